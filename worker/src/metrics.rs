//! The worker's Prometheus metrics, recorded through the `metrics` facade (the binary
//! installs the exporter). Labels: `worker` (index in the job), `stage`, `kind`.
//!
//! | name | type | labels |
//! |---|---|---|
//! | `pipewise_pass_duration_seconds` | histogram | `kind` = F \| B \| W \| BW, `stage` |
//! | `pipewise_worker_bubble_ratio` | gauge | `worker` |
//! | `pipewise_worker_peak_activation_bytes` | gauge | `worker` |
//! | `pipewise_parameter_bytes` | gauge | `worker` (parameters + f32 master copies + AdamW moments) |
//! | `pipewise_optimizer_bytes` | gauge | `worker` (AdamW moments + f32 master copies: a shard's when sharded) |
//! | `pipewise_summed_gradient_bytes` | gauge | `worker` (the summed gradients the optimizer reads) |
//! | `pipewise_worker_steps_total` | counter | `worker` |
//! | `pipewise_peer_bytes_total` | counter | `worker`, `peer`, `direction` = sent \| received |
//! | `pipewise_peer_tier` | gauge (1: the tier in use, 0: not) | `worker`, `peer`, `tier` = shm \| grpc \| grpc-tls |

use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};

use crate::runtime::{StepReport, WorkerRuntime};

/// Upper bounds of the pass-duration histogram buckets, in seconds.
pub const PASS_BUCKETS: [f64; 14] = [
    1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Registers help text and units.
pub fn describe() {
    describe_histogram!(
        "pipewise_pass_duration_seconds",
        Unit::Seconds,
        "Compute time of one pass (F, B, W or BW) of one microbatch on one stage"
    );
    describe_gauge!(
        "pipewise_worker_bubble_ratio",
        Unit::Count,
        "This worker's idle fraction in its last step: 1 - time in passes / step wall time"
    );
    describe_gauge!(
        "pipewise_worker_peak_activation_bytes",
        Unit::Bytes,
        "Largest activation stash this worker held in its last step"
    );
    describe_gauge!(
        "pipewise_parameter_bytes",
        Unit::Bytes,
        "Bytes of this worker's parameters, their f32 master copies (bf16, f16) and AdamW moments"
    );
    describe_gauge!(
        "pipewise_optimizer_bytes",
        Unit::Bytes,
        "Bytes of this worker's AdamW moments and f32 master copies (its shard's, when the \
         optimizer is sharded)"
    );
    describe_gauge!(
        "pipewise_summed_gradient_bytes",
        Unit::Bytes,
        "Bytes of the summed gradients this worker's optimizer reads (ZeRO-2: its shard's)"
    );
    describe_counter!("pipewise_worker_steps_total", "Steps this worker finished");
    describe_counter!(
        "pipewise_peer_bytes_total",
        Unit::Bytes,
        "Activation and gradient bytes this worker sent to or received from a peer worker"
    );
    describe_gauge!(
        "pipewise_peer_tier",
        Unit::Count,
        "1 for the transport tier frames to and from a peer worker take (shm: shared memory, \
         the same host; grpc, grpc-tls: the network), 0 for the others"
    );
}

/// Records the tier of each of worker `worker`'s `peers` in its current run.
pub fn record_tiers(worker: u32, peers: impl IntoIterator<Item = (u32, crate::net::Tier)>) {
    use crate::net::Tier;
    let w = worker.to_string();
    for (peer, tier) in peers {
        for each in [Tier::Shm, Tier::Grpc, Tier::GrpcTls] {
            gauge!(
                "pipewise_peer_tier",
                "worker" => w.clone(),
                "peer" => peer.to_string(),
                "tier" => each.name()
            )
            .set(if each == tier { 1.0 } else { 0.0 });
        }
    }
}

/// Records one step of worker `worker` (its index in the job).
pub fn record_step(worker: u32, report: &StepReport) {
    for t in &report.pass_times {
        histogram!(
            "pipewise_pass_duration_seconds",
            "kind" => t.pass.kind.as_str(),
            "stage" => t.pass.stage.to_string()
        )
        .record(t.secs);
    }
    let w = worker.to_string();
    if report.wall_secs > 0.0 {
        gauge!("pipewise_worker_bubble_ratio", "worker" => w.clone())
            .set(1.0 - report.busy_secs / report.wall_secs);
    }
    gauge!("pipewise_worker_peak_activation_bytes", "worker" => w.clone())
        .set(report.peak_stash_bytes as f64);
    for (direction, table) in [
        ("sent", &report.bytes_sent),
        ("received", &report.bytes_received),
    ] {
        for (peer, bytes) in table {
            counter!(
                "pipewise_peer_bytes_total",
                "worker" => w.clone(),
                "peer" => peer.to_string(),
                "direction" => direction
            )
            .increment(*bytes);
        }
    }
    counter!("pipewise_worker_steps_total", "worker" => w).increment(1);
}

/// Records the parameter and optimizer-state bytes of a worker's stages (all but gradients),
/// and apart its optimizer-state and summed-gradient bytes (what a sharded optimizer
/// divides).
pub fn record_parameters(rt: &WorkerRuntime) {
    let held = rt.optimizer_bytes();
    let sharded = if rt.is_sharded() { held.optimizer } else { 0 };
    let bytes: u64 = rt
        .params()
        .map(|p| p.state_bytes() - p.grad_bytes())
        .sum::<u64>()
        + sharded;
    let w = rt.worker().to_string();
    gauge!("pipewise_parameter_bytes", "worker" => w.clone()).set(bytes as f64);
    gauge!("pipewise_optimizer_bytes", "worker" => w.clone()).set(held.optimizer as f64);
    gauge!("pipewise_summed_gradient_bytes", "worker" => w).set(held.summed_grads as f64);
}
