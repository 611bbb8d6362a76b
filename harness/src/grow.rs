//! Workers joining mid-job: [`Cluster::add_worker`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};

use pipewise_worker::node::{NodeConfig, Pace, WorkerNode};

use crate::{Cluster, LIMIT, Slot, WorkerPace};

impl Cluster {
    /// Starts one more worker, `w{n}` for the `n` workers started so far, on the cluster's
    /// pace, at normal speed, with its own data directory where the others have theirs;
    /// returns its index once the coordinator has its assignment stream (so what the
    /// coordinator decides next may count on it).
    pub async fn add_worker(&mut self) -> usize {
        let w = self.workers.len();
        let id = format!("w{w}");
        let shared = self.dir.join("coordinator");
        let first = &self
            .workers
            .first()
            .expect("a worker started with the cluster")
            .config;
        let mut config = NodeConfig::new(first.coordinator.clone(), id.clone());
        config.data_dir = if first.data_dir == shared {
            shared
        } else {
            self.dir.join(&id)
        };
        std::fs::create_dir_all(&config.data_dir).expect("a worker's directory");
        config.cores = 1.0;
        config.connect_for = LIMIT;
        config.timeout = LIMIT;
        let pace = Arc::new(WorkerPace {
            id: id.clone(),
            gate: Arc::clone(&self.gate),
            killed: AtomicBool::new(false),
            beats: AtomicU64::new(0),
        });
        config.pace = Some(Arc::clone(&pace) as Arc<dyn Pace>);
        let node = WorkerNode::start(config.clone())
            .await
            .expect("the new worker starts");
        self.workers.push(Slot {
            config,
            pace,
            node: Some(node),
        });
        self.wait_members(&format!("{id}'s stream"), |live| {
            live.iter().any(|m| m.worker.id == id && m.streaming)
        })
        .await;
        w
    }
}
