//! Data-parallel replicas over gRPC: the sums of the stages' gradients. Each replica's
//! worker of a stage sends its gradients in chunks ([`GRAD_CHUNK`] values, under tonic's
//! 4 MiB message limit) as `REDUCE_OP_GRADS` contributions to replica 0's worker of its rank
//! (the assignment's `grad_root`: each of replica 0's workers sums its own stages); once
//! every replica's chunk is in, that worker sums them in replica order (the order
//! [`LocalSync`](crate::runtime::LocalSync) sums in, so a job gives the same bits whether
//! its replicas share a process or not) and answers every replica with the sum.

use std::collections::HashMap;
use std::sync::Arc;

use pipewise_proto::v1::ReduceRequest;
use tokio::sync::watch;
use tonic::Status;

use crate::runtime::sum_in_replica_order;

/// Gradient values per contribution: 2 MiB of f64.
pub(crate) const GRAD_CHUNK: usize = 1 << 18;

/// Chunks of one stage's sum a worker has in flight at once (8 MiB: the summing worker holds
/// at most this much of each replica's stage at a time).
pub(crate) const GRAD_WINDOW: usize = 4;

/// A chunk's sum, or why it failed.
pub(crate) type SumResult = Result<Arc<Vec<f64>>, Status>;

#[derive(Debug)]
struct SumRound {
    parts: Vec<Option<Vec<f64>>>,
    done: watch::Sender<Option<SumResult>>,
}

/// The sums in progress of one run, by (step, stage, chunk).
#[derive(Debug, Default)]
pub(crate) struct GradSums {
    replicas: u32,
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
    /// Sums over `replicas` replicas from now on; pending sums fail with `why`.
    pub(crate) fn reset(&mut self, replicas: u32, why: &str) {
        self.fail(why);
        self.replicas = replicas;
    }

    /// Fails every pending sum with `why`.
    pub(crate) fn fail(&mut self, why: &str) {
        for (_, round) in self.rounds.drain() {
            let _ = round.done.send(Some(Err(Status::aborted(why.to_string()))));
        }
    }

    /// Takes replica `req.replica`'s chunk; the receiver gets the sum once every replica's
    /// chunk is in.
    pub(crate) fn contribute(
        &mut self,
        req: &ReduceRequest,
    ) -> Result<watch::Receiver<Option<SumResult>>, Status> {
        let replicas = self.replicas;
        if replicas < 2 {
            return Err(Status::invalid_argument(
                "ReduceRequest.op: a gradient sum in a run without replicas",
            ));
        }
        if req.replica >= replicas {
            return Err(Status::invalid_argument(format!(
                "ReduceRequest.replica: {} of a {replicas}-replica run",
                req.replica
            )));
        }
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
        let key = (req.step, req.stage, req.chunk);
        let round = self.rounds.entry(key).or_insert_with(|| SumRound {
            parts: vec![None; replicas as usize],
            done: watch::channel(None).0,
        });
        let slot = &mut round.parts[req.replica as usize];
        if slot.is_some() {
            return Err(Status::invalid_argument(format!(
                "ReduceRequest.replica: replica {} already sent chunk {} of stage {} in step {}",
                req.replica, req.chunk, req.stage, req.step
            )));
        }
        *slot = Some(values);
        let rx = round.done.subscribe();
        if round.parts.iter().all(Option::is_some) {
            let result = sum_in_replica_order(&round.parts)
                .map(Arc::new)
                .map_err(|(a, b)| {
                    Status::invalid_argument(format!(
                        "ReduceRequest.grads: replicas sent chunks of {a} and {b} values"
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

    fn chunk(replica: u32, values: &[f64]) -> ReduceRequest {
        ReduceRequest {
            run: 1,
            step: 3,
            op: ReduceOp::Grads as i32,
            stage: 1,
            chunk: 0,
            chunks: 1,
            replica,
            grads: to_bytes(values),
            ..Default::default()
        }
    }

    /// The sum comes in replica order whatever the arrival order (f64 addition is not
    /// associative: 1e17 + 1 - 1e17 differs by order), and only once every replica is in.
    #[test]
    fn sums_in_replica_order_once_all_are_in() {
        let parts = [1e17_f64, 1.0, -1e17];
        let mut want = parts[0];
        want += parts[1];
        want += parts[2];
        for order in [[0, 1, 2], [2, 1, 0], [1, 2, 0]] {
            let mut sums = GradSums::default();
            sums.reset(3, "new run");
            let mut rx = Vec::new();
            for &r in &order {
                rx.push(sums.contribute(&chunk(r, &[parts[r as usize]])).unwrap());
                let done = rx.iter().filter(|x| x.borrow().is_some()).count();
                assert_eq!(done, if rx.len() == 3 { 3 } else { 0 }, "{order:?}");
            }
            let got = rx[0].borrow().clone().unwrap().unwrap();
            assert_eq!(got[0].to_bits(), want.to_bits(), "{order:?}");
        }
    }

    /// Bad contributions are refused naming the field; a reset fails the pending sums.
    #[test]
    fn bad_chunks_are_refused_and_a_reset_fails_the_pending() {
        let mut sums = GradSums::default();
        let refused = |sums: &mut GradSums, req: ReduceRequest, field: &str| {
            let e = sums.contribute(&req).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().starts_with(field), "{e:?}");
        };
        refused(&mut sums, chunk(0, &[1.0]), "ReduceRequest.op");
        sums.reset(2, "new run");
        refused(&mut sums, chunk(2, &[1.0]), "ReduceRequest.replica");
        let mut odd = chunk(0, &[1.0]);
        odd.grads.pop();
        refused(&mut sums, odd, "ReduceRequest.grads");
        let mut past = chunk(0, &[1.0]);
        past.chunk = 1;
        refused(&mut sums, past, "ReduceRequest.chunk");
        let rx = sums.contribute(&chunk(0, &[1.0])).unwrap();
        refused(&mut sums, chunk(0, &[1.0]), "ReduceRequest.replica");
        let rx1 = sums.contribute(&chunk(1, &[1.0, 2.0])).unwrap();
        let e = rx1.borrow().clone().unwrap().unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().starts_with("ReduceRequest.grads"), "{e:?}");
        let mut sums = GradSums::default();
        sums.reset(2, "new run");
        let rx2 = sums.contribute(&chunk(0, &[1.0])).unwrap();
        sums.reset(2, "the worker was reassigned");
        let failed = rx2.borrow().clone().unwrap().unwrap_err();
        assert_eq!(failed.code(), tonic::Code::Aborted);
        drop(rx);
    }
}
