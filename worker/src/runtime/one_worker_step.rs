//! One step of a worker that holds every stage of its job (a one-worker job) on a CPU with
//! several threads: its microbatches run side by side, one per thread, instead of one
//! after the other with every small GEMM cut over the threads.
//!
//! Microbatches go in groups of as many as there are threads, in microbatch order: `F` of
//! the group through the stages, first to last, one microbatch per lane; `B` back through
//! them; then `W`, each lane accumulating a share of the pieces, microbatches in order.
//! Every parameter thus sums its microbatches' gradients in the order one thread would,
//! and every kernel gives the same bits on any thread count, so the step's results are
//! bit for bit those of the program run pass by pass. What changes is the order of the
//! passes (every schedule's program on one worker computes the same thing) and the memory:
//! a group holds one stash per microbatch in it, whatever the schedule would hold.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use candle_core::Tensor;
use pipewise_common::pass::{Pass, PassKind};
use pipewise_common::trace::Activity;

use super::program::WorkerProgram;
use super::real_passes::RealPasses;
use super::recorder::Recorder;
use super::step::{PassTime, Passes, PassesDone, StepReport, StepSync, end_step};
use crate::error::Result;
use crate::lanes::Ran;
use crate::stage::ForwardItem;

/// Whether `program`'s worker holds every stage, so its whole step is local.
pub(super) fn holds_every_stage(program: &WorkerProgram) -> bool {
    program.placement.stages_of(program.worker).len() == program.placement.stages() as usize
}

/// Runs step `step` of `program` (whose worker holds every stage) with up to `lanes`
/// microbatches side by side, then ends it through `sync`.
pub(super) fn run_side_by_side(
    p: &mut RealPasses<'_>,
    program: &WorkerProgram,
    step: u64,
    sync: &dyn StepSync,
    started: Instant,
    lanes: usize,
) -> Result<StepReport> {
    let mut rec = Recorder::start(started, program.passes.len() + 1);
    let fused: HashSet<(u32, u32)> = program
        .passes
        .iter()
        .filter(|x| x.kind == PassKind::BW)
        .map(|x| (x.stage, x.mb))
        .collect();
    let mut times = Times {
        fused,
        b_ran: HashMap::new(),
        out: Vec::with_capacity(program.passes.len()),
    };
    let stages: Vec<u32> = p.stages.keys().copied().collect();
    let mbs: Vec<u32> = (0..program.microbatches).collect();
    let (mut losses, mut busy, mut peak) = (Vec::new(), 0.0, p.stash_bytes());
    for group in mbs.chunks(lanes.max(1)) {
        let t0 = Instant::now();
        // F, first stage to last; the last stage's outputs are the losses.
        let mut outs: Vec<Tensor> = Vec::new();
        for &s in &stages {
            let items: Vec<ForwardItem<'_>> = group
                .iter()
                .enumerate()
                .map(|(i, &mb)| {
                    let batch = &p.batches[mb as usize];
                    let input = outs.get(i).unwrap_or(&batch.tokens);
                    (mb, input, (s == p.last).then_some(&batch.targets))
                })
                .collect();
            let ran = p.stage_mut(s)?.forward_side_by_side(&items)?;
            outs = group
                .iter()
                .zip(ran)
                .map(|(&mb, r)| times.pass(&mut rec, Pass::f(s, mb), &r, r.value.clone()))
                .collect();
        }
        for (&mb, loss) in group.iter().zip(&outs) {
            losses.push((mb, loss.to_scalar::<f32>()?));
        }
        peak = peak.max(p.stash_bytes());
        // B, last stage to first.
        let mut grads: Vec<Option<Tensor>> = vec![None; group.len()];
        for &s in stages.iter().rev() {
            let items: Vec<(u32, Option<&Tensor>)> = group
                .iter()
                .zip(&grads)
                .map(|(&mb, g)| (mb, g.as_ref()))
                .collect();
            let stashed_before = p.stash_bytes();
            let stage = p.stage_mut(s)?;
            let ran = stage.backward_input_side_by_side(&items)?;
            peak = peak.max(stashed_before + stage.take_rebuilt_bytes());
            grads = group
                .iter()
                .zip(ran)
                .map(|(&mb, r)| times.b(&mut rec, s, mb, r))
                .collect();
        }
        peak = peak.max(p.stash_bytes());
        // W, each stage's pieces shared among the lanes.
        for &s in &stages {
            let ran = p.stage_mut(s)?.backward_weight_side_by_side(group, lanes)?;
            times.w(&mut rec, s, group, &ran);
        }
        busy += t0.elapsed().as_secs_f64();
        p.stretch(t0);
    }
    // In program order, as the pass-by-pass loop reports them.
    let order: HashMap<Pass, usize> = program
        .passes
        .iter()
        .enumerate()
        .map(|(i, &x)| (x, i))
        .collect();
    let mut pass_times = times.out;
    pass_times.sort_by_key(|t| order.get(&t.pass).copied().unwrap_or(usize::MAX));
    let done = PassesDone {
        losses,
        pass_times,
        busy_secs: busy,
        peak,
    };
    end_step(p, sync, step, done, rec, started, Vec::new())
}

/// Each pass's time and span as the program names it: a `B` and `W` the program runs as
/// one `BW` are reported as that, from the `B`'s start to the `W`'s end.
struct Times {
    fused: HashSet<(u32, u32)>,
    /// When each `B` of a fused pair started, and its seconds.
    b_ran: HashMap<(u32, u32), (Instant, f64)>,
    out: Vec<PassTime>,
}

impl Times {
    /// Records `pass`, which ran as `r`; returns `value`.
    fn pass<R, V>(&mut self, rec: &mut Recorder, pass: Pass, r: &Ran<R>, value: V) -> V {
        let secs = rec.span_between(Activity::Pass(pass), r.started, r.ended);
        self.out.push(PassTime {
            pass,
            secs,
            edge_secs: None,
        });
        value
    }

    /// Records `B` of `(s, mb)` (kept for its `BW` where the program fuses them).
    fn b(&mut self, rec: &mut Recorder, s: u32, mb: u32, r: Ran<Option<Tensor>>) -> Option<Tensor> {
        if self.fused.contains(&(s, mb)) {
            let secs = r.ended.saturating_duration_since(r.started).as_secs_f64();
            self.b_ran.insert((s, mb), (r.started, secs));
            return r.value;
        }
        self.pass(rec, Pass::b(s, mb), &r, ());
        r.value
    }

    /// Records `W` of stage `s` for the microbatches of `group`, which ran together as
    /// `r`: each gets the span and an equal share of the seconds.
    fn w(&mut self, rec: &mut Recorder, s: u32, group: &[u32], r: &Ran<()>) {
        let share = r.ended.saturating_duration_since(r.started).as_secs_f64() / group.len() as f64;
        for &mb in group {
            let (kind, started, before) = match self.b_ran.remove(&(s, mb)) {
                Some((started, b_secs)) => (PassKind::BW, started, b_secs),
                None => (PassKind::W, r.started, 0.0),
            };
            let pass = Pass::new(kind, s, mb);
            rec.span_between(Activity::Pass(pass), started, r.ended);
            self.out.push(PassTime {
                pass,
                secs: before + share,
                edge_secs: None,
            });
        }
    }
}
