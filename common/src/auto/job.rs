//! `pipeline_parallel_schedule = "auto"` for a job: the search ([`auto_plan`]) run with the
//! job's model and batch, what the job fixes (its microbatch size, torchtitan's layer
//! split), the workers' memory and a cost model's costs, turned into the spec, plan and
//! split the job runs, with what was chosen and why in words.

use super::candidate::{Candidate, partition_summary, recompute_summary};
use super::configuration::INTERLEAVED_CHUNKS;
use super::request::{
    AutoRequest, DEFAULT_SUM_MS_PER_VALUE, Fixed, Measured, RecomputeSearch, Replicas,
};
use super::search::auto_plan;
use crate::error::{Error, Result};
use crate::job::{ActivationCheckpoint, JobPlan, JobSpec, RecomputeRequest};
use crate::render::report::fmt_bytes;

/// One plan the search ranked, as shown.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Ranked {
    /// Schedule name.
    pub schedule: String,
    /// Stages per worker.
    pub chunks: u32,
    /// Microbatches per step.
    pub microbatches: u32,
    /// Sequences per microbatch.
    pub microbatch_size: u32,
    /// Data-parallel replicas, each running the plan on its share of the batch.
    pub replicas: u32,
    /// Pieces per stage, e.g. `emb+1 | 1 | 1 | 1+head`.
    pub split: String,
    /// Predicted step time (ms): the simulated makespan plus the end-of-step sync.
    pub predicted_ms: f64,
    /// Which stages recompute (empty: none).
    pub recompute: String,
}

impl Ranked {
    fn of(spec: &JobSpec, c: &Candidate, sync_ms: f64) -> Ranked {
        Ranked {
            schedule: c.config.kind.name().to_string(),
            chunks: c.partition.len() as u32 / spec.parallelism.pipeline_parallel_degree.max(1),
            microbatches: c.config.microbatches,
            microbatch_size: c.config.microbatch_size,
            replicas: spec.replicas(),
            split: partition_summary(&spec.model, &c.partition),
            predicted_ms: c.step_ms + sync_ms,
            recompute: recompute_summary(&c.recompute),
        }
    }

    /// `v-half (2 chunks), 8 microbatches × 4, split emb+1 | 1 | 1 | 1+head, predicted 812.3 ms`
    /// (with replicas `2 replicas of 8 microbatches × 4`).
    pub fn text(&self) -> String {
        let replicas = match self.replicas {
            0 | 1 => String::new(),
            r => format!("{r} replicas of "),
        };
        let recompute = match self.recompute.as_str() {
            "" => String::new(),
            r => format!(", {r}"),
        };
        format!(
            "{} ({} chunk{}), {replicas}{} microbatches × {}, split {}{recompute}, predicted \
             {:.1} ms",
            self.schedule,
            self.chunks,
            if self.chunks == 1 { "" } else { "s" },
            self.microbatches,
            self.microbatch_size,
            self.split,
            self.predicted_ms
        )
    }
}

/// One plan auto may run a job on: the spec, plan and split the job runs under it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PlanOption {
    /// The spec the job runs: the schedule, chunks and microbatch size of this plan.
    #[serde(skip)]
    pub spec: JobSpec,
    /// The plan.
    #[serde(skip)]
    pub plan: JobPlan,
    /// Pieces per stage of its split.
    pub stage_pieces: Vec<u32>,
    /// The plan as shown.
    pub shown: Ranked,
}

/// What auto chose for a job on its workers.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct JobChoice {
    /// The fastest predicted plan that fits.
    pub best: PlanOption,
    /// The next fastest plans that fit, in predicted order (at most [`OPTIONS`] − 1).
    pub others: Vec<PlanOption>,
    /// Plans that fit the memory.
    pub fitting: usize,
    /// The memory budget per worker (bytes).
    pub memory_per_worker: u64,
}

/// Plans a choice keeps: the best and the next ones a trial may measure.
pub const OPTIONS: usize = 4;

impl JobChoice {
    /// What was chosen and why, in one line (`costs`: where the costs came from).
    pub fn text(&self, costs: &str) -> String {
        let best = &self.best.shown;
        let runner_up = match self.others.first() {
            Some(r) => format!(
                "; runner-up {} ({:+.1} %)",
                r.shown.text(),
                100.0 * (r.shown.predicted_ms / best.predicted_ms.max(f64::MIN_POSITIVE) - 1.0)
            ),
            None => "; no other plan fits".into(),
        };
        let budget = if self.memory_per_worker == u64::MAX {
            "no memory registered".to_string()
        } else {
            format!("{} per worker", fmt_bytes(self.memory_per_worker as f64))
        };
        format!(
            "auto chose {}{runner_up}; fastest predicted of {} plans fitting {budget}, costs {costs}",
            best.text(),
            self.fitting,
        )
    }

    /// The plans predicted within `band` (0.05: 5 %) of the best, best first: those a
    /// measurement may tell apart where the prediction cannot.
    pub fn within(&self, band: f64) -> Vec<&PlanOption> {
        let limit = self.best.shown.predicted_ms * (1.0 + band);
        std::iter::once(&self.best)
            .chain(self.others.iter().filter(|o| o.shown.predicted_ms <= limit))
            .collect()
    }
}

/// What a step costs beyond its passes and hops, as a job measured them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Overheads {
    /// The end-of-step sync, milliseconds.
    pub sync_ms: f64,
    /// Milliseconds per gradient value summed over data-parallel replicas
    /// ([`DEFAULT_SUM_MS_PER_VALUE`] before any sum).
    pub sum_ms_per_value: f64,
}

impl Default for Overheads {
    fn default() -> Self {
        Overheads {
            sync_ms: 0.0,
            sum_ms_per_value: DEFAULT_SUM_MS_PER_VALUE,
        }
    }
}

/// Chooses the plan of auto job `spec` on `workers` workers per replica (the spec's
/// `data_parallel_replicate_degree` replicas, each taking its share of the global batch) of
/// `memory_per_worker` bytes each (`u64::MAX`: not known) with `measured` costs (seconds
/// are milliseconds here; worker factors per rank, or replica by replica) and the step's
/// `overheads`. The job's microbatch size (when its file gives one) and torchtitan layer
/// split are kept; everything else is searched. Errors name the job field.
pub fn choose_for_job(
    spec: &JobSpec,
    workers: u32,
    memory_per_worker: u64,
    mut measured: Measured,
    overheads: Overheads,
) -> Result<JobChoice> {
    let p = &spec.parallelism;
    measured.slowest_per_rank(workers);
    let replicas = Replicas {
        count: Some(spec.replicas()),
        sum_ms_per_value: overheads.sum_ms_per_value,
    };
    let split = (p.pipeline_parallel_first_stage_less_layers != 0
        || p.pipeline_parallel_last_stage_less_layers != 0
        || p.pipeline_parallel_layers_per_stage.is_some()
        || p.torchtitan_split)
        .then_some((
            p.pipeline_parallel_first_stage_less_layers,
            p.pipeline_parallel_last_stage_less_layers,
            p.pipeline_parallel_layers_per_stage,
        ));
    let request = AutoRequest {
        measured: Some(measured),
        fixed: Fixed {
            microbatch_size: (!p.search_microbatch_size)
                .then_some(p.pipeline_parallel_microbatch_size),
            split,
        },
        replicas,
        recompute: match spec.activation_checkpoint.request()? {
            RecomputeRequest::Every(mode) => RecomputeSearch::Every(mode),
            RecomputeRequest::WhereNeeded => RecomputeSearch::WhereNeeded,
            RecomputeRequest::PerStage(_) => {
                return Err(Error::invalid(
                    "activation_checkpoint.per_stage",
                    "auto plans its own stages; use mode = \"auto\"",
                ));
            }
        },
        ..AutoRequest::new(
            spec.model.clone(),
            spec.training.global_batch_size,
            workers,
            memory_per_worker,
            OPTIONS,
        )
    };
    let found = auto_plan(&request).map_err(|e| match e {
        Error::InvalidArgument { field, reason } => Error::invalid(
            "parallelism.pipeline_parallel_schedule",
            format!("{} (auto: {field})", reason),
        ),
        other => other,
    })?;
    let mut options = found.ranked.into_iter().map(|c| {
        let mut chosen = spec.clone();
        let cp = &mut chosen.parallelism;
        cp.pipeline_parallel_schedule = c.config.kind.name().to_string();
        cp.pipeline_parallel_microbatch_size = c.config.microbatch_size;
        cp.pipeline_parallel_chunks = INTERLEAVED_CHUNKS;
        cp.pipeline_parallel_degree = workers;
        cp.search_microbatch_size = false;
        cp.memory_limit = None;
        chosen.activation_checkpoint = ActivationCheckpoint::of_stages(&c.recompute);
        PlanOption {
            shown: Ranked::of(&chosen, &c, overheads.sync_ms),
            stage_pieces: c.partition.iter().map(|r| r.len() as u32).collect(),
            plan: JobPlan {
                kind: c.config.kind,
                microbatches: c.config.microbatches,
                schedule: c.schedule,
                recompute: c.recompute,
            },
            spec: chosen,
        }
    });
    let best = options.next().ok_or_else(|| {
        Error::invalid(
            "parallelism.pipeline_parallel_schedule",
            "auto found no plan for the workers",
        )
    })?;
    Ok(JobChoice {
        best,
        others: options.collect(),
        fitting: found.fitting,
        memory_per_worker,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::cost::Costs;
    use crate::generate::{Request, ScheduleKind, generate_with};
    use crate::job::{AUTO_SCHEDULE, example};
    use crate::simulate::simulate;

    /// The field and reason of an `InvalidArgument`; panics on anything else.
    fn invalid<T: std::fmt::Debug>(r: Result<T>) -> (&'static str, String) {
        match r {
            Err(Error::InvalidArgument { field, reason }) => (field, reason),
            other => panic!("expected an invalid argument, got {other:?}"),
        }
    }

    /// Measured costs: a block F = 1, B = 1, W = 1 ms; a head of `head` blocks; `factors`.
    fn measured(head: f64, factors: Vec<f64>) -> Measured {
        Measured {
            pieces: [[0.05, 0.01, 0.05], [1.0, 1.0, 1.0], [head, head, head]],
            microbatch_size: 1,
            worker_factors: factors,
            hop_ms_per_sequence: 0.0,
        }
    }

    /// An end-of-step sync of `sync_ms` and the default sum cost.
    fn sync(sync_ms: f64) -> Overheads {
        Overheads {
            sync_ms,
            ..Overheads::default()
        }
    }

    /// An auto job of 8 blocks on `d` workers, a global batch of 8 at a fixed microbatch
    /// size of 1.
    fn job(d: u32) -> JobSpec {
        let mut spec = example(d, AUTO_SCHEDULE);
        spec.validate().unwrap();
        spec.parallelism.search_microbatch_size = false;
        spec
    }

    /// The costs of `placement`'s stages holding `counts` pieces each under `m`, built here
    /// from scratch (not by the search).
    fn costs(placement: &crate::placement::Placement, counts: &[u32], m: &Measured) -> Costs {
        let ranges = crate::partition::by_counts(10, counts).unwrap();
        let stages = ranges
            .iter()
            .enumerate()
            .map(|(s, r)| {
                let k = m.worker_factors[placement.worker_of(s as u32) as usize];
                // Piece 0 is the embedding, 9 the head, the others blocks.
                let sum = |i: usize| {
                    k * r
                        .clone()
                        .map(|p| m.pieces[p.min(1) + usize::from(p == 9)][i])
                        .sum::<f64>()
                };
                crate::cost::StageCost {
                    f: sum(0),
                    b: sum(1),
                    w: sum(2),
                    mem: 1.0,
                }
            })
            .collect();
        Costs::per_stage(placement, stages, 0.0).unwrap()
    }

    /// The step time of fixed `kind` on `counts` pieces per stage under `m`.
    fn predicted(kind: ScheduleKind, counts: &[u32], m: &Measured, d: u32, n: u32) -> f64 {
        let costs = costs(&kind.placement(d, INTERLEAVED_CHUNKS), counts, m);
        let request = Request {
            chunks: INTERLEAVED_CHUNKS,
            ..Request::new(kind, d, n)
        };
        let schedule = generate_with(&request, &|_| Ok(costs.clone())).unwrap();
        simulate(&schedule, &costs).unwrap().makespan
    }

    /// The choice is the fastest of the fixed kinds on their balanced splits, each
    /// re-simulated here; the runner-up is no faster; the plan is the chosen kind's.
    #[test]
    fn picks_the_plan_with_the_best_predicted_time() {
        let m = measured(3.0, vec![1.0, 1.0]);
        let choice = choose_for_job(&job(2), 2, u64::MAX, m.clone(), sync(0.5)).unwrap();
        let best = &choice.best.shown;
        let runner_up = &choice.others[0].shown;
        assert!(best.predicted_ms <= runner_up.predicted_ms, "{choice:?}");
        assert_eq!(choice.best.plan.kind.name(), best.schedule);
        assert_eq!(
            choice.best.spec.parallelism.pipeline_parallel_schedule,
            best.schedule
        );
        let schedule = &choice.best.plan.schedule;
        let own = simulate(
            schedule,
            &costs(&schedule.placement, &choice.best.stage_pieces, &m),
        )
        .unwrap()
        .makespan;
        assert!(
            (own + 0.5 - best.predicted_ms).abs() < 1e-9,
            "{own} vs {best:?}"
        );
        for kind in [
            ScheduleKind::GPipe,
            ScheduleKind::OneFOneB,
            ScheduleKind::ZbH1,
        ] {
            let counts = crate::partition::split_for_speeds(
                &[0.11, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 9.0],
                &[0, 1],
                &[1.0, 1.0],
            )
            .unwrap();
            let fixed = predicted(kind, &counts, &m, 2, 8) + 0.5;
            assert!(
                best.predicted_ms <= fixed + 1e-9,
                "{kind}: {fixed} < {best:?}"
            );
        }
        // The heavy head's stage holds fewer blocks than the embedding's.
        let text = choice.text("from the start-up profile");
        assert!(text.starts_with("auto chose "), "{text}");
        assert!(text.contains("runner-up"), "{text}");
    }

    /// A worker three times as slow gets fewer pieces; the budget excludes plans that need
    /// more memory than the smallest registered.
    #[test]
    fn slow_workers_and_memory_budgets_are_respected() {
        let with = |factors| {
            choose_for_job(&job(2), 2, u64::MAX, measured(1.0, factors), sync(0.0)).unwrap()
        };
        let (even, slow) = (with(vec![1.0, 1.0]), with(vec![1.0, 3.0]));
        let held = |c: &JobChoice, w: u32| -> u32 {
            let placement = c.best.plan.schedule.placement.clone();
            placement
                .stages_of(w)
                .iter()
                .map(|&s| c.best.stage_pieces[s as usize])
                .sum()
        };
        assert!(held(&slow, 1) < held(&even, 1), "{slow:?}");
        assert!(slow.best.shown.predicted_ms > even.best.shown.predicted_ms);

        // The chosen plan's own need, one byte less: something else, which fits.
        let req_plan = |memory: u64| {
            choose_for_job(&job(2), 2, memory, measured(1.0, vec![1.0, 1.0]), sync(0.0))
        };
        let plan = auto_plan(&AutoRequest {
            measured: Some(measured(1.0, vec![1.0, 1.0])),
            fixed: Fixed {
                microbatch_size: Some(1),
                split: None,
            },
            ..AutoRequest::new(job(2).model, 8, 2, u64::MAX, 1)
        })
        .unwrap();
        let need = plan.ranked[0].max_worker_bytes;
        let tight = req_plan(need - 1).unwrap();
        assert_ne!(
            (tight.best.plan.kind, &tight.best.stage_pieces),
            (even.best.plan.kind, &even.best.stage_pieces)
        );
        assert_eq!(tight.memory_per_worker, need - 1);
        assert!(tight.text("x").contains("per worker"));
        let (field, reason) = invalid(req_plan(1000));
        assert_eq!(field, "parallelism.pipeline_parallel_schedule");
        assert!(reason.contains("memory per worker"), "{reason}");
    }

    /// A split for measured speeds that crowds the fast worker past the budget gives way
    /// to the balanced cut where only that fits.
    #[test]
    fn a_speed_split_past_the_budget_falls_back_to_the_balanced_cut() {
        let one_f_one_b = |factors: Vec<f64>, memory: u64| {
            let plan = auto_plan(&AutoRequest {
                measured: Some(measured(1.0, factors)),
                fixed: Fixed {
                    microbatch_size: Some(1),
                    split: None,
                },
                ..AutoRequest::new(job(2).model, 8, 2, memory, 100)
            })
            .unwrap();
            plan.ranked
                .into_iter()
                .find(|c| c.config.kind == ScheduleKind::OneFOneB)
        };
        let even = one_f_one_b(vec![1.0, 1.0], u64::MAX).unwrap();
        let slow = one_f_one_b(vec![1.0, 4.0], u64::MAX).unwrap();
        assert_ne!(slow.partition, even.partition);
        assert!(
            even.max_worker_bytes < slow.max_worker_bytes,
            "{} against {}",
            even.max_worker_bytes,
            slow.max_worker_bytes
        );
        let fitted = one_f_one_b(vec![1.0, 4.0], even.max_worker_bytes).unwrap();
        assert_eq!(fitted.partition, even.partition);
        assert!(fitted.fits);
    }

    /// With replicas the plan is one replica's pipeline on its share of the batch, split
    /// for the slowest worker of each rank over the replicas, its step ending with the
    /// gradient sums at the job's measured rate.
    #[test]
    fn replicas_plan_each_rank_for_its_slowest_worker() {
        let mut spec = job(2);
        spec.parallelism.data_parallel_replicate_degree = 2;
        // Replica 1's rank 1 is three times as slow as the rest.
        let by_replica = measured(1.0, vec![1.0, 1.0, 1.0, 3.0]);
        let c = choose_for_job(&spec, 2, u64::MAX, by_replica.clone(), sync(0.0)).unwrap();
        let per_rank = choose_for_job(&spec, 2, u64::MAX, measured(1.0, vec![1.0, 3.0]), sync(0.0));
        assert_eq!(c, per_rank.unwrap());
        let even =
            choose_for_job(&spec, 2, u64::MAX, measured(1.0, vec![1.0; 4]), sync(0.0)).unwrap();
        assert!(c.best.shown.predicted_ms > even.best.shown.predicted_ms);
        // 8 sequences, microbatches of 1: 4 on each replica.
        assert_eq!(c.best.plan.microbatches, 4);
        assert_eq!(c.best.spec.replicas(), 2);
        assert_eq!(c.best.spec.parallelism.pipeline_parallel_degree, 2);
        assert!(
            c.text("x").contains("2 replicas of 4 microbatches × 1"),
            "{c:?}"
        );
        let slow_sums = Overheads {
            sum_ms_per_value: 1.0,
            ..sync(0.0)
        };
        let slow_sums = choose_for_job(&spec, 2, u64::MAX, by_replica, slow_sums).unwrap();
        assert!(slow_sums.best.shown.predicted_ms > c.best.shown.predicted_ms);
        // One replica: no sum to wait for.
        let one = choose_for_job(
            &job(2),
            2,
            u64::MAX,
            measured(1.0, vec![1.0, 1.0]),
            sync(0.0),
        );
        let slow_sums = Overheads {
            sum_ms_per_value: 1.0,
            ..sync(0.0)
        };
        let one_slow_sums = choose_for_job(
            &job(2),
            2,
            u64::MAX,
            measured(1.0, vec![1.0, 1.0]),
            slow_sums,
        );
        assert_eq!(one.unwrap(), one_slow_sums.unwrap());
    }

    /// The job's microbatch size and layer split are kept; without a size in the file the
    /// size is searched.
    #[test]
    fn what_the_job_fixes_is_kept() {
        let mut spec = job(2);
        spec.parallelism.pipeline_parallel_microbatch_size = 2;
        let c =
            choose_for_job(&spec, 2, u64::MAX, measured(1.0, vec![1.0, 1.0]), sync(0.0)).unwrap();
        assert_eq!(c.best.spec.parallelism.pipeline_parallel_microbatch_size, 2);
        assert_eq!(c.best.plan.microbatches, 4);
        spec.parallelism.pipeline_parallel_first_stage_less_layers = 2;
        let c =
            choose_for_job(&spec, 2, u64::MAX, measured(1.0, vec![1.0, 1.0]), sync(0.0)).unwrap();
        let stages = c.best.plan.schedule.placement.stages();
        let want = spec.parallelism.stage_pieces(8, stages).unwrap().unwrap();
        assert_eq!(c.best.stage_pieces, want);
        // Searched: the size the plan runs divides the batch, and several were tried.
        let mut spec = job(2);
        spec.parallelism.search_microbatch_size = true;
        let c =
            choose_for_job(&spec, 2, u64::MAX, measured(1.0, vec![1.0, 1.0]), sync(0.0)).unwrap();
        let size = c.best.spec.parallelism.pipeline_parallel_microbatch_size;
        assert_eq!(size * c.best.plan.microbatches, 8);
        assert!(c.fitting > 8, "{c:?}");
    }

    /// Auto with a field it cannot honour, bad measured costs and unknown names are refused
    /// naming the field.
    #[test]
    fn bad_auto_jobs_name_the_field() {
        let mut spec = job(2);
        spec.parallelism.memory_limit = Some(2.0);
        let (field, reason) = invalid(spec.validate());
        assert_eq!(field, "parallelism.memory_limit");
        assert!(reason.contains("auto"), "{reason}");
        let mut spec = job(2);
        spec.parallelism.pipeline_parallel_schedule = "autoo".into();
        let err = spec.validate().unwrap_err().to_string();
        assert!(err.contains("known: auto,"), "{err}");
        let (field, reason) = invalid(choose_for_job(
            &job(2),
            2,
            u64::MAX,
            measured(1.0, vec![1.0]),
            sync(0.0),
        ));
        assert_eq!(field, "parallelism.pipeline_parallel_schedule");
        assert!(reason.contains("measured costs"), "{reason}");
        // Blocks per stage that no stage count auto searches allows.
        let mut spec = job(2);
        spec.parallelism.pipeline_parallel_layers_per_stage = Some(1);
        let (field, _) = invalid(spec.validate());
        assert_eq!(field, "parallelism.pipeline_parallel_layers_per_stage");
    }

    /// A job file without a microbatch size: auto searches it, and the TOML form keeps it
    /// unset through a round trip; with one, it is kept.
    #[test]
    fn the_microbatch_size_is_searched_only_when_the_file_gives_none() {
        let text = example(2, AUTO_SCHEDULE).to_toml().unwrap();
        let given = JobSpec::from_toml(&text).unwrap();
        assert!(!given.parallelism.search_microbatch_size);
        let absent = text.replace("pipeline_parallel_microbatch_size = 1\n", "");
        assert_ne!(absent, text);
        let spec = JobSpec::from_toml(&absent).unwrap();
        assert!(spec.parallelism.search_microbatch_size);
        spec.validate().unwrap();
        let again = spec.to_toml().unwrap();
        assert!(
            !again.contains("pipeline_parallel_microbatch_size"),
            "{again}"
        );
        assert_eq!(JobSpec::from_toml(&again).unwrap(), spec);
    }
}

/// How long a choice takes, printed (`cargo test --release -p pipewise-common --lib
/// auto::job::timing -- --ignored --nocapture`): the coordinator runs it at every run's
/// start, so it must not stall a step boundary.
#[cfg(test)]
mod timing {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::job::example;

    #[test]
    #[ignore = "prints timings; run by hand"]
    fn choice_time_at_two_and_eight_workers() {
        for (d, layers, batch) in [(2, 4, 32), (8, 16, 64), (8, 32, 128)] {
            let mut spec = example(d, crate::job::AUTO_SCHEDULE);
            spec.model.hidden = 256;
            spec.model.layers = layers;
            spec.model.seq_len = 128;
            spec.training.global_batch_size = batch;
            spec.parallelism.search_microbatch_size = true;
            let measured = Measured {
                pieces: [[0.5, 0.1, 0.5], [40.0, 50.0, 30.0], [60.0, 60.0, 60.0]],
                microbatch_size: 1,
                worker_factors: vec![1.0; d as usize],
                hop_ms_per_sequence: 0.1,
            };
            let start = std::time::Instant::now();
            let c = choose_for_job(
                &spec,
                d,
                1 << 32,
                measured,
                Overheads {
                    sync_ms: 1.0,
                    ..Overheads::default()
                },
            )
            .unwrap();
            println!(
                "d = {d}, {layers} blocks, batch {batch}: {:.3} s, {} fitting; {}",
                start.elapsed().as_secs_f64(),
                c.fitting,
                c.text("given")
            );
        }
    }
}
