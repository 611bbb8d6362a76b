//! The cost model: per-stage pass durations, communication latency, activation memory.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::pass::PassKind;
use crate::placement::Placement;
use crate::schedule::{Recomputation, Recompute, RecomputeShares};

/// Costs of one stage (one chunk on a worker).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StageCost {
    /// Forward duration.
    pub f: f64,
    /// Input-gradient backward duration.
    pub b: f64,
    /// Weight-gradient backward duration.
    pub w: f64,
    /// Activation memory held per microbatch (allocated at F start).
    pub mem: f64,
}

/// Per-stage costs plus the communication latency of one hop between workers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Costs {
    /// `stages[s]` for every stage of the placement.
    pub stages: Vec<StageCost>,
    /// Added on every dependency edge between different workers.
    pub comm: f64,
    /// Fraction of a microbatch's activation freed when B finishes (the rest at W).
    pub release_at_b: f64,
    /// Each stage's recomputation ([`Costs::recomputing`]); empty when no stage recomputes.
    /// A recomputing stage's `mem` is what its F keeps and its `b` includes the redone
    /// forward.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recompute: Vec<Recomputation>,
}

/// Pass times of one stage of `1/d` of the model: the `--times F,B,W[,comm]` convention.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Times {
    /// Forward.
    pub f: f64,
    /// Input gradient.
    pub b: f64,
    /// Weight gradient.
    pub w: f64,
    /// Per-hop latency.
    pub comm: f64,
}

impl Times {
    /// F = B = W = 1, no communication cost.
    pub const UNIT: Times = Times {
        f: 1.0,
        b: 1.0,
        w: 1.0,
        comm: 0.0,
    };

    /// Rejects negative or non-finite values and an all-zero compute time.
    pub fn check(&self) -> Result<()> {
        let all = [self.f, self.b, self.w, self.comm];
        if all.iter().any(|t| !t.is_finite() || *t < 0.0) {
            return Err(Error::InvalidArgument {
                field: "times",
                reason: format!("every time must be finite and ≥ 0, got {all:?}"),
            });
        }
        if self.f + self.b + self.w <= 0.0 {
            return Err(Error::InvalidArgument {
                field: "times",
                reason: "F + B + W must be > 0".into(),
            });
        }
        Ok(())
    }
}

impl Costs {
    /// Costs for `placement` from times of one stage of `1/d` of the model: each of the `v`
    /// chunks of a worker gets `1/v` of every time and `1/v` of the memory unit (one
    /// microbatch's activation over `1/d` of the model).
    pub fn uniform(placement: &Placement, times: Times) -> Result<Costs> {
        times.check()?;
        let v = f64::from(placement.chunks());
        let stage = StageCost {
            f: times.f / v,
            b: times.b / v,
            w: times.w / v,
            mem: 1.0 / v,
        };
        Ok(Costs {
            stages: vec![stage; placement.stages() as usize],
            comm: times.comm,
            release_at_b: 0.0,
            recompute: Vec::new(),
        })
    }

    /// Costs from explicit per-stage values (one entry per stage of the placement).
    pub fn per_stage(placement: &Placement, stages: Vec<StageCost>, comm: f64) -> Result<Costs> {
        if stages.len() != placement.stages() as usize {
            return Err(Error::InvalidArgument {
                field: "stage times",
                reason: format!(
                    "{} stages given, the placement has {}",
                    stages.len(),
                    placement.stages()
                ),
            });
        }
        for (s, c) in stages.iter().enumerate() {
            Times {
                f: c.f,
                b: c.b,
                w: c.w,
                comm,
            }
            .check()
            .map_err(|_| Error::InvalidArgument {
                field: "stage times",
                reason: format!("stage {s}: times must be finite, ≥ 0 and not all zero, got {c:?}"),
            })?;
            if !c.mem.is_finite() || c.mem < 0.0 {
                return Err(Error::InvalidArgument {
                    field: "stage times",
                    reason: format!("stage {s}: memory must be finite and ≥ 0"),
                });
            }
        }
        Ok(Costs {
            stages,
            comm,
            release_at_b: 0.0,
            recompute: Vec::new(),
        })
    }

    /// These costs with every time (passes and the hop) multiplied by `k` (a change of
    /// unit); memory stays.
    pub fn scaled(&self, k: f64) -> Costs {
        Costs {
            stages: self
                .stages
                .iter()
                .map(|c| StageCost {
                    f: c.f * k,
                    b: c.b * k,
                    w: c.w * k,
                    mem: c.mem,
                })
                .collect(),
            comm: self.comm * k,
            release_at_b: self.release_at_b,
            recompute: self
                .recompute
                .iter()
                .map(|r| Recomputation {
                    redo: r.redo * k,
                    ..*r
                })
                .collect(),
        }
    }

    /// Checks that these costs cover exactly the stages of `placement`.
    pub fn check_for(&self, placement: &Placement) -> Result<()> {
        if self.stages.len() != placement.stages() as usize {
            return Err(Error::InvalidArgument {
                field: "costs",
                reason: format!(
                    "{} stage costs for the {} stages of the {placement} placement",
                    self.stages.len(),
                    placement.stages()
                ),
            });
        }
        Ok(())
    }

    /// These costs with stage `s` recomputing `modes[s]` at `shares[s]`: its F keeps
    /// `keep` of its stash, its B (and BW) first redoes `time` of its F. Asked once, of
    /// costs that do not recompute yet.
    pub fn recomputing(&self, modes: &[Recompute], shares: &[RecomputeShares]) -> Result<Costs> {
        let stages = self.stages.len();
        if modes.len() != stages || shares.len() != stages {
            return Err(Error::invalid(
                "recompute",
                format!(
                    "{} modes and {} shares for {stages} stages; give one of each per stage",
                    modes.len(),
                    shares.len()
                ),
            ));
        }
        if !self.recompute.is_empty() {
            return Err(Error::invalid(
                "recompute",
                "these costs already recompute; start from the costs without recomputation",
            ));
        }
        let mut out = self.clone();
        for (s, ((c, &mode), sh)) in out.stages.iter_mut().zip(modes).zip(shares).enumerate() {
            sh.check()
                .map_err(|e| Error::invalid("recompute", format!("stage {s}: {e}")))?;
            let redo = c.f * sh.time(mode);
            out.recompute.push(Recomputation {
                mode,
                redo,
                stash: c.mem,
            });
            c.b += redo;
            c.mem *= sh.keep(mode);
        }
        Ok(out)
    }

    /// The mode of `stage` (none when these costs do not recompute).
    pub fn recompute_of(&self, stage: u32) -> Recompute {
        self.recompute
            .get(stage as usize)
            .map_or(Recompute::None, |r| r.mode)
    }

    /// A stage's whole stash of one microbatch: what its F keeps without recomputation.
    fn stash(&self, stage: u32) -> f64 {
        self.recompute
            .get(stage as usize)
            .map_or(self.stages[stage as usize].mem, |r| r.stash)
    }

    /// How a pass changes its worker's activation memory: `+mem` for F (at its start);
    /// B releases `release_at_b` of it, W the rest, BW all of it (at their end). A
    /// recomputing stage's B ends holding what W needs of the whole stash it rebuilt
    /// (`1 − release_at_b` of it), and W frees that.
    pub fn memory_change(&self, pass: crate::pass::Pass) -> f64 {
        let m = self.stages[pass.stage as usize].mem;
        let held_for_w = self.stash(pass.stage) * (1.0 - self.release_at_b);
        match pass.kind {
            PassKind::F => m,
            PassKind::B => held_for_w - m,
            PassKind::W => -held_for_w,
            PassKind::BW => -m,
        }
    }

    /// Memory a pass holds while it runs beyond its worker's before it: a recomputing
    /// stage's B (or BW) rebuilds the part of the stash its F did not keep.
    pub fn transient(&self, pass: crate::pass::Pass) -> f64 {
        match pass.kind {
            PassKind::B | PassKind::BW => {
                (self.stash(pass.stage) - self.stages[pass.stage as usize].mem).max(0.0)
            }
            PassKind::F | PassKind::W => 0.0,
        }
    }

    /// Time of the forward a pass redoes (inside its duration): idle time, not work.
    pub fn redone(&self, pass: crate::pass::Pass) -> f64 {
        match pass.kind {
            PassKind::B | PassKind::BW => self
                .recompute
                .get(pass.stage as usize)
                .map_or(0.0, |r| r.redo),
            PassKind::F | PassKind::W => 0.0,
        }
    }

    /// Duration of a pass of `kind` over `stage` (BW = B + W).
    pub fn duration(&self, kind: PassKind, stage: u32) -> f64 {
        let c = &self.stages[stage as usize];
        match kind {
            PassKind::F => c.f,
            PassKind::B => c.b,
            PassKind::W => c.w,
            PassKind::BW => c.b + c.w,
        }
    }
}
