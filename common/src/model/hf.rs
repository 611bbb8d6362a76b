//! A Hugging Face model directory's `config.json` read as a [`ModelSpec`]: what
//! `LlamaForCausalLM(config).save_pretrained(dir)` writes. Only what pipewise computes
//! exactly is taken; a key that would change the model in a way it does not implement
//! (another architecture, rope scaling, biases, a sliding window, another activation) is
//! refused, naming the file and the key. The sequence length and dtype stay the job's.

use serde_json::{Map, Value};

use super::{DType, Family, ModelSpec};
use crate::error::{Error, Result};

/// The architecture read.
pub const LLAMA_ARCHITECTURE: &str = "LlamaForCausalLM";

/// `config.json` (its text `json`, read from `file` — named in errors) as the model of a
/// job whose sequences are `seq_len` tokens in `dtype`.
pub fn spec_from_config(file: &str, json: &str, seq_len: u32, dtype: DType) -> Result<ModelSpec> {
    let bad = |key: &str, reason: String| Error::InvalidArgument {
        field: "model.path",
        reason: format!("{file}: {key}: {reason}"),
    };
    let value: Value =
        serde_json::from_str(json).map_err(|e| bad("(json)", format!("not JSON: {e}")))?;
    let Value::Object(c) = value else {
        return Err(bad("(json)", "not a JSON object".into()));
    };
    let arch = c.get("architectures").and_then(Value::as_array);
    let names: Vec<&str> = arch
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if names != [LLAMA_ARCHITECTURE] {
        return Err(bad(
            "architectures",
            format!("{names:?} is not [\"{LLAMA_ARCHITECTURE}\"], the architecture pipewise reads"),
        ));
    }
    refuse_unsupported(&c, &bad)?;
    let count = |key: &str| -> Result<u32> {
        let n = c
            .get(key)
            .and_then(Value::as_u64)
            .ok_or_else(|| bad(key, "missing, or not a whole number".into()))?;
        u32::try_from(n).map_err(|_| bad(key, format!("{n} is too large")))
    };
    let real = |key: &str| -> Result<Option<f64>> {
        match c.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| bad(key, format!("{v} is not a number"))),
        }
    };
    let (hidden, heads) = (count("hidden_size")?, count("num_attention_heads")?);
    let kv_heads = match c.get("num_key_value_heads") {
        None | Some(Value::Null) => heads,
        Some(_) => count("num_key_value_heads")?,
    };
    if let Some(hd) = c.get("head_dim").and_then(Value::as_u64)
        && heads > 0
        && hd != u64::from(hidden / heads)
    {
        return Err(bad(
            "head_dim",
            format!(
                "{hd} is not hidden_size / num_attention_heads ({})",
                hidden / heads
            ),
        ));
    }
    // transformers 5 writes the base inside `rope_parameters`; earlier versions at the top.
    let rope = c.get("rope_parameters").and_then(Value::as_object);
    let theta = match rope.and_then(|r| r.get("rope_theta")) {
        Some(v) => Some(
            v.as_f64()
                .ok_or_else(|| bad("rope_parameters.rope_theta", format!("{v} is not a number")))?,
        ),
        None => real("rope_theta")?,
    };
    let max_positions = count("max_position_embeddings")?;
    if seq_len > max_positions {
        return Err(bad(
            "max_position_embeddings",
            format!("{max_positions} positions; the job's sequences are {seq_len} tokens"),
        ));
    }
    let spec = ModelSpec {
        family: Family::Llama,
        path: None,
        vocab: count("vocab_size")?,
        hidden,
        heads,
        layers: count("num_hidden_layers")?,
        seq_len,
        dtype,
        kv_heads: Some(kv_heads),
        intermediate: Some(count("intermediate_size")?),
        rope_theta: theta.unwrap_or(super::DEFAULT_ROPE_THETA),
        norm_eps: real("rms_norm_eps")?.unwrap_or(1e-6),
        tie_embeddings: c
            .get("tie_word_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(true),
    };
    spec.validate().map_err(|e| match e {
        Error::InvalidArgument { field, reason } => bad(hf_key(field), reason),
        other => other,
    })?;
    Ok(spec)
}

/// The `config.json` key of a [`ModelSpec`] field.
fn hf_key(field: &str) -> &str {
    match field {
        "vocab" => "vocab_size",
        "hidden" => "hidden_size",
        "heads" => "num_attention_heads",
        "kv_heads" => "num_key_value_heads",
        "layers" => "num_hidden_layers",
        "intermediate" => "intermediate_size",
        "norm_eps" => "rms_norm_eps",
        other => other,
    }
}

/// Keys whose values pipewise does not compute: present and not their neutral value.
fn refuse_unsupported(c: &Map<String, Value>, bad: &dyn Fn(&str, String) -> Error) -> Result<()> {
    let truthy = |v: &Value| !matches!(v, Value::Null | Value::Bool(false));
    for key in [
        "attention_bias",
        "mlp_bias",
        "sliding_window",
        "use_sliding_window",
    ] {
        if let Some(v) = c.get(key).filter(|v| truthy(v)) {
            return Err(bad(
                key,
                format!("{v} is not supported (pipewise's Llama has none)"),
            ));
        }
    }
    if let Some(v) = c.get("rope_scaling").filter(|v| truthy(v)) {
        return Err(bad("rope_scaling", format!("{v} is not supported")));
    }
    if let Some(kind) = c
        .get("rope_parameters")
        .and_then(|r| r.get("rope_type"))
        .and_then(Value::as_str)
        .filter(|k| *k != "default")
    {
        return Err(bad(
            "rope_parameters.rope_type",
            format!("{kind:?} is not supported (only \"default\")"),
        ));
    }
    if let Some(act) = c
        .get("hidden_act")
        .and_then(Value::as_str)
        .filter(|a| *a != "silu")
    {
        return Err(bad(
            "hidden_act",
            format!("{act:?} is not supported (only \"silu\")"),
        ));
    }
    if let Some(tp) = c
        .get("pretraining_tp")
        .and_then(Value::as_u64)
        .filter(|&tp| tp != 1)
    {
        return Err(bad(
            "pretraining_tp",
            format!("{tp} is not supported (only 1)"),
        ));
    }
    Ok(())
}

/// `given` (a job's `[model]` with a `path`) completed from `from` (its `config.json`): the
/// sizes the job left out taken, those it gave checked against the file.
pub fn completed(given: &ModelSpec, from: &ModelSpec, file: &str) -> Result<ModelSpec> {
    let sizes = [
        ("vocab", given.vocab, from.vocab),
        ("hidden", given.hidden, from.hidden),
        ("heads", given.heads, from.heads),
        ("layers", given.layers, from.layers),
    ];
    for (field, job, config) in sizes {
        if job != 0 && job != config {
            return Err(Error::InvalidArgument {
                field: "model.path",
                reason: format!(
                    "the job's model.{field} = {job}, but {file} has {} = {config}",
                    hf_key(field)
                ),
            });
        }
    }
    Ok(ModelSpec {
        path: given.path.clone(),
        ..from.clone()
    })
}

/// `config.json` for `spec` as `transformers` reads it back into the same model.
pub fn config_json(spec: &ModelSpec) -> String {
    let mut c = Map::new();
    let mut put = |k: &str, v: Value| {
        c.insert(k.into(), v);
    };
    put("architectures", Value::from(vec![LLAMA_ARCHITECTURE]));
    put("model_type", "llama".into());
    put("vocab_size", spec.vocab.into());
    put("hidden_size", spec.hidden.into());
    put("intermediate_size", spec.mlp_width().into());
    put("num_hidden_layers", spec.layers.into());
    put("num_attention_heads", spec.heads.into());
    put("num_key_value_heads", spec.kv_heads().into());
    put("head_dim", spec.head_dim().into());
    put("hidden_act", "silu".into());
    put("max_position_embeddings", spec.seq_len.into());
    put("rms_norm_eps", spec.norm_eps.into());
    put("rope_theta", spec.rope_theta.into());
    put("attention_bias", false.into());
    put("mlp_bias", false.into());
    put("tie_word_embeddings", spec.tie_embeddings.into());
    let dtype = match spec.dtype {
        DType::F32 => "float32",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
    };
    put("torch_dtype", dtype.into());
    serde_json::to_string_pretty(&Value::Object(c)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Map<String, Value> {
        let v: Value = serde_json::from_str(
            r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "vocab_size": 96, "hidden_size": 32, "intermediate_size": 64,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 8, "hidden_act": "silu", "rms_norm_eps": 1e-05,
                "max_position_embeddings": 64, "attention_bias": false, "mlp_bias": false,
                "tie_word_embeddings": true, "rope_scaling": null,
                "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}}"#,
        )
        .unwrap_or_default();
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    fn read(c: &Map<String, Value>) -> Result<ModelSpec> {
        let text = serde_json::to_string(c).unwrap_or_default();
        spec_from_config("m/config.json", &text, 16, DType::F32)
    }

    #[test]
    fn a_llama_config_reads_and_writes_back() {
        let spec = read(&base()).expect("reads");
        assert_eq!(
            (
                spec.vocab,
                spec.hidden,
                spec.heads,
                spec.kv_heads(),
                spec.layers
            ),
            (96, 32, 4, 2, 2)
        );
        assert_eq!(
            (spec.mlp_width(), spec.norm_eps, spec.rope_theta),
            (64, 1e-5, 1e4)
        );
        assert!(spec.tie_embeddings);
        let again = spec_from_config("x", &config_json(&spec), 16, DType::F32).expect("reads");
        assert_eq!(again, spec);
    }

    /// Each refusal names the file and the key.
    #[test]
    fn what_pipewise_does_not_compute_is_refused_by_key() {
        let cases: Vec<(&str, Value)> = vec![
            ("architectures", serde_json::json!(["MistralForCausalLM"])),
            (
                "rope_scaling",
                serde_json::json!({"type": "linear", "factor": 2.0}),
            ),
            ("attention_bias", Value::Bool(true)),
            ("mlp_bias", Value::Bool(true)),
            ("sliding_window", Value::from(4096)),
            ("hidden_act", Value::from("gelu")),
            ("num_key_value_heads", Value::from(3)),
            ("head_dim", Value::from(16)),
            ("max_position_embeddings", Value::from(8)),
            ("vocab_size", Value::from("many")),
        ];
        for (key, value) in cases {
            let mut c = base();
            c.insert(key.into(), value);
            let err = read(&c).expect_err(key).to_string();
            assert!(err.contains("m/config.json"), "{err}");
            assert!(err.contains(key), "{key}: {err}");
        }
        let mut c = base();
        c.remove("hidden_size");
        assert!(
            read(&c)
                .expect_err("missing")
                .to_string()
                .contains("hidden_size")
        );
    }
}
