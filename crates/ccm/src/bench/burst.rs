//! The burst (many nodes register at once) and scale (a burst, then many Services) scenarios.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::StreamExt;

use super::BenchOptions;
use super::env::Env;
use super::report::{Join, Registrations, ScenarioResult, percentiles};
use super::track::{
    Tracker, api_stats, both_latencies, initialized, join_one, register_nodes, routed, spinner,
};
use crate::cluster::SimCluster;

pub(super) async fn burst(
    opts: &BenchOptions,
    timeline: &mut Vec<(f64, usize)>,
) -> anyhow::Result<ScenarioResult> {
    let pb = spinner(&format!("burst: {} nodes register at once", opts.nodes));
    let started = Instant::now();
    let baseline = no_ccm_registrations(opts, opts.nodes).await?;
    let env = Env::start(opts, opts.fault_rate, &[]).await?;
    let r = burst_on(&env, opts, opts.nodes, timeline).await;
    env.stop().await;
    let mut r = r?;
    r.set_baseline(baseline);
    r.wall_seconds = started.elapsed().as_secs_f64();
    pb.finish_and_clear();
    Ok(r)
}

/// `nodes` kubelets register at once on `env`; times, requests and usage of the burst.
pub(super) async fn burst_on(
    env: &Env,
    opts: &BenchOptions,
    nodes: u32,
    timeline: &mut Vec<(f64, usize)>,
) -> anyhow::Result<ScenarioResult> {
    let client = env.cluster.user_client();
    let init = Tracker::nodes(client.clone(), initialized);
    let net = Tracker::nodes(client.clone(), routed);
    let t0 = Instant::now();
    let n = nodes as usize;
    let (registered, sampled) = tokio::join!(
        register_nodes(&env.cluster, 0..nodes, opts.kubelets),
        async {
            let mut routes_at = None;
            let mut tl = Vec::new();
            let deadline = Instant::now() + opts.timeout.0;
            while Instant::now() < deadline {
                tl.push((t0.elapsed().as_secs_f64(), init.count()));
                if routes_at.is_none() && env.cluster.cloud.route_count() >= n {
                    routes_at = Some(t0.elapsed().as_secs_f64());
                }
                // Done, or never will be: the CCM's exit is reported by the wait below.
                if routes_at.is_some() && init.count() >= n || env.ccm_exited() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (routes_at, tl)
        }
    );
    let registered = registered?;
    let created: HashMap<String, Instant> = registered
        .iter()
        .map(|(k, (s, _))| (k.clone(), *s))
        .collect();
    let last_registered = registered.values().map(|(_, e)| *e).max();
    let (routes_at, tl) = sampled;
    *timeline = tl;
    let converged = env
        .until(opts.timeout.0, || async {
            let s = env.cluster.state().await?;
            Ok(s.initialized == n && s.network_ready == n && s.routes == n)
        })
        .await?;
    let (ready, last_ready) = both_latencies(&init, &net, &created);
    let mut r = ScenarioResult {
        scenario: "burst".into(),
        converged,
        nodes,
        time_to_initialized: Some(percentiles(init.latencies(&created))),
        time_to_routed: Some(percentiles(net.latencies(&created))),
        time_to_ready: Some(percentiles(ready)),
        last_ready_after_last_registration_seconds: last_ready
            .zip(last_registered)
            .map(|(d, r)| d.saturating_duration_since(r).as_secs_f64()),
        last_seen_after_last_registration_seconds: init
            .seen
            .lock()
            .values()
            .max()
            .zip(last_registered)
            .map(|(s, r)| s.saturating_duration_since(r).as_secs_f64()),
        registration_seconds: last_registered.map(|l| l.duration_since(t0).as_secs_f64()),
        registration_latency: Some(registrations(t0, &registered).latency),
        all_routes_seconds: routes_at,
        ..Default::default()
    };
    api_stats(env, nodes, &mut r).await;
    r.usage = env.usage();
    r.cpu_seconds_per_1000_nodes = Some(r.usage.cpu_seconds * 1000.0 / f64::from(nodes));
    Ok(r)
}

/// The scale scenario makes every `LB_EVERY`th Service a LoadBalancer.
const LB_EVERY: u32 = 50;

/// A large burst, then many Services (every 50th a LoadBalancer) on the same CCM: the burst's
/// figures at scale plus time to ingress among 10,000 Services and the memory of it all.
pub(super) async fn scale(opts: &BenchOptions) -> anyhow::Result<ScenarioResult> {
    let pb = spinner(&format!(
        "scale: {} nodes register at once, then {} Services",
        opts.scale_nodes, opts.scale_services
    ));
    let started = Instant::now();
    let baseline = no_ccm_registrations(opts, opts.scale_nodes).await?;
    let env = Env::start(opts, opts.fault_rate, &[]).await?;
    let r = scale_on(&env, opts).await;
    env.stop().await;
    let mut r = r?;
    r.set_baseline(baseline);
    r.wall_seconds = started.elapsed().as_secs_f64();
    pb.finish_and_clear();
    Ok(r)
}

pub(super) async fn scale_on(env: &Env, opts: &BenchOptions) -> anyhow::Result<ScenarioResult> {
    let mut r = burst_on(env, opts, opts.scale_nodes, &mut Vec::new()).await?;
    r.scenario = "scale".into();
    let burst_cpu = r.usage.cpu_seconds;
    let tracker = Tracker::services(env.cluster.user_client());
    let t0 = Instant::now();
    let results: Vec<anyhow::Result<Option<(String, Instant)>>> =
        futures::stream::iter(0..opts.scale_services)
            .map(|i| async move {
                let name = format!("scale-{i}");
                let t = Instant::now();
                if i % LB_EVERY == 0 {
                    env.cluster.add_service(&name).await?;
                    Ok(Some((name, t)))
                } else {
                    env.cluster.add_cluster_ip_service(&name).await?;
                    Ok(None)
                }
            })
            .buffer_unordered(64)
            .collect()
            .await;
    let mut created = HashMap::new();
    for res in results {
        created.extend(res?);
    }
    let lbs = created.len();
    r.converged &= env
        .until(opts.timeout.0, || async { Ok(tracker.count() >= lbs) })
        .await?;
    r.all_ingress_seconds = Some(t0.elapsed().as_secs_f64());
    r.time_to_ingress = Some(percentiles(tracker.latencies(&created)));
    r.services = opts.scale_services;
    // Let caches settle before reading the steady state.
    tokio::time::sleep(Duration::from_secs(3)).await;
    api_stats(env, opts.scale_nodes, &mut r).await;
    r.cpu_seconds_per_1000_nodes = Some(burst_cpu * 1000.0 / f64::from(opts.scale_nodes));
    r.converged &= join_at_scale(env, opts, &mut r).await?;
    // After the join: its load-balancer updates can set the peak.
    r.usage = env.usage();
    Ok(r)
}

/// One Node joins the settled cluster: seconds to initialized and to routed, the load balancers'
/// updates (every LB has it, then no update for 3 s), and the CCM CPU from its registration to
/// then (the quiet window's idle CPU included).
async fn join_at_scale(
    env: &Env,
    opts: &BenchOptions,
    r: &mut ScenarioResult,
) -> anyhow::Result<bool> {
    let before = env.lb_updates().await;
    let joined = join_one(env, opts, opts.scale_nodes).await?;
    let mut ok = joined.ok;
    let lbs = opts.scale_services.div_ceil(LB_EVERY) as usize;
    ok &= env
        .until_lbs_have(opts.timeout.0, lbs, opts.scale_nodes as usize + 1)
        .await?;
    let (updates, last) = env
        .lb_updates_settled(before, joined.at, Duration::from_secs(3))
        .await;
    r.join = Some(Join {
        initialized_seconds: joined.initialized,
        routed_seconds: joined.routed,
        cpu_seconds: env.usage().cpu_seconds - joined.cpu_before,
    });
    r.node_join_lb_updates = Some(updates);
    r.node_join_lb_update_seconds = Some(last.as_secs_f64());
    Ok(ok)
}

/// With `--no-ccm`: the same kubelets register the same nodes on a fresh kube-sim with the
/// same cost model and the bench's own node watches, and no CCM at all. `None` without
/// `--no-ccm` or against another API server (which could not be started fresh).
async fn no_ccm_registrations(
    opts: &BenchOptions,
    nodes: u32,
) -> anyhow::Result<Option<Registrations>> {
    if !opts.no_ccm || opts.kubeconfig.is_some() {
        return Ok(None);
    }
    let pb = spinner(&format!("{nodes} nodes register with no CCM (baseline)"));
    let mut cluster = SimCluster::start(super::env::sim_cloud(opts, 0.0)?).await?;
    cluster.bodies = opts.objects;
    if let Some(kube) = &cluster.kube {
        kube.set_cost_model(opts.cost_model()?);
    }
    let client = cluster.user_client();
    let (_init, _net) = (
        Tracker::nodes(client.clone(), initialized),
        Tracker::nodes(client, routed),
    );
    let t0 = Instant::now();
    let registered = register_nodes(&cluster, 0..nodes, opts.kubelets).await?;
    pb.finish_and_clear();
    Ok(Some(registrations(t0, &registered)))
}

/// The registrations' span from `t0` and each kubelet's POST + PATCH latency.
fn registrations(t0: Instant, registered: &HashMap<String, (Instant, Instant)>) -> Registrations {
    let last = registered.values().map(|(_, end)| *end).max();
    Registrations {
        seconds: last.map_or(0.0, |l| l.duration_since(t0).as_secs_f64()),
        latency: percentiles(
            registered
                .values()
                .map(|(start, end)| end.duration_since(*start).as_secs_f64())
                .collect(),
        ),
    }
}
