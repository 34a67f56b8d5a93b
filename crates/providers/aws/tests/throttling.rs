//! Convergence under AWS throttling: the same small cluster (nodes, routes, a Classic ELB) is
//! brought up twice through a counting proxy in front of moto, once fault-free and once with
//! throttles injected the way AWS sends them; the throttled run converges with at most 3× the
//! calls.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use ccm_controllers::nodeutil::{TAINT_UNINITIALIZED, has_taint};
use common::throttle::ThrottleProxy;
use common::{AwsWorld, Cluster, Moto, cloud_config, pod_cidr, sdk_config, wait_for};
use serde_json::json;

const NODES: usize = 8;

/// Brings the cluster up through `proxy`; returns the calls AWS saw and the provider's
/// `/metrics` text.
async fn bring_up(region: &str, proxy: &ThrottleProxy) -> anyhow::Result<(u64, String)> {
    let world = AwsWorld::create(Moto::shared(), region).await?;
    world.with_internet_gateway().await?;
    let mut instances = world.run_instances(NODES as i32 / 2, 0).await?;
    instances.extend(world.run_instances(NODES as i32 / 2, 1).await?);
    let provider = ccm_provider_aws::AwsCloud::with_sdk_config(
        cloud_config(&proxy.url),
        sdk_config(region).await,
    );
    let mut registry = prometheus_client::registry::Registry::default();
    provider.metrics().register(&mut registry);
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
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    Ok((proxy.calls().values().sum(), text))
}

/// `cloudprovider_aws_api_throttled_requests_total` by operation, from exported text.
fn throttled_ops(text: &str) -> BTreeMap<String, u64> {
    let prefix = "cloudprovider_aws_api_throttled_requests_total{operation_name=\"";
    text.lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .filter_map(|l| {
            let (op, value) = l.split_once("\"} ")?;
            Some((op.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn converges_under_throttling_with_at_most_three_times_the_calls() -> anyhow::Result<()> {
    let clean = ThrottleProxy::start(&Moto::shared().url).await;
    let (fault_free, clean_metrics) = bring_up("us-west-1", &clean).await?;

    let faulty = ThrottleProxy::start(&Moto::shared().url).await;
    // 3 throttles exhaust the SDK's 3 attempts (the controller sees CloudError::Throttled and
    // backs off); 2 are absorbed by the SDK's own retries.
    faulty.fail_next("DescribeInstances", 3);
    faulty.fail_next("CreateRoute", 2);
    faulty.fail_next("CreateLoadBalancer", 3);
    let (throttled, metrics) = bring_up("ca-central-1", &faulty).await?;

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
    // Upstream's throttle counter counts operations still throttled after the SDK's retries:
    // the 3-throttle ones (instance lookups are serialized by the provider's batcher, the one
    // LB is created once at a time), not the CreateRoutes the SDK's retry absorbed.
    assert_eq!(throttled_ops(&clean_metrics), BTreeMap::new());
    let want: BTreeMap<String, u64> = [("DescribeInstances", 1), ("CreateLoadBalancer", 1)]
        .map(|(k, v)| (k.to_string(), v))
        .into();
    assert_eq!(throttled_ops(&metrics), want, "{metrics}");
    Ok(())
}
