//! `[validation]`: a held-out loss measured during training, every `freq` optimizer steps
//! and after the last (torchtitan's `[validation]`, Hugging Face Trainer's `eval_steps`).
//!
//! The windows come from a data file of their own (`path`, read as `[data] path` is) or
//! from the end of the training stream (`fraction`: training then samples only the windows
//! before them). Each evaluation takes `steps` batches of `global_batch_size` windows in
//! order, or every window. The section's fields are in `spec`; this file has what they
//! mean (when a job evaluates, how many windows) and their checks.

use std::path::{Path, PathBuf};

use super::confine::{MAX_PATH_BYTES, check_text, confine};
use super::spec::{JobSpec, Validation};
use crate::error::{Error, Result};

impl Validation {
    /// The most windows one evaluation takes with global batch `global_batch`: `None` for
    /// every window.
    pub fn max_windows(&self, global_batch: u32) -> Option<u64> {
        u64::try_from(self.steps)
            .ok()
            .map(|steps| steps.saturating_mul(u64::from(global_batch)))
    }

    /// Whether the job evaluates after step `step` (0-based) of `steps`: every
    /// [`Validation::freq`]-th step, and the last.
    pub fn due(&self, step: u64, steps: u64) -> bool {
        let done = step + 1;
        done.is_multiple_of(u64::from(self.freq.max(1))) || done == steps
    }

    /// Checks the section, naming the field (`validation.path` …).
    pub(crate) fn check(&self) -> Result<()> {
        match (&self.path, self.fraction) {
            (Some(_), Some(_)) => {
                return Err(Error::invalid(
                    "validation.fraction",
                    "give validation.path or validation.fraction, not both",
                ));
            }
            (None, None) => {
                return Err(Error::invalid(
                    "validation.path",
                    "give the validation data (path) or the fraction of the training \
                     windows to hold out (fraction)",
                ));
            }
            (Some(path), None) => {
                if path.trim().is_empty() {
                    return Err(Error::invalid(
                        "validation.path",
                        "must not be empty when given",
                    ));
                }
                check_text("validation.path", path, MAX_PATH_BYTES)?;
            }
            (None, Some(f)) => {
                if !(f > 0.0 && f < 1.0) {
                    return Err(Error::invalid(
                        "validation.fraction",
                        format!("must be between 0 and 1 (exclusive), got {f}"),
                    ));
                }
            }
        }
        if self.freq == 0 {
            return Err(Error::invalid("validation.freq", "must be at least 1 step"));
        }
        if self.steps == 0 || self.steps < -1 {
            return Err(Error::invalid(
                "validation.steps",
                format!(
                    "must be at least 1 batch, or -1 for every window, got {}",
                    self.steps
                ),
            ));
        }
        Ok(())
    }
}

impl JobSpec {
    /// `validation.path` under data directory `root` ([`confine`]); `None`: no validation
    /// file (no validation, or a held-out fraction).
    pub fn validation_path_in(&self, root: &Path) -> Result<Option<PathBuf>> {
        self.validation
            .as_ref()
            .and_then(|v| v.path.as_deref())
            .map(|path| confine("validation.path", path, root))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::example;

    fn field_of(spec: &JobSpec) -> &'static str {
        match spec.validate() {
            Err(Error::InvalidArgument { field, .. }) => field,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    /// Every bad field of the section is refused, naming it.
    #[test]
    fn every_bad_validation_field_is_named() {
        type Edit = fn(&mut Validation);
        let cases: Vec<(&str, Edit)> = vec![
            ("validation.path", |v| v.path = None),
            ("validation.path", |v| v.path = Some(" ".into())),
            ("validation.path", |v| {
                v.path = Some("x".repeat(MAX_PATH_BYTES + 1))
            }),
            ("validation.path", |v| v.path = Some("a\nb".into())),
            ("validation.fraction", |v| v.fraction = Some(0.1)),
            ("validation.fraction", |v| {
                v.path = None;
                v.fraction = Some(0.0);
            }),
            ("validation.fraction", |v| {
                v.path = None;
                v.fraction = Some(1.0);
            }),
            ("validation.fraction", |v| {
                v.path = None;
                v.fraction = Some(f64::NAN);
            }),
            ("validation.fraction", |v| {
                v.path = None;
                v.fraction = Some(-0.5);
            }),
            ("validation.freq", |v| v.freq = 0),
            ("validation.steps", |v| v.steps = 0),
            ("validation.steps", |v| v.steps = -2),
        ];
        for (expected, edit) in cases {
            let mut spec = example(2, "1f1b");
            let mut v = Validation {
                path: Some("valid.txt".into()),
                ..Validation::default()
            };
            edit(&mut v);
            spec.validation = Some(v);
            assert_eq!(field_of(&spec), expected, "{:?}", spec.validation);
        }
    }

    /// A path or a fraction, with the defaults (every 10 steps, every window) or given
    /// values, is accepted and survives the trip through TOML; no section is no validation.
    #[test]
    fn the_section_reads_its_defaults_and_round_trips() {
        let base = example(2, "1f1b");
        assert_eq!(base.validation, None);
        assert!(!base.to_toml().expect("toml").contains("[validation]"));
        let text = format!(
            "{}\n[validation]\npath = \"valid.txt\"\n",
            base.to_toml().expect("toml")
        );
        let spec = JobSpec::from_toml(&text).expect("parses");
        let v = spec.validation.clone().expect("a section");
        assert_eq!((v.freq, v.steps, v.fraction), (10, -1, None));
        assert_eq!(v.max_windows(8), None);
        spec.validate().expect("valid");
        let mut spec = base.clone();
        spec.validation = Some(Validation {
            fraction: Some(0.25),
            freq: 3,
            steps: 2,
            ..Validation::default()
        });
        spec.validate().expect("valid");
        let text = spec.to_toml().expect("toml");
        assert_eq!(JobSpec::from_toml(&text).expect("parses"), spec, "{text}");
        assert_eq!(spec.validation.map(|v| v.max_windows(8)), Some(Some(16)));
        let unknown = format!("{text}\nbatch = 3\n");
        match JobSpec::from_toml(&unknown) {
            Err(Error::InvalidArgument { field, reason }) => {
                assert_eq!(field, "toml");
                assert!(reason.contains("batch"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    /// Every `freq`-th step and the last one evaluate.
    #[test]
    fn evaluations_fall_every_freq_steps_and_after_the_last() {
        let v = Validation {
            freq: 4,
            ..Validation::default()
        };
        let due: Vec<u64> = (0..10).filter(|&s| v.due(s, 10)).collect();
        assert_eq!(due, [3, 7, 9]);
        let every = Validation {
            freq: 1,
            ..Validation::default()
        };
        assert!((0..5).all(|s| every.due(s, 5)));
    }

    /// The path is confined to the data directory as `[data] path` is.
    #[test]
    fn the_path_is_confined_to_the_data_directory() {
        let root = Path::new("/srv/data");
        let mut spec = example(2, "1f1b");
        assert_eq!(spec.validation_path_in(root).expect("none"), None);
        spec.validation = Some(Validation {
            path: Some("held/out.txt".into()),
            ..Validation::default()
        });
        assert_eq!(
            spec.validation_path_in(root).expect("inside"),
            Some(PathBuf::from("/srv/data/held/out.txt"))
        );
        spec.validation = Some(Validation {
            path: Some("../out.txt".into()),
            ..Validation::default()
        });
        match spec.validation_path_in(root) {
            Err(Error::InvalidArgument { field, .. }) => assert_eq!(field, "validation.path"),
            other => panic!("{other:?}"),
        }
    }
}
