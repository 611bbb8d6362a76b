//! A traced step drawn next to its plan: a Chrome / Perfetto trace and an SVG figure.
//!
//! Both show up to three timelines of the same workers on one time axis (milliseconds from
//! each one's first start): **planned** — the schedule simulated on the job's costs as they
//! stood before the step (what the step line's `bubble planned` and `predicted` show; absent
//! where the job had none yet); **re-simulated** — the schedule simulated with the step's own
//! mean pass times ([`crate::trace::measured_costs`], no communication cost), the ideal
//! execution of exactly this step; and **executed** — what the workers recorded. In the
//! executed timeline, passes are coloured like the simulated ones; waits for a peer's frame
//! are red, hand-overs to the transport orange, and the end-of-step collectives plus
//! optimizer step grey. Where the executed row is longer than the simulated ones, those
//! marks show why.
//!
//! In the Chrome trace, process 0 is the plan, process 1 the execution and process 2 the
//! re-simulation; threads are workers; `ts` and `dur` are microseconds.

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::pass::Pass;
use crate::schedule::Schedule;
use crate::simulate::Simulation;
use crate::trace::{Activity, Span, StepTrace};

use super::svg::{colours, escape, time_axis};
use super::{fmt_num, fmt_percent};

const LEFT: f64 = 88.0;
const RIGHT: f64 = 24.0;
const ROW: f64 = 22.0;
const GAP: f64 = 4.0;
const PANEL_HEAD: f64 = 30.0;
const FONT: &str = "Helvetica, Arial, sans-serif";
const WAIT: &str = "#d62728";
const SEND: &str = "#ff9f1c";
const SYNC: &str = "#7f7f7f";
const ALL_REDUCE: &str = "#9467bd";

/// Name, category and arguments of a span in the Chrome trace.
fn describe(activity: &Activity) -> (String, &'static str, Value) {
    match *activity {
        Activity::Pass(p) => (
            p.to_string(),
            p.kind.as_str(),
            json!({"stage": p.stage, "mb": p.mb, "kind": p.kind.as_str()}),
        ),
        Activity::Recv { pass, peer } => (
            format!("wait {pass} ← w{peer}"),
            "recv",
            json!({"pass": pass.to_string(), "from": peer}),
        ),
        Activity::Send { pass, peer } => (
            format!("send {pass} → w{peer}"),
            "send",
            json!({"pass": pass.to_string(), "to": peer}),
        ),
        Activity::Sync => ("sync + optimizer".into(), "sync", json!({})),
        Activity::AllReduce { stage } => (
            format!("all-reduce stage {stage} over replicas"),
            "all-reduce",
            json!({"stage": stage}),
        ),
    }
}

/// The simulated timelines a traced step is drawn with.
#[derive(Debug, Clone, Copy)]
pub struct Simulated<'a> {
    /// The step's plan: the schedule simulated on the costs known before the step (`None`
    /// where the job had none).
    pub planned: Option<&'a Simulation>,
    /// The schedule simulated with the step's own mean pass times.
    pub resimulated: &'a Simulation,
}

impl<'a> Simulated<'a> {
    /// (Chrome process id, name, timeline) of every simulated lane, top to bottom.
    fn lanes(&self) -> Vec<(u32, &'static str, &'a Simulation)> {
        let mut out = Vec::new();
        if let Some(p) = self.planned {
            out.push((0, "planned", p));
        }
        out.push((2, "re-simulated", self.resimulated));
        out
    }
}

/// The Chrome trace of `trace` (process 1), its plan (process 0) and its re-simulation
/// (process 2).
pub fn chrome_trace(schedule: &Schedule, sims: Simulated<'_>, trace: &StepTrace) -> Value {
    let mut events = Vec::new();
    let lanes = sims.lanes();
    let mut processes: Vec<(u32, &str)> = lanes.iter().map(|&(pid, name, _)| (pid, name)).collect();
    processes.push((1, "executed"));
    for (order, (pid, name)) in processes.into_iter().enumerate() {
        events.push(json!({"name": "process_name", "ph": "M", "pid": pid,
            "args": {"name": format!("{name}: {} step {}", schedule.name, trace.step)}}));
        events.push(json!({"name": "process_sort_index", "ph": "M", "pid": pid,
            "args": {"sort_index": order}}));
        for w in 0..schedule.num_workers() {
            events.push(
                json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": w,
                "args": {"name": format!("worker {w}")}}),
            );
        }
    }
    let us = |t: f64| t * 1e6;
    for &(pid, _, sim) in &lanes {
        let p0 = super::first_start(sim);
        for (w, line) in sim.timeline.iter().enumerate() {
            for t in line {
                let (name, cat, args) = describe(&Activity::Pass(t.pass));
                events.push(
                    json!({"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": w,
                    "ts": us(t.start - p0), "dur": us(t.end - t.start), "args": args}),
                );
            }
        }
    }
    let origin = trace.origin();
    for (w, spans) in trace.workers.iter().enumerate() {
        for s in spans {
            let (name, cat, args) = describe(&s.activity);
            events.push(
                json!({"name": name, "cat": cat, "ph": "X", "pid": 1, "tid": w,
                "ts": us(s.start - origin), "dur": us(s.duration()), "args": args}),
            );
        }
    }
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "job": trace.job,
            "step": trace.step,
            "schedule": schedule.name,
            "workers": schedule.num_workers(),
            "microbatches": schedule.microbatches,
            "planned_makespan_s": sims.planned.map(|p| p.makespan),
            "planned_bubble": sims.planned.map(|p| p.bubble),
            "resimulated_makespan_s": sims.resimulated.makespan,
            "resimulated_bubble": sims.resimulated.bubble,
            "executed_makespan_s": trace.makespan(),
            "executed_bubble": trace.bubble(),
        },
    })
}

/// Which chunk of its worker each stage is (for the colour shade).
fn chunk_of(schedule: &Schedule) -> Vec<usize> {
    let placement = &schedule.placement;
    let mut out = vec![0; placement.stages() as usize];
    for w in 0..placement.workers() {
        for (c, s) in placement.stages_of(w).into_iter().enumerate() {
            if let Some(slot) = out.get_mut(s as usize) {
                *slot = c;
            }
        }
    }
    out
}

/// The simulated (top) and executed (bottom) timelines as one standalone SVG document.
/// Every pass is one `<rect class="pass">` (simulated and executed), every wait
/// `class="wait"`, hand-over `class="send"` and end-of-step span `class="sync"`.
pub fn svg(schedule: &Schedule, sims: Simulated<'_>, trace: &StepTrace) -> String {
    let workers = schedule.num_workers() as usize;
    let chunks = schedule.placement.chunks().max(1) as usize;
    let chunk = chunk_of(schedule);
    let lanes = sims.lanes();
    let origin = trace.origin();
    let span_ms = (lanes
        .iter()
        .map(|l| l.2.makespan)
        .fold(trace.makespan(), f64::max)
        * 1e3)
        .max(1e-6);
    // About 12 px per pass of the busiest worker, within readable limits.
    let most = schedule.workers.iter().map(Vec::len).max().unwrap_or(1);
    let plot = (most as f64 * 12.0).clamp(1000.0, 4000.0);
    let px = plot / span_ms;
    let width = LEFT + plot + RIGHT;
    let panel = PANEL_HEAD + workers as f64 * (ROW + GAP);
    let top = 80.0;
    let panels = lanes.len() + 1;
    let height = top + panels as f64 * panel + 50.0;
    let x_of = |ms: f64| LEFT + ms * px;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="{FONT}">"#,
        w = fmt_num(width, 1),
        h = fmt_num(height, 1)
    );
    let _ = writeln!(
        out,
        r##"<rect class="page" width="100%" height="100%" fill="#ffffff"/>"##
    );
    let mut title = format!("{} — job {} step {}:", schedule.name, trace.job, trace.step);
    for (_, name, sim) in &lanes {
        let _ = write!(
            title,
            " {name} {} ms, bubble {} ·",
            fmt_num(sim.makespan * 1e3, 2),
            fmt_percent(sim.bubble)
        );
    }
    let _ = write!(
        title,
        " executed {} ms, bubble {}",
        fmt_num(trace.makespan() * 1e3, 2),
        fmt_percent(trace.bubble())
    );
    let _ = writeln!(
        out,
        r##"<text x="{LEFT}" y="24" font-size="16" font-weight="bold" fill="#1b1b1b">{}</text>"##,
        escape(&title)
    );
    let mut legend = vec![
        (WAIT, "waiting for a peer's frame"),
        (SEND, "handing a frame to the transport"),
        (SYNC, "end-of-step all-reduce + optimizer"),
    ];
    let replicated = trace
        .workers
        .iter()
        .flatten()
        .any(|s| matches!(s.activity, Activity::AllReduce { .. }));
    if replicated {
        legend.push((ALL_REDUCE, "gradient sum over replicas"));
    }
    for (i, (colour, text)) in legend.into_iter().enumerate() {
        let lx = LEFT + 270.0 * i as f64;
        let _ = writeln!(
            out,
            r##"<rect class="legend" x="{}" y="36" width="12" height="12" fill="{colour}"/><text x="{}" y="46" font-size="12" fill="#333333">{text}</text>"##,
            fmt_num(lx, 1),
            fmt_num(lx + 16.0, 1)
        );
    }
    let _ = writeln!(
        out,
        r##"<text x="{LEFT}" y="66" font-size="12" fill="#555555">planned = on the costs known before this step · re-simulated = with this step's mean pass time per stage and kind, no communication cost · executed = what the workers recorded</text>"##
    );
    let pass_rect = |out: &mut String, pass: Pass, y: f64, a: f64, b: f64, title: &str| {
        let c = chunk.get(pass.stage as usize).copied().unwrap_or(0);
        let (fill, _) = colours(pass.kind, c, chunks);
        let w = (x_of(b) - x_of(a)).max(0.3);
        let _ = writeln!(
            out,
            r##"<rect class="pass" x="{}" y="{}" width="{}" height="{ROW}" fill="{fill}" stroke="#ffffff" stroke-width="{}"><title>{}</title></rect>"##,
            fmt_num(x_of(a), 2),
            fmt_num(y, 2),
            fmt_num(w, 2),
            if w > 4.0 { 0.5 } else { 0.0 },
            escape(title)
        );
    };
    let mut labels: Vec<&str> = lanes.iter().map(|l| l.1).collect();
    labels.push("executed");
    for (p, label) in labels.into_iter().enumerate() {
        let y0 = top + p as f64 * panel;
        let _ = writeln!(
            out,
            r##"<text x="{}" y="{}" font-size="13" font-weight="bold" fill="#1b1b1b">{label}</text>"##,
            fmt_num(LEFT, 1),
            fmt_num(y0 + 18.0, 1)
        );
        for w in 0..workers {
            let y = y0 + PANEL_HEAD + w as f64 * (ROW + GAP);
            let _ = writeln!(
                out,
                r##"<text x="{}" y="{}" font-size="11" text-anchor="end" fill="#1b1b1b">worker {w}</text><rect class="row" x="{LEFT}" y="{}" width="{}" height="{ROW}" fill="#f2f2f2"/>"##,
                fmt_num(LEFT - 8.0, 1),
                fmt_num(y + ROW / 2.0 + 4.0, 1),
                fmt_num(y, 2),
                fmt_num(plot, 2)
            );
            if let Some(&(_, _, sim)) = lanes.get(p) {
                let p0 = super::first_start(sim);
                for t in sim.timeline.get(w).into_iter().flatten() {
                    let (a, b) = ((t.start - p0) * 1e3, (t.end - p0) * 1e3);
                    let title = format!("{}: {}–{} ms", t.pass, fmt_num(a, 3), fmt_num(b, 3));
                    pass_rect(&mut out, t.pass, y, a, b, &title);
                }
                continue;
            }
            for s in trace.workers.get(w).into_iter().flatten() {
                let (a, b) = ((s.start - origin) * 1e3, (s.end - origin) * 1e3);
                let (name, _, _) = describe(&s.activity);
                let title = format!("{name}: {}–{} ms", fmt_num(a, 3), fmt_num(b, 3));
                match s.activity {
                    Activity::Pass(pass) => pass_rect(&mut out, pass, y, a, b, &title),
                    _ => mark(&mut out, s, y, x_of(a), x_of(b), &title),
                }
            }
        }
    }
    let axis_y = top + panels as f64 * panel + 4.0;
    time_axis(&mut out, (LEFT, plot), (span_ms, px), axis_y, "ms");
    out.push_str("</svg>\n");
    out
}

/// A wait, hand-over or sync span: a coloured band across the row's lower or upper part.
fn mark(out: &mut String, s: &Span, y: f64, x0: f64, x1: f64, title: &str) {
    let (class, colour, dy, h) = match s.activity {
        Activity::Recv { .. } => ("wait", WAIT, ROW * 0.6, ROW * 0.4),
        Activity::Send { .. } => ("send", SEND, 0.0, ROW * 0.3),
        // Beside the passes: a thin band along the row's top edge.
        Activity::AllReduce { .. } => ("all-reduce", ALL_REDUCE, 0.0, ROW * 0.15),
        _ => ("sync", SYNC, ROW * 0.25, ROW * 0.5),
    };
    let _ = writeln!(
        out,
        r##"<rect class="{class}" x="{}" y="{}" width="{}" height="{}" fill="{colour}"><title>{}</title></rect>"##,
        fmt_num(x0, 2),
        fmt_num(y + dy, 2),
        fmt_num((x1 - x0).max(0.3), 2),
        fmt_num(h, 2),
        escape(title)
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{Costs, Times};
    use crate::generate::{Request, ScheduleKind, generate};
    use crate::simulate::simulate;
    use crate::trace::measured_costs;

    #[test]
    fn both_timelines_carry_every_pass() {
        let s = generate(&Request::new(ScheduleKind::VHalf, 2, 4)).expect("v-half");
        let costs = Costs::uniform(&s.placement, Times::UNIT).expect("costs");
        let sim = simulate(&s, &costs).expect("simulate");
        // Execute the plan at 1 ms per unit, 5 ms late, with a wait before every pass of
        // worker 1 and a sync at the end.
        let trace = StepTrace {
            job: 3,
            step: 7,
            workers: sim
                .timeline
                .iter()
                .enumerate()
                .map(|(w, line)| {
                    let mut spans = Vec::new();
                    for t in line {
                        let (a, b) = (5.0 + t.start * 1e-3, 5.0 + t.end * 1e-3);
                        if w == 1 {
                            spans.push(Span {
                                activity: Activity::Recv {
                                    pass: t.pass,
                                    peer: 0,
                                },
                                start: a - 1e-4,
                                end: a,
                            });
                        }
                        spans.push(Span {
                            activity: Activity::Pass(t.pass),
                            start: a,
                            end: b,
                        });
                    }
                    let end = 5.0 + sim.makespan * 1e-3;
                    spans.push(Span {
                        activity: Activity::Sync,
                        start: end,
                        end: end + 1e-3,
                    });
                    spans
                })
                .collect(),
        };
        trace.check(&s).expect("valid");
        let resim = simulate(&s, &measured_costs(&s, &trace).expect("costs")).expect("resim");
        // The plan: the same schedule on costs twice as slow as the execution's.
        let slow = Costs::uniform(
            &s.placement,
            Times {
                f: 2e-3,
                b: 2e-3,
                w: 2e-3,
                comm: 0.0,
            },
        );
        let plan = simulate(&s, &slow.expect("costs")).expect("plan");
        let sims = Simulated {
            planned: Some(&plan),
            resimulated: &resim,
        };
        let v = chrome_trace(&s, sims, &trace);
        let events = v["traceEvents"].as_array().expect("events");
        let count = |pid: u64, cat: &str| {
            events
                .iter()
                .filter(|e| e["ph"] == "X" && e["pid"] == pid && e["cat"] == cat)
                .count()
        };
        let f = count(0, "F");
        assert_eq!(f, count(1, "F"));
        assert_eq!(f, count(2, "F"));
        assert_eq!(v["otherData"]["planned_makespan_s"], plan.makespan);
        assert_eq!(v["otherData"]["resimulated_makespan_s"], resim.makespan);
        assert_eq!(f, 2 * 2 * 4, "two stages per worker, four microbatches");
        assert_eq!(count(1, "recv"), s.workers[1].len());
        assert_eq!(count(1, "sync"), 2);
        assert!(
            events
                .iter()
                .all(|e| e["ph"] != "X" || e["ts"].as_f64().is_some_and(|t| t >= 0.0))
        );
        let text = svg(&s, sims, &trace);
        assert_eq!(text.matches("class=\"pass\"").count(), 3 * s.num_passes());
        assert_eq!(text.matches("class=\"wait\"").count(), s.workers[1].len());
        assert_eq!(text.matches("class=\"sync\"").count(), 2);
        assert!(text.contains("job 3 step 7"));
        assert!(text.contains(">re-simulated</text>") && text.contains(">planned</text>"));
        // Without a plan: the re-simulation and the execution.
        let text = svg(
            &s,
            Simulated {
                planned: None,
                resimulated: &resim,
            },
            &trace,
        );
        assert_eq!(text.matches("class=\"pass\"").count(), 2 * s.num_passes());
        assert!(!text.contains(">planned</text>"));
    }
}
