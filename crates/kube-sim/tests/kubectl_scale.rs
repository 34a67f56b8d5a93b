//! `kubectl scale` of Deployments and ReplicaSets through the scale subresource — the real
//! kubectl against kube-sim. Fails (never skips) when kubectl is missing.

#[path = "support/kubectl_cli.rs"]
mod kubectl_cli;

use ccm_kube_sim::{Config, KubeSim};
use kubectl_cli::{Kubectl, post};
use serde_json::{Value, json};

const REPLICASET: &str = "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata:\n  name: rs1\nspec:\n  \
    replicas: 1\n  selector:\n    matchLabels: {app: rs1}\n  template:\n    metadata:\n      \
    labels: {app: rs1}\n    spec:\n      containers: [{name: c, image: nginx}]\n";

async fn replicas(k: &Kubectl, what: &str) -> Value {
    let out = k.stdout(&["get", what, "-o", "json"]).await;
    let v: Value = serde_json::from_str(&out).expect("kubectl -o json");
    v["spec"]["replicas"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_deployments_and_replicasets() {
    let sim = KubeSim::start(Config {
        tls: true,
        ..Config::default()
    })
    .await
    .expect("kube-sim");
    let k = Kubectl::new(&sim, "scale", None);
    k.stdout(&[
        "create",
        "deployment",
        "web",
        "--image=nginx",
        "--replicas=1",
    ])
    .await;

    let out = k
        .stdout(&["scale", "deployment", "web", "--replicas=3"])
        .await;
    assert_eq!(out.trim(), "deployment.apps/web scaled");
    assert_eq!(replicas(&k, "deployment/web").await, 3);

    // The Scale a HorizontalPodAutoscaler reads.
    let raw = k
        .stdout(&[
            "get",
            "--raw",
            "/apis/apps/v1/namespaces/default/deployments/web/scale",
        ])
        .await;
    let scale: Value = serde_json::from_str(&raw).expect("Scale JSON");
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["apiVersion"], "autoscaling/v1");
    assert_eq!(scale["spec"]["replicas"], 3);
    assert_eq!(scale["status"]["selector"], "app=web");

    // `--current-replicas` is a precondition kubectl checks against the Scale: a wrong one
    // changes nothing.
    let out = k
        .run(&[
            "scale",
            "deployment",
            "web",
            "--current-replicas=2",
            "--replicas=5",
        ])
        .await;
    assert!(
        !out.status.success(),
        "a wrong --current-replicas must fail"
    );
    assert_eq!(replicas(&k, "deployment/web").await, 3);
    let out = k
        .stdout(&[
            "scale",
            "deployment",
            "web",
            "--current-replicas=3",
            "--replicas=0",
        ])
        .await;
    assert_eq!(out.trim(), "deployment.apps/web scaled");
    assert_eq!(replicas(&k, "deployment/web").await, 0);

    let dir = std::env::temp_dir().join(format!("kube-sim-scale-rs-{}.yaml", std::process::id()));
    std::fs::write(&dir, REPLICASET).expect("manifest");
    k.stdout(&["apply", "-f", &dir.display().to_string()]).await;
    let _ = std::fs::remove_file(&dir);
    let out = k.stdout(&["scale", "rs", "rs1", "--replicas=4"]).await;
    assert_eq!(out.trim(), "replicaset.apps/rs1 scaled");
    assert_eq!(replicas(&k, "rs/rs1").await, 4);
    sim.shutdown().await;
}

/// Scaling is its own permission (`deployments/scale`), as on a real cluster: reading the
/// Deployment is not enough, and the grant's presence or absence shows in `auth can-i` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_needs_the_scale_grant() {
    let sim = KubeSim::start(Config {
        tls: true,
        rbac: true,
        ..Config::default()
    })
    .await
    .expect("kube-sim");
    let admin = Kubectl::new(&sim, "scale-admin", None);
    admin.stdout(&["create", "serviceaccount", "scaler"]).await;
    admin
        .stdout(&["create", "deployment", "web", "--image=nginx"])
        .await;
    post(
        &sim,
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        json!({"metadata": {"name": "deploy-reader"}, "rules": [
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list"]},
        ]}),
    )
    .await;
    post(
        &sim,
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        json!({"metadata": {"name": "scaler-reads"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "deploy-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "scaler", "namespace": "default"}]}),
    )
    .await;
    let token = sim
        .service_account_token("default", "scaler")
        .expect("token");
    let scaler = Kubectl::new(&sim, "scaler", Some(token));
    let can_scale = [
        "auth",
        "can-i",
        "patch",
        "deployments",
        "--subresource=scale",
    ];

    let out = scaler.run(&can_scale).await;
    assert_eq!(out.status.code(), Some(1));
    let out = scaler
        .run(&["scale", "deployment", "web", "--replicas=3"])
        .await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "scaled without a grant");
    assert!(
        err.contains("Forbidden") || err.contains("forbidden"),
        "{err}"
    );
    assert_eq!(replicas(&admin, "deployment/web").await, 1);

    post(
        &sim,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles",
        json!({"metadata": {"name": "scale"}, "rules": [
            {"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["get", "patch"]},
        ]}),
    )
    .await;
    post(
        &sim,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings",
        json!({"metadata": {"name": "scale"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "scale"},
            "subjects": [{"kind": "ServiceAccount", "name": "scaler", "namespace": "default"}]}),
    )
    .await;
    assert_eq!(scaler.stdout(&can_scale).await, "yes\n");
    scaler
        .stdout(&["scale", "deployment", "web", "--replicas=3"])
        .await;
    assert_eq!(replicas(&admin, "deployment/web").await, 3);
    sim.shutdown().await;
}
