//! Metrics end to end: a coordinator and two workers (processes, each with
//! `--metrics-listen`) train two jobs while a real Prometheus (Debian's `prometheus`
//! package; `.ci/run` installs it) scrapes them every second. Then:
//!
//! - `promtool check metrics` accepts every endpoint's output;
//! - the measured bubble is in [0, 1], the step time is plausible, and each worker's peak
//!   activation bytes in Prometheus equal what `WatchJob` reported;
//! - every PromQL expression of the Grafana dashboard (`deploy/grafana/pipewise.json`)
//!   returns data;
//! - the measured V-Half / 1F1B peak ratio per worker equals the plan's predicted ratio.
//!
//! Without `prometheus` on the PATH the test says so and passes, unless
//! `PIPEWISE_REQUIRE_PROMETHEUS=1` (set by `.ci/run`) makes that a failure.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pipewise_common::job::example;
use pipewise_proto::v1 as pb;
use pipewise_proto::v1::job_service_client::JobServiceClient;
use serde_json::Value;
use tokio_stream::StreamExt as _;

struct Kill(Vec<Child>);

impl Drop for Kill {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

/// A plain HTTP/1.0 GET on loopback: (status, body).
fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = raw
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Ok((status, body))
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
    let (status, body) = http_get(port, &format!("/api/v1/query?query={}", encode(q))).unwrap();
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

fn start_line(mut cmd: Command, log: &Path) -> (Child, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line)
}

/// Submits `schedule` on 2 workers and follows it over `WatchJob`: the last event's peaks.
fn run_job(rt: &tokio::runtime::Runtime, url: &str, schedule: &str, steps: u32) -> Vec<u64> {
    let mut spec = example(2, schedule);
    spec.job.name = format!("prom-{schedule}");
    spec.training.steps = steps;
    rt.block_on(async {
        let mut c = JobServiceClient::connect(url.to_string()).await.unwrap();
        let status = c
            .submit_job(pb::JobSpec {
                toml: spec.to_toml().unwrap(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let mut events = c
            .watch_job(pb::JobId { id: status.id })
            .await
            .unwrap()
            .into_inner();
        let mut last = None;
        while let Some(e) = events.next().await {
            last = Some(e.unwrap());
        }
        let end = c
            .get_job(pb::JobId { id: status.id })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(end.state, pb::JobState::Succeeded as i32, "{end:?}");
        let mut peaks = last.unwrap().peaks;
        peaks.sort_by_key(|p| p.worker);
        peaks.iter().map(|p| p.peak_activation_bytes).collect()
    })
}

#[test]
fn prometheus_scrapes_bubble_memory_and_step_time() {
    let Some(prometheus) = which("prometheus") else {
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
    let bin = env!("CARGO_BIN_EXE_pipewise");
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let mut procs = Kill(Vec::new());

    let mut cmd = Command::new(bin);
    cmd.args(["coordinator", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .args(["--metrics-listen", &format!("127.0.0.1:{}", ports[0])]);
    let (child, line) = start_line(cmd, &dir.join("coordinator.log"));
    procs.0.push(child);
    let url = format!("http://{}", line.split_whitespace().nth(3).unwrap());
    for w in 0..2 {
        let mut cmd = Command::new(bin);
        cmd.args(["worker", "--coordinator", &url, "--id", &format!("w{w}")])
            .args(["--metrics-listen", &format!("127.0.0.1:{}", ports[1 + w])]);
        let (child, _) = start_line(cmd, &dir.join(format!("w{w}.log")));
        procs.0.push(child);
    }

    let prom_port = free_port();
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
    while !matches!(http_get(prom_port, "/-/ready"), Ok((200, _))) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "prometheus not ready"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let rt = tokio::runtime::Runtime::new().unwrap();
    let wait_scrapes = || std::thread::sleep(Duration::from_secs(4));

    // 1F1B first: its per-worker peaks, as WatchJob and as Prometheus saw them.
    let watched_1f1b = run_job(&rt, &url, "1f1b", 30);
    wait_scrapes();
    let peak_1f1b = by_worker(&query(
        prom_port,
        "pipewise_activation_memory_bytes{kind=\"peak\"}",
    ));
    let pred_1f1b = by_worker(&query(
        prom_port,
        "pipewise_activation_memory_bytes{kind=\"predicted_peak\"}",
    ));
    for (w, bytes) in watched_1f1b.iter().enumerate() {
        assert!(*bytes > 0);
        assert_eq!(
            peak_1f1b[&w.to_string()],
            *bytes as f64,
            "worker {w}: metric vs WatchJob"
        );
    }

    // Then V-Half on the same shape.
    let watched_vhalf = run_job(&rt, &url, "v-half", 30);
    wait_scrapes();
    let peak_vhalf = by_worker(&query(
        prom_port,
        "pipewise_activation_memory_bytes{kind=\"peak\"}",
    ));
    let pred_vhalf = by_worker(&query(
        prom_port,
        "pipewise_activation_memory_bytes{kind=\"predicted_peak\"}",
    ));
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

    // promtool accepts every endpoint's output.
    if let Some(promtool) = which("promtool") {
        for port in &ports {
            let (_, body) = http_get(*port, "/metrics").unwrap();
            let mut check = Command::new(&promtool)
                .args(["check", "metrics"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            check
                .stdin
                .take()
                .unwrap()
                .write_all(body.as_bytes())
                .unwrap();
            let out = check.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "promtool on :{port}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    // Every dashboard query returns data.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/pipewise.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let mut count = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let result = query(prom_port, expr);
            assert!(
                !result.is_empty(),
                "dashboard panel {:?}: `{expr}` returned no data",
                panel["title"]
            );
            count += 1;
        }
    }
    eprintln!("{count} dashboard queries returned data");
    let _ = std::fs::read_dir(&dir).map(|_| std::fs::remove_dir_all(&dir));
}
