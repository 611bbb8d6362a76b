//! The executed timelines the coordinator keeps: for the last [`KEEP_JOBS`] jobs, the
//! spans of their last [`KEEP_STEPS`] steps, and never more than [`KEEP_SPANS`] spans in all
//! (the oldest steps go first; the latest step of each job stays) — in memory only, so a
//! restarted coordinator has none — and their rendering as a Chrome trace and an SVG next
//! to the plan.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use pipewise_common::cost::Costs;
use pipewise_common::render::executed::{self, Simulated};
use pipewise_common::schedule::Schedule;
use pipewise_common::simulate;
use pipewise_common::trace::{StepTrace, measured_costs};

use crate::error::{CoordinatorError, Result};

/// Steps kept per job.
pub const KEEP_STEPS: usize = 64;
/// Jobs whose traces are kept.
pub const KEEP_JOBS: usize = 8;
/// Spans kept over all jobs and steps (a span takes about 40 bytes).
pub const KEEP_SPANS: usize = 2_000_000;

/// A step's timeline rendered next to its plan.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderedTrace {
    /// Job id.
    pub job: u64,
    /// Step (1-based).
    pub step: u64,
    /// Chrome / Perfetto trace JSON (process 0 planned, process 1 executed).
    pub chrome_json: String,
    /// SVG: planned, re-simulated, executed.
    pub svg: String,
    /// Bubble of the step's plan (on the costs known before it; the re-simulation's when
    /// the step had no plan kept).
    pub planned_bubble: f64,
    /// Bubble of the schedule at the step's own mean pass times.
    pub resimulated_bubble: f64,
    /// Bubble of the execution.
    pub executed_bubble: f64,
    /// Steps kept for this job.
    pub kept: Vec<u64>,
}

/// A step's trace and the costs it was planned on.
#[derive(Debug)]
struct Kept {
    trace: Arc<StepTrace>,
    planned: Option<Arc<Costs>>,
}

/// One job's schedule and recent step traces.
#[derive(Debug)]
struct JobTraces {
    schedule: Arc<Schedule>,
    steps: VecDeque<Kept>,
}

/// The traces of recent jobs.
#[derive(Debug, Default)]
pub struct TraceStore {
    jobs: BTreeMap<u64, JobTraces>,
}

fn spans_of(k: &Kept) -> usize {
    k.trace.workers.iter().map(Vec::len).sum()
}

impl TraceStore {
    /// A job starts running under `schedule`; the oldest job is forgotten past [`KEEP_JOBS`].
    pub fn start(&mut self, job: u64, schedule: Schedule) {
        self.jobs.insert(
            job,
            JobTraces {
                schedule: Arc::new(schedule),
                steps: VecDeque::new(),
            },
        );
        while self.jobs.len() > KEEP_JOBS {
            self.jobs.pop_first();
        }
    }

    /// Keeps a step's trace and the costs it was planned on (the oldest step goes past
    /// [`KEEP_STEPS`]). A trace that does not match the job's schedule is dropped with a
    /// warning.
    pub fn add(&mut self, trace: Arc<StepTrace>, planned: Option<Arc<Costs>>) {
        let Some(entry) = self.jobs.get_mut(&trace.job) else {
            return;
        };
        if let Err(e) = trace.check(&entry.schedule) {
            tracing::warn!(job = trace.job, step = trace.step, "trace dropped: {e}");
            return;
        }
        entry.steps.push_back(Kept { trace, planned });
        while entry.steps.len() > KEEP_STEPS {
            entry.steps.pop_front();
        }
        // Over the span budget: drop the oldest steps, oldest jobs first, keeping each
        // job's latest step.
        let mut total: usize = self
            .jobs
            .values()
            .flat_map(|j| j.steps.iter())
            .map(spans_of)
            .sum();
        for entry in self.jobs.values_mut() {
            while total > KEEP_SPANS && entry.steps.len() > 1 {
                if let Some(old) = entry.steps.pop_front() {
                    total -= spans_of(&old);
                }
            }
        }
    }

    /// Renders step `step` of `job` (`0`: the latest kept).
    pub fn render(&self, job: u64, step: u64) -> Result<RenderedTrace> {
        let entry = self.jobs.get(&job).ok_or_else(|| CoordinatorError::BadRequest {
            field: "job",
            reason: format!("no traces are kept for job {job} (only for the last {KEEP_JOBS} jobs run since the coordinator started)"),
        })?;
        let kept: Vec<u64> = entry.steps.iter().map(|k| k.trace.step).collect();
        let found = if step == 0 {
            entry.steps.back()
        } else {
            entry.steps.iter().find(|k| k.trace.step == step)
        }
        .ok_or_else(|| CoordinatorError::BadRequest {
            field: "step",
            reason: match (kept.first(), kept.last()) {
                (Some(a), Some(b)) => {
                    format!("step {step} of job {job} is not kept; steps {a}..={b} are")
                }
                _ => format!("job {job} has no traced step yet"),
            },
        })?;
        let (schedule, trace) = (&entry.schedule, &found.trace);
        let resimulated = simulate(schedule, &measured_costs(schedule, trace)?)?;
        // Costs of another placement (kept across a re-plan) draw no plan.
        let planned = found
            .planned
            .as_ref()
            .and_then(|c| simulate(schedule, c).ok());
        let sims = Simulated {
            planned: planned.as_ref(),
            resimulated: &resimulated,
        };
        let chrome = executed::chrome_trace(schedule, sims, trace);
        Ok(RenderedTrace {
            job,
            step: trace.step,
            chrome_json: serde_json::to_string(&chrome)
                .map_err(|e| CoordinatorError::Actor(format!("cannot serialise the trace: {e}")))?,
            svg: executed::svg(schedule, sims, trace),
            planned_bubble: planned.as_ref().unwrap_or(&resimulated).bubble,
            resimulated_bubble: resimulated.bubble,
            executed_bubble: trace.bubble(),
            kept,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipewise_common::trace::{Activity, Span};
    use pipewise_common::{Request, ScheduleKind, generate};

    fn trace_of(schedule: &Schedule, job: u64, step: u64) -> Arc<StepTrace> {
        Arc::new(StepTrace {
            job,
            step,
            workers: schedule
                .workers
                .iter()
                .map(|program| {
                    program
                        .iter()
                        .enumerate()
                        .map(|(i, &p)| Span {
                            activity: Activity::Pass(p),
                            start: i as f64,
                            end: i as f64 + 0.5,
                        })
                        .collect()
                })
                .collect(),
        })
    }

    #[test]
    fn keeps_the_last_steps_and_names_what_is_missing() {
        let s = generate(&Request::new(ScheduleKind::OneFOneB, 2, 4)).expect("1f1b");
        let mut store = TraceStore::default();
        store.start(7, s.clone());
        for step in 1..=(KEEP_STEPS as u64 + 5) {
            store.add(trace_of(&s, 7, step), None);
        }
        let latest = store.render(7, 0).expect("latest");
        assert_eq!(latest.step, KEEP_STEPS as u64 + 5);
        assert_eq!(latest.kept.len(), KEEP_STEPS);
        assert_eq!(latest.kept[0], 6);
        assert!(latest.svg.starts_with("<svg"));
        let chrome: serde_json::Value =
            serde_json::from_str(&latest.chrome_json).expect("chrome json");
        assert_eq!(chrome["otherData"]["step"], KEEP_STEPS as u64 + 5);
        let err = store.render(7, 1).expect_err("step 1 is gone");
        assert!(
            err.to_string().contains("step 1 of job 7 is not kept"),
            "{err}"
        );
        assert!(store.render(8, 0).is_err());
        // A trace that does not match the schedule is dropped.
        let mut wrong = (*trace_of(&s, 7, 999)).clone();
        wrong.workers[0].pop();
        store.add(Arc::new(wrong), None);
        assert!(store.render(7, 999).is_err());
    }

    #[test]
    fn forgets_the_oldest_jobs() {
        let s = generate(&Request::new(ScheduleKind::GPipe, 1, 1)).expect("gpipe");
        let mut store = TraceStore::default();
        for job in 1..=(KEEP_JOBS as u64 + 2) {
            store.start(job, s.clone());
            store.add(trace_of(&s, job, 1), None);
        }
        assert!(store.render(1, 0).is_err());
        assert!(store.render(2, 0).is_err());
        assert!(store.render(3, 0).is_ok());
    }
}
