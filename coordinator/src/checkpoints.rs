//! A job's checkpoint folders on disk (`step-K/stage-S.safetensors`, `final/`): read into a
//! listing the run policies decide from, settled as steps complete, and cleared of what an
//! abandoned run left behind.

use std::collections::BTreeSet;
use std::path::Path;

use pipewise_common::job::{
    FINAL_CHECKPOINT, Found, JobSpec, check_links, checkpoint_step, job_dir,
};
use pipewise_common::run::Checkpoints;
use pipewise_common::run::checkpoints::settle;

use crate::error::{CoordinatorError, Result};

/// The checkpoint folders under `output` and the stage files each holds (none when
/// `output` does not exist yet).
pub(crate) fn read(output: &Path) -> Result<Checkpoints> {
    let entries = match std::fs::read_dir(output) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Checkpoints::default()),
        Err(source) => {
            return Err(CoordinatorError::Checkpoints {
                action: "read",
                path: output.to_path_buf(),
                source,
            });
        }
    };
    let mut listing = Checkpoints::default();
    for entry in entries.flatten() {
        let Some(k) = checkpoint_step(&entry.file_name().to_string_lossy()) else {
            continue;
        };
        let stages: BTreeSet<u32> = std::fs::read_dir(entry.path())
            .into_iter()
            .flatten()
            .flatten()
            .filter(|f| f.path().is_file())
            .filter_map(|f| stage_of(&f.file_name().to_string_lossy()))
            .collect();
        listing.steps.insert(k, stages);
    }
    Ok(listing)
}

/// The stage of a checkpoint file's name (`stage-S.safetensors` → S).
fn stage_of(name: &str) -> Option<u32> {
    name.strip_prefix("stage-")?
        .strip_suffix(".safetensors")?
        .parse()
        .ok()
}

/// The job's latest complete checkpoint (0: none) once every worker has reported step
/// `reported` (1-based), removing those older than the latest `keep_latest_k` on another
/// thread ([`settle`]). A failure to read or remove is logged, not fatal.
pub(crate) fn settle_checkpoints(output: &Path, spec: &JobSpec, reported: u64) -> u64 {
    if !spec.checkpoint.enable_checkpoint {
        return 0;
    }
    let saved = match read(output) {
        Ok(listing) => listing.steps.into_keys(),
        Err(e) => {
            tracing::warn!("{e}");
            return 0;
        }
    };
    let (latest, old) = settle(saved, spec, reported);
    if !old.is_empty() {
        let output = output.to_path_buf();
        // Beside the run: a slow file system does not hold up its step reports.
        std::thread::spawn(move || {
            for k in old {
                let path = pipewise_common::job::checkpoint_dir(&output, k);
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

/// Removes what an abandoned run wrote after step `resume`: later step directories and
/// `final/`.
pub(crate) fn remove_after(output: &Path, resume: u64) -> Result<()> {
    let failed = |action, path: &Path| {
        let path = path.to_path_buf();
        move |source| CoordinatorError::Checkpoints {
            action,
            path,
            source,
        }
    };
    let entries = match std::fs::read_dir(output) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(failed("read", output)(e)),
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let stale = name == FINAL_CHECKPOINT || checkpoint_step(&name).is_some_and(|k| k > resume);
        if stale {
            let path = entry.path();
            std::fs::remove_dir_all(&path).map_err(failed("remove", &path))?;
        }
    }
    Ok(())
}

/// Where job `job`'s checkpoints and final parameters go: `job-N` under its spec's
/// checkpoint folder, confined to the data directory ([`check_paths`]).
pub(crate) fn output_dir(data_dir: &Path, job: u64, spec: &JobSpec) -> Result<std::path::PathBuf> {
    let folder = spec.checkpoint_folder_in(data_dir)?;
    check_links("checkpoint.folder", &folder, data_dir, found)?;
    Ok(job_dir(&folder, job))
}

/// Creates job `job`'s output directory ([`output_dir`]); a failure names the field that
/// chose it.
pub(crate) fn create_output_dir(
    data_dir: &Path,
    job: u64,
    spec: &JobSpec,
) -> Result<std::path::PathBuf> {
    let output = output_dir(data_dir, job, spec)?;
    std::fs::create_dir_all(&output).map_err(|e| {
        pipewise_common::Error::invalid(
            "checkpoint.folder",
            format!("cannot create {}: {e}", output.display()),
        )
    })?;
    Ok(output)
}

/// Checks, at submit, that the spec's `checkpoint.folder` and `data.path` lead under the
/// data directory, symlinks followed (the workers check again under theirs), and that they
/// are usable there: the folder is not the coordinator's store nor under a file, and the
/// data is not a directory.
pub(crate) fn check_paths(data_dir: &Path, spec: &JobSpec) -> Result<()> {
    let output = output_dir(data_dir, 0, spec)?;
    let folder = spec.checkpoint_folder_in(data_dir)?;
    if folder
        .strip_prefix(data_dir)
        .ok()
        .and_then(|f| f.iter().next())
        == Some(std::ffi::OsStr::new(crate::store::STORE_FILE))
    {
        return Err(invalid(
            "checkpoint.folder",
            format!(
                "{} is the coordinator's job store; choose another folder",
                folder.display()
            ),
        ));
    }
    // Every part that exists must be a directory, or the job's folder cannot be made.
    for at in output.ancestors().take_while(|a| a.starts_with(data_dir)) {
        match std::fs::metadata(at) {
            Ok(m) if !m.is_dir() => {
                return Err(invalid(
                    "checkpoint.folder",
                    format!(
                        "{} is a file, where the job's folder needs a directory",
                        at.display()
                    ),
                ));
            }
            Ok(_) => break,
            Err(_) => continue,
        }
    }
    if let Some(path) = spec.data_path_in(data_dir)? {
        check_links("data.path", &path, data_dir, found)?;
        if std::fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
            return Err(invalid(
                "data.path",
                format!("{} is a directory; give a text file", path.display()),
            ));
        }
    }
    Ok(())
}

fn invalid(field: &'static str, reason: String) -> CoordinatorError {
    pipewise_common::Error::invalid(field, reason).into()
}

/// What is at `path`, symlinks followed.
fn found(path: &Path) -> Found {
    match std::fs::canonicalize(path) {
        Ok(real) => Found::At(real),
        Err(_) if path.symlink_metadata().is_ok() => Found::Dangling,
        Err(_) => Found::Nothing,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use pipewise_common::job::example;
    use pipewise_common::run::Start;
    use std::time::Duration;
    fn touch(path: &std::path::Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"x").unwrap();
    }

    /// An emptied folder `pipewise-{name}-{pid}` in the temporary directory, and the example
    /// two-worker 1F1B job checkpointing every `interval` steps.
    fn checkpointed(name: &str, interval: u32) -> (std::path::PathBuf, JobSpec) {
        let out = std::env::temp_dir().join(format!("pipewise-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let mut spec = example(2, "1f1b");
        spec.checkpoint.enable_checkpoint = true;
        spec.checkpoint.interval = interval;
        (out, spec)
    }

    /// The resume step is the last checkpoint with every stage's file; later directories
    /// and `final/` go.
    #[test]
    fn resumes_from_the_last_complete_checkpoint() {
        let (out, mut spec) = checkpointed("resume", 2);
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
        assert_eq!(read(&out).unwrap().last_complete(&spec, 0, 7, 4), 4);
        // Only steps before 3 completed: 4 is not trusted even though its files exist.
        assert_eq!(read(&out).unwrap().last_complete(&spec, 0, 3, 4), 2);
        // Nothing after the run's own start: it starts there again.
        assert_eq!(read(&out).unwrap().last_complete(&spec, 4, 5, 4), 4);
        // More stages than the files: none complete.
        assert_eq!(read(&out).unwrap().last_complete(&spec, 0, 7, 5), 0);
        spec.checkpoint.enable_checkpoint = false;
        assert_eq!(read(&out).unwrap().last_complete(&spec, 0, 7, 4), 0);
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
        let (out, spec) = checkpointed("restart", 3);
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
        assert_eq!(read(&out).unwrap().restart_step(&spec, at(3, 10), 2), 3);
        assert_eq!(read(&out).unwrap().restart_step(&spec, at(0, 10), 2), 6);
        assert_eq!(read(&out).unwrap().restart_step(&spec, at(12, 10), 2), 6);
        assert_eq!(read(&out).unwrap().restart_step(&spec, at(0, 5), 2), 3);
        assert_eq!(read(&out).unwrap().restart_step(&spec, at(0, 2), 2), 0);
        std::fs::remove_dir_all(&out).unwrap();
    }

    /// Once step `reported` is reported, the checkpoints before it are complete: the latest
    /// is named, and with `keep_latest_k` only the latest K of them stay (a newer one being
    /// written is left alone); 0 keeps them all.
    #[test]
    fn settling_keeps_the_latest_k_complete_checkpoints() {
        let (out, mut spec) = checkpointed("keep", 3);
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

    /// Paths inside the data directory that could not be used are refused at submit,
    /// naming the field: a folder under a file or the store's file, a directory as the
    /// corpus; and a folder that became unusable after submit fails the job's start with
    /// the field, not an actor's start-up.
    #[test]
    fn unusable_paths_inside_are_refused_naming_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        touch(&root.join("plain-file"));
        touch(&root.join(crate::store::STORE_FILE));
        std::fs::create_dir_all(root.join("corpora")).unwrap();
        type Edit = fn(&mut JobSpec);
        let cases: [(&str, Edit, &str); 5] = [
            (
                "checkpoint.folder",
                |s| s.checkpoint.folder = "plain-file/runs".into(),
                "is a file",
            ),
            (
                "checkpoint.folder",
                |s| s.checkpoint.folder = "plain-file".into(),
                "is a file",
            ),
            (
                "checkpoint.folder",
                |s| s.checkpoint.folder = "./jobs.redb/x".into(),
                "job store",
            ),
            (
                "data.path",
                |s| s.data.path = Some(".".into()),
                "is a directory",
            ),
            (
                "data.path",
                |s| s.data.path = Some("corpora".into()),
                "is a directory",
            ),
        ];
        for (field, edit, says) in cases {
            let mut spec = example(2, "1f1b");
            edit(&mut spec);
            match check_paths(root, &spec) {
                Err(CoordinatorError::Plan(pipewise_common::Error::InvalidArgument {
                    field: named,
                    reason,
                })) => {
                    assert_eq!(named, field, "{reason}");
                    assert!(reason.contains(says), "{field}: {reason}");
                }
                other => panic!("{field}: {other:?}"),
            }
        }
        let mut spec = example(2, "1f1b");
        spec.checkpoint.folder = "runs/a".into();
        spec.data.path = Some("corpora/tiny.txt".into());
        check_paths(root, &spec).unwrap();
        // The folder made a file after submit: the start fails naming the field.
        touch(&root.join("runs/a"));
        let err = create_output_dir(root, 7, &spec).unwrap_err().to_string();
        assert!(
            err.starts_with("invalid checkpoint.folder: cannot create"),
            "{err}"
        );
    }
}
