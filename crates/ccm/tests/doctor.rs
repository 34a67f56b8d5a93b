//! `ccm doctor` against kube-sim, as an operator runs it: the real binary reads a broken cluster
//! (and proves it wrote nothing), then `kubectl ccm doctor` — kubectl's plugin mechanism finding
//! `kubectl-ccm` on PATH — reads the same cluster once it is repaired.

use std::path::Path;
use std::process::{Command, Output};

use ccm_kube_sim::{Config, KubeSim};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const UNINIT: &str = "node.cloudprovider.kubernetes.io/uninitialized";

async fn create<K>(api: &Api<K>, v: Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(v).expect("object");
    api.create(&PostParams::default(), &obj)
        .await
        .expect("create")
}

async fn set_status<K>(api: &Api<K>, name: &str, status: Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .expect("status");
}

fn now() -> String {
    jiff::Timestamp::now().to_string()
}

/// The classic broken install: kubelets external, but the CCM Deployment's pod lacks the
/// tolerations and hostNetwork, and kube-controller-manager still runs its cloud loops.
async fn broken_cluster(c: &kube::Client) {
    let nodes: Api<Node> = Api::all(c.clone());
    for (name, ready) in [("node-a", "True"), ("node-b", "False")] {
        create(
            &nodes,
            json!({"metadata": {"name": name},
            "spec": {"taints": [{"key": UNINIT, "value": "true", "effect": "NoSchedule"}]}}),
        )
        .await;
        set_status(
            &nodes,
            name,
            json!({"conditions": [{"type": "Ready", "status": ready,
            "reason": if ready == "True" { "KubeletReady" } else { "NetworkPluginNotReady" },
            "message": "cni plugin not initialized"}]}),
        )
        .await;
    }
    let pods: Api<Pod> = Api::namespaced(c.clone(), "kube-system");
    create(&pods, json!({"metadata": {"name": "cloud-controller-manager-6c5d8-x7k2p",
            "labels": {"app.kubernetes.io/name": "cloud-controller-manager"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "cloud-controller-manager-6c5d8",
                "uid": "1", "controller": true}]},
        "spec": {"containers": [{"name": "ccm", "image": "ccm-rs:dev", "command": ["/ccm"],
            "args": ["--cloud-provider=sim"]}]}})).await;
    set_status(
        &pods,
        "cloud-controller-manager-6c5d8-x7k2p",
        json!({"phase": "Pending"}),
    )
    .await;
    create(&pods, json!({"metadata": {"name": "kube-controller-manager-node-a",
            "labels": {"component": "kube-controller-manager"}},
        "spec": {"nodeName": "node-a", "containers": [{"name": "kube-controller-manager",
            "command": ["kube-controller-manager", "--cloud-provider=gce", "--leader-elect=true"]}]}})).await;
    let svcs: Api<Service> = Api::namespaced(c.clone(), "default");
    create(
        &svcs,
        json!({"metadata": {"name": "shop"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}),
    )
    .await;
    create(
        &svcs,
        json!({"metadata": {"name": "legacy"},
        "spec": {"ports": [{"port": 80}], "externalIPs": ["198.51.100.7"]}}),
    )
    .await;
    let events: Api<Event> = Api::namespaced(c.clone(), "default");
    create(
        &events,
        json!({"metadata": {"name": "shop.1"},
        "involvedObject": {"kind": "Service", "name": "shop", "namespace": "default"},
        "type": "Warning", "reason": "SyncLoadBalancerFailed", "lastTimestamp": now(),
        "message": "Error syncing load balancer: quota exceeded"}),
    )
    .await;
}

/// What the CCM, the kubelets and the operator would have done to repair it.
async fn repair(c: &kube::Client, metrics_port: u16) {
    let nodes: Api<Node> = Api::all(c.clone());
    for name in ["node-a", "node-b"] {
        nodes
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({
            "metadata": {"labels": {"topology.kubernetes.io/zone": "z1",
                "topology.kubernetes.io/region": "r1", "node.kubernetes.io/instance-type": "m1"}},
            "spec": {"taints": null, "providerID": format!("sim://{name}")}})),
            )
            .await
            .expect("node");
        set_status(&nodes, name, json!({"conditions": [{"type": "Ready", "status": "True",
            "reason": "KubeletReady"}], "addresses": [{"type": "InternalIP", "address": "10.0.0.2"}]})).await;
    }
    let pods: Api<Pod> = Api::namespaced(c.clone(), "kube-system");
    pods.delete(
        "cloud-controller-manager-6c5d8-x7k2p",
        &DeleteParams::default(),
    )
    .await
    .expect("delete");
    // The metrics endpoint is kube-sim's own HTTPS /metrics: same CA, same bearer token as a
    // CCM delegating authentication to the API server would accept.
    create(
        &pods,
        json!({"metadata": {"name": "cloud-controller-manager-7f9b4-q2w8e",
            "labels": {"app.kubernetes.io/name": "cloud-controller-manager"}},
        "spec": {"hostNetwork": true, "nodeName": "node-a",
            "tolerations": [{"key": UNINIT, "operator": "Exists"}],
            "containers": [{"name": "ccm", "image": "ccm-rs:dev", "command": ["/ccm"],
                "args": ["--cloud-provider=sim", format!("--secure-port={metrics_port}")]}]}}),
    )
    .await;
    set_status(
        &pods,
        "cloud-controller-manager-7f9b4-q2w8e",
        json!({"phase": "Running", "podIP": "127.0.0.1",
        "containerStatuses": [{"name": "ccm", "image": "ccm-rs:dev", "imageID": "", "ready": true,
            "restartCount": 0, "state": {"running": {}}}]}),
    )
    .await;
    pods.patch(
        "kube-controller-manager-node-a",
        &PatchParams::default(),
        &Patch::Merge(json!({
        "spec": {"containers": [{"name": "kube-controller-manager",
            "command": ["kube-controller-manager", "--cloud-provider=external"]}]}})),
    )
    .await
    .expect("kcm");
    let leases: Api<Lease> = Api::namespaced(c.clone(), "kube-system");
    create(
        &leases,
        json!({"metadata": {"name": "cloud-controller-manager"},
        "spec": {"holderIdentity": "node-a_5b1f0c", "leaseDurationSeconds": 15,
            "renewTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string()}}),
    )
    .await;
    let svcs: Api<Service> = Api::namespaced(c.clone(), "default");
    set_status(
        &svcs,
        "shop",
        json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}}),
    )
    .await;
    svcs.delete("legacy", &DeleteParams::default())
        .await
        .expect("delete");
}

fn findings(out: &Output) -> (Value, std::collections::BTreeMap<String, Value>) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let by_check = report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .map(|f| {
            (
                f["check"].as_str().unwrap_or_default().to_string(),
                f.clone(),
            )
        })
        .collect();
    (report, by_check)
}

fn text(v: &Value) -> String {
    v.to_string()
}

fn doctor(kubeconfig: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ccm"))
        .arg("doctor")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(extra)
        .output()
        .expect("run ccm doctor")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_diagnoses_a_broken_cluster_read_only_then_passes_as_a_kubectl_plugin() {
    let sim = KubeSim::start(Config {
        tls: true,
        ..Config::default()
    })
    .await
    .expect("kube-sim");
    let dir = std::env::temp_dir().join(format!("ccm-doctor-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let kubeconfig = dir.join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let client = sim.client_with_user_agent("test-setup").expect("client");
    broken_cluster(&client).await;

    let kc = kubeconfig.clone();
    let out = tokio::task::spawn_blocking(move || doctor(&kc, &["-o", "json", "--grace=0s"]))
        .await
        .expect("join");
    let (report, f) = findings(&out);
    assert_eq!(out.status.code(), Some(2), "{report:#}");
    assert_eq!(report["exit_code"], 2);
    let verdict = |id: &str| f[id]["verdict"].as_str().unwrap_or("missing").to_string();
    assert_eq!(verdict("uninitialized-taint"), "fail");
    assert_eq!(verdict("network-deadlock"), "fail");
    assert!(
        text(&f["network-deadlock"]).contains("node node-b: Ready=False (NetworkPluginNotReady")
    );
    assert_eq!(verdict("ccm-pods"), "fail");
    assert!(
        text(&f["ccm-pods"]).contains(&format!(
            "taint {UNINIT}:NoSchedule not tolerated (2 of 2 nodes)"
        )),
        "{:#}",
        f["ccm-pods"]
    );
    assert!(
        text(&f["ccm-pods"])
            .contains("kubectl -n kube-system edit deployment/cloud-controller-manager")
    );
    assert_eq!(verdict("leader-election"), "fail");
    assert_eq!(verdict("kcm-cloud-provider"), "fail");
    assert!(
        text(&f["kcm-cloud-provider"]).contains(
            "--cloud-provider=external on pod kube-system/kube-controller-manager-node-a"
        )
    );
    assert_eq!(verdict("lb-pending"), "fail");
    assert!(text(&f["lb-pending"]).contains("SyncLoadBalancerFailed"));
    assert!(text(&f["lb-pending"]).contains("kubectl describe service default/shop"));
    assert_eq!(verdict("external-ips"), "warn");
    assert!(text(&f["external-ips"]).contains("default/legacy"));
    assert_eq!(verdict("route-syncs"), "warn");
    assert!(text(&f["route-syncs"]).contains("metrics not reachable"));

    // Read-only: every request doctor made was a GET or a LIST.
    let by_doctor = |write: bool| {
        sim.count_requests(|k| k.client == "ccm-doctor" && k.verb.is_write() == write)
    };
    assert_eq!(by_doctor(true), 0, "doctor wrote: {:?}", sim.requests());
    assert!(
        by_doctor(false) >= 6,
        "doctor read too little: {:?}",
        sim.requests()
    );

    // A plain-HTTP metrics URL gets no credentials: a second kube-sim over HTTP, accepting the
    // same token, answers 401 because doctor sent none.
    let plain = KubeSim::start(Config::default())
        .await
        .expect("plain kube-sim");
    let kc = kubeconfig.clone();
    let url = format!("--metrics-url={}/metrics", plain.url());
    let out = tokio::task::spawn_blocking(move || doctor(&kc, &["-o", "json", &url]))
        .await
        .expect("join");
    let (_, f) = findings(&out);
    assert_eq!(f["route-syncs"]["verdict"], "warn");
    assert!(
        text(&f["route-syncs"]).contains("HTTP 401"),
        "{:#}",
        f["route-syncs"]
    );

    repair(&client, sim.addr().port()).await;
    let bin_dir = dir.join("bin");
    std::fs::create_dir_all(&bin_dir).expect("bin dir");
    let plugin = bin_dir.join("kubectl-ccm");
    let _ = std::fs::remove_file(&plugin);
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ccm"), &plugin).expect("symlink");
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let kc = kubeconfig.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("kubectl")
            .args(["ccm", "doctor"])
            .arg(format!("--kubeconfig={}", kc.display()))
            .env("PATH", path)
            .output()
            .expect("kubectl (install it: .ci/test)")
    })
    .await
    .expect("join");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("✅ leader-election"), "{stdout}");
    assert!(
        stdout.contains("held by running pod kube-system/cloud-controller-manager-7f9b4-q2w8e"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "read https://127.0.0.1:{}/metrics",
            sim.addr().port()
        )),
        "{stdout}"
    );
    assert_eq!(
        sim.count_requests(|k| k.client == "ccm-doctor" && k.verb.is_write()),
        0
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A running `ccm demo --break`, killed on drop: what it printed until it was ready, and its
/// later lines.
struct BrokenDemo {
    child: std::process::Child,
    printed: String,
    later: std::sync::mpsc::Receiver<String>,
}

impl BrokenDemo {
    /// The `--metrics-ca FILE` of the doctor command the demo printed.
    fn metrics_ca(&self) -> String {
        self.printed
            .split_whitespace()
            .skip_while(|w| *w != "--metrics-ca")
            .nth(1)
            .unwrap_or_else(|| panic!("no --metrics-ca in:\n{}", self.printed))
            .to_string()
    }

    fn metrics_ca_or_none(&self) -> String {
        if self.printed.contains("--metrics-ca") {
            self.metrics_ca()
        } else {
            String::new()
        }
    }

    /// Lines printed since it was ready.
    fn later_lines(&self) -> Vec<String> {
        self.later.try_iter().collect()
    }
}

impl Drop for BrokenDemo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `ccm demo --break <scenario>` and returns it once it prints the doctor command.
fn broken_demo(scenario: &str, kubeconfig: &Path) -> BrokenDemo {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_ccm"))
        .args([
            "demo",
            "--nodes=4",
            "--services=2",
            "--cloud-latency=5ms",
            "--break",
            scenario,
        ])
        .arg(format!("--kubeconfig-out={}", kubeconfig.display()))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("spawn demo");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = std::io::BufReader::new(stdout).lines();
    let mut seen = String::new();
    while let Some(Ok(line)) = lines.next() {
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("Still running") {
            // Keep reading, so the demo never writes into a closed pipe.
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for line in lines.map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
            return BrokenDemo {
                child,
                printed: seen,
                later: rx,
            };
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("demo --break {scenario} ended before it was ready:\n{seen}");
}

/// Doctor sends the kubeconfig's token only to an endpoint whose certificate it verified: the
/// server on the CCM pod's declared port (`--break token-probe`) presents a certificate from
/// no trusted CA, so it gets one anonymous request and no credential. The route check says
/// why it could not read the metrics and how to let doctor verify the CCM.
#[test]
fn doctor_never_sends_a_credential_to_an_unverified_metrics_endpoint() {
    let dir = std::env::temp_dir().join(format!("ccm-doctor-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let kubeconfig = dir.join("kubeconfig");
    let demo = broken_demo("token-probe", &kubeconfig);
    assert!(
        demo.printed.contains("token-probe: listening on"),
        "{}",
        demo.printed
    );
    let out = doctor(&kubeconfig, &["-o", "json"]);
    let (report, f) = findings(&out);
    assert_eq!(f["ccm-pods"]["verdict"], "ok", "{report:#}");
    assert_eq!(
        f["route-syncs"]["verdict"], "warn",
        "{:#}",
        f["route-syncs"]
    );
    let route = text(&f["route-syncs"]);
    assert!(
        route.contains("serving certificate not verified"),
        "{route}"
    );
    assert!(route.contains("sent no credentials"), "{route}");
    assert!(route.contains("--metrics-ca"), "{route}");
    // Let the probe's lines arrive, then read what it saw.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let seen: Vec<String> = demo
        .later_lines()
        .into_iter()
        .filter(|l| l.starts_with("token-probe: request"))
        .collect();
    assert!(
        seen.iter().any(|l| l.contains("\"ccm-doctor\"")),
        "doctor never reached the probe: {seen:?}"
    );
    assert!(
        seen.iter().all(|l| l.contains("without credentials")),
        "doctor sent a credential to an unverified endpoint: {seen:?}"
    );
    drop(demo);
    let _ = std::fs::remove_dir_all(&dir);
}

/// (scenario, exit status, the failing checks, a check and what it must say)
type Case = (
    &'static str,
    i32,
    &'static [&'static str],
    (&'static str, &'static str),
);

#[test]
fn demo_break_scenarios_are_what_doctor_reports() {
    let dir = std::env::temp_dir().join(format!("ccm-doctor-break-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let cases: &[Case] = &[
        (
            "ccm-down",
            2,
            &[
                "uninitialized-taint",
                "ccm-pods",
                "leader-election",
                "lb-pending",
            ],
            ("ccm-pods", "deploy the cloud-controller-manager"),
        ),
        (
            "ccm-untolerated",
            2,
            &[
                "uninitialized-taint",
                "network-deadlock",
                "ccm-pods",
                "ccm-workload",
                "leader-election",
                "lb-pending",
            ],
            ("ccm-workload", "does not tolerate"),
        ),
        (
            "kubelet-not-external",
            2,
            &["kubelet-cloud-provider"],
            ("kubelet-cloud-provider", "kubelet on node node-00004"),
        ),
        (
            "kcm-cloud-loops",
            2,
            &["kcm-cloud-provider"],
            (
                "kcm-cloud-provider",
                "refuses --cloud-provider=aws since 1.29",
            ),
        ),
        (
            "daemonset-no-match",
            2,
            &[
                "uninitialized-taint",
                "ccm-pods",
                "ccm-workload",
                "leader-election",
                "lb-pending",
            ],
            (
                "ccm-workload",
                r#"matches none of the 4 nodes (the nodes carry node-role.kubernetes.io/control-plane=\"true\")"#,
            ),
        ),
        (
            "untolerated-but-running",
            1,
            &[],
            ("ccm-workload", "no hostNetwork — works now, breaks when"),
        ),
        (
            "kcm-crashloop",
            2,
            &["kcm-cloud-provider"],
            ("kcm-cloud-provider", "crash-looping"),
        ),
    ];
    // The demos start together (each is a few seconds of setup), doctor reads each in turn.
    let demos: Vec<BrokenDemo> = std::thread::scope(|s| {
        let handles: Vec<_> = cases
            .iter()
            .map(|(scenario, ..)| {
                let kubeconfig = dir.join(format!("{scenario}.kubeconfig"));
                s.spawn(move || broken_demo(scenario, &kubeconfig))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("demo"))
            .collect()
    });
    for ((scenario, code, failing, (check, says)), demo) in cases.iter().zip(&demos) {
        let kubeconfig = dir.join(format!("{scenario}.kubeconfig"));
        let ca = format!("--metrics-ca={}", demo.metrics_ca_or_none());
        let mut args = vec!["-o", "json", "--grace=0s"];
        if demo.printed.contains("--metrics-ca") {
            args.push(&ca);
        }
        let out = doctor(&kubeconfig, &args);
        let (report, f) = findings(&out);
        assert_eq!(out.status.code(), Some(*code), "{scenario}: {report:#}");
        for id in *failing {
            assert_eq!(f[*id]["verdict"], "fail", "{scenario}: {id}: {:#}", f[*id]);
        }
        let failed: Vec<&String> = f.keys().filter(|k| f[*k]["verdict"] == "fail").collect();
        assert_eq!(
            failed.len(),
            failing.len(),
            "{scenario}: unexpected failures {failed:?}"
        );
        assert!(
            text(&f[*check]).contains(says),
            "{scenario}: {check} does not say {says:?}: {:#}",
            f[*check]
        );
        assert!(
            !report["seen"]["server_version"]
                .as_str()
                .unwrap_or_default()
                .is_empty(),
            "{report:#}"
        );
        if demo.printed.contains("--metrics-ca") && *scenario != "token-probe" {
            // The demo's CCM really runs: its pod and Lease line up, and its metrics are read
            // over HTTPS with the kubeconfig's token after verifying its serving certificate
            // (TokenReview and SubjectAccessReview by the CCM): watch-mode route syncs, a ✅.
            assert_eq!(
                f["ccm-pods"]["verdict"], "ok",
                "{scenario}: {:#}",
                f["ccm-pods"]
            );
            assert_eq!(
                f["leader-election"]["verdict"], "ok",
                "{scenario}: {:#}",
                f["leader-election"]
            );
            assert_eq!(
                f["route-syncs"]["verdict"], "ok",
                "{scenario}: {:#}",
                f["route-syncs"]
            );
            let route = text(&f["route-syncs"]);
            assert!(route.contains("read https://127.0.0.1:"), "{route}");
            assert!(!route.contains("anonymously"), "{route}");
            assert!(route.contains("route syncs in"), "{route}");
        }
    }
    drop(demos);
    let _ = std::fs::remove_dir_all(&dir);
}
