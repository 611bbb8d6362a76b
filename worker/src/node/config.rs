//! How a worker process starts: [`NodeConfig`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use pipewise_proto::auth::BearerToken;

use crate::Device;
use crate::net::TlsSettings;

/// How a worker process starts.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The coordinator's URL (`http://host:port`).
    pub coordinator: String,
    /// Where this worker's activation service listens.
    pub listen: SocketAddr,
    /// The address peers and the coordinator reach it at (default: the bound address).
    pub advertise: Option<String>,
    /// The worker's stable name (unique in the cluster).
    pub id: String,
    /// Where stages run.
    pub device: Device,
    /// How long to wait for a peer's frame or for the other workers at a step's end.
    pub timeout: Duration,
    /// How long to keep trying to reach the coordinator at start.
    pub connect_for: Duration,
    /// Real passes take longer from a step on (a stand-in for a slower device, to exercise
    /// straggler and drift handling; default: none).
    pub slowdown: crate::runtime::Slowdown,
    /// Device memory this worker may use, registered with the coordinator, which moves a
    /// job that overflows it to a schedule that fits (0: not said, not watched).
    pub memory_bytes: u64,
    /// Cores this worker may count on when every worker sharing its host computes at once
    /// (`pipewise local`: the machine's cores over its workers); 0: not known. The
    /// coordinator's cost model slows a worker with less than one core accordingly.
    pub cores: f64,
    /// This worker's host as it registers it for the shared-memory tier
    /// ([`crate::net::host_identity`] for a worker process); peers registering the same one
    /// exchange frames with it through shared memory. Empty (the default): the tier is off.
    pub host: String,
    /// Bytes the worker reports holding beyond what it computes: a stand-in for memory no
    /// plan predicts (allocator slack, other processes), to exercise the coordinator's
    /// after-a-step memory check (0: none).
    pub unplanned_bytes: u64,
    /// TLS: the CA the coordinator (and peers) are checked against, and this worker's
    /// certificate, presented to the coordinator and used for mutual TLS with the peers.
    pub tls: TlsSettings,
    /// The token sent on every call to the coordinator (the worker role).
    pub token: BearerToken,
    /// The worker's data directory: a job's `checkpoint.folder` and `data.path` resolve
    /// under it, and one that leads outside is refused (absolute, so that absolute paths
    /// under it are recognised).
    pub data_dir: PathBuf,
    /// An in-process test harness's pace and clock ([`super::pace`]); `None` (every
    /// process): as fast as it can, on the wall clock.
    pub pace: Option<std::sync::Arc<dyn super::pace::Pace>>,
}

/// The data directory of a worker and of a coordinator that are not told one (relative to
/// where they start, so both started in one directory share it).
pub const DEFAULT_DATA_DIR: &str = "pipewise-data";

impl NodeConfig {
    /// Defaults: listen on `127.0.0.1:0`, CPU, 120 s timeouts, 60 s to reach the coordinator,
    /// no TLS, no token, data in [`DEFAULT_DATA_DIR`].
    pub fn new(coordinator: impl Into<String>, id: impl Into<String>) -> Self {
        NodeConfig {
            coordinator: coordinator.into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            advertise: None,
            id: id.into(),
            device: Device::Cpu,
            timeout: crate::runtime::DEFAULT_TIMEOUT,
            connect_for: Duration::from_secs(60),
            slowdown: crate::runtime::Slowdown::default(),
            memory_bytes: 0,
            cores: 0.0,
            host: String::new(),
            unplanned_bytes: 0,
            tls: TlsSettings::default(),
            token: BearerToken::none(),
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            pace: None,
        }
    }
}
