//! Fuzz target: job files' path fields and name (`checkpoint.folder`, `data.path`,
//! `job.name`) submitted to a real coordinator over gRPC on loopback (`start_cluster` on a
//! data directory of its own, no workers), through its submit checks (`check_paths`, the
//! planner) and, for a job it takes, its run start (`create_output_dir`, the run actor).
//! Inputs: the seeds of `job_toml` with checkpoints on or off and the three fields drawn
//! from parts that paths trip on (`.`, `..`, empty, `/`, the store file `jobs.redb`, a
//! plain file, a link leaving the data directory, a dangling link, absolute paths inside
//! and outside, parts of 255, 256 and 300 bytes, paths past 1024 and 4096 bytes, control
//! characters, `\`, `~`, unicode), joined with `/` and edited as text; the name sometimes
//! given as the request's override.
//!
//! Properties: every call is answered (no hang, no panic on any thread); a refusal is
//! `InvalidArgument` naming a job field (`section.key`) or `toml`; a job taken reaches its
//! run start (`running`), or fails naming a field and not a panic; its output folder and
//! its data lead under the data directory, symlinks followed; nothing appears beside the
//! data directory; the coordinator answers `ListJobs` after every case (no actor died).
//! The started job is cancelled, so the next case's job heads the queue.
//!
//! A second test submits the fixed cases of issue 53: `checkpoint.folder` of a 300-byte
//! part or the store's file, and `data.path = "."`, each refused at submit naming the field.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pipewise_common::job::{JobSpec, example, job_dir};
use pipewise_coordinator::{Coordinator, Unfinished};
use pipewise_fuzz::arbitrary::{Result, Unstructured};
use pipewise_fuzz::{Error, Verdict, engine, job, mutate, run};
use pipewise_proto::v1 as pb;
use pipewise_proto::v1::job_service_client::JobServiceClient;
use tonic::Code;
use tonic::transport::Channel;

/// Cases `cargo test` runs (a few seconds in a debug build, the same cases every run); longer
/// runs set `PIPEWISE_FUZZ_SECS` or `PIPEWISE_FUZZ_CASES` (docs/fuzzing.md).
const CASES: u64 = 100;

/// A call not answered within this is a hang; so is a job not started (or not ended after
/// its cancel) within it.
const ANSWER: Duration = Duration::from_secs(10);

/// How often a job's state is asked for while waiting for it to change.
const POLL: Duration = Duration::from_millis(5);

/// The coordinator's store file in its data directory.
const STORE_FILE: &str = "jobs.redb";

/// Fixtures in the data directory: what a path may lead into.
const PLAIN_FILE: &str = "plain-file";
const DIR: &str = "dir";
const CORPUS: &str = "corpus.txt";
/// A link to a directory outside the data directory.
const OUT_LINK: &str = "out-link";
/// A link to nothing.
const DANGLING: &str = "dangling";
/// A link to a directory inside (allowed).
const IN_LINK: &str = "in-link";
/// A link to the store file.
const STORE_LINK: &str = "store-link";

/// A coordinator on a data directory of its own, with the fixtures beside it.
struct Cluster {
    runtime: tokio::runtime::Runtime,
    client: JobServiceClient<Channel>,
    /// `base/data`, the coordinator's data directory; `base/outside` is beside it.
    base: PathBuf,
    data: PathBuf,
    outside: PathBuf,
    /// The data directory with its links followed.
    real_data: PathBuf,
    /// Path parts the generator joins (fixtures, absolute paths and odd text).
    parts: Vec<String>,
    coordinator: Option<Coordinator>,
}

fn fixtures(base: &Path) -> std::io::Result<()> {
    let (data, outside) = (base.join("data"), base.join("outside"));
    let _ = std::fs::remove_dir_all(base);
    std::fs::create_dir_all(data.join(DIR))?;
    std::fs::create_dir_all(&outside)?;
    std::fs::write(outside.join("keep.txt"), "outside\n")?;
    std::fs::write(data.join(PLAIN_FILE), "x\n")?;
    std::fs::write(data.join(DIR).join("inner.txt"), "inner\n")?;
    std::fs::write(data.join(CORPUS), "the quick brown fox\n")?;
    std::os::unix::fs::symlink(&outside, data.join(OUT_LINK))?;
    std::os::unix::fs::symlink(base.join("nowhere"), data.join(DANGLING))?;
    std::os::unix::fs::symlink(data.join(DIR), data.join(IN_LINK))?;
    std::os::unix::fs::symlink(data.join(STORE_FILE), data.join(STORE_LINK))
}

impl Cluster {
    /// A coordinator on a fresh data directory named by `tag` (each test has its own, so
    /// one test's jobs never head another's queue).
    fn start(tag: &str) -> Cluster {
        let base = std::env::temp_dir().join(format!("pipewise-fuzz-{tag}-{}", std::process::id()));
        fixtures(&base).expect("the fixtures are written");
        let (data, outside) = (base.join("data"), base.join("outside"));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let listen = "127.0.0.1:0".parse().expect("an address");
        let coordinator = runtime
            .block_on(Coordinator::start_cluster(listen, &data, Unfinished::Fail))
            .expect("the coordinator starts");
        let uri = format!("http://{}", coordinator.addr);
        let client = runtime
            .block_on(JobServiceClient::connect(uri))
            .expect("connects")
            // `ListJobs` grows with every job taken.
            .max_decoding_message_size(usize::MAX);
        let real_data = data.canonicalize().expect("the data directory resolves");
        let mut parts: Vec<String> = [
            ".",
            "..",
            "",
            "/",
            "//",
            "~",
            "\\",
            "a\\b",
            "..\\..",
            " ",
            "...",
            "-",
            "checkpoints",
            "runs",
            "job-1",
            "step-3",
            "final",
            STORE_FILE,
            PLAIN_FILE,
            DIR,
            CORPUS,
            OUT_LINK,
            DANGLING,
            IN_LINK,
            STORE_LINK,
            "é",
            "💥",
            "\u{202e}",
            "\u{feff}",
            "\0",
            "\n",
            "\t",
            "\r",
            "\u{1b}[2J",
            "\u{7f}",
            "\u{85}",
            "\u{2028}",
        ]
        .map(String::from)
        .to_vec();
        for n in [255, 256, 300] {
            parts.push("b".repeat(n));
        }
        parts.push("a/".repeat(520));
        parts.push("c".repeat(4100));
        for at in [&data, &real_data, &outside, &base] {
            parts.push(at.display().to_string());
        }
        // A sibling sharing the data directory's name as a prefix.
        parts.push(format!("{}2", data.display()));
        parts.push("../outside".into());
        Cluster {
            runtime,
            client,
            base,
            data,
            outside,
            real_data,
            parts,
            coordinator: Some(coordinator),
        }
    }

    /// Stops the coordinator and removes its folder.
    fn stop(mut self) {
        if let Some(coordinator) = self.coordinator.take() {
            self.runtime.block_on(coordinator.shutdown());
        }
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

/// A path: one to four parts joined with `/`, sometimes with a trailing `/`, sometimes
/// edited as text.
fn path(u: &mut Unstructured<'_>, parts: &[String]) -> Result<String> {
    let mut chosen = Vec::new();
    for _ in 0..u.int_in_range(1..=4)? {
        chosen.push(u.choose(parts)?.as_str());
    }
    let mut path = chosen.join("/");
    if u.int_in_range(0..=5)? == 0 {
        path.push('/');
    }
    if u.int_in_range(0..=3)? == 0 {
        path = mutate::text(u, &path, &chosen, 3)?;
    }
    Ok(path)
}

/// A job name: a path's parts, a plain name, or odd text.
fn name(u: &mut Unstructured<'_>, parts: &[String]) -> Result<String> {
    Ok(match u.int_in_range(0..=3)? {
        0 => "fuzz".into(),
        1 => mutate::token(u, &[])?,
        _ => path(u, parts)?,
    })
}

/// A submitted job: its spec and the request's name override.
#[derive(Debug)]
struct Case {
    spec: JobSpec,
    name: Option<String>,
}

fn case(u: &mut Unstructured<'_>, c: &Cluster) -> Result<Case> {
    let mut spec = u.choose(job::seeds())?.clone();
    spec.checkpoint.enable_checkpoint = u.arbitrary()?;
    if u.int_in_range(0..=3)? > 0 {
        spec.checkpoint.folder = path(u, &c.parts)?;
    }
    match u.int_in_range(0..=3)? {
        0 => spec.data.path = None,
        1 => {}
        _ => spec.data.path = Some(path(u, &c.parts)?),
    }
    let mut name = None;
    match u.int_in_range(0..=3)? {
        0 => spec.job.name = self::name(u, &c.parts)?,
        1 => name = Some(self::name(u, &c.parts)?),
        _ => {}
    }
    Ok(Case { spec, name })
}

/// `call` within [`ANSWER`], or what did not happen.
async fn answered<T>(what: &str, call: impl Future<Output = T>) -> std::result::Result<T, Error> {
    tokio::time::timeout(ANSWER, call)
        .await
        .map_err(|_| Error::from(format!("{what}: no answer in {ANSWER:?}")))
}

/// The field a refusal's message names first (`field: reason`), if it is a job field or
/// `toml`.
fn refused_field(message: &str) -> Option<&str> {
    let (field, reason) = message.split_once(": ")?;
    ((field == "toml" || job::names_a_field(field)) && !reason.trim().is_empty()).then_some(field)
}

/// What a refusal says, in a few words (the report counts the kinds of refusal).
fn why(message: &str) -> &'static str {
    const KINDS: [(&str, &str); 12] = [
        // Before "outside": a link's refusal says both.
        ("through a symlink", "a link out"),
        ("outside the data directory", "outside"),
        ("`..`", "a `..` part"),
        ("a part of", "a part over 255 bytes"),
        ("allowed", "too long"),
        ("control character", "a control character"),
        ("empty", "empty"),
        ("leads nowhere", "a dangling link"),
        ("job store", "the store file"),
        ("is a file", "under a file"),
        ("is a directory", "a directory"),
        ("not a path inside", "not inside"),
    ];
    KINDS
        .iter()
        .find(|(says, _)| message.contains(says))
        .map_or("other", |(_, kind)| kind)
}

/// The first job field a failed job's error names.
fn failed_field(error: &str) -> Option<&str> {
    error
        .split(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_' || ch == '.'))
        .find(|word| job::names_a_field(word))
}

/// The job's status once `done` holds for it, within [`ANSWER`].
async fn until(
    client: &mut JobServiceClient<Channel>,
    id: u64,
    done: impl Fn(pb::JobState) -> bool,
) -> std::result::Result<pb::JobStatus, Error> {
    let deadline = tokio::time::Instant::now() + ANSWER;
    loop {
        let status = answered("GetJob", client.get_job(pb::JobId { id }))
            .await?
            .map_err(|s| format!("GetJob of job {id}: {s:?}"))?
            .into_inner();
        if done(status.state()) {
            return Ok(status);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("job {id} is still {:?} after {ANSWER:?}", status.state()).into());
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Whether `path` leads under the data directory once its links are followed (`true` when
/// nothing is there).
fn inside(c: &Cluster, path: &Path) -> bool {
    match path.canonicalize() {
        Ok(real) => real.starts_with(&c.real_data),
        Err(_) => path.symlink_metadata().is_err(),
    }
}

/// What is beside the data directory: only it and `outside`, which holds its one file.
fn nothing_escaped(c: &Cluster) -> std::result::Result<(), Error> {
    let names = |dir: &Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    };
    let (beside, out) = (names(&c.base), names(&c.outside));
    if beside != ["data", "outside"] || out != ["keep.txt"] {
        return Err(format!(
            "something was created outside the data directory: {beside:?}, outside/{out:?}"
        )
        .into());
    }
    Ok(())
}

/// Where job `id` of `spec` writes and reads must lead under the data directory.
fn confined(c: &Cluster, spec: &JobSpec, id: u64) -> std::result::Result<&'static str, Error> {
    let folder = spec
        .checkpoint_folder_in(&c.data)
        .map_err(|e| format!("a job taken has a folder refused: {e}"))?;
    let output = job_dir(&folder, id);
    if !output.is_dir() || !inside(c, &output) {
        return Err(format!(
            "job {id}'s output {} is not a directory under the data directory",
            output.display()
        )
        .into());
    }
    let data = spec
        .data_path_in(&c.data)
        .map_err(|e| format!("a job taken has its data path refused: {e}"))?;
    let Some(data) = data else {
        return Ok("started");
    };
    if !inside(c, &data) {
        return Err(format!("job {id}'s data {} leads outside", data.display()).into());
    }
    // A folder of documents may be data, but not the data directory itself nor one the
    // job's own folder is made in (both refused at submit).
    if data.is_dir() && (data == c.data || folder.starts_with(&data)) {
        return Err(format!(
            "job {id}'s data {} is the data directory or holds the job's folder",
            data.display()
        )
        .into());
    }
    Ok("started")
}

/// A failed job's outcome: its error names a field and no panic.
fn failure(id: u64, error: &str) -> Verdict {
    match failed_field(error) {
        Some(_) if error.contains("panicked") => Err(format!("job {id} failed: {error}").into()),
        Some(field) => Ok(format!("failed at start naming {field}")),
        None => Err(format!("job {id} failed naming no field: {error}").into()),
    }
}

fn check(c: &Cluster, case: Case) -> Verdict {
    let toml = case
        .spec
        .to_toml()
        .map_err(|e| format!("a job has no TOML form: {e}"))?;
    let request = pb::JobSpec {
        toml,
        name: case.name,
        ..Default::default()
    };
    let spec = case.spec;
    let mut client = c.client.clone();
    c.runtime.block_on(async {
        let id = match answered("SubmitJob", client.submit_job(request)).await? {
            Ok(job) => job.into_inner().id,
            Err(status) if status.code() == Code::InvalidArgument => {
                return match refused_field(status.message()) {
                    Some(field) => Ok(format!("refused {field}: {}", why(status.message()))),
                    None => Err(format!("refused naming no field: {status:?}").into()),
                };
            }
            Err(status) => return Err(format!("refused with {status:?}").into()),
        };
        until(&mut client, id, |s| s != pb::JobState::Queued).await?;
        // Asked again: a start that failed has its failure in the job manager's mailbox
        // before this call, so this answer is the start's outcome.
        let started = until(&mut client, id, |_| true).await?;
        let outcome = match started.state() {
            pb::JobState::Running => confined(c, &spec, id)?.to_string(),
            pb::JobState::Failed => return failure(id, &started.error),
            other => return Err(format!("job {id} went {other:?} by itself").into()),
        };
        answered("CancelJob", client.cancel_job(pb::JobId { id }))
            .await?
            .map_err(|s| format!("CancelJob of job {id}: {s:?}"))?;
        let ended = until(&mut client, id, |s| {
            !matches!(s, pb::JobState::Queued | pb::JobState::Running)
        })
        .await?;
        match ended.state() {
            pb::JobState::Cancelled => Ok(outcome),
            pb::JobState::Failed => failure(id, &ended.error).map(|f| format!("{outcome}, {f}")),
            other => Err(format!("job {id} cancelled ended {other:?}").into()),
        }
    })
}

/// The coordinator still answers: no actor died.
fn alive(c: &Cluster) -> std::result::Result<(), Error> {
    let mut client = c.client.clone();
    c.runtime
        .block_on(answered("ListJobs", client.list_jobs(pb::Empty {})))?
        .map_err(|s| format!("ListJobs after the case: {s:?}"))?;
    Ok(())
}

#[test]
fn job_paths_are_confined_or_refused_by_field() {
    let c = Cluster::start("job-paths");
    let report = run("job_paths", CASES, |u| {
        let case = case(u, &c).map_err(|e| format!("generator: {e}"))?;
        engine::show(&(
            &case.spec.checkpoint.folder,
            case.spec.checkpoint.enable_checkpoint,
            &case.spec.data.path,
            &case.spec.job.name,
            &case.name,
        ));
        let outcome = check(&c, case)?;
        alive(&c)?;
        nothing_escaped(&c)?;
        Ok(outcome)
    });
    assert!(report.cases > 0);
    c.stop();
}

/// The three paths of issue 53, each refused at submit naming its field.
#[test]
fn fixed_paths_are_refused_at_submit_naming_the_field() {
    let c = Cluster::start("fixed-paths");
    type Edit = fn(&mut JobSpec);
    let cases: [(&str, Edit, &str); 3] = [
        (
            "checkpoint.folder",
            |s| s.checkpoint.folder = "b".repeat(300),
            "a part of 300 bytes",
        ),
        (
            "checkpoint.folder",
            |s| s.checkpoint.folder = STORE_FILE.into(),
            "job store",
        ),
        (
            "data.path",
            |s| s.data.path = Some(".".into()),
            "is a directory",
        ),
    ];
    for (field, edit, says) in cases {
        for checkpointing in [false, true] {
            let mut spec = example(2, "1f1b");
            spec.checkpoint.enable_checkpoint = checkpointing;
            edit(&mut spec);
            let request = pb::JobSpec {
                toml: spec.to_toml().expect("a TOML form"),
                ..Default::default()
            };
            let mut client = c.client.clone();
            let status = c
                .runtime
                .block_on(answered("SubmitJob", client.submit_job(request)))
                .expect("answered")
                .expect_err("refused");
            eprintln!(
                "fixed case {field} (checkpoints {checkpointing}): {:?}: {}",
                status.code(),
                status.message()
            );
            assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
            assert_eq!(refused_field(status.message()), Some(field), "{status:?}");
            assert!(status.message().contains(says), "{field}: {status:?}");
        }
    }
    alive(&c).expect("the coordinator answers");
    nothing_escaped(&c).expect("nothing beside the data directory");
    c.stop();
}
