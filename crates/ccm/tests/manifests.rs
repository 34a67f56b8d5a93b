//! The deploy manifests as operators use them: `kubectl apply --dry-run=server -f` of every
//! variant against kube-sim, schema validation against the Kubernetes 1.36 schemas, and the
//! Helm chart (rendered by a real Helm engine) agreeing with `ccm manifests` object by object.
//!
//! These tests fail (never skip) when kubectl, kubernetes-validate or the Helm engine is
//! missing: `.ci/run` installs them (`.ci/setup.d/50-deploy.sh`).

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

/// A tool on PATH, else in the workspace's `.venv/bin` (where `.ci/run` installs it).
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
            panic!("{name} not found on PATH or in .venv/bin: run .ci/run (or .ci/setup.d/50-deploy.sh) to install it")
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
        std::fs::write(
            &file,
            ccm_manifests(&[
                "--variant",
                variant,
                "--cloud-config-secret=cloud-config",
                "--cluster-cidr=10.128.0.0/9",
            ]),
        )
        .expect("write");
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
            args.extend_from_slice(extra);
            let yaml = ccm_manifests(&args);
            objects += docs(&yaml).len();
            std::fs::write(&file, yaml).expect("write");
            files.push(file);
        }
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
            serde_json::json!({"variant": "static-pod", "replicas": 3}),
            vec!["--variant=static-pod".into(), "--replicas=3".into()],
        ),
        (
            serde_json::json!({"replicas": 3, "useServiceAccountCredentials": false,
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}),
            // Values only a values file carries: `ccm manifests -f` reads the chart's format.
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
