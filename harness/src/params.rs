//! The parameters a job ends with, against the single device's: training stays exact to
//! the last weight, not only in its losses.

use std::collections::HashMap;
use std::path::PathBuf;

use pipewise_common::job::{JobSpec, layout};
use pipewise_worker::Tensor;

use crate::Cluster;

/// Named parameter tensors.
pub type Params = HashMap<String, Tensor>;

/// `spec` trained on one device (as [`crate::reference_losses`] trains): every step's loss
/// and the final parameters.
pub fn reference(spec: &JobSpec) -> (Vec<f64>, Params) {
    use pipewise_worker::job::{corpus_of, optimizer_of, sampler_of};
    let device = pipewise_worker::Device::Cpu;
    let mut trainer =
        pipewise_worker::Trainer::new(&spec.model, spec.training.seed, &device, optimizer_of(spec))
            .expect("the reference trainer");
    let corpus = corpus_of(spec).expect("the job's data");
    let sampler = sampler_of(spec);
    let losses = (0..u64::from(spec.training.steps))
        .map(|step| {
            let batches = sampler
                .step(&corpus, step, spec.microbatches(), &device)
                .expect("a step's batches");
            trainer.train_step(&batches).expect("a reference step").loss
        })
        .collect();
    let params = trainer
        .stage()
        .params()
        .map(|p| (p.name.clone(), p.value.clone()))
        .collect();
    (losses, params)
}

impl Cluster {
    /// The final parameters `job`'s workers saved, from every data directory (each
    /// tensor once).
    pub fn final_params(&self, job: u64) -> Params {
        let mut all = Params::new();
        for data in self.data_dirs() {
            let dir: PathBuf = layout::final_dir(&layout::job_dir(&data.join("checkpoints"), job));
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries {
                let path = entry.expect("a final file").path();
                let part = candle_core::safetensors::load(&path, &pipewise_worker::Device::Cpu)
                    .expect("a final safetensors file");
                for (name, t) in part {
                    assert!(all.insert(name.clone(), t).is_none(), "{name} saved twice");
                }
            }
        }
        all
    }
}

/// The largest absolute difference between same-named tensors of `a` and `b` (in f32;
/// both must hold the same names).
pub fn max_param_diff(a: &Params, b: &Params) -> f64 {
    let names = |p: &Params| {
        p.keys()
            .cloned()
            .collect::<std::collections::BTreeSet<String>>()
    };
    assert_eq!(names(a), names(b), "the tensors differ");
    let f32 = |t: &Tensor| t.to_dtype(candle_core::DType::F32).expect("as f32");
    a.iter()
        .map(|(name, t)| {
            let d = (f32(t) - f32(&b[name]))
                .and_then(|d| d.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>())
                .expect("a difference");
            f64::from(d)
        })
        .fold(0.0, f64::max)
}
