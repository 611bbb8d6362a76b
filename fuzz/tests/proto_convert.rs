//! Fuzz target: the conversions from `pipewise.v1` messages into the domain types, where a
//! message from the network becomes a value the core, the coordinator or a worker trusts:
//! `Pass`, `Placement`, `ModelSpec` and `TraceSpan` (`pipewise_proto::convert`), a submitted
//! `JobSpec` with its overrides (the coordinator's `spec_of`, then the plan), a worker's
//! `Assignment` (the worker's decode and checks), and each of these from edited wire bytes.
//!
//! Properties: no panic and no hang; a refusal names the message's field; what converts
//! converts back to the same message; an assignment built as the coordinator builds it
//! from a planned job is accepted.

use std::collections::HashMap;
use std::sync::OnceLock;

use pipewise_common::Error;
use pipewise_common::job::{JobPlan, JobSpec, plan_job};
use pipewise_common::model::ModelSpec;
use pipewise_common::trace::Span;
use pipewise_common::{Pass, Placement};
use pipewise_coordinator::CoordinatorError;
use pipewise_coordinator::service::spec_of;
use pipewise_fuzz::arbitrary::{Result, Unstructured};
use pipewise_fuzz::{Verdict, job, mutate, run};
use pipewise_proto::convert::{ConvertError, decode_message, program_from_proto, program_to_proto};
use pipewise_proto::v1;
use pipewise_worker::node::check_assignment;
use prost::Message;

/// Cases `cargo test` runs (a few seconds in a debug build, the same cases every run); longer
/// runs set `PIPEWISE_FUZZ_SECS` or `PIPEWISE_FUZZ_CASES` (docs/fuzzing.md).
const CASES: u64 = 20_000;

/// The field a conversion error names.
fn field_of(e: &ConvertError) -> &'static str {
    match e {
        ConvertError::UnknownEnum { field, .. }
        | ConvertError::Unspecified { field }
        | ConvertError::Invalid { field, .. }
        | ConvertError::Missing { field } => field,
    }
}

/// A conversion's outcome: refused naming a field of `what`, or converted, and the value
/// sent again and converted back the same.
fn converted<T: PartialEq + std::fmt::Debug>(
    what: &str,
    result: std::result::Result<T, ConvertError>,
    round_trip: impl FnOnce(&T) -> std::result::Result<T, ConvertError>,
) -> Verdict {
    match result {
        Err(e) => {
            let field = field_of(&e);
            // A nested message's field is named by that message (`Pass.kind` in a span).
            let named = field.starts_with(what) || field.starts_with("Pass.");
            if named && !e.to_string().trim().is_empty() {
                Ok(format!("{what}: refused {field}"))
            } else {
                Err(format!("{what} refused naming {field:?}: {e}").into())
            }
        }
        Ok(value) => match round_trip(&value) {
            Ok(again) if again == value => Ok(format!("{what}: converted")),
            other => Err(format!("{what} {value:?} sent again converts as {other:?}").into()),
        },
    }
}

fn pass_message(u: &mut Unstructured<'_>) -> Result<v1::Pass> {
    Ok(v1::Pass {
        kind: mutate::enum_value(u, 4)?,
        stage: mutate::number_u32(u)?,
        mb: mutate::number_u32(u)?,
    })
}

fn placement_message(u: &mut Unstructured<'_>) -> Result<v1::Placement> {
    let (_, plan) = u.choose(plans())?;
    let mut m = v1::Placement::from(&plan.schedule.placement);
    for _ in 0..u.int_in_range(0..=3)? {
        match u.int_in_range(0..=6)? {
            0 => m.kind = mutate::enum_value(u, 4)?,
            1 => m.workers = mutate::number_u32(u)?,
            2 => m.chunks = mutate::number_u32(u)?,
            3 => m.worker_of.clear(),
            4 if !m.worker_of.is_empty() => {
                let i = u.choose_index(m.worker_of.len())?;
                m.worker_of[i] = u.int_in_range(0..=m.workers.saturating_add(1))?;
            }
            5 => m.worker_of.push(u.int_in_range(0..=4)?),
            _ => m.workers = u.int_in_range(0..=8)?,
        }
    }
    Ok(m)
}

fn model_message(u: &mut Unstructured<'_>) -> Result<v1::ModelSpec> {
    let (spec, _) = u.choose(plans())?;
    let mut m = v1::ModelSpec::from(&spec.model);
    for _ in 0..u.int_in_range(0..=3)? {
        let n = mutate::small_u32(u, 64)?;
        match u.int_in_range(0..=5)? {
            0 => m.vocab = n,
            1 => m.hidden = n,
            2 => m.heads = n,
            3 => m.layers = n,
            4 => m.seq_len = n,
            _ => m.dtype = mutate::enum_value(u, 3)?,
        }
    }
    Ok(m)
}

fn span_message(u: &mut Unstructured<'_>) -> Result<v1::TraceSpan> {
    let start = mutate::number_f64(u)?;
    Ok(v1::TraceSpan {
        kind: mutate::enum_value(u, 5)?,
        pass: if u.int_in_range(0..=7)? == 7 {
            None
        } else {
            Some(pass_message(u)?)
        },
        peer: mutate::number_u32(u)?,
        stage: mutate::number_u32(u)?,
        start,
        end: if u.arbitrary()? {
            start + f64::from(u.int_in_range(0..=100u8)?)
        } else {
            mutate::number_f64(u)?
        },
    })
}

/// The seed jobs with their plans.
fn plans() -> &'static [(JobSpec, JobPlan)] {
    static PLANS: OnceLock<Vec<(JobSpec, JobPlan)>> = OnceLock::new();
    PLANS.get_or_init(|| {
        job::seeds()
            .iter()
            .filter_map(|s| plan_job(s).ok().map(|p| (s.clone(), p)))
            .collect()
    })
}

/// Worker `w`'s assignment of a planned job, as the coordinator's run actor builds it.
fn assignment(u: &mut Unstructured<'_>) -> Result<v1::Assignment> {
    let (spec, plan) = u.choose(plans())?;
    let placement = &plan.schedule.placement;
    let w = u.choose_index(placement.workers() as usize)? as u32;
    let first_step = u64::from(u.int_in_range(0..=100u8)?);
    let stage_pieces = if u.arbitrary()? {
        spec.stage_ranges(placement)
            .map(|r| r.iter().map(|r| r.len() as u32).collect())
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    Ok(v1::Assignment {
        run: u.arbitrary()?,
        first_step: first_step.min(u64::from(spec.training.steps)),
        worker_index: w,
        placement: Some(placement.into()),
        program: program_to_proto(&plan.schedule.workers[w as usize]),
        peers: (0..placement.workers())
            .map(|i| (i, format!("http://127.0.0.1:{}", 7000 + i)))
            .collect::<HashMap<_, _>>(),
        microbatches: plan.microbatches,
        job_toml: spec.to_toml().unwrap_or_default(),
        stage_pieces,
        run_secret: Vec::new(),
        abandon: false,
        replica: 0,
        replicas: 1,
        collective_root: String::new(),
        resume_in_memory: false,
        copy_from: String::new(),
        offer_copies: false,
        grad_chain: Vec::new(),
        // A move's hand-over: the whole model held by one worker of the run before.
        handover: if u.arbitrary()? {
            vec![v1::HeldStage {
                stage: 0,
                first_piece: 0,
                end_piece: spec.model.layers + 2,
                address: "http://127.0.0.1:7100".into(),
            }]
        } else {
            Vec::new()
        },
        offer_held: false,
        same_host_peers: Vec::new(),
    })
}

/// One edit of an assignment's fields.
fn mutate_assignment(u: &mut Unstructured<'_>, a: &mut v1::Assignment) -> Result<()> {
    match u.int_in_range(0..=13)? {
        0 => a.job_toml = mutate::text(u, &a.job_toml, &[], 2)?,
        1 => {
            a.placement = if u.arbitrary()? {
                Some(placement_message(u)?)
            } else {
                None
            }
        }
        2 if !a.program.is_empty() => {
            let i = u.choose_index(a.program.len())?;
            a.program[i] = pass_message(u)?;
        }
        3 => a.program.truncate(u.choose_index(a.program.len() + 1)?),
        4 => a.first_step = mutate::number_u64(u)?,
        5 => {
            let w = u.int_in_range(0..=4)?;
            a.peers.remove(&w);
        }
        6 => a.microbatches = mutate::number_u32(u)?,
        7 => a.worker_index = mutate::number_u32(u)?,
        8 => a.replica = mutate::number_u32(u)?,
        9 => a.replicas = mutate::number_u32(u)?,
        10 => a.offer_held = u.arbitrary()?,
        11 => a.handover.push(v1::HeldStage {
            stage: mutate::number_u32(u)?,
            first_piece: mutate::number_u32(u)?,
            end_piece: mutate::number_u32(u)?,
            address: mutate::text(u, "", &["http://127.0.0.1:7101"], 1)?,
        }),
        _ => {
            a.stage_pieces = (0..u.int_in_range(0..=8)?)
                .map(|_| u.int_in_range(0..=12))
                .collect::<Result<_>>()?;
        }
    }
    Ok(())
}

/// The assignment fields a worker's refusal names first.
const ASSIGNMENT_FIELDS: [&str; 12] = [
    "job_toml",
    "placement",
    "program",
    "steps",
    "worker_index",
    "peers",
    "stage_pieces",
    "stages",
    "replica",
    "collective_root",
    "grad_chain",
    "handover",
];

fn check_assignment_case(a: v1::Assignment, mutated: bool) -> Verdict {
    match check_assignment(a, &std::env::temp_dir()) {
        Ok(()) if mutated => Ok("Assignment: accepted after edits".into()),
        Ok(()) => Ok("Assignment: accepted".into()),
        Err(_) if !mutated => {
            Err("the coordinator's assignment of a planned job is refused".into())
        }
        Err(pipewise_worker::Error::InvalidArgument {
            field: "assignment",
            reason,
        }) => {
            // "stage_pieces: …", or a core error's "invalid stage_pieces: …".
            let named = reason.strip_prefix("invalid ").unwrap_or(&reason);
            match ASSIGNMENT_FIELDS.iter().find(|f| named.starts_with(*f)) {
                Some(f) => Ok(format!("Assignment: refused {f}")),
                None => Err(format!("an assignment refused naming no field: {reason:?}").into()),
            }
        }
        // The core's check of the split (`stages`), as the worker passes it on.
        Err(pipewise_worker::Error::Spec(Error::InvalidArgument { field, .. }))
            if ASSIGNMENT_FIELDS.contains(&field) =>
        {
            Ok(format!("Assignment: refused {field}"))
        }
        Err(e) => Err(format!("an assignment refused with an error naming no field: {e:?}").into()),
    }
}

/// A submitted job with overrides: the coordinator's `spec_of`, then the plan.
fn submit(u: &mut Unstructured<'_>) -> Result<Verdict> {
    let request = v1::JobSpec {
        toml: job::mutant_text(u)?,
        name: mutate::maybe(u, |u| mutate::token(u, &["tiny"]))?,
        steps: mutate::maybe(u, mutate::number_u64)?,
        microbatches: mutate::maybe(u, |u| mutate::small_u32(u, 16))?,
        schedule: mutate::maybe(u, |u| {
            mutate::token(u, &["1f1b", "v-half", "adaptive-v", "auto"])
        })?,
        workers: mutate::maybe(u, |u| mutate::small_u32(u, 8))?,
        seed: mutate::maybe(u, mutate::number_u64)?,
    };
    Ok(match spec_of(&request) {
        Ok(spec) => job::check_spec(&spec).map(|o| format!("JobSpec: {o}")),
        Err(CoordinatorError::BadRequest { field, reason })
            if !field.is_empty() && !reason.is_empty() =>
        {
            Ok(format!("JobSpec: refused {field}"))
        }
        Err(CoordinatorError::Plan(Error::InvalidArgument { field: "toml", .. })) => {
            Ok("JobSpec: refused toml".into())
        }
        Err(e) => Err(format!("a submitted job refused naming no field: {e:?}").into()),
    })
}

/// A message's wire bytes, edited.
fn edited<M: Message>(u: &mut Unstructured<'_>, m: &M) -> Result<Vec<u8>> {
    let mut bytes = m.encode_to_vec();
    mutate::bytes(u, &mut bytes, 4)?;
    Ok(bytes)
}

/// A decode refusal names the message decoded.
fn decoded<M: Message + Default>(
    bytes: &[u8],
    what: &'static str,
) -> std::result::Result<M, Verdict> {
    decode_message::<M>(bytes, what).map_err(|e| match e {
        ConvertError::Invalid { field, .. } if field == what => {
            Ok(format!("{what}: bytes refused"))
        }
        other => Err(format!("a decode refusal names {:?}: {other}", field_of(&other)).into()),
    })
}

fn placement(m: v1::Placement) -> Verdict {
    converted("Placement", Placement::try_from(m), |p| {
        Placement::try_from(v1::Placement::from(p))
    })
}

fn case(u: &mut Unstructured<'_>) -> Result<Verdict> {
    Ok(match u.int_in_range(0..=9)? {
        0 => converted("Pass", Pass::try_from(pass_message(u)?), |p| {
            Pass::try_from(v1::Pass::from(*p))
        }),
        1 => {
            let program: Vec<v1::Pass> = (0..u.int_in_range(0..=6)?)
                .map(|_| pass_message(u))
                .collect::<Result<_>>()?;
            converted("Pass", program_from_proto(program), |p| {
                program_from_proto(program_to_proto(p))
            })
        }
        2 => placement(placement_message(u)?),
        3 => converted("ModelSpec", ModelSpec::try_from(model_message(u)?), |m| {
            ModelSpec::try_from(v1::ModelSpec::from(m))
        }),
        4 => converted("TraceSpan", Span::try_from(span_message(u)?), |s| {
            Span::try_from(v1::TraceSpan::from(s))
        }),
        5 => submit(u)?,
        6 | 7 => {
            let mut a = assignment(u)?;
            let edits = if !u.arbitrary::<bool>()? {
                0
            } else {
                u.int_in_range(1..=3)?
            };
            for _ in 0..edits {
                mutate_assignment(u, &mut a)?;
            }
            check_assignment_case(a, edits > 0)
        }
        8 => {
            let a = assignment(u)?;
            let bytes = edited(u, &a)?;
            match decoded::<v1::Assignment>(&bytes, "Assignment") {
                Ok(a) => check_assignment_case(a, true),
                Err(verdict) => verdict,
            }
        }
        _ => {
            let m = placement_message(u)?;
            let bytes = edited(u, &m)?;
            match decoded::<v1::Placement>(&bytes, "Placement") {
                Ok(m) => placement(m),
                Err(verdict) => verdict,
            }
        }
    })
}

#[test]
fn messages_convert_or_are_refused_by_field() {
    let report = run("proto_convert", CASES, |u| match case(u) {
        Ok(verdict) => verdict,
        Err(e) => Err(format!("generator: {e}").into()),
    });
    assert!(report.cases > 0);
}

/// With replicas, a worker needs the chain its stages' gradients are summed along: its
/// rank's worker in every replica, its own address at its replica's place.
#[test]
fn replicas_need_their_gradient_sums_chain() {
    let bytes = [0u8; 64];
    let mut a = assignment(&mut Unstructured::new(&bytes)).expect("an assignment");
    let own = a.peers[&a.worker_index].clone();
    a.replicas = 2;
    let refused = |a: &v1::Assignment| match check_assignment(a.clone(), &std::env::temp_dir()) {
        Err(pipewise_worker::Error::InvalidArgument { reason, .. }) => reason,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert!(
        refused(&a).starts_with("grad_chain: 0 addresses"),
        "{}",
        refused(&a)
    );
    let other = "http://127.0.0.1:1".to_string();
    a.grad_chain = vec![other.clone(), own.clone()];
    assert!(
        refused(&a).contains("at replica 0 is not this worker's address"),
        "{}",
        refused(&a)
    );
    a.grad_chain = vec![own.clone(), other.clone()];
    check_assignment(a.clone(), &std::env::temp_dir()).expect("replica 0 starts the chain");
    a.replica = 1;
    a.collective_root = "http://127.0.0.1:7000".into();
    assert!(refused(&a).contains("at replica 1"), "{}", refused(&a));
    a.grad_chain = vec![other, own];
    check_assignment(a, &std::env::temp_dir()).expect("replica 1 ends it");
}
