//! A job's paths are confined to the data directory when they are used, not only when the
//! assignment is checked: a folder swapped for a symlink between two checkpoints is
//! refused at the next one, naming the job's field, and nothing is written outside.

mod common;

use std::path::{Path, PathBuf};

use pipewise_common::generate::{Request, ScheduleKind, generate};
use pipewise_worker::confined::Confined;
use pipewise_worker::runtime::WorkerRuntime;
use pipewise_worker::{AdamW, Corpus, Device, Error, Result, Stage};

/// Worker 0 of a two-worker 1F1B pipeline of the small model.
fn runtime() -> Result<WorkerRuntime> {
    let spec = common::small_spec(2);
    let schedule = generate(&Request::new(ScheduleKind::OneFOneB, 2, 2)).map_err(Error::from)?;
    let partition = Stage::even_split(&spec, 2)?;
    WorkerRuntime::new(
        0,
        &schedule,
        &spec,
        &partition,
        7,
        &Device::Cpu,
        AdamW::default(),
    )
}

/// Every path under `dir`, relative to it, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(at) = todo.pop() {
        for entry in std::fs::read_dir(&at).expect("a readable directory") {
            let path = entry.expect("an entry").path();
            if path.is_dir() && !path.is_symlink() {
                todo.push(path.clone());
            }
            let rel = path.strip_prefix(dir).expect("under dir");
            found.push(rel.display().to_string());
        }
    }
    found.sort();
    found
}

/// A data directory and a directory outside it, in a fresh temporary directory.
fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let (data, outside) = (tmp.path().join("data"), tmp.path().join("outside"));
    for dir in [&data, &outside] {
        std::fs::create_dir_all(dir).expect("created");
    }
    (tmp, data, outside)
}

/// `at` renamed away and replaced by a symlink to `target`.
fn swap_for_link(at: &Path, target: &Path) {
    let mut away = at.as_os_str().to_owned();
    away.push("-moved");
    std::fs::rename(at, away).expect("renamed");
    std::os::unix::fs::symlink(target, at).expect("linked");
}

/// The job's checkpoint folder (`ckpt`), its output directory (`ckpt/job-1`) or the next
/// step's directory (`ckpt/job-1/step-4`, planted before it is written) swapped for a link
/// to a directory outside after the checkpoint of step 2: the checkpoint of step 4 fails
/// naming `checkpoint.folder` and the link, nothing is written outside, and resuming
/// through the link is refused too.
#[test]
fn a_folder_swapped_for_a_link_between_checkpoints_is_refused() -> Result<()> {
    let rt = runtime()?;
    for swapped in ["ckpt", "ckpt/job-1", "ckpt/job-1/step-4"] {
        let (_tmp, data, outside) = dirs();
        let output = Confined::resolve("checkpoint.folder", &data, &data.join("ckpt/job-1"))?;
        rt.save_checkpoints(&output, 2)?;
        assert_eq!(
            listing(&data.join("ckpt/job-1")),
            ["step-2", "step-2/stage-0.safetensors"]
        );
        let link = data.join(swapped);
        if link.exists() {
            swap_for_link(&link, &outside);
        } else {
            std::os::unix::fs::symlink(&outside, &link).expect("linked");
        }

        let err = rt
            .save_checkpoints(&output, 4)
            .expect_err("a checkpoint through a link");
        match &err {
            Error::Confined { field, path } => {
                assert_eq!((*field, path.as_path()), ("checkpoint.folder", &*link))
            }
            other => panic!("{swapped}: {other:?}"),
        }
        let message = err.to_string();
        assert!(
            message.starts_with("invalid checkpoint.folder: ")
                && message.contains(&link.display().to_string())
                && message.contains("is a symlink; refusing to follow it"),
            "{message}"
        );
        assert_eq!(listing(&outside), Vec::<String>::new(), "{swapped}");

        // Reading through the link is refused as well (step 2 is outside's, were it
        // followed: a copy of the real one makes the read possible).
        if swapped != "ckpt/job-1/step-4" {
            let real = data.join(format!("{swapped}-moved"));
            copy_tree(&real, &outside);
            let mut reader = runtime()?;
            assert!(
                matches!(reader.resume(&output, 2), Err(Error::Confined { .. })),
                "{swapped}"
            );
        }
    }
    Ok(())
}

/// Copies the files under `from` into `to`, keeping their relative paths.
fn copy_tree(from: &Path, to: &Path) {
    for rel in listing(from) {
        let (src, dst) = (from.join(&rel), to.join(&rel));
        if src.is_dir() {
            std::fs::create_dir_all(dst).expect("created");
        } else {
            std::fs::copy(src, dst).expect("copied");
        }
    }
}

/// A checkpoint file's temporary name planted as a link to a file outside is not written
/// through: the checkpoint fails, the file outside keeps its bytes.
#[test]
fn a_partial_file_planted_as_a_link_is_not_written_through() -> Result<()> {
    let rt = runtime()?;
    let (_tmp, data, outside) = dirs();
    let output = Confined::resolve("checkpoint.folder", &data, &data.join("ckpt/job-1"))?;
    let victim = outside.join("victim");
    std::fs::write(&victim, b"keep").expect("written");
    let step = data.join("ckpt/job-1/step-2");
    std::fs::create_dir_all(&step).expect("created");
    let planted = step.join("stage-0.safetensors.partial");
    std::os::unix::fs::symlink(&victim, &planted).expect("linked");
    match rt.save_checkpoints(&output, 2) {
        Err(Error::Confined { field, path }) => {
            assert_eq!((field, path), ("checkpoint.folder", planted))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(std::fs::read(&victim).expect("read"), b"keep");
    Ok(())
}

/// A checkpoint written through the confined path loads back (the streamed file is a
/// whole safetensors file), and a link inside the data directory that was there when the
/// path was resolved keeps working.
#[test]
fn checkpoints_round_trip_and_links_there_at_resolution_keep_working() -> Result<()> {
    let (_tmp, data, outside) = dirs();
    std::fs::create_dir_all(data.join("disks/a")).expect("created");
    std::os::unix::fs::symlink(data.join("disks/a"), data.join("ckpt")).expect("linked");
    let output = Confined::resolve("checkpoint.folder", &data, &data.join("ckpt/job-1"))?;
    let rt = runtime()?;
    rt.save_checkpoints(&output, 2)?;
    assert!(
        data.join("disks/a/job-1/step-2/stage-0.safetensors")
            .is_file()
    );
    let mut back = runtime()?;
    back.resume(&output, 2)?;
    for (a, b) in rt.params().zip(back.params()) {
        assert_eq!(
            pipewise_worker::checkpoint::tensor_bits(&a.value)?,
            pipewise_worker::checkpoint::tensor_bits(&b.value)?,
            "{}",
            a.name
        );
    }
    // A path that leads out at resolution is refused there.
    std::os::unix::fs::symlink(&outside, data.join("out")).expect("linked");
    assert!(Confined::resolve("checkpoint.folder", &data, &data.join("out/job-1")).is_err());
    Ok(())
}

/// The corpus (`data.path`) swapped for a link to a file outside after the path was
/// resolved is not read.
#[test]
fn a_corpus_swapped_for_a_link_is_not_read() -> Result<()> {
    let (_tmp, data, outside) = dirs();
    std::fs::create_dir_all(data.join("texts")).expect("created");
    std::fs::write(data.join("texts/a.txt"), b"inside text").expect("written");
    std::fs::write(outside.join("secret.txt"), b"outside text").expect("written");
    let path = Confined::resolve("data.path", &data, &data.join("texts/a.txt"))?;
    Corpus::from_confined(&path)?;
    swap_for_link(&data.join("texts"), &outside);
    std::fs::rename(outside.join("secret.txt"), outside.join("a.txt")).expect("renamed");
    match Corpus::from_confined(&path) {
        Err(Error::Confined { field, path }) => {
            assert_eq!((field, path), ("data.path", data.join("texts")))
        }
        other => panic!("read through the link: {:?}", other.err()),
    }
    Ok(())
}
