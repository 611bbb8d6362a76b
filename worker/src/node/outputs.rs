//! What a real run writes to its `output_dir`: checkpoints (`step-K/stage-S.safetensors`)
//! and the worker's final parameters (`final/worker-W.safetensors`), following no link
//! below the data directory ([`Confined`]).

use std::collections::HashMap;
use std::path::PathBuf;

use pipewise_common::job::{FINAL_CHECKPOINT, final_file_name};

use crate::checkpoint::save_tensors;
use crate::confined::Confined;
use crate::error::Result;
use crate::runtime::WorkerRuntime;
use crate::{Device, Tensor};

/// Writes the worker's parameters under their whole-model names; returns the file.
pub(crate) fn save_final(rt: &WorkerRuntime, output: &Confined, worker: u32) -> Result<PathBuf> {
    let dir = output.join(FINAL_CHECKPOINT)?.dir(true)?;
    let name = final_file_name(worker);
    let tensors: HashMap<String, Tensor> = rt
        .params()
        .map(|p| p.value.to_device(&Device::Cpu).map(|t| (p.name.clone(), t)))
        .collect::<std::result::Result<_, _>>()?;
    save_tensors(&dir, &name, &tensors)?;
    Ok(dir.path_of(name))
}
