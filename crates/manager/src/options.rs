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

/// Feature gates upstream's binary registers (component-base logging and metrics,
/// k8s.io/apiserver) that govern nothing in ccm-rs: accepted with a startup notice.
pub const INERT_FEATURE_GATES: &[&str] = &[
    "AllAlpha",
    "AllBeta",
    "ComponentSLIs",
    "ContextualLogging",
    "LoggingAlphaOptions",
    "LoggingBetaOptions",
    "APIResponseCompression",
    "OpenAPIEnums",
    "UnauthenticatedHTTP2DOSMitigation",
    "CloudDualStackNodeIPs",
    "StableLoadBalancerNodeSet",
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
    // Go's limit: an int64 of nanoseconds (about 292 years); beyond it Go reports an overflow.
    if total > i64::MAX as f64 / 1e9 {
        return Err(format!(
            "invalid duration {s:?}: longer than Go's limit of about 292 years"
        ));
    }
    Duration::try_from_secs_f64(total).map_err(|_| err())
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
///
/// Every flag of the upstream 1.36 `cloud-controller-manager` is here, in upstream's help
/// sections (`docs/upstream-flags.md` lists each one and what ccm-rs does with it); flags that
/// ccm-rs accepts without acting on them print a one-line notice at startup ([`RunOptions::notices`]).
#[derive(Debug, Clone, Args)]
pub struct RunOptions {
    // ---- Debugging flags
    /// Upstream serves /debug/pprof when true; ccm-rs has no Go profiler to serve (accepted, no effect).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool, help_heading = "Debugging flags")]
    pub profiling: bool,

    /// Upstream: lock contention profiling when --profiling is on. Accepted, no effect.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, help_heading = "Debugging flags")]
    pub contention_profiling: Option<bool>,

    // ---- Leader-migration flags
    /// Whether to enable controller leader migration: the controllers the migration
    /// configuration lists for this component run only while it holds the migration lease
    /// (needs --leader-elect).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, help_heading = "Leader-migration flags")]
    pub enable_leader_migration: Option<bool>,

    /// Path to the config file for controller leader migration, or empty for the default
    /// configuration (lease cloud-provider-extraction-migration; route, service and
    /// cloud-node-lifecycle migrate). LeaderMigrationConfiguration, group
    /// controllermanager.config.k8s.io, version v1 (v1beta1, v1alpha1 accepted).
    #[arg(long, help_heading = "Leader-migration flags")]
    pub leader_migration_config: Option<String>,

    // ---- Generic flags
    /// The provider to run (e.g. `sim`). Required.
    #[arg(
        long,
        default_value = "",
        hide_default_value = true,
        help_heading = "Generic flags"
    )]
    pub cloud_provider: String,

    /// Path to the provider's configuration file.
    #[arg(long, help_heading = "Generic flags")]
    pub cloud_config: Option<PathBuf>,

    /// Deprecated upstream; accepted so old manifests still start. ccm-rs always requires the
    /// provider to scope its resources to the cluster.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, help_heading = "Generic flags")]
    pub allow_untagged_cloud: bool,

    /// Upstream: the volume plugin for in-tree volume controllers. ccm-rs runs no volume
    /// controllers (neither does upstream's CCM): accepted, no effect.
    #[arg(long, help_heading = "Generic flags")]
    pub external_cloud_volume_plugin: Option<String>,

    /// Each controller talks to the API as its own service account in kube-system
    /// (node-controller, route-controller, service-controller), via the TokenRequest API.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, help_heading = "Generic flags")]
    pub use_service_account_credentials: bool,

    /// Full route reconcile period in interval mode (watch-based routes gate off).
    #[arg(long, default_value = "10s", help_heading = "Generic flags")]
    pub route_reconciliation_period: GoDuration,

    /// Lifecycle controller period: Ready nodes are checked from the cache, NotReady ones in
    /// one batched cloud call.
    #[arg(long, default_value = "5s", help_heading = "Generic flags")]
    pub node_monitor_period: GoDuration,

    /// Name handed to the provider to scope load balancers and routes.
    #[arg(long, default_value = "kubernetes", help_heading = "Generic flags")]
    pub cluster_name: String,

    /// Pod CIDR range of the cluster: one CIDR or a comma-separated IPv4,IPv6 pair. Required
    /// when routes are configured.
    #[arg(long, default_value = "", help_heading = "Generic flags")]
    pub cluster_cidr: String,

    /// Node IPAM is not part of ccm-rs; must stay false (run IPAM in kube-controller-manager).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, help_heading = "Generic flags")]
    pub allocate_node_cidrs: bool,

    /// Accepted for compatibility (IPAM is not part of ccm-rs).
    #[arg(long, default_value = "RangeAllocator", help_heading = "Generic flags")]
    pub cidr_allocator_type: String,

    /// Program pod-CIDR routes in the cloud (when the provider supports routes).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool, help_heading = "Generic flags")]
    pub configure_cloud_routes: bool,

    /// Deprecated upstream and a no-op there too: accepted, no effect.
    #[arg(long, hide = true, help_heading = "Generic flags")]
    pub node_sync_period: Option<GoDuration>,

    /// Accepted for compatibility; caches never resync (they are event-driven).
    #[arg(long, default_value = "12h", help_heading = "Generic flags")]
    pub min_resync_period: GoDuration,

    /// Accepted for compatibility; ccm-rs always talks JSON.
    #[arg(
        long,
        default_value = "application/json",
        help_heading = "Generic flags"
    )]
    pub kube_api_content_type: String,

    /// Client-side limit for API server requests per second, per controller (each controller
    /// has its own client, as upstream; events have one more). ccm-rs: 500 (upstream CCM: 20).
    /// API Priority and Fairness protects the API server; this limit only guards against a
    /// runaway loop, and at upstream's 20 a 1,000-node burst takes minutes to initialize.
    #[arg(long, default_value_t = 500.0, help_heading = "Generic flags")]
    pub kube_api_qps: f64,

    /// Burst for `--kube-api-qps`. ccm-rs: 120000 (upstream CCM: 30): room for a 50,000-node
    /// scale-up (2 writes per Node, plus a fifth for conflict retries) to initialize at
    /// API-server speed; a runaway loop is still held to `--kube-api-qps` once the burst is
    /// spent.
    #[arg(long, default_value_t = 120_000, help_heading = "Generic flags")]
    pub kube_api_burst: u32,

    /// ccm-rs: bound each controller client's requests in flight by a limit that adapts to
    /// the API server's latency (shrinks while the server queues, down to 2; grows back to the
    /// client's fixed bound when it keeps up), so a burst of the CCM's writes yields the server
    /// to the kubelets. `false`: the fixed bound only.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, help_heading = "Generic flags")]
    pub kube_api_adaptive_concurrency: bool,

    /// Pause between starting controllers (jittered up to 2x, as upstream).
    #[arg(long, default_value = "0", help_heading = "Generic flags")]
    pub controller_start_interval: GoDuration,

    /// Controllers to run: `*` for all, a name to enable, `-name` to disable. Canonical names
    /// and aliases: cloud-node-controller (cloud-node), cloud-node-lifecycle-controller
    /// (cloud-node-lifecycle), node-route-controller (route), service-lb-controller (service).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "*",
        help_heading = "Generic flags"
    )]
    pub controllers: Vec<String>,

    /// Run leader election so that only one replica acts at a time.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool, help_heading = "Generic flags")]
    pub leader_elect: bool,

    /// How long a lease is valid after the leader last renewed it.
    #[arg(long, default_value = "15s", help_heading = "Generic flags")]
    pub leader_elect_lease_duration: GoDuration,

    /// How long the leader retries renewing before it steps down.
    #[arg(long, default_value = "10s", help_heading = "Generic flags")]
    pub leader_elect_renew_deadline: GoDuration,

    /// How often candidates retry and the leader renews.
    #[arg(long, default_value = "2s", help_heading = "Generic flags")]
    pub leader_elect_retry_period: GoDuration,

    /// The lock kind; only `leases` is supported (as upstream).
    #[arg(long, default_value = "leases", help_heading = "Generic flags")]
    pub leader_elect_resource_lock: String,

    /// Lease name.
    #[arg(
        long,
        default_value = "cloud-controller-manager",
        help_heading = "Generic flags"
    )]
    pub leader_elect_resource_name: String,

    /// Lease namespace.
    #[arg(long, default_value = "kube-system", help_heading = "Generic flags")]
    pub leader_elect_resource_namespace: String,

    /// Feature gates as `Name=true|false,...`. Known: CloudControllerManagerWatchBasedRoutesReconciliation
    /// (ccm-rs default true), CloudControllerManagerWebhook, ControllerManagerReleaseLeaderElectionLockOnExit;
    /// upstream's logging and metrics gates are accepted without effect.
    #[arg(long, value_delimiter = ',', help_heading = "Generic flags")]
    pub feature_gates: Vec<String>,

    // ---- Cloud-node-controller flags
    /// Node initialization workers. ccm-rs: 10 (upstream: 1); each handles a batch of nodes.
    #[arg(
        long,
        default_value_t = 10,
        help_heading = "Cloud-node-controller flags"
    )]
    pub concurrent_node_syncs: u32,

    /// Address-refresh workers; 0 = use --concurrent-node-syncs.
    #[arg(
        long,
        default_value_t = 0,
        help_heading = "Cloud-node-controller flags"
    )]
    pub concurrent_node_status_updates: u32,

    // ---- Service-lb-controller flags
    /// Service workers. ccm-rs: 100 (upstream: 1); never two operations on one Service at once;
    /// put the cloud's rate limit in --cloud-api-qps, not here.
    #[arg(
        long,
        default_value_t = 100,
        help_heading = "Service-lb-controller flags"
    )]
    pub concurrent_service_syncs: u32,

    // ---- Webhook flags / Webhook serving flags
    /// Webhooks to enable (`*`, `name`, `-name`; empty: none), as upstream. Known:
    /// `persistentvolumelabel`; any other name is an error. Served only with
    /// `--feature-gates=CloudControllerManagerWebhook=true`.
    #[arg(long, value_delimiter = ',', help_heading = "Webhook flags")]
    pub webhooks: Vec<String>,

    /// Upstream (some versions): validating webhook configuration file. Accepted, no effect.
    #[arg(long, help_heading = "Webhook flags")]
    pub validation_webhook_config_file: Option<String>,

    /// Address for --webhook-secure-port (default 0.0.0.0).
    #[arg(long, help_heading = "Webhook serving flags")]
    pub webhook_bind_address: Option<IpAddr>,

    /// HTTPS port for webhooks (default 10260; 0: no webhook server).
    #[arg(long, help_heading = "Webhook serving flags")]
    pub webhook_secure_port: Option<u16>,

    /// Where a self-signed webhook pair (`cloud-controller-manager-webhook.crt/.key`) is kept.
    #[arg(long, help_heading = "Webhook serving flags")]
    pub webhook_cert_dir: Option<String>,

    /// Webhook serving certificate (PEM), reloaded on change.
    #[arg(long, help_heading = "Webhook serving flags")]
    pub webhook_tls_cert_file: Option<String>,

    /// Webhook serving key (PEM), reloaded on change.
    #[arg(long, help_heading = "Webhook serving flags")]
    pub webhook_tls_private_key_file: Option<String>,

    /// Upstream (some versions): CA of the webhook serving certificate. Accepted, no effect.
    #[arg(long, help_heading = "Webhook serving flags")]
    pub webhook_ca_cert_file: Option<String>,

    // ---- Secure serving, authentication, authorization
    /// Secure serving flags.
    #[command(flatten)]
    pub serving: crate::serving_options::SecureServingOptions,

    /// Authentication flags.
    #[command(flatten)]
    pub authn: crate::serving_options::AuthenticationOptions,

    /// Authorization flags.
    #[command(flatten)]
    pub authz: crate::serving_options::AuthorizationOptions,

    // ---- Misc flags
    /// The API server address; overrides the kubeconfig's server.
    #[arg(long, help_heading = "Misc flags")]
    pub master: Option<String>,

    /// Path to a kubeconfig; in-cluster config when omitted.
    #[arg(long, help_heading = "Misc flags")]
    pub kubeconfig: Option<PathBuf>,

    /// Period of the batched node address refresh.
    #[arg(long, default_value = "5m", help_heading = "Misc flags")]
    pub node_status_update_frequency: GoDuration,

    // ---- Global flags (logging, version)
    /// Log verbosity, klog-style: 0-1 info, 2-3 debug, 4+ trace.
    #[arg(
        short = 'v',
        long = "v",
        default_value_t = 2,
        overrides_with = "verbosity",
        help_heading = "Global flags"
    )]
    pub verbosity: u8,

    /// Log line format: text or json.
    #[arg(
        long,
        alias = "logging-format",
        value_enum,
        default_value = "text",
        help_heading = "Global flags"
    )]
    pub log_format: LogFormat,

    /// Per-file verbosity (klog). Accepted, no effect: use RUST_LOG=module=level instead.
    #[arg(long, help_heading = "Global flags")]
    pub vmodule: Option<String>,

    /// Maximum time between log flushes. Accepted, no effect: ccm-rs writes log lines unbuffered.
    #[arg(long, help_heading = "Global flags")]
    pub log_flush_frequency: Option<GoDuration>,

    /// JSON format: info messages to stdout, errors to stderr. Accepted, no effect (all to stderr).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, help_heading = "Global flags")]
    pub log_json_split_stream: Option<bool>,

    /// JSON format: info buffer size with split streams. Accepted, no effect.
    #[arg(long, help_heading = "Global flags")]
    pub log_json_info_buffer_size: Option<String>,

    /// Text format: info messages to stdout, errors to stderr. Accepted, no effect (all to stderr).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, help_heading = "Global flags")]
    pub log_text_split_stream: Option<bool>,

    /// Text format: info buffer size with split streams. Accepted, no effect.
    #[arg(long, help_heading = "Global flags")]
    pub log_text_info_buffer_size: Option<String>,

    /// Print version information and quit (`--version`, `--version=raw` as upstream).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", help_heading = "Global flags")]
    pub version: Option<String>,

    // ---- ccm-rs flags
    /// Client-side limit for cloud API calls per second (0 = unlimited).
    #[arg(long, default_value_t = 0.0, help_heading = "ccm-rs flags")]
    pub cloud_api_qps: f64,

    /// Burst for `--cloud-api-qps`.
    #[arg(long, default_value_t = 20, help_heading = "ccm-rs flags")]
    pub cloud_api_burst: u32,

    /// How often NotReady Nodes are re-checked in the cloud when the provider pushes instance
    /// events (without events, --node-monitor-period applies).
    #[arg(long, default_value = "5m", help_heading = "ccm-rs flags")]
    pub node_lifecycle_resync_period: GoDuration,

    /// Watch-based routes: while the cloud throttles route calls, at most one route sync per
    /// this interval (otherwise syncs run back to back, each batching all due routes).
    #[arg(long, default_value = "1s", help_heading = "ccm-rs flags")]
    pub route_min_sync_interval: GoDuration,

    /// Watch-based routes: a reconcile over every Node after this long without one (route
    /// drift is repaired by every listing in between; this catches the rest).
    #[arg(long, default_value = "30m", help_heading = "ccm-rs flags")]
    pub route_resync_period: GoDuration,

    /// Period of the load-balancer drift check (GetLoadBalancer per Service, re-ensure on
    /// drift); 0 disables it (upstream has none).
    #[arg(long, default_value = "0", help_heading = "ccm-rs flags")]
    pub service_drift_check_period: GoDuration,
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
    /// The leader migration configuration, when `--enable-leader-migration` and
    /// `--leader-elect` are both on.
    pub leader_migration: Option<crate::leader_migration::LeaderMigrationConfig>,
}

/// The minimum TLS version from `--tls-min-version` (Go names). `None` when invalid.
pub fn tls_min_version(v: Option<&str>) -> Option<TlsMin> {
    match v.map(str::trim) {
        None | Some("") => Some(TlsMin::Tls12),
        Some("VersionTLS10" | "VersionTLS11" | "VersionTLS12") => Some(TlsMin::Tls12),
        Some("VersionTLS13") => Some(TlsMin::Tls13),
        Some(_) => None,
    }
}

/// The lowest TLS version the server accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMin {
    /// TLS 1.2 and 1.3.
    Tls12,
    /// TLS 1.3 only.
    Tls13,
}

impl RunOptions {
    fn validate_serving(&self, errs: &mut Vec<String>) {
        let s = &self.serving;
        if s.tls_cert_file.is_some() != s.tls_private_key_file.is_some() {
            errs.push(
                "--tls-cert-file and --tls-private-key-file must be given together".to_string(),
            );
        }
        if tls_min_version(s.tls_min_version.as_deref()).is_none() {
            errs.push(format!(
                "--tls-min-version={:?}: use VersionTLS12 or VersionTLS13",
                s.tls_min_version.as_deref().unwrap_or_default()
            ));
        }
        if let Some(port) = self.webhook_secure_port
            && port != 0
            && port == s.secure_port
        {
            errs.push("--webhook-secure-port cannot be the same value as --secure-port".into());
        }
        for p in &self.authz.authorization_always_allow_paths {
            let p = p.trim();
            if p.contains('*') && !p.ends_with('*') {
                errs.push(format!(
                    "--authorization-always-allow-paths: {p:?}: only a trailing * (prefix match) is allowed"
                ));
            }
        }
    }

    /// Upstream's `LeaderMigrationOptions.ApplyTo`: the file (or the default configuration),
    /// validated; errors name the flag, the file's field and the fix.
    fn validate_leader_migration(
        &self,
        errs: &mut Vec<String>,
    ) -> Option<crate::leader_migration::LeaderMigrationConfig> {
        use crate::leader_migration::LeaderMigrationConfig;
        if self.enable_leader_migration != Some(true) || !self.leader_elect {
            return None;
        }
        let path = self
            .leader_migration_config
            .as_deref()
            .filter(|p| !p.is_empty());
        let loaded = match path {
            Some(p) => LeaderMigrationConfig::load(std::path::Path::new(p)),
            None => Ok(LeaderMigrationConfig::default_config()),
        };
        let cfg = match loaded {
            Ok(cfg) => cfg,
            Err(problems) => {
                let p = path.unwrap_or_default();
                errs.extend(
                    problems
                        .into_iter()
                        .map(|e| format!("--leader-migration-config={p}: {e}")),
                );
                return None;
            }
        };
        if cfg.leader_name == self.leader_elect_resource_name {
            errs.push(format!(
                "--leader-migration-config: leaderName {:?} is the main lease (--leader-elect-resource-name); the migration lease needs its own name, e.g. {}",
                cfg.leader_name,
                crate::leader_migration::DEFAULT_LEADER_NAME
            ));
        }
        Some(cfg)
    }

    /// One line per flag given that ccm-rs accepts without acting on it (or only partly),
    /// saying why; printed at startup so an operator never mistakes "accepted" for "done".
    pub fn notices(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut inert = |given: bool, flag: &str, why: &str| {
            if given {
                out.push(format!("{flag} has no effect in ccm-rs: {why}"));
            }
        };
        inert(
            self.contention_profiling.is_some(),
            "--contention-profiling",
            "there is no Go profiler to serve",
        );
        inert(
            self.enable_leader_migration == Some(true) && !self.leader_elect,
            "--enable-leader-migration",
            "it needs --leader-elect=true; without leader election every enabled controller runs (as upstream)",
        );
        inert(
            self.leader_migration_config.is_some() && self.enable_leader_migration != Some(true),
            "--leader-migration-config",
            "leader migration is off; add --enable-leader-migration",
        );
        inert(
            self.external_cloud_volume_plugin.is_some(),
            "--external-cloud-volume-plugin",
            "ccm-rs runs no volume controllers",
        );
        inert(
            self.node_sync_period.is_some(),
            "--node-sync-period",
            "deprecated upstream, a no-op there too",
        );
        inert(
            self.validation_webhook_config_file.is_some(),
            "--validation-webhook-config-file",
            "webhooks are configured by --webhooks and the provider",
        );
        inert(
            self.webhook_ca_cert_file.is_some(),
            "--webhook-ca-cert-file",
            "the caBundle of the WebhookConfiguration carries the CA",
        );
        let s = &self.serving;
        inert(
            !s.tls_cipher_suites.is_empty(),
            "--tls-cipher-suites",
            "rustls offers only modern AEAD suites and always uses its own list",
        );
        inert(
            !s.tls_sni_cert_key.is_empty(),
            "--tls-sni-cert-key",
            "one serving certificate answers every server name",
        );
        let a = &self.authn;
        let front_proxy = !a.requestheader_username_headers.is_empty()
            || !a.requestheader_uid_headers.is_empty()
            || !a.requestheader_group_headers.is_empty()
            || !a.requestheader_extra_headers_prefix.is_empty()
            || a.requestheader_client_ca_file.is_some()
            || !a.requestheader_allowed_names.is_empty();
        inert(
            front_proxy,
            "--requestheader-*",
            "front-proxy authentication is not implemented; use bearer tokens or --client-ca-file",
        );
        inert(
            self.vmodule.is_some(),
            "--vmodule",
            "use RUST_LOG=<module>=<level> for per-module verbosity",
        );
        inert(
            self.log_flush_frequency.is_some(),
            "--log-flush-frequency",
            "log lines are written unbuffered",
        );
        for (given, flag) in [
            (
                self.log_json_split_stream.is_some(),
                "--log-json-split-stream",
            ),
            (
                self.log_json_info_buffer_size.is_some(),
                "--log-json-info-buffer-size",
            ),
            (
                self.log_text_split_stream.is_some(),
                "--log-text-split-stream",
            ),
            (
                self.log_text_info_buffer_size.is_some(),
                "--log-text-info-buffer-size",
            ),
        ] {
            inert(given, flag, "all log lines go to stderr, unbuffered");
        }
        inert(
            self.cidr_allocator_type != "RangeAllocator",
            "--cidr-allocator-type",
            "node IPAM is not part of ccm-rs",
        );
        inert(
            self.min_resync_period.0 != Duration::from_secs(12 * 3600),
            "--min-resync-period",
            "caches are event-driven and never resync",
        );
        inert(
            self.kube_api_content_type != "application/json",
            "--kube-api-content-type",
            "kube-rs speaks JSON",
        );
        for gate in &self.feature_gates {
            let name = gate
                .split_once('=')
                .map_or(gate.as_str(), |(k, _)| k)
                .trim();
            inert(
                INERT_FEATURE_GATES.contains(&name),
                &format!("--feature-gates={name}"),
                "the gate governs Go logging, metrics or apiserver code that ccm-rs does not have",
            );
        }
        out
    }

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
        self.validate_serving(&mut errs);
        let leader_migration = self.validate_leader_migration(&mut errs);
        if let Err(e) = crate::webhook::check_syntax(&self.webhooks) {
            errs.push(e);
        }
        if self.webhook_tls_cert_file.is_some() != self.webhook_tls_private_key_file.is_some() {
            errs.push(
                "--webhook-tls-cert-file and --webhook-tls-private-key-file must be given together"
                    .into(),
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
            } else if INERT_FEATURE_GATES.contains(&k) {
                // Upstream's logging/metrics/apiserver gates: accepted, see notices().
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
                leader_migration,
                options: self,
            })
        } else {
            Err(OptionsError(errs))
        }
    }
}

#[cfg(test)]
mod tests {
    /// Found by the `small_parsers` fuzz target: a long number panicked in
    /// `Duration::from_secs_f64`.
    #[test]
    fn a_duration_past_gos_limit_is_an_error_not_a_panic() {
        let long = format!("{}s", "3".repeat(86));
        let e = parse_go_duration(&long).expect_err("overflows");
        assert!(e.contains("292 years"), "{e}");
        assert!(parse_go_duration("2562047h").is_ok(), "inside Go's limit");
        assert!(parse_go_duration("2562048h").is_err(), "past Go's limit");
    }

    use super::*;

    /// The cloud-node controller writes twice per Node. With the default limit, a 50,000-Node
    /// scale-up registering as fast as `ccm bench scale`'s kubelets (about 400 Nodes/s) is
    /// never paced by it: at the old burst of 12,000 the last Nodes waited 53 s.
    #[test]
    fn the_default_limit_lets_a_50000_node_scale_up_through_unpaced() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            o: RunOptions,
        }
        let o = <Cli as clap::Parser>::try_parse_from(["ccm"])
            .expect("defaults")
            .o;
        let start = tokio::time::Instant::now();
        let mut bucket = ccm_cloud::TokenBucket::new(o.kube_api_qps, o.kube_api_burst, start);
        let (writes, seconds) = (2 * 50_000 * 6 / 5, 120.0);
        let paced = (0..writes)
            .filter(|i| {
                let at = Duration::from_secs_f64(seconds * f64::from(*i) / f64::from(writes));
                !bucket.try_take(start + at)
            })
            .count();
        assert_eq!(
            paced, 0,
            "{paced} of {writes} writes would wait for the limit"
        );
    }

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
