//! Checkpoints of a stage as safetensors: parameters, AdamW moments and the step.
//!
//! Tensor names: `param/{name}` (the model dtype), `adam_m/{name}`, `adam_v/{name}` (f32)
//! for every parameter and `master/{name}` (f32) for those of a bf16 or f16 model (`name`
//! as [`Param::name`](crate::param::Param::name), e.g. `block3.attn.qkv.weight`),
//! and `meta/step` (`[1]` i64), `meta/range` (`[2]` i64, the piece range), `meta/spec`
//! and `meta/model` (the model that wrote it: [`CheckpointModel`]; a file of another model
//! is refused naming the `[model]` field that differs) and `meta/format` (`[1]` i64,
//! [`FORMAT`]; files without it are format 1: moments in the model dtype, no master
//! copies). A file of a later format is refused with its number. A checkpoint loads only into a stage
//! with the same spec and piece range ([`Stage::load_checkpoint`]); a step's directory of
//! stage files (`step-K/stage-S.safetensors`, one per stage of any partition of the same
//! model) loads into a stage of another partition by the tensors' whole-model names
//! ([`Stage::load_checkpoint_dir`], how a job re-planned onto fewer workers resumes).
//! Files are written under a temporary name and renamed, so a file with the final name is
//! complete. The same bytes also travel without a file ([`Stage::checkpoint_bytes`],
//! [`Stage::load_checkpoint_bytes`]): a stage's state copied to a rebuilt replica's worker.
//! Checkpoints are taken between steps: accumulated gradients are not saved, and a stage
//! with pending microbatches refuses to save.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::{Read as _, Write};
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use safetensors::View as _;
use safetensors::tensor::TensorInfo;

use pipewise_common::model::checkpoint_meta::{CheckpointModel, MODEL_TENSOR, SPEC_TENSOR};

use crate::confined::{Confined, Dir};
use crate::error::{Error, Result};
use crate::param::{Param, STATE_DTYPE};
use crate::stage::Stage;

fn meta(stage: &Stage, device: &Device) -> Result<(Tensor, Tensor, Tensor, Tensor)> {
    let s = stage.spec();
    let step = i64::try_from(stage.step()).unwrap_or(i64::MAX);
    let r = stage.range();
    Ok((
        Tensor::new(&[step], device)?,
        Tensor::new(&[r.start as i64, r.end as i64], device)?,
        Tensor::new(&CheckpointModel::spec_values(s), device)?,
        Tensor::new(&CheckpointModel::model_values(s), device)?,
    ))
}

/// The checkpoint format written: 2 since moments and master copies are kept in f32.
pub const FORMAT: i64 = 2;

/// One checkpoint file: its meta and tensors.
struct Shard {
    path: PathBuf,
    /// `meta/format` (1 for files written before it).
    format: i64,
    step: i64,
    range: Vec<i64>,
    /// The model it records (`meta/spec`, `meta/model`).
    model: CheckpointModel,
    tensors: HashMap<String, Tensor>,
}

fn bad(path: &Path, reason: String) -> Error {
    Error::Checkpoint {
        path: path.to_path_buf(),
        reason,
    }
}

/// The bit patterns of a tensor's elements widened to f32 (exact for f32, bf16 and f16), to
/// compare tensors exactly (NaNs included): how a master copy is checked against its
/// parameter.
pub fn tensor_bits(t: &Tensor) -> Result<Vec<u32>> {
    Ok(t.to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?
        .into_iter()
        .map(f32::to_bits)
        .collect())
}

/// The same values bit for bit, any NaN matching any NaN (devices round a NaN to their
/// own pattern).
fn same_values(a: &Tensor, b: &Tensor) -> Result<bool> {
    let (a, b) = (tensor_bits(a)?, tensor_bits(b)?);
    Ok(a.len() == b.len()
        && a.iter()
            .zip(&b)
            .all(|(&x, &y)| x == y || (f32::from_bits(x).is_nan() && f32::from_bits(y).is_nan())))
}

/// What errors name as the "path" of a checkpoint held in memory.
const IN_MEMORY: &str = "<stage state in memory>";

/// Reads a stage file into host memory (its tensors move to the stage's device one
/// parameter at a time as they are installed).
fn read_shard(path: &Path) -> Result<Shard> {
    if !path.exists() {
        return Err(Error::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such checkpoint"),
        });
    }
    shard_of(candle_core::safetensors::load(path, &Device::Cpu)?, path)
}

/// [`read_shard`] of a file already opened (`path` names it in errors).
fn read_open_shard(mut file: File, path: &Path) -> Result<Shard> {
    // The open file through its `/proc` link: candle maps it without resolving `path`
    // again, so a link swapped in since it was opened is not followed.
    let by_fd = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    if by_fd.exists() {
        return shard_of(candle_core::safetensors::load(&by_fd, &Device::Cpu)?, path);
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    shard_of(
        candle_core::safetensors::load_buffer(&bytes, &Device::Cpu)?,
        path,
    )
}

/// The meta and tensors of a checkpoint's tensors, read from `path` (named in errors).
fn shard_of(mut tensors: HashMap<String, Tensor>, path: &Path) -> Result<Shard> {
    let has_format = tensors.contains_key("meta/format");
    let has_model = tensors.contains_key(MODEL_TENSOR);
    let mut ints = |key: &str| -> Result<Vec<i64>> {
        let t = tensors
            .remove(key)
            .ok_or_else(|| bad(path, format!("has no tensor {key}")))?;
        Ok(t.to_dtype(DType::I64)?.to_vec1::<i64>()?)
    };
    // The format first: a later one may lay out the rest differently.
    let format = if has_format {
        ints("meta/format")?.first().copied().unwrap_or(0)
    } else {
        1
    };
    if !(1..=FORMAT).contains(&format) {
        return Err(bad(
            path,
            format!("is of checkpoint format {format}; this pipewise reads formats 1 to {FORMAT}"),
        ));
    }
    let range = ints("meta/range")?;
    let spec = ints(SPEC_TENSOR)?;
    let model = if has_model {
        Some(ints(MODEL_TENSOR)?)
    } else {
        None
    };
    let step = ints("meta/step")?
        .first()
        .copied()
        .ok_or_else(|| bad(path, "empty meta/step".into()))?;
    Ok(Shard {
        path: path.to_path_buf(),
        format,
        step,
        range,
        model: CheckpointModel { spec, model },
        tensors,
    })
}

/// Checks that `shards`, read together from `at`, are all of one step.
fn one_step(shards: &[Shard], at: &Path) -> Result<()> {
    match shards.iter().find(|s| s.step != shards[0].step) {
        Some(other) => Err(bad(
            at,
            format!(
                "mixes steps: {} is at step {}, {} at step {}",
                shards[0].path.display(),
                shards[0].step,
                other.path.display(),
                other.step
            ),
        )),
        None => Ok(()),
    }
}

/// The longest safetensors header read (bytes); a real one lists a few names per tensor.
const MAX_HEADER: u64 = 256 << 20;

/// The tensor names a safetensors file holds, from its header alone (8 bytes of header
/// length, then the JSON header), without reading the tensors.
fn tensor_names(file: &mut File, path: &Path) -> Result<BTreeSet<String>> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(io)?;
    let len = u64::from_le_bytes(len);
    if len > MAX_HEADER {
        return Err(bad(path, format!("has a header of {len} bytes")));
    }
    let mut header = vec![0u8; len as usize];
    file.read_exact(&mut header).map_err(io)?;
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&header)
        .map_err(|e| bad(path, format!("has an unreadable header: {e}")))?;
    Ok(map
        .into_iter()
        .map(|(k, _)| k)
        .filter(|k| k != "__metadata__")
        .collect())
}

/// Writes `tensors` as a safetensors file to `out` (`path` names it in errors), with one
/// tensor's bytes in memory at a time rather than the whole file's.
fn write_tensors(
    mut out: impl Write,
    tensors: &HashMap<String, Tensor>,
    path: &Path,
) -> Result<()> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    // As `safetensors::serialize` lays them out: wider dtypes first, then by name, so each
    // tensor's bytes start aligned to its dtype.
    let mut order: Vec<(&String, &Tensor)> = tensors.iter().collect();
    order.sort_by(|(a, x), (b, y)| st_dtype(y).cmp(&st_dtype(x)).then(a.cmp(b)));
    // A JSON object in that order (what `safetensors::serialize` writes, byte for byte).
    let unwritable = |e: serde_json::Error| bad(path, format!("has an unwritable header: {e}"));
    let mut header = vec![b'{'];
    let mut offset = 0;
    for (i, (name, t)) in order.iter().enumerate() {
        let end = offset + t.data_len();
        let info = TensorInfo {
            dtype: st_dtype(t),
            shape: t.dims().to_vec(),
            data_offsets: (offset, end),
        };
        if i > 0 {
            header.push(b',');
        }
        serde_json::to_writer(&mut header, name).map_err(unwritable)?;
        header.push(b':');
        serde_json::to_writer(&mut header, &info).map_err(unwritable)?;
        offset = end;
    }
    header.push(b'}');
    header.resize(header.len().next_multiple_of(8), b' ');
    out.write_all(&(header.len() as u64).to_le_bytes())
        .map_err(io)?;
    out.write_all(&header).map_err(io)?;
    for (_, t) in order {
        write_data(&mut out, t).map_err(io)?;
    }
    out.flush().map_err(io)
}

/// A tensor's dtype as safetensors names it.
/// Elements per write when a tensor's bytes are streamed from its storage.
const WRITE_CHUNK: usize = 1 << 16;

/// Writes `t`'s bytes as safetensors lays them out (little-endian): an f32 or f64 CPU
/// tensor's straight from its storage, a chunk at a time, so a save never holds a copy of
/// a whole tensor (a vocabulary table's would be a table-sized buffer beside the
/// parameter's own state); any other through a copy.
fn write_data(out: &mut impl Write, t: &Tensor) -> std::io::Result<()> {
    use crate::kernels::cpu::{with_f32, with_f64};
    if let Some(written) = with_f32(t, |v| write_le(out, v, f32::to_le_bytes)) {
        return written;
    }
    if let Some(written) = with_f64(t, |v| write_le(out, v, f64::to_le_bytes)) {
        return written;
    }
    out.write_all(&t.data())
}

/// Writes `values` as their little-endian bytes, [`WRITE_CHUNK`] elements at a time.
fn write_le<T: Copy, const N: usize>(
    out: &mut impl Write,
    values: &[T],
    le: fn(T) -> [u8; N],
) -> std::io::Result<()> {
    let mut bytes = Vec::with_capacity(WRITE_CHUNK.min(values.len()) * N);
    for chunk in values.chunks(WRITE_CHUNK) {
        bytes.clear();
        bytes.extend(chunk.iter().flat_map(|&v| le(v)));
        out.write_all(&bytes)?;
    }
    Ok(())
}

fn st_dtype(t: &Tensor) -> safetensors::Dtype {
    safetensors::View::dtype(t)
}

/// Writes `tensors` as file `name` in `dir`: under `name.partial` first, renamed into
/// place, so a file with the final name is complete. Nothing on the way follows a link.
pub(crate) fn save_tensors(
    dir: &Dir,
    name: impl AsRef<Path>,
    tensors: &HashMap<String, Tensor>,
) -> Result<()> {
    let name = name.as_ref();
    let mut partial = name.as_os_str().to_owned();
    partial.push(".partial");
    let file = dir.create(&partial)?;
    write_tensors(
        std::io::BufWriter::with_capacity(1 << 20, file),
        tensors,
        &dir.path_of(&partial),
    )?;
    dir.rename(&partial, name)
}

impl Stage {
    /// Writes this stage's parameters, optimizer state and step to `path` (through a
    /// temporary file renamed into place, so `path` never holds a partial checkpoint).
    pub fn save_checkpoint(&self, path: &Path) -> Result<()> {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(bad(path, "is not a file's path".into()));
        };
        let parent = if parent.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent
        };
        self.save_checkpoint_in(&Confined::at(parent).dir(false)?, name)
    }

    /// [`Stage::save_checkpoint`] as file `name` in directory `dir`, opened without
    /// following links ([`Confined::dir`]).
    pub fn save_checkpoint_in(&self, dir: &Dir, name: impl AsRef<Path>) -> Result<()> {
        let tensors = self.state_tensors(&dir.path_of(name.as_ref()))?;
        save_tensors(dir, name, &tensors)
    }

    /// The bytes [`Stage::save_checkpoint`] would write, in memory: how a stage's state goes
    /// to another replica's worker without a scratch file (a stage's state can be larger
    /// than the scratch space a pod has).
    pub fn checkpoint_bytes(&self) -> Result<Vec<u8>> {
        let tensors = self.state_tensors(Path::new(IN_MEMORY))?;
        Ok(safetensors::tensor::serialize(&tensors, None).map_err(candle_core::Error::from)?)
    }

    /// [`Stage::load_checkpoint`] from the bytes of a checkpoint file
    /// ([`Stage::checkpoint_bytes`]).
    pub fn load_checkpoint_bytes(&mut self, bytes: &[u8]) -> Result<()> {
        let tensors = candle_core::safetensors::load_buffer(bytes, &Device::Cpu)?;
        self.load_shard(shard_of(tensors, Path::new(IN_MEMORY))?)
    }

    /// This stage's parameters, optimizer state and step as a checkpoint's tensors, on the
    /// CPU; refused between a step's passes (`path` names the checkpoint in the error).
    fn state_tensors(&self, path: &Path) -> Result<HashMap<String, Tensor>> {
        let (waiting_b, waiting_w) = self.pending();
        if !waiting_b.is_empty() || !waiting_w.is_empty() {
            return Err(bad(
                path,
                format!(
                    "microbatches {waiting_b:?} wait for B and {waiting_w:?} for W; save between steps"
                ),
            ));
        }
        let cpu = Device::Cpu;
        let mut tensors: HashMap<String, Tensor> = HashMap::new();
        for p in self.params() {
            tensors.insert(format!("param/{}", p.name), p.value.to_device(&cpu)?);
            tensors.insert(format!("adam_m/{}", p.name), p.m.to_device(&cpu)?);
            tensors.insert(format!("adam_v/{}", p.name), p.v.to_device(&cpu)?);
            if let Some(master) = &p.master {
                tensors.insert(format!("master/{}", p.name), master.to_device(&cpu)?);
            }
        }
        let (step, range, spec, model) = meta(self, &cpu)?;
        tensors.insert("meta/step".into(), step);
        tensors.insert("meta/range".into(), range);
        tensors.insert(SPEC_TENSOR.into(), spec);
        tensors.insert(MODEL_TENSOR.into(), model);
        tensors.insert("meta/format".into(), Tensor::new(&[FORMAT], &cpu)?);
        Ok(tensors)
    }

    /// Loads this stage's state from checkpoint shards in memory (`buffers`, as
    /// [`Stage::checkpoint_bytes`] gives them) of any partition of the same model, taking
    /// the tensors by their whole-model names from those whose pieces overlap this
    /// stage's: a move's run takes its stages from the run before's.
    pub fn load_checkpoint_buffers(&mut self, buffers: &[&[u8]]) -> Result<()> {
        let mine = self.range();
        let mut shards = Vec::new();
        for bytes in buffers {
            let tensors = candle_core::safetensors::load_buffer(bytes, &Device::Cpu)?;
            let shard = shard_of(tensors, Path::new(IN_MEMORY))?;
            let overlaps = match shard.range[..] {
                [start, end] => (start as usize) < mine.end && mine.start < (end as usize),
                _ => false,
            };
            if overlaps {
                shards.push(shard);
            }
        }
        one_step(&shards, Path::new(IN_MEMORY))?;
        self.install(shards)
    }

    /// Replaces this stage's parameters, optimizer state and step with those saved at
    /// `path`, and zeroes its gradients. The checkpoint must come from a stage with the same
    /// spec (sizes and dtype) and piece range.
    pub fn load_checkpoint(&mut self, path: &Path) -> Result<()> {
        self.load_shard(read_shard(path)?)
    }

    /// Installs `shard` when it holds this stage's piece range.
    fn load_shard(&mut self, shard: Shard) -> Result<()> {
        let want: Vec<i64> = [self.range().start as i64, self.range().end as i64].into();
        if shard.range != want {
            return Err(bad(
                &shard.path,
                format!(
                    "holds pieces {:?}, this stage holds {:?}",
                    shard.range,
                    self.range()
                ),
            ));
        }
        self.install(vec![shard])
    }

    /// Like [`Stage::load_checkpoint`], from a step's directory of stage files
    /// (`stage-S.safetensors`) written by the stages of any partition of the same model:
    /// every tensor is taken, by its whole-model name, from the file that holds it. Only the
    /// files that hold some of this stage's tensors are read (their headers say which), so
    /// a stage reads about its own share of the state; those files must agree on the spec
    /// and the step, and every parameter of this stage must be in exactly one of them (the
    /// other files of the directory are not checked).
    pub fn load_checkpoint_dir(&mut self, dir: &Path) -> Result<()> {
        self.load_checkpoint_in(&Confined::at(dir).dir(false)?)
    }

    /// [`Stage::load_checkpoint_dir`] from directory `dir`, opened without following links
    /// ([`Confined::dir`]); its stage files are opened without following links too.
    pub fn load_checkpoint_in(&mut self, dir: &Dir) -> Result<()> {
        let files: Vec<String> = dir
            .names()?
            .into_iter()
            .filter(|name| name.starts_with("stage-") && name.ends_with(".safetensors"))
            .collect();
        if files.is_empty() {
            return Err(bad(
                &dir.path_of(""),
                "holds no stage-S.safetensors files".into(),
            ));
        }
        let wanted: BTreeSet<String> = self.params().map(|p| format!("param/{}", p.name)).collect();
        let mut needed = Vec::new();
        for name in files {
            let path = dir.path_of(&name);
            let mut file = dir.open(&name)?;
            if !tensor_names(&mut file, &path)?.is_disjoint(&wanted) {
                needed.push((file, path));
            }
        }
        if needed.is_empty() {
            return Err(bad(
                &dir.path_of(""),
                format!(
                    "holds none of the tensors of this stage (pieces {:?})",
                    self.range()
                ),
            ));
        }
        let shards = needed
            .into_iter()
            .map(|(file, path)| read_open_shard(file, &path))
            .collect::<Result<Vec<_>>>()?;
        one_step(&shards, &dir.path_of(""))?;
        self.install(shards)
    }

    /// Installs this stage's tensors from `shards` (which all passed [`read_shard`]).
    fn install(&mut self, mut shards: Vec<Shard>) -> Result<()> {
        // Another model's file names the job's field that differs (`model.hidden`, …).
        for shard in &shards {
            shard
                .model
                .check(self.spec(), &shard.path.display().to_string())?;
        }
        let step = shards.first().map_or(0, |s| s.step);
        let dtype = self.dtype();
        let mut loaded = Vec::new();
        for p in self.params() {
            let key = format!("param/{}", p.name);
            let mut holders = shards.iter_mut().filter(|s| s.tensors.contains_key(&key));
            let Some(shard) = holders.next() else {
                let held: Vec<&Vec<i64>> = shards.iter().map(|s| &s.range).collect();
                let path = shards.first().map(|s| s.path.clone()).unwrap_or_default();
                return Err(bad(
                    &path,
                    format!("no file holds {key} (they hold pieces {held:?})"),
                ));
            };
            if let Some(twice) = holders.next() {
                return Err(bad(
                    &twice.path,
                    format!("holds {key}, which another file of the step holds too"),
                ));
            }
            // Parameters in the model dtype, master copies and moments in f32. Format-1
            // checkpoints (written before moments and master copies were kept in f32) hold
            // moments in the model dtype and no master copy: they are widened. A later
            // file must have both as it was written.
            let master_name = format!("master/{}", p.name);
            let master = shard.tensors.contains_key(&master_name);
            let old_file = shard.format == 1;
            if !old_file && !master && Param::needs_master(dtype) {
                return Err(bad(
                    &shard.path,
                    format!("has no tensor {master_name} (format {})", shard.format),
                ));
            }
            let mut get = |prefix: &str, want: DType| -> Result<Tensor> {
                let name = format!("{prefix}/{}", p.name);
                let t = shard
                    .tensors
                    .remove(&name)
                    .ok_or_else(|| bad(&shard.path, format!("has no tensor {name}")))?;
                let old_form = old_file && prefix != "master" && t.dtype() == dtype;
                if t.dims() != p.value.dims() || (t.dtype() != want && !old_form) {
                    return Err(bad(
                        &shard.path,
                        format!(
                            "{name} is {:?} {:?}, expected {:?} {:?}",
                            t.dtype(),
                            t.dims(),
                            want,
                            p.value.dims()
                        ),
                    ));
                }
                Ok(t.to_dtype(want)?)
            };
            let value = get("param", dtype)?;
            let wide = if master {
                let wide = get("master", STATE_DTYPE)?;
                if !same_values(&wide.to_dtype(dtype)?, &value)? {
                    return Err(bad(
                        &shard.path,
                        format!("{key} is not {master_name} rounded to {dtype:?}"),
                    ));
                }
                wide
            } else {
                value.to_dtype(STATE_DTYPE)?
            };
            loaded.push((
                wide,
                get("adam_m", STATE_DTYPE)?,
                get("adam_v", STATE_DTYPE)?,
            ));
        }
        self.replace_state(loaded, u64::try_from(step).unwrap_or(0))?;
        // Two different tables (an untied model's checkpoint) would train as two.
        let path = shards.first().map(|s| s.path.clone()).unwrap_or_default();
        if !self.tied_copies_agree()? {
            return Err(bad(
                &path,
                "holds two different copies of the tied table (embedding.wte and \
                 head.lm_head.weight): not a checkpoint of a tied model"
                    .into(),
            ));
        }
        Ok(())
    }
}
