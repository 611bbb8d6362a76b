//! The planner actor: validates a job spec and plans its schedule with the pure core, off
//! the async runtime (planning a large adaptive schedule takes seconds).
//!
//! Several submissions plan at once, up to [`PlannerArgs::concurrency`]: a small job
//! submitted behind a slow adaptive plan is not held up by it. Further requests wait for a
//! free slot. A plan whose caller goes away is dropped before it starts, or cancelled
//! ([`pipewise_common::cancel`]) while it runs, so abandoned plans do not hold the slots.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use pipewise_common::cancel::cancellable;
use pipewise_common::job::{JobPlan, JobSpec};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::Semaphore;

use crate::error::{CoordinatorError, Result};

/// The planner.
pub struct Planner;

/// Messages of the planner.
pub enum PlannerMsg {
    /// Validate and plan a job.
    Plan(Box<JobSpec>, RpcReplyPort<Result<JobPlan>>),
}

/// What turns a job spec into its plan; run on a blocking thread.
pub type PlanFn = Arc<dyn Fn(JobSpec) -> Result<JobPlan> + Send + Sync>;

/// The planner's arguments.
pub struct PlannerArgs {
    /// The planning function: [`JobSpec::validate`] outside tests.
    pub plan: PlanFn,
    /// Plans run at once (at least 1).
    pub concurrency: usize,
}

impl Default for PlannerArgs {
    /// Validates with the pure core, as many plans at once as the machine has cores.
    fn default() -> Self {
        PlannerArgs {
            plan: Arc::new(|spec: JobSpec| spec.validate().map_err(CoordinatorError::from)),
            concurrency: std::thread::available_parallelism().map_or(2, |n| n.get()),
        }
    }
}

/// The planner's state.
pub struct PlannerState {
    plan: PlanFn,
    slots: Arc<Semaphore>,
}

impl Actor for Planner {
    type Msg = PlannerMsg;
    type State = PlannerState;
    type Arguments = PlannerArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: PlannerArgs,
    ) -> std::result::Result<PlannerState, ActorProcessingErr> {
        Ok(PlannerState {
            plan: args.plan,
            slots: Arc::new(Semaphore::new(args.concurrency.max(1))),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut PlannerState,
    ) -> std::result::Result<(), ActorProcessingErr> {
        let PlannerMsg::Plan(spec, reply) = msg;
        let plan = state.plan.clone();
        let slots = state.slots.clone();
        // The handler returns at once; the plan's own task answers when it is done.
        tokio::spawn(async move {
            let Ok(slot) = slots.acquire_owned().await else {
                let _ = reply.send(Err(CoordinatorError::Actor("planner closed".into())));
                return;
            };
            // A caller that went away while the plan waited for a slot: nothing to plan.
            if reply.is_closed() {
                return;
            }
            let cancel = Arc::new(AtomicBool::new(false));
            let flag = cancel.clone();
            let mut task = tokio::task::spawn_blocking(move || {
                let _slot = slot;
                cancellable(flag, || plan(*spec))
            });
            let planned = tokio::select! {
                joined = &mut task => joined
                    .map_err(|e| CoordinatorError::Actor(format!("planning task: {e}")))
                    .and_then(|r| r),
                () = closed(&reply) => {
                    // The caller went away mid-plan: the planning loops end soon after the
                    // flag is raised, and the slot is free again once they have.
                    cancel.store(true, Ordering::Relaxed);
                    tracing::info!("a plan's caller went away; planning cancelled");
                    return;
                }
            };
            let _ = reply.send(planned);
        });
        Ok(())
    }
}

/// How often a waiting task looks whether its caller went away.
const CLOSED_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// Ends when `port`'s caller has stopped waiting for the answer (ractor's reply ports say so
/// only when asked).
pub(crate) async fn closed<T>(port: &RpcReplyPort<T>) {
    while !port.is_closed() {
        tokio::time::sleep(CLOSED_POLL).await;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Mutex;
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;
    use pipewise_common::job::example;

    /// A planner whose plans of jobs named "held" wait until the test sends on the returned
    /// channel (one send per held plan); other jobs plan at once. The counter says how
    /// many held plans have reached the gate.
    pub(crate) async fn gated_planner(
        concurrency: usize,
    ) -> (ActorRef<PlannerMsg>, mpsc::Sender<()>, Arc<Mutex<usize>>) {
        let (release, gate) = mpsc::channel::<()>();
        let gate = Arc::new(Mutex::new(gate));
        let waiting = Arc::new(Mutex::new(0));
        let plan: PlanFn = {
            let waiting = waiting.clone();
            Arc::new(move |spec: JobSpec| {
                if spec.job.name == "held" {
                    *waiting.lock().unwrap() += 1;
                    gate.lock().unwrap().recv().unwrap();
                }
                spec.validate().map_err(CoordinatorError::from)
            })
        };
        let (planner, _) = Actor::spawn(None, Planner, PlannerArgs { plan, concurrency })
            .await
            .unwrap();
        (planner, release, waiting)
    }

    /// A 1F1B job named `name` on `workers` workers.
    fn spec(name: &str, workers: u32) -> Box<JobSpec> {
        let mut spec = example(workers, "1f1b");
        spec.job.name = name.into();
        Box::new(spec)
    }

    /// Waits until `count` plans are held at the gate (or, with another counter, `count`
    /// of whatever it counts).
    pub(crate) async fn until_held(waiting: &Mutex<usize>, count: usize) {
        while *waiting.lock().unwrap() < count {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A job submitted behind a slow plan is planned beside it (plans used to run one
    /// after another, so a small job waited for a large adaptive one).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_is_planned_beside_a_slow_one() {
        let (planner, release, waiting) = gated_planner(2).await;
        let slow = {
            let planner = planner.clone();
            tokio::spawn(async move { ractor::call!(planner, PlannerMsg::Plan, spec("held", 2)) })
        };
        until_held(&waiting, 1).await;
        let fast = tokio::time::timeout(Duration::from_secs(30), async {
            ractor::call!(planner, PlannerMsg::Plan, spec("fast", 3))
        })
        .await
        .expect("the second job is planned while the first is held")
        .unwrap()
        .unwrap();
        assert_eq!(fast.schedule.num_workers(), 3);
        assert!(!slow.is_finished());
        release.send(()).unwrap();
        let slow = slow.await.unwrap().unwrap().unwrap();
        assert_eq!(slow.schedule.num_workers(), 2);
    }

    /// Beyond the concurrency, plans wait for a free slot instead of all running at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn plans_beyond_the_concurrency_wait_for_a_slot() {
        let (planner, release, waiting) = gated_planner(1).await;
        let calls: Vec<_> = (0..2)
            .map(|_| {
                let planner = planner.clone();
                tokio::spawn(
                    async move { ractor::call!(planner, PlannerMsg::Plan, spec("held", 2)) },
                )
            })
            .collect();
        until_held(&waiting, 1).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            *waiting.lock().unwrap(),
            1,
            "one slot: the second plan waits"
        );
        release.send(()).unwrap();
        until_held(&waiting, 2).await;
        release.send(()).unwrap();
        for call in calls {
            assert_eq!(
                call.await.unwrap().unwrap().unwrap().schedule.num_workers(),
                2
            );
        }
    }

    /// A plan whose caller goes away is cancelled mid-plan and frees its slot; one whose
    /// caller went away while it waited for a slot never starts (abandoned plans used to
    /// hold every slot until they ended, so a small job behind them waited minutes).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn abandoned_plans_free_their_slot() {
        // Jobs named "endless" plan until cancelled, as a long adaptive search does.
        let started = Arc::new(Mutex::new(0usize));
        let plan: PlanFn = {
            let started = started.clone();
            Arc::new(move |spec: JobSpec| {
                if spec.job.name == "endless" {
                    *started.lock().unwrap() += 1;
                    loop {
                        pipewise_common::cancel::check()?;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                spec.validate().map_err(CoordinatorError::from)
            })
        };
        let (planner, _) = Actor::spawn(
            None,
            Planner,
            PlannerArgs {
                plan,
                concurrency: 1,
            },
        )
        .await
        .unwrap();
        // Two callers give up: the second while it waits for the slot the first holds, then
        // the first while its plan runs.
        let caller = || {
            let planner = planner.clone();
            tokio::spawn(
                async move { ractor::call!(planner, PlannerMsg::Plan, spec("endless", 2)) },
            )
        };
        let first = caller();
        until_held(&started, 1).await;
        let second = caller();
        // Time for the second request to reach the planner and wait for the slot.
        tokio::time::sleep(Duration::from_millis(200)).await;
        for gone in [second, first] {
            gone.abort();
            assert!(gone.await.unwrap_err().is_cancelled());
        }
        let fast = tokio::time::timeout(Duration::from_secs(30), async {
            ractor::call!(planner, PlannerMsg::Plan, spec("fast", 3))
        })
        .await
        .expect("the slot is free again")
        .unwrap()
        .unwrap();
        assert_eq!(fast.schedule.num_workers(), 3);
        assert_eq!(
            *started.lock().unwrap(),
            1,
            "the second endless plan never started"
        );
    }
}
