//! `pipewise local JOB.toml` with `[validation]`: the validation loss comes back through the
//! coordinator before the first step (step 0) and on the steps that evaluate (step lines,
//! `summary.json`, `loss.svg`), the same on one worker as on two over gRPC, and training
//! is the same as without it.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;

use common::processes::*;
use pipewise_common::job::Validation;
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

/// `(step, loss, val_loss)` of every record (step 0's has no loss).
fn losses(summary: &Value) -> Vec<(u64, Option<f64>, Option<f64>)> {
    summary["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let step = s["step"].as_u64().unwrap();
            (step, s["loss"].as_f64(), s["val_loss"].as_f64())
        })
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
    assert_eq!(lines.len(), 5, "{stdout}");
    assert!(lines[0].starts_with("step    0/4  val "), "{stdout}");
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line.contains("  val "), [0, 3, 4].contains(&i), "{line}");
    }
    let with = losses(&two);
    let evaluated: Vec<u64> = with.iter().filter(|l| l.2.is_some()).map(|l| l.0).collect();
    assert_eq!(
        evaluated,
        [0, 3, 4],
        "before the first step, after step 3 and the last"
    );
    assert_eq!(with[0].1, None, "step 0 trained nothing");
    let vals: Vec<f64> = with.iter().flat_map(|l| l.2).collect();
    assert!(vals.iter().all(|v| v.is_finite() && *v > 0.0));
    // The summary's validation losses run from step 0's to the last.
    let printed = format!("validation loss {:.4} → {:.4}", vals[0], vals[2]);
    assert!(stdout.contains(&printed), "{printed}\n{stdout}");
    // Step 0's line prints what summary.json holds.
    assert!(
        lines[0].ends_with(&format!("val {:.4}", vals[0])),
        "{stdout}"
    );
    let plot = dir.join("two").join("loss.svg");
    let text = std::fs::read_to_string(&plot).unwrap();
    assert_eq!(
        text.matches("<polyline").count(),
        2,
        "training and validation"
    );
    assert_renders(&plot);
    assert!(
        stdout.contains("summary.json, loss.svg, params.safetensors"),
        "{stdout}"
    );
    // The same validation losses from one worker, bit for bit.
    spec.parallelism.pipeline_parallel_degree = 1;
    let (_, one) = run(&dir, &spec, "one");
    let bits = |l: &[(u64, Option<f64>, Option<f64>)]| -> Vec<Option<u64>> {
        l.iter().map(|l| l.2.map(f64::to_bits)).collect()
    };
    assert_eq!(bits(&losses(&one)), bits(&with));
    // Every step evaluating: the evaluation after step 1 follows the one before it, each
    // with frames of its own; the same model gives step 0 and step 3 the same bits.
    spec.parallelism.pipeline_parallel_degree = 2;
    spec.validation.as_mut().unwrap().freq = 1;
    let (_, every) = run(&dir, &spec, "every");
    let every = losses(&every);
    let evaluated: Vec<u64> = every
        .iter()
        .filter(|l| l.2.is_some())
        .map(|l| l.0)
        .collect();
    assert_eq!(evaluated, [0, 1, 2, 3, 4]);
    let at = |l: &[(u64, Option<f64>, Option<f64>)], step: u64| {
        l.iter()
            .find(|r| r.0 == step && r.2.is_some())
            .unwrap()
            .2
            .unwrap()
            .to_bits()
    };
    assert_eq!((at(&every, 0), at(&every, 3)), (at(&with, 0), at(&with, 3)));
    // Training as without validation.
    spec.validation = None;
    let (stdout, without) = run(&dir, &spec, "without");
    assert!(
        !stdout.contains(" val ") && !stdout.contains("step    0"),
        "{stdout}"
    );
    let training = |l: &[(u64, Option<f64>, Option<f64>)]| -> Vec<u64> {
        l.iter().flat_map(|l| l.1).map(f64::to_bits).collect()
    };
    assert_eq!(training(&losses(&without)), training(&with));
    assert_eq!(training(&with).len(), 4);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run that goes on after a move (an overflow the plan did not predict, seen after step
/// 1, moves the job between steps) does not evaluate step 0 again: the job's history has
/// one step 0 line, before step 1's, and evaluations after the move.
#[test]
fn a_run_after_a_move_does_not_evaluate_step_zero_again() {
    let dir = tempdir("validation-move");
    let mut spec = spec(2, "gpipe", 6);
    spec.job.name = "validation-move".into();
    spec.checkpoint.enable_checkpoint = true;
    spec.checkpoint.interval = 1000;
    spec.validation = Some(Validation {
        fraction: Some(0.05),
        freq: 2,
        ..Default::default()
    });
    // Worker 0 may hold what GPipe is predicted to, and reports 4 KiB more.
    let plan = spec.validate().unwrap();
    let ranges = spec.stage_ranges(&plan.schedule.placement).unwrap();
    let fixed = plan.predicted_state_bytes_over(&spec, &ranges).unwrap()[0];
    let gpipe = plan.predicted_peak_bytes(&spec).unwrap()[0];
    let budget = (fixed + gpipe).to_string();
    let extra: &[&str] = &["--memory-bytes", &budget, "--unplanned-bytes", "4KiB"];
    let cluster = start_with(&dir, 2, &[(0, extra)]);
    let (job, _) = submit_wait(&cluster, &write_spec(&dir, &spec));
    let stdout = history(&cluster, job);
    assert_eq!(replans(&stdout, "moved to").len(), 1, "{stdout}");
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with("step")).collect();
    let zero: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].starts_with("step    0  val "))
        .collect();
    assert_eq!(zero, [0], "{stdout}");
    assert!(lines[1].starts_with("step    1  loss"), "{stdout}");
    assert_no_step_repeated(&stdout);
    let evaluated: Vec<&str> = lines[1..]
        .iter()
        .filter(|l| l.contains("  val "))
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    assert_eq!(evaluated, ["2", "4", "6"], "{stdout}");
}

/// `svg` renders to PNG with `rsvg-convert`, a strict XML and SVG reader (`.ci/run`
/// installs it and sets `PIPEWISE_REQUIRE_RSVG=1`).
fn assert_renders(svg: &Path) {
    let png = svg.with_extension("png");
    match Command::new("rsvg-convert")
        .arg(svg)
        .arg("-o")
        .arg(&png)
        .status()
    {
        Ok(status) => {
            assert!(status.success(), "rsvg-convert failed on {}", svg.display());
            assert!(std::fs::metadata(&png).unwrap().len() > 1000);
        }
        Err(_) => assert!(
            std::env::var_os("PIPEWISE_REQUIRE_RSVG").is_none(),
            "PIPEWISE_REQUIRE_RSVG is set but rsvg-convert is not installed"
        ),
    }
}
