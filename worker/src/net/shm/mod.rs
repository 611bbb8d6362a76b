//! The shared-memory tier: frames between two workers on the same host go through a ring
//! in shared memory instead of gRPC (see [`super::Tier`]).
//!
//! - `ring`: one directed pair's single-producer single-consumer ring in a `/dev/shm` file,
//!   with futex wake-ups and the other side's death noticed.
//! - Receiving ([`Receiving`]): for each same-host peer the receiver creates the ring from
//!   it (its path known to both sides: [`ring_path`]) when the peers are set, and one thread
//!   reads it into the transport's inbox, through the same checks as a gRPC stream's frames
//!   (run, stage, step, duplicates, the run's secret). The file is removed once the sender
//!   has mapped it, so nothing is left in `/dev/shm` after a crash past that point.
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
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pipewise_proto::convert;
use pipewise_proto::v1::TensorFrame;
use tokio::sync::mpsc;

use super::client::{Counted, PeerErrors, RunningPeers};
use super::codec::Outgoing;
use super::inbox::Inbox;
use super::secret::RunSecret;
use ring::{Ring, RingError};

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
    let hash = to_address
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
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

/// The sending side's end of one peer's ring, for stopping it when the peer is dropped.
#[derive(Debug, Default)]
pub(crate) struct Sending(Arc<OnceLock<Arc<Ring>>>);

impl Drop for Sending {
    fn drop(&mut self) {
        // A thread blocked on a full ring ends now rather than when the receiver reads.
        if let Some(ring) = self.0.get() {
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
    let ring = Arc::clone(&sending.0);
    let counted = Counted::new(running);
    std::thread::Builder::new()
        .name(format!("pipewise-shm-to-{worker}"))
        .spawn(move || {
            let _counted = counted;
            if let Err(e) = send_all(&ring, &path, frames, connect_timeout) {
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
    ring: &OnceLock<Arc<Ring>>,
    path: &Path,
    mut frames: mpsc::UnboundedReceiver<Outgoing>,
    connect_timeout: Duration,
) -> Result<(), String> {
    while let Some(frame) = frames.blocking_recv() {
        let ring = match ring.get() {
            Some(ring) => ring,
            None => {
                let opened = open_ring(path, connect_timeout)?;
                ring.get_or_init(|| Arc::new(opened))
            }
        };
        write_frame(ring, &frame).map_err(|e| e.to_string())?;
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
fn write_frame(ring: &Ring, frame: &Outgoing) -> Result<(), RingError> {
    let header = convert::encode_message(frame.header());
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

/// The receiving end of one same-host peer's ring: a thread reading it into the inbox,
/// stopped when this is dropped.
#[derive(Debug)]
pub(crate) struct Receiving {
    ring: Arc<Ring>,
    /// Where the ring is (the peers' next setting keeps a ring at the same path).
    pub(crate) path: PathBuf,
}

impl Drop for Receiving {
    fn drop(&mut self) {
        self.ring.stop();
    }
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
    let ring = Arc::new(Ring::create(&path, capacity).map_err(|source| {
        crate::error::Error::Io {
            path: path.clone(),
            source,
        }
    })?);
    let reader = Arc::clone(&ring);
    std::thread::Builder::new()
        .name(format!("pipewise-shm-from-{from}"))
        .spawn(move || receive_all(run, from, &reader, &inbox, &secret))
        .map_err(|source| crate::error::Error::Start {
            what: "a shared-memory receiver thread",
            source,
        })?;
    Ok(Receiving { ring, path })
}

fn receive_all(run: u64, from: u32, ring: &Ring, inbox: &Inbox, secret: &RunSecret) {
    let mut unlinked = false;
    let end = loop {
        let mut prefix = [0u8; PREFIX];
        let mut filled = 0;
        if let Err(e) = ring.read_with(PREFIX, |piece| {
            prefix[filled..filled + piece.len()].copy_from_slice(piece);
            filled += piece.len();
        }) {
            break e;
        }
        if !unlinked && ring.producer_attached() {
            // Both sides have it mapped: the name is no longer needed.
            let _ = std::fs::remove_file(ring.path());
            unlinked = true;
        }
        let header_len = u32::from_le_bytes(prefix[..4].try_into().unwrap_or_default()) as usize;
        let data_len = u64::from_le_bytes(prefix[8..].try_into().unwrap_or_default()) as usize;
        if header_len > MAX_HEADER {
            // The stream cannot be followed past a message it cannot frame.
            tracing::error!(
                from,
                "a {header_len}-byte header on the shared-memory ring: giving up the ring"
            );
            inbox.close_run(
                run,
                &format!("worker {from}'s shared-memory ring is corrupt"),
            );
            return;
        }
        let mut header = Vec::with_capacity(header_len);
        if let Err(e) = ring.read_with(header_len, |piece| header.extend_from_slice(piece)) {
            break e;
        }
        let frame = match <TensorFrame as prost::Message>::decode(Bytes::from(header)) {
            Ok(frame) => frame,
            Err(e) => {
                tracing::warn!(from, "an undecodable frame header on the shared-memory ring: {e}");
                if let Err(e) = ring.read_with(data_len, |_| ()) {
                    break e;
                }
                continue;
            }
        };
        if let Err(e) = receive_frame(from, ring, inbox, secret, &frame, data_len) {
            break e;
        }
    };
    match end {
        RingError::Stopped | RingError::Closed => {}
        RingError::Died(_) => inbox.close_run(run, &format!("worker {from}: {end}")),
    }
}

/// Takes one frame's data into the inbox (or past it, when the frame is refused); a ring
/// that ends mid-frame fails `recv` of that frame.
fn receive_frame(
    from: u32,
    ring: &Ring,
    inbox: &Inbox,
    secret: &RunSecret,
    frame: &TensorFrame,
    data_len: usize,
) -> Result<(), RingError> {
    if !secret.admits(&frame.run_secret) {
        tracing::warn!(
            from,
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
        inbox.abandon(assembly, &format!("worker {from}: {e}"));
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
