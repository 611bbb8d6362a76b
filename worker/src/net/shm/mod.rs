//! The shared-memory tier: frames between two workers on the same host go through a ring
//! in shared memory instead of gRPC (see [`super::Tier`]).
//!
//! - `ring`: one directed pair's single-producer single-consumer ring in a `/dev/shm` file,
//!   with futex wake-ups and the other side's death noticed.
//! - Receiving ([`Receiving`]): for each same-host peer the receiver creates the ring from
//!   it (its path known to both sides: [`ring_path`]) when the peers are set, and one thread
//!   reads it into the transport's inbox, through the same checks as a gRPC stream's frames
//!   (run, stage, step, duplicates, the run's secret). The file is removed once the sender
//!   has mapped it, or when the receiver drops it; one left by a receiver that died before
//!   either is removed by the next receiver to create a ring (its pid is gone).
//! - Sending ([`spawn_sender`]): one thread per same-host peer takes the peer's queue (the
//!   gRPC peer's, so [`crate::runtime::Transport::send`] is the same call), maps the ring on
//!   the first frame (waiting up to the connect timeout for the receiver to create it) and
//!   writes each frame into it, streaming a frame larger than the ring in pieces as the
//!   receiver reads.
//! - A message on the ring: a 16-byte prefix (the header's length, 4 bytes of zeros, the
//!   data's length, little-endian), the `TensorFrame` fields but `data` (protobuf), the
//!   data (little-endian elements, as on gRPC); each part padded to 8 bytes.
//! - Copies: the sender copies the tensor's memory into the ring, the receiver copies it
//!   from the ring into the tensor's storage: one copy each, no system call while data
//!   flows (a futex call only when a side had to sleep).
//! - A peer's death: a sender finding its receiver gone records the error (see
//!   [`super::GrpcTransport::take_errors`]) and stops, so later sends to it fail; a receiver
//!   finding its sender closed mid-frame fails `recv` of that frame at once, and one whose
//!   sender died (its pid gone) closes the inbox for that run, so no `recv` waits for a frame
//!   that cannot come.

mod ring;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pipewise_proto::convert;
use pipewise_proto::v1::TensorFrame;
use tokio::sync::mpsc;

use super::codec::Outgoing;
use super::inbox::Inbox;
use super::peers::{Counted, PeerErrors, RunningPeers};
use super::secret::RunSecret;
use ring::{Ring, RingError, WORD};

/// The prefix of a message on a ring.
const PREFIX: usize = 16;

/// The largest header (the `TensorFrame` fields but `data`) taken from a ring.
const MAX_HEADER: usize = 64 << 10;

/// Where the rings' files live: `/dev/shm` (memory, not disk) where there is one.
pub(crate) fn ring_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// The file of run `run`'s ring from worker `from` to worker `to` listening at
/// `to_address`: both sides name it alike from the assignment. The address tells apart
/// workers of different clusters on one host (a live listener's port is its own).
pub(crate) fn ring_path(run: u64, from: u32, to: u32, to_address: &str) -> PathBuf {
    // FNV-1a: short, stable across builds and platforms (std's hasher is neither).
    let hash = to_address.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    ring_dir().join(format!("pipewise-{run:x}-{from}-to-{to}-{hash:016x}"))
}

/// This host's identity as a worker registers it: the kernel's boot id and the host name.
/// Two workers are given the shared-memory tier only when theirs are equal (the same
/// running kernel, and the same host name: containers on one machine usually differ in it,
/// and do not share `/dev/shm`). Empty where it cannot be read.
pub fn host_identity() -> String {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let boot = read("/proc/sys/kernel/random/boot_id");
    let host = read("/proc/sys/kernel/hostname");
    if boot.is_empty() || host.is_empty() {
        String::new()
    } else {
        format!("{boot}/{host}")
    }
}

/// The padded length of a message of a `header_len`-byte header and `data_len` bytes.
fn message_len(header_len: usize, data_len: usize) -> usize {
    PREFIX + header_len.next_multiple_of(WORD) + data_len.next_multiple_of(WORD)
}

/// One same-host peer's sending end: the ring (mapped on the first frame), written by the
/// caller of `send` when the whole message fits and nothing is queued before it, else by
/// the peer's thread.
#[derive(Debug, Default)]
struct Producer {
    ring: OnceLock<Arc<Ring>>,
    /// Held while a message is written, so messages do not interleave.
    writing: Mutex<()>,
    /// Frames handed to the thread and not yet written.
    queued: AtomicUsize,
}

/// The peer's thread has ended (its ring failed), so the frame cannot be sent.
#[derive(Debug)]
pub(crate) struct QueueClosed;

/// The sending side of one same-host peer; dropping it stops the peer's thread even when
/// it waits for room in the ring.
#[derive(Debug, Default)]
pub(crate) struct Sending(Arc<Producer>);

impl Sending {
    /// Writes `frame` into the ring now if it fits and no frame waits before it; otherwise
    /// (or when the ring is not mapped yet) hands it back for the thread's queue.
    pub(crate) fn send(
        &self,
        frame: Outgoing,
        queue: &mpsc::UnboundedSender<Outgoing>,
    ) -> Result<(), QueueClosed> {
        let producer = &self.0;
        if let Some(ring) = producer.ring.get()
            && producer.queued.load(Ordering::SeqCst) == 0
            && let Ok(_writing) = producer.writing.try_lock()
            && producer.queued.load(Ordering::SeqCst) == 0
        {
            let header = convert::encode_message(frame.header());
            // With the room there, the write does not wait, so it cannot fail on the peer.
            if ring.free() >= message_len(header.len(), frame.data_len())
                && write_frame(ring, &frame, &header).is_ok()
            {
                return Ok(());
            }
        }
        producer.queued.fetch_add(1, Ordering::SeqCst);
        queue.send(frame).map_err(|_| {
            producer.queued.fetch_sub(1, Ordering::SeqCst);
            QueueClosed
        })
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        // A thread blocked on a full ring ends now rather than when the receiver reads.
        if let Some(ring) = self.0.ring.get() {
            ring.stop();
        }
    }
}

/// Starts the thread that sends `frames` to worker `worker` through the ring at `path`.
pub(crate) fn spawn_sender(
    worker: u32,
    path: PathBuf,
    frames: mpsc::UnboundedReceiver<Outgoing>,
    connect_timeout: Duration,
    errors: Arc<PeerErrors>,
    running: &Arc<RunningPeers>,
) -> crate::error::Result<Sending> {
    let sending = Sending::default();
    let producer = Arc::clone(&sending.0);
    let counted = Counted::new(running);
    std::thread::Builder::new()
        .name(format!("pipewise-shm-to-{worker}"))
        .spawn(move || {
            let _counted = counted;
            if let Err(e) = send_all(&producer, &path, frames, connect_timeout) {
                errors.push(format!("peer {worker} over shared memory: {e}"));
            }
        })
        .map_err(|source| crate::error::Error::Start {
            what: "a shared-memory sender thread",
            source,
        })?;
    Ok(sending)
}

fn send_all(
    producer: &Producer,
    path: &Path,
    mut frames: mpsc::UnboundedReceiver<Outgoing>,
    connect_timeout: Duration,
) -> Result<(), String> {
    while let Some(frame) = frames.blocking_recv() {
        let ring = match producer.ring.get() {
            Some(ring) => ring,
            None => {
                let opened = open_ring(path, connect_timeout)?;
                producer.ring.get_or_init(|| Arc::new(opened))
            }
        };
        let header = convert::encode_message(frame.header());
        let written = {
            let _writing = producer
                .writing
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            write_frame(ring, &frame, &header)
        };
        producer.queued.fetch_sub(1, Ordering::SeqCst);
        written.map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Maps the ring the receiver creates when it takes its peers, waiting for it up to
/// `timeout` (the receiver may take them a little after this side).
fn open_ring(path: &Path, timeout: Duration) -> Result<Ring, String> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_micros(100);
    loop {
        match Ring::open(path) {
            Ok(ring) => return Ok(ring),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(20));
            }
            Err(e) => {
                return Err(format!(
                    "cannot open the ring {} (after {:.1} s): {e}",
                    path.display(),
                    timeout.as_secs_f64()
                ));
            }
        }
    }
}

/// Writes one message: the prefix, the header, the data straight from the tensor's memory.
fn write_frame(ring: &Ring, frame: &Outgoing, header: &[u8]) -> Result<(), RingError> {
    let data_len = frame.data_len();
    let mut prefix = [0u8; PREFIX];
    prefix[..4].copy_from_slice(&(header.len() as u32).to_le_bytes());
    prefix[8..].copy_from_slice(&(data_len as u64).to_le_bytes());
    ring.write_with(PREFIX, |at, piece| {
        piece.copy_from_slice(&prefix[at..at + piece.len()]);
    })?;
    ring.write_with(header.len(), |at, piece| {
        piece.copy_from_slice(&header[at..at + piece.len()]);
    })?;
    // `with_bytes` fails only for a frame `encode` would not have made; its data is then
    // written as zeros, and the receiver's length checks refuse nothing a peer sent.
    let written = frame.with_bytes(0, data_len, |data| {
        ring.write_with(data_len, |at, piece| {
            piece.copy_from_slice(&data[at..at + piece.len()]);
        })
    });
    match written {
        Ok(result) => result,
        Err(_) => ring.write_with(data_len, |_, piece| piece.fill(0)),
    }
}

/// One same-host peer's receiving end: read into the inbox by its thread and, while `recv`
/// waits, by `recv`'s caller ([`Receiving::poll`]), whichever comes first.
#[derive(Debug)]
struct Consumer {
    ring: Ring,
    run: u64,
    from: u32,
    inbox: Arc<Inbox>,
    secret: Arc<RunSecret>,
    /// Held while a message is read.
    reading: Mutex<()>,
    /// Threads sleeping in `recv` until this ring's thread delivers: while there are any,
    /// every write wakes the thread; else it looks at the ring every millisecond (a frame
    /// that comes while no `recv` waits is read by `recv` itself when it comes, and one
    /// that `recv` polls for is read by it: neither needs the thread woken at once, which
    /// would cost a wake-up and, on a busy host, a core taken from the caller).
    sleepers: AtomicUsize,
    /// Set once the file's name is removed.
    unlinked: AtomicBool,
}

/// The receiving end of one same-host peer's ring; dropping it stops its thread.
#[derive(Debug)]
pub(crate) struct Receiving {
    consumer: Arc<Consumer>,
    /// Where the ring is (the peers' next setting keeps a ring at the same path).
    pub(crate) path: PathBuf,
}

/// Counts a thread in `recv` as sleeping until the ring's thread delivers, until dropped.
pub(crate) struct Sleeping<'a>(&'a Consumer);

impl Drop for Sleeping<'_> {
    fn drop(&mut self) {
        self.0.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Receiving {
    /// Marks the calling thread as sleeping until the ring's thread delivers (so every
    /// write wakes that thread) until the guard is dropped.
    pub(crate) fn sleeping(&self) -> Sleeping<'_> {
        self.consumer.sleepers.fetch_add(1, Ordering::SeqCst);
        // It may be in a lazy sleep: it looks again now, and sleeps eagerly from here.
        self.consumer.ring.nudge();
        Sleeping(&self.consumer)
    }

    /// Reads every message wholly in the ring into the inbox, without waiting (nothing if
    /// another thread is reading).
    pub(crate) fn poll(&self) {
        let c = &self.consumer;
        let Ok(_reading) = c.reading.try_lock() else {
            return;
        };
        while let Some(len) = c.next_message() {
            if c.ring.queued() < len || receive_one(c).is_err() {
                return;
            }
        }
    }
}

impl Drop for Receiving {
    fn drop(&mut self) {
        self.consumer.ring.stop();
    }
}

impl Consumer {
    /// The length of the next message, when its prefix is in the ring.
    fn next_message(&self) -> Option<usize> {
        if self.ring.queued() < PREFIX {
            return None;
        }
        let mut prefix = [0u8; PREFIX];
        self.ring.peek(&mut prefix);
        let (header_len, data_len) = parse_prefix(&prefix);
        Some(message_len(header_len, data_len))
    }
}

/// The header's and the data's lengths of a message prefix.
fn parse_prefix(prefix: &[u8; PREFIX]) -> (usize, usize) {
    let mut header = [0u8; 4];
    header.copy_from_slice(&prefix[..4]);
    let mut data = [0u8; 8];
    data.copy_from_slice(&prefix[8..]);
    (
        u32::from_le_bytes(header) as usize,
        u64::from_le_bytes(data) as usize,
    )
}

/// Creates the ring from worker `from` at `path` (`capacity` bytes) and starts the thread
/// that reads it into `inbox` for run `run`.
pub(crate) fn spawn_receiver(
    run: u64,
    from: u32,
    path: PathBuf,
    capacity: usize,
    inbox: Arc<Inbox>,
    secret: Arc<RunSecret>,
) -> crate::error::Result<Receiving> {
    if let Some(dir) = path.parent() {
        ring::sweep_stale(dir);
    }
    let ring = Ring::create(&path, capacity).map_err(|source| crate::error::Error::Io {
        path: path.clone(),
        source,
    })?;
    let consumer = Arc::new(Consumer {
        ring,
        run,
        from,
        inbox,
        secret,
        reading: Mutex::new(()),
        sleepers: AtomicUsize::new(0),
        unlinked: AtomicBool::new(false),
    });
    let reader = Arc::clone(&consumer);
    std::thread::Builder::new()
        .name(format!("pipewise-shm-from-{from}"))
        .spawn(move || receive_all(&reader))
        .map_err(|source| crate::error::Error::Start {
            what: "a shared-memory receiver thread",
            source,
        })?;
    Ok(Receiving { consumer, path })
}

fn receive_all(c: &Consumer) {
    let end = loop {
        // Waits without holding the reading lock, so `recv`'s caller may read meanwhile.
        let eager = || c.sleepers.load(Ordering::SeqCst) > 0;
        if let Err(e) = c.ring.wait_queued(PREFIX, eager) {
            break e;
        }
        let _reading = c
            .reading
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if c.ring.queued() < PREFIX {
            continue; // `recv`'s caller took it.
        }
        match receive_one(c) {
            Ok(()) => {}
            Err(Some(e)) => break e,
            Err(None) => return,
        }
    };
    match end {
        RingError::Stopped | RingError::Closed => {}
        RingError::Died(_) => c
            .inbox
            .close_run(c.run, &format!("worker {}: {end}", c.from)),
    }
}

/// Reads one message (its prefix is in the ring) into the inbox. `Err(None)`: the ring is
/// corrupt and given up.
fn receive_one(c: &Consumer) -> Result<(), Option<RingError>> {
    let ring = &c.ring;
    let mut prefix = [0u8; PREFIX];
    ring.peek(&mut prefix);
    ring.read_with(PREFIX, |_| ())?;
    if !c.unlinked.load(Ordering::Relaxed) && ring.producer_attached() {
        // Both sides have it mapped: the name is no longer needed.
        let _ = std::fs::remove_file(ring.path());
        c.unlinked.store(true, Ordering::Relaxed);
    }
    let (header_len, data_len) = parse_prefix(&prefix);
    if header_len > MAX_HEADER {
        // The stream cannot be followed past a message it cannot frame.
        tracing::error!(
            from = c.from,
            "a {header_len}-byte header on the shared-memory ring: giving up the ring"
        );
        c.inbox.close_run(
            c.run,
            &format!("worker {}'s shared-memory ring is corrupt", c.from),
        );
        ring.stop();
        return Err(None);
    }
    let mut header = Vec::with_capacity(header_len);
    ring.read_with(header_len, |piece| header.extend_from_slice(piece))?;
    match <TensorFrame as prost::Message>::decode(Bytes::from(header)) {
        Ok(frame) => receive_frame(c, &frame, data_len)?,
        Err(e) => {
            tracing::warn!(
                from = c.from,
                "an undecodable frame header on the shared-memory ring: {e}"
            );
            ring.read_with(data_len, |_| ())?;
        }
    }
    Ok(())
}

/// Takes one frame's data into the inbox (or past it, when the frame is refused); a ring
/// that ends mid-frame fails `recv` of that frame.
fn receive_frame(c: &Consumer, frame: &TensorFrame, data_len: usize) -> Result<(), RingError> {
    let (ring, inbox) = (&c.ring, &c.inbox);
    if !c.secret.admits(&frame.run_secret) {
        tracing::warn!(
            from = c.from,
            run = frame.run,
            "refused a frame without the run's secret"
        );
        return ring.read_with(data_len, |_| ());
    }
    let Ok(mut assembly) = inbox.begin(frame, data_len) else {
        return ring.read_with(data_len, |_| ());
    };
    let mut refused = None;
    let read = ring.read_with(data_len, |piece| {
        if refused.is_none()
            && let Err(rejection) = assembly.append_slice(piece)
        {
            refused = Some(rejection);
        }
    });
    if let Err(e) = read {
        inbox.abandon(assembly, &format!("worker {}: {e}", c.from));
        return Err(e);
    }
    match refused {
        Some(rejection) => inbox.refuse(&assembly, &rejection),
        None => {
            let _ = inbox.complete(assembly);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_sides_name_a_pair_alike_and_pairs_apart() {
        let p = ring_path(7, 0, 1, "10.0.0.1:5000");
        assert_eq!(p, ring_path(7, 0, 1, "10.0.0.1:5000"));
        assert_ne!(p, ring_path(7, 1, 0, "10.0.0.1:5000"));
        assert_ne!(p, ring_path(8, 0, 1, "10.0.0.1:5000"));
        assert_ne!(p, ring_path(7, 0, 1, "10.0.0.1:5001"));
    }

    #[test]
    fn the_host_identity_is_the_same_on_every_call() {
        let id = host_identity();
        assert_eq!(id, host_identity());
        if Path::new("/proc/sys/kernel/random/boot_id").exists() {
            assert!(id.contains('/'), "{id:?}");
        }
    }
}
