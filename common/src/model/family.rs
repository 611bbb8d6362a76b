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

/// The largest MLP width a spec may have.
pub const MAX_INTERMEDIATE: u32 = 1 << 20;

impl super::ModelSpec {
    /// Key/value heads: `kv_heads`, or `heads` (multi-head attention).
    pub fn kv_heads(&self) -> u32 {
        self.kv_heads.unwrap_or(self.heads)
    }

    /// The MLP's hidden width: `4h` (GPT), `intermediate` (Llama).
    pub fn mlp_width(&self) -> u32 {
        match self.family {
            Family::Gpt => self.hidden.saturating_mul(4),
            Family::Llama => self
                .intermediate
                .unwrap_or_else(|| default_intermediate(self.hidden)),
        }
    }

    /// Columns of the fused Q, K, V projection's output: `h + 2·kv_heads·head_dim` (`3h`
    /// with as many key/value heads as query heads).
    pub fn qkv_width(&self) -> u32 {
        let kv = self.kv_heads().saturating_mul(self.head_dim());
        self.hidden.saturating_add(kv.saturating_mul(2))
    }

    /// The family's own fields: the Llama ones in range, and none of them set on a GPT spec.
    pub(super) fn validate_family(&self) -> crate::error::Result<()> {
        use crate::error::Error;
        let invalid =
            |field: &'static str, reason: String| Error::InvalidArgument { field, reason };
        if self.family == Family::Gpt {
            let set = [
                ("kv_heads", self.kv_heads.is_some()),
                ("intermediate", self.intermediate.is_some()),
                ("rope_theta", !is_default_rope_theta(&self.rope_theta)),
                ("norm_eps", !is_default_norm_eps(&self.norm_eps)),
                ("tie_embeddings", self.tie_embeddings),
            ];
            if let Some((field, _)) = set.into_iter().find(|(_, set)| *set) {
                return Err(invalid(
                    field,
                    "applies to family = \"llama\" (GPT has multi-head attention, a 4h MLP, \
                     learned positions, LayerNorm and an untied head)"
                        .into(),
                ));
            }
            return Ok(());
        }
        let kv = self.kv_heads();
        if kv == 0 || !self.heads.is_multiple_of(kv) {
            return Err(invalid(
                "kv_heads",
                format!("{kv} key/value heads do not divide {} heads", self.heads),
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(invalid(
                "heads",
                format!(
                    "head size {} is odd; rotary embeddings rotate pairs of dimensions",
                    self.head_dim()
                ),
            ));
        }
        let width = self.mlp_width();
        if !(1..=MAX_INTERMEDIATE).contains(&width) {
            return Err(invalid(
                "intermediate",
                format!("must be from 1 to {MAX_INTERMEDIATE}, got {width}"),
            ));
        }
        for (field, x) in [("rope_theta", self.rope_theta), ("norm_eps", self.norm_eps)] {
            if !(x.is_finite() && x > 0.0) {
                return Err(invalid(field, format!("must be finite and > 0, got {x}")));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{DType, ModelSpec, Piece};
    use super::*;

    /// The sizes of the comparison model: hidden 256, 4 layers, 8 heads, 2
    /// key/value heads, MLP 688, vocabulary 4096.
    fn llama() -> ModelSpec {
        ModelSpec {
            family: Family::Llama,
            vocab: 4096,
            hidden: 256,
            heads: 8,
            layers: 4,
            seq_len: 128,
            dtype: DType::F32,
            kv_heads: Some(2),
            intermediate: Some(688),
            ..Default::default()
        }
    }

    /// `transformers`' `LlamaForCausalLM` of these sizes has 4,868,352 parameters untied
    /// (embedding 1,048,576; each layer q 65,536, k and v 16,384 each, o 65,536, gate, up
    /// and down 176,128 each, two norms 512; final norm 256; LM head 1,048,576).
    #[test]
    fn llama_counts_parameters_as_transformers_does() {
        let spec = llama();
        assert!(spec.validate().is_ok());
        assert_eq!(spec.qkv_width(), 256 + 2 * 64);
        assert_eq!(spec.piece_params(Piece::Embedding), 1_048_576);
        assert_eq!(spec.piece_params(Piece::Block(0)), 692_736);
        assert_eq!(spec.piece_params(Piece::Head), 1_048_832);
        assert_eq!(spec.params(), 4_868_352);
    }

    #[test]
    fn llama_fields_are_checked_and_refused_on_gpt() {
        let field = |spec: ModelSpec| match spec.validate() {
            Err(crate::Error::InvalidArgument { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            field(ModelSpec {
                kv_heads: Some(3),
                ..llama()
            }),
            "kv_heads"
        );
        assert_eq!(
            field(ModelSpec {
                heads: 256,
                kv_heads: None,
                ..llama()
            }),
            "heads"
        );
        assert_eq!(
            field(ModelSpec {
                rope_theta: f64::NAN,
                ..llama()
            }),
            "rope_theta"
        );
        assert_eq!(
            field(ModelSpec {
                norm_eps: 0.0,
                ..llama()
            }),
            "norm_eps"
        );
        assert_eq!(
            field(ModelSpec {
                intermediate: Some(0),
                ..llama()
            }),
            "intermediate"
        );
        assert_eq!(
            field(ModelSpec {
                tie_embeddings: true,
                ..Default::default()
            }),
            "tie_embeddings"
        );
        assert_eq!(default_intermediate(256), 768);
    }
}
