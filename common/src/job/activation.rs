//! `[activation_checkpoint]` (torchtitan's section): whether the stages recompute their
//! activations in the backward instead of keeping them ([`crate::schedule::Recompute`]:
//! what each mode keeps and redoes), on every stage. Workers with real compute apply it to
//! every stage they hold; emulated compute has no activations to keep or redo, so a job
//! asking for recomputation there is refused when it is checked.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::schedule::Recompute;

/// `[activation_checkpoint]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActivationCheckpoint {
    /// `"none"` (default), `"selective"` or `"full"`, on every stage. Kept as written and
    /// read by [`ActivationCheckpoint::recompute`], so a bad value names this field.
    #[serde(default = "none")]
    pub mode: String,
}

fn none() -> String {
    Recompute::None.name().to_string()
}

impl Default for ActivationCheckpoint {
    fn default() -> Self {
        ActivationCheckpoint { mode: none() }
    }
}

impl ActivationCheckpoint {
    /// Whether the section says no more than the default (left out of the TOML form).
    pub fn is_default(&self) -> bool {
        self.recompute() == Ok(Recompute::None)
    }

    /// The mode, or an error naming `activation_checkpoint.mode`.
    pub fn recompute(&self) -> Result<Recompute> {
        self.mode.parse().map_err(|_| {
            Error::invalid(
                "activation_checkpoint.mode",
                format!(
                    "unknown mode {:?}; one of \"none\", \"selective\", \"full\"",
                    self.mode
                ),
            )
        })
    }

    /// Checks the mode, and refuses recomputation under emulated compute (`emulated`),
    /// whose passes hold no activations.
    pub(crate) fn check(&self, emulated: bool) -> Result<()> {
        match self.recompute()? {
            Recompute::None => Ok(()),
            mode if emulated => Err(Error::invalid(
                "activation_checkpoint.mode",
                format!(
                    "{mode} recomputation means nothing under [compute] mode = \"emulate\" \
                     (its passes hold no activations); use mode = \"none\" or real compute"
                ),
            )),
            _ => Ok(()),
        }
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
            with_section("").unwrap().activation_checkpoint.recompute(),
            Ok(Recompute::None)
        );
        for mode in Recompute::ALL {
            let spec =
                with_section(&format!("\n[activation_checkpoint]\nmode = \"{mode}\"\n")).unwrap();
            assert_eq!(spec.activation_checkpoint.recompute(), Ok(mode));
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
            assert_eq!(back.activation_checkpoint.recompute(), Ok(mode));
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
}
