//! What a scenario measured, and the table printed from it.

use std::collections::BTreeMap;

use serde::Serialize;

use super::ApiCost;

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

pub(super) fn percentiles(mut v: Vec<f64>) -> Percentiles {
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
    /// Per kubelet: its Node POST + status PATCH, seconds, as the kubelet saw them (burst).
    pub registration_latency: Option<Percentiles>,
    /// The same registrations with no CCM running (`--no-ccm`): the baseline.
    pub no_ccm: Option<Registrations>,
    /// `registration_seconds` over the no-CCM run's, minus 1: how much slower the kubelets
    /// registered beside the CCM (0.1 = 10% slower).
    pub registration_slowdown: Option<f64>,
    /// CCM requests kube-sim answered 429 (`--api-429-rate`): each one retried or dropped.
    pub api_429_answers: Option<u64>,
    /// Seconds until every node had its routes (burst).
    pub all_routes_seconds: Option<f64>,
    /// Per-node time from creation to `NetworkUnavailable=False` (routed).
    pub time_to_routed: Option<Percentiles>,
    /// Per-node time from creation until both initialized and routed (ready for pods).
    pub time_to_ready: Option<Percentiles>,
    /// Seconds from the last kubelet registration's end (create + status) to the last node
    /// both initialized and routed.
    pub last_ready_after_last_registration_seconds: Option<f64>,
    /// Seconds from the last kubelet registration's end to the last node's first appearance
    /// in a watch: the part of the above that is the API server's lag, before any watcher
    /// (the CCM included) could see the node.
    pub last_seen_after_last_registration_seconds: Option<f64>,
    /// Per-Service time from creation to ingress.
    pub time_to_ingress: Option<Percentiles>,
    /// Seconds until every Service had ingress.
    pub all_ingress_seconds: Option<f64>,
    /// Node join: seconds until every LB had the new host.
    pub node_join_lb_update_seconds: Option<f64>,
    /// Node join: UpdateLoadBalancer calls.
    pub node_join_lb_updates: Option<u64>,
    /// Scale: one Node joining the settled cluster.
    pub join: Option<Join>,
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
    /// Chaos: one row per fault.
    pub chaos: Vec<ChaosResult>,
    /// Reference: each figure beside the real server's.
    pub reference: Vec<super::reference::ReferenceRow>,
    /// `route_controller_route_sync_total` at the end of the burst.
    pub route_syncs: Option<u64>,
    /// CCM child resource use.
    pub usage: Usage,
    /// Wall time of the scenario.
    pub wall_seconds: f64,
}

impl ScenarioResult {
    /// Records the no-CCM baseline and how much slower the registrations were beside the CCM.
    pub(super) fn set_baseline(&mut self, baseline: Option<Registrations>) {
        self.registration_slowdown = baseline
            .zip(self.registration_seconds)
            .filter(|(b, _)| b.seconds > 0.0)
            .map(|(b, with)| with / b.seconds - 1.0);
        self.no_ccm = baseline;
    }
}

/// The kubelets' registrations of a burst, as they saw them.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Registrations {
    /// Seconds from the first kubelet's POST to the last status PATCH returning.
    pub seconds: f64,
    /// Per kubelet: its Node POST + status PATCH, seconds.
    pub latency: Percentiles,
}

/// One Node joining a settled cluster of the scenario's size: what a join costs at that size.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Join {
    /// From just before its kubelet's POST to initialized.
    pub initialized_seconds: f64,
    /// From just before its kubelet's POST to `NetworkUnavailable=False`.
    pub routed_seconds: f64,
    /// CCM CPU from the join until its load-balancer updates were quiet for 3 s.
    pub cpu_seconds: f64,
}

/// Chaos: one fault, what it took to recover and whether the invariants held.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChaosResult {
    /// Which fault.
    pub fault: String,
    /// Changes made (nodes and Services added and removed) while it lasted.
    pub operations: u64,
    /// Seconds from the fault's end until every invariant held (null: they did not within
    /// `--timeout`).
    pub reconverge_seconds: Option<f64>,
    /// Invariants broken at the end (empty: all held).
    pub violations: Vec<String>,
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

pub(super) fn print_table(results: &[ScenarioResult]) {
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
                "  last node ready         {}s after the last registration; the last node reached the watches after {}s",
                f(r.last_ready_after_last_registration_seconds),
                f(r.last_seen_after_last_registration_seconds)
            );
        }
        if r.registration_seconds.is_some() {
            println!(
                "  kubelet registrations   {}s (create + status of every node)",
                f(r.registration_seconds)
            );
        }
        print_registrations(r);
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
        if let Some(j) = &r.join {
            println!(
                "  one join                initialized {:.3}s, routed {:.3}s, CCM CPU {:.2}s",
                j.initialized_seconds, j.routed_seconds, j.cpu_seconds
            );
        }
        if r.node_join_lb_update_seconds.is_some() {
            println!(
                "  node join → last LB update {}s after; {} UpdateLoadBalancer calls in all",
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
        print_chaos(&r.chaos);
        print_reference(&r.reference);
        if let Some(n) = r.route_syncs {
            println!("  route syncs             {n}");
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

/// The kubelets' side of a burst: per-registration latency, the no-CCM baseline, 429s.
fn print_registrations(r: &ScenarioResult) {
    if let Some(p) = r.registration_latency {
        println!(
            "  per registration        p50 {:.3}s  p99 {:.3}s  max {:.3}s (POST + status PATCH, as the kubelet saw it)",
            p.p50, p.p99, p.max
        );
    }
    if let Some(b) = r.no_ccm {
        println!(
            "  with no CCM             {:.2}s; per registration p50 {:.3}s  p99 {:.3}s  max {:.3}s",
            b.seconds, b.latency.p50, b.latency.p99, b.latency.max
        );
    }
    if let Some(s) = r.registration_slowdown {
        println!(
            "  registrations beside the CCM took {:+.1}% of the no-CCM run's time",
            s * 100.0
        );
    }
    if let Some(n) = r.api_429_answers {
        println!("  429 answers to the CCM  {n} (each a request it had to retry)");
    }
}

/// One row per chaos fault.
fn print_chaos(rows: &[ChaosResult]) {
    if rows.is_empty() {
        return;
    }
    println!(
        "  {:<16} {:>6} {:>14}  invariants",
        "fault", "ops", "reconverged"
    );
    for c in rows {
        println!(
            "  {:<16} {:>6} {:>14}  {}",
            c.fault,
            c.operations,
            c.reconverge_seconds
                .map(|s| format!("{s:.2}s"))
                .unwrap_or_else(|| "never".into()),
            if c.violations.is_empty() {
                "all held".to_string()
            } else {
                c.violations.join("; ")
            }
        );
    }
}

/// The reference scenario's figures beside the real server's.
fn print_reference(rows: &[super::reference::ReferenceRow]) {
    if rows.is_empty() {
        return;
    }
    println!(
        "  {:<44} {:>9} {:>9} {:>8}",
        "figure", "real", "here", "off"
    );
    for row in rows {
        println!(
            "  {:<44} {:>9} {:>9.2} {:>8}{}",
            row.figure,
            row.real
                .map(|v| format!("{v:.2}"))
                .unwrap_or_else(|| "—".into()),
            row.measured,
            row.off
                .map(|o| format!("{:+.0}%", o * 100.0))
                .unwrap_or_else(|| "—".into()),
            if row.fitted { "" } else { "  (not fitted)" }
        );
    }
}
