//! Job files: the seeds (the repository's job files and a small job of every schedule),
//! their mutants, and the properties of the TOML → plan path.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::Duration;

use arbitrary::{Result, Unstructured};
use pipewise_common::Error;
use pipewise_common::cancel::cancellable;
use pipewise_common::generate::ScheduleKind;
use pipewise_common::job::{ComputeMode, JobPlan, JobSpec, example, plan_job};
use pipewise_common::model::DType;
use pipewise_common::validate::validate;

use crate::engine::Verdict;
use crate::mutate;

/// The job files in the repository.
const REPO_JOBS: [&str; 2] = [
    include_str!("../../deploy/job.toml"),
    include_str!("../../bench/job.toml"),
];

/// The sections of a job file: every field an error names is `section.key`.
const SECTIONS: [&str; 8] = [
    "job",
    "model",
    "training",
    "optimizer",
    "parallelism",
    "checkpoint",
    "data",
    "compute",
];

/// The valid jobs mutants start from: the repository's files (the deploy example with its
/// commented layer split too) and a small job of every schedule on 1 to 4 workers.
pub fn seeds() -> &'static [JobSpec] {
    static SEEDS: OnceLock<Vec<JobSpec>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let mut texts: Vec<String> = REPO_JOBS.iter().map(|t| t.to_string()).collect();
        texts.push(REPO_JOBS[0].replace("# pipeline_parallel_", "pipeline_parallel_"));
        let mut seeds: Vec<JobSpec> = texts
            .iter()
            .filter_map(|t| JobSpec::from_toml(t).ok())
            .collect();
        for kind in ScheduleKind::ALL {
            for workers in 1..=4 {
                let spec = example(workers, kind.name());
                if plan_job(&spec).is_ok() {
                    seeds.push(spec);
                }
            }
        }
        seeds
    })
}

/// Words a text mutation inserts: the keys and section headers of the seeds, schedule
/// names, dtypes, compute modes, TOML literals.
fn words() -> &'static [String] {
    static WORDS: OnceLock<Vec<String>> = OnceLock::new();
    WORDS.get_or_init(|| {
        let mut words: Vec<String> = seeds()
            .iter()
            .filter_map(|s| s.to_toml().ok())
            .flat_map(|t| {
                t.lines()
                    .filter_map(|l| l.split('=').next())
                    .map(|k| k.trim().to_string())
                    .collect::<Vec<_>>()
            })
            .filter(|w| !w.is_empty())
            .collect();
        words.extend(ScheduleKind::ALL.map(|k| format!("\"{}\"", k.name())));
        for w in [
            "\"f32\"",
            "\"bf16\"",
            "\"f16\"",
            "\"emulate\"",
            "\"real\"",
            "true",
            "false",
            "inf",
            "-inf",
            "nan",
            "[]",
            "{}",
            "[[job]]",
            "1979-05-27",
            "0x10",
            "1_000",
            "'''",
            "\"\"\"",
        ] {
            words.push(w.to_string());
        }
        words.sort();
        words.dedup();
        words
    })
}

/// A size: mostly small (so planning is reached), sometimes a boundary number.
fn size(u: &mut Unstructured<'_>) -> Result<u32> {
    Ok(match u.int_in_range(0..=4)? {
        0..=2 => u.int_in_range(0..=40)?,
        3 => 1 << u.int_in_range(0..=16)?,
        _ => mutate::number_u32(u)?,
    })
}

/// A seed with a few fields set to new values.
pub fn mutant_spec(u: &mut Unstructured<'_>) -> Result<JobSpec> {
    let mut spec = u.choose(seeds())?.clone();
    for _ in 0..u.int_in_range(0..=4)? {
        let (m, t, o, p) = (
            &mut spec.model,
            &mut spec.training,
            &mut spec.optimizer,
            &mut spec.parallelism,
        );
        match u.int_in_range(0..=28)? {
            0 => spec.job.name = mutate::token(u, &[])?,
            1 => m.vocab = size(u)?,
            2 => m.hidden = size(u)?,
            3 => m.heads = size(u)?,
            4 => m.layers = size(u)?,
            5 => m.seq_len = size(u)?,
            6 => m.dtype = *u.choose(&[DType::F32, DType::BF16, DType::F16])?,
            7 => t.global_batch_size = size(u)?,
            8 => t.steps = size(u)?,
            9 => t.seed = mutate::number_u64(u)?,
            10 => t.max_norm = mutate::number_f64(u)?,
            11 => o.lr = mutate::number_f64(u)?,
            12 => o.weight_decay = mutate::number_f64(u)?,
            13 => o.beta1 = mutate::number_f64(u)?,
            14 => o.beta2 = mutate::number_f64(u)?,
            15 => o.eps = mutate::number_f64(u)?,
            16 => p.pipeline_parallel_degree = size(u)?,
            17 => {
                p.pipeline_parallel_schedule = match u.int_in_range(0..=5)? {
                    0 => mutate::token(u, &[])?,
                    _ => u.choose(&ScheduleKind::ALL)?.name().to_string(),
                }
            }
            18 => p.pipeline_parallel_microbatch_size = size(u)?,
            19 => p.pipeline_parallel_chunks = size(u)?,
            20 => p.memory_limit = mutate::maybe(u, mutate::number_f64)?,
            21 => p.pipeline_parallel_first_stage_less_layers = size(u)?,
            22 => p.pipeline_parallel_last_stage_less_layers = size(u)?,
            23 => p.pipeline_parallel_layers_per_stage = mutate::maybe(u, size)?,
            24 => {
                let c = &mut spec.checkpoint;
                c.enable_checkpoint = u.arbitrary()?;
                c.interval = size(u)?;
                c.keep_latest_k = size(u)?;
                c.folder = mutate::token(u, &["checkpoints", "../escape", "/abs", "a/b"])?;
            }
            25 => spec.data.path = mutate::maybe(u, |u| mutate::token(u, &["data.txt"]))?,
            26 => spec.compute.mode = *u.choose(&[ComputeMode::Real, ComputeMode::Emulate])?,
            27 => spec.compute.f_ms = mutate::number_f64(u)?,
            _ => {
                spec.compute.b_ms = mutate::number_f64(u)?;
                spec.compute.w_ms = mutate::number_f64(u)?;
            }
        }
    }
    Ok(spec)
}

/// A job file: a [`mutant_spec`] as TOML, half the time with its text edited too.
pub fn mutant_text(u: &mut Unstructured<'_>) -> Result<String> {
    let spec = mutant_spec(u)?;
    let text = spec.to_toml().unwrap_or_default();
    if u.arbitrary()? {
        let words: Vec<&str> = words().iter().map(String::as_str).collect();
        mutate::text(u, &text, &words, 4)
    } else {
        Ok(text)
    }
}

/// How long a plan may take before the harness cancels it, as the coordinator's planner
/// does when the client goes away: plans of shapes near the limits take minutes in a debug
/// build. A planner that does not stop soon after is caught by the hang watch.
pub const PLAN_DEADLINE: Duration = Duration::from_secs(5);

/// `plan_job` on `spec`, cancelled (`Error::Cancelled`) after `deadline`.
fn plan_within(spec: &JobSpec, deadline: Duration) -> pipewise_common::Result<JobPlan> {
    let flag = Arc::new(AtomicBool::new(false));
    let (done, wait) = mpsc::channel::<()>();
    let raise = Arc::clone(&flag);
    let timer = thread::spawn(move || {
        if wait.recv_timeout(deadline) == Err(RecvTimeoutError::Timeout) {
            raise.store(true, Ordering::Relaxed);
        }
    });
    let plan = cancellable(flag, || plan_job(spec));
    drop(done);
    let _ = timer.join();
    plan
}

/// Whether `field` is a job file's `section.key`.
pub fn names_a_field(field: &str) -> bool {
    field
        .split_once('.')
        .is_some_and(|(section, key)| SECTIONS.contains(&section) && !key.is_empty())
}

/// The TOML → plan path on `text`: a refusal is `InvalidArgument` on `toml` (a syntax
/// error, an unknown key or a wrong type) or on a `section.key`; see [`check_spec`].
pub fn check_text(text: &str) -> Verdict {
    match JobSpec::from_toml(text) {
        Ok(spec) => check_spec(&spec),
        Err(Error::InvalidArgument {
            field: "toml",
            reason,
        }) if !reason.trim().is_empty() => Ok("refused toml".into()),
        Err(other) => {
            Err(format!("parsing refused with an error naming no field: {other:?}").into())
        }
    }
}

/// `plan_job` on `spec`: a refusal names a `section.key` and says why; a plan is a valid
/// schedule of the job's workers and microbatches, whose stages split the model and whose
/// spec round-trips through TOML.
pub fn check_spec(spec: &JobSpec) -> Verdict {
    let plan = match plan_within(spec, PLAN_DEADLINE) {
        Ok(plan) => plan,
        Err(Error::Cancelled) => {
            return Ok(format!(
                "planning cancelled after {PLAN_DEADLINE:?} (a large shape)"
            ));
        }
        Err(Error::InvalidArgument { field, reason }) => {
            return if names_a_field(field) && !reason.trim().is_empty() {
                Ok(format!("refused {field}"))
            } else {
                Err(format!("refused naming no job field: {field:?}: {reason:?}").into())
            };
        }
        Err(other) => {
            return Err(format!("refused with an error naming no field: {other:?}").into());
        }
    };
    let schedule = &plan.schedule;
    if let Err(e) = validate(schedule) {
        return Err(format!("the planned schedule is invalid: {e}").into());
    }
    if schedule.num_workers() != spec.parallelism.pipeline_parallel_degree
        || plan.microbatches != spec.pipeline_microbatches()
        || schedule.microbatches != plan.microbatches
    {
        return Err(format!(
            "planned {} workers × {} microbatches for a job of {} × {}",
            schedule.num_workers(),
            plan.microbatches,
            spec.parallelism.pipeline_parallel_degree,
            spec.pipeline_microbatches()
        )
        .into());
    }
    let stages = schedule.placement.stages();
    let ranges = spec
        .stage_ranges(&schedule.placement)
        .map_err(|e| format!("a planned job's {stages} stages do not split the model: {e}"))?;
    let pieces = spec.model.layers as usize + 2;
    let contiguous = ranges
        .first()
        .is_some_and(|r| r.start == 0 && !r.is_empty())
        && ranges
            .windows(2)
            .all(|w| w[0].end == w[1].start && !w[1].is_empty())
        && ranges.last().is_some_and(|r| r.end == pieces);
    if ranges.len() != stages as usize || !contiguous {
        return Err(format!(
            "stage ranges {ranges:?} do not cover {pieces} pieces in {stages} stages"
        )
        .into());
    }
    match plan.predicted_peak_bytes(spec) {
        Ok(_) => {}
        Err(Error::InvalidArgument { field, .. }) if names_a_field(field) => {}
        Err(e) => {
            return Err(format!("a planned job's memory prediction fails unnamed: {e:?}").into());
        }
    }
    let text = spec
        .to_toml()
        .map_err(|e| format!("a planned job has no TOML form: {e}"))?;
    match JobSpec::from_toml(&text) {
        Ok(back) if back == *spec => Ok(format!("planned {}", plan.kind)),
        other => {
            Err(format!("a planned job does not round-trip through TOML: {other:?}\n{text}").into())
        }
    }
}
