//! cloud-node and route together: `NetworkUnavailable=False` rides along in the status write
//! the cloud-node controller makes anyway, so a new Node costs 2 writes, not 3.

mod node_support;

use std::time::Duration;

use ccm_controllers::node::{CloudNodeConfig, CloudNodeController};
use ccm_controllers::nodeutil::{
    ConditionStatus, TAINT_UNINITIALIZED, condition_status, has_taint,
};
use ccm_controllers::route::{RouteConfig, RouteController};
use ccm_provider_sim::{InstanceSpec, SimOptions};
use kube::api::ListParams;
use node_support::{Env, kubelet_node, ready_condition};
use prometheus_client::registry::Registry;

const NODES: usize = 60;

async fn converge(env: &Env) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while tokio::time::Instant::now() < deadline {
        let nodes = env
            .nodes()
            .list(&ListParams::default())
            .await
            .expect("list")
            .items;
        let done = nodes.len() == NODES
            && nodes.iter().all(|n| {
                !has_taint(n, TAINT_UNINITIALIZED)
                    && condition_status(n, "NetworkUnavailable") == ConditionStatus::False
            });
        if done && env.cloud.routes().len() == NODES {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_unavailable_is_folded_into_the_status_write() {
    let env = Env::start(SimOptions::default(), true).await;
    let mut registry = Registry::default();
    let node = CloudNodeController::new(
        env.shared.clone(),
        env.client.clone(),
        CloudNodeConfig::default(),
        &mut registry,
    )
    .expect("node controller");
    let route = RouteController::new(
        env.shared.clone(),
        env.client.clone(),
        RouteConfig {
            cluster_cidrs: vec!["10.128.0.0/9".parse().expect("cidr")],
            min_sync_interval: Duration::from_millis(200),
            ..Default::default()
        },
        &mut registry,
    )
    .expect("route controller");
    tokio::spawn(node.run(env.shutdown.clone()));
    tokio::spawn(route.run(env.shutdown.clone()));

    for i in 0..NODES {
        let name = format!("n{i}");
        env.cloud.add_instance(InstanceSpec::new(name.clone()));
        let mut n = kubelet_node(&name, None);
        if let Some(spec) = n.spec.as_mut() {
            spec.pod_cidrs = Some(vec![format!("10.128.{i}.0/24")]);
        }
        if let Some(status) = n.status.as_mut() {
            status.conditions = Some(vec![
                serde_json::from_value(ready_condition("True")).expect("condition"),
            ]);
        }
        env.create_node(&n).await;
    }
    assert!(converge(&env).await, "nodes did not converge");
    // Let any trailing write land before counting.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let nodes = env
        .nodes()
        .list(&ListParams::default())
        .await
        .expect("list")
        .items;
    for n in &nodes {
        let cond = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "NetworkUnavailable"))
            .expect("condition");
        assert_eq!(cond.reason.as_deref(), Some("RouteCreated"));
        assert_eq!(
            cond.message.as_deref(),
            Some("RouteController created a route")
        );
        // The kubelet's Ready condition survived the fold.
        assert!(
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready"))
        );
    }
    let writes = env.node_writes();
    println!("node writes for {NODES} nodes: {writes}");
    // Two per node (status, object); a few 409 retries are tolerated, a third write per node
    // is not.
    assert!(
        writes <= 2 * NODES as u64 + NODES as u64 / 10,
        "{writes} node writes for {NODES} nodes"
    );
    env.shutdown.cancel();
}

fn tainted(n: &k8s_openapi::api::core::v1::Node) -> bool {
    has_taint(n, TAINT_UNINITIALIZED)
}

/// No latency floors: a Node waits for its own route only, and no route waits for a timer
/// while the cloud answers normally. Both bounds are set to an hour, so any wait on another
/// Node's route or on the storm limiter would time the test out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_waits_for_its_own_route_only_and_never_for_the_limiter() {
    use ccm_cloud::{Route, Routes};
    use node_support::wait_for;

    let env = Env::start(SimOptions::default(), true).await;
    let hour = Duration::from_secs(3600);
    // A route outside the cluster CIDR owned by someone else: "stuck" asks for the same
    // destination, which the cloud refuses, so "stuck" is never routed.
    env.cloud.add_instance(InstanceSpec::new("outsider"));
    env.cloud
        .create_route(
            "kubernetes",
            "outsider",
            &Route {
                target_node: "outsider".into(),
                destination_cidr: "192.168.7.0/24".into(),
                ..Route::default()
            },
        )
        .await
        .expect("pre-existing route");
    // Both Nodes exist before the controllers start, so they share one batch.
    for (name, cidr) in [("stuck", "192.168.7.0/24"), ("fine", "10.128.1.0/24")] {
        env.cloud.add_instance(InstanceSpec::new(name));
        let mut n = kubelet_node(name, None);
        if let Some(spec) = n.spec.as_mut() {
            spec.pod_cidrs = Some(vec![cidr.to_string()]);
        }
        env.create_node(&n).await;
    }
    let mut registry = Registry::default();
    let node = CloudNodeController::new(
        env.shared.clone(),
        env.client.clone(),
        CloudNodeConfig {
            route_condition_wait: hour,
            batch_window: Duration::from_millis(200),
            ..Default::default()
        },
        &mut registry,
    )
    .expect("node controller");
    let route = RouteController::new(
        env.shared.clone(),
        env.client.clone(),
        RouteConfig {
            cluster_cidrs: vec!["10.128.0.0/9".parse().expect("cidr")],
            min_sync_interval: hour,
            ..Default::default()
        },
        &mut registry,
    )
    .expect("route controller");
    tokio::spawn(node.run(env.shutdown.clone()));
    tokio::spawn(route.run(env.shutdown.clone()));

    let routed_and_initialized = |name: &'static str| {
        let env = &env;
        move || async move {
            env.get(name).await.is_some_and(|n| {
                !tainted(&n) && condition_status(&n, "NetworkUnavailable") == ConditionStatus::False
            })
        }
    };
    wait_for(
        "fine initialized with its route",
        routed_and_initialized("fine"),
    )
    .await;
    let stuck = env.get("stuck").await.expect("stuck");
    assert!(
        tainted(&stuck),
        "stuck has no route and waits (bounded) for it"
    );
    assert_eq!(
        env.sim.count_requests(|k| k.client == node_support::UA
            && k.resource == "nodes"
            && k.verb.is_write()
            && (200..300).contains(&k.code)),
        2,
        "fine: one status write carrying the condition, one object write"
    );

    // A Node joining now is routed at once: the sync before it is under the limiter's hour,
    // but the cloud never throttled, so nothing waits.
    env.cloud.add_instance(InstanceSpec::new("late"));
    let mut late = kubelet_node("late", None);
    if let Some(spec) = late.spec.as_mut() {
        spec.pod_cidrs = Some(vec!["10.128.2.0/24".to_string()]);
    }
    env.create_node(&late).await;
    wait_for(
        "late initialized with its route",
        routed_and_initialized("late"),
    )
    .await;
    assert_eq!(env.cloud.routes().len(), 3, "outsider, fine, late");
    env.shutdown.cancel();
}

/// The kubelet's status write usually lands while a new Node's batch waits for the cloud: the
/// cloud-node controller writes on top of it (the freshest cached copy), not on the batch's
/// older resourceVersion, so it costs no 409, no GET and no second PATCH.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_write_during_the_cloud_lookup_costs_no_conflict() {
    use ccm_provider_sim::Latency;
    use node_support::wait_for;

    let env = Env::start(SimOptions::default(), true).await;
    // Long enough that the kubelet's writes below reach the controller's cache while every
    // lookup is still in flight, however loaded the machine is (checked before the asserts).
    env.cloud
        .set_latency("*", Latency::from_millis(2_000, 0))
        .expect("latency");
    let mut registry = Registry::default();
    let node = CloudNodeController::new(
        env.shared.clone(),
        env.client.clone(),
        CloudNodeConfig::default(),
        &mut registry,
    )
    .expect("node controller");
    tokio::spawn(node.run(env.shutdown.clone()));

    const N: usize = 5;
    for i in 0..N {
        let name = format!("k{i}");
        env.cloud.add_instance(InstanceSpec::new(name.clone()));
        // Registered without status, then the kubelet's status write while the lookup runs.
        let mut n = kubelet_node(&name, None);
        n.status = None;
        env.create_node(&n).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    for i in 0..N {
        env.set_ready(&format!("k{i}"), "True").await;
    }
    wait_for("the kubelets' writes in the controller's cache", || async {
        (0..N).all(|i| {
            env.shared
                .nodes
                .get(&format!("k{i}"))
                .is_some_and(|n| condition_status(&n, "Ready") == ConditionStatus::True)
        })
    })
    .await;
    let nodes = env
        .nodes()
        .list(&ListParams::default())
        .await
        .expect("list");
    assert!(
        nodes.items.iter().all(tainted),
        "precondition: the cloud lookups (2 s) were still running when the kubelets wrote"
    );
    wait_for("all initialized", || async {
        let nodes = env
            .nodes()
            .list(&ListParams::default())
            .await
            .expect("list")
            .items;
        nodes.len() == N && nodes.iter().all(|n| !tainted(n))
    })
    .await;
    let by_ccm = |pred: fn(&ccm_kube_sim::RequestKey) -> bool| {
        env.sim
            .count_requests(|k| k.client == node_support::UA && k.resource == "nodes" && pred(k))
    };
    assert_eq!(by_ccm(|k| k.code == 409), 0, "no conflicts");
    assert_eq!(
        by_ccm(|k| k.verb == ccm_kube_sim::Verb::Get),
        0,
        "no re-reads"
    );
    assert_eq!(by_ccm(|k| k.verb.is_write()), 2 * N as u64);
    for i in 0..N {
        let n = env.get(&format!("k{i}")).await.expect("node");
        assert_eq!(
            condition_status(&n, "Ready"),
            ConditionStatus::True,
            "the kubelet's write survived"
        );
    }
    env.shutdown.cancel();
}

/// The fold holds whatever order the controllers' tasks first run in: here the route
/// controller's whole first sync runs before the cloud-node controller's task is ever polled
/// (as a loaded machine can schedule it), and still leaves the uninitialized Node's condition
/// to the cloud-node controller's status write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fold_holds_when_routes_sync_before_the_node_controller_first_runs() {
    use node_support::wait_for;

    let env = Env::start(SimOptions::default(), true).await;
    env.cloud.add_instance(InstanceSpec::new("early"));
    let mut n = kubelet_node("early", None);
    if let Some(spec) = n.spec.as_mut() {
        spec.pod_cidrs = Some(vec!["10.128.3.0/24".to_string()]);
    }
    env.create_node(&n).await;
    let mut registry = Registry::default();
    let node = CloudNodeController::new(
        env.shared.clone(),
        env.client.clone(),
        CloudNodeConfig::default(),
        &mut registry,
    )
    .expect("node controller");
    let route = RouteController::new(
        env.shared.clone(),
        env.client.clone(),
        RouteConfig {
            cluster_cidrs: vec!["10.128.0.0/9".parse().expect("cidr")],
            ..Default::default()
        },
        &mut registry,
    )
    .expect("route controller");
    let routes = route.handle();
    tokio::spawn(route.run(env.shutdown.clone()));
    wait_for("the route controller's first sync", || {
        let routes = routes.clone();
        async move { routes.has_routes("early") && routes.pending() == 0 }
    })
    .await;
    assert_eq!(
        env.node_writes(),
        0,
        "the route controller left the uninitialized Node's condition to the fold"
    );

    tokio::spawn(node.run(env.shutdown.clone()));
    wait_for("early initialized with its route", || {
        let env = &env;
        async move {
            env.get("early").await.is_some_and(|n| {
                !tainted(&n) && condition_status(&n, "NetworkUnavailable") == ConditionStatus::False
            })
        }
    })
    .await;
    assert_eq!(
        env.node_writes(),
        2,
        "one status write carrying the condition, one object write"
    );
    env.shutdown.cancel();
}
