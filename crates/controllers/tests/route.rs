//! Route controller against kube-sim (real HTTP) and the simulated cloud.
//!
//! No timed assertions: every wait polls a condition (20 ms) with a generous timeout. Periods
//! are configured short (200 ms) instead of sleeping through upstream's 10 s. The only fixed
//! waits are the observation windows of the announcement example, where what is asserted is
//! what *did not* happen (watch mode: zero syncs) or a loose lower bound (interval mode).

mod common;

use common::wait_for;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ccm_cloud::{CloudMetrics, CloudProvider, MeterOptions, Route, Routes, metered, op};
use ccm_controllers::queue::Backoff;
use ccm_controllers::route::{
    REASON_FAILED_TO_CREATE_ROUTE, RouteConfig, RouteController, RouteHandle, RouteMode,
    SyncOutcome, SyncTrigger, parse_cluster_cidrs,
};
use ccm_controllers::{Shared, StartError};
use ccm_kube_sim::{Config as KubeConfig, KubeSim, Verb};
use ccm_provider_sim::{InstanceSpec, SimCloud, SimRoute};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Node};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const CLUSTER: &str = "test-cluster";
const AGENT: &str = "route-controller";
const PERIOD: Duration = Duration::from_millis(200);

struct Env {
    kube: KubeSim,
    client: kube::Client,
    cloud: SimCloud,
    metrics: CloudMetrics,
    provider: Arc<dyn CloudProvider>,
}

impl Env {
    async fn new(seed: u64) -> Env {
        let kube = KubeSim::start(KubeConfig::default())
            .await
            .expect("kube-sim");
        let client = kube.client_with_user_agent(AGENT).expect("client");
        let cloud = SimCloud::seeded(seed);
        let metrics = CloudMetrics::default();
        let provider = metered(cloud.provider(), metrics.clone(), MeterOptions::default());
        Env {
            kube,
            client,
            cloud,
            metrics,
            provider,
        }
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    /// A cloud instance and its Node, with pod CIDRs set at creation (one watch event).
    async fn add_node(&self, name: &str, pod_cidrs: &[&str]) {
        self.cloud.add_instance(InstanceSpec::new(name));
        self.create_node(name, pod_cidrs).await;
    }

    /// The Node only (its instance already exists).
    async fn create_node(&self, name: &str, pod_cidrs: &[&str]) {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"podCIDRs": pod_cidrs, "providerID": format!("sim://{name}")},
        }))
        .expect("node");
        self.nodes()
            .create(&PostParams::default(), &node)
            .await
            .expect("create node");
    }

    fn routes(&self) -> Vec<SimRoute> {
        self.cloud
            .routes()
            .into_iter()
            .filter(|r| r.cluster == CLUSTER)
            .collect()
    }

    fn has_route(&self, node: &str, cidr: &str) -> bool {
        self.routes()
            .iter()
            .any(|r| r.target_node == node && r.destination_cidr == cidr)
    }

    /// Status patches of Nodes by the route controller (its only Node writes).
    fn condition_writes(&self) -> u64 {
        self.kube.count_requests(|k| {
            k.client == AGENT
                && k.verb == Verb::Patch
                && k.resource == "nodes"
                && k.subresource == "status"
                && (200..300).contains(&k.code)
        })
    }

    async fn network_unavailable(&self, node: &str) -> Option<(String, String)> {
        let n = self.nodes().get_opt(node).await.expect("get node")?;
        n.status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "NetworkUnavailable")
            .map(|c| (c.status, c.reason.unwrap_or_default()))
    }

    async fn routed(&self, node: &str) -> bool {
        self.network_unavailable(node).await == Some(("False".into(), "RouteCreated".into()))
    }
}

fn config(mode: RouteMode) -> RouteConfig {
    RouteConfig {
        cluster_cidrs: parse_cluster_cidrs("10.244.0.0/16").expect("cidr"),
        mode,
        reconciliation_period: PERIOD,
        min_sync_interval: PERIOD,
        resync_period: Duration::from_secs(3600),
        // Tests that count syncs or ListRoutes calls see no confirmation unless they ask.
        confirm_delay: Duration::from_secs(3600),
        retry_backoff: Backoff {
            base: Duration::from_millis(50),
            max: Duration::from_secs(1),
        },
        ..RouteConfig::default()
    }
}

type Running = common::Running<RouteHandle>;

impl Running {
    fn syncs(&self) -> u64 {
        self.handle.syncs().total()
    }
}

/// A controller with its own Shared (fresh caches), as a new process would have.
fn start(env: &Env, config: RouteConfig) -> Running {
    start_with(env, config, false)
}

/// `start`, telling the controller whether a cloud-node controller folds the condition of
/// Nodes it initializes into its own write.
fn start_with(env: &Env, config: RouteConfig, node_folds: bool) -> Running {
    let shared = Shared::new(env.provider.clone(), CLUSTER);
    shared.routed.set_node_folds(node_folds);
    let shutdown = CancellationToken::new();
    shared.start_informers(env.client.clone(), shutdown.clone());
    let mut registry = Registry::default();
    let controller = RouteController::new(shared, env.client.clone(), config, &mut registry)
        .expect("controller starts");
    let handle = controller.handle();
    let task = tokio::spawn(controller.run(shutdown.clone()));
    Running {
        handle,
        shutdown,
        task,
        registry,
    }
}

/// Waits until every listed node has its route and `RouteCreated`, and the controller is idle.
async fn wait_converged(env: &Env, run: &Running, nodes: &[(&str, &str)]) {
    wait_for("routes, conditions and an idle controller", || async {
        for (node, cidr) in nodes {
            if !env.has_route(node, cidr) || !env.routed(node).await {
                return false;
            }
        }
        run.handle.pending() == 0
    })
    .await;
}

fn cidr(i: usize) -> String {
    format!("10.244.{}.{}/26", i / 4, (i % 4) * 64)
}

/// The Kubernetes v1.36 announcement's example: a stable cluster, then one node joins.
/// Returns (startup syncs, syncs during the stable window, syncs caused by the join).
async fn announcement(mode: RouteMode, window: Duration) -> (u64, u64, u64) {
    let env = Env::new(1).await;
    let nodes = [
        ("n1", "10.244.1.0/24"),
        ("n2", "10.244.2.0/24"),
        ("n3", "10.244.3.0/24"),
    ];
    for (n, c) in nodes {
        env.add_node(n, &[c]).await;
    }
    let run = start(&env, config(mode));
    wait_converged(&env, &run, &nodes).await;
    let s0 = run.syncs();

    // The stable window: nothing changes in the cluster.
    tokio::time::sleep(window).await;
    let s1 = run.syncs();

    env.add_node("n4", &["10.244.4.0/24"]).await;
    wait_converged(&env, &run, &[("n4", "10.244.4.0/24")]).await;
    let s2 = run.syncs();
    // Each sync lists routes exactly once, but for those planned from the known listing.
    assert_eq!(
        env.metrics.count(op::LIST_ROUTES) + run.handle.syncs_from_known(),
        s2
    );
    run.stop().await;
    env.kube.shutdown().await;
    (s0, s1 - s0, s2 - s1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn announcement_example_interval_vs_watch() {
    let window = PERIOD * 10;
    let (w_start, w_window, w_join) = announcement(RouteMode::Watch, window).await;
    let (i_start, i_window, i_join) = announcement(RouteMode::Interval, window).await;
    println!(
        "stable window of {window:?} with a {PERIOD:?} period: interval mode {i_window} syncs \
         (startup {i_start}, join {i_join}); watch mode {w_window} syncs (startup {w_start}, \
         join {w_join})"
    );
    // Watch mode: one startup sync, none while stable, exactly one for the join.
    assert_eq!(w_start, 1, "watch mode startup");
    assert_eq!(w_window, 0, "watch mode must not sync a stable cluster");
    assert_eq!(w_join, 1, "a node join is exactly one sync");
    // Interval mode syncs every period whatever happens (≈10 here; loose bound: noisy CI).
    assert!(i_window >= 2, "interval mode synced {i_window} times");
}

/// A sync takes at least one ListRoutes and one CreateRoute round trip at this latency.
const CLOUD_LATENCY: Duration = Duration::from_millis(40);

fn slow_cloud(env: &Env) {
    env.cloud
        .set_latency(
            "*",
            ccm_provider_sim::Latency {
                fixed: CLOUD_LATENCY,
                jitter: Duration::ZERO,
            },
        )
        .expect("latency");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_of_300_nodes_coalesces_without_waiting() {
    let env = Env::new(2).await;
    slow_cloud(&env);
    let mut cfg = config(RouteMode::Watch);
    // The limiter's interval only matters while the cloud throttles: an hour here would stall
    // the burst if any sync waited for it.
    cfg.min_sync_interval = Duration::from_secs(3600);
    let run = start(&env, cfg);
    wait_for("startup sync", || async {
        run.syncs() == 1 && run.handle.pending() == 0
    })
    .await;

    let names: Vec<String> = (0..300).map(|i| format!("burst-{i:03}")).collect();
    let started = Instant::now();
    futures::stream::iter(names.iter().enumerate())
        .map(|(i, name)| {
            let env = &env;
            async move { env.add_node(name, &[&cidr(i)]).await }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
    let burst = started.elapsed();
    wait_for("300 routes", || async { env.routes().len() == 300 }).await;
    wait_for("idle", || async { run.handle.pending() == 0 }).await;
    let mut all_routed = true;
    for (i, name) in names.iter().enumerate() {
        all_routed &= env.has_route(name, &cidr(i));
    }
    assert!(all_routed, "every node has its route");
    let syncs = run.handle.syncs();
    let list_calls = env.metrics.count(op::LIST_ROUTES);
    println!(
        "300 nodes created in {burst:?}: {} syncs after startup ({} list_routes calls in all, \
         {} create_route calls)",
        syncs.total() - 1,
        list_calls,
        env.metrics.count(op::CREATE_ROUTE)
    );
    let from_known = run.handle.syncs_from_known();
    assert!(
        from_known >= 1,
        "a burst of joins creates from the known listing"
    );
    assert_eq!(
        list_calls + from_known,
        syncs.total(),
        "one ListRoutes per sync but for those planned from the known listing"
    );
    assert_eq!(env.metrics.count(op::CREATE_ROUTE), 300, "no create twice");
    // Coalesced by the queue: syncs run back to back and each lasts at least a create round
    // trip, so changes arriving meanwhile share the next sync.
    let bound = 2 + (burst.as_millis() / CLOUD_LATENCY.as_millis()) as u64;
    assert!(
        syncs.total() - 1 <= bound,
        "{} syncs for a {burst:?} burst (bound {bound})",
        syncs.total() - 1
    );
    run.stop().await;
    env.kube.shutdown().await;
}

/// A node joining a quiet cluster: its route is created straight from the known listing, one
/// cloud round trip (CreateRoute) and no ListRoutes before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_creates_its_route_without_listing() {
    let env = Env::new(10).await;
    let nodes = [("a", "10.244.1.0/24"), ("b", "10.244.2.0/24")];
    for (n, c) in nodes {
        env.add_node(n, &[c]).await;
    }
    let run = start(&env, config(RouteMode::Watch));
    wait_converged(&env, &run, &nodes).await;
    let lists = env.metrics.count(op::LIST_ROUTES);
    let creates = env.metrics.count(op::CREATE_ROUTE);

    env.add_node("c", &["10.244.3.0/24"]).await;
    wait_converged(&env, &run, &[("c", "10.244.3.0/24")]).await;
    assert_eq!(env.metrics.count(op::CREATE_ROUTE) - creates, 1);
    assert_eq!(
        env.metrics.count(op::LIST_ROUTES) - lists,
        0,
        "no ListRoutes for a join"
    );
    assert_eq!(run.handle.syncs_from_known(), 1);
    let s = run.handle.syncs();
    assert_eq!(
        s.get(SyncTrigger::NodeChange, SyncOutcome::Changed),
        1,
        "{s:?}"
    );
    assert_eq!(env.routes().len(), 3);
    run.stop().await;
    env.kube.shutdown().await;
}

/// Nodes n01…n60 (pod CIDR 10.244.i.0/24 each), the controller started with `cfg`, and every
/// one routed.
async fn sixty_routed_nodes(env: &Env, cfg: RouteConfig) -> Running {
    let nodes: Vec<(String, String)> = (1..=60)
        .map(|i| (format!("n{i:02}"), format!("10.244.{i}.0/24")))
        .collect();
    for (n, c) in &nodes {
        env.add_node(n, &[c.as_str()]).await;
    }
    let run = start(env, cfg);
    let expected: Vec<(&str, &str)> = nodes
        .iter()
        .map(|(n, c)| (n.as_str(), c.as_str()))
        .collect();
    wait_converged(env, &run, &expected).await;
    run
}

/// A join into a cluster of 60 Nodes costs the planner one Node, not 61: the fast path plans
/// over the changed Node and the routes known to point at it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_is_planned_over_the_joining_node_only() {
    let env = Env::new(14).await;
    let run = sixty_routed_nodes(&env, config(RouteMode::Watch)).await;
    let planned = run.handle.nodes_planned();
    let lists = env.metrics.count(op::LIST_ROUTES);

    env.add_node("joiner", &["10.244.200.0/24"]).await;
    wait_converged(&env, &run, &[("joiner", "10.244.200.0/24")]).await;
    assert_eq!(env.metrics.count(op::LIST_ROUTES), lists, "no listing yet");
    assert_eq!(run.handle.nodes_planned() - planned, 1);
    assert_eq!(env.routes().len(), 61);
    assert!(run.handle.routed_nodes().is_some_and(|r| r.len() == 61));
    run.stop().await;
    env.kube.shutdown().await;
}

/// The listings that follow changes cost what changed too: the confirming listing after a
/// join plans over the joining Node again (and any Node whose routes it shows changed), and a
/// deleted Node's listing plans over no Node at all — 60 Nodes or 50,000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_after_changes_plan_over_what_changed() {
    let env = Env::new(15).await;
    let mut cfg = config(RouteMode::Watch);
    cfg.confirm_delay = Duration::from_millis(200);
    let run = sixty_routed_nodes(&env, cfg).await;
    let planned = run.handle.nodes_planned();
    let lists = env.metrics.count(op::LIST_ROUTES);

    // n07's route vanishes behind the controller's back; a Node joins.
    assert!(env.cloud.delete_route_out_of_band(CLUSTER, "10.244.7.0/24"));
    env.add_node("joiner", &["10.244.200.0/24"]).await;
    wait_converged(&env, &run, &[("joiner", "10.244.200.0/24")]).await;
    wait_for("the confirming listing", || async {
        env.metrics.count(op::LIST_ROUTES) > lists && run.handle.pending() == 0
    })
    .await;
    wait_converged(&env, &run, &[("n07", "10.244.7.0/24")]).await;
    assert_eq!(env.metrics.count(op::LIST_ROUTES), lists + 1);
    assert_eq!(
        run.handle.nodes_planned() - planned,
        3,
        "the joiner (fast path, then its confirmation) and n07 (whose route the listing showed gone)"
    );
    assert_eq!(env.routes().len(), 61);
    assert!(run.handle.routed_nodes().is_some_and(|r| r.len() == 61));

    let planned = run.handle.nodes_planned();
    env.nodes()
        .delete("n30", &DeleteParams::default())
        .await
        .expect("delete node");
    wait_for("the deleted Node's route deleted", || async {
        !env.has_route("n30", "10.244.30.0/24") && run.handle.pending() == 0
    })
    .await;
    assert_eq!(run.handle.nodes_planned(), planned, "no Node planned");
    assert_eq!(env.routes().len(), 60);
    assert!(
        run.handle
            .routed_nodes()
            .is_some_and(|r| r.len() == 60 && !r.contains("n30"))
    );
    run.stop().await;
    env.kube.shutdown().await;
}

/// While the cloud-node controller folds the condition of Nodes it initializes, uninitialized
/// Nodes routed by an earlier sync still lack it; that is no reason to list: a second joining
/// Node is created from the known listing too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_awaiting_the_fold_are_created_without_listing() {
    let env = Env::new(12).await;
    let run = start_with(&env, config(RouteMode::Watch), true);
    wait_for("startup sync", || async {
        run.syncs() == 1 && run.handle.pending() == 0
    })
    .await;
    let lists = env.metrics.count(op::LIST_ROUTES);
    for (i, name) in ["a", "b"].into_iter().enumerate() {
        let cidr = format!("10.244.{}.0/24", i + 1);
        env.cloud.add_instance(InstanceSpec::new(name));
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "podCIDRs": [cidr],
                "taints": [{"key": "node.cloudprovider.kubernetes.io/uninitialized",
                    "value": "true", "effect": "NoSchedule"}],
            },
        }))
        .expect("node");
        env.nodes()
            .create(&PostParams::default(), &node)
            .await
            .expect("create node");
        wait_for("route created", || async {
            env.has_route(name, &cidr) && run.handle.pending() == 0
        })
        .await;
    }
    assert_eq!(run.handle.syncs_from_known(), 2, "{:?}", run.handle.syncs());
    assert_eq!(env.metrics.count(op::LIST_ROUTES), lists, "no ListRoutes");
    // The condition of both is left to the cloud-node controller.
    assert_eq!(env.condition_writes(), 0);
    run.stop().await;
    env.kube.shutdown().await;
}

/// The known listing goes stale when someone else changes the route table. A fast-path create
/// the cloud refuses is confirmed by a listing in the same sync (no duplicate route, no Warning
/// Event), and the confirming listing after a fast sync repairs a route deleted behind the
/// controller's back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_known_listing_is_confirmed_by_listing() {
    let env = Env::new(11).await;
    let nodes = [("a", "10.244.1.0/24"), ("b", "10.244.2.0/24")];
    for (n, c) in nodes {
        env.add_node(n, &[c]).await;
    }
    let mut cfg = config(RouteMode::Watch);
    cfg.confirm_delay = Duration::from_millis(300);
    let run = start(&env, cfg);
    wait_converged(&env, &run, &nodes).await;

    // Someone else already created c's route: the create from the known listing is refused.
    env.cloud.add_instance(InstanceSpec::new("c"));
    env.cloud
        .with_actor("someone-else")
        .create_route(
            CLUSTER,
            "by-hand",
            &Route {
                target_node: "c".into(),
                destination_cidr: "10.244.3.0/24".into(),
                ..Route::default()
            },
        )
        .await
        .expect("route by hand");
    let lists = env.metrics.count(op::LIST_ROUTES);
    let creates = env.metrics.count(op::CREATE_ROUTE);
    env.create_node("c", &["10.244.3.0/24"]).await;
    wait_converged(&env, &run, &[("c", "10.244.3.0/24")]).await;
    assert_eq!(
        env.metrics.count(op::CREATE_ROUTE) - creates,
        1,
        "one refused create"
    );
    assert_eq!(
        env.metrics.count(op::LIST_ROUTES) - lists,
        1,
        "then one listing"
    );
    assert_eq!(env.routes().len(), 3, "no duplicate route");
    assert_eq!(run.handle.syncs_from_known(), 0);
    let s = run.handle.syncs();
    assert_eq!(s.by_outcome(SyncOutcome::Error), 0, "{s:?}");

    // b's route vanishes behind the controller's back; d joins from the known listing, and
    // the confirming listing shortly after re-creates b's route.
    let resyncs = s.get(SyncTrigger::Resync, SyncOutcome::Changed);
    assert!(env.cloud.delete_route_out_of_band(CLUSTER, "10.244.2.0/24"));
    env.add_node("d", &["10.244.4.0/24"]).await;
    wait_converged(&env, &run, &[("d", "10.244.4.0/24")]).await;
    assert_eq!(run.handle.syncs_from_known(), 1);
    wait_converged(&env, &run, &[("b", "10.244.2.0/24")]).await;
    let s = run.handle.syncs();
    assert_eq!(
        s.get(SyncTrigger::Resync, SyncOutcome::Changed),
        resyncs + 1,
        "the confirmation re-created b's route: {s:?}"
    );
    assert_eq!(env.routes().len(), 4);

    let events: Api<Event> = Api::namespaced(env.client.clone(), "default");
    let warnings = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(REASON_FAILED_TO_CREATE_ROUTE))
        .count();
    assert_eq!(warnings, 0, "a stale listing is not the node's failure");
    run.stop().await;
    env.kube.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttling_cloud_paces_syncs() {
    let env = Env::new(9).await;
    let mut cfg = config(RouteMode::Watch);
    cfg.min_sync_interval = Duration::from_millis(500);
    let run = start(&env, cfg);
    wait_for("startup sync", || async {
        run.syncs() == 1 && run.handle.pending() == 0
    })
    .await;
    // The first create is refused as throttled: from then on syncs are spaced.
    env.cloud
        .fail_next_with(
            op::CREATE_ROUTE,
            1,
            ccm_cloud::CloudError::Throttled {
                message: "RequestLimitExceeded".into(),
                retry_after: Some(Duration::from_millis(300)),
            },
        )
        .expect("known op");
    env.add_node("t-first", &[&cidr(99)]).await;
    wait_for("the throttled sync", || async {
        run.handle.syncs().by_outcome(SyncOutcome::Error) == 1
    })
    .await;
    // One node every ~15 ms, one at a time: a steady stream of node_change events.
    let started = Instant::now();
    for i in 0..40 {
        env.add_node(&format!("t-{i:02}"), &[&cidr(i)]).await;
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    let elapsed = started.elapsed();
    wait_for("41 routes", || async { env.routes().len() == 41 }).await;
    wait_for("idle", || async { run.handle.pending() == 0 }).await;
    let syncs = run.syncs() - 2;
    println!("40 nodes over {elapsed:?} while paced at 500ms: {syncs} syncs");
    // At most one sync start per 500 ms while paced, plus the one after the trickle.
    let bound = 2 + (elapsed.as_millis() / 500) as u64;
    assert!(
        syncs <= bound,
        "{syncs} syncs over {elapsed:?} (bound {bound})"
    );
    assert_eq!(
        env.metrics.count(op::LIST_ROUTES) + run.handle.syncs_from_known(),
        run.syncs()
    );
    run.stop().await;
    env.kube.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_creates_are_retried_without_node_events() {
    let env = Env::new(3).await;
    let run = start(&env, config(RouteMode::Watch));
    wait_for("startup sync", || async {
        run.syncs() == 1 && run.handle.pending() == 0
    })
    .await;
    // The first failure is the fast path's (planned from the known listing): the same sync
    // then lists and tries again, and fails again; the retry fails once more, then succeeds.
    env.cloud.fail_next(op::CREATE_ROUTE, 3).expect("known op");
    env.add_node("flaky", &["10.244.7.0/24"]).await;
    wait_converged(&env, &run, &[("flaky", "10.244.7.0/24")]).await;

    let s = run.handle.syncs();
    assert_eq!(
        s.get(SyncTrigger::NodeChange, SyncOutcome::Error),
        1,
        "{s:?}"
    );
    assert_eq!(s.get(SyncTrigger::Retry, SyncOutcome::Error), 1, "{s:?}");
    assert_eq!(s.get(SyncTrigger::Retry, SyncOutcome::Changed), 1, "{s:?}");
    assert_eq!(env.metrics.count(op::CREATE_ROUTE), 4);
    assert_eq!(
        run.handle.syncs_from_known(),
        0,
        "the fast path's failure listed"
    );
    // NoRouteCreated after the first failure, RouteCreated after the success: two writes (a
    // third only if the cache had not seen the first when the retry ran).
    let writes = env.condition_writes();
    assert!((2..=3).contains(&writes), "{writes} condition writes");
    assert!(run.handle.has_routes("flaky"));

    // The Warning event, with upstream's reason and message.
    let events: Api<Event> = Api::namespaced(env.client.clone(), "default");
    let failed_events = || async {
        events
            .list(&ListParams::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(REASON_FAILED_TO_CREATE_ROUTE))
            .collect::<Vec<_>>()
    };
    wait_for("FailedToCreateRoute event", || async {
        !failed_events().await.is_empty()
    })
    .await;
    let found = failed_events().await;
    let e = &found[0];
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(e.involved_object.name.as_deref(), Some("flaky"));
    let msg = e.message.clone().unwrap_or_default();
    assert!(
        msg.starts_with("Could not create route ")
            && msg.contains(" 10.244.7.0/24 for node flaky after "),
        "{msg}"
    );
    let text = run.metrics_text();
    assert!(
        text.contains(r#"route_controller_route_sync_total{trigger="retry",outcome="changed"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"route_controller_route_operations_total{op="create",result="error"} 3"#),
        "{text}"
    );
    run.stop().await;
    env.kube.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_band_delete_is_repaired_at_resync() {
    let env = Env::new(4).await;
    let nodes = [("a", "10.244.1.0/24"), ("b", "10.244.2.0/24")];
    for (n, c) in nodes {
        env.add_node(n, &[c]).await;
    }
    let mut cfg = config(RouteMode::Watch);
    cfg.resync_period = Duration::from_millis(500);
    let run = start(&env, cfg);
    wait_converged(&env, &run, &nodes).await;
    let before = run.handle.syncs();

    assert!(env.cloud.delete_route_out_of_band(CLUSTER, "10.244.2.0/24"));
    wait_for("route re-created", || async {
        env.has_route("b", "10.244.2.0/24")
    })
    .await;
    let after = run.handle.syncs();
    assert_eq!(
        after.by_trigger(SyncTrigger::NodeChange),
        before.by_trigger(SyncTrigger::NodeChange),
        "repaired without any node event"
    );
    assert!(
        after.get(SyncTrigger::Resync, SyncOutcome::Changed)
            > before.get(SyncTrigger::Resync, SyncOutcome::Changed)
    );
    // The node's condition never flipped: it was written once, at startup.
    assert!(env.routed("b").await);
    assert_eq!(env.condition_writes(), 2);
    run.stop().await;
    env.kube.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_node_loses_its_routes_foreign_routes_untouched() {
    let env = Env::new(5).await;
    let nodes = [("a", "10.244.1.0/24"), ("b", "10.244.2.0/24")];
    for (n, c) in nodes {
        env.add_node(n, &[c]).await;
    }
    // Someone else's routes in the same table: outside the cluster CIDR, one even pointing at
    // a node of ours, one covering the whole cluster CIDR (neither end inside it).
    let someone_else = env.cloud.with_actor("someone-else");
    for cidr in ["192.168.0.0/24", "10.240.0.0/13"] {
        someone_else
            .create_route(
                CLUSTER,
                "foreign",
                &Route {
                    target_node: "a".into(),
                    destination_cidr: cidr.into(),
                    ..Route::default()
                },
            )
            .await
            .expect("foreign route");
    }
    let run = start(&env, config(RouteMode::Watch));
    wait_converged(&env, &run, &nodes).await;

    env.nodes()
        .delete("b", &DeleteParams::default())
        .await
        .expect("delete node");
    wait_for("b's route deleted", || async {
        !env.has_route("b", "10.244.2.0/24")
    })
    .await;
    wait_for("idle", || async { run.handle.pending() == 0 }).await;
    let left: Vec<String> = env
        .routes()
        .iter()
        .map(|r| r.destination_cidr.clone())
        .collect();
    assert_eq!(left, ["10.240.0.0/13", "10.244.1.0/24", "192.168.0.0/24"]);
    assert_eq!(
        env.metrics.count(op::DELETE_ROUTE),
        1,
        "only b's route deleted"
    );
    let text = run.metrics_text();
    assert!(text.contains("route_controller_managed_routes 1"), "{text}");
    run.stop().await;
    env.kube.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_unavailable_written_once_per_node() {
    let env = Env::new(6).await;
    let nodes = [
        ("a", "10.244.1.0/24"),
        ("b", "10.244.2.0/24"),
        ("c", "10.244.3.0/24"),
    ];
    for (n, c) in nodes {
        env.add_node(n, &[c]).await;
    }
    // Interval mode: a full reconcile every period, the worst case for needless writes.
    // 500 ms: the cache sees the first writes long before the second sync reads it.
    let mut cfg = config(RouteMode::Interval);
    cfg.reconciliation_period = Duration::from_millis(500);
    let run = start(&env, cfg);
    wait_converged(&env, &run, &nodes).await;
    let target = run.syncs() + 5;
    wait_for("five more syncs", || async { run.syncs() >= target }).await;
    assert_eq!(env.condition_writes(), 3, "one condition write per node");
    let s = run.handle.syncs();
    assert_eq!(s.by_trigger(SyncTrigger::Periodic), s.total());
    assert!(s.get(SyncTrigger::Periodic, SyncOutcome::Noop) >= 5);
    run.stop().await;
    env.kube.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack_node_gets_a_route_per_family() {
    let env = Env::new(7).await;
    env.add_node("ds", &["10.244.9.0/24", "fd00:10:0:9::/64"])
        .await;
    let mut cfg = config(RouteMode::Watch);
    cfg.cluster_cidrs = parse_cluster_cidrs("10.244.0.0/16,fd00:10::/56").expect("pair");
    let run = start(&env, cfg);
    wait_converged(
        &env,
        &run,
        &[("ds", "10.244.9.0/24"), ("ds", "fd00:10:0:9::/64")],
    )
    .await;
    assert_eq!(env.routes().len(), 2);
    run.stop().await;
    env.kube.shutdown().await;
}

/// A provider with no route support.
struct NoRoutes;

#[async_trait]
impl CloudProvider for NoRoutes {
    fn provider_name(&self) -> &str {
        "none"
    }
}

#[tokio::test]
async fn start_conditions() {
    let env = Env::new(8).await;
    let new = |provider: Arc<dyn CloudProvider>, cfg: RouteConfig| {
        RouteController::new(
            Shared::new(provider, CLUSTER),
            env.client.clone(),
            cfg,
            &mut Registry::default(),
        )
        .err()
    };
    let mut off = config(RouteMode::Watch);
    off.configure_cloud_routes = false;
    off.cluster_cidrs.clear();
    assert!(matches!(
        new(env.provider.clone(), off),
        Some(StartError::Skipped(_))
    ));
    let mut no_cidr = config(RouteMode::Watch);
    no_cidr.cluster_cidrs.clear();
    assert!(matches!(
        new(Arc::new(NoRoutes), no_cidr.clone()),
        Some(StartError::Skipped(_))
    ));
    match new(env.provider.clone(), no_cidr) {
        Some(StartError::Invalid(msg)) => assert!(msg.starts_with("--cluster-cidr:"), "{msg}"),
        other => panic!("expected Invalid, got {other:?}"),
    }
    let mut same_family = config(RouteMode::Watch);
    same_family.cluster_cidrs = vec![
        "10.0.0.0/16".parse().expect("cidr"),
        "10.1.0.0/16".parse().expect("cidr"),
    ];
    assert!(matches!(
        new(env.provider.clone(), same_family),
        Some(StartError::Invalid(_))
    ));
    env.kube.shutdown().await;
}
