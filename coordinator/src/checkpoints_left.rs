//! Checkpoints already in a submitted job's output directory (`job-N` under its
//! `checkpoint.folder`: left by a job of the same id whose store is gone, or copied there):
//! a re-planned run of the job would resume from them, so those of another model are
//! refused at submit, naming the `[model]` field that differs
//! ([`CheckpointModel::check`]). Only each stage file's header and its meta tensors' few
//! bytes are read, never a parameter.

use std::fs::File;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::Path;

use pipewise_common::job::{JobSpec, checkpoint_step};
use pipewise_common::model::checkpoint_meta::{CheckpointModel, MODEL_TENSOR, SPEC_TENSOR};
use pipewise_common::model::hf_weights::{self, LENGTH_BYTES};

use crate::checkpoints::{invalid, output_dir};
use crate::error::Result;

/// The most bytes a meta tensor may take (a few i64 values).
const MAX_META_BYTES: u64 = 64;

/// Refuses job `job` when its output directory under `data_dir` holds a stage file
/// (`step-K/stage-S.safetensors`) of another model than `spec`'s, or one whose meta
/// cannot be read. Links are not followed; without checkpoints on, no run reads the folder
/// and nothing is checked.
pub(crate) fn check_left_checkpoints(data_dir: &Path, job: u64, spec: &JobSpec) -> Result<()> {
    if !spec.checkpoint.enable_checkpoint {
        return Ok(());
    }
    let output = output_dir(data_dir, job, spec)?;
    let Ok(steps) = std::fs::read_dir(&output) else {
        return Ok(());
    };
    for step in steps.flatten() {
        let is_step = checkpoint_step(&step.file_name().to_string_lossy()).is_some();
        if !is_step || !step.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(files) = std::fs::read_dir(step.path()) else {
            continue;
        };
        for file in files.flatten() {
            let name = file.file_name().to_string_lossy().into_owned();
            let stage_file = name.starts_with("stage-") && name.ends_with(".safetensors");
            if !stage_file || !file.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            let path = file.path();
            recorded_model(&path)?.check(&spec.model, &path.display().to_string())?;
        }
    }
    Ok(())
}

/// The model the stage file at `path` records.
fn recorded_model(path: &Path) -> Result<CheckpointModel> {
    let shown = path.display().to_string();
    let unreadable = |what: String| invalid("checkpoint.folder", format!("{shown}: {what}"));
    let mut file = File::open(path).map_err(|e| unreadable(format!("cannot be read: {e}")))?;
    let len = file
        .metadata()
        .map_err(|e| unreadable(format!("cannot be read: {e}")))?
        .len();
    let mut first = [0u8; LENGTH_BYTES as usize];
    file.read_exact(&mut first)
        .map_err(|e| unreadable(format!("not a safetensors file: {e}")))?;
    // The header's reasons name the file already; the job's field is the folder.
    let as_folder = |e: pipewise_common::Error| match e {
        pipewise_common::Error::InvalidArgument { reason, .. } => {
            invalid("checkpoint.folder", reason)
        }
        other => unreadable(other.to_string()),
    };
    let n = hf_weights::header_len(&shown, first, len).map_err(as_folder)?;
    let mut header = vec![0u8; usize::try_from(n).unwrap_or(usize::MAX)];
    file.read_exact(&mut header)
        .map_err(|e| unreadable(format!("cannot be read: {e}")))?;
    let tensors = hf_weights::parse_header(&shown, &header, len).map_err(as_folder)?;
    let mut ints = |key: &str| -> Result<Option<Vec<i64>>> {
        let Some(entry) = tensors.get(key) else {
            return Ok(None);
        };
        let bytes = entry.end.saturating_sub(entry.start);
        if entry.dtype != "I64" || bytes > MAX_META_BYTES {
            return Err(unreadable(format!(
                "{key} is {} {:?}, not a few I64 values",
                entry.dtype, entry.shape
            )));
        }
        let mut raw = vec![0u8; bytes as usize];
        file.seek(SeekFrom::Start(entry.start))
            .and_then(|_| file.read_exact(&mut raw))
            .map_err(|e| unreadable(format!("{key} cannot be read: {e}")))?;
        Ok(Some(
            raw.chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or_default()))
                .collect(),
        ))
    };
    let Some(spec) = ints(SPEC_TENSOR)? else {
        return Err(unreadable(format!(
            "has no {SPEC_TENSOR}: not a pipewise checkpoint"
        )));
    };
    Ok(CheckpointModel {
        spec,
        model: ints(MODEL_TENSOR)?,
    })
}
