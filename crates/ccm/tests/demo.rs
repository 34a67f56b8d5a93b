//! `ccm demo` as a newcomer runs it, and `ccm run`'s endpoints as Prometheus and kubelet see them.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ccm_manager::scrape::Scraper;

#[test]
fn demo_converges_and_writes_a_summary() {
    let dir = std::env::temp_dir().join(format!("ccm-demo-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let summary = dir.join("summary.json");
    let kubeconfig = dir.join("kubeconfig");
    let out = Command::new(env!("CARGO_BIN_EXE_ccm"))
        .args([
            "demo",
            "--nodes=8",
            "--services=3",
            "--cloud-latency=10ms",
            "--exit-when-converged",
        ])
        .arg(format!("--summary-json={}", summary.display()))
        .arg(format!("--kubeconfig-out={}", kubeconfig.display()))
        .stdin(Stdio::null())
        .output()
        .expect("run demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("summary"), "{stdout}");
    assert!(kubeconfig.exists(), "--kubeconfig-out was not written");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).expect("summary")).expect("json");
    assert_eq!(s["converged"], true);
    assert_eq!(s["nodes"], 8);
    let st = &s["final_state"];
    // 8 nodes + 1 joined − 1 terminated.
    assert_eq!(st["nodes"], 8);
    assert_eq!(st["initialized"], 8);
    assert_eq!(st["routes"], 8);
    assert_eq!(st["shutdown_tainted"], 1);
    // 3 services − 1 deleted.
    assert_eq!(st["cloud_lbs"], 2);
    assert_eq!(st["with_ingress"], 2);
    assert!(s["cloud_calls"]["instances_metadata"].as_u64().unwrap_or(0) >= 1);
    assert!(s["route_syncs"].as_u64().unwrap_or(0) >= 1);
    assert_eq!(s["story"].as_array().map(Vec::len), Some(4));
    // No per-node cloud lookups: the sim answers batches natively.
    assert!(s["cloud_calls"].get("instance_metadata").is_none());
}

fn free_port() -> u16 {
    ccm_kube_sim::ports::free_loopback_ports(1).expect("free port")
}

/// An HTTPS client for the CCM's secure port: trusts the self-signed certificate the CCM
/// writes to `cert_dir` (waiting for it) and authenticates with kube-sim's admin token.
async fn scraper(addr: SocketAddr, cert_dir: &std::path::Path, token: &str) -> Scraper {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(s) = Scraper::for_cert_dir(addr, cert_dir, Some(token.to_string())) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "no certificate in {}",
            cert_dir.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn get(s: &Scraper, path: &str) -> Option<(u16, String)> {
    s.get(path).await.ok()
}

/// Waits until the CCM is ready *and* leads with its controllers started (a standby is ready
/// too, so /readyz alone does not say the controllers run).
async fn wait_controllers(s: &Scraper) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = matches!(get(s, "/readyz").await, Some((200, _)));
        let healthz = get(s, "/healthz?verbose")
            .await
            .map(|r| r.1)
            .unwrap_or_default();
        if ready && healthz.contains("[+]service-lb-controller ok") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "controllers never started: {healthz}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_serves_health_and_upstream_metrics() {
    let kube = ccm_kube_sim::KubeSim::start(ccm_kube_sim::Config::default())
        .await
        .expect("kube-sim");
    let dir = std::env::temp_dir().join(format!("ccm-serve-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let kubeconfig = dir.join("kubeconfig");
    kube.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let port = free_port();
    let cert_dir = dir.join("certs");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ccm"))
        .args([
            "--cloud-provider=sim",
            "--cluster-cidr=10.128.0.0/9",
            "--bind-address=127.0.0.1",
        ])
        .arg(format!("--cert-dir={}", cert_dir.display()))
        .arg(format!("--secure-port={port}"))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let s = scraper(addr, &cert_dir, kube.token()).await;
    wait_controllers(&s).await;
    let (code, body) = get(&s, "/healthz?verbose").await.expect("healthz");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("[+]leaderElection ok"), "{body}");
    assert!(body.contains("[+]node-route-controller ok"), "{body}");
    assert_eq!(get(&s, "/livez").await.map(|r| r.0), Some(200));
    assert_eq!(get(&s, "/healthz/nope").await.map(|r| r.0), Some(500));
    let (code, metrics) = get(&s, "/metrics").await.expect("metrics");
    assert_eq!(code, 200);
    for name in [
        "cloudprovider_api_requests_total",
        "route_controller_route_sync_total",
        "running_managed_controllers{",
        "leader_election_master_status{name=\"cloud-controller-manager\"} 1",
        "node_controller_cloud_provider_taint_removal_delay_seconds",
        "node_controller_initial_node_sync_delay_seconds",
        "service_controller_loadbalancer_sync_total",
        "service_controller_nodesync_error_total",
        "service_controller_nodesync_latency_seconds",
        "service_controller_update_loadbalancer_host_latency_seconds",
        "workqueue_adds_total",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
    ] {
        assert!(metrics.contains(name), "/metrics lacks {name}:\n{metrics}");
    }
    for c in ["cloud-node", "cloud-node-lifecycle", "route", "service"] {
        let line = format!(
            "running_managed_controllers{{name=\"{c}\",manager=\"cloud-controller-manager\"}} 1"
        );
        assert!(metrics.contains(&line), "missing {line}");
    }
    let _ = child.kill().await;
}

async fn spawn_run(
    kube: &ccm_kube_sim::KubeSim,
    extra: &[&str],
) -> (tokio::process::Child, SocketAddr, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!(
        "ccm-sa-test-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    let kubeconfig = dir.join("kubeconfig");
    kube.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let port = free_port();
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ccm"))
        .args([
            "--cloud-provider=sim",
            "--cluster-cidr=10.128.0.0/9",
            "--bind-address=127.0.0.1",
        ])
        .args(extra)
        .arg(format!("--cert-dir={}", dir.join("certs").display()))
        .arg(format!("--secure-port={port}"))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    (
        child,
        SocketAddr::from(([127, 0, 0, 1], port)),
        dir.join("certs"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_account_credentials_mint_a_token_per_controller() {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use kube::api::{Api, PostParams};
    let kube = ccm_kube_sim::KubeSim::start(ccm_kube_sim::Config::default())
        .await
        .expect("kube-sim");

    // Without the service accounts: a clear startup error naming the account.
    let (child, _, _) = spawn_run(&kube, &["--use-service-account-credentials"]).await;
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("exits")
        .expect("output");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("kube-system/node-controller"), "{err}");

    let sas: Api<ServiceAccount> = Api::namespaced(kube.client().expect("client"), "kube-system");
    for name in ["node-controller", "route-controller", "service-controller"] {
        let sa: ServiceAccount =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).expect("sa");
        sas.create(&PostParams::default(), &sa)
            .await
            .expect("create sa");
    }
    let (mut child, addr, cert_dir) =
        spawn_run(&kube, &["--use-service-account-credentials"]).await;
    wait_controllers(&scraper(addr, &cert_dir, kube.token()).await).await;
    let minted = kube.count_requests(|k| {
        k.resource == "serviceaccounts" && k.subresource == "token" && (200..300).contains(&k.code)
    });
    // node-controller (cloud-node and lifecycle), route-controller, service-controller.
    assert!(minted >= 3, "only {minted} tokens minted");
    let _ = child.kill().await;
}
