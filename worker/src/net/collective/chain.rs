//! A worker's own side of its rank's chain of gradient sums over the replicas
//! ([`super::super::grad_chain`]): for each chunk of a stage's gradients it waits for the
//! replica before's partial sum (not on replica 0), adds its own part after it, passes the
//! partial on to the next replica's worker (not on the last replica) and takes that call's
//! answer, the sum of every replica, which then answers the replica before. [`GRAD_WINDOW`]
//! chunks are in flight at once, so the chain is a pipeline: while one chunk's partial
//! travels on, the next one's is being added.
//!
//! A failure anywhere ends the chunk along the chain: the worker that saw it answers the
//! replica before with it (aborted), and so on back to replica 0; the replicas after wait
//! for a partial that does not come until the run is abandoned or the sync times out (the
//! timeout aborts every link here).

use std::sync::Arc;
use std::time::{Duration, Instant};

use pipewise_proto::v1::ReduceOp;
use tonic::Status;

use super::{CollectiveServer, GradChain, NetSync, abandoned};
use crate::error::{Error, Result};
use crate::net::grad_chain::LinkKey;
use crate::net::grad_sum::{GRAD_CHUNK, GRAD_WINDOW, from_bytes};
use crate::runtime::{Replica, ReplicaPart};

impl GradChain {
    /// `replica`'s place in the chain of `addresses` (its rank's worker in every replica,
    /// in replica order), taking partials at `here` and passing them on through `next`
    /// (a sync to `addresses[replica.index + 1]`; `None` on the last replica).
    pub(crate) fn new(
        replica: Replica,
        addresses: &[String],
        here: CollectiveServer,
        next: Option<NetSync>,
    ) -> Result<Self> {
        let last = replica.index + 1 == replica.count;
        if addresses.len() != replica.count as usize || last != next.is_none() {
            return Err(Error::invalid(
                "grad_chain",
                format!(
                    "{} addresses and {} next worker for replica {} of {}",
                    addresses.len(),
                    if next.is_some() { "a" } else { "no" },
                    replica.index,
                    replica.count
                ),
            ));
        }
        let before = replica
            .index
            .checked_sub(1)
            .map(|r| addresses[r as usize].clone());
        Ok(Self {
            replica,
            here,
            before,
            next: next.map(Arc::new),
        })
    }
}

impl NetSync {
    /// Sums `grads` (`part`'s) over the replicas along `chain` and leaves the sum in
    /// `grads`.
    pub(super) fn sum_along(
        &self,
        chain: &GradChain,
        part: ReplicaPart,
        grads: &mut [f64],
    ) -> Result<()> {
        if part.replica != chain.replica.index {
            return Err(Error::invalid(
                "replicas",
                format!(
                    "{part}: this worker is replica {}'s of {}",
                    chain.replica.index, chain.replica.count
                ),
            ));
        }
        let what = format!("step {} gradients of stage {}", part.step + 1, part.stage);
        let chunks = grads.len().div_ceil(GRAD_CHUNK).max(1) as u32;
        for (first, group) in grads.chunks_mut(GRAD_CHUNK * GRAD_WINDOW).enumerate() {
            let links: Vec<_> = group
                .chunks(GRAD_CHUNK)
                .enumerate()
                .map(|(i, values)| {
                    let chunk = (first * GRAD_WINDOW + i) as u32;
                    let link = self.link(chain, &what, part, (chunk, chunks), values.to_vec());
                    self.runtime.spawn(link)
                })
                .collect();
            let sums = self.runtime.block_on(async {
                let mut sums = Vec::with_capacity(links.len());
                for link in links {
                    sums.push(link.await.unwrap_or_else(|e| {
                        Err(Error::invalid(
                            "replicas",
                            format!("{what}: the chunk's task ended: {e}"),
                        ))
                    }));
                }
                sums
            });
            for (values, sum) in group.chunks_mut(GRAD_CHUNK).zip(sums) {
                values.copy_from_slice(&sum?);
            }
        }
        Ok(())
    }

    /// Chunk `chunk` of `chunks` of `part`'s gradients (`values`) through this worker's
    /// link of the chain: the sum of every replica's chunk, owning all it needs.
    fn link(
        &self,
        chain: &GradChain,
        what: &str,
        part: ReplicaPart,
        (chunk, chunks): (u32, u32),
        mut values: Vec<f64>,
    ) -> impl std::future::Future<Output = Result<Arc<Vec<f64>>>> + Send + 'static {
        let key: LinkKey = (part.step, part.stage, chunk);
        // Asked for now, so a partial that comes before the task runs waits for it.
        let partial = chain
            .before
            .clone()
            .map(|before| (before, chain.here.collective.lock().chain.partial(key)));
        let here = chain.here.clone();
        let next = chain.next.clone();
        let aborted = self.aborted.clone();
        let index = chain.replica.index;
        let what = what.to_string();
        async move {
            let sum = async {
                if let Some((before, rx)) = partial {
                    let got = tokio::select! {
                        got = here.answer(part.step, rx) => got,
                        why = abandoned(aborted) => Err(Status::aborted(why)),
                    };
                    let partial = got.map_err(|s| Error::Call {
                        call: format!("{what}: the partial sum of chunk {chunk}"),
                        peer: before,
                        code: s.code(),
                        message: s.message().to_string(),
                    })?;
                    same_length(&what, partial.len(), values.len())?;
                    // The replicas before summed, plus this one's part: replica order (one
                    // IEEE addition commutes bit for bit).
                    for (v, p) in values.iter_mut().zip(partial.iter()) {
                        *v += *p;
                    }
                }
                match next {
                    Some(next) => pass_on(&next, &what, part, (chunk, chunks), &values).await,
                    None => Ok(Arc::new(values)),
                }
            }
            .await;
            if index > 0 {
                let answer = match &sum {
                    Ok(sum) => Ok(Arc::clone(sum)),
                    Err(e) => Err(Status::aborted(format!("replica {index}'s worker: {e}"))),
                };
                here.collective.lock().chain.finish(key, answer);
            }
            sum
        }
    }
}

/// Sends the partial sum `values` of chunk `chunk` to the next replica's worker (`next`)
/// and returns its answer, the sum of every replica; sent again while that worker cannot
/// be reached (the channel is first used here), up to the timeout.
async fn pass_on(
    next: &NetSync,
    what: &str,
    part: ReplicaPart,
    (chunk, chunks): (u32, u32),
    values: &[f64],
) -> Result<Arc<Vec<f64>>> {
    let deadline = Instant::now() + next.timeout;
    let reply = loop {
        let req = next.grads_request((ReduceOp::Grads, part), (chunk, chunks), values);
        match next.answer(what.to_string(), req).await {
            Err(Error::Call {
                code: tonic::Code::Unavailable,
                ..
            }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => break other?,
        }
    };
    let sum = from_bytes(&reply.grads, "ReduceReply.grads")
        .map_err(|s| Error::invalid("replicas", format!("{what}: {}", s.message())))?;
    same_length(what, sum.len(), values.len())?;
    Ok(Arc::new(sum))
}

/// Refuses a chunk of `got` values for one of `want`.
fn same_length(what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(Error::invalid(
            "replicas",
            format!("{what}: a chunk of {got} values for {want}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::{Collective, TlsSettings};
    use crate::runtime::{Gathered, ShardPart, StepSync, sum_in_replica_order};

    const RUN: u64 = 7;

    /// A service of run [`RUN`] (2 workers a replica) for `replica`'s worker.
    fn service(replica: Replica, timeout: Duration) -> CollectiveServer {
        let collective = Arc::new(Collective::default());
        collective.configure(RUN, 2 * replica.count, replica, timeout);
        CollectiveServer {
            collective,
            secret: Arc::new(crate::net::secret::RunSecret::default()),
        }
    }

    /// Contributor `worker`'s sync calling `at` (`host:port`), in process through `local`.
    fn sync(
        runtime: &tokio::runtime::Runtime,
        at: &str,
        worker: u32,
        local: Option<&CollectiveServer>,
        timeout: Duration,
    ) -> NetSync {
        let sync = NetSync::new(
            runtime.handle().clone(),
            at,
            &TlsSettings::default(),
            (RUN, worker),
            timeout,
        )
        .expect("sync");
        match local {
            Some(server) => sync.in_process(server.clone()),
            None => sync,
        }
    }

    /// Rank 1's worker of each of `replicas` replicas (contributor `2 · r + 1`) as its link
    /// of the chain, every call in process (nothing listens at the addresses), and each
    /// one's own service.
    fn chain(
        runtime: &tokio::runtime::Runtime,
        replicas: u32,
    ) -> (Vec<NetSync>, Vec<CollectiveServer>) {
        let timeout = Duration::from_secs(5);
        let replica = |index| Replica {
            index,
            count: replicas,
        };
        let services: Vec<_> = (0..replicas)
            .map(|r| service(replica(r), timeout))
            .collect();
        let root = service(Replica::default(), timeout);
        let addresses: Vec<String> = (0..replicas)
            .map(|r| format!("127.0.0.1:{}", r + 1))
            .collect();
        let syncs = (0..replicas)
            .map(|r| {
                let worker = 2 * r + 1;
                let next = services.get(r as usize + 1).map(|s| {
                    sync(
                        runtime,
                        &addresses[r as usize + 1],
                        worker,
                        Some(s),
                        timeout,
                    )
                });
                let link =
                    GradChain::new(replica(r), &addresses, services[r as usize].clone(), next)
                        .expect("a chain");
                sync(runtime, "127.0.0.1:1", worker, Some(&root), timeout).with_grad_chain(link)
            })
            .collect();
        (syncs, services)
    }

    /// Replica `r`'s part: values whose sum depends on the order (1e17 - 1e17 + 1 is 1
    /// in f64, 1 - 1e17 + 1e17 is 0), over two chunks.
    fn part(r: u32) -> Vec<f64> {
        let scale = [1e17, -1e17, 1.0, 0.375][r as usize % 4];
        (0..GRAD_CHUNK + 3)
            .map(|i| scale * (1 + i % 7) as f64 + (r as usize * i % 3) as f64)
            .collect()
    }

    /// R = 2, 3, 4: every replica gets the sum of every chunk in replica order, bit for
    /// bit (the in-process sum's), and no link stays open anywhere.
    #[test]
    fn every_replica_gets_each_chunks_sum_in_replica_order() {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        for replicas in [2, 3, 4] {
            let parts: Vec<_> = (0..replicas).map(|r| Some(part(r))).collect();
            let want = sum_in_replica_order(&parts).expect("equal lengths");
            if replicas > 2 {
                let mut reversed = parts.clone();
                reversed.reverse();
                let other = sum_in_replica_order(&reversed).expect("equal lengths");
                assert!(want != other, "the order shows in the bits");
            }
            let (syncs, services) = chain(&runtime, replicas);
            let calls: Vec<_> = syncs
                .into_iter()
                .zip(parts)
                .enumerate()
                .map(|(r, (sync, part))| {
                    std::thread::spawn(move || {
                        let mut grads = part.expect("a part");
                        let at = ReplicaPart {
                            step: 4,
                            stage: 1,
                            replica: r as u32,
                        };
                        sync.all_reduce_replicas(at, &mut grads).map(|()| grads)
                    })
                })
                .collect();
            for (r, call) in calls.into_iter().enumerate() {
                let got = call.join().expect("thread").expect("the sum");
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(g, w)| g.to_bits() == w.to_bits());
                assert!(
                    same && got.len() == want.len(),
                    "R = {replicas}, replica {r}"
                );
            }
            for s in &services {
                assert_eq!(s.collective.links(), 0, "R = {replicas}");
            }
        }
    }

    /// A failure at the chain's last worker (here its collectives aborted once replica 1's
    /// partial came) fails the chunk on every replica before, with its reason, not at the
    /// timeout.
    #[test]
    fn a_failure_down_the_chain_reaches_every_replica_before() {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let (mut syncs, services) = chain(&runtime, 3);
        drop(syncs.pop());
        let calls: Vec<_> = syncs
            .into_iter()
            .enumerate()
            .map(|(r, sync)| {
                std::thread::spawn(move || {
                    let at = ReplicaPart {
                        step: 0,
                        stage: 1,
                        replica: r as u32,
                    };
                    sync.all_reduce_replicas(at, &mut [1.0, 2.0])
                })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(5);
        while services[2].collective.links() == 0 {
            assert!(Instant::now() < deadline, "replica 1's partial never came");
            std::thread::sleep(Duration::from_millis(5));
        }
        services[2].collective.abort("replica 2's worker left");
        for (r, call) in calls.into_iter().enumerate() {
            let err = call
                .join()
                .expect("thread")
                .expect_err("no sum")
                .to_string();
            assert!(
                err.contains("replica 2's worker left"),
                "replica {r}: {err}"
            );
        }
    }

    /// A sharded optimizer's all-gather through the chain: every replica of 2 shard groups
    /// of 2 gets the first group's shards side by side, bit for bit (a `-0.0` among them
    /// keeps its sign).
    #[test]
    fn shards_are_gathered_bit_for_bit_along_the_chain() {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let (syncs, _services) = chain(&runtime, 4);
        let part = |replica: u32| ShardPart {
            step: 2,
            stage: 1,
            group: replica / 2,
            shard: replica % 2,
            shards: 2,
            total: 5,
            what: Gathered::Values,
        };
        // Shard 0 holds values 0..2, shard 1 values 2..5; group 1's are ignored.
        let shards: [&[f32]; 4] = [&[1.5, -0.0], &[0.0, 3.25, -7.0], &[9.0, 9.0], &[9.0; 3]];
        let calls: Vec<_> = syncs
            .into_iter()
            .enumerate()
            .map(|(r, sync)| {
                let shard = shards[r].to_vec();
                std::thread::spawn(move || sync.all_gather_shards(part(r as u32), &shard))
            })
            .collect();
        let want: Vec<u32> = [1.5f32, -0.0, 0.0, 3.25, -7.0].map(f32::to_bits).to_vec();
        for call in calls {
            let got = call.join().expect("thread").expect("the gather");
            assert_eq!(got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want);
        }
    }

    /// The next replica's worker is first called at the sum: while it cannot be reached
    /// the chunk is sent again up to the timeout (not failed at once), and once it
    /// listens the sum goes through.
    #[test]
    fn a_chunk_is_sent_again_while_the_next_worker_is_unreachable() {
        use pipewise_proto::v1::collective_service_server::CollectiveServiceServer;
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .to_string();
        let replica = |index| Replica { index, count: 2 };
        let addresses = ["127.0.0.1:1".to_string(), addr.clone()];
        let first = |timeout: Duration| {
            let here = service(replica(0), timeout);
            let next = sync(&runtime, &addr, 1, None, timeout);
            let link =
                GradChain::new(replica(0), &addresses, here.clone(), Some(next)).expect("a chain");
            sync(&runtime, "127.0.0.1:1", 1, Some(&here), timeout).with_grad_chain(link)
        };
        let at = |step, replica| ReplicaPart {
            step,
            stage: 0,
            replica,
        };
        let timeout = Duration::from_millis(300);
        let started = Instant::now();
        let err = first(timeout)
            .all_reduce_replicas(at(0, 0), &mut [1.0])
            .expect_err("nothing listens");
        assert!(started.elapsed() >= timeout, "failed at once: {err}");
        assert!(
            matches!(
                err,
                Error::Call {
                    code: tonic::Code::Unavailable,
                    ..
                }
            ),
            "{err}"
        );

        let timeout = Duration::from_secs(5);
        let last = service(replica(1), timeout);
        let link = GradChain::new(replica(1), &addresses, last.clone(), None).expect("a chain");
        let second = sync(&runtime, "127.0.0.1:1", 3, Some(&last), timeout).with_grad_chain(link);
        runtime.spawn(
            tonic::transport::Server::builder()
                .add_service(CollectiveServiceServer::new(last))
                .serve(addr.parse().expect("an address")),
        );
        let other = std::thread::spawn(move || {
            let mut grads = vec![2.0];
            second
                .all_reduce_replicas(at(1, 1), &mut grads)
                .map(|()| grads)
        });
        let mut grads = vec![1.0];
        first(timeout)
            .all_reduce_replicas(at(1, 0), &mut grads)
            .expect("replica 0's sum");
        assert_eq!(grads, [3.0]);
        assert_eq!(
            other.join().expect("thread").expect("replica 1's sum"),
            [3.0]
        );
    }
}
