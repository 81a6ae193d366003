//! Unit tests of the queue's pure state: batch order, priority levels,
//! expiry and the arrival-rate estimate.

use super::*;
use crate::tensor::TensorData;

/// An entry with `rows` rows of width `width`; keep the receiver alive
/// or the entry counts as abandoned.
pub(crate) fn entry(rows: usize, width: usize, arrival: Instant) -> (Entry, oneshot::Receiver<EntryResult>) {
    let (tx, rx) = oneshot::channel();
    let t = Tensor::new("x", vec![rows, width], TensorData::F32(vec![0.0; rows * width])).unwrap();
    (
        Entry::new(vec![t], arrival, arrival + Duration::from_secs(60), tx),
        rx,
    )
}

#[test]
fn higher_levels_leave_first_oldest_first_and_a_long_wait_is_promoted() {
    let t0 = Instant::now();
    let mut s = State::new();
    let mut keep = Vec::new();
    // (level, rows): rows name the entries; arrivals 1 ms apart.
    for (i, (level, rows)) in [(2, 1), (2, 2), (1, 3), (3, 4), (1, 5)].into_iter().enumerate() {
        let (e, rx) = entry(rows, 2, t0 + Duration::from_millis(i as u64));
        keep.push(rx);
        s.push(e.with_level(level));
    }
    let order = |s: &State| s.entries.iter().map(|e| e.rows).collect::<Vec<_>>();
    assert_eq!(order(&s), [3, 5, 1, 2, 4]);
    // Each waits at most half its 60 s to its deadline behind higher
    // levels: at 30.001 s the first two arrivals have waited that long.
    assert!(s.remove_dead(t0 + Duration::from_millis(30_001)).is_empty());
    assert_eq!(order(&s), [1, 2, 3, 5, 4]);
    let b = s.take_batch(Limits::rows(3));
    assert_eq!(b.iter().map(|e| e.rows).collect::<Vec<_>>(), [1, 2]);
    // With no levels (0) the queue is arrival order, as it always was.
    let mut flat = State::new();
    for rows in [4, 1, 3] {
        let (e, rx) = entry(rows, 2, t0);
        keep.push(rx);
        flat.push(e);
    }
    assert_eq!(order(&flat), [4, 1, 3]);
}

#[test]
fn take_batch_respects_max_rows_and_order() {
    let now = Instant::now();
    let mut s = State::new();
    let mut keep = Vec::new();
    for rows in [3, 4, 2, 5] {
        let (e, rx) = entry(rows, 2, now);
        keep.push(rx);
        s.push(e);
    }
    let b = s.take_batch(Limits::rows(8));
    // 3 + 4 fit; 2 would make 9; 5 too: skipped entries keep their place.
    assert_eq!(b.iter().map(|e| e.rows).collect::<Vec<_>>(), vec![3, 4]);
    assert_eq!(
        s.take_batch(Limits::rows(8))
            .iter()
            .map(|e| e.rows)
            .collect::<Vec<_>>(),
        vec![2, 5]
    );
    assert!(s.is_empty());
}

#[test]
fn a_later_small_request_never_jumps_an_earlier_one_that_did_not_fit() {
    let now = Instant::now();
    let mut s = State::new();
    let mut keep = Vec::new();
    for rows in [3, 6, 1] {
        let (e, rx) = entry(rows, 2, now);
        keep.push(rx);
        s.push(e);
    }
    assert_eq!(
        s.take_batch(Limits::rows(8))
            .iter()
            .map(|e| e.rows)
            .collect::<Vec<_>>(),
        vec![3]
    );
    assert_eq!(
        s.take_batch(Limits::rows(8))
            .iter()
            .map(|e| e.rows)
            .collect::<Vec<_>>(),
        vec![6, 1]
    );
}

#[test]
fn different_trailing_dims_never_share_a_batch() {
    let now = Instant::now();
    let mut s = State::new();
    let (a, _ra) = entry(1, 4, now);
    let (b, _rb) = entry(1, 5, now);
    let (c, _rc) = entry(1, 4, now);
    s.push(a);
    s.push(b);
    s.push(c);
    // Two of 32 rows: not full, but the 5-wide one would be left behind.
    let fill = s.fill(Limits::rows(32));
    assert_eq!((fill.full, fill.leaves_behind), (false, true));
    assert!(s.fill(Limits::rows(2)).full);
    let first = s.take_batch(Limits::rows(32));
    assert_eq!(first.len(), 2);
    assert!(first.iter().all(|e| e.key == vec![vec![4]]));
    let second = s.take_batch(Limits::rows(32));
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].key, vec![vec![5]]);
    assert_eq!(s.fill(Limits::rows(32)), Fill::default());
}

#[test]
fn remove_dead_finds_expired_and_abandoned() {
    let now = Instant::now();
    let mut s = State::new();
    let (a, ra) = entry(1, 1, now);
    let (mut b, _rb) = entry(1, 1, now);
    b.deadline = now + Duration::from_millis(5);
    let (c, _rc) = entry(1, 1, now);
    s.push(a);
    s.push(b);
    s.push(c);
    drop(ra);
    assert_eq!(s.next_deadline(), Some(now + Duration::from_millis(5)));
    let dead = s.remove_dead(now + Duration::from_millis(10));
    assert_eq!(
        dead.iter().map(|(_, why)| *why).collect::<Vec<_>>(),
        vec![Dropped::ClientGone, Dropped::Expired]
    );
    assert_eq!(s.len(), 1);
}

#[test]
fn arrival_rate_estimate_follows_gaps() {
    let t0 = Instant::now();
    let mut s = State::new();
    let mut keep = Vec::new();
    assert_eq!(s.next_arrival_expected(), None);
    for i in 0..10 {
        let (e, rx) = entry(1, 1, t0 + Duration::from_millis(i));
        keep.push(rx);
        s.push(e);
    }
    let next = s.next_arrival_expected().unwrap();
    assert_eq!(next, t0 + Duration::from_millis(10));
}

#[test]
fn a_long_gap_before_a_burst_moves_the_estimate_by_its_share_of_the_window() {
    // Bursts of 20 arrivals 10 µs apart, 1 ms between bursts: the mean
    // gap over the window is (2 ms + 30 × 10 µs) / 31, not the
    // 200 µs a weighted mean of the last gaps would give just after the long gap.
    let t0 = Instant::now();
    let mut s = State::new();
    let mut keep = Vec::new();
    let mut t = t0;
    for burst in 0..3 {
        if burst > 0 {
            t += Duration::from_millis(1);
        }
        for _ in 0..20 {
            t += Duration::from_micros(10);
            let (e, rx) = entry(1, 1, t);
            keep.push(rx);
            s.push(e);
        }
    }
    // First arrival after a long gap.
    t += Duration::from_millis(1);
    let (e, rx) = entry(1, 1, t);
    keep.push(rx);
    s.push(e);
    let gap = s.next_arrival_expected().unwrap() - t;
    let want = (Duration::from_millis(2) + Duration::from_micros(10 * 30)) / 31;
    assert_eq!(gap, want, "two long gaps and 30 short ones in the window");
    assert!(gap < Duration::from_micros(80), "{gap:?}");
}

#[test]
fn units_ahead_count_each_level_and_higher() {
    let t0 = Instant::now();
    let mut s = State::new();
    let mut keep = Vec::new();
    for (level, rows) in [(2, 1), (1, 2), (3, 4), (2, 8)] {
        let (e, rx) = entry(rows, 2, t0);
        keep.push(rx);
        s.push(e.with_level(level));
    }
    assert_eq!(
        [1, 2, 3].map(|l| s.units_ahead(l)),
        [2, 11, 15],
        "level 1: its own; level 2: levels 1 and 2; level 3: all"
    );
    assert_eq!(s.units(), 15);
    // Entries leave: the counts follow.
    let b = s.take_batch(Limits::rows(4));
    assert_eq!(b.iter().map(|e| e.rows).collect::<Vec<_>>(), [2, 1]);
    assert_eq!([1, 2, 3].map(|l| s.units_ahead(l)), [0, 8, 12]);
    drop(keep.remove(2));
    assert!(s.remove_dead(t0).len() == 1);
    assert_eq!([1, 2, 3].map(|l| s.units_ahead(l)), [0, 8, 8]);
    s.take_all();
    assert_eq!(s.units(), 0);
}

#[test]
fn once_the_cost_is_known_a_low_level_is_promoted_three_runs_before_its_deadline() {
    let t0 = Instant::now();
    let mut s = State::new();
    for _ in 0..3 {
        s.record_run(2, Duration::from_secs(1));
    }
    let mut keep = Vec::new();
    // The low one arrived first, the high one 1 ms later.
    for (i, (level, rows)) in [(2, 1), (1, 2)].into_iter().enumerate() {
        let (e, rx) = entry(rows, 2, t0 + Duration::from_millis(i as u64));
        keep.push(rx);
        s.push(e.with_level(level));
    }
    let order = |s: &State| s.entries.iter().map(|e| e.rows).collect::<Vec<_>>();
    // Half its 60 s is no longer the rule: at 56.9 s it still waits...
    assert!(s.remove_dead(t0 + Duration::from_millis(56_900)).is_empty());
    assert_eq!(order(&s), [2, 1]);
    // ...and three runs of 1 s before its deadline it goes first.
    assert!(s.remove_dead(t0 + Duration::from_secs(57)).is_empty());
    assert_eq!(order(&s), [1, 2]);
}
