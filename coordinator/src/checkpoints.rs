//! A job's checkpoint folders on disk (`step-K/stage-S.safetensors`, `final/`): read into a
//! listing the run policies decide from, settled as steps complete, and cleared of what an
//! abandoned run left behind.
//!
//! The job's output directory is resolved once, when its run starts ([`create_output_dir`]:
//! no link on the path it returns), and opened at each use without following a link on
//! any part of it: a folder swapped for a link to outside the data directory during the run
//! is refused, naming `checkpoint.folder`, and nothing outside is listed or removed.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::path::{Component, Path};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use pipewise_common::job::{
    FINAL_CHECKPOINT, Found, JobSpec, check_links, checkpoint_name, checkpoint_step, job_dir,
};
use pipewise_common::run::Checkpoints;
use pipewise_common::run::checkpoints::settle;

use crate::error::{CoordinatorError, Result};

/// The checkpoint folders under `output` and the stage files each holds (none when
/// `output` does not exist yet).
pub(crate) fn read(output: &Path) -> Result<Checkpoints> {
    let Some(dir) = open_output("read", output)? else {
        return Ok(Checkpoints::default());
    };
    let mut listing = Checkpoints::default();
    for name in names(&dir).map_err(failed("read", output))? {
        let Some(k) = checkpoint_step(&name) else {
            continue;
        };
        // A step's directory that is a link (or a file) holds no checkpoint.
        let Ok(step) = open_below(&dir, OsStr::new(&name)) else {
            continue;
        };
        let stages: BTreeSet<u32> = names(&step)
            .unwrap_or_default()
            .iter()
            .filter(|f| {
                rustix::fs::statat(&step, f.as_str(), AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::RegularFile)
            })
            .filter_map(|f| stage_of(f))
            .collect();
        listing.steps.insert(k, stages);
    }
    Ok(listing)
}

/// `action` on `path` failed with `source`.
fn failed(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> CoordinatorError {
    let path = path.to_path_buf();
    move |source| CoordinatorError::Checkpoints {
        action,
        path,
        source,
    }
}

/// The job's output directory `output` opened without following a link on any part of it
/// (`None`: it does not exist yet); a link on it is refused naming `checkpoint.folder`.
fn open_output(action: &'static str, output: &Path) -> Result<Option<OwnedFd>> {
    let start = if output.is_absolute() { "/" } else { "." };
    let mut dir = rustix::fs::open(
        start,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| failed(action, Path::new(start))(e.into()))?;
    let mut at = std::path::PathBuf::from(start);
    for part in output.components() {
        let name = match part {
            Component::Normal(name) => name,
            Component::RootDir | Component::CurDir => continue,
            Component::ParentDir | Component::Prefix(_) => {
                return Err(invalid(
                    "checkpoint.folder",
                    format!("{} is not a resolved path", output.display()),
                ));
            }
        };
        at.push(name);
        dir = match open_below(&dir, name) {
            Ok(next) => next,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(e) => {
                let link = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink);
                return Err(if link {
                    invalid(
                        "checkpoint.folder",
                        format!(
                            "{} is a symlink; refusing to follow it out of the data directory",
                            at.display()
                        ),
                    )
                } else {
                    failed(action, &at)(e.into())
                });
            }
        };
    }
    Ok(Some(dir))
}

/// Directory `name` in `dir`, opened only if it is a directory and not a link.
fn open_below(dir: &OwnedFd, name: &OsStr) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// The names in directory `dir` (`.` and `..` left out).
fn names(dir: &OwnedFd) -> std::io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name != "." && name != ".." {
            names.push(name);
        }
    }
    Ok(names)
}

/// Removes `name` from directory `dir`: a directory with what is in it, a file or a link
/// itself (never what a link leads to).
fn remove_at(dir: &OwnedFd, name: &OsStr) -> std::io::Result<()> {
    match open_below(dir, name) {
        Ok(inner) => {
            for entry in names(&inner)? {
                remove_at(&inner, OsStr::new(&entry))?;
            }
            rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?;
        }
        Err(rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => {
            rustix::fs::unlinkat(dir, name, AtFlags::empty())?;
        }
        Err(e) => return Err(e.into()),
    }
    Ok(())
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
            let dir = match open_output("remove", &output) {
                Ok(Some(dir)) => dir,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!("cannot remove old checkpoints: {e}");
                    return;
                }
            };
            for k in old {
                let name = checkpoint_name(k);
                if let Err(e) = remove_at(&dir, OsStr::new(&name)) {
                    tracing::warn!(
                        "cannot remove the checkpoint of step {k} ({}): {e}",
                        output.join(&name).display()
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
    let Some(dir) = open_output("read", output)? else {
        return Ok(());
    };
    for name in names(&dir).map_err(failed("read", output))? {
        let stale = name == FINAL_CHECKPOINT || checkpoint_step(&name).is_some_and(|k| k > resume);
        if stale {
            remove_at(&dir, OsStr::new(&name)).map_err(failed("remove", &output.join(&name)))?;
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

/// Creates job `job`'s output directory ([`output_dir`]) and returns it with its links
/// resolved, once: the run opens it without following any ([`read`], [`remove_after`]), so
/// a link swapped in later is refused. A failure names the field that chose it.
pub(crate) fn create_output_dir(
    data_dir: &Path,
    job: u64,
    spec: &JobSpec,
) -> Result<std::path::PathBuf> {
    let output = output_dir(data_dir, job, spec)?;
    let cannot = |e: std::io::Error| {
        invalid(
            "checkpoint.folder",
            format!("cannot create {}: {e}", output.display()),
        )
    };
    std::fs::create_dir_all(&output).map_err(cannot)?;
    let real = output.canonicalize().map_err(cannot)?;
    let real_root = data_dir.canonicalize().map_err(cannot)?;
    if !real.starts_with(&real_root) {
        return Err(invalid(
            "checkpoint.folder",
            format!(
                "{} leads to {} through a symlink, outside the data directory {}",
                output.display(),
                real.display(),
                data_dir.display()
            ),
        ));
    }
    Ok(real)
}

/// Checks, at submit, that the spec's `checkpoint.folder`, `data.path`, `data.tokenizer`
/// and `validation.path` lead under the data directory, symlinks followed (the workers check
/// again under theirs), and that they are usable there: the folder is not the
/// coordinator's store nor under a file, the data is not the data directory itself, and
/// the tokenizer is not a directory.
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
        // A folder of documents is data; the data directory itself also holds the jobs'
        // folders and the workers' token cache.
        if path == data_dir {
            return Err(invalid(
                "data.path",
                format!(
                    "{} is a directory, the data directory itself; give a file or a folder \
                     of documents inside it",
                    path.display()
                ),
            ));
        }
        // Creating the job's folder there would make the data a directory (or fail).
        if folder.starts_with(&path) {
            return Err(invalid(
                "data.path",
                format!(
                    "{} is where checkpoint.folder puts the job's folders ({}); give the \
                     data its own file",
                    path.display(),
                    folder.display()
                ),
            ));
        }
    }
    if let Some(path) = spec.data_tokenizer_in(data_dir)? {
        check_links("data.tokenizer", &path, data_dir, found)?;
        if std::fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
            return Err(invalid(
                "data.tokenizer",
                format!(
                    "{} is a directory; give a tokenizer.json file",
                    path.display()
                ),
            ));
        }
    }
    check_validation_path(data_dir, spec, &folder)
}

/// `validation.path` checked as `data.path` is ([`check_paths`]), `folder` the job's
/// `checkpoint.folder`.
fn check_validation_path(data_dir: &Path, spec: &JobSpec, folder: &Path) -> Result<()> {
    let Some(path) = spec.validation_path_in(data_dir)? else {
        return Ok(());
    };
    check_links("validation.path", &path, data_dir, found)?;
    if path == data_dir {
        return Err(invalid(
            "validation.path",
            format!(
                "{} is a directory, the data directory itself; give a file or a folder of \
                 documents inside it",
                path.display()
            ),
        ));
    }
    if folder.starts_with(&path) {
        return Err(invalid(
            "validation.path",
            format!(
                "{} is where checkpoint.folder puts the job's folders ({}); give the \
                 validation data its own file",
                path.display(),
                folder.display()
            ),
        ));
    }
    Ok(())
}

pub(crate) fn invalid(field: &'static str, reason: String) -> CoordinatorError {
    pipewise_common::Error::invalid(field, reason).into()
}

/// What is at `path`, symlinks followed.
pub(crate) fn found(path: &Path) -> Found {
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
        // Resolved, as `create_output_dir` gives it: the listing follows no link.
        let tmp = std::env::temp_dir().canonicalize().unwrap();
        let out = tmp.join(format!("pipewise-{name}-{}", std::process::id()));
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
        let cases: [(&str, Edit, &str); 6] = [
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
                "data.tokenizer",
                |s| s.data.tokenizer = Some("corpora".into()),
                "is a directory",
            ),
            (
                "data.path",
                |s| {
                    s.checkpoint.folder = "x".into();
                    s.data.path = Some("x".into());
                },
                "is where checkpoint.folder puts",
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
        // A folder of documents.
        spec.data.path = Some("corpora".into());
        check_paths(root, &spec).unwrap();
        // The folder made a file after submit: the start fails naming the field.
        touch(&root.join("runs/a"));
        let err = create_output_dir(root, 7, &spec).unwrap_err().to_string();
        assert!(
            err.starts_with("invalid checkpoint.folder: cannot create"),
            "{err}"
        );
    }

    /// The job's checkpoint folder, or its output directory, swapped for a link to a
    /// directory outside the data directory during the run: reading the listing and
    /// clearing or settling checkpoints refuse it naming `checkpoint.folder`, and nothing
    /// outside is removed.
    /// `validation.path` is checked at submit as `data.path` is, naming its field.
    #[test]
    fn a_validation_path_is_checked_as_the_data_path() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("corpora")).unwrap();
        let with = |path: &str, folder: &str| {
            let mut spec = example(2, "1f1b");
            spec.checkpoint.folder = folder.into();
            spec.validation = Some(pipewise_common::job::Validation {
                path: Some(path.into()),
                ..Default::default()
            });
            check_paths(root, &spec)
        };
        for (path, folder, says) in [
            (".", "runs", "the data directory itself"),
            ("x", "x", "is where checkpoint.folder puts"),
            ("../outside.txt", "runs", "outside"),
        ] {
            match with(path, folder) {
                Err(CoordinatorError::Plan(pipewise_common::Error::InvalidArgument {
                    field,
                    reason,
                })) => {
                    assert_eq!(field, "validation.path", "{reason}");
                    assert!(reason.contains(says), "{path}: {reason}");
                }
                other => panic!("{path}: {other:?}"),
            }
        }
        // A file or a folder of documents, as data.path.
        with("corpora/valid.txt", "runs").unwrap();
        with("corpora", "runs").unwrap();
    }

    #[test]
    fn a_folder_swapped_for_a_link_during_the_run_is_not_followed() {
        for swapped in ["runs", "runs/job-7"] {
            let dir = tempfile::tempdir().unwrap();
            let (root, outside) = (dir.path().join("data"), dir.path().join("outside"));
            let mut spec = example(2, "1f1b");
            spec.checkpoint.folder = "runs".into();
            spec.checkpoint.enable_checkpoint = true;
            spec.checkpoint.interval = 2;
            spec.checkpoint.keep_latest_k = 1;
            std::fs::create_dir_all(&root).unwrap();
            let output = create_output_dir(&root, 7, &spec).unwrap();
            touch(&output.join("step-2/stage-0.safetensors"));
            assert_eq!(read(&output).unwrap().steps.len(), 1);
            // Outside: what a listing through the link would find and clear.
            let planted = [
                "step-2/stage-0.safetensors",
                "step-4/stage-0.safetensors",
                "final/worker-0.safetensors",
            ];
            let base = if swapped == "runs" {
                outside.join("job-7")
            } else {
                outside.clone()
            };
            for file in planted {
                touch(&base.join(file));
            }
            let link = root.join(swapped);
            std::fs::rename(&link, root.join("moved")).unwrap();
            std::os::unix::fs::symlink(&outside, &link).unwrap();

            let refused = |err: CoordinatorError| {
                let err = err.to_string();
                assert!(
                    err.starts_with("invalid checkpoint.folder: ")
                        && err.contains(&link.display().to_string())
                        && err.contains("is a symlink"),
                    "{swapped}: {err}"
                );
            };
            refused(read(&output).unwrap_err());
            refused(remove_after(&output, 0).unwrap_err());
            assert_eq!(settle_checkpoints(&output, &spec, 5), 0);
            // The removals would run beside the caller: give them the time to.
            std::thread::sleep(Duration::from_millis(100));
            for file in planted {
                assert!(base.join(file).is_file(), "{swapped}: {file} removed");
            }
        }
    }

    /// Clearing removes a stale step's files and a link in it, never what the link leads
    /// to.
    #[test]
    fn clearing_removes_links_not_their_targets() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().canonicalize().unwrap().join("job-1");
        let victim = dir.path().join("victim");
        touch(&victim.join("keep.safetensors"));
        touch(&out.join("step-4/stage-0.safetensors"));
        std::os::unix::fs::symlink(&victim, out.join("step-4/stage-1.safetensors")).unwrap();
        std::os::unix::fs::symlink(&victim, out.join("final")).unwrap();
        // A step's directory that is a link holds no checkpoint.
        std::os::unix::fs::symlink(&victim, out.join("step-2")).unwrap();
        let listing = read(&out).unwrap();
        assert_eq!(listing.steps.keys().copied().collect::<Vec<_>>(), [4]);
        assert_eq!(listing.steps[&4], BTreeSet::from([0]));
        remove_after(&out, 2).unwrap();
        assert!(victim.join("keep.safetensors").is_file());
        assert!(!out.join("step-4").exists() && out.join("final").symlink_metadata().is_err());
    }
}
