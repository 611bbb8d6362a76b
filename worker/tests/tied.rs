//! Tied embeddings (a Llama whose LM head is its embedding table): the embedding and the
//! head each hold a copy, their gradients are summed every step and both take the same
//! update. The gradient is the shared parameter's (candle's autograd), the norm counts the
//! table once, every schedule on 1, 2, 4 and 8 workers (and data-parallel replicas) trains
//! bit for bit like the single-device trainer, the copies stay bit-identical, and a run
//! resumed from its checkpoint on another placement goes on exactly.

mod common;

use std::collections::BTreeMap;

use candle_core::{Device, Tensor};
use pipewise_common::generate::ScheduleKind;
use pipewise_common::model::ModelSpec;
use pipewise_worker::checkpoint::tensor_bits;
use pipewise_worker::runtime::{LocalOptions, LocalRun, run_local};
use pipewise_worker::{AdamW, Batch, Result, Stage, Trainer};

use common::reference::{CLIP, Reference, SEED, adamw, differing, reference, schedule};
const MICROBATCHES: u32 = 8;
const STEPS: u64 = 5;

/// The tied Llama of these tests: heads of 16, 2 query heads sharing 1 key/value head.
fn tied(layers: u32) -> ModelSpec {
    ModelSpec {
        heads: 2,
        kv_heads: Some(1),
        tie_embeddings: true,
        ..common::small_llama(layers)
    }
}

/// The head's copy of the table, transposed back, has the embedding's bits.
fn assert_copies_equal(params: &BTreeMap<String, Tensor>, who: &str) -> Result<()> {
    let table = &params["embedding.wte"];
    let head = params["head.lm_head.weight"].t()?.contiguous()?;
    assert_eq!(
        tensor_bits(table)?,
        tensor_bits(&head)?,
        "{who}: the two copies of the tied table differ"
    );
    Ok(())
}

/// `run`'s losses (f32 means) and parameters are the reference's bit for bit.
fn assert_bit_identical(what: &str, run: &LocalRun, reference: &Reference) -> Result<()> {
    let want: Vec<f32> = reference.losses.iter().map(|&l| l as f32).collect();
    assert_eq!(run.losses, want, "{what}: losses");
    let differ = differing(&run.params, &reference.params)?;
    assert!(differ.is_empty(), "{what}: parameters differ: {differ:?}");
    assert_copies_equal(&run.params, what)
}

/// Trains [`STEPS`] steps of `kind` on `workers` workers: the reference trainer's losses,
/// gradient norms and parameters, the two copies equal.
fn matches_reference(kind: ScheduleKind, workers: u32, chunks: u32, layers: u32) -> Result<()> {
    let spec = tied(layers);
    let data = common::step_batches(&spec, STEPS, MICROBATCHES)?;
    let reference = reference(&spec, &data)?;
    assert_copies_equal(&reference.params, "the reference")?;
    let clipped = reference.grad_norms.iter().filter(|&&g| g > CLIP).count();
    assert!(
        clipped > 0 && clipped < reference.grad_norms.len(),
        "some steps should be clipped, some not: {:?}",
        reference.grad_norms
    );
    let schedule = schedule(kind, workers, chunks, MICROBATCHES);
    let run = run_local(
        &schedule,
        &spec,
        SEED,
        adamw(),
        &Device::Cpu,
        &data,
        LocalOptions::default(),
    )?;
    let norm_diff = run
        .reports
        .iter()
        .zip(&reference.grad_norms)
        .flat_map(|(all, &want)| all.iter().map(move |r| (r.grad_norm - want).abs()))
        .fold(0.0, f64::max);
    eprintln!(
        "tied {kind:>16} d={workers} stages={}: max |Δgrad norm| {norm_diff:.2e}, norms \
         {:.3?}, losses {:.4} → {:.4}",
        schedule.placement.stages(),
        reference.grad_norms,
        reference.losses[0],
        reference.losses[reference.losses.len() - 1],
    );
    assert!(
        norm_diff <= 1e-9,
        "{kind}: gradient norms differ by {norm_diff}"
    );
    assert_bit_identical(&format!("{kind} on {workers}"), &run, &reference)
}

macro_rules! tied {
    ($name:ident, $kind:expr, $workers:expr, $chunks:expr, $layers:expr) => {
        #[test]
        fn $name() -> Result<()> {
            matches_reference($kind, $workers, $chunks, $layers)
        }
    };
}

tied!(gpipe, ScheduleKind::GPipe, 4, 1, 8);
tied!(one_f1b, ScheduleKind::OneFOneB, 4, 1, 8);
tied!(interleaved, ScheduleKind::Interleaved1F1B, 4, 2, 8);
tied!(zb_h1, ScheduleKind::ZbH1, 4, 1, 8);
tied!(zb_h2, ScheduleKind::ZbH2, 4, 1, 8);
tied!(v_min, ScheduleKind::VMin, 4, 1, 8);
tied!(v_half, ScheduleKind::VHalf, 4, 1, 8);
tied!(v_zb, ScheduleKind::VZb, 4, 1, 8);
tied!(adaptive_v, ScheduleKind::AdaptiveV, 4, 1, 8);
tied!(one_f1b_1_worker, ScheduleKind::OneFOneB, 1, 1, 8);
tied!(one_f1b_2_workers, ScheduleKind::OneFOneB, 2, 1, 8);
tied!(one_f1b_8_workers, ScheduleKind::OneFOneB, 8, 1, 14);
tied!(v_half_2_workers, ScheduleKind::VHalf, 2, 1, 8);
tied!(v_half_8_workers, ScheduleKind::VHalf, 8, 1, 14);

/// One step's gradient is the shared parameter's: candle's autograd of the whole model with
/// the head's and the embedding's table as two variables of equal value gives each its
/// part, and the trainer's gradient norm is that of the sum counted once (the table's
/// elements in the norm once, not twice).
#[test]
fn the_gradient_is_the_shared_tables() -> Result<()> {
    let spec = tied(2);
    let data = common::step_batches(&spec, 1, 3)?;
    let whole = Stage::whole(&spec, SEED, &Device::Cpu)?;
    let oracle = common::Oracle::new(&whole)?;
    let pairs: Vec<(Tensor, Tensor)> = data[0]
        .iter()
        .map(|b| (b.tokens.clone(), b.targets.clone()))
        .collect();
    let want = oracle.step(&pairs)?;
    let sq = |t: &Tensor| -> Result<f64> {
        Ok(t.to_dtype(candle_core::DType::F64)?
            .sqr()?
            .sum_all()?
            .to_scalar::<f64>()?)
    };
    let table =
        (&want.param_grads["embedding.wte"] + want.param_grads["head.lm_head.weight"].t()?)?;
    let mut once = sq(&table)?;
    for (name, g) in &want.param_grads {
        if name != "embedding.wte" && name != "head.lm_head.weight" {
            once += sq(g)?;
        }
    }
    let twice = once + sq(&table)?;
    let optimizer = AdamW {
        max_grad_norm: None,
        ..adamw()
    };
    let mut trainer = Trainer::new(&spec, SEED, &Device::Cpu, optimizer)?;
    let norm = trainer.train_step(&data[0])?.grad_norm;
    let (once, twice) = (once.sqrt(), twice.sqrt());
    eprintln!("tied gradient norm {norm:.6}: autograd's {once:.6} (the table twice: {twice:.6})");
    assert!((norm - once).abs() <= 1e-5 * once, "{norm} vs {once}");
    assert!((twice - once) > 1e-2 * once, "the table's share is visible");
    let params: BTreeMap<String, Tensor> = trainer
        .stage()
        .params()
        .map(|p| (p.name.clone(), p.value.clone()))
        .collect();
    assert_copies_equal(&params, "after one step")
}

/// Two data-parallel replicas, each summing its own two copies after the replicas' sums:
/// the reference's bits, on both replicas.
#[test]
fn replicas_match_the_reference() -> Result<()> {
    const REPLICAS: u32 = 2;
    let spec = tied(4);
    let data = common::step_batches(&spec, STEPS, MICROBATCHES)?;
    let reference = reference(&spec, &data)?;
    for (kind, workers, chunks) in [
        (ScheduleKind::OneFOneB, 2, 1),
        (ScheduleKind::VHalf, 2, 1),
        (ScheduleKind::Interleaved1F1B, 2, 2),
    ] {
        let schedule = schedule(kind, workers, chunks, MICROBATCHES / REPLICAS);
        let options = LocalOptions {
            replicas: REPLICAS,
            ..LocalOptions::default()
        };
        let run = run_local(
            &schedule,
            &spec,
            SEED,
            adamw(),
            &Device::Cpu,
            &data,
            options,
        )?;
        let what = format!("{kind} R={REPLICAS} d={workers}");
        assert_bit_identical(&what, &run, &reference)?;
        for other in &run.replica_params {
            let differ = differing(other, &run.params)?;
            assert!(differ.is_empty(), "{what}: replicas differ: {differ:?}");
        }
    }
    Ok(())
}

/// A tied run saves both copies with their moments; one resumed from its checkpoint on
/// another placement (the embedding and the head on one worker before, on two after, or
/// the other way) goes on bit for bit.
fn resumes_exactly(before: ScheduleKind, after: ScheduleKind) -> Result<()> {
    let (cut, total) = (2, 5);
    let spec = tied(8);
    let data = common::step_batches(&spec, total, MICROBATCHES)?;
    let reference = reference(&spec, &data)?;
    let folder = std::env::temp_dir().join(format!(
        "pipewise-tied-{before}-{after}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&folder);
    let run = |kind, steps: &[Vec<Batch>], first_step| {
        let options = LocalOptions {
            first_step,
            checkpoints: Some(&folder),
            ..LocalOptions::default()
        };
        let schedule = schedule(kind, 2, 1, MICROBATCHES);
        run_local(
            &schedule,
            &spec,
            SEED,
            adamw(),
            &Device::Cpu,
            steps,
            options,
        )
    };
    let first = run(before, &data[..cut], 0)?;
    let mut second = run(after, &data[cut..], cut as u64)?;
    let _ = std::fs::remove_dir_all(&folder);
    second.losses = first.losses.iter().chain(&second.losses).copied().collect();
    assert_bit_identical(&format!("{before} → {after}"), &second, &reference)
}

#[test]
fn v_half_resumes_as_1f1b() -> Result<()> {
    resumes_exactly(ScheduleKind::VHalf, ScheduleKind::OneFOneB)
}

#[test]
fn one_f1b_resumes_as_v_half() -> Result<()> {
    resumes_exactly(ScheduleKind::OneFOneB, ScheduleKind::VHalf)
}

/// A stage holding both copies refuses a checkpoint whose two tables differ (an untied
/// model's, whose sizes and names are the same) and takes a tied one's.
#[test]
fn an_untied_checkpoint_does_not_load_as_tied() -> Result<()> {
    let folder = std::env::temp_dir().join(format!("pipewise-tied-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&folder).map_err(|e| pipewise_worker::Error::Io {
        path: folder.clone(),
        source: e,
    })?;
    let (untied_file, tied_file) = (
        folder.join("untied.safetensors"),
        folder.join("tied.safetensors"),
    );
    let untied = ModelSpec {
        tie_embeddings: false,
        ..tied(2)
    };
    Stage::whole(&untied, SEED, &Device::Cpu)?.save_checkpoint(&untied_file)?;
    Stage::whole(&tied(2), SEED + 1, &Device::Cpu)?.save_checkpoint(&tied_file)?;
    let mut stage = Stage::whole(&tied(2), SEED, &Device::Cpu)?;
    let refused = stage
        .load_checkpoint(&untied_file)
        .map_err(|e| e.to_string());
    let taken = stage.load_checkpoint(&tied_file);
    let _ = std::fs::remove_dir_all(&folder);
    let err = refused.expect_err("an untied checkpoint");
    assert!(err.contains("copies of the tied table"), "{err}");
    taken
}
