//! Schedule names as typed after `--schedule`: parsed with `pipewise-common`'s names and
//! aliases, and a misspelt one answered with the closest known name ("did you mean v-half?").

use anyhow::{Result, anyhow};
use pipewise_common::ScheduleKind;
use pipewise_common::job::AUTO_SCHEDULE;

/// How alike (normalised Damerau–Levenshtein, 1 = equal) a typed name and a known one must
/// be for the known one to be suggested: one slip in five letters is, two in four are not.
const SUGGEST_SIMILARITY: f64 = 0.6;

/// Parses `name`, given to the flag `flag`. An unknown name is an error that names the flag
/// and the name, suggests the closest known name when one is close, and lists every known
/// name followed by `also` (another accepted form, e.g. "; or csv:PATH to import one").
pub(crate) fn parse_schedule(flag: &str, name: &str, also: &str) -> Result<ScheduleKind> {
    name.parse().map_err(|_| {
        let known = ScheduleKind::ALL.map(ScheduleKind::name).join(", ");
        match closest(name) {
            Some(near) => anyhow!(
                "{flag}: unknown schedule {name:?}; did you mean {near}? Known schedules: \
                 {known}{also}"
            ),
            None => anyhow!("{flag}: unknown schedule {name:?}; known schedules: {known}{also}"),
        }
    })
}

/// Checks a job's schedule given to `flag`: [`AUTO_SCHEDULE`] (the coordinator chooses on
/// the workers) or a name [`parse_schedule`] knows.
pub(crate) fn check_job_schedule(flag: &str, name: &str) -> Result<()> {
    if name == AUTO_SCHEDULE {
        return Ok(());
    }
    parse_schedule(flag, name, &format!("; or {AUTO_SCHEDULE}")).map(|_| ())
}

/// The known schedule name closest to `typed`, if any is close enough. Case, `-`, `_` and
/// spaces are ignored, so `vhalf` and `V Half` find `v-half`; ties go to the earlier name.
fn closest(typed: &str) -> Option<&'static str> {
    let squash = |s: &str| s.to_ascii_lowercase().replace(['-', '_', ' '], "");
    let typed = squash(typed.trim());
    let mut best: Option<(f64, &'static str)> = None;
    for kind in ScheduleKind::ALL {
        let score = strsim::normalized_damerau_levenshtein(&typed, &squash(kind.name()));
        if score >= SUGGEST_SIMILARITY && best.is_none_or(|(top, _)| score > top) {
            best = Some((score, kind.name()));
        }
    }
    best.map(|(_, name)| name)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn known_names_and_aliases_parse() {
        for kind in ScheduleKind::ALL {
            assert_eq!(parse_schedule("--schedule", kind.name(), "").unwrap(), kind);
        }
        assert_eq!(
            parse_schedule("--schedule", "V_Half", "").unwrap(),
            ScheduleKind::VHalf
        );
        assert_eq!(
            parse_schedule("--schedule", "zbh1", "").unwrap(),
            ScheduleKind::ZbH1
        );
    }

    #[test]
    fn a_misspelt_name_gets_the_closest_one() {
        for (typed, near) in [
            ("vhalf", "v-half"),
            ("vhaf", "v-half"),
            ("V-HAFL", "v-half"),
            ("gpip", "gpipe"),
            ("dualpipe", "dualpipe-v"),
            ("interleaved-1fb", "interleaved-1f1b"),
            ("zb-h3", "zb-h1"),
        ] {
            let err = parse_schedule("--schedule", typed, "")
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with(&format!(
                    "--schedule: unknown schedule {typed:?}; did you mean {near}? "
                )),
                "{typed}: {err}"
            );
            assert!(err.contains("adaptive-zb"), "{err}");
        }
    }

    #[test]
    fn a_name_close_to_none_lists_them_all() {
        let err = parse_schedule("--schedule", "2f2b", "; or csv:PATH")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("did you mean"), "{err}");
        assert!(
            err.starts_with("--schedule: unknown schedule \"2f2b\"; known schedules: gpipe, "),
            "{err}"
        );
        assert!(err.ends_with("adaptive-zb; or csv:PATH"), "{err}");
        assert_eq!(closest("nope"), None);
        assert_eq!(closest(""), None);
    }
}
