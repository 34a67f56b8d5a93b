//! The deploy manifests as operators use them: `kubectl apply --dry-run=server -f` of every
//! variant against kube-sim, schema validation against the Kubernetes 1.36 schemas, and the
//! Helm chart (rendered by a real Helm engine) agreeing with `ccm manifests` object by object.
//!
//! These tests fail (never skip) when kubectl, kubernetes-validate or the Helm engine is
//! missing: `.ci/test` installs them (`.ci/setup.d/50-deploy.sh`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ccm_kube_sim::{Config, KubeSim};
use serde_json::Value;

const VARIANTS: &[&str] = &["deployment", "daemonset", "static-pod"];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

/// A tool on PATH, else in the workspace's `.venv/bin` (where `.ci/test` installs it).
fn tool(name: &str) -> PathBuf {
    let venv = workspace().join(".venv/bin");
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([venv, PathBuf::from("/usr/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("{name} not found on PATH or in .venv/bin: run .ci/test (or .ci/setup.d/50-deploy.sh) to install it")
        })
}

fn ccm_manifests(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ccm"))
        .arg("manifests")
        .args(args)
        .output()
        .expect("ccm manifests");
    assert!(
        out.status.success(),
        "ccm manifests {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn docs(yaml: &str) -> Vec<Value> {
    yaml.split("\n---")
        .map(|d| d.trim_start_matches("---"))
        .filter_map(|d| serde_yaml_ng::from_str::<Value>(d).ok())
        .filter(|v| !v.is_null())
        .collect()
}

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "ccm-manifests-{tag}-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn kubectl(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(tool("kubectl"))
        .args(args)
        .env("KUBECONFIG", dir.join("kubeconfig"))
        .env("HOME", dir)
        .arg(format!("--cache-dir={}", dir.join("cache").display()))
        .stdin(Stdio::null())
        .output()
        .expect("running kubectl")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_server_dry_run_accepts_every_variant_and_stores_nothing() {
    let sim = KubeSim::start(Config {
        tls: true,
        ..Config::default()
    })
    .await
    .expect("kube-sim");
    let dir = tempdir("dry-run");
    sim.write_kubeconfig(&dir.join("kubeconfig"))
        .expect("kubeconfig");
    for variant in VARIANTS {
        let file = dir.join(format!("{variant}.yaml"));
        let mut args = vec!["--variant", variant, "--cluster-cidr=10.128.0.0/9"];
        if *variant != "static-pod" {
            args.push("--cloud-config-secret=cloud-config");
        }
        std::fs::write(&file, ccm_manifests(&args)).expect("write");
        let before = sim.resource_version();
        let out = kubectl(
            &dir,
            &[
                "apply",
                "--dry-run=server",
                "-f",
                file.to_str().expect("path"),
            ],
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{variant}: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("(server dry run)"), "{variant}: {stdout}");
        assert_eq!(
            sim.resource_version(),
            before,
            "{variant}: a dry run stored something"
        );
    }
    let out = kubectl(
        &dir,
        &[
            "get",
            "deployments,daemonsets,pods,clusterroles",
            "-A",
            "-o",
            "name",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "",
        "dry runs left objects"
    );

    // The same apply for real creates everything, and a second apply changes nothing.
    let file = dir.join("deployment.yaml");
    for _ in 0..2 {
        let out = kubectl(&dir, &["apply", "-f", file.to_str().expect("path")]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = kubectl(
        &dir,
        &[
            "get",
            "deployment",
            "-n",
            "kube-system",
            "cloud-controller-manager",
            "-o",
            "json",
        ],
    );
    let d: Value = serde_json::from_slice(&out.stdout).expect("deployment json");
    // Server-side defaults are there, as on a real cluster.
    assert_eq!(d["spec"]["strategy"]["type"], "RollingUpdate");
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["successThreshold"],
        1
    );
    assert_eq!(d["metadata"]["generation"], 1, "re-apply changed the spec");

    // A broken manifest fails the dry run with kube-apiserver's message.
    let mut broken = docs(&std::fs::read_to_string(&file).expect("read"))
        .into_iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("deployment");
    broken["metadata"]["name"] = "broken".into();
    broken["spec"]["template"]["metadata"]["labels"] = serde_json::json!({"other": "x"});
    let bad = dir.join("broken.json");
    std::fs::write(&bad, serde_json::to_vec(&broken).expect("json")).expect("write");
    let out = kubectl(
        &dir,
        &[
            "apply",
            "--dry-run=server",
            "-f",
            bad.to_str().expect("path"),
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("`selector` does not match template `labels`"),
        "{err}"
    );
    sim.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_variant_validates_against_the_kubernetes_1_36_schemas() {
    let dir = tempdir("schema");
    let mut files = Vec::new();
    let mut objects = 0;
    for variant in VARIANTS {
        for extra in [
            &[][..],
            &[
                "--cloud-config-secret=c",
                "--cluster-cidr=10.0.0.0/8",
                "--extra-arg=--v=4",
            ][..],
        ] {
            let file = dir.join(format!("{variant}-{}.yaml", extra.len()));
            let mut args = vec!["--variant", variant];
            args.extend(
                extra
                    .iter()
                    .filter(|a| *variant != "static-pod" || !a.starts_with("--cloud-config")),
            );
            let yaml = ccm_manifests(&args);
            objects += docs(&yaml).len();
            std::fs::write(&file, yaml).expect("write");
            files.push(file);
        }
    }
    // The optional API Priority and Fairness objects, for each variant's identities.
    for (i, extra) in [
        &["--variant=deployment"][..],
        &["--variant=static-pod", "--rbac"][..],
    ]
    .into_iter()
    .enumerate()
    {
        let values = dir.join(format!("apf-{i}.yaml"));
        std::fs::write(&values, "apf:\n  enabled: true\n").expect("write");
        let mut args = vec!["--values", values.to_str().expect("utf-8")];
        args.extend(extra);
        let yaml = ccm_manifests(&args);
        objects += docs(&yaml).len();
        let file = dir.join(format!("apf-{i}-objects.yaml"));
        std::fs::write(&file, yaml).expect("write");
        files.push(file);
    }
    let out = Command::new(tool("kubernetes-validate"))
        .args(["--strict", "--kubernetes-version", "1.36.0"])
        .args(&files)
        .output()
        .expect("kubernetes-validate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    // It names each valid object; make sure it saw them all, against 1.36.
    assert_eq!(
        text.matches("against version 1.36").count(),
        objects,
        "{text}"
    );

    // And it is not a rubber stamp: a misspelt field fails strict validation.
    let bad = dir.join("bad.yaml");
    std::fs::write(
        &bad,
        ccm_manifests(&[]).replace("hostNetwork:", "hostNetwrk:"),
    )
    .expect("write");
    let out = Command::new(tool("kubernetes-validate"))
        .args(["--strict", "--kubernetes-version", "1.36.0"])
        .arg(&bad)
        .output()
        .expect("kubernetes-validate");
    assert!(!out.status.success(), "a misspelt field passed");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Objects keyed by kind and name, for comparisons that do not depend on order.
fn by_key(objects: Vec<Value>) -> std::collections::BTreeMap<String, Value> {
    objects
        .into_iter()
        .map(|o| {
            (
                format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap_or_default(),
                    o["metadata"]["name"].as_str().unwrap_or_default()
                ),
                o,
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_chart_renders_what_ccm_manifests_prints() {
    let chart = workspace().join("deploy/helm/ccm-rs");
    let script = workspace().join("deploy/helm/helm.py");
    let helm = tool("helm-python");
    let lint = Command::new(&helm)
        .arg(&script)
        .arg("lint")
        .arg(&chart)
        .output()
        .expect("helm lint");
    assert!(
        lint.status.success(),
        "helm lint: {}{}",
        String::from_utf8_lossy(&lint.stdout),
        String::from_utf8_lossy(&lint.stderr)
    );

    let dir = tempdir("helm");
    // (values as Helm gets them, the same values as `ccm manifests` flags)
    let cases: Vec<(Value, Vec<String>)> = vec![
        (serde_json::json!({}), vec![]),
        (
            serde_json::json!({"variant": "daemonset", "provider": "metal",
                "image": {"repository": "registry.example/ccm", "tag": "v9"},
                "cloudConfigSecret": "metal-config", "clusterCIDR": "10.244.0.0/16",
                "extraArgs": ["--concurrent-service-syncs=10", "--v=2"]}),
            [
                "--variant=daemonset",
                "--provider=metal",
                "--image=registry.example/ccm:v9",
                "--cloud-config-secret=metal-config",
                "--cluster-cidr=10.244.0.0/16",
                "--extra-arg=--concurrent-service-syncs=10",
                "--extra-arg=--v=2",
            ]
            .map(String::from)
            .to_vec(),
        ),
        (
            serde_json::json!({"replicas": 3, "useServiceAccountCredentials": false,
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}),
            // Values only a values file carries: `ccm manifests -f` reads the chart's format.
            vec!["--values".into(), "VALUES_FILE".into()],
        ),
        (
            fitted_values(),
            vec!["--values".into(), "VALUES_FILE".into()],
        ),
        (
            serde_json::json!({"provider": "metal", "metal": {"credentialsSecrets": ["bmc-rack1"]}}),
            vec!["--values".into(), "VALUES_FILE".into()],
        ),
        (
            serde_json::json!({"provider": "metal", "metal": {"announceLoadBalancers": true}}),
            vec!["--values".into(), "VALUES_FILE".into()],
        ),
        (
            serde_json::json!({"apf": {"enabled": true, "nominalConcurrencyShares": 20}}),
            vec!["--values".into(), "VALUES_FILE".into()],
        ),
        // The webhook with a Secret the operator provides (kube-sim stores the
        // MutatingWebhookConfiguration; cert-manager's CRDs it does not serve).
        (
            webhook_values("secret"),
            vec!["--values".into(), "VALUES_FILE".into()],
        ),
    ];
    for (i, (values, args)) in cases.into_iter().enumerate() {
        let values_file = dir.join(format!("values-{i}.json"));
        std::fs::write(&values_file, serde_json::to_vec(&values).expect("json")).expect("write");
        let args: Vec<String> = args
            .into_iter()
            .map(|a| {
                if a == "VALUES_FILE" {
                    values_file.display().to_string()
                } else {
                    a
                }
            })
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let ours = by_key(docs(&ccm_manifests(&args)));

        // A real install into kube-sim: Helm renders, and the API server takes every object.
        // TLS: client-go (inside Helm) sends no bearer token over plain HTTP.
        let sim = KubeSim::start(Config {
            tls: true,
            ..Config::default()
        })
        .await
        .expect("kube-sim");
        let kubeconfig = dir.join(format!("kubeconfig-{i}"));
        sim.write_kubeconfig(&kubeconfig).expect("kubeconfig");
        let out = tokio::process::Command::new(&helm)
            .arg(&script)
            .arg("install")
            .arg(&chart)
            .arg(&kubeconfig)
            .arg(format!("ccm-{i}"))
            .arg(values.to_string())
            .env("HELM_DRIVER", "memory")
            .output()
            .await
            .expect("helm install");
        assert!(
            out.status.success(),
            "helm install {values}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let theirs = by_key(docs(&String::from_utf8_lossy(&out.stdout)));
        assert_eq!(
            theirs.keys().collect::<Vec<_>>(),
            ours.keys().collect::<Vec<_>>(),
            "values {values}: different objects"
        );
        for (k, o) in &ours {
            assert_eq!(&theirs[k], o, "values {values}: {k} differs");
        }
        let workload = ours
            .keys()
            .find(|k| {
                k.starts_with("Deployment/") || k.starts_with("DaemonSet/") || k.starts_with("Pod/")
            })
            .expect("a workload");
        let (kind, name) = workload.split_once('/').expect("key");
        let plural = match kind {
            "Deployment" => "/apis/apps/v1/namespaces/kube-system/deployments",
            "DaemonSet" => "/apis/apps/v1/namespaces/kube-system/daemonsets",
            _ => "/api/v1/namespaces/kube-system/pods",
        };
        let req = http::Request::get(format!("{plural}/{name}"))
            .body(Vec::new())
            .expect("request");
        sim.client()
            .expect("client")
            .request::<Value>(req)
            .await
            .unwrap_or_else(|e| panic!("helm did not create {workload}: {e}"));
        sim.shutdown().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Values that fit the chart to a particular cluster, as the charts of cloud-provider-aws,
/// hcloud and openstack expose them.
fn fitted_values() -> Value {
    serde_json::json!({
        "replicas": 2,
        "provider": "aws",
        "nodeSelector": {"node-role.kubernetes.io/control-plane": "true"},
        "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
        "env": [
            {"name": "KUBERNETES_SERVICE_HOST", "value": "10.0.0.10"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"},
            {"name": "AWS_REGION", "valueFrom": {"configMapKeyRef": {"name": "aws", "key": "region"}}}
        ],
        "imagePullSecrets": [{"name": "regcred"}],
        "podAnnotations": {"example.com/team": "platform"},
        "podLabels": {"team": "platform"},
        "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/ccm"}},
        "extraVolumes": [{"name": "ca", "hostPath": {"path": "/etc/pki", "type": "Directory"}}],
        "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/pki", "readOnly": true}],
        "dnsPolicy": "ClusterFirstWithHostNet",
        "priorityClassName": "system-node-critical",
        "cloudConfig": "[Global]\nZone = us-east-1a\n",
        "metrics": {"readerSubjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}]},
        // The dashboard ConfigMap through the real Helm engine (a PrometheusRule needs the
        // Prometheus Operator's CRD, which kube-sim does not serve).
        "monitoring": {"dashboards": {"enabled": true}}
    })
}

fn one<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
}

fn ccm_manifests_err(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ccm"))
        .arg("manifests")
        .args(args)
        .output()
        .expect("ccm manifests");
    assert!(!out.status.success(), "ccm manifests {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).to_string()
}

/// Hostname anti-affinity and the host network's port: no node can take a surge pod, so a
/// rolling update with a surge waits forever. The rendered Deployment must replace pods in
/// place, and a PodDisruptionBudget must leave a drain something to evict.
#[test]
fn upgrades_never_wait_for_a_surge_pod_and_drains_are_never_blocked() {
    for replicas in ["1", "2", "3"] {
        let objects = docs(&ccm_manifests(&[&format!("--replicas={replicas}")]));
        let d = one(&objects, "Deployment");
        let spec = &d["spec"]["template"]["spec"];
        let hostname_anti_affinity =
            spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                .as_array()
                .is_some_and(|t| {
                    t.iter()
                        .any(|t| t["topologyKey"] == "kubernetes.io/hostname")
                });
        assert!(spec["hostNetwork"] == true && hostname_anti_affinity);
        let strategy = &d["spec"]["strategy"];
        assert!(
            strategy["type"] == "Recreate"
                || (strategy["rollingUpdate"]["maxSurge"] == 0
                    && strategy["rollingUpdate"]["maxUnavailable"].as_u64() >= Some(1)),
            "replicas {replicas}: a surge pod could never schedule: {strategy}"
        );
        let pdb = objects.iter().find(|o| o["kind"] == "PodDisruptionBudget");
        let n: u64 = replicas.parse().expect("n");
        match pdb {
            None => assert_eq!(n, 1, "replicas {replicas}: no PodDisruptionBudget"),
            Some(p) => {
                assert!(
                    n > 1,
                    "a PodDisruptionBudget on one replica blocks every drain"
                );
                let allows = p["spec"]["maxUnavailable"].as_u64().unwrap_or(0) >= 1
                    || p["spec"]["minAvailable"].as_u64().is_some_and(|m| m < n);
                assert!(allows, "replicas {replicas}: {p}");
            }
        }
    }
    let ds = docs(&ccm_manifests(&["--variant=daemonset"]));
    let u = &one(&ds, "DaemonSet")["spec"]["updateStrategy"]["rollingUpdate"];
    assert_eq!(u["maxSurge"], 0, "{u}");
    assert!(!ds.iter().any(|o| o["kind"] == "PodDisruptionBudget"));
}

/// The static pod is exactly one Pod document a kubelet reads from its manifest directory:
/// no ServiceAccount, no Secret or other API object, host paths only, running as the owner of
/// kubeadm's root-owned 0600 kubeconfig. Its RBAC is a second stream for `kubectl apply`, and
/// Helm refuses the variant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_static_pod_is_one_pod_a_kubelet_starts() {
    let text = ccm_manifests(&["--variant=static-pod", "--cluster-cidr=10.0.0.0/8"]);
    assert!(!text.contains("\n---"), "more than one document:\n{text}");
    let pod: Value = serde_yaml_ng::from_str(&text).expect("one YAML document");
    assert_eq!(
        (pod["apiVersion"].as_str(), pod["kind"].as_str()),
        (Some("v1"), Some("Pod"))
    );
    assert_eq!(pod["metadata"]["namespace"], "kube-system");
    let spec = &pod["spec"];
    for field in [
        "serviceAccountName",
        "serviceAccount",
        "imagePullSecrets",
        "nodeName",
    ] {
        assert!(spec[field].is_null(), "a static pod cannot have {field}");
    }
    for vol in spec["volumes"].as_array().expect("volumes") {
        let kinds: Vec<&String> = vol
            .as_object()
            .expect("volume")
            .keys()
            .filter(|k| *k != "name")
            .collect();
        assert_eq!(kinds, ["hostPath"], "not a host path: {vol}");
    }
    let args: Vec<&str> = spec["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let kubeconfig = args
        .iter()
        .find_map(|a| a.strip_prefix("--kubeconfig="))
        .expect("--kubeconfig");
    assert!(
        spec["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .any(|v| v["hostPath"]["path"] == kubeconfig),
        "the kubeconfig is not mounted from the host"
    );
    // kubeadm writes its kubeconfigs root:root 0600: only uid 0 reads them.
    let ctx = &spec["securityContext"];
    assert_eq!(ctx["runAsUser"], 0, "{ctx}");
    assert_ne!(ctx["runAsNonRoot"], true, "{ctx}");
    assert_eq!(
        spec["containers"][0]["securityContext"]["capabilities"]["drop"][0],
        "ALL"
    );
    assert_eq!(spec["hostNetwork"], true);

    let dir = tempdir("static");
    let file = dir.join("cloud-controller-manager.yaml");
    std::fs::write(&file, &text).expect("write");
    let out = Command::new(tool("kubernetes-validate"))
        .args(["--strict", "--kubernetes-version", "1.36.0"])
        .arg(&file)
        .output()
        .expect("kubernetes-validate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let rbac = docs(&ccm_manifests(&["--variant=static-pod", "--rbac"]));
    assert!(!rbac.is_empty());
    assert!(rbac.iter().all(|o| o["kind"] != "Pod"));
    assert!(
        rbac.iter()
            .filter(|o| o["kind"] == "ClusterRoleBinding"
                && o["metadata"]["name"] == "ccm-rs:cloud-controller-manager")
            .all(|b| b["subjects"][0]["kind"] == "User")
    );

    let err = ccm_manifests_err(&["--variant=static-pod", "--cloud-config-secret=c"]);
    assert!(err.contains("cannot mount a Secret"), "{err}");

    let sim = KubeSim::start(Config {
        tls: true,
        ..Config::default()
    })
    .await
    .expect("kube-sim");
    let kubeconfig = dir.join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let out = helm_install(
        &kubeconfig,
        "static",
        &serde_json::json!({"variant": "static-pod"}),
        "kube-system",
        None,
    )
    .await;
    assert!(!out.status.success(), "helm installed a static pod");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ccm manifests --variant static-pod"), "{err}");
    sim.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

async fn helm_install(
    kubeconfig: &Path,
    name: &str,
    values: &Value,
    namespace: &str,
    upgrade: Option<&Value>,
) -> std::process::Output {
    let mut cmd = tokio::process::Command::new(tool("helm-python"));
    cmd.arg(workspace().join("deploy/helm/helm.py"))
        .arg("install")
        .arg(workspace().join("deploy/helm/ccm-rs"))
        .arg(kubeconfig)
        .arg(name)
        .arg(values.to_string())
        .arg(namespace)
        .env("HELM_DRIVER", "memory");
    if let Some(u) = upgrade {
        cmd.arg(u.to_string());
    }
    cmd.output().await.expect("helm-python")
}

/// A misspelt value, an unknown provider or variant: an error naming it, from `ccm manifests`
/// and from Helm (values.schema.json), never a silent default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_providers_variants_and_values_are_errors() {
    let err = ccm_manifests_err(&["--provider=bogus"]);
    assert!(
        err.contains("provider \"bogus\"") && err.contains("sim, aws, metal"),
        "{err}"
    );
    let err = ccm_manifests_err(&["--variant=bogus"]);
    assert!(err.contains("bogus"), "{err}");
    let dir = tempdir("unknown");
    let file = dir.join("values.yaml");
    std::fs::write(&file, "nodeSelectr:\n  x: y\n").expect("write");
    let err = ccm_manifests_err(&["--values", file.to_str().expect("path")]);
    assert!(err.contains("unknown key \"nodeSelectr\""), "{err}");
    std::fs::write(&file, "metrics:\n  serviceMonitor:\n    enabld: true\n").expect("write");
    let err = ccm_manifests_err(&["--values", file.to_str().expect("path")]);
    assert!(err.contains("metrics.serviceMonitor.enabld"), "{err}");

    let sim = KubeSim::start(Config {
        tls: true,
        ..Config::default()
    })
    .await
    .expect("kube-sim");
    let kubeconfig = dir.join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    for (i, values) in [
        serde_json::json!({"provider": "bogus"}),
        serde_json::json!({"variant": "bogus"}),
        serde_json::json!({"nodeSelectr": {"x": "y"}}),
        serde_json::json!({"metrics": {"serviceMonitor": {"enabld": true}}}),
    ]
    .iter()
    .enumerate()
    {
        let out = helm_install(
            &kubeconfig,
            &format!("bad-{i}"),
            values,
            "kube-system",
            None,
        )
        .await;
        assert!(!out.status.success(), "helm accepted {values}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("schema") || err.contains("bogus"),
            "{values}: {err}"
        );
    }
    sim.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// `helm install -n X`: the CCM's ServiceAccount, workload and Secret go to X; its Lease's and
/// the controllers' token grants stay where the CCM uses them (kube-system). An upgrade
/// renders the same way and keeps the in-place update strategy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_namespace_is_honoured_and_an_upgrade_renders_the_same() {
    let dir = tempdir("namespace");
    let sim = KubeSim::start(Config {
        tls: true,
        ..Config::default()
    })
    .await
    .expect("kube-sim");
    let kubeconfig = dir.join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "cloud"}})).expect("ns");
    kube::Api::all(sim.client().expect("client"))
        .create(&Default::default(), &ns)
        .await
        .expect("namespace");
    let values = serde_json::json!({"cloudConfig": "a = 1\n"});
    let upgrade = serde_json::json!({"cloudConfig": "a = 2\n", "image": {"repository": "ghcr.io/ccm-rs/ccm", "tag": "0.2.0"}});
    let out = helm_install(&kubeconfig, "ccm", &values, "cloud", Some(&upgrade)).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs = by_key(docs(&String::from_utf8_lossy(&out.stdout)));
    let file = dir.join("values.json");
    std::fs::write(&file, upgrade.to_string()).expect("write");
    let ours = by_key(docs(&ccm_manifests(&[
        "-n",
        "cloud",
        "--values",
        file.to_str().expect("path"),
    ])));
    assert_eq!(theirs, ours);
    for (k, o) in &ours {
        let ns = o["metadata"]["namespace"].as_str();
        let expected = match k.as_str() {
            k if k.starts_with("Role")
                || k.starts_with("ServiceAccount/")
                    && !k.ends_with("/cloud-controller-manager") =>
            {
                Some("kube-system")
            }
            k if k.starts_with("Cluster") => None,
            _ => Some("cloud"),
        };
        assert_eq!(ns, expected, "{k}");
    }
    let d = &ours["Deployment/cloud-controller-manager"];
    assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxSurge"], 0);
    let sum = &d["spec"]["template"]["metadata"]["annotations"]["checksum/cloud-config"];
    assert_eq!(sum.as_str().map(str::len), Some(64), "{sum}");
    let before = by_key(docs(&ccm_manifests(&["-n", "cloud", "--values", {
        std::fs::write(&file, values.to_string()).expect("write");
        file.to_str().expect("path")
    }])));
    assert_ne!(
        &before["Deployment/cloud-controller-manager"]["spec"]["template"]["metadata"]["annotations"]
            ["checksum/cloud-config"],
        sum,
        "a changed cloud config must roll the pods"
    );
    sim.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The RBAC objects, keyed by kind and name.
fn rbac_of(args: &[&str]) -> std::collections::BTreeMap<String, Value> {
    by_key(docs(&ccm_manifests(args)))
        .into_iter()
        .filter(|(k, _)| k.starts_with("Role") || k.starts_with("ClusterRole"))
        .collect()
}

/// A provider's own API calls are granted only with that provider. The AWS provider makes
/// none (it talks to AWS only), so its grants are sim's; the metal provider patches Services
/// (kube-vip's annotation) and their status (clearing a sharer that gave its address up), lists Services and Nodes (already the manager's: its informers),
/// and reads the BMC credential Secrets the cloud config names, and nothing else.
#[test]
fn provider_grants_follow_the_provider() {
    let sim = rbac_of(&["--provider=sim"]);
    assert_eq!(
        rbac_of(&["--provider=aws"]),
        sim,
        "aws grants differ from sim's"
    );
    let metal = rbac_of(&["--provider=metal"]);
    let extra: Vec<&String> = metal.keys().filter(|k| !sim.contains_key(*k)).collect();
    assert_eq!(
        extra,
        [
            "ClusterRole/ccm-rs:provider-metal",
            "ClusterRoleBinding/ccm-rs:provider-metal"
        ]
    );
    assert_eq!(
        metal["ClusterRole/ccm-rs:provider-metal"]["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["services", "services/status"], "verbs": ["patch"]}])
    );
    assert_eq!(
        metal["ClusterRoleBinding/ccm-rs:provider-metal"]["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": "cloud-controller-manager", "namespace": "kube-system"}])
    );
    for (k, o) in &sim {
        assert_eq!(&metal[k], o, "{k}");
    }
    // list/watch nodes and services: the manager's own grant, which the provider shares.
    let manager = &sim["ClusterRole/ccm-rs:cloud-controller-manager"]["rules"][0];
    assert_eq!(
        manager["resources"],
        serde_json::json!(["nodes", "services"])
    );
    assert_eq!(manager["verbs"], serde_json::json!(["list", "watch"]));

    let dir = tempdir("metal");
    let file = dir.join("values.yaml");
    std::fs::write(
        &file,
        "provider: metal\nmetal:\n  credentialsSecrets: [bmc-rack1, bmc-rack2]\n",
    )
    .expect("write");
    let with_secrets = rbac_of(&["--values", file.to_str().expect("path")]);
    assert_eq!(
        with_secrets["Role/ccm-rs:provider-metal"]["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["secrets"],
            "resourceNames": ["bmc-rack1", "bmc-rack2"], "verbs": ["get"]}])
    );
    std::fs::write(
        &file,
        "provider: sim\nmetal:\n  credentialsSecrets: [bmc-rack1]\n",
    )
    .expect("write");
    assert_eq!(rbac_of(&["--values", file.to_str().expect("path")]), sim);
    // LoadBalancer addresses over BGP: the EndpointSlice watch, with metal only.
    std::fs::write(
        &file,
        "provider: metal\nmetal:\n  announceLoadBalancers: true\n",
    )
    .expect("write");
    let with_bgp = rbac_of(&["--values", file.to_str().expect("path")]);
    assert_eq!(
        with_bgp["ClusterRole/ccm-rs:provider-metal"]["rules"],
        serde_json::json!([
            {"apiGroups": [""], "resources": ["services", "services/status"], "verbs": ["patch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}
        ])
    );
    std::fs::write(
        &file,
        "provider: sim\nmetal:\n  announceLoadBalancers: true\n",
    )
    .expect("write");
    assert_eq!(rbac_of(&["--values", file.to_str().expect("path")]), sim);
    let _ = std::fs::remove_dir_all(&dir);
}

const TEST_CA: &str = "-----BEGIN CERTIFICATE-----\nMIIBtest\n-----END CERTIFICATE-----\n";

fn webhook_values(certificates: &str) -> Value {
    serde_json::json!({"provider": "aws", "webhooks": {
        "persistentVolumeLabel": {"enabled": true},
        "certificates": certificates,
        "secret": {"name": "ccm-webhook-tls", "caBundle": if certificates == "secret" { TEST_CA } else { "" }},
    }})
}

fn render_values(dir: &Path, values: &Value) -> Vec<Value> {
    let file = dir.join("values.json");
    std::fs::write(&file, serde_json::to_vec(values).expect("json")).expect("write");
    docs(&ccm_manifests(&["--values", file.to_str().expect("path")]))
}

/// Off unless enabled; enabled, everything a cluster needs to call it: the flags and port, the
/// Service, the MutatingWebhookConfiguration the labeler is meant for, and a certificate the
/// API server trusts (cert-manager's Certificate with its CA injected, or the operator's).
#[test]
fn the_webhook_is_off_unless_enabled_and_complete_when_enabled() {
    let dir = tempdir("webhook");
    let off = docs(&ccm_manifests(&[]));
    assert!(
        !off.iter()
            .any(|o| o["kind"] == "MutatingWebhookConfiguration"
                || o["metadata"]["name"] == "cloud-controller-manager-webhook")
    );
    let args =
        one(&off, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(!args.contains("--webhooks"), "{args}");

    let on = render_values(&dir, &webhook_values("cert-manager"));
    let pod = &one(&on, "Deployment")["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for want in [
        "--webhooks=persistentvolumelabel",
        "--feature-gates=CloudControllerManagerWebhook=true",
        "--webhook-secure-port=10260",
        "--webhook-tls-cert-file=/etc/kubernetes/webhook-tls/tls.crt",
        "--webhook-tls-private-key-file=/etc/kubernetes/webhook-tls/tls.key",
    ] {
        assert!(args.contains(&want), "{want} missing: {args:?}");
    }
    assert!(
        c["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["containerPort"] == 10260 && p["name"] == "webhook")
    );
    assert!(
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["secret"]["secretName"] == "cloud-controller-manager-webhook-tls")
    );
    let svc = on
        .iter()
        .find(|o| {
            o["kind"] == "Service" && o["metadata"]["name"] == "cloud-controller-manager-webhook"
        })
        .expect("service");
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "webhook");
    let cert = one(&on, "Certificate");
    assert_eq!(
        cert["spec"]["secretName"],
        "cloud-controller-manager-webhook-tls"
    );
    assert!(
        cert["spec"]["dnsNames"]
            .to_string()
            .contains("cloud-controller-manager-webhook.kube-system.svc")
    );
    assert_eq!(
        cert["spec"]["issuerRef"]["name"],
        one(&on, "Issuer")["metadata"]["name"]
    );
    let mwc = one(&on, "MutatingWebhookConfiguration");
    assert_eq!(
        mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "kube-system/cloud-controller-manager-webhook"
    );
    let hook = &mwc["webhooks"][0];
    assert_eq!(hook["failurePolicy"], "Fail");
    assert_eq!(hook["sideEffects"], "None");
    assert_eq!(hook["timeoutSeconds"], 10);
    assert_eq!(
        hook["rules"][0]["operations"],
        serde_json::json!(["CREATE"])
    );
    assert_eq!(
        hook["rules"][0]["resources"],
        serde_json::json!(["persistentvolumes"])
    );
    assert_eq!(
        hook["clientConfig"]["service"]["name"],
        "cloud-controller-manager-webhook"
    );
    assert_eq!(
        hook["clientConfig"]["service"]["path"],
        "/persistentvolumelabel"
    );

    // The Helm engine executes the cert-manager branch too (a copy of the chart whose
    // defaults enable the webhook; lint renders the templates with them). An install, as in
    // `helm_chart_renders_what_ccm_manifests_prints`, needs cert-manager's CRDs.
    let chart = dir.join("chart");
    copy_dir(&workspace().join("deploy/helm/ccm-rs"), &chart);
    let values = std::fs::read_to_string(chart.join("values.yaml")).expect("values");
    let enabled = values.replacen(
        "persistentVolumeLabel:\n    enabled: false",
        "persistentVolumeLabel:\n    enabled: true",
        1,
    );
    assert_ne!(
        values, enabled,
        "values.yaml has webhooks.persistentVolumeLabel.enabled"
    );
    std::fs::write(chart.join("values.yaml"), enabled).expect("write");
    let lint = Command::new(tool("helm-python"))
        .arg(workspace().join("deploy/helm/helm.py"))
        .arg("lint")
        .arg(&chart)
        .output()
        .expect("helm lint");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&lint.stdout),
        String::from_utf8_lossy(&lint.stderr)
    );
    // Lint reports a template error as a failure, and logs (only) a `fail` it hit.
    assert!(
        lint.status.success() && !said.contains("funcMap fail"),
        "helm lint with the webhook on: {said}"
    );

    // The operator's own Secret: its CA is the caBundle, and the whole set validates.
    let secret = render_values(&dir, &webhook_values("secret"));
    let hook = &one(&secret, "MutatingWebhookConfiguration")["webhooks"][0];
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD
        .decode(hook["clientConfig"]["caBundle"].as_str().expect("caBundle"))
        .expect("base64");
    assert_eq!(String::from_utf8_lossy(&ca), TEST_CA);
    assert!(!secret.iter().any(|o| o["kind"] == "Certificate"));
    let file = dir.join("secret.yaml");
    let yaml: String = secret
        .iter()
        .map(|o| format!("---\n{}", serde_yaml_ng::to_string(o).unwrap()))
        .collect();
    std::fs::write(&file, yaml).expect("write");
    let out = Command::new(tool("kubernetes-validate"))
        .args(["--strict", "--kubernetes-version", "1.36.0"])
        .arg(&file)
        .output()
        .expect("kubernetes-validate");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // What cannot work is refused, naming the values to set.
    let mut incomplete = webhook_values("secret");
    incomplete["webhooks"]["secret"]["caBundle"] = serde_json::json!("");
    std::fs::write(dir.join("bad.json"), incomplete.to_string()).expect("write");
    let err = ccm_manifests_err(&["--values", dir.join("bad.json").to_str().unwrap()]);
    assert!(err.contains("webhooks.secret.caBundle"), "{err}");
    std::fs::write(
        dir.join("pod.json"),
        webhook_values("cert-manager").to_string(),
    )
    .expect("write");
    let err = ccm_manifests_err(&[
        "--variant",
        "static-pod",
        "--values",
        dir.join("pod.json").to_str().unwrap(),
    ]);
    assert!(err.contains("webhooks"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let path = entry.expect("entry").path();
        let dest = to.join(path.file_name().expect("name"));
        if path.is_dir() {
            copy_dir(&path, &dest);
        } else {
            std::fs::copy(&path, &dest).expect("copy");
        }
    }
}

/// With `apf.enabled`, every identity the CCM sends requests as lands in its FlowSchema (the
/// manager's ServiceAccount, or the static pod's user, and each controller's ServiceAccount),
/// the Lease renewals of the manager in `leader-election`; without it, no flowcontrol object.
#[test]
fn apf_objects_cover_every_identity_of_the_ccm() {
    assert!(
        !ccm_manifests(&[]).contains("flowcontrol.apiserver.k8s.io"),
        "APF objects are optional"
    );
    let dir = tempdir("apf");
    let values = dir.join("apf.yaml");
    std::fs::write(&values, "apf:\n  enabled: true\n").expect("write");
    let v = values.to_str().expect("utf-8");
    for (args, manager) in [
        (
            vec!["--values", v],
            serde_json::json!({"kind": "ServiceAccount",
                "serviceAccount": {"name": "cloud-controller-manager", "namespace": "kube-system"}}),
        ),
        (
            vec!["--values", v, "--namespace", "ccm"],
            serde_json::json!({"kind": "ServiceAccount",
                "serviceAccount": {"name": "cloud-controller-manager", "namespace": "ccm"}}),
        ),
        (
            vec!["--values", v, "--variant", "static-pod", "--rbac"],
            serde_json::json!({"kind": "User", "user": {"name": "system:cloud-controller-manager"}}),
        ),
    ] {
        let objects = docs(&ccm_manifests(&args));
        let schemas: Vec<&Value> = objects
            .iter()
            .filter(|o| o["kind"] == "FlowSchema")
            .collect();
        assert_eq!(schemas.len(), 2, "{args:?}");
        let all = schemas
            .iter()
            .find(|o| o["spec"]["priorityLevelConfiguration"]["name"] == "cloud-controller-manager")
            .expect("the CCM's FlowSchema");
        let subjects = all["spec"]["rules"][0]["subjects"]
            .as_array()
            .expect("subjects");
        assert!(subjects.contains(&manager), "{args:?}: {subjects:?}");
        let controller_sas: Vec<&Value> = objects
            .iter()
            .filter(|o| {
                o["kind"] == "ServiceAccount" && o["metadata"]["name"] != "cloud-controller-manager"
            })
            .collect();
        for sa in &controller_sas {
            let subject = serde_json::json!({"kind": "ServiceAccount", "serviceAccount":
                {"name": sa["metadata"]["name"], "namespace": sa["metadata"]["namespace"]}});
            assert!(subjects.contains(&subject), "{args:?}: {subject} missing");
        }
        let leases = schemas
            .iter()
            .find(|o| o["spec"]["priorityLevelConfiguration"]["name"] == "leader-election")
            .expect("the leases' FlowSchema");
        assert_eq!(
            leases["spec"]["rules"][0]["subjects"],
            serde_json::json!([manager])
        );
        let level = objects
            .iter()
            .find(|o| o["kind"] == "PriorityLevelConfiguration")
            .expect("the CCM's priority level");
        assert_eq!(level["spec"]["limited"]["nominalConcurrencyShares"], 30);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
