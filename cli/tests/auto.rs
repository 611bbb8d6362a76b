//! End-to-end tests of `pipewise plan --auto`, running the built binary.

#![allow(clippy::unwrap_used)]

use serde_json::Value;

mod common;
use common::{fails, ok, plan_1f1b};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// `plan --auto` on the 24-layer model, 8 workers, global batch 32, with extra arguments.
fn auto_args<'a>(budget: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "plan",
        "--auto",
        "--workers",
        "8",
        "--layers",
        "24",
        "--hidden",
        "1024",
        "--heads",
        "16",
        "--seq-len",
        "1024",
        "--vocab",
        "32000",
        "--dtype",
        "bf16",
        "--global-batch",
        "32",
        "--memory-per-worker",
        budget,
    ];
    args.extend_from_slice(extra);
    args
}

/// A row of the printed plan table.
#[derive(Debug)]
struct Row {
    schedule: String,
    shape: String,
    max_gib: f64,
    budget_gib: f64,
}

/// The rows of the plan table: lines starting with a rank number.
fn rows(text: &str) -> Vec<Row> {
    let mut out = Vec::new();
    let mut in_table = false;
    for line in text.lines() {
        if line.trim_start().starts_with("rank") {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        let cells: Vec<&str> = line.split_whitespace().collect();
        if cells.is_empty() || cells[0].parse::<usize>().is_err() {
            break;
        }
        // … max worker GiB "X / Y" closes the row.
        let n = cells.len();
        assert_eq!(cells[n - 2], "/", "{line}");
        out.push(Row {
            schedule: cells[1].to_string(),
            shape: cells[2].to_string(),
            max_gib: cells[n - 3].parse().unwrap(),
            budget_gib: cells[n - 1].parse().unwrap(),
        });
    }
    out
}

#[test]
fn three_budgets_print_three_plans_that_fit() {
    // With a huge budget, the JSON lists every plan and what it needs.
    let open: Value = serde_json::from_str(&ok(&auto_args(
        "1TiB",
        &["--top", "1000", "--format", "json"],
    )))
    .expect("valid JSON");
    let ranked = open["plan"]["ranked"].as_array().unwrap();
    assert!(ranked.len() > 3);
    let needs: Vec<u64> = ranked
        .iter()
        .map(|c| c["max_worker_bytes"].as_u64().unwrap())
        .collect();
    for c in ranked {
        let total: u64 = c["worker_bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap())
            .max()
            .unwrap();
        assert_eq!(total, c["max_worker_bytes"].as_u64().unwrap());
    }
    let loose = needs[0];
    let smallest = *needs.iter().min().unwrap();
    assert!(smallest < loose);
    let budgets = [smallest, smallest + (loose - smallest) / 2, loose];

    let mut winners: Vec<(String, f64)> = Vec::new();
    for budget in budgets {
        let text = ok(&auto_args(&budget.to_string(), &[]));
        let table = rows(&text);
        assert!(!table.is_empty(), "{text}");
        assert!(table.len() <= 5, "{text}");
        for r in &table {
            assert!(r.max_gib <= r.budget_gib, "{r:?}\n{text}");
            assert!(r.max_gib <= (budget as f64 / GIB) + 0.005, "{r:?}\n{text}");
        }
        assert!(text.contains("Rejected"), "{text}");
        // The JSON form of the same plan: exact bytes.
        let plan: Value =
            serde_json::from_str(&ok(&auto_args(&budget.to_string(), &["--format", "json"])))
                .unwrap();
        let best = &plan["plan"]["ranked"][0];
        for c in plan["plan"]["ranked"].as_array().unwrap() {
            assert!(c["max_worker_bytes"].as_u64().unwrap() <= budget, "{c}");
            assert_eq!(c["fits"], Value::Bool(true));
        }
        assert_eq!(best["kind"].as_str().unwrap(), table[0].schedule);
        assert_eq!(
            format!(
                "{}×{}",
                best["microbatch_size"].as_u64().unwrap(),
                best["microbatches"].as_u64().unwrap()
            ),
            table[0].shape
        );
        // A plan is its schedule kind and shape and, for the adaptive kinds, the schedule
        // planned to the budget, which shows in its predicted step time.
        winners.push((
            format!(
                "{} {} {:.3} ms",
                table[0].schedule,
                table[0].shape,
                best["step_ms"].as_f64().unwrap()
            ),
            best["max_worker_bytes"].as_u64().unwrap() as f64,
        ));
    }
    eprintln!("winners: {winners:?}");
    // Three different winners; the tighter budget gets the lower-memory plan.
    assert_ne!(winners[0].0, winners[1].0, "{winners:?}");
    assert_ne!(winners[1].0, winners[2].0, "{winners:?}");
    assert_ne!(winners[0].0, winners[2].0, "{winners:?}");
    assert!(winners[0].1 < winners[1].1, "{winners:?}");
    assert!(winners[1].1 < winners[2].1, "{winners:?}");

    // Below the smallest plan: an error naming the need.
    let err = fails(&auto_args(&(smallest / 2).to_string(), &[]));
    assert!(err.contains("the smallest plan needs"), "{err}");
}

#[test]
fn auto_needs_the_model() {
    let err = fails(&[
        "plan",
        "--auto",
        "--workers",
        "4",
        "--global-batch",
        "8",
        "--memory-per-worker",
        "8GiB",
    ]);
    assert!(
        err.contains("--layers") || err.contains("--hidden"),
        "{err}"
    );
    let err = fails(&auto_args("8GiB", &["--layer-times", "1,2"]));
    assert!(err.contains("--layer-times"), "{err}");
    let err = fails(&auto_args("8GiB", &["--dtype", "f64"]));
    assert!(err.contains("--dtype"), "{err}");
    // Options of the unit-based planner are refused, not silently ignored.
    let err = fails(&auto_args("8GiB", &["--activation-bytes", "1GiB"]));
    assert!(err.contains("--activation-bytes"), "{err}");
    let err = fails(&auto_args("8GiB", &["--times", "100,100,100"]));
    assert!(
        err.contains("--layer-times") && err.contains("1,1,1,COMM"),
        "{err}"
    );
    let err = fails(&auto_args("8GiB", &["--memory-limit", "0.5x"]));
    assert!(err.contains("--memory-per-worker"), "{err}");
    // Sizes past the caps are refused (their byte counts used to overflow and panic).
    let mut args = auto_args("8GiB", &[]);
    for (flag, value) in [("--hidden", "2000000000"), ("--heads", "1")] {
        let at = args.iter().position(|a| *a == flag).unwrap();
        args[at + 1] = value;
    }
    let err = fails(&args);
    assert!(err.contains("hidden: must be at most 262144"), "{err}");
}

#[test]
fn model_options_without_auto_are_refused() {
    // They were silently ignored (clap's `requires` does not see an unset flag as absent).
    let err = fails(&plan_1f1b(&["--layers", "24"]));
    assert!(err.contains("--layers applies only with --auto"), "{err}");
    let err = fails(&plan_1f1b(&["--vocab", "100", "--top", "3"]));
    assert!(
        err.contains("--vocab, --top apply only with --auto"),
        "{err}"
    );
    // The defaults still apply under --auto.
    let mut args = auto_args("16GiB", &[]);
    for flag in ["--vocab", "--dtype"] {
        let at = args.iter().position(|a| *a == flag).unwrap();
        args.drain(at..at + 2);
    }
    let text = ok(&args);
    assert!(text.contains("vocabulary 50257, bf16"), "{text}");
}

#[test]
fn measured_times_and_comm_are_used() {
    let text = ok(&auto_args(
        "16GiB",
        &[
            "--layer-times",
            "10,20,10@2",
            "--times",
            "1,1,1,0.5",
            "--top",
            "3",
        ],
    ));
    assert!(
        text.contains("measured F 10 B 20 W 10 ms per block at microbatch size 2"),
        "{text}"
    );
    assert!(text.contains("comm 0.5 ms"), "{text}");
    assert_eq!(rows(&text).len(), 3, "{text}");
}

/// The shapes (replicas, pipeline workers) of the ranked plans in `plan --auto` JSON.
fn ranked_shapes(v: &Value) -> Vec<(u64, usize)> {
    v["plan"]["ranked"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let workers = c["stage_workers"].as_array().unwrap();
            let d = workers.iter().map(|w| w.as_u64().unwrap()).max().unwrap() + 1;
            (c["replicas"].as_u64().unwrap(), d as usize)
        })
        .collect()
}

#[test]
fn replicas_are_weighed_against_pipeline_depth() {
    // Free sums and room for the whole model on a worker: eight replicas of one worker
    // (no bubble) come first; the table gains an R×d column.
    let free = ["--replicas", "auto", "--all-reduce-ns", "0", "--top", "200"];
    let text = ok(&auto_args("64GiB", &free));
    assert!(
        text.contains("8 workers (every replica count weighed)"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("rank  R×d")),
        "{text}"
    );
    let json_args: Vec<&str> = auto_args("64GiB", &free)
        .into_iter()
        .chain(["--format", "json"])
        .collect();
    let v: Value = serde_json::from_str(&ok(&json_args)).unwrap();
    let shapes = ranked_shapes(&v);
    assert_eq!(shapes[0], (8, 1), "{shapes:?}");
    for shape in [(1, 8), (2, 4), (4, 2), (8, 1)] {
        assert!(shapes.contains(&shape), "{shape:?} not in {shapes:?}");
    }
    // Dear sums (a millisecond per value): one pipeline of eight, which sums nothing.
    let dear = [
        "--replicas",
        "auto",
        "--all-reduce-ns",
        "1e6",
        "--format",
        "json",
    ];
    let v: Value = serde_json::from_str(&ok(&auto_args("64GiB", &dear))).unwrap();
    assert_eq!(ranked_shapes(&v)[0], (1, 8));
    // A fixed count plans that many pipelines of workers / R.
    let two = ["--replicas", "2", "--format", "json"];
    let v: Value = serde_json::from_str(&ok(&auto_args("64GiB", &two))).unwrap();
    assert!(ranked_shapes(&v).iter().all(|s| *s == (2, 4)));
}

#[test]
fn bad_replicas_name_the_option() {
    let err = fails(&auto_args("64GiB", &["--replicas", "3"]));
    assert!(
        err.contains("--replicas: 3 replicas do not divide 8 workers"),
        "{err}"
    );
    for bad in ["0", "x"] {
        let err = fails(&auto_args("64GiB", &["--replicas", bad]));
        assert!(err.contains("--replicas"), "{err}");
    }
    let err = fails(&auto_args(
        "64GiB",
        &["--replicas", "2", "--all-reduce-ns=-1"],
    ));
    assert!(err.contains("--all-reduce-ns"), "{err}");
    let err = fails(&auto_args("64GiB", &["--all-reduce-ns", "10"]));
    assert!(
        err.contains("--all-reduce-ns applies only with --replicas"),
        "{err}"
    );
    let err = fails(&plan_1f1b(&["--replicas", "2"]));
    assert!(err.contains("--replicas applies only with --auto"), "{err}");
}
