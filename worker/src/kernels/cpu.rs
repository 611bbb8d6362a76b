//! Reading candle's CPU storage as plain f32 slices, and deciding when the kernels apply.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, Layout, Storage, Tensor};

/// Whether every tensor is f32 on the CPU: the kernels' domain (everything else, bf16 and
/// CUDA, runs the candle-op path of `ops`).
pub(crate) fn applies(tensors: &[&Tensor]) -> bool {
    tensors
        .iter()
        .all(|t| t.dtype() == DType::F32 && t.device().is_cpu())
}

/// The elements of a contiguous f32 CPU storage under `layout`.
pub(crate) fn f32_slice<'a>(
    storage: &'a CpuStorage,
    layout: &Layout,
    name: &str,
) -> candle_core::Result<&'a [f32]> {
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg(format!("{name} is not contiguous")))?;
    match storage {
        CpuStorage::F32(v) => Ok(&v[start..end]),
        other => candle_core::bail!("{name} is {:?}, not f32", other.dtype()),
    }
}

/// [`f32_slice`] of a tensor's storage as `storage_and_layout` lends it, checking its length.
pub(crate) fn storage_slice<'a>(
    storage: &'a Storage,
    layout: &Layout,
    name: &str,
    len: usize,
) -> candle_core::Result<&'a [f32]> {
    let s = match storage {
        Storage::Cpu(s) => f32_slice(s, layout, name)?,
        _ => candle_core::bail!("{name} is not on the CPU"),
    };
    if s.len() != len {
        candle_core::bail!("{name} has {} elements, expected {len}", s.len());
    }
    Ok(s)
}
