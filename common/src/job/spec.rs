//! The job file's schema: its sections and fields (TOML, torchtitan's names), defaults,
//! the TOML form, and a small example job. Field validation is in the
//! `check` file beside this one.

use serde::{Deserialize, Serialize};

use crate::cost::Times;
use crate::error::{Error, Result};
use crate::model::{DType, ModelSpec};

use super::activation::ActivationCheckpoint;

/// The longest `job.name`, in bytes.
pub const MAX_NAME_BYTES: usize = 128;
/// The longest `job.description`, in bytes.
pub const MAX_DESCRIPTION_BYTES: usize = 4096;
/// The largest job file, in bytes (a job file is a few hundred bytes; this leaves room for
/// a long description, well under gRPC's 4 MiB message limit).
pub const MAX_JOB_TOML_BYTES: usize = 1 << 20;

/// `[job]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSection {
    /// Job name (non-empty, at most [`MAX_NAME_BYTES`]).
    pub name: String,
    /// Free text (at most [`MAX_DESCRIPTION_BYTES`]).
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
    /// pieces (embedding, blocks, head) are split to balance the workers' compute
    /// ([`JobSpec::stage_ranges`]).
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
    /// Data-parallel replicas of the pipeline (torchtitan's name): `R` copies, each on its
    /// own `pipeline_parallel_degree` workers and each taking `1/R` of every step's
    /// microbatches; every stage's gradients are summed over the replicas before the
    /// optimizer step.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub data_parallel_replicate_degree: u32,
    /// Data-parallel copies that shard their optimizer state (torchtitan's name): `S`
    /// copies of the pipeline per replicate group, `R × S` in all, each worker of a group
    /// keeping AdamW's moments and master weights (and with [`Parallelism::zero_stage`] 2
    /// the summed gradients) for `1/S` of its stages' parameters.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub data_parallel_shard_degree: u32,
    /// What the shard degree's copies shard: 1 the optimizer state (ZeRO-1), 2 also the
    /// summed gradients (ZeRO-2).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub zero_stage: u32,
    /// With [`AUTO_SCHEDULE`]: the plans predicted within this fraction of the best
    /// (0.06: within 6 %) are each measured for a few steps before the job settles on the
    /// fastest measured; 0 measures none and keeps the search's choice.
    #[serde(
        default = "default_trial_band",
        skip_serializing_if = "is_default_trial_band"
    )]
    pub auto_trial_band: f64,
    /// Not part of a job file: split the torchtitan way although none of the three fields
    /// above is set. The coordinator sets it when it re-plans a job with blocks per stage
    /// onto another stage count (blocks per stage no longer apply, the way of splitting
    /// does).
    #[serde(skip)]
    pub torchtitan_split: bool,
    /// Not part of a job file: the file gives no microbatch size (set when it is read;
    /// the TOML form then leaves the size out). With [`AUTO_SCHEDULE`] the auto-planner
    /// then searches it; a job that sets the size keeps it.
    #[serde(skip)]
    pub search_microbatch_size: bool,
}

/// The schedule name that asks the coordinator to choose the schedule, chunks, microbatch
/// size and split for the workers it runs on ([`crate::auto::job`]).
pub const AUTO_SCHEDULE: &str = "auto";

impl Parallelism {
    /// Pieces (embedding, blocks, head) per stage for `layers` blocks in `stages` stages,
    /// the torchtitan way: `layers + first less + last less` block slots split as evenly
    /// as possible (earlier stages take the remainder), the first stage's slots minus
    /// `first less` plus the embedding, the last's minus `last less` plus the head
    /// ([`partition::torchtitan_counts`](crate::partition::torchtitan_counts)). `None` when
    /// none of the three fields (nor [`Parallelism::torchtitan_split`]) is set: the
    /// balanced split applies ([`JobSpec::stage_ranges`]).
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
        crate::partition::torchtitan_counts(
            layers,
            stages,
            first,
            last,
            self.pipeline_parallel_layers_per_stage,
        )
        .map(Some)
    }
}

fn one() -> u32 {
    1
}
fn is_one(n: &u32) -> bool {
    *n == 1
}
fn two() -> u32 {
    2
}
/// The default [`Parallelism::auto_trial_band`]: plans the cost model predicts this close
/// are within its error on a shared machine.
pub const DEFAULT_TRIAL_BAND: f64 = 0.06;
fn default_trial_band() -> f64 {
    DEFAULT_TRIAL_BAND
}
fn is_default_trial_band(band: &f64) -> bool {
    *band == DEFAULT_TRIAL_BAND
}

/// `[checkpoint]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// Save checkpoints at all.
    #[serde(default)]
    pub enable_checkpoint: bool,
    /// Folder under the coordinator's and the workers' data directories (relative to them,
    /// or absolute under them; see [`super::confine()`]).
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

/// `[data]`: the training documents, how they become tokens, and the order of their
/// windows. The worker reads `path` as one of four forms, by what it is: a folder of
/// `*.txt` documents (by name), JSON Lines (`.jsonl`, a `text` string per line), tokens
/// already encoded (`.bin`, little-endian ids of `token_bytes` bytes each, nanoGPT's
/// form), or else one text document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Data {
    /// The documents under the workers' data directory (relative to it, or absolute under
    /// it); the generated default corpus when absent.
    #[serde(default)]
    pub path: Option<String>,
    /// The corpus's windows in a seeded order each epoch (default), or in its order.
    #[serde(default = "shuffled")]
    pub shuffle: bool,
    /// A Hugging Face `tokenizer.json` under the workers' data directory; absent: a byte
    /// is a token (vocabulary 256, no end-of-text token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<String>,
    /// Bytes per token id of a `.bin` file: 2 (u16, nanoGPT's; the default) or 4 (u32).
    #[serde(default = "default_token_bytes")]
    pub token_bytes: u32,
}

fn shuffled() -> bool {
    true
}
fn default_token_bytes() -> u32 {
    2
}

impl Default for Data {
    fn default() -> Self {
        Data {
            path: None,
            shuffle: true,
            tokenizer: None,
            token_bytes: default_token_bytes(),
        }
    }
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

/// The shortest emulated pass time accepted, one microsecond: the planner costs a job with
/// the times relative to `f_ms`, which overflow when `f_ms` is tiny (found by fuzzing:
/// `f_ms = 5e-324` made `b_ms / f_ms` infinite, refused under no job field).
pub const MIN_EMULATED_PASS_MS: f64 = 1e-3;

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

    /// Checks the times (each finite, from [`MIN_EMULATED_PASS_MS`] to
    /// [`MAX_EMULATED_PASS_MS`]), naming the field (`compute.f_ms` …). Checked whatever the
    /// mode, so a typo is caught early.
    pub fn validate(&self) -> Result<()> {
        for (field, ms) in [
            ("compute.f_ms", self.f_ms),
            ("compute.b_ms", self.b_ms),
            ("compute.w_ms", self.w_ms),
        ] {
            if !(MIN_EMULATED_PASS_MS..=MAX_EMULATED_PASS_MS).contains(&ms) {
                return Err(Error::invalid(
                    field,
                    format!(
                        "must be a number of milliseconds from {MIN_EMULATED_PASS_MS} to \
                         {MAX_EMULATED_PASS_MS}, got {ms}"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// `[validation]` (what its fields mean and their checks: the `validation` file beside
/// this one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Validation {
    /// The validation data under the workers' data directory (relative to it, or absolute
    /// under it), read as `[data] path` is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Instead of `path`: this last fraction of the training stream's windows (0 < f < 1)
    /// is held out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<f64>,
    /// Evaluate after every this many optimizer steps (and after the last).
    #[serde(default = "default_freq")]
    pub freq: u32,
    /// Batches of `training.global_batch_size` windows per evaluation; -1: every window.
    #[serde(default = "every_window")]
    pub steps: i64,
}

/// The default [`Validation::freq`].
pub const DEFAULT_VALIDATION_FREQ: u32 = 10;

fn default_freq() -> u32 {
    DEFAULT_VALIDATION_FREQ
}

fn every_window() -> i64 {
    -1
}

impl Default for Validation {
    fn default() -> Self {
        Validation {
            path: None,
            fraction: None,
            freq: default_freq(),
            steps: every_window(),
        }
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
    /// `[lr_scheduler]` (absent: `optimizer.lr` at every step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr_scheduler: Option<super::lr::LrScheduler>,
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
    /// `[validation]` (absent: no validation loss).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation: Option<Validation>,
    /// `[activation_checkpoint]` (absent: no recomputation).
    #[serde(default, skip_serializing_if = "ActivationCheckpoint::is_default")]
    pub activation_checkpoint: ActivationCheckpoint,
}

impl JobSpec {
    /// The model's pieces (embedding, blocks, head) of each of `placement`'s stages: the
    /// job's layer split ([`Parallelism::stage_pieces`]) or, without one, the split that
    /// balances the workers' compute ([`ModelSpec::balanced_split`]).
    pub fn stage_ranges(
        &self,
        placement: &crate::placement::Placement,
    ) -> Result<Vec<std::ops::Range<usize>>> {
        match self
            .parallelism
            .stage_pieces(self.model.layers, placement.stages())?
        {
            Some(counts) => self.model.split_by_counts(&counts),
            None => self.model.balanced_split(placement),
        }
    }

    /// Parses TOML; a syntax error or an unknown field is an `InvalidArgument` on `toml`
    /// whose reason names the line and the key.
    pub fn from_toml(text: &str) -> Result<JobSpec> {
        if text.len() > MAX_JOB_TOML_BYTES {
            return Err(Error::invalid(
                "toml",
                format!(
                    "the job file is {} bytes, more than the {MAX_JOB_TOML_BYTES} allowed",
                    text.len()
                ),
            ));
        }
        let invalid =
            |e: &dyn std::fmt::Display| Error::invalid("toml", e.to_string().trim().to_string());
        // The document parsed once, integers kept as written (a `toml::Table` refuses a
        // seed above `i64::MAX`, which the job's `u64` takes): looked at for the keys the
        // spec's fields cannot tell apart from their defaults, then deserialized.
        let doc = toml::de::DeTable::parse(text).map_err(|e| invalid(&e))?;
        let given = doc.get_ref().iter().any(|(key, value)| {
            key.get_ref().as_ref() == "parallelism"
                && matches!(value.get_ref(), toml::de::DeValue::Table(p)
                    if p.iter().any(|(k, _)| k.get_ref().as_ref() == MICROBATCH_SIZE_KEY))
        });
        let mut spec =
            JobSpec::deserialize(toml::de::Deserializer::from(doc)).map_err(|mut e| {
                // The parsed document does not keep the text; the error's line comes from it.
                e.set_input(Some(text));
                invalid(&e)
            })?;
        spec.parallelism.search_microbatch_size = !given;
        super::parse_count::add(&spec.job.name);
        Ok(spec)
    }

    /// The job as TOML (without the microbatch size where the file gave none).
    pub fn to_toml(&self) -> Result<String> {
        let text = toml::to_string(self).map_err(|e| Error::invalid("toml", e.to_string()))?;
        if !self.parallelism.search_microbatch_size {
            return Ok(text);
        }
        // The serializer writes one `key = value` line per field under `[parallelism]`
        // (not through `toml::Value`, which refuses a seed above `i64::MAX`).
        let mut section = "";
        Ok(text
            .lines()
            .filter(|line| {
                if line.starts_with('[') {
                    section = line.trim();
                }
                !(section == "[parallelism]"
                    && line.split('=').next().map(str::trim) == Some(MICROBATCH_SIZE_KEY))
            })
            .map(|line| format!("{line}\n"))
            .collect())
    }

    /// Whether the job asks the coordinator to choose its plan ([`AUTO_SCHEDULE`]).
    pub fn is_auto(&self) -> bool {
        self.parallelism.pipeline_parallel_schedule == AUTO_SCHEDULE
    }

    /// Data-parallel copies of the pipeline in all (at least 1): the replicate degree
    /// times the shard degree.
    pub fn replicas(&self) -> u32 {
        self.parallelism
            .data_parallel_replicate_degree
            .max(1)
            .saturating_mul(self.shard_degree())
    }

    /// The shard degree (at least 1): consecutive copies sharing their optimizer state.
    pub fn shard_degree(&self) -> u32 {
        self.parallelism.data_parallel_shard_degree.max(1)
    }

    /// This spec with `replicas` data-parallel copies in all: in shard groups of the shard
    /// degree where it divides them, else unsharded.
    pub fn with_replicas(&self, replicas: u32) -> JobSpec {
        let mut spec = self.clone();
        let degree = self.shard_degree();
        if replicas.is_multiple_of(degree) {
            spec.parallelism.data_parallel_replicate_degree = replicas / degree;
        } else {
            spec.parallelism.data_parallel_replicate_degree = replicas;
            spec.parallelism.data_parallel_shard_degree = 1;
        }
        spec
    }

    /// The most replicas from `least` to `most` that the global batch splits into, each a
    /// whole number of microbatches (`None`: none does).
    pub fn splitting_replicas(&self, least: u32, most: u32) -> Option<u32> {
        let mbs = self.parallelism.pipeline_parallel_microbatch_size.max(1);
        (least.max(1)..=most)
            .rev()
            .find(|&r| self.training.global_batch_size.is_multiple_of(mbs * r))
    }

    /// Workers the job runs on: the pipeline's degree times its replicas.
    pub fn workers_needed(&self) -> u32 {
        self.parallelism
            .pipeline_parallel_degree
            .saturating_mul(self.replicas())
    }

    /// Microbatches of each replica's pipeline per step.
    pub fn pipeline_microbatches(&self) -> u32 {
        self.microbatches() / self.replicas()
    }

    /// Microbatches per step (over all replicas).
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
}

/// The microbatch size's key in `[parallelism]`.
const MICROBATCH_SIZE_KEY: &str = "pipeline_parallel_microbatch_size";

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
            ..Default::default()
        },
        training: Training {
            global_batch_size: 8,
            steps: 20,
            seed: 42,
            max_norm: 1.0,
        },
        optimizer: Optimizer::default(),
        lr_scheduler: None,
        parallelism: Parallelism {
            pipeline_parallel_degree: workers,
            pipeline_parallel_schedule: schedule.into(),
            pipeline_parallel_microbatch_size: 1,
            pipeline_parallel_chunks: 2,
            memory_limit: None,
            pipeline_parallel_first_stage_less_layers: 0,
            pipeline_parallel_last_stage_less_layers: 0,
            pipeline_parallel_layers_per_stage: None,
            data_parallel_replicate_degree: 1,
            data_parallel_shard_degree: 1,
            zero_stage: 1,
            auto_trial_band: DEFAULT_TRIAL_BAND,
            torchtitan_split: false,
            search_microbatch_size: false,
        },
        checkpoint: Checkpoint::default(),
        data: Data::default(),
        compute: Compute::default(),
        validation: None,
        activation_checkpoint: ActivationCheckpoint::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Each reading of a job file counts once (`parse_count`, which the other crates'
    /// tests use to check that a process reads a job once).
    #[test]
    fn a_reading_counts_once() {
        let mut spec = example(2, "1f1b");
        spec.job.name = "counted-once".into();
        let text = spec.to_toml().expect("toml");
        assert_eq!(super::super::parse_count::parses_of("counted-once"), 0);
        JobSpec::from_toml(&text).expect("parses");
        assert_eq!(super::super::parse_count::parses_of("counted-once"), 1);
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

    /// A seed above `i64::MAX` (the fuzzer's find) and a job file without a microbatch
    /// size both survive the trip, each way.
    #[test]
    fn a_large_seed_and_a_searched_size_round_trip_through_toml() {
        for search in [false, true] {
            let mut spec = example(2, "auto");
            spec.training.seed = u64::MAX;
            spec.parallelism.search_microbatch_size = search;
            let text = spec.to_toml().expect("toml");
            assert_eq!(text.contains(MICROBATCH_SIZE_KEY), !search, "{text}");
            assert_eq!(JobSpec::from_toml(&text).expect("parses"), spec, "{text}");
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
                    // The line of the key, from the text the document was parsed from.
                    let line = text.lines().position(|l| l.starts_with(key)).unwrap_or(0) + 1;
                    assert!(reason.contains(&format!("line {line}")), "{reason}");
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(JobSpec::from_toml("not toml [").is_err());
        // A file past the cap is refused before it is parsed, whatever it holds.
        let padded = format!("{good}\n#{}", " ".repeat(MAX_JOB_TOML_BYTES));
        match JobSpec::from_toml(&padded) {
            Err(Error::InvalidArgument { field, reason }) => {
                assert_eq!(field, "toml");
                assert!(reason.contains("more than the"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert!(JobSpec::from_toml(&padded[..MAX_JOB_TOML_BYTES]).is_ok());
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

    /// A tiny `f_ms` beside larger times is refused naming it, not passed to the planner
    /// as infinite ratios.
    #[test]
    fn emulated_times_below_a_microsecond_are_refused() {
        let mut spec = example(2, "1f1b");
        for f_ms in [5e-324, 1e-300, 1e-4] {
            spec.compute = Compute::emulate(f_ms, 10.0, 10.0);
            match spec.validate() {
                Err(Error::InvalidArgument { field, .. }) => assert_eq!(field, "compute.f_ms"),
                other => panic!("{f_ms}: {other:?}"),
            }
        }
        spec.compute = Compute::emulate(MIN_EMULATED_PASS_MS, MAX_EMULATED_PASS_MS, 1.0);
        spec.validate().expect("the extremes are accepted");
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

    /// Without a layer split a job gets the balanced split (every V worker the same blocks
    /// where the even split gave worker 1 five of 16 and worker 3 three); any of
    /// torchtitan's fields switches to torchtitan's split, and a bad one is named.
    #[test]
    fn stage_ranges_balance_workers_unless_the_job_splits() {
        let mut spec = example(4, "v-half");
        spec.model.layers = 16;
        let plan = spec.validate().expect("valid");
        let placement = &plan.schedule.placement;
        let ranges = spec.stage_ranges(placement).expect("splits");
        assert_eq!(
            ranges,
            spec.model.balanced_split(placement).expect("splits")
        );
        let blocks = |ranges: &[std::ops::Range<usize>], w: u32| -> usize {
            placement
                .stages_of(w)
                .iter()
                .map(|&s| {
                    ranges[s as usize]
                        .clone()
                        .filter(|i| (1..=16).contains(i))
                        .count()
                })
                .sum()
        };
        for w in 0..4 {
            assert_eq!(blocks(&ranges, w), 4, "worker {w}: {ranges:?}");
        }
        let even = spec.model.even_split(8).expect("splits");
        assert_eq!(blocks(&even, 1), 5);
        spec.parallelism.pipeline_parallel_last_stage_less_layers = 1;
        let counts = spec
            .parallelism
            .stage_pieces(16, 8)
            .expect("torchtitan splits")
            .expect("a layer split");
        let ranges = spec.stage_ranges(placement).expect("splits");
        assert_eq!(ranges, spec.model.split_by_counts(&counts).expect("splits"));
        assert_eq!(ranges.last().map(|r| r.len()), Some(2));
        spec.parallelism.pipeline_parallel_layers_per_stage = Some(5);
        match spec.stage_ranges(placement) {
            Err(Error::InvalidArgument { field, .. }) => {
                assert_eq!(field, "parallelism.pipeline_parallel_layers_per_stage")
            }
            other => panic!("{other:?}"),
        }
    }

    /// A shard degree multiplies the copies; re-sizing keeps whole shard groups where the
    /// degree divides the new count and drops the sharding where it does not.
    #[test]
    fn shard_groups_count_among_the_copies() {
        let mut spec = example(2, "1f1b");
        spec.parallelism.data_parallel_replicate_degree = 2;
        spec.parallelism.data_parallel_shard_degree = 4;
        assert_eq!((spec.replicas(), spec.workers_needed()), (8, 16));
        let fewer = spec.with_replicas(4);
        assert_eq!(fewer.parallelism.data_parallel_replicate_degree, 1);
        assert_eq!((fewer.shard_degree(), fewer.replicas()), (4, 4));
        let odd = spec.with_replicas(3);
        assert_eq!((odd.shard_degree(), odd.replicas()), (1, 3));
    }
}
