//! A cost model of a job's own pieces: what a pass of each kind (F, B, W, the fused BW)
//! costs over an embedding, a block and the head, what a byte on a hop costs, and the
//! end-of-step sync (the all-reduces and the optimizer step), with a speed factor per
//! worker. Pure: the caller feeds what workers registered and reported.
//!
//! It starts from FLOPs ([`ModelSpec::piece_flops`]) over the speed each worker measured in
//! its start-up profile (a small GEMM timed when the worker starts), slowed where a worker
//! may count on less than a core (the threads of a `pipewise local` with more workers than
//! cores): such workers share the cores, so each computes at that share of its profile. Every step's reports refine it: the mean pass time per stage and
//! kind each worker reports becomes a running mean per (worker, stage make-up, kind), and
//! the per-piece costs and per-worker factors are fitted to all of them (`fit.rs`); a hop
//! costs the latency that makes the step's simulated makespan its measured one (`hop.rs`). Every
//! block has the same shape, so a block's cost is one unknown however many there are.
//!
//! [`CostModel::predict`] turns it into [`Costs`] for a plan on a split and simulates the
//! schedule: the predicted step time (makespan plus sync) and bubble, counting the sync
//! as idle as the measured bubble does. A prediction uses only the steps observed so far:
//! the supervisor predicts step `k` when step `k − 1` completes.
//!
//! What it keeps: the running means cover a stage's last 16 steps; a run's first step
//! (building its stages and buffers, slower) counts only until the run's second step
//! replaces it. A stage holding the embedding or the head beside blocks also reports that
//! piece's own share of each pass (timed on the CPU; a GPU runs its ops asynchronously and
//! reports none), so one split tells a dear piece from a slow worker. The fit serves splits
//! a worker has not run; a stage it has run (the split in use) is predicted by its running
//! means themselves, since no one speed factor per worker need fit every split seen (a
//! worker's backward slowed more than its forward). The sync is the step's shortest sync
//! span (the worker that arrived last waited least).

mod all_reduce;
mod fit;
mod hop;
mod measured;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;

use crate::cost::{Costs, StageCost};
use crate::model::ModelSpec;
use crate::pass::PassKind;
use crate::run::worker::{StepReport, Worker};
use crate::schedule::Schedule;
use crate::simulate::{Simulation, simulate};
use crate::trace::Activity;

pub(crate) use all_reduce::sums_end;
use fit::{Row, UNKNOWNS, fit};

/// The speed assumed for a worker that registered no profile (FLOP/s).
pub const DEFAULT_FLOPS: f64 = 1e10;

/// Seconds per byte on a hop before any is measured (about 1 GB/s).
const DEFAULT_SECS_PER_BYTE: f64 = 1e-9;

/// A running mean over at most this many steps (older steps fade: exponential averaging
/// once the window is full).
const WINDOW: f64 = 16.0;

/// Fits kept for [`CostModel::forget`]: more than a drift's steps.
const FITS_KEPT: usize = 8;

/// Seconds of one pass of each kind over one piece, for a worker of the workers' mean speed.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct PieceCost {
    /// Forward.
    pub f: f64,
    /// Input-gradient backward.
    pub b: f64,
    /// Weight-gradient backward.
    pub w: f64,
}

/// The piece a stage of `counts` (embeddings, blocks, heads) has timed alone, by index:
/// the embedding (0) or the head (2) beside blocks. Its own time then tells that piece's
/// cost from its worker's speed on one split; a stage holding both, or no block, tells
/// nothing more.
fn timed_edge(counts: [u32; 3]) -> Option<usize> {
    match counts {
        [1, b, 0] if b > 0 => Some(0),
        [0, b, 1] if b > 0 => Some(2),
        _ => None,
    }
}

/// A running mean with a window ([`WINDOW`]); a provisional sample counts only until the
/// next one comes, which replaces it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Mean {
    value: f64,
    n: f64,
    /// The mean before a provisional sample.
    before: Option<(f64, f64)>,
}

impl Mean {
    /// A mean of `n` samples at `value`.
    fn of(value: f64, n: f64) -> Mean {
        Mean {
            value,
            n,
            before: None,
        }
    }

    fn add(&mut self, x: f64, provisional: bool) {
        if x.is_finite() && x >= 0.0 {
            if let Some((value, n)) = self.before.take() {
                (self.value, self.n) = (value, n);
            }
            if provisional {
                self.before = Some((self.value, self.n));
            }
            self.n = (self.n + 1.0).min(WINDOW);
            self.value += (x - self.value) / self.n;
        }
    }

    fn get(&self) -> Option<f64> {
        (self.n > 0.0).then_some(self.value)
    }
}

/// What the model predicts for a plan on a split.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    /// Predicted step time: the simulated makespan plus the end-of-step sync (seconds).
    pub step_secs: f64,
    /// `1 − Σ busy / (workers × step time)`: waits and the sync count as idle.
    pub bubble: f64,
    /// The per-stage costs simulated.
    pub costs: Costs,
}

/// The median of `xs` (of an even count, the mean of the middle two; 0 for none).
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => xs[n / 2],
        _ => 0.5 * (xs[n / 2 - 1] + xs[n / 2]),
    }
}

/// Whether each of `stages` stages of `schedule` runs its backward as one fused `BW`.
fn fused_stages(schedule: &Schedule, stages: usize) -> Vec<bool> {
    (0..stages as u32)
        .map(|s| {
            schedule
                .workers
                .iter()
                .flatten()
                .any(|p| p.stage == s && p.kind == PassKind::BW)
        })
        .collect()
}

/// What a pass time is a sample of: the worker (by index), its stage's embeddings, blocks
/// and heads, and the pass kind.
type SampleKey = (usize, [u32; 3], PassKind);

/// The cost model of one job (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct CostModel {
    model: ModelSpec,
    microbatch_size: u32,
    /// Worker ids, by the index the samples use.
    workers: Vec<String>,
    /// Every worker's start-up profile (FLOP/s; 0: none).
    profiles: Vec<f64>,
    /// Every worker's share of a core (1: a core or more, or not known).
    shares: Vec<f64>,
    /// Running mean seconds per sample.
    samples: BTreeMap<SampleKey, Mean>,
    sync: Mean,
    /// Seconds per byte of a hop, fitted to every step's makespan ([`hop`]).
    secs_per_byte: Mean,
    /// Seconds per gradient value summed over the replicas ([`all_reduce`]).
    secs_per_value: Mean,
    /// The fit to the samples: costs, factors (one per worker); `None` before any.
    fitted: Option<([f64; UNKNOWNS], Vec<f64>)>,
    /// After a [`CostModel::forget`], the costs fitted before the drift: every later fit
    /// starts from (and is pulled towards) them, and finds the workers' factors first.
    held: Option<[f64; UNKNOWNS]>,
    /// The costs fitted after each of the last [`FITS_KEPT`] steps, oldest first: where a
    /// drift's steps began, the fit before them is still at hand.
    fits: VecDeque<[f64; UNKNOWNS]>,
    /// Whether the next step observed is a run's first ([`CostModel::start_run`]).
    warming: bool,
    steps: u64,
}

/// Which replica's step [`CostModel::observe`] takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replica {
    /// The one whose steps make the run's events: its sync, sends and sums are the step's.
    Leading,
    /// Any other: its pass times only.
    Other,
}

impl CostModel {
    /// The model of a job training `model` in microbatches of `microbatch_size`.
    pub fn new(model: ModelSpec, microbatch_size: u32) -> CostModel {
        CostModel {
            model,
            microbatch_size,
            workers: Vec::new(),
            profiles: Vec::new(),
            shares: Vec::new(),
            samples: BTreeMap::new(),
            sync: Mean::default(),
            secs_per_byte: Mean::default(),
            secs_per_value: Mean::default(),
            fitted: None,
            held: None,
            fits: VecDeque::new(),
            warming: false,
            steps: 0,
        }
    }

    /// Steps observed so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The index of worker `id`, added (with its profile) if new; a known worker's profile
    /// is updated when it registers one.
    fn index(&mut self, w: &Worker) -> usize {
        let flops = w.flops_per_second as f64;
        let share = match w.millicores {
            1..1000 => f64::from(w.millicores) / 1000.0,
            _ => 1.0,
        };
        match self.workers.iter().position(|id| *id == w.id) {
            Some(i) => {
                if flops > 0.0 {
                    self.profiles[i] = flops;
                }
                self.shares[i] = share;
                i
            }
            None => {
                self.workers.push(w.id.clone());
                self.profiles.push(flops);
                self.shares.push(share);
                if let Some((_, factors)) = &mut self.fitted {
                    factors.push(f64::NAN);
                }
                self.workers.len() - 1
            }
        }
    }

    /// Embeddings, blocks and heads in a range of pieces.
    fn counts(&self, range: &Range<usize>) -> [u32; 3] {
        let head = self.model.layers as usize + 1;
        let blocks = range.end.min(head).saturating_sub(range.start.max(1));
        [
            u32::from(range.contains(&0)),
            blocks as u32,
            u32::from(range.contains(&head)),
        ]
    }

    /// The prior: every piece's FLOPs over the workers' mean profiled speed. `B` of a block
    /// also redoes the attention products; `W` has no attention term; the embedding's `B`
    /// is nearly free (nothing before it needs a gradient).
    fn prior(&self) -> [f64; UNKNOWNS] {
        let speed = self.mean_speed();
        let (h, t) = (f64::from(self.model.hidden), f64::from(self.model.seq_len));
        let b = f64::from(self.microbatch_size);
        let n = b * t;
        let flops = |p| self.model.piece_flops(p, self.microbatch_size);
        use crate::model::Piece;
        let emb = flops(Piece::Embedding);
        let block = flops(Piece::Block(0));
        let attention = 4.0 * b * t * t * h;
        let head = flops(Piece::Head);
        [
            [emb, 0.1 * emb, emb],
            [block, block + attention, 24.0 * n * h * h],
            [head, head, head],
        ]
        .as_flattened()
        .iter()
        .map(|f| f.max(1.0) / speed)
        .collect::<Vec<_>>()
        .try_into()
        .unwrap_or([1e-3; UNKNOWNS])
    }

    /// Geometric mean of the registered profiles ([`DEFAULT_FLOPS`] without any).
    fn mean_speed(&self) -> f64 {
        let known: Vec<f64> = self.profiles.iter().copied().filter(|f| *f > 0.0).collect();
        if known.is_empty() {
            return DEFAULT_FLOPS;
        }
        (known.iter().map(|f| f.ln()).sum::<f64>() / known.len() as f64).exp()
    }

    /// Every worker's factor before measurements: the mean speed over its own, over its
    /// share of a core.
    fn prior_factors(&self) -> Vec<f64> {
        let mean = self.mean_speed();
        self.profiles
            .iter()
            .zip(&self.shares)
            .map(|(&p, share)| if p > 0.0 { mean / p } else { 1.0 } / share)
            .collect()
    }

    /// The current per-piece costs: embedding, block, head.
    pub fn piece_costs(&self) -> [PieceCost; 3] {
        let c = self.fitted.as_ref().map_or_else(|| self.prior(), |f| f.0);
        [0, 1, 2].map(|p| PieceCost {
            f: c[3 * p],
            b: c[3 * p + 1],
            w: c[3 * p + 2],
        })
    }

    /// Whether any measured pass time went into the costs (before: FLOPs and profiles only).
    pub fn calibrated(&self) -> bool {
        !self.samples.is_empty()
    }

    /// Forgets every measurement, keeping the workers and their start-up profiles: the
    /// steps observed next are all the costs stand on (after the costs drifted, the steps
    /// before the drift would hold the fit back for a window's length). The per-piece
    /// costs fitted before the last `drifted` steps are where the next fit starts, and it
    /// fits the workers' factors to them first: a drift is a worker's speed changing
    /// (another load, a throttled core), not its pieces' work, and steps on one split
    /// alone cannot tell the two apart. The fits after the drift began are not: with
    /// only one worker's steps slower, they had already put the slowdown into the pieces
    /// that worker alone holds (a head three times its cost, its worker's factor barely
    /// moved).
    pub fn forget(&mut self, drifted: usize) {
        self.samples.clear();
        self.sync = Mean::default();
        self.secs_per_byte = Mean::default();
        self.secs_per_value = Mean::default();
        let fitted = self.fitted.take().map(|(costs, _)| costs);
        let before = self.fits.len().checked_sub(drifted + 1);
        self.held = before.and_then(|i| self.fits.get(i).copied()).or(fitted);
        self.fits.clear();
    }

    /// A run starts: its first step warms up (stages built, buffers allocated, connections
    /// opened) and runs slower than the steps after it, so its times stand in for the costs
    /// only until the run's second step replaces them.
    pub fn start_run(&mut self) {
        self.warming = true;
    }

    /// Worker `id`'s speed factor (its pass times over a mean worker's), if known.
    pub fn factor(&self, id: &str) -> Option<f64> {
        let i = self.workers.iter().position(|w| w == id)?;
        let factor = match &self.fitted {
            Some((_, f)) => f.get(i).copied(),
            None => self.prior_factors().get(i).copied(),
        };
        factor.filter(|f| f.is_finite())
    }

    /// Takes one complete step of a data-parallel replica of a run of `schedule` on `ranges`
    /// (pieces per stage) by `workers` (that replica's, by index): every report's mean pass
    /// times per stage. The [`Replica::Leading`] one's step also gives the step's sync, sends
    /// and gradient sums, and the costs are fitted again; another replica's workers' speeds
    /// count from the next fit on.
    pub fn observe(
        &mut self,
        replica: Replica,
        schedule: &Schedule,
        ranges: &[Range<usize>],
        workers: &[Worker],
        reports: &[StepReport],
    ) {
        if ranges.len() != schedule.placement.stages() as usize {
            return;
        }
        if replica == Replica::Other {
            self.add_pass_times(schedule, ranges, workers, reports, false);
        } else {
            let warming = self.take_overheads(schedule, ranges, reports);
            self.add_pass_times(schedule, ranges, workers, reports, warming);
            self.refit();
        }
    }

    /// A drift: forgets what was measured before the `window` of steps (each one every
    /// worker's reports, oldest first; see [`CostModel::forget`]) and stands on those steps
    /// alone, every pass time at its median over them: a step slowed on one worker by a
    /// passing load moves that worker's speed less than a mean would, and so does not hide
    /// another worker slowed in the steps after it.
    pub fn recalibrate(
        &mut self,
        schedule: &Schedule,
        ranges: &[Range<usize>],
        workers: &[Worker],
        window: &[Vec<StepReport>],
    ) {
        if ranges.len() != schedule.placement.stages() as usize {
            return;
        }
        self.forget(window.len());
        let mut times: BTreeMap<SampleKey, Vec<f64>> = BTreeMap::new();
        for reports in window {
            // A drift's steps follow a run's first (it warms up): none is provisional.
            self.take_overheads(schedule, ranges, reports);
            for (key, secs) in self.pass_times(schedule, ranges, workers, reports) {
                times.entry(key).or_default().push(secs);
            }
        }
        for (key, secs) in times {
            let n = secs.len() as f64;
            self.samples.insert(key, Mean::of(median(secs), n));
        }
        self.refit();
    }

    /// One complete step's sync, hops and gradient sums into the model (see
    /// [`CostModel::observe`]); whether it was a run's first, which warms up.
    fn take_overheads(
        &mut self,
        schedule: &Schedule,
        ranges: &[Range<usize>],
        reports: &[StepReport],
    ) -> bool {
        let warming = std::mem::take(&mut self.warming);
        let mut sync = f64::INFINITY;
        for r in reports {
            let mut synced = r.spans.iter().filter(|s| s.activity == Activity::Sync);
            if let Some(first) = synced.next() {
                sync = sync.min(first.duration() + synced.map(|s| s.duration()).sum::<f64>());
            }
        }
        let values = all_reduce::stage_values(&self.model, ranges);
        let sums = all_reduce::observed(reports, &values);
        if let Some((per_value, _)) = sums {
            self.secs_per_value.add(per_value, warming);
        }
        // The worker that reached the sync last waited least in it: its sync is the cost.
        if sync.is_finite() {
            self.sync.add(sync, warming);
            let wall = reports.iter().map(|r| r.wall_secs).fold(0.0, f64::max);
            // With replicas the passes end before the sums past them do.
            let passes = sums.map_or(wall - sync, |(_, passes)| passes);
            if let Some(hop) = hop::fitted_hop(schedule, reports, passes) {
                self.secs_per_byte
                    .add(hop / self.frame_bytes() as f64, warming);
            }
        }
        self.steps += 1;
        warming
    }

    /// Every report's pass times per stage into the samples (`provisional`: a run's first
    /// step, replaced by the next).
    fn add_pass_times(
        &mut self,
        schedule: &Schedule,
        ranges: &[Range<usize>],
        workers: &[Worker],
        reports: &[StepReport],
        provisional: bool,
    ) {
        for (key, secs) in self.pass_times(schedule, ranges, workers, reports) {
            self.samples.entry(key).or_default().add(secs, provisional);
        }
    }

    /// Every report's mean pass times per stage, by sample (worker, stage make-up, kind).
    fn pass_times(
        &mut self,
        schedule: &Schedule,
        ranges: &[Range<usize>],
        workers: &[Worker],
        reports: &[StepReport],
    ) -> Vec<(SampleKey, f64)> {
        let fused = fused_stages(schedule, ranges.len());
        let mut times = Vec::new();
        for r in reports {
            let Some(worker) = workers.get(r.worker_index as usize) else {
                continue;
            };
            let w = self.index(worker);
            for t in &r.stage_times {
                let s = t.stage as usize;
                let Some(range) = ranges.get(s) else { continue };
                let counts = self.counts(range);
                let edge = timed_edge(counts).map(|p| {
                    let mut piece = [0; 3];
                    piece[p] = 1;
                    piece
                });
                let backward = if fused[s] { PassKind::BW } else { PassKind::B };
                let kinds = [PassKind::F, backward, PassKind::W];
                for ((kind, secs), edge_secs) in kinds.into_iter().zip([t.f, t.b, t.w]).zip(t.edge)
                {
                    if secs > 0.0 && !(fused[s] && kind == PassKind::W) {
                        times.push(((w, counts, kind), secs));
                        if let Some(piece) = edge
                            && edge_secs > 0.0
                            && edge_secs < secs
                        {
                            times.push(((w, piece, kind), edge_secs));
                        }
                    }
                }
            }
        }
        times
    }

    /// Fits costs and factors to the samples.
    fn refit(&mut self) {
        let rows: Vec<Row> = self
            .samples
            .iter()
            .filter_map(|(&(worker, counts, kind), m)| {
                Some(Row {
                    worker,
                    counts,
                    kind,
                    secs: m.get()?,
                    weight: m.n,
                })
            })
            .collect();
        // After a drift the costs fitted before it are the prior: a worker's speed changed.
        let prior = self.held.unwrap_or_else(|| self.prior());
        let fitted = fit(&rows, prior, &self.prior_factors(), self.held.is_some());
        // Later fits start from this one: from the prior, a fit would split a worker's time
        // between its pieces and its speed the prior's way again.
        self.held = self.held.map(|_| fitted.0);
        if self.fits.len() == FITS_KEPT {
            self.fits.pop_front();
        }
        self.fits.push_back(fitted.0);
        self.fitted = Some(fitted);
    }

    /// Every one of `workers`' speed factor: fitted where the fit has one, else the prior.
    fn worker_factors(&mut self, workers: &[Worker]) -> Vec<f64> {
        let index: Vec<usize> = workers.iter().map(|w| self.index(w)).collect();
        self.factors_at(&index)
    }

    /// [`CostModel::worker_factors`] of the workers at `index` (their sample indices).
    fn factors_at(&self, index: &[usize]) -> Vec<f64> {
        let prior = self.prior_factors();
        let fitted = self.fitted.as_ref().map(|f| &f.1);
        index
            .iter()
            .map(|&i| {
                fitted
                    .and_then(|f| f.get(i).copied())
                    .filter(|f| f.is_finite() && *f > 0.0)
                    .unwrap_or(prior[i])
            })
            .collect()
    }

    /// The per-stage costs of `schedule` on `ranges` run by `workers` (by index; with
    /// replicas, every replica's, replica by replica), the hop cost of one activation frame,
    /// and the sync; `None` when they do not match.
    pub fn costs(
        &mut self,
        schedule: &Schedule,
        ranges: &[Range<usize>],
        workers: &[Worker],
    ) -> Option<(Costs, f64)> {
        let placement = &schedule.placement;
        let d = placement.workers() as usize;
        if ranges.len() != placement.stages() as usize
            || workers.is_empty()
            || !workers.len().is_multiple_of(d)
        {
            return None;
        }
        // With replicas every rank runs at its slowest replica's: the step's sums wait for
        // the last contribution.
        let index: Vec<usize> = workers.iter().map(|w| self.index(w)).collect();
        let factors = self.factors_at(&index);
        let c = self.fitted.as_ref().map_or_else(|| self.prior(), |f| f.0);
        let fused = fused_stages(schedule, ranges.len());
        let stages = ranges
            .iter()
            .enumerate()
            .map(|(s, range)| {
                let counts = self.counts(range);
                let rank = placement.worker_of(s as u32) as usize;
                let mut cost = StageCost {
                    f: 0.0,
                    b: 0.0,
                    w: 0.0,
                    mem: 1.0,
                };
                for (&i, &k) in index.iter().zip(&factors).skip(rank).step_by(d) {
                    let [f, b, w] = self.stage_secs(i, counts, k, &c, fused[s]);
                    cost.f = cost.f.max(f);
                    cost.b = cost.b.max(b);
                    cost.w = cost.w.max(w);
                }
                cost
            })
            .collect();
        let hop =
            self.frame_bytes() as f64 * self.secs_per_byte.get().unwrap_or(DEFAULT_SECS_PER_BYTE);
        let costs = Costs::per_stage(placement, stages, hop).ok()?;
        Some((costs, self.sync.get().unwrap_or(0.0)))
    }

    /// Seconds of F, B and W over a stage of `counts` on worker `i` (factor `k`): the fit
    /// (`costs`), except where this worker has run such a stage: there its measured mean
    /// pass times, which the fit, a compromise over every split seen, may miss by several
    /// percent (the split in use is predicted as it ran; a fused `BW` splits as the fit's).
    fn stage_secs(
        &self,
        i: usize,
        counts: [u32; 3],
        k: f64,
        costs: &[f64; UNKNOWNS],
        fused: bool,
    ) -> [f64; 3] {
        let n = counts.map(f64::from);
        let fit = |pass: usize| k * (0..3).map(|p| n[p] * costs[3 * p + pass]).sum::<f64>();
        let measured = |kind| self.samples.get(&(i, counts, kind)).and_then(Mean::get);
        let (f, b, w) = (fit(0), fit(1), fit(2));
        let f = measured(PassKind::F).unwrap_or(f);
        if !fused {
            let b = measured(PassKind::B).unwrap_or(b);
            return [f, b, measured(PassKind::W).unwrap_or(w)];
        }
        match measured(PassKind::BW) {
            Some(bw) if b + w > 0.0 => [f, bw * b / (b + w), bw * w / (b + w)],
            _ => [f, b, w],
        }
    }

    /// Bytes of one activation frame (a microbatch's hidden states).
    fn frame_bytes(&self) -> u64 {
        let m = &self.model;
        (u64::from(self.microbatch_size) * u64::from(m.seq_len) * u64::from(m.hidden)).max(1)
            * m.dtype.bytes()
    }

    /// Seconds from the step's start to the end of its passes and of the gradient sums
    /// over `replicas` data-parallel replicas beside them (one: the makespan of `sim`).
    pub fn passes_and_sums(
        &self,
        sim: &Simulation,
        schedule: &Schedule,
        ranges: &[Range<usize>],
        replicas: u32,
    ) -> f64 {
        if replicas <= 1 {
            return sim.makespan;
        }
        let values = all_reduce::stage_values(&self.model, ranges);
        let per_value = self
            .secs_per_value
            .get()
            .unwrap_or(all_reduce::DEFAULT_SECS_PER_VALUE);
        let sums = all_reduce::sums_end(sim, &schedule.placement, &values, per_value);
        sim.makespan.max(sums)
    }

    /// The hop of one activation frame fitted so far (seconds; `None` before any).
    pub fn hop_secs(&self) -> Option<f64> {
        Some(self.frame_bytes() as f64 * self.secs_per_byte.get()?)
    }

    /// The end-of-step sync measured so far (seconds; 0 before any).
    pub fn sync_secs(&self) -> f64 {
        self.sync.get().unwrap_or(0.0)
    }

    /// The predicted step time and bubble of `schedule` on `ranges` run by `workers`, one
    /// pipeline of `replicas` data-parallel replicas.
    pub fn predict(
        &mut self,
        schedule: &Schedule,
        ranges: &[Range<usize>],
        workers: &[Worker],
        replicas: u32,
    ) -> Option<Prediction> {
        let (costs, sync) = self.costs(schedule, ranges, workers)?;
        let sim = simulate(schedule, &costs).ok()?;
        let step_secs = self.passes_and_sums(&sim, schedule, ranges, replicas) + sync;
        let d = sim.busy.len() as f64;
        let bubble = if step_secs > 0.0 {
            1.0 - sim.busy.iter().sum::<f64>() / (d * step_secs)
        } else {
            0.0
        };
        Some(Prediction {
            step_secs,
            bubble,
            costs,
        })
    }
}
