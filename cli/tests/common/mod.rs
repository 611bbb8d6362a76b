//! Helpers shared by the end-to-end tests of the `pipewise` binary.

#![allow(dead_code, clippy::unwrap_used)]

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

pub(crate) mod processes;

/// Holds this test binary's other callers back until the guard drops: for tests whose
/// timings or trial bands are a lone job's on a small machine.
pub(crate) fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The largest absolute difference between same-named tensors of `a` and `b` (compared in
/// f32; both must hold the same names and dtypes).
pub(crate) fn max_param_diff(
    a: &std::collections::HashMap<String, candle_core::Tensor>,
    b: &std::collections::HashMap<String, candle_core::Tensor>,
) -> f64 {
    assert_eq!(a.len(), b.len(), "tensor counts differ");
    let mut worst = 0.0f64;
    for (name, t) in a {
        let u = b.get(name).unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(t.dtype(), u.dtype(), "{name}");
        let f32 = |x: &candle_core::Tensor| x.to_dtype(candle_core::DType::F32).unwrap();
        let d = (f32(t) - f32(u))
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        worst = worst.max(f64::from(d));
    }
    worst
}

/// Runs the built binary with `args`.
pub(crate) fn pipewise(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pipewise"))
        .args(args)
        .output()
        .expect("runs pipewise")
}

/// Standard output as text.
pub(crate) fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Standard error as text.
pub(crate) fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs and expects success; returns standard output.
pub(crate) fn ok(args: &[&str]) -> String {
    let out = pipewise(args);
    assert!(
        out.status.success(),
        "pipewise {args:?} failed:\n{}",
        stderr(&out)
    );
    stdout(&out)
}

/// Runs any command and expects success; returns standard output. On failure the panic
/// shows the command and both of its outputs.
pub(crate) fn succeeds(command: &mut Command) -> String {
    let out = command.output().expect("runs the command");
    assert!(
        out.status.success(),
        "{command:?} failed:\n{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    stdout(&out)
}

/// `pipewise plan` of 1F1B on 4 workers and 8 microbatches, the tests' usual plan, then
/// `extra`.
pub(crate) fn plan_1f1b<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["plan", "-s", "1f1b", "-d", "4", "-n", "8"];
    args.extend_from_slice(extra);
    args
}

/// Runs and expects failure; returns standard error.
pub(crate) fn fails(args: &[&str]) -> String {
    let out = pipewise(args);
    assert!(
        !out.status.success(),
        "pipewise {args:?} succeeded:\n{}",
        stdout(&out)
    );
    let err = stderr(&out);
    assert!(!err.contains("panicked"), "{err}");
    err
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub(crate) fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

/// The repository's root.
pub(crate) fn repo_root() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `helm`: from `PIPEWISE_HELM`, else on the PATH. Missing, it skips the caller's test
/// (`None`), or fails it where `PIPEWISE_REQUIRE_HELM` is set (CI).
pub(crate) fn helm() -> Option<PathBuf> {
    let found = std::env::var_os("PIPEWISE_HELM")
        .map(PathBuf::from)
        .or_else(|| which("helm"));
    if found.is_none() {
        assert!(
            std::env::var_os("PIPEWISE_REQUIRE_HELM").is_none(),
            "PIPEWISE_REQUIRE_HELM is set but there is no `helm` (PIPEWISE_HELM or the PATH)"
        );
        eprintln!("skipped: no `helm` (set PIPEWISE_HELM or put helm on the PATH)");
    }
    found
}

/// A YAML list of strings (a container's args, say).
pub(crate) fn strings(value: &serde_norway::Value) -> Vec<String> {
    value
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// The value after `flag` in a command line.
pub(crate) fn arg<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let at = args.iter().position(|a| a == flag)?;
    args.get(at + 1).map(String::as_str)
}

/// A plain HTTP/1.0 GET on loopback: (status, body).
pub(crate) fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = raw
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Ok((status, body))
}

/// `promtool check metrics` (when installed) accepts what `port` serves.
pub(crate) fn promtool_accepts(port: u16) {
    let Some(promtool) = which("promtool") else {
        assert!(
            std::env::var_os("PIPEWISE_REQUIRE_PROMETHEUS").is_none(),
            "PIPEWISE_REQUIRE_PROMETHEUS is set but `promtool` is not on the PATH"
        );
        eprintln!("promtool not installed: metrics format not checked");
        return;
    };
    let (_, body) = http_get(port, "/metrics").unwrap();
    let mut check = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    check
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool on :{port}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "promtool check metrics: :{port} ok ({} lines)",
        body.lines().count()
    );
}
