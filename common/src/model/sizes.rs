//! The sizes the family decides: key/value heads, the MLP's width, the fused QKV
//! projection's width, and the checks of the Llama fields.

use super::ModelSpec;
use super::family::{Family, default_intermediate, is_default_norm_eps, is_default_rope_theta};

/// The largest MLP width a spec may have.
const MAX_INTERMEDIATE: u32 = 1 << 20;

impl ModelSpec {
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
    use super::super::{DType, Piece};
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
