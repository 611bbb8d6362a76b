//! `[validation]` through the pipeline: the held-out loss is the same bits on any worker
//! count, schedule and replicas, equals the whole model's loss over the same windows, and
//! training with it gives the same bits as training without it.

mod common;

use candle_core::{DType, Device};
use pipewise_common::generate::{Request, ScheduleKind, generate};
use pipewise_common::model::ModelSpec;
use pipewise_worker::runtime::{LocalOptions, LocalRun, ValidationSet, run_local};
use pipewise_worker::{AdamW, Batch, Corpus, Result, Stage};

const SEED: u64 = 7;
/// Microbatches of a step (over every replica), of [`MB_SIZE`] sequences.
const MICROBATCHES: u32 = 8;
const MB_SIZE: usize = 2;
const GLOBAL: usize = MICROBATCHES as usize * MB_SIZE;
/// 37 windows: batches of 8, 8 and 3 microbatches, the last of one window.
const WINDOWS: usize = 37;
const STEPS: u64 = 3;
/// Evaluations after step 2 and after the last (3).
const FREQ: u64 = 2;

fn spec() -> ModelSpec {
    ModelSpec {
        heads: 2,
        ..common::small_spec(8)
    }
}

fn adamw() -> AdamW {
    AdamW {
        lr: 1e-2,
        weight_decay: 0.1,
        max_grad_norm: Some(1.0),
        ..AdamW::default()
    }
}

/// The validation windows: another generated text than the training corpus.
fn validation_set(spec: &ModelSpec) -> Result<ValidationSet> {
    let seq_len = spec.seq_len as usize;
    let corpus = Corpus::generate(WINDOWS * seq_len + 1, 11);
    let set = ValidationSet::new(corpus, seq_len, MB_SIZE, GLOBAL, None)?;
    assert_eq!((set.windows(), set.batches()), (WINDOWS, 3));
    Ok(set)
}

/// `kind` on `workers` workers (each replica's pipeline with its share of the step).
fn schedule(
    kind: ScheduleKind,
    workers: u32,
    chunks: u32,
    replicas: u32,
) -> Result<pipewise_common::schedule::Schedule> {
    let mut req = Request::new(kind, workers, MICROBATCHES / replicas);
    req.chunks = chunks;
    Ok(generate(&req)?)
}

/// Trains [`STEPS`] steps of `kind` on `workers` workers and `replicas` replicas, with
/// validation every [`FREQ`] steps when `set` is given; the step's checkpoint after the
/// last goes to `checkpoints` when given.
fn train(
    (kind, workers, chunks, replicas): (ScheduleKind, u32, u32, u32),
    data: &[Vec<Batch>],
    set: Option<&ValidationSet>,
    checkpoints: Option<&std::path::Path>,
) -> Result<LocalRun> {
    let schedule = schedule(kind, workers, chunks, replicas)?;
    let options = LocalOptions {
        replicas,
        validation: set.map(|s| (s, FREQ)),
        checkpoints,
        ..LocalOptions::default()
    };
    run_local(
        &schedule,
        &spec(),
        SEED,
        adamw(),
        &Device::Cpu,
        data,
        options,
    )
}

/// Every step's validation loss (`None` where it did not evaluate), the same on every
/// worker.
fn validation_losses(run: &LocalRun) -> Vec<Option<u64>> {
    run.reports
        .iter()
        .enumerate()
        .map(|(step, workers)| {
            let got: Vec<Option<u64>> = workers
                .iter()
                .map(|r| r.validation_loss.map(f64::to_bits))
                .collect();
            assert!(
                got.iter().all(|&v| v == got[0]),
                "step {step}: every worker knows the same validation loss: {got:?}"
            );
            got[0]
        })
        .collect()
}

/// Losses and parameters, bit for bit.
fn assert_same_training(a: &LocalRun, b: &LocalRun, what: &str) -> Result<()> {
    let bits = |r: &LocalRun| r.losses.iter().map(|l| l.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(a), bits(b), "{what}: losses");
    assert_eq!(a.params.len(), b.params.len(), "{what}");
    for (name, value) in &a.params {
        let other = b.params.get(name).expect("the same parameters");
        let same = value
            .flatten_all()?
            .to_vec1::<f32>()?
            .iter()
            .zip(other.flatten_all()?.to_vec1::<f32>()?)
            .all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{what}: {name} differs");
    }
    Ok(())
}

/// One worker, 2 and 4 workers, a V placement (two stages a worker, handed over in memory
/// at the turn), an interleaved one and two replicas all measure the same validation loss,
/// bit for bit, after the same steps; and each trains exactly as without validation.
#[test]
fn validation_loss_is_the_same_on_any_workers_schedule_and_replicas() -> Result<()> {
    let spec = spec();
    let data = common::step_batches(&spec, STEPS, MICROBATCHES)?;
    let set = validation_set(&spec)?;
    let reference = train((ScheduleKind::OneFOneB, 1, 1, 1), &data, Some(&set), None)?;
    let want = validation_losses(&reference);
    assert!(
        want[0].is_none() && want[1].is_some() && want[2].is_some(),
        "{want:?}"
    );
    assert_ne!(
        want[1], want[2],
        "training between evaluations changes the loss"
    );
    let loss = f64::from_bits(want[2].unwrap_or_default());
    // Near ln 256 untrained, lower after a few steps of the generated English.
    assert!(loss.is_finite() && loss > 1.0 && loss < 6.0, "{loss}");
    for config in [
        (ScheduleKind::OneFOneB, 1, 1, 1),
        (ScheduleKind::OneFOneB, 2, 1, 1),
        (ScheduleKind::GPipe, 4, 1, 1),
        (ScheduleKind::VHalf, 4, 1, 1),
        (ScheduleKind::Interleaved1F1B, 2, 2, 1),
        (ScheduleKind::ZbH1, 2, 1, 2),
    ] {
        let with = train(config, &data, Some(&set), None)?;
        assert_eq!(validation_losses(&with), want, "{config:?}");
        let without = train(config, &data, None, None)?;
        assert!(validation_losses(&without).iter().all(Option::is_none));
        assert_same_training(&with, &without, &format!("{config:?}"))?;
    }
    Ok(())
}

/// Each window's mean token cross-entropy from the log-softmax of the whole model's logits,
/// in f64 on the host: the definition, computed apart from the stages' code.
fn by_definition(whole: &Stage, windows: &Batch) -> Result<Vec<f64>> {
    let logits = whole.infer(&windows.tokens)?.to_dtype(DType::F64)?;
    let (b, t, _) = logits.dims3()?;
    let rows = logits.to_vec3::<f64>()?;
    let targets = windows.targets.to_vec2::<u32>()?;
    Ok((0..b)
        .map(|i| {
            (0..t)
                .map(|p| {
                    let row = &rows[i][p];
                    let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = row.iter().map(|x| (x - max).exp()).sum();
                    max + sum.ln() - row[targets[i][p] as usize]
                })
                .sum::<f64>()
                / t as f64
        })
        .collect())
}

/// The validation loss after the last step equals the whole model's (one stage, the
/// trained parameters from the run's checkpoint) over the same windows: bit for bit as the
/// stage computes it, batch sums in window order, and within f32 rounding of the
/// definition computed in f64.
#[test]
fn validation_loss_equals_the_whole_models_over_the_same_windows() -> Result<()> {
    let spec = spec();
    let data = common::step_batches(&spec, STEPS, MICROBATCHES)?;
    let set = validation_set(&spec)?;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let run = train(
        (ScheduleKind::VHalf, 2, 1, 1),
        &data,
        Some(&set),
        Some(dir.path()),
    )?;
    let got = run.reports[STEPS as usize - 1][0]
        .validation_loss
        .expect("the last step evaluates");
    let mut whole = Stage::whole(&spec, SEED, &Device::Cpu)?;
    whole.load_checkpoint_dir(&dir.path().join(format!("step-{STEPS}")))?;
    let per_batch = (GLOBAL / MB_SIZE) as u64;
    let microbatches = WINDOWS.div_ceil(MB_SIZE) as u64;
    let (mut total, mut defined) = (0.0, 0.0);
    let mut seen = 0;
    for batch in 0..set.batches() {
        let mut sum = 0.0;
        for j in batch * per_batch..((batch + 1) * per_batch).min(microbatches) {
            let (first, windows) = set.microbatch(j, &Device::Cpu)?;
            assert_eq!(first, seen as u64);
            let means = whole.window_losses(&windows.tokens, &windows.targets)?;
            seen += means.len();
            sum += means.iter().sum::<f64>();
            defined += by_definition(&whole, &windows)?.iter().sum::<f64>();
        }
        total += sum;
    }
    assert_eq!(seen, WINDOWS);
    let want = total / WINDOWS as f64;
    assert_eq!(got.to_bits(), want.to_bits(), "{got} against {want}");
    let defined = defined / WINDOWS as f64;
    assert!((got - defined).abs() < 1e-5, "{got} against {defined}");
    Ok(())
}

/// A held-out fraction takes the stream's last windows; training keeps the others, their
/// windows unchanged.
#[test]
fn a_held_out_fraction_takes_the_last_windows() -> Result<()> {
    let corpus = Corpus::from_bytes((0..=200u8).collect());
    // 201 tokens of 10: 20 windows, ⌈0.12 · 20⌉ = 3 held out.
    let (training, held) = pipewise_worker::runtime::hold_out(&corpus, 10, 0.12)?;
    assert_eq!((training.len(), held.len()), (171, 31));
    let set = ValidationSet::new(held, 10, 2, 4, None)?;
    assert_eq!((set.windows(), set.batches()), (3, 1));
    let (first, windows) = set.microbatch(1, &Device::Cpu)?;
    assert_eq!(first, 2);
    assert_eq!(
        windows.tokens.to_vec2::<u32>()?,
        [(190..200).collect::<Vec<u32>>()]
    );
    assert_eq!(
        windows.targets.to_vec2::<u32>()?,
        [(191..201).collect::<Vec<u32>>()]
    );
    // Every window but the held-out ones stays the training's.
    let ids = |c: &Corpus, at: usize| -> Result<Vec<u32>> {
        let s = ValidationSet::new(c.clone(), 10, 1, 1, None)?;
        Ok(s.microbatch(at as u64, &Device::Cpu)?
            .1
            .tokens
            .flatten_all()?
            .to_vec1()?)
    };
    assert_eq!(ids(&training, 16)?, (160..170).collect::<Vec<u32>>());
    assert!(ValidationSet::new(training, 10, 1, 1, None)?.windows() == 17);
    // Nothing left to train on, or nothing to hold out.
    for f in [0.99, 0.96] {
        let err = pipewise_worker::runtime::hold_out(&corpus, 10, f).err();
        let err = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("validation.fraction"), "{f}: {err}");
    }
    let tiny = Corpus::from_bytes(vec![1; 15]);
    assert!(pipewise_worker::runtime::hold_out(&tiny, 10, 0.5).is_err());
    // A validation file shorter than a window is refused, naming it.
    let err = ValidationSet::new(Corpus::from_bytes(vec![1; 10]), 10, 1, 1, None).err();
    assert!(
        err.map(|e| e.to_string())
            .unwrap_or_default()
            .contains("validation")
    );
    // At most `steps` batches are taken.
    let capped = ValidationSet::new(Corpus::from_bytes(vec![1; 201]), 10, 2, 4, Some(8))?;
    assert_eq!((capped.windows(), capped.batches()), (8, 2));
    Ok(())
}
