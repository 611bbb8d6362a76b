//! Which queued jobs start: in queue order, each on all of its workers or none, with EASY
//! backfill (Slurm's and Maui's rule). The first job that cannot start gets a reservation:
//! the time the running jobs, ending as predicted, free enough workers for it. A later job
//! starts before it only when it fits the idle workers and either is predicted to end by
//! then or leaves enough of the workers free at that time to the first: it cannot delay
//! the first job by more than the predictions miss.

use super::pressure::in_use_ranges;
use super::supervisor::shown;
use super::worker::Worker;
use crate::calibration::CostModel;
use crate::job::{JobPlan, JobSpec};

/// A job's predicted run time in seconds on `workers` (by index; `d × R` of them), before
/// any step of it ran: its steps times the step its plan is predicted to take on the
/// workers' start-up profiles (the supervisor's first prediction).
pub fn predicted_secs(spec: &JobSpec, plan: &JobPlan, workers: &[Worker]) -> Option<f64> {
    let (_, ranges) = in_use_ranges(spec, plan, &[])?;
    let mbs = spec.parallelism.pipeline_parallel_microbatch_size;
    let mut costs = CostModel::new(spec.model.clone(), mbs);
    let step_ms = shown(spec, plan, &ranges, workers, &mut costs).step_ms;
    let secs = f64::from(spec.training.steps) * step_ms / 1e3;
    (secs.is_finite() && secs > 0.0).then_some(secs)
}

/// Jobs whose prediction misses are remembered ([`Misses`]).
const MISSES_KEPT: usize = 16;

/// How much longer than first predicted the jobs' steps ran. A job's first prediction
/// stands on its workers' start-up profiles alone and knows nothing of the hops and the
/// end-of-step sync (a small model runs many times slower than it); per job the mean of
/// its measured steps over that prediction is kept, with the job's shape ([`shape`]). A
/// queued job's prediction is scaled by the largest miss of the latest jobs of its shape,
/// or of all of them when none had its shape (at least 1), before the backfill rule reads
/// it: a job is let past the first waiting one only as far as the cluster's own
/// predictions have held.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Misses {
    jobs: std::collections::BTreeMap<u64, Miss>,
}

/// One job's miss: its shape, its first predicted step and its measured steps over it.
#[derive(Debug, Clone, PartialEq)]
struct Miss {
    shape: String,
    /// The first predicted step, seconds.
    first: f64,
    /// The sum of its measured steps over `first`, and how many.
    sum: f64,
    steps: u32,
}

impl Miss {
    /// The mean measured step over the first prediction (`None` before a step).
    fn mean(&self) -> Option<f64> {
        (self.steps > 0).then(|| self.sum / f64::from(self.steps))
    }
}

/// What a prediction's miss depends on: the model, the microbatch size, the degree and
/// the replicas (how much of a step is compute, and how much hops and sync).
pub fn shape(spec: &JobSpec) -> String {
    let p = &spec.parallelism;
    format!(
        "{:?} b{} d{} r{}",
        spec.model,
        p.pipeline_parallel_microbatch_size,
        p.pipeline_parallel_degree,
        spec.replicas()
    )
}

impl Misses {
    /// Job `job` of `shape` starts, its step predicted to take `step_secs`.
    pub fn started(&mut self, job: u64, shape: String, step_secs: f64) {
        if step_secs.is_finite() && step_secs > 0.0 {
            let miss = Miss {
                shape,
                first: step_secs,
                sum: 0.0,
                steps: 0,
            };
            self.jobs.insert(job, miss);
            while self.jobs.len() > MISSES_KEPT {
                self.jobs.pop_first();
            }
        }
    }

    /// Step `step` (1-based) of job `job` took `secs`; a run's first step, which warms up,
    /// is left out.
    pub fn step(&mut self, job: u64, step: u64, secs: f64) {
        if let Some(miss) = self.jobs.get_mut(&job)
            && step > 1
            && secs.is_finite()
            && secs > 0.0
        {
            miss.sum += secs / miss.first;
            miss.steps += 1;
        }
    }

    /// The factor a queued job of `shape`'s prediction is scaled by (see [`Misses`]).
    pub fn factor(&self, shape: &str) -> f64 {
        let measured = || self.jobs.values().filter(|m| m.steps > 0);
        let same = measured().any(|m| m.shape == shape);
        measured()
            .filter(|m| !same || m.shape == shape)
            .filter_map(Miss::mean)
            .fold(1.0, f64::max)
    }
}

/// A queued job as the rule sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Queued {
    /// The job's id.
    pub id: u64,
    /// Workers it needs (`d × R`).
    pub need: usize,
    /// Its predicted run time in seconds (`None`: not known; it never backfills).
    pub secs: Option<f64>,
}

/// A started job as the rule sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Started {
    /// Workers it frees when it ends.
    pub need: usize,
    /// Its predicted seconds left (`None`: not known; no reservation reaches past it).
    pub left: Option<f64>,
}

/// The first waiting job's reservation: when enough workers are predicted free for it, and
/// how many more than it needs are free then.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Shadow {
    time: f64,
    extra: usize,
}

/// When the running jobs, ending as predicted, leave `need` workers free beside `idle`;
/// `None` if a job whose end is not known comes first or they never do.
fn shadow(need: usize, idle: usize, running: &[Started]) -> Option<Shadow> {
    let end = |job: &Started| job.left.unwrap_or(f64::INFINITY);
    let mut ends: Vec<&Started> = running.iter().collect();
    ends.sort_by(|a, b| end(a).total_cmp(&end(b)));
    let mut free = idle;
    for job in ends {
        free += job.need;
        if free >= need {
            let time = job.left?;
            return Some(Shadow {
                time,
                extra: free - need,
            });
        }
    }
    None
}

/// What a queued job does now ([`admit`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// It starts.
    Start,
    /// The first job that cannot start: it waits for workers, which the running jobs are
    /// predicted to free in `free_in` seconds (`None`: not known).
    Workers {
        /// Predicted seconds until enough workers are free.
        free_in: Option<f64>,
    },
    /// Behind job `first`, the first that cannot start, which it could delay.
    Behind {
        /// The first job's id.
        first: u64,
        /// Predicted seconds until the first job can start (`None`: not known).
        free_in: Option<f64>,
    },
    /// It needs more workers than the cluster streams: it waits for workers to join.
    Joining,
}

impl Verdict {
    /// What a job waits for, in words (empty when it starts), for a job that needs `need`
    /// workers and is predicted to take `secs`.
    pub fn waiting(&self, need: usize, secs: Option<f64>, streaming: usize) -> String {
        let about = |t: Option<f64>| match t {
            Some(t) => format!("in about {t:.0} s"),
            None => "when running jobs end".to_string(),
        };
        match *self {
            Verdict::Start => String::new(),
            Verdict::Workers { free_in } => {
                format!("{need} idle workers (predicted free {})", about(free_in))
            }
            Verdict::Behind { first, free_in } => {
                let long = secs.map_or(String::new(), |t| format!(", predicted {t:.0} s,"));
                format!(
                    "job {first} to start: this job{long} would hold workers it needs (it \
                     can start {})",
                    about(free_in)
                )
            }
            Verdict::Joining => {
                format!("workers to join: {need} needed, {streaming} in the cluster")
            }
        }
    }
}

/// What every job of `queue` (in queue order) does now, on `idle` of the `streaming`
/// workers, beside the `running` jobs. A job needing more workers than stream at all waits
/// for workers to join rather than for jobs to end and holds nothing up; with nothing
/// running the head of the queue starts and waits for its workers inside.
pub fn admit(
    queue: &[Queued],
    idle: usize,
    streaming: usize,
    running: &[Started],
) -> Vec<(u64, Verdict)> {
    let mut running = running.to_vec();
    let mut idle = idle;
    let mut verdicts = Vec::with_capacity(queue.len());
    // The first job that cannot start, and its reservation.
    let mut reserved: Option<(u64, Option<Shadow>)> = None;
    for (i, job) in queue.iter().enumerate() {
        let head = i == 0 && running.is_empty();
        if job.need > streaming && !head {
            verdicts.push((job.id, Verdict::Joining));
            continue;
        }
        let fits = job.need <= idle || head;
        let admitted = match reserved {
            _ if !fits => false,
            None => true,
            Some((_, None)) => false,
            Some((first, Some(s))) => match job.secs {
                Some(secs) if secs <= s.time => true,
                Some(_) if job.need <= s.extra => {
                    let extra = s.extra - job.need;
                    reserved = Some((first, Some(Shadow { extra, ..s })));
                    true
                }
                _ => false,
            },
        };
        let verdict = if admitted {
            idle = idle.saturating_sub(job.need);
            running.push(Started {
                need: job.need,
                left: job.secs,
            });
            Verdict::Start
        } else if let Some((first, s)) = reserved {
            Verdict::Behind {
                first,
                free_in: s.map(|s| s.time),
            }
        } else {
            let s = shadow(job.need, idle, &running);
            reserved = Some((job.id, s));
            Verdict::Workers {
                free_in: s.map(|s| s.time),
            }
        };
        verdicts.push((job.id, verdict));
    }
    verdicts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queued(id: u64, need: usize, secs: f64) -> Queued {
        Queued {
            id,
            need,
            secs: Some(secs),
        }
    }

    /// The ids of the jobs [`admit`] starts.
    fn starts(queue: &[Queued], idle: usize, streaming: usize, running: &[Started]) -> Vec<u64> {
        admit(queue, idle, streaming, running)
            .into_iter()
            .filter(|(_, v)| *v == Verdict::Start)
            .map(|(id, _)| id)
            .collect()
    }

    fn started(need: usize, left: f64) -> Started {
        Started {
            need,
            left: Some(left),
        }
    }

    /// In queue order while the idle workers last; nothing running: the head starts even
    /// when the cluster lacks its workers yet.
    #[test]
    fn jobs_start_in_order_while_workers_are_idle() {
        let queue = [queued(1, 4, 10.0), queued(2, 4, 10.0), queued(3, 4, 10.0)];
        assert_eq!(starts(&queue, 8, 8, &[]), [1, 2]);
        assert_eq!(starts(&[queued(1, 8, 10.0)], 2, 8, &[]), [1]);
        assert_eq!(starts(&[queued(1, 12, 10.0)], 2, 8, &[]), [1]);
    }

    /// Job 1 needs all 8 workers; job A runs on 4 for another 100 s, 4 are idle. A 2-worker
    /// job predicted to take 60 s starts (it ends before A frees the workers); one of 200 s
    /// does not (it would hold 2 of the 8 past that time), nor one whose time is unknown.
    #[test]
    fn a_job_behind_a_waiting_one_starts_only_when_it_cannot_delay_it() {
        let running = [started(4, 100.0)];
        let head = queued(1, 8, 50.0);
        assert_eq!(starts(&[head, queued(2, 2, 60.0)], 4, 8, &running), [2]);
        assert!(starts(&[head, queued(2, 2, 200.0)], 4, 8, &running).is_empty());
        let unknown = Queued {
            id: 2,
            need: 2,
            secs: None,
        };
        assert!(starts(&[head, unknown], 4, 8, &running).is_empty());
        // Jobs behind wait for nothing else: two short ones both start.
        let two = [head, queued(2, 2, 60.0), queued(3, 2, 90.0)];
        assert_eq!(starts(&two, 4, 8, &running), [2, 3]);
    }

    /// The first waiting job needs 6 of 8 workers, A (4 workers) frees its own in 100 s:
    /// then 8 are free, 2 more than it needs, so a long 2-worker job may run past that time
    /// (the extra workers), and a second long one may not (the extra are taken).
    #[test]
    fn a_long_job_may_take_the_workers_the_first_does_not_need() {
        let running = [started(4, 100.0)];
        let queue = [queued(1, 6, 50.0), queued(2, 2, 500.0), queued(3, 2, 500.0)];
        assert_eq!(starts(&queue, 4, 8, &running), [2]);
    }

    /// A running job whose end is not known before enough workers are free: no reservation,
    /// so nothing overtakes (the rule from before run-time predictions).
    #[test]
    fn without_a_known_end_nothing_overtakes() {
        let running = [
            Started {
                need: 4,
                left: None,
            },
            started(2, 10.0),
        ];
        let queue = [queued(1, 8, 50.0), queued(2, 2, 1.0)];
        assert!(starts(&queue, 2, 8, &running).is_empty());
    }

    /// A job's prediction before it runs: its steps times its first step's prediction, so
    /// twice the steps take twice as long.
    #[test]
    fn a_jobs_time_is_its_steps_times_its_first_prediction() {
        let workers: Vec<Worker> = (0..2)
            .map(|i| Worker {
                id: format!("w{i}"),
                flops_per_second: 10_000_000_000,
                ..Worker::default()
            })
            .collect();
        let mut spec = crate::job::example(2, "1f1b");
        let plan = spec.validate().expect("plan");
        let short = predicted_secs(&spec, &plan, &workers).expect("predicted");
        spec.training.steps *= 2;
        let long = predicted_secs(&spec, &plan, &workers).expect("predicted");
        assert!(
            short > 0.0 && (long / short - 2.0).abs() < 1e-9,
            "{short} {long}"
        );
    }

    /// What each job waits for: the first for workers (free when A ends, in 100 s), the
    /// long one behind it for that job, the too-large one for workers to join.
    #[test]
    fn every_waiting_job_says_what_it_waits_for() {
        let running = [started(4, 100.0)];
        let queue = [
            queued(1, 8, 50.0),
            queued(2, 2, 500.0),
            queued(3, 12, 5.0),
            queued(4, 2, 60.0),
        ];
        let verdicts = admit(&queue, 4, 8, &running);
        let first = Verdict::Workers {
            free_in: Some(100.0),
        };
        let behind = Verdict::Behind {
            first: 1,
            free_in: Some(100.0),
        };
        assert_eq!(
            verdicts,
            [
                (1, first),
                (2, behind),
                (3, Verdict::Joining),
                (4, Verdict::Start)
            ]
        );
        assert_eq!(
            first.waiting(8, Some(50.0), 8),
            "8 idle workers (predicted free in about 100 s)"
        );
        assert_eq!(
            behind.waiting(2, Some(500.0), 8),
            "job 1 to start: this job, predicted 500 s, would hold workers it needs (it can \
             start in about 100 s)"
        );
        assert_eq!(
            Verdict::Joining.waiting(12, None, 8),
            "workers to join: 12 needed, 8 in the cluster"
        );
        assert_eq!(Verdict::Start.waiting(2, None, 8), "");
    }

    /// A job whose steps ran 3× its first prediction (its first step left out) scales
    /// the predictions of its shape by 3; one that ran faster does not shrink them; a
    /// shape no job had takes the largest miss of all; forgotten jobs no longer count.
    #[test]
    fn queued_predictions_are_scaled_by_the_largest_miss_of_their_shape() {
        let (small, large, other) = ("small", "large", "other");
        let mut misses = Misses::default();
        assert_eq!(misses.factor(small), 1.0);
        misses.started(1, small.into(), 0.01);
        misses.step(1, 1, 1.0);
        assert_eq!(misses.factor(small), 1.0);
        misses.step(1, 2, 0.02);
        misses.step(1, 3, 0.04);
        assert!((misses.factor(small) - 3.0).abs() < 1e-9);
        misses.started(2, small.into(), 0.01);
        misses.step(2, 2, 0.005);
        misses.started(3, large.into(), 0.1);
        misses.step(3, 2, 0.15);
        assert!((misses.factor(small) - 3.0).abs() < 1e-9);
        assert!((misses.factor(large) - 1.5).abs() < 1e-9);
        assert!((misses.factor(other) - 3.0).abs() < 1e-9);
        for job in 4..4 + MISSES_KEPT as u64 {
            misses.started(job, small.into(), 0.01);
        }
        assert_eq!(misses.factor(small), 1.0);
    }

    /// Jobs differing in model, microbatch size, degree or replicas have other shapes.
    #[test]
    fn a_shape_names_what_a_miss_depends_on() {
        let spec = crate::job::example(2, "1f1b");
        let mut wider = spec.clone();
        wider.model.hidden *= 2;
        let mut deeper = spec.clone();
        deeper.parallelism.pipeline_parallel_degree = 4;
        let mut replicated = spec.clone();
        replicated.parallelism.data_parallel_replicate_degree = 2;
        let mut longer = spec.clone();
        longer.training.steps *= 2;
        assert_eq!(shape(&spec), shape(&longer));
        for other in [wider, deeper, replicated] {
            assert_ne!(shape(&spec), shape(&other));
        }
    }

    /// A job needing more workers than stream waits for workers to join, not for jobs to
    /// end: the jobs behind it start as if it were not there.
    #[test]
    fn a_job_larger_than_the_cluster_holds_nothing_up() {
        let running = [started(4, 100.0)];
        let queue = [queued(1, 10, 50.0), queued(2, 4, 500.0)];
        assert_eq!(starts(&queue, 4, 8, &running), [2]);
    }
}
