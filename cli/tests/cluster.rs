//! Worker processes: a `pipewise coordinator` and several `pipewise worker` processes on
//! loopback, jobs submitted with `pipewise submit`. Training across processes must equal the
//! single-device reference trainer; a malformed frame or a cancel must end a job cleanly and
//! leave the workers ready for the next one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pipewise_proto::v1 as pb;
use pipewise_proto::v1::activation_service_client::ActivationServiceClient;

use candle_core::{Device, Tensor};
use pipewise_common::job::{JobSpec, example};
use pipewise_worker::Trainer;
use pipewise_worker::job::{corpus_of, optimizer_of, sampler_of};

const STEPS: u32 = 20;
const TOLERANCE: f64 = 1e-5;
/// `--metrics-expiry` of the coordinator and of worker `w0`, in seconds.
const EXPIRY_SECS: u64 = 3;

fn pipewise() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pipewise"))
}

/// A coordinator and its workers; killed on drop.
struct Cluster {
    children: Vec<Child>,
    url: String,
    data: PathBuf,
    /// Worker id → activation address.
    workers: HashMap<String, String>,
    /// Metrics ports of the coordinator and of worker `w0`.
    metrics: [u16; 2],
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
fn spawn_with_line(mut cmd: Command, log: &Path) -> (Child, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("starts pipewise");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(!line.is_empty(), "no start line; see {}", log.display());
    (child, line)
}

fn start(dir: &Path, workers: usize) -> Cluster {
    start_with(dir, workers, &[])
}

/// [`start`], with extra arguments for worker `w` for every `(w, args)`.
fn start_with(dir: &Path, workers: usize, extra: &[(usize, &[&str])]) -> Cluster {
    std::fs::create_dir_all(dir).unwrap();
    let data = dir.join("data");
    let metrics = [common::free_port(), common::free_port()];
    let mut cmd = pipewise();
    cmd.args(["coordinator", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .args(["--metrics-listen", &format!("127.0.0.1:{}", metrics[0])])
        .args(["--metrics-expiry", &EXPIRY_SECS.to_string()]);
    let (coord, line) = spawn_with_line(cmd, &dir.join("coordinator.log"));
    // "coordinator listening on ADDR (data in DIR)"
    let addr = line.split_whitespace().nth(3).unwrap().to_string();
    let url = format!("http://{addr}");
    let mut cluster = Cluster {
        children: vec![coord],
        url: url.clone(),
        data,
        workers: HashMap::new(),
        metrics,
    };
    for w in 0..workers {
        let mut args: Vec<&str> = Vec::new();
        if let Some((_, extra)) = extra.iter().find(|(i, _)| *i == w) {
            args.extend_from_slice(extra);
        }
        let metrics_listen = format!("127.0.0.1:{}", metrics[1]);
        let expiry = EXPIRY_SECS.to_string();
        if w == 0 {
            args.extend([
                "--metrics-listen",
                &metrics_listen,
                "--metrics-expiry",
                &expiry,
            ]);
        }
        add_worker(&mut cluster, dir, &format!("w{w}"), &args);
    }
    cluster
}

/// Starts worker `id` (with `args`) against the cluster's coordinator.
fn add_worker(cluster: &mut Cluster, dir: &Path, id: &str, args: &[&str]) {
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
    cmd.args(args);
    let (child, line) = spawn_with_line(cmd, &dir.join(format!("{id}.log")));
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
fn spec(workers: u32, schedule: &str, steps: u32) -> JobSpec {
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

fn write_spec(dir: &Path, spec: &JobSpec) -> PathBuf {
    let path = dir.join(format!("{}.toml", spec.job.name));
    std::fs::write(&path, spec.to_toml().unwrap()).unwrap();
    path
}

/// `pipewise submit FILE --wait`: the job id and the losses it printed.
fn submit_wait(cluster: &Cluster, file: &Path) -> (u64, Vec<f64>) {
    let out = pipewise()
        .arg("submit")
        .arg(file)
        .args(["--coordinator", &cluster.url, "--wait"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{}: {stdout}\n{}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let id = stdout
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap();
    let losses = stdout
        .lines()
        .filter(|l| l.starts_with("step"))
        .map(|l| l.split_whitespace().nth(3).unwrap().parse().unwrap())
        .collect();
    (id, losses)
}

fn final_params(cluster: &Cluster, job: u64) -> HashMap<String, Tensor> {
    let dir = cluster
        .data
        .join("checkpoints")
        .join(format!("job-{job}"))
        .join("final");
    let mut all = HashMap::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let part = candle_core::safetensors::load(entry.unwrap().path(), &Device::Cpu).unwrap();
        for (name, t) in part {
            assert!(all.insert(name.clone(), t).is_none(), "{name} saved twice");
        }
    }
    all
}

fn reference(spec: &JobSpec) -> Reference {
    let device = Device::Cpu;
    let corpus = corpus_of(spec).unwrap();
    let sampler = sampler_of(spec);
    let mut trainer =
        Trainer::new(&spec.model, spec.training.seed, &device, optimizer_of(spec)).unwrap();
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

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pipewise-cluster-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn worker_processes_match_the_single_device_reference() {
    let dir = tempdir("exact");
    let cluster = start(&dir, 8);
    let (ref_losses, ref_params) = reference(&spec(1, "1f1b", STEPS));
    let mut runs: Vec<(u32, &str)> = [
        "gpipe",
        "1f1b",
        "interleaved-1f1b",
        "zb-h1",
        "zb-h2",
        "v-min",
        "v-half",
        "v-zb",
        "adaptive-v",
    ]
    .iter()
    .map(|s| (4, *s))
    .collect();
    runs.extend([
        (1, "1f1b"),
        (2, "1f1b"),
        (8, "1f1b"),
        (1, "v-half"),
        (2, "v-half"),
        (8, "v-half"),
    ]);
    for (workers, schedule) in runs {
        let started = Instant::now();
        let spec = spec(workers, schedule, STEPS);
        let (job, losses) = submit_wait(&cluster, &write_spec(&dir, &spec));
        assert_eq!(losses.len(), STEPS as usize, "{schedule} d={workers}");
        let loss_diff = losses
            .iter()
            .zip(&ref_losses)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        let param_diff = common::max_param_diff(&ref_params, &final_params(&cluster, job));
        eprintln!(
            "{schedule:>16} d={workers}: max |Δloss| {loss_diff:.2e}, max |Δparam| {param_diff:.2e}, \
             loss {:.4} → {:.4}, {:.1} s",
            losses[0],
            losses[losses.len() - 1],
            started.elapsed().as_secs_f64()
        );
        // The printed losses have 7 decimals.
        assert!(
            loss_diff <= TOLERANCE,
            "{schedule} d={workers}: Δloss {loss_diff}"
        );
        assert!(
            param_diff <= TOLERANCE,
            "{schedule} d={workers}: Δparam {param_diff}"
        );
    }
}

/// `pipewise submit FILE` (no wait): the job id.
fn submit(cluster: &Cluster, file: &Path) -> u64 {
    let out = pipewise()
        .arg("submit")
        .arg(file)
        .args(["--coordinator", &cluster.url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap()
}

/// `pipewise status JOB`: (state, step, the whole line).
fn status(cluster: &Cluster, job: u64) -> (String, u64, String) {
    let out = pipewise()
        .args(["status", &job.to_string(), "--coordinator", &cluster.url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let words: Vec<&str> = line.split_whitespace().collect();
    let state = words[3].to_string();
    let step = words[5].split('/').next().unwrap().parse().unwrap();
    (state, step, line)
}

/// Polls the job's status until `done` holds (panics after `limit`).
fn wait_until(
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

#[test]
fn malformed_frame_and_cancel_end_jobs_cleanly() {
    let dir = tempdir("faults");
    let cluster = start(&dir, 2);

    // A long job; once it runs, a stranger sends worker 1 frames whose data does not match
    // their shape, for the stage it holds and the steps ahead.
    let job = submit(&cluster, &write_spec(&dir, &spec(2, "1f1b", 5000)));
    wait_until(&cluster, job, Duration::from_secs(60), |s, step| {
        s == "running" && step >= 2
    });
    let (_, now, _) = status(&cluster, job);
    let target = format!("http://{}", cluster.workers["w1"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let rejected = rt.block_on(async {
        let mut client = ActivationServiceClient::connect(target).await.unwrap();
        let mut rejected = Vec::new();
        // From the status's step (which lags the workers a little) on: the worker takes
        // frames of its own step and the two after, and refuses the others unread.
        for step in now..now + 60 {
            let frame = pb::TensorFrame {
                job,
                step,
                stage: 1,
                mb: 0,
                kind: pb::FrameKind::Activation as i32,
                dtype: pb::Dtype::F32 as i32,
                shape: vec![1, 16, 32],
                data: vec![0u8; 7].into(),
                offset: 0,
            };
            let err = client
                .send(tokio_stream::iter(vec![frame]))
                .await
                .expect_err("a malformed frame is refused");
            rejected.push(err);
        }
        rejected
    });
    // A frame of a step the worker already took is refused as a duplicate, one far from
    // its step as such (both checked first); those near it are refused for their data.
    let mut malformed = 0;
    for e in &rejected {
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        if e.message().contains("TensorFrame.data") {
            malformed += 1;
        } else {
            assert!(
                e.message().contains("duplicate") || e.message().contains("not near"),
                "{e:?}"
            );
        }
    }
    assert!(malformed >= 1, "none of 60 refused for their data");
    let line = ended(&cluster, job, Duration::from_secs(60));
    assert!(line.contains("failed"), "{line}");
    assert!(
        line.contains("TensorFrame.data"),
        "the error names the field: {line}"
    );
    eprintln!("malformed frames: {line}");
    // The failing worker logged it as JSON, with the job and the worker from its spans.
    let log = std::fs::read_to_string(dir.join("w1.log")).unwrap();
    let failure: serde_json::Value = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["level"] == "ERROR")
        .expect("an ERROR line in JSON");
    assert_eq!(failure["span"]["job"], job, "{failure}");
    assert_eq!(failure["span"]["worker"], 1, "{failure}");

    // A cancelled job stops at a step boundary.
    let job = submit(&cluster, &write_spec(&dir, &spec(2, "v-half", 5000)));
    wait_until(&cluster, job, Duration::from_secs(60), |s, step| {
        s == "running" && step >= 1
    });
    let out = pipewise()
        .args(["cancel", &job.to_string(), "--coordinator", &cluster.url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // It says the running job is being cancelled, not just that it runs.
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("cancelling: its workers stop after the current step"),
        "{said}"
    );
    let line = ended(&cluster, job, Duration::from_secs(60));
    assert!(line.contains("cancelled"), "{line}");
    eprintln!("cancel: {line}");

    // The same workers then train the next job to the end.
    let mut short = spec(2, "zb-h1", 3);
    short.job.name = "after-faults".into();
    let (job, losses) = submit_wait(&cluster, &write_spec(&dir, &short));
    assert_eq!(losses.len(), 3);

    // `pipewise trace` writes a kept step's timeline; a step that is not kept is refused
    // naming the field.
    let traces = dir.join("traces");
    let out = pipewise()
        .args([
            "trace",
            &job.to_string(),
            "--step",
            "2",
            "--coordinator",
            &cluster.url,
        ])
        .arg("--out")
        .arg(&traces)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let chrome: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(traces.join("step-2.trace.json")).unwrap())
            .unwrap();
    assert_eq!(chrome["otherData"]["job"], job);
    assert!(
        std::fs::read_to_string(traces.join("step-2.svg"))
            .unwrap()
            .starts_with("<svg")
    );
    let out = pipewise()
        .args([
            "trace",
            &job.to_string(),
            "--step",
            "9",
            "--coordinator",
            &cluster.url,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("step: step 9") && err.contains("1..=3"),
        "{err}"
    );

    // The coordinator's and a worker's metrics endpoints pass `promtool check metrics`.
    for port in cluster.metrics {
        common::promtool_accepts(port);
    }
}

/// `[compute] mode = "emulate"` reaches worker processes through the job spec: the job runs
/// its steps with sleeping passes (no loss, no parameters) and the coordinator's planned
/// bubble is the schedule simulated with the emulated times, not with unit times.
#[test]
fn emulated_job_runs_on_worker_processes() {
    use pipewise_common::job::Compute;
    use pipewise_common::{Costs, Times, simulate};

    let dir = tempdir("emulate");
    let cluster = start(&dir, 4);
    let mut spec = spec(4, "zb-h1", 3);
    spec.job.name = "emulated-zb-h1".into();
    // B four times F and W a quarter of B: ZB-H1's bubble differs from the unit-time one.
    spec.compute = Compute::emulate(2.0, 8.0, 1.0);
    let plan = spec.validate().unwrap();
    let bubble = |times: Times| {
        simulate(
            &plan.schedule,
            &Costs::uniform(&plan.schedule.placement, times).unwrap(),
        )
        .unwrap()
        .bubble
    };
    let planned = bubble(spec.compute.times_secs());
    assert!((planned - bubble(Times::UNIT)).abs() > 0.01, "{planned}");

    let file = write_spec(&dir, &spec);
    let out = pipewise()
        .arg("submit")
        .arg(&file)
        .args(["--coordinator", &cluster.url, "--wait"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // "step    1  loss NaN  12.3 ms  bubble planned  12.3% measured  14.5%  peak KiB [...]"
    let steps: Vec<&str> = stdout.lines().filter(|l| l.starts_with("step")).collect();
    assert_eq!(steps.len(), 3, "{stdout}");
    let percent_after = |line: &str, key: &str| -> f64 {
        let rest = &line[line.find(key).unwrap() + key.len()..];
        rest.trim_start()
            .split('%')
            .next()
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    for line in steps {
        assert!(line.contains("loss NaN"), "nothing is learned: {line}");
        let p = percent_after(line, "planned");
        assert!(
            (p - 100.0 * planned).abs() <= 0.051,
            "{line}: planned {planned}"
        );
        let m = percent_after(line, "measured");
        assert!((0.0..=100.0).contains(&m), "{line}");
    }

    // The finished job's gauges leave the metrics once unset for --metrics-expiry; the
    // cluster's own (refreshed every heartbeat tick) and the counters stay.
    let scrape = |port: u16| common::http_get(port, "/metrics").unwrap().1;
    let series = |text: &str, prefix: &str| text.lines().filter(|l| l.starts_with(prefix)).count();
    let job_gauges = [
        "pipewise_tokens_per_second{",
        "pipewise_bubble_ratio{",
        "pipewise_activation_memory_bytes{",
    ];
    let kept = [
        "pipewise_workers_up 4",
        "pipewise_jobs{state=\"succeeded\"} 1",
        "pipewise_heartbeat_age_seconds{worker=\"w0\"}",
        "pipewise_steps_total{job_id=",
    ];
    // After a heartbeat tick (every second) at least.
    std::thread::sleep(Duration::from_millis(1200));
    let (coordinator, worker) = (scrape(cluster.metrics[0]), scrape(cluster.metrics[1]));
    for prefix in job_gauges.iter().chain(&kept) {
        assert!(
            series(&coordinator, prefix) > 0,
            "{prefix} missing:\n{coordinator}"
        );
    }
    assert!(
        series(&worker, "pipewise_worker_bubble_ratio{") > 0,
        "{worker}"
    );
    std::thread::sleep(Duration::from_millis(EXPIRY_SECS * 1000 + 1500));
    let (coordinator, worker) = (scrape(cluster.metrics[0]), scrape(cluster.metrics[1]));
    for prefix in job_gauges {
        assert_eq!(
            series(&coordinator, prefix),
            0,
            "{prefix} stayed:\n{coordinator}"
        );
    }
    for prefix in kept {
        assert!(
            series(&coordinator, prefix) > 0,
            "{prefix} missing:\n{coordinator}"
        );
    }
    assert_eq!(
        series(&worker, "pipewise_worker_bubble_ratio{"),
        0,
        "{worker}"
    );
    assert!(
        series(&worker, "pipewise_worker_steps_total{") > 0,
        "{worker}"
    );
}

/// A job waiting for more workers than are registered says so in its status (not a bare
/// "running step 0/N"), with the count as it changes, and stops saying so once it runs.
#[test]
fn a_job_waiting_for_workers_says_so() {
    use pipewise_common::job::Compute;

    let dir = tempdir("waiting");
    let mut cluster = start(&dir, 1);
    let mut spec = spec(3, "1f1b", 2);
    spec.compute = Compute::emulate(1.0, 1.0, 1.0);
    let job = submit(&cluster, &write_spec(&dir, &spec));
    // The status line once it contains `needle`.
    let until = |cluster: &Cluster, needle: &str| {
        let started = Instant::now();
        loop {
            let line = status(cluster, job).2;
            if line.contains(needle) {
                return line;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "{line}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let line = until(&cluster, "waiting for workers: 1 of 3 ready");
    assert!(
        line.contains("running") && line.contains("step 0/2"),
        "{line}"
    );
    add_worker(&mut cluster, &dir, "w1", &[]);
    until(&cluster, "waiting for workers: 2 of 3 ready");
    add_worker(&mut cluster, &dir, "w2", &[]);
    let line = ended(&cluster, job, Duration::from_secs(60));
    assert!(
        line.contains("succeeded") && !line.contains("waiting"),
        "{line}"
    );
}

/// A coordinator whose job store was cut short refuses to start with one error naming the
/// file, and nothing of the storage library's assertion before it.
#[test]
fn a_damaged_job_store_is_one_clear_error() {
    let dir = tempdir("cut-store");
    drop(start(&dir, 0)); // kills the coordinator, which leaves an empty store
    let store = dir.join("data").join("jobs.redb");
    let bytes = std::fs::read(&store).unwrap();
    std::fs::write(&store, &bytes[..10_000]).unwrap();
    let out = pipewise()
        .args(["coordinator", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("jobs.redb: the job store is damaged"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `pipewise watch JOB` once the job has ended: everything it printed.
fn history(cluster: &Cluster, job: u64) -> String {
    let out = pipewise()
        .args(["watch", &job.to_string(), "--coordinator", &cluster.url])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The `re-planned:` lines of a watch output that contain `what`.
fn replans<'a>(stdout: &'a str, what: &str) -> Vec<&'a str> {
    stdout
        .lines()
        .filter(|l| l.starts_with("re-planned:") && l.contains(what))
        .collect()
}

/// step → the last loss a watch output reports for it (steps run again after a re-plan
/// count once, the later run).
fn last_losses(stdout: &str) -> BTreeMap<u64, f64> {
    let mut losses = BTreeMap::new();
    for l in stdout.lines().filter(|l| l.starts_with("step")) {
        let words: Vec<&str> = l.split_whitespace().collect();
        losses.insert(words[1].parse().unwrap(), words[3].parse().unwrap());
    }
    losses
}

/// Asserts that every step's loss and the final parameters of `job` equal the reference
/// (within [`TOLERANCE`]); returns the largest differences.
fn assert_exact(
    cluster: &Cluster,
    job: u64,
    losses: &BTreeMap<u64, f64>,
    reference: &Reference,
) -> (f64, f64) {
    assert_exact_from(cluster, job, 1, losses, reference)
}

/// [`assert_exact`] for the steps from `first` on (a watch after a coordinator restart sees
/// only the steps run since).
fn assert_exact_from(
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
    let param_diff = common::max_param_diff(ref_params, &final_params(cluster, job));
    assert!(loss_diff <= TOLERANCE, "Δloss {loss_diff}");
    assert!(param_diff <= TOLERANCE, "Δparam {param_diff}");
    (loss_diff, param_diff)
}

/// Waits until the job is no longer running; its status line.
fn ended(cluster: &Cluster, job: u64, limit: Duration) -> String {
    wait_until(cluster, job, limit, |s, _| {
        matches!(s, "succeeded" | "failed" | "cancelled")
    })
}

/// `pipewise_replans_total{reason=…}` on the coordinator's metrics.
fn replans_counted(cluster: &Cluster, reason: &str) -> f64 {
    let (_, text) = common::http_get(cluster.metrics[0], "/metrics").unwrap();
    let key = format!("pipewise_replans_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(key.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {text}"))
}

/// The single-device reference of a spec: every step's loss and the final parameters.
type Reference = (Vec<f64>, HashMap<String, Tensor>);

/// Three worker processes running `schedule` for `steps` steps with checkpoints every
/// `interval`, submitted and seen running past step `past`: the directory, cluster, spec,
/// its reference and the job id.
fn running_checkpointed(
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

/// Files in the job's `final/` directory (one per worker of the last run).
fn finals(cluster: &Cluster, job: u64) -> usize {
    std::fs::read_dir(
        cluster
            .data
            .join("checkpoints")
            .join(format!("job-{job}"))
            .join("final"),
    )
    .unwrap()
    .count()
}

/// A worker process killed mid-job: the coordinator re-plans onto the survivors, which
/// resume from the last complete checkpoint (written by another partition), and training
/// ends exactly where it would have without the loss.
#[test]
fn a_lost_worker_is_replanned_onto_the_survivors() {
    const LONG: u32 = 40;
    let (_dir, mut cluster, _, reference, job) =
        running_checkpointed("replan", "v-half", LONG, 3, 5);
    // Worker w2 (the third process after the coordinator) dies without a word.
    cluster.children[3].kill().unwrap();
    let (_, killed_at, _) = status(&cluster, job);
    assert!(
        killed_at + 5 < u64::from(LONG),
        "the job ran too fast to lose a worker mid-way ({killed_at} steps)"
    );
    let line = ended(&cluster, job, Duration::from_secs(120));
    assert!(line.contains("succeeded"), "{line}");

    // The job's whole history: the re-plan, then the steps again from the checkpoint. (A
    // straggler move, on a busy machine, would be a second re-plan; it keeps training
    // exact too.)
    let stdout = history(&cluster, job);
    let lost = replans(&stdout, "stopped heartbeating");
    assert_eq!(lost.len(), 1, "{stdout}");
    let why = lost[0];
    assert!(why.contains("worker 2 (w2) stopped heartbeating"), "{why}");
    assert!(
        why.contains("re-planned onto 2 workers (v-half, 4 stages)"),
        "{why}"
    );
    let resume: u64 = why
        .rsplit("checkpoint of step ")
        .next()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no checkpoint step in {why}"));
    // The status read after the kill can lag the workers, whose checkpoint of a step is
    // written before the coordinator has that step's reports: by a checkpoint interval at
    // most. (This assertion, then `resume <= killed_at`, failed once in a full run of the
    // cluster tests and passed in the next runs; its figures were not kept.)
    assert!(
        resume >= 3 && resume.is_multiple_of(3) && resume <= killed_at + 3,
        "killed at step {killed_at} (status): {why}"
    );
    // The first step after the re-plan follows the checkpoint.
    let after: Option<u64> = stdout
        .split(why)
        .nth(1)
        .and_then(|rest| rest.lines().find(|l| l.starts_with("step")))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok());
    assert_eq!(after, Some(resume + 1), "{stdout}");
    let (loss_diff, param_diff) = assert_exact(&cluster, job, &last_losses(&stdout), &reference);
    eprintln!(
        "re-plan: killed at step {killed_at}, resumed from {resume}; max |Δloss| {loss_diff:.2e}, \
         max |Δparam| {param_diff:.2e}"
    );
    // Written by the two survivors only (the abandoned run's directories were cleared).
    assert_eq!(finals(&cluster, job), 2);
    assert_eq!(replans_counted(&cluster, "worker_lost"), 1.0);
}

/// A worker process killed and started again at once under its id and address (a pod
/// restarted in place) registers before its heartbeats are missed: the run holding the
/// dead process sees a lost worker all the same and is re-planned (it hung until the peers'
/// frame timeout, then failed), and training stays exact.
#[test]
fn a_worker_restarted_under_its_id_is_a_lost_one() {
    const LONG: u32 = 60;
    let (dir, mut cluster, _, reference, job) = running_checkpointed("restart", "1f1b", LONG, 3, 3);
    let address = cluster.workers["w2"].clone();
    let w2 = &mut cluster.children[3];
    w2.kill().unwrap();
    w2.wait().unwrap();
    add_worker(&mut cluster, &dir, "w2", &["--listen", &address]);
    let (_, restarted_at, _) = status(&cluster, job);
    assert!(
        restarted_at + 5 < u64::from(LONG),
        "the job ran too fast to restart a worker mid-way ({restarted_at} steps)"
    );
    let line = ended(&cluster, job, Duration::from_secs(120));
    assert!(line.contains("succeeded"), "{line}");
    let stdout = history(&cluster, job);
    let restarted = replans(&stdout, "restarted");
    assert_eq!(restarted.len(), 1, "{stdout}");
    assert!(
        restarted[0].contains(&format!(
            "worker 2 (w2) restarted (registered again from {address})"
        )),
        "{}",
        restarted[0]
    );
    let (loss_diff, param_diff) = assert_exact(&cluster, job, &last_losses(&stdout), &reference);
    eprintln!(
        "restart: w2 restarted at step {restarted_at}; max |Δloss| {loss_diff:.2e}, max \
         |Δparam| {param_diff:.2e}"
    );
}

/// A coordinator killed mid-job and started again on its address and store: its workers
/// register again and abandon the old run, the running job resumes from its last complete
/// checkpoint (it was failed, checkpoints or not), the job queued behind it runs next (it
/// was failed too), and training stays exact.
#[test]
fn a_restarted_coordinator_resumes_its_jobs() {
    const LONG: u32 = 60;
    let (dir, mut cluster, _, reference, job) =
        running_checkpointed("coordinator-restart", "1f1b", LONG, 3, 8);
    let mut behind = spec(3, "1f1b", 4);
    behind.job.name = "behind".into();
    let queued = submit(&cluster, &write_spec(&dir, &behind));
    let (_, killed_at, _) = status(&cluster, job);
    let coordinator = &mut cluster.children[0];
    coordinator.kill().unwrap();
    coordinator.wait().unwrap();
    let mut cmd = pipewise();
    cmd.args([
        "coordinator",
        "--listen",
        cluster.url.trim_start_matches("http://"),
    ])
    .arg("--data-dir")
    .arg(&cluster.data);
    let (again, _) = spawn_with_line(cmd, &dir.join("coordinator-again.log"));
    cluster.children[0] = again;
    assert!(
        killed_at + 10 < u64::from(LONG),
        "the job ran too fast to restart the coordinator mid-way ({killed_at} steps)"
    );
    let line = ended(&cluster, job, Duration::from_secs(120));
    assert!(line.contains("succeeded"), "{line}");
    let stdout = history(&cluster, job);
    let resumed = replans(&stdout, "the coordinator restarted");
    assert_eq!(resumed.len(), 1, "{stdout}");
    let from: u64 = resumed[0]
        .rsplit("checkpoint of step ")
        .next()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no checkpoint step in {}", resumed[0]));
    assert!(from >= 3 && from.is_multiple_of(3), "{}", resumed[0]);
    let (loss_diff, param_diff) =
        assert_exact_from(&cluster, job, from + 1, &last_losses(&stdout), &reference);
    eprintln!(
        "coordinator restart at step {killed_at}: resumed from {from}; max |Δloss| \
         {loss_diff:.2e}, max |Δparam| {param_diff:.2e}"
    );
    let line = ended(&cluster, queued, Duration::from_secs(60));
    assert!(line.contains("succeeded"), "{line}");
    // keep_latest_k = 2: the two latest complete at the last report, and the last step's
    // (removals run beside the run: give them a moment).
    let output = cluster.data.join("checkpoints").join(format!("job-{job}"));
    let kept = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&output)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with("step-"))
            .collect();
        names.sort();
        names
    };
    let started = Instant::now();
    while kept().len() > 3 && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    // (Step 54 and 57, unless a straggler move saved a step between.)
    let left = kept();
    assert_eq!(left.len(), 3, "{left:?}");
    assert_eq!(left[2], "step-60", "{left:?}");
}

/// A job re-planned onto the survivors grows back to its degree when a worker joins: the
/// run stops after a step (saving it), the job is planned on the larger set again, and
/// training still ends exactly where it would have without the loss.
#[test]
fn a_replanned_job_grows_back_when_a_worker_joins() {
    const LONG: u32 = 120;
    let (dir, mut cluster, _, reference, job) = running_checkpointed("grow", "1f1b", LONG, 5, 3);
    cluster.children[3].kill().unwrap();
    // The job goes on with two workers; then a new one joins.
    let started = Instant::now();
    while replans_counted(&cluster, "worker_lost") < 1.0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no re-plan after the loss"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    add_worker(&mut cluster, &dir, "w3", &[]);
    let (_, joined_at, _) = status(&cluster, job);
    assert!(
        joined_at + 20 < u64::from(LONG),
        "the job ran too fast to grow mid-way ({joined_at} steps)"
    );
    let line = ended(&cluster, job, Duration::from_secs(180));
    assert!(line.contains("succeeded"), "{line}");

    let stdout = history(&cluster, job);
    assert_eq!(
        replans(&stdout, "stopped heartbeating").len(),
        1,
        "{stdout}"
    );
    let grew = replans(&stdout, "joined");
    assert_eq!(grew.len(), 1, "{stdout}");
    assert!(
        grew[0].contains("workers joined (3 live); grew from 2 onto 3 workers (1f1b, 3 stages)"),
        "{}",
        grew[0]
    );
    assert!(
        grew[0].contains("resuming from the checkpoint of step"),
        "{}",
        grew[0]
    );
    let (loss_diff, param_diff) = assert_exact(&cluster, job, &last_losses(&stdout), &reference);
    eprintln!(
        "grow: w3 joined at step {joined_at}; max |Δloss| {loss_diff:.2e}, max |Δparam| \
         {param_diff:.2e}"
    );
    // The last run is on three workers, the new one among them.
    assert_eq!(finals(&cluster, job), 3);
    assert_eq!(replans_counted(&cluster, "worker_joined"), 1.0);
}

/// The peak activation KiB per worker of every step a watch output prints.
fn peaks(stdout: &str) -> Vec<Vec<f64>> {
    stdout
        .lines()
        .filter(|l| l.starts_with("step"))
        .map(|l| {
            let list = &l[l.find("peak KiB [").unwrap() + 10..l.rfind(']').unwrap()];
            list.split_whitespace()
                .map(|x| x.parse().unwrap())
                .collect()
        })
        .collect()
}

/// torchtitan's `pipeline_parallel_first_stage_less_layers` moves blocks off the first
/// stage: worker 0 holds fewer activations, worker 1 more, and training is still exact.
#[test]
fn first_stage_less_layers_moves_blocks_off_the_first_stage() {
    let dir = tempdir("lesslayers");
    let cluster = start(&dir, 2);
    let even = spec(2, "1f1b", 3);
    let mut less = even.clone();
    less.job.name = "less".into();
    // 14 blocks + 4 slots: 9 per stage, the first holding 5 blocks and the embedding.
    less.parallelism.pipeline_parallel_first_stage_less_layers = 4;
    let reference = reference(&even);
    let (even_job, _) = submit_wait(&cluster, &write_spec(&dir, &even));
    let (less_job, _) = submit_wait(&cluster, &write_spec(&dir, &less));
    let (a, b) = (history(&cluster, even_job), history(&cluster, less_job));
    let (pa, pb) = (&peaks(&a)[0], &peaks(&b)[0]);
    eprintln!("peak KiB per worker: even split {pa:?}, first stage 4 layers less {pb:?}");
    assert!(pb[0] < pa[0] && pb[1] > pa[1], "{pa:?} {pb:?}");
    assert_exact(&cluster, less_job, &last_losses(&b), &reference);
    // Refused before planning, with the field named.
    less.parallelism.pipeline_parallel_first_stage_less_layers = 40;
    let out = pipewise()
        .arg("submit")
        .arg(write_spec(&dir, &less))
        .args(["--coordinator", &cluster.url])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("parallelism.pipeline_parallel_first_stage_less_layers"),
        "{err}"
    );
}

/// `submit` reads the job file before connecting: a malformed one is named even when no
/// coordinator runs (it used to say only that the coordinator could not be reached).
#[test]
fn submit_names_a_malformed_job_file_before_connecting() {
    let dir = tempdir("badfile");
    std::fs::create_dir_all(&dir).unwrap();
    let nowhere = format!("http://127.0.0.1:{}", common::free_port());
    let negative = spec(2, "1f1b", 3)
        .to_toml()
        .unwrap()
        .replace("steps = 3", "steps = -5");
    for (name, text, expect) in [
        ("unclosed.toml", "[job\nname=", "unclosed table"),
        ("empty.toml", "", "missing field"),
        ("negative.toml", negative.as_str(), "steps"),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        let err = common::fails(&["submit", path.to_str().unwrap(), "--coordinator", &nowhere]);
        assert!(err.contains("is not a valid job spec"), "{name}: {err}");
        assert!(err.contains(expect), "{name}: {err}");
        assert!(!err.contains("cannot reach"), "{name}: {err}");
    }
    // A valid file gets as far as the connection.
    let path = write_spec(&dir, &spec(2, "1f1b", 3));
    let err = common::fails(&["submit", path.to_str().unwrap(), "--coordinator", &nowhere]);
    assert!(err.contains("cannot reach the coordinator"), "{err}");
}

/// `--wait-for-coordinator`: a submit made before the coordinator listens gets through
/// once it does (as the Helm chart's hook does while the coordinator starts), and gives up
/// with the connection error when the time runs out.
#[test]
fn submit_waits_for_a_starting_coordinator() {
    let dir = tempdir("waitcoord");
    std::fs::create_dir_all(&dir).unwrap();
    let file = write_spec(&dir, &spec(2, "1f1b", 3));
    let port = common::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    let err = common::fails(&[
        "submit",
        file.to_str().unwrap(),
        "--coordinator",
        &url,
        "--wait-for-coordinator",
        "1",
    ]);
    assert!(err.contains("cannot reach the coordinator"), "{err}");
    assert!(err.contains("waiting up to 1 s"), "{err}");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "gave up at once"
    );

    let submit = pipewise()
        .arg("submit")
        .arg(&file)
        .args(["--coordinator", &url, "--wait-for-coordinator", "60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let mut cmd = pipewise();
    cmd.args([
        "coordinator",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--data-dir",
    ])
    .arg(dir.join("data"));
    let (mut coordinator, _) = spawn_with_line(cmd, &dir.join("coordinator.log"));
    let out = submit.wait_with_output().unwrap();
    let _ = coordinator.kill();
    let _ = coordinator.wait();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("job 1 "), "{stdout}");
    assert!(stderr.contains("waiting up to 60 s"), "{stderr}");
}

/// A coordinator that takes the connection and never answers (a frozen process, a dead
/// link) ends a client command within the connect and keep-alive timeouts instead of
/// hanging, and a URL with a path is refused (its path would be dropped).
#[test]
fn clients_give_up_on_a_silent_coordinator() {
    // The kernel completes the TCP handshakes; nothing ever reads or writes.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    let started = Instant::now();
    let err = common::fails(&["status", "--coordinator", &url]);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(60), "{took:?}: {err}");
    assert!(err.contains("stopped answering"), "{err}");
    let err = common::fails(&["status", "--coordinator", &format!("{url}/jobs")]);
    assert!(err.contains("a path (/jobs) is not supported"), "{err}");
    drop(silent);
}

/// A worker six times slower per pass: the coordinator sees it in the step reports,
/// stops every worker after the same step, moves layers off it and resumes from that
/// step's checkpoint; training stays exact.
#[test]
fn layers_move_off_a_straggler() {
    const LONG: u32 = 24;
    let dir = tempdir("straggler");
    let cluster = start_with(&dir, 3, &[(2, &["--slowdown", "6"])]);
    let mut spec = spec(3, "1f1b", LONG);
    spec.job.name = "straggler".into();
    spec.checkpoint.enable_checkpoint = true;
    spec.checkpoint.interval = 1000;
    let reference = reference(&spec);
    let (job, _) = submit_wait(&cluster, &write_spec(&dir, &spec));
    let stdout = history(&cluster, job);
    let moves = replans(&stdout, "moved layers");
    assert!(!moves.is_empty(), "{stdout}");
    let first = moves[0];
    assert!(first.contains("worker 2 (w2) took"), "{first}");
    // "pieces per stage [a, b, c] → [x, y, z] (predicted …"
    let lists: Vec<Vec<u32>> = first
        .split("pieces per stage ")
        .nth(1)
        .and_then(|rest| rest.split(" (predicted").next())
        .unwrap()
        .split(" → ")
        .map(|list| {
            list.trim_matches(|c| c == '[' || c == ']')
                .split(", ")
                .map(|x| x.parse().unwrap())
                .collect()
        })
        .collect();
    assert_eq!(lists.len(), 2, "{first}");
    assert_eq!(lists[0].iter().sum::<u32>(), lists[1].iter().sum::<u32>());
    assert!(
        lists[1][2] < lists[0][2],
        "the straggler keeps its layers: {first}"
    );
    let (loss_diff, param_diff) = assert_exact(&cluster, job, &last_losses(&stdout), &reference);
    // Step times of the reports' first and second halves (not asserted: a shared machine).
    let ms: Vec<f64> = stdout
        .lines()
        .filter(|l| l.starts_with("step"))
        .map(|l| l.split_whitespace().nth(4).unwrap().parse().unwrap())
        .collect();
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len().max(1) as f64;
    let cut = ms.len() / 2;
    eprintln!(
        "straggler: {first}\n  max |Δloss| {loss_diff:.2e}, max |Δparam| {param_diff:.2e}; \
         mean step {:.1} ms (first half of the reports) vs {:.1} ms (second half)",
        mean(&ms[..cut]),
        mean(&ms[cut..])
    );
    assert!(replans_counted(&cluster, "straggler") >= 1.0);
}

/// A 2-worker GPipe job with checkpoints, and worker 0's bytes: its parameters,
/// gradients and AdamW moments (f32) and the activations GPipe and 1F1B are predicted to
/// hold there.
fn pressure_job(name: &str) -> (JobSpec, u64, u64, u64) {
    let mut spec = spec(2, "gpipe", PRESSURE_STEPS);
    spec.job.name = name.into();
    spec.checkpoint.enable_checkpoint = true;
    spec.checkpoint.interval = 1000;
    let plan = spec.validate().unwrap();
    let fixed = plan
        .predicted_state_bytes_over(&spec, &spec.model.even_split(2).unwrap())
        .unwrap()[0];
    let gpipe = plan.predicted_peak_bytes(&spec).unwrap()[0];
    let mut one = spec.clone();
    one.parallelism.pipeline_parallel_schedule = "1f1b".into();
    let one_f_one_b = one.validate().unwrap().predicted_peak_bytes(&one).unwrap()[0];
    assert!(one_f_one_b < gpipe);
    (spec, fixed, gpipe, one_f_one_b)
}

const PRESSURE_STEPS: u32 = 8;

/// A worker whose registered memory the job's plan is predicted to overflow (GPipe holds
/// every microbatch's activations): the coordinator moves the job to the fastest schedule
/// predicted to fit before its first step, no step overflows, and training stays exact.
#[test]
fn memory_pressure_moves_the_job_to_a_schedule_that_fits() {
    const LONG: u32 = PRESSURE_STEPS;
    let dir = tempdir("pressure");
    let (spec, fixed, gpipe, one_f_one_b) = pressure_job("pressure");
    let budget = (fixed + (gpipe + one_f_one_b) / 2).to_string();
    let cluster = start_with(&dir, 2, &[(0, &["--memory-bytes", budget.as_str()])]);
    let reference = reference(&spec);
    let (job, _) = submit_wait(&cluster, &write_spec(&dir, &spec));
    let stdout = history(&cluster, job);
    let moves = replans(&stdout, "moved to");
    assert_eq!(moves.len(), 1, "{stdout}");
    assert!(
        moves[0].contains("worker 0 (w0) is predicted to hold"),
        "{}",
        moves[0]
    );
    assert!(moves[0].contains("gpipe planned"), "{}", moves[0]);
    assert!(moves[0].ends_with("before step 1"), "{}", moves[0]);
    eprintln!("pressure: {} (budget {budget} bytes)", moves[0]);
    // Worker 0's parameters, gradients and AdamW moments on V-Half: stages 0 and 3.
    assert!(moves[0].contains("moved to v-half,"), "{}", moves[0]);
    let mut v_half = spec.clone();
    v_half.parallelism.pipeline_parallel_schedule = "v-half".into();
    let moved = v_half.validate().unwrap();
    let ranges = v_half
        .stage_ranges(moved.schedule.placement.stages())
        .unwrap();
    let fixed_after = moved.predicted_state_bytes_over(&v_half, &ranges).unwrap()[0];
    assert!(fixed_after > 0);
    // Every step ran once, on the new plan, within the budget on worker 0.
    let steps: Vec<&str> = stdout.lines().filter(|l| l.starts_with("step")).collect();
    assert_eq!(steps.len(), LONG as usize, "{stdout}");
    for line in &steps {
        let kib = line
            .split('[')
            .nth(1)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap();
        let held = kib.parse::<f64>().unwrap() * 1024.0 + fixed_after as f64;
        assert!(held <= budget.parse::<f64>().unwrap() + 1024.0, "{line}");
    }
    assert_exact(&cluster, job, &last_losses(&stdout), &reference);
    assert_eq!(replans_counted(&cluster, "memory_pressure"), 1.0);
}

/// An overflow the plan did not predict (the worker reports 4 KiB more than its stages
/// hold, with a budget of exactly GPipe's prediction): seen after step 1, every worker
/// stops after the same step, the job resumes from that checkpoint on a schedule that
/// fits, and training stays exact.
#[test]
fn a_measured_overflow_stops_the_run_and_moves_it() {
    let dir = tempdir("pressure-measured");
    let (spec, fixed, gpipe, _) = pressure_job("pressure-measured");
    let budget = (fixed + gpipe).to_string();
    let extra: &[&str] = &["--memory-bytes", &budget, "--unplanned-bytes", "4KiB"];
    let cluster = start_with(&dir, 2, &[(0, extra)]);
    let reference = reference(&spec);
    let (job, _) = submit_wait(&cluster, &write_spec(&dir, &spec));
    let stdout = history(&cluster, job);
    let moves = replans(&stdout, "moved to");
    assert_eq!(moves.len(), 1, "{stdout}");
    assert!(moves[0].contains("worker 0 (w0) held"), "{}", moves[0]);
    assert!(moves[0].contains("gpipe planned"), "{}", moves[0]);
    assert!(
        moves[0].contains("resuming from the checkpoint of step"),
        "{}",
        moves[0]
    );
    eprintln!("measured pressure: {} (budget {budget} bytes)", moves[0]);
    assert_exact(&cluster, job, &last_losses(&stdout), &reference);
    assert_eq!(replans_counted(&cluster, "memory_pressure"), 1.0);
}
