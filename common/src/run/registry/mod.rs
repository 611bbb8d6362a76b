//! The registry of worker processes, without I/O: registrations, heartbeats and their
//! expiry on logical time (milliseconds, given with every call), assignment streams opened
//! and closed, which job holds which worker (claims), and what a run's workers are told
//! (stop, abandon). Each call answers at once and leaves [`Action`]s for the coordinator's
//! membership actor to carry out ([`Registry::actions`]): inputs to tell every run actor,
//! streams to drop, abandons to push, the pool the job scheduler sees, log notes and gauges.

use std::collections::{BTreeMap, BTreeSet};

use super::supervisor::{Input, Member, Taken};
use super::worker::Worker;

/// Heartbeat interval handed to workers, milliseconds.
pub const HEARTBEAT_MS: u64 = 500;
/// A worker silent for this many intervals is lost.
pub const MISSED_HEARTBEATS: u32 = 4;
/// A worker silent this long is forgotten (a lost one is noticed after
/// [`MISSED_HEARTBEATS`] intervals; this only bounds the registry), milliseconds.
pub const FORGET_AFTER_MS: u64 = 600_000;

/// The registry's timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Heartbeat interval, milliseconds.
    pub heartbeat_ms: u64,
    /// Intervals a worker may miss before it is lost.
    pub missed_heartbeats: u32,
    /// Silence after which a worker is forgotten, milliseconds.
    pub forget_after_ms: u64,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            heartbeat_ms: HEARTBEAT_MS,
            missed_heartbeats: MISSED_HEARTBEATS,
            forget_after_ms: FORGET_AFTER_MS,
        }
    }
}

impl Config {
    /// How long a worker may stay silent and still be live, milliseconds.
    pub fn deadline_ms(&self) -> u64 {
        self.heartbeat_ms * u64::from(self.missed_heartbeats)
    }
}

/// Why a registration was refused: a live worker at another address holds the id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InUse {
    /// The holder's address.
    pub address: String,
    /// How long ago the holder was last heard of, milliseconds.
    pub ago_ms: u64,
}

/// The answer to a step report of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportAnswer {
    /// Stop at the next step boundary (a cancel, or a re-plan between steps).
    pub stop: bool,
    /// Abandon the run now: it was aborted, or this coordinator did not start it.
    pub abort: bool,
    /// The run's reports go to its run actor (it is attached).
    pub routed: bool,
}

/// The workers a job scheduler may start jobs on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Pool {
    /// Live workers with their assignment stream open.
    pub streaming: usize,
    /// Of those, the ones no job holds, by id.
    pub idle: Vec<Worker>,
}

/// A worker's memory as a run's metrics show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Memory {
    /// The run it was assigned.
    pub run: u64,
    /// Its replica there.
    pub replica: u32,
    /// Its index there.
    pub index: u32,
    /// Activation bytes held (last heartbeat).
    pub bytes: u64,
    /// The memory it registered (0: not given).
    pub limit: u64,
}

/// What the registry shows on every tick.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Gauges {
    /// Every known worker and the seconds since it was last heard of.
    pub ages: Vec<(String, f64)>,
    /// Live workers.
    pub up: usize,
    /// Live workers no job holds.
    pub idle: usize,
    /// Live workers a job holds.
    pub busy: usize,
    /// The memory of the workers of attached runs.
    pub memory: Vec<Memory>,
}

/// A line for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// A worker registered; `was`: the address of an earlier process under its id.
    Registered {
        /// Worker id.
        id: String,
        /// Its address.
        address: String,
        /// The earlier process's address, if one was known.
        was: Option<String>,
    },
    /// A registration was refused: the id is in use by the worker at `holder`.
    Refused {
        /// Worker id.
        id: String,
        /// The refused process's address.
        address: String,
        /// The holder's address.
        holder: String,
    },
    /// A worker left, having abandoned `run` (0: none).
    Left {
        /// Worker id.
        id: String,
        /// The run it abandoned.
        run: u64,
    },
    /// A worker the registry does not know said it leaves.
    UnknownLeft(String),
    /// A worker was forgotten after [`Config::forget_after_ms`] of silence.
    Forgotten(String),
}

/// What the registry asks of the membership actor.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Tell every run actor that follows the workers.
    Tell(Input),
    /// Drop the worker's assignment stream (a later process opens its own).
    CloseStream(String),
    /// Push down the worker's assignment stream that it abandon `run` now.
    Abandon {
        /// Worker id.
        worker: String,
        /// The run.
        run: u64,
    },
    /// The pool the job scheduler sees changed.
    Pool(Pool),
    /// A line for the log.
    Note(Note),
    /// A worker's memory, for the metrics.
    Memory(Memory),
    /// The gauges, every tick.
    Gauges(Box<Gauges>),
}

/// What the registry keeps of a worker.
#[derive(Debug, Clone)]
struct Entry {
    worker: Worker,
    /// When it was last heard of.
    last_seen: u64,
    /// Activation bytes held (last heartbeat).
    bytes: u64,
    /// The run it said it runs (0: none).
    running: u64,
    /// Its assignment stream is open.
    streaming: bool,
    /// The run actors were told it was lost (and are told again if it comes back).
    lost: bool,
}

/// The registry (see the [module docs](self)).
#[derive(Debug, Default)]
pub struct Registry {
    cfg: Config,
    workers: BTreeMap<String, Entry>,
    /// Worker id → the run it was last assigned, its replica and its index there.
    assigned: BTreeMap<String, (u64, u32, u32)>,
    /// Worker id → the job holding it (from the job's claim until it ends).
    claims: BTreeMap<String, u64>,
    /// Runs whose step reports go to their run actor.
    attached: BTreeSet<u64>,
    /// Every run this coordinator started. A worker still running another one runs it for
    /// an earlier coordinator (this one restarted since, and runs that job again under new
    /// run ids if it resumes it): it is told to abandon that run, so it writes nothing
    /// more for it.
    started: BTreeSet<u64>,
    /// Runs whose workers stop at the next step boundary.
    stopping: BTreeSet<u64>,
    /// Runs whose workers abandon them at once.
    aborted: BTreeSet<u64>,
    /// Registrations so far (the last one's incarnation).
    registrations: u64,
    /// The pool last told.
    pool: Option<Pool>,
    now: u64,
    out: Vec<Action>,
}

impl Registry {
    /// An empty registry with `cfg`'s timing.
    pub fn new(cfg: Config) -> Registry {
        Registry {
            cfg,
            ..Registry::default()
        }
    }

    /// The actions left by the calls so far, in order.
    pub fn actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.out)
    }

    fn at(&mut self, now: u64) {
        self.now = self.now.max(now);
    }

    fn tell(&mut self, input: Input) {
        self.out.push(Action::Tell(input));
    }

    fn silent_ms(&self, e: &Entry) -> u64 {
        self.now.saturating_sub(e.last_seen)
    }

    fn is_live(&self, e: &Entry) -> bool {
        self.silent_ms(e) <= self.cfg.deadline_ms()
    }

    /// The workers alive now, with whose each is.
    pub fn live(&mut self, now: u64) -> Vec<Member> {
        self.at(now);
        self.workers
            .values()
            .filter(|e| self.is_live(e))
            .map(|e| Member {
                worker: e.worker.clone(),
                streaming: e.streaming,
                running: e.running,
                claimed: self.claims.get(&e.worker.id).copied().unwrap_or(0),
            })
            .collect()
    }

    /// The pool now (as the scheduler was last told it, or is told next).
    pub fn pool(&mut self, now: u64) -> Pool {
        self.at(now);
        let pool = self.current_pool();
        self.pool = Some(pool.clone());
        pool
    }

    /// Tells the scheduler the pool if it changed.
    fn pool_changed(&mut self) {
        let pool = self.current_pool();
        if self.pool.as_ref() != Some(&pool) {
            self.pool = Some(pool.clone());
            self.out.push(Action::Pool(pool));
        }
    }

    fn current_pool(&mut self) -> Pool {
        let live = self.live(self.now);
        let streaming: Vec<&Member> = live.iter().filter(|m| m.streaming).collect();
        Pool {
            streaming: streaming.len(),
            idle: streaming
                .iter()
                .filter(|m| m.claimed == 0)
                .map(|m| m.worker.clone())
                .collect(),
        }
    }

    /// Tells the run actors which job holds worker `id`, if one does (a worker that comes
    /// back is a new member of their pools, held as before).
    fn tell_claim(&mut self, id: &str) {
        if let Some(&job) = self.claims.get(id) {
            self.tell(Input::Claimed {
                id: id.to_string(),
                job,
            });
        }
    }

    /// `worker` registers (again) at `now`, running `running` (0: nothing) until its first
    /// heartbeat says otherwise; its incarnation, or why not: another process under a live
    /// worker's id would take its place and its assignments (the coordinator's own restart,
    /// or the same worker coming back at its address or after its stream closed, registers
    /// again as usual).
    pub fn register(&mut self, now: u64, worker: Worker, running: u64) -> Result<u64, InUse> {
        self.at(now);
        let id = worker.id.clone();
        let earlier = self.workers.get(&id).cloned();
        if let Some(old) = &earlier
            && old.worker.address != worker.address
            && old.streaming
            && self.is_live(old)
        {
            self.out.push(Action::Note(Note::Refused {
                id,
                address: worker.address,
                holder: old.worker.address.clone(),
            }));
            return Err(InUse {
                address: old.worker.address.clone(),
                ago_ms: self.silent_ms(old),
            });
        }
        self.registrations += 1;
        let worker = Worker {
            incarnation: self.registrations,
            ..worker
        };
        // A registration starts afresh: the process opens its own stream next. An earlier
        // process's stream may not look closed yet, and an assignment sent down it would
        // be lost (the run then waited for that worker until the peers' frame timeout).
        if earlier.is_some() {
            self.out.push(Action::CloseStream(id.clone()));
        }
        self.out.push(Action::Note(Note::Registered {
            id: id.clone(),
            address: worker.address.clone(),
            was: earlier.map(|e| e.worker.address),
        }));
        // The earlier process under this id is gone: a run holding it sees a lost worker
        // (its supervisor tells incarnations apart).
        self.tell(Input::Registered(worker.clone()));
        self.tell_claim(&id);
        let entry = Entry {
            worker,
            last_seen: self.now,
            bytes: 0,
            running,
            streaming: false,
            lost: false,
        };
        self.workers.insert(id, entry);
        self.pool_changed();
        Ok(self.registrations)
    }

    /// Worker `id` heartbeats at `now`, running `run` (0: nothing) and holding `bytes` of
    /// activations; whether it is known (else it must register), and the run it must
    /// abandon now, if any.
    pub fn heartbeat(&mut self, now: u64, id: &str, run: u64, bytes: u64) -> (bool, Option<u64>) {
        self.at(now);
        let now = self.now;
        let Some(e) = self.workers.get_mut(id) else {
            return (false, self.abandons(run).then_some(run));
        };
        e.last_seen = now;
        e.bytes = bytes;
        e.running = run;
        let back = std::mem::replace(&mut e.lost, false);
        let (worker, streaming) = (e.worker.clone(), e.streaming);
        if back {
            // Back after it was reported lost: a worker again.
            self.tell(Input::Registered(worker));
            self.tell_claim(id);
            if streaming {
                self.tell(Input::StreamOpened(id.to_string()));
            }
        }
        self.tell(Input::Heartbeat {
            id: id.to_string(),
            run,
        });
        self.pool_changed();
        (true, self.abandons(run).then_some(run))
    }

    /// Worker `id` opens its assignment stream (replacing an older one); false if it is
    /// not registered.
    pub fn open_stream(&mut self, now: u64, id: &str) -> bool {
        self.at(now);
        let Some(e) = self.workers.get_mut(id) else {
            return false;
        };
        e.streaming = true;
        self.tell(Input::StreamOpened(id.to_string()));
        self.pool_changed();
        true
    }

    /// Worker `id`'s assignment stream closed.
    pub fn stream_closed(&mut self, now: u64, id: &str) {
        self.at(now);
        if let Some(e) = self.workers.get_mut(id)
            && std::mem::replace(&mut e.streaming, false)
        {
            self.tell(Input::StreamClosed(id.to_string()));
            self.pool_changed();
        }
    }

    /// Worker `id` took its assignment: worker `index` of replica `replica` of `run`. It
    /// starts holding no activations; heartbeats update that.
    pub fn assigned(&mut self, id: &str, run: u64, replica: u32, index: u32) {
        let limit = self.workers.get(id).map_or(0, |e| e.worker.memory_bytes);
        self.assigned.insert(id.to_string(), (run, replica, index));
        self.out.push(Action::Memory(Memory {
            run,
            replica,
            index,
            bytes: 0,
            limit,
        }));
    }

    /// Makes `ids` job `job`'s workers, and only those (its earlier ones go back), unless
    /// another job holds one of them; the run actors hear of each change.
    pub fn claim(&mut self, job: u64, ids: &[String]) -> Result<(), Taken> {
        let taken: Vec<(String, u64)> = ids
            .iter()
            .filter_map(|id| match self.claims.get(id) {
                Some(&other) if other != job => Some((id.clone(), other)),
                _ => None,
            })
            .collect();
        if !taken.is_empty() {
            return Err(Taken(taken));
        }
        self.give_back(job, ids);
        for id in ids {
            if self.claims.insert(id.clone(), job) != Some(job) {
                self.tell(Input::Claimed {
                    id: id.clone(),
                    job,
                });
            }
        }
        self.pool_changed();
        Ok(())
    }

    /// Job `job` is over: its workers go back.
    pub fn release(&mut self, job: u64) {
        self.give_back(job, &[]);
        self.pool_changed();
    }

    /// Job `job`'s workers other than `keep` go back (are idle again).
    fn give_back(&mut self, job: u64, keep: &[String]) {
        let gone: Vec<String> = self
            .claims
            .iter()
            .filter(|(id, j)| **j == job && !keep.contains(id))
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            self.claims.remove(&id);
            self.tell(Input::Claimed { id, job: 0 });
        }
    }

    /// Run `run` is this coordinator's, and its workers' reports go to its run actor.
    pub fn attach(&mut self, run: u64) {
        self.started.insert(run);
        self.attached.insert(run);
    }

    /// Run `run` is over: its reports are no longer routed.
    pub fn detach(&mut self, run: u64) {
        self.attached.remove(&run);
    }

    /// What a worker's step report of `run` is answered. An abandoned run ends at once and
    /// writes nothing more (a graceful stop would save a checkpoint and final parameters
    /// for a run nobody follows).
    pub fn report(&self, run: u64) -> ReportAnswer {
        let abort = self.abandons(run);
        ReportAnswer {
            stop: !abort && self.stopping.contains(&run),
            abort,
            routed: self.attached.contains(&run),
        }
    }

    /// Run `run`'s workers stop at the next step boundary.
    pub fn stop(&mut self, run: u64) {
        self.stopping.insert(run);
    }

    /// Run `run`'s workers abandon it now: pushed down their streams (their heartbeat
    /// replies say so too, up to an interval later). Their reports of leaving it are still
    /// routed until it is detached: a job shedding a replica reads them.
    pub fn abort(&mut self, run: u64) {
        self.aborted.insert(run);
        let told: Vec<Action> = self
            .assigned
            .iter()
            .filter(|(_, (r, ..))| *r == run)
            .map(|(id, _)| Action::Abandon {
                worker: id.clone(),
                run,
            })
            .collect();
        self.out.extend(told);
    }

    /// Whether the workers of `run` should abandon it now: it was aborted, or it is not one
    /// this coordinator started (0 is no run).
    fn abandons(&self, run: u64) -> bool {
        run != 0 && (self.aborted.contains(&run) || !self.started.contains(&run))
    }

    /// Worker `id` leaves (it was asked to stop), having abandoned `run` (0: none): it is
    /// forgotten, and the run actors are told at once.
    pub fn leave(&mut self, id: &str, run: u64) {
        if self.workers.remove(id).is_none() {
            self.out
                .push(Action::Note(Note::UnknownLeft(id.to_string())));
            return;
        }
        self.out.push(Action::Note(Note::Left {
            id: id.to_string(),
            run,
        }));
        self.out.push(Action::CloseStream(id.to_string()));
        self.assigned.remove(id);
        self.claims.remove(id);
        self.tell(Input::Left(id.to_string()));
        self.pool_changed();
    }

    /// Time passed: workers silent for [`Config::forget_after_ms`] are forgotten (they
    /// register again if they come back, so registrations under ever new ids do not pile
    /// up), the ones silent past the deadline are lost (told once each), and the gauges are
    /// shown.
    pub fn tick(&mut self, now: u64) {
        self.at(now);
        let forgotten: Vec<String> = self
            .workers
            .values()
            .filter(|e| self.silent_ms(e) >= self.cfg.forget_after_ms)
            .map(|e| e.worker.id.clone())
            .collect();
        for id in forgotten {
            if self.workers.remove(&id).is_some_and(|e| !e.lost) {
                self.tell(Input::Lost(id.clone()));
            }
            self.assigned.remove(&id);
            self.claims.remove(&id);
            self.out.push(Action::Note(Note::Forgotten(id.clone())));
            self.out.push(Action::CloseStream(id));
        }
        let lost: Vec<String> = self
            .workers
            .values()
            .filter(|e| !e.lost && !self.is_live(e))
            .map(|e| e.worker.id.clone())
            .collect();
        for id in lost {
            if let Some(e) = self.workers.get_mut(&id) {
                e.lost = true;
            }
            self.tell(Input::Lost(id));
        }
        let gauges = self.gauges();
        self.out.push(Action::Gauges(Box::new(gauges)));
        self.pool_changed();
    }

    fn gauges(&mut self) -> Gauges {
        let ages = self
            .workers
            .values()
            .map(|e| (e.worker.id.clone(), self.silent_ms(e) as f64 / 1e3))
            .collect();
        let live = self.live(self.now);
        let busy = live.iter().filter(|m| m.claimed != 0).count();
        // Only the workers of a run still attached: a finished run's indices are left to
        // the exporter's expiry.
        let memory = self
            .workers
            .values()
            .filter_map(|e| {
                let &(run, replica, index) = self.assigned.get(&e.worker.id)?;
                self.attached.contains(&run).then_some(Memory {
                    run,
                    replica,
                    index,
                    bytes: e.bytes,
                    limit: e.worker.memory_bytes,
                })
            })
            .collect();
        Gauges {
            ages,
            up: live.len(),
            idle: live.len() - busy,
            busy,
            memory,
        }
    }
}

#[cfg(test)]
mod tests;
