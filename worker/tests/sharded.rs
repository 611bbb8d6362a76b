//! A sharded optimizer across data-parallel replicas (ZeRO-1 and ZeRO-2,
//! `data_parallel_shard_degree`): training gives the single device's bits, each worker
//! holds a shard of the optimizer state (and with ZeRO-2 of the summed gradients), its
//! checkpoints load on another layout, and a degree that does not fit is refused naming
//! the field.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use pipewise_common::generate::ScheduleKind;
use pipewise_common::job::JobSpec;
use pipewise_common::model::{DType as SpecDType, ModelSpec};
use pipewise_worker::optim::ZeroStage;
use pipewise_worker::runtime::{LocalOptions, LocalRun, Replica, WorkerRuntime, run_local};
use pipewise_worker::{Batch, Result};

use common::reference::{SEED, adamw, differing, reference, schedule};

const MICROBATCHES: u32 = 8;
const WORKERS: u32 = 2;

/// The compute tests' small model, with heads of 16, in `dtype`.
fn spec(dtype: SpecDType) -> ModelSpec {
    ModelSpec {
        heads: 2,
        dtype,
        ..common::small_spec(4)
    }
}

/// `replicas` copies of a 1F1B pipeline on [`WORKERS`] workers sharing `data`'s
/// microbatches, consecutive `shard_degree` of them sharding `zero_stage`.
fn run(
    spec: &ModelSpec,
    data: &[Vec<Batch>],
    (replicas, shard_degree, zero_stage): (u32, u32, ZeroStage),
    checkpoints: Option<(&Path, u64)>,
) -> Result<LocalRun> {
    let schedule = schedule(ScheduleKind::OneFOneB, WORKERS, 1, MICROBATCHES / replicas);
    let options = LocalOptions {
        replicas,
        shard_degree,
        zero_stage,
        checkpoints: checkpoints.map(|(dir, _)| dir),
        first_step: checkpoints.map_or(0, |(_, first)| first),
        ..LocalOptions::default()
    };
    run_local(&schedule, spec, SEED, adamw(), &Device::Cpu, data, options)
}

/// Every replica ends with the first's parameters, bit for bit.
fn assert_replicas_agree(run: &LocalRun, what: &str) -> Result<()> {
    for (r, other) in run.replica_params.iter().enumerate() {
        let differ = differing(other, &run.params)?;
        assert!(
            differ.is_empty(),
            "{what}: replica {} differs in {differ:?}",
            r + 1
        );
    }
    Ok(())
}

/// `params` and `losses` are the reference's bits (`want`), and the reference's losses
/// are the unsharded replicas' (`plain`).
fn assert_exact(
    what: &str,
    run: &LocalRun,
    want: &BTreeMap<String, Tensor>,
    plain: &[f32],
) -> Result<()> {
    let differ = differing(&run.params, want)?;
    eprintln!(
        "{what}: {} of {} parameters differ from the single device; losses {:?}",
        differ.len(),
        want.len(),
        run.losses
    );
    assert!(differ.is_empty(), "{what}: {differ:?} differ");
    assert_eq!(run.losses, plain, "{what}: losses");
    assert_replicas_agree(run, what)
}

/// ZeRO-1 and ZeRO-2 with S = 2 and 4 (d = 2), and S = 2 in each of R = 2 groups: the
/// losses are the unsharded replicas' and the parameters the single device's, bit for bit,
/// in f32 and in bf16 (whose master copies are what is sharded).
#[test]
fn sharded_optimizers_train_like_the_single_device() -> Result<()> {
    for dtype in [SpecDType::F32, SpecDType::BF16] {
        let spec = spec(dtype);
        let data = common::step_batches(&spec, 5, MICROBATCHES)?;
        let want = reference(&spec, &data)?.params;
        for zero in [ZeroStage::OptimizerState, ZeroStage::Gradients] {
            for (replicas, degree) in [(2, 2), (4, 4), (4, 2)] {
                let plain = run(&spec, &data, (replicas, 1, zero), None)?;
                assert!(differing(&plain.params, &want)?.is_empty(), "{dtype:?}");
                let sharded = run(&spec, &data, (replicas, degree, zero), None)?;
                let what = format!("{dtype:?} {zero:?} S={degree} of {replicas} copies");
                assert_exact(&what, &sharded, &want, &plain.losses)?;
            }
        }
    }
    Ok(())
}

/// With S = 4, every worker holds at most 0.30 of the optimizer bytes it holds unsharded;
/// with ZeRO-2 at most 0.30 of the summed gradients' too, with ZeRO-1 all of them.
#[test]
fn a_shard_holds_a_quarter_of_the_state() -> Result<()> {
    let spec = spec(SpecDType::BF16);
    let data = common::step_batches(&spec, 1, MICROBATCHES)?;
    let plain = run(&spec, &data, (4, 1, ZeroStage::OptimizerState), None)?;
    for zero in [ZeroStage::OptimizerState, ZeroStage::Gradients] {
        let sharded = run(&spec, &data, (4, 4, zero), None)?;
        for (w, (got, full)) in sharded
            .optimizer_bytes
            .iter()
            .zip(&plain.optimizer_bytes)
            .enumerate()
        {
            let ratio = |a: u64, b: u64| a as f64 / b as f64;
            let (opt, grads) = (
                ratio(got.optimizer, full.optimizer),
                ratio(got.summed_grads, full.summed_grads),
            );
            eprintln!(
                "{zero:?} S=4 worker {w}: optimizer {} of {} bytes ({opt:.3}), summed \
                 gradients {} of {} bytes ({grads:.3})",
                got.optimizer, full.optimizer, got.summed_grads, full.summed_grads
            );
            assert!(full.optimizer > 0 && opt <= 0.30, "worker {w}: {opt}");
            match zero {
                ZeroStage::OptimizerState => assert_eq!(grads, 1.0, "worker {w}"),
                ZeroStage::Gradients => assert!(grads <= 0.30, "worker {w}: {grads}"),
            }
        }
    }
    Ok(())
}

/// A checkpoint of an S = 4 ZeRO-2 run holds the whole state: it resumes on R = 2 without
/// sharding, and on S = 2 ZeRO-1, with the single device's bits.
#[test]
fn a_sharded_checkpoint_resumes_on_another_layout() -> Result<()> {
    let spec = spec(SpecDType::BF16);
    let data = common::step_batches(&spec, 6, MICROBATCHES)?;
    let want = reference(&spec, &data)?.params;
    let plain = run(&spec, &data, (2, 1, ZeroStage::OptimizerState), None)?;
    for (after, degree, zero) in [
        (2, 1, ZeroStage::OptimizerState),
        (2, 2, ZeroStage::OptimizerState),
    ] {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let first = run(
            &spec,
            &data[..3],
            (4, 4, ZeroStage::Gradients),
            Some((dir.path(), 0)),
        )?;
        let second = run(
            &spec,
            &data[3..],
            (after, degree, zero),
            Some((dir.path(), 3)),
        )?;
        let losses: Vec<f32> = first.losses.iter().chain(&second.losses).copied().collect();
        let what = format!("S=4 ZeRO-2 resumed on R={after} S={degree} {zero:?}");
        let merged = LocalRun { losses, ..second };
        assert_exact(&what, &merged, &want, &plain.losses)?;
    }
    Ok(())
}

/// A degree that does not fit the replicas, or ZeRO-2 of a tied table, is refused naming
/// the field; `zero_stage` has stages 1 and 2 only.
#[test]
fn a_degree_that_does_not_fit_is_refused() -> Result<()> {
    let spec = spec(SpecDType::F32);
    let data = common::step_batches(&spec, 1, MICROBATCHES)?;
    let refused = |replicas, degree, zero, spec: &ModelSpec| {
        run(spec, &data, (replicas, degree, zero), None)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    for (replicas, degree) in [(4, 0), (4, 3), (2, 4)] {
        let err = refused(replicas, degree, ZeroStage::OptimizerState, &spec);
        assert!(
            err.contains("data_parallel_shard_degree") && err.contains(&format!("{degree}")),
            "S={degree} of {replicas}: {err}"
        );
    }
    let tied = ModelSpec {
        tie_embeddings: true,
        ..common::small_llama(2)
    };
    let err = refused(2, 2, ZeroStage::Gradients, &tied);
    assert!(err.contains("zero_stage"), "{err}");
    let err = ZeroStage::from_number(3)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("zero_stage") && err.contains('3'), "{err}");
    Ok(())
}

/// bench/job.toml's model on d = 2 workers, S = 4 (4 copies, 8 workers): each worker's
/// optimizer bytes, and with ZeRO-2 its summed-gradient bytes, measured from the state it
/// holds, at most 0.30 of the unsharded worker's (printed per worker).
#[test]
fn the_bench_models_workers_hold_a_quarter_of_the_state() -> Result<()> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/job.toml"))
        .expect("bench/job.toml");
    let job = JobSpec::from_toml(&text).expect("bench/job.toml parses");
    let spec = job.model.clone();
    let schedule = schedule(ScheduleKind::OneFOneB, WORKERS, 1, MICROBATCHES / 4);
    let partition = spec.balanced_split(&schedule.placement)?;
    let worker = |w: u32, r: u32, shard: Option<ZeroStage>| -> Result<WorkerRuntime> {
        let mut rt =
            WorkerRuntime::new(w, &schedule, &spec, &partition, SEED, &Device::Cpu, adamw())?;
        rt.set_replica(Replica { index: r, count: 4 })?;
        if let Some(zero) = shard {
            rt.set_sharding(4, zero)?;
        }
        Ok(rt)
    };
    for zero in [ZeroStage::OptimizerState, ZeroStage::Gradients] {
        for w in 0..WORKERS {
            let full = worker(w, 0, None)?.optimizer_bytes();
            for r in 0..4 {
                let got = worker(w, r, Some(zero))?.optimizer_bytes();
                let opt = got.optimizer as f64 / full.optimizer as f64;
                let grads = got.summed_grads as f64 / full.summed_grads as f64;
                eprintln!(
                    "bench model {zero:?} S=4 d=2 worker {w} replica {r}: optimizer {} of {} \
                     bytes ({opt:.3}), summed gradients {} of {} bytes ({grads:.3})",
                    got.optimizer, full.optimizer, got.summed_grads, full.summed_grads
                );
                assert!(opt <= 0.30, "worker {w} replica {r}: {opt}");
                if zero == ZeroStage::Gradients {
                    assert!(grads <= 0.30, "worker {w} replica {r}: {grads}");
                }
            }
        }
    }
    Ok(())
}
