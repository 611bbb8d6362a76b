//! What the nodes of the process log, captured as the JSON lines `pipewise worker
//! --log-format json` writes (each with the fields of its enclosing spans: the job, the
//! worker), so that a scenario can check what a worker logged.
//!
//! Logging is the process's: [`capture`] installs the one subscriber every test of a test
//! binary shares, so a scenario picks the lines of its own jobs (their `job` span field).

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::Value;
use tracing_subscriber::filter::LevelFilter;

use crate::lock;

/// The log lines written since [`capture`] first ran in this process.
#[derive(Debug, Clone)]
pub struct Logs {
    written: Arc<Mutex<Vec<u8>>>,
}

/// Where the subscriber writes: one JSON object per line.
#[derive(Debug)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        lock(&self.0).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Captures every `info` and more severe line of this process from now on (the first
/// call installs the subscriber; later ones share it).
pub fn capture() -> Logs {
    static WRITTEN: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    let written = WRITTEN.get_or_init(|| {
        let written = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&written);
        let installed = tracing_subscriber::fmt()
            .with_max_level(LevelFilter::INFO)
            .with_ansi(false)
            .with_writer(move || Sink(Arc::clone(&sink)))
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .try_init();
        assert!(installed.is_ok(), "another subscriber logs this process");
        written
    });
    Logs {
        written: Arc::clone(written),
    }
}

impl Logs {
    /// Every line so far, parsed.
    pub fn lines(&self) -> Vec<Value> {
        let text = String::from_utf8_lossy(&lock(&self.written)).to_string();
        text.lines()
            .map(|l| serde_json::from_str(l).expect("a JSON log line"))
            .collect()
    }

    /// The lines so far logged inside job `job`'s span (by a worker running it).
    pub fn of_job(&self, job: u64) -> Vec<Value> {
        self.lines()
            .into_iter()
            .filter(|l| l["span"]["job"] == job)
            .collect()
    }
}
