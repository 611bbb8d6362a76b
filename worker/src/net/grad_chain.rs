//! Data-parallel replicas over gRPC: a worker's side of its rank's chain of gradient sums.
//! A stage's gradients are summed over the replicas chunk by chunk ([`GRAD_CHUNK`] values)
//! along a chain in replica order: replica 0's worker of the rank sends its chunk to replica
//! 1's, which adds its own part and sends the partial sum on to replica 2's, and so on; the
//! last replica's worker holds the sum and answers the call that brought it the partial,
//! and each answer is passed back along the chain as the answer to the call before. Every
//! chunk is thus summed in replica order 0, 1, …, R-1 (the order
//! [`LocalSync`](crate::runtime::LocalSync) sums in, so a job gives the same bits whether
//! its replicas share a process or not), and every worker receives and sends each chunk at
//! most twice, whatever R: no worker's load grows with the replicas.
//!
//! [`ChainSums`] holds the links this worker is part of: the partial sum the replica before
//! sent (its call waits here for the answer) and the sum once this worker knows it. The
//! worker's own side ([`crate::net::NetSync`]) takes the partial, adds its part, calls the
//! next replica and finishes the link with the answer.
//!
//! [`GRAD_CHUNK`]: super::grad_sum::GRAD_CHUNK

use std::collections::HashMap;
use std::sync::Arc;

use pipewise_proto::v1::ReduceRequest;
use tokio::sync::watch;
use tonic::Status;

use super::grad_sum::{GRAD_CHUNK, SumResult, from_bytes};
use crate::runtime::Replica;

/// A chunk of a stage's sum in a step: (step, stage, chunk).
pub(crate) type LinkKey = (u64, u32, u32);

/// One chunk's place in the chain at this worker.
#[derive(Debug)]
struct Link {
    /// The replicas before this one summed, once their call brought it.
    partial: watch::Sender<Option<SumResult>>,
    /// Whether that call came (a second one for the chunk is refused).
    arrived: bool,
    /// Every replica's sum, once this worker knows it: the answer to that call.
    sum: watch::Sender<Option<SumResult>>,
}

impl Link {
    fn new() -> Self {
        Self {
            partial: watch::channel(None).0,
            arrived: false,
            sum: watch::channel(None).0,
        }
    }
}

/// The links of one run's chain sums at this worker (see the [module docs](self)).
#[derive(Debug, Default)]
pub(crate) struct ChainSums {
    /// This worker's replica (a count of 1: the run sums nothing over replicas).
    replica: Replica,
    links: HashMap<LinkKey, Link>,
}

impl ChainSums {
    /// Serves the links of `replica` from now on; pending links fail with `why`.
    pub(crate) fn reset(&mut self, replica: Replica, why: &str) {
        self.fail(why);
        self.replica = replica;
    }

    /// Fails every pending link with `why`: the call waiting for its sum, and this
    /// worker's own side waiting for its partial.
    pub(crate) fn fail(&mut self, why: &str) {
        for (_, link) in self.links.drain() {
            let failed = || Some(Err(Status::aborted(why.to_string())));
            link.partial.send_replace(failed());
            link.sum.send_replace(failed());
        }
    }

    /// Takes the partial sum `req` brings from the replica before; the receiver gets the
    /// sum of every replica once this worker knows it.
    pub(crate) fn receive(
        &mut self,
        req: &ReduceRequest,
    ) -> Result<watch::Receiver<Option<SumResult>>, Status> {
        let Replica { index, count } = self.replica;
        if count < 2 {
            return Err(Status::invalid_argument(
                "ReduceRequest.op: a gradient sum in a run without replicas",
            ));
        }
        if index == 0 {
            return Err(Status::invalid_argument(format!(
                "ReduceRequest.replica: replica {}'s partial sum came to replica 0's worker, \
                 which starts the chain",
                req.replica
            )));
        }
        if req.replica + 1 != index {
            return Err(Status::invalid_argument(format!(
                "ReduceRequest.replica: replica {}'s partial sum came to replica {index}'s \
                 worker, which takes only replica {}'s",
                req.replica,
                index - 1
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
        let link = self
            .links
            .entry((req.step, req.stage, req.chunk))
            .or_insert_with(Link::new);
        if link.arrived {
            return Err(Status::invalid_argument(format!(
                "ReduceRequest.replica: replica {} already sent chunk {} of stage {} in step {}",
                req.replica, req.chunk, req.stage, req.step
            )));
        }
        link.arrived = true;
        link.partial.send_replace(Some(Ok(Arc::new(values))));
        Ok(link.sum.subscribe())
    }

    /// This worker's own side: the partial sum of chunk `key` the replica before sends (at
    /// once if it came already).
    pub(crate) fn partial(&mut self, key: LinkKey) -> watch::Receiver<Option<SumResult>> {
        self.links
            .entry(key)
            .or_insert_with(Link::new)
            .partial
            .subscribe()
    }

    /// This worker's own side: the sum of chunk `key` (or why there is none) answers the
    /// replica before, and the link ends.
    pub(crate) fn finish(&mut self, key: LinkKey, sum: SumResult) {
        if let Some(link) = self.links.remove(&key) {
            link.sum.send_replace(Some(sum));
        }
    }

    /// The links open: each a chunk whose partial or sum is awaited here. For tests.
    pub(crate) fn open(&self) -> usize {
        self.links.len()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::net::grad_sum::to_bytes;
    use pipewise_proto::v1::ReduceOp;

    fn partial(replica: u32, values: &[f64]) -> ReduceRequest {
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

    fn chain(index: u32, count: u32) -> ChainSums {
        let mut sums = ChainSums::default();
        sums.reset(Replica { index, count }, "new run");
        sums
    }

    /// The replica before's partial reaches this worker's own side whichever comes first,
    /// and its call is answered with the sum this worker finishes the link with.
    #[test]
    fn a_partial_meets_the_own_side_and_the_sum_answers_it() {
        for own_first in [true, false] {
            let mut sums = chain(2, 4);
            let key = (3, 1, 0);
            let early = own_first.then(|| sums.partial(key));
            let answer = sums.receive(&partial(1, &[1.5, -2.0])).unwrap();
            let mut own = early.unwrap_or_else(|| sums.partial(key));
            let got = own.borrow_and_update().clone().unwrap().unwrap();
            assert_eq!(*got, [1.5, -2.0], "own first: {own_first}");
            assert!(answer.borrow().is_none(), "no sum yet");
            assert_eq!(sums.open(), 1);
            sums.finish(key, Ok(Arc::new(vec![4.0, 8.0])));
            assert_eq!(*answer.borrow().clone().unwrap().unwrap(), [4.0, 8.0]);
            assert_eq!(sums.open(), 0, "the link ended");
        }
    }

    /// Bad partials are refused naming the field: without replicas, to replica 0 (the
    /// chain's start), from a replica other than the one before, past the chunks, not f64
    /// values, more than a chunk, or twice.
    #[test]
    fn bad_partials_are_refused_naming_the_field() {
        let refused = |sums: &mut ChainSums, req: ReduceRequest, field: &str| {
            let e = sums.receive(&req).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().starts_with(field), "{e:?}");
        };
        refused(
            &mut ChainSums::default(),
            partial(0, &[1.0]),
            "ReduceRequest.op",
        );
        refused(
            &mut chain(0, 3),
            partial(0, &[1.0]),
            "ReduceRequest.replica",
        );
        let mut sums = chain(2, 3);
        refused(&mut sums, partial(0, &[1.0]), "ReduceRequest.replica");
        let mut past = partial(1, &[1.0]);
        past.chunk = 1;
        refused(&mut sums, past, "ReduceRequest.chunk");
        let mut odd = partial(1, &[1.0]);
        odd.grads.pop();
        refused(&mut sums, odd, "ReduceRequest.grads");
        refused(
            &mut sums,
            partial(1, &vec![0.0; GRAD_CHUNK + 1]),
            "ReduceRequest.grads",
        );
        sums.receive(&partial(1, &[1.0])).unwrap();
        refused(&mut sums, partial(1, &[1.0]), "ReduceRequest.replica");
    }

    /// A reset (the worker reassigned) or an abort fails both sides of every pending link.
    #[test]
    fn a_reset_fails_both_sides_of_pending_links() {
        let mut sums = chain(1, 2);
        let answer = sums.receive(&partial(0, &[1.0])).unwrap();
        let own = sums.partial((9, 9, 0));
        sums.reset(Replica { index: 1, count: 2 }, "the worker was reassigned");
        for rx in [answer, own] {
            let e = rx.borrow().clone().unwrap().unwrap_err();
            assert_eq!(e.code(), tonic::Code::Aborted);
            assert!(e.message().contains("reassigned"), "{e:?}");
        }
        assert_eq!(sums.open(), 0);
    }
}
