//! Checkpoints of a stage as safetensors: parameters, AdamW moments and the step.
//!
//! Tensor names: `param/{name}`, `adam_m/{name}`, `adam_v/{name}` for every parameter
//! (`name` as [`Param::name`](crate::param::Param::name), e.g. `block3.attn.qkv.weight`),
//! and `meta/step` (`[1]` i64), `meta/range` (`[2]` i64, the piece range) and `meta/spec`
//! (`[5]` i64: vocab, hidden, heads, layers, seq_len). A checkpoint loads only into a stage
//! with the same spec and piece range. Checkpoints are taken between steps: accumulated
//! gradients are not saved, and a stage with pending microbatches refuses to save.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};
use crate::stage::Stage;

fn meta(stage: &Stage, device: &Device) -> Result<(Tensor, Tensor, Tensor)> {
    let s = stage.spec();
    let step = i64::try_from(stage.step()).unwrap_or(i64::MAX);
    let r = stage.range();
    Ok((
        Tensor::new(&[step], device)?,
        Tensor::new(&[r.start as i64, r.end as i64], device)?,
        Tensor::new(
            &[
                i64::from(s.vocab),
                i64::from(s.hidden),
                i64::from(s.heads),
                i64::from(s.layers),
                i64::from(s.seq_len),
            ],
            device,
        )?,
    ))
}

impl Stage {
    /// Writes this stage's parameters, optimizer state and step to `path`.
    pub fn save_checkpoint(&self, path: &Path) -> Result<()> {
        let (waiting_b, waiting_w) = self.pending();
        if !waiting_b.is_empty() || !waiting_w.is_empty() {
            return Err(Error::Checkpoint {
                path: path.to_path_buf(),
                reason: format!(
                    "microbatches {waiting_b:?} wait for B and {waiting_w:?} for W; save between steps"
                ),
            });
        }
        let cpu = Device::Cpu;
        let mut tensors: HashMap<String, Tensor> = HashMap::new();
        for p in self.params() {
            tensors.insert(format!("param/{}", p.name), p.value.to_device(&cpu)?);
            tensors.insert(format!("adam_m/{}", p.name), p.m.to_device(&cpu)?);
            tensors.insert(format!("adam_v/{}", p.name), p.v.to_device(&cpu)?);
        }
        let (step, range, spec) = meta(self, &cpu)?;
        tensors.insert("meta/step".into(), step);
        tensors.insert("meta/range".into(), range);
        tensors.insert("meta/spec".into(), spec);
        candle_core::safetensors::save(&tensors, path)?;
        Ok(())
    }

    /// Replaces this stage's parameters, optimizer state and step with those saved at
    /// `path`, and zeroes its gradients. The checkpoint must come from a stage with the same
    /// spec (sizes and dtype) and piece range.
    pub fn load_checkpoint(&mut self, path: &Path) -> Result<()> {
        let bad = |reason: String| Error::Checkpoint {
            path: path.to_path_buf(),
            reason,
        };
        if !path.exists() {
            return Err(Error::Io {
                path: path.to_path_buf(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such checkpoint"),
            });
        }
        let device = self.device().clone();
        let mut tensors = candle_core::safetensors::load(path, &device)?;
        let mut take = |key: String| {
            tensors
                .remove(&key)
                .ok_or_else(|| bad(format!("has no tensor {key}")))
        };
        let ints =
            |t: Tensor| -> Result<Vec<i64>> { Ok(t.to_dtype(DType::I64)?.to_vec1::<i64>()?) };
        let (_, want_range, want_spec) = meta(self, &Device::Cpu)?;
        let got_range = ints(take("meta/range".into())?)?;
        let got_spec = ints(take("meta/spec".into())?)?;
        if got_range != want_range.to_vec1::<i64>()? {
            return Err(bad(format!(
                "holds pieces {got_range:?}, this stage holds {:?}",
                self.range()
            )));
        }
        if got_spec != want_spec.to_vec1::<i64>()? {
            return Err(bad(format!(
                "model sizes {got_spec:?} differ from this stage's {:?}",
                want_spec.to_vec1::<i64>()?
            )));
        }
        let step = ints(take("meta/step".into())?)?
            .first()
            .copied()
            .ok_or_else(|| bad("empty meta/step".into()))?;
        let dtype = self.dtype();
        let mut loaded = Vec::new();
        for p in self.params() {
            let mut get = |prefix: &str| -> Result<Tensor> {
                let t = take(format!("{prefix}/{}", p.name))?;
                if t.dims() != p.value.dims() || t.dtype() != dtype {
                    return Err(bad(format!(
                        "{prefix}/{} is {:?} {:?}, expected {:?} {:?}",
                        p.name,
                        t.dtype(),
                        t.dims(),
                        dtype,
                        p.value.dims()
                    )));
                }
                Ok(t)
            };
            loaded.push((get("param")?, get("adam_m")?, get("adam_v")?));
        }
        self.replace_state(loaded, u64::try_from(step).unwrap_or(0))
    }
}
