//! Which of a job's checkpoints a run resumes from, decided from a listing of its output
//! folder (the coordinator reads the folder; nothing here touches a disk).

use std::collections::{BTreeMap, BTreeSet};

use crate::job::JobSpec;

/// Where a job's runs start: a new job at step 0; one the coordinator had queued or running
/// when it stopped, at the last checkpoint known to be complete, with run ids that none of
/// the earlier coordinator's runs had (its workers may still be running one of those).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Start {
    /// The first step: 0, or the step of a complete checkpoint.
    pub step: u64,
    /// Coordinator restarts the job has been through.
    pub restarts: u64,
    /// After a restart, the steps the store counted as done (no resume goes past them).
    pub through: u64,
}

/// A job's checkpoint folders as they are on disk: every `step-K/` and the stages whose
/// file (`stage-S.safetensors`) it holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checkpoints {
    /// Step → the stages saved in its folder.
    pub steps: BTreeMap<u64, BTreeSet<u32>>,
}

impl Checkpoints {
    /// Whether `step-K/` holds all `stages` stage files.
    pub fn complete(&self, k: u64, stages: u32) -> bool {
        self.steps
            .get(&k)
            .is_some_and(|saved| (0..stages).all(|s| saved.contains(&s)))
    }

    /// The step a run that started at `first_step` and completed every step before
    /// `through` resumes from: the last checkpoint step after `first_step` (every
    /// `checkpoint.interval` steps, when checkpoints are on) whose folder holds all `stages`
    /// stage files, else `first_step`.
    pub fn last_complete(&self, spec: &JobSpec, first_step: u64, through: u64, stages: u32) -> u64 {
        if !spec.checkpoint.enable_checkpoint {
            return first_step;
        }
        let interval = u64::from(spec.checkpoint.interval.max(1));
        (first_step + 1..=through)
            .rev()
            .filter(|k| k % interval == 0)
            .find(|&k| self.complete(k, stages))
            .unwrap_or(first_step)
    }

    /// Where a job resumed after a coordinator restart starts: the checkpoint the store
    /// named (`start.step`) if its folder is there, else (a store from before it was kept,
    /// or a folder changed by hand) the latest complete one on `stages` stages at most the
    /// steps the store counted (`start.through`), else 0.
    pub fn restart_step(&self, spec: &JobSpec, start: Start, stages: u32) -> u64 {
        if start.step > 0 && self.steps.contains_key(&start.step) {
            start.step
        } else {
            self.last_complete(spec, 0, start.through, stages)
        }
    }
}

/// The job's latest complete checkpoint (0: none) once every worker has reported step
/// `reported` (1-based), of the checkpoint folders `saved`, and the older ones to remove: a
/// worker saves a step's checkpoint after reporting the step and before reporting the next,
/// so those of steps before `reported` are complete. With `keep_latest_k` > 0 (at least 2:
/// the store may still name the one before the latest), those older than the latest K go.
pub fn settle(
    saved: impl IntoIterator<Item = u64>,
    spec: &JobSpec,
    reported: u64,
) -> (u64, Vec<u64>) {
    if !spec.checkpoint.enable_checkpoint {
        return (0, Vec::new());
    }
    let mut complete: Vec<u64> = saved.into_iter().filter(|&k| k < reported).collect();
    complete.sort_unstable_by(|a, b| b.cmp(a));
    let latest = complete.first().copied().unwrap_or(0);
    let old = match spec.checkpoint.keep_latest_k as usize {
        0 => Vec::new(),
        keep => complete.into_iter().skip(keep).collect(),
    };
    (latest, old)
}
