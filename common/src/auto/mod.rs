//! The auto-planner: picks the layer partition, microbatch size and schedule that maximise
//! predicted throughput while fitting a per-worker memory budget.
//!
//! # What it searches
//!
//! For every microbatch size `b` dividing the global batch (`n = global_batch / b`
//! microbatches) and every kind in [`auto_kinds`], the planner
//!
//! 1. takes the kind's placement on `d` workers (`S` stages; interleaved 1F1B with
//!    [`INTERLEAVED_CHUNKS`] chunks, only when `n` is a multiple of `d`);
//! 2. splits the model's pieces ([`ModelSpec::pieces`]: embedding, blocks, head) into `S`
//!    contiguous non-empty stages with [`balance`]: the largest stage time `F + B + W` first,
//!    then the largest stage parameter count, then the spread of the stage times. The LM head
//!    costs about `2V / (24h + 4t)` blocks of compute, so the last stage gets fewer blocks;
//!    the embedding costs almost no compute but `V·h` parameters, so the parameter tie-break
//!    gives the first stage fewer blocks where the time balance leaves room (torchtitan's
//!    "first and last stage hold fewer layers");
//! 3. checks the static memory of every worker: parameters, gradients and AdamW state,
//!    [`DType::training_state_bytes`](crate::model::DType::training_state_bytes) bytes per parameter;
//! 4. generates the schedule with the stage costs and simulates it; the adaptive kinds are
//!    searched under one activation limit for every worker: the budget minus the smallest
//!    static state if the schedule found then fits every worker, else the largest limit
//!    found by bisection down to the budget minus the largest static state (which always
//!    fits) whose schedule fits every worker; when no limit fits in the room on the fullest
//!    worker, the schedule at the smallest limit the search accepts is tried too (its peaks
//!    may fall on emptier workers). The budget a rejected adaptive kind is reported to need
//!    is what that least-memory schedule needs on its fullest worker, so that budget gets it;
//! 5. keeps it if every worker's static bytes plus simulated activation peak fit.
//!
//! The fitting plans are ranked by predicted step time (throughput is `global_batch ·
//! seq_len / step`, the same for every plan), then by the largest per-worker memory.
//!
//! Left out: `eager-1f1b` (1F1B with more memory for no modelled gain), `looped-bfs`
//! (GPipe-like memory on the loop placement) and `dualpipe-v` (its overlap of F with B is
//! not modelled by the simulator, so its step time would be pessimistic).
//!
//! # Cost model
//!
//! - Pass times in milliseconds. Without measured times every piece's F, B and W each take
//!   `piece_flops / DEFAULT_FLOPS_PER_MS`. With [`LayerTimes`] (measured F, B, W of one
//!   transformer block at some microbatch size) every piece's times are those, scaled by
//!   the piece's FLOPs at the planned microbatch size over a block's FLOPs at the measured
//!   one (linear in the microbatch size; the embedding and head by their FLOPs ratio).
//! - Activation bytes held per microbatch by a stage: the larger of what its pieces stash
//!   after F and what they still hold after B ([`ModelSpec::piece_activation_bytes`]),
//!   allocated when F starts and freed when W (or BW) ends. This is conservative: it never
//!   releases anything at B and charges the larger stash for the whole F → W span.
//! - Communication: `comm_ms` on every hop between workers.
//!
//! [`ModelSpec::pieces`]: crate::model::ModelSpec::pieces
//! [`ModelSpec::piece_activation_bytes`]: crate::model::ModelSpec::piece_activation_bytes
//!
//! # Files
//!
//! - `request`: the request and the per-piece costs;
//! - `search`: every configuration planned, the fitting ones ranked ([`auto_plan`]);
//! - `configuration`: planning one configuration;
//! - `activation_limit`: the activation limit an adaptive kind is searched under;
//! - `worker_memory`: what each worker holds;
//! - `candidate`: the answer's types;
//! - `job`: the search for a job that says `schedule = "auto"`, on its workers with its
//!   cost model's costs ([`job::choose_for_job`]).
//!
//! The partition search itself is [`crate::partition::balance`].

mod activation_limit;
mod candidate;
mod configuration;
pub mod job;
mod request;
mod search;
mod worker_memory;

/// The auto-planner's balanced partition search (kept here for its old path).
pub use crate::partition::balance;
pub use activation_limit::{ADAPTIVE_ASCENT_STEPS, ADAPTIVE_DESCENT_STEPS};
pub use candidate::{
    AutoPlan, Candidate, Configuration, Rejected, Why, partition_summary, recompute_summary,
};
pub use configuration::{INTERLEAVED_CHUNKS, MAX_ADAPTIVE_SHAPE, MAX_FIXED_SHAPE};
pub use request::{
    AutoRequest, DEFAULT_FLOPS_PER_MS, DEFAULT_SUM_MS_PER_VALUE, Fixed, LayerTimes, Measured,
    RecomputeSearch, Replicas, slowest_per_rank,
};
pub use search::{auto_kinds, auto_plan};

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;
    use std::ops::Range;

    use super::candidate::Outcome;
    use super::configuration::plan_one;
    use super::request::piece_costs;
    use super::*;
    use crate::error::Error;
    use crate::generate::ScheduleKind;
    use crate::model::{ModelSpec, Piece};

    fn spec(layers: u32, vocab: u32) -> ModelSpec {
        ModelSpec {
            vocab,
            hidden: 64,
            heads: 4,
            layers,
            seq_len: 32,
            dtype: crate::model::DType::BF16,
            ..Default::default()
        }
    }

    fn request(layers: u32, vocab: u32, workers: u32, memory: u64) -> AutoRequest {
        AutoRequest::new(spec(layers, vocab), 8, workers, memory, 3)
    }

    #[test]
    fn heavy_head_and_embedding_get_fewer_blocks() {
        // Vocabulary 4096, h = 64, t = 32: the head costs 2V/(24h + 4t) ≈ 4.9 blocks of
        // compute and the embedding V/(12h) ≈ 5 blocks of parameters. The head's stage
        // (head + 1 block ≈ 5.9) sets the largest time; the parameter tie-break then moves
        // blocks away from the embedding's stage: 3 | 5 | 5 | 1.
        let req = request(14, 4096, 4, u64::MAX);
        let pieces = piece_costs(&req, 1);
        let times: Vec<f64> = pieces.iter().map(|p| p.f + p.b + p.w).collect();
        let params: Vec<u64> = pieces.iter().map(|p| p.params).collect();
        let p = balance(&times, &params, 4).unwrap();
        let last = req.spec.layers as usize + 1;
        let blocks = |r: &Range<usize>| r.end.min(last).saturating_sub(r.start.max(1));
        let counts: Vec<usize> = p.iter().map(blocks).collect();
        assert_eq!(counts.iter().sum::<usize>(), 14);
        let most = *counts.iter().max().unwrap();
        assert!(counts[0] < most, "{counts:?}");
        assert!(counts[3] < most, "{counts:?}");
        let text = partition_summary(&req.spec, &p);
        assert!(text.starts_with("emb+"), "{text}");
        assert!(text.ends_with("head"), "{text}");
        // A tiny vocabulary: the blocks split evenly.
        let req = request(16, 8, 4, u64::MAX);
        let pieces = piece_costs(&req, 1);
        let times: Vec<f64> = pieces.iter().map(|p| p.f + p.b + p.w).collect();
        let params: Vec<u64> = pieces.iter().map(|p| p.params).collect();
        let p = balance(&times, &params, 4).unwrap();
        assert_eq!(partition_summary(&req.spec, &p), "emb+4 | 4 | 4 | 4+head");
    }

    #[test]
    fn rejects_bad_requests() {
        let good = request(4, 256, 2, 1 << 30);
        assert!(good.validate().is_ok());
        let cases: [(&str, AutoRequest); 6] = [
            (
                "global batch",
                AutoRequest {
                    global_batch: 0,
                    ..good.clone()
                },
            ),
            (
                "workers",
                AutoRequest {
                    workers: 0,
                    ..good.clone()
                },
            ),
            (
                "memory per worker",
                AutoRequest {
                    memory_per_worker: 0,
                    ..good.clone()
                },
            ),
            (
                "times",
                AutoRequest {
                    comm_ms: f64::NAN,
                    ..good.clone()
                },
            ),
            (
                "layer times",
                AutoRequest {
                    layer_times: Some(LayerTimes {
                        f: 1.0,
                        b: -1.0,
                        w: 1.0,
                        microbatch_size: 1,
                    }),
                    ..good.clone()
                },
            ),
            (
                "heads",
                AutoRequest {
                    spec: ModelSpec {
                        heads: 5,
                        ..good.spec.clone()
                    },
                    ..good.clone()
                },
            ),
        ];
        for (want, req) in cases {
            match auto_plan(&req) {
                Err(Error::InvalidArgument { field, .. }) => assert_eq!(field, want),
                other => panic!("expected {want}, got {other:?}"),
            }
        }
    }

    #[test]
    fn rejection_reasons() {
        let loose = auto_plan(&request(4, 256, 2, u64::MAX)).unwrap();
        assert_eq!(loose.ranked.len(), 3);
        assert!(
            loose
                .ranked
                .windows(2)
                .all(|w| w[0].step_ms <= w[1].step_ms)
        );
        // Everything fitting beyond the top 3 is reported slower than the best.
        let slower: Vec<&Rejected> = loose
            .rejected
            .iter()
            .filter(|r| r.why == Why::Slower)
            .collect();
        assert_eq!(slower.len(), loose.fitting - 3);
        for r in &slower {
            assert!(r.reason.starts_with("slower: step"), "{}", r.reason);
            assert!(r.step_ms.unwrap() >= loose.ranked[0].step_ms);
        }
        // 2 workers, 4 layers: V placements have 4 stages ≤ 6 pieces; 16 pieces never.
        assert!(loose.rejected.iter().all(|r| r.why != Why::DoesNotFit));

        // A budget between the smallest and the largest plan: some do not fit, with the
        // bytes they need above the budget.
        let mut needs: Vec<u64> = loose
            .ranked
            .iter()
            .map(|c| c.max_worker_bytes)
            .chain(loose.rejected.iter().filter_map(|r| r.needed_bytes))
            .collect();
        needs.sort_unstable();
        let budget = needs[needs.len() / 2];
        let mid = auto_plan(&request(4, 256, 2, budget)).unwrap();
        assert!(
            mid.ranked
                .iter()
                .all(|c| c.fits && c.max_worker_bytes <= budget)
        );
        let no_fit: Vec<&Rejected> = mid
            .rejected
            .iter()
            .filter(|r| r.why == Why::DoesNotFit)
            .collect();
        assert!(!no_fit.is_empty());
        for r in no_fit {
            assert!(r.reason.starts_with("does not fit"), "{}", r.reason);
            assert!(r.needed_bytes.is_none_or(|b| b > budget), "{r:?}");
        }

        // Far below every plan: a clear error naming the smallest need; that budget fits.
        let smallest = match auto_plan(&request(4, 256, 2, 1000)) {
            Err(Error::InvalidArgument { field, reason }) => {
                assert_eq!(field, "memory per worker");
                let tail = reason.split("the smallest plan needs ").nth(1).unwrap();
                tail.split(' ').next().unwrap().parse::<u64>().unwrap()
            }
            other => panic!("expected a memory error, got {other:?}"),
        };
        assert!(smallest <= needs[0]);
        let at = auto_plan(&request(4, 256, 2, smallest)).unwrap();
        assert!(at.ranked.iter().all(|c| c.max_worker_bytes <= smallest));
        // Parameters alone over budget name the static state.
        let tiny = auto_plan(&request(4, 256, 2, 1000));
        assert!(matches!(tiny, Err(Error::InvalidArgument { .. })));
        let r = plan_one(
            &request(4, 256, 2, 1000),
            ScheduleKind::OneFOneB,
            1,
            8,
            &piece_costs(&request(4, 256, 2, 1000), 1),
            12,
            &mut BTreeMap::new(),
        )
        .unwrap();
        match r {
            Outcome::Rejected(r) => {
                assert!(
                    r.reason.contains("parameters and optimizer state"),
                    "{}",
                    r.reason
                )
            }
            Outcome::Planned(_) => panic!("1000 bytes cannot fit"),
        }
    }

    #[test]
    fn too_many_stages_are_skipped() {
        // 1 layer = 3 pieces; V on 2 workers needs 4 stages.
        let plan = auto_plan(&request(1, 256, 2, u64::MAX)).unwrap();
        assert!(
            plan.rejected
                .iter()
                .any(|r| r.config.kind == ScheduleKind::VMin
                    && r.why == Why::Skipped
                    && r.reason.contains("only 3 pieces"))
        );
        assert!(plan.ranked.iter().all(|c| c.partition.len() == 2));
    }

    #[test]
    fn too_few_layers_for_the_workers_name_the_shape_not_the_budget() {
        // 1 layer = 3 pieces, 4 workers need 4 stages: nothing can be planned at any budget.
        match auto_plan(&request(1, 256, 4, u64::MAX)) {
            Err(Error::InvalidArgument { field, reason }) => {
                assert_eq!(field, "workers");
                assert!(reason.contains("only 3 pieces"), "{reason}");
            }
            other => panic!("expected an error naming the workers, got {other:?}"),
        }
    }

    #[test]
    fn measured_times_scale_with_flops() {
        let mut req = request(4, 256, 2, u64::MAX);
        req.layer_times = Some(LayerTimes {
            f: 2.0,
            b: 3.0,
            w: 1.0,
            microbatch_size: 2,
        });
        let pieces = piece_costs(&req, 4);
        // Block at microbatch 4 = twice the measured block at 2.
        assert!((pieces[1].f - 4.0).abs() < 1e-12);
        assert!((pieces[1].b - 6.0).abs() < 1e-12);
        assert!((pieces[1].w - 2.0).abs() < 1e-12);
        let ratio = req.spec.piece_flops(Piece::Head, 4) / req.spec.piece_flops(Piece::Block(0), 2);
        assert!((pieces[5].f - 2.0 * ratio).abs() < 1e-12);
    }

    /// Every replica count of 4 workers (16 layers, so every shape has pieces enough).
    fn weighing(sum_ms_per_value: f64, memory: u64) -> AutoRequest {
        let mut req = request(16, 256, 4, memory);
        req.global_batch = 16;
        req.top = 1000;
        req.replicas = Replicas {
            count: None,
            sum_ms_per_value,
        };
        req
    }

    #[test]
    fn replicas_are_weighed_against_pipeline_depth() {
        // Free sums: four replicas of one worker have no bubble and win.
        let plan = auto_plan(&weighing(0.0, u64::MAX)).unwrap();
        let shapes: std::collections::BTreeSet<(u32, u32)> = plan
            .ranked
            .iter()
            .map(|c| (c.config.replicas, c.degree()))
            .collect();
        assert_eq!(
            shapes.into_iter().collect::<Vec<_>>(),
            vec![(1, 4), (2, 2), (4, 1)]
        );
        let best = &plan.ranked[0];
        assert_eq!(
            (best.config.replicas, best.degree()),
            (4, 1),
            "{}",
            best.label()
        );
        assert!(best.label().starts_with("4× "), "{}", best.label());
        // Each replica takes its share of the batch; throughput counts the whole batch.
        assert_eq!(best.config.microbatch_size * best.config.microbatches, 4);
        let tokens = 16.0 * f64::from(spec(16, 256).seq_len);
        assert!((best.tokens_per_s - tokens / (best.step_ms / 1e3)).abs() < 1e-6 * tokens);
        // Dear sums (a second per value): one pipeline of four, which sums nothing.
        let plan = auto_plan(&weighing(1e3, u64::MAX)).unwrap();
        let best = &plan.ranked[0];
        assert_eq!(
            (best.config.replicas, best.degree()),
            (1, 4),
            "{}",
            best.label()
        );
        // A replicated plan's step waits for its sums: at least stage 0's, a second each.
        let s = spec(16, 256);
        let params: Vec<u64> = s.pieces().into_iter().map(|p| s.piece_params(p)).collect();
        let two = plan.ranked.iter().find(|c| c.config.replicas == 2).unwrap();
        let stage0: u64 = params[two.partition[0].clone()].iter().sum();
        assert!(two.step_ms >= stage0 as f64 * 1e3, "{} ms", two.step_ms);
    }

    #[test]
    fn replicas_need_each_worker_to_hold_its_whole_stage_group() {
        // The four-deep pipeline's own need fits it and no shape of fewer, larger stages.
        let all = auto_plan(&weighing(0.0, u64::MAX)).unwrap();
        let deepest = all.ranked.iter().find(|c| c.config.replicas == 1).unwrap();
        let plan = auto_plan(&weighing(0.0, deepest.max_worker_bytes)).unwrap();
        assert!(
            plan.ranked.iter().all(|c| c.config.replicas == 1),
            "{}",
            plan.ranked[0].label()
        );
        assert!(
            plan.rejected
                .iter()
                .any(|r| r.config.replicas == 4 && r.why == Why::DoesNotFit)
        );
        // A count that does not divide the batch names the field.
        let mut odd = weighing(0.0, u64::MAX);
        odd.replicas.count = Some(3);
        let err = odd.validate().unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidArgument {
                    field: "replicas",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn a_shape_plans_each_rank_at_its_slowest_replicas_speed() {
        let mut req = weighing(0.0, u64::MAX);
        req.measured = Some(Measured {
            pieces: [[1.0; 3]; 3],
            microbatch_size: 1,
            worker_factors: vec![1.0, 2.0, 3.0, 0.5],
            hop_ms_per_sequence: 0.0,
        });
        req.validate().unwrap();
        // Replica-major: replica 0 is workers 0 and 1, replica 1 workers 2 and 3.
        let two = req.shape((2, 2));
        assert_eq!((two.workers, two.global_batch), (2, 8));
        assert_eq!(two.replicas.count, Some(2));
        assert_eq!(two.measured.unwrap().worker_factors, vec![3.0, 2.0]);
        let one = req.shape((4, 1));
        assert_eq!(one.measured.unwrap().worker_factors, vec![3.0]);
    }
}
