//! Which waiting entries of a padded model join the oldest entry's batch.
//!
//! Padding a 5-token request into a 500-token batch wastes compute, so a
//! batch is bounded three ways: rows (`max_batch_size`), padded tokens (rows
//! × the longest length, `max_batch_tokens`), and the padded fraction of its
//! tokens (`max_padding_ratio`). The oldest entry always runs (so no request
//! waits behind newer ones for ever); the others are chosen to put as many
//! rows as those bounds allow into its batch:
//!
//! For each length `cap` at least the oldest entry's (each length waiting),
//! the batch takes the entries no longer than `cap`, longest first, while
//! they fit. With one padded dim this is the best batch under that cap: a
//! shorter entry only adds more padding, so once one fails the waste bound,
//! every shorter one would too. The cap that gives the most rows (then the
//! fewest padded tokens) wins. Entries of equal length are taken in arrival
//! order, and a batch that cannot take the next one stops there, so a split
//! request's chunks (equal lengths) still run in order.

use std::collections::VecDeque;

use super::{Entry, Limits};

/// Most entries looked at after the oldest, in arrival order (bounds the
/// work per decision when thousands wait; 8 batches' worth at 32 rows).
const CANDIDATES: usize = 256;

/// The entries of one batch.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Pick {
    /// Indices into the queue, ascending (the oldest, 0, first).
    pub indices: Vec<usize>,
    /// True when the next entry that could join was refused for rows or
    /// tokens (the batch is full), not for padding.
    pub full: bool,
}

/// A batch being assembled: the oldest entry, then candidates in order.
struct Acc {
    indices: Vec<usize>,
    rows: usize,
    /// Longest length of each padded dim.
    max: Vec<usize>,
    /// Σ rows × tokens per row of the entries (unpadded tokens).
    real: usize,
}

impl Acc {
    fn new(first: &Entry) -> Acc {
        Acc {
            indices: vec![0],
            rows: first.rows,
            max: first.lengths.clone(),
            real: first.rows * first.tokens_per_row(),
        }
    }

    /// Rows × the product of the longest lengths.
    fn padded(&self) -> usize {
        self.rows * self.max.iter().product::<usize>().max(1)
    }

    /// Adds entry `i` unless the batch would exceed `max_rows` or `max_tokens`.
    fn try_add(&mut self, i: usize, e: &Entry, limits: Limits) -> bool {
        let rows = self.rows + e.rows;
        let longest = self.max.iter().zip(&e.lengths).map(|(a, b)| *a.max(b));
        let padded = rows * longest.product::<usize>().max(1);
        if rows > limits.max_rows || limits.max_tokens.is_some_and(|t| padded > t) {
            return false;
        }
        for (a, b) in self.max.iter_mut().zip(&e.lengths) {
            *a = (*a).max(*b);
        }
        self.rows = rows;
        self.real += e.rows * e.tokens_per_row();
        self.indices.push(i);
        true
    }

    /// True while padded tokens are at most `max_padding` of all tokens.
    fn within_padding(&self, limits: Limits) -> bool {
        let padded = self.padded();
        (padded - self.real) as f64 <= limits.max_padding * padded as f64
    }
}

/// The oldest entry and the entries of its key that join its batch (see the module docs).
pub(super) fn pick(entries: &VecDeque<Entry>, limits: Limits) -> Pick {
    let Some(first) = entries.front() else {
        return Pick::default();
    };
    let mut candidates: Vec<(usize, usize)> = entries
        .iter()
        .enumerate()
        .skip(1)
        .filter(|(_, e)| e.key == first.key)
        .take(CANDIDATES)
        .map(|(i, e)| (i, e.tokens_per_row()))
        .collect();
    // Longest first; a stable sort keeps arrival order among equal lengths.
    candidates.sort_by_key(|&(_, t)| std::cmp::Reverse(t));
    let own = first.tokens_per_row();
    let mut caps: Vec<usize> = candidates.iter().map(|&(_, t)| t).filter(|&t| t > own).collect();
    caps.push(own);
    caps.dedup();
    // (rows, padded tokens) and entries of the best batch so far.
    let mut best: Option<((usize, usize), Pick)> = None;
    for cap in caps {
        let start = candidates.partition_point(|&(_, t)| t > cap);
        let mut acc = Acc::new(first);
        // The longest prefix within the padding bound (entries as long as
        // the cap can bring the fraction back under it after shorter ones).
        let (mut n, mut size) = (1, (acc.rows, acc.padded()));
        let mut refused = false;
        for &(i, _) in &candidates[start..] {
            if !acc.try_add(i, &entries[i], limits) {
                refused = true;
                break;
            }
            if acc.within_padding(limits) {
                (n, size) = (acc.indices.len(), (acc.rows, acc.padded()));
            }
        }
        let better = best
            .as_ref()
            .is_none_or(|(b, _)| size.0 > b.0 || (size.0 == b.0 && size.1 < b.1));
        if better {
            let full = refused && n == acc.indices.len();
            acc.indices.truncate(n);
            let pick = Pick {
                full,
                indices: acc.indices,
            };
            best = Some((size, pick));
        }
    }
    let ((rows, _), mut best) = best.expect("the oldest entry's own length is always a cap");
    best.full |= rows >= limits.max_rows;
    best.indices.sort_unstable();
    best
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use tokio::sync::oneshot;

    use super::super::{EntryResult, Fill, State};
    use super::*;
    use crate::tensor::{Tensor, TensorData};

    /// An entry of a padded model: `rows` rows of `len` tokens.
    fn entry(rows: usize, len: usize) -> (Entry, oneshot::Receiver<EntryResult>) {
        let (tx, rx) = oneshot::channel();
        let now = Instant::now();
        let t = Tensor::new("ids", vec![rows, len], TensorData::I64(vec![1; rows * len])).unwrap();
        let e = Entry::new(vec![t], now, now + Duration::from_secs(60), tx)
            .padded(vec![vec![usize::MAX]], vec![len]);
        (e, rx)
    }

    fn queue(entries: &[(usize, usize)]) -> (State, Vec<oneshot::Receiver<EntryResult>>) {
        let mut s = State::new();
        let mut keep = Vec::new();
        for &(rows, len) in entries {
            let (e, rx) = entry(rows, len);
            keep.push(rx);
            s.push(e);
        }
        (s, keep)
    }

    fn limits(max_rows: usize, max_tokens: Option<usize>, max_padding: f64) -> Limits {
        Limits {
            max_rows,
            max_tokens,
            max_padding,
        }
    }

    fn lengths(batch: &[Entry]) -> Vec<usize> {
        batch.iter().map(|e| e.lengths[0]).collect()
    }

    #[test]
    fn lengths_mix_within_the_padding_bound() {
        // 10 with 9, 8 and 12: padded to 12, 48 tokens of which 9 padding (19%).
        let (mut s, _k) = queue(&[(1, 10), (1, 100), (1, 9), (1, 12), (1, 8), (1, 2)]);
        // Room for more rows, but the padding bound leaves the 100 and the 2 out.
        let fill = s.fill(limits(32, None, 0.25));
        assert_eq!((fill.full, fill.leaves_behind), (false, true));
        let b = s.take_batch(limits(32, None, 0.25));
        assert_eq!(lengths(&b), vec![10, 9, 12, 8]);
        // The 100 cannot join the 2 (98% padding): each runs alone.
        assert_eq!(lengths(&s.take_batch(limits(32, None, 0.25))), vec![100]);
        assert_eq!(lengths(&s.take_batch(limits(32, None, 0.25))), vec![2]);
        assert!(s.is_empty());
    }

    #[test]
    fn the_oldest_runs_even_when_longer_than_every_bound() {
        let (mut s, _k) = queue(&[(4, 500), (1, 500)]);
        let l = limits(32, Some(1000), 0.1);
        assert!(s.fill(l).full);
        let b = s.take_batch(l);
        assert_eq!(b.iter().map(|e| e.rows).collect::<Vec<_>>(), vec![4]);
    }

    #[test]
    fn rows_and_tokens_bound_the_batch() {
        let (s, _k) = queue(&[(3, 16), (3, 16), (3, 16)]);
        assert_eq!(pick(&s.entries, limits(8, None, 0.0)).indices, vec![0, 1]);
        assert!(s.fill(limits(8, None, 0.0)).full);
        // 6 rows × 16 = 96 tokens fit 100; 9 × 16 do not.
        let p = pick(&s.entries, limits(32, Some(100), 0.0));
        assert_eq!((p.indices, p.full), (vec![0, 1], true));
        // Not full: the third fits.
        assert_eq!(s.fill(limits(32, Some(200), 0.0)), Fill::default());
    }

    #[test]
    fn a_longer_cap_wins_when_it_takes_more_rows() {
        // Oldest 8; four of 16: with cap 8 it runs alone; with cap 16, 5 rows at 10% padding.
        let (mut s, _k) = queue(&[(1, 8), (1, 16), (1, 16), (1, 16), (1, 16), (1, 3)]);
        let b = s.take_batch(limits(32, None, 0.1));
        assert_eq!(lengths(&b), vec![8, 16, 16, 16, 16]);
    }

    #[test]
    fn equal_lengths_leave_in_arrival_order() {
        // A split request's chunks: 4 rows then 2 rows, both 20 long.
        let (mut s, _k) = queue(&[(1, 20), (4, 20), (2, 20)]);
        let b = s.take_batch(limits(4, None, 0.5));
        assert_eq!(
            b.iter().map(|e| e.rows).collect::<Vec<_>>(),
            vec![1],
            "the 2 never jumps the 4"
        );
        let b = s.take_batch(limits(4, None, 0.5));
        assert_eq!(b.iter().map(|e| e.rows).collect::<Vec<_>>(), vec![4]);
    }

    #[test]
    fn different_keys_never_mix() {
        let (mut s, _k) = queue(&[(1, 5), (1, 5)]);
        let (tx, _rx) = oneshot::channel();
        let now = Instant::now();
        let t = Tensor::new("ids", vec![1, 5, 2], TensorData::I64(vec![1; 10])).unwrap();
        s.push(
            Entry::new(vec![t], now, now + Duration::from_secs(60), tx)
                .padded(vec![vec![usize::MAX, 2]], vec![5]),
        );
        assert_eq!(s.take_batch(limits(32, None, 0.5)).len(), 2);
        assert_eq!(s.take_batch(limits(32, None, 0.5)).len(), 1);
    }

    #[test]
    fn an_entry_moved_to_another_version_is_grouped_by_its_padding() {
        let (e, _rx) = entry(1, 5);
        // To a version without padding: grouped by exact trailing dims again.
        let plain = e.regroup(None).unwrap();
        assert_eq!(
            (plain.key.clone(), plain.lengths.clone()),
            (vec![vec![5]], vec![])
        );
        // And back to one that pads `ids`.
        let sig = crate::tensor::Signature {
            inputs: vec![crate::tensor::TensorSpec {
                name: "ids".into(),
                dtype: crate::tensor::DataType::I64,
                shape: vec![-1, -1],
                dim_names: vec!["b".into(), "n".into()],
            }],
            outputs: vec![],
        };
        let p = crate::batcher::Padding::new(&sig, &serde_json::from_str(r#"{"ids": 0}"#).unwrap())
            .unwrap()
            .unwrap();
        let padded = plain.regroup(Some(&p)).unwrap();
        assert_eq!((padded.key, padded.lengths), (vec![vec![usize::MAX]], vec![5]));
    }
}
