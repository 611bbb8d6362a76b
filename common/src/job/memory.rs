//! Memory prediction of a planned job: the activation peak and training state each worker
//! is predicted to hold in a step.

use super::plan::JobPlan;
use super::spec::JobSpec;
use crate::error::{Error, Result};

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
    pub fn predicted_peak_bytes_over(
        &self,
        spec: &JobSpec,
        ranges: &[std::ops::Range<usize>],
    ) -> Result<Vec<u64>> {
        use crate::pass::PassKind;
        self.check_ranges(ranges)?;
        let b = spec.parallelism.pipeline_parallel_microbatch_size;
        let per_stage: Vec<_> = ranges
            .iter()
            .map(|r| spec.model.range_activation_bytes(r.clone(), b))
            .collect();
        Ok(self
            .schedule
            .workers
            .iter()
            .map(|program| {
                let (mut now, mut peak) = (0i128, 0i128);
                for p in program {
                    let a = per_stage[p.stage as usize];
                    let (f, bw) = (
                        i128::from(a.after_forward),
                        i128::from(a.after_backward_input),
                    );
                    now += match p.kind {
                        PassKind::F => f,
                        PassKind::B => bw - f,
                        PassKind::W => -bw,
                        PassKind::BW => -f,
                    };
                    peak = peak.max(now);
                }
                // Never negative (it starts at 0); past u64 only for saturated stashes.
                u64::try_from(peak).unwrap_or(u64::MAX)
            })
            .collect())
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
}
