//! Hugging Face model directories in and out: `config.json` plus `model.safetensors` (or
//! shards listed in `model.safetensors.index.json`), as `save_pretrained` writes them for
//! `LlamaForCausalLM`.
//!
//! Reading parses only each file's header ([`pipewise_common::model::hf_weights`]); a stage
//! then reads the bytes of its own pieces' tensors, a few MiB at a time, straight into its
//! parameters, so a worker holds neither another stage's tensors nor a second copy of its
//! own (nothing is mapped: pages the kernel caches for a read are not the worker's).
//! `transformers` stores linear weights `[out, in]`; a stage holds them `[in, out]` with Q,
//! K, V side by side and gate, up side by side, so each is transposed into its columns on
//! the way in and split on the way out.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use pipewise_common::model::hf_weights::{self, TensorEntry, WeightDType};
use pipewise_common::model::{self, Family, ModelSpec, Piece};

use crate::confined::Confined;
use crate::error::{Error, Result};
use crate::param::Param;
use crate::piece::PieceState;
use crate::stage::Stage;

/// The single-file checkpoint's name.
pub const WEIGHTS: &str = hf_weights::WEIGHTS_FILE;
/// The sharded checkpoint's index.
pub const INDEX: &str = hf_weights::INDEX_FILE;
/// The model's configuration.
pub const CONFIG: &str = "config.json";
/// The tokenizer `transformers` saves beside the model.
pub const TOKENIZER: &str = "tokenizer.json";

/// Bytes of a tensor read at once: what loading holds beside the parameters it fills.
const CHUNK_BYTES: usize = 4 << 20;

/// A bad model directory: the file and the key (tensor or field) at fault.
fn bad(file: &Path, key: &str, reason: impl Into<String>) -> Error {
    hf_weights::bad(&file.display().to_string(), key, reason).into()
}

/// One weight file: its path, the open file and its header's tensors.
struct WeightFile {
    path: PathBuf,
    file: File,
}

/// A model directory opened for reading: its spec, its weight files and where each tensor
/// lies in them.
pub struct HfModel {
    dir: PathBuf,
    spec: ModelSpec,
    files: Vec<WeightFile>,
    /// Tensor name → the index of its file in `files` and its header entry.
    index: HashMap<String, (usize, TensorEntry)>,
    /// What a tensor missing from every file is reported against: the single file or the
    /// index.
    listing: PathBuf,
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

/// The tensors of the header of `file` (at `path`), reading nothing past it.
fn read_header(path: &Path, file: &mut File) -> Result<BTreeMap<String, TensorEntry>> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let len = file.metadata().map_err(io)?.len();
    let shown = path.display().to_string();
    let mut first = [0u8; 8];
    file.read_exact(&mut first)
        .map_err(|e| bad(path, "(header)", format!("not a safetensors file: {e}")))?;
    let n = hf_weights::header_len(&shown, first, len)?;
    let mut header = vec![0u8; usize::try_from(n).unwrap_or(usize::MAX)];
    file.read_exact(&mut header).map_err(io)?;
    Ok(hf_weights::parse_header(&shown, &header, len)?)
}

/// Where a file tensor goes in the parameter it fills.
#[derive(Debug, Clone, Copy)]
enum Place {
    /// Element for element: the parameter is the tensor.
    Same,
    /// A linear weight `[out, in]` transposed into columns `col .. col + out` of the
    /// parameter `[in, cols]`.
    Columns(usize),
}

impl HfModel {
    /// Opens directory `dir` (a local path, trusted) for a job of `seq_len`-token
    /// sequences in `dtype`.
    pub fn open(dir: &Path, seq_len: u32, dtype: model::DType) -> Result<Self> {
        Self::open_confined(&Confined::at(dir), seq_len, dtype)
    }

    /// Opens `dir` (a job's `model.path` under the data directory; nothing below it is
    /// reached through a link): reads `config.json` and every weight file's header.
    pub fn open_confined(dir: &Confined, seq_len: u32, dtype: model::DType) -> Result<Self> {
        let config = dir.join(CONFIG)?;
        let text = read_text(&config)?;
        let shown = config.path().display().to_string();
        let spec = model::hf::spec_from_config(&shown, &text, seq_len, dtype)?;
        let (names, listing) = weight_files(dir)?;
        let mut files = Vec::with_capacity(names.len());
        let mut index = HashMap::new();
        for (i, file) in names.into_iter().enumerate() {
            let path = file.path();
            let mut opened = file.open()?;
            for (name, entry) in read_header(&path, &mut opened)? {
                index.insert(name, (i, entry));
            }
            files.push(WeightFile { path, file: opened });
        }
        Ok(Self {
            dir: dir.path(),
            spec,
            files,
            index,
            listing,
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

    /// Writes file tensor `name` of `shape` (checked against its header) into `dst`, the
    /// elements of a parameter of `dst_cols` columns, at `place`; read [`CHUNK_BYTES`] at a
    /// time and widened to f32.
    fn write_tensor(
        &self,
        (name, shape): &(String, Vec<u64>),
        place: Place,
        dst: &mut [f32],
        dst_cols: usize,
    ) -> Result<()> {
        let Some((i, entry)) = self.index.get(name) else {
            return Err(bad(&self.listing, name, "missing tensor"));
        };
        let WeightFile { path, file } = &self.files[*i];
        let dtype = entry.check(&path.display().to_string(), name, shape)?;
        let dims: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
        let (rows, cols) = match dims[..] {
            [r, c] => (r, c),
            [n] => (1, n),
            _ => {
                return Err(bad(
                    path,
                    name,
                    format!("shape {shape:?} is not 1-D or 2-D"),
                ));
            }
        };
        let row_bytes = cols * dtype.size() as usize;
        let chunk_rows = (CHUNK_BYTES / row_bytes.max(1)).clamp(1, rows.max(1));
        let mut raw = vec![0u8; chunk_rows * row_bytes];
        let mut values = Vec::with_capacity(chunk_rows * cols);
        let mut reader = file;
        for r0 in (0..rows).step_by(chunk_rows) {
            let n = chunk_rows.min(rows - r0);
            let bytes = &mut raw[..n * row_bytes];
            reader
                .seek(SeekFrom::Start(entry.start + (r0 * row_bytes) as u64))
                .and_then(|_| reader.read_exact(bytes))
                .map_err(|e| bad(path, name, format!("unreadable: {e}")))?;
            widen(dtype, bytes, &mut values);
            match place {
                Place::Same => dst[r0 * cols..(r0 + n) * cols].copy_from_slice(&values),
                Place::Columns(col) => {
                    for (k, row) in values.chunks_exact(cols).enumerate() {
                        let o = col + r0 + k;
                        for (x, &v) in row.iter().enumerate() {
                            dst[x * dst_cols + o] = v;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Parameter `p` read from `parts` (file tensor, place), which together cover it:
    /// written in place into its f32 value or master copy on the CPU, through one host
    /// buffer elsewhere.
    fn fill(&self, p: &mut Param, parts: &[(&(String, Vec<u64>), Place)]) -> Result<()> {
        let dims = filled_dims(parts);
        if dims != p.value.dims() {
            return Err(Error::InvalidArgument {
                field: "model.path",
                reason: format!(
                    "{}: the directory's tensors make {dims:?}, the stage holds {:?}",
                    p.name,
                    p.value.dims()
                ),
            });
        }
        let cols = *dims.last().unwrap_or(&1);
        let write = |dst: &mut [f32]| -> Result<()> {
            for (tensor, place) in parts {
                self.write_tensor(tensor, *place, dst, cols)?;
            }
            Ok(())
        };
        let target = p.master.clone().unwrap_or_else(|| p.value.clone());
        match crate::kernels::cpu::with_f32_mut(&target, write)? {
            // Written in place: a narrower value is rounded from its master copy.
            Some(written) => {
                written?;
                if p.master.is_some() {
                    p.set_wide(target)?;
                }
            }
            None => {
                let mut host = vec![0f32; dims.iter().product()];
                write(&mut host)?;
                let wide = Tensor::from_vec(host, dims, p.value.device())?;
                p.set_wide(wide)?;
            }
        }
        Ok(())
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
        let (h, m) = (s.hidden as usize, s.mlp_width() as usize);
        let kvd = (s.kv_heads() * s.head_dim()) as usize;
        let kinds = stage.kinds.clone();
        for (kind, piece) in kinds.into_iter().zip(stage.pieces.iter_mut()) {
            let t = hf_weights::piece_tensors(&s, kind);
            match (kind, piece) {
                (Piece::Embedding, PieceState::Embedding(e)) => {
                    self.fill(&mut e.wte, &[(&t[0], Place::Same)])?;
                }
                (Piece::Block(_), PieceState::LlamaBlock(b)) => {
                    // input norm, q, k, v, o, post-attention norm, gate, up, down.
                    self.fill(&mut b.attn_norm, &[(&t[0], Place::Same)])?;
                    let qkv = [
                        (&t[1], Place::Columns(0)),
                        (&t[2], Place::Columns(h)),
                        (&t[3], Place::Columns(h + kvd)),
                    ];
                    self.fill(&mut b.qkv_w, &qkv)?;
                    self.fill(&mut b.o_w, &[(&t[4], Place::Columns(0))])?;
                    self.fill(&mut b.mlp_norm, &[(&t[5], Place::Same)])?;
                    let gate_up = [(&t[6], Place::Columns(0)), (&t[7], Place::Columns(m))];
                    self.fill(&mut b.gate_up_w, &gate_up)?;
                    self.fill(&mut b.down_w, &[(&t[8], Place::Columns(0))])?;
                }
                (Piece::Head, PieceState::Head(hd)) => {
                    self.fill(&mut hd.ln_w, &[(&t[0], Place::Same)])?;
                    self.fill(&mut hd.lm, &[(&t[1], Place::Columns(0))])?;
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

/// The dims of the parameter `parts` fill: a tensor's own, or `[in, Σ out]` of linear
/// weights side by side.
fn filled_dims(parts: &[(&(String, Vec<u64>), Place)]) -> Vec<usize> {
    match parts {
        [((_, shape), Place::Same)] => shape.iter().map(|&d| d as usize).collect(),
        _ => {
            let inner = parts
                .first()
                .map_or(0, |((_, s), _)| s[s.len() - 1] as usize);
            let outs = parts.iter().map(|((_, s), _)| s[0] as usize).sum();
            vec![inner, outs]
        }
    }
}

/// `bytes` (little-endian elements of `dtype`) as f32 in `out`.
fn widen(dtype: WeightDType, bytes: &[u8], out: &mut Vec<f32>) {
    out.clear();
    match dtype {
        WeightDType::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        ),
        WeightDType::BF16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()),
        ),
        WeightDType::F16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()),
        ),
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
    p.set_wide(value)
}

/// The weight files of `dir`: `model.safetensors`, or the shards its index names (each once,
/// in name order); with the file a tensor missing from all of them is reported against.
fn weight_files(dir: &Confined) -> Result<(Vec<Confined>, PathBuf)> {
    let single = dir.join(WEIGHTS)?;
    if single.open().is_ok() {
        let path = single.path();
        return Ok((vec![single], path));
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
    let shards = hf_weights::shard_names(&shown.display().to_string(), &text)?
        .iter()
        .map(|name| dir.join(name))
        .collect::<Result<Vec<_>>>()?;
    Ok((shards, shown))
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
    for (&kind, piece) in stage.kinds.iter().zip(&stage.pieces) {
        let names: Vec<String> = hf_weights::piece_tensors(s, kind)
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        let tensors = match (kind, piece) {
            (Piece::Embedding, PieceState::Embedding(e)) => vec![f32_of(&e.wte)?],
            (Piece::Block(_), PieceState::LlamaBlock(b)) => {
                let qkv = f32_of(&b.qkv_w)?;
                let gu = f32_of(&b.gate_up_w)?;
                vec![
                    f32_of(&b.attn_norm)?,
                    out_in(qkv.narrow(1, 0, h)?)?,
                    out_in(qkv.narrow(1, h, kvd)?)?,
                    out_in(qkv.narrow(1, h + kvd, kvd)?)?,
                    out_in(f32_of(&b.o_w)?)?,
                    f32_of(&b.mlp_norm)?,
                    out_in(gu.narrow(1, 0, m)?)?,
                    out_in(gu.narrow(1, m, m)?)?,
                    out_in(f32_of(&b.down_w)?)?,
                ]
            }
            // A tied head's table is the embedding's: nothing of its own to write.
            (Piece::Head, PieceState::Head(hd)) if s.tie_embeddings => vec![f32_of(&hd.ln_w)?],
            (Piece::Head, PieceState::Head(hd)) => {
                vec![f32_of(&hd.ln_w)?, out_in(f32_of(&hd.lm)?)?]
            }
            (kind, _) => {
                return Err(Error::InvalidArgument {
                    field: "model.family",
                    reason: format!("{kind}: not a Llama piece"),
                });
            }
        };
        out.extend(names.into_iter().zip(tensors));
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
