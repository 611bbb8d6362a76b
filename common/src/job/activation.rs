//! `[activation_checkpoint]` (torchtitan's section): whether the stages recompute their
//! activations in the backward instead of keeping them ([`crate::schedule::Recompute`]:
//! what each mode keeps and redoes). `mode` sets every stage alike, `per_stage` each stage
//! of the plan, and `mode = "auto"` (with `pipeline_parallel_schedule = "auto"`) lets the
//! planner recompute only the stages whose worker would otherwise overflow its memory
//! ([`crate::auto`]). Workers with real compute apply the plan's modes to the stages they
//! hold; emulated compute has no activations to keep or redo, so a job asking for
//! recomputation there is refused when it is checked.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::schedule::Recompute;

/// `mode`'s value that leaves the choice per stage to the planner.
pub const AUTO_RECOMPUTE: &str = "auto";

/// `[activation_checkpoint]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActivationCheckpoint {
    /// `"none"` (default), `"selective"` or `"full"` on every stage, or `"auto"`. Kept as
    /// written and read by [`ActivationCheckpoint::request`], so a bad value names this
    /// field.
    #[serde(default = "none")]
    pub mode: String,
    /// One mode per stage of the plan, in stage order (empty: `mode` on every stage).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_stage: Vec<String>,
}

fn none() -> String {
    Recompute::None.name().to_string()
}

impl Default for ActivationCheckpoint {
    fn default() -> Self {
        ActivationCheckpoint {
            mode: none(),
            per_stage: Vec::new(),
        }
    }
}

/// What a job asks of its stages' recomputation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecomputeRequest {
    /// The same mode on every stage.
    Every(Recompute),
    /// These modes, one per stage.
    PerStage(Vec<Recompute>),
    /// The planner's choice: none where the memory allows, more where it does not.
    WhereNeeded,
}

impl ActivationCheckpoint {
    /// The section giving `modes`, one per stage: `mode` when they are all the same.
    pub fn of_stages(modes: &[Recompute]) -> ActivationCheckpoint {
        match modes.split_first() {
            None => ActivationCheckpoint::default(),
            Some((first, rest)) if rest.iter().all(|m| m == first) => ActivationCheckpoint {
                mode: first.name().to_string(),
                per_stage: Vec::new(),
            },
            Some(_) => ActivationCheckpoint {
                mode: none(),
                per_stage: modes.iter().map(|m| m.name().to_string()).collect(),
            },
        }
    }

    /// Whether the section says no more than the default (left out of the TOML form).
    pub fn is_default(&self) -> bool {
        self.request() == Ok(RecomputeRequest::Every(Recompute::None))
    }

    /// What the section asks, or an error naming the field at fault.
    pub fn request(&self) -> Result<RecomputeRequest> {
        let parse = |field: &'static str, text: &str| {
            text.parse::<Recompute>().map_err(|_| {
                Error::invalid(
                    field,
                    format!(
                        "unknown mode {text:?}; one of \"none\", \"selective\", \"full\"{}",
                        if field == "activation_checkpoint.mode" {
                            ", \"auto\""
                        } else {
                            ""
                        }
                    ),
                )
            })
        };
        let auto = self.mode.trim().eq_ignore_ascii_case(AUTO_RECOMPUTE);
        if self.per_stage.is_empty() {
            return Ok(if auto {
                RecomputeRequest::WhereNeeded
            } else {
                RecomputeRequest::Every(parse("activation_checkpoint.mode", &self.mode)?)
            });
        }
        if auto || parse("activation_checkpoint.mode", &self.mode)? != Recompute::None {
            return Err(Error::invalid(
                "activation_checkpoint.per_stage",
                format!("give either mode = {:?} or per_stage, not both", self.mode),
            ));
        }
        self.per_stage
            .iter()
            .map(|m| parse("activation_checkpoint.per_stage", m))
            .collect::<Result<Vec<_>>>()
            .map(RecomputeRequest::PerStage)
    }

    /// The mode of each of a plan's `stages` stages. `per_stage` must list exactly that
    /// many; `mode = "auto"` is the planner's to resolve and is an error here.
    pub fn modes(&self, stages: usize) -> Result<Vec<Recompute>> {
        match self.request()? {
            RecomputeRequest::Every(mode) => Ok(vec![mode; stages]),
            RecomputeRequest::PerStage(modes) if modes.len() == stages => Ok(modes),
            RecomputeRequest::PerStage(modes) => Err(Error::invalid(
                "activation_checkpoint.per_stage",
                format!(
                    "{} modes for a plan of {stages} stages; give one per stage",
                    modes.len()
                ),
            )),
            RecomputeRequest::WhereNeeded => Err(Error::invalid(
                "activation_checkpoint.mode",
                "\"auto\" is chosen by the planner of pipeline_parallel_schedule = \"auto\"",
            )),
        }
    }

    /// The modes of a plan of `stages` stages that a re-plan made (another schedule may
    /// have another stage count): [`ActivationCheckpoint::modes`] where `per_stage` fits,
    /// else its most recomputing mode on every stage, which keeps the least. `auto` keeps
    /// `planned`'s modes when their count fits, else recomputes everywhere as much as
    /// `planned` does anywhere.
    pub fn modes_after_replan(&self, stages: usize, planned: &[Recompute]) -> Vec<Recompute> {
        let most = |modes: &[Recompute]| modes.iter().copied().max().unwrap_or_default();
        match self.request() {
            Ok(RecomputeRequest::Every(mode)) => vec![mode; stages],
            Ok(RecomputeRequest::PerStage(modes)) if modes.len() == stages => modes,
            Ok(RecomputeRequest::PerStage(modes)) => vec![most(&modes); stages],
            _ if planned.len() == stages => planned.to_vec(),
            _ => vec![most(planned); stages],
        }
    }

    /// Checks the section against the job: `auto` needs the auto schedule (`auto_schedule`),
    /// and recomputation is refused under emulated compute (`emulated`), whose passes hold
    /// no activations.
    pub(crate) fn check(&self, emulated: bool, auto_schedule: bool) -> Result<()> {
        let (field, recomputes) = match self.request()? {
            RecomputeRequest::Every(mode) => {
                ("activation_checkpoint.mode", mode != Recompute::None)
            }
            RecomputeRequest::PerStage(modes) => {
                if auto_schedule {
                    return Err(Error::invalid(
                        "activation_checkpoint.per_stage",
                        "the stages of pipeline_parallel_schedule = \"auto\" are not known \
                         before it plans; use mode = \"auto\" (or one mode for every stage)",
                    ));
                }
                (
                    "activation_checkpoint.per_stage",
                    modes.iter().any(|m| *m != Recompute::None),
                )
            }
            RecomputeRequest::WhereNeeded => {
                if !auto_schedule {
                    return Err(Error::invalid(
                        "activation_checkpoint.mode",
                        "\"auto\" needs pipeline_parallel_schedule = \"auto\"; with a named \
                         schedule give the modes (mode or per_stage)",
                    ));
                }
                ("activation_checkpoint.mode", true)
            }
        };
        if recomputes && emulated {
            return Err(Error::invalid(
                field,
                "recomputation means nothing under [compute] mode = \"emulate\" (its passes \
                 hold no activations); use mode = \"none\" or real compute",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::job::{Compute, JobSpec, example};

    fn with_section(section: &str) -> Result<JobSpec> {
        let mut text = example(2, "1f1b").to_toml().unwrap();
        text.push_str(section);
        JobSpec::from_toml(&text)
    }

    #[test]
    fn the_section_reads_every_mode_and_defaults_to_none() {
        assert_eq!(
            with_section("").unwrap().activation_checkpoint.request(),
            Ok(RecomputeRequest::Every(Recompute::None))
        );
        for mode in Recompute::ALL {
            let spec =
                with_section(&format!("\n[activation_checkpoint]\nmode = \"{mode}\"\n")).unwrap();
            assert_eq!(
                spec.activation_checkpoint.request(),
                Ok(RecomputeRequest::Every(mode))
            );
        }
    }

    #[test]
    fn a_bad_mode_names_the_field() {
        let spec = with_section("\n[activation_checkpoint]\nmode = \"partial\"\n").unwrap();
        match spec.validate() {
            Err(Error::InvalidArgument { field, reason }) => {
                assert_eq!(field, "activation_checkpoint.mode");
                assert!(reason.contains("\"partial\""), "{reason}");
            }
            other => panic!("expected an error naming the field, got {other:?}"),
        }
        let unknown = with_section("\n[activation_checkpoint]\nlayers = 2\n").unwrap_err();
        assert!(unknown.to_string().contains("layers"), "{unknown}");
    }

    #[test]
    fn recomputation_is_accepted_with_real_compute_and_refused_emulated() {
        for mode in [Recompute::Selective, Recompute::Full] {
            let mut spec =
                with_section(&format!("\n[activation_checkpoint]\nmode = \"{mode}\"\n")).unwrap();
            assert!(!spec.compute.is_emulated());
            assert!(spec.validate().is_ok(), "{mode} with real compute");
            let back = JobSpec::from_toml(&spec.to_toml().unwrap()).unwrap();
            assert_eq!(back.activation_checkpoint, spec.activation_checkpoint);
            spec.compute = Compute::emulate(1.0, 1.0, 1.0);
            match spec.validate() {
                Err(Error::InvalidArgument { field, reason }) => {
                    assert_eq!(field, "activation_checkpoint.mode");
                    assert!(reason.contains("emulate"), "{reason}");
                }
                other => panic!("{mode}: expected a refusal under emulation, got {other:?}"),
            }
        }
        let mut none = with_section("\n[activation_checkpoint]\nmode = \"none\"\n").unwrap();
        assert!(none.validate().is_ok());
        // The default section is left out of the TOML form, so jobs read back unchanged.
        assert!(!none.to_toml().unwrap().contains("activation_checkpoint"));
        none.compute = Compute::emulate(1.0, 1.0, 1.0);
        assert!(none.validate().is_ok(), "no recomputation is fine emulated");
    }

    /// The field and reason of an `InvalidArgument`; panics on anything else.
    fn refused<T: std::fmt::Debug>(r: Result<T>) -> (&'static str, String) {
        match r {
            Err(Error::InvalidArgument { field, reason }) => (field, reason),
            other => panic!("expected an error naming a field, got {other:?}"),
        }
    }

    #[test]
    fn per_stage_modes_reach_the_plan_and_must_match_its_stages() {
        let section = "\n[activation_checkpoint]\nper_stage = [\"full\", \"none\"]\n";
        let spec = with_section(section).unwrap();
        let plan = spec.validate().unwrap();
        assert_eq!(plan.recompute, [Recompute::Full, Recompute::None]);
        let back = JobSpec::from_toml(&spec.to_toml().unwrap()).unwrap();
        assert_eq!(back.activation_checkpoint, spec.activation_checkpoint);

        let three =
            with_section("\n[activation_checkpoint]\nper_stage = [\"full\", \"none\", \"none\"]\n")
                .unwrap();
        let (field, reason) = refused(three.validate());
        assert_eq!(field, "activation_checkpoint.per_stage");
        assert!(
            reason.contains("3 modes for a plan of 2 stages"),
            "{reason}"
        );

        let both = with_section(
            "\n[activation_checkpoint]\nmode = \"full\"\nper_stage = [\"full\", \"none\"]\n",
        )
        .unwrap();
        assert_eq!(
            refused(both.validate()).0,
            "activation_checkpoint.per_stage"
        );
        let bad =
            with_section("\n[activation_checkpoint]\nper_stage = [\"full\", \"half\"]\n").unwrap();
        let (field, reason) = refused(bad.validate());
        assert_eq!(field, "activation_checkpoint.per_stage");
        assert!(reason.contains("\"half\""), "{reason}");

        let mut emulated = spec.clone();
        emulated.compute = Compute::emulate(1.0, 1.0, 1.0);
        assert_eq!(
            refused(emulated.validate()).0,
            "activation_checkpoint.per_stage"
        );
    }

    #[test]
    fn auto_recomputation_needs_the_auto_schedule() {
        let auto = "\n[activation_checkpoint]\nmode = \"auto\"\n";
        let (field, reason) = refused(with_section(auto).unwrap().validate());
        assert_eq!(field, "activation_checkpoint.mode");
        assert!(reason.contains("pipeline_parallel_schedule"), "{reason}");

        let mut spec = with_section(auto).unwrap();
        spec.parallelism.pipeline_parallel_schedule = crate::job::AUTO_SCHEDULE.into();
        assert_eq!(
            spec.activation_checkpoint.request(),
            Ok(RecomputeRequest::WhereNeeded)
        );
        spec.validate().unwrap();
        let mut emulated = spec.clone();
        emulated.compute = Compute::emulate(1.0, 1.0, 1.0);
        assert_eq!(refused(emulated.validate()).0, "activation_checkpoint.mode");

        spec.activation_checkpoint =
            ActivationCheckpoint::of_stages(&[Recompute::Full, Recompute::None]);
        let (field, reason) = refused(spec.validate());
        assert_eq!(field, "activation_checkpoint.per_stage");
        assert!(reason.contains("mode = \"auto\""), "{reason}");
    }

    #[test]
    fn modes_written_back_read_the_same_and_replans_keep_the_least_memory() {
        use Recompute::{Full, None, Selective};
        for modes in [
            vec![Full, Full],
            vec![None, None, None],
            vec![Full, Selective, None],
        ] {
            let section = ActivationCheckpoint::of_stages(&modes);
            assert_eq!(section.modes(modes.len()), Ok(modes.clone()));
        }
        assert!(
            ActivationCheckpoint::of_stages(&[Full, Full])
                .per_stage
                .is_empty()
        );
        let mixed = ActivationCheckpoint::of_stages(&[Full, Selective, None]);
        assert_eq!(mixed.modes_after_replan(3, &[]), [Full, Selective, None]);
        assert_eq!(mixed.modes_after_replan(6, &[]), [Full; 6]);
        let auto = ActivationCheckpoint {
            mode: AUTO_RECOMPUTE.into(),
            per_stage: Vec::new(),
        };
        assert_eq!(
            auto.modes_after_replan(2, &[Selective, None]),
            [Selective, None]
        );
        assert_eq!(
            auto.modes_after_replan(4, &[Selective, None]),
            [Selective; 4]
        );
    }
}
