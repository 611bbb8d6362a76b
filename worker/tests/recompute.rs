//! Full activation recomputation: a stage that keeps only its input after `F` and runs `F`
//! again in `B` trains bit for bit like the single-device trainer, for both model families,
//! every schedule and 1, 2 and 4 workers, and holds less between a microbatch's `F` and `B`.

mod common;

use candle_core::Device;
use common::reference::{SEED, adamw, differing, reference, schedule};
use pipewise_common::generate::ScheduleKind;
use pipewise_common::model::ModelSpec;
use pipewise_worker::Result;
use pipewise_worker::runtime::{LocalOptions, LocalRun, run_local};

const MICROBATCHES: u32 = 8;
const STEPS: u64 = 3;

fn gpt(layers: u32) -> ModelSpec {
    ModelSpec {
        heads: 2,
        ..common::small_spec(layers)
    }
}

fn llama(layers: u32) -> ModelSpec {
    ModelSpec {
        heads: 2,
        kv_heads: Some(1),
        ..common::small_llama(layers)
    }
}

/// `kind` on `workers` workers with every stage recomputing (or none).
fn run(
    spec: &ModelSpec,
    kind: ScheduleKind,
    workers: u32,
    chunks: u32,
    all: bool,
) -> Result<LocalRun> {
    let data = common::step_batches(spec, STEPS, MICROBATCHES)?;
    let schedule = schedule(kind, workers, chunks, MICROBATCHES);
    let stages: Vec<u32> = if all {
        (0..schedule.placement.stages()).collect()
    } else {
        Vec::new()
    };
    let options = LocalOptions {
        recompute: &stages,
        ..LocalOptions::default()
    };
    run_local(&schedule, spec, SEED, adamw(), &Device::Cpu, &data, options)
}

/// Recomputing on every stage gives the reference's losses and parameters, bit for bit.
fn matches_reference(
    spec: &ModelSpec,
    kind: ScheduleKind,
    workers: u32,
    chunks: u32,
) -> Result<()> {
    let data = common::step_batches(spec, STEPS, MICROBATCHES)?;
    let want = reference(spec, &data)?;
    let got = run(spec, kind, workers, chunks, true)?;
    let losses: Vec<f32> = want.losses.iter().map(|&l| l as f32).collect();
    let what = format!("{:?} {kind} on {workers}", spec.family);
    assert_eq!(got.losses, losses, "{what}: losses");
    let differ = differing(&got.params, &want.params)?;
    assert!(differ.is_empty(), "{what}: parameters differ: {differ:?}");
    Ok(())
}

macro_rules! exact {
    ($name:ident, $kind:expr, $workers:expr, $chunks:expr) => {
        #[test]
        fn $name() -> Result<()> {
            matches_reference(&gpt(8), $kind, $workers, $chunks)?;
            matches_reference(&llama(8), $kind, $workers, $chunks)
        }
    };
}

exact!(one_worker, ScheduleKind::OneFOneB, 1, 1);
exact!(gpipe_2, ScheduleKind::GPipe, 2, 1);
exact!(one_f1b_2, ScheduleKind::OneFOneB, 2, 1);
exact!(one_f1b_4, ScheduleKind::OneFOneB, 4, 1);
exact!(interleaved_4, ScheduleKind::Interleaved1F1B, 4, 2);
exact!(zb_h1_4, ScheduleKind::ZbH1, 4, 1);
exact!(zb_h2_4, ScheduleKind::ZbH2, 4, 1);
exact!(v_min_4, ScheduleKind::VMin, 4, 1);
exact!(v_half_2, ScheduleKind::VHalf, 2, 1);
exact!(v_half_4, ScheduleKind::VHalf, 4, 1);
exact!(v_zb_4, ScheduleKind::VZb, 4, 1);

/// Between a microbatch's `F` and `B` a recomputing stage holds its input only, and during
/// `B` one microbatch's rebuilt activations: on 1F1B the first worker (4 microbatches in
/// flight) peaks at a fraction of what it holds keeping every activation.
#[test]
fn recomputing_holds_less() -> Result<()> {
    let spec = gpt(8);
    let peak = |run: &LocalRun| -> u64 {
        run.reports
            .iter()
            .map(|step| step[0].peak_stash_bytes)
            .max()
            .unwrap_or(0)
    };
    let kept = peak(&run(&spec, ScheduleKind::OneFOneB, 4, 1, false)?);
    let recomputed = peak(&run(&spec, ScheduleKind::OneFOneB, 4, 1, true)?);
    eprintln!("1F1B d=4, worker 0's peak stash: kept {kept} B, recomputed {recomputed} B");
    assert!(
        recomputed > 0,
        "a recomputed B holds its rebuilt activations"
    );
    assert!(
        2 * recomputed < kept,
        "recomputing peaked at {recomputed} B against {kept} B kept"
    );
    Ok(())
}
