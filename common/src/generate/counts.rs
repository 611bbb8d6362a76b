//! The counts every generator needs.

use crate::error::{Error, Result};

/// At least one worker and one microbatch.
pub(crate) fn check_counts(d: u32, n: u32) -> Result<()> {
    if d == 0 {
        return Err(Error::invalid("workers", "must be at least 1"));
    }
    if n == 0 {
        return Err(Error::invalid("microbatches", "must be at least 1"));
    }
    Ok(())
}
