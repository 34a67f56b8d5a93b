//! Convergence under AWS throttling: the same small cluster (nodes, routes, a Classic ELB) is
//! brought up twice through a counting proxy in front of moto, once fault-free and once with
//! throttles injected the way AWS sends them; the throttled run converges with at most 3× the
//! calls.

mod common;

use std::time::Duration;

use ccm_controllers::nodeutil::{TAINT_UNINITIALIZED, has_taint};
use common::throttle::ThrottleProxy;
use common::{AwsWorld, Cluster, Moto, cloud_config, pod_cidr, sdk_config, wait_for};
use serde_json::json;

const NODES: usize = 8;

async fn bring_up(region: &str, proxy: &ThrottleProxy) -> anyhow::Result<u64> {
    let world = AwsWorld::create(Moto::shared(), region).await?;
    let mut instances = world.run_instances(NODES as i32 / 2, 0).await?;
    instances.extend(world.run_instances(NODES as i32 / 2, 1).await?);
    let provider = ccm_provider_aws::AwsCloud::with_sdk_config(
        cloud_config(&proxy.url),
        sdk_config(region).await,
    );
    let mut cluster = Cluster::start().await?;
    cluster.start_ccm(provider, &[]).await?;
    for (i, (_, dns)) in instances.iter().enumerate() {
        cluster.add_node(dns, &pod_cidr(i)).await?;
    }
    cluster.create_service("web", json!({}), &[80]).await?;
    wait_for(
        "nodes initialized, routed, LB ingress",
        Duration::from_secs(120),
        || async {
            let nodes = cluster.nodes().await?;
            let init = nodes
                .iter()
                .filter(|n| !has_taint(n, TAINT_UNINITIALIZED))
                .count();
            let routes = world.routes().await?.len();
            let svc = cluster.service("web").await?;
            let ingress = svc
                .and_then(|s| s.status)
                .and_then(|s| s.load_balancer)
                .and_then(|l| l.ingress)
                .is_some_and(|i| !i.is_empty());
            Ok(if init == NODES && routes == NODES && ingress {
                Ok(())
            } else {
                Err(format!(
                    "initialized {init}, routes {routes}, ingress {ingress}"
                ))
            })
        },
    )
    .await?;
    cluster.stop_ccm().await?;
    Ok(proxy.calls().values().sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn converges_under_throttling_with_at_most_three_times_the_calls() -> anyhow::Result<()> {
    let clean = ThrottleProxy::start(&Moto::shared().url).await;
    let fault_free = bring_up("us-west-1", &clean).await?;

    let faulty = ThrottleProxy::start(&Moto::shared().url).await;
    // 3 throttles exhaust the SDK's 3 attempts (the controller sees CloudError::Throttled and
    // backs off); 2 are absorbed by the SDK's own retries.
    faulty.fail_next("DescribeInstances", 3);
    faulty.fail_next("CreateRoute", 2);
    faulty.fail_next("CreateLoadBalancer", 3);
    let throttled = bring_up("ca-central-1", &faulty).await?;

    let injected = faulty.throttled();
    eprintln!("fault-free {fault_free} calls {:?}", clean.calls());
    eprintln!(
        "throttled {throttled} calls {:?}, injected {injected:?}",
        faulty.calls()
    );
    assert_eq!(injected.get("DescribeInstances"), Some(&3));
    assert_eq!(injected.get("CreateRoute"), Some(&2));
    assert_eq!(injected.get("CreateLoadBalancer"), Some(&3));
    assert!(
        throttled <= 3 * fault_free,
        "{throttled} calls under throttling vs {fault_free} fault-free"
    );
    Ok(())
}
