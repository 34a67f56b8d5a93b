//! `ccm bench chaos`: faults of the API server, the cloud and the CCM itself, one at a time,
//! while nodes and Services come and go; after each, the time until every invariant holds
//! again, and any invariant still broken.
//!
//! Invariants: no Node deleted whose instance exists in the cloud (and every Node whose
//! instance was terminated deleted); every Node initialized and routed; one route per node
//! and none for a node that is gone; one cloud LB per LoadBalancer Service and none for a
//! Service that is gone; every LoadBalancer Service with its ingress.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use ccm_manager::client::USER_AGENT_BASE;
use ccm_provider_sim::Throttle;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, ListParams};
use serde::Serialize;

use super::BenchOptions;
use super::env::Env;
use super::report::{ChaosResult, ScenarioResult};
use super::track::{initialized, routed, spinner};

/// The faults `ccm bench chaos` injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// kube-sim restarts mid-burst: watches cut, resourceVersions expired (410 on resume),
    /// every request answered 503 for a while; its storage is kept.
    ApiRestart,
    /// A share of watch events is not delivered; the watch closes instead.
    WatchDrops,
    /// A share of the CCM's requests is answered 429 with Retry-After.
    Api429,
    /// Every cloud call fails for `--chaos-duration`.
    CloudOutage,
    /// The cloud admits fewer calls per second than the churn needs.
    CloudThrottle,
    /// The CCM is killed with SIGKILL at `--chaos-kills` random moments and restarted.
    CcmKill,
}

const ALL: [Fault; 6] = [
    Fault::ApiRestart,
    Fault::WatchDrops,
    Fault::Api429,
    Fault::CloudOutage,
    Fault::CloudThrottle,
    Fault::CcmKill,
];

/// What should exist: the bench's own record of the nodes and Services it made.
#[derive(Default)]
struct World {
    /// Nodes whose instance runs.
    nodes: BTreeSet<u32>,
    /// Nodes whose instance was terminated: the CCM must delete them.
    gone: BTreeSet<u32>,
    services: BTreeSet<u32>,
    next_node: u32,
    next_service: u32,
}

fn node_name(i: u32) -> String {
    format!("node-{i:05}")
}

fn service_name(i: u32) -> String {
    format!("chaos-{i}")
}

/// Runs every fault of `--chaos-fault` (default: all) on one CCM and cluster.
pub(super) async fn chaos(opts: &BenchOptions) -> anyhow::Result<ScenarioResult> {
    let started = Instant::now();
    let mut env = Env::start(opts, 0.0, &[]).await?;
    let mut world = World::default();
    let r = run_faults(&mut env, &mut world, opts).await;
    let usage = env.usage();
    env.stop().await;
    let rows = r?;
    Ok(ScenarioResult {
        scenario: "chaos".into(),
        converged: rows
            .iter()
            .all(|c| c.violations.is_empty() && c.reconverge_seconds.is_some()),
        nodes: world.nodes.len() as u32,
        services: world.services.len() as u32,
        chaos: rows,
        usage,
        wall_seconds: started.elapsed().as_secs_f64(),
        ..Default::default()
    })
}

async fn run_faults(
    env: &mut Env,
    world: &mut World,
    opts: &BenchOptions,
) -> anyhow::Result<Vec<ChaosResult>> {
    let pb = spinner(&format!(
        "chaos: {} nodes and {} Services to start with",
        opts.chaos_nodes, opts.chaos_services
    ));
    burst(env, world, opts.chaos_nodes, opts).await?;
    for _ in 0..opts.chaos_services {
        add_service(env, world).await;
    }
    let (settled, violations) = reconverge(env, world, opts.timeout.0).await;
    anyhow::ensure!(
        settled.is_some(),
        "the cluster did not converge before the faults: {}",
        violations.join("; ")
    );
    pb.finish_and_clear();
    let faults = if opts.chaos_faults.is_empty() {
        ALL.to_vec()
    } else {
        opts.chaos_faults.clone()
    };
    let mut rows = Vec::new();
    for fault in faults {
        let pb = spinner(&format!("chaos: {fault:?}"));
        let operations = inject(fault, env, world, opts).await?;
        let (reconverge_seconds, violations) = reconverge(env, world, opts.timeout.0).await;
        rows.push(ChaosResult {
            fault: format!("{fault:?}"),
            operations,
            reconverge_seconds,
            violations,
        });
        pb.finish_and_clear();
    }
    Ok(rows)
}

/// Applies `fault` for `--chaos-duration` while the cluster churns, then lifts it. Changes
/// made.
async fn inject(
    fault: Fault,
    env: &mut Env,
    world: &mut World,
    opts: &BenchOptions,
) -> anyhow::Result<u64> {
    let window = opts.chaos_duration.0;
    let kube = env.cluster.kube.as_ref().map(|k| k.faults().clone());
    let cloud = env.cluster.cloud.clone();
    Ok(match fault {
        Fault::ApiRestart => {
            let Some(faults) = kube else {
                anyhow::bail!("api-restart needs the in-process kube-sim (no --kubeconfig)")
            };
            restart_mid_burst(env, world, &faults, opts).await?
        }
        Fault::WatchDrops | Fault::Api429 => {
            let Some(faults) = kube else {
                anyhow::bail!("{fault:?} needs the in-process kube-sim (no --kubeconfig)")
            };
            if fault == Fault::WatchDrops {
                faults.set_watch_drop_rate(0.3);
            } else {
                faults.set_client_prefix(Some(USER_AGENT_BASE.to_string()));
                faults.set_retry_after(1);
                faults.set_429_rate(None, 0.3);
            }
            let ops = churn(env, world, opts, window, &[]).await?;
            faults.set_watch_drop_rate(0.0);
            faults.set_429_rate(None, 0.0);
            ops
        }
        Fault::CloudOutage => {
            cloud.set_error_rate("*", 1.0)?;
            let ops = churn(env, world, opts, window, &[]).await;
            cloud.set_error_rate("*", 0.0)?;
            ops?
        }
        Fault::CloudThrottle => {
            let t = Throttle { qps: 2.0, burst: 2 };
            cloud.set_throttle("*", Some(t))?;
            let ops = burst(env, world, opts.chaos_nodes / 4, opts)
                .await
                .map(u64::from);
            let more = churn(env, world, opts, window, &[]).await;
            cloud.set_throttle("*", None)?;
            ops? + more?
        }
        Fault::CcmKill => {
            let mut at: Vec<Duration> = (0..opts.chaos_kills)
                .map(|_| window.mul_f64(rand::random::<f64>()))
                .collect();
            at.sort();
            churn(env, world, opts, window, &at).await?
        }
    })
}

/// Registers `n` new nodes with `--kubelets` persistent kubelets at once.
async fn burst(env: &Env, world: &mut World, n: u32, opts: &BenchOptions) -> anyhow::Result<u32> {
    let first = world.next_node;
    world.next_node += n;
    let give_up = opts.timeout.0;
    let results: Vec<anyhow::Result<String>> = futures::stream::iter(first..first + n)
        .map(|i| env.cluster.add_node_persistent(i, give_up))
        .buffer_unordered(opts.kubelets.max(1))
        .collect()
        .await;
    for r in results {
        r?;
    }
    world.nodes.extend(first..first + n);
    Ok(n)
}

/// Restarts kube-sim once a quarter of a burst has registered; the burst's kubelets retry
/// through it. Changes made.
async fn restart_mid_burst(
    env: &Env,
    world: &mut World,
    faults: &ccm_kube_sim::Faults,
    opts: &BenchOptions,
) -> anyhow::Result<u64> {
    let n = opts.chaos_nodes.max(4);
    let before = env.cluster.cloud.instances().len();
    let down = opts.chaos_duration.0.min(Duration::from_secs(5));
    let deadline = Instant::now() + opts.timeout.0;
    let trigger = async {
        while env.cluster.cloud.instances().len() < before + n as usize / 4
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        faults.restart(down);
    };
    let (registered, ()) = tokio::join!(burst(env, world, n, opts), trigger);
    registered?;
    // The fault ends when the server answers again.
    tokio::time::sleep(down.saturating_sub(Duration::from_millis(1))).await;
    Ok(u64::from(n))
}

/// Random changes at `--churn-rate` for `window`: Services added and deleted, nodes added,
/// instances terminated (their Nodes left for the CCM to delete). At each of `kills` (offsets
/// into the window) the CCM is SIGKILLed and restarted. Changes made.
async fn churn(
    env: &mut Env,
    world: &mut World,
    opts: &BenchOptions,
    window: Duration,
    kills: &[Duration],
) -> anyhow::Result<u64> {
    let period = Duration::from_secs_f64(1.0 / opts.churn_rate.max(0.1));
    let mut kills = kills.iter().peekable();
    let (t0, mut ops) = (Instant::now(), 0u64);
    while t0.elapsed() < window {
        if kills.next_if(|k| t0.elapsed() >= **k).is_some() {
            env.kill_and_restart().await?;
        }
        match rand::random::<u8>() % 4 {
            0 => add_service(env, world).await,
            1 => delete_service(env, world).await,
            2 => burst(env, world, 1, opts).await.map(|_| ())?,
            _ => terminate_node(env, world).await?,
        }
        ops += 1;
        tokio::time::sleep(period).await;
    }
    for _ in kills {
        env.kill_and_restart().await?;
    }
    Ok(ops)
}

/// Adds a LoadBalancer Service; one the API server refused is not recorded.
async fn add_service(env: &Env, world: &mut World) {
    world.next_service += 1;
    let i = world.next_service;
    if env.cluster.add_service(&service_name(i)).await.is_ok() {
        world.services.insert(i);
    }
}

async fn delete_service(env: &Env, world: &mut World) {
    let Some(&i) = world
        .services
        .iter()
        .nth(rand::random::<u32>() as usize % world.services.len().max(1))
    else {
        return;
    };
    if env.cluster.delete_service(&service_name(i)).await.is_ok() {
        world.services.remove(&i);
    }
}

/// Terminates a node's instance (keeping at least two) and marks the Node's Ready Unknown: the
/// Node is the CCM's to delete.
async fn terminate_node(env: &Env, world: &mut World) -> anyhow::Result<()> {
    if world.nodes.len() <= 2 {
        return Ok(());
    }
    let pick = rand::random::<u32>() as usize % world.nodes.len();
    let Some(&i) = world.nodes.iter().nth(pick) else {
        return Ok(());
    };
    // Its kubelet is gone with it: Ready turns Unknown, as kube-controller-manager marks it.
    env.cluster.terminate_node(&node_name(i)).await?;
    world.nodes.remove(&i);
    world.gone.insert(i);
    Ok(())
}

/// Polls the invariants until they all hold or `timeout` passes: seconds it took (`None`
/// when they did not) and the last violations seen.
async fn reconverge(env: &Env, world: &World, timeout: Duration) -> (Option<f64>, Vec<String>) {
    let t0 = Instant::now();
    loop {
        let violations = match violations(env, world).await {
            Ok(v) => v,
            Err(e) => vec![format!("the cluster could not be read: {e}")],
        };
        if violations.is_empty() {
            return (Some(t0.elapsed().as_secs_f64()), violations);
        }
        if t0.elapsed() >= timeout {
            return (None, violations);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every invariant broken now, in words.
async fn violations(env: &Env, world: &World) -> anyhow::Result<Vec<String>> {
    let client = env.cluster.user_client();
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let services = Api::<Service>::namespaced(client, "default")
        .list(&ListParams::default())
        .await?
        .items;
    let mut out = node_violations(world, &nodes);
    let want_nodes: BTreeSet<String> = world.nodes.iter().map(|i| node_name(*i)).collect();
    let routes = env.cluster.cloud.routes();
    out.extend(exactly_once(
        "route",
        &want_nodes,
        routes.iter().map(|r| r.target_node.clone()),
    ));
    let want_svcs: BTreeSet<String> = world.services.iter().map(|i| service_name(*i)).collect();
    let lbs = env.cluster.cloud.load_balancers();
    out.extend(exactly_once(
        "cloud LB",
        &want_svcs,
        lbs.iter().map(|lb| lb.service_name.clone()),
    ));
    out.extend(service_violations(&want_svcs, &services));
    Ok(out)
}

fn node_violations(world: &World, nodes: &[Node]) -> Vec<String> {
    let by_name: BTreeMap<String, &Node> = nodes
        .iter()
        .filter_map(|n| Some((n.metadata.name.clone()?, n)))
        .collect();
    let mut out = Vec::new();
    for i in &world.nodes {
        match by_name.get(&node_name(*i)) {
            None => out.push(format!("{} deleted while its instance runs", node_name(*i))),
            Some(n) if !initialized(n) => out.push(format!("{} not initialized", node_name(*i))),
            Some(n) if !routed(n) => out.push(format!("{} not routed", node_name(*i))),
            Some(_) => {}
        }
    }
    for i in &world.gone {
        if by_name.contains_key(&node_name(*i)) {
            out.push(format!(
                "{} kept after its instance terminated",
                node_name(*i)
            ));
        }
    }
    out
}

/// `have` holds each of `want` exactly once and nothing else.
fn exactly_once(
    what: &str,
    want: &BTreeSet<String>,
    have: impl Iterator<Item = String>,
) -> Vec<String> {
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for h in have {
        *count.entry(h).or_default() += 1;
    }
    let mut out = Vec::new();
    for (name, n) in &count {
        if !want.contains(name) {
            out.push(format!("{what} leaked for {name}"));
        } else if *n > 1 {
            out.push(format!("{what} for {name} duplicated ({n})"));
        }
    }
    for name in want.iter().filter(|w| !count.contains_key(*w)) {
        out.push(format!("{what} missing for {name}"));
    }
    out
}

fn service_violations(want: &BTreeSet<String>, services: &[Service]) -> Vec<String> {
    let mut out = Vec::new();
    for svc in services {
        let Some(name) = svc.metadata.name.as_deref() else {
            continue;
        };
        let lb = svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer");
        if !lb {
            continue;
        }
        if !want.contains(name) {
            out.push(format!("Service {name} still there after its deletion"));
            continue;
        }
        let ingress = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref())
            .is_some_and(|i| !i.is_empty());
        if !ingress {
            out.push(format!("Service {name} has no ingress"));
        }
    }
    let present: BTreeSet<&str> = services
        .iter()
        .filter_map(|s| s.metadata.name.as_deref())
        .collect();
    for name in want.iter().filter(|w| !present.contains(w.as_str())) {
        out.push(format!("Service {name} missing"));
    }
    out
}
