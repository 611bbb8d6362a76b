//! The corpus: a stream of token ids bound by a vocabulary, kept as little-endian integers
//! of the narrowest width its vocabulary needs (a byte a token for byte-level text, two
//! bytes for up to 65 536 ids), so that a corpus read from a token file or the cache is
//! used as read, without widening it.

use std::io::Read as _;
use std::path::Path;

use crate::confined::Confined;
use crate::error::{Error, Result};
use crate::rng::SplitMix64;

/// A stream of token ids, each below [`Corpus::vocab`]: the bytes of a text (vocabulary
/// 256), or the ids a tokenizer gave or a token file holds.
#[derive(Debug, Clone)]
pub struct Corpus {
    tokens: Tokens,
    vocab: u32,
}

/// Token ids as little-endian integers of `width` bytes, from `buf[start..]`.
#[derive(Debug, Clone)]
pub(crate) struct Tokens {
    buf: Vec<u8>,
    start: usize,
    width: usize,
}

impl Tokens {
    /// Ids stored in `buf[start..]` at `width` (1, 2 or 4) bytes each, little-endian; the
    /// caller has checked that the length is a whole number of ids.
    pub(crate) fn from_le(buf: Vec<u8>, start: usize, width: usize) -> Self {
        debug_assert!(matches!(width, 1 | 2 | 4));
        debug_assert_eq!((buf.len() - start) % width, 0);
        Tokens { buf, start, width }
    }

    /// `ids` stored at the narrowest width that holds every id below `vocab`.
    pub(crate) fn from_ids(ids: &[u32], vocab: u32) -> Self {
        let width = width_for(vocab);
        let mut buf = Vec::with_capacity(ids.len() * width);
        for &id in ids {
            buf.extend_from_slice(&id.to_le_bytes()[..width]);
        }
        Tokens::from_le(buf, 0, width)
    }

    /// The stored bytes: the ids, little-endian.
    pub(crate) fn le_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    /// Bytes per id.
    pub(crate) fn width(&self) -> usize {
        self.width
    }

    fn len(&self) -> usize {
        (self.buf.len() - self.start) / self.width
    }

    /// Appends ids `at .. at + n` to `out`.
    fn extend_into(&self, at: usize, n: usize, out: &mut Vec<u32>) {
        let w = self.width;
        let bytes = &self.le_bytes()[at * w..(at + n) * w];
        match w {
            1 => out.extend(bytes.iter().map(|&b| u32::from(b))),
            2 => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]]))),
            ),
            _ => out.extend(
                bytes
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            ),
        }
    }
}

/// The bytes per id that hold every id below `vocab`.
pub(crate) fn width_for(vocab: u32) -> usize {
    match vocab {
        0..=256 => 1,
        257..=65_536 => 2,
        _ => 4,
    }
}

const SUBJECTS: &[&str] = &[
    "the worker",
    "the coordinator",
    "a stage",
    "the scheduler",
    "every microbatch",
    "the pipeline",
    "the planner",
    "a gradient",
    "the optimizer",
    "the model",
];
const VERBS: &[&str] = &[
    "sends",
    "receives",
    "computes",
    "stashes",
    "frees",
    "waits for",
    "splits",
    "checks",
    "reduces",
    "schedules",
];
const OBJECTS: &[&str] = &[
    "the activations",
    "the input gradient",
    "the weight gradient",
    "a checkpoint",
    "the next stage",
    "the bubble",
    "its memory",
    "the loss",
    "a warm-up pass",
    "the step",
];
const TAILS: &[&str] = &[
    "before the backward pass",
    "after the forward pass",
    "on every worker",
    "without waiting",
    "in order",
    "at the end of the step",
    "as planned",
    "again",
];

/// The vocabulary of byte-level text: one token per byte value.
pub const BYTE_VOCAB: u32 = 256;

impl Corpus {
    /// The corpus of these bytes, a byte a token (vocabulary 256).
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        Self {
            tokens: Tokens::from_le(bytes, 0, 1),
            vocab: BYTE_VOCAB,
        }
    }

    /// The corpus of these ids, refused unless each is below `vocab`.
    pub fn from_ids(ids: &[u32], vocab: u32) -> Result<Self> {
        if let Some((at, id)) = ids.iter().enumerate().find(|(_, id)| **id >= vocab) {
            return Err(Error::invalid(
                "corpus",
                format!("token id {id} at token {at} is not below the vocabulary of {vocab}"),
            ));
        }
        Ok(Self::from_tokens(Tokens::from_ids(ids, vocab), vocab))
    }

    /// `tokens`, every one of them known to be below `vocab`.
    pub(crate) fn from_tokens(tokens: Tokens, vocab: u32) -> Self {
        Self { tokens, vocab }
    }

    /// Reads a text (or any) file as bytes, a byte a token.
    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self::from_bytes(bytes))
    }

    /// The bytes of `path`, a byte a token, opened without following a link below its data
    /// directory.
    pub fn from_confined(path: &Confined) -> Result<Self> {
        let mut bytes = Vec::new();
        path.open()?
            .read_to_end(&mut bytes)
            .map_err(|source| Error::Io {
                path: path.path(),
                source,
            })?;
        Ok(Self::from_bytes(bytes))
    }

    /// The default corpus: 64 KiB of simple English sentences about pipelines, generated
    /// from a fixed seed (no download; the same bytes on every machine).
    pub fn generated() -> Self {
        Self::generate(64 * 1024, 0x5049_5045)
    }

    /// `len` bytes of generated sentences from `seed`.
    pub fn generate(len: usize, seed: u64) -> Self {
        let mut rng = SplitMix64::new(seed);
        let mut pick = |words: &[&'static str]| words[rng.below(words.len() as u64) as usize];
        let mut text = String::with_capacity(len + 128);
        let mut in_line = 0;
        while text.len() < len {
            let mut sentence = format!("{} {} {}", pick(SUBJECTS), pick(VERBS), pick(OBJECTS));
            if pick(&["", "tail"]) == "tail" {
                sentence.push(' ');
                sentence.push_str(pick(TAILS));
            }
            let mut chars = sentence.chars();
            if let Some(first) = chars.next() {
                text.extend(first.to_uppercase());
                text.push_str(chars.as_str());
            }
            text.push('.');
            in_line += 1;
            text.push(if in_line % 4 == 0 { '\n' } else { ' ' });
        }
        let mut bytes = text.into_bytes();
        bytes.truncate(len);
        Self::from_bytes(bytes)
    }

    /// Writes the ids as stored: for a byte-level corpus its text, else little-endian
    /// integers of [`Corpus::token_bytes`] bytes.
    pub fn write_to(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.tokens.le_bytes()).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })
    }

    /// The text of a byte-level corpus (`None` for the ids of a tokenizer or token file).
    pub fn byte_text(&self) -> Option<&[u8]> {
        (self.tokens.width() == 1 && self.vocab == BYTE_VOCAB).then(|| self.tokens.le_bytes())
    }

    /// Bytes per stored id (1, 2 or 4).
    pub fn token_bytes(&self) -> usize {
        self.tokens.width()
    }

    /// One past the largest id the corpus may hold: every id is below it.
    pub fn vocab(&self) -> u32 {
        self.vocab
    }

    /// Length in tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the corpus is empty.
    pub fn is_empty(&self) -> bool {
        self.tokens.len() == 0
    }

    /// Every id, in order.
    pub fn to_vec(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.len());
        self.tokens.extend_into(0, self.len(), &mut out);
        out
    }

    /// Appends ids `at .. at + n` to `out` (in range: the sampler's windows are).
    pub(crate) fn extend_into(&self, at: usize, n: usize, out: &mut Vec<u32>) {
        self.tokens.extend_into(at, n, out);
    }
}

/// Two corpora are equal when their ids and vocabularies are, however they are stored.
impl PartialEq for Corpus {
    fn eq(&self, other: &Self) -> bool {
        self.vocab == other.vocab
            && self.len() == other.len()
            && ((self.tokens.width() == other.tokens.width()
                && self.tokens.le_bytes() == other.tokens.le_bytes())
                || self.to_vec() == other.to_vec())
    }
}

impl Eq for Corpus {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_corpus_is_deterministic_text() {
        let a = Corpus::generated();
        let b = Corpus::generated();
        assert_eq!(a, b);
        assert_eq!(a.len(), 64 * 1024);
        let text = a.byte_text().expect("byte-level");
        assert!(text.iter().all(|c| c.is_ascii()));
        assert_ne!(Corpus::generate(1024, 1), Corpus::generate(1024, 2));
        // Golden start: the default corpus must not change silently between versions.
        let start = String::from_utf8_lossy(&text[..74]).into_owned();
        assert_eq!(
            start,
            "The pipeline receives the bubble. Every microbatch splits the activations."
        );
    }

    /// Ids round-trip at every width, and the width is the narrowest for the vocabulary.
    #[test]
    fn ids_are_stored_at_the_narrowest_width() -> Result<()> {
        for (vocab, width) in [(256, 1), (257, 2), (65_536, 2), (65_537, 4), (1 << 20, 4)] {
            let ids: Vec<u32> = (0..50).map(|i| (i * 7919) % vocab).collect();
            let c = Corpus::from_ids(&ids, vocab)?;
            assert_eq!((c.token_bytes(), c.to_vec()), (width, ids), "vocab {vocab}");
            let mut window = Vec::new();
            c.extend_into(3, 4, &mut window);
            assert_eq!(window, c.to_vec()[3..7]);
        }
        assert!(Corpus::from_ids(&[1, 2, 300], 300).is_err());
        // Stored another way, the same ids are the same corpus.
        let bytes = Corpus::from_bytes(vec![1, 2, 3]);
        assert_eq!(bytes, Corpus::from_ids(&[1, 2, 3], 256)?);
        assert_ne!(bytes, Corpus::from_ids(&[1, 2, 3], 257)?);
        Ok(())
    }
}
