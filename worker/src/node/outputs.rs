//! What a real run writes to its `output_dir`: checkpoints (`step-K/stage-S.safetensors`)
//! and the worker's final parameters (`final/worker-W.safetensors`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::runtime::WorkerRuntime;
use crate::{Device, Tensor};

fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Io {
        path: dir.to_path_buf(),
        source,
    })
}

/// Writes the worker's parameters under their whole-model names; returns the file.
pub(crate) fn save_final(rt: &WorkerRuntime, output: &Path, worker: u32) -> Result<PathBuf> {
    let dir = output.join("final");
    create_dir(&dir)?;
    let path = dir.join(format!("worker-{worker}.safetensors"));
    let tensors: HashMap<String, Tensor> = rt
        .params()
        .map(|p| p.value.to_device(&Device::Cpu).map(|t| (p.name.clone(), t)))
        .collect::<std::result::Result<_, _>>()?;
    candle_core::safetensors::save(&tensors, &path)?;
    Ok(path)
}
