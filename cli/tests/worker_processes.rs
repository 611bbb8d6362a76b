//! Worker processes: a `pipewise coordinator` and several `pipewise worker` processes on
//! loopback, jobs submitted with `pipewise submit`. Training across processes must equal the
//! single-device reference trainer, whatever the schedule, worker count or split; emulated
//! compute reaches the workers through the job spec (and a finished job's gauges leave the
//! metrics); what the binaries write around a job (trace, JSON logs, metrics, cancel).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::processes::*;

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
    // Passes of several milliseconds, so the millisecond a hop or a sleep can take on a
    // loaded machine moves the bubble planned from measured costs by a few points, not ten.
    spec.compute = Compute::emulate(8.0, 32.0, 4.0);
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
    let stdout = common::succeeds(pipewise().arg("submit").arg(&file).args([
        "--coordinator",
        &cluster.url,
        "--wait",
    ]));
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
    // The first step is planned on the emulated times; the later ones on the costs the
    // steps before measured (the same times, give or take the transport and the sleeps).
    for (i, line) in steps.into_iter().enumerate() {
        assert!(line.contains("loss NaN"), "nothing is learned: {line}");
        let p = percent_after(line, "planned");
        let within = if i == 0 { 0.051 } else { 10.0 };
        assert!(
            (p - 100.0 * planned).abs() <= within,
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
        "pipewise_workers{state=\"idle\"} 4",
        "pipewise_jobs{state=\"succeeded\"} 1",
        "pipewise_heartbeat_age_seconds{worker=\"w0\"}",
        "pipewise_steps_total{job_id=",
    ];
    // The job's gauges right after it ended (they expire --metrics-expiry after its last
    // step, however slowly this test gets here on a loaded machine the sooner it looks).
    let (coordinator, worker) = (scrape(cluster.metrics[0]), scrape(cluster.metrics[1]));
    for prefix in job_gauges {
        assert!(
            series(&coordinator, prefix) > 0,
            "{prefix} missing:\n{coordinator}"
        );
    }
    assert!(
        series(&worker, "pipewise_worker_bubble_ratio{") > 0,
        "{worker}"
    );
    // The cluster's own after a heartbeat tick (every second).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let coordinator = scrape(cluster.metrics[0]);
        let missing: Vec<&str> = kept
            .iter()
            .copied()
            .filter(|p| series(&coordinator, p) == 0)
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{missing:?} missing:\n{coordinator}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Then they leave, --metrics-expiry after the job's last step.
    let deadline = Instant::now() + Duration::from_secs(EXPIRY_SECS + 30);
    let (coordinator, worker) = loop {
        let (coordinator, worker) = (scrape(cluster.metrics[0]), scrape(cluster.metrics[1]));
        let left: usize = job_gauges
            .iter()
            .map(|p| series(&coordinator, p))
            .sum::<usize>()
            + series(&worker, "pipewise_worker_bubble_ratio{");
        if left == 0 {
            break (coordinator, worker);
        }
        assert!(
            Instant::now() < deadline,
            "the job's gauges stayed:\n{coordinator}\n{worker}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    for prefix in kept {
        assert!(
            series(&coordinator, prefix) > 0,
            "{prefix} missing:\n{coordinator}"
        );
    }
    assert!(
        series(&worker, "pipewise_worker_steps_total{") > 0,
        "{worker}"
    );
}

/// What the binaries themselves write around a finished job: `pipewise trace` a kept step's
/// timeline (and a refusal naming the field for a step not kept), a worker's JSON log lines
/// with the job and the worker of their spans, metrics `promtool check metrics` accepts,
/// and `pipewise cancel` saying a running job is being cancelled.
#[test]
fn trace_logs_metrics_and_cancel_of_the_binaries() {
    let dir = tempdir("outputs");
    let cluster = start(&dir, 2);
    let mut short = spec(2, "zb-h1", 3);
    short.job.name = "outputs".into();
    let (job, losses) = submit_wait(&cluster, &write_spec(&dir, &short));
    assert_eq!(losses.len(), 3);

    let traces = dir.join("traces");
    common::succeeds(
        pipewise()
            .args(["trace", &job.to_string(), "--step", "2"])
            .args(["--coordinator", &cluster.url])
            .arg("--out")
            .arg(&traces),
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
        .args(["trace", &job.to_string(), "--step", "9"])
        .args(["--coordinator", &cluster.url])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = common::stderr(&out);
    assert!(
        err.contains("step: step 9") && err.contains("1..=3"),
        "{err}"
    );

    // `--log-format json`: one object a line, the job and the worker from the spans.
    let log = std::fs::read_to_string(dir.join("w1.log")).unwrap();
    let in_job = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["span"]["job"] == job)
        .expect("a JSON line in the job's span");
    assert_eq!(in_job["span"]["worker"], 1, "{in_job}");

    for port in cluster.metrics {
        common::promtool_accepts(port);
    }

    let long = submit(&cluster, &write_spec(&dir, &spec(2, "v-half", 5000)));
    wait_until(&cluster, long, Duration::from_secs(60), |s, step| {
        s == "running" && step >= 1
    });
    let said = common::succeeds(pipewise().args([
        "cancel",
        &long.to_string(),
        "--coordinator",
        &cluster.url,
    ]));
    assert!(
        said.contains("cancelling: its workers stop after the current step"),
        "{said}"
    );
    let line = ended(&cluster, long, Duration::from_secs(60));
    assert!(line.contains("cancelled"), "{line}");
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
