//! `[validation]` on the harness: the validation loss comes back through the coordinator
//! before the first step (step 0) and on the steps that evaluate, the same on one worker as
//! on two, training is the same as without it, and a run that goes on after a move does
//! not evaluate step 0 again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use pipewise_common::job::{JobSpec, Validation};
use pipewise_harness::{Cluster, reference_losses, spec};
use pipewise_proto::v1 as pb;

/// One step's event: `(step, training loss, validation loss after it)`.
type Record = (u64, f64, Option<f64>);

/// What a job left: its id, step 0's validation loss (before the first step) and every
/// step's record.
type Run = (u64, Option<f64>, Vec<Record>);

/// Runs `spec` to its end on `cluster`.
async fn run(cluster: &mut Cluster, spec: JobSpec) -> Run {
    let job = cluster.submit(spec).await;
    let status = cluster.wait(job).await;
    assert_eq!(status.state, pb::JobState::Succeeded as i32, "{status:?}");
    let events = cluster.events(job);
    let initial: Vec<f64> = events
        .iter()
        .filter_map(|e| e.initial_validation_loss)
        .collect();
    assert!(initial.len() <= 1, "step 0 evaluated twice: {initial:?}");
    let before = events.first().and_then(|e| e.initial_validation_loss);
    assert_eq!(
        before,
        initial.first().copied(),
        "step 0 is on step 1's event"
    );
    let records = events
        .iter()
        .map(|e| (e.step, e.loss, e.validation_loss))
        .collect();
    (job, before, records)
}

/// The steps a run evaluated after.
fn evaluated(records: &[Record]) -> Vec<u64> {
    records
        .iter()
        .filter(|r| r.2.is_some())
        .map(|r| r.0)
        .collect()
}

/// The validation losses' bits, step 0's first.
fn val_bits(initial: Option<f64>, records: &[Record]) -> Vec<u64> {
    initial
        .into_iter()
        .chain(records.iter().filter_map(|r| r.2))
        .map(f64::to_bits)
        .collect()
}

/// The training losses' bits.
fn train_bits(records: &[Record]) -> Vec<u64> {
    records.iter().map(|r| r.1.to_bits()).collect()
}

/// The single device's losses training on what `[validation] fraction` leaves of the
/// job's data (the held-out windows are not trained on).
fn held_out_reference(spec: &JobSpec) -> Vec<f64> {
    use pipewise_worker::job::{corpus_of, optimizer_of, sampler_of};
    let device = pipewise_worker::Device::Cpu;
    let fraction = spec.validation.as_ref().and_then(|v| v.fraction).unwrap();
    let all = corpus_of(spec).unwrap();
    let (corpus, _) =
        pipewise_worker::runtime::hold_out(&all, spec.model.seq_len as usize, fraction).unwrap();
    let mut trainer =
        pipewise_worker::Trainer::new(&spec.model, spec.training.seed, &device, optimizer_of(spec))
            .unwrap();
    let sampler = sampler_of(spec);
    (0..u64::from(spec.training.steps))
        .map(|step| {
            let batches = sampler
                .step(&corpus, step, spec.microbatches(), &device)
                .unwrap();
            trainer.train_step(&batches).unwrap().loss
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn validation_losses_come_back_on_the_steps_that_evaluate() {
    let mut cluster = Cluster::builder("validation").start().await;
    // Validation documents of their own, as JSON Lines (read as [data] path would read
    // them): 40 of 30 and 32 bytes, joined as they are, 38 windows of 32 tokens.
    let lines: String = (0..40)
        .map(|i| {
            format!(
                "{{\"text\": \"{}\"}}\n",
                [
                    "the stage sends a frame to w1 ",
                    "a worker waits for the w0 frame "
                ][i % 2]
            )
        })
        .collect();
    std::fs::write(cluster.data_dirs()[0].join("valid.jsonl"), lines).unwrap();
    let mut spec = pipewise_common::job::example(2, "1f1b");
    spec.training.steps = 4;
    spec.validation = Some(Validation {
        path: Some("valid.jsonl".into()),
        freq: 3,
        ..Default::default()
    });
    let reference = reference_losses(&spec);

    let (_, zero, two) = run(&mut cluster, spec.clone()).await;
    assert_eq!(evaluated(&two), [3, 4], "after step 3 and the last");
    let vals = val_bits(zero, &two);
    assert_eq!(
        vals.len(),
        3,
        "before the first step, after step 3 and the last"
    );
    assert!(
        vals.iter()
            .map(|b| f64::from_bits(*b))
            .all(|v| v.is_finite() && v > 0.0),
        "{vals:?}"
    );
    for (step, loss, _) in &two {
        let want = reference[*step as usize - 1];
        assert!((loss - want).abs() <= 1e-5, "step {step}: {loss} vs {want}");
    }
    // The same validation losses from one worker, bit for bit.
    spec.parallelism.pipeline_parallel_degree = 1;
    let (_, zero_one, one) = run(&mut cluster, spec.clone()).await;
    assert_eq!(val_bits(zero_one, &one), vals);
    assert_eq!(evaluated(&one), [3, 4]);
    // Every step evaluating: the evaluation after step 1 follows the one before it, each
    // with frames of its own; the same model gives step 0 and step 3 the same bits.
    spec.parallelism.pipeline_parallel_degree = 2;
    spec.validation.as_mut().unwrap().freq = 1;
    let (_, zero_every, every) = run(&mut cluster, spec.clone()).await;
    assert_eq!(evaluated(&every), [1, 2, 3, 4]);
    let at3 = |records: &[Record]| records.iter().find(|r| r.0 == 3).unwrap().2.unwrap();
    assert_eq!(
        (zero_every.map(f64::to_bits), at3(&every).to_bits()),
        (zero.map(f64::to_bits), at3(&two).to_bits())
    );
    // Training as without validation.
    spec.validation = None;
    let (_, zero_without, without) = run(&mut cluster, spec).await;
    assert_eq!((zero_without, evaluated(&without)), (None, vec![]));
    assert_eq!(train_bits(&without), train_bits(&two));
    assert_eq!(train_bits(&two).len(), 4);
    cluster.shutdown().await;
}

/// A run that goes on after a move (an overflow the plan did not predict, seen after step
/// 1, moves the job to V-Min after step 3) does not evaluate step 0 again: one step 0
/// evaluation, before step 1, evaluations after steps 2, 4 and 6, no step run twice, and
/// the losses are the single device's on the windows not held out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_after_a_move_does_not_evaluate_step_zero_again() {
    let mut spec = spec(2, "gpipe", 6);
    spec.job.name = "validation-move".into();
    spec.checkpoint.enable_checkpoint = true;
    spec.checkpoint.interval = 1000;
    spec.validation = Some(Validation {
        fraction: Some(0.05),
        freq: 2,
        ..Default::default()
    });
    let reference = held_out_reference(&spec);
    // Worker 0 may hold what GPipe is predicted to, and reports 4 KiB more.
    let plan = spec.validate().unwrap();
    let ranges = spec.stage_ranges(&plan.schedule.placement).unwrap();
    let fixed = plan.predicted_state_bytes_over(&spec, &ranges).unwrap()[0];
    let gpipe = plan.predicted_peak_bytes(&spec).unwrap()[0];
    let mut cluster = Cluster::builder("validation-move")
        .memory(0, fixed + gpipe, 4 << 10)
        .start()
        .await;
    let (job, zero, records) = run(&mut cluster, spec).await;
    let replans = cluster.replans(job);
    cluster.shutdown().await;
    assert!(zero.is_some(), "step 0 evaluated before step 1");
    assert_eq!(evaluated(&records), [2, 4, 6]);
    let steps: Vec<u64> = records.iter().map(|r| r.0).collect();
    assert_eq!(steps, [1, 2, 3, 4, 5, 6]);
    for (step, loss, _) in &records {
        let want = reference[*step as usize - 1];
        assert!((loss - want).abs() <= 1e-5, "step {step}: {loss} vs {want}");
    }
    // Seen after step 1, the move reaches the workers with step 2's answers: they go on
    // from memory after step 3.
    let moved = "worker 0 (w0) held 3.63 MiB of its 3.63 MiB (gpipe planned); moved to v-min, \
                 predicted 2.51 MiB there; going on after step 3 from the workers' memory";
    assert_eq!(replans, [(4, moved.to_string())]);
}
