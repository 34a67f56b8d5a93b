//! `ccm bench`: scale scenarios that measure what ccm-rs costs the API server and the cloud,
//! and how fast it converges.
//!
//! The CCM under test runs as a separate child process (`ccm run`), so its RSS and CPU come from
//! /proc for that process alone. The bench process hosts kube-sim (or talks to `--kubeconfig`)
//! and the sim cloud, served over HTTP to the child, with a per-call latency (default 50 ms).
//! Numbers are measured, never asserted: see docs/BENCHMARKS.md.

use std::collections::{BTreeMap, HashMap};
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ccm_controllers::nodeutil::{
    ConditionStatus, TAINT_UNINITIALIZED, condition_status, has_taint,
};
use ccm_manager::options::GoDuration;
use ccm_manager::scrape::Scraper;
use ccm_provider_sim::{SimCloud, SimServer};
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::json;
use tokio::process::{Child, Command};

use crate::cluster::{CLUSTER_CIDR, SimCluster, wait_until};

/// The scenarios.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    /// Many Ready nodes register at once.
    Burst,
    /// A converged cluster sits idle, once per route mode.
    Idle,
    /// Many LoadBalancer Services at once, then one node joins.
    Services,
    /// Nodes and Services come and go with injected cloud faults.
    Churn,
    /// Many nodes and Services cached: steady memory.
    Memory,
    /// One node at a time joins a quiet cluster: time to routed and initialized.
    Join,
    /// A burst of `--scale-nodes` nodes, then `--scale-services` Services (1 in 50 of them
    /// LoadBalancer): how time, requests and memory grow with the cluster.
    Scale,
}

/// How the CCM under test reconciles routes in the idle scenario (`--idle-route-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RouteMode {
    /// Watch-based route reconciliation (the default of ccm-rs).
    Watch,
    /// A route sync every `--route-reconciliation-period` (upstream's default).
    Interval,
}

impl RouteMode {
    fn name_and_gate(self) -> (&'static str, &'static str) {
        match self {
            RouteMode::Watch => ("watch", "true"),
            RouteMode::Interval => ("interval", "false"),
        }
    }
}

/// What kube-sim's requests cost (`--api-cost`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ApiCost {
    /// kube-sim as it is: requests cost microseconds (optimistic).
    Free,
    /// Server CPU burned per request and commit latency per write, calibrated to
    /// kube-apiserver + etcd on a 2-core machine (`ccm_kube_sim::cost::CostModel::calibrated`).
    Calibrated,
}

impl ApiCost {
    fn model(self) -> ccm_kube_sim::cost::CostModel {
        match self {
            ApiCost::Free => ccm_kube_sim::cost::CostModel::free(),
            ApiCost::Calibrated => ccm_kube_sim::cost::CostModel::calibrated(),
        }
    }
}

/// Flags of `ccm bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchOptions {
    /// Scenarios to run (default: all, in this order).
    #[arg(value_enum)]
    pub scenarios: Vec<Scenario>,
    /// Nodes for burst, idle and services.
    #[arg(long, default_value_t = 1000)]
    pub nodes: u32,
    /// LoadBalancer Services for the services scenario.
    #[arg(long, default_value_t = 200)]
    pub services: u32,
    /// Latency of every cloud API call.
    #[arg(long, default_value = "50ms")]
    pub cloud_latency: GoDuration,
    /// Fraction of cloud calls that fail (churn uses at least 0.1).
    #[arg(long, default_value_t = 0.0)]
    pub fault_rate: f64,
    /// Quiet window of the idle scenario, per route mode (`1h`: the soak).
    #[arg(long, default_value = "120s")]
    pub idle_window: GoDuration,
    /// Route modes of the idle scenario (repeatable; default: watch, then interval).
    #[arg(long = "idle-route-mode", value_enum)]
    pub idle_route_modes: Vec<RouteMode>,
    /// How long the churn scenario changes things.
    #[arg(long, default_value = "60s")]
    pub churn_duration: GoDuration,
    /// Changes per second during churn.
    #[arg(long, default_value_t = 5.0)]
    pub churn_rate: f64,
    /// Nodes cached in the memory scenario.
    #[arg(long, default_value_t = 5000)]
    pub memory_nodes: u32,
    /// Services cached in the memory scenario.
    #[arg(long, default_value_t = 5000)]
    pub memory_services: u32,
    /// kube-sim cost modes to run every scenario in (repeatable; default: free, then
    /// calibrated). Ignored with --kubeconfig.
    #[arg(long = "api-cost", value_enum)]
    pub api_cost: Vec<ApiCost>,
    /// Multiplies the calibrated model's server CPU per request: to re-calibrate it against
    /// another machine's kube-apiserver, or to ask how the figures move with a slower server.
    #[arg(long, default_value_t = 1.0)]
    pub api_cost_scale: f64,
    /// Nodes registering at once in the scale scenario.
    #[arg(long, default_value_t = 5000)]
    pub scale_nodes: u32,
    /// Services created after the scale scenario's burst (every 50th a LoadBalancer).
    #[arg(long, default_value_t = 10000)]
    pub scale_services: u32,
    /// Simulated kubelets registering concurrently (the issue 17 real-server runs used 32).
    #[arg(long, default_value_t = 32)]
    pub kubelets: usize,
    /// Nodes joining one at a time in the join scenario.
    #[arg(long, default_value_t = 10)]
    pub joins: u32,
    /// Give up on a convergence wait after this long.
    #[arg(long, default_value = "600s")]
    pub timeout: GoDuration,
    /// Run against this API server instead of an in-process kube-sim (no request accounting).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The CCM binary to test (default: `ccm-controller-manager` beside this binary, the one
    /// the image runs; this binary when that is missing).
    #[arg(long)]
    pub ccm_bin: Option<PathBuf>,
    /// Extra flag for the CCM under test (repeatable), e.g. --ccm-arg=--kube-api-qps=20.
    #[arg(long = "ccm-arg", allow_hyphen_values = true)]
    pub ccm_args: Vec<String>,
    /// Append the CCM under test's log here (default: a temporary file removed afterwards).
    #[arg(long)]
    pub ccm_log: Option<PathBuf>,
    /// Write results as JSON (one object per scenario).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write SVG charts into this directory.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// The cost mode of the scenario being run (set per run from `api_cost`).
    #[arg(skip = ApiCost::Free)]
    pub cost: ApiCost,
}

/// Latency percentiles in seconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Slowest.
    pub max: f64,
}

fn percentiles(mut v: Vec<f64>) -> Percentiles {
    if v.is_empty() {
        return Percentiles::default();
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1];
    Percentiles {
        p50: at(0.5),
        p99: at(0.99),
        max: v[v.len() - 1],
    }
}

/// Resource use of the CCM child.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Usage {
    /// Peak resident set size, MB.
    pub peak_rss_mb: f64,
    /// Resident set size at the end, MB.
    pub rss_mb: f64,
    /// CPU seconds used.
    pub cpu_seconds: f64,
    /// Of `rss_mb`: anonymous memory (heap, stacks), MB.
    pub rss_anon_mb: f64,
    /// Of `rss_mb`: file-backed pages (mostly the binary's code), MB.
    pub rss_file_mb: f64,
}

/// One scenario's results (fields depend on the scenario; absent ones are null).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ScenarioResult {
    /// Which scenario.
    pub scenario: String,
    /// kube-sim's cost mode (`free` or `calibrated`; null against another API server).
    pub api_cost: Option<ApiCost>,
    /// Did it converge?
    pub converged: bool,
    /// Nodes involved.
    pub nodes: u32,
    /// Services involved.
    pub services: u32,
    /// Per-node time from creation to initialized.
    pub time_to_initialized: Option<Percentiles>,
    /// Seconds from the first kubelet's POST to the last kubelet's status PATCH returning
    /// (burst): what the API server's write path costs, whatever the CCM does.
    pub registration_seconds: Option<f64>,
    /// Seconds until every node had its routes (burst).
    pub all_routes_seconds: Option<f64>,
    /// Per-node time from creation to `NetworkUnavailable=False` (routed).
    pub time_to_routed: Option<Percentiles>,
    /// Per-node time from creation until both initialized and routed (ready for pods).
    pub time_to_ready: Option<Percentiles>,
    /// Seconds from the last kubelet registration's end (create + status) to the last node
    /// both initialized and routed.
    pub last_ready_after_last_registration_seconds: Option<f64>,
    /// Per-Service time from creation to ingress.
    pub time_to_ingress: Option<Percentiles>,
    /// Seconds until every Service had ingress.
    pub all_ingress_seconds: Option<f64>,
    /// Node join: seconds until every LB had the new host.
    pub node_join_lb_update_seconds: Option<f64>,
    /// Node join: UpdateLoadBalancer calls.
    pub node_join_lb_updates: Option<u64>,
    /// Successful CCM writes to nodes (incl. status) per node.
    pub api_node_writes_per_node: Option<f64>,
    /// Successful CCM writes of any kind (incl. events) per node.
    pub api_writes_per_node: Option<f64>,
    /// CCM requests by "verb resource".
    pub api_requests: BTreeMap<String, u64>,
    /// CCM requests per node by verb (reads included), all resources.
    pub api_requests_per_node: BTreeMap<String, f64>,
    /// CCM CPU seconds per 1,000 nodes of the scenario.
    pub cpu_seconds_per_1000_nodes: Option<f64>,
    /// Cloud calls by operation.
    pub cloud_calls: BTreeMap<String, u64>,
    /// Idle: per route mode, extrapolated per hour.
    pub idle: Vec<IdleResult>,
    /// Churn: seconds from the end of churn to convergence.
    pub churn_convergence_lag_seconds: Option<f64>,
    /// Churn: cloud LBs without a LoadBalancer Service.
    pub leaked_load_balancers: Option<usize>,
    /// Churn: LoadBalancer Services without a cloud LB or ingress.
    pub missing_load_balancers: Option<usize>,
    /// Churn: routes for nodes that do not exist.
    pub leaked_routes: Option<usize>,
    /// Churn: changes made.
    pub churn_operations: Option<u64>,
    /// CCM child resource use.
    pub usage: Usage,
    /// Wall time of the scenario.
    pub wall_seconds: f64,
}

/// Idle scenario numbers for one route mode.
#[derive(Debug, Clone, Default, Serialize)]
pub struct IdleResult {
    /// `watch` or `interval`.
    pub route_mode: String,
    /// Window measured, seconds.
    pub window_seconds: f64,
    /// Cloud calls per hour (extrapolated).
    pub cloud_calls_per_hour: f64,
    /// CCM API requests per hour, excluding leader-election lease traffic.
    pub api_requests_per_hour: f64,
    /// Leader-election lease requests per hour.
    pub lease_requests_per_hour: f64,
    /// route_controller_route_sync_total delta over the window.
    pub route_syncs: u64,
    /// CCM RSS at the start and at the end of the window, MB (growth at rest shows here).
    pub rss_start_mb: f64,
    /// See `rss_start_mb`.
    pub rss_end_mb: f64,
    /// Highest RSS sampled (every second) during the window, MB.
    pub rss_max_mb: f64,
    /// CCM CPU seconds spent during the window.
    pub cpu_seconds: f64,
    /// Seconds waited after the setup until the CCM's API requests (Events of the setup,
    /// mostly) stopped, before the window started (null against another API server).
    pub drain_seconds: Option<f64>,
    /// RSS every 10 s of the window: (seconds into it, RSS MB, anonymous MB).
    pub rss_timeline: Vec<(f64, f64, f64)>,
    /// Cumulative cloud calls sampled each second (for the chart).
    #[serde(skip)]
    pub timeline: Vec<(f64, u64)>,
}

/// The CCM under test, as a child process, with the sim cloud served to it.
struct Env {
    cluster: SimCluster,
    server: SimServer,
    child: Child,
    pid: u32,
    http: Scraper,
}

/// The bearer token of the kubeconfig's current user, to scrape the CCM's /metrics with (the
/// CCM confirms it with a TokenReview; kube-sim's admin is in system:masters).
fn bearer_token(kubeconfig: &Path) -> Option<String> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).ok()?;
    let ctx_name = kc.current_context.clone()?;
    let ctx = kc
        .contexts
        .iter()
        .find(|c| c.name == ctx_name)?
        .context
        .clone()?;
    let user = kc
        .auth_infos
        .iter()
        .find(|a| a.name == ctx.user.clone().unwrap_or_default())?;
    // kube keeps tokens in a SecretString; its serializer writes the value back out.
    let info = serde_json::to_value(user.auth_info.as_ref()?).ok()?;
    info.get("token")?.as_str().map(String::from)
}

/// A `kB` field of /proc/<pid>/status, in kB (0 when absent).
fn status_kb(status: &str, field: &str) -> f64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// The binary an operator runs: `ccm-controller-manager` beside this one (the image's binary:
/// the CCM without the tools, so its code pages are what production maps). A `cargo run` of
/// `ccm` alone may not have built it; then this binary's `ccm run` is measured, with a warning,
/// because its resident set includes the tools' code.
fn ccm_under_test() -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe().context("locating the ccm binary")?;
    let slim = me.with_file_name("ccm-controller-manager");
    if slim.is_file() {
        return Ok(slim);
    }
    eprintln!(
        "bench: {} not found (build it: cargo build --release -p ccm); measuring `{} run`, \
         whose RSS includes the code of the tools",
        slim.display(),
        me.display()
    );
    Ok(me)
}

fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

fn sim_cloud(opts: &BenchOptions, fault_rate: f64) -> anyhow::Result<SimCloud> {
    crate::cluster::sim_cloud(7, opts.cloud_latency.0, 10, fault_rate)
}

impl Env {
    async fn start(opts: &BenchOptions, fault_rate: f64, extra: &[String]) -> anyhow::Result<Env> {
        let cloud = sim_cloud(opts, fault_rate)?;
        let cluster = match &opts.kubeconfig {
            Some(path) => SimCluster::connect(path, cloud.clone()).await?,
            None => SimCluster::start(cloud.clone()).await?,
        };
        if let Some(kube) = &cluster.kube {
            kube.set_cost_model(opts.cost.model().cpu_scaled(opts.api_cost_scale));
        }
        let server = SimServer::start(cloud, SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let dir = cluster
            .kubeconfig
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(std::env::temp_dir);
        let cloud_config = dir.join(format!("bench-cloud-{}.toml", rand::random::<u32>()));
        std::fs::write(
            &cloud_config,
            format!(
                "endpoint = \"{}\"\nactor = \"ccm-under-test\"\n",
                server.endpoint()
            ),
        )?;
        let port = free_port()?;
        let cert_dir = dir.join(format!("bench-certs-{}", rand::random::<u32>()));
        let bin = match &opts.ccm_bin {
            Some(b) => b.clone(),
            None => ccm_under_test()?,
        };
        let log_path = opts.ccm_log.clone().unwrap_or_else(|| dir.join("ccm.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("--ccm-log {}", log_path.display()))?;
        let mut cmd = Command::new(&bin);
        cmd.arg("run")
            .arg("--cloud-provider=sim")
            .arg(format!("--cloud-config={}", cloud_config.display()))
            .arg(format!("--kubeconfig={}", cluster.kubeconfig.display()))
            .arg(format!("--cluster-cidr={CLUSTER_CIDR}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={port}"))
            .arg(format!("--cert-dir={}", cert_dir.display()))
            .arg("-v=1")
            .args(&opts.ccm_args)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = child.id().context("child pid")?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let token = bearer_token(&cluster.kubeconfig);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut http = None;
        let mut ready = false;
        while !ready && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if let Ok(s) = Scraper::for_cert_dir(addr, &cert_dir, token.clone()) {
                ready = matches!(s.get("/readyz").await, Ok((200, _)));
                http = Some(s);
            }
        }
        let (true, Some(http)) = (ready, http) else {
            anyhow::bail!(
                "the CCM under test did not become ready within 60s (log: {})",
                log_path.display()
            );
        };
        Ok(Env {
            cluster,
            server,
            child,
            pid,
            http,
        })
    }

    fn usage(&self) -> Usage {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap_or_default();
        ccm_manager::procfs::read_pid(self.pid)
            .map(|p| Usage {
                peak_rss_mb: p.peak_rss_bytes as f64 / 1e6,
                rss_mb: p.rss_bytes as f64 / 1e6,
                cpu_seconds: p.cpu_seconds,
                rss_anon_mb: status_kb(&status, "RssAnon:") / 1e3,
                rss_file_mb: status_kb(&status, "RssFile:") / 1e3,
            })
            .unwrap_or_default()
    }

    async fn metric(&self, prefix: &str) -> u64 {
        let Ok((200, body)) = self.http.get("/metrics").await else {
            return 0;
        };
        body.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
            .sum::<f64>() as u64
    }

    fn cloud_calls(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for ((op, _), n) in self.cluster.cloud.calls() {
            *out.entry(op).or_default() += n;
        }
        out
    }

    async fn stop(mut self) {
        #[cfg(unix)]
        {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(self.pid.to_string())
                .status()
                .await;
            let _ = tokio::time::timeout(Duration::from_secs(15), self.child.wait()).await;
        }
        let _ = self.child.kill().await;
        let _ = self.server.shutdown().await;
    }
}

/// Records when each object first satisfied a predicate, from a watch.
struct Tracker {
    first: Arc<Mutex<HashMap<String, Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Tracker {
    /// Watches every object of kind `K` and notes when each first satisfies `pred`.
    fn watch<K>(client: kube::Client, pred: fn(&K) -> bool) -> Self
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug
            + Send
            + 'static,
    {
        let first: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
        let f = first.clone();
        let task = tokio::spawn(async move {
            // Backoff matters: without it a watch error (the API server going away at the end of
            // a scenario) is retried in a tight loop that never yields to the runtime.
            let stream = watcher::watcher(Api::<K>::all(client), watcher::Config::default())
                .default_backoff();
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                let obj = match ev {
                    Ok(watcher::Event::Apply(o)) | Ok(watcher::Event::InitApply(o)) => o,
                    _ => continue,
                };
                if pred(&obj)
                    && let Some(name) = obj.meta().name.clone()
                {
                    f.lock().entry(name).or_insert_with(Instant::now);
                }
            }
        });
        Tracker { first, task }
    }

    fn nodes(client: kube::Client, pred: fn(&Node) -> bool) -> Self {
        Self::watch(client, pred)
    }

    fn services(client: kube::Client) -> Self {
        Self::watch::<Service>(client, |svc| {
            svc.status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|l| l.ingress.as_ref())
                .is_some_and(|i| !i.is_empty())
        })
    }

    fn count(&self) -> usize {
        self.first.lock().len()
    }

    fn latencies(&self, created: &HashMap<String, Instant>) -> Vec<f64> {
        let first = self.first.lock();
        created
            .iter()
            .filter_map(|(n, c)| {
                first
                    .get(n)
                    .map(|f| f.saturating_duration_since(*c).as_secs_f64())
            })
            .collect()
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn initialized(n: &Node) -> bool {
    !has_taint(n, TAINT_UNINITIALIZED)
        && n.spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .is_some_and(|p| !p.is_empty())
}

fn spinner(msg: &str) -> ProgressBar {
    if std::io::stderr().is_terminal() {
        let pb = ProgressBar::new_spinner();
        pb.set_style(
            ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        pb.set_message(msg.to_string());
        pb.enable_steady_tick(Duration::from_millis(120));
        pb
    } else {
        eprintln!("bench: {msg}");
        ProgressBar::hidden()
    }
}

/// Registers nodes `range` concurrently; returns each node's creation instant.
async fn add_nodes(
    cluster: &SimCluster,
    range: std::ops::Range<u32>,
    kubelets: usize,
) -> anyhow::Result<HashMap<String, Instant>> {
    Ok(register_nodes(cluster, range, kubelets)
        .await?
        .into_iter()
        .map(|(n, (start, _))| (n, start))
        .collect())
}

/// Registers nodes `range` concurrently; returns when each kubelet started (just before its
/// POST) and finished (after its status PATCH).
async fn register_nodes(
    cluster: &SimCluster,
    range: std::ops::Range<u32>,
    kubelets: usize,
) -> anyhow::Result<HashMap<String, (Instant, Instant)>> {
    let results: Vec<anyhow::Result<(String, (Instant, Instant))>> = futures::stream::iter(range)
        .map(|i| async move {
            let t = Instant::now();
            let name = cluster.add_node(i).await?;
            Ok((name, (t, Instant::now())))
        })
        .buffer_unordered(kubelets.max(1))
        .collect()
        .await;
    results.into_iter().collect()
}

/// `NetworkUnavailable=False`: the route controller (or the fold) says the node is routed.
fn routed(n: &Node) -> bool {
    condition_status(n, "NetworkUnavailable") == ConditionStatus::False
}

async fn add_services(
    cluster: &SimCluster,
    prefix: &str,
    n: u32,
) -> anyhow::Result<HashMap<String, Instant>> {
    let results: Vec<anyhow::Result<(String, Instant)>> = futures::stream::iter(0..n)
        .map(|i| async move {
            let name = format!("{prefix}-{i}");
            let t = Instant::now();
            cluster.add_service(&name).await?;
            Ok((name, t))
        })
        .buffer_unordered(64)
        .collect()
        .await;
    results.into_iter().collect()
}

fn api_stats(env: &Env, nodes: u32, r: &mut ScenarioResult) {
    if env.cluster.kube.is_some() && nodes > 0 {
        r.api_node_writes_per_node =
            Some(env.cluster.ccm_writes(Some("nodes")) as f64 / f64::from(nodes));
        r.api_writes_per_node = Some(env.cluster.ccm_writes(None) as f64 / f64::from(nodes));
    }
    r.api_requests = env.cluster.ccm_requests();
    if nodes > 0 {
        r.api_requests_per_node = per_node_by_verb(&r.api_requests, nodes);
    }
    r.cloud_calls = env.cloud_calls();
}

/// `"verb resource" → count` folded to `verb → count per node`, leader-election leases left
/// out (they cost the same whatever the cluster size).
fn per_node_by_verb(requests: &BTreeMap<String, u64>, nodes: u32) -> BTreeMap<String, f64> {
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    for (key, n) in requests {
        let mut parts = key.split(' ');
        let (Some(verb), Some(resource)) = (parts.next(), parts.next()) else {
            continue;
        };
        if resource.starts_with("leases") {
            continue;
        }
        *out.entry(verb.to_string()).or_default() += *n as f64 / f64::from(nodes);
    }
    out
}

/// Per node: time from its kubelet's first request until both `a` and `b` had happened.
fn both_latencies(
    a: &Tracker,
    b: &Tracker,
    started: &HashMap<String, Instant>,
) -> (Vec<f64>, Option<Instant>) {
    let (fa, fb) = (a.first.lock(), b.first.lock());
    let mut last = None;
    let v = started
        .iter()
        .filter_map(|(n, c)| {
            let done = (*fa.get(n)?).max(*fb.get(n)?);
            last = Some(last.map_or(done, |l: Instant| l.max(done)));
            Some(done.saturating_duration_since(*c).as_secs_f64())
        })
        .collect();
    (v, last)
}

async fn burst(
    opts: &BenchOptions,
    timeline: &mut Vec<(f64, usize)>,
) -> anyhow::Result<ScenarioResult> {
    let pb = spinner(&format!("burst: {} nodes register at once", opts.nodes));
    let started = Instant::now();
    let env = Env::start(opts, opts.fault_rate, &[]).await?;
    let r = burst_on(&env, opts, opts.nodes, timeline).await;
    env.stop().await;
    let mut r = r?;
    r.wall_seconds = started.elapsed().as_secs_f64();
    pb.finish_and_clear();
    Ok(r)
}

/// `nodes` kubelets register at once on `env`; times, requests and usage of the burst.
async fn burst_on(
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
                if routes_at.is_some() && init.count() >= n {
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
    let converged = wait_until(opts.timeout.0, || async {
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
        registration_seconds: last_registered.map(|l| l.duration_since(t0).as_secs_f64()),
        all_routes_seconds: routes_at,
        ..Default::default()
    };
    api_stats(env, nodes, &mut r);
    r.usage = env.usage();
    r.cpu_seconds_per_1000_nodes = Some(r.usage.cpu_seconds * 1000.0 / f64::from(nodes));
    Ok(r)
}

/// A large burst, then many Services (every 50th a LoadBalancer) on the same CCM: the burst's
/// figures at scale plus time to ingress among 10,000 Services and the memory of it all.
async fn scale(opts: &BenchOptions) -> anyhow::Result<ScenarioResult> {
    let pb = spinner(&format!(
        "scale: {} nodes register at once, then {} Services",
        opts.scale_nodes, opts.scale_services
    ));
    let started = Instant::now();
    let env = Env::start(opts, opts.fault_rate, &[]).await?;
    let r = scale_on(&env, opts).await;
    env.stop().await;
    let mut r = r?;
    r.wall_seconds = started.elapsed().as_secs_f64();
    pb.finish_and_clear();
    Ok(r)
}

async fn scale_on(env: &Env, opts: &BenchOptions) -> anyhow::Result<ScenarioResult> {
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
                if i % 50 == 0 {
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
    r.converged &= wait_until(opts.timeout.0, || async { Ok(tracker.count() >= lbs) }).await?;
    r.all_ingress_seconds = Some(t0.elapsed().as_secs_f64());
    r.time_to_ingress = Some(percentiles(tracker.latencies(&created)));
    r.services = opts.scale_services;
    // Let caches settle before reading the steady state.
    tokio::time::sleep(Duration::from_secs(3)).await;
    api_stats(env, opts.scale_nodes, &mut r);
    r.usage = env.usage();
    r.cpu_seconds_per_1000_nodes = Some(burst_cpu * 1000.0 / f64::from(opts.scale_nodes));
    Ok(r)
}

async fn idle(opts: &BenchOptions) -> anyhow::Result<ScenarioResult> {
    let started = Instant::now();
    let mut r = ScenarioResult {
        scenario: "idle".into(),
        nodes: opts.nodes,
        converged: true,
        ..Default::default()
    };
    let mut modes = opts.idle_route_modes.clone();
    if modes.is_empty() {
        modes = vec![RouteMode::Watch, RouteMode::Interval];
    }
    for (mode, gate) in modes.into_iter().map(RouteMode::name_and_gate) {
        let pb = spinner(&format!(
            "idle ({mode} routes): {} nodes, then a {} quiet window",
            opts.nodes, opts.idle_window
        ));
        let extra = vec![format!(
            "--feature-gates=CloudControllerManagerWatchBasedRoutesReconciliation={gate}"
        )];
        let env = Env::start(opts, 0.0, &extra).await?;
        let n = opts.nodes as usize;
        add_nodes(&env.cluster, 0..opts.nodes, opts.kubelets).await?;
        let ok = wait_until(opts.timeout.0, || async {
            let s = env.cluster.state().await?;
            Ok(s.initialized == n && s.network_ready == n && s.routes == n)
        })
        .await?;
        r.converged &= ok;
        // The LB phase before the quiet window, as in the issue 17 real-server soak.
        add_services(&env.cluster, "idle-lb", opts.services).await?;
        let m = opts.services as usize;
        r.converged &= wait_until(opts.timeout.0, || async {
            let s = env.cluster.state().await?;
            Ok(s.with_ingress == m)
        })
        .await?;
        // Let trailing work (events, the last sync) finish before the window starts.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let drain_seconds = drain_requests(&env, opts.timeout.0).await;
        env.cluster.cloud.reset_calls();
        if let Some(k) = &env.cluster.kube {
            k.reset_requests();
        }
        let syncs_before = env.metric("route_controller_route_sync_total").await;
        let at_start = env.usage();
        let window = opts.idle_window.0;
        let t0 = Instant::now();
        let mut timeline = Vec::new();
        let mut rss_max = at_start.rss_mb;
        let mut rss_timeline = Vec::new();
        let mut next_rss_sample = Duration::ZERO;
        while t0.elapsed() < window {
            let (at, usage) = (t0.elapsed(), env.usage());
            timeline.push((at.as_secs_f64(), env.cluster.cloud.total_calls()));
            rss_max = rss_max.max(usage.rss_mb);
            if at >= next_rss_sample {
                rss_timeline.push((at.as_secs_f64(), usage.rss_mb, usage.rss_anon_mb));
                next_rss_sample += Duration::from_secs(10);
            }
            tokio::time::sleep(Duration::from_secs(1).min(window)).await;
        }
        let secs = t0.elapsed().as_secs_f64();
        timeline.push((secs, env.cluster.cloud.total_calls()));
        let at_end = env.usage();
        rss_timeline.push((secs, at_end.rss_mb, at_end.rss_anon_mb));
        let per_hour = |n: u64| n as f64 * 3600.0 / secs;
        let requests = env.cluster.ccm_requests();
        let lease: u64 = requests
            .iter()
            .filter(|(k, _)| k.contains("leases"))
            .map(|(_, v)| v)
            .sum();
        let other: u64 = requests
            .iter()
            .filter(|(k, _)| !k.contains("leases"))
            .map(|(_, v)| v)
            .sum();
        let syncs = env
            .metric("route_controller_route_sync_total")
            .await
            .saturating_sub(syncs_before);
        r.idle.push(IdleResult {
            route_mode: mode.into(),
            window_seconds: secs,
            cloud_calls_per_hour: per_hour(env.cluster.cloud.total_calls()),
            api_requests_per_hour: per_hour(other),
            lease_requests_per_hour: per_hour(lease),
            route_syncs: syncs,
            timeline,
            rss_start_mb: at_start.rss_mb,
            rss_end_mb: at_end.rss_mb,
            rss_max_mb: rss_max,
            cpu_seconds: at_end.cpu_seconds - at_start.cpu_seconds,
            drain_seconds,
            rss_timeline,
        });
        r.usage = env.usage();
        env.stop().await;
        pb.finish_and_clear();
    }
    r.wall_seconds = started.elapsed().as_secs_f64();
    Ok(r)
}

/// Waits until the CCM has made no API request but leader election's for 10 s (the setup's
/// Events drain through their client's rate limit for a while), so an idle window measures
/// rest, not the tail of the setup. Seconds waited; `None` without kube-sim's counters.
async fn drain_requests(env: &Env, timeout: Duration) -> Option<f64> {
    env.cluster.kube.as_ref()?;
    let non_lease = || -> u64 {
        env.cluster
            .ccm_requests()
            .iter()
            .filter(|(k, _)| !k.contains("leases"))
            .map(|(_, v)| v)
            .sum()
    };
    let (started, mut last, mut quiet_since) = (Instant::now(), non_lease(), Instant::now());
    while quiet_since.elapsed() < Duration::from_secs(10) && started.elapsed() < timeout {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = non_lease();
        if now != last {
            (last, quiet_since) = (now, Instant::now());
        }
    }
    Some(started.elapsed().as_secs_f64())
}

async fn services(opts: &BenchOptions) -> anyhow::Result<ScenarioResult> {
    let pb = spinner(&format!(
        "services: {} LoadBalancer Services at once",
        opts.services
    ));
    let started = Instant::now();
    let env = Env::start(opts, opts.fault_rate, &[]).await?;
    let n = opts.nodes as usize;
    add_nodes(&env.cluster, 0..opts.nodes, opts.kubelets).await?;
    let mut converged = wait_until(opts.timeout.0, || async {
        Ok(env.cluster.state().await?.initialized == n)
    })
    .await?;
    let tracker = Tracker::services(env.cluster.user_client());
    let t0 = Instant::now();
    let created = add_services(&env.cluster, "lb", opts.services).await?;
    let m = opts.services as usize;
    let all = wait_until(opts.timeout.0, || async { Ok(tracker.count() >= m) }).await?;
    let all_ingress = t0.elapsed().as_secs_f64();
    converged &= all;
    let updates_before = env
        .cluster
        .cloud
        .call_count(ccm_cloud::op::UPDATE_LOAD_BALANCER);
    let t1 = Instant::now();
    env.cluster.add_node(opts.nodes).await?;
    let joined = wait_until(opts.timeout.0, || async {
        let hosts = env.cluster.cloud.load_balancer_host_counts();
        Ok(hosts.len() == m && hosts.iter().all(|h| *h == n + 1))
    })
    .await?;
    converged &= joined;
    let mut r = ScenarioResult {
        scenario: "services".into(),
        converged,
        nodes: opts.nodes,
        services: opts.services,
        time_to_ingress: Some(percentiles(tracker.latencies(&created))),
        all_ingress_seconds: Some(all_ingress),
        node_join_lb_update_seconds: Some(t1.elapsed().as_secs_f64()),
        node_join_lb_updates: Some(
            env.cluster
                .cloud
                .call_count(ccm_cloud::op::UPDATE_LOAD_BALANCER)
                - updates_before,
        ),
        ..Default::default()
    };
    api_stats(&env, 0, &mut r);
    r.usage = env.usage();
    env.stop().await;
    r.wall_seconds = started.elapsed().as_secs_f64();
    pb.finish_and_clear();
    Ok(r)
}

async fn churn(opts: &BenchOptions) -> anyhow::Result<ScenarioResult> {
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
    let converged = wait_until(opts.timeout.0, || async {
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
    api_stats(&env, 0, &mut r);
    r.usage = env.usage();
    env.stop().await;
    r.wall_seconds = started.elapsed().as_secs_f64();
    pb.finish_and_clear();
    Ok(r)
}

async fn memory(opts: &BenchOptions) -> anyhow::Result<ScenarioResult> {
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
    let converged = wait_until(opts.timeout.0, || async {
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
    api_stats(&env, opts.memory_nodes, &mut r);
    env.stop().await;
    r.wall_seconds = started.elapsed().as_secs_f64();
    pb.finish_and_clear();
    Ok(r)
}

/// Nodes joining a quiet cluster one at a time: each is timed from its kubelet's first
/// request to routed and to initialized.
async fn join(opts: &BenchOptions) -> anyhow::Result<ScenarioResult> {
    let base = opts.nodes.min(100);
    let joins = opts.joins.max(1);
    let pb = spinner(&format!(
        "join: {joins} nodes join a quiet {base}-node cluster, one at a time"
    ));
    let started = Instant::now();
    let env = Env::start(opts, 0.0, &[]).await?;
    add_nodes(&env.cluster, 0..base, opts.kubelets).await?;
    let b = base as usize;
    let mut converged = wait_until(opts.timeout.0, || async {
        let s = env.cluster.state().await?;
        Ok(s.initialized == b && s.network_ready == b && s.routes == b)
    })
    .await?;
    let client = env.cluster.user_client();
    let init = Tracker::nodes(client.clone(), initialized);
    let net = Tracker::nodes(client, routed);
    let mut created = HashMap::new();
    for i in base..base + joins {
        // Quiet: let the previous join's trailing writes (its Event) settle first.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let t = Instant::now();
        let name = env.cluster.add_node(i).await?;
        created.insert(name.clone(), t);
        converged &= wait_until(opts.timeout.0, || async {
            let (i, r) = (init.first.lock(), net.first.lock());
            Ok(i.contains_key(&name) && r.contains_key(&name))
        })
        .await?;
    }
    let (ready, _) = both_latencies(&init, &net, &created);
    let mut r = ScenarioResult {
        scenario: "join".into(),
        converged,
        nodes: joins,
        time_to_initialized: Some(percentiles(init.latencies(&created))),
        time_to_routed: Some(percentiles(net.latencies(&created))),
        time_to_ready: Some(percentiles(ready)),
        ..Default::default()
    };
    r.usage = env.usage();
    r.cloud_calls = env.cloud_calls();
    env.stop().await;
    r.wall_seconds = started.elapsed().as_secs_f64();
    pb.finish_and_clear();
    Ok(r)
}

async fn add_cluster_ip_services(cluster: &SimCluster, n: u32) -> anyhow::Result<()> {
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(0..n)
        .map(|i| async move { cluster.add_cluster_ip_service(&format!("cip-{i}")).await })
        .buffer_unordered(64)
        .collect()
        .await;
    results.into_iter().collect()
}

fn print_table(results: &[ScenarioResult]) {
    let f = |v: Option<f64>| v.map(|x| format!("{x:.2}")).unwrap_or_else(|| "—".into());
    for r in results {
        println!(
            "\n== {} [{} API] ({}; {:.0}s)",
            r.scenario,
            r.api_cost
                .map(|c| format!("{c:?}").to_lowercase())
                .unwrap_or_else(|| "external".into()),
            if r.converged {
                "converged"
            } else {
                "NOT converged"
            },
            r.wall_seconds
        );
        if let Some(p) = r.time_to_initialized {
            println!(
                "  time to initialized     p50 {:.2}s  p99 {:.2}s  max {:.2}s",
                p.p50, p.p99, p.max
            );
        }
        if let Some(p) = r.time_to_routed {
            println!(
                "  time to routed          p50 {:.2}s  p99 {:.2}s  max {:.2}s",
                p.p50, p.p99, p.max
            );
        }
        if let Some(p) = r.time_to_ready {
            println!(
                "  initialized and routed  p50 {:.2}s  p99 {:.2}s  max {:.2}s",
                p.p50, p.p99, p.max
            );
        }
        if r.last_ready_after_last_registration_seconds.is_some() {
            println!(
                "  last node ready         {}s after the last registration",
                f(r.last_ready_after_last_registration_seconds)
            );
        }
        if r.registration_seconds.is_some() {
            println!(
                "  kubelet registrations   {}s (create + status of every node)",
                f(r.registration_seconds)
            );
        }
        if r.all_routes_seconds.is_some() {
            println!("  all routes              {}s", f(r.all_routes_seconds));
        }
        if let Some(p) = r.time_to_ingress {
            println!(
                "  time to ingress         p50 {:.3}s  p99 {:.3}s  max {:.3}s (all {}s)",
                p.p50,
                p.p99,
                p.max,
                f(r.all_ingress_seconds)
            );
        }
        if r.node_join_lb_update_seconds.is_some() {
            println!(
                "  node join → LBs updated {}s with {} UpdateLoadBalancer calls",
                f(r.node_join_lb_update_seconds),
                r.node_join_lb_updates.unwrap_or(0)
            );
        }
        if r.api_writes_per_node.is_some() {
            println!(
                "  API writes per node     {} to nodes, {} in total (incl. events)",
                f(r.api_node_writes_per_node),
                f(r.api_writes_per_node)
            );
        }
        if !r.api_requests_per_node.is_empty() {
            let by: Vec<String> = r
                .api_requests_per_node
                .iter()
                .map(|(k, v)| format!("{k} {v:.3}"))
                .collect();
            println!("  API requests per node   {}", by.join(", "));
        }
        for i in &r.idle {
            println!(
                "  idle [{:<8}] cloud calls/h {:>8.1}  API requests/h {:>8.1} (+{:.0} lease)  route syncs {}  RSS {:.1} → {:.1} MB (max {:.1}) over {:.0}s, CPU {:.2}s{}",
                i.route_mode,
                i.cloud_calls_per_hour,
                i.api_requests_per_hour,
                i.lease_requests_per_hour,
                i.route_syncs,
                i.rss_start_mb,
                i.rss_end_mb,
                i.rss_max_mb,
                i.window_seconds,
                i.cpu_seconds,
                i.drain_seconds
                    .map(|d| format!(" (started after {d:.0}s of setup requests draining)"))
                    .unwrap_or_default()
            );
        }
        if let Some(lag) = r.churn_convergence_lag_seconds {
            println!(
                "  churn {} ops; converged {:.2}s after; leaked LBs {}, missing LBs {}, leaked routes {}",
                r.churn_operations.unwrap_or(0),
                lag,
                r.leaked_load_balancers.unwrap_or(0),
                r.missing_load_balancers.unwrap_or(0),
                r.leaked_routes.unwrap_or(0)
            );
        }
        if !r.cloud_calls.is_empty() {
            let total: u64 = r.cloud_calls.values().sum();
            let by: Vec<String> = r
                .cloud_calls
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            println!("  cloud calls             {total}: {}", by.join(", "));
        }
        println!(
            "  CCM                     peak RSS {:.1} MB, RSS {:.1} MB ({:.1} anon + {:.1} file), CPU {:.2}s{}",
            r.usage.peak_rss_mb,
            r.usage.rss_mb,
            r.usage.rss_anon_mb,
            r.usage.rss_file_mb,
            r.usage.cpu_seconds,
            r.cpu_seconds_per_1000_nodes
                .map(|c| format!(" ({c:.2}s per 1,000 nodes)"))
                .unwrap_or_default()
        );
    }
}

/// Runs the selected scenarios.
pub async fn run(opts: BenchOptions) -> anyhow::Result<std::process::ExitCode> {
    let mut scenarios = opts.scenarios.clone();
    if scenarios.is_empty() {
        scenarios = vec![
            Scenario::Burst,
            Scenario::Idle,
            Scenario::Services,
            Scenario::Churn,
            Scenario::Memory,
            Scenario::Join,
            Scenario::Scale,
        ];
    }
    let mut results = Vec::new();
    let mut burst_timeline = Vec::new();
    let mut costs = opts.api_cost.clone();
    if costs.is_empty() {
        costs = vec![ApiCost::Free, ApiCost::Calibrated];
    }
    if opts.kubeconfig.is_some() {
        costs = vec![ApiCost::Free];
    }
    for cost in costs {
        let opts = BenchOptions {
            cost,
            ..opts.clone()
        };
        for &s in &scenarios {
            let mut r = match s {
                Scenario::Burst => burst(&opts, &mut burst_timeline).await,
                Scenario::Idle => idle(&opts).await,
                Scenario::Services => services(&opts).await,
                Scenario::Churn => churn(&opts).await,
                Scenario::Memory => memory(&opts).await,
                Scenario::Join => join(&opts).await,
                Scenario::Scale => scale(&opts).await,
            }
            .with_context(|| format!("scenario {s:?} ({cost:?} API)"))?;
            r.api_cost = opts.kubeconfig.is_none().then_some(cost);
            results.push(r);
        }
    }
    print_table(&results);
    if let Some(path) = &opts.json {
        let doc = json!({
            "schema": 1,
            "cloud_latency_ms": opts.cloud_latency.0.as_millis() as u64,
            "machine": machine(),
            "ccm_under_test": match &opts.ccm_bin {
                Some(b) => b.clone(),
                None => ccm_under_test()?,
            },
            "scenarios": results,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("--json {}", path.display()))?;
    }
    if let Some(dir) = &opts.plot {
        std::fs::create_dir_all(dir)?;
        crate::plot::burst(
            &dir.join("burst-initialized.svg"),
            &burst_timeline,
            opts.nodes,
        )?;
        if let Some(idle) = results.iter().find(|r| r.scenario == "idle") {
            crate::plot::idle(&dir.join("idle-cloud-calls.svg"), &idle.idle)?;
            crate::plot::idle_rss(&dir.join("idle-rss.svg"), &idle.idle)?;
        }
    }
    Ok(if results.iter().all(|r| r.converged) {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}

fn machine() -> serde_json::Value {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| s.lines().next().map(|l| l.to_string()))
        .unwrap_or_default();
    json!({"cpus": cpus, "memory": mem.trim()})
}
