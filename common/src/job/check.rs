//! Field validation of a job: every field checked, the first problem found returned as
//! [`Error::InvalidArgument`] naming the field (`section.key`) and the reason.

use super::confine::{MAX_PATH_BYTES, check_text};
use super::spec::{AUTO_SCHEDULE, JobSpec, MAX_DESCRIPTION_BYTES, MAX_FRAME_BYTES, MAX_NAME_BYTES};
use crate::error::{Error, Result};
use crate::generate::{
    MAX_CHUNKS, MAX_MICROBATCHES, MAX_STAGE_MICROBATCHES, MAX_WORKERS, Request, ScheduleKind,
};
use crate::model::DType;

impl JobSpec {
    /// Checks every field the schedule depends on (all but `[checkpoint]` and `[data]`) and
    /// returns the request that generates the schedule.
    pub(crate) fn schedule_request(&self) -> Result<Request> {
        if self.job.name.trim().is_empty() {
            return Err(Error::invalid("job.name", "must not be empty"));
        }
        check_text("job.name", &self.job.name, MAX_NAME_BYTES)?;
        check_text(
            "job.description",
            // Line breaks are fine in a description (it is printed on its own).
            &self.job.description.replace(['\n', '\r', '\t'], " "),
            MAX_DESCRIPTION_BYTES,
        )?;
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
            return Err(Error::invalid(
                "model.dtype",
                "f16 training needs loss scaling, which pipewise does not have; use bf16 \
                 (f16 is accepted for planning and emulated compute)",
            ));
        }
        self.activation_checkpoint
            .check(self.compute.is_emulated(), self.is_auto())?;
        let t = &self.training;
        if t.steps == 0 {
            return Err(Error::invalid("training.steps", "must be at least 1"));
        }
        if t.global_batch_size == 0 {
            return Err(Error::invalid(
                "training.global_batch_size",
                "must be at least 1",
            ));
        }
        if !(t.max_norm.is_finite() && t.max_norm >= 0.0) {
            return Err(Error::invalid(
                "training.max_norm",
                format!(
                    "must be finite and ≥ 0 (0 turns clipping off), got {}",
                    t.max_norm
                ),
            ));
        }
        let o = &self.optimizer;
        if !(o.lr.is_finite() && o.lr > 0.0) {
            return Err(Error::invalid(
                "optimizer.lr",
                format!("must be finite and > 0, got {}", o.lr),
            ));
        }
        if !(o.weight_decay.is_finite() && o.weight_decay >= 0.0) {
            return Err(Error::invalid(
                "optimizer.weight_decay",
                format!("must be finite and ≥ 0, got {}", o.weight_decay),
            ));
        }
        for (field, beta) in [("optimizer.beta1", o.beta1), ("optimizer.beta2", o.beta2)] {
            if !(0.0..1.0).contains(&beta) {
                return Err(Error::invalid(
                    field,
                    format!("must be in [0, 1), got {beta}"),
                ));
            }
        }
        if !(o.eps.is_finite() && o.eps > 0.0) {
            return Err(Error::invalid(
                "optimizer.eps",
                format!("must be finite and > 0, got {}", o.eps),
            ));
        }
        if let Some(lr) = &self.lr_scheduler {
            lr.check(t.steps)?;
        }
        let p = &self.parallelism;
        let d = p.pipeline_parallel_degree;
        if !(1..=MAX_WORKERS).contains(&d) {
            return Err(Error::invalid(
                "parallelism.pipeline_parallel_degree",
                format!("must be 1 to {MAX_WORKERS} workers, got {d}"),
            ));
        }
        let mbs = p.pipeline_parallel_microbatch_size;
        if mbs == 0 {
            return Err(Error::invalid(
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
            return Err(Error::invalid(
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
            return Err(Error::invalid(
                "training.global_batch_size",
                format!(
                    "{} sequences do not split into microbatches of {mbs} \
                     (parallelism.pipeline_parallel_microbatch_size)",
                    t.global_batch_size
                ),
            ));
        }
        let r = p.data_parallel_replicate_degree;
        if r == 0 || u64::from(d) * u64::from(r) > u64::from(MAX_WORKERS) {
            return Err(Error::invalid(
                "parallelism.data_parallel_replicate_degree",
                format!(
                    "must be at least 1, with degree × replicas at most {MAX_WORKERS} workers; \
                     got {r} replicas of {d} workers"
                ),
            ));
        }
        check_sharding(self, d)?;
        let r = self.replicas();
        if !u64::from(t.global_batch_size).is_multiple_of(u64::from(mbs) * u64::from(r)) {
            return Err(Error::invalid(
                "training.global_batch_size",
                format!(
                    "{} sequences do not split into {r} replicas \
                     (parallelism.data_parallel_replicate_degree × \
                     data_parallel_shard_degree) of microbatches of {mbs}",
                    t.global_batch_size
                ),
            ));
        }
        if !(1..=MAX_CHUNKS).contains(&p.pipeline_parallel_chunks) {
            return Err(Error::invalid(
                "parallelism.pipeline_parallel_chunks",
                format!(
                    "must be 1 to {MAX_CHUNKS}, got {}",
                    p.pipeline_parallel_chunks
                ),
            ));
        }
        // Capped before the error below quotes it.
        check_text(
            "parallelism.pipeline_parallel_schedule",
            &p.pipeline_parallel_schedule,
            MAX_SCHEDULE_NAME_BYTES,
        )?;
        // Auto's own plan is made on the workers; until then the job is checked and held
        // as 1F1B (one stage per worker, which every plan's pieces must cover too).
        let auto = self.is_auto();
        let kind: ScheduleKind = if auto {
            ScheduleKind::OneFOneB
        } else {
            p.pipeline_parallel_schedule.parse().map_err(|_| {
                Error::invalid(
                    "parallelism.pipeline_parallel_schedule",
                    format!(
                        "unknown schedule {:?}; known: {AUTO_SCHEDULE}, {}",
                        p.pipeline_parallel_schedule,
                        ScheduleKind::ALL.map(ScheduleKind::name).join(", ")
                    ),
                )
            })?
        };
        if let Some(limit) = p.memory_limit {
            if auto {
                return Err(Error::invalid(
                    "parallelism.memory_limit",
                    format!(
                        "applies to a named adaptive schedule; {AUTO_SCHEDULE} fits the plan \
                         to the workers' registered memory instead"
                    ),
                ));
            }
            if !kind.is_adaptive() {
                return Err(Error::invalid(
                    "parallelism.memory_limit",
                    format!("applies to adaptive-v and adaptive-zb, not to {kind}"),
                ));
            }
            if !(limit.is_finite() && limit > 0.0) {
                return Err(Error::invalid(
                    "parallelism.memory_limit",
                    format!("must be finite and > 0, got {limit}"),
                ));
            }
        }
        let band = p.auto_trial_band;
        if !(0.0..=1.0).contains(&band) {
            return Err(Error::invalid(
                "parallelism.auto_trial_band",
                format!("must be between 0 and 1 (a fraction of the best plan's time), got {band}"),
            ));
        }
        let n = self.pipeline_microbatches();
        if n > MAX_MICROBATCHES {
            return Err(Error::invalid(
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
            return Err(Error::invalid(
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
            return Err(Error::invalid(
                "model.layers",
                format!(
                    "{kind} on {d} workers has {stages} stages but the model has only {pieces} \
                     pieces (embedding, {} blocks, head); use at least {} layers",
                    self.model.layers,
                    stages - 2
                ),
            ));
        }
        if !auto {
            p.stage_pieces(self.model.layers, stages)?;
        } else if p.stage_pieces(self.model.layers, stages).is_err() {
            // Auto searches one stage per worker and two (V, interleaved): blocks per
            // stage must allow one of them.
            p.stage_pieces(self.model.layers, 2 * stages)?;
        }
        self.compute.validate()?;
        Ok(Request {
            chunks: p.pipeline_parallel_chunks,
            memory_limit: p.memory_limit,
            times: self.planning_times(),
            ..Request::new(kind, d, n)
        })
    }

    /// Checks `[checkpoint]`, `[data]` and `[validation]`.
    pub(crate) fn check_outputs(&self) -> Result<()> {
        if self.checkpoint.enable_checkpoint {
            if self.checkpoint.interval == 0 {
                return Err(Error::invalid(
                    "checkpoint.interval",
                    "must be at least 1 step",
                ));
            }
            if self.checkpoint.folder.trim().is_empty() {
                return Err(Error::invalid("checkpoint.folder", "must not be empty"));
            }
            if self.checkpoint.keep_latest_k == 1 {
                // As torchtitan: the latest may not be recorded as the one to resume from
                // yet when the one before is removed.
                return Err(Error::invalid(
                    "checkpoint.keep_latest_k",
                    "must be 0 (keep all) or at least 2",
                ));
            }
        }
        // Where the paths lead is checked against a data directory (`confine`); their
        // length and characters are checked here, set or not.
        check_text("checkpoint.folder", &self.checkpoint.folder, MAX_PATH_BYTES)?;
        if let Some(path) = &self.data.path {
            if path.trim().is_empty() {
                return Err(Error::invalid("data.path", "must not be empty when given"));
            }
            check_text("data.path", path, MAX_PATH_BYTES)?;
        }
        if let Some(v) = &self.validation {
            v.check()?;
        }
        self.check_data_encoding()
    }

    /// Checks how `[data]` becomes tokens, as far as the spec alone tells: what is in the
    /// files (a `.bin` file's ids, a tokenizer's vocabulary) is checked where a worker
    /// reads them.
    fn check_data_encoding(&self) -> Result<()> {
        let d = &self.data;
        if let Some(tokenizer) = &d.tokenizer {
            if tokenizer.trim().is_empty() {
                return Err(Error::invalid(
                    "data.tokenizer",
                    "must not be empty when given",
                ));
            }
            check_text("data.tokenizer", tokenizer, MAX_PATH_BYTES)?;
        }
        if d.token_bytes != 2 && d.token_bytes != 4 {
            return Err(Error::invalid(
                "data.token_bytes",
                format!("{} is neither 2 (u16 ids) nor 4 (u32 ids)", d.token_bytes),
            ));
        }
        let token_file = d.path.as_deref().is_some_and(|p| p.ends_with(".bin"));
        if d.token_bytes != 2 && !token_file {
            return Err(Error::invalid(
                "data.token_bytes",
                "applies to a `.bin` file of token ids only (data.path)",
            ));
        }
        // Byte-level text needs an embedding row for every byte; emulated passes embed
        // nothing.
        if d.tokenizer.is_none()
            && !token_file
            && !self.compute.is_emulated()
            && self.model.vocab < BYTE_VOCAB
        {
            return Err(Error::invalid(
                "model.vocab",
                format!(
                    "{} is smaller than the {BYTE_VOCAB} byte tokens of text read without a \
                     tokenizer; raise it or set data.tokenizer",
                    self.model.vocab
                ),
            ));
        }
        Ok(())
    }
}

/// The vocabulary of text read without a tokenizer: one token per byte value.
const BYTE_VOCAB: u32 = 256;

/// The longest schedule name accepted (the longest known one is under 20 bytes).
const MAX_SCHEDULE_NAME_BYTES: usize = 64;

/// `model.<field>` for a field name the model spec reports.
/// `data_parallel_shard_degree` and `zero_stage`: a degree of at least 1 whose copies
/// (replicate × shard × `d` workers) fit, on real compute (an emulated pass has no
/// optimizer state to shard), and ZeRO-1 or ZeRO-2 (not of a tied table, which sums its
/// gradients whole).
fn check_sharding(spec: &JobSpec, d: u32) -> Result<()> {
    let p = &spec.parallelism;
    let (r, s) = (
        p.data_parallel_replicate_degree,
        p.data_parallel_shard_degree,
    );
    let workers = u64::from(d) * u64::from(r) * u64::from(s);
    if s == 0 || workers > u64::from(MAX_WORKERS) {
        return Err(Error::invalid(
            "parallelism.data_parallel_shard_degree",
            format!(
                "must be at least 1, with degree × replicas × shard degree at most \
                 {MAX_WORKERS} workers; got a shard degree of {s} with {r} replicas of {d} \
                 workers"
            ),
        ));
    }
    if s > 1 && spec.compute.is_emulated() {
        return Err(Error::invalid(
            "parallelism.data_parallel_shard_degree",
            format!("{s}: emulated compute has no optimizer state to shard; use 1 or real compute"),
        ));
    }
    if !(1..=2).contains(&p.zero_stage) {
        return Err(Error::invalid(
            "parallelism.zero_stage",
            format!(
                "{}: 1 shards the optimizer state, 2 also the summed gradients",
                p.zero_stage
            ),
        ));
    }
    if s > 1 && p.zero_stage == 2 && spec.model.tie_embeddings {
        return Err(Error::invalid(
            "parallelism.zero_stage",
            "2 shards the summed gradients, which a tied embedding table sums whole: use \
             zero_stage = 1 with model.tie_embeddings",
        ));
    }
    Ok(())
}

fn model_field(field: &'static str) -> &'static str {
    match field {
        "vocab" => "model.vocab",
        "hidden" => "model.hidden",
        "heads" => "model.heads",
        "layers" => "model.layers",
        "seq_len" => "model.seq_len",
        "dtype" => "model.dtype",
        "family" => "model.family",
        "kv_heads" => "model.kv_heads",
        "intermediate" => "model.intermediate",
        "rope_theta" => "model.rope_theta",
        "norm_eps" => "model.norm_eps",
        "tie_embeddings" => "model.tie_embeddings",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Compute, example};

    fn field_of(spec: &JobSpec) -> &'static str {
        match spec.validate() {
            Err(Error::InvalidArgument { field, .. }) => field,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
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

    /// A Llama whose head is its embedding table trains (its two copies' gradients are
    /// summed every step); the GPT family has no tied head, refused naming the field.
    #[test]
    fn a_tied_llama_trains_and_a_tied_gpt_is_refused() {
        let mut spec = example(2, "1f1b");
        spec.model.tie_embeddings = true;
        assert_eq!(field_of(&spec), "model.tie_embeddings");
        spec.model.family = crate::model::Family::Llama;
        assert!(spec.validate().is_ok(), "{:?}", spec.validate().err());
    }

    /// A vocabulary under 256 is refused only where text is read a byte a token.
    #[test]
    fn a_small_vocab_needs_a_tokenizer_or_token_ids() {
        let mut spec = example(2, "1f1b");
        spec.model.vocab = 100;
        assert_eq!(field_of(&spec), "model.vocab");
        spec.data.tokenizer = Some("tokenizer.json".into());
        assert!(spec.validate().is_ok());
        spec.data.tokenizer = None;
        spec.data.path = Some("train.bin".into());
        spec.data.token_bytes = 4;
        assert!(spec.validate().is_ok());
        spec.data.path = None;
        spec.data.token_bytes = 2;
        spec.compute = Compute::emulate(1.0, 1.0, 1.0);
        assert!(spec.validate().is_ok());
    }

    /// A shard degree whose copies the batch does not split into is named beside the batch.
    #[test]
    fn a_shard_degree_the_batch_does_not_split_into_names_both() {
        let mut spec = example(2, "1f1b");
        spec.parallelism.data_parallel_shard_degree = 3;
        match spec.validate() {
            Err(Error::InvalidArgument { field, reason }) => {
                assert_eq!(field, "training.global_batch_size");
                assert!(reason.contains("3 replicas"), "{reason}");
                assert!(reason.contains("data_parallel_shard_degree"), "{reason}");
            }
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
        spec.parallelism.data_parallel_shard_degree = 2;
        assert!(spec.validate().is_ok(), "{:?}", spec.validate().err());
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
            ("parallelism.data_parallel_replicate_degree", |s| {
                s.parallelism.data_parallel_replicate_degree = 0
            }),
            ("parallelism.data_parallel_replicate_degree", |s| {
                s.parallelism.data_parallel_replicate_degree = u32::MAX
            }),
            ("parallelism.data_parallel_shard_degree", |s| {
                s.parallelism.data_parallel_shard_degree = 0
            }),
            ("parallelism.data_parallel_shard_degree", |s| {
                s.parallelism.data_parallel_replicate_degree = 64;
                s.parallelism.data_parallel_shard_degree = 64;
            }),
            ("parallelism.data_parallel_shard_degree", |s| {
                s.parallelism.data_parallel_shard_degree = 2;
                s.compute = Compute::emulate(1.0, 1.0, 1.0);
            }),
            ("parallelism.zero_stage", |s| s.parallelism.zero_stage = 3),
            ("parallelism.zero_stage", |s| {
                s.parallelism.data_parallel_shard_degree = 2;
                s.parallelism.zero_stage = 2;
                s.model.family = crate::model::Family::Llama;
                s.model.tie_embeddings = true;
            }),
            // 8 sequences in microbatches of 1 do not split into 2 × 3 copies.
            ("training.global_batch_size", |s| {
                s.parallelism.data_parallel_replicate_degree = 2;
                s.parallelism.data_parallel_shard_degree = 3;
            }),
            // Auto plans replicas too, on a batch that splits into them.
            ("training.global_batch_size", |s| {
                s.parallelism.pipeline_parallel_schedule = AUTO_SCHEDULE.into();
                s.parallelism.data_parallel_replicate_degree = 3;
            }),
            // 8 sequences in microbatches of 1 do not split into 3 replicas.
            ("training.global_batch_size", |s| {
                s.parallelism.data_parallel_replicate_degree = 3
            }),
            ("parallelism.memory_limit", |s| {
                s.parallelism.memory_limit = Some(2.0)
            }),
            ("parallelism.memory_limit", |s| {
                s.parallelism.pipeline_parallel_schedule = "adaptive-v".into();
                s.parallelism.memory_limit = Some(0.25);
            }),
            ("parallelism.auto_trial_band", |s| {
                s.parallelism.auto_trial_band = 1.5
            }),
            ("parallelism.auto_trial_band", |s| {
                s.parallelism.auto_trial_band = f64::NAN
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
            ("data.path", |s| {
                s.data.path = Some("x".repeat(MAX_PATH_BYTES + 1))
            }),
            ("data.tokenizer", |s| s.data.tokenizer = Some(" ".into())),
            ("data.tokenizer", |s| {
                s.data.tokenizer = Some("tok\0.json".into())
            }),
            ("data.token_bytes", |s| {
                s.data.path = Some("train.bin".into());
                s.data.token_bytes = 3;
            }),
            ("data.token_bytes", |s| {
                s.data.path = Some("corpus.txt".into());
                s.data.token_bytes = 4;
            }),
            ("model.vocab", |s| s.model.vocab = 100),
            ("checkpoint.folder", |s| s.checkpoint.folder = "a\0b".into()),
            ("job.name", |s| s.job.name = "n".repeat(MAX_NAME_BYTES + 1)),
            ("job.name", |s| s.job.name = "line\nbreak".into()),
            ("job.description", |s| {
                s.job.description = "d".repeat(MAX_DESCRIPTION_BYTES + 1)
            }),
            ("parallelism.pipeline_parallel_schedule", |s| {
                s.parallelism.pipeline_parallel_schedule = "v".repeat(1 << 20)
            }),
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
}
