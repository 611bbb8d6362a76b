//! One step of a worker's program, whatever computes its passes: [`run_passes`] walks the
//! program once, taking each pass's input (from this worker's memory or the transport),
//! running the pass through [`Passes`] (real stages or emulated compute), handing its
//! output on and tracking the stash (with data-parallel replicas, handing each stage's
//! final gradients to be summed beside the passes still to come), then ends the step with
//! the [`StepSync`] collectives. Also [`StepReport`], what it returns: the runtime's own
//! record of the step, pass by pass, which its tests and the worker's pass metrics read and
//! [`StepReport::into_report`] turns into the report a run takes
//! ([`pipewise_common::run::StepReport`]); nothing else carries it.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use candle_core::DType;
use pipewise_common::pass::{Pass, PassKind};
use pipewise_common::run::StageTimes;
use pipewise_common::trace::{Activity, Span};

use super::all_reduce::{Reduced, Reducer, last_gradient_passes, sum_stage};
use super::exchange::{Input, Local};
use super::program::WorkerProgram;
use super::recorder::Recorder;
use super::sync::sum_tied_parts;
pub use super::sync::{Gathered, Replica, ReplicaPart, ShardPart, StepSync, TiedHolder, TiedPart};
use super::transport::{FrameKind, Payload, Transport};
use crate::error::{Error, Result};
use crate::stage::tied::TiedGrads;

/// What one worker's executor records of one step (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct StepReport {
    /// The step's mean loss over its microbatches (the same on every worker after the sync).
    pub loss: Option<f32>,
    /// Every pass the worker ran and its compute seconds, in program order.
    pub pass_times: Vec<PassTime>,
    /// Seconds the worker spent computing: the sum of [`StepReport::pass_times`], or less
    /// where passes ran side by side (a one-worker job on several threads), each second
    /// counted once.
    pub busy_secs: f64,
    /// Seconds from the start of the step to its end (optimizer step and syncs included).
    pub wall_secs: f64,
    /// The largest stash (bytes for pending `B` and `W` over all the worker's stages) seen
    /// at a pass boundary during the step.
    pub peak_stash_bytes: u64,
    /// The global gradient norm before clipping.
    pub grad_norm: f64,
    /// What the worker did when, in seconds of UNIX time: every pass, every wait for a
    /// peer's frame, every hand-over to the transport and the end-of-step sync.
    pub spans: Vec<Span>,
    /// Activation and gradient bytes sent to each peer worker during the step.
    pub bytes_sent: BTreeMap<u32, u64>,
    /// Activation and gradient bytes received from each peer worker during the step.
    pub bytes_received: BTreeMap<u32, u64>,
    /// Seconds of the worker's waits for peers' frames and for the end-of-step collectives
    /// that it spent waiting for a core once the data was there (0 where the OS does not
    /// say; see `core_wait`).
    pub core_wait_secs: f64,
    /// Seconds of the passes this thread ran spent waiting for a core (in
    /// [`StepReport::busy_secs`]; passes on other threads not counted).
    pub pass_core_wait_secs: f64,
    /// `[validation]`: the mean token cross-entropy over the validation windows, when the
    /// job evaluated after this step (the same on every worker).
    pub validation_loss: Option<f64>,
}

impl StepReport {
    /// What a run takes of this step: every figure but the worker's and the step's names
    /// (left at their defaults for the worker to fill), pass times as each stage's means
    /// (the loss NaN where the step has none: emulated compute).
    pub fn into_report(self) -> pipewise_common::run::StepReport {
        pipewise_common::run::StepReport {
            loss: self.loss.map_or(f64::NAN, f64::from),
            wall_secs: self.wall_secs,
            busy_secs: self.busy_secs,
            core_wait_secs: self.core_wait_secs,
            pass_core_wait_secs: self.pass_core_wait_secs,
            peak_activation_bytes: self.peak_stash_bytes,
            grad_norm: self.grad_norm,
            stage_times: stage_times(&self.pass_times),
            bytes_sent: self.bytes_sent,
            bytes_received: self.bytes_received,
            spans: self.spans,
            validation_loss: self.validation_loss,
            ..Default::default()
        }
    }
}

/// Each stage's mean F / B / W seconds (BW counted as B), and of them the part spent in the
/// stage's embedding or head piece, from `times`.
fn stage_times(times: &[PassTime]) -> Vec<StageTimes> {
    type Sums = [(f64, f64, u32); 3];
    let mut sums: BTreeMap<u32, Sums> = BTreeMap::new();
    for t in times {
        let slot = match t.pass.kind {
            PassKind::F => 0,
            PassKind::B | PassKind::BW => 1,
            PassKind::W => 2,
        };
        let e = &mut sums.entry(t.pass.stage).or_default()[slot];
        e.0 += t.secs;
        e.1 += t.edge_secs.unwrap_or(0.0);
        e.2 += 1;
    }
    let mean = |sum: f64, n: u32| if n == 0 { 0.0 } else { sum / f64::from(n) };
    sums.into_iter()
        .map(|(stage, [f, b, w])| StageTimes {
            stage,
            f: mean(f.0, f.2),
            b: mean(b.0, b.2),
            w: mean(w.0, w.2),
            edge: [mean(f.1, f.2), mean(b.1, b.2), mean(w.1, w.2)],
        })
        .collect()
}

/// One pass a worker ran and how long it computed (waiting for frames not included).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PassTime {
    /// The pass.
    pub pass: Pass,
    /// Its compute seconds.
    pub secs: f64,
    /// Of `secs`, the seconds in the stage's embedding or head piece; `None` where not
    /// measured (passes side by side).
    pub edge_secs: Option<f64>,
}

/// A worker's passes as [`run_passes`] drives them: real stages or emulated compute.
pub(crate) trait Passes {
    /// What a pass hands to another stage (a tensor, or emulated compute's byte buffer).
    type Value;
    /// Whether the step's mean loss is reported (emulated compute learns nothing).
    const LEARNS: bool;

    /// Checks, before its input is taken, that `pass` may run now.
    fn check_order(&mut self, _pass: Pass) -> Result<()> {
        Ok(())
    }

    /// The shape and dtype of the frame `pass` takes as its input.
    fn expected(&self, pass: Pass) -> Result<([usize; 3], DType)>;

    /// A received `payload` of the expected shape and dtype as the input of `pass`.
    fn input_from(&self, pass: Pass, payload: Payload) -> Result<Self::Value>;

    /// Runs `pass` on `input` (`None` for the first stage's forward and the last stage's
    /// backward); returns its output for another stage (the last stage's forward: its
    /// loss, for [`Passes::loss`]).
    fn run(&mut self, pass: Pass, input: Option<Self::Value>) -> Result<Option<Self::Value>>;

    /// The microbatch loss of the last stage's forward `pass`, from its `output`.
    fn loss(&self, pass: Pass, output: Option<Self::Value>) -> Result<f32>;

    /// `value` as a frame's payload.
    fn into_payload(value: Self::Value) -> Payload;

    /// Bytes stashed for pending `B` and `W` passes now.
    fn stash_bytes(&self) -> u64;

    /// Bytes of stashes rebuilt by the passes run since the last call (a recomputing
    /// stage's `B`), held during the pass beside what was stashed before it.
    fn take_rebuilt_bytes(&mut self) -> u64 {
        0
    }

    /// Seconds the last run `pass` spent in its stage's embedding or head piece (0: the
    /// stage has neither; `None`: not measured).
    fn edge_secs(&self, _pass: Pass) -> Option<f64> {
        None
    }

    /// This worker's data-parallel replica (a count of 1: no gradient sums).
    fn replica(&self) -> Replica {
        Replica::default()
    }

    /// The stages whose gradients this worker sums over the replicas.
    fn stages(&self) -> Vec<u32> {
        Vec::new()
    }

    /// Stage `stage`'s gradients of the step, every parameter flattened in order.
    fn stage_grads(&mut self, stage: u32) -> Result<Vec<f64>> {
        Err(Error::invalid(
            "replicas",
            format!("stage {stage}: these passes have no gradients to sum"),
        ))
    }

    /// Sets stage `stage`'s gradients to `grads` (their sum over the replicas).
    fn set_stage_grads(&mut self, _stage: u32, _grads: &[f64]) -> Result<()> {
        Ok(())
    }

    /// Tied embeddings: this worker's parts of the tied table's gradient of the step (none
    /// where it holds neither copy, or the model is untied).
    fn tied_grads(&mut self) -> Result<TiedGrads> {
        Ok(TiedGrads::default())
    }

    /// Sets the gradient of each copy of the tied table this worker holds to `sum`.
    fn set_tied_grads(&mut self, _sum: &[f64]) -> Result<()> {
        Ok(())
    }

    /// The squared gradient norm of this worker's stages (0 on a replica other than the
    /// first, whose gradients, once reduced, are the first's: counted once).
    fn grad_sq_norm(&self) -> Result<f64>;

    /// The optimizer step of step `step`, given the squared gradient norm over every
    /// worker; a sharded optimizer gathers its updated shards through `sync`.
    fn optimizer_step(&mut self, global_sq: f64, sync: &dyn StepSync, step: u64) -> Result<()>;
}

/// Runs `program` with `passes` for step `step` of run `job`, which started at `started`:
/// frames for other workers go through `transport`, and the step ends with the
/// collectives of `sync`.
pub(crate) fn run_passes<P: Passes>(
    passes: &mut P,
    program: &WorkerProgram,
    (job, step): (u64, u64),
    transport: &dyn Transport,
    sync: &dyn StepSync,
    started: Instant,
) -> Result<StepReport> {
    let replica = passes.replica();
    // With replicas, the stages' gradient sums run beside the passes still to come.
    std::thread::scope(|scope| {
        let mut reducer = (replica.count > 1).then(|| Reducer::start(scope, sync, step, replica));
        let link = program.link(transport, job, step);
        let worker = program.worker;
        let last = program.placement.stages() - 1;
        let program = &program.passes;
        let mut finals = match reducer {
            Some(_) => last_gradient_passes(program),
            None => Vec::new(),
        }
        .into_iter()
        .peekable();
        let mut local: Local<P::Value> = HashMap::new();
        let mut rec = Recorder::start(started, 2 * program.len() + 1);
        let mut losses: Vec<(u32, f32)> = Vec::new();
        let mut pass_times = Vec::with_capacity(program.len());
        let mut peak = passes.stash_bytes();
        for (i, &pass) in program.iter().enumerate() {
            let (s, mb) = (pass.stage, pass.mb);
            passes.check_order(pass)?;
            let input_kind = match pass.kind {
                PassKind::F if s > 0 => Some(FrameKind::Activation),
                PassKind::B | PassKind::BW if s < last => Some(FrameKind::Gradient),
                _ => None,
            };
            let input = match input_kind {
                Some(kind) => Some(match link.take(&mut local, &mut rec, pass, kind)? {
                    Input::Local(value) => value,
                    Input::Received(payload) => {
                        let (dims, dtype) = passes.expected(pass)?;
                        if payload.dims() != dims || payload.dtype() != dtype {
                            return Err(link.bad_frame(pass, kind, &payload, (&dims, dtype)));
                        }
                        passes.input_from(pass, payload)?
                    }
                }),
                None => None,
            };
            let stashed_before = passes.stash_bytes();
            let t0 = Instant::now();
            let mark = rec.core_wait.mark();
            let output = passes.run(pass, input)?;
            rec.core_wait.add_pass_since(mark);
            pass_times.push(PassTime {
                pass,
                secs: rec.span(Activity::Pass(pass), t0),
                edge_secs: passes.edge_secs(pass),
            });
            let to = match pass.kind {
                PassKind::F if s < last => Some((s + 1, FrameKind::Activation)),
                PassKind::B | PassKind::BW if s > 0 => Some((s - 1, FrameKind::Gradient)),
                _ => None,
            };
            if pass.kind == PassKind::F && s == last {
                losses.push((mb, passes.loss(pass, output)?));
            } else if let Some((to, kind)) = to {
                let value = output.ok_or_else(|| {
                    Error::invalid(
                        "stage",
                        format!("pass {pass} gave no {kind} for stage {to}"),
                    )
                })?;
                link.deliver(&mut local, &mut rec, pass, to, kind, value, P::into_payload)?;
            }
            peak = peak
                .max(passes.stash_bytes())
                .max(stashed_before + passes.take_rebuilt_bytes());
            if let Some(r) = &reducer {
                if let Some((_, s)) = finals.next_if(|&(at, _)| at == i) {
                    r.sum(s, passes.stage_grads(s)?);
                }
                if r.failed()
                    && let Some(r) = reducer.take()
                {
                    r.finish()?;
                }
            }
        }
        if let Some(&(s, mb, kind)) = local.keys().next() {
            return Err(Error::invalid(
                "schedule",
                format!(
                    "worker {worker}: the {kind} for stage {s} microbatch {mb} was never consumed"
                ),
            ));
        }
        let busy_secs = pass_times.iter().map(|t| t.secs).sum();
        let ran = PassesDone {
            losses,
            pass_times,
            busy_secs,
            peak,
        };
        let reduced = match reducer {
            Some(reducer) => reducer.finish()?,
            None => Vec::new(),
        };
        end_step(passes, sync, step, ran, rec, started, reduced)
    })
}

/// What a step's passes did, for [`end_step`].
pub(crate) struct PassesDone {
    /// The last stage's losses, by microbatch (in any order).
    pub(crate) losses: Vec<(u32, f32)>,
    /// Each pass's compute seconds, in program order.
    pub(crate) pass_times: Vec<PassTime>,
    /// Seconds the worker spent computing (passes side by side counted once).
    pub(crate) busy_secs: f64,
    /// The largest stash seen at a pass boundary.
    pub(crate) peak: u64,
}

/// Ends step `step` after its passes: the replicas' gradient sums not `reduced` beside the
/// passes, a tied table's sum, the global-norm clipped optimizer step and the mean loss
/// through `sync`, and the report.
pub(crate) fn end_step<P: Passes>(
    passes: &mut P,
    sync: &dyn StepSync,
    step: u64,
    mut ran: PassesDone,
    mut rec: Recorder,
    started: Instant,
    mut reduced: Vec<Reduced>,
) -> Result<StepReport> {
    let replica = passes.replica();
    if replica.count > 1 {
        for stage in passes.stages() {
            if reduced.iter().any(|r| r.stage == stage) {
                continue;
            }
            let grads = passes.stage_grads(stage)?;
            reduced.push(sum_stage(sync, step, replica, stage, grads)?);
        }
    }
    // The sync span holds taking the sums in, the collectives and the optimizer step.
    let sync_started = Instant::now();
    for r in reduced {
        passes.set_stage_grads(r.stage, &r.grads)?;
        let activity = Activity::AllReduce { stage: r.stage };
        rec.span_between(activity, r.started, r.ended);
    }
    // The tied table's copies take their summed gradient before the norm counts it.
    if let Some(sum) = sum_tied_parts(sync, step, replica, passes.tied_grads()?)? {
        passes.set_tied_grads(&sum)?;
    }
    // Global-norm clipping: every stage of every worker scales by the same factor.
    let local_sq = passes.grad_sq_norm()?;
    let mark = rec.core_wait.mark();
    let global_sq = sync.all_reduce_sq_norm(step, local_sq)?;
    rec.core_wait.add_since(mark);
    ran.losses.sort_by_key(|&(mb, _)| mb);
    let local_losses: Vec<f32> = ran.losses.into_iter().map(|(_, l)| l).collect();
    let mark = rec.core_wait.mark();
    let loss = sync.mean_loss(step, &local_losses)?;
    rec.core_wait.add_since(mark);
    // Last, after every collective: a step that fails leaves the parameters as they were
    // before it, so its workers can go on from memory (a replica lost mid-step).
    passes.optimizer_step(global_sq, sync, step)?;
    rec.span(Activity::Sync, sync_started);
    Ok(StepReport {
        loss: P::LEARNS.then_some(loss),
        pass_times: ran.pass_times,
        busy_secs: ran.busy_secs,
        wall_secs: started.elapsed().as_secs_f64(),
        peak_stash_bytes: ran.peak,
        grad_norm: global_sq.sqrt(),
        spans: rec.spans,
        bytes_sent: rec.sent,
        bytes_received: rec.received,
        core_wait_secs: rec.core_wait.waited().as_secs_f64(),
        pass_core_wait_secs: rec.core_wait.in_passes().as_secs_f64(),
        validation_loss: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each stage's means by kind (a fused `BW` as `B`), edges where measured, and the loss
    /// NaN where the step has none.
    #[test]
    fn the_report_holds_each_stages_mean_pass_times() {
        let time = |pass, secs, edge_secs| PassTime {
            pass,
            secs,
            edge_secs,
        };
        let record = StepReport {
            loss: None,
            pass_times: vec![
                time(Pass::f(1, 0), 1.0, Some(0.5)),
                time(Pass::f(1, 1), 3.0, Some(0.25)),
                time(Pass::b(1, 0), 2.0, None),
                time(Pass::bw(1, 1), 4.0, None),
                time(Pass::f(0, 0), 0.5, None),
                time(Pass::w(0, 0), 0.25, Some(0.125)),
            ],
            busy_secs: 10.75,
            wall_secs: 12.0,
            peak_stash_bytes: 77,
            grad_norm: 1.5,
            spans: Vec::new(),
            bytes_sent: [(1, 5)].into(),
            bytes_received: [(1, 6)].into(),
            core_wait_secs: 0.5,
            pass_core_wait_secs: 0.25,
            validation_loss: Some(2.0),
        };
        let report = record.into_report();
        assert!(report.loss.is_nan());
        assert_eq!(
            report.stage_times,
            [
                StageTimes {
                    stage: 0,
                    f: 0.5,
                    b: 0.0,
                    w: 0.25,
                    edge: [0.0, 0.0, 0.125],
                },
                StageTimes {
                    stage: 1,
                    f: 2.0,
                    b: 3.0,
                    w: 0.0,
                    edge: [0.375, 0.0, 0.0],
                },
            ]
        );
        assert_eq!(
            (report.busy_secs, report.wall_secs, report.grad_norm),
            (10.75, 12.0, 1.5)
        );
        assert_eq!(report.peak_activation_bytes, 77);
        assert_eq!(report.bytes_received.get(&1), Some(&6));
        assert_eq!(report.validation_loss, Some(2.0));
        let learned = StepReport {
            loss: Some(0.5),
            ..report_of_nothing()
        };
        assert_eq!(learned.into_report().loss, 0.5);
    }

    fn report_of_nothing() -> StepReport {
        StepReport {
            loss: None,
            pass_times: Vec::new(),
            busy_secs: 0.0,
            wall_secs: 0.0,
            peak_stash_bytes: 0,
            grad_norm: 0.0,
            spans: Vec::new(),
            bytes_sent: BTreeMap::new(),
            bytes_received: BTreeMap::new(),
            core_wait_secs: 0.0,
            pass_core_wait_secs: 0.0,
            validation_loss: None,
        }
    }
}
