//! RBAC enforcement over real HTTP: service-account identities get exactly what their bindings
//! grant, with kube-apiserver's 403 wording; the admin token is unaffected.

use ccm_kube_sim::rbac::{Attributes, UserInfo};
use ccm_kube_sim::{Config, KubeSim, Verb};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Service, ServiceAccount};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

async fn apply(sim: &KubeSim, kind_url: &str, body: serde_json::Value) {
    let client = sim.client().expect("admin");
    let req = http::Request::post(kind_url)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).expect("json"))
        .expect("request");
    client
        .request::<serde_json::Value>(req)
        .await
        .unwrap_or_else(|e| panic!("creating {body}: {e}"));
}

async fn setup(rbac: bool) -> KubeSim {
    let sim = KubeSim::start(Config {
        rbac,
        ..Config::default()
    })
    .await
    .expect("kube-sim");
    let sas: Api<ServiceAccount> = Api::namespaced(sim.client().expect("admin"), "kube-system");
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "node-controller"}})).expect("sa");
    sas.create(&PostParams::default(), &sa).await.expect("sa");
    apply(
        &sim,
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        json!({"metadata": {"name": "ccm:node"}, "rules": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
        ]}),
    )
    .await;
    apply(
        &sim,
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        json!({"metadata": {"name": "ccm:node"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "ccm:node"},
            "subjects": [{"kind": "ServiceAccount", "name": "node-controller", "namespace": "kube-system"}]}),
    )
    .await;
    apply(
        &sim,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/roles",
        json!({"metadata": {"name": "lease"}, "rules": [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["ccm"], "verbs": ["get"]},
        ]}),
    )
    .await;
    apply(
        &sim,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/rolebindings",
        json!({"metadata": {"name": "lease"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "lease"},
            "subjects": [{"kind": "ServiceAccount", "name": "node-controller"}]}),
    )
    .await;
    sim
}

fn status_of(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other}"),
    }
}

#[tokio::test]
async fn service_accounts_get_what_bindings_grant_and_403_otherwise() {
    let sim = setup(true).await;
    let client = sim
        .client_as_service_account("kube-system", "node-controller", "node-controller")
        .expect("sa client");
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .list(&ListParams::default())
        .await
        .expect("list nodes");

    let services: Api<Service> = Api::all(client.clone());
    let e = status_of(services.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(e.code, 403);
    assert_eq!(e.reason, "Forbidden");
    assert_eq!(
        e.message,
        r#"services is forbidden: User "system:serviceaccount:kube-system:node-controller" cannot list resource "services" in API group "" at the cluster scope"#
    );

    // The status subresource is granted, the main resource is not.
    let admin_nodes: Api<Node> = Api::all(sim.client().expect("admin"));
    let n: Node = serde_json::from_value(json!({"metadata": {"name": "n1"}})).expect("node");
    admin_nodes
        .create(&PostParams::default(), &n)
        .await
        .expect("node");
    let p = Patch::Merge(
        json!({"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}}),
    );
    nodes
        .patch_status("n1", &PatchParams::default(), &p)
        .await
        .expect("patch status");
    let e = status_of(
        nodes
            .patch(
                "n1",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(
        e.message,
        r#"nodes "n1" is forbidden: User "system:serviceaccount:kube-system:node-controller" cannot patch resource "nodes" in API group "" at the cluster scope"#
    );

    // resourceNames: the named lease only, and only in the RoleBinding's namespace.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let e = status_of(leases.get("ccm").await.unwrap_err());
    assert_eq!(e.code, 404, "allowed, then not found: {e:?}");
    let e = status_of(leases.get("other").await.unwrap_err());
    assert_eq!(e.code, 403);
    assert!(
        e.message.ends_with(r#"in the namespace "kube-system""#),
        "{}",
        e.message
    );

    // Denials are counted per user, so tests can tell which identity lacked what.
    let denied = sim.count_requests(|k| {
        k.code == 403
            && k.user == "system:serviceaccount:kube-system:node-controller"
            && k.verb == Verb::List
            && k.resource == "services"
    });
    assert_eq!(denied, 1);

    // The admin token is in system:masters and never restricted.
    let all: Api<Service> = Api::all(sim.client().expect("admin"));
    all.list(&ListParams::default()).await.expect("admin lists");
    sim.shutdown().await;
}

#[tokio::test]
async fn enforcement_is_off_by_default_but_authorize_still_answers() {
    let sim = setup(false).await;
    let client = sim
        .client_as_service_account("kube-system", "node-controller", "x")
        .expect("sa client");
    let services: Api<Service> = Api::all(client);
    services
        .list(&ListParams::default())
        .await
        .expect("no enforcement without Config::rbac");
    let sa = UserInfo::service_account("kube-system", "node-controller");
    let d = sim.authorize(&Attributes::resource(
        sa.clone(),
        "watch",
        "",
        "nodes",
        "",
        "",
        "",
    ));
    assert!(d.allowed);
    assert_eq!(
        d.reason,
        r#"RBAC: allowed by ClusterRoleBinding "ccm:node" of ClusterRole "ccm:node" to ServiceAccount "node-controller/kube-system""#
    );
    let d = sim.authorize(&Attributes::resource(
        sa, "delete", "", "nodes", "", "", "n1",
    ));
    assert!(!d.allowed);
    sim.shutdown().await;
}

#[tokio::test]
async fn invalid_bindings_are_rejected_and_role_ref_is_immutable() {
    let sim = setup(false).await;
    let client = sim.client().expect("admin");
    let post = |url: &str, body: serde_json::Value| {
        http::Request::post(url.to_string())
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).expect("json"))
            .expect("request")
    };
    let e = client
        .request::<serde_json::Value>(post(
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            json!({"metadata": {"name": "bad"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "x"},
                "subjects": [{"kind": "ServiceAccount", "name": "a"}]}),
        ))
        .await
        .unwrap_err();
    let e = status_of(e);
    assert_eq!(e.code, 422);
    assert!(
        e.message.contains(
            r#"roleRef.kind: Unsupported value: "Role": supported values: "ClusterRole""#
        ),
        "{}",
        e.message
    );
    assert!(
        e.message.contains("subjects[0].namespace: Required value"),
        "{}",
        e.message
    );

    let patch =
        http::Request::patch("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/ccm:node")
            .header("content-type", "application/merge-patch+json")
            .body(serde_json::to_vec(&json!({"roleRef": {"name": "other"}})).expect("json"))
            .expect("request");
    let e = status_of(
        client
            .request::<serde_json::Value>(patch)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert!(e.message.contains("cannot change roleRef"), "{}", e.message);
    sim.shutdown().await;
}
