//! Activation recomputation: a stage under `selective` (per block its input, attention
//! output and log-sum-exp) or `full` (its input only) trains bit for bit like the
//! single-device trainer, for both model families, every schedule and 1, 2 and 4 workers;
//! it holds less between a microbatch's `F` and `B`, and what selective keeps is what the
//! planner's memory model says.

mod common;

use candle_core::Device;
use common::reference::{SEED, adamw, differing, reference, schedule};
use pipewise_common::generate::ScheduleKind;
use pipewise_common::model::ModelSpec;
use pipewise_common::placement::Placement;
use pipewise_common::schedule::{Recompute, RecomputeShares};
use pipewise_worker::runtime::{LocalOptions, LocalRun, run_local};
use pipewise_worker::{Result, Stage};

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

/// `kind` on `workers` workers with every stage under `mode`.
fn run(
    spec: &ModelSpec,
    kind: ScheduleKind,
    workers: u32,
    chunks: u32,
    mode: Recompute,
) -> Result<LocalRun> {
    let data = common::step_batches(spec, STEPS, MICROBATCHES)?;
    let schedule = schedule(kind, workers, chunks, MICROBATCHES);
    let modes = vec![mode; schedule.placement.stages() as usize];
    let options = LocalOptions {
        recompute: &modes,
        ..LocalOptions::default()
    };
    run_local(&schedule, spec, SEED, adamw(), &Device::Cpu, &data, options)
}

/// Recomputing on every stage, selectively and fully, gives the reference's losses and
/// parameters, bit for bit.
fn matches_reference(
    spec: &ModelSpec,
    kind: ScheduleKind,
    workers: u32,
    chunks: u32,
) -> Result<()> {
    let data = common::step_batches(spec, STEPS, MICROBATCHES)?;
    let want = reference(spec, &data)?;
    let losses: Vec<f32> = want.losses.iter().map(|&l| l as f32).collect();
    for mode in [Recompute::Selective, Recompute::Full] {
        let got = run(spec, kind, workers, chunks, mode)?;
        let what = format!("{:?} {kind} on {workers}, {mode}", spec.family);
        assert_eq!(got.losses, losses, "{what}: losses");
        let differ = differing(&got.params, &want.params)?;
        assert!(differ.is_empty(), "{what}: parameters differ: {differ:?}");
    }
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

/// Each stage its own mode (full, selective, none, in turn), as auto's plans recompute only
/// where a worker needs it: the reference's losses and parameters, bit for bit.
#[test]
fn modes_differing_by_stage_match_the_reference() -> Result<()> {
    for spec in [gpt(8), llama(8)] {
        let data = common::step_batches(&spec, STEPS, MICROBATCHES)?;
        let want = reference(&spec, &data)?;
        let losses: Vec<f32> = want.losses.iter().map(|&l| l as f32).collect();
        for (kind, workers) in [(ScheduleKind::OneFOneB, 4), (ScheduleKind::VHalf, 2)] {
            let schedule = schedule(kind, workers, 1, MICROBATCHES);
            let stages = schedule.placement.stages() as usize;
            let modes: Vec<Recompute> = (0..stages)
                .map(|s| [Recompute::Full, Recompute::Selective, Recompute::None][s % 3])
                .collect();
            let options = LocalOptions {
                recompute: &modes,
                ..LocalOptions::default()
            };
            let got = run_local(
                &schedule,
                &spec,
                SEED,
                adamw(),
                &Device::Cpu,
                &data,
                options,
            )?;
            let what = format!("{:?} {kind} on {workers}, {modes:?}", spec.family);
            assert_eq!(got.losses, losses, "{what}: losses");
            let differ = differing(&got.params, &want.params)?;
            assert!(differ.is_empty(), "{what}: parameters differ: {differ:?}");
        }
    }
    Ok(())
}

/// Worker 0's largest peak stash over the steps of `run`.
fn worker0_peak(run: &LocalRun) -> u64 {
    run.reports
        .iter()
        .map(|step| step[0].peak_stash_bytes)
        .max()
        .unwrap_or(0)
}

/// On 1F1B over 4 workers the first worker has 4 microbatches in flight: selective holds
/// per block its input, attention output and log-sum-exp for each of them, full only the
/// stage's input, and each a `B`'s rebuilt activations while it runs; selective peaks under
/// 0.70 of keeping everything and full under 0.30 of it.
#[test]
fn recomputing_holds_less() -> Result<()> {
    for spec in [gpt(8), llama(8)] {
        let [none, selective, full] = [Recompute::None, Recompute::Selective, Recompute::Full]
            .map(|mode| run(&spec, ScheduleKind::OneFOneB, 4, 1, mode).map(|r| worker0_peak(&r)));
        let (none, selective, full) = (none?, selective?, full?);
        let share = |b: u64| b as f64 / none as f64;
        eprintln!(
            "{:?}, 1F1B d=4, worker 0's peak stash: none {none} B, selective {selective} B \
             ({:.3}), full {full} B ({:.3})",
            spec.family,
            share(selective),
            share(full)
        );
        assert!(full > 0, "a recomputed B holds its rebuilt activations");
        assert!(full < selective, "full {full} B, selective {selective} B");
        assert!(selective < none, "selective {selective} B, none {none} B");
        assert!(
            share(selective) <= 0.70,
            "selective at {}",
            share(selective)
        );
        assert!(share(full) <= 0.30, "full at {}", share(full));
    }
    Ok(())
}

/// What one microbatch's `F` leaves stashed on the stage of `pieces` under `mode`.
fn kept_after_forward(
    spec: &ModelSpec,
    pieces: std::ops::Range<usize>,
    mode: Recompute,
) -> Result<u64> {
    let mut stage = Stage::new(spec, pieces, SEED, &Device::Cpu)?;
    stage.set_recompute(mode);
    let (ids, targets) = common::tokens(spec, 2, 0, &Device::Cpu)?;
    let mut x = ids;
    if !stage.is_first() {
        let h = spec.hidden as usize;
        x = candle_core::Tensor::ones((2, spec.seq_len as usize, h), stage.dtype(), &Device::Cpu)?;
    }
    stage.forward(0, &x, Some(&targets))?;
    Ok(stage.stash_bytes())
}

/// The planner's memory model ([`RecomputeShares::of_stage`]) gives the share of a stage's
/// stash that selective and full keep within 5 % of what the worker keeps, on every stage
/// of a 4-way split of both families: what selective keeps is what the table says.
#[test]
fn kept_shares_are_the_planners() -> Result<()> {
    for spec in [gpt(8), llama(8), common::small_spec(3)] {
        let split = spec.balanced_split(&Placement::OnePerWorker { workers: 4 })?;
        for pieces in split {
            let kept = |mode| kept_after_forward(&spec, pieces.clone(), mode);
            let none = kept(Recompute::None)? as f64;
            let want = spec.range_activation_bytes(pieces.clone(), 2).after_forward as f64;
            assert_eq!(none, want, "{pieces:?}: none keeps the planner's stash");
            let shares = RecomputeShares::of_stage(&spec, pieces.clone(), 2);
            for mode in [Recompute::Selective, Recompute::Full] {
                let measured = kept(mode)? as f64 / none;
                let planned = shares.keep(mode);
                eprintln!(
                    "{:?} {pieces:?} {mode}: keeps {measured:.4} of the stash, planned \
                     {planned:.4}",
                    spec.family
                );
                assert!(
                    (measured - planned).abs() <= 0.05 * measured,
                    "{:?} {pieces:?} {mode}: keeps {measured:.4}, planned {planned:.4}",
                    spec.family
                );
            }
        }
    }
    Ok(())
}

/// 1F1B's last worker runs each microbatch's `B` right after its `F`: rebuilding would save
/// nothing, so under every mode it keeps the whole stash and peaks as keeping everything
/// does (rebuilding, it would hold the kept input beside the rebuilt stash, more than none).
#[test]
fn a_backward_right_after_its_forward_keeps_the_whole_stash() -> Result<()> {
    for spec in [gpt(8), llama(8)] {
        let last_peak = |mode| -> Result<u64> {
            let r = run(&spec, ScheduleKind::OneFOneB, 4, 1, mode)?;
            Ok(r.reports
                .iter()
                .map(|s| s[3].peak_stash_bytes)
                .max()
                .unwrap_or(0))
        };
        let none = last_peak(Recompute::None)?;
        assert!(none > 0);
        for mode in [Recompute::Selective, Recompute::Full] {
            assert_eq!(last_peak(mode)?, none, "{:?}, {mode}", spec.family);
        }
    }
    Ok(())
}
