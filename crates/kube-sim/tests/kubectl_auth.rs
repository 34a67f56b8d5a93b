//! `kubectl auth can-i` and `kubectl auth whoami` — the real kubectl against kube-sim with RBAC
//! enforced, once as the administrator and once as a restricted service account.
//!
//! Fails (never skips) when kubectl is missing. Set `KUBECTL` to use a binary outside `PATH`.

#[path = "support/kubectl_cli.rs"]
mod kubectl_cli;

use ccm_kube_sim::{ADMIN_USER, Config, KubeSim};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use kubectl_cli::{Kubectl, post};
use serde_json::json;

/// RBAC on; service account `default/viewer` may read Nodes and nothing else.
async fn setup() -> (KubeSim, ServiceAccount) {
    let sim = KubeSim::start(Config {
        tls: true,
        rbac: true,
        ..Config::default()
    })
    .await
    .expect("kube-sim");
    let sas: Api<ServiceAccount> = Api::namespaced(sim.client().expect("admin"), "default");
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "viewer"}})).expect("sa");
    let sa = sas.create(&PostParams::default(), &sa).await.expect("sa");
    post(
        &sim,
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        json!({"metadata": {"name": "node-reader"}, "rules": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        ]}),
    )
    .await;
    post(
        &sim,
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        json!({"metadata": {"name": "viewer-reads-nodes"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "node-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": "default"}]}),
    )
    .await;
    (sim, sa)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn can_i_answers_from_rbac_for_the_requesting_user() {
    let (sim, _) = setup().await;
    let admin = Kubectl::new(&sim, "admin", None);
    let token = sim
        .service_account_token("default", "viewer")
        .expect("token");
    let viewer = Kubectl::new(&sim, "viewer", Some(token));

    assert_eq!(admin.can_i("create", "nodes").await, (0, "yes\n".into()));
    // As the real kubectl prints a denial: "no", exit code 1.
    assert_eq!(viewer.can_i("create", "nodes").await, (1, "no\n".into()));
    // The grant the binding gives is seen: the answer comes from RBAC, not a blanket "no".
    assert_eq!(viewer.can_i("list", "nodes").await, (0, "yes\n".into()));
    assert_eq!(viewer.can_i("delete", "services").await, (1, "no\n".into()));

    // Discovery lists both review groups, so `kubectl api-resources` shows them.
    let listed = admin
        .stdout(&["api-resources", "--no-headers", "-o", "name"])
        .await;
    for r in [
        "selfsubjectaccessreviews.authorization.k8s.io",
        "selfsubjectreviews.authentication.k8s.io",
    ] {
        assert!(
            listed.lines().any(|l| l == r),
            "{r} missing from:\n{listed}"
        );
    }
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whoami_shows_the_requesting_user() {
    let (sim, sa) = setup().await;
    let admin = Kubectl::new(&sim, "whoami-admin", None);
    let token = sim
        .service_account_token("default", "viewer")
        .expect("token");
    let viewer = Kubectl::new(&sim, "whoami-viewer", Some(token));

    let me = admin.whoami().await;
    assert_eq!(me["kind"], "SelfSubjectReview");
    assert_eq!(me["status"]["userInfo"]["username"], ADMIN_USER);
    assert_eq!(
        me["status"]["userInfo"]["groups"],
        json!(["system:masters", "system:authenticated"])
    );

    let me = viewer.whoami().await;
    let info = &me["status"]["userInfo"];
    assert_eq!(info["username"], "system:serviceaccount:default:viewer");
    assert_eq!(
        info["uid"].as_str(),
        sa.metadata.uid.as_deref(),
        "a service account's UID is its object's"
    );
    assert_eq!(
        info["groups"],
        json!([
            "system:serviceaccounts",
            "system:serviceaccounts:default",
            "system:authenticated"
        ])
    );

    // The table a person reads.
    let table = viewer.stdout(&["auth", "whoami"]).await;
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("Username")
                && l.ends_with("system:serviceaccount:default:viewer")),
        "{table}"
    );
    sim.shutdown().await;
}
