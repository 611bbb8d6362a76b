//! A tied table's copy's gradients summed at the root over gRPC in chunks, [`GRAD_CHUNK`]
//! values per call with [`GRAD_WINDOW`] calls in flight at once; and the all-gather of
//! optimizer shards, through the replicas' chain sum.

use pipewise_proto::v1::{ReduceOp, ReduceReply};

use super::NetSync;
use crate::error::{Error, Result};
use crate::net::grad_sum::{GRAD_CHUNK, GRAD_WINDOW, from_bytes};
use crate::optim::shard_range;
use crate::runtime::{Gathered, ReplicaPart, ShardPart, StepSync};

/// The steps a gather of shards is keyed by in the replicas' sums, apart from every
/// training step's: this bit, then the step and which state.
const GATHER_STEPS: u64 = 1 << 62;

impl NetSync {
    /// Sends `grads` in chunks for the sum `sum` (`what` names it in errors) and leaves the
    /// sum the summing worker answers in `grads`.
    pub(super) fn sum_in_chunks(
        &self,
        what: &str,
        sum: (ReduceOp, ReplicaPart),
        grads: &mut [f64],
    ) -> Result<()> {
        let field = "tie_embeddings";
        let chunks = grads.len().div_ceil(GRAD_CHUNK).max(1) as u32;
        // A window of chunks in flight at once (the root sums each as both copies' parts
        // come): the round trips overlap, and the bytes held on both sides stay bounded.
        let window = GRAD_CHUNK * GRAD_WINDOW;
        for (first, group) in grads.chunks_mut(window).enumerate() {
            let calls: Vec<_> = group
                .chunks(GRAD_CHUNK)
                .enumerate()
                .map(|(i, values)| {
                    let chunk = (first * GRAD_WINDOW + i) as u32;
                    let req = self.grads_request(sum, (chunk, chunks), values);
                    self.runtime.spawn(self.answer(what.to_string(), req))
                })
                .collect();
            let replies: Vec<Result<ReduceReply>> = self.runtime.block_on(async {
                let mut replies = Vec::with_capacity(calls.len());
                for call in calls {
                    replies.push(call.await.unwrap_or_else(|e| {
                        Err(Error::Call {
                            call: what.to_string(),
                            peer: self.root.clone(),
                            code: tonic::Code::Internal,
                            message: format!("the call's task ended: {e}"),
                        })
                    }));
                }
                replies
            });
            for (i, (values, reply)) in group.chunks_mut(GRAD_CHUNK).zip(replies).enumerate() {
                let chunk = (first * GRAD_WINDOW + i) as u32;
                let reply = match reply {
                    // Not delivered: the root not reachable yet.
                    Err(Error::Call {
                        code: tonic::Code::Unavailable,
                        ..
                    }) => self.send_retrying(what, &[tonic::Code::Unavailable], || {
                        self.grads_request(sum, (chunk, chunks), values)
                    }),
                    other => other,
                };
                let summed = from_bytes(&reply?.grads, "ReduceReply.grads")
                    .map_err(|s| Error::invalid(field, format!("{what}: {}", s.message())))?;
                if summed.len() != values.len() {
                    return Err(Error::invalid(
                        field,
                        format!(
                            "{what}: a sum of {} values for {}",
                            summed.len(),
                            values.len()
                        ),
                    ));
                }
                values.copy_from_slice(&summed);
            }
        }
        Ok(())
    }
}

impl NetSync {
    /// An all-gather of optimizer shards through the replicas' chain sum: every replica
    /// passes the stage's whole length of `-0.0` with its shard in place (the first shard
    /// group's; the other groups hold the same values and pass `-0.0` only). Adding `-0.0`
    /// leaves every value's bits as they are, so the sum is the shards side by side.
    pub(super) fn gather_by_sum(&self, part: ShardPart, shard: &[f32]) -> Result<Vec<f32>> {
        let total = usize::try_from(part.total).unwrap_or(usize::MAX);
        let range = shard_range(total, part.shard, part.shards);
        if range.len() != shard.len() || part.shards == 0 {
            return Err(Error::invalid(
                "data_parallel_shard_degree",
                format!(
                    "{part}: a shard of {} values, not {}",
                    shard.len(),
                    range.len()
                ),
            ));
        }
        let mut values = vec![-0.0f64; total];
        if part.group == 0 {
            for (v, &x) in values[range].iter_mut().zip(shard) {
                *v = f64::from(x);
            }
        }
        let what = match part.what {
            Gathered::Values => 0,
            Gathered::Master => 1,
            Gathered::FirstMoment => 2,
            Gathered::SecondMoment => 3,
        };
        let key = ReplicaPart {
            step: GATHER_STEPS | (part.step << 2) | what,
            stage: part.stage,
            replica: part.group * part.shards + part.shard,
        };
        self.all_reduce_replicas(key, &mut values)?;
        // Each value is one shard's f32, widened exactly.
        Ok(values.iter().map(|&v| v as f32).collect())
    }
}
