//! The durable job store: one redb table, job id → JSON record, in the data directory, so a
//! restarted coordinator still lists every job.

use std::path::Path;

use redb::{Database, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use pipewise_common::job::{JobSpec, checkpoint_name, checkpoint_step};

use crate::error::{CoordinatorError, Result};
use crate::events::{Start, StepEvent};

const JOBS: TableDefinition<u64, &[u8]> = TableDefinition::new("jobs");

/// Life cycle of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobState {
    /// Accepted, waiting for workers or for the running job to finish.
    Queued,
    /// Steps are being driven.
    Running,
    /// All steps done.
    Succeeded,
    /// Stopped by an error.
    Failed,
    /// Stopped by the user.
    Cancelled,
}

impl JobState {
    /// Lower-case name (`queued`, `running`, …), as metrics label it.
    pub fn name(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    /// True once the job will not change any more.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }
}

/// What the store keeps about a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// Job id (1, 2, …).
    pub id: u64,
    /// `[job] name`.
    pub name: String,
    /// The spec as submitted (TOML, after overrides).
    pub spec_toml: String,
    /// Current state.
    pub state: JobState,
    /// Steps done.
    pub step: u64,
    /// Steps asked for.
    pub steps: u64,
    /// Loss of the last step, if any.
    pub last_loss: Option<f64>,
    /// Why it failed.
    pub error: String,
    /// The last checkpoint known to be complete (`step-K`; empty: none), where the job
    /// resumes after a coordinator restart.
    pub last_checkpoint: String,
    /// Coordinator restarts the job has been through (it resumes after each).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restarts: u64,
    /// What a running job waits for (e.g. "workers: 3 of 4 ready"); empty otherwise.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub waiting: String,
    /// What `schedule = "auto"` last chose and why; empty otherwise.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub plan_choice: String,
    /// The workers a running job holds; empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workers: Vec<String>,
}

/// What a starting coordinator does with the jobs its store holds as queued or running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unfinished {
    /// Plans them again and runs them, a running one from its last complete checkpoint.
    #[default]
    Resume,
    /// Marks them failed (`pipewise local`, which runs the one job it was given).
    Fail,
}

impl JobRecord {
    /// Job `id`, planned from `spec` and queued.
    pub fn queued(id: u64, spec: &JobSpec) -> Result<JobRecord> {
        Ok(JobRecord {
            id,
            name: spec.job.name.clone(),
            spec_toml: spec.to_toml()?,
            state: JobState::Queued,
            step: 0,
            steps: u64::from(spec.training.steps),
            last_loss: None,
            error: String::new(),
            last_checkpoint: String::new(),
            restarts: 0,
            waiting: String::new(),
            plan_choice: String::new(),
            workers: Vec::new(),
        })
    }

    /// A job the coordinator had queued or running when it stopped: queued in its place
    /// to be planned again from its stored spec (`Resume`; a running one resumes from its
    /// last complete checkpoint), or failed (`Fail`, or a spec that no longer reads). The
    /// spec, read here once, when the job is to be planned again; a job that was neither
    /// queued nor running is left as it is.
    pub fn after_restart(&mut self, unfinished: Unfinished) -> Option<JobSpec> {
        if self.state != JobState::Running && self.state != JobState::Queued {
            return None;
        }
        let failed = match JobSpec::from_toml(&self.spec_toml) {
            Ok(spec) if unfinished == Unfinished::Resume => {
                self.state = JobState::Queued;
                self.restarts += 1;
                self.waiting = "its plan again (the coordinator restarted)".into();
                return Some(spec);
            }
            Ok(_) => "the coordinator restarted before the job finished".to_string(),
            Err(e) => format!(
                "the coordinator restarted before the job finished, and its stored spec no \
                 longer reads: {e}"
            ),
        };
        self.state = JobState::Failed;
        self.error = failed;
        self.waiting.clear();
        None
    }

    /// Where a job planned again after a restart starts: its last complete checkpoint.
    pub fn resumed_start(&self) -> Start {
        Start {
            step: checkpoint_step(&self.last_checkpoint).unwrap_or(0),
            restarts: self.restarts,
            through: self.step,
        }
    }

    /// Takes a step's event: the step, its loss, the checkpoint and the plan choice; the
    /// job waits no longer. Whether the checkpoint a restart resumes from moved.
    pub fn take_step(&mut self, event: &StepEvent) -> bool {
        self.step = event.step;
        self.last_loss = Some(event.loss);
        let before = self.last_checkpoint.clone();
        if event.checkpoint > 0 {
            self.last_checkpoint = checkpoint_name(event.checkpoint);
        }
        self.waiting.clear();
        if !event.plan_choice.is_empty() {
            self.plan_choice.clone_from(&event.plan_choice);
        }
        self.last_checkpoint != before
    }

    /// The job ended with `outcome`: cancelled (before its last step), succeeded or failed.
    pub fn end(&mut self, outcome: &Result<()>, cancelled: bool) {
        self.waiting.clear();
        self.workers.clear();
        match outcome {
            Ok(()) if cancelled && self.step < self.steps => self.state = JobState::Cancelled,
            Ok(()) => self.state = JobState::Succeeded,
            Err(e) => {
                self.state = JobState::Failed;
                self.error = e.to_string();
            }
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The store (a redb database file `jobs.redb` in the data directory).
pub struct JobStore {
    db: Database,
    dir: std::path::PathBuf,
}

fn store_err(e: impl std::fmt::Display) -> CoordinatorError {
    CoordinatorError::Store(e.to_string())
}

thread_local! {
    /// Whether this thread's panics are caught by [`catch_quietly`] (not printed).
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// [`std::panic::catch_unwind`] without the panic hook's message for panics of `f` (the
/// caller reports them). The first call wraps the process's panic hook, once, in one that
/// stays silent on threads inside this function and calls the previous hook otherwise.
fn catch_quietly<T>(f: impl FnOnce() -> T + std::panic::UnwindSafe) -> std::thread::Result<T> {
    static WRAP: std::sync::Once = std::sync::Once::new();
    WRAP.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(std::cell::Cell::get) {
                previous(info);
            }
        }));
    });
    QUIET.with(|q| q.set(true));
    let caught = std::panic::catch_unwind(f);
    QUIET.with(|q| q.set(false));
    caught
}

/// The store's file in the coordinator's data directory (no job's folder may be it).
pub(crate) const STORE_FILE: &str = "jobs.redb";

impl JobStore {
    /// Opens (or creates) the store in `dir`.
    pub fn open(dir: &Path) -> Result<JobStore> {
        std::fs::create_dir_all(dir).map_err(|e| {
            CoordinatorError::Store(format!(
                "cannot create data directory {}: {e}",
                dir.display()
            ))
        })?;
        let path = dir.join(STORE_FILE);
        let named = |e: String| CoordinatorError::Store(format!("{}: {e}", path.display()));
        // redb asserts on some damaged files (one cut short by a crash or a full disk)
        // rather than returning an error: that is an error naming the file here, not a panic
        // of the coordinator (nor the assertion's text on stderr before the error).
        let opened = catch_quietly(|| Database::create(&path)).map_err(|panic| {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_string()))
                .unwrap_or_default();
            named(format!(
                "the job store is damaged (truncated?): {what}; move it away to start with \
                 an empty one"
            ))
        })?;
        let db = opened.map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => named(
                "the job store is in use by another coordinator (give each its own \
                 --data-dir)"
                    .into(),
            ),
            other => named(other.to_string()),
        })?;
        let txn = db.begin_write().map_err(store_err)?;
        txn.open_table(JOBS).map_err(store_err)?;
        txn.commit().map_err(store_err)?;
        Ok(JobStore {
            db,
            dir: dir.to_path_buf(),
        })
    }

    /// The data directory the store is in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Inserts or replaces a record (durable on return).
    pub fn put(&self, record: &JobRecord) -> Result<()> {
        let bytes = serde_json::to_vec(record).map_err(store_err)?;
        let txn = self.db.begin_write().map_err(store_err)?;
        {
            let mut table = txn.open_table(JOBS).map_err(store_err)?;
            table
                .insert(record.id, bytes.as_slice())
                .map_err(store_err)?;
        }
        txn.commit().map_err(store_err)
    }

    /// Every record, by id.
    pub fn list(&self) -> Result<Vec<JobRecord>> {
        let txn = self.db.begin_read().map_err(store_err)?;
        let table = txn.open_table(JOBS).map_err(store_err)?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(store_err)? {
            let (_, value) = entry.map_err(store_err)?;
            out.push(serde_json::from_slice(value.value()).map_err(store_err)?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store in use or cut short is an error naming the file (a short one used to panic
    /// the coordinator inside redb).
    #[test]
    fn a_store_in_use_or_cut_short_is_refused_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = JobStore::open(dir.path()).expect("opens");
        let err = JobStore::open(dir.path())
            .err()
            .expect("in use")
            .to_string();
        assert!(err.contains("jobs.redb") && err.contains("in use"), "{err}");
        drop(store);
        let path = dir.path().join("jobs.redb");
        let bytes = std::fs::read(&path).expect("reads");
        std::fs::write(&path, &bytes[..10_000]).expect("writes");
        let err = JobStore::open(dir.path())
            .err()
            .expect("damaged")
            .to_string();
        assert!(
            err.contains("jobs.redb") && err.contains("damaged"),
            "{err}"
        );
    }

    #[test]
    fn records_survive_reopening() {
        let dir = tempfile::tempdir().expect("tempdir");
        let record = JobRecord {
            id: 7,
            name: "a".into(),
            spec_toml: "x".into(),
            state: JobState::Queued,
            step: 0,
            steps: 5,
            last_loss: None,
            error: String::new(),
            last_checkpoint: String::new(),
            restarts: 0,
            waiting: "workers: 1 of 2 ready".into(),
            plan_choice: String::new(),
            workers: Vec::new(),
        };
        {
            let store = JobStore::open(dir.path()).expect("opens");
            store.put(&record).expect("puts");
            store
                .put(&JobRecord {
                    state: JobState::Running,
                    ..record.clone()
                })
                .expect("replaces");
        }
        let store = JobStore::open(dir.path()).expect("reopens");
        let all = store.list().expect("lists");
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].state, JobState::Running);
    }
}
