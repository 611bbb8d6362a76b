//! The single device's parameters, which a pipelined run's final parameters must equal: the
//! sequential reference, the same model summing each step's gradients share by share (as
//! data-parallel replicas do) or with its microbatches reordered, and the final parameters
//! a job left in the cluster's data directories.

use std::collections::HashMap;
use std::path::PathBuf;

use pipewise_common::job::{JobSpec, layout};
use pipewise_worker::job::{corpus_of, optimizer_of, sampler_of};
use pipewise_worker::{Corpus, Device, Sampler, Tensor, Trainer, clip_scale};

use crate::Cluster;

/// Parameters by their whole-model name.
pub type Params = HashMap<String, Tensor>;

/// Every step's loss and the final parameters of a single device.
pub type Reference = (Vec<f64>, Params);

/// The single-device trainer of `spec` on the CPU, with the job's data.
fn single_device(spec: &JobSpec) -> (Trainer, Corpus, Sampler) {
    let trainer = Trainer::new(
        &spec.model,
        spec.training.seed,
        &Device::Cpu,
        optimizer_of(spec),
    )
    .expect("the reference trainer");
    (
        trainer,
        corpus_of(spec).expect("the job's data"),
        sampler_of(spec),
    )
}

fn params_of(trainer: &Trainer) -> Params {
    trainer
        .stage()
        .params()
        .map(|p| (p.name.clone(), p.value.clone()))
        .collect()
}

/// `spec` trained on one device, each step's microbatches in the order `arrange` leaves
/// them: the losses and the final parameters.
fn trained(spec: &JobSpec, arrange: impl Fn(&mut Vec<pipewise_worker::Batch>)) -> Reference {
    let (mut trainer, corpus, sampler) = single_device(spec);
    let n = spec.microbatches();
    let losses = (0..u64::from(spec.training.steps))
        .map(|step| {
            let mut batches = sampler
                .step(&corpus, step, n, &Device::Cpu)
                .expect("a step's batches");
            arrange(&mut batches);
            trainer.train_step(&batches).expect("a reference step").loss
        })
        .collect();
    (losses, params_of(&trainer))
}

/// [`crate::reference_losses`] with the final parameters.
pub fn reference(spec: &JobSpec) -> Reference {
    trained(spec, |_| {})
}

/// The single device with each step's microbatches' halves swapped (the same math summed in
/// another order): its largest loss and parameter differences from [`reference`].
pub fn reordered_floor(spec: &JobSpec) -> (f64, f64) {
    let half = spec.microbatches() as usize / 2;
    let (losses, params) = trained(spec, |batches| batches.rotate_left(half));
    let (ref_losses, ref_params) = reference(spec);
    (
        max_loss_diff(&losses, &ref_losses),
        max_param_diff(&params, &ref_params),
    )
}

/// The single device summing each step's microbatch gradients share by share, as
/// data-parallel replicas sum them: `shares` equal shares, each summed from zero in
/// microbatch order, then the shares in order. The losses and final parameters.
pub fn summed_by_shares(spec: &JobSpec, shares: usize) -> Reference {
    let (mut trainer, corpus, sampler) = single_device(spec);
    let n = spec.microbatches();
    let max_norm = trainer.stage().optimizer().max_grad_norm;
    let stage = trainer.stage_mut();
    let mut losses = Vec::new();
    for step in 0..u64::from(spec.training.steps) {
        let batches = sampler
            .step(&corpus, step, n, &Device::Cpu)
            .expect("a step's batches");
        stage.set_microbatches(n);
        let mut loss = 0.0;
        let mut sum: Vec<f64> = Vec::new();
        for (r, share) in batches.chunks(n as usize / shares).enumerate() {
            for (k, b) in share.iter().enumerate() {
                let mb = (r * share.len() + k) as u32;
                let l = stage
                    .forward(mb, &b.tokens, Some(&b.targets))
                    .expect("a forward pass");
                loss += f64::from(l.to_scalar::<f32>().expect("a scalar loss"));
                stage.backward(mb, None).expect("a backward pass");
            }
            let g = stage.flat_grads().expect("the share's gradients");
            stage
                .set_flat_grads(&vec![0.0; g.len()])
                .expect("gradients cleared");
            if sum.is_empty() {
                sum = g;
            } else {
                sum.iter_mut().zip(&g).for_each(|(a, b)| *a += b);
            }
        }
        stage.set_flat_grads(&sum).expect("the summed gradients");
        let scale = clip_scale(stage.grad_sq_norm().expect("a gradient norm"), max_norm);
        stage.optimizer_step(scale).expect("an optimizer step");
        losses.push(loss / f64::from(n));
    }
    let params = stage
        .params()
        .map(|p| (p.name.clone(), p.value.clone()))
        .collect();
    (losses, params)
}

/// The largest difference of two loss lists of one length.
pub fn max_loss_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "loss counts differ");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// The largest elementwise difference of two parameter sets with the same names.
pub fn max_param_diff(a: &Params, b: &Params) -> f64 {
    assert_eq!(a.len(), b.len(), "tensor counts differ");
    let as_f32 = |t: &Tensor| {
        t.to_dtype(pipewise_worker::CandleDType::F32)
            .expect("an f32 copy")
    };
    a.iter()
        .map(|(name, t)| {
            let u = b.get(name).unwrap_or_else(|| panic!("{name} missing"));
            assert_eq!(t.dtype(), u.dtype(), "{name}");
            let d = (as_f32(t) - as_f32(u))
                .and_then(|d| d.abs())
                .and_then(|d| d.flatten_all())
                .and_then(|d| d.max(0))
                .and_then(|d| d.to_scalar::<f32>())
                .expect("a difference");
            f64::from(d)
        })
        .fold(0.0, f64::max)
}

impl Cluster {
    /// The `final/` directories of `job` in the cluster's data directories that exist.
    fn final_dirs(&self, job: u64) -> Vec<PathBuf> {
        self.data_dirs()
            .into_iter()
            .map(|data| layout::final_dir(&layout::job_dir(&data.join("checkpoints"), job)))
            .filter(|dir| dir.is_dir())
            .collect()
    }

    /// The files of `job`'s final parameters (one per worker of its last run).
    pub fn final_files(&self, job: u64) -> usize {
        self.final_dirs(job)
            .iter()
            .filter_map(|dir| std::fs::read_dir(dir).ok())
            .map(Iterator::count)
            .sum()
    }

    /// `job`'s final parameters, gathered from every data directory (call before
    /// [`Cluster::shutdown`], which removes them).
    pub fn final_params(&self, job: u64) -> Params {
        let mut all = Params::new();
        for dir in self.final_dirs(job) {
            for entry in std::fs::read_dir(&dir).expect("the final directory") {
                let path = entry.expect("a final file").path();
                let part = candle_core::safetensors::load(&path, &Device::Cpu)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                for (name, t) in part {
                    assert!(all.insert(name.clone(), t).is_none(), "{name} saved twice");
                }
            }
        }
        all
    }

    /// Asserts `job`'s final parameters are within `tolerance` of `reference`'s; the largest
    /// difference.
    pub fn assert_params(&self, job: u64, reference: &Params, tolerance: f64) -> f64 {
        let diff = max_param_diff(reference, &self.final_params(job));
        assert!(diff <= tolerance, "job {job}: |Δparam| {diff:e}");
        diff
    }
}
