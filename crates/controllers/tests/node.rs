//! cloud-node controller against kube-sim and the simulated cloud.

mod node_support;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use ccm_cloud::op;
use ccm_controllers::node::{CloudNodeConfig, CloudNodeController, CloudNodeHandle};
use ccm_provider_sim::{InstanceSpec, SimOptions, Throttle};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher;
use node_support::*;
use parking_lot::Mutex;
use prometheus_client::registry::Registry;

fn start(env: &Env, config: CloudNodeConfig) -> CloudNodeHandle {
    let mut registry = Registry::default();
    let c = CloudNodeController::new(
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

fn tainted(n: &Node) -> bool {
    taint_keys(n).iter().any(|k| k == TAINT_UNINIT)
}

async fn untainted_count(env: &Env) -> usize {
    env.nodes()
        .list(&Default::default())
        .await
        .map(|l| l.items.iter().filter(|n| !tainted(n)).count())
        .unwrap_or(0)
}

fn spec(name: &str) -> InstanceSpec {
    InstanceSpec {
        labels: BTreeMap::from([
            ("example.com/pool".to_string(), "blue".to_string()),
            ("node.kubernetes.io/sneaky".to_string(), "x".to_string()),
            ("kubernetes.io/hostname".to_string(), "other".to_string()),
        ]),
        ..InstanceSpec::new(name)
    }
}

/// Records, from a watch, every state of every Node in which the taint was gone but the cloud's
/// InternalIP was not yet in status.addresses.
fn watch_for_early_untaint(env: &Env) -> Arc<Mutex<Vec<String>>> {
    let violations = Arc::new(Mutex::new(Vec::new()));
    let v = violations.clone();
    let stream = watcher::watcher(env.nodes(), watcher::Config::default());
    let stop = env.shutdown.clone();
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        loop {
            let ev = tokio::select! {
                _ = stop.cancelled() => return,
                ev = stream.next() => ev,
            };
            let Some(ev) = ev else { return };
            if let Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) = ev
                && !tainted(&n)
                && !addresses(&n).iter().any(|(t, _)| t == "InternalIP")
            {
                v.lock().push(n.metadata.name.clone().unwrap_or_default());
            }
        }
    });
    violations
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_of_500_nodes_is_batched_and_written_at_most_twice_each() {
    const N: usize = 500;
    const BATCH: usize = 100;
    let env = Env::start(
        SimOptions {
            max_batch_size: BATCH,
            seed: Some(1),
            ..Default::default()
        },
        true,
    )
    .await;
    let violations = watch_for_early_untaint(&env);
    let mut ids = BTreeMap::new();
    for i in 0..N {
        let name = format!("node-{i:03}");
        ids.insert(name.clone(), env.cloud.add_instance(spec(&name)));
    }
    // The burst: every Node registers before the controller sees any of them.
    let creates = futures::stream::iter(0..N)
        .map(|i| {
            let env = &env;
            async move {
                env.create_node(&kubelet_node(&format!("node-{i:03}"), None))
                    .await;
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>();
    creates.await;
    env.sim.reset_requests();

    let h = start(&env, CloudNodeConfig::default());
    wait_for("all nodes initialized", || async {
        untainted_count(&env).await == N
    })
    .await;
    wait_for("controller idle", || async { h.pending() == 0 }).await;

    let by_name: BTreeMap<String, _> = env
        .cloud
        .instances()
        .into_iter()
        .map(|i| (i.name.clone(), i))
        .collect();
    for n in env.nodes().list(&Default::default()).await.unwrap().items {
        let name = n.metadata.name.clone().unwrap();
        let inst = &by_name[&name];
        assert_eq!(
            n.spec.as_ref().unwrap().provider_id.as_deref(),
            Some(format!("sim://{}", ids[&name]).as_str())
        );
        assert_eq!(taint_keys(&n), Vec::<String>::new(), "{name}");
        let labels = n.metadata.labels.clone().unwrap();
        let expect: BTreeMap<String, String> = [
            ("kubernetes.io/hostname", name.as_str()),
            (
                "node.kubernetes.io/instance-type",
                inst.instance_type.as_str(),
            ),
            (
                "beta.kubernetes.io/instance-type",
                inst.instance_type.as_str(),
            ),
            ("topology.kubernetes.io/zone", inst.zone.as_str()),
            ("failure-domain.beta.kubernetes.io/zone", inst.zone.as_str()),
            ("topology.kubernetes.io/region", inst.region.as_str()),
            (
                "failure-domain.beta.kubernetes.io/region",
                inst.region.as_str(),
            ),
            ("example.com/pool", "blue"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(labels, expect, "{name}");
        let want: Vec<(String, String)> = inst
            .addresses
            .iter()
            .map(|a| (a.type_.clone(), a.address.clone()))
            .collect();
        assert_eq!(addresses(&n), want, "{name}");
    }

    let writes = env.node_writes();
    let calls = env.metrics.count(op::INSTANCES_METADATA);
    let per_node = env.metrics.count(op::INSTANCE_METADATA);
    eprintln!(
        "BURST {N} nodes, batch {BATCH}: cloud calls instances_metadata={calls} instance_metadata={per_node} total={}; \
         node API writes={writes} ({:.2}/node); cloud calls by op: {:?}",
        env.metrics.total(),
        writes as f64 / N as f64,
        env.metrics.snapshot()
    );
    assert!(writes <= 2 * N as u64, "writes {writes}");
    assert_eq!(per_node, 0);
    assert!(
        calls <= N.div_ceil(BATCH) as u64 + 2,
        "cloud calls {calls} > ceil({N}/{BATCH}) + 2"
    );
    assert_eq!(env.metrics.total(), calls);
    let v = violations.lock().clone();
    assert!(
        v.is_empty(),
        "nodes untainted before their addresses: {v:?}"
    );
    wait_for("a Synced event per node", || async {
        env.events("Synced").await.len() == N
    })
    .await;
    env.shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provided_node_ip_single_dual_stack_and_mismatch() {
    let env = Env::start(SimOptions::default(), true).await;
    let v4: IpAddr = "10.1.0.5".parse().unwrap();
    let v6: IpAddr = "2001:db8::5".parse().unwrap();
    for name in ["single", "dual", "nomatch", "plain-dual"] {
        env.cloud.add_instance(InstanceSpec {
            internal_ip: Some(if name == "single" {
                "10.1.0.9".parse().unwrap()
            } else {
                v4
            }),
            external_ip: Some(v6),
            ..InstanceSpec::new(name)
        });
    }
    env.create_node(&kubelet_node("single", Some("10.1.0.9")))
        .await;
    env.create_node(&kubelet_node("dual", Some("2001:db8::5,10.1.0.5")))
        .await;
    env.create_node(&kubelet_node("nomatch", Some("10.9.9.9")))
        .await;
    env.create_node(&kubelet_node("plain-dual", None)).await;
    let h = start(&env, CloudNodeConfig::default());

    let s = |t: &str, a: &str| (t.to_string(), a.to_string());
    wait_for("single and dual initialized", || async {
        let mut ok = true;
        for n in ["single", "dual", "plain-dual"] {
            ok &= env.get(n).await.is_some_and(|n| !tainted(&n));
        }
        ok
    })
    .await;
    assert_eq!(
        addresses(&env.get("single").await.unwrap()),
        vec![
            s("InternalIP", "10.1.0.9"),
            s("ExternalIP", "2001:db8::5"),
            s("Hostname", "single")
        ]
    );
    // The annotation's order wins for the matched addresses; other types follow.
    assert_eq!(
        addresses(&env.get("dual").await.unwrap()),
        vec![
            s("ExternalIP", "2001:db8::5"),
            s("InternalIP", "10.1.0.5"),
            s("Hostname", "dual")
        ]
    );
    // Dual-stack cloud addresses without an annotation pass through unchanged.
    assert_eq!(
        addresses(&env.get("plain-dual").await.unwrap()),
        vec![
            s("InternalIP", "10.1.0.5"),
            s("ExternalIP", "2001:db8::5"),
            s("Hostname", "plain-dual")
        ]
    );

    wait_for("mismatch warning", || async {
        !env.events("ProvidedNodeIPNotValid").await.is_empty() && h.failures("nomatch") >= 2
    })
    .await;
    let n = env.get("nomatch").await.unwrap();
    assert!(tainted(&n), "mismatched node must stay tainted");
    assert_eq!(addresses(&n), vec![s("Hostname", "nomatch")]);
    assert!(n.spec.as_ref().unwrap().provider_id.is_none());
    let ev = env.events("ProvidedNodeIPNotValid").await;
    assert_eq!(ev[0].type_.as_deref(), Some("Warning"));
    assert!(
        ev[0].message.as_deref().unwrap().contains("10.9.9.9"),
        "{:?}",
        ev[0].message
    );
    env.shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_not_found_then_created_initializes_after_backoff() {
    // No instance events: the retry must come from the per-node backoff alone.
    let env = Env::start(SimOptions::default(), false).await;
    env.create_node(&kubelet_node("late", None)).await;
    let h = start(&env, CloudNodeConfig::default());
    wait_for("a few failed attempts", || async {
        h.failures("late") >= 3 && !env.events("InstanceNotFound").await.is_empty()
    })
    .await;
    let n = env.get("late").await.unwrap();
    assert!(tainted(&n));
    let ev = &env.events("InstanceNotFound").await[0];
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert!(
        ev.message
            .as_deref()
            .unwrap()
            .contains("instance not found")
    );

    let id = env.cloud.add_instance(InstanceSpec::new("late"));
    wait_for("initialized after backoff", || async {
        env.get("late").await.is_some_and(|n| !tainted(&n))
    })
    .await;
    let n = env.get("late").await.unwrap();
    assert_eq!(n.spec.unwrap().provider_id.unwrap(), format!("sim://{id}"));
    wait_for("backoff forgotten", || async { h.failures("late") == 0 }).await;
    env.shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beta_labels_are_copied_to_ga_without_cloud_calls() {
    let env = Env::start(SimOptions::default(), true).await;
    let mut n = initialized_node("old", "sim://i-0000000000000000f", "True");
    n.metadata.labels.as_mut().unwrap().extend([
        (
            "failure-domain.beta.kubernetes.io/zone".to_string(),
            "z1".to_string(),
        ),
        (
            "beta.kubernetes.io/instance-type".to_string(),
            "big".to_string(),
        ),
        (
            "node.kubernetes.io/instance-type".to_string(),
            "stale".to_string(),
        ),
    ]);
    env.create_node(&n).await;
    // A long refresh period: the only cloud call would come from the startup refresh, which
    // fails for this unknown instance and writes nothing.
    let h = start(&env, CloudNodeConfig::default());
    wait_for("GA labels", || async {
        env.get("old").await.is_some_and(|n| {
            let l = n.metadata.labels.unwrap();
            l.get("topology.kubernetes.io/zone").map(String::as_str) == Some("z1")
                && l.get("node.kubernetes.io/instance-type")
                    .map(String::as_str)
                    == Some("big")
        })
    })
    .await;
    wait_for("idle", || async { h.pending() == 0 }).await;
    assert_eq!(env.metrics.count(op::INSTANCE_METADATA), 0);
    // Only the periodic refresh at start asked the cloud (one batch call for one node).
    assert!(env.metrics.count(op::INSTANCES_METADATA) <= 1);
    assert_eq!(env.node_writes(), 1, "one label patch");
    env.shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_refresh_is_batched_and_writes_only_changes() {
    const N: usize = 30;
    let env = Env::start(
        SimOptions {
            max_batch_size: 10,
            ..Default::default()
        },
        true,
    )
    .await;
    for i in 0..N {
        env.cloud
            .add_instance(InstanceSpec::new(format!("r-{i:02}")));
        env.create_node(&kubelet_node(&format!("r-{i:02}"), None))
            .await;
    }
    let h = start(
        &env,
        CloudNodeConfig {
            node_status_update_frequency: Duration::from_millis(300),
            ..Default::default()
        },
    );
    wait_for("initialized", || async { untainted_count(&env).await == N }).await;
    wait_for("idle", || async { h.pending() == 0 }).await;
    let writes0 = env.node_writes();
    let calls0 = env.metrics.count(op::INSTANCES_METADATA);
    // A few refresh periods with nothing changed: calls in batches, no writes.
    wait_for("3 refresh periods", || async {
        env.metrics.count(op::INSTANCES_METADATA) >= calls0 + 3 * N.div_ceil(10) as u64
    })
    .await;
    assert_eq!(
        env.node_writes(),
        writes0,
        "unchanged addresses must not be written"
    );
    eprintln!(
        "REFRESH {N} nodes, batch 10: calls so far {} (per period {})",
        env.metrics.count(op::INSTANCES_METADATA),
        N.div_ceil(10)
    );
    assert_eq!(env.metrics.count(op::INSTANCE_METADATA), 0);
    env.shutdown.cancel();
}

async fn run_burst_with_faults(faulty: bool) -> (u64, u64) {
    // Enough batches that the 30 % error draws average out (fault-free: 20 calls).
    const N: usize = 500;
    const BATCH: usize = 25;
    let env = Env::start(
        SimOptions {
            max_batch_size: BATCH,
            seed: Some(7),
            ..Default::default()
        },
        true,
    )
    .await;
    for i in 0..N {
        let name = format!("f-{i:03}");
        env.cloud.add_instance(InstanceSpec::new(&name));
        env.create_node(&kubelet_node(&name, None)).await;
    }
    if faulty {
        env.cloud
            .set_error_rate(op::INSTANCES_METADATA, 0.3)
            .unwrap();
        env.cloud
            .set_throttle(
                op::INSTANCES_METADATA,
                Some(Throttle {
                    qps: 10.0,
                    burst: 3,
                }),
            )
            .unwrap();
    }
    let h = start(&env, CloudNodeConfig::default());
    wait_for("all initialized", || async {
        untainted_count(&env).await == N
    })
    .await;
    wait_for("idle", || async { h.pending() == 0 }).await;
    let calls = env.metrics.count(op::INSTANCES_METADATA);
    eprintln!(
        "FAULTS faulty={faulty}: cloud calls {calls} {:?}; node writes {}",
        env.metrics.snapshot(),
        env.node_writes()
    );
    if faulty {
        assert!(
            !env.events("CloudProviderError").await.is_empty()
                || !env.events("CloudProviderThrottled").await.is_empty()
        );
    }
    env.shutdown.cancel();
    (calls, env.node_writes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_errors_and_throttling_converge_within_3x_calls() {
    let (clean, clean_writes) = run_burst_with_faults(false).await;
    let (faulty, faulty_writes) = run_burst_with_faults(true).await;
    assert!(
        faulty <= 3 * clean,
        "faulty run made {faulty} cloud calls, fault-free {clean}"
    );
    assert!(clean_writes <= 1000 && faulty_writes <= 1000);
}
