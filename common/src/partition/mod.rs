//! Every split of the model into pipeline stages goes through here: the model's pieces
//! (embedding, blocks, head; [`ModelSpec::pieces`](crate::model::ModelSpec::pieces)) cut
//! into contiguous, non-empty ranges, one per stage, in model order.
//!
//! - [`balance_placed`]: the default split: every worker of a placement (the stages it
//!   holds together) the same cost, then every stage, then the activation memory;
//! - [`even`]: by piece count, earlier stages taking the extra pieces;
//! - [`torchtitan_counts`]: torchtitan's first / last stage less layers and layers per stage;
//! - [`balance`]: the auto-planner's split for piece compute times and parameter counts;
//! - [`split_for_speeds`]: moving layers off a straggler, for measured worker speeds
//!   ([`fitting_split_for_speeds`]: as far towards it as the workers' memory allows;
//!   [`split_for_speeds_within`]: the one or, where it does not fit, the other);
//! - [`by_counts`]: ranges from pieces per stage (what the other splits and the wire carry);
//! - [`summary`]: the short text form of a split.
//!
//! The functions see piece counts and costs only, not the model spec, so the model, the job
//! and the planners can all call them.

mod balanced;
mod placed;
mod speeds;
#[cfg(test)]
mod testing;
mod text;
mod torchtitan;

use std::ops::Range;

pub use balanced::balance;
pub use placed::{SEARCH_NODES, balance_placed};
pub use speeds::{
    fitting_split_for_speeds, largest_worker_time, split_for_speeds, split_for_speeds_within,
};
pub use text::summary;
pub use torchtitan::torchtitan_counts;

use crate::error::{Error, Result};

/// `pieces` cut into `stages` contiguous ranges as evenly as possible (earlier stages get
/// the extra pieces); with the model's pieces the embedding goes with the first stage and
/// the head with the last.
pub fn even(pieces: usize, stages: usize) -> Result<Vec<Range<usize>>> {
    if stages == 0 || stages > pieces {
        return Err(Error::InvalidArgument {
            field: "stages",
            reason: format!("{stages} stages for a model of {pieces} pieces"),
        });
    }
    let mut ranges = Vec::with_capacity(stages);
    let mut start = 0;
    for s in 0..stages {
        let len = pieces / stages + usize::from(s < pieces % stages);
        ranges.push(start..start + len);
        start += len;
    }
    Ok(ranges)
}

/// `pieces` cut into contiguous ranges of `counts[s]` pieces each (a stage per count):
/// every count positive, adding up to `pieces`.
pub fn by_counts(pieces: usize, counts: &[u32]) -> Result<Vec<Range<usize>>> {
    let sum: u64 = counts.iter().map(|&c| u64::from(c)).sum();
    if counts.is_empty() || counts.contains(&0) || sum != pieces as u64 {
        return Err(Error::InvalidArgument {
            field: "stage_pieces",
            reason: format!(
                "{counts:?}: need a positive count per stage adding up to the model's \
                 {pieces} pieces"
            ),
        });
    }
    let mut start = 0;
    Ok(counts
        .iter()
        .map(|&c| {
            let r = start..start + c as usize;
            start = r.end;
            r
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_gives_earlier_stages_the_extra_pieces() {
        assert_eq!(even(10, 4), Ok(vec![0..3, 3..6, 6..8, 8..10]));
        assert_eq!(even(3, 3), Ok(vec![0..1, 1..2, 2..3]));
        assert!(even(3, 4).is_err());
        assert!(even(3, 0).is_err());
    }
}
