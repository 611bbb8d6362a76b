//! Memory prediction of a planned job: the activation peak and training state each worker
//! is predicted to hold in a step.

use super::plan::JobPlan;
use super::spec::JobSpec;
use crate::error::{Error, Result};
use crate::model::Piece;
use crate::schedule::{Recompute, RecomputeShares, backward_follows};

impl JobPlan {
    /// The peak activation bytes each worker is predicted to hold in a step: its program
    /// replayed in order over the stages of `spec.model` cut as the job cuts them
    /// ([`JobSpec::stage_ranges`]), each `F` adding the stage's stash after forward, `B`
    /// trading it for the stash after the input gradient, `W` (and `BW`) freeing it, the
    /// peak taken at pass boundaries with [`ModelSpec::piece_activation_bytes`]'s figures.
    ///
    /// [`ModelSpec::piece_activation_bytes`]: crate::model::ModelSpec::piece_activation_bytes
    pub fn predicted_peak_bytes(&self, spec: &JobSpec) -> Result<Vec<u64>> {
        let ranges = spec.stage_ranges(&self.schedule.placement)?;
        self.predicted_peak_bytes_over(spec, &ranges)
    }

    /// Everything each worker is predicted to hold in a step, on the job's layer split: its
    /// peak activations ([`JobPlan::predicted_peak_bytes`]) plus its training state
    /// ([`JobPlan::predicted_state_bytes_over`]).
    pub fn predicted_bytes(&self, spec: &JobSpec) -> Result<Vec<u64>> {
        let ranges = spec.stage_ranges(&self.schedule.placement)?;
        self.predicted_bytes_over(spec, &ranges)
    }

    /// [`JobPlan::predicted_bytes`] with the model's pieces cut into `ranges`.
    pub fn predicted_bytes_over(
        &self,
        spec: &JobSpec,
        ranges: &[std::ops::Range<usize>],
    ) -> Result<Vec<u64>> {
        let peaks = self.predicted_peak_bytes_over(spec, ranges)?;
        let state = self.predicted_state_bytes_over(spec, ranges)?;
        Ok(peaks
            .iter()
            .zip(state)
            .map(|(a, b)| a.saturating_add(b))
            .collect())
    }

    /// The parameters, gradients and two AdamW moments each worker holds, with the model's
    /// pieces cut into `ranges` (one per stage): [`DType::training_state_bytes`] per
    /// parameter of its stages, as a worker counts them in its step reports.
    ///
    /// [`DType::training_state_bytes`]: crate::model::DType::training_state_bytes
    pub fn predicted_state_bytes_over(
        &self,
        spec: &JobSpec,
        ranges: &[std::ops::Range<usize>],
    ) -> Result<Vec<u64>> {
        self.check_ranges(ranges)?;
        Ok(spec
            .model
            .state_bytes_by_worker(&self.schedule.placement, ranges))
    }

    /// Stage `stage`'s recomputation (none past the plan's modes).
    fn mode_of(&self, stage: usize) -> Recompute {
        self.recompute.get(stage).copied().unwrap_or_default()
    }

    /// `ranges` has one range per stage.
    fn check_ranges(&self, ranges: &[std::ops::Range<usize>]) -> Result<()> {
        let stages = self.schedule.placement.stages();
        if ranges.len() != stages as usize {
            return Err(Error::invalid(
                "stage_pieces",
                format!("{} ranges for {stages} stages", ranges.len()),
            ));
        }
        Ok(())
    }

    /// [`JobPlan::predicted_peak_bytes`] with the model's pieces cut into `ranges`, one per
    /// stage (e.g. a split that moved layers off a slow worker).
    ///
    /// With the plan's recomputation a stage's `F` keeps only its share of the stash
    /// ([`RecomputeShares::of_stage`]) and its `B` holds the part it rebuilds beside what is
    /// pending while it runs (as the worker counts its peaks): the whole stash with `full`,
    /// the part not kept and each block's input with `selective`. A microbatch whose `B`
    /// follows its `F` at once keeps its whole stash ([`backward_follows`]).
    pub fn predicted_peak_bytes_over(
        &self,
        spec: &JobSpec,
        ranges: &[std::ops::Range<usize>],
    ) -> Result<Vec<u64>> {
        use crate::pass::PassKind;
        self.check_ranges(ranges)?;
        let b = spec.parallelism.pipeline_parallel_microbatch_size;
        let per_stage: Vec<StageBytes> = ranges
            .iter()
            .enumerate()
            .map(|(s, r)| StageBytes::of(spec, r.clone(), b, self.mode_of(s)))
            .collect();
        Ok(self
            .schedule
            .workers
            .iter()
            .map(|program| {
                let whole = backward_follows(program);
                let (mut now, mut peak) = (0i128, 0i128);
                for p in program {
                    let mut s = per_stage[p.stage as usize];
                    if whole.contains(&(p.stage, p.mb)) {
                        s = s.keeping_all();
                    }
                    match p.kind {
                        PassKind::F => now += s.kept,
                        PassKind::B => {
                            peak = peak.max(now + s.rebuilt);
                            now += s.held_for_w - s.kept;
                        }
                        PassKind::W => now -= s.held_for_w,
                        PassKind::BW => {
                            peak = peak.max(now + s.rebuilt);
                            now -= s.kept;
                        }
                    }
                    peak = peak.max(now);
                }
                // Never negative (it starts at 0); past u64 only for saturated stashes.
                u64::try_from(peak).unwrap_or(u64::MAX)
            })
            .collect())
    }
}

/// A stage's activation bytes for one microbatch, as its worker holds them.
#[derive(Debug, Clone, Copy)]
struct StageBytes {
    /// Kept from `F` to `B`.
    kept: i128,
    /// Rebuilt at the start of `B` and held through it, beside what is pending.
    rebuilt: i128,
    /// Kept from `B` until `W`.
    held_for_w: i128,
    /// The whole stash, what `F` keeps without recomputation.
    stash: i128,
}

impl StageBytes {
    /// The bytes of a microbatch whose stash is kept whole.
    fn keeping_all(self) -> StageBytes {
        StageBytes {
            kept: self.stash,
            rebuilt: 0,
            ..self
        }
    }

    fn of(spec: &JobSpec, pieces: std::ops::Range<usize>, b: u32, mode: Recompute) -> StageBytes {
        let a = spec.model.range_activation_bytes(pieces.clone(), b);
        let stash = a.after_forward as f64;
        let shares = RecomputeShares::of_stage(&spec.model, pieces.clone(), b);
        let kept = (stash * shares.keep(mode)).round();
        // While B rebuilds, the kept inputs it rebuilds from are still held: with `full` the
        // stage's input beside its whole stash, with `selective` each block's input beside
        // the parts of its stash not kept (its attention output and log-sum-exp go on into
        // the stash).
        let block_inputs = spec.model.pieces().get(pieces.clone()).map_or(0, |p| {
            p.iter().filter(|p| matches!(p, Piece::Block(_))).count()
        }) as f64
            * f64::from(b)
            * f64::from(spec.model.seq_len)
            * f64::from(spec.model.hidden)
            * spec.model.dtype.bytes() as f64;
        let rebuilt = match mode {
            Recompute::None => 0.0,
            Recompute::Selective => stash - kept + block_inputs,
            Recompute::Full => stash,
        };
        StageBytes {
            kept: kept as i128,
            rebuilt: rebuilt as i128,
            held_for_w: i128::from(a.after_backward_input),
            stash: i128::from(a.after_forward),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::job::example;

    /// Predicted activation peaks follow the job's layer split, not the even one.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn predicted_peaks_follow_the_layer_split() {
        let mut spec = example(2, "1f1b");
        spec.model.layers = 8;
        let even = spec
            .validate()
            .unwrap()
            .predicted_peak_bytes(&spec)
            .unwrap();
        spec.parallelism.pipeline_parallel_first_stage_less_layers = 2;
        let placement = crate::placement::Placement::OnePerWorker { workers: 2 };
        let ranges = spec.stage_ranges(&placement).unwrap();
        assert_eq!(ranges, vec![0..4, 4..10]);
        let split = spec
            .validate()
            .unwrap()
            .predicted_peak_bytes(&spec)
            .unwrap();
        // Fewer blocks on worker 0, more on worker 1.
        assert!(split[0] < even[0], "{split:?} against {even:?}");
        assert!(split[1] > even[1], "{split:?} against {even:?}");
    }

    /// Recomputation shrinks the predicted peaks of 1F1B's fullest worker: full keeps each
    /// stage's input and holds one rebuilt stash; selective keeps more than full.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn recomputation_shrinks_the_predicted_peaks() {
        use crate::schedule::Recompute;
        let mut spec = example(4, "1f1b");
        spec.model.layers = 8;
        let mut peaks = Vec::new();
        for mode in Recompute::ALL {
            spec.activation_checkpoint.mode = mode.to_string();
            let plan = spec.validate().unwrap();
            peaks.push(plan.predicted_peak_bytes(&spec).unwrap());
        }
        let mut plan = spec.validate().unwrap();
        let (none, selective, full) = (&peaks[0], &peaks[1], &peaks[2]);
        assert!(full[0] < selective[0], "{full:?} against {selective:?}");
        assert!(selective[0] < none[0], "{selective:?} against {none:?}");
        // 1F1B's worker 0 keeps 4 microbatches: with full it holds 4 inputs and one
        // rebuilt stash instead of 4 stashes.
        let ranges = spec.stage_ranges(&plan.schedule.placement).unwrap();
        let b = spec.parallelism.pipeline_parallel_microbatch_size;
        let stash = spec.model.range_activation_bytes(ranges[0].clone(), b);
        assert_eq!(none[0], 4 * stash.after_forward);
        assert!(full[0] > stash.after_forward && full[0] < 2 * stash.after_forward);
        // Recomputing on the first stage only changes worker 0's peak alone.
        plan.recompute = vec![
            Recompute::Full,
            Recompute::None,
            Recompute::None,
            Recompute::None,
        ];
        let first = plan.predicted_peak_bytes(&spec).unwrap();
        assert_eq!(first[0], full[0]);
        assert_eq!(first[1..], none[1..]);
    }
}
