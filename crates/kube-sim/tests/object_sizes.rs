//! Bytes of one Node and one Service as kube-sim serves them: with the bench's small bodies and
//! with the kubelet-sized bodies of `ccm_kube_sim::realistic_*`, each with the managedFields the
//! writes recorded. Run with `--nocapture` to see the figures.

use ccm_kube_sim::{Config, KubeSim, realistic_node, realistic_node_status, realistic_service};
use serde_json::{Value, json};

async fn send(c: &kube::Client, method: &str, url: &str, ct: &str, body: &Value) -> Value {
    let req = http::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", ct)
        .body(serde_json::to_vec(body).expect("json"))
        .expect("request");
    let text = c.request_text(req).await.expect("request");
    serde_json::from_str(&text).expect("JSON answer")
}

async fn served(c: &kube::Client, url: &str) -> (usize, usize) {
    let req = http::Request::get(url).body(Vec::new()).expect("request");
    let text = c.request_text(req).await.expect("get");
    let mut v: Value = serde_json::from_str(&text).expect("JSON");
    let with = text.len();
    v["metadata"]
        .as_object_mut()
        .expect("metadata")
        .remove("managedFields");
    (with, serde_json::to_vec(&v).expect("json").len())
}

const SMP: &str = "application/strategic-merge-patch+json";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_and_service_sizes() {
    let sim = KubeSim::start(Config::default()).await.expect("kube-sim");
    let kubelet = sim
        .client_with_user_agent("kubelet/v1.36.2 (linux/amd64) kubernetes/0000000")
        .expect("client");
    let base = format!("{}/api/v1", sim.url());
    let now = "2026-11-26T12:00:00Z";

    // The bench's kubelet today: a minimal Node and a Ready + Hostname status patch.
    let small = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "small",
        "labels": {"kubernetes.io/hostname": "small", "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}},
        "spec": {"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"]}});
    send(
        &kubelet,
        "POST",
        &format!("{base}/nodes"),
        "application/json",
        &small,
    )
    .await;
    let status = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
        "message": "kubelet is posting ready status", "lastHeartbeatTime": now, "lastTransitionTime": now}],
        "addresses": [{"type": "Hostname", "address": "small"}]}});
    send(
        &kubelet,
        "PATCH",
        &format!("{base}/nodes/small/status"),
        SMP,
        &status,
    )
    .await;
    let (small_with, small_without) = served(&kubelet, &format!("{base}/nodes/small")).await;

    // A kubelet-sized registration and status.
    let node = realistic_node("big", "10.244.1.0/24");
    send(
        &kubelet,
        "POST",
        &format!("{base}/nodes"),
        "application/json",
        &node,
    )
    .await;
    let st = realistic_node_status("big", "10.0.1.17", now);
    let out = send(
        &kubelet,
        "PATCH",
        &format!("{base}/nodes/big/status"),
        SMP,
        &st,
    )
    .await;
    assert_eq!(out["status"]["images"].as_array().map(Vec::len), Some(10));
    let kubelet_entries: Vec<&Value> = out["metadata"]["managedFields"]
        .as_array()
        .expect("managedFields")
        .iter()
        .filter(|e| e["manager"] == "kubelet")
        .collect();
    assert_eq!(
        kubelet_entries.len(),
        2,
        "create and status: {kubelet_entries:?}"
    );
    let (big_with, big_without) = served(&kubelet, &format!("{base}/nodes/big")).await;

    // Services: the bench's one-port body and a Helm-installed one.
    let user = sim.client_with_user_agent("helm/v4.0.0").expect("client");
    let ns = format!("{base}/namespaces/default/services");
    let bench_svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "small"},
        "spec": {"type": "LoadBalancer", "selector": {"app": "small"},
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}});
    send(&user, "POST", &ns, "application/json", &bench_svc).await;
    let svc = send(
        &user,
        "POST",
        &ns,
        "application/json",
        &realistic_service("big", "default"),
    )
    .await;
    for f in [
        "clusterIPs",
        "ipFamilies",
        "ipFamilyPolicy",
        "internalTrafficPolicy",
        "sessionAffinity",
        "allocateLoadBalancerNodePorts",
        "externalTrafficPolicy",
    ] {
        assert!(svc["spec"].get(f).is_some(), "{f} not defaulted: {svc}");
    }
    assert_eq!(svc["metadata"]["managedFields"][0]["manager"], "helm");
    let (ssvc_with, ssvc_without) = served(&user, &format!("{ns}/small")).await;
    let (bsvc_with, bsvc_without) = served(&user, &format!("{ns}/big")).await;

    eprintln!("JSON bytes served (with managedFields / without):");
    eprintln!("  bench Node      {small_with} / {small_without}");
    eprintln!("  realistic Node  {big_with} / {big_without}");
    eprintln!("  bench Service   {ssvc_with} / {ssvc_without}");
    eprintln!("  realistic Svc   {bsvc_with} / {bsvc_without}");
    // Upstream kubelet Nodes are about 4–6 KB with managedFields.
    assert!(
        (4_000..=7_000).contains(&big_with),
        "realistic Node is {big_with} bytes"
    );
    assert!(small_with > small_without && big_with > big_without);
    sim.shutdown().await;
}
