//! A stage whose optimizer state is sharded across data-parallel replicas
//! ([`crate::optim::ShardState`]): handing its state to a shard, the update on the shard,
//! the gathered values back in, and the whole state back for a checkpoint.

use candle_core::{Device, Tensor};

use super::Stage;
use crate::error::{Error, Result};
use crate::optim::{AdamW, ShardState, Sharding};
use crate::param::STATE_DTYPE;

impl Stage {
    /// Moves this stage's optimizer state for shard `sharding` into a [`ShardState`] and
    /// drops the parameters' own moments and master copies: from now on the step runs
    /// through [`Stage::sharded_step`].
    pub(crate) fn shard_optimizer(&mut self, sharding: Sharding) -> Result<ShardState> {
        let params: Vec<_> = self.params().collect();
        let state = ShardState::take(&params, sharding)?;
        let device = self.device.clone();
        for p in self.params_mut() {
            p.m = Tensor::zeros(0, STATE_DTYPE, &device)?;
            p.v = Tensor::zeros(0, STATE_DTYPE, &device)?;
            p.master = None;
        }
        Ok(state)
    }

    /// One AdamW step of `shard` with gradients multiplied by `clip_scale`: the shard's
    /// summed gradients (ZeRO-2) or its part of the parameters' own; zeroes the gradients.
    /// The parameters take the update from [`Stage::install_gathered`]. Fails while
    /// microbatches are pending.
    pub(crate) fn sharded_step(&mut self, shard: &mut ShardState, clip_scale: f64) -> Result<()> {
        if let Some((&mb, _)) = self.pending.iter().next() {
            return Err(self.order_error("step", mb, "still pending at the optimizer step"));
        }
        let grads = match shard.grad.take() {
            Some(grads) => grads,
            None => shard.grads_of(self.params())?,
        };
        let step = self.step + 1;
        let cfg = AdamW {
            lr: self.adamw.lr_at(step),
            ..self.adamw
        };
        shard.load_values(self.params())?;
        shard.update(&grads, &cfg, step, clip_scale)?;
        self.step = step;
        self.zero_grad()
    }

    /// Takes `wide` (every shard's updated f32 values, in shard order: the stage's
    /// flattened parameters) as the parameters' values, each rounded to the model dtype
    /// as a master copy is.
    pub(crate) fn install_gathered(&mut self, wide: &[f32]) -> Result<()> {
        let want: usize = self.params().map(|p| p.value.elem_count()).sum();
        if wide.len() != want {
            return Err(Error::invalid(
                "data_parallel_shard_degree",
                format!("{} gathered values for a stage of {want}", wide.len()),
            ));
        }
        let mut at = 0;
        for p in self.params_mut() {
            let n = p.value.elem_count();
            let t = Tensor::from_slice(&wide[at..at + n], p.value.shape(), &Device::Cpu)?
                .to_device(p.value.device())?;
            p.value = t.to_dtype(p.value.dtype())?;
            at += n;
        }
        Ok(())
    }

    /// Installs the whole optimizer state gathered from every shard (`wide`, `m`, `v`:
    /// the stage's flattened parameters, in f32), as before [`Stage::shard_optimizer`]:
    /// what a checkpoint saves, loadable on any layout.
    pub(crate) fn unshard_optimizer(&mut self, wide: &[f32], m: &[f32], v: &[f32]) -> Result<()> {
        let shapes: Vec<_> = self.params().map(|p| p.value.shape().clone()).collect();
        let want: usize = shapes.iter().map(|s| s.elem_count()).sum();
        if [wide.len(), m.len(), v.len()].iter().any(|&n| n != want) {
            return Err(Error::invalid(
                "data_parallel_shard_degree",
                format!(
                    "gathered state of {}, {} and {} values for a stage of {want}",
                    wide.len(),
                    m.len(),
                    v.len()
                ),
            ));
        }
        let mut at = 0;
        let mut loaded = Vec::with_capacity(shapes.len());
        for shape in shapes {
            let n = shape.elem_count();
            let part =
                |xs: &[f32]| Tensor::from_slice(&xs[at..at + n], shape.clone(), &Device::Cpu);
            loaded.push((part(wide)?, part(m)?, part(v)?));
            at += n;
        }
        self.replace_state(loaded, self.step)
    }
}
