//! The host's available memory (`/proc/meminfo`), which a CPU worker's stages must fit.

use crate::error::{Error, Result};

/// The bytes of memory `/proc/meminfo` (its text, `meminfo`) says are available
/// (`MemAvailable`); `None` where that is unknown (not Linux, no such line).
pub fn available_memory(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let kib = line
            .strip_prefix("MemAvailable:")?
            .trim()
            .strip_suffix("kB")?;
        kib.trim().parse::<u64>().ok()?.checked_mul(1024)
    })
}

/// [`available_memory`] of this machine, read from `/proc/meminfo`.
pub fn host_available_memory() -> Option<u64> {
    available_memory(&read_meminfo())
}

/// `/proc/meminfo`'s text (empty where it cannot be read).
pub(crate) fn read_meminfo() -> String {
    std::fs::read_to_string("/proc/meminfo").unwrap_or_default()
}

/// Whether `state` bytes of parameters, gradients and optimizer state fit the memory
/// `/proc/meminfo` (its text, `meminfo`) says is available; an unknown figure passes.
pub(crate) fn fits_host_memory(state: u64, meminfo: &str) -> Result<()> {
    match available_memory(meminfo) {
        Some(bytes) if state > bytes => Err(Error::invalid(
            "assignment",
            format!(
                "this worker's stages hold {state} bytes of parameters, gradients and \
                 optimizer state, more than the {bytes} bytes of memory available on this \
                 machine; use more workers or a smaller model"
            ),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::fits_host_memory;

    #[test]
    fn state_beyond_the_available_memory_is_refused() {
        let meminfo = "MemTotal:       16000000 kB\nMemFree:         1000000 kB\n\
                       MemAvailable:    8000000 kB\n";
        let available = 8_000_000 * 1024;
        assert!(fits_host_memory(available, meminfo).is_ok());
        let err = fits_host_memory(available + 1, meminfo)
            .expect_err("too big")
            .to_string();
        assert!(
            err.contains(&format!("more than the {available} bytes")),
            "{err}"
        );
        // Unknown: passes.
        assert!(fits_host_memory(u64::MAX, "").is_ok());
        assert!(fits_host_memory(u64::MAX, "MemTotal: 1 kB\n").is_ok());
    }
}
