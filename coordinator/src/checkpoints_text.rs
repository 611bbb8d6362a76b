//! The tokens of a job's text counted at submit, cheaply and exactly: a text of `B` bytes
//! makes at least `B / longest` tokens (longest: the tokenizer's longest token text; a
//! byte a token without a tokenizer) and its documents' end-of-text tokens
//! ([`TextTokens`], the rule in `pipewise_common::data`). Where that bound already reaches
//! what the job needs, nothing is encoded; below it the text is short, and is encoded as
//! the workers encode it (the `tokenizers` library, truncation and padding off, no special
//! tokens added, documents joined with the end-of-text token) to count it.

use pipewise_common::data::{END_OF_TEXT, TextTokens};

/// The most bytes of text encoded at submit: past it (only where a tokenizer has no bound,
/// see [`TextTokens::longest`]) the count is left to the workers, who read the data anyway.
const MAX_ENCODED_BYTES: u64 = 64 << 20;

/// A text's tokens as far as the coordinator needs to know them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Count {
    /// At least what was needed.
    Enough,
    /// Exactly this many, fewer than needed.
    Short(u64),
    /// Not counted: the text could not be read or encoded, or is too long to encode here;
    /// the workers say what is wrong with it.
    Unknown,
}

/// How a job's text is made into tokens: a byte a token, or a `tokenizer.json`.
pub(crate) struct TextCounter<'a> {
    bound: TextTokens,
    /// The `tokenizer.json`'s content; `None`: byte-level.
    json: Option<&'a [u8]>,
}

impl<'a> TextCounter<'a> {
    /// Text read a byte a token.
    pub(crate) fn byte_level() -> Self {
        TextCounter {
            bound: TextTokens::BYTE_LEVEL,
            json: None,
        }
    }

    /// Text encoded by the `tokenizer.json` whose content is `json`; why not, in words.
    pub(crate) fn hugging_face(json: &'a [u8]) -> Result<Self, String> {
        Ok(TextCounter {
            bound: TextTokens::of_tokenizer(json)?,
            json: Some(json),
        })
    }

    /// Counts `documents` documents of `bytes` bytes in all against `needed` tokens;
    /// `texts` gives the documents, called only where the bound falls short.
    pub(crate) fn count(
        &self,
        bytes: u64,
        documents: u64,
        needed: u64,
        texts: impl FnOnce() -> Option<Vec<String>>,
    ) -> Count {
        let least = self.bound.at_least(bytes, documents);
        if least >= needed {
            return Count::Enough;
        }
        let Some(json) = self.json else {
            // A byte a token: the bound is the count.
            return Count::Short(least);
        };
        if bytes > MAX_ENCODED_BYTES {
            return Count::Unknown;
        }
        match texts().map(|t| encoded_len(json, &t, needed)) {
            Some(Ok(n)) if n >= needed => Count::Enough,
            Some(Ok(n)) => Count::Short(n),
            Some(Err(e)) => {
                tracing::debug!(error = %e, "cannot encode the job's text at submit");
                Count::Unknown
            }
            None => Count::Unknown,
        }
    }
}

/// The tokens of `texts` encoded by the `tokenizer.json` `json` and joined as the workers
/// join them; counting stops once it reaches `needed`.
fn encoded_len(json: &[u8], texts: &[String], needed: u64) -> tokenizers::Result<u64> {
    let mut tokenizer = tokenizers::Tokenizer::from_bytes(json)?;
    tokenizer.with_truncation(None)?;
    tokenizer.with_padding(None);
    let eot = END_OF_TEXT
        .iter()
        .any(|t| tokenizer.token_to_id(t).is_some());
    let mut n = 0u64;
    for (i, text) in texts.iter().enumerate() {
        if i > 0 && eot {
            n += 1;
        }
        n += tokenizer.encode_fast(text.as_str(), false)?.len() as u64;
        if n >= needed {
            break;
        }
    }
    Ok(n)
}
