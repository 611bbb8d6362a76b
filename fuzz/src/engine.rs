//! The engine: cases drawn from a seed under a case or time budget, each run with its
//! panics (on any thread) and hangs caught, and a report of what the cases did.
//!
//! Without a budget in the environment a target runs the fixed number of cases it asks for
//! from its fixed seed: the same cases on every machine however loaded (a time budget
//! would run fewer where the machine is busy), so `cargo test` checks the same inputs each
//! time. Long runs set `PIPEWISE_FUZZ_SECS` (and a random seed).
//!
//! A case is a byte string derived from `(seed, case index)` alone, read through
//! [`arbitrary::Unstructured`] by the target's generator, so any case replays from its two
//! numbers (`PIPEWISE_FUZZ_SEED`, `PIPEWISE_FUZZ_CASE`). There is no coverage feedback
//! (that needs a nightly compiler's instrumentation); the generators are structure-aware
//! instead: they start from valid inputs and mutate them.

use std::collections::BTreeMap;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arbitrary::Unstructured;

/// What one case did: `Ok(outcome)` names the kind of result (counted in the report, e.g.
/// `"planned 1f1b"` or `"refused model.heads"`); `Err` is a broken property.
pub type Verdict = Result<String, Error>;

/// The one error type of `pipewise-fuzz`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A case broke a property: what was expected, and what happened.
    #[error("{0}")]
    Broken(String),
    /// An environment variable of [`Settings`] holds no valid value.
    #[error("{name}={value:?}: expected {expected}")]
    Setting {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What it should hold.
        expected: &'static str,
    },
}

impl From<String> for Error {
    fn from(why: String) -> Self {
        Error::Broken(why)
    }
}

impl From<&str> for Error {
    fn from(why: &str) -> Self {
        Error::Broken(why.to_string())
    }
}

/// A case running longer than this many seconds is a hang (unless overridden).
pub const DEFAULT_HANG_SECS: f64 = 30.0;

/// The largest case input, in bytes.
pub const MAX_INPUT: usize = 4096;

/// How long to run, from which seed, and what counts as a hang.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Stop after this many seconds (`PIPEWISE_FUZZ_SECS`).
    pub secs: Option<f64>,
    /// Stop after this many cases (`PIPEWISE_FUZZ_CASES`).
    pub cases: Option<u64>,
    /// The seed every case derives from (`PIPEWISE_FUZZ_SEED`: a number, or `random`).
    pub seed: u64,
    /// Run only this case (`PIPEWISE_FUZZ_CASE`), to replay a failure.
    pub only: Option<u64>,
    /// A case running longer is a hang (`PIPEWISE_FUZZ_HANG_SECS`).
    pub hang: Duration,
    /// Print every case's outcome (`PIPEWISE_FUZZ_VERBOSE=1`).
    pub verbose: bool,
}

impl Settings {
    /// The settings in the environment; without a time or case budget, `default_cases`
    /// cases, and without a seed, one fixed per target (so CI runs the same cases).
    pub fn from_env(target: &str, default_cases: u64) -> Result<Settings, Error> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let bad = |name: &'static str, value: &str, expected: &'static str| Error::Setting {
            name,
            value: value.to_string(),
            expected,
        };
        let number = |name: &'static str| -> Result<Option<f64>, Error> {
            var(name)
                .map(|v| {
                    v.trim()
                        .parse::<f64>()
                        .ok()
                        .filter(|x| x.is_finite() && *x >= 0.0)
                        .ok_or_else(|| bad(name, &v, "a number ≥ 0"))
                })
                .transpose()
        };
        let whole = |name: &'static str| -> Result<Option<u64>, Error> {
            var(name)
                .map(|v| parse_u64(&v).ok_or_else(|| bad(name, &v, "a whole number")))
                .transpose()
        };
        let secs = number("PIPEWISE_FUZZ_SECS")?;
        let mut cases = whole("PIPEWISE_FUZZ_CASES")?;
        if secs.is_none() && cases.is_none() {
            cases = Some(default_cases);
        }
        let seed = match var("PIPEWISE_FUZZ_SEED") {
            None => fnv1a(target.as_bytes()),
            Some(v) if v.trim() == "random" => {
                let nanos = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64);
                splitmix(nanos ^ u64::from(std::process::id()))
            }
            Some(v) => {
                parse_u64(&v).ok_or_else(|| bad("PIPEWISE_FUZZ_SEED", &v, "a number or random"))?
            }
        };
        let hang = number("PIPEWISE_FUZZ_HANG_SECS")?.unwrap_or(DEFAULT_HANG_SECS);
        Ok(Settings {
            secs,
            cases,
            seed,
            only: whole("PIPEWISE_FUZZ_CASE")?,
            hang: Duration::from_secs_f64(hang.max(0.1)),
            verbose: var("PIPEWISE_FUZZ_VERBOSE").is_some_and(|v| v.trim() != "0"),
        })
    }
}

/// A decimal or `0x` hexadecimal number.
fn parse_u64(text: &str) -> Option<u64> {
    let text = text.trim();
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// One step of SplitMix64: a well-mixed 64-bit value of `x`.
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The input of case `index` of `seed`: up to [`MAX_INPUT`] bytes, a fixed function of the
/// two numbers.
pub fn case_input(seed: u64, index: u64) -> Vec<u8> {
    let mut state = splitmix(seed ^ splitmix(index));
    let mut next = || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        splitmix(state)
    };
    // Short inputs often: small cases reach the early checks, long ones the deep paths.
    let len = match next() % 4 {
        0 => next() % 64,
        1 => next() % 512,
        _ => next() % (MAX_INPUT as u64 + 1),
    } as usize;
    let mut bytes = Vec::with_capacity(len + 8);
    while bytes.len() < len {
        bytes.extend_from_slice(&next().to_le_bytes());
    }
    bytes.truncate(len);
    bytes
}

/// Panics seen on any thread since the hook was installed, and the first one's text.
static PANICS: AtomicU64 = AtomicU64::new(0);
static FIRST_PANIC: Mutex<Option<String>> = Mutex::new(None);

/// Counts every panic (a server task's too) and keeps the first one's message and place.
fn install_panic_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        panic::set_hook(Box::new(|info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            let mut first = FIRST_PANIC
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if first.is_none() {
                let message = info
                    .payload()
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_string())
                    .or_else(|| info.payload().downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "(no message)".into());
                let place = info
                    .location()
                    .map_or(String::new(), |l| format!(" at {}:{}", l.file(), l.line()));
                let thread = thread::current().name().unwrap_or("unnamed").to_string();
                *first = Some(format!("{message}{place} (thread {thread})"));
            }
        }));
    });
}

/// Ends the process when a case runs past the hang limit (a hung case never returns, so
/// the test could not fail otherwise), naming the case.
struct Watchdog {
    /// Milliseconds since `epoch` when the running case started, plus one; 0 when idle.
    started: AtomicU64,
    case: AtomicU64,
    done: AtomicBool,
    epoch: Instant,
}

impl Watchdog {
    fn start(target: &str, seed: u64, hang: Duration) -> Arc<Watchdog> {
        let watch = Arc::new(Watchdog {
            started: AtomicU64::new(0),
            case: AtomicU64::new(0),
            done: AtomicBool::new(false),
            epoch: Instant::now(),
        });
        let w = Arc::clone(&watch);
        let target = target.to_string();
        thread::spawn(move || {
            while !w.done.load(Ordering::SeqCst) {
                thread::sleep(Duration::from_millis(200));
                let started = w.started.load(Ordering::SeqCst);
                if started == 0 {
                    continue;
                }
                let running = w.now_ms().saturating_sub(started - 1);
                if running > hang.as_millis() as u64 {
                    let case = w.case.load(Ordering::SeqCst);
                    eprintln!(
                        "fuzz {target}: HANG: case {case} of seed {seed} has run {running} ms \
                         (limit {} ms)\n{}",
                        hang.as_millis(),
                        replay(&target, seed, case)
                    );
                    std::process::exit(3);
                }
            }
        });
        watch
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn begin(&self, case: u64) {
        self.case.store(case, Ordering::SeqCst);
        self.started.store(self.now_ms() + 1, Ordering::SeqCst);
    }

    fn end(&self) {
        self.started.store(0, Ordering::SeqCst);
    }
}

fn replay(target: &str, seed: u64, case: u64) -> String {
    format!(
        "replay: PIPEWISE_FUZZ_SEED={seed} PIPEWISE_FUZZ_CASE={case} \
         cargo test -p pipewise-fuzz --test {target} -- --nocapture"
    )
}

/// Prints a case's input when `PIPEWISE_FUZZ_VERBOSE` is set (for a replayed case).
pub fn show(input: &dyn fmt::Debug) {
    if std::env::var("PIPEWISE_FUZZ_VERBOSE").is_ok_and(|v| !v.trim().is_empty() && v.trim() != "0")
    {
        eprintln!("input: {input:#?}");
    }
}

/// What a run did.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The target's name (its test file).
    pub target: String,
    /// The seed.
    pub seed: u64,
    /// Cases run.
    pub cases: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Cases by outcome.
    pub outcomes: BTreeMap<String, u64>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "fuzz {}: {} cases in {:.1} s (seed {}): 0 panics, 0 hangs, 0 broken properties",
            self.target,
            self.cases,
            self.elapsed.as_secs_f64(),
            self.seed
        )?;
        for (outcome, n) in &self.outcomes {
            writeln!(f, "  {n:>9}  {outcome}")?;
        }
        Ok(())
    }
}

/// Runs `case` on inputs drawn from the environment's [`Settings`] (`default_cases` cases
/// when it sets no budget) until the budget is spent, and returns the report (also
/// printed). Panics, naming the case and how to replay
/// it, at the first case that panics (on any thread) or breaks a property; ends the process
/// at a case that hangs.
pub fn run(
    target: &str,
    default_cases: u64,
    mut case: impl FnMut(&mut Unstructured<'_>) -> Verdict,
) -> Report {
    let settings = match Settings::from_env(target, default_cases) {
        Ok(s) => s,
        Err(e) => panic!("fuzz {target}: {e}"),
    };
    install_panic_hook();
    let watch = Watchdog::start(target, settings.seed, settings.hang);
    let start = Instant::now();
    let mut outcomes = BTreeMap::new();
    let mut cases = 0;
    let (first, last) = match settings.only {
        Some(i) => (i, i),
        None => (0, u64::MAX),
    };
    let mut seen_panics = PANICS.load(Ordering::SeqCst);
    for index in first..=last {
        let out_of_time = settings
            .secs
            .is_some_and(|s| start.elapsed().as_secs_f64() >= s);
        if settings.only.is_none() && (out_of_time || settings.cases.is_some_and(|c| cases >= c)) {
            break;
        }
        let input = case_input(settings.seed, index);
        watch.begin(index);
        let verdict =
            panic::catch_unwind(AssertUnwindSafe(|| case(&mut Unstructured::new(&input))));
        watch.end();
        cases += 1;
        let panics = PANICS.load(Ordering::SeqCst);
        let failure = if panics > seen_panics {
            let first = FIRST_PANIC
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
                .unwrap_or_default();
            Some(format!("panicked: {first}"))
        } else {
            match verdict {
                Ok(Ok(outcome)) => {
                    if settings.verbose {
                        eprintln!("case {index}: {outcome}");
                    }
                    *outcomes.entry(outcome).or_insert(0) += 1;
                    None
                }
                Ok(Err(why)) => Some(format!("broke a property: {why}")),
                Err(_) => Some("panicked".to_string()),
            }
        };
        seen_panics = panics;
        if let Some(failure) = failure {
            watch.done.store(true, Ordering::SeqCst);
            // The default hook again, so the test's own failure message is printed.
            let _ = panic::take_hook();
            panic!(
                "fuzz {target}: case {index} of seed {} {failure}\n{}",
                settings.seed,
                replay(target, settings.seed, index)
            );
        }
    }
    watch.done.store(true, Ordering::SeqCst);
    let report = Report {
        target: target.to_string(),
        seed: settings.seed,
        cases,
        elapsed: start.elapsed(),
        outcomes,
    };
    eprint!("{report}");
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_are_a_function_of_seed_and_index() {
        assert_eq!(case_input(7, 3), case_input(7, 3));
        assert_ne!(case_input(7, 3), case_input(7, 4));
        assert_ne!(case_input(7, 3), case_input(8, 3));
        assert!((0..200).all(|i| case_input(1, i).len() <= MAX_INPUT));
        assert!((0..200).any(|i| case_input(1, i).len() > 512));
    }

    #[test]
    fn numbers_parse_in_decimal_and_hex() {
        assert_eq!(parse_u64("42"), Some(42));
        assert_eq!(parse_u64(" 0x2a "), Some(42));
        assert_eq!(parse_u64("x"), None);
    }
}
