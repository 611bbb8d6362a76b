//! What a worker is given to run, checked: its program of a schedule ([`WorkerProgram`])
//! and the partition of the model into stages.

use std::collections::HashMap;
use std::ops::Range;
use std::time::Duration;

use pipewise_common::model::ModelSpec;
use pipewise_common::pass::{Pass, PassKind};
use pipewise_common::placement::Placement;
use pipewise_common::schedule::Schedule;

use super::exchange::Link;
use super::transport::Transport;
use crate::error::{Error, Result};

/// How long a worker waits for a frame or for the other workers at a step's end, unless
/// told otherwise ([`WorkerRuntime::set_timeout`](super::WorkerRuntime::set_timeout)).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// One worker's part of a schedule: its index, the placement, its passes of a step in
/// order, and how long it waits for a peer's frame.
#[derive(Debug, Clone)]
pub(crate) struct WorkerProgram {
    pub(crate) worker: u32,
    pub(crate) placement: Placement,
    pub(crate) microbatches: u32,
    pub(crate) passes: Vec<Pass>,
    pub(crate) timeout: Duration,
}

impl WorkerProgram {
    /// Worker `worker` running `passes` (its program of a schedule over `placement` with
    /// `microbatches` microbatches), as a remote worker gets it in an assignment; checked
    /// by [`check_program`].
    pub(crate) fn new(
        worker: u32,
        placement: &Placement,
        microbatches: u32,
        passes: Vec<Pass>,
    ) -> Result<Self> {
        worker_of(worker, placement.workers(), "placement")?;
        check_program(worker, placement, microbatches, &passes)?;
        Ok(WorkerProgram {
            worker,
            placement: placement.clone(),
            microbatches,
            passes,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// This worker's view of the exchanges of step `step` of run `job` over `transport`.
    pub(crate) fn link<'a>(
        &'a self,
        transport: &'a dyn Transport,
        job: u64,
        step: u64,
    ) -> Link<'a> {
        Link {
            worker: self.worker,
            placement: &self.placement,
            transport,
            job,
            step,
            timeout: self.timeout,
        }
    }
}

/// Worker `worker`'s passes of `schedule`, which is validated (every pass present once,
/// dependencies acyclic).
pub(crate) fn schedule_program(worker: u32, schedule: &Schedule) -> Result<Vec<Pass>> {
    pipewise_common::validate(schedule)?;
    worker_of(worker, schedule.num_workers(), "schedule")?;
    Ok(schedule.workers[worker as usize].clone())
}

/// Worker `worker` is one of `workers` (of a `what`: schedule, placement).
fn worker_of(worker: u32, workers: u32, what: &str) -> Result<()> {
    if worker < workers {
        Ok(())
    } else {
        Err(Error::invalid(
            "worker",
            format!("worker {worker} of a {workers}-worker {what}"),
        ))
    }
}

/// One worker's program: its own stages, microbatches in range, each pass once, and a
/// complete forward and backward for every (stage, microbatch) it holds.
pub(crate) fn check_program(
    worker: u32,
    placement: &Placement,
    microbatches: u32,
    program: &[Pass],
) -> Result<()> {
    let mine = placement.stages_of(worker);
    let mut seen: HashMap<(PassKind, u32, u32), usize> = HashMap::new();
    for (i, p) in program.iter().enumerate() {
        if !mine.contains(&p.stage) {
            return Err(Error::invalid(
                "program",
                format!(
                    "pass {i} ({p}) is on stage {} that worker {worker} does not hold",
                    p.stage
                ),
            ));
        }
        if p.mb >= microbatches {
            return Err(Error::invalid(
                "program",
                format!(
                    "pass {i} ({p}) is for microbatch {} of {microbatches}",
                    p.mb
                ),
            ));
        }
        if let Some(first) = seen.insert((p.kind, p.stage, p.mb), i) {
            return Err(Error::invalid(
                "program",
                format!("pass {i} ({p}) repeats pass {first}"),
            ));
        }
    }
    for &s in &mine {
        for mb in 0..microbatches {
            let has = |k: PassKind| seen.contains_key(&(k, s, mb));
            let backward = has(PassKind::BW) || (has(PassKind::B) && has(PassKind::W));
            if !has(PassKind::F) || !backward {
                return Err(Error::invalid(
                    "program",
                    format!(
                        "stage {s} microbatch {mb} lacks its forward or a complete backward \
                         (B and W, or BW)"
                    ),
                ));
            }
        }
    }
    Ok(())
}

pub(crate) fn check_partition(
    spec: &ModelSpec,
    partition: &[Range<usize>],
    stages: u32,
) -> Result<()> {
    let total = spec.layers as usize + 2;
    if partition.len() != stages as usize {
        return Err(Error::invalid(
            "partition",
            format!("{} piece ranges for {stages} stages", partition.len()),
        ));
    }
    let mut next = 0;
    for (s, r) in partition.iter().enumerate() {
        if r.start != next || r.end <= r.start {
            return Err(Error::invalid(
                "partition",
                format!(
                    "stage {s} holds pieces {}..{}, expected a non-empty range from {next}",
                    r.start, r.end
                ),
            ));
        }
        next = r.end;
    }
    if next != total {
        return Err(Error::invalid(
            "partition",
            format!("the ranges end at piece {next}, the model has {total}"),
        ));
    }
    Ok(())
}
