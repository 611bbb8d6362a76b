//! Access to the f32 data of contiguous CPU tensors, and the split of rows over threads,
//! shared by the stage kernels.
//!
//! Reading goes through [`Tensor::storage_and_layout`] (a read lock on the storage); writing
//! in place through [`with_f32_mut`], a candle [`InplaceOp1`] whose `cpu_fwd` hands the
//! slice to a closure, so no `unsafe` is needed. A tensor is on the fast path when it is on
//! the CPU, f32 and contiguous; the callers keep candle's ops for everything else.

use std::cell::RefCell;
use std::mem::MaybeUninit;

use candle_core::{CpuStorage, DType, Layout, Shape, Storage, Tensor, WithDType};
use rayon::prelude::*;

use crate::error::Result;

/// Whether every tensor is f32, on the CPU and contiguous (the kernels' fast path).
pub(crate) fn all_f32_cpu(ts: &[&Tensor]) -> bool {
    ts.iter().all(|t| {
        t.dtype() == DType::F32 && t.device().is_cpu() && t.layout().contiguous_offsets().is_some()
    })
}

/// Runs `f` on the elements of `t`, a contiguous CPU tensor of `T` (`None` otherwise),
/// holding a read lock on its storage meanwhile.
fn with_slice<T: WithDType, R>(t: &Tensor, f: impl FnOnce(&[T]) -> R) -> Option<R> {
    let (storage, layout) = t.storage_and_layout();
    let (Storage::Cpu(s), Some((a, b))) = (&*storage, layout.contiguous_offsets()) else {
        return None;
    };
    Some(f(&T::cpu_storage_as_slice(s).ok()?[a..b]))
}

/// [`with_slice`] of a contiguous f32 CPU tensor (the kernels' fast path).
pub(crate) fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Option<R> {
    with_slice(t, f)
}

/// Runs `f` on the elements of several contiguous f32 CPU tensors (`None`, without running
/// it, if any is not one), holding a read lock on each storage meanwhile.
pub(crate) fn with_f32s<const N: usize, R>(
    ts: [&Tensor; N],
    f: impl FnOnce([&[f32]; N]) -> R,
) -> Option<R> {
    let guards = ts.map(Tensor::storage_and_layout);
    let mut slices: [&[f32]; N] = [&[]; N];
    for (slice, (storage, layout)) in slices.iter_mut().zip(&guards) {
        match (&**storage, layout.contiguous_offsets()) {
            (Storage::Cpu(CpuStorage::F32(v)), Some((a, b))) => *slice = &v[a..b],
            _ => return None,
        }
    }
    Some(f(slices))
}

/// [`with_slice`] of a u32 tensor (token ids).
pub(crate) fn with_u32<R>(t: &Tensor, f: impl FnOnce(&[u32]) -> R) -> Option<R> {
    with_slice(t, f)
}

/// The address of the buffer behind a contiguous f32 CPU tensor (its storage's, whatever
/// the tensor's offset in it), to tell whether two tensors share a storage (and its lock)
/// before locking both.
pub(crate) fn f32_addr(t: &Tensor) -> Option<usize> {
    let (storage, layout) = t.storage_and_layout();
    match (&*storage, layout.contiguous_offsets()) {
        (Storage::Cpu(CpuStorage::F32(v)), Some(_)) => Some(v.as_ptr() as usize),
        _ => None,
    }
}

/// Whether the tensors are all on the fast path and no two share a storage (so each may be
/// locked while the others are).
pub(crate) fn distinct_f32(ts: &[&Tensor]) -> bool {
    let mut addrs = Vec::with_capacity(ts.len());
    for t in ts {
        match f32_addr(t) {
            Some(a) if !addrs.contains(&a) => addrs.push(a),
            _ => return false,
        }
    }
    true
}

/// An element type whose contiguous CPU tensors the kernels borrow in place (candle's
/// `WithDType` reads a storage's slice but does not lend it mutably).
pub(crate) trait Elem: WithDType {
    /// The storage's values, when it holds this type.
    fn values(storage: &mut CpuStorage) -> Option<&mut Vec<Self>>;
}

impl Elem for f32 {
    fn values(storage: &mut CpuStorage) -> Option<&mut Vec<f32>> {
        match storage {
            CpuStorage::F32(v) => Some(v),
            _ => None,
        }
    }
}

impl Elem for f64 {
    fn values(storage: &mut CpuStorage) -> Option<&mut Vec<f64>> {
        match storage {
            CpuStorage::F64(v) => Some(v),
            _ => None,
        }
    }
}

/// An [`InplaceOp1`] that lends the storage's slice of `T` to a closure, once.
struct Lend<T, F>(RefCell<Option<F>>, std::marker::PhantomData<T>);

impl<T: Elem, F: FnOnce(&mut [T])> candle_core::InplaceOp1 for Lend<T, F> {
    fn name(&self) -> &'static str {
        "pipewise-lend"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let (Some(v), Some((a, b))) = (T::values(storage), layout.contiguous_offsets()) else {
            candle_core::bail!("pipewise-lend: not a contiguous {:?} tensor", T::DTYPE)
        };
        if let Some(f) = self.0.borrow_mut().take() {
            f(&mut v[a..b]);
        }
        Ok(())
    }
}

/// Runs `f` on the elements of `t` (a contiguous CPU tensor of `T`) with write access,
/// under its storage's write lock: every tensor sharing `t`'s buffer sees the change.
/// Returns `None` (without running `f`) where `t` is not one. Nesting calls on tensors that
/// share a buffer would deadlock: callers compare [`f32_addr`]s first.
fn with_mut<T: Elem, R>(t: &Tensor, f: impl FnOnce(&mut [T]) -> R) -> Result<Option<R>> {
    let on_path =
        t.dtype() == T::DTYPE && t.device().is_cpu() && t.layout().contiguous_offsets().is_some();
    if !on_path {
        return Ok(None);
    }
    let mut out = None;
    let lend = Lend(
        RefCell::new(Some(|s: &mut [T]| out = Some(f(s)))),
        std::marker::PhantomData,
    );
    t.inplace_op1(&lend)?;
    drop(lend);
    Ok(out)
}

/// [`with_mut`] of a contiguous f32 CPU tensor (the kernels' fast path).
pub(crate) fn with_f32_mut<R>(t: &Tensor, f: impl FnOnce(&mut [f32]) -> R) -> Result<Option<R>> {
    with_mut(t, f)
}

/// [`with_mut`] of a contiguous f64 CPU tensor (accumulated gradients).
pub(crate) fn with_f64_mut<R>(t: &Tensor, f: impl FnOnce(&mut [f64]) -> R) -> Result<Option<R>> {
    with_mut(t, f)
}

/// [`with_slice`] of an f64 tensor (accumulated gradients).
pub(crate) fn with_f64<R>(t: &Tensor, f: impl FnOnce(&[f64]) -> R) -> Option<R> {
    with_slice(t, f)
}

/// Room for a kernel's output of `n` f32, not zeroed: `vec![0; n]` memsets the reused heap
/// block first, about 3 % of a training step. The kernel writes every element, then
/// [`written`] takes the vector as f32.
pub(crate) fn uninit(n: usize) -> Vec<MaybeUninit<f32>> {
    let mut v = Vec::with_capacity(n);
    v.resize_with(n, MaybeUninit::uninit);
    v
}

/// `v` as the f32 a kernel wrote into it.
///
/// # Safety
/// Every element of `v` must have been written.
#[allow(unsafe_code)]
pub(crate) unsafe fn written(v: Vec<MaybeUninit<f32>>) -> Vec<f32> {
    let mut v = std::mem::ManuallyDrop::new(v);
    let (ptr, len, cap) = (v.as_mut_ptr(), v.len(), v.capacity());
    // SAFETY: `MaybeUninit<f32>` has f32's size and alignment, so the allocation is one of
    // `cap` f32; its first `len` are initialised (the caller's contract); `v` is not
    // dropped, so the allocation has one owner.
    unsafe { Vec::from_raw_parts(ptr.cast::<f32>(), len, cap) }
}

/// A CPU f32 tensor of `shape` holding `v` (no copy).
pub(crate) fn tensor(v: Vec<f32>, shape: impl Into<Shape>) -> Result<Tensor> {
    Ok(Tensor::from_vec(v, shape, &candle_core::Device::Cpu)?)
}

/// Rows below which one thread does the work (a rayon task costs a few µs).
pub(crate) const PAR_MIN_ROWS: usize = 64;

/// The threads the kernels may use: the current rayon pool's inside one (so a test can
/// `install` a pool of 1 or 2), else candle's count (`RAYON_NUM_THREADS`) at most the
/// calling thread's [`limit_threads`], without touching rayon's global pool when that is 1.
pub(crate) fn threads() -> usize {
    if rayon::current_thread_index().is_some() {
        rayon::current_num_threads()
    } else {
        match LIMIT.get() {
            0 => candle_threads(),
            n => candle_threads().min(n),
        }
    }
}

thread_local! {
    /// The calling thread's cap on [`threads`] (0: none).
    static LIMIT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Caps the threads the kernels called from this thread fan out to (0: no cap): a worker
/// sharing its host's cores with other workers uses its share. Fanning out further gains
/// nothing on cores the other workers keep busy, and each hand-over to rayon's pool and
/// back costs two context switches (the README's `pipewise local`, 4 workers on 2 cores:
/// 30–37 → 27–28 ms a step at 1 thread each). Results do not change: every kernel splits its
/// work so that no sum depends on the threads.
pub(crate) fn limit_threads(n: usize) {
    LIMIT.set(n);
}

/// candle's thread count (`candle_core::utils::get_num_threads`), read once per process:
/// without `RAYON_NUM_THREADS` candle counts physical cores by parsing `/proc/cpuinfo` on
/// every call, and kernels ask on every pass (2,500 reads a step, more system time than
/// compute, in the README's `pipewise local`). Like rayon's global pool, it does not follow
/// later changes of the environment.
pub(crate) fn candle_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(candle_core::utils::get_num_threads)
}

/// What the `pipewise` binary calls first: where `RAYON_NUM_THREADS` is not a positive
/// number, sets it to candle's count (physical cores, or `CANDLE_CPU_MASK`'s), at most the
/// cores this process may use (affinity, cgroup quota), so candle's own CPU ops (bf16
/// matmuls and the like, which ask on every call) read the variable instead of parsing
/// `/proc/cpuinfo`, and rayon's global pool has the size candle plans for. Where
/// `CANDLE_NUM_THREADS` is unset it sets it to 1: candle's element-wise ops over 64 Ki
/// elements otherwise go to its own barrier pool, whose threads ignore the lanes' one-thread
/// pools, spin 25,000 times after each op and take one op at a time, so two lanes on two
/// cores shared them with a third, spinning thread (the step bench's small model at 2
/// threads: 0.64 → 0.54 s a step). Our kernels and gemm thread through rayon, which the
/// lanes confine; the few candle element-wise ops left on the f32 path (the embedding's
/// position add, bf16 and f64 conversions) then run on one thread in every mode. Returns
/// the count the kernels use.
///
/// # Safety
///
/// No other thread may exist yet (it writes the environment).
#[allow(unsafe_code)]
pub unsafe fn settle_thread_count() -> usize {
    let set = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .is_some_and(|n| n > 0);
    if !set {
        let usable = std::thread::available_parallelism().map_or(1, |n| n.get());
        let n = candle_core::utils::get_num_threads().min(usable).max(1);
        // SAFETY: the caller guarantees that no other thread exists, so nothing reads or
        // writes the environment at the same time.
        #[allow(unsafe_code)]
        unsafe {
            std::env::set_var("RAYON_NUM_THREADS", n.to_string());
        }
    }
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        // SAFETY: as above.
        #[allow(unsafe_code)]
        unsafe {
            std::env::set_var("CANDLE_NUM_THREADS", "1");
        }
    }
    candle_threads()
}

/// What a process that runs stages calls first (the `pipewise` binary, the step bench's
/// child): the heap policy ([`crate::alloc::policy_from_env`]), then
/// [`settle_thread_count`]. Returns the count the kernels use.
///
/// # Safety
///
/// No other thread may exist yet (it writes the environment).
#[allow(unsafe_code)]
pub unsafe fn set_up_process() -> usize {
    crate::alloc::policy_from_env();
    // SAFETY: the caller's contract (the heap policy starts no thread).
    unsafe { settle_thread_count() }
}

/// Columns per rayon task for a reduction over `rows` of `cols` columns (each task sums
/// whole columns, in row order, so the split never changes a result), or `None` to stay on
/// this thread. Blocks are a multiple of 16 columns (a cache line).
pub(crate) fn cols_per_task(rows: usize, cols: usize) -> Option<usize> {
    let t = threads();
    (t > 1 && rows >= PAR_MIN_ROWS && cols >= 128)
        .then(|| cols.div_ceil(t).next_multiple_of(16).max(64))
}

/// Rows per rayon task for `rows` independent rows, or `None` to stay on this thread (one
/// thread, or too few rows). Rows are computed the same way whoever computes them, so the
/// split never changes a result.
pub(crate) fn rows_per_task(rows: usize) -> Option<usize> {
    let t = threads();
    (t > 1 && rows >= PAR_MIN_ROWS).then(|| rows.div_ceil(4 * t).max(16))
}

/// A fresh output of `rows` rows of `cols` f32, filled block by block of whole rows, over
/// the threads where [`rows_per_task`] says so: `fill(first_row, block)` is given a block's
/// first row and its room, `block.len() / cols` rows. A kernel whose rows are independent
/// needs no more scaffolding than its row loop.
///
/// # Safety
/// `fill` must write every element of every block it is given.
#[allow(unsafe_code)]
pub(crate) unsafe fn fill_rows(
    rows: usize,
    cols: usize,
    fill: impl Fn(usize, &mut [MaybeUninit<f32>]) + Sync,
) -> Vec<f32> {
    let mut out = uninit(rows * cols);
    match rows_per_task(rows) {
        Some(k) if cols > 0 => out
            .par_chunks_mut(k * cols)
            .enumerate()
            .for_each(|(i, block)| fill(i * k, block)),
        _ => fill(0, &mut out),
    }
    // SAFETY: the blocks cover `out`, and `fill` writes all of each (the caller's contract).
    unsafe { written(out) }
}

/// The elements of `s` under a contiguous `l` inside a [`candle_core::CustomOp1`]-style
/// `cpu_fwd`; an error naming `op` where it is not contiguous f32.
pub(crate) fn storage_f32<'a>(
    s: &'a CpuStorage,
    l: &Layout,
    op: &str,
) -> candle_core::Result<&'a [f32]> {
    match (s, l.contiguous_offsets()) {
        (CpuStorage::F32(v), Some((a, b))) => Ok(&v[a..b]),
        _ => candle_core::bail!("{op}: expects a contiguous f32 CPU tensor"),
    }
}

/// [`storage_f32`] of a tensor's storage as [`Tensor::storage_and_layout`] lends it, checking
/// its length; an error naming `name` otherwise.
pub(crate) fn storage_slice<'a>(
    s: &'a Storage,
    l: &Layout,
    name: &str,
    len: usize,
) -> candle_core::Result<&'a [f32]> {
    let v = match s {
        Storage::Cpu(s) => storage_f32(s, l, name)?,
        _ => candle_core::bail!("{name}: expects a contiguous f32 CPU tensor"),
    };
    if v.len() != len {
        candle_core::bail!("{name} has {} elements, expected {len}", v.len());
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A limit holds for the thread that set it, and only there.
    #[test]
    fn a_limit_caps_only_the_calling_threads_kernels() {
        let all = candle_threads();
        std::thread::spawn(move || {
            limit_threads(1);
            assert_eq!(threads(), 1);
            let other = std::thread::spawn(threads).join();
            assert_eq!(other.ok(), Some(all));
            limit_threads(0);
            assert_eq!(threads(), all);
        })
        .join()
        .expect("the limited thread's checks");
    }
}
