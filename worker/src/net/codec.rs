//! Tensor ⇄ [`TensorFrame`]s: little-endian raw elements, row-major, exact to the bit.
//!
//! Sending, a tensor goes out as chunks of at most the configured chunk size (whole
//! elements each, consecutive messages of one stream, `offset` growing). [`Chunk::wire`]
//! writes each chunk's bytes straight from the tensor's memory into the gRPC message (one
//! copy); a [`Buffer`]'s bytes (emulated compute) go to HTTP/2 as slices, not copied. Receiving, an [`Assembly`] copies each chunk's prost-decoded `data` (a slice
//! of the HTTP/2 frame that carried it) into the tensor's own storage (one copy), or, when
//! the transport delivers [`Buffer`]s (emulated compute), keeps that slice itself (no copy)
//! for a frame of one chunk and copies the chunks into one buffer otherwise. Chunks keep
//! the per-message buffers small and reused, so they stay in cache and are not page-faulted in
//! afresh for every large tensor.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use candle_core::{CpuStorage, DType, Device, Storage, Tensor};
use pipewise_proto::convert;
use pipewise_proto::v1::{self, TensorFrame};
use tonic::Status;

use crate::error::{Error, Result};
use crate::runtime::transport::{Buffer, Frame, FrameKind, Payload};

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

impl From<Rejection> for Error {
    fn from(rejection: Rejection) -> Self {
        Error::invalid("frame", rejection.to_string())
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

/// The elements of a tensor being received, in its own storage.
#[derive(Debug)]
enum Values {
    F32(Vec<f32>),
    F16(Vec<half::f16>),
    Bf16(Vec<half::bf16>),
}

impl Values {
    /// Room for `elements` elements, none written yet: each chunk is appended in place, so
    /// the storage is written once (no zeroing first).
    fn with_capacity(dtype: DType, elements: usize) -> Result<Self, Rejection> {
        Ok(match dtype {
            DType::F32 => Values::F32(Vec::with_capacity(elements)),
            DType::F16 => Values::F16(Vec::with_capacity(elements)),
            DType::BF16 => Values::Bf16(Vec::with_capacity(elements)),
            other => {
                return Err(Rejection::new(
                    "dtype",
                    format!("{other:?} is not a wire dtype"),
                ));
            }
        })
    }

    /// Appends the little-endian elements in `data` (a whole number of elements).
    fn extend_le(&mut self, data: &[u8]) {
        fn extend<T: LeElement + bytemuck::Pod>(v: &mut Vec<T>, data: &[u8]) {
            // Little-endian data is the elements already: one memcpy when aligned, else a
            // memset and a memcpy (both vectorised, unlike decoding element by element;
            // HTTP/2 DATA frames put the data at any offset).
            if cfg!(target_endian = "little") {
                if let Ok(elements) = bytemuck::try_cast_slice::<u8, T>(data) {
                    v.extend_from_slice(elements);
                } else {
                    let start = v.len();
                    v.resize(
                        start + data.len() / std::mem::size_of::<T>(),
                        bytemuck::Zeroable::zeroed(),
                    );
                    bytemuck::cast_slice_mut::<T, u8>(&mut v[start..]).copy_from_slice(data);
                }
                return;
            }
            v.extend(
                data.chunks_exact(std::mem::size_of::<T>())
                    .map(T::from_le_chunk),
            );
        }
        match self {
            Values::F32(v) => extend(v, data),
            Values::F16(v) => extend(v, data),
            Values::Bf16(v) => extend(v, data),
        }
    }

    fn into_tensor(self, shape: &[usize], device: &Device) -> Result<Tensor> {
        fn build<T: LeElement>(v: Vec<T>, shape: &[usize], device: &Device) -> Result<Tensor> {
            Ok(Tensor::from_vec(v, shape, device)?)
        }
        match self {
            Values::F32(v) => build(v, shape, device),
            Values::F16(v) => build(v, shape, device),
            Values::Bf16(v) => build(v, shape, device),
        }
    }
}

/// Where the `data` of an outgoing frame comes from.
#[derive(Debug)]
enum Source {
    /// A contiguous CPU tensor of a wire dtype on a little-endian host: its memory is
    /// copied straight into the gRPC message when the frame is encoded.
    Tensor(Tensor),
    /// The data already in wire form (buffers; tensors on other devices, views that are not
    /// contiguous, variables, big-endian hosts).
    Bytes(Bytes),
}

/// A frame on its way to a peer: every `TensorFrame` field but `data`, and the data.
///
/// It goes out as one or more [`Chunk`]s, each one `TensorFrame` message ([`Chunk::wire`]).
#[derive(Debug)]
pub(crate) struct Outgoing {
    /// The fields of the frame, with `data` left empty and `offset` 0.
    header: TensorFrame,
    source: Source,
    data_len: usize,
    element_bytes: usize,
}

/// Prepares `frame` for the wire. Only f32, f16 and bf16 tensors travel.
///
/// A contiguous CPU tensor is not copied here: the encoder reads its memory later (candle
/// tensors are immutable; a variable, which `Var::set` can overwrite, is copied now).
pub(crate) fn encode(frame: &Frame) -> Result<Outgoing> {
    let (dtype, size) = match wire_dtype(frame.payload.dtype()) {
        Some(wire) => wire,
        None => {
            return Err(Error::InvalidArgument {
                field: "frame.tensor",
                reason: format!(
                    "dtype {:?} cannot be sent (f32, f16 and bf16 can)",
                    frame.payload.dtype()
                ),
            });
        }
    };
    let source = match &frame.payload {
        Payload::Buffer(buffer) => {
            buffer.check()?;
            Source::Bytes(buffer.bytes.clone())
        }
        Payload::Tensor(tensor) => {
            let in_place = cfg!(target_endian = "little")
                && tensor.device().is_cpu()
                && tensor.is_contiguous()
                && !tensor.is_variable();
            if in_place {
                Source::Tensor(tensor.clone())
            } else {
                Source::Bytes(match dtype {
                    v1::Dtype::F16 => element_bytes::<half::f16>(tensor)?,
                    v1::Dtype::Bf16 => element_bytes::<half::bf16>(tensor)?,
                    _ => element_bytes::<f32>(tensor)?,
                })
            }
        }
    };
    Ok(Outgoing {
        header: TensorFrame {
            run: frame.job,
            step: frame.step,
            stage: frame.stage,
            mb: frame.mb,
            kind: kind_to_proto(frame.kind) as i32,
            dtype: dtype as i32,
            shape: frame.payload.dims().iter().map(|&d| d as u64).collect(),
            data: Bytes::new(),
            offset: 0,
            run_secret: Bytes::new(),
        },
        source,
        data_len: frame.payload.byte_len() as usize,
        element_bytes: size,
    })
}

/// The wire dtype and element size of `dtype`, if it travels.
fn wire_dtype(dtype: DType) -> Option<(v1::Dtype, usize)> {
    match dtype {
        DType::F32 => Some((v1::Dtype::F32, 4)),
        DType::F16 => Some((v1::Dtype::F16, 2)),
        DType::BF16 => Some((v1::Dtype::Bf16, 2)),
        _ => None,
    }
}

/// gRPC's message prefix: a compression flag and a big-endian length.
pub(crate) const PREFIX: usize = 5;

/// The key of `TensorFrame.data` (field 8, length-delimited).
const DATA_KEY: u8 = (8 << 3) | 2;
/// The key of `TensorFrame.offset` (field 9, varint).
const OFFSET_KEY: u8 = 9 << 3;

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
    /// The frame with the run's secret, which every chunk carries.
    pub(crate) fn with_run_secret(mut self, secret: Bytes) -> Self {
        self.header.run_secret = secret;
        self
    }

    /// The chunks of this frame, each at most `chunk_bytes` long (rounded down to whole
    /// elements, one element at least); a frame of no elements is one empty chunk.
    pub(crate) fn chunks(
        self: &Arc<Self>,
        chunk_bytes: usize,
    ) -> impl Iterator<Item = Chunk> + use<> {
        let step = (chunk_bytes / self.element_bytes).max(1) * self.element_bytes;
        let frame = Arc::clone(self);
        let count = self.data_len.div_ceil(step).max(1);
        (0..count).map(move |i| {
            let offset = i * step;
            Chunk {
                frame: Arc::clone(&frame),
                offset,
                len: step.min(frame.data_len - offset),
            }
        })
    }

    /// The frame's fields but `data` (with the run's secret).
    pub(crate) fn header(&self) -> &TensorFrame {
        &self.header
    }

    /// The data's length in bytes.
    pub(crate) fn data_len(&self) -> usize {
        self.data_len
    }

    /// The bytes `offset..offset + len` of the frame's data.
    pub(crate) fn with_bytes<R>(
        &self,
        offset: usize,
        len: usize,
        use_bytes: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, Status> {
        let range = offset..offset + len;
        let slice = |bytes: &[u8]| -> Result<R, Status> {
            if bytes.len() != self.data_len {
                return Err(encode_error(format!(
                    "{} bytes, expected {}",
                    bytes.len(),
                    self.data_len
                )));
            }
            let part = bytes
                .get(range.clone())
                .ok_or_else(|| encode_error(format!("chunk {range:?} out of range")))?;
            Ok(use_bytes(part))
        };
        match &self.source {
            Source::Bytes(bytes) => slice(bytes),
            Source::Tensor(tensor) => {
                let (storage, layout) = tensor.storage_and_layout();
                let (start, end) = layout
                    .contiguous_offsets()
                    .ok_or_else(|| encode_error("the tensor is not contiguous"))?;
                let Storage::Cpu(cpu) = &*storage else {
                    return Err(encode_error("the tensor is not on the CPU"));
                };
                let elements = start..end;
                let bytes: Option<&[u8]> = match cpu {
                    CpuStorage::F32(v) => v.get(elements).map(bytemuck::cast_slice),
                    CpuStorage::F16(v) => v.get(elements).map(bytemuck::cast_slice),
                    CpuStorage::BF16(v) => v.get(elements).map(bytemuck::cast_slice),
                    _ => return Err(encode_error("the storage is not f32, f16 or bf16")),
                };
                slice(bytes.ok_or_else(|| encode_error("the layout exceeds the storage"))?)
            }
        }
    }
}

/// Bytes `offset..offset + len` of an outgoing frame: one `TensorFrame` message.
#[derive(Debug)]
pub(crate) struct Chunk {
    frame: Arc<Outgoing>,
    offset: usize,
    len: usize,
}

impl Chunk {
    /// Writes the `TensorFrame` message: the other fields, then `offset` and `data`
    /// (protobuf allows fields in any order).
    #[cfg(test)]
    fn write(&self, dst: &mut impl BufMut) -> Result<(), Status> {
        self.write_head(dst);
        self.frame
            .with_bytes(self.offset, self.len, |bytes| dst.put_slice(bytes))
    }

    /// Every byte of the message before the data's: the other fields, `offset`, and the
    /// data's key and length.
    fn write_head(&self, dst: &mut impl BufMut) {
        dst.put_slice(&convert::encode_message(&self.frame.header));
        if self.offset > 0 {
            dst.put_u8(OFFSET_KEY);
            put_varint(dst, self.offset as u64);
        }
        dst.put_u8(DATA_KEY);
        put_varint(dst, self.len as u64);
    }

    /// The chunk as a length-prefixed gRPC message of at most `max_message_bytes`, in two
    /// parts: the prefix and the fields before the data, and the data when it is already
    /// bytes (a slice of them, not a copy: HTTP/2 writes it to the socket from where it is).
    /// A tensor's memory is copied into the first part instead (the one copy on this side).
    pub(crate) fn wire(&self, max_message_bytes: usize) -> Result<(Bytes, Option<Bytes>), Status> {
        let mut head = BytesMut::with_capacity(
            PREFIX + 64 + 10 * self.frame.header.shape.len() + self.frame.header.run_secret.len(),
        );
        head.put_bytes(0, PREFIX);
        self.write_head(&mut head);
        let data = match &self.frame.source {
            Source::Bytes(bytes) => Some(
                self.frame
                    .with_bytes(self.offset, self.len, |part| bytes.slice_ref(part))?,
            ),
            Source::Tensor(_) => {
                head.reserve(self.len);
                self.frame
                    .with_bytes(self.offset, self.len, |bytes| head.put_slice(bytes))?;
                None
            }
        };
        let message = head.len() - PREFIX + data.as_ref().map_or(0, Bytes::len);
        if message > max_message_bytes {
            return Err(Status::out_of_range(format!(
                "a {message}-byte TensorFrame is over the {max_message_bytes}-byte limit"
            )));
        }
        let length = u32::try_from(message)
            .map_err(|_| encode_error(format!("{message} bytes do not fit a gRPC message")))?;
        head[1..PREFIX].copy_from_slice(&length.to_be_bytes());
        Ok((head.freeze(), data))
    }
}

/// The dtype, element size, shape and byte length of the tensor a frame (or its first chunk)
/// announces, refused above `max_bytes`.
fn check_layout(
    frame: &TensorFrame,
    max_bytes: usize,
) -> Result<(DType, usize, Vec<usize>, usize), Rejection> {
    let (dtype, size) = dtype_from_proto(frame.dtype)?;
    let mut shape = Vec::with_capacity(frame.shape.len());
    let mut elements: usize = 1;
    // The product of the dimensions other than 0: a tensor's strides are products of its
    // trailing dimensions, so they overflow when this does, even with no elements (found by
    // fuzzing: shape [0, 2^33, 2^33] panicked in candle's stride computation).
    let mut strides: usize = 1;
    for &d in &frame.shape {
        let d = usize::try_from(d)
            .map_err(|_| Rejection::new("shape", format!("dimension {d} does not fit usize")))?;
        let too_many =
            || Rejection::new("shape", format!("{:?} has too many elements", frame.shape));
        elements = elements.checked_mul(d).ok_or_else(too_many)?;
        strides = strides.checked_mul(d.max(1)).ok_or_else(too_many)?;
        shape.push(d);
    }
    let total = elements
        .checked_mul(size)
        .filter(|&total| total <= max_bytes)
        .ok_or_else(|| {
            Rejection::new(
                "shape",
                format!(
                    "{:?} of {dtype:?} is larger than the {max_bytes}-byte limit",
                    frame.shape
                ),
            )
        })?;
    Ok((dtype, size, shape, total))
}

/// What the receiving side hands to `recv`: tensors (real compute) or [`Buffer`]s
/// (emulated compute).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Delivery {
    /// Each frame decoded into a tensor's own storage as it arrives (one copy).
    #[default]
    Tensors,
    /// Each frame kept as its wire bytes: a frame that came as one chunk is the slice of the
    /// HTTP/2 frame that carried it (no copy); the chunks of a larger one are copied into
    /// one buffer.
    Buffers,
}

/// Where an [`Assembly`] puts the data.
#[derive(Debug)]
enum Sink {
    Tensor(Values),
    /// The chunks' data as received (slices of the DATA frames, not copies).
    Buffer(Vec<Bytes>),
    /// The data copied into one buffer as it comes (from memory that is reused, e.g. a
    /// shared-memory ring).
    Copied(BytesMut),
}

/// A tensor being received chunk by chunk, straight into its own storage (or its bytes,
/// see [`Delivery`]).
#[derive(Debug)]
pub(crate) struct Assembly {
    /// The first chunk's fields (`data` empty), which every later chunk must repeat.
    header: TensorFrame,
    dtype: DType,
    shape: Vec<usize>,
    total: usize,
    filled: usize,
    sink: Sink,
}

impl Assembly {
    /// Starts the tensor announced by `first`, refused when its layout is invalid or larger
    /// than `max_bytes`; the chunk's data is added by [`Assembly::append`].
    pub(crate) fn start(
        first: &TensorFrame,
        max_bytes: usize,
        delivery: Delivery,
    ) -> Result<Self, Rejection> {
        Self::start_as(first, max_bytes, delivery, false)
    }

    /// [`Assembly::start`] for data added by [`Assembly::append_slice`] from memory that is
    /// reused once it returns: buffers are copied into one as they come.
    pub(crate) fn start_copied(
        first: &TensorFrame,
        max_bytes: usize,
        delivery: Delivery,
    ) -> Result<Self, Rejection> {
        Self::start_as(first, max_bytes, delivery, true)
    }

    fn start_as(
        first: &TensorFrame,
        max_bytes: usize,
        delivery: Delivery,
        copied: bool,
    ) -> Result<Self, Rejection> {
        let (dtype, element_bytes, shape, total) = check_layout(first, max_bytes)?;
        if first.offset != 0 {
            return Err(Rejection::new(
                "offset",
                format!(
                    "{} starts no tensor: a tensor's first chunk has offset 0",
                    first.offset
                ),
            ));
        }
        Ok(Assembly {
            header: TensorFrame {
                data: Bytes::new(),
                ..first.clone()
            },
            dtype,
            shape,
            total,
            filled: 0,
            sink: match delivery {
                Delivery::Tensors => {
                    Sink::Tensor(Values::with_capacity(dtype, total / element_bytes)?)
                }
                Delivery::Buffers if copied => Sink::Copied(BytesMut::with_capacity(total)),
                Delivery::Buffers => Sink::Buffer(Vec::new()),
            },
        })
    }

    /// The first chunk's fields.
    pub(crate) fn header(&self) -> &TensorFrame {
        &self.header
    }

    /// Bytes received so far, and the tensor's size.
    pub(crate) fn progress(&self) -> (usize, usize) {
        (self.filled, self.total)
    }

    /// Whether `chunk` continues this tensor: the same fields and the next offset.
    pub(crate) fn check_continues(&self, chunk: &TensorFrame) -> Result<(), Rejection> {
        let h = &self.header;
        let same = chunk.run == h.run
            && chunk.step == h.step
            && chunk.stage == h.stage
            && chunk.mb == h.mb
            && chunk.kind == h.kind;
        if !same {
            return Err(Rejection::new(
                "data",
                format!(
                    "a chunk for step {} stage {} microbatch {} came before the tensor of step \
                     {} stage {} microbatch {} was complete ({} of {} bytes)",
                    chunk.step,
                    chunk.stage,
                    chunk.mb,
                    h.step,
                    h.stage,
                    h.mb,
                    self.filled,
                    self.total
                ),
            ));
        }
        if chunk.dtype != h.dtype || chunk.shape != h.shape {
            return Err(Rejection::new(
                "shape",
                format!(
                    "a later chunk says dtype {} shape {:?}, the first said dtype {} shape {:?}",
                    chunk.dtype, chunk.shape, h.dtype, h.shape
                ),
            ));
        }
        if chunk.offset != self.filled as u64 {
            return Err(Rejection::new(
                "offset",
                format!(
                    "{}, but {} bytes of the tensor have arrived (chunks come in order, \
                     without gaps or overlaps)",
                    chunk.offset, self.filled
                ),
            ));
        }
        Ok(())
    }

    /// Copies a chunk's data into the tensor's storage (or keeps it, see [`Delivery`]).
    pub(crate) fn append(&mut self, data: &Bytes) -> Result<(), Rejection> {
        self.check_append(data)?;
        match &mut self.sink {
            Sink::Tensor(values) => values.extend_le(data),
            Sink::Buffer(parts) => parts.push(data.clone()),
            Sink::Copied(joined) => joined.extend_from_slice(data),
        }
        self.filled += data.len();
        Ok(())
    }

    /// Copies a piece of the data into the tensor's storage or the buffer.
    pub(crate) fn append_slice(&mut self, data: &[u8]) -> Result<(), Rejection> {
        self.check_append(data)?;
        match &mut self.sink {
            Sink::Tensor(values) => values.extend_le(data),
            Sink::Buffer(parts) => parts.push(Bytes::copy_from_slice(data)),
            Sink::Copied(joined) => joined.extend_from_slice(data),
        }
        self.filled += data.len();
        Ok(())
    }

    fn check_append(&self, data: &[u8]) -> Result<(), Rejection> {
        let end = self.filled + data.len();
        if end > self.total {
            return Err(Rejection::new(
                "data",
                format!(
                    "{} bytes at offset {}, but the tensor's shape {:?} needs {} bytes in all",
                    data.len(),
                    self.filled,
                    self.header.shape,
                    self.total
                ),
            ));
        }
        let element_bytes = self.dtype.size_in_bytes();
        if !data.len().is_multiple_of(element_bytes) {
            return Err(Rejection::new(
                "data",
                format!(
                    "{} bytes is not a whole number of {}-byte elements",
                    data.len(),
                    element_bytes
                ),
            ));
        }
        if data.is_empty() && self.total > 0 {
            return Err(Rejection::new(
                "data",
                "an empty chunk of a non-empty tensor",
            ));
        }
        Ok(())
    }

    /// Whether every byte has arrived.
    pub(crate) fn is_complete(&self) -> bool {
        self.filled == self.total
    }

    /// The received tensor or buffer (call when [`Assembly::is_complete`]).
    pub(crate) fn finish(self, device: &Device) -> Result<Payload, Rejection> {
        match self.sink {
            Sink::Tensor(values) => values
                .into_tensor(&self.shape, device)
                .map(Payload::Tensor)
                .map_err(|e| Rejection::new("data", e.to_string())),
            Sink::Buffer(mut parts) => {
                // One chunk is handed over as it came; several are joined (one copy).
                let bytes = if parts.len() == 1 {
                    parts.pop().unwrap_or_default()
                } else {
                    let mut joined = BytesMut::with_capacity(self.total);
                    for part in &parts {
                        joined.extend_from_slice(part);
                    }
                    joined.freeze()
                };
                Ok(Payload::Buffer(Buffer {
                    dtype: self.dtype,
                    shape: self.shape,
                    bytes,
                }))
            }
            Sink::Copied(joined) => Ok(Payload::Buffer(Buffer {
                dtype: self.dtype,
                shape: self.shape,
                bytes: joined.freeze(),
            })),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejection(r: Rejection) -> Error {
        Error::InvalidArgument {
            field: "frame",
            reason: r.to_string(),
        }
    }

    /// The `TensorFrame`s a peer decodes from what [`Chunk::write`] writes for `frame` in
    /// chunks of `chunk_bytes`.
    fn wire_chunks(frame: &Frame, chunk_bytes: usize) -> Result<Vec<TensorFrame>> {
        let outgoing = Arc::new(encode(frame)?);
        outgoing
            .chunks(chunk_bytes)
            .map(|chunk| {
                let mut buf = Vec::new();
                chunk.write(&mut buf).map_err(|s| Error::InvalidArgument {
                    field: "frame",
                    reason: s.message().to_string(),
                })?;
                convert::decode_message(&buf, "TensorFrame").map_err(|e| Error::InvalidArgument {
                    field: "frame",
                    reason: e.to_string(),
                })
            })
            .collect()
    }

    /// The `TensorFrame` a peer decodes for `frame` sent whole.
    fn wire(frame: &Frame) -> Result<TensorFrame> {
        let mut chunks = wire_chunks(frame, usize::MAX)?;
        assert_eq!(chunks.len(), 1);
        Ok(chunks.remove(0))
    }

    /// Assembles chunks as the receiver does, delivering as `delivery` says.
    fn assemble_as(chunks: &[TensorFrame], delivery: Delivery) -> Result<Payload, Rejection> {
        let first = chunks
            .first()
            .ok_or_else(|| Rejection::new("data", "no chunk"))?;
        let mut assembly = Assembly::start(first, usize::MAX, delivery)?;
        assembly.append(&first.data)?;
        for chunk in &chunks[1..] {
            assembly.check_continues(chunk)?;
            assembly.append(&chunk.data)?;
        }
        if !assembly.is_complete() {
            return Err(Rejection::new("data", "incomplete"));
        }
        assembly.finish(&Device::Cpu)
    }

    /// Assembles chunks into a tensor, as the receiver of real compute does.
    fn assemble(chunks: &[TensorFrame]) -> Result<Tensor, Rejection> {
        match assemble_as(chunks, Delivery::Tensors)? {
            Payload::Tensor(t) => Ok(t),
            Payload::Buffer(_) => Err(Rejection::new("data", "a buffer, not a tensor")),
        }
    }

    /// A tensor's elements as little-endian f32 bytes.
    fn le_bytes(t: &Tensor) -> Result<Vec<u8>> {
        Ok(t.flatten_all()?
            .to_vec1::<f32>()?
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect())
    }

    fn frame_of(tensor: Tensor) -> Frame {
        Frame {
            job: 1,
            step: 2,
            stage: 3,
            mb: 4,
            kind: FrameKind::Activation,
            payload: Payload::Tensor(tensor),
        }
    }

    /// A chunk's wire form is its message, length-prefixed: a tensor's in one part, a
    /// buffer's as the fields and then a slice of the buffer itself.
    #[test]
    fn wire_form_is_the_prefixed_message() -> Result<()> {
        let t = Tensor::arange(0f32, 300.0, &Device::Cpu)?;
        let buffer = Bytes::from(le_bytes(&t)?);
        let as_buffer = Frame {
            payload: Payload::Buffer(Buffer {
                dtype: DType::F32,
                shape: vec![300],
                bytes: buffer.clone(),
            }),
            ..frame_of(t.clone())
        };
        for (frame, split) in [(frame_of(t), false), (as_buffer, true)] {
            let outgoing = Arc::new(encode(&frame)?);
            for chunk in outgoing.chunks(400) {
                let mut message = Vec::new();
                chunk
                    .write(&mut message)
                    .map_err(|s| rejection(Rejection::new("data", s.message())))?;
                let (head, data) = chunk
                    .wire(usize::MAX)
                    .map_err(|s| rejection(Rejection::new("data", s.message())))?;
                assert_eq!(data.is_some(), split);
                let mut wire = head.to_vec();
                if let Some(data) = &data {
                    assert!(buffer.as_ptr_range().contains(&data.as_ptr()), "a copy");
                    wire.extend_from_slice(data);
                }
                assert_eq!(wire[0], 0);
                assert_eq!(
                    u32::from_be_bytes([wire[1], wire[2], wire[3], wire[4]]) as usize,
                    message.len()
                );
                assert_eq!(&wire[PREFIX..], &message[..]);
                // Over the message limit: refused.
                assert!(chunk.wire(message.len() - 1).is_err());
            }
        }
        Ok(())
    }

    /// Buffers travel as their bytes: one chunk is delivered as the very slice that carried
    /// it, several are joined; either decodes to the tensor the tensor path gives.
    #[test]
    fn buffers_are_delivered_without_a_copy_when_whole() -> Result<()> {
        let t = Tensor::arange(0f32, 600.0, &Device::Cpu)?.reshape((2, 3, 100))?;
        let bytes = le_bytes(&t)?;
        let frame = Frame {
            payload: Payload::Buffer(Buffer {
                dtype: DType::F32,
                shape: vec![2, 3, 100],
                bytes: Bytes::from(bytes.clone()),
            }),
            ..frame_of(t.clone())
        };
        for chunk_bytes in [usize::MAX, 1000, 4] {
            let chunks = wire_chunks(&frame, chunk_bytes)?;
            let Payload::Buffer(got) =
                assemble_as(&chunks, Delivery::Buffers).map_err(rejection)?
            else {
                panic!("expected a buffer");
            };
            assert_eq!((got.dtype, &got.shape[..]), (DType::F32, &[2, 3, 100][..]));
            assert_eq!(&got.bytes[..], &bytes[..]);
            if chunks.len() == 1 {
                assert_eq!(
                    got.bytes.as_ptr(),
                    chunks[0].data.as_ptr(),
                    "not the same slice"
                );
            }
            // The same wire bytes decode to the same tensor either way.
            let via_buffer = Payload::Buffer(got).into_tensor(&Device::Cpu)?;
            let via_tensor = assemble(&chunks).map_err(rejection)?;
            assert_eq!(
                via_buffer.flatten_all()?.to_vec1::<f32>()?,
                via_tensor.flatten_all()?.to_vec1::<f32>()?
            );
            assert_eq!(via_tensor.dims(), t.dims());
        }
        // A buffer whose length does not match its shape is not sent.
        let short = Frame {
            payload: Payload::Buffer(Buffer {
                dtype: DType::F32,
                shape: vec![2, 3, 100],
                bytes: Bytes::from(vec![0u8; 10]),
            }),
            ..frame_of(t)
        };
        assert!(encode(&short).is_err());
        Ok(())
    }

    #[test]
    fn chunks_reassemble_bit_exactly() -> Result<()> {
        let t = Tensor::arange(0f32, 1000.0, &Device::Cpu)?
            .affine(0.37, -5.0)?
            .reshape((10, 100))?;
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let t = t.to_dtype(dtype)?;
            let size = dtype.size_in_bytes();
            // Exact multiples, ragged ends, odd sizes (rounded down to whole elements), one
            // element per chunk.
            for chunk_bytes in [usize::MAX, 4000, 1000, 999, 7, 1] {
                let chunks = wire_chunks(&frame_of(t.clone()), chunk_bytes)?;
                let step = (chunk_bytes.min(1 << 30) / size).max(1) * size;
                assert_eq!(chunks.len(), (1000 * size).div_ceil(step));
                let mut offset = 0u64;
                for c in &chunks {
                    assert_eq!(c.offset, offset);
                    assert_eq!(c.data.len() % size, 0);
                    offset += c.data.len() as u64;
                }
                let back = assemble(&chunks).map_err(rejection)?;
                assert_eq!(back.dims(), t.dims());
                let a = back.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                let b = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                assert_eq!(a, b, "{dtype:?} in chunks of {chunk_bytes}");
            }
        }
        // A tensor of no elements is one empty chunk.
        let empty = Tensor::zeros((0, 3), DType::F32, &Device::Cpu)?;
        let chunks = wire_chunks(&frame_of(empty), 16)?;
        assert_eq!(chunks.len(), 1);
        assert_eq!(assemble(&chunks).map_err(rejection)?.dims(), &[0, 3]);
        Ok(())
    }

    #[test]
    fn bad_chunk_sequences_name_the_field() -> Result<()> {
        let t = Tensor::arange(0f32, 64.0, &Device::Cpu)?.reshape((8, 8))?;
        let good = wire_chunks(&frame_of(t), 64)?;
        assert_eq!(good.len(), 4);
        let field = |chunks: Vec<TensorFrame>| match assemble(&chunks) {
            Ok(_) => "accepted",
            Err(r) => r.field,
        };
        // A gap, an overlap, a first chunk that is not at offset 0.
        let gap = vec![good[0].clone(), good[2].clone()];
        let overlap = vec![good[0].clone(), good[0].clone()];
        let late_start = good[1..].to_vec();
        assert_eq!(field(gap), "offset");
        assert_eq!(field(overlap.clone()), "offset");
        assert_eq!(field(late_start), "offset");
        // Another microbatch before this tensor is complete; a shape change mid-tensor.
        let mut other_mb = good[1].clone();
        other_mb.mb += 1;
        assert_eq!(field(vec![good[0].clone(), other_mb]), "data");
        let mut reshaped = good[1].clone();
        reshaped.shape = vec![4, 16];
        assert_eq!(field(vec![good[0].clone(), reshaped]), "shape");
        // Too many bytes, part of an element, an empty chunk, missing bytes.
        let mut long = good[3].clone();
        long.data = vec![0u8; 128].into();
        assert_eq!(
            field(vec![
                good[0].clone(),
                good[1].clone(),
                good[2].clone(),
                long
            ]),
            "data"
        );
        let mut ragged = good[0].clone();
        ragged.data = vec![0u8; 6].into();
        assert_eq!(field(vec![ragged]), "data");
        let mut empty = good[1].clone();
        empty.data = Bytes::new();
        assert_eq!(field(vec![good[0].clone(), empty]), "data");
        assert_eq!(field(good[..3].to_vec()), "data");
        assert_eq!(field(good.clone()), "accepted");
        // A shape above the limit is refused before anything is allocated.
        let err = Assembly::start(&good[0], 255, Delivery::Tensors).expect_err("256 bytes > 255");
        assert_eq!(err.field, "shape");
        Ok(())
    }

    /// An empty tensor whose other dimensions multiply past `usize` is refused, not
    /// handed to candle (whose stride computation overflowed on it).
    #[test]
    fn empty_shapes_with_overflowing_strides_are_refused() {
        let first = TensorFrame {
            kind: v1::FrameKind::Activation as i32,
            dtype: v1::Dtype::F32 as i32,
            shape: vec![0, 1 << 33, 1 << 33],
            ..TensorFrame::default()
        };
        for delivery in [Delivery::Tensors, Delivery::Buffers] {
            let err = Assembly::start(&first, usize::MAX, delivery).expect_err("overflows");
            assert_eq!(err.field, "shape");
        }
        let fits = TensorFrame {
            shape: vec![0, 1 << 16, 1 << 16],
            ..first
        };
        let payload = assemble_as(&[fits], Delivery::Tensors).expect("an empty tensor");
        assert_eq!(payload.dims(), &[0, 1 << 16, 1 << 16]);
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
                payload: Payload::Tensor(t.clone()),
            };
            let msg = wire(&frame)?;
            let back = assemble(&[msg]).map_err(rejection)?;
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
            payload: Payload::Tensor(t),
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
                payload: Payload::Tensor(t.clone()),
            };
            let msg = wire(&frame)?;
            assert_eq!(
                msg.shape,
                t.dims().iter().map(|&d| d as u64).collect::<Vec<_>>()
            );
            assert_eq!(&msg.data[..], &le_bytes(&t)?[..]);
        }
        Ok(())
    }
}
