//! `pipewise relay`: a TCP relay that delays every link of an emulated cluster by its
//! latency ± jitter and can black-hole a node's links for a while (`bench/cluster.py`
//! runs one between network namespaces, where the kernel has no `netem`; see
//! docs/cluster-emulation.md).
//!
//! Each route listens on one address and forwards to one node (`target`); the node a
//! connection comes from is told by its source address, so one listening port per
//! destination serves every link into it. A control socket takes one command per line:
//! `blackhole NODE SECONDS` holds every byte on NODE's links (both directions, every
//! connection, new ones too) until the time is up, then lets them through in order: a
//! partition that heals, as TCP sees one.
//!
//! - `config`: the JSON file (nodes, routes, link delays), checked.
//! - `pipe`: one relayed connection (the delaying threads), the holes, the jitter.

mod config;
mod pipe;

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Args;

use self::config::{Config, Route};
use self::pipe::{Holes, Jitter, Link};

/// `pipewise relay` arguments.
#[derive(Debug, Args)]
pub(crate) struct RelayArgs {
    /// The JSON file of nodes, routes and link delays (docs/cluster-emulation.md).
    #[arg(long, value_name = "FILE")]
    pub(crate) config: PathBuf,
    /// Where to take `blackhole NODE SECONDS` commands (one a line).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    pub(crate) control: SocketAddr,
}

/// Runs the relay until the process is killed.
pub(crate) fn run(args: &RelayArgs) -> Result<()> {
    let text = crate::text_file::read_text(&args.config, 1 << 20).context("--config")?;
    let config = Arc::new(Config::parse(&text).with_context(|| args.config.display().to_string())?);
    let holes = Arc::new(Holes::default());
    let control = TcpListener::bind(args.control)
        .with_context(|| format!("--control {}: cannot listen", args.control))?;
    for (index, route) in config.routes.iter().enumerate() {
        let listener = TcpListener::bind(route.listen)
            .with_context(|| format!("routes[{index}].listen {}: cannot listen", route.listen))?;
        let (config, holes, route) = (config.clone(), holes.clone(), route.clone());
        std::thread::Builder::new()
            .name(format!("relay-{}", route.to))
            .spawn(move || accept(&listener, &route, &config, &holes, index as u64))?;
    }
    outln!(
        "relay: {} routes, control on {}",
        config.routes.len(),
        control.local_addr()?
    );
    std::io::stdout().flush().ok();
    for stream in control.incoming() {
        let Ok(stream) = stream else { continue };
        let (config, holes) = (config.clone(), holes.clone());
        std::thread::spawn(move || serve_control(stream, &config, &holes));
    }
    Ok(())
}

/// Takes connections on `route` and relays each on its own threads.
fn accept(listener: &TcpListener, route: &Route, config: &Config, holes: &Arc<Holes>, index: u64) {
    for (count, client) in listener.incoming().enumerate() {
        let client = match client {
            Ok(client) => client,
            Err(e) => {
                tracing::warn!(route = %route.listen, "accept failed: {e}");
                continue;
            }
        };
        let from = client
            .peer_addr()
            .ok()
            .and_then(|a| config.nodes.get(&a.ip()).cloned());
        let link = Link {
            delay: config.delay(from.as_deref(), &route.to),
            from,
            to: route.to.clone(),
            holes: holes.clone(),
        };
        // One jitter stream per connection, fixed by the seed, the route and the count.
        let seed = config.seed ^ (index << 48) ^ count as u64;
        let target = route.target;
        std::thread::spawn(move || {
            // A connection opened while its link is black-holed reaches its target when
            // the hole closes.
            link.holes.wait_open(link.from.as_deref(), &link.to);
            let outcome = TcpStream::connect(target)
                .and_then(|server| pipe::relay(client, server, &link, Jitter::new(seed)));
            if let Err(e) = outcome {
                tracing::warn!(
                    from = link.from.as_deref().unwrap_or("?"),
                    to = %link.to,
                    "cannot relay to {target}: {e}"
                );
            }
        });
    }
}

/// Answers the commands of one control connection, a line each.
fn serve_control(stream: TcpStream, config: &Config, holes: &Holes) {
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { return };
        let answer = match command(&line, config, holes) {
            Ok(said) => format!("ok {said}"),
            Err(e) => format!("error: {e}"),
        };
        if writeln!(out, "{answer}").is_err() {
            return;
        }
    }
}

/// Carries out one control command; what it did, or why not.
fn command(line: &str, config: &Config, holes: &Holes) -> Result<String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["blackhole", node, seconds] => {
            if !config.nodes.values().any(|n| n == node) {
                bail!("blackhole: {node:?} is no node");
            }
            let secs: f64 = seconds
                .parse()
                .ok()
                .filter(|s: &f64| s.is_finite() && (0.0..=3600.0).contains(s))
                .with_context(|| format!("blackhole: SECONDS {seconds:?} is not 0 to 3600"))?;
            holes.open(node, Instant::now() + Duration::from_secs_f64(secs));
            outln!("relay: {node}'s links black-holed for {secs} s");
            Ok(format!("{node} black-holed for {secs} s"))
        }
        _ => bail!("unknown command {line:?} (blackhole NODE SECONDS)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_commands_black_hole_a_node_or_say_why_not() {
        let config = Config::parse(
            r#"{"nodes": [{"name": "w0", "address": "10.0.0.1"}],
                "routes": [{"to": "w0", "listen": "127.0.0.1:9", "target": "10.0.0.1:1"}]}"#,
        )
        .expect("valid");
        let holes = Holes::default();
        let said = command("blackhole w0 5", &config, &holes).expect("a node");
        assert_eq!(said, "w0 black-holed for 5 s");
        let until = holes
            .closed_until(Some("w1"), "w0")
            .expect("w0's links held");
        assert!(until > Instant::now() + Duration::from_secs(4));
        for (line, says) in [
            ("blackhole w9 5", "\"w9\" is no node"),
            ("blackhole w0 -1", "SECONDS \"-1\" is not 0 to 3600"),
            ("blackhole w0 soon", "SECONDS \"soon\""),
            ("heal w0", "unknown command"),
        ] {
            let err = command(line, &config, &holes).expect_err(line).to_string();
            assert!(err.contains(says), "{line}: {err}");
        }
    }
}
