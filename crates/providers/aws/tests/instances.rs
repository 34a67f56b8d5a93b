//! Instances against moto, through the real CCM controllers on kube-sim: a burst initializes
//! with providerIDs, labels and addresses, routed and behind load balancers, from a handful of
//! `DescribeInstances` shared by the cloud-node, route and service controllers; a stopped
//! instance gets the shutdown taint; a terminated one loses its Node.

mod common;

use std::time::Duration;

use ccm_controllers::nodeutil::{TAINT_SHUTDOWN, TAINT_UNINITIALIZED, has_taint};
use common::{AwsWorld, Cluster, Moto, pod_cidr, wait_for};
use k8s_openapi::api::core::v1::Node;

/// Nodes in the burst: the bound is for 1,000 (DescribeInstances ≤ ceil(1000/1000)+2;
/// measured 2). About 25 s on moto on an idle 2-core machine.
const BURST: usize = 1000;
/// `type: LoadBalancer` Services ensured during the burst: each needs every Node's instance.
const LBS: usize = 4;

fn label<'a>(n: &'a Node, k: &str) -> &'a str {
    n.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(k))
        .map(String::as_str)
        .unwrap_or("")
}

fn initialized(n: &Node) -> bool {
    !has_taint(n, TAINT_UNINITIALIZED)
        && n.spec
            .as_ref()
            .and_then(|s| s.provider_id.as_ref())
            .is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_initializes_every_node_from_batched_lookups() -> anyhow::Result<()> {
    let t0 = std::time::Instant::now();
    let moto = Moto::start();
    let world = AwsWorld::create(&moto, "us-east-1").await?;
    world.with_internet_gateway().await?;
    let mut instances = world.run_instances((BURST / 2) as i32, 0).await?;
    instances.extend(world.run_instances((BURST / 2) as i32, 1).await?);
    let mut cluster = Cluster::start().await?;

    // Every kubelet has registered when the CCM starts (a new cluster, or a CCM rollout).
    let kubelets = &cluster;
    let adds = instances
        .iter()
        .enumerate()
        .map(|(i, (_, dns))| async move { kubelets.add_node(dns, &pod_cidr(i)).await });
    for r in futures_join(adds).await {
        r?;
    }
    for i in 0..LBS {
        cluster
            .create_service(&format!("svc-{i}"), serde_json::json!({}), &[80])
            .await?;
    }
    let t_registered = t0.elapsed();
    moto.start_recording().await;
    // Routes and load balancers on: the route and service controllers look the same Nodes up
    // (by name, as none has a providerID yet) while the cloud-node controller initializes them.
    cluster.start_ccm(world.provider().await, &[]).await?;
    let nodes = wait_for(
        "all nodes initialized, routed and behind every LB",
        Duration::from_secs(300),
        || async {
            let nodes = cluster.nodes().await?;
            let done = nodes.iter().filter(|n| initialized(n)).count();
            let routes = world.routes().await?.len();
            let lbs = world.elb.describe_load_balancers().send().await?;
            let full = lbs
                .load_balancer_descriptions()
                .iter()
                .filter(|l| l.instances().len() == BURST)
                .count();
            Ok(if done == BURST && routes == BURST && full == LBS {
                Ok(nodes)
            } else {
                Err(format!(
                    "{done}/{BURST} initialized, {routes} routes, {full}/{LBS} LBs with every node"
                ))
            })
        },
    )
    .await?;
    let calls = moto.recorded().await;

    for n in &nodes {
        let name = n.metadata.name.as_deref().unwrap_or("");
        let (id, _) = instances
            .iter()
            .find(|(_, d)| d == name)
            .expect("node of an instance");
        let pid = n
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .unwrap_or("");
        let zone = label(n, "topology.kubernetes.io/zone");
        assert!(
            zone == "us-east-1a" || zone == "us-east-1b",
            "{name}: zone {zone:?}"
        );
        assert_eq!(pid, format!("aws:///{zone}/{id}"));
        assert_eq!(label(n, "node.kubernetes.io/instance-type"), "m5.large");
        assert_eq!(label(n, "topology.kubernetes.io/region"), "us-east-1");
        assert!(
            label(n, "topology.k8s.aws/zone-id").starts_with("use1-az"),
            "{name}: zone id"
        );
        let addrs: Vec<(&str, &str)> = n
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .map(|a| {
                a.iter()
                    .map(|a| (a.type_.as_str(), a.address.as_str()))
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(addrs.len(), 3, "{name}: {addrs:?}");
        assert_eq!(addrs[0].0, "InternalIP");
        assert!(addrs[0].1.starts_with("10.0."), "{addrs:?}");
        assert_eq!(addrs[1], ("InternalDNS", name));
        assert_eq!(addrs[2], ("Hostname", name));
    }
    let describes = calls.get("DescribeInstances").copied().unwrap_or(0);
    eprintln!(
        "burst of {BURST}: AWS calls {calls:?}; instances+nodes ready after {t_registered:?}, all initialized after {:?}",
        t0.elapsed()
    );
    // Zone ids (moto's instances lack them): asked once, however many batches miss them.
    assert!(
        calls.get("DescribeAvailabilityZones").copied().unwrap_or(0) <= 1,
        "{calls:?}"
    );
    let bound = (BURST as u64).div_ceil(1000) + 2;
    assert!(
        describes <= bound,
        "DescribeInstances {describes} > {bound} for {BURST} nodes: {calls:?}"
    );
    cluster.stop_ccm().await
}

async fn futures_join<F: std::future::Future>(fs: impl Iterator<Item = F>) -> Vec<F::Output> {
    use futures::StreamExt;
    // 32 at a time, as many kubelets hitting the API server together.
    futures::stream::iter(fs)
        .buffer_unordered(32)
        .collect()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_instance_is_tainted_and_terminated_one_loses_its_node() -> anyhow::Result<()> {
    let world = AwsWorld::create(Moto::shared(), "us-east-2").await?;
    let instances = world.run_instances(3, 0).await?;
    let mut cluster = Cluster::start().await?;
    cluster.start_ccm(world.provider().await, &[]).await?;
    for (i, (_, dns)) in instances.iter().enumerate() {
        cluster.add_node(dns, &pod_cidr(i)).await?;
    }
    wait_for("3 nodes initialized", Duration::from_secs(60), || async {
        let n = cluster
            .nodes()
            .await?
            .iter()
            .filter(|n| initialized(n))
            .count();
        Ok(if n == 3 {
            Ok(())
        } else {
            Err(format!("{n}/3"))
        })
    })
    .await?;

    let (stopped_id, stopped) = &instances[0];
    let (terminated_id, terminated) = &instances[1];
    world
        .ec2
        .stop_instances()
        .instance_ids(stopped_id)
        .send()
        .await?;
    world
        .ec2
        .terminate_instances()
        .instance_ids(terminated_id)
        .send()
        .await?;
    // Their kubelets stop reporting.
    cluster.set_ready(stopped, false).await?;
    cluster.set_ready(terminated, false).await?;

    wait_for(
        "shutdown taint on the stopped node, terminated node deleted",
        Duration::from_secs(90),
        || async {
            let nodes = cluster.nodes().await?;
            let names: Vec<&str> = nodes
                .iter()
                .filter_map(|n| n.metadata.name.as_deref())
                .collect();
            let tainted = nodes
                .iter()
                .find(|n| n.metadata.name.as_deref() == Some(stopped.as_str()))
                .is_some_and(|n| has_taint(n, TAINT_SHUTDOWN));
            let gone = !names.contains(&terminated.as_str());
            Ok(if tainted && gone && names.len() == 2 {
                Ok(())
            } else {
                Err(format!("nodes {names:?}, stopped tainted {tainted}"))
            })
        },
    )
    .await?;
    cluster.stop_ccm().await
}
