//! Tensor ⇄ [`TensorFrame`]: little-endian raw elements, row-major, exact to the bit.

use bytes::Bytes;
use candle_core::{DType, Device, Tensor};
use pipewise_proto::v1::{self, TensorFrame};

use crate::error::{Error, Result};
use crate::runtime::transport::{Frame, FrameKind};

/// A rejected field of an incoming frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rejection {
    /// The `TensorFrame` field at fault.
    pub(crate) field: &'static str,
    /// Why it is rejected.
    pub(crate) reason: String,
    /// The frame repeats one already received (which stays deliverable).
    pub(crate) duplicate: bool,
}

impl Rejection {
    pub(crate) fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Rejection {
            field,
            reason: reason.into(),
            duplicate: false,
        }
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TensorFrame.{}: {}", self.field, self.reason)
    }
}

/// The proto kind of a frame kind.
pub(crate) fn kind_to_proto(kind: FrameKind) -> v1::FrameKind {
    match kind {
        FrameKind::Activation => v1::FrameKind::Activation,
        FrameKind::Gradient => v1::FrameKind::Gradient,
    }
}

/// The frame kind of a proto enum value.
pub(crate) fn kind_from_proto(value: i32) -> Result<FrameKind, Rejection> {
    match v1::FrameKind::try_from(value) {
        Ok(v1::FrameKind::Activation) => Ok(FrameKind::Activation),
        Ok(v1::FrameKind::Gradient) => Ok(FrameKind::Gradient),
        Ok(v1::FrameKind::Unspecified) => Err(Rejection::new("kind", "not set")),
        Err(_) => Err(Rejection::new("kind", format!("unknown value {value}"))),
    }
}

/// The wire dtype and element size of a proto enum value.
pub(crate) fn dtype_from_proto(value: i32) -> Result<(DType, usize), Rejection> {
    match v1::Dtype::try_from(value) {
        Ok(v1::Dtype::F32) => Ok((DType::F32, 4)),
        Ok(v1::Dtype::F16) => Ok((DType::F16, 2)),
        Ok(v1::Dtype::Bf16) => Ok((DType::BF16, 2)),
        Ok(v1::Dtype::Unspecified) => Err(Rejection::new("dtype", "not set")),
        Err(_) => Err(Rejection::new("dtype", format!("unknown value {value}"))),
    }
}

/// A `Vec<T>` seen as its bytes, so `Bytes` can own it without a copy.
struct PodBytes<T>(Vec<T>);

impl<T: bytemuck::Pod> AsRef<[u8]> for PodBytes<T> {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

/// Elements with a little-endian byte form.
trait LeElement: bytemuck::Pod + candle_core::WithDType + Send + Sync {
    /// Swaps to little-endian order (a no-op on little-endian hosts).
    fn to_le(self) -> Self;
}

macro_rules! le_element {
    ($t:ty, $bits:ty) => {
        impl LeElement for $t {
            fn to_le(self) -> Self {
                <$t>::from_bits(<$bits>::from_ne_bytes(self.to_le_bytes()))
            }
        }
    };
}
le_element!(f32, u32);
le_element!(half::f16, u16);
le_element!(half::bf16, u16);

fn element_bytes<T: LeElement>(tensor: &Tensor) -> Result<Bytes> {
    let mut values = tensor.flatten_all()?.to_vec1::<T>()?;
    if cfg!(target_endian = "big") {
        for v in &mut values {
            *v = v.to_le();
        }
    }
    Ok(Bytes::from_owner(PodBytes(values)))
}

fn element_tensor<T: LeElement>(data: &[u8], shape: &[usize], device: &Device) -> Result<Tensor> {
    // One copy, which also aligns the elements.
    let mut values: Vec<T> = bytemuck::pod_collect_to_vec(data);
    if cfg!(target_endian = "big") {
        for v in &mut values {
            *v = v.to_le();
        }
    }
    Ok(Tensor::from_vec(values, shape, device)?)
}

/// Encodes `frame` for the wire. Only f32, f16 and bf16 tensors travel.
pub(crate) fn encode(frame: &Frame) -> Result<TensorFrame> {
    let tensor = &frame.tensor;
    let (dtype, data) = match tensor.dtype() {
        DType::F32 => (v1::Dtype::F32, element_bytes::<f32>(tensor)?),
        DType::F16 => (v1::Dtype::F16, element_bytes::<half::f16>(tensor)?),
        DType::BF16 => (v1::Dtype::Bf16, element_bytes::<half::bf16>(tensor)?),
        other => {
            return Err(Error::InvalidArgument {
                field: "frame.tensor",
                reason: format!("dtype {other:?} cannot be sent (f32, f16 and bf16 can)"),
            });
        }
    };
    Ok(TensorFrame {
        job: frame.job,
        step: frame.step,
        stage: frame.stage,
        mb: frame.mb,
        kind: kind_to_proto(frame.kind) as i32,
        dtype: dtype as i32,
        shape: tensor.dims().iter().map(|&d| d as u64).collect(),
        data,
    })
}

/// Checks `dtype`, `shape` and the data length of a frame; returns the dtype and the shape.
pub(crate) fn check_layout(frame: &TensorFrame) -> Result<(DType, Vec<usize>), Rejection> {
    let (dtype, size) = dtype_from_proto(frame.dtype)?;
    let mut shape = Vec::with_capacity(frame.shape.len());
    let mut elements: usize = 1;
    for &d in &frame.shape {
        let d = usize::try_from(d)
            .map_err(|_| Rejection::new("shape", format!("dimension {d} does not fit usize")))?;
        elements = elements.checked_mul(d).ok_or_else(|| {
            Rejection::new("shape", format!("{:?} has too many elements", frame.shape))
        })?;
        shape.push(d);
    }
    let expected = elements
        .checked_mul(size)
        .ok_or_else(|| Rejection::new("shape", format!("{:?} is too large", frame.shape)))?;
    if expected != frame.data.len() {
        return Err(Rejection::new(
            "data",
            format!(
                "{} bytes, but shape {:?} of {dtype:?} needs {expected}",
                frame.data.len(),
                frame.shape
            ),
        ));
    }
    Ok((dtype, shape))
}

/// Decodes the tensor of a frame that passed [`check_layout`].
pub(crate) fn decode(
    data: &[u8],
    dtype: DType,
    shape: &[usize],
    device: &Device,
) -> Result<Tensor> {
    match dtype {
        DType::F32 => element_tensor::<f32>(data, shape, device),
        DType::F16 => element_tensor::<half::f16>(data, shape, device),
        DType::BF16 => element_tensor::<half::bf16>(data, shape, device),
        other => Err(Error::InvalidArgument {
            field: "dtype",
            reason: format!("{other:?} is not a wire dtype"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_bits() -> Result<()> {
        let values: Vec<f32> = vec![
            0.0,
            -0.0,
            1.5,
            f32::MIN_POSITIVE / 4.0,
            f32::INFINITY,
            -3.25,
        ];
        let t = Tensor::from_vec(values.clone(), (2, 3), &Device::Cpu)?;
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let t = t.to_dtype(dtype)?;
            let frame = Frame {
                job: 1,
                step: 2,
                stage: 3,
                mb: 4,
                kind: FrameKind::Gradient,
                tensor: t.clone(),
            };
            let msg = encode(&frame)?;
            let (dt, shape) = check_layout(&msg).map_err(|r| Error::InvalidArgument {
                field: "frame",
                reason: r.to_string(),
            })?;
            let back = decode(&msg.data, dt, &shape, &Device::Cpu)?;
            assert_eq!(back.dims(), t.dims());
            assert_eq!(back.dtype(), dtype);
            let a = back.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            let b = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b));
        }
        Ok(())
    }

    #[test]
    fn little_endian_on_the_wire() -> Result<()> {
        let t = Tensor::from_vec(vec![1.0f32], 1, &Device::Cpu)?;
        let frame = Frame {
            job: 0,
            step: 0,
            stage: 0,
            mb: 0,
            kind: FrameKind::Activation,
            tensor: t,
        };
        assert_eq!(&encode(&frame)?.data[..], &1.0f32.to_le_bytes());
        Ok(())
    }
}
