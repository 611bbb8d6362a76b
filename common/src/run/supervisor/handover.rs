//! A move's hand-over from memory: the stages of the run before a move, held by its
//! workers, from which the next run's workers take their stages' state peer to peer.

use super::io::{Action, HeldStage, Move};
use super::tracked_run::Out;
use super::{Supervisor, resumed_from};
use crate::job::JobPlan;
use crate::run::checkpoints::Checkpoints;
use crate::run::respec::spec_split;
use crate::run::worker::Worker;

impl Supervisor {
    /// Goes on after a move: the run stopped after step `through` for `to` (`reason`), its
    /// workers holding `held` (empty: from the checkpoints, `listing`); the move's plan
    /// is adopted and the next run is waited for.
    pub(super) fn after_move(
        &mut self,
        reason: String,
        (through, to, held): (u64, Move, Vec<HeldStage>),
        listing: &Checkpoints,
    ) {
        let stages = self.plan.schedule.placement.stages();
        // The workers stopped after `through` steps and saved it when checkpoints
        // are on (always, when a move is possible): the fall-back should the
        // stages they hold in memory not be handed over.
        let saved = if listing.complete(through, stages) {
            through
        } else {
            listing.last_complete(&self.spec, self.floor, through, stages)
        };
        let from_memory = !held.is_empty();
        let resume = if from_memory { through } else { saved };
        self.out.push(Action::ClearAfter(resume));
        let reason = if from_memory {
            format!("{reason}; going on after step {through} from the workers' memory")
        } else {
            format!("{reason}; resuming from {}", resumed_from(resume))
        };
        self.out.push(Action::Warn(reason.clone()));
        self.out.push(Action::Replanned(to.reason()));
        if !matches!(to, Move::Trial(_)) {
            self.end_trial();
        }
        match to {
            Move::Trial(option) => {
                self.trial_moves += 1;
                self.next_plan = Some(*option);
            }
            Move::Split(counts) | Move::Recalibrate(counts) => self.stage_pieces = counts,
            Move::Plan(fits) => {
                self.plan = fits.adopt_into(&mut self.current);
                self.stage_pieces = spec_split(&self.current, &self.plan);
            }
            Move::Grow(plan) => {
                self.plan = *plan;
                self.stage_pieces = spec_split(&self.current, &self.plan);
            }
            Move::Rebuild(replicas) => self.with_replicas(replicas),
        }
        self.tell(reason);
        if from_memory {
            // Should the stages not be handed over, or the next run be lost, the
            // job restarts from the checkpoint the stop saved (or the last one).
            self.first_step = through;
            self.floor = saved;
            self.handover = held;
        } else {
            self.start_from_checkpoint(resume);
        }
    }

    /// The `d` workers of the next run among `ready` (in id order): with a hand-over
    /// pending, the workers holding the stages first, as they must all take part in it.
    pub(super) fn holders_first(&self, mut ready: Vec<Worker>, d: usize) -> Vec<Worker> {
        if !self.handover.is_empty() {
            let holds = |w: &Worker| self.handover.iter().any(|h| h.holder.id == w.id);
            ready.sort_by_key(|w| !holds(w));
            ready.truncate(d);
            ready.sort_by(|a, b| a.id.cmp(&b.id));
        }
        ready.truncate(d);
        ready
    }

    /// The stages the run on `every` takes from memory: the pending hand-over when every
    /// worker holding a stage (the same process) is among `every`; otherwise none, and the
    /// run starts from the last complete checkpoint (the floor).
    pub(super) fn take_handover(&mut self, every: &[Worker]) -> Vec<HeldStage> {
        let handover = std::mem::take(&mut self.handover);
        if handover.is_empty() {
            return handover;
        }
        let in_run = |h: &HeldStage| {
            every
                .iter()
                .find(|w| w.id == h.holder.id && w.incarnation == h.holder.incarnation)
                .cloned()
        };
        let held: Option<Vec<HeldStage>> = handover
            .iter()
            .map(|h| {
                in_run(h).map(|holder| HeldStage {
                    holder,
                    ..h.clone()
                })
            })
            .collect();
        match held {
            Some(held) => held,
            None => {
                let gone = handover
                    .iter()
                    .find(|h| in_run(h).is_none())
                    .map_or_else(String::new, |h| h.holder.id.clone());
                let reason = format!(
                    "worker {gone}, which held stages after step {}, is not in the next run; \
                     resuming from {}",
                    self.first_step,
                    resumed_from(self.floor)
                );
                self.out.push(Action::Warn(reason.clone()));
                self.out.push(Action::ClearAfter(self.floor));
                self.tell(reason);
                self.start_from_checkpoint(self.floor);
                Vec::new()
            }
        }
    }
}

/// The stages of `out`, a run of `plan` that stopped for a move, each with its pieces and
/// the worker holding it (replica 0's of its rank); empty when its split is not known.
pub(super) fn held_stages(plan: &JobPlan, out: &Out) -> Vec<HeldStage> {
    let placement = &plan.schedule.placement;
    if out.ranges.len() != placement.stages() as usize {
        return Vec::new();
    }
    let held: Option<Vec<HeldStage>> = out
        .ranges
        .iter()
        .enumerate()
        .map(|(stage, pieces)| {
            let stage = stage as u32;
            let holder = out.workers.get(placement.worker_of(stage) as usize)?;
            Some(HeldStage {
                stage,
                pieces: pieces.clone(),
                holder: holder.clone(),
            })
        })
        .collect();
    held.unwrap_or_default()
}
