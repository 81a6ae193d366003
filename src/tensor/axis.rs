//! Concatenating and slicing tensors along any axis, for models whose batch
//! is not dim 0 of every tensor (a recurrent state `[layers, batch, hidden]`
//! batches on axis 1). A row-major tensor is `outer × len × inner` around an
//! axis: each of the `outer` blocks holds `len` slices of `inner` elements.
//! Pure data, no I/O.

use super::{Tensor, TensorData};

/// Elements before and after `axis` in a row-major `shape`.
fn around(shape: &[usize], axis: usize) -> (usize, usize) {
    (shape[..axis].iter().product(), shape[axis + 1..].iter().product())
}

impl Tensor {
    /// Size of `axis` (1 for a 0-d tensor or an axis past its rank).
    pub fn len_at(&self, axis: usize) -> usize {
        self.shape.get(axis).copied().unwrap_or(1)
    }

    /// Concatenates `parts` along `axis`. All parts share name, dtype and
    /// every other dim (the batcher groups requests so that they do).
    pub fn concat_axis(parts: &[&Tensor], axis: usize) -> Tensor {
        if axis == 0 {
            return Tensor::concat_rows(parts);
        }
        let first = parts.first().expect("concat of zero tensors. This is a bug.");
        let total: usize = parts.iter().map(|t| t.len_at(axis)).sum();
        let (outer, inner) = around(&first.shape, axis);
        let mut data = TensorData::with_capacity(first.dtype(), outer * total * inner);
        for o in 0..outer {
            for p in parts {
                let block = p.len_at(axis) * inner;
                data.extend_from(&p.data.slice(o * block..(o + 1) * block));
            }
        }
        let mut shape = first.shape.clone();
        shape[axis] = total;
        Tensor {
            name: first.name.clone(),
            shape,
            data,
        }
    }

    /// Indices `range` of `axis`, as a new tensor.
    pub fn slice_axis(&self, axis: usize, range: std::ops::Range<usize>) -> Tensor {
        if axis == 0 {
            return self.slice_rows(range);
        }
        let (outer, inner) = around(&self.shape, axis);
        let block = self.len_at(axis) * inner;
        let mut data = TensorData::with_capacity(self.dtype(), outer * range.len() * inner);
        for o in 0..outer {
            let start = o * block + range.start * inner;
            data.extend_from(&self.data.slice(start..start + range.len() * inner));
        }
        let mut shape = self.shape.clone();
        shape[axis] = range.len();
        Tensor {
            name: self.name.clone(),
            shape,
            data,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: Vec<usize>, from: i64) -> Tensor {
        let n = shape.iter().product::<usize>() as i64;
        Tensor::new("s", shape, TensorData::I64((from..from + n).collect())).unwrap()
    }

    #[test]
    fn concat_along_axis_1_then_slice_gives_back_each_part() {
        // [layers=2, batch, hidden=3]
        let a = t(vec![2, 1, 3], 0);
        let b = t(vec![2, 2, 3], 100);
        let c = Tensor::concat_axis(&[&a, &b], 1);
        assert_eq!(c.shape, vec![2, 3, 3]);
        // Layer 0: a's row, then b's two rows; layer 1 likewise.
        let TensorData::I64(v) = &c.data else { panic!() };
        assert_eq!(&v[..9], &[0, 1, 2, 100, 101, 102, 103, 104, 105]);
        assert_eq!(&v[9..12], &[3, 4, 5]);
        assert_eq!(c.slice_axis(1, 0..1), a);
        assert_eq!(c.slice_axis(1, 1..3), b);
    }

    #[test]
    fn the_last_axis_and_axis_0_work_too() {
        let a = t(vec![2, 2], 0);
        let b = t(vec![2, 1], 10);
        let c = Tensor::concat_axis(&[&a, &b], 1);
        assert_eq!(c.data, TensorData::I64(vec![0, 1, 10, 2, 3, 11]));
        assert_eq!(c.slice_axis(1, 2..3), b);
        let d = Tensor::concat_axis(&[&a, &a], 0);
        assert_eq!(d.slice_axis(0, 2..4), a);
    }
}
