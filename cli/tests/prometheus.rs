//! Metrics end to end: two `pipewise local --metrics-listen` runs (1F1B, then V-Half, on
//! the same 2-worker shape; each keeps serving for a few seconds after its job ends) while
//! a real Prometheus (Debian's `prometheus` package; `.ci/run` installs it) scrapes them
//! every second. Then:
//!
//! - `promtool check metrics` accepts the endpoint's output;
//! - the measured bubble is in [0, 1], the step time is plausible, and each worker's peak
//!   activation bytes in Prometheus equal what `WatchJob` reported (local's summary.json
//!   holds the `WatchJob` events);
//! - every PromQL expression of the Grafana dashboard (`deploy/grafana/pipewise.json`),
//!   its `job_id` / `replica` / `worker` variables at "All", and each variable's values
//!   returns data;
//! - the measured V-Half / 1F1B peak ratio per worker equals the plan's predicted ratio.
//!
//! Without `prometheus` on the PATH the test says so and passes, unless
//! `PIPEWISE_REQUIRE_PROMETHEUS=1` (set by `.ci/run`) makes that a failure.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

struct Kill(Vec<Child>);

impl Drop for Kill {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An instant PromQL query: the result vector.
fn query(port: u16, q: &str) -> Vec<Value> {
    let (status, body) =
        common::http_get(port, &format!("/api/v1/query?query={}", encode(q))).unwrap();
    assert_eq!(status, 200, "{q}: {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "success", "{q}: {body}");
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

fn value(sample: &Value) -> f64 {
    sample["value"][1].as_str().unwrap().parse().unwrap()
}

/// worker label → value.
fn by_worker(samples: &[Value]) -> HashMap<String, f64> {
    samples
        .iter()
        .map(|s| {
            (
                s["metric"]["worker"].as_str().unwrap().to_string(),
                value(s),
            )
        })
        .collect()
}

/// `pipewise_activation_memory_bytes{kind}` of the run serving metrics on `port`, by worker,
/// once Prometheus has scraped every worker's series (and, when `expected` is not empty,
/// the values `expected[w]`; a run's peaks are the same every step, so an earlier scrape
/// agrees too). Polls for up to 60 s.
fn scraped(prom_port: u16, port: u16, kind: &str, expected: &[u64]) -> HashMap<String, f64> {
    let q = format!(
        "pipewise_activation_memory_bytes{{kind=\"{kind}\",instance=\"127.0.0.1:{port}\"}}"
    );
    let started = Instant::now();
    loop {
        let got = by_worker(&query(prom_port, &q));
        let complete = got.len() >= expected.len().max(2)
            && expected
                .iter()
                .enumerate()
                .all(|(w, b)| got.get(&w.to_string()) == Some(&(*b as f64)));
        if complete {
            return got;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{q}: Prometheus has {got:?}, WatchJob said {expected:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Starts `pipewise local` on 2 workers with `schedule`, serving metrics on `port`, and
/// returns once it says it is lingering (its job is over, summary.json written): the child
/// (still serving) and the last step's peaks per worker from summary.json.
fn start_local(dir: &Path, schedule: &str, port: u16) -> (Child, Vec<u64>) {
    let out = dir.join(schedule);
    let mut child = Command::new(env!("CARGO_BIN_EXE_pipewise"))
        .args([
            "local",
            "--workers",
            "2",
            "--schedule",
            schedule,
            "--steps",
            "30",
            // Far above what the plan needs: only the dashboard's limit line reads it.
            "--memory-bytes",
            "64GiB",
        ])
        .args(["--metrics-listen", &format!("127.0.0.1:{port}")])
        .args(["--metrics-linger", "60", "--quiet", "--output-dir"])
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join(format!("{schedule}.log"))).unwrap())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    loop {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("pipewise local {schedule} ended before lingering"))
            .unwrap();
        if line.starts_with("serving metrics on") {
            break;
        }
    }
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let last = summary["steps"].as_array().unwrap().last().unwrap().clone();
    let peaks = last["peak_activation_bytes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap())
        .collect();
    (child, peaks)
}

#[test]
fn prometheus_scrapes_bubble_memory_and_step_time() {
    let Some(prometheus) = common::which("prometheus") else {
        assert!(
            std::env::var_os("PIPEWISE_REQUIRE_PROMETHEUS").is_none(),
            "PIPEWISE_REQUIRE_PROMETHEUS is set but `prometheus` is not on the PATH"
        );
        eprintln!("skipped: no `prometheus` on the PATH (apt-get install prometheus)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("pipewise-prom-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ports: Vec<u16> = (0..2).map(|_| common::free_port()).collect();
    let mut procs = Kill(Vec::new());

    let prom_port = common::free_port();
    let targets: Vec<String> = ports.iter().map(|p| format!("'127.0.0.1:{p}'")).collect();
    std::fs::write(
        dir.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: pipewise\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        ),
    )
    .unwrap();
    procs.0.push(
        Command::new(&prometheus)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let started = Instant::now();
    while !matches!(common::http_get(prom_port, "/-/ready"), Ok((200, _))) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "prometheus not ready"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // 1F1B first: its per-worker peaks, as WatchJob and as Prometheus saw them.
    let (child, watched_1f1b) = start_local(&dir, "1f1b", ports[0]);
    procs.0.push(child);
    let peak_1f1b = scraped(prom_port, ports[0], "peak", &watched_1f1b);
    let pred_1f1b = scraped(prom_port, ports[0], "predicted_peak", &[]);
    for (w, bytes) in watched_1f1b.iter().enumerate() {
        assert!(*bytes > 0);
        assert_eq!(
            peak_1f1b[&w.to_string()],
            *bytes as f64,
            "worker {w}: metric vs WatchJob"
        );
    }
    // promtool accepts the endpoint's output.
    common::promtool_accepts(ports[0]);
    // The 1F1B run is stopped (its series go stale); queries below name their instance.
    let mut first = procs.0.pop().unwrap();
    let _ = first.kill();
    first.wait().unwrap();

    // Then V-Half on the same shape.
    let (child, watched_vhalf) = start_local(&dir, "v-half", ports[1]);
    procs.0.push(child);
    let peak_vhalf = scraped(prom_port, ports[1], "peak", &watched_vhalf);
    let pred_vhalf = scraped(prom_port, ports[1], "predicted_peak", &[]);
    for (w, bytes) in watched_vhalf.iter().enumerate() {
        let w = w.to_string();
        assert_eq!(
            peak_vhalf[&w], *bytes as f64,
            "worker {w}: metric vs WatchJob"
        );
        let measured = peak_vhalf[&w] / peak_1f1b[&w];
        let predicted = pred_vhalf[&w] / pred_1f1b[&w];
        eprintln!(
            "worker {w}: peak 1F1B {} B, V-Half {} B: measured ratio {measured:.4}, predicted {predicted:.4}",
            peak_1f1b[&w], peak_vhalf[&w]
        );
        assert!(
            (measured / predicted - 1.0).abs() <= 0.10,
            "worker {w}: ratio {measured} vs predicted {predicted}"
        );
    }

    // Bubble and step time.
    let bubbles = query(prom_port, "pipewise_bubble_ratio{source=\"measured\"}");
    assert!(!bubbles.is_empty());
    for b in &bubbles {
        let v = value(b);
        assert!((0.0..=1.0).contains(&v), "bubble {v}: {b}");
    }
    let mean_step = query(
        prom_port,
        "sum(pipewise_step_duration_seconds_sum) / sum(pipewise_step_duration_seconds_count)",
    );
    let mean_step = value(&mean_step[0]);
    assert!(
        mean_step > 0.0 && mean_step < 60.0,
        "mean step {mean_step} s"
    );
    eprintln!(
        "measured bubbles {:?}, mean step {mean_step:.3} s",
        bubbles.iter().map(value).collect::<Vec<_>>()
    );

    common::promtool_accepts(ports[1]);

    // Every dashboard query returns data.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/pipewise.json"),
        )
        .unwrap(),
    )
    .unwrap();
    // Its variables (`label_values(METRIC, LABEL)`) have values to offer.
    let mut variables = Vec::new();
    for v in dashboard["templating"]["list"].as_array().unwrap() {
        let Some(definition) = v["definition"].as_str() else {
            continue;
        };
        let inner = definition
            .strip_prefix("label_values(")
            .and_then(|d| d.strip_suffix(')'))
            .unwrap();
        let (metric, label) = inner.split_once(", ").unwrap();
        let values = query(prom_port, &format!("count by ({label}) ({metric})"));
        assert!(
            !values.is_empty(),
            "variable {}: no {label} values",
            v["name"]
        );
        assert_eq!(v["allValue"], ".*", "{}", v["name"]);
        variables.push(format!("${}", v["name"].as_str().unwrap()));
    }
    assert_eq!(variables, ["$job_id", "$replica", "$worker"]);
    let mut count = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            // As Grafana sends it with every variable at "All".
            let mut expr = target["expr"].as_str().unwrap().to_string();
            for v in &variables {
                expr = expr.replace(v.as_str(), ".*");
            }
            let expr = expr.as_str();
            // `rate()` needs two scrapes of a series inside its window: allow the
            // lingering run up to 30 s of scrapes.
            let asked = Instant::now();
            let mut result = query(prom_port, expr);
            while result.is_empty() {
                assert!(
                    asked.elapsed() < Duration::from_secs(30),
                    "dashboard panel {:?}: `{expr}` returned no data",
                    panel["title"]
                );
                std::thread::sleep(Duration::from_millis(500));
                result = query(prom_port, expr);
            }
            // Every label the legend names is in the result, and none of the exporter's
            // labels was renamed by Prometheus for clashing with a target label (`job`,
            // `instance`: `exported_job` would merge the series of every job).
            let legend = target["legendFormat"].as_str().unwrap_or("");
            for sample in &result {
                let labels = sample["metric"].as_object().unwrap();
                assert!(
                    !labels.keys().any(|k| k.starts_with("exported_")),
                    "`{expr}`: a label clashes with a target label: {sample}"
                );
                for name in legend
                    .split("{{")
                    .skip(1)
                    .filter_map(|r| r.split("}}").next())
                {
                    assert!(
                        labels.contains_key(name.trim()),
                        "`{expr}`: legend {legend:?} names {name}, not in {sample}"
                    );
                }
            }
            count += 1;
        }
    }
    eprintln!("{count} dashboard queries returned data");
    let _ = std::fs::read_dir(&dir).map(|_| std::fs::remove_dir_all(&dir));
}
