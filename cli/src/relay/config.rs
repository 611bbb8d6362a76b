//! The relay's configuration file (JSON): the nodes it tells apart by source address, the
//! routes it listens on, and the delay of each link between two nodes.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{Result, bail};
use serde::Deserialize;

/// The file as written: see `docs/cluster-emulation.md` for an example.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    seed: u64,
    nodes: Vec<RawNode>,
    routes: Vec<RawRoute>,
    #[serde(default)]
    links: Vec<RawLink>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    name: String,
    address: IpAddr,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    to: String,
    listen: SocketAddr,
    target: SocketAddr,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLink {
    between: [String; 2],
    latency_ms: f64,
    #[serde(default)]
    jitter_ms: f64,
}

/// One direction's delay: `latency ± jitter`, uniform, never below zero.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Delay {
    pub(crate) latency: Duration,
    pub(crate) jitter: Duration,
}

/// A port the relay listens on, and where what arrives there goes.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    /// The node behind `target`.
    pub(crate) to: String,
    pub(crate) listen: SocketAddr,
    pub(crate) target: SocketAddr,
}

/// The checked configuration.
#[derive(Debug)]
pub(crate) struct Config {
    pub(crate) seed: u64,
    /// Source address → node name.
    pub(crate) nodes: HashMap<IpAddr, String>,
    pub(crate) routes: Vec<Route>,
    /// (a, b) → delay, both orders present; pairs not listed are not delayed.
    links: HashMap<(String, String), Delay>,
}

impl Config {
    /// Parses and checks `text`; every error names the field at fault.
    pub(crate) fn parse(text: &str) -> Result<Self> {
        let raw: RawConfig =
            serde_json::from_str(text).map_err(|e| anyhow::anyhow!("relay configuration: {e}"))?;
        let mut nodes = HashMap::new();
        let mut names = Vec::new();
        for (i, node) in raw.nodes.iter().enumerate() {
            if node.name.is_empty() {
                bail!("nodes[{i}].name: empty");
            }
            if names.contains(&node.name) {
                bail!("nodes[{i}].name: {:?} appears twice", node.name);
            }
            if let Some(other) = nodes.insert(node.address, node.name.clone()) {
                bail!(
                    "nodes[{i}].address: {} is {other:?}'s address too: the relay tells \
                     nodes apart by the address their connections come from",
                    node.address
                );
            }
            names.push(node.name.clone());
        }
        let known = |field: String, name: &str| -> Result<()> {
            if names.iter().any(|n| n == name) {
                Ok(())
            } else {
                bail!("{field}: {name:?} is no node (nodes: {})", names.join(", "))
            }
        };
        if raw.routes.is_empty() {
            bail!("routes: empty (nothing to relay)");
        }
        let mut routes: Vec<Route> = Vec::new();
        for (i, route) in raw.routes.iter().enumerate() {
            known(format!("routes[{i}].to"), &route.to)?;
            if route.listen.port() == 0 {
                bail!("routes[{i}].listen: port 0 (peers need a fixed port to dial)");
            }
            if routes.iter().any(|r| r.listen == route.listen) {
                bail!("routes[{i}].listen: {} is listed twice", route.listen);
            }
            routes.push(Route {
                to: route.to.clone(),
                listen: route.listen,
                target: route.target,
            });
        }
        let mut links = HashMap::new();
        for (i, link) in raw.links.iter().enumerate() {
            let [a, b] = &link.between;
            known(format!("links[{i}].between"), a)?;
            known(format!("links[{i}].between"), b)?;
            if a == b {
                bail!("links[{i}].between: a node's link to itself ({a:?})");
            }
            let delay = Delay {
                latency: millis(&format!("links[{i}].latency_ms"), link.latency_ms)?,
                jitter: millis(&format!("links[{i}].jitter_ms"), link.jitter_ms)?,
            };
            if delay.jitter > delay.latency {
                bail!(
                    "links[{i}].jitter_ms: {} exceeds latency_ms",
                    link.jitter_ms
                );
            }
            let pair = (a.clone(), b.clone());
            if links.insert(pair, delay).is_some() {
                bail!("links[{i}].between: the link {a:?}–{b:?} is listed twice");
            }
            links.insert((b.clone(), a.clone()), delay);
        }
        Ok(Self {
            seed: raw.seed,
            nodes,
            routes,
            links,
        })
    }

    /// The delay between `from` (None: a source that is no node) and `to`.
    pub(crate) fn delay(&self, from: Option<&str>, to: &str) -> Delay {
        from.and_then(|f| self.links.get(&(f.to_string(), to.to_string())))
            .copied()
            .unwrap_or_default()
    }
}

/// Milliseconds, finite, from 0 to a minute.
fn millis(field: &str, ms: f64) -> Result<Duration> {
    if !ms.is_finite() || !(0.0..=60_000.0).contains(&ms) {
        bail!("{field}: {ms} is not a time from 0 to 60000 ms");
    }
    Ok(Duration::from_secs_f64(ms / 1e3))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(links: &str) -> Result<Config> {
        Config::parse(&format!(
            r#"{{"seed": 3,
                "nodes": [{{"name": "a", "address": "10.0.0.1"}},
                          {{"name": "b", "address": "10.0.0.2"}}],
                "routes": [{{"to": "b", "listen": "127.0.0.1:9", "target": "10.0.0.2:7000"}}],
                "links": [{links}]}}"#
        ))
    }

    #[test]
    fn a_link_delays_both_directions_and_others_not_at_all() {
        let c =
            config(r#"{"between": ["a", "b"], "latency_ms": 5, "jitter_ms": 0.5}"#).expect("valid");
        let want = Delay {
            latency: Duration::from_millis(5),
            jitter: Duration::from_micros(500),
        };
        assert_eq!(c.delay(Some("a"), "b"), want);
        assert_eq!(c.delay(Some("b"), "a"), want);
        assert_eq!(c.delay(None, "b"), Delay::default());
        assert_eq!(c.seed, 3);
        assert_eq!(c.nodes[&"10.0.0.2".parse::<IpAddr>().expect("ip")], "b");
    }

    #[test]
    fn bad_input_names_the_field() {
        for (links, says) in [
            (
                r#"{"between": ["a", "c"], "latency_ms": 1}"#,
                "links[0].between: \"c\" is no node",
            ),
            (
                r#"{"between": ["a", "a"], "latency_ms": 1}"#,
                "links[0].between: a node's link",
            ),
            (
                r#"{"between": ["a", "b"], "latency_ms": -1}"#,
                "links[0].latency_ms",
            ),
            (
                r#"{"between": ["a", "b"], "latency_ms": 1, "jitter_ms": 2}"#,
                "links[0].jitter_ms: 2 exceeds",
            ),
            (
                r#"{"between": ["a", "b"], "latency_ms": 1}, {"between": ["b", "a"], "latency_ms": 2}"#,
                "links[1].between: the link",
            ),
            (
                r#"{"between": ["a", "b"], "latency": 1}"#,
                "unknown field `latency`",
            ),
        ] {
            let err = config(links).expect_err(links).to_string();
            assert!(err.contains(says), "{links}: {err}");
        }
        let twice = r#"{"nodes": [{"name": "a", "address": "10.0.0.1"},
                                  {"name": "b", "address": "10.0.0.1"}],
                        "routes": [{"to": "a", "listen": "127.0.0.1:9", "target": "10.0.0.1:1"}]}"#;
        let err = Config::parse(twice).expect_err("same address").to_string();
        assert!(err.contains("nodes[1].address"), "{err}");
        let port0 = r#"{"nodes": [{"name": "a", "address": "10.0.0.1"}],
                        "routes": [{"to": "a", "listen": "127.0.0.1:0", "target": "10.0.0.1:1"}]}"#;
        let err = Config::parse(port0).expect_err("port 0").to_string();
        assert!(err.contains("routes[0].listen: port 0"), "{err}");
    }
}
