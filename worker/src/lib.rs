//! `pipewise-worker`: stage compute on candle — a GPT-style decoder cut into stages, with an
//! exact `F` / `B` / `W` split.
//!
//! # Layout
//!
//! - [`stage`]: [`Stage`], a contiguous range of the model's pieces with `forward` (F),
//!   `backward_input` (B), `backward_weight` (W), `backward` (BW), stash-byte accounting and
//!   the optimizer step.
//! - `piece` (private): the embedding, transformer block and head, each with its forward,
//!   input-gradient and weight-gradient math and the stashes between them.
//! - `kernels` (private): the CPU f32 stage kernels (GEMM with folded bias and residual,
//!   fused element-wise passes) as candle custom ops.
//! - `ops` (private): hand-written forward and backward of linear, LayerNorm, tanh-GELU,
//!   causal attention and cross-entropy on candle-core tensors (LayerNorm, softmax, loss
//!   and token sums computed in f32 for a bf16 model).
//! - `kernels` (private): fused, vectorised CPU kernels (f32) for LayerNorm, GELU,
//!   cross-entropy, token sums and AdamW, with run-time ISA dispatch and rows split over
//!   threads; `ops`, `optim` and `param` use them on the CPU and keep candle's ops elsewhere.
//! - [`param`]: parameters with their f32 gradient, AdamW moments and (bf16) master copy,
//!   seeded initialisation: Megatron-LM's mixed-precision layout.
//! - [`optim`]: AdamW and global-norm clipping across stages.
//! - [`checkpoint`]: a stage's parameters, optimizer state and step as safetensors.
//! - [`confined`]: a job's files under the data directory, opened at each use without
//!   following a symlink below it.
//! - [`trainer`]: the single-device reference trainer (the whole model as one stage).
//! - [`data`]: the training corpus (a generated default one, or text files, JSON Lines or
//!   token files, encoded by a byte-level or Hugging Face tokenizer and cached) and a
//!   seeded window sampler.
//! - [`runtime`]: the pipeline executor ([`runtime::WorkerRuntime`] runs a worker's program
//!   of a schedule for one step), the worker-to-worker [`runtime::Transport`] and
//!   [`runtime::run_local`] (all workers on threads of one process), and the emulated
//!   runtime [`runtime::EmulatedRuntime`] (`[compute] mode = "emulate"`: passes sleep for
//!   their cost-model time, frames are real buffers of the true size).
//! - [`net`]: the gRPC activation transport ([`net::GrpcTransport`]) and the end-of-step
//!   collectives across processes ([`net::NetSync`], served by a job's worker 0).
//! - [`node`]: the worker process: a connection actor (register, heartbeat, assignments)
//!   and an executor thread running assignments with the transport above.
//! - [`metrics`]: the worker's Prometheus metrics (pass durations, bubble, memory).
//! - [`job`]: what a worker derives from a job spec (optimizer, sampler, corpus, partition).
//! - [`lanes`]: independent work side by side, one item per CPU thread, each on one kernel
//!   thread: a one-worker step's microbatches (`PIPEWISE_SIDE_BY_SIDE=0` turns it off).
//! - [`rng`]: the deterministic host-side random source.
//! - [`test_utils`]: [`test_device!`] and device helpers for tests.
//! - [`error`]: the crate's one error type.
//! - [`alloc`]: the worker process's heap policy (freed buffers kept for reuse, glibc).
//! - [`sched`]: the async runtime whose threads do not preempt compute (`SCHED_BATCH`).
//!
//! The model's sizes come from [`pipewise_common::model::ModelSpec`], which also predicts
//! the stash bytes that [`Stage::stash_bytes`] measures.

pub mod alloc;
pub mod checkpoint;
pub mod confined;
pub mod data;
pub mod error;
pub mod eval;
pub mod hf;
pub mod job;
mod kernels;
pub mod lanes;
mod llama_ops;
pub mod metrics;
pub mod net;
pub mod node;
mod ops;
pub mod optim;
pub mod param;
mod piece;
pub mod rng;
pub mod runtime;
pub mod sched;
pub mod stage;
pub mod test_utils;
pub mod trainer;

pub use candle_core::{DType as CandleDType, Device, Tensor};
pub use data::{Batch, Corpus, DataSource, Sampler, Tokenizer};
pub use error::{Error, Result};
pub use kernels::cpu::{set_up_process, settle_thread_count};
pub use kernels::in_use as kernels_in_use;
pub use optim::{AdamW, clip_scale};
pub use stage::Stage;
pub use trainer::{StepStats, Trainer};
