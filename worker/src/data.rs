//! Byte-level training data: a corpus (a text file, or a small generated default one) and
//! a seeded sampler of `(input, target)` windows.

use std::io::Read as _;
use std::path::Path;

use candle_core::{Device, Tensor};

use crate::confined::Confined;
use crate::error::{Error, Result};
use crate::rng::SplitMix64;

/// A byte string; every byte is a token (vocabulary 256).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corpus {
    bytes: Vec<u8>,
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

impl Corpus {
    /// The corpus of these bytes.
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        Self { bytes }
    }

    /// Reads a text (or any) file as bytes.
    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self { bytes })
    }

    /// The text of `path`, opened without following a link below its data directory.
    pub fn from_confined(path: &Confined) -> Result<Self> {
        let mut bytes = Vec::new();
        path.open()?
            .read_to_end(&mut bytes)
            .map_err(|source| Error::Io {
                path: path.path(),
                source,
            })?;
        Ok(Self { bytes })
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
        Self { bytes }
    }

    /// Writes the corpus to a file.
    pub fn write_to(&self, path: &Path) -> Result<()> {
        std::fs::write(path, &self.bytes).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Length in bytes (= tokens).
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether the corpus is empty.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// One microbatch: token ids and the next-token targets, both `[b, t]` u32.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Input token ids.
    pub tokens: Tensor,
    /// The byte after each input position.
    pub targets: Tensor,
}

/// Draws `(input, target)` windows at offsets chosen by `(seed, step, sequence)` alone, so
/// any step can be replayed (or resumed) without drawing the earlier ones, and a step's
/// sequences are the same however they are cut into microbatches and shared among
/// data-parallel replicas (`schedule = "auto"` may choose another microbatch size than the
/// spec's: the global batch, and so the training, stays the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sampler {
    /// Seed of the offsets.
    pub seed: u64,
    /// Sequences per microbatch `b`.
    pub microbatch_size: usize,
    /// Window length `t`.
    pub seq_len: usize,
}

impl Sampler {
    /// The window start offsets of microbatch `mb` of step `step`: those of the step's
    /// sequences `mb·b` to `mb·b + b − 1`.
    pub fn offsets(&self, corpus_len: usize, step: u64, mb: u32) -> Result<Vec<usize>> {
        if self.seq_len == 0 || self.microbatch_size == 0 || corpus_len <= self.seq_len {
            return Err(Error::InvalidArgument {
                field: "corpus",
                reason: format!(
                    "{corpus_len} bytes cannot give {} windows of {} + 1 bytes",
                    self.microbatch_size, self.seq_len
                ),
            });
        }
        let starts = (corpus_len - self.seq_len) as u64;
        let first = mb as usize * self.microbatch_size;
        Ok((first..first + self.microbatch_size)
            .map(|seq| {
                // Named as microbatches of one sequence were: their windows stay.
                let mut rng = SplitMix64::for_stream(self.seed, &format!("batch/{step}/{seq}"));
                rng.below(starts) as usize
            })
            .collect())
    }

    /// Microbatch `mb` of step `step` on `device`.
    pub fn batch(&self, corpus: &Corpus, step: u64, mb: u32, device: &Device) -> Result<Batch> {
        let bytes = corpus.as_bytes();
        let offsets = self.offsets(bytes.len(), step, mb)?;
        let (b, t) = (self.microbatch_size, self.seq_len);
        let mut inputs = Vec::with_capacity(b * t);
        let mut targets = Vec::with_capacity(b * t);
        for o in offsets {
            inputs.extend(bytes[o..o + t].iter().map(|&x| u32::from(x)));
            targets.extend(bytes[o + 1..o + t + 1].iter().map(|&x| u32::from(x)));
        }
        Ok(Batch {
            tokens: Tensor::from_vec(inputs, (b, t), device)?,
            targets: Tensor::from_vec(targets, (b, t), device)?,
        })
    }

    /// All `n` microbatches of step `step`.
    pub fn step(&self, corpus: &Corpus, step: u64, n: u32, device: &Device) -> Result<Vec<Batch>> {
        self.share(corpus, step, 0..n, device)
    }

    /// Microbatches `mbs` of step `step` (a data-parallel replica's share of the step).
    pub fn share(
        &self,
        corpus: &Corpus,
        step: u64,
        mbs: std::ops::Range<u32>,
        device: &Device,
    ) -> Result<Vec<Batch>> {
        mbs.map(|mb| self.batch(corpus, step, mb, device)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_corpus_is_deterministic_text() {
        let a = Corpus::generated();
        let b = Corpus::generated();
        assert_eq!(a, b);
        assert_eq!(a.len(), 64 * 1024);
        assert!(a.as_bytes().iter().all(|c| c.is_ascii()));
        assert_ne!(Corpus::generate(1024, 1), Corpus::generate(1024, 2));
        // Golden start: the default corpus must not change silently between versions.
        let start = String::from_utf8_lossy(&a.as_bytes()[..74]).into_owned();
        assert_eq!(
            start,
            "The pipeline receives the bubble. Every microbatch splits the activations."
        );
    }

    #[test]
    fn windows_are_shifted_by_one_and_seeded() -> Result<()> {
        let corpus = Corpus::generate(4096, 3);
        let s = Sampler {
            seed: 9,
            microbatch_size: 3,
            seq_len: 16,
        };
        let batch = s.batch(&corpus, 5, 1, &Device::Cpu)?;
        let x = batch.tokens.to_vec2::<u32>()?;
        let y = batch.targets.to_vec2::<u32>()?;
        for (row_x, row_y) in x.iter().zip(&y) {
            assert_eq!(&row_x[1..], &row_y[..15]);
        }
        assert_eq!(s.offsets(4096, 5, 1)?, s.offsets(4096, 5, 1)?);
        assert_ne!(s.offsets(4096, 5, 1)?, s.offsets(4096, 6, 1)?);
        assert_ne!(s.offsets(4096, 5, 1)?, s.offsets(4096, 5, 2)?);
        assert!(s.offsets(16, 0, 0).is_err());
        Ok(())
    }

    /// A step's windows are the same cut into 12 microbatches of 1, 4 of 3 or 2 of 6.
    #[test]
    fn a_steps_sequences_do_not_depend_on_the_microbatch_size() -> Result<()> {
        let corpus = Corpus::generate(4096, 3);
        let windows = |microbatch_size: usize| -> Result<Vec<Vec<u32>>> {
            let s = Sampler {
                seed: 9,
                microbatch_size,
                seq_len: 16,
            };
            let n = (12 / microbatch_size) as u32;
            let mut rows = Vec::new();
            for batch in s.step(&corpus, 5, n, &Device::Cpu)? {
                rows.extend(batch.tokens.to_vec2::<u32>()?);
            }
            Ok(rows)
        };
        let ones = windows(1)?;
        assert_eq!(ones.len(), 12);
        assert_eq!(windows(3)?, ones);
        assert_eq!(windows(6)?, ones);
        // Not one window drawn twelve times.
        assert!(ones.iter().any(|w| *w != ones[0]));
        Ok(())
    }
}
