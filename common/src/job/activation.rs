//! `[activation_checkpoint]` (torchtitan's section): whether the stages recompute their
//! activations in the backward instead of keeping them.
//!
//! The planner counts recomputation ([`crate::schedule::Recompute`]); the workers do not
//! execute it yet, so a job asking for `selective` or `full` is refused when it is
//! checked, rather than run without it under a plan that assumes it.

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

    /// Checks the mode, and refuses the ones the workers cannot execute yet.
    pub(crate) fn check(&self) -> Result<()> {
        match self.recompute()? {
            Recompute::None => Ok(()),
            mode => Err(Error::invalid(
                "activation_checkpoint.mode",
                format!(
                    "{mode:?} recomputation is planned (`pipewise plan --recompute {mode}`) but \
                     the workers do not execute it yet; use mode = \"none\""
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::job::{JobSpec, example};

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
    fn recomputation_is_refused_until_the_workers_execute_it() {
        for mode in [Recompute::Selective, Recompute::Full] {
            let spec =
                with_section(&format!("\n[activation_checkpoint]\nmode = \"{mode}\"\n")).unwrap();
            match spec.validate() {
                Err(Error::InvalidArgument { field, reason }) => {
                    assert_eq!(field, "activation_checkpoint.mode");
                    assert!(reason.contains("do not execute it yet"), "{reason}");
                }
                other => panic!("{mode}: expected a refusal, got {other:?}"),
            }
        }
        let none = with_section("\n[activation_checkpoint]\nmode = \"none\"\n").unwrap();
        assert!(none.validate().is_ok());
        // The default section is left out of the TOML form, so jobs read back unchanged.
        assert!(!none.to_toml().unwrap().contains("activation_checkpoint"));
    }
}
