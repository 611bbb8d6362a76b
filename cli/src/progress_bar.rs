//! A one-line progress bar under a job's step lines, on a terminal only (`pipewise local`,
//! `submit --wait`, `watch`): steps done of the job's, the percentage, tokens per second,
//! the time left and the latest loss and validation loss, redrawn in place after every
//! step. The step lines are printed above it as they are without it, so a terminal shows
//! the same lines a pipe or a log gets, with the bar under them; a pipe gets no bar.
//!
//! The rate and the time left come from the wall time between step events, so they count
//! everything a step costs the run (evaluations, checkpoints, the coordinator), as tqdm's
//! do; the step line's tok/s is the step's own.

use std::io::{IsTerminal as _, Write as _};
use std::time::Instant;

/// Where a run stands, as the bar shows it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Standing {
    /// Steps done (the latest step event's step).
    pub(crate) done: u64,
    /// The job's steps.
    pub(crate) total: u64,
    /// Wall seconds a step takes, as measured so far (`None`: not yet known).
    pub(crate) secs_per_step: Option<f64>,
    /// Tokens a step trains on (0: not known).
    pub(crate) tokens_per_step: f64,
    /// The latest step's loss (NaN: none, e.g. emulated compute).
    pub(crate) loss: f64,
    /// The latest validation loss (`None`: none yet).
    pub(crate) val: Option<f64>,
}

/// The columns a bar takes when the terminal's width is unknown.
const DEFAULT_WIDTH: usize = 80;
/// The fewest cells the bar itself gets; narrower terminals get the text alone.
const MIN_CELLS: usize = 10;

/// The bar's line for `s`, at most `width` characters (see the [module docs](self)).
pub(crate) fn render(s: &Standing, width: usize) -> String {
    let total = s.total.max(1);
    let fraction = (s.done as f64 / total as f64).clamp(0.0, 1.0);
    let counts = format!(
        "{:>w$}/{total} {:>3.0}%",
        s.done,
        100.0 * fraction,
        w = total.to_string().len()
    );
    let mut tail = String::new();
    if let Some(secs) = s.secs_per_step.filter(|t| *t > 0.0 && t.is_finite()) {
        if s.tokens_per_step > 0.0 {
            tail.push_str(&format!("  {:.0} tok/s", s.tokens_per_step / secs));
        }
        let left = total.saturating_sub(s.done) as f64 * secs;
        tail.push_str(&format!("  ETA {}", clock(left)));
    }
    if s.loss.is_finite() {
        tail.push_str(&format!("  loss {:.4}", s.loss));
    }
    if let Some(v) = s.val {
        tail.push_str(&format!("  val {v:.4}"));
    }
    let text = counts.chars().count() + tail.chars().count();
    // `counts |bar|tail`: the bar takes what the text leaves of the width.
    let line = match width.checked_sub(text + 3) {
        Some(cells) if cells >= MIN_CELLS => {
            let cells = cells.min(40);
            let full = ((fraction * cells as f64).floor() as usize).min(cells);
            format!(
                "{counts} |{}{}|{tail}",
                "█".repeat(full),
                "░".repeat(cells - full)
            )
        }
        _ => format!("{counts}{tail}"),
    };
    line.chars().take(width).collect()
}

/// `1:02:03`, `2:05`, `0:07` (seconds rounded up: a run is never later than it said).
fn clock(secs: f64) -> String {
    let s = secs.max(0.0).ceil().min(u64::MAX as f64 / 2.0) as u64;
    match (s / 3600, s % 3600 / 60, s % 60) {
        (0, m, s) => format!("{m}:{s:02}"),
        (h, m, s) => format!("{h}:{m:02}:{s:02}"),
    }
}

/// A bar drawn on standard output (see the [module docs](self)).
pub(crate) struct Bar {
    standing: Standing,
    /// The first step event's time and step: the rate is measured from it.
    first: Option<(Instant, u64)>,
    /// Events since the first (steps run again after a re-plan count too).
    events: u64,
    drawn: bool,
}

impl Bar {
    /// A bar for a job of `total` steps of `tokens_per_step` tokens (0: not known), when
    /// standard output is a terminal.
    pub(crate) fn on_terminal(total: u64, tokens_per_step: f64) -> Option<Bar> {
        std::io::stdout().is_terminal().then(|| Bar {
            standing: Standing {
                done: 0,
                total,
                secs_per_step: None,
                tokens_per_step,
                loss: f64::NAN,
                val: None,
            },
            first: None,
            events: 0,
            drawn: false,
        })
    }

    /// Takes a step event (step `done`, its `loss`, its validation loss where it has one,
    /// its own wall time `step_secs`) and measures the rate at time `now`.
    pub(crate) fn step(
        &mut self,
        (done, loss, val): (u64, f64, Option<f64>),
        step_secs: f64,
        now: Instant,
    ) {
        let s = &mut self.standing;
        s.done = done;
        s.loss = loss;
        s.val = val.or(s.val);
        match self.first {
            None => {
                self.first = Some((now, done));
                s.secs_per_step = (step_secs > 0.0).then_some(step_secs);
            }
            Some((at, _)) => {
                self.events += 1;
                let elapsed = now.saturating_duration_since(at);
                s.secs_per_step = Some(elapsed.as_secs_f64() / self.events as f64);
            }
        }
    }

    /// A validation loss that came without a step (the one before the first step).
    pub(crate) fn validation(&mut self, val: f64) {
        self.standing.val = Some(val);
    }

    /// Erases the bar, so that a line can be printed where it was.
    pub(crate) fn clear(&mut self) {
        if std::mem::take(&mut self.drawn) {
            let mut out = std::io::stdout();
            let _ = write!(out, "\r\x1b[2K");
            let _ = out.flush();
        }
    }

    /// Draws the bar on the terminal's last line (after [`Bar::clear`] or a full line).
    pub(crate) fn draw(&mut self) {
        let width = terminal_size::terminal_size_of(std::io::stdout())
            .map_or(DEFAULT_WIDTH, |(w, _)| usize::from(w.0));
        // The last column left empty: some terminals wrap a line that fills it.
        let line = render(&self.standing, width.saturating_sub(1));
        let mut out = std::io::stdout();
        let _ = write!(out, "\r\x1b[2K{line}");
        let _ = out.flush();
        self.drawn = true;
    }
}

impl Drop for Bar {
    /// The lines after the run (the summary, an error) start on a line of their own.
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn standing(done: u64, secs: Option<f64>) -> Standing {
        Standing {
            done,
            total: 200,
            secs_per_step: secs,
            tokens_per_step: 2048.0,
            loss: 5.36904,
            val: Some(6.00061),
        }
    }

    /// The bar's fields, its fill in proportion to the steps done, and the time left from
    /// the measured step time.
    #[test]
    fn the_bar_shows_the_counts_rate_time_left_and_losses() {
        // 40 cells of bar: the text takes 59 columns, and 3 go around the bar.
        let line = render(&standing(50, Some(0.5)), 102);
        assert!(line.starts_with(" 50/200  25% |"), "{line}");
        assert!(
            line.ends_with("|  4096 tok/s  ETA 1:15  loss 5.3690  val 6.0006"),
            "{line}"
        );
        let (full, empty) = (line.matches('█').count(), line.matches('░').count());
        assert_eq!((full, empty), (10, 30), "{line}");
        assert_eq!(line.chars().count(), 102);
        // Done: a full bar and no time left.
        let line = render(&standing(200, Some(0.5)), 100);
        assert!(
            line.contains("200/200 100%") && line.contains("ETA 0:00"),
            "{line}"
        );
        assert_eq!(line.matches('░').count(), 0);
        // Before a rate is known: no rate and no time left.
        let line = render(&standing(0, None), 100);
        assert!(!line.contains("tok/s") && !line.contains("ETA"), "{line}");
    }

    /// A narrow terminal gets the text without the bar, cut to its width.
    #[test]
    fn a_narrow_terminal_gets_the_text_cut_to_its_width() {
        let line = render(&standing(50, Some(0.5)), 40);
        assert!(!line.contains('█') && !line.contains('░'), "{line}");
        assert_eq!(line.chars().count(), 40);
        assert!(line.starts_with(" 50/200  25%  4096 tok/s"), "{line}");
    }

    #[test]
    fn clock_times() {
        assert_eq!(clock(0.0), "0:00");
        assert_eq!(clock(6.2), "0:07");
        assert_eq!(clock(125.0), "2:05");
        assert_eq!(clock(3723.0), "1:02:03");
        assert_eq!(clock(-3.0), "0:00");
    }

    /// The rate is the wall time between events over the events since the first; the
    /// first event's own step time stands in until a second comes.
    #[test]
    fn the_rate_is_measured_between_events() {
        let mut bar = Bar {
            standing: standing(0, None),
            first: None,
            events: 0,
            drawn: false,
        };
        let t0 = Instant::now();
        bar.step((1, 8.0, None), 0.25, t0);
        assert_eq!(bar.standing.secs_per_step, Some(0.25));
        bar.step((2, 7.0, None), 0.25, t0 + Duration::from_secs(1));
        bar.step((3, 6.0, Some(6.5)), 0.25, t0 + Duration::from_secs(3));
        assert_eq!(bar.standing.secs_per_step, Some(1.5));
        assert_eq!(bar.standing.val, Some(6.5));
        // A step without an evaluation keeps the latest validation loss.
        bar.step((4, 5.0, None), 0.25, t0 + Duration::from_secs(4));
        assert_eq!((bar.standing.done, bar.standing.val), (4, Some(6.5)));
    }
}
