//! `pipewise local JOB.toml`: the job a file describes, as `submit` sends it, with the flags
//! given on the command line over its fields (a flag left at its default changes nothing).
//! Without a file, the job the flags describe.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use pipewise_common::job::{AUTO_RECOMPUTE, ActivationCheckpoint, Compute, JobSpec, example};
use pipewise_common::model::{Family, ModelSpec};
use pipewise_common::schedule::Recompute;

use super::{ComputeArg, LocalArgs, ModelArg};
use crate::text_file::read_text;

/// The largest job file read (as `submit` takes).
const MAX_JOB_FILE: u64 = (4 << 20) - (64 << 10);

/// The job `args` describe; `given(id)` says whether the flag of field `id` of
/// [`LocalArgs`] was given on the command line.
pub(crate) fn local_job(args: &LocalArgs, given: &dyn Fn(&str) -> bool) -> Result<JobSpec> {
    let Some(file) = &args.job else {
        let mut spec = flags_job(args);
        local_model(&mut spec)?;
        return Ok(spec);
    };
    let toml = read_text(file, MAX_JOB_FILE)?;
    let mut spec = JobSpec::from_toml(&toml)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("job file {}", file.display()))?;
    over(&mut spec, args, given);
    local_model(&mut spec)?;
    Ok(spec)
}

/// A job that starts from a Hugging Face directory on this machine (`--model DIR`, or the
/// job file's `[model] path`, relative to the current directory): its sizes read from the
/// directory's `config.json`, as the coordinator reads them at submit.
fn local_model(spec: &mut JobSpec) -> Result<()> {
    let Some(dir) = spec.model.path.clone() else {
        return Ok(());
    };
    let file = PathBuf::from(&dir).join("config.json");
    let shown = file.display().to_string();
    let text = read_text(&file, MAX_JOB_FILE).with_context(|| format!("model {dir}"))?;
    let m = &spec.model;
    let from = pipewise_common::model::hf::spec_from_config(&shown, &text, m.seq_len, m.dtype)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    spec.model = pipewise_common::model::hf::completed(m, &from, &shown)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

/// The job the flags alone describe: the example job with every flag over it, a microbatch
/// size searched (from 1) unless one is given, and under emulated compute at least one
/// layer for every stage of a V or interleaved placement (up to 4 per worker), since
/// emulated passes cost nothing to hold.
fn flags_job(args: &LocalArgs) -> JobSpec {
    let mut spec = example(args.workers, &args.schedule);
    spec.job.name = format!("local-{}-{}w", args.schedule, args.workers);
    over(&mut spec, args, &|_| true);
    spec.parallelism.search_microbatch_size = args.microbatch_size.is_none();
    spec.data.path = args.data.as_ref().map(|p| p.display().to_string());
    if spec.compute.is_emulated() {
        spec.model.layers = spec.model.layers.max(4 * args.workers);
    }
    spec
}

/// Sets `spec`'s fields from the flags of `args` that `given` says were given.
fn over(spec: &mut JobSpec, args: &LocalArgs, given: &dyn Fn(&str) -> bool) {
    let p = &mut spec.parallelism;
    if given("workers") {
        p.pipeline_parallel_degree = args.workers;
    }
    if given("replicas") {
        p.data_parallel_replicate_degree = args.replicas;
    }
    if given("schedule") {
        p.pipeline_parallel_schedule = args.schedule.clone();
    }
    if let Some(size) = args.microbatch_size {
        p.pipeline_parallel_microbatch_size = size;
        p.search_microbatch_size = false;
    }
    if given("model") {
        let m = &mut spec.model;
        let preset = |hidden, layers, seq_len| ModelSpec {
            hidden,
            layers,
            seq_len,
            dtype: m.dtype,
            ..ModelSpec::default()
        };
        *m = match &args.model {
            ModelArg::Tiny => preset(64, 8, 32),
            ModelArg::Small => preset(128, 16, 64),
            // Its sizes come from its config.json ([`local_model`]).
            ModelArg::Dir(dir) => ModelSpec {
                path: Some(dir.display().to_string()),
                seq_len: m.seq_len,
                dtype: m.dtype,
                family: Family::Llama,
                vocab: 0,
                hidden: 0,
                heads: 0,
                layers: 0,
                ..ModelSpec::default()
            },
        };
    }
    if given("dtype") {
        spec.model.dtype = args.dtype;
    }
    if given("steps") {
        spec.training.steps = args.steps;
    }
    if given("global_batch") {
        spec.training.global_batch_size = args.global_batch;
    }
    if given("seed") {
        spec.training.seed = args.seed;
    }
    if given("lr") {
        spec.optimizer.lr = args.lr;
    }
    if let Some(mode) = &args.recompute {
        spec.activation_checkpoint = ActivationCheckpoint {
            mode: mode.clone(),
            per_stage: Vec::new(),
        };
    }
    if given("compute") && args.compute == ComputeArg::Emulate {
        if let [f, b, w] = args.emulate_ms[..] {
            spec.compute = Compute::emulate(f, b, w);
        }
    } else if given("compute") {
        spec.compute = Compute::default();
    }
}

/// Parses `--recompute`: a mode for every stage, or `auto`.
pub(super) fn parse_recompute(text: &str) -> std::result::Result<String, String> {
    if text.trim().eq_ignore_ascii_case(AUTO_RECOMPUTE) {
        return Ok(AUTO_RECOMPUTE.into());
    }
    text.parse::<Recompute>()
        .map(|m| m.name().to_string())
        .map_err(|e| format!("{e}, or auto (with --schedule auto)"))
}

/// Where `[validation] path` is linked (or copied) under the data directory.
const STAGED_VALIDATION: &str = "validation";

/// Links the job file's `[validation] path` (on this machine, relative to the current
/// directory as `[data] path` is) under `data_dir` as `[data] path` is staged, and points
/// the job at it: a job names only paths under the workers' data directory. Returns the
/// link (`None`: no validation file).
pub(crate) fn stage_validation(spec: &mut JobSpec, data_dir: &Path) -> Result<Option<PathBuf>> {
    let Some(v) = spec.validation.as_mut() else {
        return Ok(None);
    };
    let Some(path) = v.path.clone() else {
        return Ok(None);
    };
    let (staged, name) =
        super::stage_data(Path::new(&path), data_dir, STAGED_VALIDATION, "validation")?;
    v.path = Some(name);
    Ok(Some(staged))
}

/// The training text on this machine: `--data`, else the job file's `[data] path` (relative
/// to the current directory, as a path on the command line is), else none (the generated
/// corpus).
pub(crate) fn local_data(args: &LocalArgs, spec: &JobSpec) -> Option<PathBuf> {
    args.data
        .clone()
        .or_else(|| spec.data.path.as_ref().map(PathBuf::from))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;
    use pipewise_common::job::RecomputeRequest;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        local: LocalArgs,
    }

    /// A file's fields stay unless their flag is given; given flags win, defaults do not.
    #[test]
    fn given_flags_override_the_files_fields_and_defaults_do_not() -> Result<()> {
        let dir = std::env::temp_dir().join(format!("pipewise-local-job-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let file = dir.join("job.toml");
        let mut written = pipewise_common::job::example(2, "1f1b");
        written.training.steps = 7;
        written.optimizer.lr = 1e-3;
        written.data.path = Some("corpus.txt".into());
        std::fs::write(&file, written.to_toml()?)?;
        let path = file.display().to_string();
        let parsed = |extra: &[&str]| -> Result<JobSpec> {
            let argv = [&["pipewise", path.as_str()][..], extra].concat();
            let cli = Cli::try_parse_from(&argv)?;
            let matches = <Cli as clap::CommandFactory>::command().try_get_matches_from(&argv)?;
            let given = |id: &str| {
                matches
                    .value_source(id)
                    .is_some_and(|s| s != clap::parser::ValueSource::DefaultValue)
            };
            local_job(&cli.local, &given)
        };
        let spec = parsed(&[])?;
        assert_eq!(spec.training.steps, 7);
        assert_eq!(spec.parallelism.pipeline_parallel_schedule, "1f1b");
        assert_eq!(spec.parallelism.pipeline_parallel_degree, 2);
        assert_eq!(spec.optimizer.lr, 1e-3);
        let spec = parsed(&["--steps", "3", "--schedule", "v-half", "--workers", "4"])?;
        assert_eq!(spec.training.steps, 3);
        assert_eq!(spec.parallelism.pipeline_parallel_schedule, "v-half");
        assert_eq!(spec.parallelism.pipeline_parallel_degree, 4);
        assert_eq!(spec.optimizer.lr, 1e-3);
        assert_eq!(
            spec.activation_checkpoint.request()?,
            RecomputeRequest::Every(Recompute::None)
        );
        let spec = parsed(&["--recompute", "selective"])?;
        assert_eq!(
            spec.activation_checkpoint.request()?,
            RecomputeRequest::Every(Recompute::Selective)
        );
        let spec = parsed(&["--recompute", "auto", "--schedule", "auto"])?;
        assert_eq!(
            spec.activation_checkpoint.request()?,
            RecomputeRequest::WhereNeeded
        );
        assert!(parsed(&["--recompute", "half"]).is_err());
        std::fs::write(&file, "[job]\nname = \"x\"\n[model]\nvocab = 0\n")?;
        let err = format!("{:#}", parsed(&[]).expect_err("a bad file"));
        assert!(err.contains("job.toml"), "{err}");
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }
}
