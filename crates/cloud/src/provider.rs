//! The traits a cloud-provider author implements.
//!
//! The shape follows upstream `k8s.io/cloud-provider` so that its documentation and
//! intuitions carry over: one root trait with optional capabilities, InstancesV2 semantics for
//! instances, and the LoadBalancer and Routes contracts unchanged. Two additions make zero idle
//! cloud calls possible: batch lookups ([`Instances::instances_metadata`],
//! [`Instances::instances_status`]) and an instance event stream
//! ([`Instances::instance_events`]).

use std::sync::Arc;

use async_trait::async_trait;
use futures::future::join_all;
use futures::stream::BoxStream;
use tokio_util::sync::CancellationToken;

use crate::error::CloudResult;
use crate::types::{
    InstanceEvent, InstanceMetadata, InstanceStatus, LoadBalancerStatus, Node, Route, Service,
};

/// How many per-node calls the default batch methods keep in flight at once. High enough that a
/// provider without native batching still initializes a burst of nodes quickly, low enough not to
/// trip a cloud's rate limit on its own.
pub const DEFAULT_FALLBACK_CONCURRENCY: usize = 16;

/// What a provider receives once, after leadership is won and before any controller starts
/// (upstream `Initialize(clientBuilder, stop)`).
#[derive(Clone)]
pub struct InitContext {
    /// A client for the cluster, for providers that read ConfigMaps, Secrets or Nodes.
    pub client: kube::Client,
    /// Cancelled when the controllers stop; background tasks the provider spawns must end then.
    pub shutdown: CancellationToken,
}

/// The root of a cloud provider. Capabilities the cloud lacks return `None`, and the controller
/// that needs them is skipped with a log line (upstream's `(x, false)`).
///
/// A provider is one implementation of this trait plus whichever capability traits it supports:
///
/// ```
/// use std::sync::Arc;
/// use async_trait::async_trait;
/// use ccm_cloud::{CloudProvider, CloudResult, Instances, InstanceMetadata, Node, node_name};
///
/// /// A cloud where every node is a VM named after the node.
/// struct TinyCloud;
///
/// #[async_trait]
/// impl Instances for TinyCloud {
///     async fn instance_exists(&self, _node: &Node) -> CloudResult<bool> {
///         Ok(true)
///     }
///     async fn instance_shutdown(&self, _node: &Node) -> CloudResult<bool> {
///         Ok(false)
///     }
///     async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
///         Ok(Some(InstanceMetadata {
///             provider_id: format!("tiny://{}", node_name(node)),
///             instance_type: "small".into(),
///             zone: "zone-a".into(),
///             region: "region-1".into(),
///             ..Default::default()
///         }))
///     }
/// }
///
/// struct Tiny(Arc<TinyCloud>);
///
/// impl CloudProvider for Tiny {
///     fn provider_name(&self) -> &str {
///         "tiny"
///     }
///     fn instances(&self) -> Option<Arc<dyn Instances>> {
///         Some(self.0.clone())
///     }
/// }
///
/// # let provider: Arc<dyn CloudProvider> = Arc::new(Tiny(Arc::new(TinyCloud)));
/// # assert!(provider.load_balancer().is_none());
/// ```
#[async_trait]
pub trait CloudProvider: Send + Sync + 'static {
    /// The provider's name: the prefix of `<name>://<id>` provider IDs and the
    /// `--cloud-provider` value it registers under.
    fn provider_name(&self) -> &str;

    /// Whether the provider can tell this cluster's cloud resources from others'. Upstream's
    /// sample CCM refuses to start without it unless `--allow-untagged-cloud` is set.
    fn has_cluster_id(&self) -> bool {
        true
    }

    /// Called once per leadership term, after leadership is acquired and before any controller
    /// starts.
    async fn initialize(&self, _ctx: InitContext) -> CloudResult<()> {
        Ok(())
    }

    /// Adds the provider's own metrics (e.g. upstream cloud-provider-aws's
    /// `cloudprovider_aws_api_*`) to the registry served at `/metrics`. Called once, when the
    /// manager builds the provider.
    fn register_metrics(&self, _registry: &mut prometheus_client::registry::Registry) {}

    /// Instance lookups (upstream InstancesV2). `None`: the node controllers are skipped.
    fn instances(&self) -> Option<Arc<dyn Instances>> {
        None
    }

    /// Load balancers for `type: LoadBalancer` Services. `None`: the service controller is
    /// skipped.
    fn load_balancer(&self) -> Option<Arc<dyn LoadBalancer>> {
        None
    }

    /// Pod-CIDR routes. `None`: the route controller is skipped.
    fn routes(&self) -> Option<Arc<dyn Routes>> {
        None
    }

    /// Disk topology lookups. `Some`: `--webhooks=persistentvolumelabel` serves the
    /// PersistentVolume labeler for this cloud's disks; `None`: that name is a startup error.
    fn volumes(&self) -> Option<Arc<dyn crate::Volumes>> {
        None
    }

    /// Further admission webhooks this provider hosts, each enabled by its name in
    /// `--webhooks` (upstream: the provider's `WebhookConfigs`). Called once, at startup.
    fn webhooks(&self) -> Vec<Arc<dyn crate::webhook::Webhook>> {
        Vec::new()
    }
}

/// Instance lookups with upstream InstancesV2 semantics: every call takes the whole Node, and
/// implementations look it up by `spec.providerID` first, then by name.
#[async_trait]
pub trait Instances: Send + Sync + 'static {
    /// Whether the instance exists. `Ok(false)` means gone: the lifecycle controller deletes the
    /// Node if it is NotReady. Stopped instances must return `Ok(true)`.
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool>;

    /// Whether the instance exists but is powered off.
    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool>;

    /// Everything needed to initialize the Node. `Ok(None)` is upstream's `(nil, nil)`: the
    /// controller logs it and waits for the next Node event.
    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>>;

    /// Metadata for many Nodes, one result per input Node in the same order.
    ///
    /// The Nodes are the controllers' cached ones, shared: a batch of 500 costs the caller
    /// no copies (a copy of a kubelet's Node is ~5 KiB, and the address refresh asks for every
    /// Node every few minutes).
    ///
    /// The default calls [`Instances::instance_metadata`] once per node (a few at a time).
    /// Override it when the cloud answers many instances per API call (EC2 `DescribeInstances`
    /// takes 1,000 ids) and return `true` from [`Instances::native_batching`].
    async fn instances_metadata(
        &self,
        nodes: &[Arc<Node>],
    ) -> Vec<CloudResult<Option<InstanceMetadata>>> {
        fallback_instances_metadata(self, nodes).await
    }

    /// Existence and shutdown state for many Nodes, one result per input Node in order.
    ///
    /// The default calls [`Instances::instance_exists`] once per node and
    /// [`Instances::instance_shutdown`] once per existing node.
    async fn instances_status(&self, nodes: &[Arc<Node>]) -> Vec<CloudResult<InstanceStatus>> {
        fallback_instances_status(self, nodes).await
    }

    /// True when `instances_metadata` and `instances_status` are real batch calls. Wrappers such
    /// as the metering layer use it to count what the cloud actually sees.
    fn native_batching(&self) -> bool {
        false
    }

    /// The most Nodes worth passing to one batch call.
    fn max_batch_size(&self) -> usize {
        100
    }

    /// A stream of instance changes, for providers that can watch their cloud. Each call
    /// subscribes anew. `None` (the default): controllers poll instead.
    fn instance_events(&self) -> Option<BoxStream<'static, InstanceEvent>> {
        None
    }
}

/// The default of [`Instances::instances_metadata`], usable by wrappers that must route the
/// per-node calls through themselves.
pub async fn fallback_instances_metadata<I: Instances + ?Sized>(
    instances: &I,
    nodes: &[Arc<Node>],
) -> Vec<CloudResult<Option<InstanceMetadata>>> {
    let mut out = Vec::with_capacity(nodes.len());
    for chunk in nodes.chunks(DEFAULT_FALLBACK_CONCURRENCY) {
        out.extend(join_all(chunk.iter().map(|node| instances.instance_metadata(node))).await);
    }
    out
}

/// The default of [`Instances::instances_status`]: exists, then shutdown only for instances that
/// exist (a missing instance cannot be shut down).
pub async fn fallback_instances_status<I: Instances + ?Sized>(
    instances: &I,
    nodes: &[Arc<Node>],
) -> Vec<CloudResult<InstanceStatus>> {
    let mut out = Vec::with_capacity(nodes.len());
    for chunk in nodes.chunks(DEFAULT_FALLBACK_CONCURRENCY) {
        out.extend(join_all(chunk.iter().map(|node| status_of(instances, node))).await);
    }
    out
}

async fn status_of<I: Instances + ?Sized>(
    instances: &I,
    node: &Node,
) -> CloudResult<InstanceStatus> {
    if !instances.instance_exists(node).await? {
        return Ok(InstanceStatus {
            exists: false,
            shutdown: false,
        });
    }
    let shutdown = match instances.instance_shutdown(node).await {
        Ok(s) => s,
        // Upstream treats NotImplemented as "not shut down".
        Err(crate::CloudError::NotImplemented) => false,
        Err(e) => return Err(e),
    };
    Ok(InstanceStatus {
        exists: true,
        shutdown,
    })
}

/// Load balancers for `type: LoadBalancer` Services, with upstream's contracts. Every method
/// receives the cluster name (`--cluster-name`) so providers can tag and find their own LBs.
#[async_trait]
pub trait LoadBalancer: Send + Sync + 'static {
    /// The LB's status if this controller's LB exists. A missing LB is `Ok(None)`, never an
    /// error: an error makes cleanup retry forever (k/k #61100).
    async fn get_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>>;

    /// The cloud name for the Service's LB. Not called by the controllers; here so every provider
    /// answers the question the same way its own methods do.
    fn load_balancer_name(&self, _cluster: &str, service: &Service) -> String {
        crate::types::default_load_balancer_name(service)
    }

    /// Create or update the LB and return its status (at least one ingress entry when ready).
    /// Return [`crate::CloudError::Retry`] while it is still provisioning.
    ///
    /// `nodes` are the Nodes that back load balancers, sorted by name, as the node cache holds
    /// them: metadata (minus `managedFields`), spec, and of the status the addresses and
    /// conditions only (the rest — images, capacity, system info — was most of a cached Node's
    /// memory at 50,000 Nodes). Shared (`Arc`, as upstream's `[]*v1.Node`): the very objects of
    /// the cache, so a list costs a pointer per Node and lists built a moment apart share the
    /// Nodes that did not change. The same holds for
    /// `update_load_balancer`.
    async fn ensure_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus>;

    /// Replace the LB's backend hosts with `nodes`; nothing else changes.
    async fn update_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()>;

    /// Delete the LB; `Ok(())` if it is already gone. Must not return `ImplementedElsewhere`.
    async fn ensure_load_balancer_deleted(
        &self,
        cluster: &str,
        service: &Service,
    ) -> CloudResult<()>;

    /// The `spec.loadBalancerClass` this provider serves. `None` (the default, upstream's
    /// behaviour): Services without a class, and no Service with one. `Some(class)`: exactly
    /// the Services of that class, and no class-less one (as MetalLB's `--lb-class`), so two
    /// load-balancer implementations can share a cluster. Read once, when the service
    /// controller starts.
    fn load_balancer_class(&self) -> Option<String> {
        None
    }

    /// Services (`namespace/name`) the provider wants synced again now, because something the
    /// controller cannot see changed for them: an address a waiting Service can take was freed,
    /// a pool grew. Without it such a Service waits out its retry backoff. Each call subscribes
    /// anew (see [`ServiceRequeue`]); `None` (the default): only Service events and retries
    /// sync a Service.
    fn service_requeues(&self) -> Option<BoxStream<'static, String>> {
        None
    }
}

/// The provider's side of [`LoadBalancer::service_requeues`]: keep one in the provider, return
/// [`ServiceRequeue::subscribe`] from `service_requeues` and call [`ServiceRequeue::requeue`]
/// when waiting Services can make progress. Unbounded and lossless: a requeue is a key, and a
/// key already queued in the controller is not queued twice.
#[derive(Clone, Default)]
pub struct ServiceRequeue {
    subscribers: Arc<std::sync::Mutex<Vec<tokio::sync::mpsc::UnboundedSender<String>>>>,
}

impl ServiceRequeue {
    /// A new stream of the keys passed to [`ServiceRequeue::requeue`] from now on; it ends when
    /// the last clone of this value is dropped.
    pub fn subscribe(&self) -> BoxStream<'static, String> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.lock().push(tx);
        Box::pin(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|key| (key, rx))
        }))
    }

    /// Asks every subscriber to sync `keys` (`namespace/name`) now. Subscribers that went away
    /// are dropped.
    pub fn requeue<I: IntoIterator<Item = String>>(&self, keys: I) {
        let keys: Vec<String> = keys.into_iter().collect();
        if keys.is_empty() {
            return;
        }
        self.lock()
            .retain(|tx| keys.iter().all(|k| tx.send(k.clone()).is_ok()));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<tokio::sync::mpsc::UnboundedSender<String>>> {
        // A panic while holding this lock cannot leave the Vec inconsistent.
        self.subscribers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Pod-CIDR routes in the cloud's route table.
#[async_trait]
pub trait Routes: Send + Sync + 'static {
    /// The routes this cluster owns. Ownership by cluster is the provider's job: the controller
    /// only filters by cluster CIDR, and deletes whatever it is responsible for.
    async fn list_routes(&self, cluster: &str) -> CloudResult<Vec<Route>>;

    /// Create `route`; `name_hint` is the Node UID. Dual-stack providers must derive distinct
    /// names per CIDR, because both CIDRs of a Node share the hint.
    async fn create_route(&self, cluster: &str, name_hint: &str, route: &Route) -> CloudResult<()>;

    /// Delete a route exactly as returned by `list_routes`.
    async fn delete_route(&self, cluster: &str, route: &Route) -> CloudResult<()>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    struct Classy(ServiceRequeue);

    #[async_trait]
    impl LoadBalancer for Classy {
        async fn get_load_balancer(
            &self,
            _: &str,
            _: &Service,
        ) -> CloudResult<Option<LoadBalancerStatus>> {
            Ok(None)
        }
        async fn ensure_load_balancer(
            &self,
            _: &str,
            _: &Service,
            _: &[Arc<Node>],
        ) -> CloudResult<LoadBalancerStatus> {
            Ok(LoadBalancerStatus::default())
        }
        async fn update_load_balancer(
            &self,
            _: &str,
            _: &Service,
            _: &[Arc<Node>],
        ) -> CloudResult<()> {
            Ok(())
        }
        async fn ensure_load_balancer_deleted(&self, _: &str, _: &Service) -> CloudResult<()> {
            Ok(())
        }
        fn load_balancer_class(&self) -> Option<String> {
            Some("example.com/lb".into())
        }
        fn service_requeues(&self) -> Option<BoxStream<'static, String>> {
            Some(self.0.subscribe())
        }
    }

    struct P(Arc<Classy>);

    impl CloudProvider for P {
        fn provider_name(&self) -> &str {
            "p"
        }
        fn load_balancer(&self) -> Option<Arc<dyn LoadBalancer>> {
            Some(self.0.clone())
        }
    }

    #[tokio::test]
    async fn every_subscriber_gets_every_requeue_and_the_metering_wrapper_passes_both_through() {
        let hub = ServiceRequeue::default();
        let provider = crate::metered(
            Arc::new(P(Arc::new(Classy(hub.clone())))),
            crate::CloudMetrics::new(&mut prometheus_client::registry::Registry::default()),
            crate::MeterOptions::default(),
        );
        let lb = provider.load_balancer().expect("lb");
        assert_eq!(lb.load_balancer_class().as_deref(), Some("example.com/lb"));
        let mut a = lb.service_requeues().expect("stream");
        let mut b = hub.subscribe();
        let gone = hub.subscribe();
        drop(gone);
        hub.requeue(["ns/one".to_string(), "ns/two".to_string()]);
        hub.requeue(Vec::new());
        for s in [&mut a, &mut b] {
            assert_eq!(s.next().await.as_deref(), Some("ns/one"));
            assert_eq!(s.next().await.as_deref(), Some("ns/two"));
        }
        assert_eq!(hub.lock().len(), 2, "the dropped subscriber is pruned");
        drop((provider, lb));
        drop(hub);
        // The wrapper and the provider are gone, the stream's sender with them.
        assert_eq!(a.next().await, None);
    }
}
