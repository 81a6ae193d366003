//! Triton's `reshape` of an input or output: the shape clients send or get
//! (the config's `dims`) differs from the model's (`reshape.shape`) with
//! the same elements in the same order, e.g. an output the model gives as
//! `[N]` that Triton's dims must call `[N, 1]`. Only the shape changes.

use super::{Tensor, TensorSpec};

/// One tensor's two shapes, without the batch dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reshape {
    /// As clients see it (`dims`; -1: any size).
    pub client: Vec<i64>,
    /// As the model has it (`reshape.shape`; -1: any size).
    pub model: Vec<i64>,
    /// The shapes follow a batch dimension (`max_batch_size` above 0).
    pub batched: bool,
}

impl Reshape {
    /// `t`, sent by a client, in the model's shape.
    pub fn to_model(&self, t: &mut Tensor) -> Result<(), String> {
        t.shape = self.convert(&t.name, &t.shape, &self.client, &self.model)?;
        Ok(())
    }

    /// `t`, given by the model, in the clients' shape.
    pub fn to_client(&self, t: &mut Tensor) -> Result<(), String> {
        t.shape = self.convert(&t.name, &t.shape, &self.model, &self.client)?;
        Ok(())
    }

    /// `spec` (the model's) as clients see it, for metadata.
    pub fn client_spec(&self, spec: &TensorSpec) -> TensorSpec {
        let mut shape: Vec<i64> = Vec::with_capacity(self.client.len() + 1);
        if self.batched {
            shape.push(spec.shape.first().copied().unwrap_or(-1));
        }
        shape.extend(&self.client);
        TensorSpec {
            name: spec.name.clone(),
            dtype: spec.dtype,
            shape,
            dim_names: Vec::new(),
        }
    }

    /// `shape` (which must fit `from`) as `to`, with a -1 of `to` taking
    /// what the elements leave for it.
    fn convert(&self, name: &str, shape: &[usize], from: &[i64], to: &[i64]) -> Result<Vec<usize>, String> {
        let (rows, rest) = match (self.batched, shape.split_first()) {
            (true, Some((rows, rest))) => (Some(*rows), rest),
            (true, None) => return Err(format!("`{name}` has no batch dimension (shape [])")),
            (false, _) => (None, shape),
        };
        let fits = rest.len() == from.len() && rest.iter().zip(from).all(|(s, f)| *f < 0 || *s as i64 == *f);
        if !fits {
            return Err(format!(
                "`{name}` has shape {shape:?}, which does not fit its dims {from:?} (-1: any size){}",
                if self.batched {
                    " after the batch dimension"
                } else {
                    ""
                }
            ));
        }
        let elements: usize = rest.iter().product();
        let known: usize = to.iter().filter(|d| **d >= 0).map(|d| *d as usize).product();
        let mut out: Vec<usize> = rows.into_iter().collect();
        for d in to {
            out.push(match *d {
                d if d >= 0 => d as usize,
                _ if known > 0 && elements.is_multiple_of(known) => elements / known,
                _ => {
                    return Err(format!(
                        "`{name}`: {elements} elements per row cannot take the shape {to:?}"
                    ))
                }
            });
        }
        let got: usize = out.iter().skip(rows.is_some() as usize).product();
        if got != elements {
            return Err(format!(
                "`{name}`: {elements} elements per row (shape {shape:?}) cannot take the shape {to:?}"
            ));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::TensorData;

    fn t(shape: &[usize]) -> Tensor {
        let n = shape.iter().product();
        Tensor::new("x", shape.to_vec(), TensorData::F32(vec![0.0; n])).unwrap()
    }

    #[test]
    fn shapes_go_both_ways_and_the_batch_stays() {
        let r = Reshape {
            client: vec![2, 2],
            model: vec![4],
            batched: true,
        };
        let mut x = t(&[3, 2, 2]);
        r.to_model(&mut x).unwrap();
        assert_eq!(x.shape, [3, 4]);
        r.to_client(&mut x).unwrap();
        assert_eq!(x.shape, [3, 2, 2]);
        // An output of shape [N] that Triton's dims call [N, 1].
        let out = Reshape {
            client: vec![1],
            model: vec![],
            batched: true,
        };
        let mut y = t(&[5]);
        out.to_client(&mut y).unwrap();
        assert_eq!(y.shape, [5, 1]);
        // A -1 takes what the elements leave.
        let any = Reshape {
            client: vec![-1],
            model: vec![-1, 2],
            batched: false,
        };
        let mut z = t(&[6]);
        any.to_model(&mut z).unwrap();
        assert_eq!(z.shape, [3, 2]);
    }

    #[test]
    fn a_shape_that_does_not_fit_is_refused_naming_it() {
        let r = Reshape {
            client: vec![2, 2],
            model: vec![4],
            batched: true,
        };
        let e = r.to_model(&mut t(&[1, 4])).unwrap_err();
        assert!(
            e.contains("`x` has shape [1, 4], which does not fit its dims [2, 2]"),
            "{e}"
        );
        let odd = Reshape {
            client: vec![-1],
            model: vec![-1, 2],
            batched: false,
        };
        let e = odd.to_model(&mut t(&[5])).unwrap_err();
        assert!(e.contains("cannot take the shape [-1, 2]"), "{e}");
    }
}
