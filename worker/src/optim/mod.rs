//! AdamW with decoupled weight decay, and gradient clipping by the whole model's norm.
//!
//! Clipping across stages works in two steps: every stage reports
//! [`Stage::grad_sq_norm`](crate::Stage::grad_sq_norm); the driver adds them up and computes
//! one scale with [`clip_scale`]; every stage then calls
//! [`Stage::optimizer_step`](crate::Stage::optimizer_step) with that scale.
//!
//! [`AdamW`] and [`clip_scale`] are in `adamw`, the update in `update`: apart, so that the
//! fused kernel, which the update calls, can name [`AdamW`] without an import cycle.

mod adamw;
mod shard;
mod update;

pub use adamw::{AdamW, clip_scale};
pub(crate) use shard::ShardState;
pub use shard::{Sharding, ZeroStage, shard_range};
pub(crate) use update::update;
/// The fused update and the candle reference the kernels' tests compare it with.
#[cfg(test)]
pub(crate) use update::{update_candle, update_fused};
