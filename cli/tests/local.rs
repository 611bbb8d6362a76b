//! `pipewise local` end to end: the job goes through the coordinator's gRPC API, workers
//! train, and the result does not depend on the worker count or the schedule.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

mod common;

fn local(dir: &Path, workers: &str, schedule: &str, steps: &str) -> Value {
    local_with(dir, workers, schedule, steps, &[])
}

fn local_with(dir: &Path, workers: &str, schedule: &str, steps: &str, extra: &[&str]) -> Value {
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
        .args(extra)
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

type Params = std::collections::HashMap<String, candle_core::Tensor>;

fn params(dir: &Path) -> Params {
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

/// Two runs' losses and final parameters agree within 1e-5.
fn assert_same(what: &str, reference: (&[f64], &Params), run: (&[f64], &Params)) {
    assert_close(what, reference, run, 1e-5);
}

/// Two runs' losses agree within 1e-5 and their final parameters within `params`.
fn assert_close(what: &str, (rl, rp): (&[f64], &Params), (l, p): (&[f64], &Params), params: f64) {
    assert_eq!(rl.len(), l.len(), "{what}: step counts differ");
    for (a, b) in rl.iter().zip(l) {
        assert!((a - b).abs() <= 1e-5, "{what}: loss {a} vs {b}");
    }
    let diff = common::max_param_diff(rp, p);
    assert!(diff <= params, "{what}: parameters differ by up to {diff}");
}

#[test]
fn same_result_for_any_worker_count_and_schedule() {
    let root = tempfile_dir("same");
    let runs: [(&str, &str, &[&str]); 5] = [
        ("1", "1f1b", &[]),
        ("4", "v-half", &[]),
        ("4", "zb-h1", &[]),
        ("2", "interleaved-1f1b", &[]),
        // Two data-parallel replicas of a 2-worker V-Half pipeline.
        ("2", "v-half", &["--replicas", "2"]),
    ];
    let mut reference: Option<(Vec<f64>, Params)> = None;
    for (workers, schedule, extra) in runs {
        let dir = root.join(format!("{workers}-{schedule}-{}", extra.len()));
        let summary = local_with(&dir, workers, schedule, "6", extra);
        let l = losses(&summary);
        assert_eq!(l.len(), 6);
        assert!(l[5] < l[0], "{schedule}: loss did not fall: {l:?}");
        let p = params(&dir);
        match &reference {
            None => reference = Some((l, p)),
            Some((rl, rp)) => assert_same(schedule, (rl, rp), (&l, &p)),
        }
    }
    let _ = std::fs::remove_dir_all(root);
}

/// A step's sequences are the same however they are cut into microbatches (`auto` may
/// choose another size than the job's): two replicas of 2-worker pipelines with
/// microbatches of 2 see the losses of one device with microbatches of 1 (before the
/// sampler drew per sequence, they trained on other data: 2.7e-3 apart at step 1). The
/// parameters agree within 1e-4, not 1e-5: a wider product rounds its sums otherwise, and
/// Adam's first updates of gradients near its epsilon (a few elements) magnify that.
#[test]
fn the_sequences_of_a_step_do_not_depend_on_the_microbatch_size() {
    let root = tempfile_dir("microbatch-size");
    let one = root.join("one");
    let one = (losses(&local(&one, "1", "1f1b", "4")), params(&one));
    let cut = root.join("cut");
    let extra = ["--replicas", "2", "--microbatch-size", "2"];
    let summary = local_with(&cut, "2", "1f1b", "4", &extra);
    let cut_run = (losses(&summary), params(&cut));
    let what = "microbatches of 2 against 1";
    assert_close(what, (&one.0, &one.1), (&cut_run.0, &cut_run.1), 1e-4);
    let _ = std::fs::remove_dir_all(root);
}

/// `--schedule auto`: the coordinator chooses the plan on the workers, says what it chose
/// on the first step (in `summary.json` too), and the result is the single-device one at
/// the microbatch size it chose, with the microbatch size fixed and searched, and for two
/// data-parallel replicas.
#[test]
fn auto_chooses_a_plan_with_the_single_device_result() {
    let root = tempfile_dir("auto");
    // The single-device reference at each microbatch size auto chooses.
    let mut references = std::collections::HashMap::new();
    for (workers, extra) in [
        ("2", &["--microbatch-size", "1"][..]),
        ("4", &[][..]),
        ("2", &["--replicas", "2"][..]),
    ] {
        let dir = root.join(format!("auto-{workers}"));
        let summary = local_with(&dir, workers, "auto", "4", extra);
        let choice = summary["steps"][0]["plan_choice"]
            .as_str()
            .unwrap_or_default();
        assert!(choice.starts_with("auto chose "), "{summary}");
        assert!(
            choice.contains("predicted") && choice.contains("split"),
            "{choice}"
        );
        match extra.first() {
            Some(&"--microbatch-size") => {
                assert!(choice.contains("8 microbatches × 1"), "{choice}")
            }
            // Each replica's pipeline takes half of the 8 sequences.
            Some(_) => assert!(choice.contains("2 replicas of "), "{choice}"),
            None => {}
        }
        let size = choice
            .split_once(" microbatches × ")
            .and_then(|(_, rest)| rest.split(',').next())
            .unwrap_or_else(|| panic!("no microbatch size in {choice:?}"))
            .to_string();
        let reference = references.entry(size.clone()).or_insert_with(|| {
            let dir = root.join(format!("reference-{size}"));
            let summary = local_with(&dir, "1", "1f1b", "4", &["--microbatch-size", &size]);
            (losses(&summary), params(&dir))
        });
        let what = format!("auto on {workers} {extra:?} ({choice})");
        assert_same(
            &what,
            (&reference.0, &reference.1),
            (&losses(&summary), &params(&dir)),
        );
    }
    let _ = std::fs::remove_dir_all(root);
}

/// Mixed precision: a bf16 job trains (its loss falls), holds about half the activations
/// of the f32 job (token ids keep their size), writes bf16
/// parameters, and gives the same losses and parameters on 1 worker and on 4.
#[test]
fn bf16_trains_alike_on_any_worker_count() {
    let root = tempfile_dir("bf16");
    let bf16 = local_with(&root.join("4"), "4", "v-half", "6", &["--dtype", "bf16"]);
    let l = losses(&bf16);
    assert_eq!(l.len(), 6);
    assert!(l[5] < l[0], "loss did not fall: {l:?}");
    let p = params(&root.join("4"));
    assert!(!p.is_empty());
    assert!(p.values().all(|t| t.dtype() == candle_core::DType::BF16));
    let f32 = local(&root.join("f32"), "4", "v-half", "6");
    let peaks = |s: &Value| {
        s["steps"][0]["peak_activation_bytes"]
            .as_array()
            .unwrap()
            .clone()
    };
    let (half, full) = (peaks(&bf16), peaks(&f32));
    assert_eq!((half.len(), full.len()), (4, 4));
    for (h, f) in half.iter().zip(&full) {
        let ratio = h.as_f64().unwrap() / f.as_f64().unwrap();
        assert!((0.5..0.51).contains(&ratio), "{half:?} vs {full:?}");
    }
    let one = local_with(&root.join("1"), "1", "1f1b", "6", &["--dtype", "bf16"]);
    let one = (losses(&one), params(&root.join("1")));
    assert_same("bf16, 1 worker against 4", (&one.0, &one.1), (&l, &p));
    let _ = std::fs::remove_dir_all(root);
}

#[test]
fn bad_local_jobs_are_refused_with_the_field() {
    let err = common::fails(&[
        "local",
        "--workers",
        "4",
        "--schedule",
        "nope",
        "--steps",
        "1",
    ]);
    // The value came from the flag: the flag is named, not the job file's TOML path.
    assert!(err.contains("--schedule"), "{err}");
    // 8 sequences do not split into 3 replicas.
    let err = common::fails(&["local", "--replicas", "3", "--steps", "1"]);
    assert!(
        err.contains("training.global_batch_size")
            && err.contains("parallelism.data_parallel_replicate_degree"),
        "{err}"
    );
    // So is a shape the schedule does not support.
    let err = common::fails(&[
        "local",
        "--workers",
        "3",
        "--schedule",
        "dualpipe-v",
        "--global-batch",
        "2",
        "--steps",
        "1",
    ]);
    assert!(
        err.contains("--schedule: dualpipe-v does not support 2 microbatches on 3 workers"),
        "{err}"
    );
    assert!(!err.contains("pipeline_parallel_schedule"), "{err}");
    let err = common::fails(&[
        "local",
        "--workers",
        "4",
        "--global-batch",
        "6",
        "--microbatch-size",
        "4",
    ]);
    assert!(err.contains("global_batch_size"), "{err}");
    let err = common::fails(&["local", "--dtype", "fp8", "--steps", "1"]);
    assert!(err.contains("--dtype") && err.contains("bf16"), "{err}");
    let err = common::fails(&["local", "--dtype", "f16", "--steps", "1"]);
    assert!(
        err.contains("model.dtype") && err.contains("loss scaling"),
        "{err}"
    );
    // Trace steps the run will not keep: refused before it starts (they used to fail it
    // after training, before the summary and the outputs were written).
    let dir = tempfile_dir("bad-trace");
    for steps in ["5", "0", "1,3"] {
        let err = common::fails(&[
            "local",
            "--steps",
            "2",
            "--trace-steps",
            steps,
            "--trace-dir",
            dir.to_str().unwrap(),
        ]);
        assert!(
            err.contains("--trace-steps") && err.contains("1..=2"),
            "{steps}: {err}"
        );
    }
    // A corpus shorter than one window: refused before the workers start.
    std::fs::create_dir_all(&dir).unwrap();
    let short = dir.join("short.txt");
    std::fs::write(&short, b"abc").unwrap();
    let err = common::fails(&["local", "--steps", "1", "--data", short.to_str().unwrap()]);
    assert!(
        err.contains("--data") && err.contains("3 tokens; one window of seq_len 32 needs 33"),
        "{err}"
    );
    // CUDA in a binary built without it: refused at start, with the way to get it.
    if !cfg!(feature = "cuda") {
        let err = common::fails(&["local", "--device", "cuda", "--steps", "1"]);
        assert!(
            err.contains("built without CUDA") && err.contains("--features cuda"),
            "{err}"
        );
    }
}

fn tempfile_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("pipewise-cli-local-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// `--trace-dir`: the Chrome trace parses and carries every pass of every worker twice
/// (planned and executed), the executed passes line up with the schedule's programs, and
/// the SVG renders to PNG (with `rsvg-convert`; `.ci/run` installs it and sets
/// `PIPEWISE_REQUIRE_RSVG=1`).
#[test]
fn trace_dir_writes_a_chrome_trace_and_an_svg_per_step() {
    let dir = tempfile_dir("trace");
    let traces = dir.join("traces");
    let out = Command::new(env!("CARGO_BIN_EXE_pipewise"))
        .args([
            "local",
            "--workers",
            "3",
            "--schedule",
            "zb-h1",
            "--steps",
            "3",
        ])
        .args(["--quiet", "--trace-steps", "1,3", "--trace-dir"])
        .arg(&traces)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan = Command::new(env!("CARGO_BIN_EXE_pipewise"))
        .args([
            "plan", "-s", "zb-h1", "-d", "3", "-n", "8", "--format", "csv",
        ])
        .output()
        .unwrap();
    assert!(plan.status.success());
    // The CSV has one row per worker; every non-empty cell is a pass (PyTorch's letters:
    // `I` is our input-gradient B).
    let csv = String::from_utf8_lossy(&plan.stdout).to_string();
    let programs: Vec<Vec<String>> = csv
        .lines()
        .map(|l| {
            l.split(',')
                .filter(|c| !c.trim().is_empty())
                .map(|c| c.trim().replace('I', "B"))
                .collect()
        })
        .collect();
    assert_eq!(programs.len(), 3, "{csv}");
    for step in [1, 3] {
        let json: Value = serde_json::from_str(
            &std::fs::read_to_string(traces.join(format!("step-{step}.trace.json"))).unwrap(),
        )
        .unwrap();
        assert_eq!(json["otherData"]["step"], step);
        let events = json["traceEvents"].as_array().unwrap();
        for pid in [0, 1] {
            for (w, program) in programs.iter().enumerate() {
                let mut passes: Vec<(f64, String)> = events
                    .iter()
                    .filter(|e| e["ph"] == "X" && e["pid"] == pid && e["tid"] == w)
                    .filter(|e| ["F", "B", "W", "BW"].contains(&e["cat"].as_str().unwrap()))
                    .map(|e| {
                        (
                            e["ts"].as_f64().unwrap(),
                            e["name"].as_str().unwrap().to_string(),
                        )
                    })
                    .collect();
                passes.sort_by(|a, b| a.0.total_cmp(&b.0));
                let names: Vec<String> = passes.into_iter().map(|p| p.1).collect();
                if pid == 1 {
                    // Executed: exactly the worker's program, in its order.
                    assert_eq!(&names, program, "step {step} worker {w}");
                } else {
                    assert_eq!(names.len(), program.len(), "planned, worker {w}");
                }
            }
        }
        let executed = json["otherData"]["executed_bubble"].as_f64().unwrap();
        assert!((0.0..1.0).contains(&executed), "{executed}");
        let svg = traces.join(format!("step-{step}.svg"));
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"));
        assert_renders(&svg);
    }
    let _ = std::fs::remove_dir_all(dir);
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

/// Runs `pipewise local FILE` for `spec` in `dir` (where the files it names are), writing to
/// `dir/out`: its standard output and `summary.json`.
fn local_file(dir: &Path, spec: &pipewise_common::job::JobSpec, out: &str) -> (String, Value) {
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

/// `pipewise local JOB.toml` with `[validation]` every 3 of 4 steps (the losses themselves:
/// `harness/tests/validation.rs`): the step lines show the validation loss before the first
/// step (step 0) and after steps 3 and 4, as `summary.json` holds them; the summary prints
/// their first and last, and `loss.svg` plots training and validation. Without
/// `[validation]` no line shows one.
#[test]
fn validation_shows_in_the_step_lines_summary_and_plot() {
    let dir = tempfile_dir("validation");
    std::fs::create_dir_all(&dir).unwrap();
    let lines: String = (0..40)
        .map(|i| {
            let text = [
                "the stage sends a frame to w1 ",
                "a worker waits for the w0 frame ",
            ];
            format!("{{\"text\": \"{}\"}}\n", text[i % 2])
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
    let (stdout, summary) = local_file(&dir, &spec, "two");
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with("step")).collect();
    assert_eq!(lines.len(), 5, "{stdout}");
    assert!(lines[0].starts_with("step    0/4  val "), "{stdout}");
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line.contains("  val "), [0, 3, 4].contains(&i), "{line}");
    }
    let records = summary["steps"].as_array().unwrap();
    let evaluated: Vec<(u64, f64)> = records
        .iter()
        .filter_map(|r| Some((r["step"].as_u64()?, r["val_loss"].as_f64()?)))
        .collect();
    let steps: Vec<u64> = evaluated.iter().map(|e| e.0).collect();
    assert_eq!(steps, [0, 3, 4], "{summary}");
    assert!(
        records[0]["loss"].as_f64().is_none(),
        "step 0 trained nothing"
    );
    let vals: Vec<f64> = evaluated.iter().map(|e| e.1).collect();
    let printed = format!("validation loss {:.4} → {:.4}", vals[0], vals[2]);
    assert!(stdout.contains(&printed), "{printed}\n{stdout}");
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
    spec.validation = None;
    let (stdout, _) = local_file(&dir, &spec, "without");
    assert!(
        !stdout.contains(" val ") && !stdout.contains("step    0"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--compute emulate`: passes sleep, frames are real buffers over gRPC, nothing is learned
/// (no loss, no parameters); the first step's planned bubble is the simulation with the
/// emulated times, and later steps are planned on the costs the steps before measured.
#[test]
fn emulated_local_run_reports_bubbles_and_no_loss() {
    let dir = tempfile_dir("emulate");
    let out = Command::new(env!("CARGO_BIN_EXE_pipewise"))
        .args([
            "local",
            "--workers",
            "4",
            "--schedule",
            "zb-h1",
            "--steps",
            "2",
        ])
        .args(["--compute", "emulate", "--emulate-ms", "2,3,1", "--quiet"])
        .arg("--output-dir")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert!(!dir.join("params.safetensors").exists());
    let plan = Command::new(env!("CARGO_BIN_EXE_pipewise"))
        .args([
            "plan",
            "-s",
            "zb-h1",
            "-d",
            "4",
            "-n",
            "8",
            "--times",
            "1,1.5,0.5",
        ])
        .args(["--format", "json"])
        .output()
        .unwrap();
    let planned: Value = serde_json::from_slice(&plan.stdout).unwrap();
    let planned = planned["bubble"].as_f64().unwrap();
    let steps = summary["steps"].as_array().unwrap();
    let first = &steps[0];
    assert!((first["planned_bubble"].as_f64().unwrap() - planned).abs() < 1e-9);
    // 8 microbatches of 2 + 3 + 1 ms on each stage, with the bubble's idle share.
    let first_ms = first["predicted_step_time_ms"].as_f64().unwrap();
    assert!((first_ms - 48.0 / (1.0 - planned)).abs() < 1e-6, "{first}");
    let second = &steps[1];
    let (predicted, before) = (
        second["predicted_step_time_ms"].as_f64().unwrap(),
        first["step_time_ms"].as_f64().unwrap(),
    );
    assert!(
        (predicted - before).abs() < 0.5 * before,
        "step 2 predicted {predicted} ms from step 1's {before} ms"
    );
    for step in steps {
        assert!(step["loss"].is_null(), "{step}");
        let planned = step["planned_bubble"].as_f64().unwrap();
        assert!((0.0..1.0).contains(&planned), "{planned}");
        let measured = step["measured_bubble"].as_f64().unwrap();
        assert!((0.0..1.0).contains(&measured), "{measured}");
        // The part of it waiting for a core is a part of it.
        let core = step["core_wait_bubble"].as_f64().unwrap();
        assert!((0.0..=measured).contains(&core), "{core} of {measured}");
        let in_passes = step["pass_core_wait"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&in_passes), "{in_passes}");
    }
    let bad = Command::new(env!("CARGO_BIN_EXE_pipewise"))
        .args(["local", "--compute", "emulate", "--emulate-ms", "2,3"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--emulate-ms"));
    let _ = std::fs::remove_dir_all(dir);
}

/// A closed standard output (e.g. `pipewise local | head -1`) loses the lines, not the run:
/// the job finishes, writes its outputs and exits 0 (printing used to panic with a broken
/// pipe at the summary, before the outputs were written).
#[test]
fn a_closed_standard_output_does_not_stop_the_run() {
    use std::io::BufRead as _;
    let dir = tempfile_dir("closed-stdout");
    let mut child = Command::new(env!("CARGO_BIN_EXE_pipewise"))
        .args(["local", "--workers", "2", "--steps", "3", "--output-dir"])
        .arg(&dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("runs pipewise");
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("job "), "{first}");
    // The reader is gone: every later line goes to a closed pipe.
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(
        summary["steps"].as_array().map(Vec::len),
        Some(3),
        "{summary}"
    );
    assert!(dir.join("params.safetensors").exists());
}

/// `pipewise local JOB.toml` runs the file's job (its name, schedule, workers, batch and
/// data order), with the flags given over its fields: the same losses as the job written
/// with those fields.
#[test]
fn a_job_file_runs_with_the_given_flags_over_its_fields() {
    let dir = std::env::temp_dir().join(format!("pipewise-local-file-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut spec = pipewise_common::job::example(2, "1f1b");
    spec.job.name = "from-a-file".into();
    spec.training.steps = 9;
    spec.training.global_batch_size = 4;
    spec.data.shuffle = false;
    let file = dir.join("job.toml");
    std::fs::write(&file, spec.to_toml().unwrap()).unwrap();
    let run = |file: &Path, out: &str, extra: &[&str]| -> Value {
        let out_dir = dir.join(out);
        let output = Command::new(env!("CARGO_BIN_EXE_pipewise"))
            .arg("local")
            .arg(file)
            .args(["--quiet", "--output-dir"])
            .arg(&out_dir)
            .args(extra)
            .output()
            .expect("runs pipewise");
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        assert!(
            output.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains("1f1b on 2 workers"), "{stdout}");
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("summary.json")).unwrap())
            .unwrap()
    };
    let overridden = run(&file, "flags", &["--steps", "3"]);
    spec.training.steps = 3;
    let written = dir.join("written.toml");
    std::fs::write(&written, spec.to_toml().unwrap()).unwrap();
    let reference = run(&written, "written", &[]);
    assert_eq!(losses(&overridden).len(), 3);
    assert_eq!(losses(&overridden), losses(&reference));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run that starts from a Hugging Face Llama directory gives the same result on 1 worker
/// and on V-Half over 2; its first loss is the loaded model's (not a fresh one's: ln 96 is
/// 4.564), `--output-dir` writes the model as a Hugging Face directory, and `pipewise
/// export` of the run's parameters writes the same tensors.
#[test]
fn a_hugging_face_model_trains_and_exports() {
    let run = trains_and_exports("untied", "v-half", 21);
    std::fs::remove_dir_all(run.parent().unwrap()).ok();
}

/// The same for a model whose head is its embedding table, on 1F1B over 2 (the embedding
/// on worker 0, the head on worker 1: their copies' gradients are summed over gRPC): the
/// copies stay equal and the table is written once, tied.
#[test]
fn a_tied_hugging_face_model_trains_and_exports() {
    let run = trains_and_exports("tied", "1f1b", 20);
    let params = params(&run);
    let values = |t: &candle_core::Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let head = params["head.lm_head.weight"]
        .t()
        .unwrap()
        .contiguous()
        .unwrap();
    assert_eq!(
        values(&params["embedding.wte"]),
        values(&head),
        "the two copies of the table"
    );
    let config = std::fs::read_to_string(run.join("hf/config.json")).unwrap();
    let config: Value = serde_json::from_str(&config).unwrap();
    assert_eq!(config["tie_word_embeddings"], Value::Bool(true));
    std::fs::remove_dir_all(run.parent().unwrap()).ok();
}

/// Trains the `which` fixture on 1 worker and with `schedule` on 2, and exports it (the
/// Hugging Face file holds `tensors` tensors); the 2-worker run's output folder.
fn trains_and_exports(which: &str, schedule: &str, tensors: usize) -> PathBuf {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../worker/testdata/llama-tiny")
        .join(which);
    let base = tempfile_dir(&format!("hf-train-{which}"));
    std::fs::create_dir_all(&base).unwrap();
    // Token ids below the fixture's vocabulary of 96, as nanoGPT's u16 `.bin`.
    let ids: Vec<u8> = (0..20_000u32)
        .flat_map(|i| (((i * 7919 % 10007) % 96) as u16).to_le_bytes())
        .collect();
    let data = base.join("ids.bin");
    std::fs::write(&data, ids).unwrap();
    let model = fixture.display().to_string();
    let extra = ["--model", &model, "--data", data.to_str().unwrap()];
    let (one, two) = (base.join("one"), base.join("two"));
    let reference = local_with(&one, "1", "1f1b", "4", &extra);
    let run = local_with(&two, "2", schedule, "4", &extra);
    assert_same(
        &format!("{schedule} on 2"),
        (&losses(&reference), &params(&one)),
        (&losses(&run), &params(&two)),
    );
    let first = losses(&reference)[0];
    assert!((first - 4.564).abs() > 0.01, "first loss {first}");
    let hf = two.join("hf");
    assert!(hf.join("config.json").is_file() && hf.join("model.safetensors").is_file());
    let exported = base.join("exported");
    let out = Command::new(env!("CARGO_BIN_EXE_pipewise"))
        .arg("export")
        .arg(two.join("params.safetensors"))
        .arg("--to")
        .arg(&exported)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let load = |dir: &Path| {
        candle_core::safetensors::load(dir.join("model.safetensors"), &candle_core::Device::Cpu)
            .unwrap()
    };
    let (a, b) = (load(&hf), load(&exported));
    assert_eq!(a.len(), tensors, "{:?}", a.keys());
    assert_eq!(common::max_param_diff(&a, &b), 0.0);
    two
}
