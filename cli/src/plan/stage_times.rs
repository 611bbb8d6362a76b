//! `pipewise plan --stage-times FILE`: per-stage pass times and memory, one line a stage.

use std::path::Path;

use anyhow::{Context as _, Result};

use crate::text_file::read_text;
use crate::values::number;

/// Times of one stage from `--stage-times`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct StageTimes {
    /// Forward.
    pub(crate) f: f64,
    /// Input-gradient backward.
    pub(crate) b: f64,
    /// Weight-gradient backward.
    pub(crate) w: f64,
    /// Activation memory per microbatch, if given.
    pub(crate) mem: Option<f64>,
}

/// The largest `--stage-times` file read (4096 workers × 64 chunks of lines, with room).
const MAX_STAGE_TIMES_BYTES: u64 = 64 << 20;

/// Reads and parses a `--stage-times` file.
pub(crate) fn read_stage_times(path: &Path) -> Result<Vec<StageTimes>> {
    let text = read_text(path, MAX_STAGE_TIMES_BYTES).context("--stage-times")?;
    parse_stage_times(&text).map_err(|e| anyhow::anyhow!("--stage-times {}: {e}", path.display()))
}

/// The smallest positive `mem` of a `--stage-times` line, in memory units.
const MIN_STAGE_MEMORY: f64 = 1e-6;

/// Parses the text of a `--stage-times` file.
pub(crate) fn parse_stage_times(text: &str) -> std::result::Result<Vec<StageTimes>, String> {
    // A byte-order mark, as some editors write, like CSV schedules accept.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut stages = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let content = line.split('#').next().unwrap_or("").trim();
        if content.is_empty() {
            continue;
        }
        let at = |e: String| format!("line {}: {e}", i + 1);
        let parts: Vec<&str> = content.split(',').collect();
        if !(3..=4).contains(&parts.len()) {
            return Err(at(format!(
                "expected f,b,w[,mem] (3 or 4 comma-separated numbers), got {content:?}"
            )));
        }
        let f = number(parts[0], "f").map_err(at)?;
        let b = number(parts[1], "b").map_err(at)?;
        let w = number(parts[2], "w").map_err(at)?;
        if f + b + w <= 0.0 {
            return Err(at("f + b + w must be greater than 0".into()));
        }
        let mem = match parts.get(3) {
            Some(m) => {
                let mem = number(m, "mem").map_err(at)?;
                // The planners compare memory with an absolute tolerance of 1e-9 units.
                if mem > 0.0 && mem < MIN_STAGE_MEMORY {
                    return Err(at(format!(
                        "mem {m} is below {MIN_STAGE_MEMORY:e}: it is in units of one \
                         microbatch's activation over 1/d of the model (1/v for a stage of \
                         a worker with v stages), not in bytes or GB; give 0 for none"
                    )));
                }
                Some(mem)
            }
            None => None,
        };
        stages.push(StageTimes { f, b, w, mem });
    }
    if stages.is_empty() {
        return Err("no stages (expected one line f,b,w[,mem] per stage)".into());
    }
    Ok(stages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stage_times() {
        let text = "# stage times\n1,2,1\n\n 0.5, 1, 0.5, 0.25 # last\n";
        let stages = parse_stage_times(text).expect("parses");
        assert_eq!(stages.len(), 2);
        assert_eq!(stages[1].mem, Some(0.25));
        assert!(parse_stage_times("1,2\n").is_err_and(|e| e.contains("line 1")));
        assert!(parse_stage_times("1,2,1\n1,x,1\n").is_err_and(|e| e.contains("line 2")));
        assert!(parse_stage_times("# nothing\n").is_err());
        // Memory below the planners' tolerance is refused, zero is none.
        assert!(parse_stage_times("1,1,1,1e-7\n").is_err_and(|e| e.contains("below 1e-6")));
        assert!(parse_stage_times("1,1,1,0\n1,1,1,1e-6\n").is_ok());
        let bom = parse_stage_times("\u{feff}1,2,1\n").expect("a byte-order mark is skipped");
        assert_eq!(bom.len(), 1);
    }
}
