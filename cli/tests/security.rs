//! TLS, mutual TLS and tokens on a coordinator and three worker processes (loopback): the
//! job trains exactly as without them (the single-device reference), and each door stays
//! shut to whoever lacks the key: no token, the wrong role's token, plain text on the TLS
//! port, a worker certificate from another CA, a peer without a valid certificate (or
//! with one, but without the run's secret); a burst of jobs submitted at once all start.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use common::processes::*;
use pipewise_proto::v1 as pb;
use pipewise_proto::v1::activation_service_client::ActivationServiceClient;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

fn path(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

/// Waits for `child` to exit (killed after `limit`); whether it exited by itself, and how.
fn exit_within(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// One frame of `run` to the activation service at `address`, over TLS with `ca` and, if
/// given, the client certificate `identity` (`(cert, key)` files).
fn send_frame(
    address: &str,
    ca: &Path,
    identity: Option<(&Path, &Path)>,
    run: u64,
) -> Result<pb::SendAck, String> {
    let mut tls =
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(std::fs::read(ca).unwrap()));
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(
            std::fs::read(cert).unwrap(),
            std::fs::read(key).unwrap(),
        ));
    }
    let frame = pb::TensorFrame {
        run,
        step: 0,
        stage: 1,
        mb: 0,
        kind: pb::FrameKind::Activation as i32,
        dtype: pb::Dtype::F32 as i32,
        shape: vec![1],
        data: vec![0u8; 4].into(),
        offset: 0,
        run_secret: Default::default(),
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let endpoint = Endpoint::from_shared(format!("https://{address}"))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect_timeout(Duration::from_secs(5));
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| format!("connect: {e:?}"))?;
        ActivationServiceClient::new(channel)
            .send(tokio_stream::iter(vec![frame]))
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
    })
}

#[test]
fn tls_mutual_tls_and_tokens_train_exactly_and_keep_strangers_out() {
    let dir = tempdir("security");
    std::fs::create_dir_all(&dir).unwrap();
    let (certs, other) = (dir.join("certs"), dir.join("other-ca"));
    for d in [&certs, &other] {
        common::ok(&["certs", d.to_str().unwrap()]);
    }
    std::fs::write(dir.join("submitter.token"), "submit-8f3a1c\n").unwrap();
    std::fs::write(dir.join("worker.token"), "  worker-51d0e7  \nsecond line\n").unwrap();
    let (submitter_token, worker_token) =
        (path(&dir, "submitter.token"), path(&dir, "worker.token"));
    let ca = path(&certs, "ca.pem");

    let coordinator = |port: u16| {
        let mut cmd = pipewise();
        cmd.args(["coordinator", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.join("data"))
            .args(["--metrics-listen", &format!("127.0.0.1:{port}")])
            .args(["--tls-cert", &path(&certs, "coordinator.pem")])
            .args(["--tls-key", &path(&certs, "coordinator.key")])
            .args(["--tls-client-ca", &ca])
            .args(["--submitter-token-file", &submitter_token])
            .args(["--worker-token-file", &worker_token]);
        cmd
    };
    let (coordinator, line, metrics) =
        spawn_on_free_port(coordinator, &dir.join("coordinator.log"));
    let addr = line.split_whitespace().nth(3).unwrap().to_string();
    let mut cluster = Cluster {
        children: vec![coordinator],
        url: format!("https://{addr}"),
        data: dir.join("data"),
        workers: Default::default(),
        metrics: [metrics, 0],
        worker_data: Vec::new(),
    };
    let worker_tls = |certs: &Path| {
        [
            "--tls-ca".to_string(),
            ca.clone(),
            "--tls-cert".into(),
            path(certs, "worker.pem"),
            "--tls-key".into(),
            path(certs, "worker.key"),
            "--token-file".into(),
            worker_token.clone(),
        ]
    };
    let good = worker_tls(&certs);
    let good: Vec<&str> = good.iter().map(String::as_str).collect();
    for w in 0..3 {
        add_worker(&mut cluster, &dir, &format!("w{w}"), &good);
    }

    // A worker whose certificate another CA signed: the coordinator refuses its handshake,
    // so it never registers (it runs beside the job; its id sorts after the others').
    let rogue_args = worker_tls(&other);
    let mut rogue = pipewise()
        .args(["worker", "--coordinator", &cluster.url, "--id", "zz-rogue"])
        .args(&rogue_args)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("rogue.log")).unwrap())
        .spawn()
        .unwrap();

    // The job, over TLS with the submitter token: exactly the reference.
    let spec = spec(3, "1f1b", STEPS);
    let file = write_spec(&dir, &spec);
    let stdout = common::succeeds(
        pipewise()
            .arg("submit")
            .arg(&file)
            .args(secured(&cluster.url, &ca, &submitter_token))
            .arg("--wait"),
    );
    let job: u64 = stdout
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap();
    let (loss_diff, param_diff) = assert_exact(
        &cluster,
        job,
        &last_losses(&stdout),
        &reference(&spec_of_one()),
    );
    eprintln!(
        "TLS + mTLS + tokens, 1F1B on 3 workers: max |Δloss| {loss_diff:.2e}, max |Δparam| {param_diff:.2e}"
    );

    // A burst of short emulated jobs submitted at once: each starts, though a follower may
    // take up the next run before worker 0 (the collectives' root) has, and must then wait
    // for it rather than be refused on the run secret.
    burst(&dir, &secured(&cluster.url, &ca, &submitter_token));

    // No token: Unauthenticated (the TLS handshake itself succeeds).
    let err = common::fails(&["status", "--coordinator", &cluster.url, "--tls-ca", &ca]);
    assert!(
        err.contains("Unauthenticated") && err.contains("needs a token"),
        "{err}"
    );
    // A wrong token: Unauthenticated too (twice: logged once, counted twice).
    std::fs::write(dir.join("guess.token"), "guess-0b9e4d\n").unwrap();
    let guess = path(&dir, "guess.token");
    for _ in 0..2 {
        let err = common::fails(&[&["status"][..], &secured(&cluster.url, &ca, &guess)].concat());
        assert!(err.contains("Unauthenticated"), "{err}");
    }
    // The worker token on SubmitJob: PermissionDenied.
    let submit = ["submit", file.to_str().unwrap()];
    let err = common::fails(&[&submit[..], &secured(&cluster.url, &ca, &worker_token)].concat());
    assert!(
        err.contains("PermissionDenied")
            && err.contains("the worker token may not call the submitter API"),
        "{err}"
    );
    // Plain text to the TLS port (with the right token), twice: the client is told the
    // port speaks TLS.
    for _ in 0..2 {
        let err = common::fails(&[
            "status",
            "--coordinator",
            &format!("http://{addr}"),
            "--token-file",
            &submitter_token,
        ]);
        assert!(
            err.contains(
                "the coordinator speaks TLS on this port but this side dialled plain text"
            ) && !err.contains("Unauthenticated"),
            "{err}"
        );
    }
    // The right token over TLS: the job is listed.
    let listed = common::ok(
        &[
            &["status"][..],
            &secured(&cluster.url, &ca, &submitter_token),
        ]
        .concat(),
    );
    assert!(listed.contains("succeeded"), "{listed}");

    // The rogue worker gave up without registering.
    let exit = exit_within(&mut rogue, Duration::from_secs(120));
    let rogue_log = std::fs::read_to_string(dir.join("rogue.log")).unwrap();
    assert!(exit.is_some_and(|s| !s.success()), "{exit:?}: {rogue_log}");
    assert!(!rogue_log.contains("registered"), "{rogue_log}");
    assert!(
        rogue_log.contains("the coordinator refused this side's client certificate"),
        "{rogue_log}"
    );
    let coordinator_log = std::fs::read_to_string(dir.join("coordinator.log")).unwrap();
    assert!(!coordinator_log.contains("zz-rogue"), "{coordinator_log}");

    // Each refusal is counted, and logged at warn once per peer and reason (the handshakes'
    // are recorded after the client has its answer: wait for them).
    let expected = [
        ("no_token", 1.0),
        ("bad_token", 2.0),
        ("wrong_role", 1.0),
        ("plain_text_on_tls", 2.0),
        ("unknown_issuer", 1.0),
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    let counted = loop {
        let counted = expected.map(|(reason, _)| (reason, refusals_counted(metrics, reason)));
        let all_in = counted.iter().zip(&expected).all(|(c, e)| c.1 >= e.1);
        if all_in || Instant::now() > deadline {
            break counted;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // A CLI command's channel dials again after the GOAWAY, and the rogue worker's may
    // too: at least those for the handshakes, exactly those for the calls.
    assert_eq!(counted[..3], expected[..3]);
    assert!(counted[3].1 >= 2.0 && counted[4].1 >= 1.0, "{counted:?}");
    let coordinator_log = std::fs::read_to_string(dir.join("coordinator.log")).unwrap();
    for (reason, role) in [
        ("no_token", "submitter"),
        ("bad_token", "submitter"),
        ("wrong_role", "submitter"),
        ("plain_text_on_tls", "unknown"),
        ("unknown_issuer", "worker"),
    ] {
        let lines: Vec<&str> = coordinator_log
            .lines()
            .filter(|l| l.contains("refused a caller") && l.contains(&format!("reason={reason} ")))
            .collect();
        // The calls' refusals came within seconds of each other: one line each. The rogue
        // worker dials again until it gives up, which on a loaded machine may take over a
        // minute: its lines are a minute apart at least.
        if reason == "unknown_issuer" {
            assert!(!lines.is_empty(), "{reason}: {coordinator_log}");
            let at: Vec<f64> = lines.iter().map(|l| seconds_of_day(l)).collect();
            assert!(
                at.windows(2).all(|w| w[1] - w[0] >= 59.0),
                "{reason}: more than one line a minute:\n{}",
                lines.join("\n")
            );
        } else {
            assert_eq!(lines.len(), 1, "{reason}: {coordinator_log}");
        }
        assert!(
            lines[0].contains("WARN")
                && lines[0].contains(&format!("role={role} "))
                && lines[0].contains("peer=127.0.0.1:"),
            "{}",
            lines[0]
        );
    }

    // Peers: a frame from a client without a certificate, or with one from another CA,
    // does not get through the handshake; one with a valid certificate reaches the
    // worker, which refuses it for lacking the run's secret.
    let w1 = cluster.workers["w1"].clone();
    let ca_path = certs.join("ca.pem");
    let (good_cert, good_key) = (certs.join("worker.pem"), certs.join("worker.key"));
    let (foreign_cert, foreign_key) = (other.join("worker.pem"), other.join("worker.key"));
    for (identity, what) in [
        (None, "no client certificate"),
        (
            Some((&*foreign_cert, &*foreign_key)),
            "a certificate of another CA",
        ),
        (
            Some((&*good_cert, &*good_key)),
            "a valid certificate, no run secret",
        ),
    ] {
        let err = send_frame(&w1, &ca_path, identity, job).expect_err(what);
        // Only a peer through the handshake reaches the worker's frame checks.
        let checked = err.starts_with("PermissionDenied") && err.contains("TensorFrame.run_secret");
        assert_eq!(checked, what.starts_with("a valid"), "{what}: {err}");
    }
    // The coordinator's log never holds a token.
    let coordinator_log = std::fs::read_to_string(dir.join("coordinator.log")).unwrap();
    assert!(
        coordinator_log.contains("coordinator security: TLS"),
        "{coordinator_log}"
    );
    for token in ["submit-8f3a1c", "worker-51d0e7", "guess-0b9e4d"] {
        assert!(!coordinator_log.contains(token), "{coordinator_log}");
    }
}

/// `pipewise_auth_refused_total{reason=…}` on the metrics at `port`.
fn refusals_counted(port: u16, reason: &str) -> f64 {
    let (_, text) = common::http_get(port, "/metrics").unwrap();
    let key = format!("pipewise_auth_refused_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(key.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {text}"))
}

/// The time of day, in seconds, of a log line that starts with an RFC 3339 UTC timestamp
/// (`2026-12-05T15:19:37.011581Z …`).
fn seconds_of_day(line: &str) -> f64 {
    let time = line
        .split_once('T')
        .and_then(|(_, rest)| rest.split_once('Z'))
        .map(|(time, _)| time)
        .unwrap_or_else(|| panic!("no timestamp: {line}"));
    time.split(':')
        .map(|part| part.parse::<f64>().unwrap())
        .fold(0.0, |total, part| total * 60.0 + part)
}

/// Submits `BURST` three-step emulated 3-worker jobs at once with the client flags `flags`,
/// and waits for each to succeed.
fn burst(dir: &Path, flags: &[&str]) {
    const BURST: usize = 8;
    let mut spec = spec(3, "1f1b", 3);
    spec.compute.mode = pipewise_common::job::ComputeMode::Emulate;
    spec.compute.f_ms = 1.0;
    spec.compute.b_ms = 1.0;
    spec.compute.w_ms = 1.0;
    let submits: Vec<Child> = (0..BURST)
        .map(|i| {
            spec.job.name = format!("burst-{i}");
            let file = write_spec(dir, &spec);
            pipewise()
                .arg("submit")
                .arg(file)
                .args(flags)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let ids: Vec<String> = submits
        .into_iter()
        .map(|child| {
            let out = child.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout).to_string();
            assert!(
                out.status.success(),
                "{stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            stdout.split_whitespace().nth(1).unwrap().to_string()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(180);
    for id in &ids {
        loop {
            let line = common::ok(&[&["status", id.as_str()][..], flags].concat());
            if line.contains("succeeded") {
                break;
            }
            assert!(
                !line.contains("failed") && Instant::now() < deadline,
                "burst job {id}: {line}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The reference every run equals: the same model on one device.
fn spec_of_one() -> pipewise_common::job::JobSpec {
    spec(1, "1f1b", STEPS)
}

/// Without the flags the coordinator is open, as before, and says so at start.
#[test]
fn an_open_coordinator_says_so() {
    let dir = tempdir("open");
    let cluster = start(&dir, 0);
    let listed = common::ok(&["status", "--coordinator", &cluster.url]);
    assert_eq!(listed.trim(), "no jobs");
    let log = std::fs::read_to_string(dir.join("coordinator.log")).unwrap();
    assert!(
        log.contains("the coordinator is open: no TLS and no tokens"),
        "{log}"
    );
}

/// A client's flags for the TLS port with a token: coordinator URL, CA and token file.
fn secured<'a>(url: &'a str, ca: &'a str, token: &'a str) -> [&'a str; 6] {
    ["--coordinator", url, "--tls-ca", ca, "--token-file", token]
}
