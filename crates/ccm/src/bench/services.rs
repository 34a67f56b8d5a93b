//! The services scenario: many LoadBalancer Services at once, then one node joins.

use std::time::{Duration, Instant};

use super::BenchOptions;
use super::env::Env;
use super::report::{ScenarioResult, percentiles};
use super::track::{SERVICE_CLIENTS, Tracker, add_nodes, add_services, api_stats, spinner};

pub(super) async fn services(opts: &BenchOptions) -> anyhow::Result<ScenarioResult> {
    let pb = spinner(&format!(
        "services: {} LoadBalancer Services at once",
        opts.services
    ));
    let started = Instant::now();
    let env = Env::start(opts, opts.fault_rate, &[]).await?;
    let n = opts.nodes as usize;
    add_nodes(&env.cluster, 0..opts.nodes, opts.kubelets).await?;
    let mut converged = env
        .until(opts.timeout.0, || async {
            Ok(env.cluster.state().await?.initialized == n)
        })
        .await?;
    let tracker = Tracker::services(env.cluster.user_client());
    let t0 = Instant::now();
    let created = add_services(&env.cluster, "lb", opts.services, SERVICE_CLIENTS).await?;
    let m = opts.services as usize;
    let all = env
        .until(opts.timeout.0, || async { Ok(tracker.count() >= m) })
        .await?;
    let all_ingress = t0.elapsed().as_secs_f64();
    converged &= all;
    let updates_before = env.lb_updates().await;
    let t1 = Instant::now();
    env.cluster.add_node(opts.nodes).await?;
    converged &= env.until_lbs_have(opts.timeout.0, m, n + 1).await?;
    // Every update the join causes, not only the first pass that reached all LBs: a second
    // pass (e.g. when the providerID arrives) lands up to a node-sync window later.
    let (seen, last_change) = env
        .lb_updates_settled(updates_before, t1, Duration::from_secs(3))
        .await;
    let mut r = ScenarioResult {
        scenario: "services".into(),
        converged,
        nodes: opts.nodes,
        services: opts.services,
        time_to_ingress: Some(percentiles(tracker.latencies(&created))),
        all_ingress_seconds: Some(all_ingress),
        node_join_lb_update_seconds: Some(last_change.as_secs_f64()),
        node_join_lb_updates: Some(seen),
        ..Default::default()
    };
    api_stats(&env, 0, &mut r).await;
    r.usage = env.usage();
    env.stop().await;
    r.wall_seconds = started.elapsed().as_secs_f64();
    pb.finish_and_clear();
    Ok(r)
}
