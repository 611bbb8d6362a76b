//! What turns text into token ids: a byte a token (the default), or a Hugging Face
//! `tokenizer.json` (GPT-2's byte-level BPE, Llama's, any the `tokenizers` library reads).
//! Encoding adds no special tokens: the loader puts the end-of-text token between
//! documents itself.

use std::fmt;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use pipewise_common::data::END_OF_TEXT;

use crate::confined::Confined;
use crate::error::{Error, Result};

use super::corpus::BYTE_VOCAB;

/// A tokenizer: byte-level, or a Hugging Face `tokenizer.json`.
#[derive(Debug, Clone, Default)]
pub enum Tokenizer {
    /// A byte is a token: vocabulary 256, no end-of-text token (documents are joined as
    /// they are).
    #[default]
    ByteLevel,
    /// A Hugging Face `tokenizer.json`.
    HuggingFace(Box<HuggingFace>),
}

/// A Hugging Face tokenizer as loaded from its `tokenizer.json`, with truncation and
/// padding turned off (a file made for a model's inputs may cut texts at 512 tokens).
#[derive(Clone)]
pub struct HuggingFace {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
    /// The job field that chose the file, named in errors.
    field: &'static str,
    vocab: u32,
    eot: Option<u32>,
    digest: [u8; 32],
}

impl fmt::Debug for HuggingFace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HuggingFace")
            .field("path", &self.path)
            .field("vocab", &self.vocab)
            .field("eot", &self.eot)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// The Hugging Face `tokenizer.json` at `path` (a plain path: a model directory's
    /// tokenizer, a test's).
    pub fn from_file(path: &Path) -> Result<Self> {
        let json = std::fs::read(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json(&json, path, "tokenizer")
    }

    /// The `tokenizer.json` at `path` under a data directory, opened without following a
    /// link below it; errors name the job field that chose it.
    pub fn from_confined(path: &Confined) -> Result<Self> {
        let mut json = Vec::new();
        path.open()?
            .read_to_end(&mut json)
            .map_err(|source| Error::Io {
                path: path.path(),
                source,
            })?;
        Self::from_json(&json, &path.path(), path.field())
    }

    /// The tokenizer of `json`, a `tokenizer.json`'s content read from `path`; `field`
    /// names where it was chosen in errors.
    pub fn from_json(json: &[u8], path: &Path, field: &'static str) -> Result<Self> {
        let bad = |reason: String| Error::Data {
            field,
            path: path.to_path_buf(),
            line: None,
            reason,
        };
        let mut inner = tokenizers::Tokenizer::from_bytes(json)
            .map_err(|e| bad(format!("not a Hugging Face tokenizer.json: {e}")))?;
        inner
            .with_truncation(None)
            .map_err(|e| bad(format!("cannot turn truncation off: {e}")))?;
        inner.with_padding(None);
        // One past the largest id, added tokens included: what the embedding must hold
        // (a count alone misses gaps in the ids).
        let vocab = inner
            .get_vocab(true)
            .into_values()
            .max()
            .map_or(0, |id| id.saturating_add(1));
        if vocab == 0 {
            return Err(bad("its vocabulary is empty".into()));
        }
        let eot = END_OF_TEXT.iter().find_map(|t| inner.token_to_id(t));
        Ok(Tokenizer::HuggingFace(Box::new(HuggingFace {
            inner,
            path: path.to_path_buf(),
            field,
            vocab,
            eot,
            digest: super::cache::digest(json),
        })))
    }

    /// The ids of `text`, without special tokens. A Hugging Face tokenizer still reads an
    /// added token written out in the text (`<|endoftext|>`) as that token.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            Tokenizer::ByteLevel => Ok(text.bytes().map(u32::from).collect()),
            Tokenizer::HuggingFace(hf) => hf
                .inner
                .encode_fast(text, false)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| hf.error(format!("cannot encode: {e}"))),
        }
    }

    /// The text of `ids`, special tokens included. Byte-level ids that are not UTF-8 come
    /// out as U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match self {
            Tokenizer::ByteLevel => {
                let bytes = ids
                    .iter()
                    .map(|&id| u8::try_from(id))
                    .collect::<Result<Vec<u8>, _>>()
                    .map_err(|_| {
                        Error::invalid("tokens", "a byte-level id is not below 256".to_string())
                    })?;
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
            Tokenizer::HuggingFace(hf) => hf
                .inner
                .decode(ids, false)
                .map_err(|e| hf.error(format!("cannot decode: {e}"))),
        }
    }

    /// One past the largest id it gives (256 byte-level): the smallest `[model] vocab`
    /// that embeds its tokens.
    pub fn vocab_size(&self) -> u32 {
        match self {
            Tokenizer::ByteLevel => BYTE_VOCAB,
            Tokenizer::HuggingFace(hf) => hf.vocab,
        }
    }

    /// The end-of-text token put between documents: `<|endoftext|>`, `<|end_of_text|>`,
    /// `</s>` or `<eos>`, the first the vocabulary has; byte-level has none.
    pub fn eot(&self) -> Option<u32> {
        match self {
            Tokenizer::ByteLevel => None,
            Tokenizer::HuggingFace(hf) => hf.eot,
        }
    }

    /// The file it was loaded from (`None`: byte-level).
    pub fn path(&self) -> Option<&Path> {
        match self {
            Tokenizer::ByteLevel => None,
            Tokenizer::HuggingFace(hf) => Some(&hf.path),
        }
    }

    /// What the token cache's key takes of the tokenizer: its file's digest.
    pub(crate) fn digest(&self) -> [u8; 32] {
        match self {
            Tokenizer::ByteLevel => [0; 32],
            Tokenizer::HuggingFace(hf) => hf.digest,
        }
    }

    /// Refuses a tokenizer whose ids a model of vocabulary `vocab` cannot embed.
    pub fn fits(&self, vocab: u32) -> Result<()> {
        let needs = self.vocab_size();
        if needs <= vocab {
            return Ok(());
        }
        Err(match self {
            Tokenizer::ByteLevel => Error::invalid(
                "model.vocab",
                format!(
                    "{vocab} is smaller than the {needs} byte tokens of text read without a \
                     tokenizer; raise it or set data.tokenizer"
                ),
            ),
            Tokenizer::HuggingFace(hf) => hf.error(format!(
                "its vocabulary of {needs} tokens is larger than the model's ([model] vocab \
                 {vocab})"
            )),
        })
    }
}

impl HuggingFace {
    fn error(&self, reason: String) -> Error {
        Error::Data {
            field: self.field,
            path: self.path.clone(),
            line: None,
            reason,
        }
    }
}
