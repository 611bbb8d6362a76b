//! A job's training data checked at submit, where the coordinator can read it under its
//! data directory: the tokenizer's vocabulary against the model's, every id of a token file
//! (`.bin`) against the vocabulary, every line of a JSON Lines file for its `text`, and a
//! token file or byte-level text long enough for one window. Each refusal names the field
//! and the file (and the line), as the workers' reading at the job's start does. Files are
//! read a block at a time, never whole; text a tokenizer encodes is counted by the workers,
//! who encode it.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use pipewise_common::data::{first_id_not_below, jsonl_text, tokenizer_vocab};
use pipewise_common::job::JobSpec;

use crate::checkpoints::invalid;
use crate::error::Result;

/// Bytes read at once.
const BLOCK: usize = 1 << 20;

/// Checks `spec`'s `[data]` (and the tokenizer it is encoded with) under `data_dir`; the
/// paths are known to lead there ([`crate::checkpoints::check_paths`]). What the
/// coordinator cannot read is left to the workers, whose data directories may differ.
pub(crate) fn check_data(data_dir: &Path, spec: &JobSpec) -> Result<()> {
    // Emulated passes read no data.
    if spec.compute.is_emulated() {
        return Ok(());
    }
    let vocab = spec.model.vocab;
    let tokenizer = tokenizer_of(data_dir, spec)?;
    let bound = match tokenizer.as_ref() {
        Some(&(field, ref path, size)) => {
            if size > vocab {
                return Err(invalid(
                    field,
                    format!(
                        "{}: its vocabulary of {size} tokens is larger than the model's \
                         ([model] vocab {vocab})",
                        path.display()
                    ),
                ));
            }
            size
        }
        None => vocab,
    };
    let Some(path) = spec.data_path_in(data_dir)? else {
        return Ok(());
    };
    let window = u64::from(spec.model.seq_len) + 1;
    let short = |n: u64| {
        invalid(
            "data.path",
            format!(
                "{}: {n} tokens; one window of seq_len {} needs {window}",
                path.display(),
                spec.model.seq_len
            ),
        )
    };
    let byte_level = tokenizer.is_none();
    let ext = path.extension().and_then(|e| e.to_str());
    if path.is_dir() {
        if byte_level {
            let bytes = text_files_bytes(&path);
            if bytes.is_some_and(|n| n < window) {
                return Err(short(bytes.unwrap_or(0)));
            }
        }
    } else if ext == Some("bin") {
        let of = if byte_level {
            "[model] vocab"
        } else {
            "the tokenizer's vocabulary of"
        };
        let width = spec.data.token_bytes as usize;
        if let Some(n) = token_file(&path, width, bound, of)?
            && n < window
        {
            return Err(short(n));
        }
    } else if ext == Some("jsonl") {
        if let Some(bytes) = json_lines(&path)?
            && byte_level
            && bytes < window
        {
            return Err(short(bytes));
        }
    } else if byte_level
        && let Ok(m) = std::fs::metadata(&path)
        && m.len() < window
    {
        return Err(short(m.len()));
    }
    Ok(())
}

/// The tokenizer the job's text is encoded with: `data.tokenizer`, else the model
/// directory's own `tokenizer.json`; its field, path and vocabulary. `None`: byte-level,
/// or a file the coordinator cannot read.
fn tokenizer_of(data_dir: &Path, spec: &JobSpec) -> Result<Option<(&'static str, PathBuf, u32)>> {
    let (field, path) = match spec.data_tokenizer_in(data_dir)? {
        Some(path) => ("data.tokenizer", path),
        None => match spec.model_path_in(data_dir)? {
            Some(dir) => ("model.path", dir.join("tokenizer.json")),
            None => return Ok(None),
        },
    };
    let Ok(json) = std::fs::read(&path) else {
        return Ok(None);
    };
    let size = tokenizer_vocab(&json)
        .map_err(|reason| invalid(field, format!("{}: {reason}", path.display())))?;
    Ok(Some((field, path, size)))
}

/// The bytes of the `*.txt` files of folder `dir` together; `None` when it cannot be read
/// or has none (the workers say so).
fn text_files_bytes(dir: &Path) -> Option<u64> {
    let sizes: Vec<u64> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(std::result::Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".txt"))
        .filter_map(|e| e.metadata().ok())
        .filter(std::fs::Metadata::is_file)
        .map(|m| m.len())
        .collect();
    (!sizes.is_empty()).then(|| sizes.iter().sum())
}

/// The number of ids in token file `path` (little-endian, `width` bytes each), each checked
/// to be below `bound` (`of`: whose vocabulary, in the error); `None` when it cannot be
/// read.
fn token_file(path: &Path, width: usize, bound: u32, of: &str) -> Result<Option<u64>> {
    let Ok(file) = File::open(path) else {
        return Ok(None);
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let w = width as u64;
    if !len.is_multiple_of(w) {
        return Err(invalid(
            "data.path",
            format!(
                "{}: {len} bytes are not a whole number of {width}-byte ids \
                 (data.token_bytes = {width})",
                path.display()
            ),
        ));
    }
    let mut reader = BufReader::with_capacity(BLOCK, file);
    let mut block = vec![0u8; BLOCK - BLOCK % width];
    let mut seen = 0u64;
    loop {
        let n = read_full(&mut reader, &mut block);
        if n == 0 {
            return Ok(Some(seen));
        }
        if let Some((at, id)) = first_id_not_below(&block[..n], width, bound) {
            let at = seen + at as u64;
            return Err(invalid(
                "data.path",
                format!(
                    "{}: token id {id} at token {at} (byte {}) is not below {of} {bound}",
                    path.display(),
                    at * w
                ),
            ));
        }
        seen += (n / width) as u64;
    }
}

/// Fills `buf` from `reader` as far as it goes; the bytes read (fewer only at the end, or
/// where reading fails: the workers report that).
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> usize {
    let mut got = 0;
    while got < buf.len() {
        match reader.read(&mut buf[got..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    got
}

/// Every line of JSON Lines file `path` checked for its `text`; the bytes of the texts
/// together, `None` when it cannot be read.
fn json_lines(path: &Path) -> Result<Option<u64>> {
    let Ok(file) = File::open(path) else {
        return Ok(None);
    };
    let mut bytes = 0u64;
    for (i, line) in BufReader::with_capacity(BLOCK, file)
        .split(b'\n')
        .enumerate()
    {
        let Ok(line) = line else {
            return Ok(None);
        };
        let text = jsonl_text(&line).map_err(|reason| {
            invalid(
                "data.path",
                format!("{}:{}: {reason}", path.display(), i + 1),
            )
        })?;
        bytes += text.map_or(0, |t| t.len() as u64);
    }
    Ok(Some(bytes))
}
