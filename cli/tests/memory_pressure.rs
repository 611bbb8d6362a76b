//! Memory pressure: a job predicted, or measured, to overflow a worker's memory moves to a
//! schedule that fits; training stays exact.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use pipewise_common::job::JobSpec;

use common::processes::*;

/// A 2-worker GPipe job with checkpoints, and worker 0's bytes: its parameters,
/// gradients and AdamW moments (f32) and the activations GPipe and 1F1B are predicted to
/// hold there.
fn pressure_job(name: &str) -> (JobSpec, u64, u64, u64) {
    let mut spec = spec(2, "gpipe", PRESSURE_STEPS);
    spec.job.name = name.into();
    spec.checkpoint.enable_checkpoint = true;
    spec.checkpoint.interval = 1000;
    let plan = spec.validate().unwrap();
    let fixed = plan
        .predicted_state_bytes_over(&spec, &spec.stage_ranges(&plan.schedule.placement).unwrap())
        .unwrap()[0];
    let gpipe = plan.predicted_peak_bytes(&spec).unwrap()[0];
    let mut one = spec.clone();
    one.parallelism.pipeline_parallel_schedule = "1f1b".into();
    let one_f_one_b = one.validate().unwrap().predicted_peak_bytes(&one).unwrap()[0];
    assert!(one_f_one_b < gpipe);
    (spec, fixed, gpipe, one_f_one_b)
}

const PRESSURE_STEPS: u32 = 8;

/// A worker whose registered memory the job's plan is predicted to overflow (GPipe holds
/// every microbatch's activations): the coordinator moves the job to the fastest schedule
/// predicted to fit before its first step, no step overflows, and training stays exact.
#[test]
fn memory_pressure_moves_the_job_to_a_schedule_that_fits() {
    const LONG: u32 = PRESSURE_STEPS;
    let dir = tempdir("pressure");
    let (spec, fixed, gpipe, one_f_one_b) = pressure_job("pressure");
    let budget = (fixed + (gpipe + one_f_one_b) / 2).to_string();
    let cluster = start_with(&dir, 2, &[(0, &["--memory-bytes", budget.as_str()])]);
    let reference = reference(&spec);
    let (job, _) = submit_wait(&cluster, &write_spec(&dir, &spec));
    let stdout = history(&cluster, job);
    let moves = replans(&stdout, "moved to");
    assert_eq!(moves.len(), 1, "{stdout}");
    assert!(
        moves[0].contains("worker 0 (w0) is predicted to hold"),
        "{}",
        moves[0]
    );
    assert!(moves[0].contains("gpipe planned"), "{}", moves[0]);
    assert!(moves[0].ends_with("before step 1"), "{}", moves[0]);
    eprintln!("pressure: {} (budget {budget} bytes)", moves[0]);
    // At d = 2 V-Min's and V-Half's classes are both 2 units and the named V schedules are
    // the best of their class, so they tie and the first in order is taken. Worker 0's
    // parameters, gradients and AdamW moments on it: stages 0 and 3.
    assert!(moves[0].contains("moved to v-min,"), "{}", moves[0]);
    let mut v_min = spec.clone();
    v_min.parallelism.pipeline_parallel_schedule = "v-min".into();
    let moved = v_min.validate().unwrap();
    let ranges = v_min.stage_ranges(&moved.schedule.placement).unwrap();
    let fixed_after = moved.predicted_state_bytes_over(&v_min, &ranges).unwrap()[0];
    assert!(fixed_after > 0);
    // Every step ran once, on the new plan, within the budget on worker 0.
    let steps: Vec<&str> = stdout.lines().filter(|l| l.starts_with("step")).collect();
    assert_eq!(steps.len(), LONG as usize, "{stdout}");
    for line in &steps {
        let kib = line
            .split('[')
            .nth(1)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap();
        let held = kib.parse::<f64>().unwrap() * 1024.0 + fixed_after as f64;
        assert!(held <= budget.parse::<f64>().unwrap() + 1024.0, "{line}");
    }
    assert_exact(&cluster, job, &last_losses(&stdout), &reference);
    assert_eq!(replans_counted(&cluster, "memory_pressure"), 1.0);
}

/// An overflow the plan did not predict (the worker reports 4 KiB more than its stages
/// hold, with a budget of exactly GPipe's prediction): seen after step 1, every worker
/// stops after the same step, the job resumes from that checkpoint on a schedule that
/// fits, and training stays exact.
#[test]
fn a_measured_overflow_stops_the_run_and_moves_it() {
    let dir = tempdir("pressure-measured");
    let (spec, fixed, gpipe, _) = pressure_job("pressure-measured");
    let budget = (fixed + gpipe).to_string();
    let extra: &[&str] = &["--memory-bytes", &budget, "--unplanned-bytes", "4KiB"];
    let cluster = start_with(&dir, 2, &[(0, extra)]);
    let reference = reference(&spec);
    let (job, _) = submit_wait(&cluster, &write_spec(&dir, &spec));
    let stdout = history(&cluster, job);
    let moves = replans(&stdout, "moved to");
    assert_eq!(moves.len(), 1, "{stdout}");
    assert!(moves[0].contains("worker 0 (w0) held"), "{}", moves[0]);
    assert!(moves[0].contains("gpipe planned"), "{}", moves[0]);
    assert!(
        moves[0].contains("from the workers' memory"),
        "{}",
        moves[0]
    );
    assert_no_step_repeated(&stdout);
    eprintln!("measured pressure: {} (budget {budget} bytes)", moves[0]);
    assert_exact(&cluster, job, &last_losses(&stdout), &reference);
    assert_eq!(replans_counted(&cluster, "memory_pressure"), 1.0);
}
