//! `pipewise local JOB.toml` with `[validation]`: the validation loss comes back through the
//! coordinator on the steps that evaluate (step lines, `summary.json`), the same on one
//! worker as on two over gRPC, and training is the same as without it.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Runs `pipewise local job.toml` in `dir` (where `valid.jsonl` is); returns its standard
/// output and `summary.json`.
fn run(dir: &Path, spec: &pipewise_common::job::JobSpec, out: &str) -> (String, Value) {
    let file = dir.join(format!("{out}.toml"));
    std::fs::write(&file, spec.to_toml().unwrap()).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_pipewise"))
        .current_dir(dir)
        .arg("local")
        .arg(&file)
        .arg("--output-dir")
        .arg(dir.join(out))
        .output()
        .expect("runs pipewise");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary = std::fs::read_to_string(dir.join(out).join("summary.json")).unwrap();
    (stdout, serde_json::from_str(&summary).unwrap())
}

/// `(loss, val_loss)` of every step.
fn losses(summary: &Value) -> Vec<(f64, Option<f64>)> {
    summary["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["loss"].as_f64().unwrap(), s["val_loss"].as_f64()))
        .collect()
}

#[test]
fn validation_losses_come_back_on_the_steps_that_evaluate() {
    let dir = std::env::temp_dir().join(format!("pipewise-validation-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Validation documents of their own, as JSON Lines (read as [data] path would read
    // them): 40 of 30 and 32 bytes, joined as they are, 38 windows of 32 tokens.
    let lines: String = (0..40)
        .map(|i| {
            format!(
                "{{\"text\": \"{}\"}}\n",
                [
                    "the stage sends a frame to w1 ",
                    "a worker waits for the w0 frame "
                ][i % 2]
            )
        })
        .collect();
    std::fs::write(dir.join("valid.jsonl"), lines).unwrap();
    let mut spec = pipewise_common::job::example(2, "1f1b");
    spec.training.steps = 4;
    spec.validation = Some(pipewise_common::job::Validation {
        path: Some("valid.jsonl".into()),
        freq: 3,
        ..Default::default()
    });
    let (stdout, two) = run(&dir, &spec, "two");
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with("step")).collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line.contains("  val "), i == 2 || i == 3, "{line}");
    }
    assert!(stdout.contains("validation loss "), "{stdout}");
    let with = losses(&two);
    let evaluated: Vec<usize> = (0..4).filter(|&i| with[i].1.is_some()).collect();
    assert_eq!(evaluated, [2, 3], "after step 3 and the last");
    assert!(
        with.iter()
            .flat_map(|l| l.1)
            .all(|v| v.is_finite() && v > 0.0)
    );
    // The same validation losses from one worker, bit for bit.
    spec.parallelism.pipeline_parallel_degree = 1;
    let (_, one) = run(&dir, &spec, "one");
    let bits = |l: &[(f64, Option<f64>)]| -> Vec<Option<u64>> {
        l.iter().map(|(_, v)| v.map(f64::to_bits)).collect()
    };
    assert_eq!(bits(&losses(&one)), bits(&with));
    // Training as without validation.
    spec.parallelism.pipeline_parallel_degree = 2;
    spec.validation = None;
    let (stdout, without) = run(&dir, &spec, "without");
    assert!(!stdout.contains(" val "), "{stdout}");
    let training =
        |l: &[(f64, Option<f64>)]| -> Vec<u64> { l.iter().map(|l| l.0.to_bits()).collect() };
    assert_eq!(training(&losses(&without)), training(&with));
    let _ = std::fs::remove_dir_all(&dir);
}
