//! The checks of what a worker is given to run: its program of a schedule and the
//! partition of the model into stages.

use std::collections::HashMap;
use std::ops::Range;

use pipewise_common::model::ModelSpec;
use pipewise_common::pass::{Pass, PassKind};
use pipewise_common::placement::Placement;

use crate::error::{Error, Result};

/// One worker's program: its own stages, microbatches in range, each pass once, and a
/// complete forward and backward for every (stage, microbatch) it holds.
pub(crate) fn check_program(
    worker: u32,
    placement: &Placement,
    microbatches: u32,
    program: &[Pass],
) -> Result<()> {
    let mine = placement.stages_of(worker);
    let mut seen: HashMap<(PassKind, u32, u32), usize> = HashMap::new();
    for (i, p) in program.iter().enumerate() {
        if !mine.contains(&p.stage) {
            return Err(Error::invalid(
                "program",
                format!(
                    "pass {i} ({p}) is on stage {} that worker {worker} does not hold",
                    p.stage
                ),
            ));
        }
        if p.mb >= microbatches {
            return Err(Error::invalid(
                "program",
                format!(
                    "pass {i} ({p}) is for microbatch {} of {microbatches}",
                    p.mb
                ),
            ));
        }
        if let Some(first) = seen.insert((p.kind, p.stage, p.mb), i) {
            return Err(Error::invalid(
                "program",
                format!("pass {i} ({p}) repeats pass {first}"),
            ));
        }
    }
    for &s in &mine {
        for mb in 0..microbatches {
            let has = |k: PassKind| seen.contains_key(&(k, s, mb));
            let backward = has(PassKind::BW) || (has(PassKind::B) && has(PassKind::W));
            if !has(PassKind::F) || !backward {
                return Err(Error::invalid(
                    "program",
                    format!(
                        "stage {s} microbatch {mb} lacks its forward or a complete backward \
                         (B and W, or BW)"
                    ),
                ));
            }
        }
    }
    Ok(())
}

pub(crate) fn check_partition(
    spec: &ModelSpec,
    partition: &[Range<usize>],
    stages: u32,
) -> Result<()> {
    let total = spec.layers as usize + 2;
    if partition.len() != stages as usize {
        return Err(Error::invalid(
            "partition",
            format!("{} piece ranges for {stages} stages", partition.len()),
        ));
    }
    let mut next = 0;
    for (s, r) in partition.iter().enumerate() {
        if r.start != next || r.end <= r.start {
            return Err(Error::invalid(
                "partition",
                format!(
                    "stage {s} holds pieces {}..{}, expected a non-empty range from {next}",
                    r.start, r.end
                ),
            ));
        }
        next = r.end;
    }
    if next != total {
        return Err(Error::invalid(
            "partition",
            format!("the ranges end at piece {next}, the model has {total}"),
        ));
    }
    Ok(())
}
