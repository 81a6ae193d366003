//! Padding and cropping tensors along any of their trailing dims: the batch
//! of a padded model (`model-settings.json` `padding`) stacks requests of
//! different lengths into one tensor filled with the pad value, and each
//! request's outputs are cut back out of the batch's. Pure data, no I/O.

use super::{Strings, Tensor, TensorData};

impl TensorData {
    /// `n` copies of the first element of `one` (a pad value).
    pub fn repeat(one: &TensorData, n: usize) -> TensorData {
        // `v[..1]` panics on an empty pad value: a bug, padding checks it at load.
        map_tensor_data!(
            one,
            v => v[..1].iter().cycle().take(n).cloned().collect(),
            s => std::iter::repeat_n(&s[0], n).collect()
        )
    }
}

impl Tensor {
    /// Stacks `parts` along dim 0 into one tensor whose trailing dims are
    /// `trailing` (each at least the part's own), every element a part does
    /// not cover being `pad` (a one-element tensor of the same dtype). Each
    /// part sits at the start of every padded dim (right padding).
    pub fn concat_padded(parts: &[&Tensor], trailing: &[usize], pad: &TensorData) -> Tensor {
        let first = parts.first().expect("concat of zero tensors. This is a bug.");
        let rows: usize = parts.iter().map(|t| t.rows()).sum();
        let mut shape = Vec::with_capacity(trailing.len() + 1);
        shape.push(rows);
        shape.extend_from_slice(trailing);
        let mut data = TensorData::repeat(pad, shape.iter().product());
        let mut row = 0;
        for p in parts {
            debug_assert_eq!(
                p.shape.len(),
                shape.len(),
                "padding a tensor of another rank. This is a bug."
            );
            place(&mut data, &p.data, &p.shape, &shape, row);
            row += p.rows();
        }
        Tensor {
            name: first.name.clone(),
            shape,
            data,
        }
    }

    /// Rows `rows` of dim 0, each trailing dim cut to `trailing` (at most the
    /// tensor's own): the block at the start of every dim.
    pub fn crop(&self, rows: std::ops::Range<usize>, trailing: &[usize]) -> Tensor {
        let mut shape = Vec::with_capacity(trailing.len() + 1);
        shape.push(rows.len());
        shape.extend_from_slice(trailing);
        let n: usize = shape.iter().product();
        let data = map_tensor_data!(&self.data, v => {
            let mut out = Vec::with_capacity(n);
            lines(&shape, &self.shape, rows.start, |src_at, len| out.extend_from_slice(&v[src_at..src_at + len]));
            out
        }, s => {
            let mut out = Strings::with_capacity(n);
            lines(&shape, &self.shape, rows.start, |src_at, len| out.extend_range(s, src_at..src_at + len));
            out
        });
        Tensor {
            name: self.name.clone(),
            shape,
            data,
        }
    }
}

/// Copies the tensor data `src` (shape `src_shape`) into `dst` (shape
/// `dst_shape`, same rank, every trailing dim at least `src`'s) at row `row`.
/// Both must be the same variant.
fn place(dst: &mut TensorData, src: &TensorData, src_shape: &[usize], dst_shape: &[usize], row: usize) {
    fn typed<T: Clone>(dst: &mut [T], src: &[T], src_shape: &[usize], dst_shape: &[usize], row: usize) {
        let mut from = 0;
        lines(src_shape, dst_shape, row, |to, len| {
            dst[to..to + len].clone_from_slice(&src[from..from + len]);
            from += len;
        });
    }
    macro_rules! pairs {
        ($($var:ident),*) => {
            match (dst, src) {
                $((TensorData::$var(a), TensorData::$var(b)) => typed(a, b, src_shape, dst_shape, row),)*
                (a, b) => panic!("padding {} with {}. This is a bug.", b.dtype(), a.dtype()),
            }
        };
    }
    if let (TensorData::Bytes(a), TensorData::Bytes(b)) = (&mut *dst, src) {
        // Strings cannot be overwritten in place: rebuild them as owned
        // elements (padded string inputs are rare and small).
        let mut owned: Vec<&[u8]> = a.iter().collect();
        typed(
            &mut owned,
            &b.iter().collect::<Vec<_>>(),
            src_shape,
            dst_shape,
            row,
        );
        *a = owned.into_iter().collect();
        return;
    }
    pairs!(Bool, U8, U16, U32, U64, I8, I16, I32, I64, F16, Bf16, F32, F64)
}

/// Walks the innermost lines of a block of shape `block` (rank ≥ 1) that sits
/// at row `row` and the start of every other dim of a tensor of shape `outer`
/// (same rank, every dim at least `block`'s): calls `f(offset in outer, line
/// length)` for each line, in row-major order.
fn lines(block: &[usize], outer: &[usize], row: usize, mut f: impl FnMut(usize, usize)) {
    let rank = block.len();
    let len = block[rank - 1];
    if block.contains(&0) {
        return;
    }
    // Row-major strides of `outer`.
    let mut strides = vec![1usize; rank];
    for d in (0..rank - 1).rev() {
        strides[d] = strides[d + 1] * outer[d + 1];
    }
    // An odometer over every dim but the last.
    let mut index = vec![0usize; rank - 1];
    loop {
        let at = (row + index.first().copied().unwrap_or(0)) * strides[0]
            + (1..rank - 1).map(|d| index[d] * strides[d]).sum::<usize>();
        f(at, len);
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            index[d] += 1;
            if index[d] < block[d] {
                break;
            }
            index[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: Vec<usize>, v: Vec<i64>) -> Tensor {
        Tensor::new("x", shape, TensorData::I64(v)).unwrap()
    }

    #[test]
    fn pads_each_part_to_the_longest_and_crops_it_back() {
        let a = t(vec![1, 2], vec![1, 2]);
        let b = t(vec![2, 3], vec![3, 4, 5, 6, 7, 8]);
        let pad = TensorData::I64(vec![-1]);
        let c = Tensor::concat_padded(&[&a, &b], &[4], &pad);
        assert_eq!(c.shape, vec![3, 4]);
        assert_eq!(
            c.data,
            TensorData::I64(vec![1, 2, -1, -1, 3, 4, 5, -1, 6, 7, 8, -1])
        );
        assert_eq!(c.crop(0..1, &[2]), a);
        assert_eq!(c.crop(1..3, &[3]), b);
    }

    #[test]
    fn pads_inner_dims_of_higher_rank_tensors() {
        // [1, 2, 2] into [1, 3, 3]; then a [1, 3, 1] beside it.
        let a = t(vec![1, 2, 2], vec![1, 2, 3, 4]);
        let b = t(vec![1, 3, 1], vec![5, 6, 7]);
        let c = Tensor::concat_padded(&[&a, &b], &[3, 3], &TensorData::I64(vec![0]));
        assert_eq!(
            c.data,
            TensorData::I64(vec![1, 2, 0, 3, 4, 0, 0, 0, 0, 5, 0, 0, 6, 0, 0, 7, 0, 0])
        );
        assert_eq!(c.crop(0..1, &[2, 2]), a);
        assert_eq!(c.crop(1..2, &[3, 1]), b);
    }

    #[test]
    fn rank_one_and_empty_parts() {
        let a = t(vec![2], vec![1, 2]);
        let c = Tensor::concat_padded(&[&a, &a], &[], &TensorData::I64(vec![0]));
        assert_eq!(c.data, TensorData::I64(vec![1, 2, 1, 2]));
        assert_eq!(c.crop(1..2, &[]).data, TensorData::I64(vec![2]));
        let empty = t(vec![1, 0], vec![]);
        let c = Tensor::concat_padded(
            &[&empty, &t(vec![1, 2], vec![8, 9])],
            &[2],
            &TensorData::I64(vec![7]),
        );
        assert_eq!(c.data, TensorData::I64(vec![7, 7, 8, 9]));
        assert_eq!(c.crop(0..1, &[0]), empty);
    }
}
