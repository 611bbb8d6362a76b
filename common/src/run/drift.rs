//! The calibration rule, the straggler rule generalised: a run whose steps take well over
//! the plan's predicted time for several steps in a row has drifted from the costs it was
//! planned with; it is re-planned on the costs measured since, when the new plan is
//! predicted enough faster than the running one on those same costs.
//!
//! - **When**: [`DRIFT_STEPS`] steps in a row each take at least [`DRIFT_RATIO`] times their
//!   predicted time (real compute, checkpoints on, two workers or more, predictions from
//!   measured costs, two steps left).
//! - **Recalibration** (the supervisor's `recalibrate.rs`): the cost model forgets what it
//!   measured before those steps and is fitted to them alone, every pass time at its median
//!   over them (a passing load on one worker in one step, then another worker slowed, would
//!   otherwise read from their means as both slowed alike), starting from the per-piece costs
//!   fitted before them (the model keeps its last fits: the fits after the slowdown have
//!   already put a slowed worker's time into the pieces only it holds, such as the head). A
//!   drift is a worker's speed changing, not its pieces' work, and steps on one split cannot
//!   tell the two apart, so the workers' factors are fitted to those costs first.
//! - **Move**: the split balanced for the recalibrated per-piece costs and per-worker factors
//!   is simulated; when it is predicted [`DRIFT_GAIN`] times faster than the running split on
//!   the same costs, every worker stops after the step and the next run goes on from there on
//!   the new split (`pipewise_replans_total{reason="calibration"}`). A `schedule = "auto"` job
//!   chooses its whole plan again on the recalibrated costs.
//! - **Order with the straggler rule** ([`crate::run::straggler`]): this rule is checked
//!   first, and while it is counting drifted steps the straggler rule waits for its verdict,
//!   so a worker slowed mid-run is moved by what it measured rather than by FLOPs. When it
//!   finds no faster split, the straggler rule is checked in the same step.
//! - **Memory**: neither rule moves to a split predicted to hold more on a worker than the
//!   memory it registered (with replicas, each rank's tightest): balanced for speed alone, a
//!   move could pile layers onto a worker without room for them, and memory pressure would
//!   move the run again as it starts. Such a move goes as far as the memory allows: from the
//!   split in use, one piece at a time from a stage to another, each time the fitting move
//!   that shortens the busiest worker's time most, while one does (greedy: over 1,833 random
//!   small cases it stopped short of the fastest fitting split in 14); its reason ends "(as
//!   far as the workers' memory allows)".

/// A step drifted when it took at least this many times its predicted time.
pub const DRIFT_RATIO: f64 = 1.10;
/// Steps in a row that must have drifted.
pub const DRIFT_STEPS: usize = 3;
/// A new plan replaces the running one only when predicted at least this many times faster
/// (both predicted on the recalibrated costs).
pub const DRIFT_GAIN: f64 = 1.05;

/// The recent steps of a run that took longer than predicted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Drift {
    /// `(step, measured / predicted)` of the latest steps over [`DRIFT_RATIO`], in a row.
    over: Vec<(u64, f64)>,
}

impl Drift {
    /// Takes step `step`'s predicted and measured times (any one unit); whether the last
    /// [`DRIFT_STEPS`] steps all drifted. A step on time, or without a usable prediction,
    /// starts the count again.
    pub fn observe(&mut self, step: u64, predicted: f64, measured: f64) -> bool {
        let ratio = measured / predicted;
        if !(predicted > 0.0 && ratio.is_finite() && ratio >= DRIFT_RATIO) {
            self.over.clear();
            return false;
        }
        self.over.push((step, ratio));
        if self.over.len() > DRIFT_STEPS {
            self.over.remove(0);
        }
        self.over.len() == DRIFT_STEPS
    }

    /// Whether the latest steps drifted but fewer than [`DRIFT_STEPS`] in a row: the rule
    /// has not decided yet.
    pub fn pending(&self) -> bool {
        (1..DRIFT_STEPS).contains(&self.over.len())
    }

    /// Forgets the steps seen (after a re-plan, or one judged not worth it).
    pub fn reset(&mut self) {
        self.over.clear();
    }

    /// Why the run is re-planned: the drifted steps, and the predicted gain of `candidate`
    /// over `current` (predicted step times on the recalibrated costs).
    pub fn reason(&self, current: f64, candidate: f64) -> String {
        let steps: Vec<String> = self
            .over
            .iter()
            .map(|(s, r)| format!("{} ({:.0}% over)", s + 1, 100.0 * (r - 1.0)))
            .collect();
        format!(
            "steps {} took longer than planned; recalibrated, the new plan is predicted {:.0}% \
             faster",
            steps.join(", "),
            100.0 * (current / candidate - 1.0)
        )
    }
}

/// Whether moving from the running plan to `candidate` is worth a re-plan: `current` and
/// `candidate` are their predicted step times on the same (recalibrated) costs.
pub fn worth_replanning(current: f64, candidate: f64) -> bool {
    candidate > 0.0 && current.is_finite() && current >= DRIFT_GAIN * candidate
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_steps_in_a_row_ten_percent_over_have_drifted() {
        let mut d = Drift::default();
        assert!(!d.pending());
        assert!(!d.observe(4, 1.0, 1.10));
        assert!(d.pending());
        assert!(!d.observe(5, 1.0, 1.5));
        assert!(d.pending());
        assert!(d.observe(6, 1.0, 1.2));
        assert!(!d.pending());
        // A fourth over keeps it drifted; the oldest leaves the window.
        assert!(d.observe(7, 1.0, 1.3));
        assert!(
            d.reason(2.0, 1.0)
                .starts_with("steps 6 (50% over), 7 (20% over), 8 (30% over)")
        );
    }

    #[test]
    fn a_step_under_the_threshold_starts_the_count_again() {
        let mut d = Drift::default();
        assert!(!d.observe(1, 1.0, 1.2));
        assert!(!d.observe(2, 1.0, 1.2));
        // 9.9 % over is on time.
        assert!(!d.observe(3, 1.0, 1.099));
        assert!(!d.pending());
        assert!(!d.observe(4, 1.0, 1.2));
        assert!(!d.observe(5, 1.0, 1.2));
        assert!(d.observe(6, 1.0, 1.2));
        d.reset();
        assert!(!d.observe(7, 1.0, 1.2));
    }

    #[test]
    fn steps_without_a_usable_prediction_do_not_count() {
        let mut d = Drift::default();
        for (p, m) in [(0.0, 1.0), (-1.0, 1.0), (1.0, f64::NAN), (f64::NAN, 1.0)] {
            assert!(!d.observe(1, p, m));
            assert!(!d.observe(2, 1.0, 2.0));
            assert!(!d.observe(3, 1.0, 2.0));
            assert!(!d.observe(4, p, m), "({p}, {m}) counted");
        }
    }

    #[test]
    fn a_new_plan_must_be_five_percent_faster() {
        assert!(worth_replanning(1.05, 1.0));
        assert!(worth_replanning(2.0, 1.0));
        assert!(!worth_replanning(1.049, 1.0));
        assert!(!worth_replanning(1.0, 0.0));
        assert!(!worth_replanning(f64::INFINITY, 1.0));
    }
}
