//! The planner actor: validates a job spec and plans its schedule with the pure core, off
//! the async runtime (planning a large adaptive schedule takes seconds).

use pipewise_common::job::{JobPlan, JobSpec};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::error::{CoordinatorError, Result};

/// The planner.
pub struct Planner;

/// Messages of the planner.
pub enum PlannerMsg {
    /// Validate and plan a job.
    Plan(Box<JobSpec>, RpcReplyPort<Result<JobPlan>>),
}

impl Actor for Planner {
    type Msg = PlannerMsg;
    type State = ();
    type Arguments = ();

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        _args: (),
    ) -> std::result::Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        _state: &mut (),
    ) -> std::result::Result<(), ActorProcessingErr> {
        match msg {
            PlannerMsg::Plan(spec, reply) => {
                let planned = tokio::task::spawn_blocking(move || spec.validate())
                    .await
                    .map_err(|e| CoordinatorError::Actor(format!("planning task: {e}")))
                    .and_then(|r| r.map_err(CoordinatorError::from));
                // The caller may have gone away; nothing to do then.
                let _ = reply.send(planned);
            }
        }
        Ok(())
    }
}
