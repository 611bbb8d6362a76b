//! A Hugging Face directory's weights as its safetensors headers describe them: the tensors
//! each piece of a Llama model reads (their `transformers` names and shapes) and a header's
//! table of tensors, checked against them. Only the header is read: the 8-byte little-endian
//! length at the start of a file and the JSON after it; the coordinator checks a directory
//! at submit with it and each worker finds its stages' tensors in the files with it.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{ModelSpec, Piece};
use crate::error::{Error, Result};

/// The single-file checkpoint's name.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The sharded checkpoint's index.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Bytes of the header's length at the start of a safetensors file.
pub const LENGTH_BYTES: u64 = 8;

/// The longest header read (the `safetensors` crate's own limit): a longer one is corrupt.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// A weight file's key at fault: `file: key: reason`, under the job's `model.path`.
pub fn bad(file: &str, key: &str, reason: impl Into<String>) -> Error {
    Error::InvalidArgument {
        field: "model.path",
        reason: format!("{file}: {key}: {}", reason.into()),
    }
}

/// The element types pipewise reads weights in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightDType {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// bfloat16.
    BF16,
}

impl WeightDType {
    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            WeightDType::F32 => 4,
            WeightDType::F16 | WeightDType::BF16 => 2,
        }
    }

    fn from_header(name: &str) -> Option<Self> {
        match name {
            "F32" => Some(WeightDType::F32),
            "F16" => Some(WeightDType::F16),
            "BF16" => Some(WeightDType::BF16),
            _ => None,
        }
    }
}

/// Bytes per element of a safetensors dtype name; `None` for one the format does not have.
fn header_dtype_bits(name: &str) -> Option<u64> {
    Some(match name {
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" => 8,
        "I16" | "U16" | "F16" | "BF16" => 16,
        "I32" | "U32" | "F32" => 32,
        "I64" | "U64" | "F64" | "C64" => 64,
        "F4" => 4,
        "F6_E2M3" | "F6_E3M2" => 6,
        _ => return None,
    })
}

/// One tensor of a header: where its bytes lie in the file, its shape and dtype (as the
/// header names it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    /// The header's dtype name (`F32`, `BF16`, `U32`, …).
    pub dtype: String,
    /// The shape.
    pub shape: Vec<u64>,
    /// The first byte, from the start of the file.
    pub start: u64,
    /// One past the last byte, from the start of the file.
    pub end: u64,
}

impl TensorEntry {
    /// Its dtype when pipewise reads it; else an error naming `file` and `name`.
    pub fn weight_dtype(&self, file: &str, name: &str) -> Result<WeightDType> {
        WeightDType::from_header(&self.dtype).ok_or_else(|| {
            bad(
                file,
                name,
                format!("dtype {}; weights must be F32, F16 or BF16", self.dtype),
            )
        })
    }

    /// Checks that it has `shape` (as the file stores it) and a dtype pipewise reads.
    pub fn check(&self, file: &str, name: &str, shape: &[u64]) -> Result<WeightDType> {
        if self.shape != shape {
            return Err(bad(
                file,
                name,
                format!("shape {:?}, the model needs {shape:?}", self.shape),
            ));
        }
        self.weight_dtype(file, name)
    }
}

/// The header's length from the first [`LENGTH_BYTES`] of `file` (named in errors), a file
/// of `file_len` bytes.
pub fn header_len(file: &str, first: [u8; 8], file_len: u64) -> Result<u64> {
    let n = u64::from_le_bytes(first);
    let room = file_len.saturating_sub(LENGTH_BYTES);
    if n > MAX_HEADER_BYTES || n > room {
        return Err(bad(
            file,
            "(header)",
            format!("not a safetensors file: a header of {n} bytes in a file of {file_len} bytes"),
        ));
    }
    Ok(n)
}

/// The tensors of `header` (the JSON after the length) in `file` of `file_len` bytes, by
/// name; each one's bytes are checked to lie in the file and to be its shape's size.
pub fn parse_header(
    file: &str,
    header: &[u8],
    file_len: u64,
) -> Result<BTreeMap<String, TensorEntry>> {
    let corrupt = |reason: String| {
        bad(
            file,
            "(header)",
            format!("not a safetensors file: {reason}"),
        )
    };
    let value: Value =
        serde_json::from_slice(header).map_err(|e| corrupt(format!("not JSON: {e}")))?;
    let Value::Object(entries) = value else {
        return Err(corrupt("not a JSON object".into()));
    };
    let data_start = LENGTH_BYTES + header.len() as u64;
    let data_len = file_len.saturating_sub(data_start);
    let mut out = BTreeMap::new();
    for (name, entry) in entries {
        if name == "__metadata__" {
            continue;
        }
        let e = parse_entry(&entry).map_err(|reason| bad(file, &name, reason))?;
        let numel = e
            .shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .ok_or_else(|| bad(file, &name, format!("shape {:?} overflows", e.shape)))?;
        let bits = header_dtype_bits(&e.dtype)
            .ok_or_else(|| bad(file, &name, format!("unknown dtype {}", e.dtype)))?;
        let (start, end) = (e.start, e.end);
        let want = numel.checked_mul(bits).map(|b| b.div_ceil(8));
        if end < start || end > data_len || want != Some(end - start) {
            return Err(bad(
                file,
                &name,
                format!(
                    "data_offsets [{start}, {end}] do not hold {numel} {} elements in the \
                     file's {data_len} data bytes",
                    e.dtype
                ),
            ));
        }
        let entry = TensorEntry {
            start: data_start + start,
            end: data_start + end,
            ..e
        };
        out.insert(name, entry);
    }
    Ok(out)
}

/// One header entry, its offsets from the start of the data; why not, otherwise.
fn parse_entry(entry: &Value) -> std::result::Result<TensorEntry, String> {
    let dtype = entry
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or("no dtype string")?;
    let whole = |v: &Value| v.as_u64();
    let shape = entry
        .get("shape")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().map(whole).collect::<Option<Vec<u64>>>())
        .ok_or("no shape of whole numbers")?;
    let offsets = entry
        .get("data_offsets")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().map(whole).collect::<Option<Vec<u64>>>())
        .filter(|o| o.len() == 2)
        .ok_or("no data_offsets pair")?;
    Ok(TensorEntry {
        dtype: dtype.to_string(),
        shape,
        start: offsets[0],
        end: offsets[1],
    })
}

/// The shard files `model.safetensors.index.json` (its text `json`, read from `file`)
/// names in its `weight_map`, each once, in name order; each must be a plain file name in
/// the directory.
pub fn shard_names(file: &str, json: &str) -> Result<Vec<String>> {
    let parsed: Value =
        serde_json::from_str(json).map_err(|e| bad(file, "(json)", format!("not JSON: {e}")))?;
    let map = parsed
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| bad(file, "weight_map", "missing, or not an object"))?;
    let mut shards = std::collections::BTreeSet::new();
    for (tensor, shard) in map {
        let shard = shard
            .as_str()
            .filter(|f| {
                !f.contains('/') && !f.contains('\\') && *f != "." && *f != ".." && !f.is_empty()
            })
            .ok_or_else(|| bad(file, tensor, "not a file name in the directory"))?;
        shards.insert(shard.to_string());
    }
    if shards.is_empty() {
        return Err(bad(file, "weight_map", "names no file"));
    }
    Ok(shards.into_iter().collect())
}

/// The tensors `piece` of Llama model `spec` reads, by `transformers` name, with the shape
/// the file stores (`[out, in]` for a linear weight), in the order a stage takes them. A
/// tied head reads the embedding's table.
pub fn piece_tensors(spec: &ModelSpec, piece: Piece) -> Vec<(String, Vec<u64>)> {
    let (h, v, m) = (
        u64::from(spec.hidden),
        u64::from(spec.vocab),
        u64::from(spec.mlp_width()),
    );
    let kvd = u64::from(spec.kv_heads() * spec.head_dim());
    match piece {
        Piece::Embedding => vec![("model.embed_tokens.weight".into(), vec![v, h])],
        Piece::Block(i) => {
            let p = |name: &str| format!("model.layers.{i}.{name}");
            vec![
                (p("input_layernorm.weight"), vec![h]),
                (p("self_attn.q_proj.weight"), vec![h, h]),
                (p("self_attn.k_proj.weight"), vec![kvd, h]),
                (p("self_attn.v_proj.weight"), vec![kvd, h]),
                (p("self_attn.o_proj.weight"), vec![h, h]),
                (p("post_attention_layernorm.weight"), vec![h]),
                (p("mlp.gate_proj.weight"), vec![m, h]),
                (p("mlp.up_proj.weight"), vec![m, h]),
                (p("mlp.down_proj.weight"), vec![h, m]),
            ]
        }
        Piece::Head => {
            let lm = if spec.tie_embeddings {
                "model.embed_tokens.weight"
            } else {
                "lm_head.weight"
            };
            vec![
                ("model.norm.weight".into(), vec![h]),
                (lm.into(), vec![v, h]),
            ]
        }
    }
}

/// Every tensor of `spec`'s pieces ([`piece_tensors`]), each once.
pub fn model_tensors(spec: &ModelSpec) -> Vec<(String, Vec<u64>)> {
    let mut seen = std::collections::BTreeSet::new();
    spec.pieces()
        .into_iter()
        .flat_map(|p| piece_tensors(spec, p))
        .filter(|(name, _)| seen.insert(name.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_of(header: &str, data: usize) -> (Vec<u8>, u64) {
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.resize(bytes.len() + data, 0);
        let len = bytes.len() as u64;
        (bytes, len)
    }

    fn parsed(header: &str, data: usize) -> Result<BTreeMap<String, TensorEntry>> {
        let (bytes, len) = file_of(header, data);
        let mut first = [0u8; 8];
        first.copy_from_slice(&bytes[..8]);
        let n = header_len("m.safetensors", first, len)?;
        parse_header("m.safetensors", &bytes[8..8 + n as usize], len)
    }

    #[test]
    fn a_header_gives_each_tensors_place_in_the_file() -> Result<()> {
        let h = r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]}}"#;
        let t = parsed(h, 32)?;
        let start = 8 + h.len() as u64;
        assert_eq!(t.len(), 2);
        assert_eq!((t["a"].start, t["a"].end), (start, start + 24));
        assert_eq!(t["b"].check("f", "b", &[4])?, WeightDType::BF16);
        let err = t["a"]
            .check("f", "a", &[3, 2])
            .expect_err("shape")
            .to_string();
        assert!(
            err.contains("f: a: shape [2, 3], the model needs [3, 2]"),
            "{err}"
        );
        Ok(())
    }

    #[test]
    fn corrupt_headers_are_refused_naming_the_file_and_the_key() {
        let cases = [
            (r#"{"a": nonsense}"#, 0, "(header)"),
            (r#"[1]"#, 0, "(header)"),
            (
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
                4,
                "a: data_offsets",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#,
                8,
                "a: data_offsets",
            ),
            (
                r#"{"a":{"dtype":"Q9","shape":[2],"data_offsets":[0,4]}}"#,
                8,
                "a: unknown dtype",
            ),
            (
                r#"{"a":{"shape":[2],"data_offsets":[0,8]}}"#,
                8,
                "a: no dtype",
            ),
        ];
        for (header, data, says) in cases {
            let err = parsed(header, data).expect_err(header).to_string();
            assert!(
                err.contains("m.safetensors") && err.contains(says),
                "{header}: {err}"
            );
        }
        let err = header_len("m.safetensors", 1000u64.to_le_bytes(), 20)
            .expect_err("long")
            .to_string();
        assert!(
            err.contains("a header of 1000 bytes in a file of 20 bytes"),
            "{err}"
        );
    }

    #[test]
    fn a_tied_model_reads_its_table_once() {
        let mut spec = ModelSpec {
            family: crate::model::Family::Llama,
            ..ModelSpec::default()
        };
        spec.tie_embeddings = true;
        let all = model_tensors(&spec);
        let embed = all
            .iter()
            .filter(|(n, _)| n == "model.embed_tokens.weight")
            .count();
        assert_eq!(embed, 1);
        assert_eq!(all.len(), 1 + 9 * spec.layers as usize + 1);
        spec.tie_embeddings = false;
        assert_eq!(model_tensors(&spec).len(), 1 + 9 * spec.layers as usize + 2);
    }
}
