//! The sample `pipewise local` prints after training a Llama-family model with a
//! tokenizer: what the trained model writes, greedily, after the first line of its text.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::Result;
use pipewise_common::job::JobSpec;
use pipewise_worker::Tensor;
use pipewise_worker::data::Tokenizer;
use pipewise_worker::eval::{self, Sampling};

/// The longest prompt taken from the text, in bytes.
const PROMPT_BYTES: usize = 80;

/// The tokenizer.json the run's workers used, under its data directory: the job's, else
/// its model directory's.
pub(super) fn tokenizer_in(data_dir: &Path, spec: &JobSpec) -> Option<PathBuf> {
    let named = spec.data.tokenizer.as_ref().map(|t| data_dir.join(t));
    let model = spec
        .model
        .path
        .as_ref()
        .map(|m| data_dir.join(m).join("tokenizer.json"));
    named.into_iter().chain(model).find(|f| f.is_file())
}

/// The first line of the text at `data` (at most [`PROMPT_BYTES`], cut at a character).
fn first_line(data: &Path) -> Option<String> {
    let text = std::fs::read(data).ok()?;
    let line = text
        .split(|&b| b == b'\n')
        .find(|l| l.iter().any(|b| !b.is_ascii_whitespace()))?;
    let line = String::from_utf8_lossy(line);
    let mut cut = line.len().min(PROMPT_BYTES);
    while !line.is_char_boundary(cut) {
        cut -= 1;
    }
    Some(line[..cut].trim_end().to_string())
}

/// `tokens` tokens the trained model (`params`) writes greedily after the first line of
/// the text at `data`, with the tokenizer at `tokenizer`: `(prompt, continuation)`.
pub(super) fn sample(
    spec: &JobSpec,
    params: &HashMap<String, Tensor>,
    data: &Path,
    tokenizer: &Path,
    tokens: usize,
) -> Result<Option<(String, String)>> {
    let Some(prompt) = first_line(data) else {
        return Ok(None);
    };
    let tokenizer = Tokenizer::from_file(tokenizer).map_err(|e| anyhow::anyhow!("{e}"))?;
    let ids = tokenizer
        .encode(&prompt)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if ids.is_empty() {
        return Ok(None);
    }
    let stage = pipewise_worker::hf::whole_from_params(&spec.model, params)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let new = eval::generate(&[stage], &ids, tokens, Sampling::default(), tokenizer.eot())
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let text = tokenizer.decode(&new).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(Some((prompt, text)))
}
