//! The reference scenario: the workload of the real-server run that kube-sim's cost model is
//! fitted to (docs/BENCHMARKS.md, "The reference run"), played phase by phase, each figure
//! printed beside the real server's.
//!
//! Phases: (a) `--kubelets` clients register `--nodes` Nodes (POST, then a status PATCH, with
//! the reference run's bodies); (b) idle; (c) `--services` LoadBalancer Services from the same
//! number of clients; (d) one Node joins and the cloud's UpdateLoadBalancer count is watched
//! until stable for 20 s; (e) idle (the 5-minute address refresh falls in it); (f) one more
//! Node joins.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Serialize;

use super::BenchOptions;
use super::env::Env;
use super::report::{Percentiles, ScenarioResult, percentiles};
use super::track::{Tracker, add_services, initialized, join_one, routed, spinner};
use crate::cluster::Bodies;

/// One figure of the reference run, measured here and (at the reference run's sizes) there.
#[derive(Debug, Clone, Serialize)]
pub struct ReferenceRow {
    /// What is measured, as the reference table names it.
    pub figure: String,
    /// The real kube-apiserver + etcd's figure for ccm-rs (null at other sizes).
    pub real: Option<f64>,
    /// This run's.
    pub measured: f64,
    /// `measured / real − 1`.
    pub off: Option<f64>,
    /// True for the figures the model is fitted to (the rest are reported, not fitted).
    pub fitted: bool,
}

/// The figures, in phase order, with the real server's for ccm-rs (main 1fc782c; 1,000 Nodes,
/// 200 Services, 32 clients, 50 ms cloud): ../shared/reference/real-server-2026-11-25.md.
/// `true`: a fitted figure. The last UpdateLoadBalancer is not: the real run saw its cloud's
/// counter only through /metrics scraped every 2 s (upstream's 218 updates and ccm-rs's 400
/// were both "done after 1.47 s"), so its figure says "by 1.47 s", not when. The CCM's CPU in
/// each phase after the burst has no real figure (the real run read it after the burst and at
/// the end only): it shows where the model's end-of-run CPU goes. Nor have the connections
/// the server accepted (each a TLS handshake, from every client): they size what a dearer
/// handshake (`--api-cost-knob handshake=…`) could add to a phase.
const FIGURES: &[(&str, Option<f64>, bool)] = &[
    ("(a) the POST+PATCH pairs took, s", Some(3.39), false),
    ("(a) initialized p50, s", Some(1.09), true),
    ("(a) initialized p99, s", Some(1.40), true),
    ("(a) routed p50, s", Some(0.97), false),
    ("(a) routed p99, s", Some(1.36), true),
    ("(a) first create → last initialized, s", Some(4.36), false),
    ("(a) first create → last routed, s", Some(4.33), false),
    ("(a) cloud calls: instances_metadata", Some(52.0), false),
    ("(a) route syncs counted", Some(63.0), false),
    ("(a) CCM GET requests", Some(150.0), false),
    ("(a) CCM PATCH requests", Some(2128.0), false),
    ("(a) CCM POST requests", Some(341.0), false),
    ("(a) CCM CPU, s", Some(0.68), true),
    ("(a) connections opened to the server", None, false),
    ("(a) CCM peak RSS, MB", Some(34.0), true),
    (
        "(b) CCM POST requests in the idle window",
        Some(346.0),
        false,
    ),
    ("(b) CCM CPU in the idle window, s", None, false),
    ("(c) the Service creates took, s", Some(0.9), true),
    ("(c) ingress p50, s", Some(0.06), true),
    ("(c) ingress p99, s", Some(0.12), true),
    ("(c) CCM peak RSS, MB", Some(48.0), false),
    ("(c) CCM CPU for the Services, s", None, false),
    ("(c) connections opened to the server", None, false),
    ("(d) joined Node initialized, s", Some(0.08), true),
    ("(d) joined Node routed, s", Some(0.08), true),
    ("(d) UpdateLoadBalancer calls", Some(400.0), false),
    (
        "(d) last UpdateLoadBalancer done after, s",
        Some(1.47),
        false,
    ),
    ("(d) CCM CPU for the join, s", None, false),
    ("(e) cloud calls in the idle window", Some(3.0), false),
    ("(e) CCM CPU in the idle window, s", None, false),
    ("(f) CCM CPU for the second join, s", None, false),
    ("end: CCM CPU, s", Some(1.25), true),
    ("end: CCM peak RSS, MB", Some(58.0), true),
];

/// The figures in [`FIGURES`]' order, as this run measured them.
#[derive(Default)]
struct Measured {
    figures: BTreeMap<&'static str, f64>,
    /// The CCM's CPU seconds when the last phase ended.
    cpu_at_last_phase: f64,
}

impl Measured {
    fn set(&mut self, figure: &'static str, v: f64) {
        debug_assert!(FIGURES.iter().any(|(f, _, _)| *f == figure), "{figure}");
        self.figures.insert(figure, v);
    }

    /// Sets the phase's `figure` to the CPU the CCM spent since the last phase ended, `now`
    /// being its CPU seconds: the phases add up to the end of the run's.
    fn phase_cpu(&mut self, figure: &'static str, now: f64) {
        self.set(figure, now - self.cpu_at_last_phase);
        self.cpu_at_last_phase = now;
    }

    /// Rows beside the real figures; those only at the reference sizes.
    fn rows(&self, at_reference_size: bool) -> Vec<ReferenceRow> {
        FIGURES
            .iter()
            .filter_map(|(figure, real, fitted)| {
                let measured = *self.figures.get(figure)?;
                let real = real.filter(|_| at_reference_size);
                Some(ReferenceRow {
                    figure: figure.to_string(),
                    real,
                    measured,
                    off: real.filter(|r| *r > 0.0).map(|r| measured / r - 1.0),
                    fitted: *fitted,
                })
            })
            .collect()
    }
}

/// The reference run scraped the CCM's /metrics this often throughout, as Prometheus would;
/// each scrape is CPU and memory of the CCM's.
const SCRAPE_INTERVAL: Duration = Duration::from_secs(2);

/// Reads the CCM's /metrics every `interval` until dropped.
async fn scrape_every(env: &Env, interval: Duration) -> std::convert::Infallible {
    let mut tick = tokio::time::interval(interval);
    loop {
        tick.tick().await;
        let _ = env.http.get("/metrics").await;
    }
}

pub(super) async fn reference(opts: &BenchOptions) -> anyhow::Result<ScenarioResult> {
    let pb = spinner(&format!(
        "reference: {} nodes, idle, {} LoadBalancer Services, a join, idle, a join",
        opts.nodes, opts.services
    ));
    let started = Instant::now();
    // The reference run's cloud was in the CCM's process and took exactly 50 ms per call
    // (`fixed_ms = 50`, no jitter).
    let opts = BenchOptions {
        objects: Bodies::Reference,
        exact_cloud_latency: true,
        cloud_in_ccm: true,
        ..opts.clone()
    };
    // The reference run's CCM ran without leader election.
    let env = Env::start(&opts, opts.fault_rate, &["--leader-elect=false".into()]).await?;
    let r = tokio::select! {
        r = phases(&env, &opts) => r,
        never = scrape_every(&env, SCRAPE_INTERVAL) => match never {},
    };
    env.stop().await;
    let mut r = r?;
    r.wall_seconds = started.elapsed().as_secs_f64();
    pb.finish_and_clear();
    Ok(r)
}

async fn phases(env: &Env, opts: &BenchOptions) -> anyhow::Result<ScenarioResult> {
    let mut m = Measured::default();
    let mut r = burst(env, opts, &mut m).await?;
    let posts = || requests_by_verb(&env.cluster.ccm_requests(), "create");
    let posted = posts();
    tokio::time::sleep(opts.reference_idle.0).await;
    m.set("(b) CCM POST requests in the idle window", posts() - posted);
    m.phase_cpu("(b) CCM CPU in the idle window, s", env.usage().cpu_seconds);
    r.converged &= services(env, opts, &mut m, &mut r).await?;
    m.phase_cpu("(c) CCM CPU for the Services, s", env.usage().cpu_seconds);
    r.converged &= join_with_lbs(env, opts, &mut m, &mut r).await?;
    m.phase_cpu("(d) CCM CPU for the join, s", env.usage().cpu_seconds);
    let before: u64 = env.cloud_calls().await.values().sum();
    tokio::time::sleep(opts.reference_idle_after_join.0).await;
    let after: u64 = env.cloud_calls().await.values().sum();
    m.set(
        "(e) cloud calls in the idle window",
        (after - before) as f64,
    );
    m.phase_cpu("(e) CCM CPU in the idle window, s", env.usage().cpu_seconds);
    r.converged &= join_one(env, opts, opts.nodes + 1).await?.ok;
    let end = env.usage();
    m.phase_cpu("(f) CCM CPU for the second join, s", end.cpu_seconds);
    m.set("end: CCM CPU, s", end.cpu_seconds);
    m.set("end: CCM peak RSS, MB", end.peak_rss_mb);
    r.usage = end;
    r.cloud_calls = env.cloud_calls().await;
    let at_size = opts.nodes == 1000 && opts.services == 200 && opts.kubelets == 32;
    r.reference = m.rows(at_size);
    Ok(r)
}

/// (a): the burst, until every Node is initialized and routed.
async fn burst(env: &Env, opts: &BenchOptions, m: &mut Measured) -> anyhow::Result<ScenarioResult> {
    let client = env.cluster.user_client();
    let (init, net) = (
        Tracker::nodes(client.clone(), initialized),
        Tracker::nodes(client, routed),
    );
    let t0 = Instant::now();
    let registered = register(env, 0..opts.nodes, opts.kubelets).await?;
    let n = opts.nodes as usize;
    let converged = env
        .until(opts.timeout.0, || async {
            Ok(init.count() >= n && net.count() >= n)
        })
        .await?;
    // Time zero per Node is when its POST returned, as in the reference run.
    let created: HashMap<String, Instant> = registered
        .iter()
        .map(|(k, (posted, _))| (k.clone(), *posted))
        .collect();
    let last_registered = registered.values().map(|(_, e)| *e).max().unwrap_or(t0);
    let (ti, tr) = (
        percentiles(init.latencies(&created)),
        percentiles(net.latencies(&created)),
    );
    let last = |t: &Tracker| {
        let f = t.first.lock();
        f.values()
            .max()
            .map_or(0.0, |l| l.duration_since(t0).as_secs_f64())
    };
    m.set(
        "(a) the POST+PATCH pairs took, s",
        secs(t0, last_registered),
    );
    set_percentiles(m, ["(a) initialized p50, s", "(a) initialized p99, s"], ti);
    set_percentiles(m, ["(a) routed p50, s", "(a) routed p99, s"], tr);
    m.set("(a) first create → last initialized, s", last(&init));
    m.set("(a) first create → last routed, s", last(&net));
    let usage = env.usage();
    m.phase_cpu("(a) CCM CPU, s", usage.cpu_seconds);
    m.set(
        "(a) connections opened to the server",
        env.cluster.accepted_connections() as f64,
    );
    m.set("(a) CCM peak RSS, MB", usage.peak_rss_mb);
    let mut r = ScenarioResult {
        scenario: "reference".into(),
        converged,
        nodes: opts.nodes,
        services: opts.services,
        time_to_initialized: Some(ti),
        time_to_routed: Some(tr),
        registration_seconds: Some(secs(t0, last_registered)),
        ..Default::default()
    };
    super::track::api_stats(env, opts.nodes, &mut r).await;
    r.route_syncs = Some(env.metric("route_controller_route_sync_total").await);
    // How many batches the CCM's Nodes reached it in: the real run's watch handed them over
    // in clumps, one instances_metadata call and one route sync per clump or so.
    let calls = r
        .cloud_calls
        .get("instances_metadata")
        .copied()
        .unwrap_or(0);
    m.set("(a) cloud calls: instances_metadata", calls as f64);
    m.set("(a) route syncs counted", r.route_syncs.unwrap_or(0) as f64);
    for (figure, verb) in [
        ("(a) CCM GET requests", "get"),
        ("(a) CCM PATCH requests", "patch"),
        ("(a) CCM POST requests", "create"),
    ] {
        m.set(figure, requests_by_verb(&r.api_requests, verb));
    }
    Ok(r)
}

/// (c): Services from `--kubelets` clients, until every one has its ingress.
async fn services(
    env: &Env,
    opts: &BenchOptions,
    m: &mut Measured,
    r: &mut ScenarioResult,
) -> anyhow::Result<bool> {
    let tracker = Tracker::services(env.cluster.user_client());
    let accepted = env.cluster.accepted_connections();
    let t0 = Instant::now();
    let created = add_services(&env.cluster, "lb", opts.services, opts.kubelets).await?;
    m.set("(c) the Service creates took, s", secs(t0, Instant::now()));
    let want = created.len();
    let ok = env
        .until(opts.timeout.0, || async { Ok(tracker.count() >= want) })
        .await?;
    let p = percentiles(tracker.latencies(&created));
    set_percentiles(m, ["(c) ingress p50, s", "(c) ingress p99, s"], p);
    m.set(
        "(c) connections opened to the server",
        (env.cluster.accepted_connections() - accepted) as f64,
    );
    m.set("(c) CCM peak RSS, MB", env.usage().peak_rss_mb);
    r.time_to_ingress = Some(p);
    Ok(ok)
}

/// (d): one Node joins the cluster with its load balancers; the update count is final once it
/// has not moved for 20 s, as in the reference run.
async fn join_with_lbs(
    env: &Env,
    opts: &BenchOptions,
    m: &mut Measured,
    r: &mut ScenarioResult,
) -> anyhow::Result<bool> {
    let before = env.lb_updates().await;
    let joined = join_one(env, opts, opts.nodes).await?;
    let (seen, last_change) = env
        .lb_updates_settled(before, joined.at, Duration::from_secs(20))
        .await;
    m.set("(d) joined Node initialized, s", joined.initialized);
    m.set("(d) joined Node routed, s", joined.routed);
    m.set("(d) UpdateLoadBalancer calls", seen as f64);
    m.set(
        "(d) last UpdateLoadBalancer done after, s",
        last_change.as_secs_f64(),
    );
    r.node_join_lb_updates = Some(seen);
    r.node_join_lb_update_seconds = Some(last_change.as_secs_f64());
    Ok(joined.ok)
}

/// `kubelets` clients register Nodes `range`: per Node, when its POST returned and when its
/// status PATCH did.
async fn register(
    env: &Env,
    range: std::ops::Range<u32>,
    kubelets: usize,
) -> anyhow::Result<HashMap<String, (Instant, Instant)>> {
    futures::stream::iter(range)
        .map(|i| async move {
            let (name, posted) = env.cluster.register(i).await?;
            Ok((name, (posted, Instant::now())))
        })
        .buffer_unordered(kubelets.max(1))
        .collect::<Vec<anyhow::Result<_>>>()
        .await
        .into_iter()
        .collect()
}

/// Of the CCM's requests by `"<verb> <resource>"` (as [`SimCluster::ccm_requests`] counts
/// them), those of `verb`, over every resource.
///
/// [`SimCluster::ccm_requests`]: crate::cluster::SimCluster::ccm_requests
fn requests_by_verb(requests: &BTreeMap<String, u64>, verb: &str) -> f64 {
    requests
        .iter()
        .filter(|(k, _)| k.split(' ').next() == Some(verb))
        .map(|(_, n)| *n as f64)
        .sum()
}

fn set_percentiles(m: &mut Measured, figures: [&'static str; 2], p: Percentiles) {
    m.set(figures[0], p.p50);
    m.set(figures[1], p.p99);
}

fn secs(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64()
}
