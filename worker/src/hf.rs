//! Hugging Face model directories in and out: `config.json` plus `model.safetensors` (or
//! shards listed in `model.safetensors.index.json`), as `save_pretrained` writes them for
//! `LlamaForCausalLM`.
//!
//! Reading maps each safetensors file and parses only its header; a stage copies out the
//! tensors of its own pieces, so a worker touches only its part of the model. `transformers`
//! stores linear weights `[out, in]`; a stage holds them `[in, out]` with Q, K, V side by
//! side and gate, up side by side, so each is transposed (and concatenated) on the way in
//! and split on the way out.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use memmap2::Mmap;
use pipewise_common::model::{self, Family, ModelSpec, Piece};
use safetensors::SafeTensors;

use crate::confined::Confined;
use crate::error::{Error, Result};
use crate::param::Param;
use crate::piece::PieceState;
use crate::stage::Stage;

/// The single-file checkpoint's name.
pub const WEIGHTS: &str = "model.safetensors";
/// The sharded checkpoint's index.
pub const INDEX: &str = "model.safetensors.index.json";
/// The model's configuration.
pub const CONFIG: &str = "config.json";
/// The tokenizer `transformers` saves beside the model.
pub const TOKENIZER: &str = "tokenizer.json";

/// A bad model directory: the file and the key (tensor or field) at fault.
fn bad(file: &Path, key: &str, reason: impl Into<String>) -> Error {
    Error::InvalidArgument {
        field: "model.path",
        reason: format!("{}: {key}: {}", file.display(), reason.into()),
    }
}

/// A model directory opened for reading: its spec and its mapped weight files.
pub struct HfModel {
    dir: PathBuf,
    spec: ModelSpec,
    /// Each weight file and its map.
    files: Vec<(PathBuf, Mmap)>,
    /// Tensor name → index into `files`.
    index: HashMap<String, usize>,
}

impl std::fmt::Debug for HfModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfModel")
            .field("dir", &self.dir)
            .field("spec", &self.spec)
            .field("tensors", &self.index.len())
            .finish()
    }
}

fn read_text(file: &Confined) -> Result<String> {
    let mut text = String::new();
    file.open()?
        .read_to_string(&mut text)
        .map_err(|source| Error::Io {
            path: file.path(),
            source,
        })?;
    Ok(text)
}

impl HfModel {
    /// Opens directory `dir` (a local path, trusted) for a job of `seq_len`-token
    /// sequences in `dtype`.
    pub fn open(dir: &Path, seq_len: u32, dtype: model::DType) -> Result<Self> {
        Self::open_confined(&Confined::at(dir), seq_len, dtype)
    }

    /// Opens `dir` (a job's `model.path` under the data directory; nothing below it is
    /// reached through a link): reads `config.json`, maps the weight files and checks
    /// every header.
    pub fn open_confined(dir: &Confined, seq_len: u32, dtype: model::DType) -> Result<Self> {
        let config = dir.join(CONFIG)?;
        let text = read_text(&config)?;
        let shown = config.path().display().to_string();
        let spec = model::hf::spec_from_config(&shown, &text, seq_len, dtype)?;
        let names = weight_files(dir)?;
        let mut files = Vec::with_capacity(names.len());
        let mut index = HashMap::new();
        for (i, file) in names.into_iter().enumerate() {
            let path = file.path();
            let opened = file.open()?;
            // SAFETY: the map is read-only and lives as long as `files`; a file changed
            // underneath a running job is outside what any reader of it can guard against.
            #[allow(unsafe_code)]
            let map = unsafe { Mmap::map(&opened) }.map_err(|source| Error::Io {
                path: path.clone(),
                source,
            })?;
            let st = SafeTensors::deserialize(&map)
                .map_err(|e| bad(&path, "(header)", format!("not a safetensors file: {e}")))?;
            for name in st.names() {
                index.insert(name.to_string(), i);
            }
            files.push((path, map));
        }
        Ok(Self {
            dir: dir.path(),
            spec,
            files,
            index,
        })
    }

    /// The model `config.json` describes.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Tensor `name` of `shape`, on `device`, in f32 (a model of narrower dtype narrows
    /// it when it takes it).
    fn tensor(&self, name: &str, shape: &[usize], device: &Device) -> Result<Tensor> {
        let Some(&i) = self.index.get(name) else {
            return Err(bad(&self.dir.join(WEIGHTS), name, "missing tensor"));
        };
        let (path, map) = &self.files[i];
        let st = SafeTensors::deserialize(map)
            .map_err(|e| bad(path, "(header)", format!("not a safetensors file: {e}")))?;
        let view = st
            .tensor(name)
            .map_err(|e| bad(path, name, format!("unreadable: {e}")))?;
        if view.shape() != shape {
            return Err(bad(
                path,
                name,
                format!("shape {:?}, the model needs {shape:?}", view.shape()),
            ));
        }
        let dtype = match view.dtype() {
            safetensors::Dtype::F32 => DType::F32,
            safetensors::Dtype::F16 => DType::F16,
            safetensors::Dtype::BF16 => DType::BF16,
            other => {
                return Err(bad(
                    path,
                    name,
                    format!("dtype {other:?}; weights must be F32, F16 or BF16"),
                ));
            }
        };
        let t = Tensor::from_raw_buffer(view.data(), dtype, shape, device)?;
        Ok(t.to_dtype(DType::F32)?)
    }

    /// Every parameter of `stage` set from the checkpoint (its optimizer state untouched).
    pub fn load_into(&self, stage: &mut Stage) -> Result<()> {
        let s = self.spec.clone();
        let held = ModelSpec {
            path: None,
            ..stage.spec().clone()
        };
        if held != s {
            return Err(Error::InvalidArgument {
                field: "model.path",
                reason: format!(
                    "{}: the stage's model {:?} is not the directory's {:?}",
                    self.dir.display(),
                    stage.spec(),
                    s
                ),
            });
        }
        let device = stage.device().clone();
        let (h, v, m) = (s.hidden as usize, s.vocab as usize, s.mlp_width() as usize);
        let kvd = (s.kv_heads() * s.head_dim()) as usize;
        let get = |name: &str, shape: &[usize]| self.tensor(name, shape, &device);
        // `[out, in]` in the file, `[in, out]` in the stage.
        let linear = |name: &str, out: usize, inp: usize| -> Result<Tensor> {
            Ok(get(name, &[out, inp])?.t()?.contiguous()?)
        };
        let kinds = stage.kinds.clone();
        for (kind, piece) in kinds.into_iter().zip(stage.pieces.iter_mut()) {
            match (kind, piece) {
                (Piece::Embedding, PieceState::Embedding(e)) => {
                    set(&mut e.wte, get("model.embed_tokens.weight", &[v, h])?)?;
                }
                (Piece::Block(i), PieceState::LlamaBlock(b)) => {
                    let p = |name: &str| format!("model.layers.{i}.{name}");
                    set(&mut b.attn_norm, get(&p("input_layernorm.weight"), &[h])?)?;
                    let qkv = Tensor::cat(
                        &[
                            linear(&p("self_attn.q_proj.weight"), h, h)?,
                            linear(&p("self_attn.k_proj.weight"), kvd, h)?,
                            linear(&p("self_attn.v_proj.weight"), kvd, h)?,
                        ],
                        1,
                    )?;
                    set(&mut b.qkv_w, qkv)?;
                    set(&mut b.o_w, linear(&p("self_attn.o_proj.weight"), h, h)?)?;
                    set(
                        &mut b.mlp_norm,
                        get(&p("post_attention_layernorm.weight"), &[h])?,
                    )?;
                    let gate_up = Tensor::cat(
                        &[
                            linear(&p("mlp.gate_proj.weight"), m, h)?,
                            linear(&p("mlp.up_proj.weight"), m, h)?,
                        ],
                        1,
                    )?;
                    set(&mut b.gate_up_w, gate_up)?;
                    set(&mut b.down_w, linear(&p("mlp.down_proj.weight"), h, m)?)?;
                }
                (Piece::Head, PieceState::Head(hd)) => {
                    set(&mut hd.ln_w, get("model.norm.weight", &[h])?)?;
                    let lm = if s.tie_embeddings {
                        "model.embed_tokens.weight"
                    } else {
                        "lm_head.weight"
                    };
                    set(&mut hd.lm, linear(lm, v, h)?)?;
                }
                (kind, _) => {
                    return Err(Error::InvalidArgument {
                        field: "model.family",
                        reason: format!("{kind}: only the Llama family reads Hugging Face weights"),
                    });
                }
            }
        }
        Ok(())
    }
}

/// `p` takes `value` (f32, of `p`'s shape): in `p`'s dtype, and as its master copy where it
/// keeps one.
fn set(p: &mut Param, value: Tensor) -> Result<()> {
    if value.dims() != p.value.dims() {
        return Err(Error::InvalidArgument {
            field: "model.path",
            reason: format!(
                "{}: shape {:?}, the stage holds {:?}",
                p.name,
                value.dims(),
                p.value.dims()
            ),
        });
    }
    p.value = value.to_dtype(p.value.dtype())?;
    p.master = Param::needs_master(p.value.dtype()).then_some(value);
    Ok(())
}

/// The weight files of `dir`: `model.safetensors`, or the shards its index names (each once,
/// in name order).
fn weight_files(dir: &Confined) -> Result<Vec<Confined>> {
    let single = dir.join(WEIGHTS)?;
    if single.open().is_ok() {
        return Ok(vec![single]);
    }
    let index = dir.join(INDEX)?;
    let text = read_text(&index).map_err(|_| {
        bad(
            &dir.path(),
            WEIGHTS,
            format!("neither {WEIGHTS} nor {INDEX} can be read there"),
        )
    })?;
    let shown = index.path();
    let parsed: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(&shown, "(json)", format!("not JSON: {e}")))?;
    let map = parsed
        .get("weight_map")
        .and_then(serde_json::Value::as_object)
        .ok_or_else(|| bad(&shown, "weight_map", "missing, or not an object"))?;
    let mut shards = BTreeMap::new();
    for (tensor, file) in map {
        let file = file
            .as_str()
            .filter(|f| !f.contains('/') && !f.contains('\\') && *f != ".." && !f.is_empty())
            .ok_or_else(|| bad(&shown, tensor, "not a file name in the directory"))?;
        shards.insert(file.to_string(), dir.join(file)?);
    }
    Ok(shards.into_values().collect())
}

/// The HF tensors of `stage` (its pieces' parameters as `transformers` names and shapes
/// them), in f32; a tied head adds nothing (its table is the embedding's).
pub fn stage_tensors(stage: &Stage) -> Result<Vec<(String, Tensor)>> {
    let s = stage.spec();
    if s.family != Family::Llama {
        return Err(Error::InvalidArgument {
            field: "model.family",
            reason: "only the Llama family writes Hugging Face weights".into(),
        });
    }
    let (h, m) = (s.hidden as usize, s.mlp_width() as usize);
    let kvd = (s.kv_heads() * s.head_dim()) as usize;
    let f32_of = |p: &Param| -> Result<Tensor> {
        Ok(p.master.clone().unwrap_or(p.value.to_dtype(DType::F32)?))
    };
    let out_in = |t: Tensor| -> Result<Tensor> { Ok(t.t()?.contiguous()?) };
    let mut out = Vec::new();
    for (kind, piece) in stage.kinds.iter().zip(&stage.pieces) {
        match (kind, piece) {
            (Piece::Embedding, PieceState::Embedding(e)) => {
                out.push(("model.embed_tokens.weight".into(), f32_of(&e.wte)?));
            }
            (Piece::Block(i), PieceState::LlamaBlock(b)) => {
                let p = |name: &str| format!("model.layers.{i}.{name}");
                out.push((p("input_layernorm.weight"), f32_of(&b.attn_norm)?));
                let qkv = f32_of(&b.qkv_w)?;
                out.push((p("self_attn.q_proj.weight"), out_in(qkv.narrow(1, 0, h)?)?));
                out.push((
                    p("self_attn.k_proj.weight"),
                    out_in(qkv.narrow(1, h, kvd)?)?,
                ));
                let v = qkv.narrow(1, h + kvd, kvd)?;
                out.push((p("self_attn.v_proj.weight"), out_in(v)?));
                out.push((p("self_attn.o_proj.weight"), out_in(f32_of(&b.o_w)?)?));
                out.push((p("post_attention_layernorm.weight"), f32_of(&b.mlp_norm)?));
                let gu = f32_of(&b.gate_up_w)?;
                out.push((p("mlp.gate_proj.weight"), out_in(gu.narrow(1, 0, m)?)?));
                out.push((p("mlp.up_proj.weight"), out_in(gu.narrow(1, m, m)?)?));
                out.push((p("mlp.down_proj.weight"), out_in(f32_of(&b.down_w)?)?));
            }
            (Piece::Head, PieceState::Head(hd)) => {
                out.push(("model.norm.weight".into(), f32_of(&hd.ln_w)?));
                if !s.tie_embeddings {
                    out.push(("lm_head.weight".into(), out_in(f32_of(&hd.lm)?)?));
                }
            }
            (kind, _) => {
                return Err(Error::InvalidArgument {
                    field: "model.family",
                    reason: format!("{kind}: not a Llama piece"),
                });
            }
        }
    }
    Ok(out)
}

/// Writes `tensors` (f32) as `dir/model.safetensors` and `spec`'s `config.json`.
pub fn save(dir: &Path, spec: &ModelSpec, tensors: &[(String, Tensor)]) -> Result<()> {
    let io = |path: PathBuf| move |source| Error::Io { path, source };
    std::fs::create_dir_all(dir).map_err(io(dir.to_path_buf()))?;
    let config = dir.join(CONFIG);
    std::fs::write(&config, model::hf::config_json(spec)).map_err(io(config.clone()))?;
    let data: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let path = dir.join(WEIGHTS);
    let mut meta = HashMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    safetensors::serialize_to_file(data, Some(meta), &path)
        .map_err(|e| bad(&path, "(write)", e.to_string()))?;
    Ok(())
}

/// Writes the whole model `spec` whose parameters are `params` (by whole-model name, as
/// `params.safetensors` and the final files hold them) as a Hugging Face directory.
pub fn save_params(dir: &Path, spec: &ModelSpec, params: &HashMap<String, Tensor>) -> Result<()> {
    let stage = whole_from_params(spec, params)?;
    save(dir, stage.spec(), &stage_tensors(&stage)?)
}

/// The whole model `spec` as one stage on the CPU, its parameters `params` (by whole-model
/// name).
pub fn whole_from_params(spec: &ModelSpec, params: &HashMap<String, Tensor>) -> Result<Stage> {
    let spec = ModelSpec {
        path: None,
        ..spec.clone()
    };
    let mut stage = Stage::whole(&spec, 0, &Device::Cpu)?;
    for p in stage.params_mut() {
        let value = params.get(&p.name).ok_or_else(|| Error::InvalidArgument {
            field: "checkpoint",
            reason: format!("has no parameter {}", p.name),
        })?;
        set(p, value.to_dtype(DType::F32)?)?;
    }
    Ok(stage)
}
