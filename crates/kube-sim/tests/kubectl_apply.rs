//! `kubectl apply --server-side` against kube-sim: create, no-op re-apply, changes, conflicts
//! between managers (kube-apiserver's message and exit code), `--force-conflicts`, removal of
//! dropped fields, the status subresource, and the `managedFields` other writes record. The real
//! kubectl; fails (never skips) when it is missing.

#[path = "support/kubectl_cli.rs"]
mod kubectl_cli;

use ccm_kube_sim::{Config, KubeSim};
use kubectl_cli::Kubectl;
use serde_json::{Value, json};

/// Writes `yaml` to a file in the kubectl's directory and applies it server-side with `extra`.
async fn apply(k: &Kubectl, file: &str, yaml: &str, extra: &[&str]) -> std::process::Output {
    let path = std::env::temp_dir().join(format!("kube-sim-apply-{}-{file}", std::process::id()));
    std::fs::write(&path, yaml).expect("manifest");
    let p = path.to_string_lossy().into_owned();
    let mut args = vec!["apply", "--server-side", "-f", p.as_str()];
    args.extend_from_slice(extra);
    let out = k.run(&args).await;
    let _ = std::fs::remove_file(&path);
    out
}

async fn ok(k: &Kubectl, file: &str, yaml: &str, extra: &[&str]) -> String {
    let out = apply(k, file, yaml, extra).await;
    assert!(
        out.status.success(),
        "apply {file}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn get(k: &Kubectl, what: &str) -> Value {
    let out = k
        .stdout(&["get", what, "-o", "json", "--show-managed-fields"])
        .await;
    serde_json::from_str(&out).expect("kubectl -o json")
}

/// The `fieldsV1` of `manager`'s entry with `operation`, or `None`.
fn fields(obj: &Value, manager: &str, operation: &str) -> Option<Value> {
    obj["metadata"]["managedFields"]
        .as_array()?
        .iter()
        .find(|e| e["manager"] == manager && e["operation"] == operation)
        .map(|e| e["fieldsV1"].clone())
}

const CM_V1: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\n  labels: {team: a, tier: web}\ndata:\n  a: \"1\"\n  b: \"2\"\n";
const CM_V2: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\n  labels: {team: a}\ndata:\n  a: \"1\"\n  b: \"3\"\n";
const CM_OTHER: &str =
    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\ndata:\n  b: \"other\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_lifecycle() {
    let sim = KubeSim::start(Config {
        tls: true,
        ..Config::default()
    })
    .await
    .expect("kube-sim");
    let k = Kubectl::new(&sim, "ssa", None);

    // Create.
    let out = ok(&k, "cm1.yaml", CM_V1, &[]).await;
    assert_eq!(out.trim(), "configmap/cfg serverside-applied");
    let cm = get(&k, "configmap/cfg").await;
    assert_eq!(cm["data"], json!({"a": "1", "b": "2"}));
    assert_eq!(
        fields(&cm, "kubectl", "Apply"),
        Some(json!({"f:data": {"f:a": {}, "f:b": {}},
                    "f:metadata": {"f:labels": {"f:team": {}, "f:tier": {}}}}))
    );
    let rv = cm["metadata"]["resourceVersion"].clone();

    // Re-applying the same manifest changes nothing.
    ok(&k, "cm1.yaml", CM_V1, &[]).await;
    let same = get(&k, "configmap/cfg").await;
    assert_eq!(same["metadata"]["resourceVersion"], rv);
    assert_eq!(
        same["metadata"]["managedFields"],
        cm["metadata"]["managedFields"]
    );

    // A change; the label the manifest no longer sets goes away (kubectl was its only owner).
    ok(&k, "cm2.yaml", CM_V2, &[]).await;
    let cm = get(&k, "configmap/cfg").await;
    assert_eq!(cm["data"]["b"], "3");
    assert_eq!(cm["metadata"]["labels"], json!({"team": "a"}));
    assert_ne!(cm["metadata"]["resourceVersion"], rv);

    // Another manager changing an owned field: kube-apiserver's 409, kubectl exits 1.
    let out = apply(&k, "other.yaml", CM_OTHER, &["--field-manager=other"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(r#"Apply failed with 1 conflict: conflict with "kubectl": .data.b"#),
        "{err}"
    );
    assert_eq!(get(&k, "configmap/cfg").await["data"]["b"], "3");

    // --force-conflicts takes the field over.
    ok(
        &k,
        "other.yaml",
        CM_OTHER,
        &["--field-manager=other", "--force-conflicts"],
    )
    .await;
    let cm = get(&k, "configmap/cfg").await;
    assert_eq!(cm["data"]["b"], "other");
    assert_eq!(
        fields(&cm, "other", "Apply"),
        Some(json!({"f:data": {"f:b": {}}}))
    );
    assert_eq!(
        fields(&cm, "kubectl", "Apply"),
        Some(json!({"f:data": {"f:a": {}}, "f:metadata": {"f:labels": {"f:team": {}}}}))
    );

    // kubectl now drops `b` from its manifest: `other` still owns it, so it stays.
    let v3 = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\n  labels: {team: a}\ndata:\n  a: \"1\"\n";
    ok(&k, "cm3.yaml", v3, &[]).await;
    assert_eq!(
        get(&k, "configmap/cfg").await["data"],
        json!({"a": "1", "b": "other"})
    );
    sim.shutdown().await;
}

const SVC: &str = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  type: LoadBalancer\n  selector: {app: web}\n  ports:\n  - {name: http, port: 80, targetPort: 8080}\n";
const SVC_STATUS: &str = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nstatus:\n  loadBalancer:\n    ingress:\n    - ip: 203.0.113.7\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_after_client_side_apply_conflicts_and_status() {
    let sim = KubeSim::start(Config {
        tls: true,
        ..Config::default()
    })
    .await
    .expect("kube-sim");
    let k = Kubectl::new(&sim, "ssa-svc", None);

    // Client-side apply records an Update entry for kubectl-client-side-apply.
    let path = std::env::temp_dir().join(format!("kube-sim-csa-{}.yaml", std::process::id()));
    std::fs::write(&path, SVC).expect("manifest");
    k.stdout(&["apply", "-f", &path.to_string_lossy()]).await;
    let _ = std::fs::remove_file(&path);
    let svc = get(&k, "service/web").await;
    let csa = fields(&svc, "kubectl-client-side-apply", "Update").expect("CSA entry");
    assert_eq!(
        csa["f:spec"]["f:ports"]["k:{\"port\":80,\"protocol\":\"TCP\"}"]["f:targetPort"],
        json!({})
    );
    assert_eq!(csa["f:spec"]["f:selector"], json!({}));

    // Server-side apply of another targetPort conflicts with client-side apply's entry.
    let changed = SVC.replace("8080", "9090");
    let out = apply(&k, "svc.yaml", &changed, &[]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            r#"Apply failed with 1 conflict: conflict with "kubectl-client-side-apply" using v1: .spec.ports[port=80,protocol="TCP"].targetPort"#
        ),
        "{err}"
    );

    // The same values apply (shared ownership); kubectl then moves client-side apply's fields
    // to its own Apply entry (a JSON patch of managedFields) and drops the annotation.
    ok(&k, "svc.yaml", SVC, &[]).await;
    let svc = get(&k, "service/web").await;
    assert_eq!(fields(&svc, "kubectl-client-side-apply", "Update"), None);
    let own = fields(&svc, "kubectl", "Apply").expect("kubectl Apply entry");
    assert_eq!(
        own["f:spec"]["f:ports"]["k:{\"port\":80,\"protocol\":\"TCP\"}"]["f:targetPort"],
        json!({})
    );
    ok(&k, "svc.yaml", &changed, &[]).await;
    assert_eq!(
        get(&k, "service/web").await["spec"]["ports"][0]["targetPort"],
        9090
    );

    // Another writer changes the field; applying the old value again conflicts with it.
    k.stdout(&[
        "patch",
        "service/web",
        "-p",
        r#"{"spec":{"ports":[{"port":80,"targetPort":7070}]}}"#,
    ])
    .await;
    let out = apply(&k, "svc.yaml", &changed, &[]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            r#"Apply failed with 1 conflict: conflict with "kubectl-patch" using v1: .spec.ports[port=80,protocol="TCP"].targetPort"#
        ),
        "{err}"
    );

    // Status through the status subresource.
    ok(
        &k,
        "status.yaml",
        SVC_STATUS,
        &["--subresource=status", "--field-manager=lb-controller"],
    )
    .await;
    let svc = get(&k, "service/web").await;
    assert_eq!(
        svc["status"]["loadBalancer"]["ingress"],
        json!([{"ip": "203.0.113.7", "ipMode": "VIP"}])
    );
    let entry = svc["metadata"]["managedFields"]
        .as_array()
        .and_then(|l| l.iter().find(|e| e["manager"] == "lb-controller").cloned())
        .expect("lb-controller entry");
    assert_eq!(entry["subresource"], "status");
    assert_eq!(entry["operation"], "Apply");
    assert_eq!(
        entry["fieldsV1"],
        json!({"f:status": {"f:loadBalancer": {"f:ingress": {}}}})
    );

    // A label patch records its own Update entry (kubectl's field manager name).
    k.stdout(&["label", "service/web", "owner=me"]).await;
    let svc = get(&k, "service/web").await;
    assert_eq!(
        fields(&svc, "kubectl-label", "Update"),
        Some(json!({"f:metadata": {"f:labels": {".": {}, "f:owner": {}}}}))
    );
    sim.shutdown().await;
}
