//! Executed timelines: what every worker did during one training step, as recorded by the
//! workers, next to what the schedule planned.
//!
//! A worker records one [`Span`] per pass it computed, per wait for a peer's frame, per hand
//! over of a frame to the transport, and one for the end-of-step collectives and optimizer
//! step. Times are seconds on a clock the workers share (the runtime records UNIX time, so
//! workers on one host line up exactly and workers on different hosts line up to their
//! clocks' agreement); only differences matter here.
//!
//! The *planned* timeline of the same step is the schedule simulated with the step's own
//! measured mean pass times per stage and kind and no communication cost
//! ([`measured_costs`]), so the gap between the two panels is what the runtime added:
//! waiting on peers, transport work and the end-of-step synchronisation.
//!
//! The renderers are in [`crate::render::executed`].

use serde::{Deserialize, Serialize};

use crate::cost::{Costs, StageCost};
use crate::error::{Error, Result};
use crate::pass::{Pass, PassKind};
use crate::schedule::Schedule;

/// What a worker spent a span of its step on.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Activity {
    /// Computing a pass.
    Pass(Pass),
    /// Blocked waiting for the frame `pass` needs from worker `peer`.
    Recv {
        /// The pass that needed the frame.
        pass: Pass,
        /// The worker that produces it.
        peer: u32,
    },
    /// Handing the output of `pass` to the transport, bound for worker `peer`.
    Send {
        /// The pass that produced the frame.
        pass: Pass,
        /// The worker that consumes it.
        peer: u32,
    },
    /// The end-of-step gradient-norm and loss all-reduce and the optimizer step.
    Sync,
    /// Summing stage `stage`'s gradients over the job's data-parallel replicas: started
    /// when the stage's last gradient pass of the step ends, beside the passes still to run.
    AllReduce {
        /// The stage whose gradients are summed.
        stage: u32,
    },
}

/// One recorded span of a worker's step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Span {
    /// What the worker did.
    pub activity: Activity,
    /// Start, in seconds on the shared clock.
    pub start: f64,
    /// End, in seconds on the shared clock (≥ `start`).
    pub end: f64,
}

impl Span {
    /// `end − start`.
    pub fn duration(&self) -> f64 {
        self.end - self.start
    }
}

/// When a worker's passes of a step ended: the end of its last pass or send (`None`
/// without either).
pub fn passes_end(spans: &[Span]) -> Option<f64> {
    spans
        .iter()
        .filter(|s| matches!(s.activity, Activity::Pass(_) | Activity::Send { .. }))
        .map(|s| s.end)
        .reduce(f64::max)
}

/// A worker's gradient sums over the replicas in a step: their seconds in all, and how far
/// the last ran past its passes ([`passes_end`]; what the step waited for them).
pub fn sums(spans: &[Span]) -> (f64, f64) {
    let summing = spans
        .iter()
        .filter(|s| matches!(s.activity, Activity::AllReduce { .. }));
    let total = summing.clone().map(Span::duration).sum();
    let last = summing.map(|s| s.end).reduce(f64::max);
    let exposed = match (last, passes_end(spans)) {
        (Some(last), Some(passes)) => (last - passes).max(0.0),
        _ => 0.0,
    };
    (total, exposed)
}

/// One step of one job as executed by all its workers.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct StepTrace {
    /// Job id.
    pub job: u64,
    /// Step number (1-based, as users see it).
    pub step: u64,
    /// `workers[w]`: worker `w`'s spans in the order it recorded them.
    pub workers: Vec<Vec<Span>>,
}

impl StepTrace {
    /// The earliest start over every worker (0 when nothing was recorded).
    pub fn origin(&self) -> f64 {
        let t = self
            .workers
            .iter()
            .flatten()
            .map(|s| s.start)
            .fold(f64::INFINITY, f64::min);
        if t.is_finite() { t } else { 0.0 }
    }

    /// From the earliest start to the latest end over every worker.
    pub fn makespan(&self) -> f64 {
        let end = self
            .workers
            .iter()
            .flatten()
            .map(|s| s.end)
            .fold(f64::NEG_INFINITY, f64::max);
        if end.is_finite() {
            end - self.origin()
        } else {
            0.0
        }
    }

    /// Seconds each worker spent computing passes.
    pub fn busy(&self) -> Vec<f64> {
        self.workers
            .iter()
            .map(|spans| {
                spans
                    .iter()
                    .filter(|s| matches!(s.activity, Activity::Pass(_)))
                    .map(Span::duration)
                    .sum()
            })
            .collect()
    }

    /// `1 − Σ busy / (workers × makespan)` of the executed step (passes only; waits, sends
    /// and the end-of-step sync count as idle).
    pub fn bubble(&self) -> f64 {
        let span = self.makespan();
        if self.workers.is_empty() || span <= 0.0 {
            return 0.0;
        }
        1.0 - self.busy().iter().sum::<f64>() / (self.workers.len() as f64 * span)
    }

    /// Checks the trace against `schedule`: one list per worker, spans with finite,
    /// ordered times, and exactly the worker's program as its passes, in order.
    pub fn check(&self, schedule: &Schedule) -> Result<()> {
        let bad = |reason: String| Error::InvalidArgument {
            field: "trace",
            reason,
        };
        if self.workers.len() != schedule.workers.len() {
            return Err(bad(format!(
                "{} workers traced, the schedule has {}",
                self.workers.len(),
                schedule.workers.len()
            )));
        }
        for (w, (spans, program)) in self.workers.iter().zip(&schedule.workers).enumerate() {
            if let Some(s) = spans
                .iter()
                .find(|s| !s.start.is_finite() || !s.end.is_finite() || s.end < s.start)
            {
                return Err(bad(format!(
                    "worker {w}: span {:?} has bad times",
                    s.activity
                )));
            }
            let passes: Vec<Pass> = spans
                .iter()
                .filter_map(|s| match s.activity {
                    Activity::Pass(p) => Some(p),
                    _ => None,
                })
                .collect();
            if passes != *program {
                return Err(bad(format!(
                    "worker {w}: {} passes traced, its program has {} (or they differ in order)",
                    passes.len(),
                    program.len()
                )));
            }
        }
        Ok(())
    }
}

/// The cost model of a traced step: every stage's mean measured F, B and W durations (a
/// fused BW counts as B with W = 0), unit activation memory and no communication cost.
/// Stages or kinds that were never traced get the mean of the traced passes of that kind.
pub fn measured_costs(schedule: &Schedule, trace: &StepTrace) -> Result<Costs> {
    let stages = schedule.placement.stages() as usize;
    // sums[stage][kind] = (seconds, count); kind 0 F, 1 B or BW, 2 W.
    let mut sums = vec![[(0.0f64, 0u32); 3]; stages];
    let mut all = [(0.0f64, 0u32); 3];
    for span in trace.workers.iter().flatten() {
        if let Activity::Pass(p) = span.activity {
            let k = match p.kind {
                PassKind::F => 0,
                PassKind::B | PassKind::BW => 1,
                PassKind::W => 2,
            };
            if let Some(slot) = sums.get_mut(p.stage as usize) {
                slot[k].0 += span.duration();
                slot[k].1 += 1;
                all[k].0 += span.duration();
                all[k].1 += 1;
            }
        }
    }
    let mean = |(sum, n): (f64, u32)| (n > 0).then(|| sum / f64::from(n));
    let fallback = |k: usize| mean(all[k]).unwrap_or(0.0);
    let costs: Vec<StageCost> = sums
        .iter()
        .map(|s| StageCost {
            f: mean(s[0]).unwrap_or_else(|| fallback(0)),
            b: mean(s[1]).unwrap_or_else(|| fallback(1)),
            w: mean(s[2]).unwrap_or_else(|| fallback(2)),
            mem: 1.0,
        })
        .map(|mut c| {
            // The cost model refuses an all-zero stage; a stage too fast to time gets a
            // nanosecond forward.
            if c.f + c.b + c.w <= 0.0 {
                c.f = 1e-9;
            }
            c
        })
        .collect();
    Costs::per_stage(&schedule.placement, costs, 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{Request, ScheduleKind, generate};
    use crate::simulate::simulate;

    fn schedule() -> Schedule {
        generate(&Request::new(ScheduleKind::OneFOneB, 2, 3)).expect("1f1b")
    }

    /// A trace that executes the simulation exactly (shifted by `origin`).
    fn exact(schedule: &Schedule, costs: &Costs, origin: f64) -> StepTrace {
        let sim = simulate(schedule, costs).expect("simulate");
        StepTrace {
            job: 1,
            step: 1,
            workers: sim
                .timeline
                .iter()
                .map(|line| {
                    line.iter()
                        .map(|t| Span {
                            activity: Activity::Pass(t.pass),
                            start: origin + t.start,
                            end: origin + t.end,
                        })
                        .collect()
                })
                .collect(),
        }
    }

    #[test]
    fn an_exact_execution_has_the_planned_bubble_and_costs() {
        let s = schedule();
        let costs = Costs::uniform(&s.placement, crate::Times::UNIT).expect("costs");
        let trace = exact(&s, &costs, 1.7e9);
        trace.check(&s).expect("valid trace");
        let measured = measured_costs(&s, &trace).expect("costs");
        for stage in 0..s.placement.stages() {
            // 1F1B fuses the backward: BW measured 2 units, modelled as B = 2, W = 0.
            assert!((measured.duration(PassKind::F, stage) - 1.0).abs() < 1e-6);
            assert!((measured.duration(PassKind::BW, stage) - 2.0).abs() < 1e-6);
        }
        let sim = simulate(&s, &measured).expect("simulate");
        assert!((trace.bubble() - sim.bubble).abs() < 1e-6);
        assert!((trace.makespan() - sim.makespan).abs() < 1e-6);
    }

    #[test]
    fn waits_count_as_idle_and_broken_traces_are_refused() {
        let s = schedule();
        let costs = Costs::uniform(&s.placement, crate::Times::UNIT).expect("costs");
        let mut trace = exact(&s, &costs, 0.0);
        let before = trace.bubble();
        let end = trace.makespan();
        trace.workers[0].push(Span {
            activity: Activity::Sync,
            start: end,
            end: end + 3.0,
        });
        assert!(trace.bubble() > before);
        trace.check(&s).expect("a sync span is fine");
        trace.workers[1].pop();
        assert!(trace.check(&s).is_err());
        let mut bad = exact(&s, &costs, 0.0);
        bad.workers[0][0].end = f64::NAN;
        assert!(bad.check(&s).is_err());
    }
}
