//! A worker's step report and a job's step event on the wire: [`StepReport`] ↔
//! `v1::StepReport` (with [`StageTimes`] ↔ `v1::StageTimes`, seconds ↔ milliseconds) and
//! [`StepEvent`] ↔ `v1::StepEvent`.
//!
//! A step event's message carries what watchers see: the coordinator's own parts (the
//! trace, the planned costs, per-worker bubbles and sums, the checkpoint, the re-planned
//! schedule) stay behind and come back empty.

use pipewise_common::run::{StageTimes, StepEvent, StepReport};
use pipewise_common::trace::Span;

use super::ConvertError;
use crate::v1;

impl From<&StageTimes> for v1::StageTimes {
    fn from(t: &StageTimes) -> Self {
        let [edge_f_ms, edge_b_ms, edge_w_ms] = t.edge.map(|s| s * 1e3);
        v1::StageTimes {
            stage: t.stage,
            f_ms: t.f * 1e3,
            b_ms: t.b * 1e3,
            w_ms: t.w * 1e3,
            edge_f_ms,
            edge_b_ms,
            edge_w_ms,
        }
    }
}

impl From<&v1::StageTimes> for StageTimes {
    fn from(t: &v1::StageTimes) -> Self {
        StageTimes {
            stage: t.stage,
            f: t.f_ms / 1e3,
            b: t.b_ms / 1e3,
            w: t.w_ms / 1e3,
            edge: [t.edge_f_ms, t.edge_b_ms, t.edge_w_ms].map(|ms| ms / 1e3),
        }
    }
}

impl From<StepReport> for v1::StepReport {
    fn from(r: StepReport) -> Self {
        // Every field named: one added to the report is a choice made here, not a gap.
        let StepReport {
            run,
            worker_index,
            replica,
            worker_id,
            step,
            loss,
            wall_secs,
            busy_secs,
            core_wait_secs,
            pass_core_wait_secs,
            peak_activation_bytes,
            grad_norm,
            static_bytes,
            stage_times,
            bytes_sent,
            bytes_received,
            spans,
            error,
            starting,
            done,
            params_path,
            validation_loss,
            initial_validation_loss,
        } = r;
        v1::StepReport {
            run,
            worker_id,
            worker_index,
            step,
            loss,
            busy_secs,
            wall_secs,
            peak_activation_bytes,
            grad_norm,
            stage_times: stage_times.iter().map(v1::StageTimes::from).collect(),
            error,
            done,
            params_path,
            spans: spans.iter().map(v1::TraceSpan::from).collect(),
            bytes_sent: bytes_sent.into_iter().collect(),
            bytes_received: bytes_received.into_iter().collect(),
            static_bytes,
            core_wait_secs,
            pass_core_wait_secs,
            replica,
            starting,
            validation_loss,
            initial_validation_loss,
        }
    }
}

/// A worker's step report from its message. Only the spans can be malformed: then the
/// report comes without them (the step has no trace) and with the first bad span's error
/// beside it, for the receiver to log; the step's figures still count.
pub fn step_report_from_proto(r: v1::StepReport) -> (StepReport, Option<ConvertError>) {
    let v1::StepReport {
        run,
        worker_id,
        worker_index,
        step,
        loss,
        busy_secs,
        wall_secs,
        peak_activation_bytes,
        grad_norm,
        stage_times,
        error,
        done,
        params_path,
        spans,
        bytes_sent,
        bytes_received,
        static_bytes,
        core_wait_secs,
        pass_core_wait_secs,
        replica,
        starting,
        validation_loss,
        initial_validation_loss,
    } = r;
    let (spans, bad_span) = match spans.into_iter().map(Span::try_from).collect() {
        Ok(spans) => (spans, None),
        Err(e) => (Vec::new(), Some(e)),
    };
    let report = StepReport {
        run,
        worker_index,
        replica,
        worker_id,
        step,
        loss,
        wall_secs,
        busy_secs,
        core_wait_secs,
        pass_core_wait_secs,
        peak_activation_bytes,
        grad_norm,
        static_bytes,
        stage_times: stage_times.iter().map(StageTimes::from).collect(),
        bytes_sent: bytes_sent.into_iter().collect(),
        bytes_received: bytes_received.into_iter().collect(),
        spans,
        error,
        starting,
        done,
        params_path,
        validation_loss,
        initial_validation_loss,
    };
    (report, bad_span)
}

impl From<StepEvent> for v1::StepEvent {
    fn from(e: StepEvent) -> Self {
        v1::StepEvent {
            job: e.job,
            step: e.step,
            loss: e.loss,
            step_time_ms: e.step_time_ms,
            planned_bubble: e.planned_bubble,
            measured_bubble: e.measured_bubble,
            peaks: e
                .peaks
                .into_iter()
                .map(|(worker, peak_activation_bytes)| v1::WorkerPeak {
                    worker,
                    peak_activation_bytes,
                })
                .collect(),
            replan_reason: e.replan_reason,
            predicted_step_time_ms: e.predicted_step_time_ms,
            plan_choice: e.plan_choice,
            core_wait_bubble: e.core_wait_bubble,
            pass_core_wait: e.pass_core_wait,
            validation_loss: e.validation_loss,
            initial_validation_loss: e.initial_validation_loss,
        }
    }
}

impl From<v1::StepEvent> for StepEvent {
    fn from(e: v1::StepEvent) -> Self {
        // Every field named: one added to the message is a choice made here, not a gap.
        let v1::StepEvent {
            job,
            step,
            loss,
            step_time_ms,
            planned_bubble,
            measured_bubble,
            peaks,
            replan_reason,
            predicted_step_time_ms,
            plan_choice,
            core_wait_bubble,
            pass_core_wait,
            validation_loss,
            initial_validation_loss,
        } = e;
        StepEvent {
            job,
            step,
            loss,
            step_time_ms,
            planned_bubble,
            measured_bubble,
            core_wait_bubble,
            pass_core_wait,
            peaks: peaks
                .into_iter()
                .map(|p| (p.worker, p.peak_activation_bytes))
                .collect(),
            predicted_step_time_ms,
            plan_choice,
            validation_loss,
            initial_validation_loss,
            replan_reason,
            ..StepEvent::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use pipewise_common::Pass;
    use pipewise_common::trace::{Activity, StepTrace};

    use super::*;

    /// A report with every field set; its times are binary fractions of a second, exact in
    /// milliseconds too, so the round trip compares equal.
    fn full_report() -> StepReport {
        StepReport {
            run: (3 << 32) | 2,
            worker_index: 1,
            replica: 2,
            worker_id: "w1".into(),
            step: 9,
            loss: 4.5,
            wall_secs: 2.0,
            busy_secs: 1.5,
            core_wait_secs: 0.25,
            pass_core_wait_secs: 0.125,
            peak_activation_bytes: 1 << 20,
            grad_norm: 0.75,
            static_bytes: 1 << 30,
            stage_times: vec![StageTimes {
                stage: 4,
                f: 0.5,
                b: 1.0,
                w: 0.25,
                edge: [0.125, 0.0, 0.5],
            }],
            bytes_sent: [(0, 10), (2, 30)].into(),
            bytes_received: [(0, 20)].into(),
            spans: vec![
                Span {
                    activity: Activity::Pass(Pass::f(4, 0)),
                    start: 1.0,
                    end: 1.5,
                },
                Span {
                    activity: Activity::Sync,
                    start: 1.5,
                    end: 2.0,
                },
            ],
            error: "boom".into(),
            starting: true,
            done: true,
            params_path: "/out/final-1.safetensors".into(),
            validation_loss: Some(4.25),
            initial_validation_loss: Some(5.0),
        }
    }

    #[test]
    fn step_reports_round_trip() {
        let report = full_report();
        let msg = v1::StepReport::from(report.clone());
        assert_eq!(msg.stage_times[0].f_ms, 500.0);
        assert_eq!(msg.stage_times[0].edge_f_ms, 125.0);
        assert_eq!(msg.bytes_sent.get(&2), Some(&30));
        let (back, bad) = step_report_from_proto(msg.clone());
        assert_eq!(bad, None);
        assert_eq!(back, report);
        assert_eq!(v1::StepReport::from(back), msg);
        // A report without a step's figures (a worker's end) stays one.
        let done = StepReport {
            done: true,
            ..StepReport::default()
        };
        let (back, _) = step_report_from_proto(v1::StepReport::from(done.clone()));
        assert_eq!(back, done);
    }

    /// A malformed span costs the report its spans, not its figures, and names the field.
    #[test]
    fn a_bad_span_drops_the_spans_and_says_why() {
        let mut msg = v1::StepReport::from(full_report());
        msg.spans[1].end = -1.0;
        let (back, bad) = step_report_from_proto(msg);
        assert!(back.spans.is_empty());
        assert_eq!(back.stage_times, full_report().stage_times);
        assert_eq!(back.loss, 4.5);
        let bad = bad.expect("the span is refused");
        assert!(bad.to_string().starts_with("TraceSpan.end"), "{bad}");
    }

    #[test]
    fn step_events_round_trip_what_watchers_see() {
        let event = StepEvent {
            job: 5,
            step: 2,
            loss: 3.5,
            step_time_ms: 120.0,
            planned_bubble: 0.25,
            measured_bubble: 0.375,
            core_wait_bubble: 0.125,
            pass_core_wait: 0.0625,
            peaks: vec![(1, 200), (0, 100)],
            predicted_step_time_ms: 110.0,
            plan_choice: "chose 1f1b".into(),
            validation_loss: Some(3.25),
            initial_validation_loss: Some(4.0),
            replan_reason: "worker 1 is slow".into(),
            ..StepEvent::default()
        };
        let msg = v1::StepEvent::from(event.clone());
        assert_eq!(
            msg.peaks[0],
            v1::WorkerPeak {
                worker: 1,
                peak_activation_bytes: 200
            }
        );
        assert_eq!(StepEvent::from(msg.clone()), event);
        assert_eq!(v1::StepEvent::from(StepEvent::from(msg.clone())), msg);

        // The coordinator's own parts stay behind.
        let kept = StepEvent {
            predicted_peaks: vec![1, 2],
            checkpoint: 4,
            worker_bubbles: vec![(0, 0.5)],
            replica: 1,
            all_reduce: vec![(0, 0.5, 0.25)],
            trace: Some(Arc::new(StepTrace {
                job: 5,
                step: 2,
                workers: Vec::new(),
            })),
            ..event.clone()
        };
        assert_eq!(v1::StepEvent::from(kept), msg);
    }
}
