//! A training job: what a user submits (TOML, field names in torchtitan's spirit) and its
//! validation. Every rejected field comes back as [`Error::InvalidArgument`] naming the field
//! (`section.key`) and the reason; the gRPC edge turns that into `InvalidArgument`.
//!
//! ```toml
//! [job]
//! name = "tiny"
//!
//! [model]
//! vocab = 256
//! hidden = 64
//! heads = 4
//! layers = 8
//! seq_len = 32
//! dtype = "f32"
//!
//! [training]
//! global_batch_size = 8
//! steps = 50
//! seed = 42
//! max_norm = 1.0
//!
//! [optimizer]
//! lr = 3e-3
//!
//! [parallelism]
//! pipeline_parallel_degree = 4
//! pipeline_parallel_schedule = "v-half"     # any `pipewise plan` schedule
//! pipeline_parallel_microbatch_size = 1     # microbatches = global_batch_size / this
//! pipeline_parallel_first_stage_less_layers = 1   # optional, torchtitan's layer split
//! pipeline_parallel_last_stage_less_layers = 1    # (default: the pieces split evenly)
//!
//! [checkpoint]
//! enable_checkpoint = true
//! folder = "checkpoints"
//! interval = 10
//!
//! [compute]                 # optional; absent = real compute
//! mode = "emulate"          # "real" (candle stage compute) or "emulate"
//! f_ms = 10.0               # emulated pass times of one stage of 1/d of the model
//! b_ms = 10.0
//! w_ms = 10.0
//! ```
//!
//! With `mode = "emulate"` a worker runs its program without candle: every pass sleeps for
//! the cost model's duration of it (`Costs::uniform` over the job's placement with these
//! times, so a V or interleaved chunk pass takes `1/v` of them) and the frames between
//! workers are real buffers of the true activation size. The planned bubble (and the
//! schedule's cost-aware reordering) then use these times.

use serde::{Deserialize, Serialize};

use crate::cost::Times;
use crate::error::{Error, Result};
use crate::generate::{
    MAX_CHUNKS, MAX_MICROBATCHES, MAX_STAGE_MICROBATCHES, MAX_WORKERS, Request, ScheduleKind,
    generate,
};
use crate::model::{DType, ModelSpec};
use crate::schedule::Schedule;

/// `[job]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSection {
    /// Job name (non-empty).
    pub name: String,
    /// Free text.
    #[serde(default)]
    pub description: String,
}

/// `[training]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Training {
    /// Sequences per optimizer step.
    pub global_batch_size: u32,
    /// Optimizer steps.
    pub steps: u32,
    /// Seed of initialisation and data sampling.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Gradient clipping by global norm (0 turns it off).
    #[serde(default = "default_max_norm")]
    pub max_norm: f64,
}

fn default_seed() -> u64 {
    42
}

fn default_max_norm() -> f64 {
    1.0
}

/// `[optimizer]` (AdamW).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Optimizer {
    /// Learning rate.
    #[serde(default = "default_lr")]
    pub lr: f64,
    /// Decoupled weight decay.
    #[serde(default = "default_weight_decay")]
    pub weight_decay: f64,
    /// First-moment decay.
    #[serde(default = "default_beta1")]
    pub beta1: f64,
    /// Second-moment decay.
    #[serde(default = "default_beta2")]
    pub beta2: f64,
    /// Denominator epsilon.
    #[serde(default = "default_eps")]
    pub eps: f64,
}

fn default_lr() -> f64 {
    3e-3
}
fn default_weight_decay() -> f64 {
    0.1
}
fn default_beta1() -> f64 {
    0.9
}
fn default_beta2() -> f64 {
    0.95
}
fn default_eps() -> f64 {
    1e-8
}

impl Default for Optimizer {
    fn default() -> Self {
        Optimizer {
            lr: default_lr(),
            weight_decay: default_weight_decay(),
            beta1: default_beta1(),
            beta2: default_beta2(),
            eps: default_eps(),
        }
    }
}

/// `[parallelism]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Parallelism {
    /// Workers (pipeline ranks).
    pub pipeline_parallel_degree: u32,
    /// Schedule name (`pipewise plan` names; `pipewise plan --auto` chooses one for a
    /// model and a memory budget).
    pub pipeline_parallel_schedule: String,
    /// Sequences per microbatch.
    #[serde(default = "one")]
    pub pipeline_parallel_microbatch_size: u32,
    /// Chunks per worker of `interleaved-1f1b` / `looped-bfs`.
    #[serde(default = "two")]
    pub pipeline_parallel_chunks: u32,
    /// Activation-memory limit of the adaptive schedules, in units of one microbatch's
    /// activation over `1/d` of the model (default: `d`, 1F1B's peak).
    #[serde(default)]
    pub memory_limit: Option<f64>,
    /// torchtitan's layer split: the first stage holds this many fewer transformer blocks
    /// than the others (it also holds the embedding). With the next two fields unset the
    /// pieces (embedding, blocks, head) are split evenly.
    #[serde(default)]
    pub pipeline_parallel_first_stage_less_layers: u32,
    /// The last stage holds this many fewer blocks (it also holds the output head).
    #[serde(default)]
    pub pipeline_parallel_last_stage_less_layers: u32,
    /// Blocks per stage, counting the first and last stages' fewer blocks as held: as in
    /// torchtitan, `⌈(layers + first less + last less) / layers per stage⌉` must be the
    /// schedule's stage count (the slots are then split as evenly as possible).
    #[serde(default)]
    pub pipeline_parallel_layers_per_stage: Option<u32>,
    /// Not part of a job file: split the torchtitan way although none of the three fields
    /// above is set. The coordinator sets it when it re-plans a job with blocks per stage
    /// onto another stage count (blocks per stage no longer apply, the way of splitting
    /// does).
    #[serde(skip)]
    pub torchtitan_split: bool,
}

impl Parallelism {
    /// Pieces (embedding, blocks, head) per stage for `layers` blocks in `stages` stages,
    /// the torchtitan way: `layers + first less + last less` block slots split as evenly
    /// as possible (earlier stages take the remainder), the first stage's slots minus
    /// `first less` plus the embedding, the last's minus `last less` plus the head. `None`
    /// when none of the three fields (nor [`Parallelism::torchtitan_split`]) is set: the
    /// even split of the pieces applies.
    pub fn stage_pieces(&self, layers: u32, stages: u32) -> Result<Option<Vec<u32>>> {
        let (first, last) = (
            self.pipeline_parallel_first_stage_less_layers,
            self.pipeline_parallel_last_stage_less_layers,
        );
        if first == 0
            && last == 0
            && self.pipeline_parallel_layers_per_stage.is_none()
            && !self.torchtitan_split
        {
            return Ok(None);
        }
        let slots = u64::from(layers) + u64::from(first) + u64::from(last);
        let s = u64::from(stages.max(1));
        if let Some(per) = self.pipeline_parallel_layers_per_stage
            && (per == 0 || slots.div_ceil(u64::from(per)) != s)
        {
            let made = if per == 0 {
                "no stage".to_string()
            } else {
                format!("{} stages", slots.div_ceil(u64::from(per)))
            };
            return Err(invalid(
                "parallelism.pipeline_parallel_layers_per_stage",
                format!(
                    "{per} blocks per stage make {made} of {slots} block slots ({layers} \
                     layers + {first} + {last} fewer on the first and last stages), the \
                     schedule has {s}"
                ),
            ));
        }
        let mut blocks: Vec<i64> = (0..s)
            .map(|i| (slots / s + u64::from(i < slots % s)) as i64)
            .collect();
        blocks[0] -= i64::from(first);
        let end = blocks.len() - 1;
        blocks[end] -= i64::from(last);
        if blocks.iter().any(|b| *b < 0) {
            let field = if blocks[0] < 0 {
                "parallelism.pipeline_parallel_first_stage_less_layers"
            } else {
                "parallelism.pipeline_parallel_last_stage_less_layers"
            };
            return Err(invalid(
                field,
                format!(
                    "{layers} layers in {s} stages leave {} block slots per stage: too few \
                     to hold {first} fewer on the first and {last} fewer on the last",
                    slots / s
                ),
            ));
        }
        let mut pieces: Vec<u32> = blocks.into_iter().map(|b| b as u32).collect();
        pieces[0] += 1;
        pieces[end] += 1;
        if let Some(i) = pieces.iter().position(|p| *p == 0) {
            return Err(invalid(
                "model.layers",
                format!(
                    "stage {i} would hold no layer ({layers} layers, {s} stages, {first} and \
                     {last} fewer on the first and last)"
                ),
            ));
        }
        Ok(Some(pieces))
    }
}

fn one() -> u32 {
    1
}
fn two() -> u32 {
    2
}

/// `[checkpoint]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// Save checkpoints at all.
    #[serde(default)]
    pub enable_checkpoint: bool,
    /// Folder (relative to the coordinator's data directory unless absolute).
    #[serde(default = "default_folder")]
    pub folder: String,
    /// Steps between checkpoints.
    #[serde(default = "default_interval")]
    pub interval: u32,
    /// Keep only the latest K complete checkpoints of a job, removing older ones as newer
    /// ones complete (torchtitan's name and default; not 1, as there); 0 keeps them all.
    /// The last step's checkpoint, saved after its report, comes on top.
    #[serde(default = "default_keep_latest_k")]
    pub keep_latest_k: u32,
}

fn default_folder() -> String {
    "checkpoints".into()
}
fn default_interval() -> u32 {
    10
}
fn default_keep_latest_k() -> u32 {
    10
}

impl Default for Checkpoint {
    fn default() -> Self {
        Checkpoint {
            enable_checkpoint: false,
            folder: default_folder(),
            interval: default_interval(),
            keep_latest_k: default_keep_latest_k(),
        }
    }
}

/// `[data]`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Data {
    /// A text file of training bytes; the generated default corpus when absent.
    #[serde(default)]
    pub path: Option<String>,
}

/// How the workers compute a job's passes (`[compute] mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ComputeMode {
    /// The stage compute library (candle).
    #[default]
    Real,
    /// Each pass sleeps for its cost-model time; frames are zero buffers of the true size.
    Emulate,
}

/// `[compute]`: real or emulated stage compute, and the emulated pass times.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Compute {
    /// `"real"` (default) or `"emulate"`.
    #[serde(default)]
    pub mode: ComputeMode,
    /// Emulated forward milliseconds of one stage holding `1/d` of the model.
    #[serde(default = "default_f_ms")]
    pub f_ms: f64,
    /// Emulated input-gradient (B) milliseconds, same convention.
    #[serde(default = "default_b_ms")]
    pub b_ms: f64,
    /// Emulated weight-gradient (W) milliseconds, same convention.
    #[serde(default = "default_w_ms")]
    pub w_ms: f64,
}

/// The longest emulated pass time accepted: a pass of more than a minute is a units mistake
/// (and would run into the workers' frame timeout).
pub const MAX_EMULATED_PASS_MS: f64 = 60_000.0;

fn default_f_ms() -> f64 {
    10.0
}
fn default_b_ms() -> f64 {
    10.0
}
fn default_w_ms() -> f64 {
    10.0
}

impl Default for Compute {
    fn default() -> Self {
        Compute {
            mode: ComputeMode::Real,
            f_ms: default_f_ms(),
            b_ms: default_b_ms(),
            w_ms: default_w_ms(),
        }
    }
}

impl Compute {
    /// Emulated compute with these F / B / W milliseconds.
    pub fn emulate(f_ms: f64, b_ms: f64, w_ms: f64) -> Compute {
        Compute {
            mode: ComputeMode::Emulate,
            f_ms,
            b_ms,
            w_ms,
        }
    }

    /// Whether passes are emulated.
    pub fn is_emulated(&self) -> bool {
        self.mode == ComputeMode::Emulate
    }

    fn is_default(&self) -> bool {
        *self == Compute::default()
    }

    /// The emulated pass times in seconds (no communication cost), for
    /// [`Costs::uniform`](crate::Costs::uniform) over the job's placement.
    pub fn times_secs(&self) -> Times {
        Times {
            f: self.f_ms / 1e3,
            b: self.b_ms / 1e3,
            w: self.w_ms / 1e3,
            comm: 0.0,
        }
    }

    /// Checks the times (each finite, > 0 and at most [`MAX_EMULATED_PASS_MS`]), naming
    /// the field (`compute.f_ms` …). Checked whatever the mode, so a typo is caught early.
    pub fn validate(&self) -> Result<()> {
        for (field, ms) in [
            ("compute.f_ms", self.f_ms),
            ("compute.b_ms", self.b_ms),
            ("compute.w_ms", self.w_ms),
        ] {
            if !(ms.is_finite() && ms > 0.0 && ms <= MAX_EMULATED_PASS_MS) {
                return Err(invalid(
                    field,
                    format!(
                        "must be a finite number of milliseconds in (0, {MAX_EMULATED_PASS_MS}], \
                         got {ms}"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The largest activation a job may pass between stages, in bytes: the workers'
/// transport carries tensors of up to 256 MiB (its message limit).
pub const MAX_FRAME_BYTES: u64 = 256 << 20;

/// A training job as submitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// `[job]`.
    pub job: JobSection,
    /// `[model]`.
    pub model: ModelSpec,
    /// `[training]`.
    pub training: Training,
    /// `[optimizer]`.
    #[serde(default)]
    pub optimizer: Optimizer,
    /// `[parallelism]`.
    pub parallelism: Parallelism,
    /// `[checkpoint]`.
    #[serde(default)]
    pub checkpoint: Checkpoint,
    /// `[data]`.
    #[serde(default)]
    pub data: Data,
    /// `[compute]` (absent: real compute).
    #[serde(default, skip_serializing_if = "Compute::is_default")]
    pub compute: Compute,
}

fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
    Error::InvalidArgument {
        field,
        reason: reason.into(),
    }
}

/// The schedule a valid job runs.
#[derive(Debug, Clone, PartialEq)]
pub struct JobPlan {
    /// The schedule kind (`auto` resolved by the caller's planner; here the named kind).
    pub kind: ScheduleKind,
    /// Microbatches per step.
    pub microbatches: u32,
    /// The schedule.
    pub schedule: Schedule,
}

/// The checkpoint directory after `step` steps under a job's output directory
/// (`step-K/`; workers write it, the coordinator resumes re-planned runs from it).
pub fn checkpoint_dir(output: &std::path::Path, step: u64) -> std::path::PathBuf {
    output.join(checkpoint_name(step))
}

/// The name of the checkpoint directory after `step` steps (`step-K`), the inverse of
/// [`checkpoint_step`].
pub fn checkpoint_name(step: u64) -> String {
    format!("step-{step}")
}

/// The checkpoint of stage `stage` after `step` steps (`step-K/stage-S.safetensors`).
pub fn checkpoint_file(output: &std::path::Path, step: u64, stage: u32) -> std::path::PathBuf {
    checkpoint_dir(output, step).join(format!("stage-{stage}.safetensors"))
}

/// The step of a checkpoint directory's name (`step-K` → K).
pub fn checkpoint_step(name: &str) -> Option<u64> {
    name.strip_prefix("step-")?.parse().ok()
}

/// The id of a job's `run`-th run (0: the first; each re-plan and each coordinator restart
/// starts another): the job id in the low 48 bits, the run's number above, so a worker can
/// tell the runs of a job apart (`Assignment.job`, `TensorFrame.job`).
pub fn run_id(job: u64, run: u64) -> u64 {
    job.wrapping_add(run << 48)
}

/// The job of a run id.
pub fn job_of(run_id: u64) -> u64 {
    run_id & ((1 << 48) - 1)
}

/// A run id's number within its job.
pub fn run_of(run_id: u64) -> u64 {
    run_id >> 48
}

impl JobPlan {
    /// The peak activation bytes each worker is predicted to hold in a step: its program
    /// replayed in order over the stages of `spec.model` cut as the job cuts them
    /// ([`JobSpec::stage_ranges`]), each `F` adding the stage's stash after forward, `B`
    /// trading it for the stash after the input gradient, `W` (and `BW`) freeing it, the
    /// peak taken at pass boundaries with [`ModelSpec::piece_activation_bytes`]'s figures.
    pub fn predicted_peak_bytes(&self, spec: &JobSpec) -> Result<Vec<u64>> {
        let ranges = spec.stage_ranges(self.schedule.placement.stages())?;
        self.predicted_peak_bytes_over(spec, &ranges)
    }

    /// Everything each worker is predicted to hold in a step, on the job's layer split: its
    /// peak activations ([`JobPlan::predicted_peak_bytes`]) plus its training state
    /// ([`JobPlan::predicted_state_bytes_over`]).
    pub fn predicted_bytes(&self, spec: &JobSpec) -> Result<Vec<u64>> {
        let ranges = spec.stage_ranges(self.schedule.placement.stages())?;
        self.predicted_bytes_over(spec, &ranges)
    }

    /// [`JobPlan::predicted_bytes`] with the model's pieces cut into `ranges`.
    pub fn predicted_bytes_over(
        &self,
        spec: &JobSpec,
        ranges: &[std::ops::Range<usize>],
    ) -> Result<Vec<u64>> {
        let peaks = self.predicted_peak_bytes_over(spec, ranges)?;
        let state = self.predicted_state_bytes_over(spec, ranges)?;
        Ok(peaks
            .iter()
            .zip(state)
            .map(|(a, b)| a.saturating_add(b))
            .collect())
    }

    /// The parameters, gradients and two AdamW moments each worker holds, with the model's
    /// pieces cut into `ranges` (one per stage): [`DType::training_state_bytes`] per
    /// parameter of its stages, as a worker counts them in its step reports.
    pub fn predicted_state_bytes_over(
        &self,
        spec: &JobSpec,
        ranges: &[std::ops::Range<usize>],
    ) -> Result<Vec<u64>> {
        self.check_ranges(ranges)?;
        Ok(spec
            .model
            .state_bytes_by_worker(&self.schedule.placement, ranges))
    }

    /// `ranges` has one range per stage.
    fn check_ranges(&self, ranges: &[std::ops::Range<usize>]) -> Result<()> {
        let stages = self.schedule.placement.stages();
        if ranges.len() != stages as usize {
            return Err(invalid(
                "stage_pieces",
                format!("{} ranges for {stages} stages", ranges.len()),
            ));
        }
        Ok(())
    }

    /// [`JobPlan::predicted_peak_bytes`] with the model's pieces cut into `ranges`, one per
    /// stage (e.g. a split that moved layers off a slow worker).
    pub fn predicted_peak_bytes_over(
        &self,
        spec: &JobSpec,
        ranges: &[std::ops::Range<usize>],
    ) -> Result<Vec<u64>> {
        use crate::pass::PassKind;
        self.check_ranges(ranges)?;
        let b = spec.parallelism.pipeline_parallel_microbatch_size;
        let per_stage: Vec<_> = ranges
            .iter()
            .map(|r| spec.model.range_activation_bytes(r.clone(), b))
            .collect();
        Ok(self
            .schedule
            .workers
            .iter()
            .map(|program| {
                let (mut now, mut peak) = (0i128, 0i128);
                for p in program {
                    let a = per_stage[p.stage as usize];
                    let (f, bw) = (
                        i128::from(a.after_forward),
                        i128::from(a.after_backward_input),
                    );
                    now += match p.kind {
                        PassKind::F => f,
                        PassKind::B => bw - f,
                        PassKind::W => -bw,
                        PassKind::BW => -f,
                    };
                    peak = peak.max(now);
                }
                // Never negative (it starts at 0); past u64 only for saturated stashes.
                u64::try_from(peak).unwrap_or(u64::MAX)
            })
            .collect())
    }
}

impl JobSpec {
    /// The model's pieces (embedding, blocks, head) of each of `stages` stages: the job's
    /// layer split ([`Parallelism::stage_pieces`]) or, without one, the even split
    /// ([`ModelSpec::even_split`]).
    pub fn stage_ranges(&self, stages: u32) -> Result<Vec<std::ops::Range<usize>>> {
        match self.parallelism.stage_pieces(self.model.layers, stages)? {
            Some(counts) => self.model.split_by_counts(&counts),
            None => self.model.even_split(stages as usize),
        }
    }

    /// Parses TOML; a syntax error or an unknown field is an `InvalidArgument` on `toml`
    /// whose reason names the line and the key.
    pub fn from_toml(text: &str) -> Result<JobSpec> {
        toml::from_str(text).map_err(|e| invalid("toml", e.to_string().trim().to_string()))
    }

    /// The job as TOML.
    pub fn to_toml(&self) -> Result<String> {
        toml::to_string(self).map_err(|e| invalid("toml", e.to_string()))
    }

    /// Microbatches per step.
    pub fn microbatches(&self) -> u32 {
        self.training
            .global_batch_size
            .checked_div(self.parallelism.pipeline_parallel_microbatch_size)
            .unwrap_or(0)
    }

    /// The pass times the planner costs this job's schedule with: unit times for real
    /// compute (the measured ratios are not known before it runs), the `[compute]` times
    /// relative to F for emulated compute (the bubble does not depend on the scale).
    pub fn planning_times(&self) -> Times {
        if self.compute.is_emulated() && self.compute.f_ms > 0.0 {
            let f = self.compute.f_ms;
            Times {
                f: 1.0,
                b: self.compute.b_ms / f,
                w: self.compute.w_ms / f,
                comm: 0.0,
            }
        } else {
            Times::UNIT
        }
    }

    /// Checks every field; the first problem found is returned, naming its field.
    pub fn validate(&self) -> Result<JobPlan> {
        if self.job.name.trim().is_empty() {
            return Err(invalid("job.name", "must not be empty"));
        }
        self.model.validate().map_err(|e| match e {
            Error::InvalidArgument { field, reason } => Error::InvalidArgument {
                field: model_field(field),
                reason,
            },
            other => other,
        })?;
        if self.model.dtype == DType::F16 && !self.compute.is_emulated() {
            // bf16 has f32's exponent range; f16's underflows without loss scaling (a
            // 32k-vocabulary loss gradient over 8 × 4096 tokens is about 1e-9).
            return Err(invalid(
                "model.dtype",
                "f16 training needs loss scaling, which pipewise does not have; use bf16 \
                 (f16 is accepted for planning and emulated compute)",
            ));
        }
        let t = &self.training;
        if t.steps == 0 {
            return Err(invalid("training.steps", "must be at least 1"));
        }
        if t.global_batch_size == 0 {
            return Err(invalid("training.global_batch_size", "must be at least 1"));
        }
        if !(t.max_norm.is_finite() && t.max_norm >= 0.0) {
            return Err(invalid(
                "training.max_norm",
                format!(
                    "must be finite and ≥ 0 (0 turns clipping off), got {}",
                    t.max_norm
                ),
            ));
        }
        let o = &self.optimizer;
        if !(o.lr.is_finite() && o.lr > 0.0) {
            return Err(invalid(
                "optimizer.lr",
                format!("must be finite and > 0, got {}", o.lr),
            ));
        }
        if !(o.weight_decay.is_finite() && o.weight_decay >= 0.0) {
            return Err(invalid(
                "optimizer.weight_decay",
                format!("must be finite and ≥ 0, got {}", o.weight_decay),
            ));
        }
        for (field, beta) in [("optimizer.beta1", o.beta1), ("optimizer.beta2", o.beta2)] {
            if !(0.0..1.0).contains(&beta) {
                return Err(invalid(field, format!("must be in [0, 1), got {beta}")));
            }
        }
        if !(o.eps.is_finite() && o.eps > 0.0) {
            return Err(invalid(
                "optimizer.eps",
                format!("must be finite and > 0, got {}", o.eps),
            ));
        }
        let p = &self.parallelism;
        let d = p.pipeline_parallel_degree;
        if !(1..=MAX_WORKERS).contains(&d) {
            return Err(invalid(
                "parallelism.pipeline_parallel_degree",
                format!("must be 1 to {MAX_WORKERS} workers, got {d}"),
            ));
        }
        let mbs = p.pipeline_parallel_microbatch_size;
        if mbs == 0 {
            return Err(invalid(
                "parallelism.pipeline_parallel_microbatch_size",
                "must be at least 1",
            ));
        }
        // What one activation (or its gradient) between stages takes: b × t × h elements.
        let frame = u128::from(mbs)
            * u128::from(self.model.seq_len)
            * u128::from(self.model.hidden)
            * u128::from(self.model.dtype.bytes());
        if frame > u128::from(MAX_FRAME_BYTES) {
            return Err(invalid(
                "parallelism.pipeline_parallel_microbatch_size",
                format!(
                    "a microbatch's activation between stages ({mbs} × {} tokens × {} × {} \
                     bytes) is {frame} bytes, over the {MAX_FRAME_BYTES} bytes the workers' \
                     transport carries in one frame; use smaller microbatches or sequences",
                    self.model.seq_len,
                    self.model.hidden,
                    self.model.dtype.bytes()
                ),
            ));
        }
        if !t.global_batch_size.is_multiple_of(mbs) {
            return Err(invalid(
                "training.global_batch_size",
                format!(
                    "{} sequences do not split into microbatches of {mbs} \
                     (parallelism.pipeline_parallel_microbatch_size)",
                    t.global_batch_size
                ),
            ));
        }
        if !(1..=MAX_CHUNKS).contains(&p.pipeline_parallel_chunks) {
            return Err(invalid(
                "parallelism.pipeline_parallel_chunks",
                format!(
                    "must be 1 to {MAX_CHUNKS}, got {}",
                    p.pipeline_parallel_chunks
                ),
            ));
        }
        let kind: ScheduleKind = p.pipeline_parallel_schedule.parse().map_err(|_| {
            invalid(
                "parallelism.pipeline_parallel_schedule",
                format!(
                    "unknown schedule {:?}; known: {}",
                    p.pipeline_parallel_schedule,
                    ScheduleKind::ALL.map(ScheduleKind::name).join(", ")
                ),
            )
        })?;
        if let Some(limit) = p.memory_limit {
            if !kind.is_adaptive() {
                return Err(invalid(
                    "parallelism.memory_limit",
                    format!("applies to adaptive-v and adaptive-zb, not to {kind}"),
                ));
            }
            if !(limit.is_finite() && limit > 0.0) {
                return Err(invalid(
                    "parallelism.memory_limit",
                    format!("must be finite and > 0, got {limit}"),
                ));
            }
        }
        let n = self.microbatches();
        if n > MAX_MICROBATCHES {
            return Err(invalid(
                "training.global_batch_size",
                format!(
                    "{} sequences in microbatches of {mbs} are {n} microbatches; at most \
                     {MAX_MICROBATCHES} are planned (use larger microbatches)",
                    t.global_batch_size
                ),
            ));
        }
        let stages = kind.placement(d, p.pipeline_parallel_chunks).stages();
        let size = u64::from(stages) * u64::from(n);
        if size > MAX_STAGE_MICROBATCHES {
            return Err(invalid(
                "training.global_batch_size",
                format!(
                    "{kind} on {d} workers has {stages} stages; × {n} microbatches is {size}, \
                     at most {MAX_STAGE_MICROBATCHES} are planned (use larger microbatches or \
                     fewer workers)"
                ),
            ));
        }
        let pieces = self.model.layers + 2;
        if stages > pieces {
            return Err(invalid(
                "model.layers",
                format!(
                    "{kind} on {d} workers has {stages} stages but the model has only {pieces} \
                     pieces (embedding, {} blocks, head); use at least {} layers",
                    self.model.layers,
                    stages - 2
                ),
            ));
        }
        p.stage_pieces(self.model.layers, stages)?;
        self.compute.validate()?;
        let request = Request {
            chunks: p.pipeline_parallel_chunks,
            memory_limit: p.memory_limit,
            times: self.planning_times(),
            ..Request::new(kind, d, n)
        };
        let schedule = generate(&request).map_err(|e| match e {
            Error::MemoryLimit { smallest, .. } => invalid(
                "parallelism.memory_limit",
                format!("no {kind} schedule fits; the smallest limit that fits is {smallest}"),
            ),
            Error::Unsupported { reason, .. } => invalid(
                "parallelism.pipeline_parallel_schedule",
                format!("{kind} does not support {reason}"),
            ),
            other => other,
        })?;
        if self.checkpoint.enable_checkpoint {
            if self.checkpoint.interval == 0 {
                return Err(invalid("checkpoint.interval", "must be at least 1 step"));
            }
            if self.checkpoint.folder.trim().is_empty() {
                return Err(invalid("checkpoint.folder", "must not be empty"));
            }
            if self.checkpoint.keep_latest_k == 1 {
                // As torchtitan: the latest may not be recorded as the one to resume from
                // yet when the one before is removed.
                return Err(invalid(
                    "checkpoint.keep_latest_k",
                    "must be 0 (keep all) or at least 2",
                ));
            }
        }
        if let Some(path) = &self.data.path
            && path.trim().is_empty()
        {
            return Err(invalid("data.path", "must not be empty when given"));
        }
        Ok(JobPlan {
            kind,
            microbatches: n,
            schedule,
        })
    }
}

/// `model.<field>` for a field name the model spec reports.
fn model_field(field: &'static str) -> &'static str {
    match field {
        "vocab" => "model.vocab",
        "hidden" => "model.hidden",
        "heads" => "model.heads",
        "layers" => "model.layers",
        "seq_len" => "model.seq_len",
        "dtype" => "model.dtype",
        other => other,
    }
}

/// A small valid job (the `pipewise local` default model), for tests and examples.
pub fn example(workers: u32, schedule: &str) -> JobSpec {
    JobSpec {
        job: JobSection {
            name: "example".into(),
            description: String::new(),
        },
        model: ModelSpec {
            vocab: 256,
            hidden: 64,
            heads: 4,
            layers: 8,
            seq_len: 32,
            dtype: DType::F32,
        },
        training: Training {
            global_batch_size: 8,
            steps: 20,
            seed: 42,
            max_norm: 1.0,
        },
        optimizer: Optimizer::default(),
        parallelism: Parallelism {
            pipeline_parallel_degree: workers,
            pipeline_parallel_schedule: schedule.into(),
            pipeline_parallel_microbatch_size: 1,
            pipeline_parallel_chunks: 2,
            memory_limit: None,
            pipeline_parallel_first_stage_less_layers: 0,
            pipeline_parallel_last_stage_less_layers: 0,
            pipeline_parallel_layers_per_stage: None,
            torchtitan_split: false,
        },
        checkpoint: Checkpoint::default(),
        data: Data::default(),
        compute: Compute::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_split_into_job_and_run() {
        let id = run_id(12, 3);
        assert_eq!((job_of(id), run_of(id)), (12, 3));
        assert_eq!((job_of(12), run_of(12)), (12, 0));
        assert_eq!(run_id(12, 0), 12);
    }

    /// torchtitan's first / last stage less layers and layers per stage.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn stage_pieces_follow_torchtitan_options() {
        let mut spec = example(2, "1f1b");
        let p = &mut spec.parallelism;
        assert_eq!(p.stage_pieces(8, 2).unwrap(), None);
        // 8 blocks + 2 slots = 5 per stage; the first holds 2 fewer, plus the embedding.
        p.pipeline_parallel_first_stage_less_layers = 2;
        assert_eq!(p.stage_pieces(8, 2).unwrap(), Some(vec![4, 6]));
        // 32 blocks, 4 stages, one fewer on each end: 34 slots as 9, 9, 8, 8.
        p.pipeline_parallel_first_stage_less_layers = 1;
        p.pipeline_parallel_last_stage_less_layers = 1;
        assert_eq!(p.stage_pieces(32, 4).unwrap(), Some(vec![9, 9, 8, 8]));
        assert_eq!(
            p.stage_pieces(32, 4).unwrap().unwrap().iter().sum::<u32>(),
            32 + 2
        );
        // Layers per stage must give the stage count: ⌈34 / 8⌉ = 5 stages, not 4.
        p.pipeline_parallel_layers_per_stage = Some(8);
        let err = p.stage_pieces(32, 4).unwrap_err().to_string();
        assert!(err.contains("pipeline_parallel_layers_per_stage"), "{err}");
        assert!(err.contains("5 stages") && err.contains("has 4"), "{err}");
        // torchtitan rounds up: 9 per stage gives ⌈34 / 9⌉ = 4 stages, split 9, 9, 8, 8.
        p.pipeline_parallel_layers_per_stage = Some(9);
        assert_eq!(p.stage_pieces(32, 4).unwrap(), Some(vec![9, 9, 8, 8]));
        p.pipeline_parallel_layers_per_stage = Some(0);
        let err = p.stage_pieces(32, 4).unwrap_err().to_string();
        assert!(err.contains("no stage"), "{err}");
        p.pipeline_parallel_layers_per_stage = Some(8);
        p.pipeline_parallel_first_stage_less_layers = 0;
        p.pipeline_parallel_last_stage_less_layers = 0;
        assert_eq!(p.stage_pieces(32, 4).unwrap(), Some(vec![9, 8, 8, 9]));
        // More fewer layers than a stage has slots.
        p.pipeline_parallel_layers_per_stage = None;
        p.pipeline_parallel_first_stage_less_layers = 12;
        let err = p.stage_pieces(8, 2).unwrap_err().to_string();
        assert!(err.contains("first_stage_less_layers"), "{err}");
        // A middle stage without a block.
        p.pipeline_parallel_first_stage_less_layers = 1;
        let err = p.stage_pieces(1, 4).unwrap_err().to_string();
        assert!(err.contains("no layer") || err.contains("too few"), "{err}");
        assert!(err.contains("model.layers"), "{err}");
        // Checked when the job is validated, with the field named.
        let mut spec = example(2, "1f1b");
        spec.parallelism.pipeline_parallel_layers_per_stage = Some(3);
        let err = spec.validate().unwrap_err().to_string();
        assert!(err.contains("pipeline_parallel_layers_per_stage"), "{err}");
    }

    /// The shipped example job validates, and so does its commented layer split.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn the_example_job_file_validates_with_its_layer_split() {
        let text = include_str!("../../deploy/job.toml");
        let spec = JobSpec::from_toml(text).unwrap();
        spec.validate().unwrap();
        let uncommented = text.replace("# pipeline_parallel_", "pipeline_parallel_");
        assert_ne!(uncommented, text);
        let split = JobSpec::from_toml(&uncommented).unwrap();
        assert_eq!(
            split.parallelism.pipeline_parallel_layers_per_stage,
            Some(2)
        );
        let plan = split.validate().unwrap();
        let stages = plan.schedule.placement.stages();
        let ranges = split.stage_ranges(stages).unwrap();
        let held: Vec<usize> = ranges.iter().map(|r| r.len()).collect();
        // 16 block slots in 8 stages of 2; one fewer block on each end, which also holds
        // the embedding or the head.
        assert_eq!(held, vec![2; 8]);
    }

    /// Predicted activation peaks follow the job's layer split, not the even one.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn predicted_peaks_follow_the_layer_split() {
        let mut spec = example(2, "1f1b");
        spec.model.layers = 8;
        let even = spec
            .validate()
            .unwrap()
            .predicted_peak_bytes(&spec)
            .unwrap();
        spec.parallelism.pipeline_parallel_first_stage_less_layers = 2;
        let ranges = spec.stage_ranges(2).unwrap();
        assert_eq!(ranges, vec![0..4, 4..10]);
        let split = spec
            .validate()
            .unwrap()
            .predicted_peak_bytes(&spec)
            .unwrap();
        // Fewer blocks on worker 0, more on worker 1.
        assert!(split[0] < even[0], "{split:?} against {even:?}");
        assert!(split[1] > even[1], "{split:?} against {even:?}");
    }

    fn field_of(spec: &JobSpec) -> &'static str {
        match spec.validate() {
            Err(Error::InvalidArgument { field, .. }) => field,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn example_validates_and_round_trips_through_toml() {
        let spec = example(4, "v-half");
        let plan = spec.validate().expect("valid");
        assert_eq!(plan.microbatches, 8);
        assert_eq!(plan.schedule.num_workers(), 4);
        let text = spec.to_toml().expect("toml");
        assert_eq!(JobSpec::from_toml(&text).expect("parses"), spec);
    }

    #[test]
    fn f16_is_refused_only_for_real_compute() {
        let mut spec = example(2, "1f1b");
        spec.model.dtype = DType::BF16;
        assert!(spec.validate().is_ok());
        spec.model.dtype = DType::F16;
        assert!(spec.validate().is_err());
        spec.compute = Compute::emulate(1.0, 1.0, 1.0);
        assert!(spec.validate().is_ok());
    }

    #[test]
    fn every_bad_field_is_named() {
        type Edit = fn(&mut JobSpec);
        let cases: Vec<(&str, Edit)> = vec![
            ("job.name", |s| s.job.name = " ".into()),
            ("model.hidden", |s| s.model.hidden = 0),
            ("model.heads", |s| s.model.heads = 3),
            ("model.dtype", |s| s.model.dtype = DType::F16),
            ("training.steps", |s| s.training.steps = 0),
            ("training.global_batch_size", |s| {
                s.training.global_batch_size = 0
            }),
            ("training.global_batch_size", |s| {
                s.parallelism.pipeline_parallel_microbatch_size = 3
            }),
            ("training.max_norm", |s| s.training.max_norm = -1.0),
            ("optimizer.lr", |s| s.optimizer.lr = f64::NAN),
            ("optimizer.weight_decay", |s| {
                s.optimizer.weight_decay = -0.1
            }),
            ("optimizer.beta2", |s| s.optimizer.beta2 = 1.0),
            ("optimizer.eps", |s| s.optimizer.eps = 0.0),
            ("parallelism.pipeline_parallel_degree", |s| {
                s.parallelism.pipeline_parallel_degree = 0
            }),
            ("parallelism.pipeline_parallel_microbatch_size", |s| {
                s.parallelism.pipeline_parallel_microbatch_size = 0
            }),
            // 2^22 tokens × 64 × 4 bytes: a 1 GiB activation the transport cannot carry
            // (it used to be queued and fail at its first frame).
            ("parallelism.pipeline_parallel_microbatch_size", |s| {
                s.model.seq_len = 1 << 22;
            }),
            ("parallelism.pipeline_parallel_schedule", |s| {
                s.parallelism.pipeline_parallel_schedule = "2f2b".into()
            }),
            ("parallelism.pipeline_parallel_schedule", |s| {
                // DualPipeV needs 2 × workers microbatches: 8 < 2 × 8.
                s.parallelism.pipeline_parallel_schedule = "dualpipe-v".into();
                s.parallelism.pipeline_parallel_degree = 8;
                s.model.layers = 16;
            }),
            ("parallelism.pipeline_parallel_chunks", |s| {
                s.parallelism.pipeline_parallel_chunks = 0
            }),
            ("parallelism.memory_limit", |s| {
                s.parallelism.memory_limit = Some(2.0)
            }),
            ("parallelism.memory_limit", |s| {
                s.parallelism.pipeline_parallel_schedule = "adaptive-v".into();
                s.parallelism.memory_limit = Some(0.25);
            }),
            ("model.layers", |s| {
                s.parallelism.pipeline_parallel_degree = 8
            }),
            // Too large to plan: refused before any allocation (a u32-sized batch used to
            // exhaust the coordinator's memory inside the generator).
            ("model.layers", |s| s.model.layers = u32::MAX),
            // Sizes whose parameter and stash byte counts used to overflow u64.
            ("model.hidden", |s| {
                s.model.hidden = 4_000_000_000;
                s.model.heads = 1;
            }),
            ("model.vocab", |s| s.model.vocab = u32::MAX),
            ("model.seq_len", |s| s.model.seq_len = u32::MAX),
            ("parallelism.pipeline_parallel_degree", |s| {
                s.parallelism.pipeline_parallel_degree = u32::MAX
            }),
            ("parallelism.pipeline_parallel_chunks", |s| {
                s.parallelism.pipeline_parallel_schedule = "interleaved-1f1b".into();
                s.parallelism.pipeline_parallel_chunks = 1000;
            }),
            ("training.global_batch_size", |s| {
                s.training.global_batch_size = u32::MAX
            }),
            ("training.global_batch_size", |s| {
                // 1M microbatches × 4 stages: each count alone is within limits.
                s.training.global_batch_size = 1_000_000;
                s.parallelism.pipeline_parallel_degree = 4;
            }),
            ("checkpoint.interval", |s| {
                s.checkpoint.enable_checkpoint = true;
                s.checkpoint.interval = 0;
            }),
            ("checkpoint.keep_latest_k", |s| {
                s.checkpoint.enable_checkpoint = true;
                s.checkpoint.keep_latest_k = 1;
            }),
            ("data.path", |s| s.data.path = Some(String::new())),
            ("compute.f_ms", |s| {
                s.compute = Compute::emulate(f64::NAN, 1.0, 1.0)
            }),
            ("compute.b_ms", |s| {
                s.compute = Compute::emulate(1.0, 0.0, 1.0)
            }),
            ("compute.w_ms", |s| {
                s.compute = Compute::emulate(1.0, 1.0, -2.0)
            }),
            ("compute.f_ms", |s| {
                s.compute = Compute::emulate(f64::INFINITY, 1.0, 1.0)
            }),
            ("compute.w_ms", |s| {
                s.compute = Compute::emulate(1.0, 1.0, 1e9)
            }),
            // Checked in real mode too: a typo in an unused section is still a typo.
            ("compute.b_ms", |s| s.compute.b_ms = -1.0),
        ];
        for (expected, edit) in cases {
            let mut spec = example(4, "v-half");
            edit(&mut spec);
            assert_eq!(field_of(&spec), expected, "{spec:?}");
        }
    }

    #[test]
    fn toml_errors_name_the_key() {
        let good = example(2, "1f1b").to_toml().expect("toml");
        for (section, key) in [("[training]", "steps_typo"), ("[model]", "n_kv_heads")] {
            let text = good.replace(section, &format!("{section}\n{key} = 3"));
            assert_ne!(text, good, "{section} is in the example");
            match JobSpec::from_toml(&text) {
                Err(Error::InvalidArgument { field, reason }) => {
                    assert_eq!(field, "toml");
                    assert!(reason.contains(key), "{reason}");
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(JobSpec::from_toml("not toml [").is_err());
    }

    #[test]
    fn compute_section_is_optional_and_round_trips() {
        let real = example(4, "v-half");
        assert_eq!(real.compute.mode, ComputeMode::Real);
        let text = real.to_toml().expect("toml");
        assert!(!text.contains("[compute]"), "{text}");
        assert_eq!(real.planning_times(), Times::UNIT);

        let mut emu = real.clone();
        emu.compute = Compute::emulate(12.0, 24.0, 6.0);
        let text = emu.to_toml().expect("toml");
        assert!(
            text.contains("[compute]") && text.contains("emulate"),
            "{text}"
        );
        let back = JobSpec::from_toml(&text).expect("parses");
        assert_eq!(back, emu);
        assert!(back.compute.is_emulated());
        let t = back.planning_times();
        assert_eq!((t.f, t.b, t.w, t.comm), (1.0, 2.0, 0.5, 0.0));
        let s = back.compute.times_secs();
        assert!((s.f - 0.012).abs() < 1e-12 && (s.b - 0.024).abs() < 1e-12);
        back.validate().expect("valid");

        // Only the mode given: the default times.
        let text = format!(
            "{}\n[compute]\nmode = \"emulate\"\n",
            real.to_toml().expect("toml")
        );
        let c = JobSpec::from_toml(&text).expect("parses").compute;
        assert_eq!(c, Compute::emulate(10.0, 10.0, 10.0));
    }

    #[test]
    fn malformed_compute_section_names_the_key() {
        let base = example(2, "1f1b").to_toml().expect("toml");
        for (section, key) in [
            ("[compute]\nmode = \"emulated\"\n", "mode"),
            ("[compute]\nmode = \"emulate\"\nf_ms = \"fast\"\n", "f_ms"),
            ("[compute]\nmode = \"emulate\"\nx_ms = 3.0\n", "x_ms"),
        ] {
            match JobSpec::from_toml(&format!("{base}\n{section}")) {
                Err(Error::InvalidArgument { field, reason }) => {
                    assert_eq!(field, "toml");
                    assert!(reason.contains(key), "{key}: {reason}");
                }
                other => panic!("{section}: {other:?}"),
            }
        }
    }

    #[test]
    fn smallest_memory_limit_is_reported() {
        let mut spec = example(4, "adaptive-v");
        spec.parallelism.memory_limit = Some(0.25);
        match spec.validate() {
            Err(Error::InvalidArgument { reason, .. }) => {
                assert!(reason.contains("smallest limit that fits"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }
}
