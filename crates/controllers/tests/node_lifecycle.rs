//! cloud-node-lifecycle controller against kube-sim and the simulated cloud, polling and
//! event-driven.

mod node_support;

use std::time::Duration;

use ccm_cloud::op;
use ccm_controllers::node_lifecycle::{
    NodeLifecycleConfig, NodeLifecycleController, NodeLifecycleHandle,
};
use ccm_provider_sim::{InstanceSpec, SimOptions};
use node_support::*;
use prometheus_client::registry::Registry;

fn start(env: &Env, config: NodeLifecycleConfig) -> NodeLifecycleHandle {
    let mut registry = Registry::default();
    let c = NodeLifecycleController::new(
        env.shared.clone(),
        env.client.clone(),
        config,
        &mut registry,
    )
    .expect("controller");
    let h = c.handle();
    tokio::spawn(c.run(env.shutdown.clone()));
    h
}

fn fast() -> NodeLifecycleConfig {
    NodeLifecycleConfig {
        node_monitor_period: Duration::from_millis(50),
        ..Default::default()
    }
}

/// An instance and its initialized Node; returns the instance id.
async fn node_with_instance(env: &Env, name: &str, ready: &str) -> String {
    let id = env.cloud.add_instance(InstanceSpec::new(name));
    env.create_node(&initialized_node(name, &format!("sim://{id}"), ready))
        .await;
    id
}

async fn has_shutdown_taint(env: &Env, name: &str) -> bool {
    env.get(name)
        .await
        .is_some_and(|n| taint_keys(&n).iter().any(|k| k == TAINT_SHUTDOWN))
}

async fn wait_rounds(h: &NodeLifecycleHandle, n: u64) {
    let target = h.rounds() + n;
    wait_for("monitor rounds", || async { h.rounds() >= target }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_nodes_never_cost_a_cloud_call() {
    let env = Env::start(SimOptions::default(), false).await;
    for i in 0..20 {
        node_with_instance(&env, &format!("ready-{i}"), "True").await;
    }
    let h = start(&env, fast());
    wait_for("cache", || async { env.shared.nodes.len() == 20 }).await;
    wait_rounds(&h, 10).await;
    assert_eq!(env.metrics.total(), 0, "{:?}", env.metrics.snapshot());
    assert_eq!(env.node_writes(), 0);
    env.shutdown.cancel();
}

/// A round looks at the Nodes that are NotReady or still carry the shutdown taint, never at
/// the healthy rest: the cluster's size costs nothing per round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_looks_only_at_nodes_that_are_not_ready() {
    let env = Env::start(SimOptions::default(), false).await;
    for i in 0..40 {
        node_with_instance(&env, &format!("ready-{i}"), "True").await;
    }
    node_with_instance(&env, "sick", "False").await;
    let h = start(&env, fast());
    wait_for("cache", || async { env.shared.nodes.len() == 41 }).await;
    wait_rounds(&h, 5).await;
    let (rounds, examined) = (h.rounds(), h.nodes_examined());
    // (A round counts its Nodes when it starts and itself when it ends: one round of slack.)
    assert!(
        examined <= rounds + 1,
        "{examined} Nodes examined in {rounds} rounds: only the NotReady one should be"
    );

    // A Node turning NotReady joins the rounds; turning Ready again, it leaves them.
    env.set_ready("ready-7", "False").await;
    wait_for("two examined per round", || async {
        let (r, e) = (h.rounds(), h.nodes_examined());
        wait_rounds(&h, 4).await;
        h.nodes_examined() - e >= 2 * (h.rounds() - r) - 2
    })
    .await;
    env.set_ready("ready-7", "True").await;
    env.set_ready("sick", "True").await;
    wait_for("none examined", || async {
        let e = h.nodes_examined();
        wait_rounds(&h, 3).await;
        h.nodes_examined() == e
    })
    .await;
    env.shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_deletes_gone_nodes_taints_stopped_ones_and_untaints_ready_ones() {
    let env = Env::start(SimOptions::default(), false).await;
    let gone = node_with_instance(&env, "gone", "False").await;
    let stopped = node_with_instance(&env, "stopped", "Unknown").await;
    node_with_instance(&env, "fine", "False").await;
    node_with_instance(&env, "ready", "True").await;
    env.cloud.terminate_instance(&gone).unwrap();
    env.cloud.stop_instance(&stopped).unwrap();
    let h = start(&env, fast());

    wait_for("gone deleted", || async { env.get("gone").await.is_none() }).await;
    wait_for("stopped tainted", || async {
        has_shutdown_taint(&env, "stopped").await
    })
    .await;
    let ev = env.events("DeletingNode").await;
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].type_.as_deref(), Some("Normal"));
    assert_eq!(
        ev[0].message.as_deref(),
        Some("Deleting node gone because it does not exist in the cloud provider")
    );
    assert!(env.get("fine").await.is_some());
    assert!(!has_shutdown_taint(&env, "fine").await);
    assert!(
        env.get("stopped").await.is_some(),
        "a shut-down node is not deleted"
    );

    // Batched: one instances_status call per round for all NotReady nodes, never per node.
    wait_rounds(&h, 5).await;
    let rounds = h.rounds();
    let calls = env.metrics.count(op::INSTANCES_STATUS);
    assert!(calls <= rounds + 1, "{calls} calls in {rounds} rounds");
    assert_eq!(env.metrics.count(op::INSTANCE_EXISTS), 0);
    assert_eq!(env.metrics.count(op::INSTANCE_SHUTDOWN), 0);

    // Started again and Ready: the taint goes, from the cache alone.
    env.cloud.start_instance(&stopped).unwrap();
    env.set_ready("stopped", "True").await;
    wait_for("taint removed", || async {
        !has_shutdown_taint(&env, "stopped").await
    })
    .await;
    env.shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_events_act_at_once_and_only_on_not_ready_nodes() {
    let env = Env::start(SimOptions::default(), true).await;
    let doomed = node_with_instance(&env, "doomed", "True").await;
    let sleepy = node_with_instance(&env, "sleepy", "False").await;
    node_with_instance(&env, "steady", "True").await;
    let h = start(
        &env,
        NodeLifecycleConfig {
            node_monitor_period: Duration::from_millis(50),
            // Polling the cloud only hourly: anything that happens below is event-driven.
            event_driven_resync_period: Duration::from_secs(3600),
            ..Default::default()
        },
    );
    wait_for("cache", || async { env.shared.nodes.len() == 3 }).await;
    wait_rounds(&h, 2).await;
    let initial = env.metrics.count(op::INSTANCES_STATUS);
    assert_eq!(initial, 1, "one startup check of the NotReady node");

    // Stopped while NotReady: tainted at once by one single-node check.
    env.cloud.stop_instance(&sleepy).unwrap();
    wait_for("sleepy tainted", || async {
        has_shutdown_taint(&env, "sleepy").await
    })
    .await;
    assert_eq!(env.metrics.count(op::INSTANCES_STATUS), initial + 1);

    // Terminated while Ready: nothing happens yet, however many rounds pass.
    env.cloud.terminate_instance(&doomed).unwrap();
    wait_for("event remembered", || async { h.pending() >= 1 }).await;
    wait_rounds(&h, 5).await;
    assert!(
        env.get("doomed").await.is_some(),
        "a Ready node is never deleted"
    );
    assert_eq!(env.metrics.count(op::INSTANCES_STATUS), initial + 1);

    // ... and deleted as soon as it turns NotReady.
    env.set_ready("doomed", "False").await;
    wait_for("doomed deleted", || async {
        env.get("doomed").await.is_none()
    })
    .await;
    assert_eq!(env.metrics.count(op::INSTANCES_STATUS), initial + 2);
    assert!(env.get("steady").await.is_some());

    // Started and Ready again: the shutdown taint goes.
    env.cloud.start_instance(&sleepy).unwrap();
    env.set_ready("sleepy", "True").await;
    wait_for("sleepy untainted", || async {
        !has_shutdown_taint(&env, "sleepy").await
    })
    .await;
    wait_for("idle", || async { h.pending() == 0 }).await;
    assert_eq!(env.metrics.count(op::INSTANCES_STATUS), initial + 2);
    env.shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloud_errors_skip_the_round_and_never_delete() {
    let env = Env::start(SimOptions::default(), false).await;
    let id = node_with_instance(&env, "flaky", "False").await;
    env.cloud.terminate_instance(&id).unwrap();
    env.cloud.set_error_rate(op::INSTANCES_STATUS, 1.0).unwrap();
    let h = start(&env, fast());
    wait_rounds(&h, 5).await;
    assert!(env.get("flaky").await.is_some(), "errors must not delete");
    env.cloud.clear_faults();
    wait_for("deleted once the cloud answers", || async {
        env.get("flaky").await.is_none()
    })
    .await;
    env.shutdown.cancel();
}

/// With instance events the full cloud check runs only every resync period (here an hour), but
/// a Node whose check failed is asked about again every monitor period: a Node whose instance
/// was terminated during a cloud outage is deleted once the cloud answers, not an hour later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_check_is_retried_every_round_when_events_make_full_checks_rare() {
    let env = Env::start(SimOptions::default(), true).await;
    let doomed = node_with_instance(&env, "doomed", "False").await;
    node_with_instance(&env, "steady", "True").await;
    env.cloud.set_error_rate(op::INSTANCES_STATUS, 1.0).unwrap();
    let h = start(
        &env,
        NodeLifecycleConfig {
            node_monitor_period: Duration::from_millis(50),
            event_driven_resync_period: Duration::from_secs(3600),
            ..Default::default()
        },
    );
    wait_for("cache", || async { env.shared.nodes.len() == 2 }).await;
    env.cloud.terminate_instance(&doomed).unwrap();
    wait_rounds(&h, 5).await;
    assert!(env.get("doomed").await.is_some(), "errors must not delete");
    let failed = env.metrics.count(op::INSTANCES_STATUS);
    assert!(
        failed >= 3,
        "the unanswered Node is asked about each round: {failed}"
    );

    env.cloud.clear_faults();
    wait_for("deleted once the cloud answers", || async {
        env.get("doomed").await.is_none()
    })
    .await;
    assert!(env.get("steady").await.is_some());
    let after = env.metrics.count(op::INSTANCES_STATUS);
    wait_rounds(&h, 5).await;
    assert_eq!(
        env.metrics.count(op::INSTANCES_STATUS),
        after,
        "answered: no more checks until the resync"
    );
    env.shutdown.cancel();
}
