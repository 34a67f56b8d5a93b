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
    /// The default calls [`Instances::instance_metadata`] once per node (a few at a time).
    /// Override it when the cloud answers many instances per API call (EC2 `DescribeInstances`
    /// takes 1,000 ids) and return `true` from [`Instances::native_batching`].
    async fn instances_metadata(
        &self,
        nodes: &[Node],
    ) -> Vec<CloudResult<Option<InstanceMetadata>>> {
        fallback_instances_metadata(self, nodes).await
    }

    /// Existence and shutdown state for many Nodes, one result per input Node in order.
    ///
    /// The default calls [`Instances::instance_exists`] once per node and
    /// [`Instances::instance_shutdown`] once per existing node.
    async fn instances_status(&self, nodes: &[Node]) -> Vec<CloudResult<InstanceStatus>> {
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
    nodes: &[Node],
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
    nodes: &[Node],
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
    async fn ensure_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Node],
    ) -> CloudResult<LoadBalancerStatus>;

    /// Replace the LB's backend hosts with `nodes`; nothing else changes.
    async fn update_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Node],
    ) -> CloudResult<()>;

    /// Delete the LB; `Ok(())` if it is already gone. Must not return `ImplementedElsewhere`.
    async fn ensure_load_balancer_deleted(
        &self,
        cluster: &str,
        service: &Service,
    ) -> CloudResult<()>;
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
