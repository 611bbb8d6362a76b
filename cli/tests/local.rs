//! `pipewise local` end to end: the job goes through the coordinator's gRPC API, workers
//! train, and the result does not depend on the worker count or the schedule.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn local(dir: &Path, workers: &str, schedule: &str, steps: &str) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_pipewise"))
        .args([
            "local",
            "--workers",
            workers,
            "--schedule",
            schedule,
            "--steps",
            steps,
            "--quiet",
            "--output-dir",
        ])
        .arg(dir)
        .output()
        .expect("runs pipewise");
    assert!(
        out.status.success(),
        "pipewise local failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("summary:"), "{stdout}");
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
}

fn params(dir: &Path) -> std::collections::HashMap<String, candle_core::Tensor> {
    candle_core::safetensors::load(dir.join("params.safetensors"), &candle_core::Device::Cpu)
        .unwrap()
}

fn losses(summary: &Value) -> Vec<f64> {
    summary["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["loss"].as_f64().unwrap())
        .collect()
}

#[test]
fn same_result_for_any_worker_count_and_schedule() {
    let root = tempfile_dir("same");
    let runs = [
        ("1", "1f1b"),
        ("4", "v-half"),
        ("4", "zb-h1"),
        ("2", "interleaved-1f1b"),
    ];
    let mut reference: Option<(
        Vec<f64>,
        std::collections::HashMap<String, candle_core::Tensor>,
    )> = None;
    for (workers, schedule) in runs {
        let dir = root.join(format!("{workers}-{schedule}"));
        let summary = local(&dir, workers, schedule, "6");
        let l = losses(&summary);
        assert_eq!(l.len(), 6);
        assert!(l[5] < l[0], "{schedule}: loss did not fall: {l:?}");
        let p = params(&dir);
        match &reference {
            None => reference = Some((l, p)),
            Some((rl, rp)) => {
                assert_eq!(rp.len(), p.len(), "{schedule}: tensor names differ");
                for (a, b) in rl.iter().zip(&l) {
                    assert!((a - b).abs() <= 1e-5, "{schedule}: loss {a} vs {b}");
                }
                for (name, t) in rp {
                    let u = p
                        .get(name)
                        .unwrap_or_else(|| panic!("{schedule}: no {name}"));
                    let diff = (t - u)
                        .unwrap()
                        .abs()
                        .unwrap()
                        .flatten_all()
                        .unwrap()
                        .max(0)
                        .unwrap()
                        .to_scalar::<f32>()
                        .unwrap();
                    assert!(diff <= 1e-5, "{schedule} {name}: max diff {diff}");
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(root);
}

#[test]
fn bad_local_jobs_are_refused_with_the_field() {
    let out = Command::new(env!("CARGO_BIN_EXE_pipewise"))
        .args([
            "local",
            "--workers",
            "4",
            "--schedule",
            "nope",
            "--steps",
            "1",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("pipeline_parallel_schedule"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_pipewise"))
        .args([
            "local",
            "--workers",
            "4",
            "--global-batch",
            "6",
            "--microbatch-size",
            "4",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("global_batch_size"), "{err}");
}

fn tempfile_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("pipewise-cli-local-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}
