//! Service load-balancer controller against kube-sim (real HTTP) and the simulated cloud.
//!
//! No timed assertions: every wait polls a condition (20 ms) with a generous timeout.

mod common;

use common::{TIMEOUT, wait_for};

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use ccm_cloud::{CloudMetrics, CloudProvider, MeterOptions, metered, op};
use ccm_controllers::Shared;
use ccm_controllers::queue::Backoff;
use ccm_controllers::service::planner::LOAD_BALANCER_CLEANUP_FINALIZER;
use ccm_controllers::service::{ServiceConfig, ServiceController, ServiceHandle};
use ccm_kube_sim::{Config as SimConfig, KubeSim, Verb};
use ccm_provider_sim::{Latency, SimCloud, SimLoadBalancer, Throttle};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use prometheus_client::registry::Registry;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const CLUSTER: &str = "test-cluster";
const AGENT: &str = "service-controller";

struct Env {
    kube: KubeSim,
    /// The test's own client (User-Agent `kube-sim-client`), so the controller's writes can be
    /// counted apart.
    client: kube::Client,
    /// The controller's client (User-Agent `service-controller`).
    controller_client: kube::Client,
    cloud: SimCloud,
    metrics: CloudMetrics,
    provider: Arc<dyn CloudProvider>,
}

impl Env {
    async fn new(seed: u64) -> Env {
        let kube = KubeSim::start(SimConfig::default())
            .await
            .expect("kube-sim");
        let client = kube.client().expect("client");
        let controller_client = kube.client_with_user_agent(AGENT).expect("client");
        let cloud = SimCloud::seeded(seed);
        let metrics = CloudMetrics::default();
        let provider = metered(cloud.provider(), metrics.clone(), MeterOptions::default());
        Env {
            kube,
            client,
            controller_client,
            cloud,
            metrics,
            provider,
        }
    }

    fn services(&self) -> Api<Service> {
        Api::namespaced(self.client.clone(), "default")
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    async fn add_node(&self, name: &str, labels: serde_json::Value) {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"providerID": format!("sim://i-{name}")},
        }))
        .expect("node");
        self.nodes()
            .create(&PostParams::default(), &node)
            .await
            .expect("create node");
    }

    fn lbs(&self) -> Vec<SimLoadBalancer> {
        self.cloud.load_balancers()
    }

    fn lb_of(&self, svc: &Service) -> Option<SimLoadBalancer> {
        let uid = svc.metadata.uid.as_deref()?;
        self.lbs().into_iter().find(|lb| lb.service_uid == uid)
    }

    /// Creates a LoadBalancer Service on port 80 and waits for its load balancer.
    async fn create_lb(&self, name: &str) -> Service {
        let svc = self
            .services()
            .create(&PostParams::default(), &lb_service(name, &[80]))
            .await
            .expect("create");
        wait_for(&format!("{name}'s LB"), || async {
            self.lb_of(&svc).is_some()
        })
        .await;
        svc
    }

    /// Waits until `svc`'s load balancer has exactly `hosts`.
    async fn wait_hosts(&self, svc: &Service, hosts: &[&str], why: &str) {
        wait_for(why, || async {
            self.lb_of(svc).is_some_and(|lb| lb.hosts == hosts)
        })
        .await;
    }
}

/// [`config`] with an hour-long node-sync window: after a node sync that updated LBs, no
/// other can run within the test.
fn config_with_hour_window() -> ServiceConfig {
    ServiceConfig {
        node_sync_window: Duration::from_secs(3600),
        ..config()
    }
}

fn config() -> ServiceConfig {
    ServiceConfig {
        concurrent_service_syncs: 10,
        backoff: Backoff {
            base: Duration::from_millis(20),
            max: Duration::from_millis(500),
        },
        drift_check_period: None,
        node_sync_window: Duration::from_millis(50),
        ..ServiceConfig::default()
    }
}

type Running = common::Running<ServiceHandle>;

/// A controller with its own Shared (fresh caches), as a new process would have.
fn start(env: &Env, config: ServiceConfig) -> Running {
    start_shared(env, config).0
}

/// `start`, also returning the controller's caches.
fn start_shared(env: &Env, config: ServiceConfig) -> (Running, Shared) {
    let shared = Shared::new(env.provider.clone(), CLUSTER);
    let shutdown = CancellationToken::new();
    shared.start_informers(env.controller_client.clone(), shutdown.clone());
    let mut registry = Registry::default();
    let controller = ServiceController::new(
        shared.clone(),
        env.controller_client.clone(),
        config,
        &mut registry,
    )
    .expect("controller starts");
    let handle = controller.handle();
    let task = tokio::spawn(controller.run(shutdown.clone()));
    let running = Running {
        handle,
        shutdown,
        task,
        registry,
    };
    (running, shared)
}

/// The LB node list is reused between Services while the node cache is unchanged, and rebuilt
/// once it changes: a Service ensured after a Node joined gets that Node even while no node
/// sync can run (the join of `c` made a pass that updated LBs, and the window after it is an
/// hour, so the later join of `b` waits for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_ensured_after_a_join_gets_the_new_node() {
    let env = Env::new(41).await;
    env.add_node("a", json!({})).await;
    let (run, shared) = start_shared(&env, config_with_hour_window());
    let first = env.create_lb("first").await;
    assert_eq!(env.lb_of(&first).expect("lb").hosts, ["a"]);
    env.add_node("c", json!({})).await;
    env.wait_hosts(
        &first,
        &["a", "c"],
        "c behind the first LB (a pass that opens the window)",
    )
    .await;

    env.add_node("b", json!({})).await;
    wait_for("b in the controller's cache", || async {
        shared.nodes.get("b").is_some()
    })
    .await;
    let second = env.create_lb("second").await;
    assert_eq!(env.lb_of(&second).expect("lb").hosts, ["a", "b", "c"]);
    assert_eq!(
        env.lb_of(&first).expect("lb").hosts,
        ["a", "c"],
        "no node sync ran: b reached the second LB through its ensure"
    );
    run.stop().await;
    env.kube.shutdown().await;
}

/// Providers get the node cache's own Nodes, not copies: while the cache is unchanged the LB
/// list holds them (one Node in memory, however many Services). Once a Node changes in a way
/// that moves no LB (a label), the list lets go of the old version, so it is freed: kept, every
/// kubelet status update at rest would leave a second version of its Node behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lb_list_shares_the_cached_nodes_and_frees_a_replaced_version() {
    let env = Env::new(47).await;
    env.add_node("a", json!({})).await;
    env.add_node("b", json!({})).await;
    let (run, shared) = start_shared(&env, config());
    let svc = env.create_lb("web").await;
    env.wait_hosts(&svc, &["a", "b"], "both Nodes behind the LB")
        .await;
    let cached = shared.nodes.get("a").expect("a cached");
    assert!(
        Arc::strong_count(&cached) > 2,
        "the LB list holds the cache's own Node (cache, list, this test): {} holders",
        Arc::strong_count(&cached)
    );
    let old = Arc::downgrade(&cached);
    drop(cached);
    env.nodes()
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "web"}}})),
        )
        .await
        .expect("label a");
    wait_for("the old version of a freed", || async {
        old.upgrade().is_none()
    })
    .await;
    assert_eq!(env.lb_of(&svc).expect("lb").hosts, ["a", "b"]);
    run.stop().await;
    env.kube.shutdown().await;
}

/// The workers (100 by default) wait for work nearly all the time; an idle one must not hold
/// room for a whole sync's state (inline it was ~4 KiB: 0.4 MB of a CCM at rest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_service_worker_is_small() {
    let env = Env::new(53).await;
    let run = start(&env, config());
    let bytes = run.handle.idle_worker_bytes();
    assert!(bytes <= 1024, "an idle service worker holds {bytes} bytes");
    run.stop().await;
    env.kube.shutdown().await;
}

/// A Node joining a quiet cluster reaches every load balancer at once, whatever the node
/// sync window (here an hour): the window only spaces passes that changed load balancers, so
/// a second join right after the first waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_join_reaches_the_load_balancers_without_waiting_for_the_window() {
    let env = Env::new(43).await;
    env.add_node("a", json!({})).await;
    let run = start(&env, config_with_hour_window());
    let svc = env.create_lb("web").await;

    env.add_node("b", json!({})).await;
    env.wait_hosts(
        &svc,
        &["a", "b"],
        "b behind the LB before the hour-long window ends",
    )
    .await;

    env.add_node("c", json!({})).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        env.lb_of(&svc).expect("lb").hosts,
        ["a", "b"],
        "a join within the window of a pass that updated LBs waits for the window"
    );
    run.stop().await;
    env.kube.shutdown().await;
}

/// A joining Node is not a backend until the cloud confirms it: registered with the
/// `uninitialized` taint and no providerID it changes no load balancer; initialized (providerID
/// set, taint removed, as the cloud-node controller does) it joins each load balancer with one
/// update. Upstream updates every load balancer twice for one join (at registration and again
/// when the providerID arrives).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_updates_each_load_balancer_once_when_the_node_is_initialized() {
    let env = Env::new(47).await;
    env.add_node("a", json!({})).await;
    let (run, shared) = start_shared(&env, config());
    let services = [
        env.create_lb("one").await,
        env.create_lb("two").await,
        env.create_lb("three").await,
    ];
    wait_for("idle", || async { run.handle.pending() == 0 }).await;
    let updates = || env.metrics.count(op::UPDATE_LOAD_BALANCER);
    assert_eq!(updates(), 0);

    let joining: Node = serde_json::from_value(json!({
        "metadata": {"name": "j"},
        "spec": {"taints": [{"key": "node.cloudprovider.kubernetes.io/uninitialized",
                             "value": "true", "effect": "NoSchedule"}]},
    }))
    .expect("node");
    env.nodes()
        .create(&PostParams::default(), &joining)
        .await
        .expect("register j");
    wait_for("j in the controller's cache", || async {
        shared.nodes.get("j").is_some()
    })
    .await;
    // Give a node sync the chance to run on the registration (it must change nothing).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(updates(), 0, "an uninitialized Node is no backend yet");
    for svc in &services {
        assert_eq!(env.lb_of(svc).expect("lb").hosts, ["a"]);
    }

    env.nodes()
        .patch(
            "j",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"providerID": "sim://i-j", "taints": null}})),
        )
        .await
        .expect("initialize j");
    for svc in &services {
        env.wait_hosts(svc, &["a", "j"], "j behind every LB once initialized")
            .await;
    }
    wait_for("idle", || async { run.handle.pending() == 0 }).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(updates(), 3, "one update per load balancer for the join");
    run.stop().await;
    env.kube.shutdown().await;
}

fn lb_service(name: &str, ports: &[i32]) -> Service {
    let ports: Vec<_> = ports
        .iter()
        .map(|p| json!({"name": format!("p{p}"), "port": p, "protocol": "TCP"}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"type": "LoadBalancer", "ports": ports},
    }))
    .expect("service")
}

fn ingress_ips(svc: &Service) -> Vec<String> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|i| i.iter().filter_map(|i| i.ip.clone()).collect())
        .unwrap_or_default()
}

fn has_finalizer(svc: &Service) -> bool {
    svc.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == LOAD_BALANCER_CLEANUP_FINALIZER))
}

async fn get(env: &Env, name: &str) -> Option<Service> {
    env.services().get_opt(name).await.expect("get service")
}

async fn patch_spec(env: &Env, name: &str, spec: serde_json::Value) -> kube::Result<Service> {
    env.services()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": spec })),
        )
        .await
}

/// type → ClusterIP. kube-apiserver drops the type-dependent fields (nodePorts,
/// externalTrafficPolicy) itself; kube-sim refuses them instead, so the patch clears them.
async fn to_cluster_ip(env: &Env, name: &str) -> kube::Result<Service> {
    let svc = env.services().get(name).await?;
    let ports: Vec<_> = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|p| json!({"name": p.name, "port": p.port, "protocol": p.protocol}))
        .collect();
    env.services()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({
                "metadata": {"resourceVersion": svc.metadata.resource_version},
                "spec": {"type": "ClusterIP", "externalTrafficPolicy": null, "ports": ports},
            })),
        )
        .await
}

/// The Service is ensured: finalizer, an LB in the cloud, and the LB's VIP as ingress.
async fn ensured(env: &Env, name: &str) -> bool {
    let Some(svc) = get(env, name).await else {
        return false;
    };
    let Some(lb) = env.lb_of(&svc) else {
        return false;
    };
    has_finalizer(&svc) && ingress_ips(&svc) == vec![lb.vip.to_string()]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_finalizer_first_update_type_change_delete_and_class() {
    let env = Env::new(1).await;
    env.add_node("n1", json!({})).await;
    env.add_node("n2", json!({})).await;
    let ctl = start(&env, config());

    // Create: the first EnsureLoadBalancer fails, and by then the finalizer is already there.
    env.cloud
        .fail_next(op::ENSURE_LOAD_BALANCER, 1)
        .expect("op");
    env.services()
        .create(&PostParams::default(), &lb_service("web", &[80]))
        .await
        .expect("create");
    wait_for("first ensure call", || async {
        env.metrics.count(op::ENSURE_LOAD_BALANCER) >= 1
    })
    .await;
    let svc = get(&env, "web").await.expect("exists");
    assert!(has_finalizer(&svc), "finalizer is added before the LB");
    wait_for("web ensured", || ensured(&env, "web")).await;
    let svc = get(&env, "web").await.expect("exists");
    let lb = env.lb_of(&svc).expect("lb");
    assert_eq!(lb.hosts, vec!["n1", "n2"]);
    assert_eq!(lb.ports.len(), 1);
    assert_eq!(lb.ports[0].port, 80);
    let node_port = svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].node_port;
    assert_eq!(Some(lb.ports[0].node_port), node_port);

    // Status written once, through /status only.
    let status_writes = env
        .kube
        .count_requests(|k| k.client == AGENT && k.resource == "services" && k.verb == Verb::Patch);
    assert!(status_writes >= 2, "finalizer + status patches");
    assert_eq!(
        env.kube.count_requests(|k| {
            k.client == AGENT
                && k.resource == "services"
                && k.verb.is_write()
                && k.subresource != "status"
        }),
        0,
        "never writes the main resource"
    );

    // Change ports: the LB gets them.
    let ports = json!([{"name": "p80", "port": 80, "protocol": "TCP"},
                       {"name": "p443", "port": 443, "protocol": "TCP"}]);
    patch_spec(&env, "web", json!({"ports": ports}))
        .await
        .expect("patch ports");
    wait_for("LB has two listeners", || async {
        let svc = get(&env, "web").await.expect("exists");
        env.lb_of(&svc).is_some_and(|lb| {
            lb.ports.iter().map(|p| p.port).collect::<BTreeSet<_>>() == BTreeSet::from([80, 443])
        })
    })
    .await;
    let vip = env.lb_of(&get(&env, "web").await.unwrap()).unwrap().vip;

    // type → ClusterIP: LB deleted, finalizer and ingress gone.
    to_cluster_ip(&env, "web").await.expect("to ClusterIP");
    wait_for("LB deleted and Service cleaned", || async {
        let svc = get(&env, "web").await.expect("exists");
        env.lbs().is_empty() && !has_finalizer(&svc) && ingress_ips(&svc).is_empty()
    })
    .await;

    // Back to LoadBalancer, then delete: the LB goes before the finalizer.
    patch_spec(&env, "web", json!({"type": "LoadBalancer"}))
        .await
        .expect("to LB");
    wait_for("web ensured again", || ensured(&env, "web")).await;
    assert_ne!(
        env.lb_of(&get(&env, "web").await.unwrap())
            .unwrap()
            .vip
            .to_string(),
        "",
        "new LB has a VIP (was {vip})"
    );
    let deletes_before = env.metrics.count(op::ENSURE_LOAD_BALANCER_DELETED);
    env.cloud
        .fail_next(op::ENSURE_LOAD_BALANCER_DELETED, 2)
        .expect("op");
    env.services()
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete");
    wait_for("a failed LB delete", || async {
        env.metrics.count(op::ENSURE_LOAD_BALANCER_DELETED) > deletes_before
    })
    .await;
    let svc = get(&env, "web")
        .await
        .expect("still there while its LB exists");
    assert!(svc.metadata.deletion_timestamp.is_some());
    assert!(has_finalizer(&svc));
    assert_eq!(env.lbs().len(), 1, "LB still exists");
    wait_for("Service gone", || async {
        get(&env, "web").await.is_none()
    })
    .await;
    assert!(env.lbs().is_empty(), "LB deleted before the finalizer went");

    // A Service with a loadBalancerClass is never touched.
    let mut classy = lb_service("classy", &[80]);
    classy.spec.as_mut().unwrap().load_balancer_class = Some("example.com/other".into());
    env.services()
        .create(&PostParams::default(), &classy)
        .await
        .expect("create classy");
    env.services()
        .create(&PostParams::default(), &lb_service("plain", &[80]))
        .await
        .expect("create plain");
    wait_for("plain ensured", || ensured(&env, "plain")).await;
    wait_for("idle", || async { ctl.handle.pending() == 0 }).await;
    let classy = get(&env, "classy").await.expect("exists");
    assert!(!has_finalizer(&classy));
    assert!(ingress_ips(&classy).is_empty());
    assert!(env.lb_of(&classy).is_none());
    assert_eq!(env.lbs().len(), 1);

    ctl.stop().await;
}

fn lb_sync_total(ctl: &Running) -> u64 {
    ctl.metrics_text()
        .lines()
        .find(|l| l.starts_with("service_controller_loadbalancer_sync_total "))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_changes_update_only_services_whose_set_changed() {
    let env = Env::new(2).await;
    for n in ["n1", "n2", "n3"] {
        env.add_node(n, json!({})).await;
    }
    let ctl = start(&env, config());
    for name in ["a", "b"] {
        env.services()
            .create(&PostParams::default(), &lb_service(name, &[80]))
            .await
            .expect("create");
    }
    // A ClusterIP Service and a classed one: never updated.
    let mut cip = lb_service("cip", &[80]);
    cip.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
    env.services()
        .create(&PostParams::default(), &cip)
        .await
        .expect("cip");
    let mut classy = lb_service("classy", &[80]);
    classy.spec.as_mut().unwrap().load_balancer_class = Some("example.com/x".into());
    env.services()
        .create(&PostParams::default(), &classy)
        .await
        .expect("classy");
    wait_for("a and b ensured", || async {
        ensured(&env, "a").await && ensured(&env, "b").await
    })
    .await;
    wait_for("idle", || async { ctl.handle.pending() == 0 }).await;
    let hosts = |name: &'static str| {
        let env = &env;
        async move { env.lb_of(&get(env, name).await.unwrap()).unwrap().hosts }
    };
    let updates = || env.metrics.count(op::UPDATE_LOAD_BALANCER);
    assert_eq!(updates(), 0);

    // Add a node: one update per LB Service.
    env.add_node("n4", json!({})).await;
    wait_for("n4 in both LBs", || async {
        hosts("a").await.contains(&"n4".to_string()) && hosts("b").await.contains(&"n4".to_string())
    })
    .await;
    wait_for("idle", || async { ctl.handle.pending() == 0 }).await;
    assert_eq!(updates(), 2);
    assert_eq!(lb_sync_total(&ctl), 2);

    // Node changes that leave the set as it is: no update at all.
    env.add_node(
        "n5",
        json!({"node.kubernetes.io/exclude-from-external-load-balancers": "true"}),
    )
    .await; // triggers a node sync (add), but n5 is excluded
    env.nodes()
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {"node.kubernetes.io/exclude-from-external-load-balancers": "false"}}})),
        )
        .await
        .expect("label false keeps the node");
    env.nodes()
        .patch(
            "n2",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {"unrelated": "x"}}})),
        )
        .await
        .expect("unrelated label");
    env.nodes()
        .delete("n5", &DeleteParams::default())
        .await
        .expect("delete excluded node"); // triggers, set unchanged
    // Let the controller see all of it: a later, set-changing event proves it processed them.
    env.nodes()
        .patch(
            "n3",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {"node.kubernetes.io/exclude-from-external-load-balancers": "true"}}})),
        )
        .await
        .expect("exclude n3");
    wait_for("n3 out of both LBs", || async {
        !hosts("a").await.contains(&"n3".to_string())
            && !hosts("b").await.contains(&"n3".to_string())
    })
    .await;
    wait_for("idle", || async { ctl.handle.pending() == 0 }).await;
    assert_eq!(updates(), 4, "only the exclusion of n3 changed the set");
    assert_eq!(hosts("a").await, vec!["n1", "n2", "n4"]);

    // Remove a node: both updated again; a failing update is retried through a full ensure.
    env.cloud
        .fail_next(op::UPDATE_LOAD_BALANCER, 1)
        .expect("op");
    let ensures = env.metrics.count(op::ENSURE_LOAD_BALANCER);
    env.nodes()
        .delete("n4", &DeleteParams::default())
        .await
        .expect("delete n4");
    wait_for("n4 out of both LBs", || async {
        !hosts("a").await.contains(&"n4".to_string())
            && !hosts("b").await.contains(&"n4".to_string())
    })
    .await;
    wait_for("idle", || async { ctl.handle.pending() == 0 }).await;
    assert_eq!(updates(), 6);
    assert_eq!(
        env.metrics.count(op::ENSURE_LOAD_BALANCER),
        ensures + 1,
        "the failed update became one full ensure"
    );
    assert!(
        ctl.metrics_text()
            .contains("service_controller_nodesync_error_total 1"),
        "{}",
        ctl.metrics_text()
    );
    let svc = get(&env, "cip").await.unwrap();
    assert!(env.lb_of(&svc).is_none() && !has_finalizer(&svc));
    ctl.stop().await;
}

/// A load balancer that tracks how many Nodes its ensure/update calls hold at once.
struct NodesInFlight {
    inner: Arc<dyn ccm_cloud::LoadBalancer>,
    now: std::sync::atomic::AtomicUsize,
    max: std::sync::atomic::AtomicUsize,
}

impl NodesInFlight {
    async fn holding<T>(&self, nodes: usize, call: impl std::future::Future<Output = T>) -> T {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.now.fetch_add(nodes, SeqCst) + nodes;
        self.max.fetch_max(now, SeqCst);
        let r = call.await;
        self.now.fetch_sub(nodes, SeqCst);
        r
    }
}

#[async_trait::async_trait]
impl ccm_cloud::LoadBalancer for NodesInFlight {
    async fn get_load_balancer(
        &self,
        cluster: &str,
        svc: &Service,
    ) -> ccm_cloud::CloudResult<Option<k8s_openapi::api::core::v1::LoadBalancerStatus>> {
        self.inner.get_load_balancer(cluster, svc).await
    }
    async fn ensure_load_balancer(
        &self,
        cluster: &str,
        svc: &Service,
        nodes: &[std::sync::Arc<Node>],
    ) -> ccm_cloud::CloudResult<k8s_openapi::api::core::v1::LoadBalancerStatus> {
        let call = self.inner.ensure_load_balancer(cluster, svc, nodes);
        self.holding(nodes.len(), call).await
    }
    async fn update_load_balancer(
        &self,
        cluster: &str,
        svc: &Service,
        nodes: &[std::sync::Arc<Node>],
    ) -> ccm_cloud::CloudResult<()> {
        let call = self.inner.update_load_balancer(cluster, svc, nodes);
        self.holding(nodes.len(), call).await
    }
    async fn ensure_load_balancer_deleted(
        &self,
        cluster: &str,
        svc: &Service,
    ) -> ccm_cloud::CloudResult<()> {
        self.inner.ensure_load_balancer_deleted(cluster, svc).await
    }
}

struct WithLb(Arc<NodesInFlight>);

impl CloudProvider for WithLb {
    fn provider_name(&self) -> &str {
        "nodes-in-flight"
    }
    fn load_balancer(&self) -> Option<Arc<dyn ccm_cloud::LoadBalancer>> {
        Some(self.0.clone())
    }
}

/// Concurrent provider calls never hold more Nodes than `nodes_in_flight` between them (each
/// call's node list becomes a request body: at 50,000 Nodes, 100 at once were gigabytes), and
/// with the budget every LB is still made and then updated for a join. Without it the ten
/// workers hand 5 Nodes each to up to ten calls at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_calls_never_hold_more_nodes_than_the_budget() {
    let mut env = Env::new(44).await;
    for i in 0..5 {
        env.add_node(&format!("n{i}"), json!({})).await;
    }
    env.cloud
        .set_latency("*", Latency::from_millis(20, 5))
        .expect("latency");
    let lb = Arc::new(NodesInFlight {
        inner: env.provider.load_balancer().expect("the sim has LBs"),
        now: Default::default(),
        max: Default::default(),
    });
    env.provider = Arc::new(WithLb(lb.clone()));
    let ctl = start(
        &env,
        ServiceConfig {
            nodes_in_flight: 10,
            ..config()
        },
    );
    let api = env.services();
    let names: Vec<String> = (0..12).map(|i| format!("b{i:02}")).collect();
    futures::future::join_all(names.iter().map(|n| {
        let api = api.clone();
        async move {
            api.create(&PostParams::default(), &lb_service(n, &[80]))
                .await
                .expect("create")
        }
    }))
    .await;
    wait_for("12 LBs on 5 hosts", || async {
        let lbs = env.lbs();
        lbs.len() == 12 && lbs.iter().all(|lb| lb.hosts.len() == 5)
    })
    .await;
    env.add_node("n5", json!({})).await;
    wait_for("12 LBs updated to 6 hosts", || async {
        env.lbs().iter().filter(|lb| lb.hosts.len() == 6).count() == 12
    })
    .await;
    let max = lb.max.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        (5..=10).contains(&max),
        "at most 10 Nodes in flight, at least one call's 5: {max}"
    );
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_200_services_converge() {
    let env = Env::new(3).await;
    for i in 0..20 {
        env.add_node(&format!("n{i:02}"), json!({})).await;
    }
    // A cloud with realistic per-call latency.
    env.cloud
        .set_latency("*", Latency::from_millis(20, 10))
        .expect("latency");
    // SERVICE_SCALE_WORKERS=1 measures upstream's default for comparison.
    let workers = std::env::var("SERVICE_SCALE_WORKERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let ctl = start(
        &env,
        ServiceConfig {
            concurrent_service_syncs: workers,
            ..config()
        },
    );
    let started = Instant::now();
    let api = env.services();
    futures::future::join_all((0..200).map(|i| {
        let api = api.clone();
        async move {
            api.create(
                &PostParams::default(),
                &lb_service(&format!("s{i:03}"), &[80]),
            )
            .await
            .expect("create")
        }
    }))
    .await;
    let list = || async {
        api.list(&Default::default())
            .await
            .expect("list")
            .items
            .into_iter()
            .filter(|s| {
                s.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with('s'))
            })
            .collect::<Vec<_>>()
    };
    wait_for("200 LBs with ingress", || async {
        let svcs = list().await;
        env.lbs().len() == 200
            && svcs.len() == 200
            && svcs
                .iter()
                .all(|s| has_finalizer(s) && ingress_ips(s).len() == 1)
    })
    .await;
    let elapsed = started.elapsed();
    wait_for("idle", || async { ctl.handle.pending() == 0 }).await;
    let calls: BTreeMap<&str, u64> = [
        op::GET_LOAD_BALANCER,
        op::ENSURE_LOAD_BALANCER,
        op::UPDATE_LOAD_BALANCER,
        op::ENSURE_LOAD_BALANCER_DELETED,
    ]
    .into_iter()
    .map(|o| (o, env.metrics.count(o)))
    .collect();
    let writes = env.kube.count_writes(AGENT);
    let svc_writes = env
        .kube
        .count_requests(|k| k.client == AGENT && k.resource == "services" && k.verb.is_write());
    println!(
        "SCALE 200 services / 20 nodes / cloud latency 20±10ms / {workers} workers: converged in {elapsed:?}; cloud calls {calls:?}; API writes {writes} (services {svc_writes}, rest events)"
    );
    assert_eq!(
        calls[op::ENSURE_LOAD_BALANCER],
        200,
        "one ensure per Service"
    );
    assert_eq!(calls[op::UPDATE_LOAD_BALANCER], 0);
    assert_eq!(
        svc_writes, 400,
        "one finalizer and one status patch per Service"
    );
    ctl.stop().await;
}

/// Random create / update / type-flip / delete churn on a pool of names with cloud faults.
async fn churn(env: &Env, rng: &mut StdRng, steps: usize, ok: &mut usize) {
    let api = env.services();
    for _ in 0..steps {
        let name = format!("c{:02}", rng.random_range(0..30));
        let roll = rng.random_range(0..100);
        let result = match roll {
            0..=39 => {
                let mut svc = lb_service(&name, &[80]);
                match rng.random_range(0..10) {
                    0 => svc.spec.as_mut().unwrap().type_ = Some("ClusterIP".into()),
                    1 => {
                        svc.spec.as_mut().unwrap().load_balancer_class =
                            Some("example.com/other".into())
                    }
                    _ => {}
                }
                api.create(&PostParams::default(), &svc).await.map(|_| ())
            }
            40..=59 => {
                let port = rng.random_range(1..1000);
                let ports = json!([{"name": "p", "port": port, "protocol": "TCP"}]);
                patch_spec(env, &name, json!({"ports": ports}))
                    .await
                    .map(|_| ())
            }
            60..=69 => to_cluster_ip(env, &name).await.map(|_| ()),
            70..=79 => patch_spec(env, &name, json!({"type": "LoadBalancer"}))
                .await
                .map(|_| ()),
            80..=84 => env
                .services()
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"metadata": {"annotations": {"x": rng.random_range(0..9).to_string()}}})),
                )
                .await
                .map(|_| ()),
            _ => api
                .delete(&name, &DeleteParams::default())
                .await
                .map(|_| ()),
        };
        // Conflicts, NotFound and validation refusals are part of the churn; count what landed.
        if result.is_ok() {
            *ok += 1;
        }
        if rng.random_range(0..20) == 0 {
            let n = format!("x{}", rng.random_range(0..3));
            if env.nodes().get_opt(&n).await.expect("get node").is_some() {
                let _ = env.nodes().delete(&n, &DeleteParams::default()).await;
            } else {
                env.add_node(&n, json!({})).await;
            }
        }
        if rng.random_range(0..10) == 0 {
            no_lb_without_service(env).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..15))).await;
    }
}

/// At any moment, an LB that exists in the cloud belongs to a Service that still exists and
/// carries the finalizer: otherwise it could leak. An LB seen both before and after listing
/// the Services existed throughout the list, so the list must show its Service.
async fn no_lb_without_service(env: &Env) {
    let before: BTreeSet<String> = env.lbs().into_iter().map(|lb| lb.service_uid).collect();
    let svcs = env
        .services()
        .list(&Default::default())
        .await
        .expect("list");
    let after: BTreeSet<String> = env.lbs().into_iter().map(|lb| lb.service_uid).collect();
    let protected: BTreeSet<String> = svcs
        .items
        .iter()
        .filter(|s| has_finalizer(s))
        .filter_map(|s| s.metadata.uid.clone())
        .collect();
    for uid in before.intersection(&after) {
        assert!(
            protected.contains(uid),
            "LB of Service uid {uid} exists without a finalizer-protected Service"
        );
    }
}

fn faulty(env: &Env) {
    for o in [
        op::GET_LOAD_BALANCER,
        op::ENSURE_LOAD_BALANCER,
        op::UPDATE_LOAD_BALANCER,
        op::ENSURE_LOAD_BALANCER_DELETED,
    ] {
        env.cloud.set_error_rate(o, 0.3).expect("op");
    }
    env.cloud
        .set_throttle(
            "*",
            Some(Throttle {
                qps: 40.0,
                burst: 10,
            }),
        )
        .expect("throttle");
    env.cloud
        .set_latency("*", Latency::from_millis(2, 8))
        .expect("latency");
}

#[derive(Debug, Default)]
struct Audit {
    services: usize,
    lb_services: usize,
    lbs: usize,
    leaked: Vec<String>,
    missing: Vec<String>,
    wrong_ingress: Vec<String>,
    stuck_deleting: Vec<String>,
    stray_finalizers: Vec<String>,
}

impl Audit {
    fn clean(&self) -> bool {
        self.leaked.is_empty()
            && self.missing.is_empty()
            && self.wrong_ingress.is_empty()
            && self.stuck_deleting.is_empty()
            && self.stray_finalizers.is_empty()
    }
}

async fn audit(env: &Env) -> Audit {
    let svcs = env
        .services()
        .list(&Default::default())
        .await
        .expect("list");
    let lbs = env.lbs();
    let by_uid: BTreeMap<&str, &SimLoadBalancer> =
        lbs.iter().map(|lb| (lb.service_uid.as_str(), lb)).collect();
    let mut a = Audit {
        lbs: lbs.len(),
        ..Default::default()
    };
    let mut wanted = BTreeSet::new();
    for s in &svcs.items {
        let name = s.metadata.name.clone().unwrap_or_default();
        if name == "kubernetes" {
            continue;
        }
        a.services += 1;
        let spec = s.spec.as_ref().unwrap();
        let wants =
            spec.type_.as_deref() == Some("LoadBalancer") && spec.load_balancer_class.is_none();
        if s.metadata.deletion_timestamp.is_some() {
            a.stuck_deleting.push(name.clone());
            continue;
        }
        let uid = s.metadata.uid.as_deref().unwrap_or_default();
        if wants {
            a.lb_services += 1;
            wanted.insert(uid.to_string());
            match by_uid.get(uid) {
                None => a.missing.push(name.clone()),
                Some(lb) => {
                    if ingress_ips(s) != vec![lb.vip.to_string()] || !has_finalizer(s) {
                        a.wrong_ingress.push(name.clone());
                    }
                    let ports: BTreeSet<i32> =
                        spec.ports.iter().flatten().map(|p| p.port).collect();
                    if lb.ports.iter().map(|p| p.port).collect::<BTreeSet<_>>() != ports {
                        a.wrong_ingress.push(format!("{name} (ports)"));
                    }
                }
            }
        } else {
            if has_finalizer(s) {
                a.stray_finalizers.push(name.clone());
            }
            if !ingress_ips(s).is_empty() && spec.load_balancer_class.is_none() {
                a.wrong_ingress.push(name.clone());
            }
        }
    }
    for lb in &lbs {
        if !wanted.contains(&lb.service_uid) {
            a.leaked
                .push(format!("{}/{}", lb.service_name, lb.service_uid));
        }
    }
    a
}

async fn quiesce_and_audit(env: &Env, ctl: &Running) -> Audit {
    env.cloud.clear_faults();
    let mut last = Audit::default();
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if ctl.handle.pending() == 0 {
            last = audit(env).await;
            if last.clean() {
                return last;
            }
        }
        if Instant::now() > deadline {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_leaks_under_churn_with_cloud_errors_and_throttling() {
    let env = Env::new(4).await;
    for n in ["n1", "n2", "n3"] {
        env.add_node(n, json!({})).await;
    }
    faulty(&env);
    let ctl = start(&env, config());
    let mut rng = StdRng::seed_from_u64(42);
    let started = Instant::now();
    let mut ok = 0;
    churn(&env, &mut rng, 400, &mut ok).await;
    let churned = started.elapsed();
    let a = quiesce_and_audit(&env, &ctl).await;
    println!(
        "CHURN 400 ops ({ok} accepted by the API), 30% LB-call errors + throttle 40qps: churn {churned:?}, quiescent after {:?}; {a:?}; cloud calls get={} ensure={} update={} delete={}",
        started.elapsed(),
        env.metrics.count(op::GET_LOAD_BALANCER),
        env.metrics.count(op::ENSURE_LOAD_BALANCER),
        env.metrics.count(op::UPDATE_LOAD_BALANCER),
        env.metrics.count(op::ENSURE_LOAD_BALANCER_DELETED),
    );
    assert!(a.clean(), "{a:#?}");
    assert_eq!(a.lbs, a.lb_services);
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_leaks_when_the_controller_restarts_mid_churn() {
    let env = Env::new(5).await;
    for n in ["n1", "n2", "n3"] {
        env.add_node(n, json!({})).await;
    }
    faulty(&env);
    let mut rng = StdRng::seed_from_u64(7);
    let first = start(&env, config());
    let mut ok = 0;
    churn(&env, &mut rng, 200, &mut ok).await;
    // Drop the controller mid-flight (in-flight cloud calls are abandoned)...
    first.stop().await;
    churn(&env, &mut rng, 50, &mut ok).await; // ...changes while no controller runs...
    let second = start(&env, config()); // ...and a new process with fresh caches takes over.
    churn(&env, &mut rng, 200, &mut ok).await;
    let a = quiesce_and_audit(&env, &second).await;
    println!("RESTART churn 450 ops ({ok} accepted) with a restart after 200: {a:?}");
    assert!(a.clean(), "{a:#?}");
    assert_eq!(a.lbs, a.lb_services);
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_check_recreates_an_lb_deleted_outside_the_cluster() {
    let env = Env::new(6).await;
    env.add_node("n1", json!({})).await;
    let mut cfg = config();
    cfg.drift_check_period = Some(Duration::from_millis(200));
    let ctl = start(&env, cfg);
    env.services()
        .create(&PostParams::default(), &lb_service("web", &[80]))
        .await
        .expect("create");
    wait_for("ensured", || ensured(&env, "web")).await;
    let svc = get(&env, "web").await.unwrap();
    // Someone deletes the LB in the cloud console.
    use ccm_cloud::LoadBalancer as _;
    env.cloud
        .ensure_load_balancer_deleted(CLUSTER, &svc)
        .await
        .expect("out-of-band delete");
    assert!(env.lbs().is_empty());
    wait_for("LB re-created and ingress updated", || ensured(&env, "web")).await;
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skipped_without_load_balancers_and_invalid_config() {
    struct NoLb;
    impl CloudProvider for NoLb {
        fn provider_name(&self) -> &str {
            "nolb"
        }
    }
    let env = Env::new(7).await;
    let shared = Shared::new(Arc::new(NoLb), CLUSTER);
    let r = ServiceController::new(
        shared,
        env.client.clone(),
        ServiceConfig::default(),
        &mut Registry::default(),
    );
    assert!(matches!(r, Err(ccm_controllers::StartError::Skipped(_))));
    let shared = Shared::new(env.provider.clone(), CLUSTER);
    for bad in [0, 1 << 29] {
        let bad = ServiceConfig {
            nodes_in_flight: bad,
            ..ServiceConfig::default()
        };
        let r = ServiceController::new(
            shared.clone(),
            env.client.clone(),
            bad,
            &mut Registry::default(),
        );
        assert!(
            matches!(&r, Err(ccm_controllers::StartError::Invalid(m)) if m.contains("nodes in flight")),
            "{:?}",
            r.err()
        );
    }
    let bad = ServiceConfig {
        concurrent_service_syncs: 0,
        ..ServiceConfig::default()
    };
    let r = ServiceController::new(shared, env.client.clone(), bad, &mut Registry::default());
    match r {
        Err(ccm_controllers::StartError::Invalid(m)) => {
            assert!(m.contains("--concurrent-service-syncs"))
        }
        _ => panic!("expected Invalid"),
    }
}
