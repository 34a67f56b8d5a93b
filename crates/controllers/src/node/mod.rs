//! The cloud-node controller (upstream `cloud-node-controller`, alias `cloud-node`): initializes
//! Nodes registered by a kubelet running with `--cloud-provider=external`, and keeps their
//! addresses current.
//!
//! Flow: a Node carrying `node.cloudprovider.kubernetes.io/uninitialized` enters the `Nodes`
//! queue; workers take *batches* of keys gathered within a short window and ask the cloud once
//! per batch ([`ccm_cloud::Instances::instances_metadata`]); [`planner::plan_initialization`]
//! turns each Node plus its metadata into an update, written as at most two
//! resourceVersion-guarded merge patches — status (addresses) first, then the object
//! (providerID, labels, taint removal) — so a Node never becomes schedulable without its cloud
//! addresses and a concurrent kubelet write is never lost. Initialized Nodes only get beta→GA
//! label reconciliation (no cloud call). Every `node_status_update_frequency` the addresses of
//! all initialized Nodes are refreshed, one cloud call per batch.

pub mod planner;
pub(crate) mod write;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ccm_cloud::{CloudError, CloudResult, InstanceEvent, InstanceMetadata, Instances};
use futures::StreamExt;
use futures::future::join_all;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use parking_lot::Mutex;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::context::{Shared, StartError};
use crate::events::{EventType, Recorder};
use crate::nodeutil::{TAINT_UNINITIALIZED, has_taint, pod_cidrs};
use crate::queue::{Backoff, WorkQueue};
use crate::route::planner::{NETWORK_UNAVAILABLE, NetworkCondition};
use planner::PlanError;
use write::Target;

/// Event source (`source.component`) of this controller's Events, as upstream.
pub const EVENT_SOURCE: &str = "cloud-node-controller";
/// Name of the work queue (the `name` label of the `workqueue_*` metrics), as upstream.
pub const QUEUE_NAME: &str = "Nodes";
/// Per-Node retry backoff, upstream's default controller rate limiter: 5 ms doubling to 1000 s.
pub const BACKOFF: Backoff = Backoff {
    base: Duration::from_millis(5),
    max: Duration::from_secs(1000),
};
/// How long workers pause cloud calls after a throttled answer without a `retry_after` hint.
pub const DEFAULT_THROTTLE_PAUSE: Duration = Duration::from_secs(1);
/// Node writes the controller keeps in flight at once, all batches together: the cloud-node
/// client's own in-flight cap (`ccm_manager::client::NODE_INIT_IN_FLIGHT`). A write beyond it
/// would only wait in the client's limiter holding its ~10 KiB request future; with a cap per
/// batch (32 × 10 workers) a 1,000-Node burst kept ~320 of them alive, 3 MB of its peak heap.
const WRITE_CONCURRENCY: usize = 64;

/// Flags of the cloud-node controller, with upstream names and defaults where upstream has them.
#[derive(Debug, Clone)]
pub struct CloudNodeConfig {
    /// `--node-status-update-frequency` (default 5m): how often the addresses of initialized
    /// Nodes are refreshed from the cloud.
    pub node_status_update_frequency: Duration,
    /// `--concurrent-node-syncs`: batches processed at once. ccm-rs defaults to **10**, not
    /// upstream's 1: a worker is busy for a cloud round trip plus two API writes per Node, and
    /// with 1 worker a burst of thousands of Nodes (cluster autoscaler scale-up, CCM restart)
    /// waits behind each batch in turn. Ten batches in flight keeps the cloud call count the
    /// same (one per batch) while initializing a 5,000-Node burst in about one batch latency.
    pub concurrent_node_syncs: usize,
    /// `--concurrent-node-status-updates` (v1.36+; default 0 = use `concurrent_node_syncs`):
    /// batches of the periodic address refresh processed at once.
    pub concurrent_node_status_updates: usize,
    /// Most Nodes per cloud lookup (default 500); the provider's own
    /// [`ccm_cloud::Instances::max_batch_size`] caps it further.
    pub max_batch_size: usize,
    /// How long a worker gathers arriving Nodes into one batch after the first (default 20 ms):
    /// long enough that Nodes registering together are looked up together, short enough not to
    /// matter for a single Node.
    pub batch_window: Duration,
    /// How long a batch waits for the route controller to create its Nodes' routes before
    /// writing, so `NetworkUnavailable=False` rides along in the status write (one API write
    /// per Node less; default 2s). Only when the route controller runs; 0 disables it.
    pub route_condition_wait: Duration,
}

impl Default for CloudNodeConfig {
    fn default() -> Self {
        CloudNodeConfig {
            node_status_update_frequency: Duration::from_secs(300),
            concurrent_node_syncs: 10,
            concurrent_node_status_updates: 0,
            max_batch_size: 500,
            batch_window: Duration::from_millis(20),
            route_condition_wait: Duration::from_secs(2),
        }
    }
}

impl CloudNodeConfig {
    fn validate(&self) -> Result<(), StartError> {
        if self.concurrent_node_syncs == 0 {
            return Err(StartError::Invalid(
                "--concurrent-node-syncs: must be at least 1 (it is the number of node sync workers)"
                    .into(),
            ));
        }
        if self.node_status_update_frequency.is_zero() {
            return Err(StartError::Invalid(
                "--node-status-update-frequency: must be greater than 0 (e.g. 5m)".into(),
            ));
        }
        if self.max_batch_size == 0 {
            return Err(StartError::Invalid(
                "node max batch size: must be at least 1".into(),
            ));
        }
        Ok(())
    }

    fn status_workers(&self) -> usize {
        if self.concurrent_node_status_updates == 0 {
            self.concurrent_node_syncs
        } else {
            self.concurrent_node_status_updates
        }
    }
}

/// Why one Node could not be initialized; each variant has its own event reason so
/// `kubectl describe node` names the cause.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// The metadata does not fit the Node (provided node IP, missing providerID).
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The cloud lookup failed.
    #[error("failed to get instance metadata for node {node}: {source}")]
    Cloud {
        /// The Node.
        node: String,
        /// The provider's error.
        source: CloudError,
    },
    /// Writing the Node failed.
    #[error("failed to update node {node}: {source}")]
    Api {
        /// The Node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
}

impl SyncError {
    /// The Warning event reason for this failure.
    pub fn reason(&self) -> &'static str {
        match self {
            SyncError::Plan(PlanError::ProvidedNodeIp { .. }) => "ProvidedNodeIPNotValid",
            SyncError::Plan(PlanError::ProviderIdMissing { .. }) => "ProviderIDMissing",
            SyncError::Cloud {
                source: CloudError::InstanceNotFound,
                ..
            } => "InstanceNotFound",
            SyncError::Cloud {
                source: CloudError::Throttled { .. },
                ..
            } => "CloudProviderThrottled",
            SyncError::Cloud { .. } => "CloudProviderError",
            SyncError::Api { .. } => "NodeUpdateFailed",
        }
    }

    fn throttle_hint(&self) -> Option<Duration> {
        match self {
            SyncError::Cloud {
                source: CloudError::Throttled { retry_after, .. },
                ..
            } => Some(retry_after.unwrap_or(DEFAULT_THROTTLE_PAUSE)),
            _ => None,
        }
    }
}

/// How long call pacing stays on after the last throttled answer.
const PACING_MEMORY: Duration = Duration::from_secs(10);

/// Client-side reaction to cloud throttling. After a refusal with hint `h`, no call goes out
/// for `h`, and then calls go out one per `h` (the cloud's own refill interval) until
/// [`PACING_MEMORY`] passes without another refusal. Without it, every worker would fire at
/// the end of the pause at once and be refused again: a slow hot loop.
#[derive(Debug, Default)]
struct Pacing {
    interval: Duration,
    next_slot: Option<Instant>,
    until: Option<Instant>,
}

impl Pacing {
    fn throttled(&mut self, now: Instant, hint: Duration) {
        let hint = hint.clamp(Duration::from_millis(10), Duration::from_secs(60));
        self.interval = self.interval.max(hint);
        let resume = now + hint;
        self.next_slot = Some(self.next_slot.map_or(resume, |s| s.max(resume)));
        self.until = Some(now + PACING_MEMORY.max(hint * 2));
    }

    /// The instant the next call may go out, reserving it; `None`: at once.
    fn slot(&mut self, now: Instant) -> Option<Instant> {
        match self.until {
            Some(until) if until > now => {
                let slot = self.next_slot.map_or(now, |s| s.max(now));
                self.next_slot = Some(slot + self.interval);
                (slot > now).then_some(slot)
            }
            _ => {
                *self = Pacing::default();
                None
            }
        }
    }
}

#[derive(Clone)]
struct Metrics {
    taint_removal_delay: Histogram,
    initial_sync_delay: Histogram,
}

impl Metrics {
    fn new(registry: &mut Registry) -> Self {
        // Upstream: exponential buckets 1, 4, 16, 64, 256, 1024 seconds.
        let m = Metrics {
            taint_removal_delay: Histogram::new(exponential_buckets(1.0, 4.0, 6)),
            initial_sync_delay: Histogram::new(exponential_buckets(1.0, 4.0, 6)),
        };
        registry.register(
            "node_controller_cloud_provider_taint_removal_delay_seconds",
            "Number of seconds after node creation when NodeController removed the cloud-provider taint of a single node.",
            m.taint_removal_delay.clone(),
        );
        registry.register(
            "node_controller_initial_node_sync_delay_seconds",
            "Number of seconds after node creation when NodeController finished the initial synchronization of a single node.",
            m.initial_sync_delay.clone(),
        );
        m
    }
}

struct Inner {
    shared: Shared,
    client: kube::Client,
    config: CloudNodeConfig,
    instances: Arc<dyn Instances>,
    recorder: Recorder,
    queue: WorkQueue<String>,
    stop: CancellationToken,
    metrics: Metrics,
    batch_max: usize,
    /// One worker gathers a batch at a time, so a burst fills few big batches instead of one
    /// small batch per idle worker.
    gather: tokio::sync::Mutex<()>,
    /// Spacing of cloud calls after the cloud throttled us.
    pacing: Mutex<Pacing>,
    /// Nodes (name → uid) this controller has initialized but whose untainted version the
    /// cache has not shown yet. A tainted copy of them in the cache is stale (our own
    /// intermediate status write, or a lagging watch), not work: looking it up again would cost
    /// a cloud call and a refused write.
    initialized: Mutex<HashMap<String, String>>,
    /// providerID → name of tainted Nodes whose initialization failed: an instance `Created`
    /// event for a Node not found by name is looked up here, not by scanning every cached Node
    /// (a burst of N instance creations made that N² work: most of them precede their Node).
    failed_by_provider_id: Mutex<HashMap<String, String>>,
    /// [`WRITE_CONCURRENCY`] permits, shared by every batch, label fix and address refresh.
    writes: Semaphore,
    busy: Arc<AtomicUsize>,
}

/// The cloud-node controller. Build with [`CloudNodeController::new`], then
/// [`CloudNodeController::run`].
pub struct CloudNodeController {
    inner: Arc<Inner>,
}

/// A cheap, cloneable view of the controller's backlog, for tests and `ccm demo` to know when
/// it is idle.
#[derive(Clone)]
pub struct CloudNodeHandle {
    queue: WorkQueue<String>,
    busy: Arc<AtomicUsize>,
}

impl CloudNodeHandle {
    /// Nodes queued, waiting for a retry, or being processed, plus a running address refresh.
    /// Zero means idle.
    pub fn pending(&self) -> usize {
        self.queue.pending() + self.busy.load(Ordering::SeqCst)
    }

    /// Consecutive failures recorded for a Node (its backoff step).
    pub fn failures(&self, node: &str) -> u32 {
        self.queue.failures(&node.to_string())
    }
}

impl CloudNodeController {
    /// Builds the controller. `Skipped` when the provider has no instances support (upstream
    /// skips the controller with a warning); `Invalid` for bad flags. Must be called inside a
    /// Tokio runtime (the event recorder spawns its writer).
    pub fn new(
        shared: Shared,
        client: kube::Client,
        config: CloudNodeConfig,
        registry: &mut Registry,
    ) -> Result<Self, StartError> {
        config.validate()?;
        let Some(instances) = shared.provider.instances() else {
            return Err(StartError::Skipped(format!(
                "cloud provider {:?} does not support instances; cloud-node-controller not started",
                shared.provider.provider_name()
            )));
        };
        let batch_max = config.max_batch_size.min(instances.max_batch_size()).max(1);
        // Announced here, not in `run`: a route controller whose first sync runs before this
        // controller's task is first polled must already leave the condition to the fold.
        shared
            .routed
            .set_node_folds(!config.route_condition_wait.is_zero());
        let stop = CancellationToken::new();
        let queue = WorkQueue::new(
            QUEUE_NAME,
            BACKOFF,
            shared.queue_metrics.clone(),
            stop.clone(),
        );
        Ok(CloudNodeController {
            inner: Arc::new(Inner {
                recorder: shared.recorder(&client, EVENT_SOURCE),
                shared,
                client,
                config,
                instances,
                queue,
                stop,
                metrics: Metrics::new(registry),
                batch_max,
                gather: tokio::sync::Mutex::new(()),
                pacing: Mutex::default(),
                initialized: Mutex::default(),
                failed_by_provider_id: Mutex::default(),
                writes: Semaphore::new(WRITE_CONCURRENCY),
                busy: Arc::new(AtomicUsize::new(0)),
            }),
        })
    }

    /// A probe of the controller's backlog.
    pub fn handle(&self) -> CloudNodeHandle {
        CloudNodeHandle {
            queue: self.inner.queue.clone(),
            busy: self.inner.busy.clone(),
        }
    }

    /// Runs until `shutdown`: waits for the Node cache, then feeds the queue from Node changes
    /// (and instance `Created` events when the provider has them), runs the workers and the
    /// periodic address refresh.
    pub async fn run(self, shutdown: CancellationToken) {
        let inner = self.inner;
        let stop = inner.stop.clone();
        let _stop_guard = stop.clone().drop_guard();
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = inner.shared.nodes.wait_ready() => {}
        }
        tracing::info!(
            workers = inner.config.concurrent_node_syncs,
            batch = inner.batch_max,
            "starting cloud-node-controller"
        );
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(inner.clone().feed());
        if let Some(events) = inner.instances.instance_events() {
            tasks.spawn(inner.clone().instance_events(events));
        }
        tasks.spawn(inner.clone().status_loop());
        for _ in 0..inner.config.concurrent_node_syncs {
            tasks.spawn(inner.clone().worker());
        }
        shutdown.cancelled().await;
        stop.cancel();
        while tasks.join_next().await.is_some() {}
    }
}

fn name(node: &Node) -> String {
    node.metadata.name.clone().unwrap_or_default()
}

fn seconds_since_creation(node: &Node) -> Option<f64> {
    let created = node.metadata.creation_timestamp.as_ref()?.0;
    Some(
        Timestamp::now()
            .duration_since(created)
            .as_secs_f64()
            .max(0.0),
    )
}

impl Inner {
    /// Node changes → queue: tainted Nodes and Nodes whose GA labels lag their beta labels.
    async fn feed(self: Arc<Self>) {
        let mut rx = self.shared.nodes.subscribe();
        loop {
            let change = tokio::select! {
                _ = self.stop.cancelled() => return,
                c = rx.recv() => match c { Some(c) => c, None => return },
            };
            let Some(new) = change.new else {
                if let Some(old) = change.old {
                    self.initialized.lock().remove(&name(&old));
                    self.forget_failure(&old);
                }
                continue;
            };
            let key = name(&new);
            if has_taint(&new, TAINT_UNINITIALIZED) {
                if self.is_stale(&new) {
                    continue;
                }
                self.queue.add(key);
            } else {
                self.initialized.lock().remove(&key);
                self.forget_failure(&new);
                if !planner::plan_ga_labels(&new).is_empty() {
                    self.queue.add(key);
                }
            }
        }
    }

    /// Drops a gone or initialized Node from [`Inner::failed_by_provider_id`].
    fn forget_failure(&self, node: &Node) {
        let provider_id = ccm_cloud::node_provider_id(node);
        if provider_id.is_empty() {
            return;
        }
        let mut failed = self.failed_by_provider_id.lock();
        if failed.get(provider_id).is_some_and(|n| *n == name(node)) {
            failed.remove(provider_id);
        }
    }

    /// True for a tainted cached copy of a Node this controller has already initialized.
    fn is_stale(&self, node: &Node) -> bool {
        let uid = node.metadata.uid.as_deref().unwrap_or_default();
        self.initialized
            .lock()
            .get(&name(node))
            .is_some_and(|u| u == uid)
    }

    /// A new instance may be the one a tainted Node waits for: retry that Node at once instead
    /// of after its (possibly long) backoff.
    async fn instance_events(
        self: Arc<Self>,
        mut events: futures::stream::BoxStream<'static, InstanceEvent>,
    ) {
        loop {
            let ev = tokio::select! {
                _ = self.stop.cancelled() => return,
                e = events.next() => match e { Some(e) => e, None => return },
            };
            if ev.kind != ccm_cloud::InstanceEventKind::Created {
                continue;
            }
            let node = ev
                .node_name
                .as_deref()
                .and_then(|n| self.shared.nodes.get(n))
                .or_else(|| {
                    let name = self
                        .failed_by_provider_id
                        .lock()
                        .get(&ev.provider_id)
                        .cloned()?;
                    self.shared
                        .nodes
                        .get(&name)
                        .filter(|n| ccm_cloud::node_provider_id(n) == ev.provider_id)
                });
            if let Some(node) = node
                && has_taint(&node, TAINT_UNINITIALIZED)
            {
                let key = name(&node);
                tracing::debug!(node = %key, "instance created; retrying node initialization now");
                self.queue.forget(&key);
                self.queue.add(key);
            }
        }
    }

    async fn worker(self: Arc<Self>) {
        loop {
            let batch = {
                let _gather = tokio::select! {
                    _ = self.stop.cancelled() => return,
                    g = self.gather.lock() => g,
                };
                self.queue
                    .get_batch(self.batch_max, self.config.batch_window)
                    .await
            };
            let Some(keys) = batch else { return };
            self.process(&keys).await;
            for key in &keys {
                self.queue.done(key);
            }
        }
    }

    async fn process(&self, keys: &[String]) {
        let mut init = Vec::new();
        let mut labels = Vec::new();
        for key in keys {
            match self.shared.nodes.get(key) {
                None => self.queue.forget(key),
                Some(n) if self.is_stale(&n) => self.queue.forget(key),
                Some(n) if has_taint(&n, TAINT_UNINITIALIZED) => init.push(n),
                Some(n) => labels.push(n),
            }
        }
        // Initialized Nodes come back on every change of theirs (a burst requeues each one
        // after its own writes); only those missing a GA label need a write future. Creating
        // one per Node held ~13 KiB each: 15 MB of a 3,000-Node burst's 35 MB peak heap.
        labels.retain(|n| {
            let needed = !planner::plan_ga_labels(n).is_empty();
            if !needed {
                self.queue.forget(&name(n));
            }
            needed
        });
        let label_work = join_all(labels.into_iter().map(|n| async move {
            let _permit = self.writes.acquire().await;
            // Boxed, as in `initialize`: only a Node holding a write slot holds the write.
            Box::pin(self.reconcile_labels((*n).clone())).await
        }));
        let init_work = self.initialize(init);
        tokio::join!(label_work, init_work);
    }

    /// Beta→GA label reconciliation (upstream §2.6): cache only, no cloud call.
    async fn reconcile_labels(&self, node: Node) {
        let key = name(&node);
        let api = Api::<Node>::all(self.client.clone());
        let res = write::patch_guarded(&api, node, Target::Object, |n| {
            let set = planner::plan_ga_labels(n);
            (!set.is_empty()).then(|| planner::labels_patch(&set))
        })
        .await;
        match res {
            Ok(_) => self.queue.forget(&key),
            Err(e) => {
                tracing::warn!(node = %key, error = %e, "failed to reconcile node labels");
                self.queue.add_rate_limited(key);
            }
        }
    }

    /// Waits for this call's slot when the cloud has throttled us recently (see [`Pacing`]).
    async fn wait_throttle(&self) {
        let slot = self.pacing.lock().slot(Instant::now());
        if let Some(at) = slot {
            tokio::select! {
                _ = tokio::time::sleep_until(at) => {}
                _ = self.stop.cancelled() => {}
            }
        }
    }

    fn note_throttle(&self, pause: Duration) {
        self.pacing.lock().throttled(Instant::now(), pause);
    }

    /// One cloud call for the whole batch, then the writes per Node.
    ///
    /// The Nodes are the cache's `Arc`s, for the cloud call too: a waiting Node's future holds
    /// 8 bytes of it instead of a ~1.4 KiB `Node` (plus its strings). Copies exist only inside
    /// a write slot.
    async fn initialize(&self, nodes: Vec<Arc<Node>>) {
        if nodes.is_empty() {
            return;
        }
        self.wait_throttle().await;
        let mut results = self.instances.instances_metadata(&nodes).await.into_iter();
        let work: Vec<(Arc<Node>, CloudResult<Option<InstanceMetadata>>)> = nodes
            .into_iter()
            .map(|n| {
                let r = results.next().unwrap_or_else(|| {
                    Err(CloudError::Permanent(
                        "provider returned fewer metadata results than nodes asked for".into(),
                    ))
                });
                (n, r)
            })
            .collect();
        join_all(work.into_iter().map(|(node, res)| async {
            // Each Node waits for its own route only, and holds no write slot meanwhile.
            // Boxed: the wait (timer, channel, select) would otherwise be part of every
            // Node's future from the start, though most Nodes find their route already made.
            Box::pin(self.wait_for_route(&node, &res)).await;
            let _permit = self.writes.acquire().await;
            // Boxed: the write future (API requests, retries) is ~13 KiB, and a 1,000-Node
            // batch keeps every Node's future alive while it waits; unboxed, each waiting
            // Node would reserve that space (13 MB of a 1,000-Node burst's peak heap).
            Box::pin(self.finish(node, res)).await
        }))
        .await;
    }

    /// Gives the route controller a moment to create this Node's routes, so its status write
    /// can carry `NetworkUnavailable=False`. The route starts at registration, in parallel with
    /// the metadata lookup, so the wait is usually zero; it is bounded by
    /// `route_condition_wait` and never spent on other Nodes' routes.
    async fn wait_for_route(&self, node: &Node, res: &CloudResult<Option<InstanceMetadata>>) {
        let wait = self.config.route_condition_wait;
        if !planner::waits_for_route(
            wait,
            self.shared.routed.is_active(),
            matches!(res, Ok(Some(_))),
            !pod_cidrs(node).is_empty(),
        ) {
            return;
        }
        let key = name(node);
        let start = Instant::now();
        tokio::select! {
            routed = self.shared.routed.wait(&key, wait) => {
                tracing::debug!(node = %key, routed, waited = ?start.elapsed(), "waited for the node's route");
            }
            _ = self.stop.cancelled() => {}
        }
    }

    /// The Node's conditions with `NetworkUnavailable=False/RouteCreated`, when its routes
    /// exist and the condition does not say so yet.
    fn folded_conditions(&self, node: &Node) -> Option<Vec<NodeCondition>> {
        let key = name(node);
        if self.config.route_condition_wait.is_zero()
            || !self.shared.routed.is_active()
            || pod_cidrs(node).is_empty()
            || !self.shared.routed.contains(&key)
        {
            return None;
        }
        let created = NetworkCondition::RouteCreated;
        let mut conditions = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        if let Some(c) = conditions.iter().find(|c| c.type_ == NETWORK_UNAVAILABLE)
            && c.status == created.status()
            && c.reason.as_deref() == Some(created.reason())
        {
            return None;
        }
        let now = Time(jiff::Timestamp::now());
        conditions.retain(|c| c.type_ != NETWORK_UNAVAILABLE);
        conditions.push(NodeCondition {
            type_: NETWORK_UNAVAILABLE.to_string(),
            status: created.status().to_string(),
            reason: Some(created.reason().to_string()),
            message: Some(created.message().to_string()),
            last_heartbeat_time: Some(now.clone()),
            last_transition_time: Some(now),
        });
        Some(conditions)
    }

    async fn finish(&self, node: Arc<Node>, res: CloudResult<Option<InstanceMetadata>>) {
        let key = name(&node);
        let meta = match res {
            Ok(Some(m)) => m,
            Ok(None) => {
                // Upstream: success with no requeue; the next Node update retries.
                tracing::info!(node = %key, "cloud provider returned no instance metadata; waiting for the next node update");
                self.queue.forget(&key);
                return;
            }
            Err(source) => {
                return self.fail(
                    &node,
                    SyncError::Cloud {
                        node: key.clone(),
                        source,
                    },
                );
            }
        };
        let node = self.freshest(&node);
        match self.initialize_one(node.clone(), &meta).await {
            Ok(Some(updated)) => {
                self.queue.forget(&key);
                if let Some(uid) = &updated.metadata.uid {
                    // Checked under the lock the feed takes to clear entries, so an entry is
                    // either never made (cache already current) or cleared when it catches up.
                    let mut initialized = self.initialized.lock();
                    if self
                        .shared
                        .nodes
                        .get(&key)
                        .is_none_or(|cached| has_taint(&cached, TAINT_UNINITIALIZED))
                    {
                        initialized.insert(key.clone(), uid.clone());
                    }
                }
                self.recorder.publish(
                    &updated,
                    EventType::Normal,
                    "Synced",
                    "Node synced successfully",
                );
                if let Some(s) = seconds_since_creation(&updated) {
                    self.metrics.initial_sync_delay.observe(s);
                }
            }
            Ok(None) => self.queue.forget(&key),
            Err(e) => self.fail(&node, e),
        }
    }

    /// The cached copy of `node` when it is the same object: the kubelet's status write
    /// usually lands while the batch waits for the cloud and the route, and writing with the
    /// batch's older resourceVersion would cost a conflict, a GET and a second PATCH.
    fn freshest(&self, node: &Node) -> Node {
        match self.shared.nodes.get(&name(node)) {
            Some(cached) if cached.metadata.uid == node.metadata.uid => (*cached).clone(),
            _ => node.clone(),
        }
    }

    fn fail(&self, node: &Node, err: SyncError) {
        let key = name(node);
        let provider_id = ccm_cloud::node_provider_id(node);
        if !provider_id.is_empty() {
            self.failed_by_provider_id
                .lock()
                .insert(provider_id.to_string(), key.clone());
        }
        let delay = match err.throttle_hint() {
            Some(pause) => {
                self.note_throttle(pause);
                self.queue.add_rate_limited_min(key.clone(), pause)
            }
            None => self.queue.add_rate_limited(key.clone()),
        };
        tracing::warn!(node = %key, error = %err, retry_in = ?delay, "failed to initialize node");
        self.recorder
            .publish(node, EventType::Warning, err.reason(), err.to_string());
    }

    /// At most two writes: status (addresses), then the object (providerID, labels, taint).
    /// Each is guarded by the resourceVersion it was planned from; a Conflict re-reads the
    /// Node and re-plans. `Ok(None)`: the Node is gone.
    async fn initialize_one(
        &self,
        node: Node,
        meta: &InstanceMetadata,
    ) -> Result<Option<Node>, SyncError> {
        let key = name(&node);
        let api = Api::<Node>::all(self.client.clone());
        let api_err = |source| SyncError::Api {
            node: key.clone(),
            source,
        };
        let mut node = node;
        let mut conflicts = 0;
        loop {
            let plan = planner::plan_initialization(&node, meta)?;
            let folded = self.folded_conditions(&node);
            let (target, patch) = if plan.addresses.is_some() || folded.is_some() {
                let addresses = plan.addresses.as_deref().unwrap_or(&[]);
                let mut patch = planner::status_patch(addresses);
                if plan.addresses.is_none() {
                    patch["status"]
                        .as_object_mut()
                        .map(|o| o.remove("addresses"));
                }
                if let Some(c) = folded {
                    patch["status"]["conditions"] = serde_json::json!(c);
                }
                (Target::Status, patch)
            } else if let Some(p) = planner::object_patch(&plan) {
                (Target::Object, p)
            } else {
                return Ok(Some(node));
            };
            match write::send(&api, &node, target, patch).await {
                Ok(updated) => {
                    if target == Target::Object {
                        if plan.taints.is_some()
                            && let Some(s) = seconds_since_creation(&updated)
                        {
                            self.metrics.taint_removal_delay.observe(s);
                        }
                        return Ok(Some(updated));
                    }
                    node = updated;
                }
                Err(e) if write::is_not_found(&e) => return Ok(None),
                Err(e) if write::is_conflict(&e) && conflicts < write::MAX_CONFLICTS => {
                    conflicts += 1;
                    node = match api.get(&key).await {
                        Ok(n) => n,
                        Err(e) if write::is_not_found(&e) => return Ok(None),
                        Err(e) => return Err(api_err(e)),
                    };
                    if !has_taint(&node, TAINT_UNINITIALIZED) {
                        // Someone else finished the job.
                        return Ok(Some(node));
                    }
                }
                Err(e) => return Err(api_err(e)),
            }
        }
    }

    async fn status_loop(self: Arc<Self>) {
        loop {
            self.busy.fetch_add(1, Ordering::SeqCst);
            let start = Instant::now();
            self.refresh_addresses().await;
            self.busy.fetch_sub(1, Ordering::SeqCst);
            tracing::debug!(took = ?start.elapsed(), "node address refresh done");
            // Sliding period, as upstream's wait.Until.
            tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = tokio::time::sleep(self.config.node_status_update_frequency) => {}
            }
        }
    }

    /// Upstream `UpdateNodeStatus`, batched: one cloud call per `batch_max` initialized Nodes;
    /// a status write only for Nodes whose addresses changed. Errors wait for the next period.
    ///
    /// The refresh runs every few minutes on an idle cluster, and what it allocates at once
    /// shows as a peak of the idle process: it hands the provider the cache's `Arc`s and copies
    /// a Node only to write it (copying every Node for the call, as it did, lifted an idle
    /// 1,000-Node CCM's RSS by ~7 MB every refresh).
    async fn refresh_addresses(&self) {
        let mut nodes: Vec<Arc<Node>> = self
            .shared
            .nodes
            .list()
            .into_iter()
            .filter(|n| !has_taint(n, TAINT_UNINITIALIZED))
            .collect();
        nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let calls = Semaphore::new(self.config.status_workers());
        join_all(nodes.chunks(self.batch_max).map(|chunk| async {
            let _permit = calls.acquire().await;
            self.wait_throttle().await;
            if self.stop.is_cancelled() {
                return;
            }
            let results = self.instances.instances_metadata(chunk).await;
            let changed: Vec<(Arc<Node>, Vec<NodeAddress>)> = chunk
                .iter()
                .zip(results)
                .filter_map(|(node, res)| {
                    Some((Arc::clone(node), self.changed_addresses(node, res)?))
                })
                .collect();
            join_all(changed.into_iter().map(|(node, addresses)| async {
                let _permit = self.writes.acquire().await;
                // Boxed, as in `initialize`: unboxed, every changed Node would hold the write
                // path's ~13 KiB future while waiting for a permit.
                Box::pin(self.write_addresses(node, addresses)).await
            }))
            .await;
        }))
        .await;
    }

    /// The addresses to write for `node`, or `None` when the answer is an error (logged), says
    /// nothing, or matches what the Node has (the usual case).
    fn changed_addresses(
        &self,
        node: &Node,
        res: CloudResult<Option<InstanceMetadata>>,
    ) -> Option<Vec<NodeAddress>> {
        let meta = match res {
            Ok(meta) => meta?,
            Err(e) => {
                if let CloudError::Throttled { retry_after, .. } = &e {
                    self.note_throttle(retry_after.unwrap_or(DEFAULT_THROTTLE_PAUSE));
                }
                tracing::warn!(node = %name(node), error = %e, "failed to refresh node addresses");
                return None;
            }
        };
        match planner::plan_address_refresh(node, &meta.node_addresses) {
            Err(e) => {
                tracing::warn!(node = %name(node), error = %e, "not updating node addresses");
                None
            }
            Ok(None) => None,
            Ok(Some(_)) => Some(meta.node_addresses),
        }
    }

    async fn write_addresses(&self, node: Arc<Node>, addresses: Vec<NodeAddress>) {
        let key = name(&node);
        let api = Api::<Node>::all(self.client.clone());
        let res = write::patch_guarded(&api, (*node).clone(), Target::Status, |n| {
            planner::plan_address_refresh(n, &addresses)
                .ok()
                .flatten()
                .map(|a| planner::status_patch(&a))
        })
        .await;
        if let Err(e) = res {
            tracing::warn!(node = %key, error = %e, "failed to update node addresses");
        }
    }
}
