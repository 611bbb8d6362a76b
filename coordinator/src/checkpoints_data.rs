//! A job's training and validation data checked at submit, where the coordinator can read
//! it under its data directory: the tokenizer's vocabulary against the model's, every id of
//! a token file (`.bin`) against the vocabulary, every line of a JSON Lines file for its
//! `text`, and each stream long enough for what the job takes of it (one window, or with
//! `[validation] fraction` enough to hold that out and keep one). Each refusal names the
//! field and the file (and the line), as the workers' reading at the job's start does.
//! Files are read a block at a time, never whole; text is encoded only where it is short
//! ([`crate::checkpoints_text`]).

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use pipewise_common::data::{first_id_not_below, jsonl_text, tokenizer_vocab, tokens_needed};
use pipewise_common::job::JobSpec;

use crate::checkpoints::invalid;
use crate::checkpoints_text::{Count, TextCounter};
use crate::error::Result;

/// Bytes read at once.
const BLOCK: usize = 1 << 20;

/// The token files' ids: their width, the bound each must be below, and whose it is.
struct Ids {
    width: usize,
    bound: u32,
    of: &'static str,
}

/// One stream a job reads: its field, its file and the tokens it needs.
struct Stream {
    field: &'static str,
    path: PathBuf,
    needed: u64,
}

/// Checks `spec`'s `[data]` and `[validation] path` (and the tokenizer they are encoded
/// with) under `data_dir`; the paths are known to lead there
/// ([`crate::checkpoints::check_paths`]). What the coordinator cannot read is left to the
/// workers, whose data directories may differ.
pub(crate) fn check_data(data_dir: &Path, spec: &JobSpec) -> Result<()> {
    // Emulated passes read no data.
    if spec.compute.is_emulated() {
        return Ok(());
    }
    let vocab = spec.model.vocab;
    let tokenizer = tokenizer_of(data_dir, spec)?;
    let (bound, of, text) = match &tokenizer {
        Some(t) => {
            if t.vocab > vocab {
                return Err(invalid(
                    t.field,
                    format!(
                        "{}: its vocabulary of {} tokens is larger than the model's \
                         ([model] vocab {vocab})",
                        t.path.display(),
                        t.vocab
                    ),
                ));
            }
            let text = TextCounter::hugging_face(&t.json)
                .map_err(|reason| invalid(t.field, format!("{}: {reason}", t.path.display())))?;
            (t.vocab, "the tokenizer's vocabulary of", text)
        }
        None => (vocab, "[model] vocab", TextCounter::byte_level()),
    };
    let ids = Ids {
        width: spec.data.token_bytes as usize,
        bound,
        of,
    };
    let seq_len = spec.model.seq_len;
    let fraction = spec.validation.as_ref().and_then(|v| v.fraction);
    let streams = [
        spec.data_path_in(data_dir)?.map(|path| Stream {
            field: "data.path",
            path,
            needed: tokens_needed(seq_len, fraction),
        }),
        spec.validation_path_in(data_dir)?.map(|path| Stream {
            field: "validation.path",
            path,
            needed: tokens_needed(seq_len, None),
        }),
    ];
    for stream in streams.iter().flatten() {
        let Some(n) = tokens_short(stream, &ids, &text)? else {
            continue;
        };
        let window = tokens_needed(seq_len, None);
        let path = stream.path.display();
        return Err(match fraction {
            Some(f) if n >= window && stream.field == "data.path" => invalid(
                "validation.fraction",
                format!(
                    "{path}: {n} tokens hold {} windows of {seq_len}: holding out {f} of them \
                     leaves none to train on ({} tokens would)",
                    (n - 1) / u64::from(seq_len.max(1)),
                    stream.needed
                ),
            ),
            _ => invalid(
                stream.field,
                format!("{path}: {n} tokens; one window of seq_len {seq_len} needs {window}"),
            ),
        });
    }
    Ok(())
}

/// The tokens of `stream` when they are fewer than it needs (`None`: enough, or not
/// known here); a token file's ids and a JSON Lines file's lines are checked on the way.
fn tokens_short(stream: &Stream, ids: &Ids, text: &TextCounter<'_>) -> Result<Option<u64>> {
    let path = &stream.path;
    let (field, needed) = (stream.field, stream.needed);
    let count = if path.is_dir() {
        let Some(files) = text_files(path) else {
            return Ok(None);
        };
        let bytes = files.iter().map(|(_, len)| len).sum();
        text.count(bytes, files.len() as u64, needed, || {
            files.iter().map(|(f, _)| read_text(f)).collect()
        })
    } else {
        match path.extension().and_then(|e| e.to_str()) {
            Some("bin") => match token_file(field, path, ids)? {
                Some(n) if n < needed => Count::Short(n),
                Some(_) => Count::Enough,
                None => Count::Unknown,
            },
            Some("jsonl") => match json_lines(field, path, false)? {
                Some(lines) => text.count(lines.bytes, lines.documents, needed, || {
                    json_lines(field, path, true)
                        .ok()
                        .flatten()
                        .map(|l| l.texts)
                }),
                None => Count::Unknown,
            },
            _ => match std::fs::metadata(path) {
                Ok(m) => text.count(m.len(), 1, needed, || Some(vec![read_text(path)?])),
                Err(_) => Count::Unknown,
            },
        }
    };
    Ok(match count {
        Count::Short(n) => Some(n),
        Count::Enough | Count::Unknown => None,
    })
}

/// The whole of text file `path`; `None` when it cannot be read or is not UTF-8 (the
/// workers say so).
fn read_text(path: &Path) -> Option<String> {
    String::from_utf8(std::fs::read(path).ok()?).ok()
}

/// A `tokenizer.json` the job's text is encoded with, read.
struct TokenizerFile {
    /// The field that chose it.
    field: &'static str,
    path: PathBuf,
    json: Vec<u8>,
    /// One past its largest id.
    vocab: u32,
}

/// The tokenizer the job's text is encoded with: `data.tokenizer`, else the model
/// directory's own `tokenizer.json`. `None`: byte-level, or a file the coordinator cannot
/// read.
fn tokenizer_of(data_dir: &Path, spec: &JobSpec) -> Result<Option<TokenizerFile>> {
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
    let vocab = tokenizer_vocab(&json)
        .map_err(|reason| invalid(field, format!("{}: {reason}", path.display())))?;
    Ok(Some(TokenizerFile {
        field,
        path,
        json,
        vocab,
    }))
}

/// The `*.txt` files of folder `dir` and their sizes; `None` when it cannot be read or has
/// none (the workers say so).
fn text_files(dir: &Path) -> Option<Vec<(PathBuf, u64)>> {
    let files: Vec<(PathBuf, u64)> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(std::result::Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".txt"))
        .filter_map(|e| Some((e.path(), e.metadata().ok()?)))
        .filter(|(_, m)| m.is_file())
        .map(|(path, m)| (path, m.len()))
        .collect();
    (!files.is_empty()).then_some(files)
}

/// The number of ids in token file `path` (little-endian, `ids.width` bytes each), each
/// checked to be below `ids.bound`; `None` when it cannot be read. Errors name `field`.
fn token_file(field: &'static str, path: &Path, ids: &Ids) -> Result<Option<u64>> {
    let Ok(file) = File::open(path) else {
        return Ok(None);
    };
    let Ids { width, bound, of } = *ids;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let w = width as u64;
    if !len.is_multiple_of(w) {
        return Err(invalid(
            field,
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
                field,
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

/// The documents of a JSON Lines file: how many, their bytes together, and (when asked
/// for) their texts.
struct Lines {
    documents: u64,
    bytes: u64,
    texts: Vec<String>,
}

/// Every line of JSON Lines file `path` checked for its `text` (errors name `field`), its
/// texts kept when `keep`; `None` when it cannot be read.
fn json_lines(field: &'static str, path: &Path, keep: bool) -> Result<Option<Lines>> {
    let Ok(file) = File::open(path) else {
        return Ok(None);
    };
    let mut lines = Lines {
        documents: 0,
        bytes: 0,
        texts: Vec::new(),
    };
    for (i, line) in BufReader::with_capacity(BLOCK, file)
        .split(b'\n')
        .enumerate()
    {
        let Ok(line) = line else {
            return Ok(None);
        };
        let text = jsonl_text(&line)
            .map_err(|reason| invalid(field, format!("{}:{}: {reason}", path.display(), i + 1)))?;
        if let Some(text) = text {
            lines.documents += 1;
            lines.bytes += text.len() as u64;
            if keep {
                lines.texts.push(text);
            }
        }
    }
    Ok(Some(lines))
}
