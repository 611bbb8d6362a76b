//! A job re-planned between steps resumes exactly: trained for some steps under one plan,
//! saved, and resumed under another (a V placement and one stage per worker, either way),
//! it ends with the single-device reference's losses and parameters.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use candle_core::{Device, Tensor};
use pipewise_common::generate::{Request, ScheduleKind, generate};
use pipewise_common::model::{DType as SpecDType, ModelSpec};
use pipewise_common::schedule::Schedule;
use pipewise_worker::runtime::{LocalOptions, LocalRun, run_local_with};
use pipewise_worker::test_utils::max_abs_diff;
use pipewise_worker::{AdamW, Batch, Result, Trainer};

const SEED: u64 = 7;
const MICROBATCHES: u32 = 8;
const TOLERANCE: f64 = 1e-5;

fn spec() -> ModelSpec {
    ModelSpec {
        vocab: 256,
        hidden: 32,
        heads: 2,
        layers: 14,
        seq_len: 16,
        dtype: SpecDType::F32,
    }
}

fn adamw() -> AdamW {
    AdamW {
        lr: 3e-3,
        weight_decay: 0.1,
        max_grad_norm: Some(1.0),
        ..AdamW::default()
    }
}

fn reference(
    spec: &ModelSpec,
    steps: &[Vec<Batch>],
) -> Result<(Vec<f64>, BTreeMap<String, Tensor>)> {
    let mut trainer = Trainer::new(spec, SEED, &Device::Cpu, adamw())?;
    let mut losses = Vec::new();
    for batches in steps {
        losses.push(trainer.train_step(batches)?.loss);
    }
    let params = trainer
        .stage()
        .params()
        .map(|p| (p.name.clone(), p.value.clone()))
        .collect();
    Ok((losses, params))
}

fn schedule(kind: ScheduleKind, workers: u32) -> Schedule {
    generate(&Request::new(kind, workers, MICROBATCHES)).expect("a schedule")
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pipewise-replan-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("a temporary directory");
    d
}

fn run(
    schedule: &Schedule,
    spec: &ModelSpec,
    steps: &[Vec<Batch>],
    first_step: u64,
    resume: Option<&std::path::Path>,
    save: Option<&std::path::Path>,
) -> Result<LocalRun> {
    run_local_with(
        schedule,
        spec,
        SEED,
        adamw(),
        &Device::Cpu,
        steps,
        LocalOptions {
            resume,
            first_step,
            save,
            ..LocalOptions::default()
        },
    )
}

/// `before` for `cut` steps, then `after` from the saved stages for the rest.
fn moved(
    before: ScheduleKind,
    after: ScheduleKind,
    workers: u32,
    cut: usize,
    total: u64,
) -> Result<()> {
    let spec = spec();
    let data = common::step_batches(&spec, total, MICROBATCHES)?;
    let (ref_losses, ref_params) = reference(&spec, &data)?;
    let saved = dir(&format!("{before}-{after}"));
    let first = run(
        &schedule(before, workers),
        &spec,
        &data[..cut],
        0,
        None,
        Some(&saved),
    )?;
    let second = run(
        &schedule(after, workers),
        &spec,
        &data[cut..],
        cut as u64,
        Some(&saved),
        None,
    )?;
    let straight = run(&schedule(after, workers), &spec, &data, 0, None, None)?;
    let losses: Vec<f32> = first.losses.iter().chain(&second.losses).copied().collect();
    let loss_diff = losses
        .iter()
        .zip(&ref_losses)
        .map(|(&a, &b)| (f64::from(a) - b).abs())
        .fold(0.0, f64::max);
    let mut param_diff: f64 = 0.0;
    let mut straight_diff: f64 = 0.0;
    for (name, want) in &ref_params {
        param_diff = param_diff.max(max_abs_diff(&second.params[name], want)?);
        straight_diff = straight_diff.max(max_abs_diff(&straight.params[name], want)?);
    }
    eprintln!(
        "{before} → {after} after {cut} of {total} steps on {workers} workers: max |Δloss| \
         {loss_diff:.2e}, max |Δparam| {param_diff:.2e} ({after} straight: {straight_diff:.2e})"
    );
    let _ = std::fs::remove_dir_all(&saved);
    assert!(loss_diff <= TOLERANCE, "losses differ by {loss_diff}");
    assert!(param_diff <= TOLERANCE, "parameters differ by {param_diff}");
    Ok(())
}

#[test]
fn v_half_to_one_f1b() -> Result<()> {
    moved(ScheduleKind::VHalf, ScheduleKind::OneFOneB, 2, 4, 12)
}

#[test]
fn one_f1b_to_v_half() -> Result<()> {
    moved(ScheduleKind::OneFOneB, ScheduleKind::VHalf, 2, 4, 12)
}

#[test]
fn zb_h1_to_v_zb() -> Result<()> {
    moved(ScheduleKind::ZbH1, ScheduleKind::VZb, 2, 4, 12)
}
