//! Every worker of a schedule on threads of one process: [`run_local`] (real compute) over
//! a [`MemoryTransport`] and a [`LocalSync`], the in-process [`StepSync`].

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use pipewise_common::model::ModelSpec;
use pipewise_common::schedule::{Recompute, Schedule};

use super::program::DEFAULT_TIMEOUT;
use super::step::StepReport;
use super::sync::{
    Gathered, Replica, ReplicaPart, ShardPart, StepSync, TiedHolder, TiedPart,
    sum_in_replica_order, sum_in_window_order,
};
use super::transport::{MemoryTransport, Transport};
use super::validate::ValidationSet;
use super::worker_runtime::{OptimizerBytes, WorkerRuntime};
use crate::confined::Confined;
use crate::data::Batch;
use crate::error::{Error, Result};
use crate::optim::{AdamW, ZeroStage};

/// The operation a [`LocalSync`] round is collecting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    SqNorm,
    Loss,
    Validation,
}

#[derive(Debug)]
struct SyncState {
    generation: u64,
    round: Option<(Op, u64)>,
    arrived: usize,
    sq: Vec<f64>,
    losses: Vec<f32>,
    /// A validation batch's `(window, mean loss)` pairs.
    windows: Vec<(u64, f64)>,
    /// The last round's result (`None`: no worker reported a loss).
    result: Option<f64>,
    aborted: Option<String>,
}

/// A gradient sum in progress: a stage's over the replicas in a step, or a replica's tied
/// table's over its two copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum SumKey {
    Replicas {
        step: u64,
        stage: u32,
    },
    Tied {
        step: u64,
        replica: u32,
    },
    Shards {
        step: u64,
        stage: u32,
        group: u32,
        what: Gathered,
    },
}

/// How a round's parts combine: summed, or concatenated.
type Combine = fn(&[Option<Vec<f64>>]) -> std::result::Result<Vec<f64>, (usize, usize)>;

/// The parts concatenated in part order (an all-gather).
fn concatenated(parts: &[Option<Vec<f64>>]) -> std::result::Result<Vec<f64>, (usize, usize)> {
    Ok(parts.iter().flatten().flatten().copied().collect())
}

/// One gradient sum: each part (a replica's, or a tied copy's), then the sum.
#[derive(Debug, Default)]
struct SumRound {
    parts: Vec<Option<Vec<f64>>>,
    sum: Option<std::sync::Arc<Vec<f64>>>,
    taken: usize,
}

/// [`StepSync`] for `N` workers on threads of one process: a reusable barrier (mutex and
/// condition variable) that sums the contributions; waits time out, and
/// [`LocalSync::abort`] releases every waiter with an error. With data-parallel replicas,
/// each stage's gradients are summed over them per step ([`LocalSync::with_replicas`]);
/// a tied table's two copies' gradients, per replica and step.
#[derive(Debug)]
pub struct LocalSync {
    workers: usize,
    timeout: Duration,
    state: Mutex<SyncState>,
    done: Condvar,
    replicas: usize,
    /// Gradient sums in progress.
    rounds: Mutex<BTreeMap<SumKey, SumRound>>,
    summed: Condvar,
}

impl LocalSync {
    /// A sync point for `workers` workers; a worker waits at most `timeout` for the others.
    pub fn new(workers: u32, timeout: Duration) -> Self {
        Self::with_replicas(workers, 1, timeout)
    }

    /// A sync point for `workers` workers in all, forming `replicas` data-parallel replicas
    /// of one pipeline.
    pub fn with_replicas(workers: u32, replicas: u32, timeout: Duration) -> Self {
        Self {
            replicas: replicas.max(1) as usize,
            rounds: Mutex::new(BTreeMap::new()),
            summed: Condvar::new(),
            workers: workers.max(1) as usize,
            timeout,
            state: Mutex::new(SyncState {
                generation: 0,
                round: None,
                arrived: 0,
                sq: Vec::new(),
                losses: Vec::new(),
                windows: Vec::new(),
                result: Some(0.0),
                aborted: None,
            }),
            done: Condvar::new(),
        }
    }

    /// Fails every current and later collective with `reason`.
    pub fn abort(&self, reason: &str) {
        let mut st = self.lock();
        if st.aborted.is_none() {
            st.aborted = Some(reason.to_string());
        }
        self.done.notify_all();
        drop(st);
        // Taken (and released) so a replica waiting for a sum sees the abort.
        drop(self.rounds.lock());
        self.summed.notify_all();
    }

    /// Why the collectives were aborted, if they were.
    fn aborted(&self) -> Option<String> {
        self.lock().aborted.clone()
    }

    fn lock(&self) -> MutexGuard<'_, SyncState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn collective(
        &self,
        op: Op,
        step: u64,
        contribute: impl FnOnce(&mut SyncState),
        finish: impl FnOnce(&mut SyncState) -> Option<f64>,
    ) -> Result<f64> {
        let awaited = || format!("step {step} {op:?}");
        let aborted = |reason: &str| Error::Closed {
            awaited: awaited(),
            reason: format!("aborted ({reason})"),
        };
        let outcome = |result: Option<f64>| {
            result.ok_or_else(|| {
                Error::invalid("sync", format!("{}: no worker reported a loss", awaited()))
            })
        };
        let mut st = self.lock();
        if let Some(reason) = &st.aborted {
            return Err(aborted(reason));
        }
        match st.round {
            None => st.round = Some((op, step)),
            Some(round) if round == (op, step) => {}
            Some((other, other_step)) => {
                let reason = format!(
                    "another worker is at step {other_step} {other:?}; the workers diverged"
                );
                st.aborted = Some(reason.clone());
                self.done.notify_all();
                return Err(Error::invalid("sync", format!("{}: {reason}", awaited())));
            }
        }
        contribute(&mut st);
        st.arrived += 1;
        if st.arrived == self.workers {
            st.result = finish(&mut st);
            st.sq.clear();
            st.losses.clear();
            st.windows.clear();
            st.arrived = 0;
            st.round = None;
            st.generation += 1;
            self.done.notify_all();
            return outcome(st.result);
        }
        let generation = st.generation;
        let deadline = Instant::now() + self.timeout;
        loop {
            if st.generation != generation {
                return outcome(st.result);
            }
            if let Some(reason) = &st.aborted {
                return Err(aborted(reason));
            }
            let now = Instant::now();
            if now >= deadline {
                let timeout = Error::Timeout {
                    awaited: format!("{}: waiting for the other workers", awaited()),
                    after: self.timeout,
                };
                st.aborted = Some(timeout.to_string());
                self.done.notify_all();
                return Err(timeout);
            }
            st = wait(&self.done, st, deadline - now);
        }
    }

    /// Puts `grads` in as part `index` of `parts` of the sum `key`, waits until every part
    /// is in and leaves their sum in part order in `grads` (`awaited` names the sum in
    /// errors).
    fn sum_parts(
        &self,
        key: SumKey,
        (index, parts): (usize, usize),
        grads: &mut [f64],
        awaited: &dyn Fn() -> String,
    ) -> Result<()> {
        let sum = self.combine_parts(key, (index, parts), grads, sum_in_replica_order, awaited)?;
        if sum.len() != grads.len() {
            return Err(Error::invalid(
                "replicas",
                format!(
                    "{}: parts of {} and {} values",
                    awaited(),
                    sum.len(),
                    grads.len()
                ),
            ));
        }
        grads.copy_from_slice(&sum);
        Ok(())
    }

    /// Puts `part` in as part `index` of `parts` of the round `key`, waits until every
    /// part is in and returns them combined by `combine`.
    fn combine_parts(
        &self,
        key: SumKey,
        (index, parts): (usize, usize),
        part: &[f64],
        combine: Combine,
        awaited: &dyn Fn() -> String,
    ) -> Result<std::sync::Arc<Vec<f64>>> {
        let mut rounds = self
            .rounds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let round = rounds.entry(key).or_default();
        round.parts.resize(parts, None);
        round.parts[index] = Some(part.to_vec());
        if round.parts.iter().all(Option::is_some) {
            let sum = combine(&round.parts).map_err(|(a, b)| {
                Error::invalid(
                    "replicas",
                    format!("{}: parts of {a} and {b} values", awaited()),
                )
            })?;
            round.parts.clear();
            round.sum = Some(std::sync::Arc::new(sum));
            self.summed.notify_all();
        }
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(round) = rounds.get_mut(&key)
                && let Some(sum) = round.sum.clone()
            {
                round.taken += 1;
                if round.taken == parts {
                    rounds.remove(&key);
                }
                return Ok(sum);
            }
            // `abort` takes `rounds` before it notifies, so this check cannot miss it.
            if let Some(reason) = self.aborted() {
                return Err(Error::Closed {
                    awaited: awaited(),
                    reason: format!("aborted ({reason})"),
                });
            }
            let now = Instant::now();
            if now >= deadline {
                let timeout = Error::Timeout {
                    awaited: awaited(),
                    after: self.timeout,
                };
                drop(rounds);
                self.abort(&timeout.to_string());
                return Err(timeout);
            }
            rounds = wait(&self.summed, rounds, deadline - now);
        }
    }
}

/// Waits on `cv` at most `left`, through a poisoned lock too.
fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>, left: Duration) -> MutexGuard<'a, T> {
    cv.wait_timeout(guard, left)
        .map(|(guard, _)| guard)
        .unwrap_or_else(|poisoned| poisoned.into_inner().0)
}

impl StepSync for LocalSync {
    fn all_reduce_replicas(&self, part: ReplicaPart, grads: &mut [f64]) -> Result<()> {
        let awaited = || format!("{part}: the gradients of every replica");
        let r = part.replica as usize;
        if r >= self.replicas {
            return Err(Error::invalid(
                "replicas",
                format!("{part}: a sync for {} replicas", self.replicas),
            ));
        }
        let key = SumKey::Replicas {
            step: part.step,
            stage: part.stage,
        };
        self.sum_parts(key, (r, self.replicas), grads, &awaited)
    }

    fn sum_tied(&self, part: TiedPart, grads: &mut [f64]) -> Result<()> {
        let awaited = || format!("{part}: both copies' gradients");
        if part.replica as usize >= self.replicas {
            return Err(Error::invalid(
                "replicas",
                format!("{part}: a sync for {} replicas", self.replicas),
            ));
        }
        let key = SumKey::Tied {
            step: part.step,
            replica: part.replica,
        };
        // The embedding's part first: the order every placement sums in.
        let index = match part.holder {
            TiedHolder::Embedding => 0,
            TiedHolder::Head => 1,
        };
        self.sum_parts(key, (index, 2), grads, &awaited)
    }

    fn all_gather_shards(&self, part: ShardPart, shard: &[f32]) -> Result<Vec<f32>> {
        let awaited = || format!("{part}: every shard");
        let groups = self.replicas / part.shards.max(1) as usize;
        if part.shards == 0 || part.shard >= part.shards || part.group as usize >= groups {
            return Err(Error::invalid(
                "data_parallel_shard_degree",
                format!("{part}: a sync for {} replicas", self.replicas),
            ));
        }
        let key = SumKey::Shards {
            step: part.step,
            stage: part.stage,
            group: part.group,
            what: part.what,
        };
        // f32 to f64 and back is exact: the gather moves the bits unchanged.
        let wide: Vec<f64> = shard.iter().map(|&x| f64::from(x)).collect();
        let at = (part.shard as usize, part.shards as usize);
        let all = self.combine_parts(key, at, &wide, concatenated, &awaited)?;
        Ok(all.iter().map(|&x| x as f32).collect())
    }

    fn all_reduce_sq_norm(&self, step: u64, local: f64) -> Result<f64> {
        self.collective(
            Op::SqNorm,
            step,
            |st| st.sq.push(local),
            |st| {
                // Summed in value order: the same global sum whatever the arrival order.
                st.sq.sort_by(f64::total_cmp);
                Some(st.sq.iter().sum())
            },
        )
    }

    fn mean_loss(&self, step: u64, local: &[f32]) -> Result<f32> {
        let mean = self.collective(
            Op::Loss,
            step,
            |st| st.losses.extend_from_slice(local),
            |st| {
                if st.losses.is_empty() {
                    return None;
                }
                let sum: f64 = st.losses.iter().map(|&l| f64::from(l)).sum();
                Some(sum / st.losses.len() as f64)
            },
        )?;
        Ok(mean as f32)
    }

    fn validation_sum(&self, round: u64, local: &[(u64, f64)]) -> Result<f64> {
        self.collective(
            Op::Validation,
            round,
            |st| st.windows.extend_from_slice(local),
            |st| Some(sum_in_window_order(&mut st.windows)),
        )
    }
}

/// Wraps worker `w`'s in-memory transport handle (e.g. to count or corrupt frames in tests).
pub type WrapTransport = dyn Fn(u32, MemoryTransport) -> Box<dyn Transport> + Sync;

/// Options of [`run_local`].
#[derive(Clone, Copy)]
pub struct LocalOptions<'a> {
    /// Piece ranges per stage; `None`: the default split of the placement's stages
    /// ([`ModelSpec::balanced_split`]).
    pub partition: Option<&'a [Range<usize>]>,
    /// How long a worker waits for a frame or for the others.
    pub timeout: Duration,
    /// The job id written into frames.
    pub job: u64,
    /// Wraps each worker's transport handle.
    pub wrap: Option<&'a WrapTransport>,
    /// The step number of `steps[0]`.
    pub first_step: u64,
    /// A job's checkpoint folder, as a worker's: a run from a step past 0 resumes from that
    /// step's checkpoint (stage files of any partition), and the last step's is saved.
    pub checkpoints: Option<&'a Path>,
    /// Data-parallel replicas of the pipeline (at least 1): replica `r` trains on
    /// microbatches `r·n .. (r+1)·n` of each step (`n`: the schedule's), each on its own
    /// workers and transport, and every stage's gradients are summed over the replicas.
    pub replicas: u32,
    /// `[validation]`: `(set, freq)`, evaluate `set` after every `freq`-th step (counted
    /// from the job's first) and after the last of the steps run.
    pub validation: Option<(&'a ValidationSet, u64)>,
    /// Each stage's activation recomputation, by stage (a stage past the end: none;
    /// [`crate::Stage::set_recompute`]).
    pub recompute: &'a [Recompute],
    /// `data_parallel_shard_degree`: consecutive replicas (of `replicas` in all) that
    /// shard their optimizer state ([`WorkerRuntime::set_sharding`]); 1 shards nothing.
    pub shard_degree: u32,
    /// What the shard groups shard (`zero_stage`).
    pub zero_stage: ZeroStage,
    /// Each worker's collectives instead of the in-process [`LocalSync`] (replica `r`'s
    /// worker `w` at `r · workers + w`): e.g. gRPC's, to check they give the same bits.
    pub syncs: Option<&'a [&'a dyn StepSync]>,
}

impl Default for LocalOptions<'_> {
    fn default() -> Self {
        Self {
            partition: None,
            timeout: DEFAULT_TIMEOUT,
            job: 0,
            wrap: None,
            first_step: 0,
            checkpoints: None,
            replicas: 1,
            validation: None,
            recompute: &[],
            shard_degree: 1,
            zero_stage: ZeroStage::OptimizerState,
            syncs: None,
        }
    }
}

impl std::fmt::Debug for LocalOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalOptions")
            .field("partition", &self.partition)
            .field("timeout", &self.timeout)
            .field("job", &self.job)
            .field("wrap", &self.wrap.map(|_| "…"))
            .field("first_step", &self.first_step)
            .field("checkpoints", &self.checkpoints)
            .field("replicas", &self.replicas)
            .field("shard_degree", &self.shard_degree)
            .field("zero_stage", &self.zero_stage)
            .field("syncs", &self.syncs.map(<[_]>::len))
            .field(
                "validation",
                &self.validation.map(|(set, freq)| (set.windows(), freq)),
            )
            .finish()
    }
}

/// What [`run_local`] returns.
#[derive(Debug, Clone)]
pub struct LocalRun {
    /// The mean loss of every step.
    pub losses: Vec<f32>,
    /// Every parameter of the model after training, by name (`"{piece}.{local}"`): the
    /// first replica's.
    pub params: BTreeMap<String, Tensor>,
    /// `reports[step][worker]` (replica `r`'s worker `w` at `r · workers + w`).
    pub reports: Vec<Vec<StepReport>>,
    /// The other replicas' parameters (`replica_params[r - 1]`), to check they agree.
    pub replica_params: Vec<BTreeMap<String, Tensor>>,
    /// Each worker's optimizer-state and summed-gradient bytes after the last step (as
    /// [`LocalRun::reports`] orders the workers).
    pub optimizer_bytes: Vec<OptimizerBytes>,
}

/// Aborts the networks and the sync when a worker thread ends early (error or panic).
struct AbortGuard<'a> {
    worker: u32,
    networks: &'a [MemoryTransport],
    sync: &'a LocalSync,
    armed: bool,
}

impl Drop for AbortGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            let reason = format!("worker {} stopped", self.worker);
            for network in self.networks {
                network.abort(&reason);
            }
            self.sync.abort(&reason);
        }
    }
}

type WorkerOutcome = (Vec<StepReport>, Vec<(String, Tensor)>, OptimizerBytes);

/// Trains `steps.len()` steps (`steps[i]` holds step `i`'s `n` microbatches) with every
/// worker of `schedule` on its own thread, [`MemoryTransport`] between them and a
/// [`LocalSync`]; `options` may set the partition (default: [`ModelSpec::balanced_split`]),
/// timeout, job id and transport wrapper. When a worker fails, the others are stopped and
/// the first failure is returned.
pub fn run_local(
    schedule: &Schedule,
    spec: &ModelSpec,
    seed: u64,
    optimizer: AdamW,
    device: &Device,
    steps: &[Vec<Batch>],
    options: LocalOptions<'_>,
) -> Result<LocalRun> {
    let workers = schedule.num_workers();
    let replicas = options.replicas.max(1);
    let per_replica = schedule.microbatches as usize;
    if let Some((step, b)) = steps
        .iter()
        .enumerate()
        .find(|(_, b)| b.len() != per_replica * replicas as usize)
    {
        return Err(Error::invalid(
            "batches",
            format!(
                "step {step} has {} microbatches; {replicas} replica(s) of a schedule of \
                 {per_replica} take {}",
                b.len(),
                per_replica * replicas as usize
            ),
        ));
    }
    if let Some(syncs) = options.syncs
        && syncs.len() != (workers * replicas) as usize
    {
        return Err(Error::invalid(
            "syncs",
            format!(
                "{} syncs for {replicas} replica(s) of {workers} workers",
                syncs.len()
            ),
        ));
    }
    let partition: Vec<Range<usize>> = match options.partition {
        Some(p) => p.to_vec(),
        None => spec.balanced_split(&schedule.placement)?,
    };
    // One network per replica: frames never cross replicas, only gradient sums do.
    let mut networks = Vec::new();
    let mut handles = Vec::new();
    for r in 0..replicas {
        let replica = MemoryTransport::network(workers);
        let Some(network) = replica.first().cloned() else {
            return Err(Error::invalid("schedule", "no workers"));
        };
        networks.push(network);
        handles.extend(
            replica
                .into_iter()
                .enumerate()
                .map(|(w, h)| (r, w as u32, h)),
        );
    }
    let sync = LocalSync::with_replicas(workers * replicas, replicas, options.timeout);
    let first_failed = AtomicU32::new(u32::MAX);
    let outcomes: Vec<Result<WorkerOutcome>> = std::thread::scope(|scope| {
        let threads: Vec<_> = handles
            .into_iter()
            .map(|(r, w, handle)| {
                let index = r * workers + w;
                let (partition, networks, local_sync, first_failed) =
                    (&partition, &networks, &sync, &first_failed);
                let sync: &dyn StepSync = match options.syncs {
                    Some(syncs) => syncs[index as usize],
                    None => local_sync,
                };
                scope.spawn(move || {
                    let mut guard = AbortGuard {
                        worker: index,
                        networks,
                        sync: local_sync,
                        armed: true,
                    };
                    let run = || -> Result<WorkerOutcome> {
                        let mut rt = WorkerRuntime::new(
                            w, schedule, spec, partition, seed, device, optimizer,
                        )?;
                        if replicas > 1 {
                            rt.set_replica(Replica {
                                index: r,
                                count: replicas,
                            })?;
                        }
                        if options.shard_degree != 1 {
                            rt.set_sharding(options.shard_degree, options.zero_stage)?;
                        }
                        rt.set_timeout(options.timeout);
                        rt.set_recompute(options.recompute);
                        if let Some(output) = options.checkpoints
                            && options.first_step > 0
                        {
                            rt.resume(&Confined::at(output), options.first_step)?;
                        }
                        let transport: Box<dyn Transport> = match options.wrap {
                            Some(wrap) => wrap(w, handle),
                            None => Box::new(handle),
                        };
                        let mut reports = Vec::with_capacity(steps.len());
                        let share = r as usize * per_replica..(r as usize + 1) * per_replica;
                        let mut rounds = 0;
                        for (step, batches) in steps.iter().enumerate() {
                            let at = options.first_step + step as u64;
                            let mut report = rt.run_step(
                                options.job,
                                at,
                                &batches[share.clone()],
                                transport.as_ref(),
                                sync,
                            )?;
                            if let Some((set, freq)) = options.validation
                                && ((at + 1).is_multiple_of(freq.max(1)) || step + 1 == steps.len())
                            {
                                let through = transport.as_ref();
                                let loss = rt.validate(
                                    (options.job, at),
                                    set,
                                    through,
                                    sync,
                                    &mut rounds,
                                )?;
                                report.validation_loss = Some(loss);
                            }
                            reports.push(report);
                        }
                        let bytes = rt.optimizer_bytes();
                        let end = options.first_step + steps.len() as u64;
                        if options.checkpoints.is_some() {
                            // Every shard's part of the state, whole, in the checkpoint.
                            rt.unshard(sync, end)?;
                        }
                        // Every replica holds the same parameters: the first saves them.
                        if let Some(output) = options.checkpoints.filter(|_| r == 0) {
                            rt.save_checkpoints(&Confined::at(output), end)?;
                        }
                        let params = rt
                            .params()
                            .map(|p| (p.name.clone(), p.value.clone()))
                            .collect();
                        Ok((reports, params, bytes))
                    };
                    let result = run();
                    if result.is_err() {
                        let _ = first_failed.compare_exchange(
                            u32::MAX,
                            index,
                            Ordering::SeqCst,
                            Ordering::SeqCst,
                        );
                    } else {
                        guard.armed = false;
                    }
                    drop(guard);
                    result
                })
            })
            .collect();
        threads
            .into_iter()
            .enumerate()
            .map(|(w, t)| {
                t.join().unwrap_or_else(|_| {
                    let _ = first_failed.compare_exchange(
                        u32::MAX,
                        w as u32,
                        Ordering::SeqCst,
                        Ordering::SeqCst,
                    );
                    Err(Error::invalid("worker", format!("worker {w} panicked")))
                })
            })
            .collect()
    });
    let first = first_failed.load(Ordering::SeqCst);
    let mut per_worker = Vec::with_capacity(outcomes.len());
    let mut errors = Vec::new();
    for (w, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            Ok(o) => per_worker.push(o),
            Err(e) => errors.push((w as u32, e)),
        }
    }
    // The worker that failed first caused the others to stop: report its error.
    if let Some(at) = errors.iter().position(|(w, _)| *w == first) {
        return Err(errors.swap_remove(at).1);
    }
    if let Some((_, e)) = errors.into_iter().next() {
        return Err(e);
    }
    let mut reports: Vec<Vec<StepReport>> = (0..steps.len()).map(|_| Vec::new()).collect();
    let mut all_params = vec![BTreeMap::new(); replicas as usize];
    let mut optimizer_bytes = Vec::with_capacity(per_worker.len());
    for (index, (worker_reports, worker_params, bytes)) in per_worker.into_iter().enumerate() {
        optimizer_bytes.push(bytes);
        for (step, r) in worker_reports.into_iter().enumerate() {
            reports[step].push(r);
        }
        all_params[index / workers as usize].extend(worker_params);
    }
    let params = all_params.remove(0);
    let losses = reports
        .iter()
        .map(|r| r.first().and_then(|r| r.loss).unwrap_or(f32::NAN))
        .collect();
    Ok(LocalRun {
        losses,
        params,
        reports,
        replica_params: all_params,
        optimizer_bytes,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn part(replica: u32) -> ReplicaPart {
        ReplicaPart {
            step: 3,
            stage: 1,
            replica,
        }
    }

    /// A tied table's two copies on different workers: both get the sum; a second step
    /// is a sum of its own.
    #[test]
    fn tied_copies_get_their_sum() {
        let sync = LocalSync::new(2, Duration::from_secs(10));
        let part = |step, holder| TiedPart {
            step,
            replica: 0,
            holder,
        };
        for step in 0..2 {
            let (a, b) = std::thread::scope(|s| {
                let head = s.spawn(|| {
                    let mut g = vec![0.25, 3.0 + step as f64];
                    sync.sum_tied(part(step, TiedHolder::Head), &mut g)
                        .map(|()| g)
                });
                let mut g = vec![1.0, -1.0];
                let embedding = sync
                    .sum_tied(part(step, TiedHolder::Embedding), &mut g)
                    .map(|()| g);
                (embedding, head.join().unwrap())
            });
            let want = vec![1.25, 2.0 + step as f64];
            assert_eq!((a.unwrap(), b.unwrap()), (want.clone(), want));
        }
    }

    /// Two replicas' parts of one stage: both get the sum, whichever arrives first; an
    /// abort releases a replica waiting for a part that never comes.
    #[test]
    fn replicas_get_the_sum_or_the_abort() {
        let sync = LocalSync::with_replicas(4, 2, Duration::from_secs(10));
        let (a, b) = std::thread::scope(|s| {
            let late = s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                let mut g = vec![3.0f64, 4.0];
                sync.all_reduce_replicas(part(1), &mut g).map(|()| g)
            });
            let mut g = vec![1.0f64, 2.0];
            let first = sync.all_reduce_replicas(part(0), &mut g).map(|()| g);
            (first, late.join().unwrap())
        });
        assert_eq!((a.unwrap(), b.unwrap()), (vec![4.0, 6.0], vec![4.0, 6.0]));

        let started = Instant::now();
        let err = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                sync.abort("worker 2 stopped");
            });
            sync.all_reduce_replicas(part(0), &mut [1.0]).unwrap_err()
        });
        assert!(err.to_string().contains("worker 2 stopped"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
        let bad = sync.all_reduce_replicas(part(2), &mut [1.0]).unwrap_err();
        assert!(bad.to_string().contains("replicas"), "{bad}");
    }
}
