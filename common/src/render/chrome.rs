//! A Chrome / Perfetto trace of a simulated schedule (the JSON "Trace Event Format").
//!
//! Open it in `chrome://tracing` or <https://ui.perfetto.dev>. Every pass is one complete
//! event (`"ph": "X"`) on process 0, thread = worker, named by its pass text (`0F3`, `1B0`,
//! `2W5`, `0BW1`) with `args` `stage`, `mb` and `kind`. Threads are named `worker N` by
//! metadata events.
//!
//! **Time scale:** one time unit of the cost model is shown as one millisecond, so `ts` and
//! `dur` (which the format gives in microseconds) are the simulated times × 1000.

use serde::Serialize;
use serde_json::{Value, json};

use crate::schedule::Schedule;
use crate::simulate::Simulation;

/// Microseconds per time unit of the cost model (one unit is shown as 1 ms).
pub const MICROS_PER_UNIT: f64 = 1000.0;

/// One pass as a complete event (written one by one: a JSON tree of a large schedule
/// took kilobytes per pass).
#[derive(Serialize)]
struct PassEvent<'a> {
    name: String,
    cat: &'a str,
    ph: &'a str,
    pid: u32,
    tid: usize,
    ts: f64,
    dur: f64,
    args: PassArgs<'a>,
}

#[derive(Serialize)]
struct PassArgs<'a> {
    stage: u32,
    mb: u32,
    kind: &'a str,
}

/// The trace as JSON text (`{"traceEvents": [...], "displayTimeUnit": "ms", ...}`).
pub fn chrome_trace(schedule: &Schedule, sim: &Simulation) -> String {
    let mut meta: Vec<Value> = vec![json!({
        "name": "process_name",
        "ph": "M",
        "pid": 0,
        "args": { "name": format!("pipewise: {}", schedule.name) },
    })];
    for w in 0..sim.timeline.len() {
        meta.push(json!({
            "name": "thread_name",
            "ph": "M",
            "pid": 0,
            "tid": w,
            "args": { "name": format!("worker {w}") },
        }));
        meta.push(json!({
            "name": "thread_sort_index",
            "ph": "M",
            "pid": 0,
            "tid": w,
            "args": { "sort_index": w },
        }));
    }
    let mut text = String::from("{\"traceEvents\":[");
    let mut first = true;
    let mut push = |event: String| {
        if !first {
            text.push(',');
        }
        first = false;
        text.push_str(&event);
    };
    for event in &meta {
        push(event.to_string());
    }
    for (w, line) in sim.timeline.iter().enumerate() {
        for timed in line {
            let pass = timed.pass;
            let event = PassEvent {
                name: pass.to_string(),
                cat: pass.kind.as_str(),
                ph: "X",
                pid: 0,
                tid: w,
                ts: timed.start * MICROS_PER_UNIT,
                dur: (timed.end - timed.start) * MICROS_PER_UNIT,
                args: PassArgs {
                    stage: pass.stage,
                    mb: pass.mb,
                    kind: pass.kind.as_str(),
                },
            };
            // Plain fields and finite numbers: serialising cannot fail.
            push(serde_json::to_string(&event).unwrap_or_default());
        }
    }
    let other = json!({
        "schedule": schedule.name,
        "workers": schedule.num_workers(),
        "microbatches": schedule.microbatches,
        "placement": schedule.placement.to_string(),
        "makespan": sim.makespan,
        "bubble": sim.bubble,
        "time_scale": "1 time unit = 1 ms",
    });
    text.push_str("],\"displayTimeUnit\":\"ms\",\"otherData\":");
    text.push_str(&other.to_string());
    text.push_str("}\n");
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{Costs, Times};
    use crate::generate::{Request, ScheduleKind, generate};
    use crate::simulate::simulate;

    #[test]
    fn one_complete_event_per_pass() {
        let s = generate(&Request::new(ScheduleKind::ZbH1, 4, 8)).expect("generates");
        let costs = Costs::uniform(&s.placement, Times::UNIT).expect("costs");
        let sim = simulate(&s, &costs).expect("simulates");
        let text = chrome_trace(&s, &sim);
        let value: Value = serde_json::from_str(&text).expect("parses");
        let events = value["traceEvents"].as_array().expect("events");
        let complete: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(complete.len(), s.num_passes());
        let names = events.iter().filter(|e| e["name"] == "thread_name").count();
        assert_eq!(names, 4);
        let last_end = complete
            .iter()
            .map(|e| e["ts"].as_f64().unwrap_or(0.0) + e["dur"].as_f64().unwrap_or(0.0))
            .fold(0.0, f64::max);
        assert!((last_end - sim.makespan * 1000.0).abs() < 1e-6);
        let first = complete[0];
        assert_eq!(first["tid"], 0);
        assert_eq!(first["name"], "0F0");
        assert_eq!(first["args"]["kind"], "F");
    }
}
