//! The route controller (`node-route-controller`, alias `route`): one cloud route per node pod
//! CIDR, and the node's `NetworkUnavailable` condition.
//!
//! A sync is one `ListRoutes`, the [`planner`]'s creates and deletes (at most
//! [`RouteConfig::max_concurrent_route_ops`] in flight), then condition patches only where they
//! change something. Watch mode plans over what changed, so a change costs the same in a
//! cluster of 100 Nodes or 50,000 (see `Scope`):
//! - a sync for a node change that only has routes to *create* skips the listing: it plans the
//!   changed Nodes against the last known listing (the last `ListRoutes` plus this
//!   controller's own creates and deletes since), so a node joining a quiet cluster is routed
//!   after one cloud round trip instead of two;
//! - any other sync for node changes (deletes, address changes, a fast-path create the cloud
//!   refuses because the known listing was stale) and the confirming listing after fast
//!   syncs list, then plan over the changed Nodes, the Nodes fast syncs planned since the last
//!   listing, and every Node whose listed routes differ from the known ones;
//! - the startup and safety resyncs, retries and interval mode plan over every Node.
//!
//! What differs between the modes is *when* a sync runs ([`RouteMode`]):
//! - [`RouteMode::Interval`] (upstream's default): every `--route-reconciliation-period`,
//!   non-sliding, whether or not anything changed (`trigger="periodic"`);
//! - [`RouteMode::Watch`] (upstream's `CloudControllerManagerWatchBasedRoutesReconciliation`
//!   gate; **on by default in ccm-rs**): when a node is added or deleted or its pod CIDRs or
//!   addresses change (`node_change`), coalesced into one pending sync — syncs run back to
//!   back, each creating every route that became due while the previous one ran, and are
//!   spaced by [`RouteConfig::min_sync_interval`] only while the cloud throttles
//!   ([`limiter`]); a failed sync is
//!   retried with backoff (`retry`), which upstream's watch mode forgets to do; and a safety
//!   resync (`resync`) repairs drift made in the cloud behind the controller's back.
//!
//! `route_controller_route_sync_total{trigger,outcome}` counts syncs, so the difference between
//! the modes is visible on a dashboard: an idle cluster in watch mode shows a flat line.

mod known;
pub mod limiter;
pub mod planner;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use ccm_cloud::{CloudError, Routes};
use futures::StreamExt;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams};
use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::context::{Shared, StartError};
use crate::events::{EventType, Recorder};
use crate::informer::Change;
use crate::nodeutil::{
    ConditionStatus, TAINT_UNINITIALIZED, condition_status, has_taint, pod_cidrs,
};
use crate::queue::{Backoff, WorkQueue};
use known::KnownRoutes;
use planner::{NETWORK_UNAVAILABLE, NodeView, RouteCreate, RoutePlan};

/// Upstream's event source (`source.component`) for route events.
pub const EVENT_SOURCE: &str = "route_controller";
/// Upstream's event reason when a route cannot be created.
pub const REASON_FAILED_TO_CREATE_ROUTE: &str = "FailedToCreateRoute";
/// The feature gate that selects [`RouteMode::Watch`] (same name as upstream).
pub const WATCH_GATE: &str = "CloudControllerManagerWatchBasedRoutesReconciliation";
/// Workqueue name of watch mode, as upstream (`workqueue_*{name="Routes"}`; the KEP's SLI is
/// `workqueue_work_duration_seconds_count{name="Routes"}`).
pub const QUEUE_NAME: &str = "Routes";
/// How many condition patches are in flight at once (API server writes, not cloud calls).
const CONDITION_PATCH_CONCURRENCY: usize = 16;
/// The single key of the watch-mode queue: one sync covers every pending reason (`Reasons`).
const KEY: () = ();

/// When syncs run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteMode {
    /// Full reconcile every [`RouteConfig::reconciliation_period`] (gate off; upstream default).
    Interval,
    /// Reconcile on node changes, failures and a safety resync (gate on; ccm-rs default).
    Watch,
}

/// Route controller settings, from flags.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    /// `--cluster-cidr`: one CIDR or a v4+v6 pair. Only routes whose first or last IP lies in
    /// one of these are ever deleted. Required (see [`parse_cluster_cidrs`]); no default.
    pub cluster_cidrs: Vec<IpNet>,
    /// `--configure-cloud-routes` (default `true`): `false` skips the controller.
    pub configure_cloud_routes: bool,
    /// Interval or watch mode: `--feature-gates=CloudControllerManagerWatchBasedRoutesReconciliation=…`.
    /// Default [`RouteMode::Watch`] (upstream: alpha, off).
    pub mode: RouteMode,
    /// `--route-reconciliation-period` (default 10s): the period of interval mode; unused in
    /// watch mode, as upstream.
    pub reconciliation_period: Duration,
    /// Watch mode's storm limiter while the cloud throttles (default **1s**; upstream's token
    /// bucket allows one sync per 10s, always): after a throttled answer, at most one sync
    /// starts per interval (and none before the cloud's retry-after) until 10 s pass without
    /// another refusal. While the cloud answers normally no sync waits: a storm is coalesced
    /// by the queue instead (changes during a sync fold into the next one, which creates all
    /// their routes at once), so a node's route is never delayed by a timer.
    pub min_sync_interval: Duration,
    /// Watch mode's safety resync (default 30 min): a reconcile over every Node after this
    /// long without one, to repair what no listing since showed as changed (a condition
    /// edited by someone else, say); route drift is repaired by the listings in between.
    /// Upstream relies on the node informer's 12–24 h resync.
    pub resync_period: Duration,
    /// Watch mode: how long after the last sync planned from the known listing (the fast
    /// path) a confirming listing (`ListRoutes`, trigger `resync`) runs, to repair whatever
    /// the known listing missed — blackholes, routes changed behind the controller's back
    /// (default 2s). A burst of fast syncs is confirmed once, after its last one; a sync that
    /// lists meanwhile confirms too. Short, so a quiet cluster is confirmed before it counts as
    /// idle; long enough that nodes joining a second apart share one confirmation.
    pub confirm_delay: Duration,
    /// Cloud create/delete calls in flight at once per sync (default 200, upstream's constant).
    pub max_concurrent_route_ops: usize,
    /// Watch mode: delay before re-running a failed sync, doubling per consecutive failure
    /// (default 10s → 1 min). Upstream's watch mode never retries failed route operations. The
    /// cap bounds how long routes wait after a long cloud outage ends (in `ccm bench chaos` the
    /// retries had grown to 300 s during an outage under a 5-minute cap); one `ListRoutes` a
    /// minute while the cloud fails is nothing.
    pub retry_backoff: Backoff,
}

impl Default for RouteConfig {
    fn default() -> Self {
        RouteConfig {
            cluster_cidrs: Vec::new(),
            configure_cloud_routes: true,
            mode: RouteMode::Watch,
            reconciliation_period: Duration::from_secs(10),
            min_sync_interval: Duration::from_secs(1),
            resync_period: Duration::from_secs(30 * 60),
            confirm_delay: Duration::from_secs(2),
            max_concurrent_route_ops: 200,
            retry_backoff: Backoff {
                base: Duration::from_secs(10),
                max: Duration::from_secs(60),
            },
        }
    }
}

/// A `--cluster-cidr` value that cannot be used; the message names the flag and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterCidrError {
    /// No CIDR given while routes are configured.
    #[error(
        "--cluster-cidr: required when --configure-cloud-routes=true (the default); give the pod network CIDR (e.g. 10.244.0.0/16, or a dual-stack pair 10.244.0.0/16,fd00:10:244::/56), or set --configure-cloud-routes=false"
    )]
    Missing,
    /// An entry does not parse.
    #[error("--cluster-cidr: {value:?} is not a CIDR (expected e.g. 10.244.0.0/16): {reason}")]
    Unparsable {
        /// The offending entry.
        value: String,
        /// The parser's complaint.
        reason: String,
    },
    /// Two CIDRs of one family, or more than two.
    #[error(
        "--cluster-cidr: {0}; give one CIDR, or one IPv4 and one IPv6 CIDR separated by a comma"
    )]
    NotDualStack(String),
}

/// Parses `--cluster-cidr` as upstream: comma-separated, trimmed; one CIDR, or a pair with one
/// IPv4 and one IPv6 CIDR.
pub fn parse_cluster_cidrs(value: &str) -> Result<Vec<IpNet>, ClusterCidrError> {
    let parts: Vec<&str> = value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let nets = parts
        .iter()
        .map(|p| {
            p.parse::<IpNet>()
                .map_err(|e| ClusterCidrError::Unparsable {
                    value: (*p).to_string(),
                    reason: e.to_string(),
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    validate_cluster_cidrs(&nets)?;
    Ok(nets)
}

/// Checks an already-parsed CIDR list (what [`RouteConfig::cluster_cidrs`] holds).
pub fn validate_cluster_cidrs(nets: &[IpNet]) -> Result<(), ClusterCidrError> {
    match nets {
        [] => Err(ClusterCidrError::Missing),
        [_] => Ok(()),
        [a, b] if a.addr().is_ipv4() != b.addr().is_ipv4() => Ok(()),
        [a, b] => Err(ClusterCidrError::NotDualStack(format!(
            "{a} and {b} are of the same IP family"
        ))),
        more => Err(ClusterCidrError::NotDualStack(format!(
            "{} CIDRs given, at most 2 are allowed",
            more.len()
        ))),
    }
}

/// Why a sync ran: the `trigger` label of `route_controller_route_sync_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SyncTrigger {
    /// Interval mode's tick.
    Periodic,
    /// Watch mode: a node was added or deleted, or its pod CIDRs or addresses changed.
    NodeChange,
    /// Watch mode: re-running a sync that failed.
    Retry,
    /// Watch mode: the startup sync and the safety resync.
    Resync,
}

impl SyncTrigger {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            SyncTrigger::Periodic => "periodic",
            SyncTrigger::NodeChange => "node_change",
            SyncTrigger::Retry => "retry",
            SyncTrigger::Resync => "resync",
        }
    }
}

/// How a sync ended: the `outcome` label of `route_controller_route_sync_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SyncOutcome {
    /// Routes were created or deleted, or a condition written, and nothing failed.
    Changed,
    /// Nothing needed doing: the steady state.
    Noop,
    /// Listing routes failed, or a route operation or condition write failed.
    Error,
}

impl SyncOutcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            SyncOutcome::Changed => "changed",
            SyncOutcome::Noop => "noop",
            SyncOutcome::Error => "error",
        }
    }
}

/// Sync counts by trigger and outcome: the same numbers as
/// `route_controller_route_sync_total`, readable by tests and `ccm demo`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncCounts(pub BTreeMap<(SyncTrigger, SyncOutcome), u64>);

impl SyncCounts {
    /// All syncs (upstream's unlabeled counter).
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// Syncs with this trigger and outcome.
    pub fn get(&self, trigger: SyncTrigger, outcome: SyncOutcome) -> u64 {
        self.0.get(&(trigger, outcome)).copied().unwrap_or(0)
    }

    /// Syncs with this trigger, whatever the outcome.
    pub fn by_trigger(&self, trigger: SyncTrigger) -> u64 {
        self.0
            .iter()
            .filter(|((t, _), _)| *t == trigger)
            .map(|(_, n)| n)
            .sum()
    }

    /// Syncs with this outcome, whatever the trigger.
    pub fn by_outcome(&self, outcome: SyncOutcome) -> u64 {
        self.0
            .iter()
            .filter(|((_, o), _)| *o == outcome)
            .map(|(_, n)| n)
            .sum()
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SyncLabels {
    trigger: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TriggerLabels {
    trigger: &'static str,
}

/// The controller's metrics.
#[derive(Clone)]
struct Metrics {
    syncs: Family<SyncLabels, Counter>,
    ops: Family<OpLabels, Counter>,
    duration: Family<TriggerLabels, Histogram>,
    managed: Gauge,
}

impl Metrics {
    fn new(registry: &mut Registry) -> Self {
        let m = Metrics {
            syncs: Family::default(),
            ops: Family::default(),
            duration: Family::new_with_constructor(|| {
                // 1 ms … ~16 s: a sync is one list plus concurrent mutations.
                Histogram::new(exponential_buckets(0.001, 2.0, 15))
            }),
            managed: Gauge::default(),
        };
        registry.register(
            "route_controller_route_sync",
            "Route syncs by what triggered them and how they ended; the sum over labels is upstream's route_controller_route_sync_total",
            m.syncs.clone(),
        );
        registry.register(
            "route_controller_route_operations",
            "Cloud route create and delete calls by result",
            m.ops.clone(),
        );
        registry.register(
            "route_controller_route_sync_duration_seconds",
            "Duration of one route sync: list, mutations and condition writes",
            m.duration.clone(),
        );
        registry.register(
            "route_controller_managed_routes",
            "Routes inside the cluster CIDRs after the last sync",
            m.managed.clone(),
        );
        m
    }
}

struct HandleInner {
    counts: Mutex<BTreeMap<(SyncTrigger, SyncOutcome), u64>>,
    /// Syncs planned against the known listing, without a `ListRoutes`.
    from_known: AtomicU64,
    /// Nodes the planner has looked at, over all syncs.
    planned: AtomicU64,
    routed: Mutex<Option<BTreeSet<String>>>,
    running: AtomicUsize,
    queue: Option<WorkQueue<()>>,
}

/// A cheap, cloneable view of the controller for tests, `ccm demo` and the node controller.
#[derive(Clone)]
pub struct RouteHandle {
    inner: Arc<HandleInner>,
}

impl RouteHandle {
    /// Sync counts so far, by trigger and outcome.
    pub fn syncs(&self) -> SyncCounts {
        SyncCounts(self.inner.counts.lock().clone())
    }

    /// Syncs that planned against the last known listing instead of calling `ListRoutes` (the
    /// fast path of a node change that only needs route creates).
    pub fn syncs_from_known(&self) -> u64 {
        self.inner.from_known.load(Ordering::SeqCst)
    }

    /// How many Nodes the planner has looked at, over all syncs: a sync for a node change
    /// plans over the changed Nodes only, so a join adds one here (and its confirming listing
    /// one more) however large the cluster.
    pub fn nodes_planned(&self) -> u64 {
        self.inner.planned.load(Ordering::SeqCst)
    }

    /// Work not yet done: a sync running, pending, or a retry scheduled. Zero means idle (a
    /// change the node cache has not delivered yet is not counted).
    pub fn pending(&self) -> usize {
        let queued = self.inner.queue.as_ref().map(|q| q.pending()).unwrap_or(0);
        queued + self.inner.running.load(Ordering::SeqCst)
    }

    /// Nodes whose every pod CIDR had its route at the end of the last sync; `None` before the
    /// first sync.
    pub fn routed_nodes(&self) -> Option<BTreeSet<String>> {
        self.inner.routed.lock().clone()
    }

    /// Whether `node` had all its routes at the end of the last sync.
    pub fn has_routes(&self, node: &str) -> bool {
        self.inner
            .routed
            .lock()
            .as_ref()
            .is_some_and(|s| s.contains(node))
    }
}

/// Which sync reasons are pending in watch mode (the queue holds one key; this says why).
#[derive(Debug, Default)]
struct Reasons {
    node_change: bool,
    retry: bool,
    resync: bool,
    /// The confirming listing after fast syncs is due.
    confirm: bool,
    /// The Nodes whose changes are pending: what a node-change sync plans over.
    changed: HashSet<String>,
}

/// What one sync lists and plans over.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Scope {
    /// A fresh listing and every cached Node: the startup and safety resyncs, retries,
    /// interval mode.
    All,
    /// The changed Nodes against the known listing when that only creates routes (the fast
    /// path); otherwise as [`Scope::Listing`].
    Changes(HashSet<String>),
    /// A fresh listing, planned over these changed Nodes, the Nodes fast syncs planned since
    /// the last listing, and every Node whose listed routes differ from the known ones (drift:
    /// blackholes, routes changed behind the controller's back). Nodes none of that touches
    /// were consistent after the last plan that covered them, and nothing has changed them.
    Listing(HashSet<String>),
}

impl Reasons {
    /// The trigger to report for a sync that covers all pending reasons, clearing them, and
    /// what it plans over: the changed Nodes when changes (and the confirmation) are all that
    /// is pending, every Node for a retry or resync.
    fn take(&mut self) -> Option<(SyncTrigger, Scope)> {
        let t = if self.node_change {
            SyncTrigger::NodeChange
        } else if self.retry {
            SyncTrigger::Retry
        } else if self.resync || self.confirm {
            SyncTrigger::Resync
        } else {
            return None;
        };
        let changed = std::mem::take(&mut self.changed);
        let scope = if self.retry || self.resync {
            Scope::All
        } else if self.confirm {
            Scope::Listing(changed)
        } else {
            Scope::Changes(changed)
        };
        *self = Reasons::default();
        Some((t, scope))
    }

    /// Records a Node change.
    fn node_changed(&mut self, node: &str) {
        self.node_change = true;
        self.changed.insert(node.to_string());
    }
}

/// One cloud route call of a sync.
enum Op {
    Delete(ccm_cloud::Route),
    Create(RouteCreate),
}

/// How one cloud route call ended: a create or delete carries its route, a failed create its
/// (node, CIDR); failures carry the cloud's retry-after when it throttled.
enum OpResult {
    Created(ccm_cloud::Route),
    CreateFailed((String, String), Option<Duration>),
    Deleted(ccm_cloud::Route),
    DeleteFailed(Option<Duration>),
}

/// The pause a throttled answer asks for (its hint, or 1 s); `None` for other errors.
fn throttle_hint(e: &CloudError) -> Option<Duration> {
    match e {
        CloudError::Throttled { retry_after, .. } => {
            Some(retry_after.unwrap_or(Duration::from_secs(1)))
        }
        _ => None,
    }
}

/// The route controller (see the module docs).
pub struct RouteController {
    shared: Shared,
    routes: Arc<dyn Routes>,
    /// Condition writes; their replies are decoded slim, as nothing reads them.
    nodes_api: Api<crate::informer::slim::SlimNode>,
    config: RouteConfig,
    recorder: Recorder,
    metrics: Metrics,
    handle: RouteHandle,
    queue_shutdown: CancellationToken,
    /// Whether the cloud's routes track node addresses (`enable_node_addresses`), as of the
    /// last ListRoutes. Only then does an address change need a sync; until the first list,
    /// assume it does.
    tracks_addresses: Arc<std::sync::atomic::AtomicBool>,
    /// The cloud's routes as this controller knows them: the last `ListRoutes`, plus its own
    /// successful creates and deletes since. `None` before the first listing and after any
    /// failed cloud call (the cloud's state is then unknown until the next listing).
    known: Mutex<Option<KnownRoutes>>,
    /// The Nodes fast-path syncs planned since the last listing: the confirming listing plans
    /// over them again.
    unconfirmed: Mutex<HashSet<String>>,
}

/// What executing one plan did.
#[derive(Debug, Default)]
struct Executed {
    changed: bool,
    errors: usize,
    /// The longest retry-after of a throttled call, if any call was throttled.
    throttled: Option<Duration>,
}

impl Executed {
    fn throttled(&mut self, hint: Option<Duration>) {
        if let Some(h) = hint {
            self.throttled = Some(self.throttled.map_or(h, |t| t.max(h)));
        }
    }
}

impl RouteController {
    /// Builds the controller. `Skipped` when `--configure-cloud-routes=false` or the provider
    /// has no routes (upstream logs and skips); `Invalid` when `--cluster-cidr` is missing or
    /// not one CIDR / a dual-stack pair (upstream exits with a fatal log), or a period is zero.
    pub fn new(
        shared: Shared,
        client: kube::Client,
        config: RouteConfig,
        registry: &mut Registry,
    ) -> Result<Self, StartError> {
        if !config.configure_cloud_routes {
            return Err(StartError::Skipped(
                "route controller not started: --configure-cloud-routes=false".into(),
            ));
        }
        let Some(routes) = shared.provider.routes() else {
            return Err(StartError::Skipped(format!(
                "route controller not started: cloud provider {:?} does not support routes",
                shared.provider.provider_name()
            )));
        };
        validate_cluster_cidrs(&config.cluster_cidrs)
            .map_err(|e| StartError::Invalid(e.to_string()))?;
        if config.max_concurrent_route_ops == 0 {
            return Err(StartError::Invalid(
                "max concurrent route operations: must be at least 1".into(),
            ));
        }
        match config.mode {
            RouteMode::Interval if config.reconciliation_period.is_zero() => {
                return Err(StartError::Invalid(
                    "--route-reconciliation-period: must be greater than 0 (default 10s)".into(),
                ));
            }
            RouteMode::Watch if config.resync_period.is_zero() => {
                return Err(StartError::Invalid(
                    "--route-resync-period: must be greater than 0 (default 30m)".into(),
                ));
            }
            _ => {}
        }
        let queue_shutdown = CancellationToken::new();
        let queue = (config.mode == RouteMode::Watch).then(|| {
            WorkQueue::new(
                QUEUE_NAME,
                config.retry_backoff,
                shared.queue_metrics.clone(),
                queue_shutdown.clone(),
            )
        });
        let handle = RouteHandle {
            inner: Arc::new(HandleInner {
                counts: Mutex::default(),
                routed: Mutex::default(),
                from_known: AtomicU64::new(0),
                planned: AtomicU64::new(0),
                running: AtomicUsize::new(0),
                queue,
            }),
        };
        // Announced here, not in `run`: a cloud-node batch processed before this controller's
        // task is first polled must already wait for (and fold) the Node's route.
        shared.routed.activate();
        Ok(RouteController {
            routes,
            nodes_api: Api::all(client.clone()),
            recorder: shared.recorder(&client, EVENT_SOURCE),
            metrics: Metrics::new(registry),
            shared,
            config,
            handle,
            queue_shutdown,
            tracks_addresses: Arc::new(std::sync::atomic::AtomicBool::new(true)),
            known: Mutex::new(None),
            unconfirmed: Mutex::default(),
        })
    }

    /// A probe for tests and `ccm demo`: sync counts, idleness, routed nodes.
    pub fn handle(&self) -> RouteHandle {
        self.handle.clone()
    }

    /// Runs until `shutdown`: waits for the node cache, then syncs per [`RouteConfig::mode`].
    pub async fn run(self, shutdown: CancellationToken) {
        let _stop_queue = self.queue_shutdown.clone().drop_guard();
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = self.shared.nodes.wait_ready() => {}
        }
        tracing::info!(
            mode = ?self.config.mode,
            cluster_cidrs = ?self.config.cluster_cidrs,
            "starting route controller"
        );
        match self.config.mode {
            RouteMode::Interval => self.run_interval(shutdown).await,
            RouteMode::Watch => self.run_watch(shutdown).await,
        }
    }

    /// Upstream's `wait.NonSlidingUntil(reconcile, period)`: the period counts from each start.
    async fn run_interval(&self, shutdown: CancellationToken) {
        loop {
            let start = Instant::now();
            let _ = self.sync(SyncTrigger::Periodic, Scope::All).await;
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep_until(start + self.config.reconciliation_period) => {}
            }
        }
    }

    async fn run_watch(&self, shutdown: CancellationToken) {
        let Some(queue) = self.handle.inner.queue.clone() else {
            return;
        };
        let reasons = Arc::new(Mutex::new(Reasons::default()));
        // Subscribe after the cache is ready; the snapshot of existing nodes that `subscribe`
        // replays is covered by the startup sync, so drop it.
        let mut changes = self.shared.nodes.subscribe();
        while changes.try_recv().is_ok() {}
        reasons.lock().resync = true;
        queue.add(KEY);

        let watcher = {
            let (queue, reasons, shutdown) = (queue.clone(), reasons.clone(), shutdown.clone());
            let tracks_addresses = self.tracks_addresses.clone();
            tokio::spawn(async move {
                loop {
                    let change = tokio::select! {
                        _ = shutdown.cancelled() => return,
                        c = changes.recv() => match c { Some(c) => c, None => return },
                    };
                    if needs_sync(&change, tracks_addresses.load(Ordering::Relaxed))
                        && let Some(node) = change.new.as_ref().or(change.old.as_ref())
                    {
                        reasons.lock().node_changed(ccm_cloud::node_name(node));
                        queue.add(KEY);
                    }
                }
            })
        };

        let mut limiter = limiter::StormLimiter::new(self.config.min_sync_interval);
        // The last sync over every Node: the safety resync counts from it.
        let mut last_full = Instant::now();
        // When the last fast-path sync must be confirmed by a listing.
        let mut confirm_due: Option<Instant> = None;
        loop {
            let resync_due = last_full + self.config.resync_period;
            let due = confirm_due.map_or(resync_due, |c| c.min(resync_due));
            tokio::select! {
                _ = shutdown.cancelled() => break,
                k = queue.get() => if k.is_none() { break },
                _ = tokio::time::sleep_until(due) => {
                    if confirm_due.is_some_and(|c| c <= resync_due) {
                        reasons.lock().confirm = true;
                    } else {
                        reasons.lock().resync = true;
                        last_full = Instant::now();
                    }
                    queue.add(KEY);
                    confirm_due = None;
                    continue;
                }
            }
            // Storm limiter: waits only while the cloud throttles. Changes arriving meanwhile
            // (or during a sync) mark the processing key dirty and fold into the next sync.
            if let Some(gate) = limiter.next_start(Instant::now()) {
                tokio::select! {
                    _ = shutdown.cancelled() => { queue.done(&KEY); break }
                    _ = tokio::time::sleep_until(gate) => {}
                }
            }
            // Taken right before the sync (upstream's Forget-before-process): a change that
            // arrives during the sync sets its reason again and queues another sync.
            let Some((trigger, scope)) = reasons.lock().take() else {
                // A stale retry: a later sync already succeeded.
                queue.done(&KEY);
                continue;
            };
            limiter.started(Instant::now());
            let fast_before = self.handle.syncs_from_known();
            let full = scope == Scope::All;
            let (outcome, throttled) = self.sync(trigger, scope).await;
            let last_end = Instant::now();
            if full {
                last_full = last_end;
            }
            confirm_due = (self.handle.syncs_from_known() > fast_before)
                .then(|| last_end + self.config.confirm_delay);
            limiter.ended(last_end, throttled);
            if outcome == SyncOutcome::Error {
                reasons.lock().retry = true;
                let delay = queue.add_rate_limited(KEY);
                tracing::info!(?delay, "route sync failed; retrying with backoff");
            } else {
                queue.forget(&KEY);
            }
            queue.done(&KEY);
        }
        watcher.abort();
    }

    /// One reconcile, counted and timed; also returns the cloud's retry-after when a call was
    /// throttled.
    async fn sync(&self, trigger: SyncTrigger, scope: Scope) -> (SyncOutcome, Option<Duration>) {
        self.handle.inner.running.fetch_add(1, Ordering::SeqCst);
        let started = Instant::now();
        let (outcome, throttled) = match self.reconcile(scope).await {
            Ok(Executed {
                errors: 0,
                changed,
                throttled,
            }) => {
                let o = if changed {
                    SyncOutcome::Changed
                } else {
                    SyncOutcome::Noop
                };
                (o, throttled)
            }
            Ok(Executed {
                errors, throttled, ..
            }) => {
                tracing::warn!(errors, "route sync finished with failed operations");
                (SyncOutcome::Error, throttled)
            }
            Err(e) => {
                tracing::warn!(error = %e, "route sync failed: could not list routes");
                (SyncOutcome::Error, throttle_hint(&e))
            }
        };
        let elapsed = started.elapsed();
        self.metrics
            .duration
            .get_or_create(&TriggerLabels {
                trigger: trigger.as_str(),
            })
            .observe(elapsed.as_secs_f64());
        self.metrics
            .syncs
            .get_or_create(&SyncLabels {
                trigger: trigger.as_str(),
                outcome: outcome.as_str(),
            })
            .inc();
        *self
            .handle
            .inner
            .counts
            .lock()
            .entry((trigger, outcome))
            .or_default() += 1;
        tracing::debug!(
            trigger = trigger.as_str(),
            outcome = outcome.as_str(),
            ?elapsed,
            "route sync"
        );
        self.handle.inner.running.fetch_sub(1, Ordering::SeqCst);
        (outcome, throttled)
    }

    /// List, plan, execute: upstream's `reconcileNodeRoutes`; a node change that only needs
    /// creates skips the list, and a sync for changes plans over what changed (see
    /// [`Scope`]).
    async fn reconcile(&self, scope: Scope) -> Result<Executed, CloudError> {
        let cidrs = &self.config.cluster_cidrs;
        let changed = match scope {
            Scope::All => None,
            Scope::Listing(changed) => Some(changed),
            Scope::Changes(changed) => {
                if let Some((plan, managed)) = self.plan_from_known(&changed) {
                    if let Some(done) = self.apply(&plan, managed, Some(&changed), true).await {
                        self.handle.inner.from_known.fetch_add(1, Ordering::SeqCst);
                        self.unconfirmed.lock().extend(changed);
                        return Ok(done);
                    }
                    tracing::info!(
                        "a route create from the known listing was refused; listing routes"
                    );
                }
                Some(changed)
            }
        };
        let cluster = self.shared.cluster_name.as_str();
        let routes = match self.routes.list_routes(cluster).await {
            Ok(r) => r,
            Err(e) => {
                *self.known.lock() = None;
                return Err(e);
            }
        };
        self.tracks_addresses.store(
            routes.iter().any(|r| r.enable_node_addresses),
            Ordering::Relaxed,
        );
        let old = self.known.lock().take();
        let unconfirmed = std::mem::take(&mut *self.unconfirmed.lock());
        if let (Some(old), Some(changed)) = (old, changed) {
            return Ok(self
                .reconcile_scoped(routes, &old, changed, unconfirmed)
                .await);
        }
        let nodes = self.node_views();
        self.count_planned(nodes.len());
        let plan = planner::plan(&nodes, &routes, cidrs);
        let known = KnownRoutes::from_listing(routes, cidrs);
        let managed = known.managed();
        *self.known.lock() = Some(known);
        Ok(self
            .apply(&plan, managed, None, false)
            .await
            .unwrap_or_default())
    }

    /// A listing planned over part of the cluster ([`Scope::Listing`]): the changed Nodes,
    /// the `unconfirmed` ones (planned from the known listing since the last listing), and
    /// the Nodes whose listed routes differ from `old`, the known listing before this one.
    async fn reconcile_scoped(
        &self,
        routes: Vec<ccm_cloud::Route>,
        old: &KnownRoutes,
        mut scope: HashSet<String>,
        unconfirmed: HashSet<String>,
    ) -> Executed {
        let cidrs = &self.config.cluster_cidrs;
        let fresh = KnownRoutes::from_listing(routes, cidrs);
        scope.extend(unconfirmed);
        scope.extend(fresh.differing_nodes(old));
        let nodes = self.planned_views(&scope);
        let plan = planner::plan(&nodes, &fresh.for_nodes(&scope), cidrs);
        let managed = fresh.managed();
        *self.known.lock() = Some(fresh);
        self.apply(&plan, managed, Some(&scope), false)
            .await
            .unwrap_or_default()
    }

    /// The cached ones of `scope`'s Nodes as the planner sees them, counted as planned.
    fn planned_views(&self, scope: &HashSet<String>) -> Vec<NodeView> {
        let nodes: Vec<NodeView> = scope
            .iter()
            .filter_map(|name| self.shared.nodes.get(name))
            .map(|n| NodeView::from_node(&n))
            .collect();
        self.count_planned(nodes.len());
        nodes
    }

    fn count_planned(&self, nodes: usize) {
        self.handle
            .inner
            .planned
            .fetch_add(nodes as u64, Ordering::SeqCst);
    }

    /// The cached Nodes as the planner sees them.
    fn node_views(&self) -> Vec<NodeView> {
        self.shared
            .nodes
            .list()
            .iter()
            .map(|n| NodeView::from_node(n))
            .collect()
    }

    /// The fast path's plan: over the changed Nodes and the known routes to them, when all it
    /// has to do is create routes (and write the condition of the nodes it creates them for,
    /// or of nodes whose condition the cloud-node controller folds into its own write: no write
    /// here). Anything that deletes (a deleted Node's routes, a changed CIDR), or writes another
    /// node's condition, is left to a sync that lists: the known listing may miss blackholes and
    /// changes made behind the controller's back.
    fn plan_from_known(&self, scope: &HashSet<String>) -> Option<(RoutePlan, i64)> {
        let known = self.known.lock();
        let known = known.as_ref()?;
        let cidrs = &self.config.cluster_cidrs;
        let nodes = self.planned_views(scope);
        let plan = planner::plan(&nodes, &known.for_nodes(scope), cidrs);
        let creating: HashSet<&str> = plan
            .creates
            .iter()
            .map(|c| c.route.target_node.as_str())
            .collect();
        let folds = self.shared.routed.node_folds();
        let folded = |node: &str| {
            folds
                && self
                    .shared
                    .nodes
                    .get(node)
                    .is_some_and(|n| has_taint(&n, TAINT_UNINITIALIZED))
        };
        let only_creates = !plan.creates.is_empty()
            && plan.deletes.is_empty()
            && plan
                .conditions
                .iter()
                .all(|u| creating.contains(u.node.as_str()) || folded(&u.node));
        only_creates.then(|| (plan, known.managed()))
    }

    /// Executes `plan`: route calls, routed nodes, condition writes. `managed` counts the
    /// routes inside the cluster CIDRs before it. `scope`: the Nodes the plan covers (`None`:
    /// all of them). `None` returned (`from_known` only, the fast path): a create was refused
    /// without throttling, so the known listing was stale and nothing else was done — the
    /// caller lists and plans again.
    async fn apply(
        &self,
        plan: &RoutePlan,
        mut managed: i64,
        scope: Option<&HashSet<String>>,
        from_known: bool,
    ) -> Option<Executed> {
        let mut done = Executed::default();
        if plan.is_empty() {
            self.metrics.managed.set(managed);
            self.publish_routed(plan.routed_nodes(&HashSet::new()), scope);
            return Some(done);
        }
        tracing::info!(
            creates = plan.creates.len(),
            deletes = plan.deletes.len(),
            conditions = plan.conditions.len(),
            from_known,
            "reconciling routes"
        );
        // Nodes whose routes all exist already are routed now; the others join one by one as
        // their creates return (`execute_routes`), not when the whole sync ends.
        match scope {
            None => self.shared.routed.publish(plan.routed_without_creates()),
            Some(_) => {
                for n in plan.routed_without_creates() {
                    self.shared.routed.insert(&n);
                }
            }
        }

        let failed = self
            .execute_routes(plan, &mut done, &mut managed, !from_known)
            .await;
        if from_known && !failed.is_empty() && done.throttled.is_none() {
            return None;
        }
        self.metrics.managed.set(managed);
        self.publish_routed(plan.routed_nodes(&failed), scope);

        // Nodes still being initialized get their condition from the cloud-node controller,
        // folded into the status write it makes anyway (see `RoutedNodes`); and a condition
        // that landed while this sync ran (that fold, typically) is not written again.
        let folds = self.shared.routed.node_folds();
        let writes: Vec<_> = plan
            .conditions_after(&failed)
            .into_iter()
            .filter(|u| {
                let Some(n) = self.shared.nodes.get(&u.node) else {
                    return true;
                };
                let current = NodeView::from_node(&n).network_unavailable;
                !((folds && has_taint(&n, TAINT_UNINITIALIZED))
                    || u.condition.matches(current.as_ref()))
            })
            .collect();
        let results: Vec<bool> = futures::stream::iter(writes)
            .map(|u| self.write_condition(u))
            .buffer_unordered(CONDITION_PATCH_CONCURRENCY)
            .collect()
            .await;
        for ok in results {
            if ok {
                done.changed = true;
            } else {
                done.errors += 1;
            }
        }
        Some(done)
    }

    /// Publishes which Nodes have all their routes: `routed` is the whole set after a full
    /// plan, or the routed Nodes of `scope` after a fast-path plan over `scope`.
    fn publish_routed(&self, routed: BTreeSet<String>, scope: Option<&HashSet<String>>) {
        let mut handle = self.handle.inner.routed.lock();
        match scope {
            None => {
                self.shared.routed.publish(routed.clone());
                *handle = Some(routed);
            }
            Some(scope) => {
                self.shared.routed.update(scope, &routed);
                if let Some(all) = handle.as_mut() {
                    for n in scope {
                        if routed.contains(n) {
                            all.insert(n.clone());
                        } else {
                            all.remove(n);
                        }
                    }
                }
            }
        }
    }

    /// Keeps the known listing in step with one cloud call: a success is applied to it, a
    /// failure forgets it (the call may or may not have taken effect).
    fn track(&self, res: &OpResult) {
        let mut known = self.known.lock();
        let Some(routes) = known.as_mut() else {
            return;
        };
        let cidrs = &self.config.cluster_cidrs;
        match res {
            OpResult::Created(r) => routes.push(r.clone(), cidrs),
            OpResult::Deleted(r) => routes.remove(r, cidrs),
            OpResult::CreateFailed(..) | OpResult::DeleteFailed(_) => *known = None,
        }
    }

    /// Runs the plan's deletes and creates, at most `max_concurrent_route_ops` at once; returns
    /// the creates that failed, by (node, CIDR).
    async fn execute_routes(
        &self,
        plan: &RoutePlan,
        done: &mut Executed,
        managed: &mut i64,
        announce_failures: bool,
    ) -> HashSet<(String, String)> {
        let deletes = plan.deletes.iter().cloned().map(Op::Delete);
        let creates = plan.creates.iter().cloned().map(Op::Create);
        let phases: Vec<Vec<Op>> = if plan.deletes_before_creates {
            vec![deletes.collect(), creates.collect()]
        } else {
            vec![deletes.chain(creates).collect()]
        };
        let mut failed = HashSet::new();
        let mut remaining = plan.creates_per_node();
        for phase in phases {
            let mut results = futures::stream::iter(phase)
                .map(|op| self.execute_op(op, announce_failures))
                .buffer_unordered(self.config.max_concurrent_route_ops);
            while let Some(res) = results.next().await {
                let (op, result) = match &res {
                    OpResult::Created(_) => ("create", "success"),
                    OpResult::CreateFailed(..) => ("create", "error"),
                    OpResult::Deleted(_) => ("delete", "success"),
                    OpResult::DeleteFailed(_) => ("delete", "error"),
                };
                self.metrics
                    .ops
                    .get_or_create(&OpLabels { op, result })
                    .inc();
                self.track(&res);
                match res {
                    OpResult::Created(route) => {
                        done.changed = true;
                        *managed += 1;
                        self.created(&route.target_node, &mut remaining, &failed);
                    }
                    OpResult::Deleted(_) => {
                        done.changed = true;
                        *managed -= 1;
                    }
                    OpResult::CreateFailed(key, hint) => {
                        done.errors += 1;
                        done.throttled(hint);
                        failed.insert(key);
                    }
                    OpResult::DeleteFailed(hint) => {
                        done.errors += 1;
                        done.throttled(hint);
                    }
                }
            }
        }
        *managed = (*managed).max(0);
        failed
    }

    /// One create of `node` returned successfully: once its last one has (and none failed),
    /// the node is routed — published at once, so its initialization need not wait for the
    /// rest of the sync.
    fn created(
        &self,
        node: &str,
        remaining: &mut std::collections::HashMap<String, usize>,
        failed: &HashSet<(String, String)>,
    ) {
        let Some(left) = remaining.get_mut(node) else {
            return;
        };
        *left = left.saturating_sub(1);
        if *left == 0 && !failed.iter().any(|(n, _)| n == node) {
            remaining.remove(node);
            self.shared.routed.insert(node);
        }
    }

    /// One cloud call, logged (and a `FailedToCreateRoute` event for a failed create when
    /// `announce_failures`: a fast-path create refused because the known listing was stale is
    /// not the node's failure — the confirming listing decides).
    async fn execute_op(&self, op: Op, announce_failures: bool) -> OpResult {
        let cluster = self.shared.cluster_name.as_str();
        let start = Instant::now();
        match op {
            Op::Delete(r) => match self.routes.delete_route(cluster, &r).await {
                Ok(()) => {
                    tracing::info!(route = %r.name, cidr = %r.destination_cidr, "deleted route");
                    OpResult::Deleted(r)
                }
                Err(e) => {
                    tracing::warn!(route = %r.name, cidr = %r.destination_cidr, error = %e,
                        elapsed = ?start.elapsed(), "could not delete route");
                    OpResult::DeleteFailed(throttle_hint(&e))
                }
            },
            Op::Create(c) => match self
                .routes
                .create_route(cluster, &c.name_hint, &c.route)
                .await
            {
                Ok(()) => {
                    tracing::info!(node = %c.route.target_node, cidr = %c.route.destination_cidr,
                        hint = %c.name_hint, "created route");
                    OpResult::Created(c.route)
                }
                Err(e) if !announce_failures => {
                    tracing::info!(node = %c.route.target_node, cidr = %c.route.destination_cidr,
                        error = %e, "route create from the known listing refused");
                    OpResult::CreateFailed(
                        (c.route.target_node, c.route.destination_cidr),
                        throttle_hint(&e),
                    )
                }
                Err(e) => {
                    self.create_failed(&c, start.elapsed(), &e);
                    OpResult::CreateFailed(
                        (
                            c.route.target_node.clone(),
                            c.route.destination_cidr.clone(),
                        ),
                        throttle_hint(&e),
                    )
                }
            },
        }
    }

    /// Upstream's `FailedToCreateRoute` Warning event on the Node.
    fn create_failed(&self, c: &RouteCreate, elapsed: Duration, err: &CloudError) {
        let node_name = &c.route.target_node;
        let msg = format!(
            "Could not create route {} {} for node {} after {:?}: {}",
            c.name_hint, c.route.destination_cidr, node_name, elapsed, err
        );
        let node = self.shared.nodes.get(node_name).unwrap_or_else(|| {
            Arc::new(Node {
                metadata: ObjectMeta {
                    name: Some(node_name.clone()),
                    ..Default::default()
                },
                ..Default::default()
            })
        });
        self.recorder.publish(
            &*node,
            EventType::Warning,
            REASON_FAILED_TO_CREATE_ROUTE,
            msg,
        );
    }

    /// Writes one `NetworkUnavailable` condition with a strategic-merge status patch (merged
    /// by condition type, so other conditions are untouched). A node deleted meanwhile is not
    /// an error. Returns false on failure.
    async fn write_condition(&self, u: planner::ConditionUpdate) -> bool {
        let now = Time(jiff::Timestamp::now());
        let cond = NodeCondition {
            type_: NETWORK_UNAVAILABLE.to_string(),
            status: u.condition.status().to_string(),
            reason: Some(u.condition.reason().to_string()),
            message: Some(u.condition.message().to_string()),
            last_heartbeat_time: Some(now.clone()),
            last_transition_time: Some(now),
        };
        let patch = serde_json::json!({ "status": { "conditions": [cond] } });
        match self
            .nodes_api
            .patch_status(&u.node, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(node = %u.node, status = u.condition.status(), reason = u.condition.reason(), "set NetworkUnavailable");
                true
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {
                tracing::debug!(node = %u.node, "node gone before its condition was written");
                true
            }
            Err(e) => {
                tracing::warn!(node = %u.node, error = %e, "could not write NetworkUnavailable condition");
                false
            }
        }
    }
}

/// Upstream's watch-mode node filter: adds and deletes always; updates when `spec.podCIDRs`
/// changed, or `status.addresses` changed and the cloud's routes track node addresses (upstream
/// syncs on every address change, which during a burst of initializations is one noop
/// ListRoutes per storm-limiter interval for providers that do not track them).
fn needs_sync(change: &Change<Node>, track_addresses: bool) -> bool {
    match (&change.old, &change.new) {
        (Some(old), Some(new)) => {
            let addrs = |n: &Node| n.status.as_ref().and_then(|s| s.addresses.clone());
            // A Node just initialized without the condition (the cloud-node controller could
            // not fold it in because its routes were not ready yet): write it now.
            let initialized_without_condition = has_taint(old, TAINT_UNINITIALIZED)
                && !has_taint(new, TAINT_UNINITIALIZED)
                && !pod_cidrs(new).is_empty()
                && condition_status(new, NETWORK_UNAVAILABLE) != ConditionStatus::False;
            pod_cidrs(old) != pod_cidrs(new)
                || (track_addresses && addrs(old) != addrs(new))
                || old.metadata.uid != new.metadata.uid
                || initialized_without_condition
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_cidr_parsing() {
        assert_eq!(
            parse_cluster_cidrs(" 10.244.0.0/16 ").expect("one").len(),
            1
        );
        assert_eq!(
            parse_cluster_cidrs("10.244.0.0/16, fd00:10::/56")
                .expect("pair")
                .len(),
            2
        );
        for bad in [
            "",
            " , ",
            "10.244.0.0",
            "10.244.0.0/16,10.245.0.0/16",
            "10.0.0.0/8,fd00::/8,10.1.0.0/16",
        ] {
            let err = parse_cluster_cidrs(bad).expect_err(bad).to_string();
            assert!(err.starts_with("--cluster-cidr:"), "{err}");
        }
    }

    #[test]
    fn node_filter() {
        let mk = |cidr: &str, ip: &str, rv: &str| {
            let mut n: Node = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "a", "uid": "u", "resourceVersion": rv},
                "spec": {"podCIDRs": [cidr]},
                "status": {"addresses": [{"type": "InternalIP", "address": ip}]},
            }))
            .expect("node");
            n.metadata.labels = None;
            Arc::new(n)
        };
        let change = |o: &Arc<Node>, n: &Arc<Node>| Change {
            old: Some(o.clone()),
            new: Some(n.clone()),
        };
        let a = mk("10.244.1.0/24", "10.0.0.1", "1");
        assert!(needs_sync(
            &Change {
                old: None,
                new: Some(a.clone())
            },
            false
        ));
        assert!(needs_sync(
            &Change {
                old: Some(a.clone()),
                new: None
            },
            false
        ));
        assert!(!needs_sync(
            &change(&a, &mk("10.244.1.0/24", "10.0.0.1", "2")),
            true
        ));
        assert!(needs_sync(
            &change(&a, &mk("10.244.2.0/24", "10.0.0.1", "2")),
            false
        ));
        let moved = mk("10.244.1.0/24", "10.0.0.2", "2");
        assert!(needs_sync(&change(&a, &moved), true));
        // Routes that do not track addresses do not care where the node moved.
        assert!(!needs_sync(&change(&a, &moved), false));
    }

    /// `run` must be spawnable: a borrowed item inside a stream combinator once made the
    /// future `!Send` for only some lifetimes, which surfaces far away, at `tokio::spawn`.
    #[allow(dead_code)]
    fn run_is_send(c: RouteController, t: CancellationToken) {
        fn is_send<T: Send>(_: T) {}
        is_send(c.run(t));
    }

    #[test]
    fn reasons_priority_and_clear() {
        let mut r = Reasons {
            retry: true,
            resync: true,
            ..Reasons::default()
        };
        assert_eq!(r.take(), Some((SyncTrigger::Retry, Scope::All)));
        assert_eq!(r.take(), None);
        r.resync = true;
        r.node_changed("a");
        assert_eq!(
            r.take(),
            Some((SyncTrigger::NodeChange, Scope::All)),
            "a resync pending too: plan over every Node"
        );
        r.node_changed("a");
        r.node_changed("b");
        let (trigger, scope) = r.take().expect("pending");
        assert_eq!(trigger, SyncTrigger::NodeChange);
        assert_eq!(
            scope,
            Scope::Changes(["a".to_string(), "b".to_string()].into())
        );
        assert!(r.changed.is_empty());
        r.confirm = true;
        assert_eq!(
            r.take(),
            Some((SyncTrigger::Resync, Scope::Listing(HashSet::new()))),
            "the confirmation lists, and plans over what changed"
        );
        r.confirm = true;
        r.node_changed("c");
        assert_eq!(
            r.take(),
            Some((
                SyncTrigger::NodeChange,
                Scope::Listing(["c".to_string()].into())
            )),
            "a change pending with the confirmation is planned against its listing"
        );
    }
}
