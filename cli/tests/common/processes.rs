//! Coordinator and worker processes for the end-to-end tests: a `pipewise coordinator` and
//! `pipewise worker` processes on loopback (killed on drop), jobs submitted with `pipewise
//! submit`, what `status` and `watch` print, and the single-device reference trainer every
//! run must equal.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use pipewise_common::job::{JobSpec, example, layout};
use pipewise_worker::job::{corpus_of, optimizer_of, sampler_of};
use pipewise_worker::{Corpus, Sampler, Trainer};

pub(crate) const STEPS: u32 = 20;
pub(crate) const TOLERANCE: f64 = 1e-5;
/// `--metrics-expiry` of the coordinator and of worker `w0`, in seconds.
pub(crate) const EXPIRY_SECS: u64 = 3;

pub(crate) fn pipewise() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pipewise"))
}

/// A coordinator and its workers; killed on drop.
pub(crate) struct Cluster {
    pub(crate) children: Vec<Child>,
    pub(crate) url: String,
    pub(crate) data: PathBuf,
    /// Worker id → activation address.
    pub(crate) workers: HashMap<String, String>,
    /// Metrics ports of the coordinator and of worker `w0`.
    pub(crate) metrics: [u16; 2],
    /// Data directories of workers given their own (`--data-dir`), besides `data`.
    pub(crate) worker_data: Vec<PathBuf>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts `cmd` and returns it with the first line it prints.
pub(crate) fn spawn_with_line(cmd: Command, log: &Path) -> (Child, String) {
    try_spawn_with_line(cmd, log)
        .unwrap_or_else(|| panic!("no start line: an address taken; see {}", log.display()))
}

/// [`spawn_with_line`], or `None` when the process ended without a line because an address
/// it was to listen on was taken meanwhile (a port [`super::free_port`] picked, bound by
/// another test before this process could).
fn try_spawn_with_line(mut cmd: Command, log: &Path) -> Option<(Child, String)> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("starts pipewise");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    if line.is_empty() {
        let _ = child.wait();
        let text = std::fs::read_to_string(log).unwrap_or_default();
        assert!(
            text.contains("Address already in use"),
            "no start line; see {}",
            log.display()
        );
        return None;
    }
    Some((child, line))
}

/// Starts the command `make(port)` builds for a free port, with another port while the one
/// picked turns out taken; the process, its first line and the port.
pub(crate) fn spawn_on_free_port(
    make: impl Fn(u16) -> Command,
    log: &Path,
) -> (Child, String, u16) {
    for _ in 0..5 {
        let port = super::free_port();
        if let Some((child, line)) = try_spawn_with_line(make(port), log) {
            return (child, line, port);
        }
    }
    panic!("no free port held long enough; see {}", log.display())
}

pub(crate) fn start(dir: &Path, workers: usize) -> Cluster {
    start_with(dir, workers, &[])
}

/// [`start`], with extra arguments for worker `w` for every `(w, args)`.
pub(crate) fn start_with(dir: &Path, workers: usize, extra: &[(usize, &[&str])]) -> Cluster {
    std::fs::create_dir_all(dir).unwrap();
    let data = dir.join("data");
    let coordinator = |port: u16| {
        let mut cmd = pipewise();
        cmd.args(["coordinator", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&data)
            .args(["--metrics-listen", &format!("127.0.0.1:{port}")])
            .args(["--metrics-expiry", &EXPIRY_SECS.to_string()]);
        cmd
    };
    let (coord, line, port) = spawn_on_free_port(coordinator, &dir.join("coordinator.log"));
    let metrics = [port, 0];
    // "coordinator listening on ADDR (data in DIR)"
    let addr = line.split_whitespace().nth(3).unwrap().to_string();
    let url = format!("http://{addr}");
    let mut cluster = Cluster {
        children: vec![coord],
        url: url.clone(),
        data,
        workers: HashMap::new(),
        metrics,
        worker_data: Vec::new(),
    };
    for w in 0..workers {
        let mut args: Vec<&str> = Vec::new();
        if let Some((_, extra)) = extra.iter().find(|(i, _)| *i == w) {
            args.extend_from_slice(extra);
        }
        let expiry = EXPIRY_SECS.to_string();
        if w == 0 {
            args.extend(["--metrics-expiry", &expiry]);
            let make = |port: u16| {
                let listen = format!("127.0.0.1:{port}");
                let mut args = args.clone();
                args.extend(["--metrics-listen", listen.as_str()]);
                worker_command(&cluster, "w0", &args)
            };
            let (child, line, port) = spawn_on_free_port(make, &dir.join("w0.log"));
            cluster.metrics[1] = port;
            started(&mut cluster, "w0", child, &line);
            note_data_dir(&mut cluster, &args);
            continue;
        }
        add_worker(&mut cluster, dir, &format!("w{w}"), &args);
    }
    cluster
}

/// Starts worker `id` (with `args`) against the cluster's coordinator.
pub(crate) fn add_worker(cluster: &mut Cluster, dir: &Path, id: &str, args: &[&str]) {
    let cmd = worker_command(cluster, id, args);
    let (child, line) = spawn_with_line(cmd, &dir.join(format!("{id}.log")));
    started(cluster, id, child, &line);
    note_data_dir(cluster, args);
}

/// Records the data directory `args` give a worker, if any.
fn note_data_dir(cluster: &mut Cluster, args: &[&str]) {
    if let Some(at) = args.iter().position(|a| *a == "--data-dir")
        && let Some(path) = args.get(at + 1)
    {
        cluster.worker_data.push(PathBuf::from(path));
    }
}

/// The command of worker `id` (with `args`) of the cluster.
fn worker_command(cluster: &Cluster, id: &str, args: &[&str]) -> Command {
    let mut cmd = pipewise();
    cmd.args([
        "worker",
        "--coordinator",
        &cluster.url,
        "--id",
        id,
        "--timeout",
        "60",
        "--log-format",
        "json",
    ]);
    // The coordinator's data directory unless given another: the tests read checkpoints
    // and parameters there.
    if !args.contains(&"--data-dir") {
        cmd.arg("--data-dir").arg(&cluster.data);
    }
    cmd.args(args);
    cmd
}

/// Worker `id` started as `child`, which printed `line` first.
fn started(cluster: &mut Cluster, id: &str, child: Child, line: &str) {
    cluster.children.push(child);
    // "worker ID serving activations on ADDR, coordinator URL"
    let addr = line
        .split_whitespace()
        .nth(5)
        .unwrap()
        .trim_end_matches(',')
        .to_string();
    cluster.workers.insert(id.to_string(), addr);
}

/// The test model: 14 layers (16 pieces, so 8 workers can hold a V shape), small sizes.
pub(crate) fn spec(workers: u32, schedule: &str, steps: u32) -> JobSpec {
    let mut spec = example(workers, schedule);
    spec.job.name = format!("{schedule}-{workers}w");
    spec.model.hidden = 32;
    spec.model.heads = 2;
    spec.model.layers = 14;
    spec.model.seq_len = 16;
    spec.training.steps = steps;
    spec.optimizer.lr = 3e-3;
    spec
}

pub(crate) fn write_spec(dir: &Path, spec: &JobSpec) -> PathBuf {
    let path = dir.join(format!("{}.toml", spec.job.name));
    std::fs::write(&path, spec.to_toml().unwrap()).unwrap();
    path
}

/// Whether `line` is a training step's line (not `[validation]`'s step 0 line, which has
/// no loss).
pub(crate) fn is_step_line(line: &str) -> bool {
    line.starts_with("step") && line.contains("  loss ")
}

/// `pipewise submit FILE --wait`: the job id and the losses it printed.
pub(crate) fn submit_wait(cluster: &Cluster, file: &Path) -> (u64, Vec<f64>) {
    let stdout = super::succeeds(pipewise().arg("submit").arg(file).args([
        "--coordinator",
        &cluster.url,
        "--wait",
    ]));
    let id = stdout
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap();
    let losses = stdout
        .lines()
        .filter(|l| is_step_line(l))
        .map(|l| l.split_whitespace().nth(3).unwrap().parse().unwrap())
        .collect();
    (id, losses)
}

/// The final parameters of `job`, from every data directory its workers wrote to.
pub(crate) fn final_params(cluster: &Cluster, job: u64) -> HashMap<String, Tensor> {
    let mut all = HashMap::new();
    for data in std::iter::once(&cluster.data).chain(&cluster.worker_data) {
        let dir = layout::final_dir(&layout::job_dir(&data.join("checkpoints"), job));
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let part = candle_core::safetensors::load(entry.unwrap().path(), &Device::Cpu);
            for (name, t) in part.unwrap() {
                assert!(all.insert(name.clone(), t).is_none(), "{name} saved twice");
            }
        }
    }
    all
}

/// The single-device trainer of `spec` on the CPU, with the job's data.
pub(crate) fn single_device(spec: &JobSpec) -> (Trainer, Corpus, Sampler) {
    let trainer = Trainer::new(
        &spec.model,
        spec.training.seed,
        &Device::Cpu,
        optimizer_of(spec),
    )
    .unwrap();
    (trainer, corpus_of(spec).unwrap(), sampler_of(spec))
}

pub(crate) fn reference(spec: &JobSpec) -> Reference {
    let device = Device::Cpu;
    let (mut trainer, corpus, sampler) = single_device(spec);
    let n = spec.microbatches();
    let mut losses = Vec::new();
    for step in 0..u64::from(spec.training.steps) {
        let batches = sampler.step(&corpus, step, n, &device).unwrap();
        losses.push(trainer.train_step(&batches).unwrap().loss);
    }
    let params = trainer
        .stage()
        .params()
        .map(|p| (p.name.clone(), p.value.clone()))
        .collect();
    (losses, params)
}

pub(crate) fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pipewise-cluster-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// `pipewise submit FILE` (no wait): the job id.
pub(crate) fn submit(cluster: &Cluster, file: &Path) -> u64 {
    super::succeeds(
        pipewise()
            .arg("submit")
            .arg(file)
            .args(["--coordinator", &cluster.url]),
    )
    .split_whitespace()
    .nth(1)
    .and_then(|s| s.parse().ok())
    .unwrap()
}

/// `pipewise status JOB`: (state, step, the whole line).
pub(crate) fn status(cluster: &Cluster, job: u64) -> (String, u64, String) {
    let line = super::succeeds(pipewise().args([
        "status",
        &job.to_string(),
        "--coordinator",
        &cluster.url,
    ]))
    .trim()
    .to_string();
    let words: Vec<&str> = line.split_whitespace().collect();
    let state = words[3].to_string();
    let step = words[5].split('/').next().unwrap().parse().unwrap();
    (state, step, line)
}

/// Polls the job's status until `done` holds (panics after `limit`).
pub(crate) fn wait_until(
    cluster: &Cluster,
    job: u64,
    limit: Duration,
    done: impl Fn(&str, u64) -> bool,
) -> String {
    let started = Instant::now();
    loop {
        let (state, step, line) = status(cluster, job);
        if done(&state, step) {
            return line;
        }
        assert!(started.elapsed() < limit, "job {job} stuck: {line}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `pipewise watch JOB` once the job has ended: everything it printed.
pub(crate) fn history(cluster: &Cluster, job: u64) -> String {
    let out = pipewise()
        .args(["watch", &job.to_string(), "--coordinator", &cluster.url])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The `re-planned:` lines of a watch output that contain `what`.
pub(crate) fn replans<'a>(stdout: &'a str, what: &str) -> Vec<&'a str> {
    stdout
        .lines()
        .filter(|l| l.starts_with("re-planned:") && l.contains(what))
        .collect()
}

/// step → the last loss a watch output reports for it (steps run again after a re-plan
/// count once, the later run).
pub(crate) fn last_losses(stdout: &str) -> BTreeMap<u64, f64> {
    let mut losses = BTreeMap::new();
    for l in stdout.lines().filter(|l| is_step_line(l)) {
        let words: Vec<&str> = l.split_whitespace().collect();
        losses.insert(words[1].parse().unwrap(), words[3].parse().unwrap());
    }
    losses
}

/// Asserts that every step's loss and the final parameters of `job` equal the reference
/// (within [`TOLERANCE`]); returns the largest differences.
pub(crate) fn assert_exact(
    cluster: &Cluster,
    job: u64,
    losses: &BTreeMap<u64, f64>,
    reference: &Reference,
) -> (f64, f64) {
    assert_exact_from(cluster, job, 1, losses, reference)
}

/// [`assert_exact`] for the steps from `first` on (a watch after a coordinator restart sees
/// only the steps run since).
pub(crate) fn assert_exact_from(
    cluster: &Cluster,
    job: u64,
    first: u64,
    losses: &BTreeMap<u64, f64>,
    (ref_losses, ref_params): &Reference,
) -> (f64, f64) {
    let steps: Vec<u64> = losses.keys().copied().collect();
    let expected: Vec<u64> = (first..=ref_losses.len() as u64).collect();
    assert_eq!(steps, expected, "{losses:?}");
    let loss_diff = losses
        .iter()
        .map(|(step, a)| (a - ref_losses[*step as usize - 1]).abs())
        .fold(0.0, f64::max);
    let param_diff = super::max_param_diff(ref_params, &final_params(cluster, job));
    assert!(loss_diff <= TOLERANCE, "Δloss {loss_diff}");
    assert!(param_diff <= TOLERANCE, "Δparam {param_diff}");
    (loss_diff, param_diff)
}

/// Whether re-plan `reason` says worker `index` (`id`) `went` ("left the cluster",
/// "stopped heartbeating") and the job was re-planned `onto` ("re-planned onto …"): from
/// its run, or while it waited to start the next one (a drift or straggler move under way
/// on a busy machine).
pub(crate) fn replanned_without(
    reason: &str,
    (index, id): (usize, &str),
    went: &str,
    onto: &str,
) -> bool {
    reason.contains(&format!("worker {index} ({id}) {went}; {onto}"))
        || reason.contains(&format!("worker {id} {went} while the job waited; {onto}"))
}

/// Waits until the job is no longer running; its status line.
pub(crate) fn ended(cluster: &Cluster, job: u64, limit: Duration) -> String {
    wait_until(cluster, job, limit, |s, _| {
        matches!(s, "succeeded" | "failed" | "cancelled")
    })
}

/// `pipewise_replans_total{reason=…}` on the coordinator's metrics.
pub(crate) fn replans_counted(cluster: &Cluster, reason: &str) -> f64 {
    let (_, text) = super::http_get(cluster.metrics[0], "/metrics").unwrap();
    let key = format!("pipewise_replans_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(key.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {text}"))
}

/// The single-device reference of a spec: every step's loss and the final parameters.
pub(crate) type Reference = (Vec<f64>, HashMap<String, Tensor>);

/// Three worker processes running `schedule` for `steps` steps with checkpoints every
/// `interval`, submitted and seen running past step `past`: the directory, cluster, spec,
/// its reference and the job id.
pub(crate) fn running_checkpointed(
    name: &str,
    schedule: &str,
    steps: u32,
    interval: u32,
    past: u64,
) -> (PathBuf, Cluster, JobSpec, Reference, u64) {
    let dir = tempdir(name);
    let cluster = start(&dir, 3);
    let mut spec = spec(3, schedule, steps);
    spec.job.name = name.into();
    spec.checkpoint.enable_checkpoint = true;
    spec.checkpoint.interval = interval;
    // Resumes must work with older checkpoints removed as newer ones complete.
    spec.checkpoint.keep_latest_k = 2;
    let reference = reference(&spec);
    let job = submit(&cluster, &write_spec(&dir, &spec));
    wait_until(&cluster, job, Duration::from_secs(60), |s, step| {
        s == "running" && step >= past
    });
    (dir, cluster, spec, reference, job)
}

/// Starts the cluster's coordinator again on its address and data directory (the earlier
/// process is gone), logging to `log`.
pub(crate) fn restart_coordinator(cluster: &mut Cluster, log: &Path) {
    let mut cmd = pipewise();
    cmd.args([
        "coordinator",
        "--listen",
        cluster.url.trim_start_matches("http://"),
    ])
    .arg("--data-dir")
    .arg(&cluster.data);
    let (again, _) = spawn_with_line(cmd, log);
    cluster.children[0] = again;
}

/// After a coordinator restart, `job` succeeds: the one resume its watch output reports
/// (from a checkpoint), and training exact from there on. Returns the step resumed from and the
/// largest loss and parameter differences. The checkpoint is one of every 3 steps, or
/// one a re-plan of the earlier coordinator (logged to `first_log`) ended its run at: a
/// run stopped between steps saves where it stopped.
pub(crate) fn assert_resumed_exactly(
    cluster: &Cluster,
    job: u64,
    reference: &Reference,
    first_log: &Path,
) -> (u64, f64, f64) {
    let (stdout, resumed) = succeeded_replanned_once(cluster, job, "the coordinator restarted");
    let from: u64 = resumed
        .rsplit("checkpoint of step ")
        .next()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no checkpoint step in {resumed}"));
    assert!(from >= 3, "{resumed}");
    assert!(
        from.is_multiple_of(3) || moved_to(first_log, from, "the coordinator restarted"),
        "resumed from step {from}, neither a periodic checkpoint nor a re-plan's; see {}",
        first_log.display()
    );
    let (loss_diff, param_diff) =
        assert_exact_from(cluster, job, from + 1, &last_losses(&stdout), reference);
    (from, loss_diff, param_diff)
}

/// Whether the coordinator's `log` shows a re-plan (other than the one whose reason holds
/// `besides`) that resumed from the checkpoint of step `step`: a run stopped between steps
/// saves where it stopped, which need not be a multiple of the checkpoint interval.
pub(crate) fn moved_to(log: &Path, step: u64, besides: &str) -> bool {
    let from_checkpoint = format!("resuming from the checkpoint of step {step}");
    let from_memory = format!("going on after step {step} from the workers' memory");
    std::fs::read_to_string(log).unwrap().lines().any(|l| {
        !l.contains(besides)
            && (l.contains(&from_memory)
                || l.split(&from_checkpoint)
                    .nth(1)
                    .is_some_and(|rest| !rest.starts_with(|c: char| c.is_ascii_digit())))
    })
}

/// The step lines of a job's watch output count 1, 2, 3, … once each: no step ran twice
/// (a move went on from memory, not back to an earlier checkpoint).
pub(crate) fn assert_no_step_repeated(stdout: &str) {
    let steps: Vec<u64> = stdout
        .lines()
        .filter(|l| is_step_line(l))
        .filter_map(|l| l.split_whitespace().nth(1)?.split('/').next()?.parse().ok())
        .collect();
    let counted: Vec<u64> = (1..=steps.len() as u64).collect();
    assert_eq!(steps, counted, "{stdout}");
}

/// Waits for `job` to succeed (2 minutes at most); its whole watch output and the one
/// `re-planned:` line in it that contains `what`.
pub(crate) fn succeeded_replanned_once(
    cluster: &Cluster,
    job: u64,
    what: &str,
) -> (String, String) {
    let line = ended(cluster, job, Duration::from_secs(120));
    assert!(line.contains("succeeded"), "{line}");
    let stdout = history(cluster, job);
    let found = replans(&stdout, what);
    assert_eq!(found.len(), 1, "{stdout}");
    let why = found[0].to_string();
    (stdout, why)
}

/// The pieces per stage before and after a move, from its `re-planned:` line ("… pieces per
/// stage [a, b, c] → [x, y, z] …").
pub(crate) fn moved_pieces(line: &str) -> (Vec<u32>, Vec<u32>) {
    let list = |text: &str| -> Vec<u32> {
        let inside = text.split_once('[').unwrap().1.split_once(']').unwrap().0;
        inside.split(", ").map(|x| x.parse().unwrap()).collect()
    };
    let moved = line.split_once("pieces per stage ").unwrap().1;
    let (before, after) = moved.split_once(" → ").unwrap();
    let (before, after) = (list(before), list(after));
    assert_eq!(
        before.iter().sum::<u32>(),
        after.iter().sum::<u32>(),
        "{line}"
    );
    (before, after)
}
