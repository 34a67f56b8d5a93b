//! RBAC exactly as used: the CCM runs with the Deployment's flags under the identities
//! `ccm manifests` creates (its own ServiceAccount, and one per controller through
//! `--use-service-account-credentials`) against kube-sim enforcing those RBAC objects. The
//! scenario walks every controller path that talks to the API; then every request must have
//! been allowed (a used verb that is not granted fails) and every granted verb must have been
//! used (a grant nobody uses fails). The secure port is on, as deployed: a scrape of
//! `/metrics` with a bearer token makes the CCM create TokenReviews and SubjectAccessReviews,
//! and its startup reads the client CA through the bootstrap Role the manifests bind.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use ccm_kube_sim::rbac::{Attributes, UserInfo};
use ccm_kube_sim::{Config, KubeSim, Verb};
use ccm_provider_sim::{InstanceSpec, SimCloud, SimServer};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::time::Instant;

const NS: &str = "kube-system";
const TIMEOUT: Duration = Duration::from_secs(90);

fn manifests(args: &[&str]) -> Vec<Value> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ccm"))
        .arg("manifests")
        .args(args)
        .output()
        .expect("ccm manifests");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    text.split("\n---\n")
        .map(|d| d.trim_start_matches("---\n"))
        .filter(|d| !d.trim().is_empty())
        .map(|d| serde_yaml_ng::from_str::<Value>(d).expect("yaml"))
        .collect()
}

fn plural(kind: &str) -> &'static str {
    match kind {
        "ServiceAccount" => "serviceaccounts",
        "ClusterRole" => "clusterroles",
        "ClusterRoleBinding" => "clusterrolebindings",
        "Role" => "roles",
        "RoleBinding" => "rolebindings",
        other => panic!("unexpected kind {other}"),
    }
}

async fn create(client: &kube::Client, o: &Value) {
    let av = o["apiVersion"].as_str().expect("apiVersion");
    let base = if av.contains('/') {
        format!("/apis/{av}")
    } else {
        format!("/api/{av}")
    };
    let ns = o["metadata"]["namespace"]
        .as_str()
        .map(|n| format!("/namespaces/{n}"))
        .unwrap_or_default();
    let url = format!("{base}{ns}/{}", plural(o["kind"].as_str().expect("kind")));
    let req = http::Request::post(url)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(o).expect("json"))
        .expect("request");
    client
        .request::<Value>(req)
        .await
        .unwrap_or_else(|e| panic!("creating {}: {e}", o["metadata"]["name"]));
}

fn kubeconfig(kube: &KubeSim, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: s\n  cluster:\n    server: {}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context:\n    cluster: s\n    user: u\ncurrent-context: c\n",
        kube.url()
    )
}

async fn wait_for<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + TIMEOUT;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

struct World {
    kube: KubeSim,
    cloud: SimCloud,
    admin: kube::Client,
}

impl World {
    async fn add_node(&self, name: &str, cidr: &str) {
        self.cloud.add_instance(InstanceSpec::new(name.to_string()));
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {"podCIDR": cidr, "podCIDRs": [cidr], "taints": [
                {"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}]},
        }))
        .expect("node");
        Api::<Node>::all(self.admin.clone())
            .create(&PostParams::default(), &node)
            .await
            .expect("create node");
        self.set_ready(name, "True").await;
    }

    async fn set_ready(&self, name: &str, status: &str) {
        let patch = json!({"status": {"conditions": [{"type": "Ready", "status": status,
            "reason": "Test", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
        Api::<Node>::all(self.admin.clone())
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
            .expect("node status");
    }

    async fn node(&self, name: &str) -> Option<Node> {
        Api::<Node>::all(self.admin.clone())
            .get_opt(name)
            .await
            .expect("get node")
    }
}

/// Prometheus with its own token scrapes `/metrics` (200), an identity without `get` on it is
/// refused (403): the CCM's account creates TokenReviews and SubjectAccessReviews.
async fn scrape_metrics(w: &World, addr: SocketAddr, certs: &std::path::Path) {
    let admin = &w.admin;
    for o in [
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "prometheus", "namespace": NS}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "nosy", "namespace": NS}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": "test:metrics-reader"},
               "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": "test:metrics-reader"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "test:metrics-reader"},
               "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": NS}]}),
    ] {
        create(admin, &o).await;
    }
    for (account, want) in [("prometheus", 200), ("nosy", 403)] {
        let token = w.kube.service_account_token(NS, account).expect("token");
        let s =
            ccm_manager::scrape::Scraper::for_cert_dir(addr, certs, Some(token)).expect("scraper");
        let (code, body) = s.get("/metrics").await.expect("GET /metrics");
        assert_eq!(code, want, "{account}: {body}");
    }
}

fn set_route_latency(cloud: &SimCloud, fixed: Duration) {
    cloud
        .set_latency(
            "create_route",
            ccm_provider_sim::Latency {
                fixed,
                jitter: Duration::ZERO,
            },
        )
        .expect("latency");
}

fn has_taint(n: &Node, key: &str) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == key))
}

type Grant = (String, String, String, String);

/// Expands `rules` into (account, verb, group, resource) for `account`.
fn expand(account: &str, rules: &Value, out: &mut BTreeSet<Grant>) {
    for r in rules.as_array().into_iter().flatten() {
        for verb in r["verbs"].as_array().into_iter().flatten() {
            for g in r["apiGroups"].as_array().into_iter().flatten() {
                for res in r["resources"].as_array().into_iter().flatten() {
                    out.insert((
                        account.to_string(),
                        verb.as_str().unwrap_or_default().to_string(),
                        g.as_str().unwrap_or_default().to_string(),
                        res.as_str().unwrap_or_default().to_string(),
                    ));
                }
            }
        }
    }
}

/// Bindings in `objects` to Roles the API server bootstraps (not in `objects`): (account,
/// role name).
fn bootstrap_bindings(objects: &[Value]) -> Vec<(String, String)> {
    let own: BTreeSet<&str> = objects
        .iter()
        .filter(|o| o["kind"] == "Role")
        .filter_map(|o| o["metadata"]["name"].as_str())
        .collect();
    objects
        .iter()
        .filter(|o| o["kind"] == "RoleBinding" && o["roleRef"]["kind"] == "Role")
        .filter_map(|b| {
            let role = b["roleRef"]["name"].as_str()?;
            (!own.contains(role)).then_some((b, role))
        })
        .flat_map(|(b, role)| {
            b["subjects"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(move |s| Some((s["name"].as_str()?.to_string(), role.to_string())))
        })
        .collect()
}

/// (account, verb, group, resource[/subresource]) for every rule of every role bound to an
/// account, expanded (no wildcards are used by the manifests).
fn granted(objects: &[Value]) -> BTreeSet<Grant> {
    let roles: BTreeMap<(String, String), &Value> = objects
        .iter()
        .filter(|o| matches!(o["kind"].as_str(), Some("ClusterRole" | "Role")))
        .map(|o| {
            (
                (
                    o["kind"].as_str().unwrap_or_default().to_string(),
                    o["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                ),
                o,
            )
        })
        .collect();
    let mut out = BTreeSet::new();
    for b in objects.iter().filter(|o| {
        matches!(
            o["kind"].as_str(),
            Some("ClusterRoleBinding" | "RoleBinding")
        )
    }) {
        let key = (
            b["roleRef"]["kind"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            b["roleRef"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
        let Some(role) = roles.get(&key) else {
            continue; // bootstrap roles (extension-apiserver-authentication-reader)
        };
        for s in b["subjects"].as_array().into_iter().flatten() {
            expand(
                s["name"].as_str().unwrap_or_default(),
                &role["rules"],
                &mut out,
            );
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controllers_under_the_manifests_identities_use_exactly_what_is_granted() {
    let objects = manifests(&["--cluster-cidr=10.128.0.0/9"]);
    let kube = KubeSim::start(Config {
        rbac: true,
        ..Config::default()
    })
    .await
    .expect("kube-sim");
    let admin = kube.client_with_user_agent("test-admin").expect("admin");
    for o in objects
        .iter()
        .filter(|o| o["kind"] != "Deployment" && o["kind"] != "PodDisruptionBudget")
    {
        create(&admin, o).await;
    }
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("a Deployment");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .expect("serviceAccountName");

    let cloud = SimCloud::seeded(7);
    let server = SimServer::start(cloud.clone(), SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("sim server");
    let dir = std::env::temp_dir().join(format!(
        "ccm-rbac-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    let kc = dir.join("kubeconfig");
    let token = kube.service_account_token(NS, sa).expect("token");
    std::fs::write(&kc, kubeconfig(&kube, &token)).expect("kubeconfig");
    let cc = dir.join("cloud.toml");
    std::fs::write(&cc, format!("endpoint = \"{}\"\n", server.endpoint())).expect("cloud config");

    // The Deployment's own flags; only the port and the local wiring differ.
    let mut args: Vec<String> = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .filter(|a| !a.starts_with("--secure-port="))
        .map(String::from)
        .collect();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    args.extend([
        format!("--kubeconfig={}", kc.display()),
        format!("--cloud-config={}", cc.display()),
        format!("--secure-port={port}"),
        "--bind-address=127.0.0.1".into(),
        format!("--cert-dir={}", dir.join("certs").display()),
        "--node-monitor-period=1s".into(),
    ]);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ccm"))
        .args(&args)
        .stdout(Stdio::null())
        .stderr(if std::env::var_os("CCM_TEST_LOGS").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .kill_on_drop(true)
        .spawn()
        .expect("spawn ccm");

    let w = World {
        kube,
        cloud,
        admin: admin.clone(),
    };
    // The leader renews its lease (update).
    wait_for("a lease renewal", || async {
        w.kube
            .count_requests(|k| k.resource == "leases" && k.verb == Verb::Update && k.code == 200)
            > 0
    })
    .await;
    // cloud-node + route: nodes join, get initialized and routed. The first taint removal
    // races another writer (409), so the controller re-reads the Node (get) and retries.
    w.kube.faults().conflict_next(Verb::Patch, "nodes", "", 1);
    for (i, n) in ["n1", "n2", "n3"].iter().enumerate() {
        if *n == "n3" {
            // A route slower than the cloud-node controller's wait for it (2 s): the node is
            // initialized first and the route controller writes NetworkUnavailable itself.
            set_route_latency(&w.cloud, Duration::from_secs(3));
        }
        w.add_node(n, &format!("10.128.{i}.0/24")).await;
        wait_for(&format!("{n} initialized"), || async {
            w.node(n)
                .await
                .is_some_and(|n| !has_taint(&n, "node.cloudprovider.kubernetes.io/uninitialized"))
        })
        .await;
    }
    wait_for("routes", || async { w.cloud.routes().len() == 3 }).await;
    wait_for("n3 routed", || async {
        w.node("n3").await.is_some_and(|n| {
            n.status
                .and_then(|s| s.conditions)
                .into_iter()
                .flatten()
                .any(|c| c.type_ == "NetworkUnavailable" && c.status == "False")
        })
    })
    .await;
    set_route_latency(&w.cloud, Duration::ZERO);

    scrape_metrics(
        &w,
        SocketAddr::from(([127, 0, 0, 1], port)),
        &dir.join("certs"),
    )
    .await;

    // service: a LoadBalancer Service gets ingress, then is deleted (finalizer removed).
    let services: Api<Service> = Api::namespaced(admin.clone(), "default");
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"type": "LoadBalancer", "selector": {"app": "web"},
                 "ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP"}]},
    }))
    .expect("svc");
    services
        .create(&PostParams::default(), &svc)
        .await
        .expect("create svc");
    wait_for("ingress", || async {
        services.get("web").await.ok().is_some_and(|s| {
            s.status
                .and_then(|s| s.load_balancer)
                .and_then(|l| l.ingress)
                .is_some_and(|i| !i.is_empty())
        })
    })
    .await;
    // A second change of the same Service repeats its events: the recorder patches the
    // existing Event's count instead of creating another.
    for port in [81, 82] {
        let p = json!({"spec": {"ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP", "name": "a"},
                                         {"port": port, "targetPort": 8080, "protocol": "TCP", "name": "b"}]}});
        services
            .patch("web", &PatchParams::default(), &Patch::Merge(&p))
            .await
            .expect("change ports");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    wait_for("a repeated event", || async {
        w.kube
            .count_requests(|k| k.resource == "events" && k.verb == Verb::Patch && k.code == 200)
            > 0
    })
    .await;
    services
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete svc");
    wait_for("service gone", || async {
        services.get_opt("web").await.expect("get").is_none()
    })
    .await;

    // cloud-node-lifecycle: a stopped instance is tainted shutdown, the taint goes when it
    // is Ready again; a terminated instance's Node is deleted.
    let id = w.cloud.instance_id("n2").expect("n2 instance");
    w.cloud.stop_instance(&id).expect("stop");
    w.set_ready("n2", "Unknown").await;
    wait_for("shutdown taint", || async {
        w.node("n2")
            .await
            .is_some_and(|n| has_taint(&n, "node.cloudprovider.kubernetes.io/shutdown"))
    })
    .await;
    w.cloud.start_instance(&id).expect("start");
    w.set_ready("n2", "True").await;
    wait_for("shutdown taint removed", || async {
        w.node("n2")
            .await
            .is_some_and(|n| !has_taint(&n, "node.cloudprovider.kubernetes.io/shutdown"))
    })
    .await;
    let id3 = w.cloud.instance_id("n3").expect("n3 instance");
    w.cloud.terminate_instance(&id3).expect("terminate");
    w.set_ready("n3", "Unknown").await;
    wait_for("n3 deleted", || async { w.node("n3").await.is_none() }).await;
    let _ = Api::<Node>::all(admin.clone())
        .list(&ListParams::default())
        .await;
    let _ = child.kill().await;

    // Compare what each identity did with what it was granted.
    let accounts: BTreeSet<String> = objects
        .iter()
        .filter(|o| o["kind"] == "ServiceAccount")
        .filter_map(|o| o["metadata"]["name"].as_str().map(String::from))
        .collect();
    let prefix = format!("system:serviceaccount:{NS}:");
    let mut used = BTreeSet::new();
    let mut denied = Vec::new();
    for c in w.kube.requests() {
        let Some(account) = c.key.user.strip_prefix(&prefix) else {
            continue;
        };
        assert!(accounts.contains(account), "unknown account {account}");
        let res = if c.key.subresource.is_empty() {
            c.key.resource.clone()
        } else {
            format!("{}/{}", c.key.resource, c.key.subresource)
        };
        let t = (
            account.to_string(),
            c.key.verb.as_str().to_string(),
            c.key.group.clone(),
            res,
        );
        if c.key.code == 403 {
            denied.push(t);
        } else {
            used.insert(t);
        }
    }
    assert!(denied.is_empty(), "used but not granted (403): {denied:#?}");
    let granted = granted(&objects);
    let unused: Vec<_> = granted.iter().filter(|g| !used.contains(*g)).collect();
    assert!(
        unused.is_empty(),
        "granted but never used: {unused:#?}\nused: {used:#?}"
    );
    // Each binding to a bootstrap Role is needed: its account used one of the Role's grants.
    let bindings = bootstrap_bindings(&objects);
    assert!(
        !bindings.is_empty(),
        "the manifests bind extension-apiserver-authentication-reader"
    );
    for (account, role) in bindings {
        let r = Api::<k8s_openapi::api::rbac::v1::Role>::namespaced(admin.clone(), NS)
            .get(&role)
            .await
            .unwrap_or_else(|e| panic!("bootstrap Role {role}: {e}"));
        let mut grants = BTreeSet::new();
        expand(
            &account,
            &serde_json::to_value(&r).expect("json")["rules"],
            &mut grants,
        );
        assert!(
            grants.iter().any(|g| used.contains(g)),
            "{account} is bound to {role} but used none of {grants:#?}"
        );
    }
    // Every controller ran under its own account, not the manager's.
    for a in ["node-controller", "route-controller", "service-controller"] {
        assert!(
            used.iter().any(|(acc, ..)| acc == a),
            "{a} made no requests: {used:#?}"
        );
    }
    // And the evaluator agrees with the expansion for a sample: the route controller may
    // not delete nodes.
    let d = w.kube.authorize(&Attributes::resource(
        UserInfo::service_account(NS, "route-controller"),
        "delete",
        "",
        "nodes",
        "",
        "",
        "n1",
    ));
    assert!(!d.allowed);
    let _ = std::fs::remove_dir_all(&dir);
}
