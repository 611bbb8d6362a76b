//! Rewriting a job's spec for a re-plan: onto another worker count, onto the schedule a
//! memory-pressure move chose, keeping the job's layer split.

use crate::job::{ActivationCheckpoint, JobPlan, JobSpec, Parallelism};

/// The job's own layer split for `plan`'s stages (torchtitan's first / last stage less
/// layers; empty: the default split, [`JobSpec::stage_ranges`]), as [`replan`] checked it for a plan on
/// another worker count.
pub fn spec_split(spec: &JobSpec, plan: &JobPlan) -> Vec<u32> {
    let d = plan.schedule.num_workers();
    let respecced;
    let spec = if d == spec.parallelism.pipeline_parallel_degree {
        spec
    } else {
        respecced = respec(spec, d);
        &respecced
    };
    let p = &spec.parallelism;
    // Every plan here came from a spec validated with the same split: an error cannot
    // happen, and the default split is the safe answer if it did.
    p.stage_pieces(spec.model.layers, plan.schedule.placement.stages())
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Makes `current` (the spec the runs follow) plan `schedule` at `limit` from now on, as a
/// memory-pressure move chose them on `d` workers: the limit, in units of `1/d` of the
/// model, is kept in units of `1/degree` as the spec's are; no blocks per stage pin the
/// stage count.
pub fn adopt(current: &mut JobSpec, schedule: String, limit: Option<f64>, d: u32) {
    let p = &mut current.parallelism;
    p.memory_limit = limit.map(|l| l * f64::from(p.pipeline_parallel_degree) / f64::from(d.max(1)));
    p.pipeline_parallel_schedule = schedule;
    unpin_stages(p);
}

/// After a loss: `current` (the spec the runs follow) planned for `d` workers, with the spec
/// it was planned from. When a memory-pressure move chose `current`'s schedule and limit
/// and the limit cannot be met on `d` workers, that schedule at its default limit, else
/// the job's own spec (the check before the run moves it again if it does not fit).
pub fn replan_after_loss(
    current: JobSpec,
    spec: &JobSpec,
    d: u32,
) -> crate::Result<(JobSpec, JobPlan)> {
    let first = match replan(&current, d) {
        Ok(plan) => return Ok((current, plan)),
        Err(e) if current == *spec => return Err(e),
        Err(e) => e,
    };
    let mut unlimited = current.clone();
    unlimited.parallelism.memory_limit = None;
    if let Ok(plan) = replan(&unlimited, d) {
        return Ok((unlimited, plan));
    }
    replan(spec, d)
        .map(|plan| (spec.clone(), plan))
        .map_err(|_| first)
}

/// Growing back: the plan of `spec` on min(`live`, degree) workers for a run on `d` that
/// `live` streaming workers outnumber, and why; else that worker count and the planner's
/// reason.
pub fn grown(
    spec: &JobSpec,
    d: usize,
    live: usize,
) -> std::result::Result<(String, JobPlan), (u32, crate::Error)> {
    let d2 = (live as u32).min(spec.parallelism.pipeline_parallel_degree);
    let plan = replan(spec, d2).map_err(|e| (d2, e))?;
    let reason = format!(
        "workers joined ({live} live); grew from {d} onto {d2} workers ({}, {} stages)",
        plan.kind.name(),
        plan.schedule.placement.stages()
    );
    Ok((reason, plan))
}

/// `spec` planned for `d` workers (see [`respec`]).
pub fn replan(spec: &JobSpec, d: u32) -> crate::Result<JobPlan> {
    respec(spec, d).validate()
}

/// `spec` for `d` workers: its degree set to `d`, its memory limit (in units of
/// `1/degree` of the model) scaled to the same bytes, and no blocks per stage nor modes
/// per stage (they pin the stage count, which changes with the workers: the stages
/// recompute as the most recomputing of them did).
pub fn respec(spec: &JobSpec, d: u32) -> JobSpec {
    let mut spec = spec.clone();
    if d != spec.parallelism.pipeline_parallel_degree {
        let ac = &mut spec.activation_checkpoint;
        if !ac.per_stage.is_empty() {
            *ac = ActivationCheckpoint::of_stages(&ac.modes_after_replan(1, &[]));
        }
    }
    let p = &mut spec.parallelism;
    p.memory_limit = p
        .memory_limit
        .map(|l| l * f64::from(d) / f64::from(p.pipeline_parallel_degree.max(1)));
    p.pipeline_parallel_degree = d;
    unpin_stages(p);
    spec
}

/// Drops blocks per stage (it pins the stage count) but keeps splitting the torchtitan way.
pub fn unpin_stages(p: &mut Parallelism) {
    if p.pipeline_parallel_layers_per_stage.take().is_some() {
        p.torchtitan_split = true;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::job::example;
    /// Re-planning keeps the memory limit's bytes: units of `1/d` of the model scale by
    /// `d' / d`.
    #[test]
    fn replanning_scales_the_memory_limit() {
        let mut spec = example(4, "adaptive-v");
        spec.parallelism.memory_limit = Some(3.0);
        let plan = replan(&spec, 2).unwrap();
        assert_eq!(plan.schedule.num_workers(), 2);
        let on_two = |limit: f64| {
            let mut two = spec.clone();
            two.parallelism.pipeline_parallel_degree = 2;
            two.parallelism.memory_limit = Some(limit);
            two.validate().unwrap().schedule
        };
        assert_eq!(plan.schedule, on_two(1.5));
        // Not vacuous: the unscaled limit plans another schedule.
        assert_ne!(plan.schedule, on_two(3.0));
    }

    /// torchtitan's first / last stage less layers survive a re-plan onto other workers,
    /// blocks per stage (which pins the stage count) included in the spec or not.
    #[test]
    fn the_layer_split_survives_a_replan() {
        let mut spec = example(4, "1f1b");
        spec.model.layers = 10;
        spec.parallelism.pipeline_parallel_first_stage_less_layers = 2;
        spec.parallelism.pipeline_parallel_layers_per_stage = Some(3);
        let plan = spec.validate().unwrap();
        // 10 blocks + 2 slots, 3 per stage: the first holds 1 block and the embedding.
        assert_eq!(spec_split(&spec, &plan), vec![2, 3, 3, 4]);
        let on_two = replan(&spec, 2).unwrap();
        // 12 slots, 6 per stage.
        assert_eq!(spec_split(&spec, &on_two), vec![5, 7]);
    }

    /// Blocks per stage alone asks for torchtitan's split (blocks evenly, the embedding and
    /// the head added to the end stages), which differs from the even split of the pieces;
    /// a re-planned or pressure-checked spec keeps it.
    #[test]
    fn blocks_per_stage_alone_keeps_the_torchtitan_split() {
        let mut spec = example(4, "1f1b");
        spec.parallelism.pipeline_parallel_layers_per_stage = Some(2);
        let plan = spec.validate().unwrap();
        assert_eq!(spec_split(&spec, &plan), vec![3, 2, 2, 3]);
        assert_eq!(
            spec.model.even_split(4).unwrap(),
            vec![0..3, 3..6, 6..8, 8..10]
        );
        let same = respec(&spec, 4);
        assert_eq!(same.parallelism.pipeline_parallel_layers_per_stage, None);
        let placement = &plan.schedule.placement;
        assert_eq!(
            same.stage_ranges(placement).unwrap(),
            spec.stage_ranges(placement).unwrap()
        );
        assert_eq!(spec_split(&same, &plan), vec![3, 2, 2, 3]);
        let mut moved = spec.clone();
        adopt(&mut moved, "v-half".into(), None, 4);
        let v_half = moved.validate().unwrap();
        // 8 blocks in 8 stages, the embedding and the head at the ends.
        assert_eq!(spec_split(&moved, &v_half), vec![2, 1, 1, 1, 1, 1, 1, 2]);
    }

    /// A loss after a memory-pressure move to an adaptive limit that cannot be met on the
    /// survivors re-plans that schedule at its default limit; the job's own limit is not
    /// dropped that way.
    #[test]
    fn a_loss_after_a_pressure_move_falls_back_to_a_plannable_limit() {
        let spec = example(4, "1f1b");
        let at = |limit: f64| {
            let mut c = spec.clone();
            adopt(&mut c, "adaptive-v".into(), Some(limit), 4);
            c
        };
        let limit = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
            .into_iter()
            .find(|&l| replan(&at(l), 4).is_ok() && replan(&at(l), 2).is_err())
            .expect("a limit met on 4 workers, not on 2");
        let (used, plan) = replan_after_loss(at(limit), &spec, 2).unwrap();
        assert_eq!(plan.kind.name(), "adaptive-v");
        assert_eq!(used.parallelism.memory_limit, None);
        assert_eq!(plan.schedule.num_workers(), 2);
        // The job's own limit: the loss fails the job as before.
        let own = at(limit);
        assert!(replan_after_loss(own.clone(), &own, 2).is_err());
    }
}
