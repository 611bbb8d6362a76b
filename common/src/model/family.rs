//! The block architecture a model spec describes, and the Llama family's sizes.
//!
//! - [`Family::Gpt`]: GPT-2's block (pre-LayerNorm with biases, learned positions, a
//!   `h → 4h → h` tanh-GELU MLP, multi-head attention), an untied LM head.
//! - [`Family::Llama`]: Llama's block as `transformers`' `LlamaForCausalLM` computes it —
//!   RMSNorm (a scale, no shift), rotary position embeddings on Q and K (the half-split
//!   rotation), grouped-query attention (`kv_heads` key/value heads, each shared by
//!   `heads / kv_heads` query heads), a SwiGLU MLP `down(silu(gate(x)) · up(x))` of width
//!   `intermediate`, no biases, a final RMSNorm; the LM head optionally tied to the token
//!   embedding.

use serde::{Deserialize, Serialize};

/// The block architecture (`[model] family`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// GPT-2's block.
    #[default]
    Gpt,
    /// Llama's block.
    Llama,
}

impl Family {
    /// The text form (`gpt`, `llama`).
    pub fn as_str(self) -> &'static str {
        match self {
            Family::Gpt => "gpt",
            Family::Llama => "llama",
        }
    }

    /// Whether this is the default family (left out of a job's TOML form).
    pub fn is_gpt(&self) -> bool {
        *self == Family::Gpt
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The default rotary base (`rope_theta`), Llama 2's and `transformers`' default.
pub const DEFAULT_ROPE_THETA: f64 = 10_000.0;
/// The default RMSNorm epsilon (`rms_norm_eps`), Llama 3's.
pub const DEFAULT_NORM_EPS: f64 = 1e-5;

/// Llama's default MLP width for hidden size `h` when a spec gives none: `8h/3`, rounded up
/// to a multiple of 256 (the reference implementation's `multiple_of`).
pub fn default_intermediate(hidden: u32) -> u32 {
    let width = (8 * u64::from(hidden)).div_ceil(3);
    u32::try_from(width.div_ceil(256) * 256).unwrap_or(u32::MAX)
}

pub(super) fn default_rope_theta() -> f64 {
    DEFAULT_ROPE_THETA
}
pub(super) fn is_default_rope_theta(x: &f64) -> bool {
    *x == DEFAULT_ROPE_THETA
}
pub(super) fn default_norm_eps() -> f64 {
    DEFAULT_NORM_EPS
}
pub(super) fn is_default_norm_eps(x: &f64) -> bool {
    *x == DEFAULT_NORM_EPS
}
pub(super) fn is_false(b: &bool) -> bool {
    !*b
}
