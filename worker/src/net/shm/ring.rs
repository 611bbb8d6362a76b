//! One directed pair's ring: a single-producer single-consumer byte ring in a shared file
//! (under `/dev/shm`), mapped by both processes, with futex wake-ups.
//!
//! The file is a 4 KiB control page and then `capacity` bytes of data (a power of two). The
//! producer owns `head` (bytes written, ever), the consumer `tail` (bytes read, ever); both
//! only grow, so `head − tail` is what is queued, and position `p` lives at `p mod capacity`.
//! Every write is a whole number of 8-byte words (see [`WORD`]), so what the consumer sees
//! in one piece starts and ends on a word: whole elements of any wire dtype.
//!
//! Wake-ups: the producer bumps `data_seq` after publishing `head`, and calls `FUTEX_WAKE`
//! on it only when the consumer said it sleeps (`consumer_sleeps`); the consumer, finding
//! nothing, reads `data_seq`, says it sleeps, looks at `head` again and only then waits on
//! `data_seq` for the value it read, so a write between the look and the wait makes the
//! wait return at once. `space_seq` / `producer_sleeps` do the same the other way. These
//! are shared (not process-private) futexes on a shared mapping, so they work across
//! processes.
//!
//! Liveness: each side writes its pid and a state (attached, closed) into its half of the
//! control page. A waiting side wakes every [`POLL`] to check the other: closed (it dropped
//! its end) or its pid gone (it died without closing) ends the wait with
//! [`RingError::Closed`] / [`RingError::Died`], so a peer's death is an error, not a hang.
//!
//! Memory shared with another process can only be reached through raw pointers and system
//! calls, so this module allows `unsafe` (the workspace denies it elsewhere); each block
//! says why it is sound.

#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use memmap2::MmapRaw;

/// The ring's unit: every write is padded to whole words.
pub(crate) const WORD: usize = 8;

/// How often a waiting side checks that the other is still there.
const POLL: Duration = Duration::from_millis(50);

/// The longest a consumer not asked to be eager sleeps between looks at the ring.
const LAZY: Duration = Duration::from_millis(1);

/// How many times a side looks again before it sleeps on the futex (a round trip's reply
/// often comes within a few microseconds; a sleep and a wake-up cost more).
const SPINS: u32 = 200;

const MAGIC: u64 = u64::from_le_bytes(*b"pwshm\0v1");
const CONTROL: usize = 4096;

// Offsets in the control page; each side's fields on their own cache line.
const OFF_MAGIC: usize = 0;
const OFF_CAPACITY: usize = 8;
const OFF_HEAD: usize = 64;
const OFF_PRODUCER_PID: usize = 72;
const OFF_PRODUCER_STATE: usize = 76;
const OFF_TAIL: usize = 128;
const OFF_CONSUMER_PID: usize = 136;
const OFF_CONSUMER_STATE: usize = 140;
const OFF_DATA_SEQ: usize = 192;
const OFF_CONSUMER_SLEEPS: usize = 196;
const OFF_SPACE_SEQ: usize = 256;
const OFF_PRODUCER_SLEEPS: usize = 260;

const ATTACHED: u32 = 1;
const CLOSED: u32 = 2;

/// Why a ring operation could not go on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RingError {
    /// The other side closed its end.
    Closed,
    /// The other side's process (pid) is gone without closing its end.
    Died(u32),
    /// This side was asked to stop (its transport is dropped or the pair replaced).
    Stopped,
}

impl std::fmt::Display for RingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RingError::Closed => f.write_str("the peer closed its end of the shared-memory ring"),
            RingError::Died(pid) => write!(
                f,
                "the peer's process (pid {pid}) died without closing the shared-memory ring"
            ),
            RingError::Stopped => f.write_str("this end of the shared-memory ring was stopped"),
        }
    }
}

impl std::error::Error for RingError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Producer,
    Consumer,
}

/// One end of a ring (see the [module docs](self)).
#[derive(Debug)]
pub(crate) struct Ring {
    map: MmapRaw,
    capacity: usize,
    side: Side,
    path: PathBuf,
    /// Set (with a wake-up) to end this side's waits.
    stop: AtomicBool,
}

// SAFETY: the mapping is shared memory touched only through atomics (control page) and
// through byte copies of ranges that the head/tail protocol gives to one side at a time.
unsafe impl Send for Ring {}
// SAFETY: as above; `Ring`'s methods of one side are called from one thread at a time
// (the pair's sender or receiver thread), `stop` and `close` from any.
unsafe impl Sync for Ring {}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: `word` is a valid, aligned u32 in a mapping that outlives the call; a
    // spurious or early return is handled by the callers' loops.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0,
        );
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: as in `futex_wait`.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0,
        );
    }
}

/// Whether process `pid` exists (it may be a zombie: then it has closed nothing, but it
/// runs no more either, which [`Ring`]'s callers treat alike).
fn alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 sends nothing; it only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Removes the rings in `dir` (files named `pipewise-…`) whose consumer's process is gone:
/// a ring is removed by its consumer once the producer mapped it, or when the consumer
/// drops it, so only a consumer that died before either leaves one behind.
pub(crate) fn sweep_stale(dir: &Path) {
    use std::io::Read;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with("pipewise-") {
            continue;
        }
        let mut control = [0u8; OFF_CONSUMER_PID + 4];
        let read = File::open(entry.path()).and_then(|mut f| f.read_exact(&mut control));
        if read.is_err() || control[..8] != MAGIC.to_le_bytes() {
            continue;
        }
        let mut pid = [0u8; 4];
        pid.copy_from_slice(&control[OFF_CONSUMER_PID..]);
        if !alive(u32::from_le_bytes(pid)) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

impl Ring {
    /// Creates the consumer's end in a new file at `path` (replacing a stale one) with
    /// `capacity` bytes of data, rounded up to a power of two.
    pub(crate) fn create(path: &Path, capacity: usize) -> io::Result<Ring> {
        let capacity = capacity.max(4096).next_power_of_two();
        // Written under a temporary name and renamed, so the producer never maps a file
        // whose control page is not set up yet.
        let temporary = path.with_extension(format!("{}.tmp", std::process::id()));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temporary)?;
        let made = (|| {
            file.set_len((CONTROL + capacity) as u64)?;
            let ring = Ring::map(&file, capacity, Side::Consumer, path)?;
            ring.u64_at(OFF_CAPACITY)
                .store(capacity as u64, Ordering::Relaxed);
            ring.u32_at(OFF_CONSUMER_PID)
                .store(std::process::id(), Ordering::Relaxed);
            ring.u32_at(OFF_CONSUMER_STATE)
                .store(ATTACHED, Ordering::Relaxed);
            ring.u64_at(OFF_MAGIC).store(MAGIC, Ordering::Release);
            std::fs::rename(&temporary, path)?;
            Ok(ring)
        })();
        if made.is_err() {
            let _ = std::fs::remove_file(&temporary);
        }
        made
    }

    /// Opens the producer's end of the ring the consumer created at `path`.
    pub(crate) fn open(path: &Path) -> io::Result<Ring> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let len = file.metadata()?.len() as usize;
        let invalid = |why: String| io::Error::new(io::ErrorKind::InvalidData, why);
        if len < CONTROL + 4096 {
            return Err(invalid(format!("{len} bytes are too few for a ring")));
        }
        let ring = Ring::map(&file, len - CONTROL, Side::Producer, path)?;
        if ring.u64_at(OFF_MAGIC).load(Ordering::Acquire) != MAGIC {
            return Err(invalid("not a pipewise ring (wrong magic)".into()));
        }
        let capacity = ring.u64_at(OFF_CAPACITY).load(Ordering::Relaxed) as usize;
        if capacity != len - CONTROL || !capacity.is_power_of_two() {
            return Err(invalid(format!(
                "capacity {capacity} does not match the file's {len} bytes"
            )));
        }
        if ring.u32_at(OFF_PRODUCER_STATE).load(Ordering::Acquire) != 0 {
            return Err(invalid("another producer already attached".into()));
        }
        ring.u32_at(OFF_PRODUCER_PID)
            .store(std::process::id(), Ordering::Relaxed);
        ring.u32_at(OFF_PRODUCER_STATE)
            .store(ATTACHED, Ordering::Release);
        Ok(ring)
    }

    fn map(file: &File, capacity: usize, side: Side, path: &Path) -> io::Result<Ring> {
        let map = memmap2::MmapOptions::new()
            .len(CONTROL + capacity)
            .map_raw(file)?;
        Ok(Ring {
            map,
            capacity,
            side,
            path: path.to_path_buf(),
            stop: AtomicBool::new(false),
        })
    }

    fn u64_at(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: the offsets are 8-aligned inside the (page-aligned) control page, and the
        // mapping lives as long as `self`.
        unsafe { &*self.map.as_mut_ptr().add(offset).cast::<AtomicU64>() }
    }

    fn u32_at(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: as in `u64_at`, 4-aligned.
        unsafe { &*self.map.as_mut_ptr().add(offset).cast::<AtomicU32>() }
    }

    fn data(&self) -> *mut u8 {
        // SAFETY: CONTROL is inside the mapping.
        unsafe { self.map.as_mut_ptr().add(CONTROL) }
    }

    /// The file's path (the consumer removes it once the producer attached).
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether a producer has attached (consumer's side).
    pub(crate) fn producer_attached(&self) -> bool {
        self.u32_at(OFF_PRODUCER_STATE).load(Ordering::Acquire) != 0
    }

    /// Ends this side's waits (from any thread): they return [`RingError::Stopped`].
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        futex_wake(self.u32_at(OFF_DATA_SEQ));
        futex_wake(self.u32_at(OFF_SPACE_SEQ));
    }

    /// Marks this side closed and wakes the other.
    fn close(&self) {
        let (state, seq) = match self.side {
            Side::Producer => (OFF_PRODUCER_STATE, OFF_DATA_SEQ),
            Side::Consumer => (OFF_CONSUMER_STATE, OFF_SPACE_SEQ),
        };
        self.u32_at(state).store(CLOSED, Ordering::SeqCst);
        self.u32_at(seq).fetch_add(1, Ordering::SeqCst);
        futex_wake(self.u32_at(seq));
    }

    /// Why the other side cannot go on, if it cannot.
    fn other_gone(&self) -> Option<RingError> {
        let (state, pid) = match self.side {
            Side::Producer => (OFF_CONSUMER_STATE, OFF_CONSUMER_PID),
            Side::Consumer => (OFF_PRODUCER_STATE, OFF_PRODUCER_PID),
        };
        match self.u32_at(state).load(Ordering::SeqCst) {
            CLOSED => Some(RingError::Closed),
            ATTACHED => {
                let pid = self.u32_at(pid).load(Ordering::Relaxed);
                (!alive(pid)).then_some(RingError::Died(pid))
            }
            _ => None,
        }
    }

    /// Waits until `ready()` gives a nonzero count: spins a little, then sleeps on the
    /// futex at `seq`, checking the other side every [`POLL`]. While `eager()` holds, the
    /// sleep is announced in `sleeps`, so the other side wakes it at its next write; else
    /// it is not, and the sleep lasts up to [`LAZY`] unless [`Ring::nudge`] (or a full
    /// ring's producer) ends it sooner.
    fn wait(
        &self,
        seq: usize,
        sleeps: usize,
        ready: impl Fn() -> usize,
        eager: impl Fn() -> bool,
    ) -> Result<usize, RingError> {
        for _ in 0..SPINS {
            let n = ready();
            if n > 0 {
                return Ok(n);
            }
            std::hint::spin_loop();
        }
        loop {
            if self.stop.load(Ordering::SeqCst) {
                return Err(RingError::Stopped);
            }
            let seen = self.u32_at(seq).load(Ordering::SeqCst);
            let eager = eager();
            if eager {
                self.u32_at(sleeps).store(1, Ordering::SeqCst);
            }
            let n = ready();
            if n > 0 {
                self.u32_at(sleeps).store(0, Ordering::Relaxed);
                return Ok(n);
            }
            // Gone only once nothing is left to take: what a closed producer wrote is read.
            if let Some(gone) = self.other_gone() {
                self.u32_at(sleeps).store(0, Ordering::Relaxed);
                return Err(gone);
            }
            futex_wait(self.u32_at(seq), seen, if eager { POLL } else { LAZY });
            self.u32_at(sleeps).store(0, Ordering::Relaxed);
            let n = ready();
            if n > 0 {
                return Ok(n);
            }
        }
    }

    /// Ends the consumer's lazy sleep now (see [`Ring::wait_queued`]).
    pub(crate) fn nudge(&self) {
        // Bumped too, so a consumer about to sleep (past its `eager()`) does not.
        self.u32_at(OFF_DATA_SEQ).fetch_add(1, Ordering::SeqCst);
        futex_wake(self.u32_at(OFF_DATA_SEQ));
    }

    /// Bytes the producer may write now without waiting.
    pub(crate) fn free(&self) -> usize {
        let head = self.u64_at(OFF_HEAD).load(Ordering::Relaxed);
        self.capacity - (head - self.u64_at(OFF_TAIL).load(Ordering::Acquire)) as usize
    }

    /// Bytes the consumer may read now without waiting.
    pub(crate) fn queued(&self) -> usize {
        let tail = self.u64_at(OFF_TAIL).load(Ordering::Relaxed);
        (self.u64_at(OFF_HEAD).load(Ordering::Acquire) - tail) as usize
    }

    /// Waits (consumer's side) until at least `min` bytes are queued, or the ring is full;
    /// woken by each write only while `eager()` holds (else it looks every [`LAZY`], and
    /// when the producer finds the ring full).
    pub(crate) fn wait_queued(
        &self,
        min: usize,
        eager: impl Fn() -> bool,
    ) -> Result<(), RingError> {
        let min = min.min(self.capacity);
        let ready = || {
            let n = self.queued();
            if n >= min { n } else { 0 }
        };
        self.wait(OFF_DATA_SEQ, OFF_CONSUMER_SLEEPS, ready, eager)
            .map(|_| ())
    }

    /// Copies the first `into.len()` queued bytes without taking them (call when that many
    /// are queued).
    pub(crate) fn peek(&self, into: &mut [u8]) {
        debug_assert!(self.queued() >= into.len());
        let at = self.u64_at(OFF_TAIL).load(Ordering::Relaxed) as usize & (self.capacity - 1);
        let first = into.len().min(self.capacity - at);
        // SAFETY: the ranges are inside the data area and queued (published by `head`).
        unsafe {
            std::ptr::copy_nonoverlapping(self.data().add(at), into.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(
                self.data(),
                into.as_mut_ptr().add(first),
                into.len() - first,
            );
        }
    }

    /// Writes `len` bytes (padded with zeros to whole words) that `fill(offset, piece)`
    /// puts into the ring piece by piece, waiting for room as the consumer reads: a message
    /// larger than the ring streams through it.
    pub(crate) fn write_with(
        &self,
        len: usize,
        mut fill: impl FnMut(usize, &mut [u8]),
    ) -> Result<(), RingError> {
        debug_assert_eq!(self.side, Side::Producer);
        let padded = len.next_multiple_of(WORD);
        let head = self.u64_at(OFF_HEAD);
        let tail = self.u64_at(OFF_TAIL);
        let mut written = 0;
        while written < padded {
            let free = || {
                let at = head.load(Ordering::Relaxed);
                self.capacity - (at - tail.load(Ordering::Acquire)) as usize
            };
            if free() == 0 {
                // The consumer may be in a lazy sleep: it must read for this side to go on.
                futex_wake(self.u32_at(OFF_DATA_SEQ));
            }
            let room = self.wait(OFF_SPACE_SEQ, OFF_PRODUCER_SLEEPS, free, || true)?;
            let at = head.load(Ordering::Relaxed);
            let start = (at as usize) & (self.capacity - 1);
            let n = room.min(self.capacity - start).min(padded - written);
            // SAFETY: `start..start + n` is inside the data area and free: the consumer
            // reads no byte at or past `head`.
            let piece = unsafe { std::slice::from_raw_parts_mut(self.data().add(start), n) };
            let data = n.min(len.saturating_sub(written));
            fill(written, &mut piece[..data]);
            piece[data..].fill(0);
            written += n;
            head.store(at + n as u64, Ordering::SeqCst);
            self.u32_at(OFF_DATA_SEQ).fetch_add(1, Ordering::SeqCst);
            if self.u32_at(OFF_CONSUMER_SLEEPS).load(Ordering::SeqCst) != 0 {
                futex_wake(self.u32_at(OFF_DATA_SEQ));
            }
        }
        Ok(())
    }

    /// Reads `len` bytes (and their padding to whole words), handing them to `take` piece
    /// by piece as they arrive; each piece but the last is whole words.
    pub(crate) fn read_with(
        &self,
        len: usize,
        mut take: impl FnMut(&[u8]),
    ) -> Result<(), RingError> {
        debug_assert_eq!(self.side, Side::Consumer);
        let padded = len.next_multiple_of(WORD);
        let head = self.u64_at(OFF_HEAD);
        let tail = self.u64_at(OFF_TAIL);
        let mut read = 0;
        while read < padded {
            let queued = || (head.load(Ordering::Acquire) - tail.load(Ordering::Relaxed)) as usize;
            let ready = self.wait(OFF_DATA_SEQ, OFF_CONSUMER_SLEEPS, queued, || true)?;
            let at = tail.load(Ordering::Relaxed);
            let start = (at as usize) & (self.capacity - 1);
            let n = ready.min(self.capacity - start).min(padded - read);
            let data = n.min(len.saturating_sub(read));
            if data > 0 {
                // SAFETY: `start..start + n` is inside the data area and written: the
                // producer published it with `head` and does not touch it before `tail`
                // passes it.
                take(unsafe { std::slice::from_raw_parts(self.data().add(start), data) });
            }
            read += n;
            tail.store(at + n as u64, Ordering::SeqCst);
            self.u32_at(OFF_SPACE_SEQ).fetch_add(1, Ordering::SeqCst);
            if self.u32_at(OFF_PRODUCER_SLEEPS).load(Ordering::SeqCst) != 0 {
                futex_wake(self.u32_at(OFF_SPACE_SEQ));
            }
        }
        Ok(())
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        self.close();
        if self.side == Side::Consumer {
            // Gone already once the producer attached; a file no producer opened goes now.
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn path(name: &str) -> PathBuf {
        super::super::ring_dir().join(format!(
            "pipewise-test-{}-{name}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ))
    }

    #[test]
    fn a_stream_larger_than_the_ring_arrives_in_order() -> Result<(), Box<dyn std::error::Error>> {
        let p = path("stream");
        let consumer = Ring::create(&p, 4096)?;
        let producer = Ring::open(&p)?;
        assert!(consumer.producer_attached());
        // Lengths that are not whole words, so padding is exercised; 10× the ring.
        let messages: Vec<Vec<u8>> = (0..40u32)
            .map(|i| {
                (0..(i as usize * 997 + 3))
                    .map(|b| (b as u32 ^ i) as u8)
                    .collect()
            })
            .collect();
        let sent = messages.clone();
        let writer = std::thread::spawn(move || -> Result<(), RingError> {
            for m in &sent {
                producer.write_with(m.len(), |at, piece| {
                    piece.copy_from_slice(&m[at..at + piece.len()]);
                })?;
            }
            Ok(())
        });
        for m in &messages {
            let mut got = Vec::with_capacity(m.len());
            consumer.read_with(m.len(), |piece| got.extend_from_slice(piece))?;
            assert_eq!(&got, m);
        }
        writer.join().map_err(|_| "writer panicked")??;
        Ok(())
    }

    #[test]
    fn a_closed_producer_ends_the_wait_after_what_it_wrote()
    -> Result<(), Box<dyn std::error::Error>> {
        let p = path("closed");
        let consumer = Ring::create(&p, 4096)?;
        let producer = Ring::open(&p)?;
        producer.write_with(16, |_, piece| piece.fill(1))?;
        drop(producer);
        let mut got = Vec::new();
        consumer.read_with(16, |piece| got.extend_from_slice(piece))?;
        assert_eq!(got, vec![1; 16]);
        assert_eq!(consumer.read_with(8, |_| ()), Err(RingError::Closed));
        Ok(())
    }

    #[test]
    fn a_full_ring_whose_consumer_left_fails_the_writer() -> Result<(), Box<dyn std::error::Error>>
    {
        let p = path("full");
        let consumer = Ring::create(&p, 4096)?;
        let producer = Arc::new(Ring::open(&p)?);
        let writer = {
            let producer = Arc::clone(&producer);
            std::thread::spawn(move || producer.write_with(3 * 4096, |_, piece| piece.fill(2)))
        };
        // The writer fills the ring and waits for room that never comes.
        let head = producer.u64_at(OFF_HEAD);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while head.load(Ordering::SeqCst) < 4096 {
            assert!(
                std::time::Instant::now() < deadline,
                "the writer never filled the ring"
            );
            std::thread::yield_now();
        }
        drop(consumer);
        let result = writer.join().map_err(|_| "writer panicked")?;
        assert_eq!(result, Err(RingError::Closed));
        Ok(())
    }

    #[test]
    fn stop_ends_a_wait_and_a_dead_pid_is_reported() -> Result<(), Box<dyn std::error::Error>> {
        let p = path("stop");
        let consumer = Arc::new(Ring::create(&p, 4096)?);
        let producer = Ring::open(&p)?;
        let reader = {
            let consumer = Arc::clone(&consumer);
            std::thread::spawn(move || consumer.read_with(8, |_| ()))
        };
        consumer.stop();
        assert_eq!(
            reader.join().map_err(|_| "reader panicked")?,
            Err(RingError::Stopped)
        );
        drop(producer);
        // A producer whose process is gone without closing: a pid no process has (above
        // the kernel's maximum), as a killed one leaves.
        let fresh = Ring::create(&path("dead"), 4096)?;
        let other = Ring::open(fresh.path())?;
        other
            .u32_at(OFF_PRODUCER_PID)
            .store(u32::MAX >> 1, Ordering::SeqCst);
        assert_eq!(
            fresh.read_with(8, |_| ()),
            Err(RingError::Died(u32::MAX >> 1))
        );
        Ok(())
    }

    #[test]
    fn a_second_producer_and_a_foreign_file_are_refused() -> Result<(), Box<dyn std::error::Error>>
    {
        let p = path("second");
        let _consumer = Ring::create(&p, 4096)?;
        let _producer = Ring::open(&p)?;
        assert!(Ring::open(&p).is_err());
        let foreign = path("foreign");
        std::fs::write(&foreign, vec![0u8; 3 * 4096])?;
        let refused = Ring::open(&foreign);
        std::fs::remove_file(&foreign)?;
        assert!(refused.is_err());
        Ok(())
    }
}
