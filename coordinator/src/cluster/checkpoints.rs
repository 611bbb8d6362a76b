//! A job's checkpoint folders on disk (`step-K/stage-S.safetensors`, `final/`): which one
//! is complete, where a run resumes, and what an abandoned run leaves behind.

use pipewise_common::job::{JobSpec, checkpoint_dir, checkpoint_file, checkpoint_step};

use crate::events::Start;

/// The step a run that started at `first_step` and completed every step before `through`
/// resumes from: the last checkpoint step after `first_step` (every `checkpoint.interval`
/// steps, when checkpoints are on) whose directory holds all `stages` stage files, else
/// `first_step`.
pub(super) fn last_checkpoint(
    output: &std::path::Path,
    spec: &JobSpec,
    first_step: u64,
    through: u64,
    stages: u32,
) -> u64 {
    if !spec.checkpoint.enable_checkpoint {
        return first_step;
    }
    let interval = u64::from(spec.checkpoint.interval.max(1));
    (first_step + 1..=through)
        .rev()
        .filter(|k| k % interval == 0)
        .find(|&k| complete(output, k, stages))
        .unwrap_or(first_step)
}

/// The job's latest complete checkpoint (0: none) once every worker has reported step
/// `reported` (1-based): a worker saves a step's checkpoint after reporting the step and
/// before reporting the next, so those of steps before `reported` are complete. With
/// `keep_latest_k` > 0 (at least 2: the store may still name the one before the latest),
/// removes those older than the latest K, on another thread. A failure to remove is logged,
/// not fatal.
pub(super) fn settle_checkpoints(output: &std::path::Path, spec: &JobSpec, reported: u64) -> u64 {
    if !spec.checkpoint.enable_checkpoint {
        return 0;
    }
    let Ok(entries) = std::fs::read_dir(output) else {
        return 0;
    };
    let mut complete: Vec<(u64, std::path::PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let k = checkpoint_step(&e.file_name().to_string_lossy())?;
            (k < reported).then(|| (k, e.path()))
        })
        .collect();
    complete.sort_by_key(|c| std::cmp::Reverse(c.0));
    let latest = complete.first().map_or(0, |(k, _)| *k);
    let keep = spec.checkpoint.keep_latest_k as usize;
    let old: Vec<(u64, std::path::PathBuf)> = match keep {
        0 => Vec::new(),
        _ => complete.into_iter().skip(keep).collect(),
    };
    if !old.is_empty() {
        // Beside the run: a slow file system does not hold up its step reports.
        std::thread::spawn(move || {
            for (k, path) in old {
                if let Err(e) = std::fs::remove_dir_all(&path) {
                    tracing::warn!(
                        "cannot remove the checkpoint of step {k} ({}): {e}",
                        path.display()
                    );
                }
            }
        });
    }
    latest
}

/// Where a job resumed after a coordinator restart starts: the checkpoint the store named
/// (`start.step`) if its folder is there, else (a store from before it was kept, or a
/// folder changed by hand) the latest complete one on `stages` stages at most the steps the
/// store counted (`start.through`), else 0.
pub(super) fn restart_step(
    output: &std::path::Path,
    spec: &JobSpec,
    start: Start,
    stages: u32,
) -> u64 {
    if start.step > 0 && checkpoint_dir(output, start.step).is_dir() {
        start.step
    } else {
        last_checkpoint(output, spec, 0, start.through, stages)
    }
}

/// Whether `step-K/` holds all `stages` stage files.
pub(super) fn complete(output: &std::path::Path, k: u64, stages: u32) -> bool {
    (0..stages).all(|s| checkpoint_file(output, k, s).is_file())
}

/// Removes what an abandoned run wrote after step `resume`: later step directories and
/// `final/`.
pub(super) fn remove_after(output: &std::path::Path, resume: u64) -> Result<(), String> {
    let entries = match std::fs::read_dir(output) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("cannot read {}: {e}", output.display())),
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let stale = name == "final" || checkpoint_step(&name).is_some_and(|k| k > resume);
        if stale {
            let path = entry.path();
            std::fs::remove_dir_all(&path)
                .map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use pipewise_common::job::example;
    use std::time::Duration;
    fn touch(path: &std::path::Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"x").unwrap();
    }

    /// The resume step is the last checkpoint with every stage's file; later directories
    /// and `final/` go.
    #[test]
    fn resumes_from_the_last_complete_checkpoint() {
        let out = std::env::temp_dir().join(format!("pipewise-resume-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let mut spec = example(2, "1f1b");
        spec.checkpoint.enable_checkpoint = true;
        spec.checkpoint.interval = 2;
        for k in [2, 4, 6] {
            for s in 0..4 {
                // Step 6 lost stage 3's file (the run died while writing it).
                if (k, s) != (6, 3) {
                    touch(&out.join(format!("step-{k}/stage-{s}.safetensors")));
                }
            }
        }
        touch(&out.join("final/worker-0.safetensors"));
        // Steps before 7 completed: 6 is incomplete, so 4.
        assert_eq!(last_checkpoint(&out, &spec, 0, 7, 4), 4);
        // Only steps before 3 completed: 4 is not trusted even though its files exist.
        assert_eq!(last_checkpoint(&out, &spec, 0, 3, 4), 2);
        // Nothing after the run's own start: it starts there again.
        assert_eq!(last_checkpoint(&out, &spec, 4, 5, 4), 4);
        // More stages than the files: none complete.
        assert_eq!(last_checkpoint(&out, &spec, 0, 7, 5), 0);
        spec.checkpoint.enable_checkpoint = false;
        assert_eq!(last_checkpoint(&out, &spec, 0, 7, 4), 0);
        remove_after(&out, 4).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        left.sort();
        assert_eq!(left, ["step-2", "step-4"]);
        std::fs::remove_dir_all(&out).unwrap();
    }

    /// After a coordinator restart: the checkpoint the store names if it is there, else the
    /// latest complete one up to the steps the store counted (a store from before names
    /// none), else the start.
    #[test]
    fn a_restart_resumes_from_the_named_or_the_latest_complete_checkpoint() {
        let out = std::env::temp_dir().join(format!("pipewise-restart-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let mut spec = example(2, "1f1b");
        spec.checkpoint.enable_checkpoint = true;
        spec.checkpoint.interval = 3;
        for k in [3, 6, 9] {
            // Step 9 lost stage 1's file.
            for s in 0..if k == 9 { 1 } else { 2 } {
                touch(&out.join(format!("step-{k}/stage-{s}.safetensors")));
            }
        }
        let at = |step, through| Start {
            step,
            restarts: 1,
            through,
        };
        assert_eq!(restart_step(&out, &spec, at(3, 10), 2), 3);
        assert_eq!(restart_step(&out, &spec, at(0, 10), 2), 6);
        assert_eq!(restart_step(&out, &spec, at(12, 10), 2), 6);
        assert_eq!(restart_step(&out, &spec, at(0, 5), 2), 3);
        assert_eq!(restart_step(&out, &spec, at(0, 2), 2), 0);
        std::fs::remove_dir_all(&out).unwrap();
    }

    /// Once step `reported` is reported, the checkpoints before it are complete: the latest
    /// is named, and with `keep_latest_k` only the latest K of them stay (a newer one being
    /// written is left alone); 0 keeps them all.
    #[test]
    fn settling_keeps_the_latest_k_complete_checkpoints() {
        let out = std::env::temp_dir().join(format!("pipewise-keep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let mut spec = example(2, "1f1b");
        spec.checkpoint.enable_checkpoint = true;
        spec.checkpoint.interval = 3;
        // The steps left: `expected` once the removals (beside the caller) are done, or
        // whatever is there after 5 s.
        let steps = |out: &std::path::Path, expected: &[u64]| -> Vec<u64> {
            let started = std::time::Instant::now();
            loop {
                let mut k: Vec<u64> = std::fs::read_dir(out)
                    .unwrap()
                    .filter_map(|e| checkpoint_step(&e.unwrap().file_name().to_string_lossy()))
                    .collect();
                k.sort_unstable();
                if k == expected || started.elapsed() > Duration::from_secs(5) {
                    return k;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        for k in [3, 6, 9, 12] {
            touch(&out.join(format!("step-{k}/stage-0.safetensors")));
        }
        spec.checkpoint.keep_latest_k = 0;
        assert_eq!(settle_checkpoints(&out, &spec, 10), 9);
        assert_eq!(steps(&out, &[3, 6, 9, 12]), [3, 6, 9, 12]);
        spec.checkpoint.keep_latest_k = 2;
        // Step 12 may still be written when step 10 is reported.
        assert_eq!(settle_checkpoints(&out, &spec, 10), 9);
        assert_eq!(steps(&out, &[6, 9, 12]), [6, 9, 12]);
        assert_eq!(settle_checkpoints(&out, &spec, 13), 12);
        assert_eq!(steps(&out, &[9, 12]), [9, 12]);
        spec.checkpoint.enable_checkpoint = false;
        assert_eq!(settle_checkpoints(&out, &spec, 13), 0);
        std::fs::remove_dir_all(&out).unwrap();
    }
}
