//! The planner actor: validates a job spec and plans its schedule with the pure core, off
//! the async runtime (planning a large adaptive schedule takes seconds).
//!
//! Several submissions plan at once, up to [`PlannerArgs::concurrency`]: a small job
//! submitted behind a slow adaptive plan is not held up by it. Further requests wait for a
//! free slot.

use std::sync::Arc;

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
            let planned = match slots.acquire_owned().await {
                Ok(slot) => tokio::task::spawn_blocking(move || {
                    let _slot = slot;
                    plan(*spec)
                })
                .await
                .map_err(|e| CoordinatorError::Actor(format!("planning task: {e}")))
                .and_then(|r| r),
                Err(e) => Err(CoordinatorError::Actor(format!("planner closed: {e}"))),
            };
            // The caller may have gone away; nothing to do then.
            let _ = reply.send(planned);
        });
        Ok(())
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

    /// Waits until `count` plans are held at the gate.
    async fn until_held(waiting: &Mutex<usize>, count: usize) {
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
}
