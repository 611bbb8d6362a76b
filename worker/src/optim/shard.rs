//! A sharded optimizer across data-parallel replicas (ZeRO-1 and ZeRO-2): each of `count`
//! replicas that share their optimizer state keeps AdamW's moments and the f32 master
//! weights of 1/`count` of a stage's parameters, flattened in [`Stage::params`] order
//! ([`ShardState`]); with ZeRO-2 also the summed gradient of that shard. The update runs on
//! the shard with the arithmetic of the whole-parameter update (element by element, so the
//! bits are the same), and an all-gather returns the updated values to every replica.
//!
//! [`Stage::params`]: crate::Stage::params

use std::ops::Range;

use candle_core::Tensor;

use super::adamw::AdamW;
use crate::error::{Error, Result};
use crate::kernels::adamw::{Hyper, update_slices};
use crate::param::{Param, STATE_DTYPE};

/// Which of a stage's states the replicas of a shard group split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZeroStage {
    /// The optimizer state: moments and master weights (ZeRO-1).
    OptimizerState,
    /// The optimizer state and the summed gradients (ZeRO-2).
    Gradients,
}

impl ZeroStage {
    /// `zero_stage = 1` or `2`; anything else is refused, naming the field.
    pub fn from_number(stage: u32) -> Result<Self> {
        match stage {
            1 => Ok(Self::OptimizerState),
            2 => Ok(Self::Gradients),
            other => Err(Error::invalid(
                "zero_stage",
                format!(
                    "{other}: the sharded optimizer has stages 1 (optimizer state) and 2 (also gradients)"
                ),
            )),
        }
    }
}

/// A worker's place in its shard group: shard `index` of `count` replicas sharing their
/// optimizer state (`data_parallel_shard_degree`), and what they shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sharding {
    /// This worker's shard (0-based).
    pub index: u32,
    /// The shard degree.
    pub count: u32,
    /// What is sharded.
    pub stage: ZeroStage,
}

/// The part of `total` flattened values shard `index` of `count` owns: contiguous, in
/// shard order, sizes differing by at most one.
pub fn shard_range(total: usize, index: u32, count: u32) -> Range<usize> {
    let count = count.max(1) as usize;
    let index = (index as usize).min(count);
    let at = |i: usize| total * i / count;
    at(index)..at(index + 1)
}

/// A parameter's part of a shard: where in the shard, and whether AdamW's weight decay
/// applies to it.
#[derive(Debug, Clone)]
struct Segment {
    in_shard: Range<usize>,
    decay: bool,
}

/// One stage's optimizer state for its shard of the flattened parameters.
#[derive(Debug, Clone)]
pub(crate) struct ShardState {
    /// The shard's range in the stage's flattened parameters.
    pub(crate) range: Range<usize>,
    /// All the stage's flattened parameters.
    pub(crate) total: usize,
    segments: Vec<Segment>,
    /// The f32 values the update works on: the master copy of narrower parameters, kept;
    /// of f32 parameters, their values' shard, taken for the update only
    /// ([`ShardState::load_values`], [`ShardState::release_values`]).
    pub(crate) wide: Vec<f32>,
    /// Whether `wide` is a master copy the shard keeps.
    keeps_master: bool,
    pub(crate) m: Vec<f32>,
    pub(crate) v: Vec<f32>,
    /// ZeRO-2: the shard of the step's gradients summed over the replicas (`None`: the
    /// parameters' own gradients are whole and summed, ZeRO-1).
    pub(crate) grad: Option<Vec<f64>>,
}

/// `t`'s values, flattened, as f32 (exact for f32 and narrower dtypes).
fn host_f32(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.flatten_all()?.to_dtype(STATE_DTYPE)?.to_vec1::<f32>()?)
}

impl ShardState {
    /// Takes shard `sharding` of `params`' wide values and moments (the params keep theirs:
    /// the caller drops them).
    pub(crate) fn take(params: &[&Param], sharding: Sharding) -> Result<Self> {
        let total: usize = params.iter().map(|p| p.value.elem_count()).sum();
        let keeps_master = params.iter().any(|p| p.master.is_some());
        let range = shard_range(total, sharding.index, sharding.count);
        let mut state = Self {
            range: range.clone(),
            total,
            segments: Vec::new(),
            wide: Vec::with_capacity(if keeps_master { range.len() } else { 0 }),
            keeps_master,
            m: Vec::with_capacity(range.len()),
            v: Vec::with_capacity(range.len()),
            grad: None,
        };
        let mut at = 0;
        for p in params {
            let n = p.value.elem_count();
            let (lo, hi) = (range.start.max(at), range.end.min(at + n));
            if lo < hi {
                let in_param = lo - at..hi - at;
                if let Some(master) = &p.master {
                    state
                        .wide
                        .extend_from_slice(&host_f32(master)?[in_param.clone()]);
                }
                state
                    .m
                    .extend_from_slice(&host_f32(&p.m)?[in_param.clone()]);
                state
                    .v
                    .extend_from_slice(&host_f32(&p.v)?[in_param.clone()]);
                state.segments.push(Segment {
                    in_shard: lo - range.start..hi - range.start,
                    decay: p.decay,
                });
            }
            at += n;
        }
        Ok(state)
    }

    /// One AdamW update of the shard at step `step` (1-based) with gradient
    /// `grad_scale · grads` (`grads`: the shard's summed gradients).
    pub(crate) fn update(
        &mut self,
        grads: &[f64],
        cfg: &AdamW,
        step: u64,
        grad_scale: f64,
    ) -> Result<()> {
        if grads.len() != self.wide.len() {
            return Err(Error::invalid(
                "data_parallel_shard_degree",
                format!(
                    "{} gradient values for a shard of {}",
                    grads.len(),
                    self.wide.len()
                ),
            ));
        }
        for seg in &self.segments {
            let hyper = Hyper {
                lr: cfg.lr,
                beta1: cfg.beta1,
                beta2: cfg.beta2,
                eps: cfg.eps,
                weight_decay: cfg.weight_decay,
                decay: seg.decay,
                step,
                grad_scale,
            };
            let r = seg.in_shard.clone();
            update_slices(
                &mut self.wide[r.clone()],
                &grads[r.clone()],
                &mut self.m[r.clone()],
                &mut self.v[r],
                hyper,
            );
        }
        Ok(())
    }

    /// The shard's part of `params`' `values` (each flattened), in order.
    fn slice_of<'a, T: Copy>(
        &self,
        params: impl Iterator<Item = &'a Param>,
        values: impl Fn(&Param) -> Result<Vec<T>>,
    ) -> Result<Vec<T>> {
        let mut out = Vec::with_capacity(self.range.len());
        let mut at = 0;
        for p in params {
            let n = p.value.elem_count();
            let (lo, hi) = (self.range.start.max(at), self.range.end.min(at + n));
            if lo < hi {
                out.extend_from_slice(&values(p)?[lo - at..hi - at]);
            }
            at += n;
        }
        Ok(out)
    }

    /// The shard of `params`' gradients (each whole and summed), flattened.
    pub(crate) fn grads_of<'a>(&self, params: impl Iterator<Item = &'a Param>) -> Result<Vec<f64>> {
        self.slice_of(params, |p| Ok(p.grad.flatten_all()?.to_vec1::<f64>()?))
    }

    /// The shard's f32 values: the master copy it keeps, or `params`' values' shard.
    pub(crate) fn wide_of<'a>(&self, params: impl Iterator<Item = &'a Param>) -> Result<Vec<f32>> {
        if self.keeps_master {
            return Ok(self.wide.clone());
        }
        self.slice_of(params, |p| host_f32(&p.value))
    }

    /// Takes the values' shard of f32 `params` for the update (a master copy is kept).
    pub(crate) fn load_values<'a>(
        &mut self,
        params: impl Iterator<Item = &'a Param>,
    ) -> Result<()> {
        if !self.keeps_master {
            self.wide = self.slice_of(params, |p| host_f32(&p.value))?;
        }
        Ok(())
    }

    /// Drops the values' shard taken by [`ShardState::load_values`] once gathered.
    pub(crate) fn release_values(&mut self) {
        if !self.keeps_master {
            self.wide = Vec::new();
        }
    }

    /// Bytes of the optimizer state held between steps: moments and the master copy.
    pub(crate) fn optimizer_bytes(&self) -> u64 {
        ((self.wide.len() + self.m.len() + self.v.len()) * std::mem::size_of::<f32>()) as u64
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn shards_cover_the_values_in_order() {
        let ranges: Vec<_> = (0..4).map(|i| shard_range(10, i, 4)).collect();
        assert_eq!(ranges, vec![0..2, 2..5, 5..7, 7..10]);
        assert_eq!(shard_range(3, 0, 1), 0..3);
        assert_eq!(shard_range(2, 3, 4), 1..2);
    }

    #[test]
    fn only_stages_1_and_2_exist() {
        assert_eq!(ZeroStage::from_number(2).ok(), Some(ZeroStage::Gradients));
        let err = ZeroStage::from_number(3).unwrap_err().to_string();
        assert!(err.contains("zero_stage"), "{err}");
    }
}
