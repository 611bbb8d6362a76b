//! The client commands against a coordinator that is missing, starting or silent: `submit`
//! names a malformed job file before connecting, waits for a starting coordinator when
//! asked, and every client gives up on a silent one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::processes::*;

/// `submit` reads the job file before connecting: a malformed one is named even when no
/// coordinator runs (it used to say only that the coordinator could not be reached).
#[test]
fn submit_names_a_malformed_job_file_before_connecting() {
    let dir = tempdir("badfile");
    std::fs::create_dir_all(&dir).unwrap();
    let nowhere = format!("http://127.0.0.1:{}", common::free_port());
    let negative = spec(2, "1f1b", 3)
        .to_toml()
        .unwrap()
        .replace("steps = 3", "steps = -5");
    for (name, text, expect) in [
        ("unclosed.toml", "[job\nname=", "unclosed table"),
        ("empty.toml", "", "missing field"),
        ("negative.toml", negative.as_str(), "steps"),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        let err = common::fails(&["submit", path.to_str().unwrap(), "--coordinator", &nowhere]);
        assert!(err.contains("is not a valid job spec"), "{name}: {err}");
        assert!(err.contains(expect), "{name}: {err}");
        assert!(!err.contains("cannot reach"), "{name}: {err}");
    }
    // A valid file gets as far as the connection.
    let path = write_spec(&dir, &spec(2, "1f1b", 3));
    let err = common::fails(&["submit", path.to_str().unwrap(), "--coordinator", &nowhere]);
    assert!(err.contains("cannot reach the coordinator"), "{err}");
}

/// `--wait-for-coordinator`: a submit made before the coordinator listens gets through
/// once it does (as the Helm chart's hook does while the coordinator starts), and gives up
/// with the connection error when the time runs out.
#[test]
fn submit_waits_for_a_starting_coordinator() {
    let dir = tempdir("waitcoord");
    std::fs::create_dir_all(&dir).unwrap();
    let file = write_spec(&dir, &spec(2, "1f1b", 3));
    let port = common::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    let err = common::fails(&[
        "submit",
        file.to_str().unwrap(),
        "--coordinator",
        &url,
        "--wait-for-coordinator",
        "1",
    ]);
    assert!(err.contains("cannot reach the coordinator"), "{err}");
    assert!(err.contains("waiting up to 1 s"), "{err}");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "gave up at once"
    );

    let mut submit = pipewise()
        .arg("submit")
        .arg(&file)
        .args(["--coordinator", &url, "--wait-for-coordinator", "60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The coordinator starts once the command said it waits for one.
    let said = said_on(submit.stderr.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    let waits = loop {
        let line = said
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("submit says it waits up to 60 s");
        if line.contains("waiting up to 60 s") {
            break line;
        }
    };
    let mut cmd = pipewise();
    cmd.args([
        "coordinator",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--data-dir",
    ])
    .arg(dir.join("data"));
    let (mut coordinator, _) = spawn_with_line(cmd, &dir.join("coordinator.log"));
    let out = submit.wait_with_output().unwrap();
    let _ = coordinator.kill();
    let _ = coordinator.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr: Vec<String> = said.try_iter().collect();
    assert!(out.status.success(), "{stdout}\n{waits}\n{stderr:?}");
    assert!(stdout.starts_with("job 1 "), "{stdout}");
}

/// The lines `stream` gives, as they come.
fn said_on(stream: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stream)) {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// A coordinator that takes the connection and never answers (a frozen process, a dead
/// link) ends a client command within `--answer-timeout` (its pings unanswered) instead of
/// hanging, and a URL with a path is refused (its path would be dropped).
#[test]
fn clients_give_up_on_a_silent_coordinator() {
    // The kernel completes the TCP handshakes; nothing ever reads or writes.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    let started = Instant::now();
    let err = common::fails(&["status", "--coordinator", &url, "--answer-timeout", "2"]);
    let took = started.elapsed();
    // Gave up on the silence, not at once (2 s unanswered after the first ping at 1 s);
    // the bound leaves room for a loaded machine, far below the default's 30 s.
    assert!(took >= Duration::from_secs(2), "{took:?}: {err}");
    assert!(took < Duration::from_secs(20), "{took:?}: {err}");
    assert!(err.contains("stopped answering"), "{err}");
    let err = common::fails(&["status", "--coordinator", &format!("{url}/jobs")]);
    assert!(err.contains("a path (/jobs) is not supported"), "{err}");
    drop(silent);
}
