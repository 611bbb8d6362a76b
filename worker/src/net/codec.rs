//! Tensor ⇄ [`TensorFrame`]: little-endian raw elements, row-major, exact to the bit.
//!
//! Sending, [`FrameCodec`] writes each frame's tensor memory straight into the gRPC message
//! buffer (one copy); receiving, the prost-decoded `data` (a slice of tonic's buffer) is
//! copied once into the tensor's own storage.

use bytes::{Buf, BufMut, Bytes};
use candle_core::{CpuStorage, DType, Device, Storage, Tensor};
use pipewise_proto::convert;
use pipewise_proto::v1::{self, SendAck, TensorFrame};
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

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

    /// The element whose little-endian bytes start `bytes`.
    fn from_le_chunk(bytes: &[u8]) -> Self;
}

macro_rules! le_element {
    ($t:ty, $bits:ty) => {
        impl LeElement for $t {
            fn to_le(self) -> Self {
                <$t>::from_bits(<$bits>::from_ne_bytes(self.to_le_bytes()))
            }

            fn from_le_chunk(bytes: &[u8]) -> Self {
                // Callers pass exact chunks; the default never occurs.
                <$t>::from_le_bytes(bytes.try_into().unwrap_or_default())
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
    // One copy, which also aligns the elements; no zeroing of the new memory first.
    let values: Vec<T> = match bytemuck::try_cast_slice::<u8, T>(data) {
        Ok(elements) if cfg!(target_endian = "little") => elements.to_vec(),
        _ => data
            .chunks_exact(std::mem::size_of::<T>())
            .map(T::from_le_chunk)
            .collect(),
    };
    Ok(Tensor::from_vec(values, shape, device)?)
}

/// Where the `data` of an outgoing frame comes from.
#[derive(Debug)]
enum Payload {
    /// A contiguous CPU tensor of a wire dtype on a little-endian host: its memory is
    /// copied straight into the gRPC message when the frame is encoded.
    Tensor(Tensor),
    /// The data already in wire form (tensors on other devices, views that are not
    /// contiguous, variables, big-endian hosts).
    Bytes(Bytes),
}

/// A frame on its way to a peer: every `TensorFrame` field but `data`, and the data.
///
/// [`FrameCodec`] writes it as one `TensorFrame` message, so the data is copied once, from
/// the tensor into the message buffer.
#[derive(Debug)]
pub(crate) struct Outgoing {
    /// The fields of the frame, with `data` left empty.
    header: TensorFrame,
    payload: Payload,
    data_len: usize,
}

/// Prepares `frame` for the wire. Only f32, f16 and bf16 tensors travel.
///
/// A contiguous CPU tensor is not copied here: the encoder reads its memory later (candle
/// tensors are immutable; a variable, which `Var::set` can overwrite, is copied now).
pub(crate) fn encode(frame: &Frame) -> Result<Outgoing> {
    let tensor = &frame.tensor;
    let (dtype, size) = match tensor.dtype() {
        DType::F32 => (v1::Dtype::F32, 4),
        DType::F16 => (v1::Dtype::F16, 2),
        DType::BF16 => (v1::Dtype::Bf16, 2),
        other => {
            return Err(Error::InvalidArgument {
                field: "frame.tensor",
                reason: format!("dtype {other:?} cannot be sent (f32, f16 and bf16 can)"),
            });
        }
    };
    let in_place = cfg!(target_endian = "little")
        && tensor.device().is_cpu()
        && tensor.is_contiguous()
        && !tensor.is_variable();
    let payload = if in_place {
        Payload::Tensor(tensor.clone())
    } else {
        Payload::Bytes(match dtype {
            v1::Dtype::F16 => element_bytes::<half::f16>(tensor)?,
            v1::Dtype::Bf16 => element_bytes::<half::bf16>(tensor)?,
            _ => element_bytes::<f32>(tensor)?,
        })
    };
    Ok(Outgoing {
        header: TensorFrame {
            job: frame.job,
            step: frame.step,
            stage: frame.stage,
            mb: frame.mb,
            kind: kind_to_proto(frame.kind) as i32,
            dtype: dtype as i32,
            shape: tensor.dims().iter().map(|&d| d as u64).collect(),
            data: Bytes::new(),
        },
        payload,
        data_len: tensor.elem_count() * size,
    })
}

/// The key of `TensorFrame.data` (field 8, length-delimited).
const DATA_KEY: u8 = (8 << 3) | 2;

fn put_varint(dst: &mut impl BufMut, mut value: u64) {
    while value >= 0x80 {
        dst.put_u8((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    dst.put_u8(value as u8);
}

fn encode_error(reason: impl std::fmt::Display) -> Status {
    Status::internal(format!("cannot encode TensorFrame.data: {reason}"))
}

impl Outgoing {
    /// Writes the `TensorFrame` message: the other fields, then `data` (protobuf allows
    /// fields in any order).
    fn write(&self, dst: &mut impl BufMut) -> Result<(), Status> {
        dst.put_slice(&convert::encode_message(&self.header));
        dst.put_u8(DATA_KEY);
        put_varint(dst, self.data_len as u64);
        match &self.payload {
            Payload::Bytes(bytes) => {
                if bytes.len() != self.data_len {
                    return Err(encode_error(format!(
                        "{} bytes, expected {}",
                        bytes.len(),
                        self.data_len
                    )));
                }
                dst.put_slice(bytes);
            }
            Payload::Tensor(tensor) => {
                let (storage, layout) = tensor.storage_and_layout();
                let (start, end) = layout
                    .contiguous_offsets()
                    .ok_or_else(|| encode_error("the tensor is not contiguous"))?;
                let Storage::Cpu(cpu) = &*storage else {
                    return Err(encode_error("the tensor is not on the CPU"));
                };
                let range = start..end;
                let bytes: Option<&[u8]> = match cpu {
                    CpuStorage::F32(v) => v.get(range).map(bytemuck::cast_slice),
                    CpuStorage::F16(v) => v.get(range).map(bytemuck::cast_slice),
                    CpuStorage::BF16(v) => v.get(range).map(bytemuck::cast_slice),
                    _ => return Err(encode_error("the storage is not f32, f16 or bf16")),
                };
                let bytes = bytes.ok_or_else(|| encode_error("the layout exceeds the storage"))?;
                if bytes.len() != self.data_len {
                    return Err(encode_error(format!(
                        "{} bytes, expected {}",
                        bytes.len(),
                        self.data_len
                    )));
                }
                dst.put_slice(bytes);
            }
        }
        Ok(())
    }
}

/// The client codec of `ActivationService.Send`: [`Outgoing`] frames out (data copied once,
/// straight into the message buffer), `SendAck` in.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FrameCodec;

impl Codec for FrameCodec {
    type Encode = Outgoing;
    type Decode = SendAck;
    type Encoder = FrameCodec;
    type Decoder = FrameCodec;

    fn encoder(&mut self) -> Self::Encoder {
        FrameCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        FrameCodec
    }
}

impl Encoder for FrameCodec {
    type Item = Outgoing;
    type Error = Status;

    fn encode(&mut self, item: Outgoing, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        // The fields besides `data` take a few dozen bytes; reserve once for the whole message.
        dst.reserve(item.data_len + 64 + 10 * item.header.shape.len());
        item.write(dst)
    }
}

impl Decoder for FrameCodec {
    type Item = SendAck;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<SendAck>, Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        convert::decode_message(&bytes, "SendAck")
            .map(Some)
            .map_err(|e| Status::internal(e.to_string()))
    }
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

    /// The `TensorFrame` a peer decodes from what [`FrameCodec`] writes for `frame`.
    fn wire(frame: &Frame) -> Result<TensorFrame> {
        let mut buf = Vec::new();
        encode(frame)?
            .write(&mut buf)
            .map_err(|s| Error::InvalidArgument {
                field: "frame",
                reason: s.message().to_string(),
            })?;
        convert::decode_message(&buf, "TensorFrame").map_err(|e| Error::InvalidArgument {
            field: "frame",
            reason: e.to_string(),
        })
    }

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
            let msg = wire(&frame)?;
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
        assert_eq!(&wire(&frame)?.data[..], &1.0f32.to_le_bytes());
        Ok(())
    }

    #[test]
    fn views_and_variables_send_their_own_elements() -> Result<()> {
        let base = Tensor::arange(0f32, 24.0, &Device::Cpu)?.reshape((4, 6))?;
        let var = candle_core::Var::from_tensor(&base)?;
        let cases = [
            base.narrow(0, 1, 2)?,   // contiguous, at an offset
            base.t()?,               // not contiguous
            base.narrow(1, 2, 3)?,   // not contiguous
            var.as_tensor().clone(), // a variable
            base.narrow(0, 0, 0)?,   // empty
        ];
        for t in cases {
            let frame = Frame {
                job: 1,
                step: 0,
                stage: 0,
                mb: 0,
                kind: FrameKind::Activation,
                tensor: t.clone(),
            };
            let msg = wire(&frame)?;
            assert_eq!(
                msg.shape,
                t.dims().iter().map(|&d| d as u64).collect::<Vec<_>>()
            );
            let want = t.flatten_all()?.to_vec1::<f32>()?;
            let want: Vec<u8> = want.iter().flat_map(|x| x.to_le_bytes()).collect();
            assert_eq!(&msg.data[..], &want[..]);
        }
        Ok(())
    }
}
