//! Byte-level training data: a corpus (a text file, or a small generated default one) and
//! its `(input, target)` windows, taken in order or shuffled each epoch ([`Sampler`]).

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

/// The corpus's `(input, target)` windows, one definition everywhere: a stream of `L`
/// tokens gives `W = ⌊(L − 1) / S⌋` windows (`S` = `seq_len`), window `k` the input
/// `t[kS .. kS+S]` and the target `t[kS+1 .. kS+S+1]`. Sequence `q` of step `s` is the
/// step's `q`-th of `G` (the global batch), `i = sG + q` in the job's stream of sequences;
/// in order (`shuffle = false`) it is window `i mod W`, shuffled it is window `π_e(i mod W)`
/// of epoch `e = ⌊i / W⌋`, `π_e` a permutation of the windows drawn from `(seed, e)`. Any
/// step can be replayed (or resumed) without drawing the earlier ones, and a step's
/// sequences are the same however they are cut into microbatches and shared among
/// data-parallel replicas (`schedule = "auto"` may choose another microbatch size than the
/// spec's: the global batch, and so the training, stays the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sampler {
    /// Seed of the epochs' permutations.
    pub seed: u64,
    /// Sequences per microbatch `b`.
    pub microbatch_size: usize,
    /// Window length `S`.
    pub seq_len: usize,
    /// Sequences per step `G`, over every microbatch and replica.
    pub global_batch: usize,
    /// Windows in a seeded order each epoch (`false`: in the corpus's order).
    pub shuffle: bool,
}

impl Sampler {
    /// How many windows a corpus of `corpus_len` tokens gives.
    pub fn windows(&self, corpus_len: usize) -> usize {
        match self.seq_len {
            0 => 0,
            s => corpus_len.saturating_sub(1) / s,
        }
    }

    /// The window start offsets of microbatch `mb` of step `step`: those of the step's
    /// sequences `mb·b` to `mb·b + b − 1`.
    pub fn offsets(&self, corpus_len: usize, step: u64, mb: u32) -> Result<Vec<usize>> {
        let windows = self.windows(corpus_len) as u64;
        if windows == 0 || self.microbatch_size == 0 {
            return Err(Error::InvalidArgument {
                field: "corpus",
                reason: format!(
                    "{corpus_len} tokens hold no window of {} + 1 tokens",
                    self.seq_len
                ),
            });
        }
        let first = mb as usize * self.microbatch_size;
        let base = step.saturating_mul(self.global_batch as u64);
        Ok((first..first + self.microbatch_size)
            .map(|q| {
                let i = base.saturating_add(q as u64);
                let (epoch, at) = (i / windows, i % windows);
                let k = if self.shuffle {
                    permuted(self.seed, epoch, at, windows)
                } else {
                    at
                };
                k as usize * self.seq_len
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

/// Position `at` of a permutation of `0..n` drawn from `(seed, epoch)`: a balanced
/// four-round Feistel network over the smallest even bit width holding `n`, walked until it
/// lands below `n` (a bijection on the wider domain stays one on `0..n`). No table: any
/// window of any epoch costs a few hashes.
fn permuted(seed: u64, epoch: u64, at: u64, n: u64) -> u64 {
    if n <= 1 {
        return 0;
    }
    let bits = 64 - (n - 1).leading_zeros();
    let half = bits.div_ceil(2);
    let mask = (1u64 << half) - 1;
    let key = SplitMix64::new(seed ^ 0x5348_5546_464c_4521).next_u64() ^ epoch;
    let mut x = at;
    loop {
        let (mut left, mut right) = (x >> half, x & mask);
        for round in 0..4u64 {
            let f = SplitMix64::new(key ^ (round << 56) ^ right).next_u64() & mask;
            (left, right) = (right, left ^ f);
        }
        x = (left << half) | right;
        if x < n {
            return x;
        }
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
            global_batch: 12,
            shuffle: true,
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
                global_batch: 12,
                shuffle: true,
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

    /// In order, step `s` takes windows `sG … sG+G−1` modulo the window count, microbatch
    /// `m` the `m`-th run of `b` of them; each is `t[kS .. kS+S]` and its target one on.
    #[test]
    fn in_order_windows_follow_the_definition() -> Result<()> {
        let corpus = Corpus::from_bytes((0..=200u8).collect());
        let s = Sampler {
            seed: 9,
            microbatch_size: 2,
            seq_len: 10,
            global_batch: 6,
            shuffle: false,
        };
        // 201 tokens: ⌊200 / 10⌋ = 20 windows.
        assert_eq!(s.windows(201), 20);
        assert_eq!(s.offsets(201, 0, 0)?, [0, 10]);
        assert_eq!(s.offsets(201, 0, 2)?, [40, 50]);
        // Step 3 starts at sequence 18: windows 18, 19, then 0 again.
        assert_eq!(s.offsets(201, 3, 0)?, [180, 190]);
        assert_eq!(s.offsets(201, 3, 1)?, [0, 10]);
        let batch = s.batch(&corpus, 3, 0, &Device::Cpu)?;
        let x = batch.tokens.to_vec2::<u32>()?;
        let y = batch.targets.to_vec2::<u32>()?;
        assert_eq!(x[1], (190..200).collect::<Vec<u32>>());
        assert_eq!(y[1], (191..201).collect::<Vec<u32>>());
        // The last token of 201 is only ever a target; 200 tokens give 19 windows.
        assert_eq!(s.windows(200), 19);
        assert!(s.offsets(10, 0, 0).is_err());
        assert_eq!(s.offsets(11, 0, 0)?, [0, 0]);
        Ok(())
    }

    /// Shuffled, each epoch takes every window once, in an order that differs between
    /// epochs and seeds.
    #[test]
    fn shuffled_epochs_take_every_window_once() {
        for n in [1u64, 2, 3, 7, 64, 1000, 1025] {
            let order =
                |seed, epoch| -> Vec<u64> { (0..n).map(|i| permuted(seed, epoch, i, n)).collect() };
            let mut seen = order(5, 0);
            seen.sort_unstable();
            assert_eq!(seen, (0..n).collect::<Vec<_>>(), "n {n}");
            if n >= 7 {
                assert_ne!(order(5, 0), order(5, 1), "n {n}");
                assert_ne!(order(5, 0), order(6, 0), "n {n}");
            }
        }
    }
}
