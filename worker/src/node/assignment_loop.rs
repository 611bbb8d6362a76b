//! The assignment loop: one dedicated thread (candle compute stays off the async runtime) that
//! runs assignments one after another. For each it decodes the assignment, builds its
//! [`Compute`] (real or emulated), points the worker's transport at the run and its peers,
//! joins the start barrier and runs the steps in one loop. After every step it queues the
//! step's report ([`StepReport`], the executor's figures named by this worker) for the
//! reporter, so the coordinator is never waited on within a step.

use std::path::PathBuf;

use pipewise_common::job::{job_of, run_of};
use pipewise_common::pass::PassKind;
use pipewise_common::run::StepReport;
use pipewise_proto::v1 as pb;
use tokio::sync::mpsc;

use super::assignment::Assignment;
use super::compute::{Compute, EmulatedCompute, Kept, RealCompute, RunNet};
use super::config::NodeConfig;
use super::shared::Shared;
use crate::error::{Error, Result};
use crate::net::NetSync;
use crate::runtime::StepReport as StepRecord;

/// A step report carries the step's spans only up to this many (about 9 MB encoded; the
/// coordinator accepts 64 MiB reports); longer steps are reported without a trace.
const MAX_REPORTED_SPANS: usize = 200_000;

/// Runs assignments one after another until the channel closes.
pub(crate) fn run_assignments(
    config: &NodeConfig,
    shared: &Shared,
    assignments: &std::sync::mpsc::Receiver<pb::Assignment>,
    reports: &mpsc::UnboundedSender<StepReport>,
) {
    // Sharing its host's cores with other workers, it fans out to its share of them.
    if config.cores > 0.0 {
        crate::kernels::cpu::limit_threads((config.cores.floor() as usize).max(1));
    }
    // The last real run's stages, while the job may go on from them.
    let mut kept = None;
    while let Ok(a) = assignments.recv() {
        let (job, worker, replica) = (a.run, a.worker_index, a.replica);
        // Every log line of the job carries its id and the worker (and, below, the step).
        let _job_span = tracing::info_span!(
            "job",
            job = job_of(job),
            run = run_of(job),
            worker,
            id = %config.id
        )
        .entered();
        shared.current().job = Some(job);
        let first_step = a.first_step;
        // The step being run; `None` until the run's first step starts.
        let mut running = None;
        let outcome = run_assignment(config, shared, a, reports, &mut running, &mut kept);
        let last_step = running.unwrap_or(first_step);
        let mut report = StepReport {
            run: job,
            worker_id: config.id.clone(),
            worker_index: worker,
            replica,
            step: last_step,
            ..Default::default()
        };
        match outcome {
            Ok(path) => {
                report.done = true;
                report.params_path = path.display().to_string();
            }
            // Abandoned to leave the cluster: the worker's `Leave` tells the coordinator.
            Err(e) if shared.draining() => {
                tracing::info!(step = last_step, "run abandoned to leave: {e}");
                shared.current().job = None;
                shared.ended.notify_one();
                continue;
            }
            Err(e) => {
                // The job span gives the job, the re-plan and the worker.
                tracing::error!(step = last_step, "assignment failed: {e}");
                report.error = e.to_string();
                report.starting = running.is_none();
                shared
                    .transport
                    .abort(&format!("worker {worker} failed: {e}"));
            }
        }
        shared.report_queued();
        let _ = reports.send(report);
        shared.current().job = None;
        shared.ended.notify_one();
    }
}

/// Runs one assignment; returns where the final parameters were written.
fn run_assignment(
    config: &NodeConfig,
    shared: &Shared,
    a: pb::Assignment,
    reports: &mpsc::UnboundedSender<StepReport>,
    running: &mut Option<u64>,
    kept: &mut Option<Kept>,
) -> Result<PathBuf> {
    let mut a = Assignment::decode(a, &config.data_dir)?;
    let program = std::mem::take(&mut a.program);
    let node = Node {
        config,
        shared,
        reports,
    };
    if a.spec.compute.is_emulated() {
        let mut compute = EmulatedCompute::new(config, &a, program)?;
        node.run(&a, &mut compute, running)
    } else {
        let mut compute = RealCompute::new(config, &a, program, kept)?;
        let outcome = node.run(&a, &mut compute, running);
        // Ended or failed, the stages stay for a next run that goes on from them.
        *kept = compute.keep();
        outcome
    }
}

/// What the step loop reports to.
struct Node<'a> {
    config: &'a NodeConfig,
    shared: &'a Shared,
    reports: &'a mpsc::UnboundedSender<StepReport>,
}

impl Node<'_> {
    /// Joins the run and runs its steps with `compute` until the last one or until the
    /// coordinator asks the run to stop; `running` follows the step being run (`None`
    /// before the first).
    fn run<C: Compute>(
        &self,
        a: &Assignment,
        compute: &mut C,
        running: &mut Option<u64>,
    ) -> Result<PathBuf> {
        let transport = &self.shared.transport;
        let sync = self.join(a, C::DELIVERY, compute)?;
        let net = RunNet {
            run: a.run,
            transport: transport.as_ref(),
            sync: &sync,
        };
        for step in a.steps.clone() {
            let step_span = tracing::debug_span!("step", step, emulated = tracing::field::Empty);
            if C::EMULATED {
                step_span.record("emulated", true);
            }
            let _step_span = step_span.entered();
            if let Some(pace) = &self.config.pace {
                self.shared.wait_reported(self.config.timeout);
                pace.before_step(a.run, step);
            }
            *running = Some(step);
            let initial = if step == a.steps.start {
                compute.before_first_step(step, &net)?
            } else {
                None
            };
            let record = compute.step(step, &net)?;
            let record = match &self.config.pace {
                Some(pace) => {
                    let slowdown = self.config.slowdown.at(step);
                    paced_report(&record, &a.partition, |kind, pieces| {
                        pace.pass_secs(kind, pieces, slowdown)
                    })
                }
                None => record,
            };
            crate::metrics::record_step(a.worker, &record);
            let report = StepReport {
                initial_validation_loss: initial,
                ..record.into_report()
            };
            if let Some(pace) = &self.config.pace {
                pace.before_report(a.run, step, a.replica.index);
            }
            self.publish_step(a, step, report, compute.held_bytes());
            let done = step + 1;
            compute.after_step(done, a.steps.end)?;
            if sync.stop_requested() {
                tracing::info!(
                    step = done,
                    "stopping: asked by the coordinator (a cancel, or a re-plan between steps)"
                );
                break;
            }
        }
        let to_end = running.is_some_and(|step| step + 1 == a.steps.end);
        compute.finish(running.unwrap_or(a.steps.start) + 1, to_end)
    }

    /// Readies the transport for `a` (its stages, frames delivered as `delivery`, the
    /// peers' addresses, worker 0's collectives), waits at the start barrier for the run's
    /// other workers and resets the activation counters. Returns the end-of-step
    /// collectives.
    fn join<C: Compute>(
        &self,
        a: &Assignment,
        delivery: crate::net::Delivery,
        compute: &mut C,
    ) -> Result<NetSync> {
        let transport = &self.shared.transport;
        let timeout = self.config.timeout;
        transport.set_run_secret(a.run, a.run_secret.clone());
        transport.assign(a.run, a.placement.stages_of(a.worker), delivery);
        let tier = |w: &u32| match a.same_host.contains(w) {
            true => crate::net::Tier::Shm,
            false => transport.network_tier(),
        };
        transport.set_peers_with_tiers(
            a.run,
            a.worker,
            a.peers.iter().map(|(w, addr)| (*w, addr.as_str(), tier(w))),
        )?;
        let tiers: Vec<(u32, crate::net::Tier)> = a
            .peers
            .keys()
            .filter(|&&w| w != a.worker)
            .map(|&w| (w, tier(&w)))
            .collect();
        tracing::info!(run = a.run, worker = a.worker, ?tiers, "peer tiers");
        crate::metrics::record_tiers(a.worker, tiers);
        // With replicas, every worker takes partial sums of its rank's chain.
        if a.contributor == 0 || a.grad_chain.is_some() {
            let workers = a.placement.workers() * a.replica.count;
            transport
                .collective()
                .configure(a.run, workers, a.replica, timeout);
        }
        let sync = match a.contributor {
            0 => transport.sync_at(a.root(), a.run, 0, timeout)?,
            n => transport.sync_to(a.root(), a.run, n, timeout)?,
        };
        let replica_0s = format!("replica 0's worker {}", a.worker);
        // Before the barrier: past it, the replica before's partials may come.
        let sync = match &a.grad_chain {
            Some(chain) => {
                let chain = transport
                    .grad_chain(a.replica, chain, a.run, a.contributor, timeout)
                    .map_err(|e| Error::invalid("assignment", format!("grad_chain: {e}")))?;
                sync.with_grad_chain(chain)
            }
            None => sync,
        };
        // A replica rebuilt copies its stages from a live replica's worker of its rank, which
        // offers them until every worker passed the barrier (the copies are taken first).
        if a.offer_copies {
            for (stage, bytes) in compute.stage_states()? {
                transport.collective().offer(a.run, stage, bytes);
            }
        }
        // Emulated compute holds no state to copy.
        if !a.copy_from.is_empty() && !C::EMULATED {
            let from = transport
                .sync_to(&a.copy_from, a.run, a.contributor, timeout)?
                .serving(replica_0s);
            for stage in a.placement.stages_of(a.worker) {
                let bytes = from.fetch_stage(stage)?;
                compute.load_stage_state(stage, &bytes)?;
            }
            tracing::info!(
                step = a.steps.start,
                from = %a.copy_from,
                "copied the stages' state from a live replica (no checkpoint loaded)"
            );
        }
        self.take_handover(a, compute)?;
        let joined = sync.barrier();
        // Offers go once every worker passed the barrier, or the run failed to start.
        transport.collective().withdraw();
        joined?;
        let mut stats = self.shared.stats();
        stats.peak_activation_bytes = 0;
        stats.current_activation_bytes = 0;
        Ok(sync)
    }

    /// A move from memory: offers the stages this worker held in the run before, then builds
    /// its stages' state from the held stages their pieces overlap (its own in process,
    /// the others' fetched from their holders, which offer them until the start barrier).
    fn take_handover<C: Compute>(&self, a: &Assignment, compute: &mut C) -> Result<()> {
        let transport = &self.shared.transport;
        let held = compute.take_held_states();
        for (stage, bytes) in &held {
            transport.collective().offer(a.run, *stage, bytes.clone());
        }
        // Emulated compute holds no state to hand over.
        if a.handover.is_empty() || C::EMULATED {
            return Ok(());
        }
        let own = a.peers.get(&a.worker);
        let mut states = Vec::with_capacity(a.handover.len());
        for h in &a.handover {
            let mine = held
                .iter()
                .find(|(stage, _)| *stage == h.stage && own == Some(&h.address));
            let bytes = match mine {
                Some((_, bytes)) => bytes.clone(),
                None => transport
                    .sync_to(&h.address, a.run, a.contributor, self.config.timeout)?
                    .serving(format!("the holder of stage {} of the run before", h.stage))
                    .fetch_stage(h.stage)?
                    .into(),
            };
            states.push(bytes);
        }
        compute.load_handover(&states)?;
        tracing::info!(
            step = a.steps.start,
            held = a.handover.len(),
            "took the stages' state from the run before's workers (no checkpoint loaded)"
        );
        Ok(())
    }

    /// Records step `step`'s `report` in the heartbeat statistics (`held`: activation bytes
    /// still stashed after it) and sends it to the coordinator, named by this worker, with
    /// the bytes its stages hold (`static_bytes`).
    fn publish_step(
        &self,
        a: &Assignment,
        step: u64,
        report: StepReport,
        (held, static_bytes): (u64, u64),
    ) {
        {
            let mut stats = self.shared.stats();
            stats.step = step + 1;
            stats.peak_activation_bytes = stats
                .peak_activation_bytes
                .max(report.peak_activation_bytes);
            stats.current_activation_bytes = held;
            stats.stage_times = report.stage_times.clone();
        }
        self.shared.report_queued();
        let mut report = StepReport {
            run: a.run,
            worker_id: self.config.id.clone(),
            worker_index: a.worker,
            replica: a.replica.index,
            step,
            static_bytes,
            ..report
        };
        if report.spans.len() > MAX_REPORTED_SPANS {
            report.spans = Vec::new();
        }
        let _ = self.reports.send(report);
    }
}

/// `record` with the logical pass times of a paced worker (`secs(kind, pieces)` of a pass
/// of a stage holding `pieces` pieces of `partition`): its time in passes is their sum, its
/// wall time the same, it waited for no core, and it carries no spans (measured, they
/// would feed the cost model's sync, hop and sum fits).
fn paced_report(
    record: &StepRecord,
    partition: &[std::ops::Range<usize>],
    secs: impl Fn(PassKind, usize) -> f64,
) -> StepRecord {
    let mut paced = record.clone();
    for t in &mut paced.pass_times {
        let pieces = partition.get(t.pass.stage as usize).map_or(0, |r| r.len());
        t.secs = secs(t.pass.kind, pieces);
        t.edge_secs = None;
    }
    paced.busy_secs = paced.pass_times.iter().map(|t| t.secs).sum();
    paced.wall_secs = paced.busy_secs;
    paced.core_wait_secs = 0.0;
    paced.pass_core_wait_secs = 0.0;
    paced.spans.clear();
    paced
}

#[cfg(test)]
mod tests {
    use pipewise_common::pass::{Pass, PassKind};
    use pipewise_common::trace::{Activity, Span};

    use super::{StepRecord as StepReport, paced_report};
    use crate::runtime::PassTime;

    #[test]
    fn a_paced_report_carries_the_logical_pass_times_only() {
        let pass = |kind, stage| Pass { kind, stage, mb: 0 };
        let measured = |p: Pass| PassTime {
            pass: p,
            secs: 0.5,
            edge_secs: Some(0.1),
        };
        let passes = [
            pass(PassKind::F, 0),
            pass(PassKind::F, 1),
            pass(PassKind::BW, 1),
        ];
        let report = StepReport {
            loss: Some(1.0),
            pass_times: passes.iter().copied().map(measured).collect(),
            busy_secs: 1.5,
            wall_secs: 2.0,
            peak_stash_bytes: 7,
            grad_norm: 1.0,
            spans: vec![Span {
                activity: Activity::Sync,
                start: 0.0,
                end: 1.0,
            }],
            bytes_sent: Default::default(),
            bytes_received: Default::default(),
            core_wait_secs: 0.25,
            pass_core_wait_secs: 0.125,
            validation_loss: None,
        };
        // Stage 0 holds 2 pieces, stage 1 holds 3; F is 1 s a piece, BW 10 s.
        let secs = |kind, pieces: usize| match kind {
            PassKind::F => pieces as f64,
            _ => 10.0 * pieces as f64,
        };
        let paced = paced_report(&report, &[0..2, 2..5], secs);
        let times: Vec<(f64, Option<f64>)> = paced
            .pass_times
            .iter()
            .map(|t| (t.secs, t.edge_secs))
            .collect();
        assert_eq!(times, [(2.0, None), (3.0, None), (30.0, None)]);
        assert_eq!((paced.busy_secs, paced.wall_secs), (35.0, 35.0));
        assert_eq!(
            (paced.core_wait_secs, paced.pass_core_wait_secs),
            (0.0, 0.0)
        );
        assert!(paced.spans.is_empty());
        assert_eq!((paced.loss, paced.peak_stash_bytes), (Some(1.0), 7));
    }
}
