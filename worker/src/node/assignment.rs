//! An assignment as the assignment loop runs it: the coordinator's `pb::Assignment` decoded once
//! and checked. The job spec (its TOML, parsed here once per assignment) is the one source
//! of the model, seed, microbatch size and steps, and the placement of this worker's
//! stages: the message carries none of them beside it.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

use pipewise_common::job::{Found, JobSpec, check_links, job_dir, job_of};
use pipewise_common::pass::Pass;
use pipewise_common::placement::Placement;
use pipewise_proto::convert::program_from_proto;
use pipewise_proto::v1 as pb;

use crate::confined::Confined;
use crate::data::DataSource;
use crate::error::{Error, Result};
use crate::job::partition_of;
use crate::runtime::Replica;

/// One worker's part of a run, decoded (see the [module docs](self)).
#[derive(Debug)]
pub(crate) struct Assignment {
    /// The run id (the wire's `job`).
    pub(crate) run: u64,
    /// This worker's index in the placement.
    pub(crate) worker: u32,
    /// Steps to run, `[first_step, end_step)`.
    pub(crate) steps: Range<u64>,
    /// The validated job spec.
    pub(crate) spec: JobSpec,
    /// Which worker holds which stage.
    pub(crate) placement: Placement,
    /// This worker's passes of one step, in order.
    pub(crate) program: Vec<Pass>,
    /// Pieces per stage.
    pub(crate) partition: Vec<Range<usize>>,
    /// Microbatches per step.
    pub(crate) microbatches: u32,
    /// Every worker's activation-service address in this worker's replica.
    pub(crate) peers: HashMap<u32, String>,
    /// The peers on this worker's host (frames through shared memory).
    pub(crate) same_host: std::collections::BTreeSet<u32>,
    /// This worker's data-parallel replica.
    pub(crate) replica: Replica,
    /// The collectives' root: replica 0's worker 0.
    pub(crate) root: String,
    /// With replicas, the chain this worker's stages' gradients are summed along: its
    /// rank's worker in every replica, in replica order (this worker at its replica's).
    pub(crate) grad_chain: Option<Vec<String>>,
    /// This worker's contributor index in the run's collectives: `replica · d + rank`.
    pub(crate) contributor: u32,
    /// Where checkpoints and final parameters go: `job-N` under `checkpoint.folder` in
    /// this worker's data directory, opened at each use without following links.
    pub(crate) output: Confined,
    /// The run's secret for frames and collectives (empty: none).
    pub(crate) run_secret: bytes::Bytes,
    /// The training data: `data.path` and `data.tokenizer` in this worker's data
    /// directory (the tokenizer defaulting to the model directory's), and the token cache
    /// there.
    pub(crate) data: DataSource,
    /// The Hugging Face directory a fresh run's weights come from (`model.path`).
    pub(crate) model: Option<Confined>,
    /// `validation.path` in this worker's data directory (`None`: no validation file).
    pub(crate) validation: Option<Confined>,
    /// Go on from the stages held in memory after `steps.start` steps, not a checkpoint.
    pub(crate) resume_in_memory: bool,
    /// Take the stages' state after `steps.start` steps from the worker at this address (a
    /// replica rebuilt); empty: no.
    pub(crate) copy_from: String,
    /// Offer the stages' state to the workers that copy from this one.
    pub(crate) offer_copies: bool,
    /// A move from memory: the stages of the run before whose pieces this worker's stages
    /// hold, each fetched from its holder (empty: none).
    pub(crate) handover: Vec<HeldStage>,
    /// Offer the stages this worker holds from the run before to the run's workers.
    pub(crate) offer_held: bool,
}

/// A stage of the run before a move, held in a worker's memory.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HeldStage {
    /// Its index in the run before.
    pub(crate) stage: u32,
    /// Its pieces.
    pub(crate) pieces: Range<usize>,
    /// Where its holder serves its collectives (and stage states).
    pub(crate) address: String,
}

impl Assignment {
    /// Decodes and checks `a`, with the job's paths under data directory `data_dir`.
    pub(crate) fn decode(a: pb::Assignment, data_dir: &Path) -> Result<Self> {
        let spec = JobSpec::from_toml(&a.job_toml)
            .map_err(|e| Error::invalid("assignment", format!("job_toml: {e}")))?;
        let placement = Placement::try_from(a.placement.unwrap_or_default())
            .map_err(|e| Error::invalid("assignment", format!("placement: {e}")))?;
        let program = program_from_proto(a.program)
            .map_err(|e| Error::invalid("assignment", format!("program: {e}")))?;
        let end_step = u64::from(spec.training.steps);
        if a.first_step > end_step {
            return Err(Error::invalid(
                "assignment",
                format!("steps [{}, {end_step}) are empty", a.first_step),
            ));
        }
        if a.worker_index >= placement.workers() {
            return Err(Error::invalid(
                "assignment",
                format!(
                    "worker_index {} of a placement of {} workers",
                    a.worker_index,
                    placement.workers()
                ),
            ));
        }
        let replica = Replica {
            index: a.replica,
            count: a.replicas.max(1),
        };
        if replica.index >= replica.count {
            return Err(Error::invalid(
                "assignment",
                format!("replica: {} of {} replicas", replica.index, replica.count),
            ));
        }
        let root = match (a.collective_root.is_empty(), a.peers.get(&0)) {
            (false, _) => a.collective_root.clone(),
            // Another replica's rank 0 is not the root.
            (true, _) if replica.index > 0 => {
                return Err(Error::invalid(
                    "assignment",
                    "collective_root: none for a replica past the first",
                ));
            }
            (true, Some(first)) => first.clone(),
            (true, None) => {
                return Err(Error::invalid(
                    "assignment",
                    "peers: no address for worker 0 (the collectives' root)",
                ));
            }
        };
        let grad_chain = match (replica.count, a.grad_chain.len()) {
            (1, _) => None,
            (n, len) if len != n as usize => {
                return Err(Error::invalid(
                    "assignment",
                    format!("grad_chain: {len} addresses for a run of {n} replicas"),
                ));
            }
            // The chain passes through this worker at its replica's place.
            _ if a.peers.get(&a.worker_index) != a.grad_chain.get(replica.index as usize) => {
                return Err(Error::invalid(
                    "assignment",
                    format!(
                        "grad_chain: {} at replica {} is not this worker's address",
                        a.grad_chain[replica.index as usize], replica.index
                    ),
                ));
            }
            _ => Some(a.grad_chain),
        };
        for w in 0..placement.workers() {
            if !a.peers.contains_key(&w) {
                return Err(Error::invalid(
                    "assignment",
                    format!("peers: no address for worker {w}"),
                ));
            }
        }
        if let Some(w) = a
            .same_host_peers
            .iter()
            .find(|&&w| w == a.worker_index || !a.peers.contains_key(&w))
        {
            return Err(Error::invalid(
                "assignment",
                format!("same_host_peers: {w} is this worker or no peer of it"),
            ));
        }
        let contributor = replica
            .index
            .checked_mul(placement.workers())
            .and_then(|c| c.checked_add(a.worker_index))
            .ok_or_else(|| {
                Error::invalid(
                    "assignment",
                    format!(
                        "replica: {} × {} workers + {} overflows",
                        replica.index,
                        placement.workers(),
                        a.worker_index
                    ),
                )
            })?;
        if a.resume_in_memory && !a.copy_from.is_empty() {
            return Err(Error::invalid(
                "assignment",
                "copy_from: a worker going on from memory copies no stages",
            ));
        }
        let partition = if a.stage_pieces.is_empty() {
            partition_of(&spec, &placement)?
        } else {
            pieces_partition(&spec, &a.stage_pieces, placement.stages())?
        };
        let mine: Vec<Range<usize>> = placement
            .stages_of(a.worker_index)
            .iter()
            .filter_map(|s| partition.get(*s as usize).cloned())
            .collect();
        let goes_on_otherwise = a.resume_in_memory || !a.copy_from.is_empty();
        let handover = handover_of(&a.handover, a.offer_held, goes_on_otherwise, &spec, &mine)?;
        // The coordinator checked the paths under its data directory; this worker's may be
        // another, with other links in it.
        let found = |p: &Path| match (p.canonicalize(), p.symlink_metadata()) {
            (Ok(real), _) => Found::At(real),
            (Err(_), Ok(_)) => Found::Dangling,
            (Err(_), Err(_)) => Found::Nothing,
        };
        let folder = spec.checkpoint_folder_in(data_dir)?;
        check_links("checkpoint.folder", &folder, data_dir, found)?;
        let output = Confined::resolve(
            "checkpoint.folder",
            data_dir,
            &job_dir(&folder, job_of(a.run)),
        )?;
        let model = match spec.model_path_in(data_dir)? {
            Some(path) => {
                check_links("model.path", &path, data_dir, found)?;
                Some(Confined::resolve("model.path", data_dir, &path)?)
            }
            None => None,
        };
        // A model directory's own tokenizer encodes its text unless the job names another.
        let model_tokenizer = model
            .as_ref()
            .map(|dir| dir.join(crate::hf::TOKENIZER))
            .transpose()?
            .filter(|file| file.open().is_ok());
        let mut data = DataSource {
            path: match spec.data_path_in(data_dir)? {
                Some(path) => {
                    check_links("data.path", &path, data_dir, found)?;
                    Some(Confined::resolve("data.path", data_dir, &path)?)
                }
                None => None,
            },
            tokenizer: match spec.data_tokenizer_in(data_dir)? {
                Some(path) => {
                    check_links("data.tokenizer", &path, data_dir, found)?;
                    Some(Confined::resolve("data.tokenizer", data_dir, &path)?)
                }
                None => None,
            },
            token_bytes: spec.data.token_bytes,
            cache: Some(DataSource::cache_in(data_dir)?),
        };
        if data.tokenizer.is_none() {
            data.tokenizer = model_tokenizer;
        }
        let validation = match spec.validation_path_in(data_dir)? {
            Some(path) => {
                check_links("validation.path", &path, data_dir, found)?;
                Some(Confined::resolve("validation.path", data_dir, &path)?)
            }
            None => None,
        };
        Ok(Assignment {
            run: a.run,
            worker: a.worker_index,
            steps: a.first_step..end_step,
            spec,
            placement,
            program,
            partition,
            microbatches: a.microbatches,
            peers: a.peers,
            same_host: a.same_host_peers.into_iter().collect(),
            replica,
            root,
            grad_chain,
            contributor,
            output,
            data,
            model,
            validation,
            run_secret: bytes::Bytes::from(a.run_secret),
            resume_in_memory: a.resume_in_memory,
            copy_from: a.copy_from,
            offer_copies: a.offer_copies,
            handover,
            offer_held: a.offer_held,
        })
    }

    /// The address of the run's collectives' root.
    pub(crate) fn root(&self) -> &str {
        &self.root
    }
}

/// Decodes and checks an assignment as a worker with data directory `data_dir` does when one
/// arrives, without running it (the fuzz harness in `fuzz/` drives this check from outside
/// the crate).
pub fn check_assignment(a: pb::Assignment, data_dir: &Path) -> Result<()> {
    Assignment::decode(a, data_dir).map(|_| ())
}

/// The held stages of a hand-over (`handover`, with `offer_held`) that this worker's stages
/// (their pieces: `mine`) take their state from, checked: each within the model, together
/// covering every piece of `mine`, and none for a worker that `goes_on_otherwise` (from
/// its own stages or a replica's).
fn handover_of(
    handover: &[pb::HeldStage],
    offer_held: bool,
    goes_on_otherwise: bool,
    spec: &JobSpec,
    mine: &[Range<usize>],
) -> Result<Vec<HeldStage>> {
    let bad = |reason: String| Error::invalid("assignment", format!("handover: {reason}"));
    if handover.is_empty() {
        if offer_held {
            return Err(bad("offer_held without a hand-over".into()));
        }
        return Ok(Vec::new());
    }
    if goes_on_otherwise {
        return Err(bad(
            "a worker going on from its own stages or a replica's takes no hand-over".into(),
        ));
    }
    let pieces = spec.model.layers as usize + 2;
    let mut held = Vec::new();
    for h in handover {
        let range = h.first_piece as usize..h.end_piece as usize;
        if range.is_empty() || range.end > pieces || h.address.trim().is_empty() {
            return Err(bad(format!(
                "stage {} holds pieces {range:?} at {:?}; the model has {pieces} pieces",
                h.stage, h.address
            )));
        }
        if mine
            .iter()
            .any(|m| m.start < range.end && range.start < m.end)
        {
            held.push(HeldStage {
                stage: h.stage,
                pieces: range,
                address: h.address.clone(),
            });
        }
    }
    for m in mine {
        if let Some(piece) = m
            .clone()
            .find(|p| !held.iter().any(|h| h.pieces.contains(p)))
        {
            return Err(bad(format!(
                "no held stage holds piece {piece} of this worker's pieces {m:?}"
            )));
        }
    }
    Ok(held)
}

/// The partition `stage_pieces` (pieces per stage) describes: one positive count per
/// stage, adding up to the model's pieces.
fn pieces_partition(
    spec: &JobSpec,
    stage_pieces: &[u32],
    stages: u32,
) -> Result<Vec<Range<usize>>> {
    if stage_pieces.len() != stages as usize {
        return Err(Error::invalid(
            "assignment",
            format!("stage_pieces {stage_pieces:?}: need {stages} counts, one per stage"),
        ));
    }
    spec.model
        .split_by_counts(stage_pieces)
        .map_err(|e| Error::invalid("assignment", e.to_string()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use pipewise_common::job::{example, parse_count::parses_of};
    use pipewise_proto::convert::program_to_proto;

    /// An assignment's TOML is parsed once as it is decoded, and the steps, model and
    /// microbatch size the worker runs are the spec's (the message no longer carries
    /// copies of them).
    #[test]
    fn an_assignment_parses_its_job_once() {
        let mut spec = example(2, "1f1b");
        spec.job.name = "assignment-parsed-once".into();
        spec.training.steps = 7;
        let plan = spec.validate().unwrap();
        let placement = &plan.schedule.placement;
        let message = pb::Assignment {
            run: 1,
            first_step: 3,
            worker_index: 1,
            placement: Some(placement.into()),
            program: program_to_proto(&plan.schedule.workers[1]),
            peers: (0..2)
                .map(|w| (w, format!("http://127.0.0.1:{}", 7000 + w)))
                .collect(),
            microbatches: plan.microbatches,
            job_toml: spec.to_toml().unwrap(),
            ..Default::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let a = Assignment::decode(message.clone(), dir.path()).unwrap();
        assert_eq!(parses_of(&spec.job.name), 1);
        assert_eq!(a.steps, 3..7);
        assert_eq!(a.spec, spec);
        assert_eq!(a.worker, 1);
        assert!(a.same_host.is_empty());
        // Same-host peers are peers other than this worker.
        let shared = pb::Assignment {
            same_host_peers: vec![0],
            ..message.clone()
        };
        let decoded = Assignment::decode(shared, dir.path()).unwrap();
        assert_eq!(decoded.same_host.into_iter().collect::<Vec<_>>(), [0]);
        for bad in [1, 5] {
            let wrong = pb::Assignment {
                same_host_peers: vec![bad],
                ..message.clone()
            };
            match Assignment::decode(wrong, dir.path()) {
                Err(Error::InvalidArgument { reason, .. }) => {
                    assert!(reason.starts_with("same_host_peers: "), "{reason}")
                }
                other => panic!("{other:?}"),
            }
        }
        // A worker past the placement is refused, naming the field.
        let past = pb::Assignment {
            worker_index: 2,
            ..message
        };
        match Assignment::decode(past, dir.path()) {
            Err(Error::InvalidArgument { reason, .. }) => {
                assert!(reason.starts_with("worker_index"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }
}
