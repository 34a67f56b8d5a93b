//! A wrapper that counts, times and optionally rate-limits every call into a provider.
//!
//! Every provider gets the same metrics for free, so "how many cloud calls did that cost?" has
//! one answer across providers, the demo and the benchmark:
//! - `cloudprovider_api_requests_total{provider,operation,result}`
//! - `cloudprovider_api_request_duration_seconds{provider,operation}`
//! - `cloudprovider_api_rate_limit_wait_seconds{provider}`
//!
//! A batch call the provider answers natively counts as one request, which is exactly what the
//! cloud sees; a batch answered by the per-node fallback counts one request per node.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use crate::error::{CloudError, CloudResult};
use crate::provider::{
    CloudProvider, InitContext, Instances, LoadBalancer, Routes, fallback_instances_metadata,
    fallback_instances_status,
};
use crate::ratelimit::RateLimiter;
use crate::types::{
    InstanceEvent, InstanceMetadata, InstanceStatus, LoadBalancerStatus, Node, Route, Service,
};
use crate::volume::Volumes;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    provider: String,
    operation: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    provider: String,
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderLabels {
    provider: String,
}

fn duration_histogram() -> Histogram {
    // 5 ms … ~80 s: covers a local simulator and a slow cloud API alike.
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

/// The cloud API metrics, shared by every wrapped provider of one process.
#[derive(Clone)]
pub struct CloudMetrics {
    requests: Family<RequestLabels, Counter>,
    duration: Family<OperationLabels, Histogram>,
    wait: Family<ProviderLabels, Histogram>,
    /// A readable copy of the request counts: prometheus-client families cannot be iterated,
    /// and tests, `ccm demo` and `ccm bench` report calls by operation.
    tally: Arc<parking_lot::Mutex<BTreeMap<(String, String), u64>>>,
}

impl Default for CloudMetrics {
    fn default() -> Self {
        CloudMetrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(duration_histogram),
            wait: Family::new_with_constructor(duration_histogram),
            tally: Arc::default(),
        }
    }
}

impl std::fmt::Debug for CloudMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CloudMetrics")
            .field("tally", &*self.tally.lock())
            .finish()
    }
}

impl CloudMetrics {
    /// Metrics registered into `registry`, which the binary serves at `/metrics`.
    pub fn new(registry: &mut Registry) -> Self {
        let m = CloudMetrics::default();
        registry.register(
            "cloudprovider_api_requests",
            "Cloud provider API calls by operation and result",
            m.requests.clone(),
        );
        registry.register(
            "cloudprovider_api_request_duration_seconds",
            "Latency of cloud provider API calls, including retries inside the provider",
            m.duration.clone(),
        );
        registry.register(
            "cloudprovider_api_rate_limit_wait_seconds",
            "Time calls waited for the client-side cloud API rate limit",
            m.wait.clone(),
        );
        m
    }

    fn record(&self, provider: &str, operation: &'static str, result: &'static str, d: Duration) {
        self.requests
            .get_or_create(&RequestLabels {
                provider: provider.to_string(),
                operation,
                result,
            })
            .inc();
        self.duration
            .get_or_create(&OperationLabels {
                provider: provider.to_string(),
                operation,
            })
            .observe(d.as_secs_f64());
        *self
            .tally
            .lock()
            .entry((operation.to_string(), result.to_string()))
            .or_default() += 1;
    }

    /// Calls made for `operation`, whatever their result.
    pub fn count(&self, operation: &str) -> u64 {
        self.tally
            .lock()
            .iter()
            .filter(|((op, _), _)| op == operation)
            .map(|(_, n)| n)
            .sum()
    }

    /// All calls made, by `(operation, result)`.
    pub fn snapshot(&self) -> BTreeMap<(String, String), u64> {
        self.tally.lock().clone()
    }

    /// All calls made, whatever the operation.
    pub fn total(&self) -> u64 {
        self.tally.lock().values().sum()
    }
}

/// Operation names, as they appear in the `operation` label.
pub mod op {
    /// [`crate::Instances::instance_exists`]
    pub const INSTANCE_EXISTS: &str = "instance_exists";
    /// [`crate::Instances::instance_shutdown`]
    pub const INSTANCE_SHUTDOWN: &str = "instance_shutdown";
    /// [`crate::Instances::instance_metadata`]
    pub const INSTANCE_METADATA: &str = "instance_metadata";
    /// [`crate::Instances::instances_metadata`] answered natively
    pub const INSTANCES_METADATA: &str = "instances_metadata";
    /// [`crate::Instances::instances_status`] answered natively
    pub const INSTANCES_STATUS: &str = "instances_status";
    /// [`crate::LoadBalancer::get_load_balancer`]
    pub const GET_LOAD_BALANCER: &str = "get_load_balancer";
    /// [`crate::LoadBalancer::ensure_load_balancer`]
    pub const ENSURE_LOAD_BALANCER: &str = "ensure_load_balancer";
    /// [`crate::LoadBalancer::update_load_balancer`]
    pub const UPDATE_LOAD_BALANCER: &str = "update_load_balancer";
    /// [`crate::LoadBalancer::ensure_load_balancer_deleted`]
    pub const ENSURE_LOAD_BALANCER_DELETED: &str = "ensure_load_balancer_deleted";
    /// [`crate::Routes::list_routes`]
    pub const LIST_ROUTES: &str = "list_routes";
    /// [`crate::Routes::create_route`]
    pub const CREATE_ROUTE: &str = "create_route";
    /// [`crate::Routes::delete_route`]
    pub const DELETE_ROUTE: &str = "delete_route";
    /// [`crate::CloudProvider::initialize`]
    pub const INITIALIZE: &str = "initialize";
    /// [`crate::Volumes::volume_topology`]
    pub const VOLUME_TOPOLOGY: &str = "volume_topology";
}

struct Meter {
    provider: String,
    metrics: CloudMetrics,
    limiter: Option<Arc<RateLimiter>>,
}

impl Meter {
    async fn limit(&self) {
        if let Some(limiter) = &self.limiter {
            let waited = limiter.acquire().await;
            self.metrics
                .wait
                .get_or_create(&ProviderLabels {
                    provider: self.provider.clone(),
                })
                .observe(waited.as_secs_f64());
        }
    }

    async fn call<T>(
        &self,
        operation: &'static str,
        fut: impl Future<Output = CloudResult<T>>,
    ) -> CloudResult<T> {
        self.limit().await;
        let start = Instant::now();
        let out = fut.await;
        let result = CloudError::result_label(&out);
        self.metrics
            .record(&self.provider, operation, result, start.elapsed());
        out
    }

    async fn batch<T>(
        &self,
        operation: &'static str,
        fut: impl Future<Output = Vec<CloudResult<T>>>,
    ) -> Vec<CloudResult<T>> {
        self.limit().await;
        let start = Instant::now();
        let out = fut.await;
        // One API call: it failed as a whole only if every answer carries the same call-level
        // error. Per-node answers such as InstanceNotFound are a successful call.
        let call_level = |e: &CloudError| {
            matches!(
                e,
                CloudError::Throttled { .. }
                    | CloudError::Transient(_)
                    | CloudError::Permanent(_)
                    | CloudError::Retry { .. }
            )
        };
        let result = match out.first() {
            Some(Err(first))
                if call_level(first) && out.iter().all(|r| matches!(r, Err(e) if e == first)) =>
            {
                first.kind()
            }
            _ => "success",
        };
        self.metrics
            .record(&self.provider, operation, result, start.elapsed());
        out
    }
}

/// Options for [`metered`].
#[derive(Debug, Clone, Default)]
pub struct MeterOptions {
    /// Client-side limit as `(qps, burst)`; `None` lets every call through at once.
    pub rate_limit: Option<(f64, u32)>,
}

/// Wraps `inner` so every call is counted into `metrics` and, if asked, rate-limited.
pub fn metered(
    inner: Arc<dyn CloudProvider>,
    metrics: CloudMetrics,
    options: MeterOptions,
) -> Arc<dyn CloudProvider> {
    let meter = Arc::new(Meter {
        provider: inner.provider_name().to_string(),
        metrics,
        limiter: options
            .rate_limit
            .map(|(qps, burst)| Arc::new(RateLimiter::new(qps, burst))),
    });
    Arc::new(Metered { inner, meter })
}

struct Metered {
    inner: Arc<dyn CloudProvider>,
    meter: Arc<Meter>,
}

#[async_trait]
impl CloudProvider for Metered {
    fn provider_name(&self) -> &str {
        self.inner.provider_name()
    }
    fn has_cluster_id(&self) -> bool {
        self.inner.has_cluster_id()
    }
    fn register_metrics(&self, registry: &mut Registry) {
        self.inner.register_metrics(registry);
    }
    async fn initialize(&self, ctx: InitContext) -> CloudResult<()> {
        self.meter
            .call(op::INITIALIZE, self.inner.initialize(ctx))
            .await
    }
    fn instances(&self) -> Option<Arc<dyn Instances>> {
        let inner = self.inner.instances()?;
        Some(Arc::new(MeteredInstances {
            inner,
            meter: self.meter.clone(),
        }))
    }
    fn load_balancer(&self) -> Option<Arc<dyn LoadBalancer>> {
        let inner = self.inner.load_balancer()?;
        Some(Arc::new(MeteredLoadBalancer {
            inner,
            meter: self.meter.clone(),
        }))
    }
    fn routes(&self) -> Option<Arc<dyn Routes>> {
        let inner = self.inner.routes()?;
        Some(Arc::new(MeteredRoutes {
            inner,
            meter: self.meter.clone(),
        }))
    }
    fn volumes(&self) -> Option<Arc<dyn Volumes>> {
        let inner = self.inner.volumes()?;
        Some(Arc::new(MeteredVolumes {
            inner,
            meter: self.meter.clone(),
        }))
    }
    fn webhooks(&self) -> Vec<Arc<dyn crate::webhook::Webhook>> {
        self.inner.webhooks()
    }
}

struct MeteredVolumes {
    inner: Arc<dyn Volumes>,
    meter: Arc<Meter>,
}

#[async_trait]
impl Volumes for MeteredVolumes {
    fn volume_id(&self, spec: &k8s_openapi::api::core::v1::PersistentVolumeSpec) -> Option<String> {
        self.inner.volume_id(spec)
    }
    async fn volume_topology(
        &self,
        ids: &[String],
    ) -> CloudResult<std::collections::HashMap<String, crate::VolumeTopology>> {
        self.meter
            .call(op::VOLUME_TOPOLOGY, self.inner.volume_topology(ids))
            .await
    }
    fn max_batch_size(&self) -> usize {
        self.inner.max_batch_size()
    }
}

struct MeteredInstances {
    inner: Arc<dyn Instances>,
    meter: Arc<Meter>,
}

#[async_trait]
impl Instances for MeteredInstances {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        self.meter
            .call(op::INSTANCE_EXISTS, self.inner.instance_exists(node))
            .await
    }
    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        self.meter
            .call(op::INSTANCE_SHUTDOWN, self.inner.instance_shutdown(node))
            .await
    }
    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        self.meter
            .call(op::INSTANCE_METADATA, self.inner.instance_metadata(node))
            .await
    }
    async fn instances_metadata(
        &self,
        nodes: &[Arc<Node>],
    ) -> Vec<CloudResult<Option<InstanceMetadata>>> {
        if self.inner.native_batching() {
            self.meter
                .batch(op::INSTANCES_METADATA, self.inner.instances_metadata(nodes))
                .await
        } else {
            fallback_instances_metadata(self, nodes).await
        }
    }
    async fn instances_status(&self, nodes: &[Arc<Node>]) -> Vec<CloudResult<InstanceStatus>> {
        if self.inner.native_batching() {
            self.meter
                .batch(op::INSTANCES_STATUS, self.inner.instances_status(nodes))
                .await
        } else {
            fallback_instances_status(self, nodes).await
        }
    }
    fn native_batching(&self) -> bool {
        self.inner.native_batching()
    }
    fn max_batch_size(&self) -> usize {
        self.inner.max_batch_size()
    }
    fn instance_events(&self) -> Option<BoxStream<'static, InstanceEvent>> {
        self.inner.instance_events()
    }
}

struct MeteredLoadBalancer {
    inner: Arc<dyn LoadBalancer>,
    meter: Arc<Meter>,
}

#[async_trait]
impl LoadBalancer for MeteredLoadBalancer {
    async fn get_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        self.meter
            .call(
                op::GET_LOAD_BALANCER,
                self.inner.get_load_balancer(cluster, service),
            )
            .await
    }
    fn load_balancer_name(&self, cluster: &str, service: &Service) -> String {
        self.inner.load_balancer_name(cluster, service)
    }
    async fn ensure_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        self.meter
            .call(
                op::ENSURE_LOAD_BALANCER,
                self.inner.ensure_load_balancer(cluster, service, nodes),
            )
            .await
    }
    async fn update_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        self.meter
            .call(
                op::UPDATE_LOAD_BALANCER,
                self.inner.update_load_balancer(cluster, service, nodes),
            )
            .await
    }
    async fn ensure_load_balancer_deleted(
        &self,
        cluster: &str,
        service: &Service,
    ) -> CloudResult<()> {
        self.meter
            .call(
                op::ENSURE_LOAD_BALANCER_DELETED,
                self.inner.ensure_load_balancer_deleted(cluster, service),
            )
            .await
    }
    fn load_balancer_class(&self) -> Option<String> {
        self.inner.load_balancer_class()
    }
    fn service_requeues(&self) -> Option<BoxStream<'static, String>> {
        self.inner.service_requeues()
    }
}

struct MeteredRoutes {
    inner: Arc<dyn Routes>,
    meter: Arc<Meter>,
}

#[async_trait]
impl Routes for MeteredRoutes {
    async fn list_routes(&self, cluster: &str) -> CloudResult<Vec<Route>> {
        self.meter
            .call(op::LIST_ROUTES, self.inner.list_routes(cluster))
            .await
    }
    async fn create_route(&self, cluster: &str, name_hint: &str, route: &Route) -> CloudResult<()> {
        self.meter
            .call(
                op::CREATE_ROUTE,
                self.inner.create_route(cluster, name_hint, route),
            )
            .await
    }
    async fn delete_route(&self, cluster: &str, route: &Route) -> CloudResult<()> {
        self.meter
            .call(op::DELETE_ROUTE, self.inner.delete_route(cluster, route))
            .await
    }
}

impl CloudError {
    /// The `result` label value for an outcome.
    pub fn result_label<T>(r: &CloudResult<T>) -> &'static str {
        match r {
            Ok(_) => "success",
            Err(e) => e.kind(),
        }
    }
}
