//! The memory scenario: many nodes and Services cached, steady memory.

use std::time::{Duration, Instant};

use super::BenchOptions;
use super::env::Env;
use super::report::ScenarioResult;
use super::track::{add_cluster_ip_services, add_nodes, api_stats, spinner};

pub(super) async fn memory(opts: &BenchOptions) -> anyhow::Result<ScenarioResult> {
    let pb = spinner(&format!(
        "memory: {} nodes + {} Services cached",
        opts.memory_nodes, opts.memory_services
    ));
    let started = Instant::now();
    let env = Env::start(opts, 0.0, &[]).await?;
    let (nodes, svcs) = tokio::join!(
        add_nodes(&env.cluster, 0..opts.memory_nodes, opts.kubelets),
        add_cluster_ip_services(&env.cluster, opts.memory_services)
    );
    nodes?;
    svcs?;
    let n = opts.memory_nodes as usize;
    let converged = env
        .until(opts.timeout.0, || async {
            let s = env.cluster.state().await?;
            Ok(s.initialized == n && s.routes == n && s.network_ready == n)
        })
        .await?;
    // Steady state: let caches settle, then read.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut r = ScenarioResult {
        scenario: "memory".into(),
        converged,
        nodes: opts.memory_nodes,
        services: opts.memory_services,
        ..Default::default()
    };
    r.usage = env.usage();
    api_stats(&env, opts.memory_nodes, &mut r).await;
    env.stop().await;
    r.wall_seconds = started.elapsed().as_secs_f64();
    pb.finish_and_clear();
    Ok(r)
}
