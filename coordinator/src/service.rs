//! The gRPC edge: `JobService` and `ClusterService` forward to the actors; errors become
//! `tonic::Status` here and only here.

use std::pin::Pin;

use pipewise_common::job::JobSpec;
use pipewise_proto::v1 as pb;
use pipewise_proto::v1::cluster_service_server::ClusterService;
use pipewise_proto::v1::job_service_server::JobService;
use ractor::ActorRef;
use tokio_stream::{Stream, StreamExt as _};
use tonic::{Request, Response, Status};

use crate::error::CoordinatorError;
use crate::job_msg::JobMsg;
use crate::membership::{Heartbeat, MembershipMsg, WorkerInfo};
use crate::store::{JobRecord, JobState};

/// `JobService` over the job manager.
#[derive(Clone)]
pub struct Jobs {
    /// The job manager.
    pub manager: ActorRef<JobMsg>,
}

/// `ClusterService` over the membership actor.
#[derive(Clone)]
pub struct Cluster {
    /// The membership actor.
    pub membership: ActorRef<MembershipMsg>,
    /// When set (the coordinator takes tokens), each assignment carries its run's secret.
    pub run_secrets: Option<std::sync::Arc<crate::security::RunSecrets>>,
}

fn status_of(r: &JobRecord) -> pb::JobStatus {
    let state = match r.state {
        JobState::Queued => pb::JobState::Queued,
        JobState::Running => pb::JobState::Running,
        JobState::Succeeded => pb::JobState::Succeeded,
        JobState::Failed => pb::JobState::Failed,
        JobState::Cancelled => pb::JobState::Cancelled,
    };
    pb::JobStatus {
        id: r.id,
        name: r.name.clone(),
        state: state as i32,
        step: r.step,
        steps: r.steps,
        last_loss: r.last_loss.unwrap_or(f64::NAN),
        error: r.error.clone(),
        last_checkpoint: r.last_checkpoint.clone(),
        waiting: r.waiting.clone(),
        plan_choice: r.plan_choice.clone(),
        workers: r.workers.clone(),
    }
}

/// The longest worker id a worker may register with (a DNS name's length).
const MAX_WORKER_ID: usize = 253;

/// The longest address a worker may register with (a URL with such a name).
const MAX_ADDRESS: usize = 1024;

/// Applies the request's overrides on top of the TOML spec.
pub fn spec_of(req: &pb::JobSpec) -> Result<JobSpec, CoordinatorError> {
    let mut spec = JobSpec::from_toml(&req.toml)?;
    if let Some(name) = &req.name {
        spec.job.name = name.clone();
    }
    if let Some(steps) = req.steps {
        spec.training.steps = u32::try_from(steps).map_err(|_| CoordinatorError::BadRequest {
            field: "steps",
            reason: format!("{steps} does not fit in 32 bits"),
        })?;
    }
    if let Some(n) = req.microbatches {
        if n == 0 || spec.training.global_batch_size % n != 0 {
            return Err(CoordinatorError::BadRequest {
                field: "microbatches",
                reason: format!(
                    "{n} microbatches do not divide the global batch of {}",
                    spec.training.global_batch_size
                ),
            });
        }
        spec.parallelism.pipeline_parallel_microbatch_size = spec.training.global_batch_size / n;
        spec.parallelism.search_microbatch_size = false;
    }
    if let Some(schedule) = &req.schedule {
        spec.parallelism.pipeline_parallel_schedule = schedule.clone();
    }
    if let Some(workers) = req.workers {
        spec.parallelism.pipeline_parallel_degree = workers;
    }
    if let Some(seed) = req.seed {
        spec.training.seed = seed;
    }
    Ok(spec)
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::StepEvent, Status>> + Send>>;
type AssignmentStream = Pin<Box<dyn Stream<Item = Result<pb::Assignment, Status>> + Send>>;

#[tonic::async_trait]
impl JobService for Jobs {
    async fn submit_job(
        &self,
        request: Request<pb::JobSpec>,
    ) -> Result<Response<pb::JobStatus>, Status> {
        let spec = spec_of(request.get_ref())?;
        let record = ractor::call!(self.manager, JobMsg::Submit, Box::new(spec))
            .map_err(CoordinatorError::from)??;
        Ok(Response::new(status_of(&record)))
    }

    async fn get_job(
        &self,
        request: Request<pb::JobId>,
    ) -> Result<Response<pb::JobStatus>, Status> {
        let id = request.get_ref().id;
        let record =
            ractor::call!(self.manager, JobMsg::Get, id).map_err(CoordinatorError::from)??;
        Ok(Response::new(status_of(&record)))
    }

    async fn list_jobs(
        &self,
        _request: Request<pb::Empty>,
    ) -> Result<Response<pb::JobList>, Status> {
        let records = ractor::call!(self.manager, JobMsg::List).map_err(CoordinatorError::from)?;
        Ok(Response::new(pb::JobList {
            jobs: records.iter().map(status_of).collect(),
        }))
    }

    type WatchJobStream = EventStream;

    async fn watch_job(
        &self,
        request: Request<pb::JobId>,
    ) -> Result<Response<Self::WatchJobStream>, Status> {
        let id = request.get_ref().id;
        let (past, rx) =
            ractor::call!(self.manager, JobMsg::Watch, id).map_err(CoordinatorError::from)??;
        let live = tokio_stream::wrappers::BroadcastStream::new(rx).filter_map(|item| match item {
            Ok(event) => Some(Ok(pb::StepEvent::from(event))),
            // A slow watcher skips events rather than stalling the job.
            Err(_) => None,
        });
        // The steps before the call first (a watcher that subscribes late misses none),
        // then the live ones; the job manager hands both over atomically.
        let stream =
            tokio_stream::iter(past.into_iter().map(|e| Ok(pb::StepEvent::from(e)))).chain(live);
        Ok(Response::new(Box::pin(stream)))
    }

    async fn cancel_job(
        &self,
        request: Request<pb::JobId>,
    ) -> Result<Response<pb::JobStatus>, Status> {
        let id = request.get_ref().id;
        let record =
            ractor::call!(self.manager, JobMsg::Cancel, id).map_err(CoordinatorError::from)??;
        Ok(Response::new(status_of(&record)))
    }

    async fn get_step_trace(
        &self,
        request: Request<pb::StepTraceRequest>,
    ) -> Result<Response<pb::StepTrace>, Status> {
        let pb::StepTraceRequest { job, step } = request.into_inner();
        let t = ractor::call!(self.manager, JobMsg::Trace, job, step)
            .map_err(CoordinatorError::from)??;
        Ok(Response::new(pb::StepTrace {
            job: t.job,
            step: t.step,
            chrome_trace_json: t.chrome_json,
            svg: t.svg,
            planned_bubble: t.planned_bubble,
            resimulated_bubble: t.resimulated_bubble,
            executed_bubble: t.executed_bubble,
            kept_steps: t.kept,
        }))
    }
}

#[tonic::async_trait]
impl ClusterService for Cluster {
    async fn register(
        &self,
        request: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterReply>, Status> {
        let r = request.into_inner();
        if r.worker_id.trim().is_empty() {
            return Err(Status::invalid_argument("worker_id: must not be empty"));
        }
        // An id names metric series and log lines: a host or pod name's length, no control
        // characters.
        if r.worker_id.len() > MAX_WORKER_ID || r.worker_id.chars().any(char::is_control) {
            return Err(Status::invalid_argument(format!(
                "worker_id: at most {MAX_WORKER_ID} bytes without control characters"
            )));
        }
        if r.address.trim().is_empty() {
            return Err(Status::invalid_argument("address: must not be empty"));
        }
        if r.address.len() > MAX_ADDRESS {
            return Err(Status::invalid_argument(format!(
                "address: at most {MAX_ADDRESS} bytes"
            )));
        }
        // Every peer of a job dials it: an address none can connect to would fail each job
        // the worker is given, at its start barrier, instead of here.
        if let Some(why) = pipewise_common::address::undialable(&r.address) {
            return Err(Status::invalid_argument(format!(
                "address: peers cannot dial {:?}: {why}; the worker's --advertise sets it",
                r.address
            )));
        }
        if r.host.len() > MAX_ADDRESS || r.host.chars().any(char::is_control) {
            return Err(Status::invalid_argument(format!(
                "host: at most {MAX_ADDRESS} bytes without control characters"
            )));
        }
        for (field, value) in [("flops_per_second", r.flops_per_second), ("cores", r.cores)] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(Status::invalid_argument(format!(
                    "{field}: must be finite and ≥ 0, got {value}"
                )));
            }
        }
        let info = WorkerInfo {
            id: r.worker_id,
            address: r.address,
            device_kind: r.device_kind,
            memory_bytes: r.memory_bytes,
            flops_per_second: r.flops_per_second,
            cores: r.cores,
            host: r.host,
            // Until its first heartbeat: the run it still runs, if any.
            job: r.run,
        };
        let interval = ractor::call!(self.membership, MembershipMsg::Register, info)
            .map_err(CoordinatorError::from)??;
        Ok(Response::new(pb::RegisterReply {
            accepted: true,
            heartbeat_interval_ms: interval.as_millis() as u64,
            reason: String::new(),
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatReply>, Status> {
        let r = request.into_inner();
        let beat = Heartbeat {
            id: r.worker_id,
            current_activation_bytes: r.current_activation_bytes,
            job: r.run,
        };
        let answer = ractor::call!(self.membership, MembershipMsg::Heartbeat, beat)
            .map_err(CoordinatorError::from)?;
        Ok(Response::new(pb::HeartbeatReply {
            known: answer.known,
            cancel: answer.abort.is_some(),
            run: answer.abort.unwrap_or(0),
        }))
    }

    type AssignmentsStream = AssignmentStream;

    async fn assignments(
        &self,
        request: Request<pb::WorkerId>,
    ) -> Result<Response<Self::AssignmentsStream>, Status> {
        let id = request.into_inner().id;
        let rx = ractor::call!(self.membership, MembershipMsg::OpenStream, id)
            .map_err(CoordinatorError::from)??;
        let secrets = self.run_secrets.clone();
        // The stream is dropped when the worker's connection closes (a killed process): the
        // membership looks at once rather than at its next tick, so a job with replicas
        // sheds the worker's replica without waiting.
        let closing = TickOnDrop(self.membership.clone());
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx).map(move |mut a| {
            let _ = &closing;
            if let Some(secrets) = &secrets {
                a.run_secret = secrets.of(a.run);
            }
            Ok(a)
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn report_step(
        &self,
        request: Request<pb::StepReport>,
    ) -> Result<Response<pb::StepAck>, Status> {
        let report = request.into_inner();
        named_worker(&report.worker_id, "StepReport.worker_id")?;
        let (report, bad_span) = pipewise_proto::convert::step::step_report_from_proto(report);
        if let Some(e) = bad_span {
            tracing::warn!(
                run = report.run,
                step = report.step,
                worker = report.worker_index,
                "bad trace span (the step has no trace): {e}"
            );
        }
        let answer = ractor::call!(self.membership, MembershipMsg::Report, Box::new(report))
            .map_err(CoordinatorError::from)?;
        Ok(Response::new(pb::StepAck {
            cancel: answer.stop,
            abort: answer.abort,
        }))
    }

    async fn leave(
        &self,
        request: Request<pb::LeaveRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let pb::LeaveRequest { worker_id, run } = request.into_inner();
        named_worker(&worker_id, "LeaveRequest.worker_id")?;
        // Answered once the run actors were told: the worker may exit then.
        let told = ractor::call!(self.membership, MembershipMsg::Leave, worker_id, run);
        told.map_err(CoordinatorError::from)?;
        Ok(Response::new(pb::Empty {}))
    }
}

/// Refuses an empty worker id in `field`.
fn named_worker(id: &str, field: &str) -> Result<(), Status> {
    if id.trim().is_empty() {
        return Err(Status::invalid_argument(format!(
            "{field}: must not be empty"
        )));
    }
    Ok(())
}

/// Asks the membership actor to look at its workers' streams when dropped.
struct TickOnDrop(ActorRef<MembershipMsg>);

impl Drop for TickOnDrop {
    fn drop(&mut self) {
        let _ = self.0.cast(MembershipMsg::Tick);
    }
}
