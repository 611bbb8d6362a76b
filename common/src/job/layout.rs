//! Where a job's files go and how its runs are numbered: the checkpoint folders under a
//! job's output directory (`job-J/step-K/stage-S.safetensors`, `job-J/final/`) and the run
//! id that tells a job's runs apart.

use std::path::{Path, PathBuf};

/// The folder of a job's parameters at its end (`final/worker-W.safetensors`), beside
/// its `step-K` checkpoints.
pub const FINAL_CHECKPOINT: &str = "final";

/// A job's output directory under the checkpoint folder (`job-J`).
pub fn job_dir(folder: &Path, job: u64) -> PathBuf {
    folder.join(format!("job-{job}"))
}

/// The folder of a job's final parameters under its output directory (`final/`).
pub fn final_dir(output: &Path) -> PathBuf {
    output.join(FINAL_CHECKPOINT)
}

/// Worker `worker`'s final parameters, under their whole-model names
/// (`final/worker-W.safetensors`).
pub fn final_file(output: &Path, worker: u32) -> PathBuf {
    final_dir(output).join(final_file_name(worker))
}

/// The name of worker `worker`'s file in `final/` (`worker-W.safetensors`).
pub fn final_file_name(worker: u32) -> String {
    format!("worker-{worker}.safetensors")
}

/// The checkpoint directory after `step` steps under a job's output directory
/// (`step-K/`; workers write it, the coordinator resumes re-planned runs from it).
pub fn checkpoint_dir(output: &Path, step: u64) -> PathBuf {
    output.join(checkpoint_name(step))
}

/// The name of the checkpoint directory after `step` steps (`step-K`), the inverse of
/// [`checkpoint_step`].
pub fn checkpoint_name(step: u64) -> String {
    format!("step-{step}")
}

/// The checkpoint of stage `stage` after `step` steps (`step-K/stage-S.safetensors`).
pub fn checkpoint_file(output: &Path, step: u64, stage: u32) -> PathBuf {
    checkpoint_dir(output, step).join(checkpoint_file_name(stage))
}

/// The name of stage `stage`'s file in a checkpoint directory (`stage-S.safetensors`).
pub fn checkpoint_file_name(stage: u32) -> String {
    format!("stage-{stage}.safetensors")
}

/// The step of a checkpoint directory's name (`step-K` → K).
pub fn checkpoint_step(name: &str) -> Option<u64> {
    name.strip_prefix("step-")?.parse().ok()
}

/// The id of a job's `run`-th run (0: the first; each re-plan and each coordinator restart
/// starts another): the job id in the low 48 bits, the run's number above, so a worker can
/// tell the runs of a job apart (`Assignment.run`, `TensorFrame.run`).
pub fn run_id(job: u64, run: u64) -> u64 {
    job.wrapping_add(run << 48)
}

/// The job of a run id.
pub fn job_of(run_id: u64) -> u64 {
    run_id & ((1 << 48) - 1)
}

/// A run id's number within its job.
pub fn run_of(run_id: u64) -> u64 {
    run_id >> 48
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_split_into_job_and_run() {
        let id = run_id(12, 3);
        assert_eq!((job_of(id), run_of(id)), (12, 3));
        assert_eq!((job_of(12), run_of(12)), (12, 0));
        assert_eq!(run_id(12, 0), 12);
    }

    #[test]
    fn checkpoint_paths_round_trip_their_step() {
        let out = job_dir(Path::new("ckpt"), 7);
        assert_eq!(out, Path::new("ckpt/job-7"));
        assert_eq!(checkpoint_dir(&out, 30), Path::new("ckpt/job-7/step-30"));
        assert_eq!(
            checkpoint_file(&out, 30, 2),
            Path::new("ckpt/job-7/step-30/stage-2.safetensors")
        );
        assert_eq!(checkpoint_step(&checkpoint_name(30)), Some(30));
        assert_eq!(checkpoint_step(FINAL_CHECKPOINT), None);
        assert_eq!(
            final_file(&out, 1),
            Path::new("ckpt/job-7/final/worker-1.safetensors")
        );
    }
}
