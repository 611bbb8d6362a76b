//! The membership actor: worker registrations and heartbeats, and who is alive.

use std::collections::BTreeMap;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::time::Instant;

/// Heartbeat interval handed to workers.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(500);
/// A worker silent for this many intervals is considered dead.
pub const MISSED_HEARTBEATS: u32 = 4;

/// What the coordinator knows about a worker.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerInfo {
    /// Worker id (unique per process).
    pub id: String,
    /// Address of its activation service.
    pub address: String,
    /// `cpu`, `cuda`, …
    pub device_kind: String,
    /// Device memory in bytes.
    pub memory_bytes: u64,
    /// Last sign of life.
    pub last_seen: Instant,
    /// Activation bytes held now (last heartbeat).
    pub current_activation_bytes: u64,
    /// Peak activation bytes (last heartbeat).
    pub peak_activation_bytes: u64,
    /// Last step the worker reported.
    pub step: u64,
}

/// A heartbeat's content.
#[derive(Debug, Clone, PartialEq)]
pub struct Heartbeat {
    /// Worker id.
    pub id: String,
    /// Activation bytes held now.
    pub current_activation_bytes: u64,
    /// Peak activation bytes.
    pub peak_activation_bytes: u64,
    /// Last step done.
    pub step: u64,
}

/// The membership actor.
pub struct Membership;

/// Messages of the membership actor.
pub enum MembershipMsg {
    /// A worker registers (again); replies with the heartbeat interval.
    Register(WorkerInfo, RpcReplyPort<Duration>),
    /// A heartbeat; replies whether the worker is known (else it must register).
    Heartbeat(Heartbeat, RpcReplyPort<bool>),
    /// The workers alive now.
    Live(RpcReplyPort<Vec<WorkerInfo>>),
}

impl Actor for Membership {
    type Msg = MembershipMsg;
    type State = BTreeMap<String, WorkerInfo>;
    type Arguments = ();

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        _args: (),
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(BTreeMap::new())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        workers: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            MembershipMsg::Register(info, reply) => {
                tracing::info!(worker = %info.id, address = %info.address, "worker registered");
                workers.insert(info.id.clone(), info);
                let _ = reply.send(HEARTBEAT_INTERVAL);
            }
            MembershipMsg::Heartbeat(beat, reply) => {
                let known = match workers.get_mut(&beat.id) {
                    Some(w) => {
                        w.last_seen = Instant::now();
                        w.current_activation_bytes = beat.current_activation_bytes;
                        w.peak_activation_bytes = beat.peak_activation_bytes;
                        w.step = beat.step;
                        true
                    }
                    None => false,
                };
                let _ = reply.send(known);
            }
            MembershipMsg::Live(reply) => {
                let deadline = HEARTBEAT_INTERVAL * MISSED_HEARTBEATS;
                let now = Instant::now();
                let live = workers
                    .values()
                    .filter(|w| now.duration_since(w.last_seen) <= deadline)
                    .cloned()
                    .collect();
                let _ = reply.send(live);
            }
        }
        Ok(())
    }
}
