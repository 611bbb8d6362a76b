//! The replicas' gradient sums of a step, beside its passes: when a stage's last gradient
//! pass of the step ends, its gradients go to a helper thread that sums them over the
//! job's replicas ([`StepSync::all_reduce_replicas`]) while the worker runs the rest of
//! its program (the drain of its other stages); the step's end waits for what is still
//! being summed. The helper takes the stages in the order they finish, one at a time, so
//! a worker never has two sums of its own in flight, and every sum is in replica order
//! whatever the timing (the sync's rule), so the overlap changes no bits.
//!
//! A failed sum stops the step at the next pass boundary. A pass that fails while a sum is
//! in flight returns once that sum ends: at once when the other replicas contribute, else
//! when the run is abandoned (a replica shed aborts the summing workers' sums) or the sync times out.

use std::sync::mpsc;
use std::thread::{Scope, ScopedJoinHandle};
use std::time::Instant;

use pipewise_common::pass::{Pass, PassKind};

use super::sync::{Replica, ReplicaPart, StepSync};
use crate::error::{Error, Result};

/// One stage's gradients summed over the replicas, and when the sum ran.
#[derive(Debug)]
pub(crate) struct Reduced {
    pub(crate) stage: u32,
    pub(crate) grads: Vec<f64>,
    pub(crate) started: Instant,
    pub(crate) ended: Instant,
}

/// The helper thread summing a step's stages as they finish (see the [module docs](self)).
pub(crate) struct Reducer<'scope> {
    to_sum: Option<mpsc::Sender<(u32, Vec<f64>)>>,
    helper: ScopedJoinHandle<'scope, Result<Vec<Reduced>>>,
}

impl<'scope> Reducer<'scope> {
    /// Starts the helper of step `step` for this worker's `replica`, on `scope`.
    pub(crate) fn start<'env>(
        scope: &'scope Scope<'scope, 'env>,
        sync: &'env dyn StepSync,
        step: u64,
        replica: Replica,
    ) -> Self {
        let (to_sum, stages) = mpsc::channel::<(u32, Vec<f64>)>();
        let helper = scope.spawn(move || {
            stages
                .into_iter()
                .map(|(stage, grads)| sum_stage(sync, step, replica, stage, grads))
                .collect()
        });
        Reducer {
            to_sum: Some(to_sum),
            helper,
        }
    }

    /// Hands stage `stage`'s gradients to the helper. A helper that stopped on an error
    /// takes nothing more: the error comes from [`Reducer::finish`].
    pub(crate) fn sum(&self, stage: u32, grads: Vec<f64>) {
        if let Some(to_sum) = &self.to_sum {
            let _ = to_sum.send((stage, grads));
        }
    }

    /// Whether the helper stopped before being told to: a sum failed (its error comes from
    /// [`Reducer::finish`]), so the step cannot end well and need not run on.
    pub(crate) fn failed(&self) -> bool {
        self.to_sum.is_some() && self.helper.is_finished()
    }

    /// Waits for every stage handed over to be summed.
    pub(crate) fn finish(mut self) -> Result<Vec<Reduced>> {
        drop(self.to_sum.take());
        self.helper
            .join()
            .map_err(|_| Error::invalid("replicas", "the gradient-sum thread panicked"))?
    }
}

/// Sums stage `stage`'s `grads` of step `step` over the replicas through `sync`, and says
/// when the sum ran.
pub(crate) fn sum_stage(
    sync: &dyn StepSync,
    step: u64,
    replica: Replica,
    stage: u32,
    mut grads: Vec<f64>,
) -> Result<Reduced> {
    let started = Instant::now();
    let part = ReplicaPart {
        step,
        stage,
        replica: replica.index,
    };
    sync.all_reduce_replicas(part, &mut grads)?;
    Ok(Reduced {
        stage,
        grads,
        started,
        ended: Instant::now(),
    })
}

/// For each stage of `program`, the index of its last gradient pass (`W` or the fused `BW`):
/// after it the stage's gradients of the step are final.
pub(crate) fn last_gradient_passes(program: &[Pass]) -> Vec<(usize, u32)> {
    let mut last: Vec<(usize, u32)> = Vec::new();
    for (i, p) in program.iter().enumerate() {
        if matches!(p.kind, PassKind::W | PassKind::BW) {
            match last.iter_mut().find(|(_, s)| *s == p.stage) {
                Some(entry) => entry.0 = i,
                None => last.push((i, p.stage)),
            }
        }
    }
    last.sort_unstable();
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stage_is_final_after_its_last_w_or_bw() {
        let program =
            Pass::parse_list("0F0 3F0 3BW0 0B0 0F1 3F1 3BW1 0W0 0B1 0W1").expect("valid passes");
        assert_eq!(last_gradient_passes(&program), vec![(6, 3), (9, 0)]);
        assert_eq!(last_gradient_passes(&[Pass::f(0, 0)]), vec![]);
    }
}
