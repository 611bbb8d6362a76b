//! Parameters with their accumulated gradient and AdamW state, and seeded initialisation.

mod grad;

use candle_core::{DType, Device, Tensor};

use crate::error::Result;
use crate::rng::SplitMix64;

/// The dtype of accumulated gradients, AdamW's moments and the master copy of bf16 and f16
/// parameters: f32 whatever the model dtype, as `DType::training_state_bytes` in
/// `pipewise-common` counts them (Megatron-LM's mixed-precision layout).
pub(crate) const STATE_DTYPE: DType = DType::F32;

/// The dtype of accumulated gradients: f64, so that summing a step's microbatch gradients
/// (f32 each) is exact in practice whatever the order, and data-parallel replicas that sum
/// their shares first give the single device's bits. Rounded to f32 for the update.
pub(crate) const GRAD_DTYPE: DType = DType::F64;

/// How a parameter starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Init {
    /// Normal with mean 0 and this standard deviation.
    Normal(f64),
    /// All elements equal to this value.
    Const(f64),
}

/// One parameter tensor of a piece.
///
/// On the CPU the optimizer step and gradient accumulation write the value (or master copy),
/// moments and gradient in place: a clone of a `Param` (or of one of its tensors) shares
/// those buffers and sees the updates.
#[derive(Debug, Clone)]
pub struct Param {
    /// Name inside the stage, `"{piece}.{local}"` (e.g. `block0.qkv.weight`).
    pub name: String,
    /// The value.
    pub value: Tensor,
    /// The gradient accumulated by `W` passes since the last optimizer step, in f64
    /// (`GRAD_DTYPE`): each microbatch's gradient (f32) is added exactly in practice.
    pub grad: Tensor,
    /// The f32 master copy of a bf16 or f16 parameter, which the optimizer updates (`value`
    /// is it rounded), so updates smaller than the narrow dtype's spacing are not lost;
    /// `None` for f32 parameters.
    pub(crate) master: Option<Tensor>,
    /// AdamW first moment, in f32 (`STATE_DTYPE`).
    pub(crate) m: Tensor,
    /// AdamW second moment, in f32 (`STATE_DTYPE`).
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
        // Each its own buffer: the optimizer updates them in place.
        let zeros = || Tensor::zeros(shape, STATE_DTYPE, device);
        Ok(Self {
            name,
            grad: Tensor::zeros(shape, GRAD_DTYPE, device)?,
            master: Self::needs_master(dtype)
                .then(|| value.to_dtype(STATE_DTYPE))
                .transpose()?,
            m: zeros()?,
            v: zeros()?,
            value,
            decay,
        })
    }

    /// Whether parameters of `dtype` keep an f32 master copy: when it is narrower than f32.
    pub(crate) fn needs_master(dtype: DType) -> bool {
        dtype != STATE_DTYPE
    }

    /// Takes `wide` (f32, of this parameter's shape, on its device) as its value: rounded
    /// to the value's dtype, and kept as the master copy where it keeps one.
    pub(crate) fn set_wide(&mut self, wide: Tensor) -> Result<()> {
        self.value = wide.to_dtype(self.value.dtype())?;
        self.master = Self::needs_master(self.value.dtype()).then_some(wide);
        Ok(())
    }

    /// Bytes of the tensors this parameter keeps for training, measured from them: its
    /// value, gradient, master copy (if any) and two AdamW moments.
    pub fn state_bytes(&self) -> u64 {
        [&self.value, &self.grad, &self.m, &self.v]
            .into_iter()
            .chain(self.master.as_ref())
            .map(|t| (t.elem_count() * t.dtype().size_in_bytes()) as u64)
            .sum()
    }

    /// Bytes of the optimizer's state: the two AdamW moments and the master copy (if any).
    pub fn optimizer_bytes(&self) -> u64 {
        [&self.m, &self.v]
            .into_iter()
            .chain(self.master.as_ref())
            .map(|t| (t.elem_count() * t.dtype().size_in_bytes()) as u64)
            .sum()
    }

    /// Bytes of the accumulated gradient.
    pub fn grad_bytes(&self) -> u64 {
        (self.grad.elem_count() * self.grad.dtype().size_in_bytes()) as u64
    }
}
