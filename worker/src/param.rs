//! Parameters with their accumulated gradient and AdamW state, and seeded initialisation.

use candle_core::{DType, Device, Tensor};

use crate::error::Result;
use crate::rng::SplitMix64;

/// How a parameter starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Init {
    /// Normal with mean 0 and this standard deviation.
    Normal(f64),
    /// All elements equal to this value.
    Const(f64),
}

/// One parameter tensor of a piece.
#[derive(Debug, Clone)]
pub struct Param {
    /// Name inside the stage, `"{piece}.{local}"` (e.g. `block0.qkv.weight`).
    pub name: String,
    /// The value.
    pub value: Tensor,
    /// The gradient accumulated by `W` passes since the last optimizer step.
    pub grad: Tensor,
    /// AdamW first moment.
    pub(crate) m: Tensor,
    /// AdamW second moment.
    pub(crate) v: Tensor,
    /// Whether AdamW's weight decay applies (matrices and embeddings, not biases or norms).
    pub decay: bool,
}

impl Param {
    /// A parameter of `shape` initialised from `(seed, name)` alone, so the value does not
    /// depend on which other parameters a stage holds.
    pub(crate) fn new(
        name: String,
        shape: &[usize],
        init: Init,
        decay: bool,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let n: usize = shape.iter().product();
        let host: Vec<f32> = match init {
            Init::Normal(std) => {
                let mut rng = SplitMix64::for_stream(seed, &name);
                (0..n).map(|_| (rng.normal() * std) as f32).collect()
            }
            Init::Const(c) => vec![c as f32; n],
        };
        let value = Tensor::from_vec(host, shape, device)?.to_dtype(dtype)?;
        let zeros = value.zeros_like()?;
        Ok(Self {
            name,
            grad: zeros.clone(),
            m: zeros.clone(),
            v: zeros,
            value,
            decay,
        })
    }

    /// Adds `g` to the accumulated gradient.
    pub(crate) fn accumulate(&mut self, g: &Tensor) -> Result<()> {
        self.grad = (&self.grad + g)?;
        Ok(())
    }

    /// Sum of squared gradient elements, in f64.
    pub(crate) fn grad_sq_sum(&self) -> Result<f64> {
        let s = self.grad.to_dtype(DType::F32)?.sqr()?.sum_all()?;
        Ok(f64::from(s.to_scalar::<f32>()?))
    }
}
