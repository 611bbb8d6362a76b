//! Data-parallel replicas whose collectives go over gRPC, as separate worker processes'
//! do: every worker serves its own `CollectiveService` on loopback, the losses and norms
//! meet at worker 0, and each rank's gradients are summed along its chain of replicas
//! (replica 0's worker to the last replica's and back), with no root. Training gives the
//! single device's parameters bit for bit with R = 2, 3 and 4 replicas, unsharded and with
//! ZeRO-1 and ZeRO-2 shards (S = 2 and 4), and the losses of the same replicas summed in
//! process.

mod common;

use std::time::Duration;

use candle_core::Device;
use pipewise_common::generate::ScheduleKind;
use pipewise_common::model::ModelSpec;
use pipewise_worker::net::{GrpcConfig, GrpcTransport, NetSync};
use pipewise_worker::optim::ZeroStage;
use pipewise_worker::runtime::{LocalOptions, LocalRun, Replica, StepSync, run_local};
use pipewise_worker::{Batch, Result};

use common::reference::{SEED, adamw, differing, reference, schedule};

/// Divisible by 2, 3 and 4 replicas.
const MICROBATCHES: u32 = 12;
const WORKERS: u32 = 2;
const JOB: u64 = 11;
const TIMEOUT: Duration = Duration::from_secs(60);

fn spec() -> ModelSpec {
    ModelSpec {
        heads: 2,
        ..common::small_spec(4)
    }
}

/// The gRPC collectives of `replicas` replicas of [`WORKERS`] workers (replica `r`'s worker
/// `w` at `r · WORKERS + w`), and the transports serving them.
fn grpc_syncs(replicas: u32) -> Result<(Vec<GrpcTransport>, Vec<NetSync>)> {
    let count = replicas * WORKERS;
    let transports = (0..count)
        .map(|c| GrpcTransport::start(GrpcConfig::new(JOB, [c % WORKERS])))
        .collect::<Result<Vec<_>>>()?;
    let addresses: Vec<String> = transports
        .iter()
        .map(|t| t.local_addr().to_string())
        .collect();
    let mut syncs = Vec::with_capacity(count as usize);
    for (c, t) in (0..count).zip(&transports) {
        let replica = Replica {
            index: c / WORKERS,
            count: replicas,
        };
        t.collective().configure(JOB, count, replica, TIMEOUT);
        let root = &addresses[0];
        let sync = match c {
            0 => t.sync_at(root, JOB, 0, TIMEOUT)?,
            _ => t.sync_to(root, JOB, c, TIMEOUT)?,
        };
        let rank = c % WORKERS;
        let chain: Vec<String> = (0..replicas)
            .map(|r| addresses[(r * WORKERS + rank) as usize].clone())
            .collect();
        syncs.push(sync.with_grad_chain(t.grad_chain(replica, &chain, JOB, c, TIMEOUT)?));
    }
    Ok((transports, syncs))
}

/// `replicas` copies of a 1F1B pipeline on [`WORKERS`] workers sharing `data`'s
/// microbatches, consecutive `shard_degree` of them sharding `zero`; collectives over gRPC
/// or in process.
fn run(
    data: &[Vec<Batch>],
    (replicas, shard_degree, zero): (u32, u32, ZeroStage),
    over_grpc: bool,
) -> Result<LocalRun> {
    let schedule = schedule(ScheduleKind::OneFOneB, WORKERS, 1, MICROBATCHES / replicas);
    let (_transports, syncs) = if over_grpc {
        grpc_syncs(replicas)?
    } else {
        (Vec::new(), Vec::new())
    };
    let syncs: Vec<&dyn StepSync> = syncs.iter().map(|s| s as &dyn StepSync).collect();
    let options = LocalOptions {
        replicas,
        shard_degree,
        zero_stage: zero,
        timeout: TIMEOUT,
        syncs: over_grpc.then_some(syncs.as_slice()),
        ..LocalOptions::default()
    };
    run_local(
        &schedule,
        &spec(),
        SEED,
        adamw(),
        &Device::Cpu,
        data,
        options,
    )
}

/// `run`'s parameters (every replica's) are `want`'s bits and its losses `losses`.
fn assert_exact(
    what: &str,
    run: &LocalRun,
    want: &std::collections::BTreeMap<String, candle_core::Tensor>,
    losses: &[f32],
) -> Result<()> {
    for (r, params) in std::iter::once(&run.params)
        .chain(&run.replica_params)
        .enumerate()
    {
        let differ = differing(params, want)?;
        assert!(differ.is_empty(), "{what}: replica {r}'s {differ:?} differ");
    }
    assert_eq!(run.losses, losses, "{what}: losses");
    Ok(())
}

/// R = 2, 3 and 4 replicas over gRPC: the single device's parameters bit for bit on every
/// replica, and the losses of the same replicas summed in process.
#[test]
fn replicas_over_grpc_train_like_the_single_device() -> Result<()> {
    let data = common::step_batches(&spec(), 3, MICROBATCHES)?;
    let want = reference(&spec(), &data)?.params;
    for replicas in [2, 3, 4] {
        let plain = (replicas, 1, ZeroStage::OptimizerState);
        let in_process = run(&data, plain, false)?;
        assert!(differing(&in_process.params, &want)?.is_empty());
        let grpc = run(&data, plain, true)?;
        assert_exact(&format!("R = {replicas}"), &grpc, &want, &in_process.losses)?;
    }
    Ok(())
}

/// ZeRO-1 and ZeRO-2 over gRPC with S = 2 and 4 (d = 2), and S = 2 in each of 2 groups:
/// the single device's parameters bit for bit and the unsharded replicas' losses.
#[test]
fn sharded_optimizers_over_grpc_train_like_the_single_device() -> Result<()> {
    let data = common::step_batches(&spec(), 3, MICROBATCHES)?;
    let want = reference(&spec(), &data)?.params;
    for zero in [ZeroStage::OptimizerState, ZeroStage::Gradients] {
        for (replicas, degree) in [(2, 2), (4, 4), (4, 2)] {
            let plain = run(&data, (replicas, 1, zero), false)?;
            let sharded = run(&data, (replicas, degree, zero), true)?;
            let what = format!("{zero:?} S = {degree} of {replicas} replicas");
            assert_exact(&what, &sharded, &want, &plain.losses)?;
        }
    }
    Ok(())
}
