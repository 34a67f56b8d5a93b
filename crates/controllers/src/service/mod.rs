//! The service load-balancer controller (`service-lb-controller`, alias `service`): a cloud
//! load balancer for every `type: LoadBalancer` Service without a `loadBalancerClass` (or, when
//! the provider serves one, of exactly that class), with upstream `controllers/service`
//! semantics (reference §5).
//!
//! Shape: Service changes → queue `"service"` (keyed `namespace/name`, per-key backoff) →
//! [`planner::plan_sync`] → ensure path (finalizer first, then `EnsureLoadBalancer`, then the
//! status) or delete path (LB first, then status and finalizer). Node changes → queue `"node"`
//! (coalesced) → one node sync that calls `UpdateLoadBalancer` only for Services whose node set
//! changed. A per-Service lock ([`locks`]) keeps the node sync and the optional drift check from
//! ever running concurrently with a sync of the same Service. A provider's
//! [`LoadBalancer::service_requeues`] stream queues the Services it names, as a Service change
//! would.

pub mod planner;

mod lb_nodes;
mod locks;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ccm_cloud::{CloudError, LoadBalancer, LoadBalancerStatus};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, Patch, PatchParams};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::context::{Shared, StartError};
use crate::events::{EventType, Recorder};
use crate::informer::object_key;
use crate::queue::{Backoff, WorkQueue};

use self::locks::KeyLocks;
use self::planner::{
    LOAD_BALANCER_CLEANUP_FINALIZER, NodeSet, Requeue, SyncPlan, current_status, has_finalizer,
    ingress_equal, must_delete_stale_lb, node_set_changed, plan_sync, requeue_for,
    should_enqueue_service, should_sync_updated_node, update_failed_message, wants_load_balancer,
};

/// Upstream event source (`source.component`) of this controller.
pub const EVENT_SOURCE: &str = "service-controller";
/// Canonical controller name (`--controllers`).
pub const CONTROLLER_NAME: &str = "service-lb-controller";
/// Alias accepted by `--controllers` and used in `running_managed_controllers`.
pub const CONTROLLER_ALIAS: &str = "service";

/// The largest [`ServiceConfig::nodes_in_flight`]: the semaphore's permit limit.
const MAX_NODES_IN_FLIGHT: usize = 1 << 28;

/// Flags of the service controller.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// `--concurrent-service-syncs`: Services synced in parallel, and the parallelism of a node
    /// sync. **Default 100** (upstream: 1). Upstream's 1 makes a cold start with hundreds of
    /// LoadBalancer Services take minutes (oracle/oci-ccm #210); workers are cheap tasks,
    /// per-Service serialization makes a high value safe, and a cloud rate limit belongs in the
    /// provider's limiter (`--cloud-api-qps`). 200 Services at 50 ms per cloud call: p99 to
    /// ingress 0.14 s with 100, 1.1 s with 10.
    pub concurrent_service_syncs: usize,
    /// Per-Service retry backoff after a failed sync. Default 5s → 300s, as upstream. A
    /// `Retry { after }` from the provider bypasses it.
    pub backoff: Backoff,
    /// Period of the drift check: `GetLoadBalancer` for every ensured Service, re-ensuring
    /// those whose LB is gone or reports another ingress than the Service shows. Default
    /// `None` (off, as upstream, which has no periodic reconcile — k/k #34660): each pass costs
    /// one cloud call per LoadBalancer Service. Something like 10 minutes is a sensible value.
    pub drift_check_period: Option<Duration>,
    /// The least time between two node syncs that updated load balancers: a Node change is
    /// acted on at once, but one arriving within this window of such a pass waits for the
    /// window's end, so a burst of Node changes costs one pass per window. Default 1s.
    pub node_sync_window: Duration,
    /// How many Nodes concurrent `EnsureLoadBalancer`/`UpdateLoadBalancer` calls may hold
    /// between them. Default 400,000. Each call turns the LB Nodes into a request body (a host
    /// list, target registrations): with 100 calls at once on 50,000 Nodes, and a copy of the
    /// Nodes per call, that was gigabytes. Up to 4,000 Nodes the default
    /// never limits the 100 concurrent syncs; above, `budget / nodes` calls run at once (40 at
    /// 10,000 Nodes, 8 at 50,000; upstream runs one). A call with more Nodes than the budget
    /// still runs, alone.
    pub nodes_in_flight: usize,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            concurrent_service_syncs: 100,
            backoff: Backoff {
                base: Duration::from_secs(5),
                max: Duration::from_secs(300),
            },
            drift_check_period: None,
            node_sync_window: Duration::from_secs(1),
            nodes_in_flight: 400_000,
        }
    }
}

impl ServiceConfig {
    fn validate(&self) -> Result<(), StartError> {
        if self.concurrent_service_syncs == 0 {
            return Err(StartError::Invalid(
                "--concurrent-service-syncs: must be at least 1; set it to 1 for upstream's serial behaviour or leave the default 100".into(),
            ));
        }
        if self.nodes_in_flight == 0 || self.nodes_in_flight > MAX_NODES_IN_FLIGHT {
            return Err(StartError::Invalid(format!(
                "service controller: nodes in flight must be between 1 and {MAX_NODES_IN_FLIGHT}, not {}",
                self.nodes_in_flight
            )));
        }
        if self.backoff.base.is_zero() || self.backoff.max < self.backoff.base {
            return Err(StartError::Invalid(format!(
                "service backoff: base {:?} must be > 0 and <= max {:?}",
                self.backoff.base, self.backoff.max
            )));
        }
        if self.drift_check_period.is_some_and(|p| p.is_zero()) {
            return Err(StartError::Invalid(
                "service drift check period: must be > 0; leave it unset to disable the drift check".into(),
            ));
        }
        Ok(())
    }
}

/// Why a sync failed, worded as upstream so logs and events read the same.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// A cloud call failed.
    #[error("{context}: {source}")]
    Cloud {
        /// What was being done (upstream's wording).
        context: &'static str,
        /// The provider's error; a `Retry` here sets the requeue delay.
        #[source]
        source: CloudError,
    },
    /// An API write failed.
    #[error("{context}: {source}")]
    Kube {
        /// What was being done (upstream's wording).
        context: &'static str,
        /// The client error.
        #[source]
        source: kube::Error,
    },
}

impl SyncError {
    fn cloud(context: &'static str) -> impl FnOnce(CloudError) -> SyncError {
        move |source| SyncError::Cloud { context, source }
    }

    fn kube(context: &'static str) -> impl FnOnce(kube::Error) -> SyncError {
        move |source| SyncError::Kube { context, source }
    }

    /// The cloud error, if this is one (it decides the requeue policy).
    pub fn cloud_error(&self) -> Option<&CloudError> {
        match self {
            SyncError::Cloud { source, .. } => Some(source),
            SyncError::Kube { .. } => None,
        }
    }
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_not_found())
}

struct Metrics {
    loadbalancer_sync: Counter,
    nodesync_error: Counter,
    nodesync_latency: Histogram,
    update_host_latency: Histogram,
}

impl Metrics {
    fn new(registry: &mut Registry) -> Self {
        // Upstream: exponential buckets 1s … 16384s (×2, 15 buckets).
        let m = Metrics {
            loadbalancer_sync: Counter::default(),
            nodesync_error: Counter::default(),
            nodesync_latency: Histogram::new(exponential_buckets(1.0, 2.0, 15)),
            update_host_latency: Histogram::new(exponential_buckets(1.0, 2.0, 15)),
        };
        registry.register(
            "service_controller_loadbalancer_sync",
            "A metric counting the amount of times any load balancer has been configured, as an effect of service/node changes on the cluster",
            m.loadbalancer_sync.clone(),
        );
        registry.register(
            "service_controller_nodesync_error",
            "A metric counting the amount of times any load balancer has been configured and errored, as an effect of node changes on the cluster",
            m.nodesync_error.clone(),
        );
        registry.register(
            "service_controller_nodesync_latency_seconds",
            "A metric measuring the latency for nodesync which updates loadbalancer hosts on cluster node updates.",
            m.nodesync_latency.clone(),
        );
        registry.register(
            "service_controller_update_loadbalancer_host_latency_seconds",
            "A metric measuring the latency for updating each load balancer hosts.",
            m.update_host_latency.clone(),
        );
        m
    }
}

/// What the controller remembers per Service key (upstream `serviceCache` + `lastSyncedNodes`).
struct KeyState {
    /// The last processed Service: needed to delete the LB of a Service that disappeared
    /// without our finalizer, and iterated by the node sync.
    cached: Arc<Service>,
    /// The node set last handed to the cloud for this Service (stored before the call).
    last_synced_nodes: Option<Arc<NodeSet>>,
    /// True after a successful ensure, until the next failure or delete: drift-check candidates.
    ensured: bool,
    /// The status this controller last wrote (or confirmed) for `cached`'s UID; guards the
    /// "skip unchanged status" check against a cache that lags our own writes.
    written_status: Option<Option<LoadBalancerStatus>>,
}

struct Inner {
    shared: Shared,
    lb: Arc<dyn LoadBalancer>,
    /// The `spec.loadBalancerClass` served ([`LoadBalancer::load_balancer_class`], read once).
    class: Option<String>,
    client: kube::Client,
    config: ServiceConfig,
    recorder: Recorder,
    queue: WorkQueue<String>,
    node_queue: WorkQueue<String>,
    state: Mutex<HashMap<String, KeyState>>,
    /// The Nodes that back load balancers and the last list handed out, shared by every
    /// Service until a Node changes: 200 Services × 1,000 Nodes must not mean 200 lists.
    lb_nodes: Mutex<lb_nodes::LbNodes>,
    /// Key → UID of Services whose status the delete path cleared. Outlives the key's
    /// [`KeyState`] (which a successful delete removes) so that a following ensure does not
    /// trust a cache still showing the ingress from before the clear. Dropped when the Service
    /// is deleted or its status is written again.
    status_cleared: Mutex<HashMap<String, String>>,
    locks: KeyLocks,
    /// [`ServiceConfig::nodes_in_flight`] as permits, one per Node handed to a provider call.
    node_budget: tokio::sync::Semaphore,
    metrics: Metrics,
    /// Node syncs and drift checks in progress (for [`ServiceHandle::pending`]).
    busy: AtomicUsize,
    stop: CancellationToken,
}

/// The service load-balancer controller. Build with [`ServiceController::new`], then `run`.
pub struct ServiceController {
    inner: Arc<Inner>,
}

/// A cheap, cloneable probe of a running [`ServiceController`], for tests and `ccm demo`.
#[derive(Clone)]
pub struct ServiceHandle {
    inner: Arc<Inner>,
}

impl ServiceHandle {
    /// Service and node keys queued, delayed (backing off) or being processed, plus node syncs
    /// and drift checks in progress. Zero means idle.
    pub fn pending(&self) -> usize {
        self.inner.queue.pending()
            + self.inner.node_queue.pending()
            + self.inner.busy.load(Ordering::SeqCst)
    }

    /// Service keys being retried: queued with at least one recorded failure.
    pub fn failing(&self) -> usize {
        let keys: Vec<String> = self.inner.state.lock().keys().cloned().collect();
        keys.iter()
            .filter(|k| self.inner.queue.failures(k) > 0)
            .count()
    }

    /// What one idle service worker holds, in bytes: `concurrent_service_syncs` of them (100
    /// by default) wait for work all the time, so their size is memory the CCM keeps at rest.
    pub fn idle_worker_bytes(&self) -> usize {
        std::mem::size_of_val(&self.inner.service_worker())
    }
}

impl ServiceController {
    /// A controller for `shared`'s provider. `Skipped` when the provider has no load
    /// balancers (upstream logs "Failed to start service controller" and carries on);
    /// `Invalid` for bad flags. Registers the `service_controller_*` metrics into `registry`.
    /// Must be called inside a Tokio runtime (the event recorder spawns its writer).
    pub fn new(
        shared: Shared,
        client: kube::Client,
        config: ServiceConfig,
        registry: &mut Registry,
    ) -> Result<Self, StartError> {
        let Some(lb) = shared.provider.load_balancer() else {
            return Err(StartError::Skipped(format!(
                "the {} cloud provider does not support load balancers; the service controller is not started",
                shared.provider.provider_name()
            )));
        };
        config.validate()?;
        let stop = CancellationToken::new();
        let queue = WorkQueue::new(
            "service",
            config.backoff,
            shared.queue_metrics.clone(),
            stop.clone(),
        );
        let node_queue = WorkQueue::new(
            "node",
            config.backoff,
            shared.queue_metrics.clone(),
            stop.clone(),
        );
        let recorder = shared.recorder(&client, EVENT_SOURCE);
        let node_budget = tokio::sync::Semaphore::new(config.nodes_in_flight);
        Ok(ServiceController {
            inner: Arc::new(Inner {
                shared,
                class: lb.load_balancer_class(),
                lb,
                client,
                config,
                recorder,
                queue,
                node_queue,
                state: Mutex::default(),
                lb_nodes: Mutex::default(),
                status_cleared: Mutex::default(),
                locks: KeyLocks::default(),
                node_budget,
                metrics: Metrics::new(registry),
                busy: AtomicUsize::new(0),
                stop,
            }),
        })
    }

    /// A probe that tells whether the controller is idle.
    pub fn handle(&self) -> ServiceHandle {
        ServiceHandle {
            inner: self.inner.clone(),
        }
    }

    /// Runs until `shutdown`: waits for the caches, then processes Service and Node changes.
    /// Everything runs inside this future, so dropping it (or cancelling `shutdown`) stops all
    /// work at once; in-flight cloud calls are abandoned and redone by the next leader.
    pub async fn run(self, shutdown: CancellationToken) {
        let inner = self.inner;
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = inner.stop.cancelled() => {}
            _ = inner.clone().run_loops() => {}
        }
        inner.stop.cancel();
    }
}

impl Inner {
    async fn run_loops(self: Arc<Self>) {
        self.shared.services.wait_ready().await;
        self.shared.nodes.wait_ready().await;
        tracing::info!(
            workers = self.config.concurrent_service_syncs,
            "starting service controller"
        );
        // The cached Nodes arrive first, as adds, already queued: indexed before any sync runs,
        // so no Service is ensured with a partial list of hosts.
        let mut node_rx = self.shared.nodes.subscribe();
        while let Ok(ch) = node_rx.try_recv() {
            self.lb_nodes.lock().apply(ch.old.as_ref(), ch.new.as_ref());
        }
        let service_rx = self.shared.services.subscribe();
        let workers = futures::future::join_all(
            (0..self.config.concurrent_service_syncs).map(|_| self.service_worker()),
        );
        let drift = async {
            match self.config.drift_check_period {
                Some(p) => self.drift_loop(p).await,
                None => futures::future::pending().await,
            }
        };
        tokio::join!(
            self.service_events(service_rx),
            self.provider_requeues(),
            self.node_events(node_rx),
            workers,
            self.node_worker(),
            drift,
        );
    }

    // ---- inputs --------------------------------------------------------------------------

    async fn service_events(
        &self,
        mut rx: tokio::sync::mpsc::UnboundedReceiver<crate::informer::Change<Service>>,
    ) {
        while let Some(ch) = rx.recv().await {
            if ch.new.is_none()
                && let Some(old) = &ch.old
            {
                self.status_cleared.lock().remove(&object_key(&**old));
            }
            if should_enqueue_service(ch.old.as_deref(), ch.new.as_deref(), self.class()) {
                let Some(obj) = ch.new.as_ref().or(ch.old.as_ref()) else {
                    continue;
                };
                self.queue.add(object_key(&**obj));
            }
        }
    }

    /// Keys the provider asks to sync again (an address freed for a waiting Service). Queued
    /// as is: a key of a Service that is gone or not ours costs one cache lookup in its sync.
    async fn provider_requeues(&self) {
        let Some(mut keys) = self.lb.service_requeues() else {
            return;
        };
        while let Some(key) = keys.next().await {
            tracing::debug!(service = %key, "provider asked for a sync");
            self.queue.add(key);
        }
    }

    fn class(&self) -> Option<&str> {
        self.class.as_deref()
    }

    async fn node_events(
        &self,
        mut rx: tokio::sync::mpsc::UnboundedReceiver<crate::informer::Change<Node>>,
    ) {
        while let Some(ch) = rx.recv().await {
            self.lb_nodes.lock().apply(ch.old.as_ref(), ch.new.as_ref());
            let trigger = match (&ch.old, &ch.new) {
                (Some(o), Some(n)) => should_sync_updated_node(o, n),
                (None, None) => false,
                _ => true,
            };
            if trigger && let Some(obj) = ch.new.as_ref().or(ch.old.as_ref()) {
                self.node_queue.add(object_key(&**obj));
            }
        }
    }

    // ---- service sync ----------------------------------------------------------------------

    async fn service_worker(&self) {
        while let Some(key) = self.queue.get().await {
            let result = {
                let _guard = self.locks.lock(&key).await;
                // Boxed: a sync's state is kilobytes, and inline every worker — 100 by
                // default, nearly all idle — would hold room for one (0.4 MB of the heap).
                Box::pin(self.sync_service(&key)).await
            };
            match result {
                Ok(()) => self.queue.forget(&key),
                Err(e) => {
                    let requeue = requeue_for(e.cloud_error());
                    tracing::warn!(service = %key, error = %e, ?requeue, "sync failed; will retry");
                    match requeue {
                        Requeue::After(d) => self.queue.add_after(key.clone(), d),
                        Requeue::RateLimited => {
                            self.queue.add_rate_limited(key.clone());
                        }
                    }
                }
            }
            self.queue.done(&key);
        }
    }

    /// Upstream `syncService`.
    async fn sync_service(&self, key: &str) -> Result<(), SyncError> {
        let start = Instant::now();
        let result = match self.shared.services.get(key) {
            None => self.process_deletion(key).await,
            Some(svc) => self.process_create_or_update(key, svc).await,
        };
        tracing::debug!(service = %key, elapsed = ?start.elapsed(), ok = result.is_ok(), "synced service");
        result
    }

    /// The Service is gone from the cache: delete the LB of the last processed version, if it
    /// wanted one (a Service deleted without our finalizer).
    async fn process_deletion(&self, key: &str) -> Result<(), SyncError> {
        let Some(cached) = self.state.lock().get(key).map(|s| s.cached.clone()) else {
            return Ok(());
        };
        self.delete_cached_lb(&cached).await?;
        self.state.lock().remove(key);
        Ok(())
    }

    /// Upstream `processLoadBalancerDelete`: the cache-based path, where errors count.
    async fn delete_cached_lb(&self, svc: &Service) -> Result<(), SyncError> {
        if !wants_load_balancer(svc, self.class()) {
            return Ok(());
        }
        self.event(
            svc,
            EventType::Normal,
            "DeletingLoadBalancer",
            "Deleting load balancer",
        );
        if let Err(e) = self
            .lb
            .ensure_load_balancer_deleted(&self.shared.cluster_name, svc)
            .await
        {
            self.event(
                svc,
                EventType::Warning,
                "DeleteLoadBalancerFailed",
                format!("Error deleting load balancer: {e}"),
            );
            return Err(SyncError::Cloud {
                context: "failed to delete load balancer",
                source: e,
            });
        }
        self.event(
            svc,
            EventType::Normal,
            "DeletedLoadBalancer",
            "Deleted load balancer",
        );
        Ok(())
    }

    async fn process_create_or_update(
        &self,
        key: &str,
        svc: Arc<Service>,
    ) -> Result<(), SyncError> {
        let stale = self
            .state
            .lock()
            .get(key)
            .map(|s| s.cached.clone())
            .filter(|cached| must_delete_stale_lb(cached, &svc, self.class()));
        if let Some(old) = stale {
            // Deleted and re-created under the same name while we were not looking.
            self.delete_cached_lb(&old).await?;
        }
        {
            let mut state = self.state.lock();
            match state.get_mut(key) {
                Some(s) if s.cached.metadata.uid == svc.metadata.uid => s.cached = svc.clone(),
                _ => {
                    state.insert(
                        key.to_string(),
                        KeyState {
                            cached: svc.clone(),
                            last_synced_nodes: None,
                            ensured: false,
                            written_status: None,
                        },
                    );
                }
            }
        }
        let plan = plan_sync(&svc, self.class());
        let result = match plan {
            SyncPlan::Delete => self.delete_path(&svc).await,
            SyncPlan::Ensure => self.ensure_path(key, &svc).await,
        };
        match &result {
            Err(e) => {
                if let Some(s) = self.state.lock().get_mut(key) {
                    s.ensured = false;
                }
                self.event(
                    &svc,
                    EventType::Warning,
                    "SyncLoadBalancerFailed",
                    format!("Error syncing load balancer: {e}"),
                );
            }
            Ok(()) if plan == SyncPlan::Delete => {
                self.state.lock().remove(key);
            }
            Ok(()) => {}
        }
        result
    }

    /// LB first, then the status, then the finalizer: a Service never loses its finalizer
    /// while its LB may still exist.
    async fn delete_path(&self, svc: &Service) -> Result<(), SyncError> {
        let cluster = &self.shared.cluster_name;
        let exists = self
            .lb
            .get_load_balancer(cluster, svc)
            .await
            .map_err(SyncError::cloud(
                "failed to check if load balancer exists before cleanup",
            ))?;
        if exists.is_some() {
            self.event(
                svc,
                EventType::Normal,
                "DeletingLoadBalancer",
                "Deleting load balancer",
            );
            match self.lb.ensure_load_balancer_deleted(cluster, svc).await {
                Ok(()) | Err(CloudError::ImplementedElsewhere) => {}
                Err(e) => return Err(SyncError::cloud("failed to delete load balancer")(e)),
            }
        }
        self.patch_status(svc, current_status(svc), None).await?;
        if has_finalizer(svc) {
            self.patch_finalizer(svc, false)
                .await
                .map_err(SyncError::kube(
                    "failed to remove load balancer cleanup finalizer",
                ))?;
        }
        self.event(
            svc,
            EventType::Normal,
            "DeletedLoadBalancer",
            "Deleted load balancer",
        );
        Ok(())
    }

    /// Finalizer first (so nothing in the cloud can outlive the Service unnoticed), then the
    /// node set, then `EnsureLoadBalancer`, then the status if its ingress changed.
    async fn ensure_path(&self, key: &str, svc: &Arc<Service>) -> Result<(), SyncError> {
        self.event(
            svc,
            EventType::Normal,
            "EnsuringLoadBalancer",
            "Ensuring load balancer",
        );
        let mut fresh: Option<Service> = None;
        if !has_finalizer(svc) {
            fresh = Some(
                self.patch_finalizer(svc, true)
                    .await
                    .map_err(SyncError::kube(
                        "failed to add load balancer cleanup finalizer",
                    ))?,
            );
        }
        // Before the list: a sync waiting for its turn holds no copy of the Nodes. Every cached
        // Node is the bound (the LB Nodes are not known before the list).
        let permits = self.node_permits(self.shared.nodes.len()).await;
        let (nodes, set) = self.lb_nodes();
        if nodes.is_empty() {
            self.event(
                svc,
                EventType::Warning,
                "UnAvailableLoadBalancer",
                "There are no available nodes for LoadBalancer",
            );
        }
        if let Some(s) = self.state.lock().get_mut(key) {
            s.last_synced_nodes = Some(set);
        }
        let ensured = self
            .lb
            .ensure_load_balancer(&self.shared.cluster_name, svc, &nodes)
            .await;
        drop(permits);
        let status = match ensured {
            Ok(status) => status,
            Err(CloudError::ImplementedElsewhere) => return Ok(()),
            Err(e) => return Err(SyncError::cloud("failed to ensure load balancer")(e)),
        };
        self.event(
            svc,
            EventType::Normal,
            "EnsuredLoadBalancer",
            "Ensured load balancer",
        );
        let previous = fresh
            .as_ref()
            .map_or_else(|| current_status(svc), current_status);
        self.patch_status(svc, previous, Some(status)).await?;
        if let Some(s) = self.state.lock().get_mut(key) {
            s.ensured = true;
        }
        Ok(())
    }

    /// The current LB nodes (sorted by name) and their set: the node cache's own Nodes.
    fn lb_nodes(&self) -> (Arc<Vec<Arc<Node>>>, Arc<NodeSet>) {
        self.lb_nodes.lock().current()
    }

    /// Waits until a provider call with `nodes` Nodes fits in [`ServiceConfig::nodes_in_flight`].
    async fn node_permits(&self, nodes: usize) -> Option<tokio::sync::SemaphorePermit<'_>> {
        let n = nodes.min(self.config.nodes_in_flight);
        // `as u32` cannot truncate: validate() caps the budget below u32::MAX. The semaphore is
        // never closed, so an error cannot happen; a call then goes ahead without permits.
        self.node_budget.acquire_many(n as u32).await.ok()
    }

    fn api(&self, svc: &Service) -> Api<Service> {
        Api::namespaced(
            self.client.clone(),
            svc.metadata.namespace.as_deref().unwrap_or("default"),
        )
    }

    /// Adds or removes our finalizer with a strategic merge patch on the status subresource
    /// (as upstream): the patch merges into the live list, so other finalizers are kept, and
    /// the UID precondition keeps it off a re-created namesake.
    async fn patch_finalizer(&self, svc: &Service, add: bool) -> Result<Service, kube::Error> {
        let name = svc.metadata.name.as_deref().unwrap_or_default();
        let patch = if add {
            json!({"metadata": {"uid": svc.metadata.uid, "finalizers": [LOAD_BALANCER_CLEANUP_FINALIZER]}})
        } else {
            json!({"metadata": {"uid": svc.metadata.uid,
                "$deleteFromPrimitiveList/finalizers": [LOAD_BALANCER_CLEANUP_FINALIZER]}})
        };
        match self
            .api(svc)
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
        {
            // Removing from a Service that is already gone is done.
            Err(e) if !add && is_not_found(&e) => Ok(svc.clone()),
            other => other,
        }
    }

    /// Writes `status.loadBalancer` through `/status`, unless its ingress is unchanged both in
    /// the cache and in what we last wrote. NotFound (the Service went away) is not an error.
    async fn patch_status(
        &self,
        svc: &Service,
        previous: Option<&LoadBalancerStatus>,
        new: Option<LoadBalancerStatus>,
    ) -> Result<(), SyncError> {
        let key = object_key(svc);
        let last_written = self
            .state
            .lock()
            .get(&key)
            .filter(|s| s.cached.metadata.uid == svc.metadata.uid)
            .and_then(|s| s.written_status.clone());
        let uid = svc.metadata.uid.clone().unwrap_or_default();
        let cleared = self.status_cleared.lock().get(&key) == Some(&uid);
        let unchanged = ingress_equal(previous, new.as_ref())
            && last_written
                .as_ref()
                .is_none_or(|w| ingress_equal(w.as_ref(), new.as_ref()))
            && !(cleared && new.is_some());
        if unchanged {
            return Ok(());
        }
        let ingress = new.as_ref().and_then(|s| s.ingress.clone());
        let patch = json!({
            "metadata": {"uid": svc.metadata.uid},
            "status": {"loadBalancer": {"ingress": ingress}},
        });
        let name = svc.metadata.name.as_deref().unwrap_or_default();
        match self
            .api(svc)
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                if new.is_some() {
                    self.status_cleared.lock().remove(&key);
                } else {
                    self.status_cleared.lock().insert(key.clone(), uid);
                }
                if let Some(s) = self.state.lock().get_mut(&key)
                    && s.cached.metadata.uid == svc.metadata.uid
                {
                    s.written_status = Some(new);
                }
                Ok(())
            }
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(SyncError::Kube {
                context: "failed to update load balancer status",
                source: e,
            }),
        }
    }

    fn event(&self, svc: &Service, type_: EventType, reason: &str, message: impl Into<String>) {
        self.recorder.publish(svc, type_, reason, message);
    }

    // ---- node sync -------------------------------------------------------------------------

    /// Node changes are acted on at once, as upstream's node worker does: a lone join reaches
    /// every load balancer one cloud round trip after it. Only a pass that changed load
    /// balancers opens the window: changes arriving within `node_sync_window` of it wait for
    /// its end and then go out together, so a burst of joins costs one pass per window instead
    /// of one per Node. (It used to wait the window after every first change: a join reached
    /// 200 LBs after 1.1–1.2 s instead of ~0.15 s.)
    async fn node_worker(&self) {
        let mut last_update: Option<Instant> = None;
        while let Some(batch) = self.node_queue.get_batch(usize::MAX, Duration::ZERO).await {
            if let Some(due) = last_update.map(|t| t + self.config.node_sync_window) {
                tokio::time::sleep_until(due).await;
            }
            let started = Instant::now();
            if self.sync_nodes().await > 0 {
                last_update = Some(started);
            }
            for k in &batch {
                self.node_queue.done(k);
            }
        }
    }

    /// Upstream `syncNodes`: for every cached LB Service, `UpdateLoadBalancer` if its node set
    /// changed, `concurrent_service_syncs` at a time, each under the Service's lock. Returns
    /// how many load balancers it updated (or tried to).
    async fn sync_nodes(&self) -> usize {
        let start = Instant::now();
        let keys: Vec<String> = self
            .state
            .lock()
            .iter()
            .filter(|(_, s)| wants_load_balancer(&s.cached, self.class()))
            .map(|(k, _)| k.clone())
            .collect();
        if keys.is_empty() {
            // No LoadBalancer Service: nothing to update, and no node list worth building.
            return 0;
        }
        let (nodes, set) = self.lb_nodes();
        tracing::debug!(services = keys.len(), nodes = nodes.len(), "node sync");
        let updated = AtomicUsize::new(0);
        futures::stream::iter(keys)
            .for_each_concurrent(self.config.concurrent_service_syncs, |key| {
                let (nodes, set, updated) = (nodes.clone(), set.clone(), &updated);
                async move {
                    if self.node_sync_service(&key, &nodes, &set).await {
                        updated.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
            .await;
        self.metrics
            .nodesync_latency
            .observe(start.elapsed().as_secs_f64());
        updated.into_inner()
    }

    /// Whether it called `UpdateLoadBalancer`.
    async fn node_sync_service(&self, key: &str, nodes: &[Arc<Node>], set: &Arc<NodeSet>) -> bool {
        let _guard = self.locks.lock(key).await;
        // Decide under the lock: a sync that ran meanwhile may already have sent this set.
        let svc = {
            let mut state = self.state.lock();
            let Some(s) = state.get_mut(key) else {
                return false;
            };
            if !wants_load_balancer(&s.cached, self.class()) || planner::needs_cleanup(&s.cached) {
                return false;
            }
            // Never ensured yet: the pending ensure will use the current set.
            let Some(old) = &s.last_synced_nodes else {
                return false;
            };
            if !node_set_changed(old, set) {
                return false;
            }
            s.last_synced_nodes = Some(set.clone());
            s.cached.clone()
        };
        self.metrics.loadbalancer_sync.inc();
        let permits = self.node_permits(nodes.len()).await;
        let start = Instant::now();
        let result = self
            .lb
            .update_load_balancer(&self.shared.cluster_name, &svc, nodes)
            .await;
        drop(permits);
        self.metrics
            .update_host_latency
            .observe(start.elapsed().as_secs_f64());
        match result {
            Ok(()) | Err(CloudError::ImplementedElsewhere) => {
                if nodes.is_empty() {
                    self.event(
                        &svc,
                        EventType::Warning,
                        "UnAvailableLoadBalancer",
                        "There are no available nodes for LoadBalancer",
                    );
                } else {
                    self.event(
                        &svc,
                        EventType::Normal,
                        "UpdatedLoadBalancer",
                        "Updated load balancer with new hosts",
                    );
                }
            }
            Err(e) => {
                // An LB that does not exist needs no hosts (the ensure will create it).
                if let Ok(None) = self
                    .lb
                    .get_load_balancer(&self.shared.cluster_name, &svc)
                    .await
                {
                    return true;
                }
                let names: Vec<String> = nodes
                    .iter()
                    .map(|n| ccm_cloud::node_name(n).to_string())
                    .collect();
                self.event(
                    &svc,
                    EventType::Warning,
                    "UpdateLoadBalancerFailed",
                    update_failed_message(&names, &e.to_string()),
                );
                self.metrics.nodesync_error.inc();
                // A full ensure retries it, with the Service's own backoff if that fails too.
                self.queue.add(key.to_string());
            }
        }
        true
    }

    // ---- drift check -----------------------------------------------------------------------

    async fn drift_loop(&self, period: Duration) {
        let mut tick = tokio::time::interval_at(Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.busy.fetch_add(1, Ordering::SeqCst);
            self.drift_check().await;
            self.busy.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// `GetLoadBalancer` for every ensured Service; re-ensure those whose LB vanished or
    /// reports another ingress than the Service shows (changed or deleted outside the cluster,
    /// or status cleared by a user — k/k #34660, #53193).
    async fn drift_check(&self) {
        let keys: Vec<String> = self
            .state
            .lock()
            .iter()
            .filter(|(_, s)| s.ensured)
            .map(|(k, _)| k.clone())
            .collect();
        futures::stream::iter(keys)
            .for_each_concurrent(self.config.concurrent_service_syncs, |key| async move {
                let _guard = self.locks.lock(&key).await;
                let Some(svc) = self.shared.services.get(&key) else {
                    return;
                };
                let still_ensured = self.state.lock().get(&key).is_some_and(|s| {
                    s.ensured && s.cached.metadata.uid == svc.metadata.uid
                });
                if !still_ensured || plan_sync(&svc, self.class()) != SyncPlan::Ensure {
                    return;
                }
                match self
                    .lb
                    .get_load_balancer(&self.shared.cluster_name, &svc)
                    .await
                {
                    Ok(None) => {
                        tracing::info!(service = %key, "load balancer missing in the cloud; re-ensuring");
                        self.queue.add(key.clone());
                    }
                    Ok(Some(status)) if !ingress_equal(Some(&status), current_status(&svc)) => {
                        tracing::info!(service = %key, "load balancer ingress drifted; re-ensuring");
                        self.queue.add(key.clone());
                    }
                    Ok(Some(_)) => {}
                    Err(e) => {
                        tracing::debug!(service = %key, error = %e, "drift check failed; next pass retries")
                    }
                }
            })
            .await;
    }
}
