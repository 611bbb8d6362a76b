//! A job's `[data]` read into a [`Corpus`]. `data.path` is one of four forms, told apart by
//! what it is:
//!
//! - a folder: its `*.txt` files, by name, each one document;
//! - `*.jsonl`: JSON Lines, one document per line in a `text` string (blank lines skipped);
//! - `*.bin`: ids already encoded, little-endian, `data.token_bytes` bytes each
//!   (nanoGPT's `train.bin`), every one checked to be below the vocabulary;
//! - anything else: one text document.
//!
//! Text is encoded by the tokenizer (`data.tokenizer`, else a byte a token) once, at the
//! job's start: documents in parallel ([`super::encode`]), joined with the tokenizer's
//! end-of-text token. What a `tokenizer.json` encoded is kept in the data directory's
//! [cache](super::cache) and read from there by the next start; byte-level text needs no
//! encoding and is not cached.

use std::borrow::Cow;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use pipewise_common::job::JobSpec;
use pipewise_common::model::ModelSpec;
use rayon::prelude::*;

use crate::confined::Confined;
use crate::error::{Error, Result};

use super::cache::{self, CACHE_DIR, KeyBuilder};
use super::corpus::{Corpus, Tokens};
use super::encode::{PIECE_BYTES, encode_documents};
use super::tokenizer::Tokenizer;

/// Where a job's training data comes from: `[data]` resolved under a data directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataSource {
    /// `data.path`: a text file, a folder of them, JSON Lines or a token file (`None`: the
    /// generated corpus, encoded by the tokenizer).
    pub path: Option<Confined>,
    /// `data.tokenizer`: a `tokenizer.json` (`None`: a byte a token).
    pub tokenizer: Option<Confined>,
    /// `data.token_bytes`: bytes per id of a `.bin` file (2 or 4).
    pub token_bytes: u32,
    /// The token cache's folder (`None`: encode at every load, keep nothing).
    pub cache: Option<Confined>,
}

/// A loaded corpus, with the tokenizer that made it and where its tokens came from.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The token stream.
    pub corpus: Corpus,
    /// `data.tokenizer`'s, or byte-level.
    pub tokenizer: Tokenizer,
    /// Where the tokens came from.
    pub origin: Origin,
}

/// Where a loaded corpus's tokens came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The generated default corpus.
    Generated,
    /// Text read a byte a token (no encoding).
    Bytes,
    /// A `.bin` file of ids.
    TokenFile,
    /// `documents` documents encoded by the tokenizer now (and written to the cache, if
    /// there is one).
    Encoded {
        /// How many.
        documents: usize,
    },
    /// The token cache: encoded by an earlier load.
    Cached,
}

/// One file's bytes, and where they came from.
struct File {
    path: PathBuf,
    bytes: Vec<u8>,
}

/// What `data.path` holds, read.
enum Form {
    Texts(Vec<File>),
    JsonLines(File),
    TokenFile(File),
}

impl Form {
    fn name(&self) -> &'static str {
        match self {
            Form::Texts(_) => "text",
            Form::JsonLines(_) => "jsonl",
            Form::TokenFile(_) => "bin",
        }
    }
}

impl DataSource {
    /// `spec`'s `[data]` at the paths it gives as they are (relative to the current
    /// directory), encoded at every load: the single-device reference and tools.
    pub fn plain(spec: &JobSpec) -> Result<Self> {
        let data = &spec.data;
        Self::plain_files(
            data.path.as_deref().map(Path::new),
            data.tokenizer.as_deref().map(Path::new),
            data.token_bytes,
        )
    }

    /// Data file `path` (`None`: the generated corpus) encoded by tokenizer file
    /// `tokenizer` (`None`: a byte a token), both as they are (relative to the current
    /// directory), encoded at every load: tools given files rather than a job.
    pub fn plain_files(
        path: Option<&Path>,
        tokenizer: Option<&Path>,
        token_bytes: u32,
    ) -> Result<Self> {
        Ok(DataSource {
            path: path.map(|p| plain_path("data.path", p)).transpose()?,
            tokenizer: tokenizer
                .map(|p| plain_path("data.tokenizer", p))
                .transpose()?,
            token_bytes,
            cache: None,
        })
    }

    /// The tokenizer the text is encoded with: `data.tokenizer`'s, else a byte a token.
    pub fn read_tokenizer(&self) -> Result<Tokenizer> {
        match &self.tokenizer {
            Some(path) => Tokenizer::from_confined(path),
            None => Ok(Tokenizer::ByteLevel),
        }
    }

    /// The token cache's folder in data directory `data_dir`.
    pub fn cache_in(data_dir: &Path) -> Result<Confined> {
        Confined::new("data.path", data_dir, Path::new(CACHE_DIR))
    }

    /// Reads and encodes the data for `model`: refused when the tokenizer's vocabulary or
    /// an id is past `model.vocab`, or the tokens do not make one window of
    /// `model.seq_len`.
    pub fn load(&self, model: &ModelSpec) -> Result<Loaded> {
        let tokenizer = self.read_tokenizer()?;
        let (corpus, origin) = match &self.path {
            None => {
                tokenizer.fits(model.vocab)?;
                (generated(&tokenizer)?, Origin::Generated)
            }
            Some(path) => self.read(path, &tokenizer, model.vocab)?,
        };
        let window = model.seq_len as usize + 1;
        if corpus.len() < window {
            let reason = format!(
                "{} tokens; one window of seq_len {} needs {window}",
                corpus.len(),
                model.seq_len
            );
            return Err(match &self.path {
                Some(path) => Error::Data {
                    field: path.field(),
                    path: path.path(),
                    line: None,
                    reason,
                },
                None => Error::invalid("model.seq_len", format!("the generated corpus: {reason}")),
            });
        }
        tracing::info!(
            tokens = corpus.len(),
            vocab = corpus.vocab(),
            ?origin,
            tokenizer = %tokenizer.path().map_or("byte-level".into(), |p| p.display().to_string()),
            "training data loaded"
        );
        Ok(Loaded {
            corpus,
            tokenizer,
            origin,
        })
    }

    fn read(&self, path: &Confined, tok: &Tokenizer, vocab: u32) -> Result<(Corpus, Origin)> {
        if !matches!(self.token_bytes, 2 | 4) {
            return Err(Error::invalid(
                "data.token_bytes",
                format!(
                    "{} is neither 2 (u16 ids) nor 4 (u32 ids)",
                    self.token_bytes
                ),
            ));
        }
        let form = read_form(path)?;
        if let Form::TokenFile(file) = form {
            // Ids are checked against the tokenizer's vocabulary when there is one: ids
            // past it were made by another.
            let (bound, of) = match tok {
                Tokenizer::ByteLevel => (vocab, "[model] vocab"),
                _ => {
                    tok.fits(vocab)?;
                    (tok.vocab_size(), "the tokenizer's vocabulary of")
                }
            };
            let width = self.token_bytes as usize;
            let tokens = token_file(path.field(), file, width, bound, of)?;
            return Ok((Corpus::from_tokens(tokens, bound), Origin::TokenFile));
        }
        tok.fits(vocab)?;
        if matches!(tok, Tokenizer::ByteLevel) {
            // Bytes are tokens as they are, UTF-8 or not.
            let bytes = match form {
                Form::Texts(files) if files.len() == 1 => files
                    .into_iter()
                    .next()
                    .map(|f| f.bytes)
                    .unwrap_or_default(),
                Form::Texts(files) => files.into_iter().flat_map(|f| f.bytes).collect(),
                form => documents(path.field(), &form)?
                    .iter()
                    .flat_map(|d| d.as_bytes().iter().copied())
                    .collect(),
            };
            return Ok((Corpus::from_bytes(bytes), Origin::Bytes));
        }
        // Workers of one process share the data directory: the first encodes and writes
        // the cache, the others read it.
        static ENCODING: Mutex<()> = Mutex::new(());
        let _one_at_a_time = ENCODING.lock().unwrap_or_else(|e| e.into_inner());
        let key = {
            let mut k = KeyBuilder::new(form.name(), &tok.digest(), PIECE_BYTES);
            match &form {
                Form::Texts(files) => files.iter().for_each(|f| k.file(&f.bytes)),
                Form::JsonLines(f) | Form::TokenFile(f) => k.file(&f.bytes),
            }
            k.finish()
        };
        let v = tok.vocab_size();
        if let Some(dir) = &self.cache {
            match cache::read(dir, &key, v) {
                Ok(Some(tokens)) => return Ok((Corpus::from_tokens(tokens, v), Origin::Cached)),
                Ok(None) => {}
                // The documents are at hand: encode them again.
                Err(e) => tracing::warn!(error = %e, "cannot read the token cache"),
            }
        }
        let docs = documents(path.field(), &form)?;
        let texts: Vec<&str> = docs.iter().map(|d| d.as_ref()).collect();
        let ids = encode_documents(tok, &texts, PIECE_BYTES)?;
        let tokens = Tokens::from_ids(&ids, v);
        if let Some(dir) = &self.cache
            && let Err(e) = cache::write(dir, &key, &tokens)
        {
            // The tokens are good; the next start encodes them again.
            tracing::warn!(error = %e, "cannot write the token cache");
        }
        let origin = Origin::Encoded {
            documents: docs.len(),
        };
        Ok((Corpus::from_tokens(tokens, v), origin))
    }
}

/// `path`, trusted as it is (relative to the current directory): its folder, and its name
/// confined below it.
fn plain_path(field: &'static str, path: &Path) -> Result<Confined> {
    let (dir, name) = match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) if !dir.as_os_str().is_empty() => (dir, name),
        (_, Some(name)) => (Path::new("."), name),
        _ => (path, std::ffi::OsStr::new("")),
    };
    Confined::new(field, dir, Path::new(name))
}

/// The generated corpus, encoded by `tok` as one document (64 KiB: no cache needed).
fn generated(tok: &Tokenizer) -> Result<Corpus> {
    let corpus = Corpus::generated();
    if matches!(tok, Tokenizer::ByteLevel) {
        return Ok(corpus);
    }
    let text = String::from_utf8_lossy(corpus.byte_text().unwrap_or_default()).into_owned();
    let ids = encode_documents(tok, &[&text], PIECE_BYTES)?;
    let v = tok.vocab_size();
    Ok(Corpus::from_tokens(Tokens::from_ids(&ids, v), v))
}

/// Reads `path` as the form it is: a folder, `.jsonl`, `.bin` or a text file.
fn read_form(path: &Confined) -> Result<Form> {
    let file = path.open()?;
    let is_dir = file
        .metadata()
        .map_err(|source| Error::Io {
            path: path.path(),
            source,
        })?
        .is_dir();
    if is_dir {
        drop(file);
        let dir = path.dir(false)?;
        let mut texts = Vec::new();
        for name in dir.names()?.into_iter().filter(|n| n.ends_with(".txt")) {
            let p = dir.path_of(&name);
            texts.push(File {
                bytes: read_all(dir.open(&name)?, &p)?,
                path: p,
            });
        }
        if texts.is_empty() {
            return Err(Error::Data {
                field: path.field(),
                path: path.path(),
                line: None,
                reason: "a folder with no *.txt files".into(),
            });
        }
        return Ok(Form::Texts(texts));
    }
    let p = path.path();
    let f = File {
        bytes: read_all(file, &p)?,
        path: p,
    };
    let ext = f.path.extension().and_then(|e| e.to_str());
    Ok(match ext {
        Some("jsonl") => Form::JsonLines(f),
        Some("bin") => Form::TokenFile(f),
        _ => Form::Texts(vec![f]),
    })
}

fn read_all(mut file: std::fs::File, path: &Path) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(bytes)
}

/// The documents of a text form, in order: each text file's UTF-8 text, or each JSON
/// line's `text`.
fn documents<'a>(field: &'static str, form: &'a Form) -> Result<Vec<Cow<'a, str>>> {
    let bad = |path: &Path, line: Option<u64>, reason: String| Error::Data {
        field,
        path: path.to_path_buf(),
        line,
        reason,
    };
    match form {
        Form::Texts(files) => files
            .iter()
            .map(|f| match std::str::from_utf8(&f.bytes) {
                Ok(text) => Ok(Cow::Borrowed(text)),
                Err(e) => Err(bad(
                    &f.path,
                    None,
                    format!(
                        "not UTF-8 text (invalid byte at offset {})",
                        e.valid_up_to()
                    ),
                )),
            })
            .collect(),
        Form::JsonLines(f) => {
            let lines: Vec<&[u8]> = f.bytes.split(|&b| b == b'\n').collect();
            let parsed: Vec<Result<Option<Cow<'a, str>>>> = lines
                .par_iter()
                .enumerate()
                .map(|(i, line)| {
                    pipewise_common::data::jsonl_text(line)
                        .map(|text| text.map(Cow::Owned))
                        .map_err(|reason| bad(&f.path, Some(i as u64 + 1), reason))
                })
                .collect();
            parsed.into_iter().filter_map(Result::transpose).collect()
        }
        Form::TokenFile(f) => Err(bad(&f.path, None, "holds ids, not text".into())),
    }
}

/// The ids of a token file of `width`-byte little-endian ids, refused when its length is
/// not a whole number of ids or an id is not below `vocab` (`of`: whose vocabulary).
fn token_file(
    field: &'static str,
    file: File,
    width: usize,
    vocab: u32,
    of: &str,
) -> Result<Tokens> {
    let bad = |reason: String| Error::Data {
        field,
        path: file.path.clone(),
        line: None,
        reason,
    };
    let len = file.bytes.len();
    if !len.is_multiple_of(width) {
        return Err(bad(format!(
            "{len} bytes are not a whole number of {width}-byte ids (data.token_bytes = {width})"
        )));
    }
    let id_at = |i: usize| pipewise_common::data::token_id(&file.bytes, width, i);
    if let Some(at) = (0..len / width)
        .into_par_iter()
        .find_first(|&i| id_at(i) >= vocab)
    {
        return Err(bad(format!(
            "token id {} at token {at} (byte {}) is not below {of} {vocab}",
            id_at(at),
            at * width
        )));
    }
    Ok(Tokens::from_le(file.bytes, 0, width))
}
