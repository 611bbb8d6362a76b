//! What `pipewise local` prints while its job runs: a line per step, the validation loss
//! before the first step as step 0's line, and on a terminal the progress bar under them
//! ([`crate::progress_bar`]). The step line's fields and their order stay (outside checks
//! read them, see [`crate::progress`]); new ones go after `peak KiB [...]`.

use std::time::Instant;

use pipewise_common::job::JobSpec;
use pipewise_common::run::StepEvent;

use crate::progress_bar::Bar;

/// The lines of one job's steps (see the [module docs](self)).
pub(super) struct StepLines {
    steps: u32,
    tokens_per_step: f64,
    quiet: bool,
    /// On a terminal, unless quiet.
    bar: Option<Bar>,
}

impl StepLines {
    /// The lines of job `spec`'s steps; `quiet`: only re-plans and plan choices.
    pub(super) fn new(spec: &JobSpec, quiet: bool) -> StepLines {
        let tokens_per_step =
            f64::from(spec.training.global_batch_size) * f64::from(spec.model.seq_len);
        let steps = spec.training.steps;
        StepLines {
            steps,
            tokens_per_step,
            quiet,
            bar: if quiet {
                None
            } else {
                Bar::on_terminal(steps.into(), tokens_per_step)
            },
        }
    }

    /// Prints step event `e` and redraws the bar.
    pub(super) fn event(&mut self, e: &StepEvent) {
        if let Some(bar) = &mut self.bar {
            bar.clear();
        }
        if !e.replan_reason.is_empty() {
            outln!("re-planned: {}", e.replan_reason);
        }
        if !e.plan_choice.is_empty() {
            outln!("{}", e.plan_choice);
        }
        if self.quiet {
            return;
        }
        if let Some(v) = e.initial_validation_loss {
            outln!("{}", initial_line(self.steps, v));
        }
        outln!("{}", step_line(e, self.steps, self.tokens_per_step));
        if let Some(bar) = &mut self.bar {
            if let Some(v) = e.initial_validation_loss {
                bar.validation(v);
            }
            let done = (e.step, e.loss, e.validation_loss);
            bar.step(done, e.step_time_ms / 1e3, Instant::now());
            bar.draw();
        }
        std::io::Write::flush(&mut std::io::stdout()).ok();
    }
}

/// Step 0's line: the validation loss before the first step, in the `val` column's form.
pub(super) fn initial_line(steps: u32, val: f64) -> String {
    format!("step {:>4}/{steps}  val {val:.4}", 0)
}

/// Step `e`'s line of a job of `steps` steps of `tokens_per_step` tokens.
pub(super) fn step_line(e: &StepEvent, steps: u32, tokens: f64) -> String {
    let peaks: Vec<String> = e
        .peak_bytes()
        .iter()
        .map(|p| format!("{:.0}", *p as f64 / 1024.0))
        .collect();
    format!(
        "step {:>4}/{}  loss {:>6}  {:>8.0} tok/s  bubble planned {:>5.1}% measured {:>5.1}%  peak KiB [{}]  predicted {:.1} ms{}",
        e.step,
        steps,
        if e.loss.is_nan() {
            "n/a".to_string()
        } else {
            format!("{:.4}", e.loss)
        },
        tokens / (e.step_time_ms / 1e3).max(1e-9),
        100.0 * e.planned_bubble,
        100.0 * e.measured_bubble,
        peaks.join(" "),
        e.predicted_step_time_ms,
        e.validation_loss
            .map_or(String::new(), |v| format!("  val {v:.4}"))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Step 0's line lines up with the step lines: the same `step N/M` column, then `val`.
    #[test]
    fn step_zero_lines_up_with_the_step_lines() {
        let e = StepEvent {
            step: 25,
            loss: 6.22994,
            step_time_ms: 500.0,
            planned_bubble: 0.526,
            measured_bubble: 0.538,
            predicted_step_time_ms: 578.0,
            validation_loss: Some(6.48271),
            peaks: vec![(1, 4096), (0, 2048)],
            ..Default::default()
        };
        let line = step_line(&e, 200, 2048.0);
        assert_eq!(
            line,
            "step   25/200  loss 6.2299      4096 tok/s  bubble planned  52.6% measured  53.8%  \
             peak KiB [2 4]  predicted 578.0 ms  val 6.4827"
        );
        let zero = initial_line(200, 8.35123);
        assert_eq!(zero, "step    0/200  val 8.3512");
        assert_eq!(zero.find("/200"), line.find("/200"));
    }
}
