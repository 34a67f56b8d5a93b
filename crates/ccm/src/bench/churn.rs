//! The churn scenario: nodes and Services come and go with injected cloud faults.

use std::time::{Duration, Instant};

use super::BenchOptions;
use super::env::Env;
use super::report::ScenarioResult;
use super::track::{add_nodes, api_stats, spinner};

pub(super) async fn churn(opts: &BenchOptions) -> anyhow::Result<ScenarioResult> {
    let fault = opts.fault_rate.max(0.1);
    let pb = spinner(&format!(
        "churn: {} of changes at {}/s with {:.0}% cloud faults",
        opts.churn_duration,
        opts.churn_rate,
        fault * 100.0
    ));
    let started = Instant::now();
    let env = Env::start(opts, fault, &[]).await?;
    let base_nodes = opts.nodes.min(50);
    add_nodes(&env.cluster, 0..base_nodes, opts.kubelets).await?;
    let mut live_nodes: Vec<u32> = (0..base_nodes).collect();
    let mut next_node = base_nodes;
    let mut live_svcs: Vec<u32> = Vec::new();
    let mut next_svc = 0u32;
    let mut ops = 0u64;
    let period = Duration::from_secs_f64(1.0 / opts.churn_rate.max(0.1));
    let t0 = Instant::now();
    while t0.elapsed() < opts.churn_duration.0 {
        let roll: u8 = rand::random::<u8>() % 4;
        let res = match roll {
            0 => {
                next_svc += 1;
                live_svcs.push(next_svc);
                env.cluster.add_service(&format!("churn-{next_svc}")).await
            }
            1 if !live_svcs.is_empty() => {
                let i = rand::random::<u32>() as usize % live_svcs.len();
                let s = live_svcs.swap_remove(i);
                env.cluster.delete_service(&format!("churn-{s}")).await
            }
            2 => {
                next_node += 1;
                live_nodes.push(next_node);
                env.cluster.add_node(next_node).await.map(|_| ())
            }
            _ if live_nodes.len() > 2 => {
                let i = rand::random::<u32>() as usize % live_nodes.len();
                let nidx = live_nodes.swap_remove(i);
                let name = format!("node-{nidx:05}");
                match env.cluster.terminate_node(&name).await {
                    Ok(()) => env.cluster.delete_node(&name).await,
                    Err(e) => Err(e),
                }
            }
            _ => Ok(()),
        };
        if let Err(e) = res {
            tracing::warn!(error = %e, "churn step failed");
        }
        ops += 1;
        tokio::time::sleep(period).await;
    }
    let churn_end = Instant::now();
    let n = live_nodes.len();
    let m = live_svcs.len();
    let converged = env
        .until(opts.timeout.0, || async {
            let s = env.cluster.state().await?;
            Ok(s.nodes == n
                && s.initialized == n
                && s.routes == n
                && s.lb_services == m
                && s.with_ingress == m
                && s.cloud_lbs == m)
        })
        .await?;
    let lag = churn_end.elapsed().as_secs_f64();
    // Leaks, counted against what should exist.
    let live_svc_names: std::collections::BTreeSet<String> =
        live_svcs.iter().map(|s| format!("churn-{s}")).collect();
    let lbs = env.cluster.cloud.load_balancers();
    let leaked_lbs = lbs
        .iter()
        .filter(|lb| !live_svc_names.contains(&lb.service_name))
        .count();
    let missing = live_svc_names
        .iter()
        .filter(|n| !lbs.iter().any(|lb| &&lb.service_name == n))
        .count();
    let live_node_names: std::collections::BTreeSet<String> =
        live_nodes.iter().map(|i| format!("node-{i:05}")).collect();
    let leaked_routes = env
        .cluster
        .cloud
        .routes()
        .iter()
        .filter(|r| !live_node_names.contains(&r.target_node))
        .count();
    let mut r = ScenarioResult {
        scenario: "churn".into(),
        converged,
        nodes: n as u32,
        services: m as u32,
        churn_convergence_lag_seconds: Some(lag),
        leaked_load_balancers: Some(leaked_lbs),
        missing_load_balancers: Some(missing),
        leaked_routes: Some(leaked_routes),
        churn_operations: Some(ops),
        ..Default::default()
    };
    api_stats(&env, 0, &mut r).await;
    r.usage = env.usage();
    env.stop().await;
    r.wall_seconds = started.elapsed().as_secs_f64();
    pb.finish_and_clear();
    Ok(r)
}
