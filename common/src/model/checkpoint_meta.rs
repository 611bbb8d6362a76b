//! What a pipewise checkpoint file records of the model that wrote it, and the check that a
//! job's model is that model, naming the first `[model]` field that differs.
//!
//! A stage file (`step-K/stage-S.safetensors`) holds [`SPEC_TENSOR`] (`[5]` i64: vocab,
//! hidden, heads, layers, seq_len) and [`MODEL_TENSOR`] (`[4]` i64: family, dtype,
//! key/value heads, MLP width; codes in [`CheckpointModel::model_values`]). Files written
//! before [`MODEL_TENSOR`] existed are checked on [`SPEC_TENSOR`] alone (their parameters'
//! names and shapes still tell a Llama from a GPT when they are loaded). Workers check a
//! checkpoint as they load it; the coordinator checks the stage files already in a job's
//! output directory when the job is submitted, so a folder left by another model is refused
//! before the job runs rather than when a re-planned run resumes from it.

use super::{DType, Family, ModelSpec};
use crate::error::{Error, Result};

/// The tensor of the sizes: vocab, hidden, heads, layers, seq_len.
pub const SPEC_TENSOR: &str = "meta/spec";
/// The tensor of the architecture: family, dtype, key/value heads, MLP width.
pub const MODEL_TENSOR: &str = "meta/model";

/// The model a checkpoint file records, as its meta tensors hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointModel {
    /// [`SPEC_TENSOR`]'s values.
    pub spec: Vec<i64>,
    /// [`MODEL_TENSOR`]'s values (`None`: a file written before it).
    pub model: Option<Vec<i64>>,
}

/// The job fields [`SPEC_TENSOR`] holds, in its order.
const SPEC_FIELDS: [(&str, &str); 5] = [
    ("model.vocab", "vocab"),
    ("model.hidden", "hidden"),
    ("model.heads", "heads"),
    ("model.layers", "layers"),
    ("model.seq_len", "seq_len"),
];

impl CheckpointModel {
    /// What a checkpoint of `model` records.
    pub fn of(model: &ModelSpec) -> CheckpointModel {
        CheckpointModel {
            spec: Self::spec_values(model).to_vec(),
            model: Some(Self::model_values(model).to_vec()),
        }
    }

    /// [`SPEC_TENSOR`]'s values for `model`.
    pub fn spec_values(model: &ModelSpec) -> [i64; 5] {
        [
            model.vocab,
            model.hidden,
            model.heads,
            model.layers,
            model.seq_len,
        ]
        .map(i64::from)
    }

    /// [`MODEL_TENSOR`]'s values for `model`: the family (0 GPT, 1 Llama), the dtype (0 f32,
    /// 1 f16, 2 bf16), the key/value heads and the MLP width as the model computes them
    /// (defaults resolved, so a spec that states a default matches one that leaves it out).
    pub fn model_values(model: &ModelSpec) -> [i64; 4] {
        [
            family_code(model.family),
            dtype_code(model.dtype),
            i64::from(model.kv_heads()),
            i64::from(model.mlp_width()),
        ]
    }

    /// Checks that `job`'s model is the one this checkpoint (the file `file`, named in the
    /// error) records; the error names the first `[model]` field that differs: the family,
    /// then the sizes, the key/value heads, the MLP width and the dtype.
    pub fn check(&self, job: &ModelSpec, file: &str) -> Result<()> {
        let differs = |field: &'static str, what: &str, held: String, asked: String| {
            Err(Error::invalid(
                field,
                format!("the checkpoint at {file} holds {what} {held}, the job asks for {asked}"),
            ))
        };
        let malformed = |tensor: &str, n: usize, want: usize| {
            Err(Error::invalid(
                "checkpoint.folder",
                format!("the checkpoint at {file} has {n} values in {tensor}, not {want}"),
            ))
        };
        let model = match &self.model {
            Some(m) if m.len() != 4 => return malformed(MODEL_TENSOR, m.len(), 4),
            Some(m) => Some([m[0], m[1], m[2], m[3]]),
            None => None,
        };
        let want = Self::model_values(job);
        if let Some(held) = model
            && held[0] != want[0]
        {
            return differs(
                "model.family",
                "a model of family",
                family_name(held[0]),
                job.family.to_string(),
            );
        }
        if self.spec.len() != SPEC_FIELDS.len() {
            return malformed(SPEC_TENSOR, self.spec.len(), SPEC_FIELDS.len());
        }
        let sizes = Self::spec_values(job);
        for ((field, what), (&held, asked)) in SPEC_FIELDS.iter().zip(self.spec.iter().zip(sizes)) {
            if held != asked {
                return differs(field, what, held.to_string(), asked.to_string());
            }
        }
        let Some(held) = model else {
            return Ok(());
        };
        if held[2] != want[2] {
            return differs(
                "model.kv_heads",
                "key/value heads",
                held[2].to_string(),
                want[2].to_string(),
            );
        }
        if held[3] != want[3] {
            return differs(
                "model.intermediate",
                "an MLP width of",
                held[3].to_string(),
                want[3].to_string(),
            );
        }
        if held[1] != want[1] {
            return differs(
                "model.dtype",
                "parameters in",
                dtype_name(held[1]),
                job.dtype.to_string(),
            );
        }
        Ok(())
    }
}

fn family_code(family: Family) -> i64 {
    match family {
        Family::Gpt => 0,
        Family::Llama => 1,
    }
}

fn family_name(code: i64) -> String {
    match code {
        0 => Family::Gpt.to_string(),
        1 => Family::Llama.to_string(),
        other => format!("(unknown code {other})"),
    }
}

fn dtype_code(dtype: DType) -> i64 {
    match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
    }
}

fn dtype_name(code: i64) -> String {
    match code {
        0 => DType::F32.to_string(),
        1 => DType::F16.to_string(),
        2 => DType::BF16.to_string(),
        other => format!("(unknown dtype code {other})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The field and reason of an `InvalidArgument`; panics on anything else.
    fn refused(r: Result<()>) -> (&'static str, String) {
        match r {
            Err(Error::InvalidArgument { field, reason }) => (field, reason),
            other => panic!("expected an error naming a field, got {other:?}"),
        }
    }

    fn llama() -> ModelSpec {
        ModelSpec {
            family: Family::Llama,
            kv_heads: Some(2),
            ..ModelSpec::default()
        }
    }

    #[test]
    fn the_same_model_passes_with_defaults_stated_or_not() {
        let gpt = ModelSpec::default();
        assert_eq!(CheckpointModel::of(&gpt).check(&gpt, "f"), Ok(()));
        let stated = ModelSpec {
            intermediate: Some(crate::model::family::default_intermediate(64)),
            ..ModelSpec {
                family: Family::Llama,
                kv_heads: Some(4),
                ..ModelSpec::default()
            }
        };
        let left_out = ModelSpec {
            family: Family::Llama,
            ..ModelSpec::default()
        };
        assert_eq!(CheckpointModel::of(&stated).check(&left_out, "f"), Ok(()));
    }

    /// Each field that makes another model is named, with what the file holds and what the
    /// job asks.
    #[test]
    fn another_model_is_refused_naming_the_field() {
        type Edit = fn(&mut ModelSpec);
        let cases: Vec<(&str, Edit, &str)> = vec![
            (
                "model.hidden",
                |m| m.hidden = 128,
                "holds hidden 64, the job asks for 128",
            ),
            (
                "model.layers",
                |m| m.layers = 4,
                "holds layers 8, the job asks for 4",
            ),
            (
                "model.vocab",
                |m| m.vocab = 512,
                "holds vocab 256, the job asks for 512",
            ),
            (
                "model.heads",
                |m| m.heads = 8,
                "holds heads 4, the job asks for 8",
            ),
            ("model.seq_len", |m| m.seq_len = 16, "holds seq_len 32"),
            (
                "model.kv_heads",
                |m| m.kv_heads = Some(1),
                "holds key/value heads 2",
            ),
            (
                "model.intermediate",
                |m| m.intermediate = Some(512),
                "an MLP width of",
            ),
            (
                "model.dtype",
                |m| m.dtype = DType::BF16,
                "parameters in f32, the job asks for bf16",
            ),
            (
                "model.family",
                |m| {
                    *m = ModelSpec::default();
                },
                "a model of family llama, the job asks for gpt",
            ),
        ];
        let held = CheckpointModel::of(&llama());
        for (field, edit, says) in cases {
            let mut job = llama();
            edit(&mut job);
            let (got, reason) = refused(held.check(&job, "ckpt/job-1/step-2/stage-0.safetensors"));
            assert_eq!(got, field, "{reason}");
            assert!(reason.contains(says), "{field}: {reason}");
            assert!(
                reason.contains("ckpt/job-1/step-2/stage-0.safetensors"),
                "{reason}"
            );
        }
    }

    /// The family is named before the sizes it changes (a GPT's MLP is 4h, a Llama's not).
    #[test]
    fn a_gpt_checkpoint_for_a_llama_job_names_the_family() {
        let held = CheckpointModel::of(&ModelSpec::default());
        let (field, reason) = refused(held.check(&llama(), "f"));
        assert_eq!(field, "model.family");
        assert!(
            reason.contains("family gpt, the job asks for llama"),
            "{reason}"
        );
    }

    /// A file from before `meta/model` is checked on its sizes alone.
    #[test]
    fn an_older_file_is_checked_on_its_sizes() {
        let old = CheckpointModel {
            spec: CheckpointModel::spec_values(&ModelSpec::default()).to_vec(),
            model: None,
        };
        assert_eq!(old.check(&llama(), "f"), Ok(()));
        let wider = ModelSpec {
            hidden: 128,
            ..llama()
        };
        assert_eq!(refused(old.check(&wider, "f")).0, "model.hidden");
        let short = CheckpointModel {
            spec: vec![256, 64],
            model: None,
        };
        let (field, reason) = refused(short.check(&llama(), "f"));
        assert_eq!(field, "checkpoint.folder");
        assert!(reason.contains("2 values in meta/spec, not 5"), "{reason}");
    }
}
