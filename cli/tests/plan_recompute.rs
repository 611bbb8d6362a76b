//! `pipewise plan` with activation recomputation: `-s 1f1b-r` (seed 000's Table 4 row) and
//! `--recompute` on any schedule, running the built binary.

#![allow(clippy::unwrap_used)]

use serde_json::Value;

mod common;
use common::{fails, ok};

const TIMES_9_6B: &str = "12.96,13.22,9.76,0.67";

fn plan_json(args: &[&str]) -> Value {
    let mut all = vec!["plan", "--format", "json"];
    all.extend_from_slice(args);
    serde_json::from_str(&ok(&all)).expect("valid JSON")
}

#[test]
fn one_f_one_b_r_reproduces_table4s_bubble_rates() {
    for (n, paper) in [("16", 63.0), ("64", 41.9), ("256", 32.2)] {
        let r = plan_json(&["-s", "1f1b-r", "-d", "16", "-n", n, "--times", TIMES_9_6B]);
        assert_eq!(r["schedule"], "1f1b-r");
        let ours = 100.0 * r["bubble_span"].as_f64().unwrap();
        assert!(
            (ours - paper).abs() <= 1.0,
            "n={n}: {ours:.2} % against {paper} %"
        );
    }
}

#[test]
fn recompute_lengthens_the_step_and_shrinks_the_peak() {
    let shape = ["-d", "4", "-n", "8", "--times", "1,2,1,0.1"];
    let run = |extra: &[&str]| {
        let mut args = vec!["-s", "zb-h1"];
        args.extend_from_slice(&shape);
        args.extend_from_slice(extra);
        plan_json(&args)
    };
    let peak = |r: &Value| {
        r["peak_memory"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_f64().unwrap())
            .fold(0.0, f64::max)
    };
    let none = run(&[]);
    let selective = run(&["--recompute", "selective"]);
    let full = run(&["--recompute", "full"]);
    assert_eq!(full["schedule"], "zb-h1 + full recompute");
    let makespan = |r: &Value| r["makespan"].as_f64().unwrap();
    assert!(makespan(&full) > makespan(&none));
    assert!(makespan(&selective) > makespan(&none));
    assert!(
        peak(&full) < peak(&none),
        "{} against {}",
        peak(&full),
        peak(&none)
    );
    assert!(peak(&selective) < peak(&none));
}

#[test]
fn bad_or_contradicting_modes_name_the_option() {
    let err = fails(&[
        "plan",
        "-s",
        "1f1b",
        "-d",
        "4",
        "-n",
        "8",
        "--recompute",
        "half",
    ]);
    assert!(
        err.contains("--recompute") && err.contains("\"half\""),
        "{err}"
    );
    let err = fails(&[
        "plan",
        "-s",
        "1f1b-r",
        "-d",
        "4",
        "-n",
        "8",
        "--recompute",
        "selective",
    ]);
    assert!(err.contains("contradicts --schedule 1f1b-r"), "{err}");
    ok(&[
        "plan",
        "-s",
        "1f1b-r",
        "-d",
        "4",
        "-n",
        "8",
        "--recompute",
        "full",
    ]);
}
