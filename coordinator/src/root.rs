//! The coordinator's root actor: the supervisor of its long-lived actors. It spawns the
//! planner, the membership actor and the job manager linked to itself, so none of them
//! ends unseen. Each holds the others' addresses and the cluster's live state (who is
//! registered, which runs are out), which a restarted one would not have: when one of
//! them fails or stops while the coordinator runs, the root logs why, stops the others
//! and itself, and says so ([`RootArgs::ended`]): the coordinator stops, visibly, rather
//! than serving on without it. A restarted coordinator resumes the jobs from the store.

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::sync::watch;

use crate::job_manager::{JobManager, JobManagerArgs, Unfinished};
use crate::job_msg::JobMsg;
use crate::membership::{Membership, MembershipMsg};
use crate::planner::{Planner, PlannerArgs};
use crate::store::JobStore;

/// The root actor.
pub(crate) struct Root;

/// What the root starts with.
pub(crate) struct RootArgs {
    /// The durable store.
    pub(crate) store: JobStore,
    /// The data directory.
    pub(crate) data_dir: std::path::PathBuf,
    /// What becomes of the jobs the store holds as queued or running.
    pub(crate) unfinished: Unfinished,
    /// Set to why the coordinator stopped when one of its actors ended.
    pub(crate) ended: watch::Sender<Option<String>>,
    /// The actors' time.
    pub(crate) clock: crate::clock::Clock,
}

/// The root's children, in the order they stop.
#[derive(Clone)]
pub(crate) struct Children {
    /// The job manager.
    pub(crate) jobs: ActorRef<JobMsg>,
    /// The membership actor.
    pub(crate) membership: ActorRef<MembershipMsg>,
    /// The planner.
    pub(crate) planner: ActorCell,
}

impl Children {
    fn named(&self) -> [(&'static str, ActorCell); 3] {
        [
            ("job manager", self.jobs.get_cell()),
            ("membership", self.membership.get_cell()),
            ("planner", self.planner.clone()),
        ]
    }
}

/// The root's state.
pub(crate) struct RootState {
    children: Children,
    ended: watch::Sender<Option<String>>,
}

/// Messages of the root.
pub(crate) enum RootMsg {
    /// Its children.
    Children(RpcReplyPort<Children>),
}

impl Actor for Root {
    type Msg = RootMsg;
    type State = RootState;
    type Arguments = RootArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<RootMsg>,
        args: RootArgs,
    ) -> Result<RootState, ActorProcessingErr> {
        let me = myself.get_cell();
        let (planner, _) =
            Actor::spawn_linked(None, Planner, PlannerArgs::default(), me.clone()).await?;
        let (membership, _) =
            Actor::spawn_linked(None, Membership, args.clock.clone(), me.clone()).await?;
        let manager = JobManagerArgs {
            store: args.store,
            planner: planner.clone(),
            membership: membership.clone(),
            data_dir: args.data_dir,
            unfinished: args.unfinished,
            clock: args.clock,
        };
        let (jobs, _) = Actor::spawn_linked(None, JobManager, manager, me).await?;
        let children = Children {
            jobs,
            membership,
            planner: planner.get_cell(),
        };
        Ok(RootState {
            children,
            ended: args.ended,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<RootMsg>,
        msg: RootMsg,
        state: &mut RootState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            RootMsg::Children(reply) => {
                let _ = reply.send(state.children.clone());
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<RootMsg>,
        event: SupervisionEvent,
        state: &mut RootState,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, what) = match event {
            SupervisionEvent::ActorFailed(cell, e) => (cell, format!("failed: {e}")),
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                let why = reason.map_or(String::new(), |r| format!(": {r}"));
                (cell, format!("stopped{why}"))
            }
            _ => return Ok(()),
        };
        let Some((name, _)) = state
            .children
            .named()
            .into_iter()
            .find(|(_, child)| child.get_id() == cell.get_id())
        else {
            return Ok(());
        };
        let why = format!("the coordinator's {name} actor {what}");
        tracing::error!("{why}; the coordinator stops (jobs resume at its next start)");
        let _ = state.ended.send(Some(why.clone()));
        myself.stop(Some(why));
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<RootMsg>,
        state: &mut RootState,
    ) -> Result<(), ActorProcessingErr> {
        // The job manager first: nothing new starts while the others stop.
        for (_, child) in state.children.named() {
            // One that already ended cannot be sent the stop: nothing to wait for.
            let _ = child.stop_and_wait(None, None).await;
        }
        Ok(())
    }
}
