//! Command-line options, with upstream `cloud-controller-manager` names and defaults so that
//! manifests written for an upstream CCM run unchanged.
//!
//! Divergent defaults are marked "ccm-rs:" in the help text and listed in
//! `docs/DIVERGENCES.md`.

use std::net::IpAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use clap::{ArgAction, Args};

/// The controllers ccm-rs can run: canonical names, aliases accepted in `--controllers`, and
/// the short name used by `running_managed_controllers`.
pub const CONTROLLERS: &[(&str, &str)] = &[
    ("cloud-node-controller", "cloud-node"),
    ("cloud-node-lifecycle-controller", "cloud-node-lifecycle"),
    ("node-route-controller", "route"),
    ("service-lb-controller", "service"),
];

/// The feature gates ccm-rs understands (others are rejected with the list).
pub const FEATURE_GATES: &[(&str, bool)] = &[
    // ccm-rs: on by default (upstream: alpha, off). See docs/DIVERGENCES.md.
    ("CloudControllerManagerWatchBasedRoutesReconciliation", true),
    ("CloudControllerManagerWebhook", false),
    ("ControllerManagerReleaseLeaderElectionLockOnExit", true),
];

/// A Go-style duration: `300ms`, `10s`, `5m`, `1h30m`, `2h45m10.5s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoDuration(pub Duration);

impl FromStr for GoDuration {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_go_duration(s).map(GoDuration)
    }
}

impl std::fmt::Display for GoDuration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = self.0;
        if d.is_zero() {
            return write!(f, "0s");
        }
        let total_ms = d.as_millis();
        if !total_ms.is_multiple_of(1000) {
            return write!(f, "{}ms", total_ms);
        }
        let mut secs = d.as_secs();
        let h = secs / 3600;
        secs %= 3600;
        let m = secs / 60;
        secs %= 60;
        if h > 0 {
            write!(f, "{h}h")?;
        }
        if m > 0 {
            write!(f, "{m}m")?;
        }
        if secs > 0 {
            write!(f, "{secs}s")?;
        }
        Ok(())
    }
}

/// Parses Go's `time.ParseDuration` syntax (units ns, us, µs, ms, s, m, h; no negatives).
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let err =
        || format!("invalid duration {s:?}: use a number with a unit, e.g. 300ms, 10s, 5m, 1h30m");
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(err());
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        if num_end == 0 {
            return Err(err());
        }
        let value: f64 = rest[..num_end].parse().map_err(|_| err())?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_end];
        rest = &rest[unit_end..];
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(err()),
        };
        total += value * scale;
    }
    Ok(Duration::from_secs_f64(total))
}

fn go_bool(s: &str) -> Result<bool, String> {
    ccm_controllers::nodeutil::parse_go_bool(s)
        .ok_or_else(|| format!("invalid boolean {s:?}: use true or false"))
}

/// `text` or `json` log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}

/// Options of `ccm run` (and of `ccm` with flags but no subcommand).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Cloud provider")]
pub struct RunOptions {
    /// The provider to run (e.g. `sim`). Required.
    #[arg(long, default_value = "", hide_default_value = true)]
    pub cloud_provider: String,

    /// Path to the provider's configuration file.
    #[arg(long)]
    pub cloud_config: Option<PathBuf>,

    /// Deprecated upstream; accepted so old manifests still start. ccm-rs always requires the
    /// provider to scope its resources to the cluster.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool)]
    pub allow_untagged_cloud: bool,

    /// Client-side limit for cloud API calls per second (ccm-rs; 0 = unlimited).
    #[arg(long, default_value_t = 0.0)]
    pub cloud_api_qps: f64,

    /// Burst for `--cloud-api-qps` (ccm-rs).
    #[arg(long, default_value_t = 20)]
    pub cloud_api_burst: u32,

    // ---- Kubernetes API
    /// Path to a kubeconfig; in-cluster config when omitted.
    #[arg(long, help_heading = "Kubernetes API")]
    pub kubeconfig: Option<PathBuf>,

    /// The API server address; overrides the kubeconfig's server.
    #[arg(long, help_heading = "Kubernetes API")]
    pub master: Option<String>,

    /// Client-side limit for API server requests per second, per controller (each controller
    /// has its own client, as upstream; events have one more). ccm-rs: 500 (upstream CCM: 20).
    /// API Priority and Fairness protects the API server; this limit only guards against a
    /// runaway loop, and at upstream's 20 a 1,000-node burst takes minutes to initialize.
    #[arg(long, default_value_t = 500.0, help_heading = "Kubernetes API")]
    pub kube_api_qps: f64,

    /// Burst for `--kube-api-qps`. ccm-rs: 2000 (upstream CCM: 30): room for a 1,000-node
    /// scale-up (2 writes per Node) to initialize at API-server speed.
    #[arg(long, default_value_t = 2000, help_heading = "Kubernetes API")]
    pub kube_api_burst: u32,

    /// Accepted for compatibility; ccm-rs always talks JSON.
    #[arg(
        long,
        default_value = "application/json",
        help_heading = "Kubernetes API"
    )]
    pub kube_api_content_type: String,

    /// Each controller talks to the API as its own service account in kube-system
    /// (node-controller, route-controller, service-controller), via the TokenRequest API.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, help_heading = "Kubernetes API")]
    pub use_service_account_credentials: bool,

    // ---- Controllers
    /// Controllers to run: `*` for all, a name to enable, `-name` to disable. Canonical names
    /// and aliases: cloud-node-controller (cloud-node), cloud-node-lifecycle-controller
    /// (cloud-node-lifecycle), node-route-controller (route), service-lb-controller (service).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "*",
        help_heading = "Controllers"
    )]
    pub controllers: Vec<String>,

    /// Name handed to the provider to scope load balancers and routes.
    #[arg(long, default_value = "kubernetes", help_heading = "Controllers")]
    pub cluster_name: String,

    /// Pod CIDR range of the cluster: one CIDR or a comma-separated IPv4,IPv6 pair. Required
    /// when routes are configured.
    #[arg(long, default_value = "", help_heading = "Controllers")]
    pub cluster_cidr: String,

    /// Program pod-CIDR routes in the cloud (when the provider supports routes).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool, help_heading = "Controllers")]
    pub configure_cloud_routes: bool,

    /// Node IPAM is not part of ccm-rs; must stay false (run IPAM in kube-controller-manager).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, help_heading = "Controllers")]
    pub allocate_node_cidrs: bool,

    /// Accepted for compatibility (IPAM is not part of ccm-rs).
    #[arg(long, default_value = "RangeAllocator", help_heading = "Controllers")]
    pub cidr_allocator_type: String,

    /// Full route reconcile period in interval mode (watch-based routes gate off).
    #[arg(long, default_value = "10s", help_heading = "Controllers")]
    pub route_reconciliation_period: GoDuration,

    /// Lifecycle controller period: Ready nodes are checked from the cache, NotReady ones in
    /// one batched cloud call.
    #[arg(long, default_value = "5s", help_heading = "Controllers")]
    pub node_monitor_period: GoDuration,

    /// Period of the batched node address refresh.
    #[arg(long, default_value = "5m", help_heading = "Controllers")]
    pub node_status_update_frequency: GoDuration,

    /// Node initialization workers. ccm-rs: 10 (upstream: 1); each handles a batch of nodes.
    #[arg(long, default_value_t = 10, help_heading = "Controllers")]
    pub concurrent_node_syncs: u32,

    /// Address-refresh workers; 0 = use --concurrent-node-syncs.
    #[arg(long, default_value_t = 0, help_heading = "Controllers")]
    pub concurrent_node_status_updates: u32,

    /// Service workers. ccm-rs: 100 (upstream: 1); never two operations on one Service at once;
    /// put the cloud's rate limit in --cloud-api-qps, not here.
    #[arg(long, default_value_t = 100, help_heading = "Controllers")]
    pub concurrent_service_syncs: u32,

    /// ccm-rs: how often NotReady Nodes are re-checked in the cloud when the provider pushes
    /// instance events (without events, --node-monitor-period applies).
    #[arg(long, default_value = "5m", help_heading = "Controllers")]
    pub node_lifecycle_resync_period: GoDuration,

    /// ccm-rs, watch-based routes: while the cloud throttles route calls, at most one route
    /// sync per this interval (otherwise syncs run back to back, each batching all due routes).
    #[arg(long, default_value = "1s", help_heading = "Controllers")]
    pub route_min_sync_interval: GoDuration,

    /// ccm-rs, watch-based routes: full reconcile after this long without one, to repair
    /// routes changed in the cloud outside the cluster.
    #[arg(long, default_value = "30m", help_heading = "Controllers")]
    pub route_resync_period: GoDuration,

    /// ccm-rs: period of the load-balancer drift check (GetLoadBalancer per Service,
    /// re-ensure on drift); 0 disables it (upstream has none).
    #[arg(long, default_value = "0", help_heading = "Controllers")]
    pub service_drift_check_period: GoDuration,

    /// Accepted for compatibility; caches never resync (they are event-driven).
    #[arg(long, default_value = "12h", help_heading = "Controllers")]
    pub min_resync_period: GoDuration,

    /// Feature gates as `Name=true|false,...`. Known: CloudControllerManagerWatchBasedRoutesReconciliation
    /// (ccm-rs default true), CloudControllerManagerWebhook, ControllerManagerReleaseLeaderElectionLockOnExit.
    #[arg(long, value_delimiter = ',', help_heading = "Controllers")]
    pub feature_gates: Vec<String>,

    // ---- Leader election
    /// Run leader election so that only one replica acts at a time.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool, help_heading = "Leader election")]
    pub leader_elect: bool,

    /// How long a lease is valid after the leader last renewed it.
    #[arg(long, default_value = "15s", help_heading = "Leader election")]
    pub leader_elect_lease_duration: GoDuration,

    /// How long the leader retries renewing before it steps down.
    #[arg(long, default_value = "10s", help_heading = "Leader election")]
    pub leader_elect_renew_deadline: GoDuration,

    /// How often candidates retry and the leader renews.
    #[arg(long, default_value = "2s", help_heading = "Leader election")]
    pub leader_elect_retry_period: GoDuration,

    /// The lock kind; only `leases` is supported (as upstream).
    #[arg(long, default_value = "leases", help_heading = "Leader election")]
    pub leader_elect_resource_lock: String,

    /// Lease name.
    #[arg(
        long,
        default_value = "cloud-controller-manager",
        help_heading = "Leader election"
    )]
    pub leader_elect_resource_name: String,

    /// Lease namespace.
    #[arg(long, default_value = "kube-system", help_heading = "Leader election")]
    pub leader_elect_resource_namespace: String,

    // ---- Serving
    /// Address for /healthz, /readyz, /livez and /metrics.
    #[arg(long, default_value = "0.0.0.0", help_heading = "Serving")]
    pub bind_address: IpAddr,

    /// Port for /healthz, /readyz, /livez and /metrics; 0 disables serving.
    #[arg(long, default_value_t = 10258, help_heading = "Serving")]
    pub secure_port: u16,

    /// TLS certificate (PEM). Without a certificate and key, ccm-rs serves plain HTTP and warns.
    #[arg(long, help_heading = "Serving")]
    pub tls_cert_file: Option<PathBuf>,

    /// TLS private key (PEM) for --tls-cert-file.
    #[arg(long, help_heading = "Serving")]
    pub tls_private_key_file: Option<PathBuf>,

    /// Accepted for compatibility; ccm-rs serves no profiling endpoints.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool, help_heading = "Serving")]
    pub profiling: bool,

    // ---- Logging
    /// Log verbosity, klog-style: 0-1 info, 2-3 debug, 4+ trace.
    #[arg(
        short = 'v',
        long = "v",
        default_value_t = 2,
        overrides_with = "verbosity",
        help_heading = "Logging"
    )]
    pub verbosity: u8,

    /// Log line format.
    #[arg(
        long,
        alias = "logging-format",
        value_enum,
        default_value = "text",
        help_heading = "Logging"
    )]
    pub log_format: LogFormat,
}

/// A controller selection resolved from `--controllers`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerSelection {
    entries: Vec<(bool, String)>,
    star: bool,
}

impl ControllerSelection {
    /// Whether the controller with canonical `name` runs (upstream `IsControllerEnabled`).
    pub fn enabled(&self, name: &str) -> bool {
        for (on, n) in &self.entries {
            if n == name {
                return *on;
            }
        }
        self.star
    }
}

/// The canonical name for a canonical name or alias.
pub fn canonical_controller(name: &str) -> Option<&'static str> {
    CONTROLLERS
        .iter()
        .find(|(canon, alias)| *canon == name || *alias == name)
        .map(|(canon, _)| *canon)
}

/// Validation failures, all reported at once like upstream's `Validate()`.
#[derive(Debug, thiserror::Error)]
#[error("invalid options:\n  - {}", .0.join("\n  - "))]
pub struct OptionsError(pub Vec<String>);

/// Options after validation.
#[derive(Debug, Clone)]
pub struct Validated {
    /// The options as given.
    pub options: RunOptions,
    /// Which controllers run.
    pub controllers: ControllerSelection,
    /// Resolved feature gates (known gates only).
    pub gates: std::collections::BTreeMap<String, bool>,
    /// Parsed `--cluster-cidr` (empty when not given).
    pub cluster_cidrs: Vec<ipnet::IpNet>,
}

impl RunOptions {
    /// Checks everything that can be checked without a cluster, collecting every problem.
    pub fn validate(self) -> Result<Validated, OptionsError> {
        let mut errs = Vec::new();
        if self.cloud_provider.is_empty() {
            errs.push("--cloud-provider is required (e.g. --cloud-provider=sim)".to_string());
        }
        if self.allocate_node_cidrs {
            errs.push(
                "--allocate-node-cidrs=true: node IPAM is not part of ccm-rs; run it in kube-controller-manager (--allocate-node-cidrs=true --cluster-cidr=... there) and leave it false here"
                    .to_string(),
            );
        }
        if self.leader_elect && self.leader_elect_resource_lock != "leases" {
            errs.push(format!(
                "--leader-elect-resource-lock={:?}: only \"leases\" is supported",
                self.leader_elect_resource_lock
            ));
        }
        if self.leader_elect {
            let (ld, rd, rp) = (
                self.leader_elect_lease_duration.0,
                self.leader_elect_renew_deadline.0,
                self.leader_elect_retry_period.0,
            );
            if rd >= ld {
                errs.push(format!("--leader-elect-renew-deadline ({}) must be less than --leader-elect-lease-duration ({})", GoDuration(rd), GoDuration(ld)));
            }
            if rp.is_zero() || rp >= rd {
                errs.push(format!("--leader-elect-retry-period ({}) must be positive and less than --leader-elect-renew-deadline ({})", GoDuration(rp), GoDuration(rd)));
            }
        }
        if self.tls_cert_file.is_some() != self.tls_private_key_file.is_some() {
            errs.push(
                "--tls-cert-file and --tls-private-key-file must be given together".to_string(),
            );
        }
        if self.concurrent_node_syncs == 0 {
            errs.push("--concurrent-node-syncs must be at least 1".to_string());
        }
        if self.concurrent_service_syncs == 0 {
            errs.push("--concurrent-service-syncs must be at least 1".to_string());
        }

        let mut entries = Vec::new();
        let mut star = false;
        for raw in &self.controllers {
            let raw = raw.trim();
            if raw.is_empty() {
                continue;
            }
            if raw == "*" {
                star = true;
                continue;
            }
            let (on, name) = match raw.strip_prefix('-') {
                Some(n) => (false, n),
                None => (true, raw),
            };
            match canonical_controller(name) {
                Some(c) => entries.push((on, c.to_string())),
                None => {
                    let names = CONTROLLERS.iter().flat_map(|(a, b)| [*a, *b]);
                    let hint = ccm_cloud::nearest(name, names)
                        .map(|n| format!(" (did you mean {n:?}?)"))
                        .unwrap_or_default();
                    errs.push(format!(
                        "--controllers: {name:?} is not in the list of known controllers{hint}; known: {}",
                        CONTROLLERS.iter().map(|(c, a)| format!("{c} ({a})")).collect::<Vec<_>>().join(", ")
                    ));
                }
            }
        }

        let mut gates: std::collections::BTreeMap<String, bool> = FEATURE_GATES
            .iter()
            .map(|(n, d)| (n.to_string(), *d))
            .collect();
        for raw in &self.feature_gates {
            let raw = raw.trim();
            if raw.is_empty() {
                continue;
            }
            let Some((k, v)) = raw.split_once('=') else {
                errs.push(format!("--feature-gates: {raw:?} must be Name=true|false"));
                continue;
            };
            let (k, v) = (k.trim(), v.trim());
            let Some(value) = ccm_controllers::nodeutil::parse_go_bool(v) else {
                errs.push(format!(
                    "--feature-gates: {k}={v:?}: value must be true or false"
                ));
                continue;
            };
            if gates.contains_key(k) {
                gates.insert(k.to_string(), value);
            } else {
                let hint = ccm_cloud::nearest(k, FEATURE_GATES.iter().map(|(n, _)| *n))
                    .map(|n| format!(" (did you mean {n:?}?)"))
                    .unwrap_or_default();
                errs.push(format!(
                    "--feature-gates: unrecognized feature gate {k:?}{hint}; known: {}",
                    FEATURE_GATES
                        .iter()
                        .map(|(n, _)| *n)
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }

        // Empty is fine here: only the route controller needs it, and it says so at start.
        let cluster_cidrs = if self.cluster_cidr.trim().is_empty() {
            Vec::new()
        } else {
            ccm_controllers::route::parse_cluster_cidrs(&self.cluster_cidr).unwrap_or_else(|e| {
                errs.push(e.to_string());
                Vec::new()
            })
        };

        if errs.is_empty() {
            Ok(Validated {
                controllers: ControllerSelection { entries, star },
                gates,
                cluster_cidrs,
                options: self,
            })
        } else {
            Err(OptionsError(errs))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_go_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_go_duration("300ms"), Ok(Duration::from_millis(300)));
        assert_eq!(parse_go_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_go_duration("0"), Ok(Duration::ZERO));
        assert!(parse_go_duration("10").is_err());
        assert!(parse_go_duration("10x").is_err());
        assert!(parse_go_duration("s").is_err());
        assert_eq!(GoDuration(Duration::from_secs(5400)).to_string(), "1h30m");
        assert_eq!(GoDuration(Duration::from_millis(300)).to_string(), "300ms");
    }
}
