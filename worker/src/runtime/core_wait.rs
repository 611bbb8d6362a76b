//! Time a worker's compute thread waited for a core while it waited for a peer:
//! [`CoreWait`].
//!
//! A wait for a frame or for the end-of-step collectives ends when the data is there, but
//! the thread runs again only when a core is free. Where workers share cores (`pipewise
//! local` with more workers than cores), part of the measured bubble is that second wait.
//! Linux counts it per thread as run-queue delay (`/proc/thread-self/schedstat`, second
//! field, nanoseconds a runnable thread was not running); the delay accrued during a wait is
//! the share of that wait spent waiting for a core rather than for a peer. It is an upper
//! bound: a wait woken early (by another frame for this worker, or by the collectives'
//! periodic check) also counts the core it waited for then. The delay accrued during a pass
//! is counted apart: it stretches the pass (busy time), not the bubble; it is the compute
//! thread's own, a lower bound where kernels also run on a pool's threads. Elsewhere, or
//! where the file cannot be read, nothing is counted.

use std::fs::File;
use std::time::Duration;

/// The run-queue delay of the thread that opened it, summed over the waits and over the
/// passes it was asked to time.
#[derive(Debug, Default)]
pub(crate) struct CoreWait {
    /// `/proc/thread-self/schedstat` of the opening thread (it names that thread's file
    /// however later reads are made); `None`: not available.
    file: Option<File>,
    /// Run-queue delay accrued during timed waits.
    waited: Duration,
    /// Run-queue delay accrued during timed passes.
    in_passes: Duration,
}

impl CoreWait {
    /// Starts counting for the calling thread.
    pub(crate) fn start() -> CoreWait {
        CoreWait {
            file: File::open("/proc/thread-self/schedstat").ok(),
            waited: Duration::ZERO,
            in_passes: Duration::ZERO,
        }
    }

    /// The thread's run-queue delay so far (`None`: not available).
    pub(crate) fn mark(&self) -> Option<u64> {
        let file = self.file.as_ref()?;
        let mut buf = [0u8; 96];
        let n = read_at_start(file, &mut buf)?;
        run_delay_ns(std::str::from_utf8(&buf[..n]).ok()?)
    }

    /// Counts the run-queue delay since `mark` (from [`CoreWait::mark`] at the wait's start)
    /// as a wait's time waiting for a core.
    pub(crate) fn add_since(&mut self, mark: Option<u64>) {
        self.waited += self.since(mark);
    }

    /// Counts the run-queue delay since `mark` (taken when a pass started) as a pass's time
    /// waiting for a core.
    pub(crate) fn add_pass_since(&mut self, mark: Option<u64>) {
        self.in_passes += self.since(mark);
    }

    fn since(&self, mark: Option<u64>) -> Duration {
        match (mark, self.mark()) {
            (Some(before), Some(now)) => Duration::from_nanos(now.saturating_sub(before)),
            _ => Duration::ZERO,
        }
    }

    /// The waits' time waiting for a core so far.
    pub(crate) fn waited(&self) -> Duration {
        self.waited
    }

    /// The passes' time waiting for a core so far.
    pub(crate) fn in_passes(&self) -> Duration {
        self.in_passes
    }
}

/// Reads the file from its start (procfs regenerates it on each read at offset 0).
#[cfg(unix)]
fn read_at_start(file: &File, buf: &mut [u8]) -> Option<usize> {
    use std::os::unix::fs::FileExt as _;
    file.read_at(buf, 0).ok()
}

#[cfg(not(unix))]
fn read_at_start(_file: &File, _buf: &mut [u8]) -> Option<usize> {
    None
}

/// The run-queue delay in a `schedstat` line: `<on-cpu ns> <run-queue ns> <timeslices>`.
fn run_delay_ns(schedstat: &str) -> Option<u64> {
    let mut fields = schedstat.split_ascii_whitespace();
    fields.next()?.parse::<u64>().ok()?;
    fields.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn reads_the_second_field() {
        assert_eq!(run_delay_ns("660555 1234 1\n"), Some(1234));
        assert_eq!(run_delay_ns("660555\n"), None);
        assert_eq!(run_delay_ns("x 5 1"), None);
        assert_eq!(run_delay_ns(""), None);
    }

    /// Two threads spinning on one core: each waits for the core about half the time, and
    /// the delay is counted only between a mark and `add_since`.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn counts_run_queue_delay_of_a_busy_core() {
        let pin = |cpu: usize| {
            // SAFETY: a zeroed cpu_set_t is a valid empty set; the call only reads it.
            #[allow(unsafe_code)]
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
            }
        };
        let spin = |d: Duration| {
            let t = std::time::Instant::now();
            while t.elapsed() < d {
                std::hint::spin_loop();
            }
        };
        let other = std::thread::spawn(move || {
            if pin(0) != 0 {
                return;
            }
            spin(Duration::from_millis(600));
        });
        if pin(0) != 0 {
            other.join().unwrap();
            return; // no CPU 0 to share here: nothing to check
        }
        let mut wait = CoreWait::start();
        let Some(mark) = wait.mark() else {
            other.join().unwrap();
            return; // schedstat not enabled in this kernel
        };
        spin(Duration::from_millis(50)); // not timed
        let mark2 = wait.mark();
        assert!(mark2.unwrap() >= mark);
        wait.add_since(mark2);
        let untimed = wait.waited();
        let mark3 = wait.mark();
        spin(Duration::from_millis(300));
        wait.add_pass_since(mark3);
        other.join().unwrap();
        if wait.mark() == Some(0) {
            return; // schedstat accounting is off in this kernel: it counts nothing
        }
        assert!(untimed < Duration::from_millis(20), "{untimed:?}");
        assert_eq!(wait.waited(), untimed, "a pass's delay is not a wait's");
        let timed = wait.in_passes();
        // 300 ms (wall time) of spinning against another spinner on the same core: about
        // half of it waiting (150 ms); well clear of 0 and of the whole 300 ms twice.
        assert!(
            timed > Duration::from_millis(50) && timed < Duration::from_millis(600),
            "{timed:?}"
        );
    }
}
