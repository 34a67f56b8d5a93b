//! `ccm bench`: scale scenarios that measure what ccm-rs costs the API server and the cloud,
//! and how fast it converges.
//!
//! The CCM under test runs as a separate child process (`ccm run`), so its RSS and CPU come from
//! /proc for that process alone. The bench process hosts kube-sim (or talks to `--kubeconfig`)
//! and the sim cloud, served over HTTP to the child, with a per-call latency (default 50 ms);
//! the reference scenario's CCM runs its sim cloud in its own process, as the real run's did.
//! Numbers are measured, never asserted: see docs/BENCHMARKS.md.

mod burst;
mod chaos;
mod churn;
mod env;
mod idle;
mod join;
mod memory;
mod reference;
mod report;
mod services;
mod track;

use std::path::PathBuf;

use anyhow::Context as _;
use ccm_manager::options::GoDuration;
use serde::Serialize;
use serde_json::json;

use crate::cluster::Bodies;

pub use report::IdleResult;

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
    /// Faults one after another (`--chaos-fault`) while nodes and Services come and go: the
    /// time to reconverge after each and the invariants (not run unless named).
    Chaos,
    /// A burst of `--scale-nodes` nodes, then `--scale-services` Services (1 in 50 of them
    /// LoadBalancer): how time, requests and memory grow with the cluster.
    Scale,
    /// The real-server reference run's workload, phase by phase, each figure beside the real
    /// server's: how well kube-sim's cost model predicts a real one (not run unless named).
    Reference,
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
    pub(super) fn name_and_gate(self) -> (&'static str, &'static str) {
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
    pub(super) fn model(self) -> ccm_kube_sim::cost::CostModel {
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
    /// Every cloud call takes exactly `--cloud-latency`, without the usual tenth of jitter
    /// (set by the reference scenario, whose real run had none).
    #[arg(skip)]
    pub exact_cloud_latency: bool,
    /// The CCM under test runs the sim cloud in its own process, from its `--cloud-config`,
    /// instead of calling the bench's over HTTP (set by the reference scenario: the real run's
    /// cloud was in the CCM's process, so its memory, its CPU and its timing were the CCM's).
    #[arg(skip)]
    pub cloud_in_ccm: bool,
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
    /// Sets one cost of the calibrated model, `KNOB=BASE_US+PER_KIB_US` with KNOB one of get,
    /// list, watch, write, dispatch, send, commit, commit-queue (per write ahead, by this
    /// write's size), group-commit, catch-up (µs between a lagging watch cache's chunks),
    /// allocate, handshake (repeatable; applied before --api-cost-scale): to fit the model to
    /// another server (docs/BENCHMARKS.md, "The cost model").
    #[arg(long = "api-cost-knob")]
    pub api_cost_knobs: Vec<String>,
    /// kube-sim serves on threads of its own, this many (a real API server's GOMAXPROCS),
    /// instead of on the bench's, where the simulated kubelets and the watchers that measure
    /// run: 0 shares the bench's.
    #[arg(long, default_value_t = 0)]
    pub api_threads: usize,
    /// Nodes registering at once in the scale scenario.
    #[arg(long, default_value_t = 5000)]
    pub scale_nodes: u32,
    /// Services created after the scale scenario's burst (every 50th a LoadBalancer).
    #[arg(long, default_value_t = 10000)]
    pub scale_services: u32,
    /// How big the Nodes and Services the simulated kubelets and users send are (the
    /// reference scenario always sends the reference run's).
    #[arg(long, value_enum, default_value_t = Bodies::Production)]
    pub objects: Bodies,
    /// Simulated kubelets registering concurrently (the issue 17 real-server runs used 32).
    #[arg(long, default_value_t = 32)]
    pub kubelets: usize,
    /// The reference scenario's idle window after the burst.
    #[arg(long, default_value = "120s")]
    pub reference_idle: GoDuration,
    /// The reference scenario's idle window after the join (it holds the 5-minute address
    /// refresh).
    #[arg(long, default_value = "360s")]
    pub reference_idle_after_join: GoDuration,
    /// Nodes joining one at a time in the join scenario.
    #[arg(long, default_value_t = 10)]
    pub joins: u32,
    /// Give up on a convergence wait after this long.
    #[arg(long, default_value = "600s")]
    pub timeout: GoDuration,
    /// Burst and scale also register their nodes with no CCM running (a fresh kube-sim, same
    /// cost model, same kubelets and watches) and report the kubelets' registrations side by
    /// side: what the CCM costs the other clients of the API server.
    #[arg(long)]
    pub no_ccm: bool,
    /// `--kube-api-qps` for the CCM under test (its own default when unset).
    #[arg(long)]
    pub kube_api_qps: Option<f64>,
    /// `--kube-api-burst` for the CCM under test (its own default when unset).
    #[arg(long)]
    pub kube_api_burst: Option<u32>,
    /// Fraction (0–1) of the CCM's API requests kube-sim answers 429 TooManyRequests with
    /// Retry-After (the kubelets and the bench's own clients are spared): API-server pushback.
    #[arg(long, default_value_t = 0.0)]
    pub api_429_rate: f64,
    /// Seconds of Retry-After sent with those 429s.
    #[arg(long, default_value_t = 1)]
    pub api_retry_after: u32,
    /// API Priority and Fairness for the CCM's requests, as `SEATS/QUEUE`: kube-sim executes at
    /// most SEATS of them at once, queues up to QUEUE more (15 s at most) and answers the rest
    /// 429 with Retry-After (`--api-retry-after`). The kubelets and the bench are spared.
    #[arg(long, value_parser = parse_priority_level, value_name = "SEATS/QUEUE")]
    pub api_priority_level: Option<(usize, usize)>,
    /// Faults of the chaos scenario, in order (repeatable; default: all).
    #[arg(long = "chaos-fault", value_enum)]
    pub chaos_faults: Vec<chaos::Fault>,
    /// Nodes registered before the chaos faults (and in the api-restart burst).
    #[arg(long, default_value_t = 200)]
    pub chaos_nodes: u32,
    /// LoadBalancer Services created before the chaos faults.
    #[arg(long, default_value_t = 20)]
    pub chaos_services: u32,
    /// How long each chaos fault lasts, with churn at `--churn-rate` (an API-server restart
    /// answers 503 for at most 5 s of it).
    #[arg(long, default_value = "20s")]
    pub chaos_duration: GoDuration,
    /// SIGKILLs of the CCM, at random moments of the ccm-kill fault's window.
    #[arg(long, default_value_t = 3)]
    pub chaos_kills: u32,
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

impl BenchOptions {
    /// kube-sim's cost model for this run: the cost mode's, with the knobs and the CPU scale.
    pub(super) fn cost_model(&self) -> anyhow::Result<ccm_kube_sim::cost::CostModel> {
        let mut model = self.cost.model();
        if self.cost == ApiCost::Calibrated {
            for knob in &self.api_cost_knobs {
                model
                    .set_knob(knob)
                    .map_err(|e| anyhow::anyhow!("--api-cost-knob {e}"))?;
            }
        }
        Ok(model.cpu_scaled(self.api_cost_scale))
    }
}

/// Runs the selected scenarios.
pub async fn run(opts: BenchOptions) -> anyhow::Result<std::process::ExitCode> {
    // A malformed --api-cost-knob is refused before any scenario starts.
    BenchOptions {
        cost: ApiCost::Calibrated,
        ..opts.clone()
    }
    .cost_model()?;
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
                Scenario::Burst => burst::burst(&opts, &mut burst_timeline).await,
                Scenario::Idle => idle::idle(&opts).await,
                Scenario::Services => services::services(&opts).await,
                Scenario::Churn => churn::churn(&opts).await,
                Scenario::Memory => memory::memory(&opts).await,
                Scenario::Join => join::join(&opts).await,
                Scenario::Scale => burst::scale(&opts).await,
                Scenario::Chaos => chaos::chaos(&opts).await,
                Scenario::Reference => reference::reference(&opts).await,
            }
            .with_context(|| format!("scenario {s:?} ({cost:?} API)"))?;
            r.api_cost = opts.kubeconfig.is_none().then_some(cost);
            results.push(r);
        }
    }
    report::print_table(&results);
    if let Some(path) = &opts.json {
        let doc = json!({
            "schema": 1,
            "cloud_latency_ms": opts.cloud_latency.0.as_millis() as u64,
            "machine": machine(),
            "ccm_under_test": match &opts.ccm_bin {
                Some(b) => b.clone(),
                None => env::ccm_under_test()?,
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

/// `SEATS/QUEUE` of `--api-priority-level`: at least one seat, any queue.
fn parse_priority_level(v: &str) -> Result<(usize, usize), String> {
    let usage = || format!("{v:?}: expected SEATS/QUEUE, e.g. 10/50 (at least one seat)");
    let (seats, queue) = v.split_once('/').ok_or_else(usage)?;
    let seats: usize = seats.trim().parse().map_err(|_| usage())?;
    let queue: usize = queue.trim().parse().map_err(|_| usage())?;
    if seats == 0 {
        return Err(usage());
    }
    Ok((seats, queue))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_priority_level_is_seats_and_queue_and_a_malformed_one_names_the_form() {
        assert_eq!(super::parse_priority_level("10/50"), Ok((10, 50)));
        assert_eq!(super::parse_priority_level("1/0"), Ok((1, 0)));
        for bad in ["10", "0/5", "a/5", "10/-1", ""] {
            let e = super::parse_priority_level(bad).expect_err(bad);
            assert!(e.contains("SEATS/QUEUE"), "{e}");
        }
    }
}
