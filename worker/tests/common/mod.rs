//! Shared helpers of the worker's integration tests: an autograd oracle of the whole model
//! written independently of the stage code (candle `Var`s and candle's own ops).

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;

use candle_core::{D, DType, Device, Tensor, Var, backprop::GradStore};
use pipewise_common::model::{DType as SpecDType, Family, ModelSpec};

mod llama;
pub mod reference;
use pipewise_worker::{Result, Stage};

/// The small model of the compute tests.
pub fn small_spec(layers: u32) -> ModelSpec {
    ModelSpec {
        vocab: 256,
        hidden: 32,
        heads: 4,
        layers,
        seq_len: 16,
        dtype: SpecDType::F32,
        ..Default::default()
    }
}

/// `steps` steps of `n` microbatches of 2 sequences from the generated corpus (sampler
/// seed 3), as the pipeline tests train on.
pub fn step_batches(
    spec: &ModelSpec,
    steps: u64,
    n: u32,
) -> Result<Vec<Vec<pipewise_worker::Batch>>> {
    let corpus = pipewise_worker::Corpus::generated();
    let sampler = pipewise_worker::Sampler {
        seed: 3,
        microbatch_size: 2,
        seq_len: spec.seq_len as usize,
        global_batch: 2 * n as usize,
        shuffle: true,
    };
    (0..steps)
        .map(|step| sampler.step(&corpus, step, n, &Device::Cpu))
        .collect()
}

/// The small Llama model of the compute tests: 4 heads sharing 2 key/value heads, an MLP
/// of 48.
pub fn small_llama(layers: u32) -> ModelSpec {
    ModelSpec {
        family: Family::Llama,
        kv_heads: Some(2),
        intermediate: Some(48),
        ..small_spec(layers)
    }
}

/// Seeded token windows `[b, t]` (inputs and targets) for microbatch `mb`.
pub fn tokens(spec: &ModelSpec, b: usize, mb: u32, device: &Device) -> Result<(Tensor, Tensor)> {
    let t = spec.seq_len as usize;
    let mut rng = pipewise_worker::rng::SplitMix64::new(1000 + u64::from(mb));
    let ids: Vec<u32> = (0..b * t)
        .map(|_| rng.below(u64::from(spec.vocab)) as u32)
        .collect();
    let tg: Vec<u32> = (0..b * t)
        .map(|_| rng.below(u64::from(spec.vocab)) as u32)
        .collect();
    Ok((
        Tensor::from_vec(ids, (b, t), device)?,
        Tensor::from_vec(tg, (b, t), device)?,
    ))
}

/// The whole model as candle `Var`s, named as the stages name their parameters.
pub struct Oracle {
    pub spec: ModelSpec,
    pub vars: HashMap<String, Var>,
}

/// What the oracle computes for one step.
pub struct OracleStep {
    /// Each microbatch's mean loss.
    pub losses: Vec<f32>,
    /// `∂(mean over microbatches)/∂(parameter)`.
    pub param_grads: HashMap<String, Tensor>,
    /// `input_grads[(piece index, mb)]`: gradient with respect to the hidden state entering
    /// that piece (for every piece after the embedding).
    pub input_grads: HashMap<(usize, u32), Tensor>,
}

fn ln(x: &Tensor, w: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
    let mean = x.mean_keepdim(D::Minus1)?;
    let xc = x.broadcast_sub(&mean)?;
    let var = xc.sqr()?.mean_keepdim(D::Minus1)?;
    xc.broadcast_div(&(var + 1e-5)?.sqrt()?)?
        .broadcast_mul(w)?
        .broadcast_add(b)
}

impl Oracle {
    /// Vars holding a whole-model stage's initial values.
    pub fn new(whole: &Stage) -> Result<Self> {
        let vars = whole
            .params()
            .map(|p| Ok((p.name.clone(), Var::from_tensor(&p.value)?)))
            .collect::<Result<HashMap<_, _>>>()?;
        Ok(Self {
            spec: whole.spec().clone(),
            vars,
        })
    }

    pub(crate) fn v(&self, name: &str) -> &Tensor {
        self.vars
            .get(name)
            .unwrap_or_else(|| panic!("no parameter {name}"))
            .as_tensor()
    }

    /// Forward of all microbatches (summing their losses / n) and candle's `backward()`.
    pub fn step(&self, batches: &[(Tensor, Tensor)]) -> Result<OracleStep> {
        let s = self.spec.clone();
        let (h, nh, v) = (s.hidden as usize, s.heads as usize, s.vocab as usize);
        let hd = h / nh;
        let n = batches.len();
        let mut total: Option<Tensor> = None;
        let mut losses = Vec::new();
        let mut taps: HashMap<(usize, u32), Var> = HashMap::new();
        for (mb, (ids, targets)) in batches.iter().enumerate() {
            let mb = mb as u32;
            let (b, t) = ids.dims2()?;
            let device = ids.device();
            if s.family == Family::Llama {
                let loss = llama::loss(self, (ids, targets), mb, &mut taps)?;
                losses.push(loss.to_scalar::<f32>()?);
                let scaled = (loss / n as f64)?;
                total = Some(match total {
                    Some(acc) => (acc + scaled)?,
                    None => scaled,
                });
                continue;
            }
            let emb = self.v("embedding.wte").embedding(&ids.flatten_all()?)?;
            let pos = self.v("embedding.wpe").narrow(0, 0, t)?;
            let mut x = emb.reshape((b, t, h))?.broadcast_add(&pos)?;
            // Causal mask by where_cond on a lower-triangular predicate.
            let tril = Tensor::tril2(t, DType::U8, device)?;
            let neg = Tensor::full(f32::NEG_INFINITY, (t, t), device)?;
            for piece in 1..=s.layers as usize {
                let tap = Var::zeros((b, t, h), DType::F32, device)?;
                x = (x + tap.as_tensor())?;
                taps.insert((piece, mb), tap);
                let p = |name: &str| self.v(&format!("block{}.{name}", piece - 1)).clone();
                let a = ln(&x, &p("ln1.weight"), &p("ln1.bias"))?;
                let qkv = a
                    .broadcast_matmul(&p("attn.qkv.weight"))?
                    .broadcast_add(&p("attn.qkv.bias"))?;
                let heads = |i: usize| -> candle_core::Result<Tensor> {
                    qkv.narrow(2, i * h, h)?
                        .reshape((b, t, nh, hd))?
                        .transpose(1, 2)?
                        .contiguous()
                };
                let (q, k, vv) = (heads(0)?, heads(1)?, heads(2)?);
                let scores = (q.matmul(&k.t()?.contiguous()?)? / (hd as f64).sqrt())?;
                let mask = tril.broadcast_as(scores.shape())?;
                let scores = mask.where_cond(&scores, &neg.broadcast_as(scores.shape())?)?;
                let e = scores
                    .broadcast_sub(&scores.max_keepdim(D::Minus1)?.detach())?
                    .exp()?;
                let probs = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
                let y = probs
                    .matmul(&vv)?
                    .transpose(1, 2)?
                    .contiguous()?
                    .reshape((b, t, h))?;
                let attn = y
                    .broadcast_matmul(&p("attn.proj.weight"))?
                    .broadcast_add(&p("attn.proj.bias"))?;
                x = (x + attn)?;
                let c = ln(&x, &p("ln2.weight"), &p("ln2.bias"))?;
                let mlp = c
                    .broadcast_matmul(&p("mlp.fc.weight"))?
                    .broadcast_add(&p("mlp.fc.bias"))?
                    .gelu()?
                    .broadcast_matmul(&p("mlp.proj.weight"))?
                    .broadcast_add(&p("mlp.proj.bias"))?;
                x = (x + mlp)?;
            }
            let head_piece = s.layers as usize + 1;
            let tap = Var::zeros((b, t, h), DType::F32, device)?;
            x = (x + tap.as_tensor())?;
            taps.insert((head_piece, mb), tap);
            let z = ln(&x, self.v("head.ln_f.weight"), self.v("head.ln_f.bias"))?;
            let logits = z
                .broadcast_matmul(self.v("head.lm_head.weight"))?
                .reshape((b * t, v))?;
            let max = logits.max_keepdim(1)?.detach();
            let lse = (logits.broadcast_sub(&max)?.exp()?.sum_keepdim(1)?.log()? + &max)?;
            let picked = logits.gather(&targets.flatten_all()?.unsqueeze(1)?, 1)?;
            let loss = (lse - picked)?.mean_all()?;
            losses.push(loss.to_scalar::<f32>()?);
            let scaled = (loss / n as f64)?;
            total = Some(match total {
                Some(acc) => (acc + scaled)?,
                None => scaled,
            });
        }
        let Some(total) = total else {
            panic!("no microbatches");
        };
        let grads: GradStore = total.backward()?;
        let mut param_grads = HashMap::new();
        for (name, var) in &self.vars {
            let g = grads
                .get(var.as_tensor())
                .cloned()
                .unwrap_or_else(|| panic!("no gradient for {name}"));
            param_grads.insert(name.clone(), g);
        }
        let mut input_grads = HashMap::new();
        for (key, var) in &taps {
            if let Some(g) = grads.get(var.as_tensor()) {
                input_grads.insert(*key, g.clone());
            }
        }
        Ok(OracleStep {
            losses,
            param_grads,
            input_grads,
        })
    }
}

/// Largest absolute value of a tensor.
pub fn max_abs(t: &Tensor) -> Result<f64> {
    Ok(f64::from(
        t.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?,
    ))
}
