//! The single-device reference the pipeline tests compare against: a [`Trainer`] holding the
//! whole model, its losses, gradient norms and final parameters.

use std::collections::BTreeMap;

use candle_core::{Device, Tensor};
use pipewise_common::generate::{Request, ScheduleKind, generate};
use pipewise_common::model::ModelSpec;
use pipewise_common::schedule::Schedule;
use pipewise_worker::checkpoint::tensor_bits;
use pipewise_worker::{AdamW, Batch, Result, Trainer};

/// The parameters' seed of every run of these tests.
pub const SEED: u64 = 7;
/// Global gradient-norm clip: the first steps of these runs exceed it, the later ones not.
pub const CLIP: f64 = 1.45;

/// A large learning rate so parameters move visibly, and a clip threshold the early steps
/// exceed and the later ones do not (the clipped and the unclipped path both run).
pub fn adamw() -> AdamW {
    AdamW {
        lr: 1e-2,
        weight_decay: 0.1,
        max_grad_norm: Some(CLIP),
        ..AdamW::default()
    }
}

/// What the whole model on one device gives.
pub struct Reference {
    /// Every step's loss.
    pub losses: Vec<f64>,
    /// Every step's gradient norm before clipping.
    pub grad_norms: Vec<f64>,
    /// The parameters after the last step, by name.
    pub params: BTreeMap<String, Tensor>,
}

/// Trains `spec` from [`SEED`] with [`adamw`] on `steps` on one device.
pub fn reference(spec: &ModelSpec, steps: &[Vec<Batch>]) -> Result<Reference> {
    let mut trainer = Trainer::new(spec, SEED, &Device::Cpu, adamw())?;
    let (mut losses, mut grad_norms) = (Vec::new(), Vec::new());
    for batches in steps {
        let stats = trainer.train_step(batches)?;
        losses.push(stats.loss);
        grad_norms.push(stats.grad_norm);
    }
    let params = trainer
        .stage()
        .params()
        .map(|p| (p.name.clone(), p.value.clone()))
        .collect();
    Ok(Reference {
        losses,
        grad_norms,
        params,
    })
}

/// The schedule `kind` on `workers` workers with `chunks` chunks each.
pub fn schedule(kind: ScheduleKind, workers: u32, chunks: u32, microbatches: u32) -> Schedule {
    let mut req = Request::new(kind, workers, microbatches);
    req.chunks = chunks;
    generate(&req).unwrap_or_else(|e| panic!("{kind} on {workers} workers: {e}"))
}

/// The names of the parameters of `params` whose bits differ from `want`'s.
pub fn differing(
    params: &BTreeMap<String, Tensor>,
    want: &BTreeMap<String, Tensor>,
) -> Result<Vec<String>> {
    assert_eq!(params.len(), want.len(), "parameter count");
    let mut differ = Vec::new();
    for (name, w) in want {
        let Some(got) = params.get(name) else {
            panic!("no parameter {name}");
        };
        if tensor_bits(got)? != tensor_bits(w)? {
            differ.push(name.clone());
        }
    }
    Ok(differ)
}
