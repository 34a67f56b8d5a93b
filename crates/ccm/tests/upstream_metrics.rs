//! The metrics operators' dashboards read, as Prometheus meets them: a running `ccm run`
//! scraped over HTTPS with a service-account token, its `/metrics` checked by the real
//! `promtool check metrics`, upstream's `rest_client_*`, `workqueue_*` and
//! `leader_election_master_status` families present, moving as the CCM works, and
//! `rest_client_requests_total` agreeing request for request with what the API server saw
//! (watches, lease renewals and TokenReviews included).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use ccm_kube_sim::{Config, KubeSim};
use ccm_manager::scrape::Scraper;
use ccm_provider_sim::{InstanceSpec, SimCloud, SimServer};
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, PostParams};
use tokio::io::AsyncWriteExt;

const SOON: Duration = Duration::from_secs(60);
const UA: &str = "cloud-controller-manager";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

/// promtool on PATH, else in the workspace's `.venv/bin`; fails naming `.ci/run`.
fn promtool() -> PathBuf {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([workspace().join(".venv/bin"), PathBuf::from("/usr/bin")])
        .map(|d| d.join("promtool"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("promtool not found on PATH: run .ci/run (or .ci/setup.d/20-promtool.sh, Debian package `prometheus`) to install it")
        })
}

/// Runs `promtool check metrics` on `text`; returns its complaints (empty when clean).
async fn promtool_check(text: &str) -> Result<(), String> {
    let mut child = tokio::process::Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn promtool");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(text.as_bytes()).await.expect("write");
    drop(stdin);
    let out = child.wait_with_output().await.expect("promtool");
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Samples by `name{labels}` (labels as printed).
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// Sum of the samples of `name` whose labels contain every `needle`.
fn sum(s: &BTreeMap<String, f64>, name: &str, needles: &[&str]) -> f64 {
    s.iter()
        .filter(|(k, _)| {
            k.split_once('{').map_or(k.as_str(), |(n, _)| n) == name
                && needles.iter().all(|n| k.contains(n))
        })
        .map(|(_, v)| v)
        .sum()
}

fn has(s: &BTreeMap<String, f64>, name: &str, needles: &[&str]) -> bool {
    s.keys().any(|k| {
        k.split_once('{').map_or(k.as_str(), |(n, _)| n) == name
            && needles.iter().all(|n| k.contains(n))
    })
}

struct World {
    kube: KubeSim,
    sim: SimCloud,
    _server: SimServer,
    dir: PathBuf,
}

async fn world() -> World {
    let kube = KubeSim::start(Config {
        rbac: true,
        ..Config::default()
    })
    .await
    .expect("kube-sim");
    let dir = std::env::temp_dir().join(format!(
        "ccm-upstream-metrics-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    let sim = SimCloud::seeded(7);
    let server = SimServer::start(sim.clone(), SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("sim server");
    std::fs::write(
        dir.join("cloud.toml"),
        format!("endpoint = \"{}\"\n", server.endpoint()),
    )
    .expect("cloud config");
    World {
        kube,
        sim,
        _server: server,
        dir,
    }
}

/// `kube-system/prometheus`, allowed `get` on `/metrics`; returns its token.
async fn prometheus_token(kube: &KubeSim) -> String {
    let client = kube.client().expect("client");
    let sa: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "prometheus"}}))
            .expect("sa");
    Api::<ServiceAccount>::namespaced(client.clone(), "kube-system")
        .create(&PostParams::default(), &sa)
        .await
        .expect("create sa");
    let role: ClusterRole = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "metrics-reader"},
        "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}],
    }))
    .expect("role");
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("create role");
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "metrics-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "metrics-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "kube-system"}],
    }))
    .expect("binding");
    Api::<ClusterRoleBinding>::all(client)
        .create(&PostParams::default(), &binding)
        .await
        .expect("create binding");
    kube.service_account_token("kube-system", "prometheus")
        .expect("token")
}

fn free_port() -> u16 {
    ccm_kube_sim::ports::free_loopback_ports(1).expect("free port")
}

fn spawn_ccm(w: &World) -> (tokio::process::Child, SocketAddr) {
    let kubeconfig = w.dir.join("kubeconfig");
    w.kube.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let port = free_port();
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ccm"))
        .args([
            "run",
            "--cloud-provider=sim",
            "--cluster-cidr=10.128.0.0/9",
            "--bind-address=127.0.0.1",
            "--leader-elect-lease-duration=4s",
            "--leader-elect-renew-deadline=3s",
            "--leader-elect-retry-period=500ms",
        ])
        .arg(format!(
            "--cloud-config={}",
            w.dir.join("cloud.toml").display()
        ))
        .arg(format!("--cert-dir={}", w.dir.join("certs").display()))
        .arg(format!("--secure-port={port}"))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn ccm");
    (child, SocketAddr::from(([127, 0, 0, 1], port)))
}

async fn scrape(s: &Scraper) -> String {
    let (code, body) = s.get("/metrics").await.expect("GET /metrics");
    assert_eq!(code, 200, "{body}");
    body
}

/// Waits until `/metrics` answers and `ok` holds for its samples.
async fn scrape_until(
    s: &Scraper,
    what: &str,
    ok: impl Fn(&BTreeMap<String, f64>) -> bool,
) -> String {
    let deadline = Instant::now() + SOON;
    loop {
        if let Ok((200, body)) = s.get("/metrics").await
            && ok(&samples(&body))
        {
            return body;
        }
        assert!(Instant::now() < deadline, "never saw {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn add_node(w: &World, i: u32) {
    let name = format!("node-{i}");
    w.sim.add_instance(InstanceSpec::new(name.clone()));
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "podCIDRs": [format!("10.128.{i}.0/24")],
            "taints": [{"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}],
        },
    }))
    .expect("node");
    Api::<Node>::all(w.kube.client().expect("client"))
        .create(&PostParams::default(), &node)
        .await
        .expect("create node");
}

/// The API server's count of the CCM's requests, by HTTP method (as client-go labels them).
fn server_side(kube: &KubeSim) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for c in kube.requests() {
        if !c.key.client.starts_with(UA) {
            continue;
        }
        let method = match c.key.verb.as_str() {
            "get" | "list" | "watch" => "GET",
            "create" => "POST",
            "update" => "PUT",
            "patch" => "PATCH",
            _ => "DELETE",
        };
        *out.entry(method.to_string()).or_default() += c.count as f64;
    }
    out
}

fn client_side(s: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for m in ["GET", "POST", "PUT", "PATCH", "DELETE"] {
        let n = sum(
            s,
            "rest_client_requests_total",
            &[&format!("method=\"{m}\"")],
        );
        if n > 0.0 {
            out.insert(m.to_string(), n);
        }
    }
    out
}

/// Every request the API server answered was counted by the CCM: the two tallies agree,
/// read while no request completes in between (lease renewals run every 500 ms).
async fn counts_agree_with_the_server(kube: &KubeSim, s: &Scraper) {
    let mut last = (BTreeMap::new(), BTreeMap::new());
    for _ in 0..50 {
        let before = server_side(kube);
        let body = scrape(s).await;
        let after = server_side(kube);
        let ours = client_side(&samples(&body));
        if before == after && ours == after {
            return;
        }
        last = (ours, after);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "rest_client_requests_total (left) never matched the API server's count (right): {:?}",
        last
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_families_pass_promtool_and_move_with_the_work() {
    let w = world().await;
    let token = prometheus_token(&w.kube).await;
    let (mut child, addr) = spawn_ccm(&w);
    let certs = w.dir.join("certs");
    let deadline = Instant::now() + SOON;
    let s = loop {
        if let Ok(s) = Scraper::for_cert_dir(addr, &certs, Some(token.clone()))
            && s.get("/livez").await.is_ok()
        {
            break s;
        }
        assert!(Instant::now() < deadline, "the secure port never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let first = scrape_until(&s, "the leader's controllers", |m| {
        sum(
            m,
            "leader_election_master_status",
            &["name=\"cloud-controller-manager\""],
        ) == 1.0
            && has(m, "workqueue_adds_total", &["name=\"Nodes\""])
            && sum(m, "rest_client_requests_total", &["method=\"PUT\""]) >= 1.0
    })
    .await;
    if let Err(e) = promtool_check(&first).await {
        panic!("promtool check metrics failed:\n{e}\n--- /metrics ---\n{first}");
    }
    let m1 = samples(&first);
    for (family, labels) in [
        (
            "rest_client_requests_total",
            &["code=\"200\"", "host=\"127.0.0.1:", "method=\"GET\""][..],
        ),
        (
            "rest_client_request_duration_seconds_bucket",
            &["le=\"0.005\"", "verb=\"GET\""],
        ),
        (
            "rest_client_request_duration_seconds_bucket",
            &["le=\"60\"", "verb=\"PUT\""],
        ),
        (
            "rest_client_rate_limiter_duration_seconds_count",
            &["verb=\"GET\"", "host=\"127.0.0.1:"],
        ),
        ("workqueue_adds_total", &["name=\"Nodes\""]),
        ("workqueue_depth", &["name=\"service\""]),
        ("workqueue_retries_total", &["name=\"Nodes\""]),
        (
            "workqueue_queue_duration_seconds_bucket",
            &["le=\"9.999999999999999e-06\"", "name=\"Nodes\""],
        ),
        (
            "workqueue_work_duration_seconds_bucket",
            &["le=\"1000\"", "name=\"Routes\""],
        ),
        ("workqueue_unfinished_work_seconds", &["name=\"Nodes\""]),
        (
            "workqueue_longest_running_processor_seconds",
            &["name=\"Routes\""],
        ),
    ] {
        assert!(
            has(&m1, family, labels),
            "/metrics lacks {family}{labels:?}:\n{first}"
        );
    }
    for family in [
        "rest_client_requests_total",
        "rest_client_request_duration_seconds",
        "rest_client_rate_limiter_duration_seconds",
        "leader_election_master_status",
        "workqueue_adds_total",
        "workqueue_depth",
        "workqueue_retries_total",
        "workqueue_queue_duration_seconds",
        "workqueue_work_duration_seconds",
        "workqueue_unfinished_work_seconds",
        "workqueue_longest_running_processor_seconds",
    ] {
        assert!(
            first.contains(&format!("# TYPE {family} ")),
            "no TYPE line for {family}"
        );
    }
    counts_agree_with_the_server(&w.kube, &s).await;

    // Work: two nodes join, the first cloud lookup fails once (a retry).
    w.sim
        .fail_next("instances_metadata", 1)
        .expect("inject failure");
    for i in 0..2 {
        add_node(&w, i).await;
    }
    let second = scrape_until(&s, "both nodes initialized", |m| {
        sum(m, "workqueue_work_duration_seconds_count", &["name=\"Nodes\""])
            >= sum(&m1, "workqueue_work_duration_seconds_count", &["name=\"Nodes\""]) + 2.0
            && sum(m, "rest_client_requests_total", &["method=\"PATCH\""]) >= 2.0
            // A lease renewal (every 500 ms) happened since the first scrape.
            && sum(m, "rest_client_requests_total", &["method=\"PUT\""])
                > sum(&m1, "rest_client_requests_total", &["method=\"PUT\""])
    })
    .await;
    if let Err(e) = promtool_check(&second).await {
        panic!("promtool check metrics failed:\n{e}\n--- /metrics ---\n{second}");
    }
    let m2 = samples(&second);
    for (family, labels) in [
        ("rest_client_requests_total", &[][..]),
        ("rest_client_request_duration_seconds_count", &[]),
        ("rest_client_rate_limiter_duration_seconds_count", &[]),
        ("rest_client_requests_total", &["method=\"PUT\""]),
        ("workqueue_adds_total", &["name=\"Nodes\""]),
        (
            "workqueue_queue_duration_seconds_count",
            &["name=\"Nodes\""],
        ),
        ("workqueue_retries_total", &["name=\"Nodes\""]),
    ] {
        let (a, b) = (sum(&m1, family, labels), sum(&m2, family, labels));
        assert!(b > a, "{family}{labels:?} did not move: {a} → {b}");
    }
    assert_eq!(
        sum(&m2, "leader_election_master_status", &[]),
        1.0,
        "{second}"
    );
    counts_agree_with_the_server(&w.kube, &s).await;
    let _ = child.kill().await;
    let _ = std::fs::remove_dir_all(&w.dir);
}
