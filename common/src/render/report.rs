//! The numbers of a plan: a serialisable [`Report`], its human table, and a comparison table.
//!
//! Memory is in units of one microbatch's activation over `1/d` of the model (the activation
//! one worker holds for one microbatch under 1F1B's one-stage-per-worker placement); 1F1B
//! peaks at `d` units on its first worker. Given the bytes of one unit, the report also gives
//! bytes.

use std::fmt::Write as _;

use serde::Serialize;

use crate::schedule::Schedule;
use crate::simulate::Simulation;

use super::{fmt_num, fmt_percent};

/// Everything pipewise reports about one planned schedule.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Schedule name (generator name, or `csv:PATH`).
    pub schedule: String,
    /// Worker count `d`.
    pub workers: u32,
    /// Microbatches per step `n`.
    pub microbatches: u32,
    /// Stages per worker `v` (the largest count for irregular placements).
    pub chunks: u32,
    /// Stage layout, e.g. `one-per-worker`, `v`, `loop(v=2)`, `explicit`.
    pub placement: String,
    /// `placement_table[s]` is the worker of stage `s`.
    pub placement_table: Vec<u32>,
    /// Time from the first start to the last end.
    pub makespan: f64,
    /// `1 − Σ busy / (workers × makespan)`.
    pub bubble: f64,
    /// The largest per-worker idle fraction between that worker's first start and last end.
    pub bubble_span: f64,
    /// Peak activation memory of each worker, in units of one microbatch's activation over
    /// `1/d` of the model.
    pub peak_memory: Vec<f64>,
    /// `peak_memory` × the bytes of one unit, when given.
    pub peak_memory_bytes: Option<Vec<f64>>,
    /// A lower bound on the makespan of every schedule on this placement:
    /// `max(max_work, critical_path)`.
    pub lower_bound: f64,
    /// The paper's bound for V-shape schedules at the simulated peak memory (V placement
    /// only).
    pub v_bound: Option<f64>,
    /// The largest per-worker amount of work.
    pub max_work: f64,
    /// The longest dependency chain of one microbatch.
    pub critical_path: f64,
    /// Time spent planning (generating or importing, and simulating), in milliseconds.
    pub planning_ms: f64,
}

impl Report {
    /// Collects the numbers of `sim`, the simulation of `schedule`. `activation_bytes` is the
    /// size in bytes of one memory unit (one microbatch's activation over `1/d` of the model);
    /// `planning_ms` is measured by the caller.
    pub fn new(
        schedule: &Schedule,
        sim: &Simulation,
        activation_bytes: Option<f64>,
        planning_ms: f64,
    ) -> Report {
        Report {
            schedule: schedule.name.clone(),
            workers: schedule.num_workers(),
            microbatches: schedule.microbatches,
            chunks: schedule.placement.chunks(),
            placement: schedule.placement.to_string(),
            placement_table: schedule.placement.table(),
            makespan: sim.makespan,
            bubble: sim.bubble,
            bubble_span: sim.bubble_span,
            peak_memory: sim.peak_memory.clone(),
            peak_memory_bytes: activation_bytes
                .map(|bytes| sim.peak_memory.iter().map(|m| m * bytes).collect()),
            lower_bound: sim.bounds.lower_bound,
            v_bound: sim.bounds.v_bound,
            max_work: sim.bounds.max_work,
            critical_path: sim.bounds.critical_path,
            planning_ms,
        }
    }

    /// The largest per-worker peak memory, in units.
    pub fn max_peak_memory(&self) -> f64 {
        self.peak_memory.iter().copied().fold(0.0, f64::max)
    }

    /// The report as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        // Serialising plain numbers, strings and vectors cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// A human-readable table of the report.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let mut row = |key: &str, value: String| {
            let _ = writeln!(out, "{key:<15} {value}");
        };
        row("schedule", self.schedule.clone());
        row(
            "shape",
            format!(
                "d={} workers, n={} microbatches, v={} chunk{} per worker, placement {}",
                self.workers,
                self.microbatches,
                self.chunks,
                if self.chunks == 1 { "" } else { "s" },
                self.placement
            ),
        );
        row("makespan", fmt_num(self.makespan, 3));
        row(
            "bubble",
            format!(
                "{} (idle share of workers × makespan)",
                fmt_percent(self.bubble)
            ),
        );
        row(
            "bubble_span",
            format!(
                "{} (worst worker, between its first start and last end)",
                fmt_percent(self.bubble_span)
            ),
        );
        row(
            "lower bound",
            format!(
                "{} = max(max work {}, critical path {}){}",
                fmt_num(self.lower_bound, 3),
                fmt_num(self.max_work, 3),
                fmt_num(self.critical_path, 3),
                if self.lower_bound > 0.0 {
                    format!(
                        "; makespan / bound = {}",
                        fmt_num(self.makespan / self.lower_bound, 3)
                    )
                } else {
                    String::new()
                }
            ),
        );
        if let Some(v) = self.v_bound {
            row(
                "v bound",
                format!("{} (V-shape bound at this peak memory)", fmt_num(v, 3)),
            );
        }
        row(
            "planning time",
            format!("{} ms", fmt_num(self.planning_ms, 3)),
        );
        let _ = writeln!(
            out,
            "peak memory     (units of one microbatch's activation over 1/d of the model)"
        );
        let width = self.workers.saturating_sub(1).to_string().len();
        for (w, units) in self.peak_memory.iter().enumerate() {
            let bytes = self
                .peak_memory_bytes
                .as_ref()
                .and_then(|b| b.get(w))
                .map(|b| format!("  ({})", fmt_bytes(*b)))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  worker {w:>width$}  {:>8}{bytes}",
                fmt_num(*units, 3)
            );
        }
        out
    }
}

/// Bytes in binary units (`1.50 GiB`).
pub fn fmt_bytes(bytes: f64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes;
    let mut unit = 0;
    while value.abs() >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{} B", fmt_num(value, 0))
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

/// One row per report: makespan, bubbles, peak memory, bound and planning time side by side.
pub fn compare_table(reports: &[Report]) -> String {
    let bytes = reports.iter().any(|r| r.peak_memory_bytes.is_some());
    let mut header = vec![
        "schedule",
        "placement",
        "makespan",
        "bubble",
        "bubble_span",
        "peak mem",
    ];
    if bytes {
        header.push("peak bytes");
    }
    header.extend(["lower bound", "planning ms"]);
    let rows: Vec<Vec<String>> = reports
        .iter()
        .map(|r| {
            let mut row = vec![
                r.schedule.clone(),
                r.placement.clone(),
                fmt_num(r.makespan, 3),
                fmt_percent(r.bubble),
                fmt_percent(r.bubble_span),
                fmt_num(r.max_peak_memory(), 3),
            ];
            if bytes {
                let peak = r
                    .peak_memory_bytes
                    .as_ref()
                    .map(|b| fmt_bytes(b.iter().copied().fold(0.0, f64::max)))
                    .unwrap_or_else(|| "-".into());
                row.push(peak);
            }
            row.push(fmt_num(r.lower_bound, 3));
            row.push(fmt_num(r.planning_ms, 3));
            row
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .map(|r| r[c].chars().count())
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let line = |cells: &[String]| -> String {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(c, text)| {
                // Names left-aligned, numbers right-aligned.
                if c < 2 {
                    format!("{text:<w$}", w = widths[c])
                } else {
                    format!("{text:>w$}", w = widths[c])
                }
            })
            .collect();
        parts.join("  ").trim_end().to_string()
    };
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    let _ = writeln!(out, "{}", line(&header));
    let _ = writeln!(
        out,
        "{}",
        widths
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .join("  ")
    );
    for row in &rows {
        let _ = writeln!(out, "{}", line(row));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{Costs, Times};
    use crate::generate::{Request, ScheduleKind, generate};
    use crate::simulate::simulate;

    fn report(kind: ScheduleKind, d: u32, n: u32, bytes: Option<f64>) -> Report {
        let s = generate(&Request::new(kind, d, n)).expect("generates");
        let costs = Costs::uniform(&s.placement, Times::UNIT).expect("costs");
        let sim = simulate(&s, &costs).expect("simulates");
        Report::new(&s, &sim, bytes, 1.25)
    }

    #[test]
    fn one_f_one_b_numbers() {
        let r = report(ScheduleKind::OneFOneB, 4, 8, Some(1024.0 * 1024.0));
        assert_eq!(r.makespan, 33.0);
        assert!((r.bubble - 3.0 / 11.0).abs() < 1e-12);
        assert_eq!(r.peak_memory, vec![4.0, 3.0, 2.0, 1.0]);
        assert_eq!(
            r.peak_memory_bytes,
            Some(vec![4194304.0, 3145728.0, 2097152.0, 1048576.0])
        );
        let json: serde_json::Value = serde_json::from_str(&r.to_json()).expect("json");
        for field in [
            "schedule",
            "workers",
            "microbatches",
            "chunks",
            "placement",
            "makespan",
            "bubble",
            "bubble_span",
            "peak_memory",
            "peak_memory_bytes",
            "lower_bound",
            "v_bound",
            "max_work",
            "critical_path",
            "planning_ms",
        ] {
            assert!(json.get(field).is_some(), "{field} missing");
        }
        assert_eq!(json["makespan"], 33.0);
        let table = r.table();
        for needle in ["makespan", "33", "bubble", "27.27 %", "4.00 MiB", "1.25 ms"] {
            assert!(table.contains(needle), "{needle}:\n{table}");
        }
    }

    #[test]
    fn compare_has_one_row_per_report() {
        let reports = [
            report(ScheduleKind::OneFOneB, 4, 8, None),
            report(ScheduleKind::VHalf, 4, 8, None),
        ];
        let table = compare_table(&reports);
        assert_eq!(table.lines().count(), 4, "{table}");
        assert!(table.lines().nth(2).is_some_and(|l| l.starts_with("1f1b")));
        assert!(
            table
                .lines()
                .nth(3)
                .is_some_and(|l| l.starts_with("v-half"))
        );
        assert_eq!(fmt_bytes(512.0), "512 B");
        assert_eq!(fmt_bytes(1.5 * 1024.0 * 1024.0 * 1024.0), "1.50 GiB");
    }
}
