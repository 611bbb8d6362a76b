//! End-to-end tests of `pipewise plan`, running the built binary.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;

mod common;
use common::{fails, ok, plan_1f1b};

/// A fresh path in the temporary directory.
fn temp_path(name: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("pipewise-test-{}-{n}-{name}", std::process::id()))
}

fn json(args: &[&str]) -> Value {
    serde_json::from_str(&ok(args)).expect("valid JSON")
}

#[test]
fn table_reports_makespan_and_bubble() {
    let text = ok(&[
        "plan",
        "--schedule",
        "1f1b",
        "--workers",
        "4",
        "--microbatches",
        "8",
    ]);
    assert!(text.contains("makespan"), "{text}");
    assert!(text.contains("33"), "{text}");
    assert!(text.contains("bubble"), "{text}");
    assert!(text.contains("27.27 %"), "{text}");
    assert!(text.contains("planning time"), "{text}");
    assert!(text.contains("worker 3"), "{text}");
}

#[test]
fn json_has_the_1f1b_numbers() {
    let (d, n) = (4.0, 8.0);
    let r = json(&plan_1f1b(&["--format", "json"]));
    assert_eq!(r["schedule"], "1f1b");
    assert_eq!(r["workers"], 4);
    assert_eq!(r["microbatches"], 8);
    assert_eq!(r["chunks"], 1);
    assert_eq!(r["placement"], "one-per-worker");
    // F = B = W = 1, BW = B + W = 2: 3 (n + d − 1).
    assert_eq!(r["makespan"].as_f64(), Some(3.0 * (n + d - 1.0)));
    let bubble = r["bubble"].as_f64().unwrap();
    assert!(
        (bubble - (d - 1.0) / (n + d - 1.0)).abs() < 1e-12,
        "{bubble}"
    );
    assert!(r["bubble_span"].as_f64().is_some());
    let peak: Vec<f64> = r["peak_memory"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(peak, vec![4.0, 3.0, 2.0, 1.0]);
    assert!(r["peak_memory_bytes"].is_null());
    assert_eq!(r["lower_bound"].as_f64(), Some(24.0));
    assert_eq!(r["max_work"].as_f64(), Some(24.0));
    assert!(r["critical_path"].as_f64().is_some());
    assert!(r["v_bound"].is_null());
    assert!(r["planning_ms"].as_f64().is_some_and(|ms| ms >= 0.0));
}

#[test]
fn activation_bytes_scale_peak_memory() {
    let r = json(&plan_1f1b(&["-f", "json", "--activation-bytes", "1KiB"]));
    let bytes: Vec<f64> = r["peak_memory_bytes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(bytes, vec![4096.0, 3072.0, 2048.0, 1024.0]);
}

#[test]
fn csv_export_then_import_gives_the_same_numbers() {
    for (schedule, extra) in [
        ("1f1b", &[][..]),
        ("zb-h1", &[][..]),
        ("v-half", &[][..]),
        ("interleaved-1f1b", &["--chunks", "2"][..]),
    ] {
        let path = temp_path(&format!("{schedule}.csv"));
        let path_text = path.to_str().unwrap();
        // The generators use the times to fill idle time: export with the same times.
        let mut export = vec![
            "plan",
            "-s",
            schedule,
            "-d",
            "4",
            "-n",
            "8",
            "--times",
            "1,2,1,0.25",
        ];
        export.extend_from_slice(extra);
        let mut args = export.clone();
        args.extend(["--format", "csv", "--output", path_text]);
        ok(&args);
        let mut args = export.clone();
        args.extend(["--format", "json"]);
        let generated = json(&args);
        let source = format!("csv:{path_text}");
        let imported = json(&[
            "plan",
            "--schedule",
            &source,
            "--format",
            "json",
            "--times",
            "1,2,1,0.25",
        ]);
        std::fs::remove_file(&path).ok();
        assert_eq!(imported["schedule"], source.as_str());
        for field in [
            "workers",
            "microbatches",
            "chunks",
            "placement",
            "placement_table",
            "makespan",
            "bubble",
            "bubble_span",
            "peak_memory",
            "lower_bound",
            "v_bound",
            "max_work",
            "critical_path",
        ] {
            assert_eq!(imported[field], generated[field], "{schedule}: {field}");
        }
    }
}

#[test]
fn imported_csv_errors_name_the_cell() {
    let path = temp_path("bad.csv");
    std::fs::write(&path, "0F0,0F1,0I0,0W0,0I1,0W1\n1I0,1F0,1F1,1W0,1I1,1W1\n").unwrap();
    let source = format!("csv:{}", path.display());
    let err = fails(&["plan", "-s", &source]);
    std::fs::remove_file(&path).ok();
    assert!(err.contains("CSV row 2 column 1 (\"1I0\")"), "{err}");
    assert!(err.contains("breaks rule"), "{err}");

    let err = fails(&["plan", "-s", "csv:/definitely/not/here.csv"]);
    assert!(err.contains("/definitely/not/here.csv"), "{err}");
}

#[test]
fn csv_shape_options_must_match_the_file() {
    let path = temp_path("ok.csv");
    std::fs::write(&path, "0F0,0B0\n").unwrap();
    let source = format!("csv:{}", path.display());
    ok(&["plan", "-s", &source, "-d", "1", "-n", "1"]);
    let err = fails(&["plan", "-s", &source, "-d", "2"]);
    assert!(err.contains("--workers 2"), "{err}");
    let err = fails(&["plan", "-s", &source, "--chunks", "2"]);
    assert!(err.contains("--chunks"), "{err}");
    std::fs::remove_file(&path).ok();
}

#[test]
fn unknown_schedule_lists_the_known_ones() {
    let err = fails(&["plan", "--schedule", "2f2b", "-d", "4", "-n", "8"]);
    assert!(err.contains("unknown schedule \"2f2b\""), "{err}");
    for known in ["gpipe", "1f1b", "zb-h1", "v-half", "dualpipe-v", "csv:PATH"] {
        assert!(err.contains(known), "{known} missing from: {err}");
    }
}

#[test]
fn bad_numbers_name_their_option() {
    let err = fails(&["plan", "-s", "1f1b", "--workers", "0", "-n", "8"]);
    assert!(err.contains("--workers"), "{err}");
    let err = fails(&["plan", "-s", "1f1b", "-d", "4", "--microbatches", "0"]);
    assert!(err.contains("--microbatches"), "{err}");
    let err = fails(&["plan", "-s", "1f1b", "-n", "8"]);
    assert!(err.contains("--workers is required"), "{err}");
    let err = fails(&plan_1f1b(&["--times", "1,2"]));
    assert!(err.contains("--times"), "{err}");
    let err = fails(&plan_1f1b(&["--times", "0,0,0"]));
    assert!(err.contains("--times"), "{err}");
    let err = fails(&plan_1f1b(&["--chunks", "3"]));
    assert!(err.contains("--chunks"), "{err}");
    let err = fails(&["plan", "-s", "dualpipe-v", "-d", "4", "-n", "3"]);
    assert!(err.contains("at least 8"), "{err}");
    let err = fails(&["plan", "-s", "1f1b", "-d", "4096", "-n", "1000000"]);
    assert!(err.contains("too large"), "{err}");
    let err = fails(&plan_1f1b(&["--activation-bytes", "12 parsecs"]));
    assert!(err.contains("--activation-bytes"), "{err}");
}

#[test]
fn stage_times_override_times() {
    let path = temp_path("stages.txt");
    std::fs::write(&path, "# f,b,w\n1,1,1\n1,1,1\n2,2,2 # slow stage\n1,1,1\n").unwrap();
    let file = path.to_str().unwrap();
    let r = json(&plan_1f1b(&["-f", "json", "--stage-times", file]));
    // The slow stage does 8 × 6 of work.
    assert_eq!(r["max_work"].as_f64(), Some(48.0));
    let err = fails(&[
        "plan",
        "-s",
        "v-half",
        "-d",
        "4",
        "-n",
        "8",
        "--stage-times",
        file,
    ]);
    assert!(
        err.contains("--stage-times") && err.contains("8 stages"),
        "{err}"
    );
    std::fs::write(&path, "1,1\n").unwrap();
    let err = fails(&[
        "plan",
        "-s",
        "1f1b",
        "-d",
        "1",
        "-n",
        "8",
        "--stage-times",
        file,
    ]);
    assert!(
        err.contains("--stage-times") && err.contains("line 1"),
        "{err}"
    );
    std::fs::remove_file(&path).ok();
}

/// With stage memory in --stage-times, a multiple of 1F1B's peak is a multiple of 1F1B's
/// peak on those stages (`max_w (d − w)·m_w`), not of `d` units.
#[test]
fn memory_multiples_follow_the_stage_memory() {
    let path = temp_path("stage-memory.txt");
    // Worker 0's stage holds 2 units per microbatch, worker 1's 1: 1F1B's peak is
    // max(2 × 2, 1 × 1) = 4 units, and no schedule fits below 2 (one activation of stage 0).
    std::fs::write(&path, "1,1,1,2\n1,1,1,1\n").unwrap();
    let file = path.to_str().unwrap();
    let base = [
        "plan",
        "-s",
        "adaptive-zb",
        "-d",
        "2",
        "-n",
        "4",
        "--stage-times",
        file,
    ];
    let with = |more: &[&'static str]| [&base[..], more].concat();
    // 0.5x is 2 units: it fits (as a multiple of d = 2 it would be 1 unit, and fail).
    let r = json(&with(&["-f", "json", "--memory-limit", "0.5x"]));
    let peak = r["peak_memory"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_f64)
        .fold(0.0, f64::max);
    assert!(peak <= 2.0 + 1e-9 && peak > 0.0, "{r}");
    let err = fails(&with(&["--memory-limit", "0.4x"]));
    assert!(
        err.contains("memory limit 1.6") && err.contains("smallest limit that fits is 2"),
        "{err}"
    );
    let sweep = ok(&with(&["--sweep-memory"]));
    assert!(sweep.contains("1F1B's peak = 4)"), "{sweep}");
    // Memory in large units: the sweep's rows stay few (one per half unit up to 2 × 4e12
    // units used to exhaust the machine's memory), and a peak that overflows is refused.
    std::fs::write(&path, "1,1,1,2e12\n1,1,1,1e12\n").unwrap();
    let r = json(&with(&["--sweep-memory", "-f", "json"]));
    let points = r["points"].as_array().unwrap().len();
    assert!((5..=33 + 256).contains(&points), "{points} points");
    std::fs::write(&path, "1,1,1,1e308\n1,1,1,1e308\n").unwrap();
    let err = fails(&with(&["--sweep-memory"]));
    assert!(err.contains("overflows"), "{err}");
    let err = fails(&base);
    assert!(err.contains("overflows"), "{err}");
    // Stages that hold no memory: the default limit still plans, a multiple of the zero
    // peak and a sweep are refused with the reason.
    std::fs::write(&path, "1,1,1,0\n1,1,1,0\n").unwrap();
    assert!(ok(&base).contains("makespan"));
    let err = fails(&with(&["--memory-limit", "0.5x"]));
    assert!(err.contains("1F1B's peak is 0"), "{err}");
    let err = fails(&with(&["--sweep-memory"]));
    assert!(err.contains("no activation memory"), "{err}");
    std::fs::remove_file(&path).ok();
}

#[test]
fn renderings() {
    let grid = ok(&["plan", "-s", "zb-h1", "-d", "4", "-n", "8", "-f", "grid"]);
    assert_eq!(
        grid.lines().filter(|l| l.starts_with("worker ")).count(),
        4,
        "{grid}"
    );

    let svg = ok(&["plan", "-s", "v-half", "-d", "4", "-n", "8", "-f", "svg"]);
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("class=\"pass\"").count(), 4 * 2 * 3 * 8);

    let trace: Value = serde_json::from_str(&ok(&plan_1f1b(&["-f", "chrome"]))).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    assert_eq!(events.iter().filter(|e| e["ph"] == "X").count(), 4 * 2 * 8);

    let csv = ok(&["plan", "-s", "1f1b", "-d", "2", "-n", "2", "-f", "csv"]);
    assert_eq!(csv, "0F0,0F1,,,0B0,,,0B1,\n,1F0,1B0,,1F1,1B1,,,\n");

    let path = temp_path("out.txt");
    let printed = ok(&[
        "plan",
        "-s",
        "1f1b",
        "-d",
        "2",
        "-n",
        "2",
        "-o",
        path.to_str().unwrap(),
    ]);
    assert!(printed.is_empty());
    let written = std::fs::read_to_string(&path).unwrap();
    assert!(written.contains("makespan"));
    std::fs::remove_file(&path).ok();
}

#[test]
fn compare_has_a_row_per_schedule_and_notes_skips() {
    let text = ok(&["plan", "--compare", "-d", "4", "-n", "4"]);
    for kind in ["gpipe", "1f1b", "zb-h1", "v-half", "interleaved-1f1b"] {
        assert!(
            text.lines().any(|l| l.starts_with(kind)),
            "{kind} missing:\n{text}"
        );
    }
    // DualPipeV needs n ≥ 2d.
    assert!(text.contains("skipped:"), "{text}");
    assert!(text.contains("dualpipe-v:"), "{text}");

    let value = json(&["plan", "--compare", "-d", "4", "-n", "4", "-f", "json"]);
    let reports = value["reports"].as_array().unwrap();
    assert!(reports.len() >= 10);
    assert!(reports.iter().all(|r| r["makespan"].as_f64().is_some()));
    assert_eq!(value["skipped"][0]["schedule"], "dualpipe-v");

    let err = fails(&["plan", "--compare", "-d", "4", "-n", "4", "-f", "svg"]);
    assert!(err.contains("--compare"), "{err}");
    let err = fails(&["plan", "--compare", "-n", "4"]);
    assert!(err.contains("--workers"), "{err}");

    // --memory-limit limits the adaptive rows alone; the fixed rows keep their class.
    let base = ["plan", "--compare", "-d", "4", "-n", "8", "-f", "json"];
    let limited = json(&[&base[..], &["--memory-limit", "0.5x"]].concat());
    let row = |v: &Value, kind: &str| -> Value {
        v["reports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["schedule"] == kind)
            .unwrap_or_else(|| panic!("no {kind} row: {v}"))
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| *k != "planning_ms")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let plain = json(&base);
    assert_eq!(row(&limited, "1f1b"), row(&plain, "1f1b"));
    let peak = |r: &Value| {
        r["peak_memory"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_f64)
            .fold(0.0, f64::max)
    };
    assert!(peak(&row(&limited, "adaptive-v")) <= 2.0 + 1e-9);
    // A limit in bytes without the bytes of a unit: one error up front, not one per row.
    let err = fails(&[&base[..], &["--memory-limit", "12GiB"]].concat());
    assert!(
        err.starts_with("error: --memory-limit in bytes needs --activation-bytes"),
        "{err}"
    );
}

#[test]
fn help_texts() {
    let help = ok(&["--help"]);
    assert!(help.contains("plan"), "{help}");
    let help = ok(&["plan", "--help"]);
    for needle in ["--schedule", "--times", "csv:PATH", "v-half", "Examples:"] {
        assert!(help.contains(needle), "{needle}:\n{help}");
    }
    let err = fails(&[]);
    assert!(err.contains("Usage"), "{err}");
}

/// `--memory-limit` in its three forms plans adaptive schedules within the limit; bad uses
/// are refused with the option named.
#[test]
fn memory_limit_forms_and_errors() {
    let shape = ["plan", "-s", "adaptive-v", "-d", "6", "-n", "12"];
    // `pipewise plan -s adaptive-v -d 6 -n 12 --memory-limit LIMIT`, which must fail.
    let v_limit = |limit: &str| fails(&[&shape[..], &["--memory-limit", limit]].concat());
    let peak = |args: &[&str]| -> f64 {
        let v: Value = serde_json::from_str(&ok(args)).unwrap();
        v["peak_memory"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .fold(0.0, f64::max)
    };
    let base = [&shape[..], &["-f", "json"]].concat();
    let units = peak(&[&base[..], &["--memory-limit", "4"]].concat());
    assert!(units <= 4.0 + 1e-9, "peak {units}");
    let half = peak(&[&base[..], &["--memory-limit", "0.5x"]].concat());
    assert!(half <= 3.0 + 1e-9, "peak {half}");
    let bytes = peak(
        &[
            &base[..],
            &["--memory-limit", "4MiB", "--activation-bytes", "1MiB"],
        ]
        .concat(),
    );
    assert!(bytes <= 4.0 + 1e-9, "peak {bytes}");
    let zb = peak(&[
        "plan",
        "-s",
        "adaptive-zb",
        "-d",
        "6",
        "-n",
        "12",
        "-f",
        "json",
        "--memory-limit",
        "4",
    ]);
    assert!(zb <= 4.0 + 1e-9, "peak {zb}");

    let e = v_limit("0.1");
    assert!(e.contains("smallest limit that fits"), "{e}");
    // Given in bytes, the limits are told in bytes too.
    let e = fails(&[
        "plan",
        "-s",
        "adaptive-zb",
        "-d",
        "4",
        "-n",
        "8",
        "--memory-limit",
        "3GiB",
        "--activation-bytes",
        "4GiB",
    ]);
    assert!(
        e.contains(
            "3.00 GiB is below the smallest memory limit that fits, 4.00 GiB (4294967296 bytes)"
        ),
        "{e}"
    );
    // The byte count it names plans (a figure rounded to 2.79 GiB was below it).
    let planned = |limit: &str| -> Vec<String> {
        format!("plan -s adaptive-zb -d 4 -n 8 --activation-bytes 3e9 --memory-limit {limit}")
            .split(' ')
            .map(String::from)
            .collect()
    };
    let args = planned("1B");
    let e = fails(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let least = e
        .split(" bytes)")
        .next()
        .and_then(|s| s.rsplit('(').next())
        .unwrap_or_else(|| panic!("no byte count in {e}"))
        .to_string();
    let args = planned(&format!("{least}B"));
    ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    // A tiny limit is written with an exponent, not hundreds of digits.
    let e = fails(&[
        "plan",
        "-s",
        "adaptive-v",
        "-d",
        "4",
        "-n",
        "8",
        "--memory-limit",
        "1e-300",
    ]);
    assert!(e.contains("memory limit 1e-300;") && e.len() < 300, "{e}");
    let e = fails(&[
        "plan",
        "-s",
        "1f1b",
        "-d",
        "6",
        "-n",
        "12",
        "--memory-limit",
        "3",
    ]);
    assert!(e.contains("--memory-limit"), "{e}");
    let e = v_limit("2GiB");
    assert!(e.contains("--activation-bytes"), "{e}");
    let e = fails(&[
        "plan",
        "-s",
        "adaptive-v",
        "-d",
        "6",
        "-n",
        "12",
        "--memory-limit=-2",
    ]);
    assert!(
        e.contains("memory-limit") || e.contains("memory limit"),
        "{e}"
    );
    // Negative, NaN and infinite limits are refused as numbers, not as unknown options or
    // byte counts.
    for bad in ["-1", "nan", "-inf", "Infinity"] {
        let e = v_limit(bad);
        assert!(
            e.contains(&format!(
                "memory limit: {bad} must be a finite number greater than 0"
            )),
            "{bad}: {e}"
        );
    }
}

/// `--sweep-memory` prints a monotone table, an SVG chart and JSON points.
#[test]
fn sweep_memory_table_svg_json() {
    let args = [
        "plan",
        "-s",
        "adaptive-v",
        "-d",
        "4",
        "-n",
        "8",
        "--times",
        "12.96,13.22,9.76",
        "--sweep-memory",
    ];
    let table = ok(&args);
    assert!(table.contains("smallest limit that fits"), "{table}");
    let svg = ok(&[&args[..], &["-f", "svg"]].concat());
    assert!(
        svg.starts_with("<svg") && svg.contains("<polyline"),
        "{svg}"
    );
    let json: Value = serde_json::from_str(&ok(&[&args[..], &["-f", "json"]].concat())).unwrap();
    let points = json["points"].as_array().unwrap();
    assert!(points.len() > 5);
    for p in points {
        assert!(p["peak_units"].as_f64().unwrap() <= p["limit_units"].as_f64().unwrap() + 1e-9);
    }
    let e = fails(&[
        "plan",
        "-s",
        "v-half",
        "-d",
        "4",
        "-n",
        "8",
        "--sweep-memory",
    ]);
    assert!(e.contains("--sweep-memory"), "{e}");
    // A sweep plans every limit itself: a --memory-limit beside it is refused, not ignored.
    let e = fails(&[&args[..], &["--memory-limit", "3"]].concat());
    assert!(e.contains("--memory-limit"), "{e}");
}

/// Input files are read up to a size cap (an endless file such as /dev/zero used to be read
/// until memory ran out) and must be UTF-8 (a UTF-16 file is named as such).
#[test]
fn oversized_and_non_utf8_files_are_refused() {
    if std::path::Path::new("/dev/zero").exists() {
        let err = common::fails(&["plan", "-s", "csv:/dev/zero"]);
        assert!(err.contains("is larger than 268435456 bytes"), "{err}");
        let err = common::fails(&[
            "plan",
            "-s",
            "1f1b",
            "-d",
            "2",
            "-n",
            "2",
            "--stage-times",
            "/dev/zero",
        ]);
        assert!(
            err.contains("--stage-times") && err.contains("is larger than"),
            "{err}"
        );
    }
    let dir = std::env::temp_dir().join(format!("pipewise-utf16-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("s.csv");
    let mut bytes = vec![0xff, 0xfe];
    for unit in "0F0,0B0\n".encode_utf16() {
        bytes.extend_from_slice(&unit.to_le_bytes());
    }
    std::fs::write(&path, bytes).unwrap();
    let err = common::fails(&["plan", "-s", &format!("csv:{}", path.display())]);
    assert!(err.contains("not UTF-8") && err.contains("UTF-16"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
