//! Gradient chunks over gRPC: [`GRAD_CHUNK`] values per call (under tonic's 4 MiB message
//! limit), [`GRAD_WINDOW`] calls in flight, f64 values as little-endian bytes; and the sums
//! of a tied table's two copies at the root ([`GradSums`], `REDUCE_OP_TIED`), the
//! embedding's part first, when the embedding and the head are on different workers. The
//! replicas' sums go along a chain instead ([`super::grad_chain`]).

use std::collections::HashMap;
use std::sync::Arc;

use pipewise_proto::v1::ReduceRequest;
use tokio::sync::watch;
use tonic::Status;

use crate::runtime::sum_in_replica_order;

/// Gradient values per contribution: 2 MiB of f64.
pub(crate) const GRAD_CHUNK: usize = 1 << 18;

/// Chunks of one sum a worker has in flight at once (8 MiB: a worker holds at most this
/// much of a sum's partials and answers at a time).
pub(crate) const GRAD_WINDOW: usize = 4;

/// A chunk's sum, or why it failed.
pub(crate) type SumResult = Result<Arc<Vec<f64>>, Status>;

#[derive(Debug)]
struct SumRound {
    parts: Vec<Option<Vec<f64>>>,
    done: watch::Sender<Option<SumResult>>,
}

/// The parts of a tied table's gradient sum: the embedding's copy and the head's.
pub(crate) const TIED_PARTS: u32 = 2;

/// The tied tables' sums in progress of one run: a table's copies' in a replica, by
/// (step, replica, chunk).
#[derive(Debug, Default)]
pub(crate) struct GradSums {
    /// The parts each sum takes: [`TIED_PARTS`].
    parts: u32,
    rounds: HashMap<(u64, u32, u32), SumRound>,
}

/// f64 values, little-endian.
pub(crate) fn to_bytes(values: &[f64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The f64 values of little-endian `bytes` (`field` names them in the error).
pub(crate) fn from_bytes(bytes: &[u8], field: &str) -> Result<Vec<f64>, Status> {
    if !bytes.len().is_multiple_of(8) {
        return Err(Status::invalid_argument(format!(
            "{field}: {} bytes are not f64 values",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(8)
        .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
        .collect())
}

impl GradSums {
    /// Sums `parts` parts ([`TIED_PARTS`]) from now on; pending sums fail with `why`.
    pub(crate) fn reset(&mut self, parts: u32, why: &str) {
        self.fail(why);
        self.parts = parts;
    }

    /// Fails every pending sum with `why`.
    pub(crate) fn fail(&mut self, why: &str) {
        for (_, round) in self.rounds.drain() {
            let _ = round.done.send(Some(Err(Status::aborted(why.to_string()))));
        }
    }

    /// Tied embeddings (a sum of [`TIED_PARTS`]): takes the chunk of the tied table's copy
    /// `req.stage` holds (stage 0 the embedding's, part 0; another the head's, part 1) in
    /// replica `req.replica`; the receiver gets the two copies' sum, the embedding's first.
    pub(crate) fn contribute_tied(
        &mut self,
        req: &ReduceRequest,
    ) -> Result<watch::Receiver<Option<SumResult>>, Status> {
        let part = u32::from(req.stage != 0);
        let key = (req.step, req.replica, req.chunk);
        self.take(req, key, part, || {
            format!(
                "ReduceRequest.stage: stage {}'s copy of the tied table already sent chunk {} \
                 in step {} (replica {})",
                req.stage, req.chunk, req.step, req.replica
            )
        })
    }

    /// Takes `req`'s chunk as part `part` of the sum `key`; `repeat` says why a second
    /// chunk for that part is refused.
    fn take(
        &mut self,
        req: &ReduceRequest,
        key: (u64, u32, u32),
        part: u32,
        repeat: impl FnOnce() -> String,
    ) -> Result<watch::Receiver<Option<SumResult>>, Status> {
        if req.chunk >= req.chunks {
            return Err(Status::invalid_argument(format!(
                "ReduceRequest.chunk: {} of {} chunks",
                req.chunk, req.chunks
            )));
        }
        let values = from_bytes(&req.grads, "ReduceRequest.grads")?;
        if values.len() > GRAD_CHUNK {
            return Err(Status::invalid_argument(format!(
                "ReduceRequest.grads: {} values, more than a chunk's {GRAD_CHUNK}",
                values.len()
            )));
        }
        let parts = self.parts as usize;
        let round = self.rounds.entry(key).or_insert_with(|| SumRound {
            parts: vec![None; parts],
            done: watch::channel(None).0,
        });
        let slot = &mut round.parts[part as usize];
        if slot.is_some() {
            return Err(Status::invalid_argument(repeat()));
        }
        *slot = Some(values);
        let rx = round.done.subscribe();
        if round.parts.iter().all(Option::is_some) {
            let result = sum_in_replica_order(&round.parts)
                .map(Arc::new)
                .map_err(|(a, b)| {
                    Status::invalid_argument(format!(
                        "ReduceRequest.grads: chunks of {a} and {b} values"
                    ))
                });
            let _ = round.done.send(Some(result));
            self.rounds.remove(&key);
        }
        Ok(rx)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use pipewise_proto::v1::ReduceOp;

    fn copy(stage: u32, replica: u32, values: &[f64]) -> ReduceRequest {
        ReduceRequest {
            run: 1,
            step: 3,
            op: ReduceOp::Tied as i32,
            stage,
            chunk: 0,
            chunks: 1,
            replica,
            grads: to_bytes(values),
            ..Default::default()
        }
    }

    /// A tied table's copies: the embedding's (stage 0) and the head's (another stage) of
    /// one replica make one sum, whichever comes first; another replica's pair is its own,
    /// and a copy sent twice is refused.
    #[test]
    fn tied_copies_make_one_sum_per_replica() {
        let mut sums = GradSums::default();
        sums.reset(TIED_PARTS, "new run");
        let head = sums.contribute_tied(&copy(5, 0, &[0.5, 1.0])).unwrap();
        let other = sums.contribute_tied(&copy(0, 1, &[7.0, 7.0])).unwrap();
        let e = sums.contribute_tied(&copy(5, 0, &[0.5, 1.0])).unwrap_err();
        assert!(e.message().contains("already sent"), "{e:?}");
        assert!(head.borrow().is_none() && other.borrow().is_none());
        let embedding = sums.contribute_tied(&copy(0, 0, &[1.0, -1.0])).unwrap();
        for rx in [head, embedding] {
            assert_eq!(*rx.borrow().clone().unwrap().unwrap(), [1.5, 0.0]);
        }
        assert!(other.borrow().is_none(), "replica 1's head has not sent");
    }

    /// Bad chunks are refused naming the field; a reset fails the pending sums.
    #[test]
    fn bad_chunks_are_refused_and_a_reset_fails_the_pending() {
        let mut sums = GradSums::default();
        sums.reset(TIED_PARTS, "new run");
        let refused = |sums: &mut GradSums, req: ReduceRequest, field: &str| {
            let e = sums.contribute_tied(&req).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().starts_with(field), "{e:?}");
        };
        let mut odd = copy(0, 0, &[1.0]);
        odd.grads.pop();
        refused(&mut sums, odd, "ReduceRequest.grads");
        let mut past = copy(0, 0, &[1.0]);
        past.chunk = 1;
        refused(&mut sums, past, "ReduceRequest.chunk");
        sums.contribute_tied(&copy(0, 0, &[1.0])).unwrap();
        let rx1 = sums.contribute_tied(&copy(1, 0, &[1.0, 2.0])).unwrap();
        let e = rx1.borrow().clone().unwrap().unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().starts_with("ReduceRequest.grads"), "{e:?}");
        let rx2 = sums.contribute_tied(&copy(0, 0, &[1.0])).unwrap();
        sums.reset(TIED_PARTS, "the worker was reassigned");
        let failed = rx2.borrow().clone().unwrap().unwrap_err();
        assert_eq!(failed.code(), tonic::Code::Aborted);
    }
}
