//! The worker process's heap policy: keep freed memory for reuse.
//!
//! A worker allocates a fresh buffer for every tensor it receives (0.5–64 MiB each, many per
//! step) and candle allocates one for every op's output. glibc's malloc serves large requests
//! with `mmap` and gives them back with `munmap` on free (above a threshold that adapts only
//! up to 32 MiB), and trims the top of the heap once 2× that threshold is free there. So the
//! next buffer of the same size faults in and zeroes fresh pages: for a 64 MiB frame that is
//! 16 384 page faults, and it halves the activation transport's throughput (transport bench:
//! 0.38–0.42 of raw TCP at 64 MiB before, 0.77–0.86 after).
//!
//! [`retain_freed_memory`] makes glibc serve every request from one heap (`M_MMAP_MAX` 0,
//! `M_ARENA_MAX` 1: per-thread arenas cannot hold blocks over 64 MiB, so they would `mmap`
//! anyway) and never trim it (`M_TRIM_THRESHOLD` at its maximum): freed buffers are reused in
//! place, the way PyTorch's caching allocator keeps GPU memory. The process's resident size
//! then stays at its peak. Small allocations still go through glibc's per-thread caches, so
//! one arena does not serialise them. Elsewhere (musl, macOS) it does nothing.

/// What [`retain_freed_memory`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeapPolicy {
    /// glibc now keeps freed memory in one heap for reuse.
    Retained,
    /// Not glibc: the allocator's defaults stand.
    Unsupported,
    /// glibc refused a setting (the defaults stand for it).
    Refused,
    /// Left at the allocator's defaults on request (`PIPEWISE_MALLOC=default`).
    Defaults,
}

impl std::fmt::Display for HeapPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HeapPolicy::Retained => "freed memory retained (one glibc heap, no trimming)",
            HeapPolicy::Unsupported => "allocator defaults (not glibc)",
            HeapPolicy::Refused => "allocator defaults (glibc refused a setting)",
            HeapPolicy::Defaults => "allocator defaults (PIPEWISE_MALLOC=default)",
        })
    }
}

/// What the `pipewise` binary and the benchmarks call first: [`retain_freed_memory`], unless
/// the environment has `PIPEWISE_MALLOC=default`.
pub fn policy_from_env() -> HeapPolicy {
    if std::env::var_os("PIPEWISE_MALLOC").is_some_and(|v| v == "default") {
        HeapPolicy::Defaults
    } else {
        retain_freed_memory()
    }
}

/// Sets the heap policy described in the module docs. Call it first thing in `main`, before
/// any thread is started: threads that have already allocated keep their arena.
pub fn retain_freed_memory() -> HeapPolicy {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let settings = [
            (libc::M_MMAP_MAX, 0),
            (libc::M_ARENA_MAX, 1),
            (libc::M_TRIM_THRESHOLD, libc::c_int::MAX),
        ];
        let all_taken = settings.iter().all(|&(param, value)| {
            // SAFETY: `mallopt` takes two integers and only changes malloc's tunables (under
            // its own lock); it touches no memory of ours. This is the crate's only unsafe
            // block (the workspace denies `unsafe_code`).
            #[allow(unsafe_code)]
            let taken = unsafe { libc::mallopt(param, value) };
            taken == 1
        });
        if all_taken {
            HeapPolicy::Retained
        } else {
            HeapPolicy::Refused
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        HeapPolicy::Unsupported
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glibc_takes_the_settings() {
        let policy = retain_freed_memory();
        if cfg!(all(target_os = "linux", target_env = "gnu")) {
            assert_eq!(policy, HeapPolicy::Retained);
        } else {
            assert_eq!(policy, HeapPolicy::Unsupported);
        }
        // A large buffer still allocates, is writable and is freed (into the heap now).
        let mut buffer = vec![0u8; 8 << 20];
        buffer[(8 << 20) - 1] = 7;
        assert_eq!(buffer.iter().map(|&b| u64::from(b)).sum::<u64>(), 7);
    }
}
