//! The model spec: a decoder (GPT or Llama family) described by its sizes, cut into pieces.
//!
//! The planner uses it for parameter counts, activation memory and FLOPs per piece; the worker
//! builds the same model from it, and stashes exactly the bytes
//! [`ModelSpec::piece_activation_bytes`] predicts (a worker test compares the two).
//!
//! # The model
//!
//! Pieces in model order: [`Piece::Embedding`] (token embedding `V × h` plus learned positions
//! `t × h`), [`Piece::Block`]`(0..layers)` (pre-LayerNorm transformer blocks: LN → causal
//! multi-head self-attention → residual, LN → MLP `h → 4h → h` with tanh-GELU → residual) and
//! [`Piece::Head`] (final LayerNorm, untied LM head `h × V` without bias, cross-entropy loss).
//! Linear layers of the blocks have biases; LayerNorms have a scale and a shift. That is the
//! GPT family; the Llama family ([`Family::Llama`], [`family`]) has the same pieces with
//! Llama's block, no learned positions, and RMSNorm in the head.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

pub mod checkpoint_meta;
pub mod family;
pub mod hf;
pub mod hf_weights;
mod sizes;
pub use family::{DEFAULT_NORM_EPS, DEFAULT_ROPE_THETA, Family};

/// Element type of parameters and activations.
///
/// Written in lower case; read in any case, in job specs as on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// bfloat16.
    BF16,
}

impl DType {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// Training-state bytes per parameter as a worker holds them: the parameter in this
    /// dtype; its accumulated gradient in f64 (microbatch gradients add exactly in practice,
    /// so data-parallel replicas give the single device's bits) and AdamW's two moments in
    /// f32; for bf16 and f16 also an f32 master copy that the optimizer updates (Megatron-LM's
    /// mixed-precision layout, with a wider gradient): 20 bytes in f32, 22 in bf16 and f16.
    pub fn training_state_bytes(self) -> u64 {
        let master = if self == DType::F32 { 0 } else { 4 };
        // The gradient accumulates in f64, the AdamW moments are f32.
        self.bytes() + 8 + 2 * 4 + master
    }

    /// The text form (`f32`, `f16`, `bf16`).
    pub fn as_str(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
        }
    }
}

impl TryFrom<String> for DType {
    type Error = Error;

    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DType {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(DType::F32),
            "f16" => Ok(DType::F16),
            "bf16" => Ok(DType::BF16),
            _ => Err(Error::InvalidArgument {
                field: "dtype",
                reason: format!("{s:?} is not one of f32, f16, bf16"),
            }),
        }
    }
}

/// One contiguous piece of the model; a stage is a range of pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Piece {
    /// Token embedding plus learned positions.
    Embedding,
    /// Transformer block `i` (0-based).
    Block(u32),
    /// Final LayerNorm, LM head and cross-entropy loss.
    Head,
}

impl fmt::Display for Piece {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Piece::Embedding => f.write_str("embedding"),
            Piece::Block(i) => write!(f, "block{i}"),
            Piece::Head => f.write_str("head"),
        }
    }
}

/// Activation bytes a stage holds for one microbatch of one piece.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Activation {
    /// Stash held from the end of `F` until `B` (what `B` and `W` need).
    pub after_forward: u64,
    /// Stash still held from the end of `B` until `W` frees it (what `W` needs).
    pub after_backward_input: u64,
}

impl std::ops::Add for Activation {
    type Output = Activation;

    fn add(self, rhs: Activation) -> Activation {
        Activation {
            after_forward: self.after_forward.saturating_add(rhs.after_forward),
            after_backward_input: self
                .after_backward_input
                .saturating_add(rhs.after_backward_input),
        }
    }
}

/// The most transformer blocks a model spec may have (the largest published models have a
/// few hundred; the auto-planner's partition search grows with the square of the count).
pub const MAX_LAYERS: u32 = 10_000;

/// The largest hidden size a model spec may have (published models stay below 2^15); with
/// [`MAX_VOCAB`] and [`MAX_SEQ_LEN`] it keeps parameter counts and their byte totals far
/// inside `u64`.
pub const MAX_HIDDEN: u32 = 1 << 18;

/// The largest vocabulary a model spec may have (published ones stay below 2^19).
pub const MAX_VOCAB: u32 = 1 << 24;

/// The longest sequence a model spec may have (2^22 tokens, four times the longest
/// published context).
pub const MAX_SEQ_LEN: u32 = 1 << 22;

/// Sizes of a decoder of either family (the `[model]` section of a job).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// The block architecture (default GPT).
    #[serde(default, skip_serializing_if = "Family::is_gpt")]
    pub family: Family,
    /// A Hugging Face model directory under the data directory (`config.json`,
    /// `model.safetensors`): the job starts from its weights, and the sizes below, left
    /// out, are read from its `config.json` when the job is submitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Vocabulary size (256 for byte-level tokens).
    #[serde(default)]
    pub vocab: u32,
    /// Hidden size `h`.
    #[serde(default)]
    pub hidden: u32,
    /// Attention heads (must divide `hidden`).
    #[serde(default)]
    pub heads: u32,
    /// Transformer blocks.
    #[serde(default)]
    pub layers: u32,
    /// Sequence length `t` (also the number of learned positions).
    pub seq_len: u32,
    /// Element type of parameters and activations.
    pub dtype: DType,
    /// Llama: key/value heads of grouped-query attention, dividing `heads` (default:
    /// `heads`, multi-head attention).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_heads: Option<u32>,
    /// Llama: the SwiGLU MLP's width (default [`family::default_intermediate`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intermediate: Option<u32>,
    /// Llama: the rotary embedding's base.
    #[serde(
        default = "family::default_rope_theta",
        skip_serializing_if = "family::is_default_rope_theta"
    )]
    pub rope_theta: f64,
    /// Llama: RMSNorm's epsilon.
    #[serde(
        default = "family::default_norm_eps",
        skip_serializing_if = "family::is_default_norm_eps"
    )]
    pub norm_eps: f64,
    /// Llama: the LM head is the token embedding's table (`tie_word_embeddings`).
    #[serde(default, skip_serializing_if = "family::is_false")]
    pub tie_embeddings: bool,
}

impl Default for ModelSpec {
    /// `pipewise local --model tiny`: a byte-level GPT of 8 blocks, hidden 64, 4 heads,
    /// sequences of 32, in f32.
    fn default() -> Self {
        ModelSpec {
            family: Family::Gpt,
            path: None,
            vocab: 256,
            hidden: 64,
            heads: 4,
            layers: 8,
            seq_len: 32,
            dtype: DType::F32,
            kv_heads: None,
            intermediate: None,
            rope_theta: DEFAULT_ROPE_THETA,
            norm_eps: DEFAULT_NORM_EPS,
            tie_embeddings: false,
        }
    }
}

/// Bytes of one token id (`u32`).
const TOKEN_BYTES: u64 = 4;

impl ModelSpec {
    /// The default split: the model's pieces cut into `placement`'s stages so that every
    /// worker's stages together cost the same ([`ModelSpec::piece_costs`]), then every
    /// stage, then the activation memory ([`partition::balance_placed`], with each piece's
    /// stash after `F`). The embedding goes with the first stage and the head with the
    /// last. Costs and stashes scale alike with the microbatch size, so the split does not
    /// depend on it.
    ///
    /// [`partition::balance_placed`]: crate::partition::balance_placed
    pub fn balanced_split(
        &self,
        placement: &crate::placement::Placement,
    ) -> Result<Vec<std::ops::Range<usize>>> {
        let stash: Vec<f64> = self
            .pieces()
            .into_iter()
            .map(|p| self.piece_activation_bytes(p, 1).after_forward as f64)
            .collect();
        crate::partition::balance_placed(&self.piece_costs(1), &stash, placement)
    }

    /// What each piece costs to train on one microbatch of `microbatch_size` sequences,
    /// for splitting the model: its `F`, `B` and `W` FLOPs ([`ModelSpec::piece_flops`];
    /// `B` and `W` each cost about `F`'s), at least 5 % of a block's (the embedding's
    /// pass does next to no arithmetic but is not free).
    pub fn piece_costs(&self, microbatch_size: u32) -> Vec<f64> {
        let block = self.piece_flops(Piece::Block(0), microbatch_size);
        self.pieces()
            .into_iter()
            .map(|p| 3.0 * self.piece_flops(p, microbatch_size).max(0.05 * block))
            .collect()
    }

    /// The model's pieces cut into `stages` contiguous ranges as evenly as possible
    /// (earlier stages get the extra pieces); the embedding goes with the first stage and
    /// the head with the last ([`partition::even`](crate::partition::even)).
    pub fn even_split(&self, stages: usize) -> Result<Vec<std::ops::Range<usize>>> {
        crate::partition::even(self.layers as usize + 2, stages)
    }

    /// The model's pieces cut into contiguous ranges of `counts[s]` pieces each (a stage
    /// per count): every count positive, adding up to the model's pieces
    /// ([`partition::by_counts`](crate::partition::by_counts)).
    pub fn split_by_counts(&self, counts: &[u32]) -> Result<Vec<std::ops::Range<usize>>> {
        crate::partition::by_counts(self.layers as usize + 2, counts)
    }

    /// Rejects zero sizes, sizes above [`MAX_LAYERS`], [`MAX_HIDDEN`], [`MAX_VOCAB`] and
    /// [`MAX_SEQ_LEN`], and a hidden size the heads do not divide.
    pub fn validate(&self) -> Result<()> {
        let fields: [(&'static str, u32); 5] = [
            ("vocab", self.vocab),
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("layers", self.layers),
            ("seq_len", self.seq_len),
        ];
        for (field, value) in fields {
            if value == 0 {
                return Err(Error::InvalidArgument {
                    field,
                    reason: "must be at least 1".into(),
                });
            }
        }
        let caps: [(&'static str, u32, u32); 4] = [
            ("layers", self.layers, MAX_LAYERS),
            ("hidden", self.hidden, MAX_HIDDEN),
            ("vocab", self.vocab, MAX_VOCAB),
            ("seq_len", self.seq_len, MAX_SEQ_LEN),
        ];
        for (field, value, cap) in caps {
            if value > cap {
                return Err(Error::InvalidArgument {
                    field,
                    reason: format!("must be at most {cap}, got {value}"),
                });
            }
        }
        if !self.hidden.is_multiple_of(self.heads) {
            return Err(Error::InvalidArgument {
                field: "heads",
                reason: format!(
                    "{} heads do not divide hidden size {}",
                    self.heads, self.hidden
                ),
            });
        }
        self.validate_family()
    }

    /// The pieces in model order: `Embedding`, `Block(0)` … `Block(layers − 1)`, `Head`.
    pub fn pieces(&self) -> Vec<Piece> {
        let mut pieces = Vec::with_capacity(self.layers as usize + 2);
        pieces.push(Piece::Embedding);
        pieces.extend((0..self.layers).map(Piece::Block));
        pieces.push(Piece::Head);
        pieces
    }

    /// Size of one attention head.
    pub fn head_dim(&self) -> u32 {
        self.hidden / self.heads.max(1)
    }

    /// Parameter count of a piece.
    ///
    /// - Embedding: `V·h + t·h` (tokens and learned positions);
    /// - Block: `12h² + 13h` (two LayerNorms `2·2h`, QKV `h·3h + 3h`, attention output
    ///   `h·h + h`, MLP `h·4h + 4h` and `4h·h + h`);
    /// - Head: `2h + h·V` (final LayerNorm, LM head untied from the embedding, no bias).
    ///
    /// Llama, with `q = h + 2·kv_heads·head_dim` and MLP width `m`: embedding `V·h`; block
    /// `2h + h·q + h² + 3·h·m` (two RMSNorms, fused QKV, output, gate, up and down); head
    /// `h + h·V` (final RMSNorm, LM head). A tied head holds the embedding's table as its own
    /// (its holder keeps the table and its optimizer state, as the embedding's does).
    pub fn piece_params(&self, p: Piece) -> u64 {
        // In u128 and saturating, for specs not (yet) validated against the size caps.
        let (v, h, t) = (
            u128::from(self.vocab),
            u128::from(self.hidden),
            u128::from(self.seq_len),
        );
        let (qkv, m) = (u128::from(self.qkv_width()), u128::from(self.mlp_width()));
        let n = match (self.family, p) {
            (Family::Gpt, Piece::Embedding) => v * h + t * h,
            (Family::Gpt, Piece::Block(_)) => 12 * h * h + 13 * h,
            (Family::Gpt, Piece::Head) => 2 * h + h * v,
            (Family::Llama, Piece::Embedding) => v * h,
            (Family::Llama, Piece::Block(_)) => 2 * h + h * qkv + h * h + 3 * h * m,
            (Family::Llama, Piece::Head) => h + h * v,
        };
        u64::try_from(n).unwrap_or(u64::MAX)
    }

    /// Total parameter count.
    pub fn params(&self) -> u64 {
        self.range_params(0..self.pieces().len())
    }

    /// The training state ([`DType::training_state_bytes`] per parameter) each of
    /// `placement`'s workers holds when stage `s` has the pieces `ranges[s]` (stages beyond
    /// `ranges` hold none), saturating.
    pub fn state_bytes_by_worker(
        &self,
        placement: &crate::placement::Placement,
        ranges: &[std::ops::Range<usize>],
    ) -> Vec<u64> {
        let mut out = vec![0u64; placement.workers() as usize];
        for (s, r) in ranges.iter().enumerate() {
            let w = placement.worker_of(s as u32) as usize;
            out[w] = out[w].saturating_add(
                self.range_params(r.clone())
                    .saturating_mul(self.dtype.training_state_bytes()),
            );
        }
        out
    }

    /// Parameter count of a range of pieces (indices into [`ModelSpec::pieces`]).
    pub fn range_params(&self, range: std::ops::Range<usize>) -> u64 {
        self.pieces()[range]
            .iter()
            .map(|&p| self.piece_params(p))
            .fold(0, u64::saturating_add)
    }

    /// Bytes a stage holds for one microbatch of `microbatch_size` sequences of this piece.
    ///
    /// With `N = b·t` tokens, `e` bytes per element, `a` heads and token ids as `u32`:
    ///
    /// | piece | after `F` | after `B` (held for `W`) |
    /// |---|---|---|
    /// | Embedding | `4N` (ids) | `4N + N·h·e` (ids, output gradient) |
    /// | Block | `N·(16h + 2)·e + 4·N·a` | `16·N·h·e` |
    /// | Head | `N·(2h + 1 + V)·e + 4N` | `N·(h + V)·e` |
    ///
    /// Block after `F`, per token: LN1 normalised input and its `1/σ` (`h + 1`), LN1 output
    /// (`h`), Q, K, V (`3h`), attention output before its projection (`h`), LN2 normalised
    /// input and `1/σ` (`h + 1`), LN2 output (`h`), MLP pre-activation and GELU output
    /// (`4h + 4h`); plus attention's log-sum-exp per head (`a`, always f32: 4 bytes). The
    /// `t × t` attention probabilities are not kept: `B` recomputes them from Q, K and the
    /// log-sum-exp (flash attention's recomputation), so a block's stash is linear in `t`.
    /// Block after `B`, per token: each linear layer's input and output gradient, what `W`
    /// needs — QKV (`h + 3h`), attention projection (`h + h`), MLP up (`h + 4h`), MLP down
    /// (`4h + h`). The LayerNorms' weight gradients need only `x̂` and the output gradient,
    /// both at hand in `B`, so `B` computes and adds them and nothing of theirs waits for
    /// `W`: the stash after `B` is no larger than the one after `F`, so zero-bubble
    /// schedules that hold many microbatches for `W` peak no higher than 1F1B's forward
    /// stashes.
    /// Head after `F`: final-LN `x̂` and `1/σ` (`h + 1`), its output (`h`), the softmax
    /// probabilities (`V`) and the target ids; after `B`: the LM head's input (the LN
    /// output) and the logits gradient (`h + V`), smaller than the probabilities it replaces
    /// plus the rest. The LM head's weight gradient (`2·N·h·V` FLOPs, the head's largest
    /// product) stays in `W`, off the critical path `B` is on.
    pub fn piece_activation_bytes(&self, p: Piece, microbatch_size: u32) -> Activation {
        // In u128: a large enough microbatch takes a stash past u64 even within the size
        // caps; such a stash saturates.
        let (v, h, t) = (
            u128::from(self.vocab),
            u128::from(self.hidden),
            u128::from(self.seq_len),
        );
        let (a, b, e) = (
            u128::from(self.heads),
            u128::from(microbatch_size),
            u128::from(self.dtype.bytes()),
        );
        let ids = u128::from(TOKEN_BYTES);
        let n = b * t;
        let (qkv, m) = (u128::from(self.qkv_width()), u128::from(self.mlp_width()));
        // The blocks' stashes differ (Llama's per token: RMSNorm x̂ and 1/σ `h + 1`, its
        // output `h`, rotated Q, K, V `q`, attention output `h`, the second RMSNorm's
        // `h + 1` and output `h`, gate and up `2m`, the gated product `m`; after B each
        // linear layer's input and output gradient); embedding and head are alike.
        let block = match self.family {
            Family::Gpt => (n * (16 * h + 2) * e + 4 * n * a, 16 * n * h * e),
            Family::Llama => (
                n * (5 * h + qkv + 3 * m + 2) * e + 4 * n * a,
                n * (5 * h + qkv + 3 * m) * e,
            ),
        };
        let (after_forward, after_backward_input) = match p {
            Piece::Embedding => (ids * n, ids * n + n * h * e),
            Piece::Block(_) => block,
            Piece::Head => (n * (2 * h + 1 + v) * e + ids * n, n * (h + v) * e),
        };
        let clamp = |x: u128| u64::try_from(x).unwrap_or(u64::MAX);
        Activation {
            after_forward: clamp(after_forward),
            after_backward_input: clamp(after_backward_input),
        }
    }

    /// Forward FLOPs of a piece for one microbatch (`2·m·n·k` per matmul).
    ///
    /// - Embedding: `N·h` (the position add; the lookup does no arithmetic);
    /// - Block: `24·N·h²` (QKV `6Nh²`, projection `2Nh²`, MLP `16Nh²`) plus `4·b·t²·h` for
    ///   the scores and the weighted sum (the full `t × t` product, as computed);
    /// - Head: `2·N·h·V` (LM head).
    ///
    /// Llama's block: QKV and output `2·N·h·(q + h)`, gate, up and down `6·N·h·m`, the same
    /// attention products; its embedding is a row copy per token (`N·h`).
    ///
    /// Backward input and weight passes cost about the same as forward each for the linear
    /// layers (`B` also redoes the attention products twice).
    pub fn piece_flops(&self, p: Piece, microbatch_size: u32) -> f64 {
        let (v, h, t) = (self.vocab as f64, self.hidden as f64, self.seq_len as f64);
        let b = microbatch_size as f64;
        let n = b * t;
        let (qkv, m) = (f64::from(self.qkv_width()), f64::from(self.mlp_width()));
        match (self.family, p) {
            (_, Piece::Embedding) => n * h,
            (Family::Gpt, Piece::Block(_)) => 24.0 * n * h * h + 4.0 * b * t * t * h,
            (Family::Llama, Piece::Block(_)) => {
                2.0 * n * h * (qkv + h) + 6.0 * n * h * m + 4.0 * b * t * t * h
            }
            (_, Piece::Head) => 2.0 * n * h * v,
        }
    }

    /// Sum of [`ModelSpec::piece_activation_bytes`] over a range of pieces (indices into
    /// [`ModelSpec::pieces`]).
    pub fn range_activation_bytes(
        &self,
        range: std::ops::Range<usize>,
        microbatch_size: u32,
    ) -> Activation {
        self.pieces()
            .into_iter()
            .skip(range.start)
            .take(range.end.saturating_sub(range.start))
            .map(|p| self.piece_activation_bytes(p, microbatch_size))
            .fold(Activation::default(), |acc, x| acc + x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_reads_in_any_case_and_writes_lower_case() {
        let read: DType = serde_json::from_str("\"BF16\"").expect("reads");
        assert_eq!(read, DType::BF16);
        assert_eq!(serde_json::to_string(&read).expect("writes"), "\"bf16\"");
        let err = serde_json::from_str::<DType>("\"fp8\"")
            .expect_err("refused")
            .to_string();
        assert!(err.contains("not one of f32, f16, bf16"), "{err}");
    }

    #[test]
    fn training_state_keeps_moments_and_masters_in_f32_gradients_in_f64() {
        // Value, gradient, the two moments (and the master copy).
        assert_eq!(DType::F32.training_state_bytes(), 4 + 8 + 8);
        assert_eq!(DType::BF16.training_state_bytes(), 2 + 8 + 8 + 4);
        assert_eq!(DType::F16.training_state_bytes(), 2 + 8 + 8 + 4);
    }

    fn spec() -> ModelSpec {
        ModelSpec {
            vocab: 256,
            hidden: 64,
            heads: 4,
            layers: 3,
            seq_len: 32,
            dtype: DType::F32,
            ..Default::default()
        }
    }

    #[test]
    fn sizes_within_the_caps_count_without_overflow() {
        let largest = ModelSpec {
            vocab: MAX_VOCAB,
            hidden: MAX_HIDDEN,
            heads: MAX_HIDDEN,
            layers: MAX_LAYERS,
            seq_len: MAX_SEQ_LEN,
            dtype: DType::BF16,
            ..Default::default()
        };
        assert!(largest.validate().is_ok());
        // Parameters stay exact (far inside u64), and so does their training state.
        let h = u64::from(MAX_HIDDEN);
        assert_eq!(largest.piece_params(Piece::Block(0)), 12 * h * h + 13 * h);
        let total = largest.params();
        assert!(
            total
                .checked_mul(DType::BF16.training_state_bytes())
                .is_some()
        );
        // A stash past u64 saturates rather than wrapping to a small figure.
        let huge = largest.piece_activation_bytes(Piece::Block(0), u32::MAX);
        assert_eq!(huge.after_forward, u64::MAX);
        let all = largest.range_activation_bytes(0..4, u32::MAX);
        assert_eq!(all.after_forward, u64::MAX);
        // One token of the smallest model is counted exactly as before.
        assert_eq!(
            spec()
                .piece_activation_bytes(Piece::Embedding, 1)
                .after_forward,
            4 * 32
        );
        for (field, edit) in [
            (
                "hidden",
                (|m: &mut ModelSpec| m.hidden = MAX_HIDDEN * 2) as fn(&mut ModelSpec),
            ),
            ("vocab", |m| m.vocab = MAX_VOCAB + 1),
            ("seq_len", |m| m.seq_len = MAX_SEQ_LEN + 1),
            ("layers", |m| m.layers = MAX_LAYERS + 1),
        ] {
            let mut m = largest.clone();
            edit(&mut m);
            match m.validate() {
                Err(Error::InvalidArgument { field: f, reason }) => {
                    assert_eq!(f, field);
                    assert!(reason.contains("must be at most"), "{reason}");
                }
                other => panic!("{field}: {other:?}"),
            }
        }
    }

    #[test]
    fn split_by_counts_cuts_contiguous_ranges() {
        // 3 blocks + embedding + head = 5 pieces.
        assert_eq!(spec().split_by_counts(&[2, 3]), Ok(vec![0..2, 2..5]));
        assert_eq!(
            spec().split_by_counts(&[1, 1, 1, 2]),
            Ok(vec![0..1, 1..2, 2..3, 3..5])
        );
        for bad in [&[][..], &[5, 0], &[2, 2], &[3, 3]] {
            assert!(
                matches!(
                    spec().split_by_counts(bad),
                    Err(Error::InvalidArgument {
                        field: "stage_pieces",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn dtype_text_round_trips() {
        for d in [DType::F32, DType::F16, DType::BF16] {
            assert_eq!(d.to_string().parse::<DType>(), Ok(d));
        }
        assert_eq!("BF16".parse::<DType>(), Ok(DType::BF16));
        assert!(matches!(
            "f64".parse::<DType>(),
            Err(Error::InvalidArgument { field: "dtype", .. })
        ));
        assert_eq!(DType::F32.bytes(), 4);
        assert_eq!(DType::BF16.bytes(), 2);
    }

    #[test]
    fn validate_names_the_field() {
        assert_eq!(spec().validate(), Ok(()));
        let cases: [(&str, ModelSpec); 6] = [
            ("vocab", ModelSpec { vocab: 0, ..spec() }),
            (
                "hidden",
                ModelSpec {
                    hidden: 0,
                    ..spec()
                },
            ),
            ("heads", ModelSpec { heads: 0, ..spec() }),
            (
                "layers",
                ModelSpec {
                    layers: 0,
                    ..spec()
                },
            ),
            (
                "seq_len",
                ModelSpec {
                    seq_len: 0,
                    ..spec()
                },
            ),
            ("heads", ModelSpec { heads: 5, ..spec() }),
        ];
        for (want, s) in cases {
            match s.validate() {
                Err(Error::InvalidArgument { field, .. }) => assert_eq!(field, want),
                other => panic!("{s:?}: expected InvalidArgument({want}), got {other:?}"),
            }
        }
    }

    #[test]
    fn pieces_in_model_order() {
        let s = spec();
        assert_eq!(
            s.pieces(),
            vec![
                Piece::Embedding,
                Piece::Block(0),
                Piece::Block(1),
                Piece::Block(2),
                Piece::Head
            ]
        );
        assert_eq!(Piece::Block(2).to_string(), "block2");
    }

    #[test]
    fn parameter_counts() {
        let s = spec();
        assert_eq!(s.piece_params(Piece::Embedding), 256 * 64 + 32 * 64);
        // GPT-2 small's block: 7,087,872 parameters at h = 768.
        let gpt2 = ModelSpec {
            hidden: 768,
            heads: 12,
            ..s.clone()
        };
        assert_eq!(gpt2.piece_params(Piece::Block(0)), 7_087_872);
        assert_eq!(s.piece_params(Piece::Head), 2 * 64 + 64 * 256);
        let total: u64 = s.pieces().iter().map(|&p| s.piece_params(p)).sum();
        assert_eq!(s.params(), total);
    }

    #[test]
    fn activation_bytes_scale_with_microbatch_and_dtype() {
        let s = spec();
        for p in s.pieces() {
            let one = s.piece_activation_bytes(p, 1);
            let three = s.piece_activation_bytes(p, 3);
            assert_eq!(three.after_forward, 3 * one.after_forward, "{p}");
            assert_eq!(
                three.after_backward_input,
                3 * one.after_backward_input,
                "{p}"
            );
        }
        // Half precision halves everything but the token ids and attention's f32
        // log-sum-exp (4 heads × 4 bytes per token, 2 × 32 tokens).
        let half = ModelSpec {
            dtype: DType::BF16,
            ..s.clone()
        };
        let b32 = s.piece_activation_bytes(Piece::Block(0), 2);
        let b16 = half.piece_activation_bytes(Piece::Block(0), 2);
        let lse = 2 * 32 * 4 * 4;
        assert_eq!(b32.after_forward - lse, 2 * (b16.after_forward - lse));
        assert_eq!(b32.after_backward_input, 2 * b16.after_backward_input);
        // Block at b = 1: N = 32 tokens, (16·64 + 2)·4 bytes each plus 4 heads × 4 bytes of
        // attention log-sum-exp each (no `t × t` probabilities).
        assert_eq!(
            s.piece_activation_bytes(Piece::Block(0), 1).after_forward,
            32 * (16 * 64 + 2) * 4 + 32 * 4 * 4
        );
        let all = s.range_activation_bytes(0..5, 1);
        let sum: u64 = s
            .pieces()
            .iter()
            .map(|&p| s.piece_activation_bytes(p, 1).after_forward)
            .sum();
        assert_eq!(all.after_forward, sum);
        assert_eq!(
            s.range_activation_bytes(1..2, 1),
            s.piece_activation_bytes(Piece::Block(0), 1)
        );
    }

    #[test]
    fn flops_are_matmul_dominated() {
        let s = spec();
        let n = 32.0;
        assert_eq!(
            s.piece_flops(Piece::Block(0), 1),
            24.0 * n * 64.0 * 64.0 + 4.0 * 32.0 * 32.0 * 64.0
        );
        assert_eq!(s.piece_flops(Piece::Head, 2), 2.0 * 2.0 * n * 64.0 * 256.0);
        assert!(s.piece_flops(Piece::Embedding, 1) < s.piece_flops(Piece::Block(0), 1));
    }

    #[test]
    fn spec_serde_round_trips() {
        let s = spec();
        let text = serde_json::to_string(&s).expect("serialize");
        assert!(text.contains("\"dtype\":\"f32\""), "{text}");
        let back: ModelSpec = serde_json::from_str(&text).expect("deserialize");
        assert_eq!(back, s);
    }
}
