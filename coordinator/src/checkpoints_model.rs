//! A job's Hugging Face directory (`model.path`) checked at submit, where the coordinator
//! can read it: its `config.json` completes the job's `[model]`, and the headers of its
//! weight files (only the headers: the 8-byte length and the JSON after it, never a
//! tensor's bytes) must hold every tensor the model reads, in its shape and a dtype pipewise
//! reads. Each refusal names the file and the key, as the workers' own reading would at the
//! job's start.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use pipewise_common::job::{JobSpec, check_links};
use pipewise_common::model::ModelSpec;
use pipewise_common::model::hf_weights::{self, INDEX_FILE, TensorEntry, WEIGHTS_FILE};

use crate::checkpoints::{found, invalid};
use crate::error::{CoordinatorError, Result};

/// Completes, at submit, a job that starts from a Hugging Face directory (`model.path`):
/// the sizes it left out are read from the directory's `config.json` under the data
/// directory, those it gave are checked against it, what pipewise does not compute is
/// refused, and so is a weight file that lacks a tensor of the model or holds one of
/// another shape or dtype, naming the file and the key. A coordinator that cannot read the
/// `config.json` (workers with data directories of their own) takes a job that gives the
/// sizes itself.
pub(crate) fn resolve_model(data_dir: &Path, spec: &mut JobSpec) -> Result<()> {
    let Some(dir) = spec.model_path_in(data_dir)? else {
        return Ok(());
    };
    check_links("model.path", &dir, data_dir, found)?;
    let file = dir.join("config.json");
    let shown = file.display().to_string();
    let text = match std::fs::read_to_string(&file) {
        Ok(text) => text,
        Err(_) if spec.model.vocab > 0 && spec.model.hidden > 0 => return Ok(()),
        Err(e) => {
            return Err(invalid(
                "model.path",
                format!(
                    "{shown}: {e}; give the model's sizes in [model] where the coordinator \
                     cannot read it"
                ),
            ));
        }
    };
    let m = &spec.model;
    let from = pipewise_common::model::hf::spec_from_config(&shown, &text, m.seq_len, m.dtype)?;
    spec.model = pipewise_common::model::hf::completed(m, &from, &shown)?;
    check_weights(data_dir, &dir, &spec.model)
}

/// Checks that the weight files of `dir` (under `data_dir`) hold every tensor `model`
/// reads, in its shape and a dtype pipewise reads, from their headers alone.
fn check_weights(data_dir: &Path, dir: &Path, model: &ModelSpec) -> Result<()> {
    let (files, listing) = weight_files(dir)?;
    let mut tensors: HashMap<String, (usize, TensorEntry)> = HashMap::new();
    for (i, path) in files.iter().enumerate() {
        check_links("model.path", path, data_dir, found)?;
        for (name, entry) in read_header(path)? {
            tensors.insert(name, (i, entry));
        }
    }
    for (name, shape) in hf_weights::model_tensors(model) {
        let Some((i, entry)) = tensors.get(&name) else {
            let shown = listing.display().to_string();
            return Err(hf_weights::bad(&shown, &name, "missing tensor").into());
        };
        entry.check(&files[*i].display().to_string(), &name, &shape)?;
    }
    Ok(())
}

/// The weight files of `dir`: `model.safetensors`, or the shards its index names; with the
/// file a tensor missing from all of them is reported against.
fn weight_files(dir: &Path) -> Result<(Vec<PathBuf>, PathBuf)> {
    let single = dir.join(WEIGHTS_FILE);
    if single.is_file() {
        return Ok((vec![single.clone()], single));
    }
    let index = dir.join(INDEX_FILE);
    let text = std::fs::read_to_string(&index).map_err(|e| {
        invalid(
            "model.path",
            format!(
                "{}: {WEIGHTS_FILE}: neither {WEIGHTS_FILE} nor {INDEX_FILE} can be read \
                 there ({e})",
                dir.display()
            ),
        )
    })?;
    let shards = hf_weights::shard_names(&index.display().to_string(), &text)?;
    Ok((shards.iter().map(|s| dir.join(s)).collect(), index))
}

/// The tensors in the header of the safetensors file at `path`, reading nothing past it.
fn read_header(path: &Path) -> Result<std::collections::BTreeMap<String, TensorEntry>> {
    let shown = path.display().to_string();
    let unreadable = |e: std::io::Error| -> CoordinatorError {
        hf_weights::bad(&shown, "(header)", format!("cannot be read: {e}")).into()
    };
    let mut file = File::open(path).map_err(unreadable)?;
    let len = file.metadata().map_err(unreadable)?.len();
    let mut first = [0u8; 8];
    file.read_exact(&mut first).map_err(|e| {
        CoordinatorError::from(hf_weights::bad(
            &shown,
            "(header)",
            format!("not a safetensors file: {e}"),
        ))
    })?;
    let n = hf_weights::header_len(&shown, first, len)?;
    let mut header = vec![0u8; usize::try_from(n).unwrap_or(usize::MAX)];
    file.read_exact(&mut header).map_err(unreadable)?;
    Ok(hf_weights::parse_header(&shown, &header, len)?)
}
