//! Training data: documents (a text file, a folder of them, JSON Lines, or ids already
//! encoded) made into one token stream by a tokenizer, and that stream's `(input, target)`
//! windows, taken in order or shuffled each epoch ([`Sampler`]).
//!
//! # Layout
//!
//! - `corpus`: [`Corpus`], token ids bound by a vocabulary (and the generated default).
//! - `tokenizer`: [`Tokenizer`], byte-level or a Hugging Face `tokenizer.json`.
//! - `load`: [`DataSource`], a job's `[data]` read into a corpus: the four forms of
//!   `data.path`, their checks, and the token cache.
//! - `encode`: documents encoded in parallel, in pieces that do not depend on the threads.
//! - `cache`: the encoded tokens kept under the data directory, keyed by what made them.
//! - this file: [`Batch`] and [`Sampler`].

use candle_core::{Device, Tensor};

use crate::error::{Error, Result};
use crate::rng::SplitMix64;

mod cache;
mod corpus;
mod encode;
mod load;
mod tokenizer;

pub use corpus::{BYTE_VOCAB, Corpus};
pub use load::{DataSource, Loaded, Origin};
pub use tokenizer::{HuggingFace, Tokenizer};

/// One microbatch: token ids and the next-token targets, both `[b, t]` u32.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Input token ids.
    pub tokens: Tensor,
    /// The token after each input position.
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
        let offsets = self.offsets(corpus.len(), step, mb)?;
        let (b, t) = (self.microbatch_size, self.seq_len);
        let mut inputs = Vec::with_capacity(b * t);
        let mut targets = Vec::with_capacity(b * t);
        for o in offsets {
            corpus.extend_into(o, t, &mut inputs);
            corpus.extend_into(o + 1, t, &mut targets);
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
mod format_tests;

#[cfg(test)]
mod tests {
    use super::*;

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
