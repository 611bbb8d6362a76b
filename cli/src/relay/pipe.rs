//! One relayed connection: two directions, each a reader thread that stamps every chunk
//! it reads with a release time and a writer thread that writes the chunk once that time
//! has come. Release times never go backwards (a chunk whose own delay would let it pass
//! the one before waits for it), so jitter delays bytes without reordering them, as a
//! byte stream must be. Blocking threads, not the async runtime: tokio's timers tick in
//! milliseconds, and the rack profile's latency is 50 µs.

use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::net::{Shutdown, TcpStream};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::config::Delay;

/// Bytes read at once from a socket.
const CHUNK: usize = 64 * 1024;
/// Chunks in flight per direction (4 MiB): more than a WAN link's bandwidth-delay product
/// (1 Gbit/s × 5.5 ms ≈ 0.7 MB); past it the reader stops reading and TCP pushes back.
const IN_FLIGHT: usize = 64;

/// Nodes whose links are black-holed, and until when.
#[derive(Debug, Default)]
pub(crate) struct Holes {
    until: Mutex<HashMap<String, Instant>>,
}

impl Holes {
    /// Black-holes every link of `node` until `until` (a later hole extends an earlier one).
    pub(crate) fn open(&self, node: &str, until: Instant) {
        let mut holes = self.until.lock().unwrap_or_else(PoisonError::into_inner);
        let end = holes.entry(node.to_string()).or_insert(until);
        *end = (*end).max(until);
    }

    /// When the link between `a` and `b` is open again, if it is black-holed now.
    pub(super) fn closed_until(&self, a: Option<&str>, b: &str) -> Option<Instant> {
        let holes = self.until.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        [a, Some(b)]
            .into_iter()
            .flatten()
            .filter_map(|n| holes.get(n).copied())
            .filter(|&t| t > now)
            .max()
    }

    /// Returns once the link between `a` and `b` is not black-holed.
    pub(crate) fn wait_open(&self, a: Option<&str>, b: &str) {
        while let Some(until) = self.closed_until(a, b) {
            std::thread::sleep(until.saturating_duration_since(Instant::now()));
        }
    }
}

/// A link's two ends and how it is delayed.
#[derive(Debug, Clone)]
pub(crate) struct Link {
    /// The node that opened the connection (None: a source that is no node).
    pub(crate) from: Option<String>,
    pub(crate) to: String,
    pub(crate) delay: Delay,
    pub(crate) holes: Arc<Holes>,
}

impl Link {
    fn wait_open(&self) {
        self.holes.wait_open(self.from.as_deref(), &self.to);
    }
}

/// The seeded generator of the jitter (splitmix64: a seed is the only randomness).
#[derive(Debug, Clone)]
pub(crate) struct Jitter(u64);

impl Jitter {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// `delay.latency ± delay.jitter`, uniform.
    pub(crate) fn sample(&mut self, delay: Delay) -> Duration {
        if delay.jitter.is_zero() {
            return delay.latency;
        }
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let offset = delay.jitter.as_secs_f64() * (2.0 * unit - 1.0);
        Duration::from_secs_f64((delay.latency.as_secs_f64() + offset).max(0.0))
    }
}

enum Piece {
    Bytes(Vec<u8>, Instant),
    End,
}

/// Relays `client` ⇄ `server` over `link` until both directions end; returns at once
/// (the four threads own the sockets).
pub(crate) fn relay(
    client: TcpStream,
    server: TcpStream,
    link: &Link,
    jitter: Jitter,
) -> std::io::Result<()> {
    for socket in [&client, &server] {
        socket.set_nodelay(true)?;
    }
    let mut back_jitter = jitter.clone();
    // A different stream for the answer direction than for the request direction.
    back_jitter.next_u64();
    back_jitter.0 ^= 0xA5A5_A5A5_A5A5_A5A5;
    direction(client.try_clone()?, server.try_clone()?, link, jitter)?;
    direction(server, client, link, back_jitter)
}

fn direction(from: TcpStream, to: TcpStream, link: &Link, jitter: Jitter) -> std::io::Result<()> {
    let (tx, rx) = sync_channel(IN_FLIGHT);
    let reader_link = link.clone();
    spawn("relay-read", move || {
        read_side(from, &tx, &reader_link, jitter)
    })?;
    let writer_link = link.clone();
    spawn("relay-write", move || write_side(to, &rx, &writer_link))
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name(name.to_string())
        .stack_size(256 * 1024)
        .spawn(f)
        .map(|_| ())
}

fn read_side(mut from: TcpStream, tx: &SyncSender<Piece>, link: &Link, mut jitter: Jitter) {
    let mut last = Instant::now();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Bytes that arrive while the link is black-holed wait with the sender's: reading
        // stops, so TCP's own flow control holds everything behind them.
        link.wait_open();
        let release = (Instant::now() + jitter.sample(link.delay)).max(last);
        last = release;
        if tx.send(Piece::Bytes(buf[..n].to_vec(), release)).is_err() {
            break;
        }
    }
    let _ = tx.send(Piece::End);
}

fn write_side(mut to: TcpStream, rx: &Receiver<Piece>, link: &Link) {
    while let Ok(piece) = rx.recv() {
        match piece {
            Piece::Bytes(bytes, release) => {
                let now = Instant::now();
                if release > now {
                    std::thread::sleep(release - now);
                }
                link.wait_open();
                if to.write_all(&bytes).is_err() {
                    // The far end is gone: end the reading side of this socket too.
                    let _ = to.shutdown(Shutdown::Both);
                    return;
                }
            }
            Piece::End => break,
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    /// A loopback echo server, a client connected to it through `relay` on `link`: the
    /// client's socket.
    fn through_relay(link: &Link) -> TcpStream {
        let echo = TcpListener::bind("127.0.0.1:0").expect("bind");
        let target = echo.local_addr().expect("addr");
        std::thread::spawn(move || {
            let (mut s, _) = echo.accept().expect("accept");
            let mut r = s.try_clone().expect("clone");
            let _ = std::io::copy(&mut r, &mut s);
        });
        let front = TcpListener::bind("127.0.0.1:0").expect("bind");
        let client = TcpStream::connect(front.local_addr().expect("addr")).expect("connect");
        let (accepted, _) = front.accept().expect("accept");
        let server = TcpStream::connect(target).expect("connect");
        relay(accepted, server, link, Jitter::new(1)).expect("relay");
        client
    }

    fn link(latency_ms: u64, jitter_ms: u64, holes: &Arc<Holes>) -> Link {
        Link {
            from: Some("a".into()),
            to: "b".into(),
            delay: Delay {
                latency: Duration::from_millis(latency_ms),
                jitter: Duration::from_millis(jitter_ms),
            },
            holes: holes.clone(),
        }
    }

    #[test]
    fn jittered_bytes_come_back_in_order() {
        let holes = Arc::new(Holes::default());
        let mut client = through_relay(&link(20, 20, &holes));
        client.set_nodelay(true).expect("nodelay");
        let sent: Vec<u8> = (0..2000u32).map(|i| (i % 251) as u8).collect();
        // Small writes, each chunk with its own delay from 0 to 40 ms: a relay that let a
        // chunk pass the one before would swap some.
        for piece in sent.chunks(7) {
            client.write_all(piece).expect("write");
        }
        let mut got = vec![0u8; sent.len()];
        client.read_exact(&mut got).expect("read");
        assert_eq!(got, sent);
    }

    #[test]
    fn each_direction_is_delayed_by_the_latency() {
        let holes = Arc::new(Holes::default());
        let mut client = through_relay(&link(30, 0, &holes));
        let begun = Instant::now();
        client.write_all(b"x").expect("write");
        let mut one = [0u8];
        client.read_exact(&mut one).expect("read");
        let rtt = begun.elapsed();
        assert!(
            rtt >= Duration::from_millis(60),
            "round trip {rtt:?} under 2 × 30 ms"
        );
    }

    #[test]
    fn a_black_holed_link_holds_its_bytes_until_the_hole_closes() {
        let holes = Arc::new(Holes::default());
        let mut client = through_relay(&link(0, 0, &holes));
        let until = Instant::now() + Duration::from_millis(400);
        holes.open("b", until);
        client.write_all(b"held").expect("write");
        let mut got = [0u8; 4];
        client.read_exact(&mut got).expect("read");
        assert!(Instant::now() >= until, "bytes crossed an open hole");
        assert_eq!(&got, b"held");
    }

    #[test]
    fn jitter_stays_within_its_bounds_and_spreads_over_them() {
        let delay = Delay {
            latency: Duration::from_micros(500),
            jitter: Duration::from_micros(50),
        };
        let mut jitter = Jitter::new(7);
        let samples: Vec<Duration> = (0..10_000).map(|_| jitter.sample(delay)).collect();
        let (lo, hi) = (Duration::from_micros(450), Duration::from_micros(550));
        assert!(samples.iter().all(|s| (lo..=hi).contains(s)));
        let below = samples.iter().filter(|&&s| s < delay.latency).count();
        assert!(
            (4_000..6_000).contains(&below),
            "{below} of 10000 below the mean"
        );
        assert!(samples.iter().any(|&s| s < Duration::from_micros(460)));
        assert!(samples.iter().any(|&s| s > Duration::from_micros(540)));
        let again: Vec<Duration> = {
            let mut j = Jitter::new(7);
            (0..10_000).map(|_| j.sample(delay)).collect()
        };
        assert_eq!(samples, again, "the seed alone decides the delays");
    }

    #[test]
    fn a_hole_holds_both_ends_of_a_node_until_it_closes() {
        let holes = Holes::default();
        let until = Instant::now() + Duration::from_secs(60);
        holes.open("w1", until);
        assert_eq!(holes.closed_until(Some("w0"), "w1"), Some(until));
        assert_eq!(holes.closed_until(Some("w1"), "w0"), Some(until));
        assert_eq!(holes.closed_until(None, "w1"), Some(until));
        assert_eq!(holes.closed_until(Some("w0"), "w2"), None);
        // A shorter hole does not cut a longer one short.
        holes.open("w1", Instant::now() + Duration::from_secs(1));
        assert_eq!(holes.closed_until(Some("w0"), "w1"), Some(until));
        holes.open("w2", Instant::now());
        assert_eq!(
            holes.closed_until(Some("w0"), "w2"),
            None,
            "an elapsed hole"
        );
    }
}
