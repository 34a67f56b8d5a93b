//! RBAC exactly as used: the CCM runs with the Deployment's flags under the identities
//! `ccm manifests` creates (its own ServiceAccount, and one per controller through
//! `--use-service-account-credentials`) against kube-sim enforcing those RBAC objects. The
//! scenario walks every controller path that talks to the API; then every request must have
//! been allowed (a used verb that is not granted fails) and every granted verb must have been
//! used (a grant nobody uses fails). The secure port is on, as deployed: a scrape of
//! `/metrics` with a bearer token makes the CCM create TokenReviews and SubjectAccessReviews,
//! and its startup reads the client CA through the bootstrap Role the manifests bind.
//!
//! It runs for every provider, each with its provider's own manifests (`ccm manifests
//! --provider …`) and its real cloud: the sim; metal on sushy-tools (System ids that are not the
//! Node names, BMC credentials from a Secret, kube-vip pairing on, a sharing conflict that makes
//! the provider clear a Service's status, kernel routes in a network namespace: needs root);
//! and, with `--features aws` (`.ci/test` runs it), aws on moto.

#[path = "support/rbac_clouds.rs"]
mod clouds;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use ccm_kube_sim::rbac::{Attributes, UserInfo};
use ccm_kube_sim::{Config, KubeSim, Verb};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::time::Instant;

const NS: &str = "kube-system";
const TIMEOUT: Duration = Duration::from_secs(90);

fn manifests(args: &[String]) -> Vec<Value> {
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
        "Secret" => "secrets",
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

/// The provider's cloud, as the test drives it (an operator's or a kubelet's actions).
enum Cloud {
    Sim(clouds::Sim),
    Metal(clouds::Metal),
    #[cfg(feature = "aws")]
    Aws(clouds::Aws),
}

#[derive(Clone, Copy, Debug)]
enum Provider {
    Sim,
    Metal,
    #[cfg(feature = "aws")]
    Aws,
}

impl Cloud {
    async fn start(p: Provider, dir: &std::path::Path) -> (Cloud, clouds::Launch) {
        match p {
            Provider::Sim => {
                let (c, l) = clouds::Sim::start(dir).await;
                (Cloud::Sim(c), l)
            }
            Provider::Metal => {
                let (c, l) = clouds::Metal::start(dir);
                (Cloud::Metal(c), l)
            }
            #[cfg(feature = "aws")]
            Provider::Aws => {
                let (c, l) = clouds::Aws::start(dir);
                (Cloud::Aws(c), l)
            }
        }
    }

    /// The three Nodes' names: the AWS instances' private DNS names, else n1..n3.
    fn node_names(&self) -> Vec<String> {
        match self {
            #[cfg(feature = "aws")]
            Cloud::Aws(a) => a.instances.iter().map(|(_, n)| n.clone()).collect(),
            _ => ["n1", "n2", "n3"].map(String::from).to_vec(),
        }
    }

    fn add(&self, name: &str) {
        if let Cloud::Sim(s) = self {
            s.add(name);
        }
    }

    async fn stop(&self, name: &str) {
        match self {
            Cloud::Sim(s) => s.stop(name),
            Cloud::Metal(m) => m.stop(name).await,
            #[cfg(feature = "aws")]
            Cloud::Aws(a) => a.stop(name),
        }
    }

    async fn start_again(&self, name: &str) {
        match self {
            Cloud::Sim(s) => s.start_again(name),
            Cloud::Metal(m) => m.start_again(name).await,
            #[cfg(feature = "aws")]
            Cloud::Aws(a) => a.start_again(name),
        }
    }

    fn terminate(&self, name: &str) {
        match self {
            Cloud::Sim(s) => s.terminate(name),
            Cloud::Metal(m) => m.terminate(name),
            #[cfg(feature = "aws")]
            Cloud::Aws(a) => a.terminate(name),
        }
    }

    fn routes(&self) -> usize {
        match self {
            Cloud::Sim(s) => s.cloud.routes().len(),
            Cloud::Metal(m) => m.routes(),
            #[cfg(feature = "aws")]
            Cloud::Aws(a) => a.routes(),
        }
    }
}

struct World {
    kube: KubeSim,
    cloud: Cloud,
    admin: kube::Client,
}

impl World {
    async fn add_node(&self, name: &str, cidr: Option<&str>) {
        self.cloud.add(name);
        let mut spec = json!({"taints": [
            {"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}]});
        if let Some(cidr) = cidr {
            spec["podCIDR"] = json!(cidr);
            spec["podCIDRs"] = json!([cidr]);
        }
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": spec,
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

    fn services(&self) -> Api<Service> {
        Api::namespaced(self.admin.clone(), "default")
    }

    async fn ingress_ips(&self, name: &str) -> Vec<String> {
        self.services()
            .get_opt(name)
            .await
            .ok()
            .flatten()
            .and_then(|s| s.status)
            .and_then(|s| s.load_balancer)
            .and_then(|l| l.ingress)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|i| i.ip.or(i.hostname))
            .collect()
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

/// The provider's CCM process with the Deployment's own flags; only the port and the local
/// wiring differ.
fn spawn_ccm(
    objects: &[Value],
    kube: &KubeSim,
    dir: &std::path::Path,
    launch: &clouds::Launch,
) -> (tokio::process::Child, u16) {
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("a Deployment");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .expect("serviceAccountName");
    let kc = dir.join("kubeconfig");
    let token = kube.service_account_token(NS, sa).expect("token");
    std::fs::write(&kc, kubeconfig(kube, &token)).expect("kubeconfig");
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
        format!("--cloud-config={}", launch.cloud_config.display()),
        format!("--secure-port={port}"),
        "--bind-address=127.0.0.1".into(),
        format!("--cert-dir={}", dir.join("certs").display()),
        "--node-monitor-period=1s".into(),
    ]);
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ccm"))
        .args(&args)
        .envs(launch.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdout(Stdio::null())
        .stderr(if std::env::var_os("CCM_TEST_LOGS").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .kill_on_drop(true)
        .spawn()
        .expect("spawn ccm");
    (child, port)
}

/// cloud-node + route: Nodes join, get initialized and routed. The first taint removal races
/// another writer (409), so the controller re-reads the Node (get) and retries. The third Node
/// gets its pod CIDR only after it is initialized, so the route controller (not the cloud-node
/// controller's folded status write) writes its `NetworkUnavailable` condition.
async fn join_nodes(w: &World, names: &[String]) {
    w.kube.faults().conflict_next(Verb::Patch, "nodes", "", 1);
    for (i, n) in names.iter().enumerate() {
        let cidr = format!("10.128.{i}.0/24");
        let late = i == 2;
        w.add_node(n, (!late).then_some(cidr.as_str())).await;
        wait_for(&format!("{n} initialized"), || async {
            w.node(n)
                .await
                .is_some_and(|n| !has_taint(&n, "node.cloudprovider.kubernetes.io/uninitialized"))
        })
        .await;
        if late {
            let p = json!({"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}});
            Api::<Node>::all(w.admin.clone())
                .patch(n, &PatchParams::default(), &Patch::Merge(&p))
                .await
                .expect("pod CIDR");
        }
    }
    wait_for("routes", || async { w.cloud.routes() == names.len() }).await;
    let last = &names[2];
    wait_for(&format!("{last} routed"), || async {
        w.node(last).await.is_some_and(|n| {
            n.status
                .and_then(|s| s.conditions)
                .into_iter()
                .flatten()
                .any(|c| c.type_ == "NetworkUnavailable" && c.status == "False")
        })
    })
    .await;
}

fn lb_service(name: &str, ports: &[i32], annotations: Value) -> Service {
    let ports: Vec<Value> = ports
        .iter()
        .map(|p| json!({"name": format!("p{p}"), "port": p, "targetPort": 8080, "protocol": "TCP"}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"type": "LoadBalancer", "selector": {"app": name}, "ports": ports},
    }))
    .expect("svc")
}

/// service: a LoadBalancer Service gets ingress, is changed twice (the recorder patches the
/// repeated Event's count instead of creating another), then is deleted (finalizer removed).
/// With metal's kube-vip pairing, the provider writes kube-vip's annotation (watch + patch).
async fn load_balancer(w: &World, kube_vip: bool) {
    let services = w.services();
    services
        .create(&PostParams::default(), &lb_service("web", &[80], json!({})))
        .await
        .expect("create svc");
    wait_for("ingress", || async {
        !w.ingress_ips("web").await.is_empty()
    })
    .await;
    if kube_vip {
        wait_for("kube-vip annotation", || async {
            let ips = w.ingress_ips("web").await;
            services.get("web").await.ok().is_some_and(|s| {
                s.metadata
                    .annotations
                    .unwrap_or_default()
                    .get("kube-vip.io/loadbalancerIPs")
                    == ips.first()
            })
        })
        .await;
    }
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
    delete_services(w, &["web"]).await;
}

async fn delete_services(w: &World, names: &[&str]) {
    let services = w.services();
    for n in names {
        services
            .delete(n, &DeleteParams::default())
            .await
            .expect("delete svc");
    }
    for n in names {
        wait_for(&format!("service {n} gone"), || async {
            services.get_opt(n).await.expect("get").is_none()
        })
        .await;
    }
}

/// metal: two Services share an address by key; one changes its ports into a conflict and
/// gives the address up — the provider clears its status itself (patch services/status under
/// the CCM's own account), and the next sync gives it an address of its own.
async fn metal_sharing_conflict(w: &World) {
    let services = w.services();
    let key = json!({"metal.ccm-rs.io/allow-shared-ip": "rbac"});
    for (name, port) in [("share-a", 80), ("share-b", 81)] {
        services
            .create(
                &PostParams::default(),
                &lb_service(name, &[port], key.clone()),
            )
            .await
            .expect("create svc");
    }
    wait_for("a shared address", || async {
        let (a, b) = (
            w.ingress_ips("share-a").await,
            w.ingress_ips("share-b").await,
        );
        !a.is_empty() && a == b
    })
    .await;
    let p = json!({"spec": {"ports": [{"name": "p81", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}});
    services
        .patch("share-b", &PatchParams::default(), &Patch::Merge(&p))
        .await
        .expect("conflicting ports");
    let manager = format!("system:serviceaccount:{NS}:cloud-controller-manager");
    wait_for(
        "the provider clears the status of the Service that gave up",
        || async {
            w.kube.count_requests(|k| {
                k.user == manager && k.resource == "services" && k.subresource == "status"
            }) > 0
        },
    )
    .await;
    // Only when the clear was allowed does the Service get an address of its own.
    let allowed = w.kube.count_requests(|k| {
        k.user == manager && k.resource == "services" && k.subresource == "status" && k.code == 200
    }) > 0;
    if allowed {
        wait_for("an address of its own", || async {
            let (a, b) = (
                w.ingress_ips("share-a").await,
                w.ingress_ips("share-b").await,
            );
            !b.is_empty() && a != b
        })
        .await;
    }
    delete_services(w, &["share-a", "share-b"]).await;
}

/// cloud-node-lifecycle: a stopped instance is tainted shutdown, the taint goes when it is
/// Ready again; a terminated instance's Node is deleted.
async fn lifecycle(w: &World, names: &[String]) {
    let (n2, n3) = (&names[1], &names[2]);
    w.cloud.stop(n2).await;
    w.set_ready(n2, "Unknown").await;
    wait_for("shutdown taint", || async {
        w.node(n2)
            .await
            .is_some_and(|n| has_taint(&n, "node.cloudprovider.kubernetes.io/shutdown"))
    })
    .await;
    w.cloud.start_again(n2).await;
    w.set_ready(n2, "True").await;
    wait_for("shutdown taint removed", || async {
        w.node(n2)
            .await
            .is_some_and(|n| !has_taint(&n, "node.cloudprovider.kubernetes.io/shutdown"))
    })
    .await;
    w.cloud.terminate(n3);
    w.set_ready(n3, "Unknown").await;
    wait_for(&format!("{n3} deleted"), || async {
        w.node(n3).await.is_none()
    })
    .await;
}

async fn exactly_what_is_granted(provider: Provider) {
    let dir = std::env::temp_dir().join(format!(
        "ccm-rbac-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    let (cloud, launch) = Cloud::start(provider, &dir).await;
    let mut margs = vec!["--cluster-cidr=10.128.0.0/9".to_string()];
    margs.extend(launch.manifest_args.iter().cloned());
    let objects = manifests(&margs);
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
    if let Cloud::Metal(m) = &cloud {
        create(&admin, &m.secret()).await;
    }
    let (mut child, port) = spawn_ccm(&objects, &kube, &dir, &launch);
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
    let names = w.cloud.node_names();
    join_nodes(&w, &names).await;
    scrape_metrics(
        &w,
        SocketAddr::from(([127, 0, 0, 1], port)),
        &dir.join("certs"),
    )
    .await;
    let metal = matches!(w.cloud, Cloud::Metal(_));
    load_balancer(&w, metal).await;
    if metal {
        metal_sharing_conflict(&w).await;
    }
    lifecycle(&w, &names).await;
    let _ = Api::<Node>::all(admin.clone())
        .list(&ListParams::default())
        .await;
    let _ = child.kill().await;
    compare(&w, &objects, &admin).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Compares what each identity did with what it was granted.
async fn compare(w: &World, objects: &[Value], admin: &kube::Client) {
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
    let granted = granted(objects);
    let unused: Vec<_> = granted.iter().filter(|g| !used.contains(*g)).collect();
    assert!(
        unused.is_empty(),
        "granted but never used: {unused:#?}\nused: {used:#?}"
    );
    // Each binding to a bootstrap Role is needed: its account used one of the Role's grants.
    let bindings = bootstrap_bindings(objects);
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controllers_under_the_manifests_identities_use_exactly_what_is_granted() {
    exactly_what_is_granted(Provider::Sim).await;
}

/// The metal provider's own calls (BMC credentials Secret, kube-vip pairing, clearing a
/// Service's status, listing Nodes and Services) under `ccm manifests --provider metal`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metal_uses_exactly_what_its_manifests_grant() {
    exactly_what_is_granted(Provider::Metal).await;
}

/// The AWS provider under `ccm manifests --provider aws`, against moto.
#[cfg(feature = "aws")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_uses_exactly_what_its_manifests_grant() {
    exactly_what_is_granted(Provider::Aws).await;
}
