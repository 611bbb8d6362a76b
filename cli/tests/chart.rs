//! The Helm chart's hardening and operations options (charts/pipewise): security contexts,
//! gRPC health probes, resources, the workers' PodDisruptionBudget, NetworkPolicies, gang
//! scheduling, priority classes, extra env and volumes; rendered with them off and on, and
//! bad values refused by the schema, naming the field. Strict validation against Kubernetes'
//! schemas is `deploy/validate-chart` (needs PyPI packages, so not here).
//!
//! Needs `helm`, found as cli/tests/deploy.rs finds it: `PIPEWISE_HELM`, else on the PATH;
//! with `PIPEWISE_REQUIRE_HELM` set (CI) a missing helm fails instead of skipping.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{Command, Output};

use serde::Deserialize as _;
use serde_norway::Value;

use common::{helm, repo_root};

fn helm_run(helm: &Path, verb: &str, args: &[&str]) -> Output {
    let mut command = Command::new(helm);
    command.arg(verb);
    if verb == "template" {
        command.arg("rel");
    }
    command
        .arg(repo_root().join("charts/pipewise"))
        .args(args)
        .output()
        .unwrap()
}

/// `helm template rel charts/pipewise ARGS`, as YAML documents.
fn render(helm: &Path, args: &[&str]) -> Vec<Value> {
    let out = helm_run(helm, "template", args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "helm template {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// Renders with `args` and expects a failure whose message names `field`.
fn refused(helm: &Path, args: &[&str], field: &str) {
    let out = helm_run(helm, "template", args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} was accepted");
    assert!(err.contains(field), "{args:?} does not name {field}: {err}");
}

/// The documents of `kind`.
fn all<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

/// The one document of `kind`.
fn one<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found = all(docs, kind);
    assert_eq!(found.len(), 1, "one {kind}");
    found[0]
}

fn pod(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]
}

fn container(workload: &Value) -> &Value {
    &pod(workload)["containers"][0]
}

/// The item of a list (env, volumes, mounts, ports) with this name.
fn named<'a>(list: &'a Value, name: &str) -> &'a Value {
    list.as_sequence()
        .unwrap_or_else(|| panic!("no list for {name}"))
        .iter()
        .find(|item| item["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {list:?}"))
}

fn job_file() -> String {
    format!("job={}", repo_root().join("deploy/job.toml").display())
}

/// The coordinator, the workers and the submit hook Job.
fn workloads(docs: &[Value]) -> [&Value; 3] {
    [
        one(docs, "Deployment"),
        one(docs, "StatefulSet"),
        one(docs, "Job"),
    ]
}

/// The probes of a container: each a gRPC health check on the port named `port`.
fn assert_grpc_probes<'a>(workload: &'a Value, port: &str) -> [&'a Value; 3] {
    let c = container(workload);
    let number = &named(&c["ports"], port)["containerPort"];
    ["startupProbe", "readinessProbe", "livenessProbe"].map(|probe| {
        let p = &c[probe];
        assert_eq!(&p["grpc"]["port"], number, "{probe} of {:?}", c["name"]);
        // The overall status (service ""), which the health service serves from the start.
        assert!(p["grpc"]["service"].is_null() && p["tcpSocket"].is_null());
        p
    })
}

/// The hardening every pod gets, whatever the options.
#[test]
fn every_pod_is_confined_and_probed_over_grpc() {
    let Some(helm) = helm() else { return };
    let job = job_file();
    let off = "networkPolicy.enabled=false,workers.podDisruptionBudget.enabled=false";
    let docs = render(&helm, &["--set", off, "--set-file", &job]);
    for kind in ["PodDisruptionBudget", "NetworkPolicy", "PodGroup"] {
        assert!(all(&docs, kind).is_empty(), "{kind} rendered while off");
    }
    for workload in workloads(&docs) {
        let (p, c) = (pod(workload), container(workload));
        let name = workload["kind"].as_str().unwrap();
        assert_eq!(p["securityContext"]["runAsNonRoot"], true, "{name}");
        assert_eq!(p["securityContext"]["runAsUser"], 10001, "{name}");
        // The data volume is writable to the images' group.
        assert_eq!(p["securityContext"]["fsGroup"], 10001, "{name}");
        assert_eq!(
            p["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        let s = &c["securityContext"];
        assert_eq!(s["runAsNonRoot"], true, "{name}");
        assert_eq!(s["runAsUser"], 10001, "{name}");
        assert_eq!(s["readOnlyRootFilesystem"], true, "{name}");
        assert_eq!(s["allowPrivilegeEscalation"], false, "{name}");
        assert_eq!(s["capabilities"]["drop"][0], "ALL", "{name}");
        assert_eq!(s["seccompProfile"]["type"], "RuntimeDefault", "{name}");
        // A read-only root: scratch space is an emptyDir on /tmp.
        assert_eq!(named(&c["volumeMounts"], "scratch")["mountPath"], "/tmp");
        assert_eq!(
            named(&p["volumes"], "scratch")["emptyDir"]["sizeLimit"],
            "1Gi"
        );
    }
    let [coordinator, workers, submit] = workloads(&docs);
    assert_grpc_probes(coordinator, "grpc");
    let [startup, _, liveness] = assert_grpc_probes(workers, "activations");
    // Up to 5 minutes to start; a worker busy in a step is not killed by a slow answer.
    assert_eq!(startup["failureThreshold"], 60);
    assert_eq!(startup["periodSeconds"], 5);
    assert_eq!(liveness["failureThreshold"], 6);
    assert!(container(submit)["livenessProbe"].is_null());
    assert_eq!(pod(coordinator)["terminationGracePeriodSeconds"], 30);
    assert_eq!(pod(workers)["terminationGracePeriodSeconds"], 60);
    // Workers ask for CPU and memory, cap memory, and keep their GPU.
    let resources = &container(workers)["resources"];
    assert_eq!(resources["requests"]["cpu"], "2");
    assert_eq!(resources["requests"]["memory"], "8Gi");
    assert_eq!(resources["limits"]["memory"], "64Gi");
    assert_eq!(resources["limits"]["nvidia.com/gpu"], 1);
    assert!(resources["limits"]["cpu"].is_null());
    // So do the coordinator (no CPU limit: heartbeats answered late would lose workers) and
    // the submit Job.
    let resources = &container(coordinator)["resources"];
    assert_eq!(resources["requests"]["memory"], "1Gi");
    assert_eq!(resources["limits"]["memory"], "4Gi");
    assert!(resources["limits"]["cpu"].is_null());
    assert_eq!(container(submit)["resources"]["limits"]["memory"], "256Mi");
    for workload in [coordinator, workers] {
        assert!(pod(workload)["priorityClassName"].is_null());
        assert!(pod(workload)["schedulerName"].is_null());
    }
    assert!(one(&docs, "StatefulSet")["metadata"]["labels"]["kueue.x-k8s.io/queue-name"].is_null());
}

/// By default the workers have a PodDisruptionBudget (one eviction at a time) and every pod
/// a NetworkPolicy.
#[test]
fn disruptions_and_network_are_bounded_by_default() {
    let Some(helm) = helm() else { return };
    let docs = render(&helm, &[]);
    assert_eq!(
        one(&docs, "PodDisruptionBudget")["spec"]["maxUnavailable"],
        1
    );
    assert_eq!(all(&docs, "NetworkPolicy").len(), 2);
}

/// charts/pipewise/ci/options-on-values.yaml: every option on.
#[test]
fn the_options_render_what_they_say() {
    let Some(helm) = helm() else { return };
    let values = repo_root().join("charts/pipewise/ci/options-on-values.yaml");
    let args = ["-f", values.to_str().unwrap(), "--set-file", &job_file()];
    let out = helm_run(&helm, "lint", &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let docs = render(&helm, &args);
    let [coordinator, workers, submit] = workloads(&docs);
    let worker_labels = &workers["spec"]["selector"]["matchLabels"];

    // The PodDisruptionBudget covers the workers, with minAvailable instead of maxUnavailable.
    let pdb = one(&docs, "PodDisruptionBudget");
    assert_eq!(pdb["apiVersion"], "policy/v1");
    assert_eq!(&pdb["spec"]["selector"]["matchLabels"], worker_labels);
    assert_eq!(pdb["spec"]["minAvailable"], "75%");
    assert!(pdb["spec"]["maxUnavailable"].is_null());

    // NetworkPolicies: workers <-> workers on activations; workers, the submit Job and the
    // listed clients -> the coordinator's gRPC port; the monitoring namespace -> metrics.
    let policies = all(&docs, "NetworkPolicy");
    assert_eq!(policies.len(), 2);
    let policy_of = |workload: &Value| -> &Value {
        let labels = &workload["spec"]["selector"]["matchLabels"];
        policies
            .iter()
            .find(|p| &p["spec"]["podSelector"]["matchLabels"] == labels)
            .expect("a policy for each workload")
    };
    let submit_labels = &submit["spec"]["template"]["metadata"]["labels"];
    let monitoring = "monitoring";
    for (workload, port, sources) in [
        (
            coordinator,
            "grpc",
            vec![worker_labels, submit_labels, &Value::Null],
        ),
        (workers, "activations", vec![worker_labels]),
    ] {
        let policy = policy_of(workload);
        assert_eq!(policy["spec"]["policyTypes"][0], "Ingress");
        let rules = policy["spec"]["ingress"].as_sequence().unwrap();
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0]["ports"][0]["port"], port);
        named(&container(workload)["ports"], port);
        let from = rules[0]["from"].as_sequence().unwrap();
        assert_eq!(from.len(), sources.len());
        for (peer, labels) in from.iter().zip(sources) {
            if labels.is_null() {
                let ns = &peer["namespaceSelector"]["matchLabels"];
                assert_eq!(ns["kubernetes.io/metadata.name"], "ml-team");
            } else {
                assert_eq!(&peer["podSelector"]["matchLabels"], labels);
            }
        }
        assert_eq!(rules[1]["ports"][0]["port"], "metrics");
        named(&container(workload)["ports"], "metrics");
        let scraper = &rules[1]["from"][0]["namespaceSelector"]["matchLabels"];
        assert_eq!(scraper["kubernetes.io/metadata.name"], monitoring);
    }

    // Volcano: a PodGroup of the workers, who name it and its scheduler.
    let group = one(&docs, "PodGroup");
    assert_eq!(group["apiVersion"], "scheduling.volcano.sh/v1beta1");
    assert_eq!(group["spec"]["minMember"], 3);
    assert_eq!(group["spec"]["queue"], "training");
    assert_eq!(group["spec"]["priorityClassName"], "pipewise-training");
    let annotations = &workers["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(
        annotations["scheduling.k8s.io/group-name"],
        group["metadata"]["name"]
    );
    assert_eq!(pod(workers)["schedulerName"], "volcano");
    assert!(pod(coordinator)["schedulerName"].is_null());

    for (workload, priority, grace, env, volume, mount) in [
        (
            coordinator,
            "pipewise-control",
            45,
            "RUST_BACKTRACE",
            "extra-config",
            "/etc/site",
        ),
        (
            workers,
            "pipewise-training",
            90,
            "PIPEWISE_SCHED",
            "dataset",
            "/datasets",
        ),
    ] {
        let (p, c) = (pod(workload), container(workload));
        assert_eq!(p["priorityClassName"], priority);
        assert_eq!(p["terminationGracePeriodSeconds"], grace);
        named(&c["env"], env);
        named(&p["volumes"], volume);
        assert_eq!(named(&c["volumeMounts"], volume)["mountPath"], mount);
        // The chart's own volumes stay.
        for own in ["data", "scratch"] {
            named(&p["volumes"], own);
            named(&c["volumeMounts"], own);
        }
        let scratch = &named(&p["volumes"], "scratch")["emptyDir"];
        assert_eq!(scratch["medium"], "Memory");
        assert_eq!(scratch["sizeLimit"], "2Gi");
    }
    named(&container(workers)["env"], "POD_NAME");
    let [_, _, liveness] = assert_grpc_probes(workers, "activations");
    assert_eq!(liveness["periodSeconds"], 30);
    assert_eq!(liveness["initialDelaySeconds"], 10);
    assert_eq!(
        container(coordinator)["resources"]["limits"]["memory"],
        "4Gi"
    );
    assert_eq!(container(submit)["resources"]["requests"]["cpu"], "100m");
}

/// The other choices of the options: the PDB's default bound, Kueue, a scheduler of one's
/// own, metrics open to any source; and the combinations that cannot work.
#[test]
fn the_options_choose_and_conflict() {
    let Some(helm) = helm() else { return };
    let docs = render(
        &helm,
        &[
            "--set",
            "workers.podDisruptionBudget.enabled=true,networkPolicy.enabled=true,\
             gang.kueue.queueName=team-a,gang.schedulerName=batch,workers.replicas=6",
        ],
    );
    let pdb = one(&docs, "PodDisruptionBudget");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert!(pdb["spec"]["minAvailable"].is_null());
    let workers = one(&docs, "StatefulSet");
    assert_eq!(
        workers["metadata"]["labels"]["kueue.x-k8s.io/queue-name"],
        "team-a"
    );
    assert_eq!(pod(workers)["schedulerName"], "batch");
    assert!(all(&docs, "PodGroup").is_empty());
    assert!(workers["spec"]["template"]["metadata"]["annotations"].is_null());
    for policy in all(&docs, "NetworkPolicy") {
        let metrics = &policy["spec"]["ingress"][1];
        assert_eq!(metrics["ports"][0]["port"], "metrics");
        assert!(metrics["from"].is_null(), "metrics open to any source");
    }
    // A PodGroup's minMember defaults to every worker.
    let docs = render(
        &helm,
        &["--set", "gang.volcano.enabled=true,workers.replicas=6"],
    );
    assert_eq!(one(&docs, "PodGroup")["spec"]["minMember"], 6);

    refused(
        &helm,
        &[
            "--set",
            "gang.volcano.enabled=true,gang.kueue.queueName=team-a",
        ],
        "choose one gang scheduler",
    );
    refused(
        &helm,
        &[
            "--set",
            "gang.volcano.enabled=true,gang.volcano.minMember=5",
        ],
        "gang.volcano.minMember (5) exceeds workers.replicas (4)",
    );
}

/// Bad values of the new fields are refused by the schema, naming the field.
#[test]
fn the_schema_refuses_bad_option_values() {
    let Some(helm) = helm() else { return };
    for (set, field) in [
        // Wrong types.
        ("networkPolicy.enabled=yes", "networkPolicy.enabled"),
        (
            "workers.podDisruptionBudget.enabled=1",
            "workers.podDisruptionBudget.enabled",
        ),
        ("gang.volcano.enabled=on", "gang.volcano.enabled"),
        (
            "securityContext.readOnlyRootFilesystem=no",
            "readOnlyRootFilesystem",
        ),
        ("coordinator.probes.startup=5", "coordinator.probes.startup"),
        ("workers.extraEnv=PATH", "workers.extraEnv"),
        (
            "coordinator.extraVolumes.name=x",
            "coordinator.extraVolumes",
        ),
        ("networkPolicy.clients=all", "networkPolicy.clients"),
        ("workers.resources=big", "workers.resources"),
        // Negative or zero where it cannot be.
        (
            "workers.podDisruptionBudget.maxUnavailable=-1",
            "workers.podDisruptionBudget.maxUnavailable",
        ),
        (
            "workers.podDisruptionBudget.minAvailable=-1",
            "workers.podDisruptionBudget.minAvailable",
        ),
        (
            "workers.terminationGracePeriodSeconds=-1",
            "workers.terminationGracePeriodSeconds",
        ),
        (
            "coordinator.terminationGracePeriodSeconds=-30",
            "coordinator.terminationGracePeriodSeconds",
        ),
        (
            "workers.probes.liveness.periodSeconds=0",
            "workers.probes.liveness.periodSeconds",
        ),
        (
            "coordinator.probes.readiness.timeoutSeconds=-1",
            "coordinator.probes.readiness.timeoutSeconds",
        ),
        (
            "workers.probes.startup.initialDelaySeconds=-1",
            "workers.probes.startup.initialDelaySeconds",
        ),
        ("gang.volcano.minMember=-1", "gang.volcano.minMember"),
        (
            "podSecurityContext.fsGroup=-1",
            "podSecurityContext.fsGroup",
        ),
        ("securityContext.runAsUser=-5", "securityContext.runAsUser"),
        // runAsNonRoot with user 0 would never start.
        (
            "podSecurityContext.runAsUser=0",
            "podSecurityContext.runAsUser",
        ),
        (
            "workers.resources.requests.cpu=-1",
            "workers.resources.requests.cpu",
        ),
        (
            "submit.resources.limits.memory=-2",
            "submit.resources.limits.memory",
        ),
        ("scratch.sizeLimit=-1", "scratch.sizeLimit"),
        // Not a quantity, percentage or name.
        (
            "coordinator.resources.limits.memory=lots",
            "coordinator.resources.limits.memory",
        ),
        ("scratch.sizeLimit=big", "scratch.sizeLimit"),
        (
            "workers.podDisruptionBudget.minAvailable=150%",
            "workers.podDisruptionBudget.minAvailable",
        ),
        (
            "workers.podDisruptionBudget.maxUnavailable=one",
            "workers.podDisruptionBudget.maxUnavailable",
        ),
        (
            "workers.priorityClassName=High_Priority",
            "workers.priorityClassName",
        ),
        ("gang.schedulerName=My Scheduler", "gang.schedulerName"),
        ("gang.kueue.queueName=-team-", "gang.kueue.queueName"),
        (
            "workers.extraVolumes[0].name=Bad_Name",
            "workers.extraVolumes.0.name",
        ),
        (
            "coordinator.extraVolumeMounts[0].name=x,coordinator.extraVolumeMounts[0].mountPath=etc",
            "coordinator.extraVolumeMounts.0.mountPath",
        ),
        ("workers.extraEnv[0].value=x", "name is required"),
        // Unknown enum values.
        (
            "podSecurityContext.seccompProfile.type=Default",
            "seccompProfile.type",
        ),
        (
            "securityContext.seccompProfile.type=default",
            "seccompProfile.type",
        ),
        (
            "podSecurityContext.fsGroupChangePolicy=Never",
            "fsGroupChangePolicy",
        ),
        (
            "securityContext.procMount=Masked",
            "securityContext.procMount",
        ),
        (
            "securityContext.capabilities.drop={all}",
            "securityContext.capabilities.drop.0",
        ),
        ("scratch.medium=HugePages", "scratch.medium"),
        (
            "workers.extraVolumeMounts[0].name=x,workers.extraVolumeMounts[0].mountPath=/x,\
             workers.extraVolumeMounts[0].mountPropagation=Both",
            "workers.extraVolumeMounts.0.mountPropagation",
        ),
        // Misspelt fields.
        ("networkPolicy.enable=true", "enable"),
        (
            "workers.podDisruptionBudget.maxUnavaliable=1",
            "maxUnavaliable",
        ),
        ("gang.volcano.queueName=q", "queueName"),
        ("securityContext.readOnlyRootFS=true", "readOnlyRootFS"),
        ("workers.probes.liveness.period=5", "period"),
        ("networkPolicy.clients[0].podSelectors.x=y", "podSelectors"),
        ("workers.resources.request.cpu=1", "property request is"),
    ] {
        refused(&helm, &["--set", set], field);
    }
    // Good values of the same fields pass.
    for ok in [
        "workers.podDisruptionBudget.enabled=true,workers.podDisruptionBudget.maxUnavailable=0",
        "workers.podDisruptionBudget.enabled=true,workers.podDisruptionBudget.minAvailable=100%",
        "workers.podDisruptionBudget.enabled=true,workers.podDisruptionBudget.minAvailable=2",
        "scratch.sizeLimit=,scratch.medium=Memory",
        "workers.resources.requests.cpu=500m,workers.resources.limits.memory=1.5Gi",
        "gang.schedulerName=volcano,gang.kueue.queueName=team_a.gpu",
        "securityContext.capabilities.add={NET_BIND_SERVICE}",
    ] {
        render(&helm, &["--set", ok]);
    }
}

/// The container's arguments as strings.
fn args_of(workload: &Value) -> Vec<String> {
    common::strings(&container(workload)["args"])
}

/// TLS and tokens: off by default (plain URLs, gRPC probes, no Secret mounted); on, every
/// pod mounts the TLS Secret and only the token its role sends, the coordinator serves TLS
/// and takes both tokens, workers present their certificate, URLs are https and the TLS
/// ports are probed over TCP.
#[test]
fn tls_and_token_secrets_are_mounted_per_role() {
    let Some(helm) = helm() else { return };
    let job = job_file();
    let off = render(&helm, &["--set-file", &job]);
    for w in workloads(&off) {
        let args = args_of(w);
        assert!(
            !args
                .iter()
                .any(|a| a.starts_with("--tls") || a.contains("token")),
            "{args:?}"
        );
        assert!(common::arg(&args, "--coordinator").is_none_or(|u| u.starts_with("http://")));
        let volumes = format!("{:?}", pod(w)["volumes"]);
        assert!(!volumes.contains("secret"), "{volumes}");
    }
    let docs = render(
        &helm,
        &[
            "--set",
            "tls.enabled=true,tls.secretName=pw-tls,tokens.enabled=true,tokens.secretName=pw-tokens",
            "--set-file",
            &job,
        ],
    );
    let [coordinator, workers, submit] = workloads(&docs);
    let tls = "/var/run/pipewise/tls";
    let tokens = "/var/run/pipewise/tokens";
    let [c, w, j] = [coordinator, workers, submit].map(args_of);
    for (args, flag, value) in [
        (&c, "--tls-cert", format!("{tls}/tls.crt")),
        (&c, "--tls-key", format!("{tls}/tls.key")),
        (&c, "--tls-client-ca", format!("{tls}/ca.crt")),
        (&c, "--submitter-token-file", format!("{tokens}/submitter")),
        (&c, "--worker-token-file", format!("{tokens}/worker")),
        (&w, "--tls-ca", format!("{tls}/ca.crt")),
        (&w, "--tls-cert", format!("{tls}/tls.crt")),
        (&w, "--token-file", format!("{tokens}/worker")),
        (&j, "--tls-ca", format!("{tls}/ca.crt")),
        (&j, "--token-file", format!("{tokens}/submitter")),
    ] {
        assert_eq!(common::arg(args, flag), Some(value.as_str()), "{args:?}");
    }
    assert!(
        common::arg(&w, "--coordinator")
            .unwrap()
            .starts_with("https://")
    );
    assert!(common::arg(&j, "--tls-cert").is_none());
    for (w, token) in [
        (coordinator, None),
        (workers, Some("worker")),
        (submit, Some("submitter")),
    ] {
        let volumes = &pod(w)["volumes"];
        assert_eq!(named(volumes, "tls")["secret"]["secretName"], "pw-tls");
        let secret = &named(volumes, "tokens")["secret"];
        assert_eq!(secret["secretName"], "pw-tokens");
        match token {
            // The coordinator reads both keys.
            None => assert!(secret["items"].is_null()),
            Some(key) => {
                assert_eq!(secret["items"].as_sequence().unwrap().len(), 1);
                assert_eq!(secret["items"][0]["key"], key);
            }
        }
        let mounts = &container(w)["volumeMounts"];
        for (name, path) in [("tls", tls), ("tokens", tokens)] {
            assert_eq!(named(mounts, name)["mountPath"], path);
            assert_eq!(named(mounts, name)["readOnly"], true);
        }
    }
    for w in [coordinator, workers] {
        for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
            let p = &container(w)[probe];
            assert!(
                p["grpc"].is_null() && p["tcpSocket"]["port"].is_number(),
                "{p:?}"
            );
        }
    }
    // Without required worker certificates the coordinator takes no client CA.
    let docs = render(
        &helm,
        &[
            "--set",
            "tls.enabled=true,tls.secretName=pw-tls,tls.requireWorkerCertificates=false",
        ],
    );
    assert!(common::arg(&args_of(one(&docs, "Deployment")), "--tls-client-ca").is_none());
}

/// Bad values of the TLS and token fields are refused by the schema, naming the field.
#[test]
fn the_schema_refuses_bad_tls_and_token_values() {
    let Some(helm) = helm() else { return };
    for (set, field) in [
        ("tls.enabled=yes", "tls.enabled"),
        ("tls.enabled=true", "secretName"),
        ("tls.enabled=true,tls.secretName=", "secretName"),
        ("tls.secretName=Bad_Name", "tls.secretName"),
        (
            "tls.requireWorkerCertificates=no",
            "tls.requireWorkerCertificates",
        ),
        ("tls.secret=x", "secret"),
        ("tokens.enabled=1", "tokens.enabled"),
        ("tokens.enabled=true", "secretName"),
        ("tokens.secretName=a..b/c", "tokens.secretName"),
        ("tokens.submitter=abc", "submitter"),
    ] {
        refused(&helm, &["--set", set], field);
    }
}
