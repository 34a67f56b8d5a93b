//! Measures what the AWS provider asks of AWS, by moto's recorder: a burst of `M_NODES`
//! kubelet-registered Nodes (no providerID yet) with `M_LBS` LoadBalancer Services (every
//! second one an NLB when `M_NLB=1`) and routes on, then `M_IDLE_SECS` of quiet, then one Node
//! joining. The numbers in docs/providers/aws.md come from it:
//!
//! ```sh
//! M_NODES=1000 M_LBS=50 M_NLB=1 M_IDLE_SECS=600 \
//!     cargo run -p ccm-provider-aws --example measure_calls
//! ```
//!
//! It takes minutes on moto, so it is an example, not a test: `cargo test` builds it (so it
//! keeps compiling) but does not run it; `tests/instances.rs` bounds the burst at 1,000 Nodes.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use ccm_controllers::nodeutil::{TAINT_UNINITIALIZED, has_taint};
use common::{AwsWorld, Cluster, Moto, pod_cidr, wait_for};
use serde_json::json;

fn env(k: &str, d: u64) -> u64 {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let nodes = env("M_NODES", 1000) as usize;
    let lbs = env("M_LBS", 50) as usize;
    let idle = env("M_IDLE_SECS", 600);
    let moto = Moto::start();
    let world = AwsWorld::create(&moto, "us-east-1").await?;
    let mut instances = Vec::new();
    for s in 0..2 {
        let mut left = nodes / 2;
        while left > 0 {
            let n = left.min(250);
            instances.extend(world.run_instances(n as i32, s).await?);
            left -= n;
        }
    }
    let mut cluster = Cluster::start().await?;
    let kubelets = &cluster;
    {
        use futures::StreamExt;
        let adds = instances
            .iter()
            .enumerate()
            .map(|(i, (_, dns))| async move { kubelets.add_node(dns, &pod_cidr(i)).await });
        let r: Vec<_> = futures::stream::iter(adds)
            .buffer_unordered(32)
            .collect()
            .await;
        for x in r {
            x?;
        }
    }
    for i in 0..lbs {
        let ann = if i % 2 == 0 || env("M_NLB", 0) == 0 {
            json!({})
        } else {
            json!({"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"})
        };
        cluster
            .create_service(&format!("svc-{i}"), ann, &[80])
            .await?;
    }
    eprintln!("M: {nodes} nodes and {lbs} services registered; starting CCM");
    moto.start_recording().await;
    let t0 = Instant::now();
    let aws = world.provider().await;
    cluster.start_ccm(aws.clone(), &[]).await?;
    converge(&cluster, nodes, lbs).await?;
    let t_conv = t0.elapsed();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let burst = moto.recorded().await;
    describe_kinds(&moto).await;
    eprintln!(
        "M: burst converged (kube side) after {t_conv:?}; calls incl. 30 s settle: {burst:?}"
    );
    let routes = world.routes().await?.len();
    eprintln!("M: routes in table: {routes}");
    // The recorder counts HTTP attempts (the SDK's retries too); the provider counts operations.
    eprintln!(
        "M: provider operations so far: {:?}",
        aws.metrics().snapshot()
    );

    moto.start_recording().await;
    tokio::time::sleep(Duration::from_secs(idle)).await;
    let idle_calls = moto.recorded().await;
    eprintln!("M: idle {idle} s: {idle_calls:?}");

    moto.start_recording().await;
    let joined = world.run_instances(1, 0).await?;
    let after_run = moto.recorded().await;
    let t1 = Instant::now();
    cluster.add_node(&joined[0].1, &pod_cidr(nodes)).await?;
    converge(&cluster, nodes + 1, lbs).await?;
    let t_join = t1.elapsed();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let join = moto.recorded().await;
    eprintln!(
        "M: node join initialized after {t_join:?}; calls incl. 30 s settle: {join:?} (test's own RunInstances etc: {after_run:?})"
    );
    let routes = world.routes().await?;
    eprintln!(
        "M: routes now {} (joined routed: {})",
        routes.len(),
        routes.values().any(|v| v == &joined[0].0)
    );
    let d = world.elb.describe_load_balancers().send().await?;
    let counts: Vec<usize> = d
        .load_balancer_descriptions()
        .iter()
        .map(|l| l.instances().len())
        .collect();
    eprintln!("M: CLB instance counts {counts:?}");
    cluster.stop_ccm().await
}

async fn converge(cluster: &Cluster, nodes: usize, lbs: usize) -> anyhow::Result<()> {
    wait_for("converged", Duration::from_secs(1800), || async {
        let ns = cluster.nodes().await?;
        let init = ns
            .iter()
            .filter(|n| {
                !has_taint(n, TAINT_UNINITIALIZED)
                    && n.spec
                        .as_ref()
                        .and_then(|s| s.provider_id.as_ref())
                        .is_some()
            })
            .count();
        let mut ingress = 0;
        for i in 0..lbs {
            if let Some(s) = cluster.service(&format!("svc-{i}")).await?
                && s.status
                    .and_then(|s| s.load_balancer)
                    .and_then(|l| l.ingress)
                    .is_some_and(|i| !i.is_empty())
            {
                ingress += 1;
            }
        }
        Ok(if init == nodes && ingress == lbs {
            Ok(())
        } else {
            Err(format!("init {init}/{nodes}, ingress {ingress}/{lbs}"))
        })
    })
    .await
}

/// Prints each DescribeInstances in order: how many ids, which filters with how many values.
async fn describe_kinds(moto: &Moto) {
    let calls = moto.recorded_calls().await;
    let mut line = Vec::new();
    for (i, (action, body)) in calls.iter().enumerate() {
        if action != "DescribeInstances" {
            continue;
        }
        let ids = body
            .split('&')
            .filter(|kv| kv.starts_with("InstanceId."))
            .count();
        let filters: Vec<String> = body
            .split('&')
            .filter(|kv| kv.starts_with("Filter.") && kv.contains(".Name="))
            .map(|kv| {
                kv.split_once('=')
                    .map(|(_, v)| v.to_string())
                    .unwrap_or_default()
            })
            .collect();
        let values = body
            .split('&')
            .filter(|kv| kv.starts_with("Filter.1.Value."))
            .count();
        line.push(format!("#{i}:ids={ids},f={filters:?},v1={values}"));
    }
    eprintln!(
        "M: DescribeInstances detail ({} of {} calls): {}",
        line.len(),
        calls.len(),
        line.join(" ")
    );
}
