//! The reference trainer learns the default corpus, and a pipeline with global-norm
//! clipping trains exactly like it.

mod common;

use candle_core::{Device, Tensor};
use common::max_abs;
use pipewise_common::model::{DType as SpecDType, ModelSpec};
use pipewise_worker::test_utils::max_abs_diff;
use pipewise_worker::{AdamW, Corpus, Result, Sampler, Stage, Trainer, clip_scale, test_device};

fn spec() -> ModelSpec {
    ModelSpec {
        vocab: 256,
        hidden: 48,
        heads: 4,
        layers: 2,
        seq_len: 32,
        dtype: SpecDType::F32,
        ..Default::default()
    }
}

fn adamw() -> AdamW {
    AdamW {
        lr: 3e-3,
        weight_decay: 0.01,
        ..AdamW::default()
    }
}

/// 200 steps on the generated corpus lower the loss by at least 30 %.
fn loss_drops(device: &Device) -> Result<()> {
    let spec = spec();
    let corpus = Corpus::generated();
    let sampler = Sampler {
        seed: 1,
        microbatch_size: 8,
        seq_len: spec.seq_len as usize,
        global_batch: 16,
        shuffle: true,
    };
    let mut trainer = Trainer::new(&spec, 42, device, adamw())?;
    let mut losses = Vec::new();
    for step in 0..200 {
        let batches = sampler.step(&corpus, step, 2, device)?;
        let stats = trainer.train_step(&batches)?;
        assert!(stats.loss.is_finite(), "step {step}: loss {}", stats.loss);
        losses.push(stats.loss);
    }
    let first = losses[0];
    let last10 = losses[190..].iter().sum::<f64>() / 10.0;
    eprintln!(
        "loss: first step {first:.4}, step 50 {:.4}, step 100 {:.4}, mean of last 10 {last10:.4} ({:.1}% lower)",
        losses[50],
        losses[100],
        (1.0 - last10 / first) * 100.0
    );
    assert!(
        (first - (spec.vocab as f64).ln()).abs() < 0.1,
        "first loss {first} should be near ln(V)"
    );
    assert!(
        last10 <= 0.7 * first,
        "loss went from {first} to {last10} (needs a 30% drop)"
    );
    assert_eq!(trainer.stage().step(), 200);
    Ok(())
}

test_device!(reference_loss_drops_30_percent_in_200_steps, loss_drops);

/// Two stages, clipping by the global norm (sum of the stages' squared norms): same
/// parameters as the one-stage reference after several steps, even though clipping is
/// active (the norm is far above the limit).
fn pipeline_matches_reference(device: &Device) -> Result<()> {
    let spec = ModelSpec {
        layers: 3,
        seq_len: 16,
        hidden: 32,
        ..spec()
    };
    let opt = AdamW {
        max_grad_norm: Some(0.05),
        ..adamw()
    };
    let corpus = Corpus::generated();
    let sampler = Sampler {
        seed: 2,
        microbatch_size: 2,
        seq_len: spec.seq_len as usize,
        global_batch: 6,
        shuffle: true,
    };
    let mut reference = Trainer::new(&spec, 9, device, opt)?;
    let mut stages = Stage::even_split(&spec, 2)?
        .into_iter()
        .map(|r| {
            let mut s = Stage::new(&spec, r, 9, device)?;
            s.set_optimizer(opt);
            Ok(s)
        })
        .collect::<Result<Vec<_>>>()?;
    let n = 3;
    for step in 0..4 {
        let batches = sampler.step(&corpus, step, n, device)?;
        let want = reference.train_step(&batches)?;
        assert!(want.grad_norm > 0.05, "clipping must be active");
        let mut loss = 0.0;
        for s in stages.iter_mut() {
            s.set_microbatches(n);
        }
        for (mb, batch) in (0..n).zip(&batches) {
            let mut x = batch.tokens.clone();
            for s in stages.iter_mut() {
                x = s.forward(mb, &x, Some(&batch.targets))?;
            }
            loss += f64::from(x.to_scalar::<f32>()?);
        }
        for mb in (0..n).rev() {
            let mut g: Option<Tensor> = None;
            for s in stages.iter_mut().rev() {
                g = s.backward_input(mb, g.as_ref())?;
            }
        }
        for mb in 0..n {
            for s in stages.iter_mut() {
                s.backward_weight(mb)?;
            }
        }
        let sq: f64 = stages
            .iter()
            .map(Stage::grad_sq_norm)
            .sum::<Result<f64>>()?;
        assert!((sq.sqrt() - want.grad_norm).abs() <= 1e-5 * want.grad_norm);
        let scale = clip_scale(sq, opt.max_grad_norm);
        for s in stages.iter_mut() {
            s.optimizer_step(scale)?;
        }
        assert!((loss / f64::from(n) - want.loss).abs() < 1e-5);
    }
    let mut compared = 0;
    for s in &stages {
        for p in s.params() {
            let r = reference
                .stage()
                .params()
                .find(|q| q.name == p.name)
                .map(|q| q.value.clone());
            let Some(r) = r else {
                panic!("reference has no {}", p.name);
            };
            let d = max_abs_diff(&p.value, &r)?;
            assert!(d <= 1e-5, "{}: {d:e} (|p| {:e})", p.name, max_abs(&r)?);
            compared += 1;
        }
    }
    assert_eq!(compared, reference.stage().params().count());
    Ok(())
}

test_device!(
    two_stage_clipped_training_matches_reference,
    pipeline_matches_reference
);

/// `[lr_scheduler]`: a trainer whose optimizer carries a schedule (2 warm-up steps, then a
/// linear decay over a 4-step job) trains exactly as one whose rate is set by hand before
/// each step to `lr · f(s)` with torchtitan's factors 1/3, 2/3, 2/3, 1/3; without the
/// schedule the parameters differ.
fn scheduled_rate_is_applied_per_step(device: &Device) -> Result<()> {
    use pipewise_common::job::lr::{DecayType, LrScheduler};
    let spec = spec();
    let corpus = Corpus::generated();
    let sampler = Sampler {
        seed: 1,
        microbatch_size: 2,
        seq_len: spec.seq_len as usize,
        global_batch: 4,
        shuffle: true,
    };
    let schedule = LrScheduler {
        warmup_steps: 2,
        decay_ratio: None,
        decay_type: DecayType::Linear,
        min_lr_factor: 0.0,
    };
    let scheduled = AdamW {
        schedule: Some((schedule, 4)),
        ..adamw()
    };
    let mut a = Trainer::new(&spec, 42, device, scheduled)?;
    let mut by_hand = Trainer::new(&spec, 42, device, adamw())?;
    let mut constant = Trainer::new(&spec, 42, device, adamw())?;
    for (step, factor) in [1.0 / 3.0, 2.0 / 3.0, 2.0 / 3.0, 1.0 / 3.0]
        .into_iter()
        .enumerate()
    {
        let batches = sampler.step(&corpus, step as u64, 2, device)?;
        by_hand.stage_mut().set_optimizer(AdamW {
            lr: adamw().lr * factor,
            ..adamw()
        });
        a.train_step(&batches)?;
        by_hand.train_step(&batches)?;
        constant.train_step(&batches)?;
    }
    let (mut same, mut apart) = (0.0f64, 0.0f64);
    for ((p, q), r) in a
        .stage()
        .params()
        .zip(by_hand.stage().params())
        .zip(constant.stage().params())
    {
        same = same.max(max_abs_diff(&p.value, &q.value)?);
        apart = apart.max(max_abs_diff(&p.value, &r.value)?);
    }
    assert!(same < 1e-7, "scheduled vs by hand: {same}");
    assert!(apart > 1e-4, "the schedule changed nothing: {apart}");
    Ok(())
}

test_device!(
    a_scheduled_rate_is_applied_per_step,
    scheduled_rate_is_applied_per_step
);
