//! What every controller is built from: the provider, the shared caches, and names.

use std::sync::Arc;

use ccm_cloud::CloudProvider;
use k8s_openapi::api::core::v1::{Node, Service};

use crate::informer::Informer;
use crate::queue::QueueMetrics;

/// Shared inputs of all controllers in one process. Cheap to clone.
///
/// The caches are filled by the manager (one watch per kind for the whole process); controllers
/// must call [`Informer::wait_ready`] before acting on them.
#[derive(Clone)]
pub struct Shared {
    /// The (metered) cloud provider.
    pub provider: Arc<dyn CloudProvider>,
    /// `--cluster-name`, handed to load-balancer and route calls.
    pub cluster_name: String,
    /// Every Node, trimmed by [`crate::informer::trim_node`].
    pub nodes: Informer<Node>,
    /// Every Service, trimmed by [`crate::informer::trim_service`].
    pub services: Informer<Service>,
    /// Workqueue metrics shared by every queue of the process.
    pub queue_metrics: QueueMetrics,
    /// Route readiness per Node, from the route controller to the cloud-node controller.
    pub routed: RoutedNodes,
    /// A client for Events only, so event writes never spend the controllers' request budget
    /// (`None`: each controller records through its own client).
    pub event_client: Option<kube::Client>,
}

impl Shared {
    /// Shared inputs with empty caches; call [`Shared::start_informers`] to fill them.
    pub fn new(provider: Arc<dyn CloudProvider>, cluster_name: impl Into<String>) -> Self {
        Shared {
            provider,
            cluster_name: cluster_name.into(),
            nodes: Informer::with_transform(crate::informer::trim_node),
            services: Informer::with_transform(crate::informer::trim_service),
            queue_metrics: QueueMetrics::default(),
            routed: RoutedNodes::default(),
            event_client: None,
        }
    }

    /// An event recorder for `component`, writing through [`Shared::event_client`] when set,
    /// else through `client`.
    pub fn recorder(&self, client: &kube::Client, component: &str) -> crate::events::Recorder {
        crate::events::Recorder::new(
            self.event_client.clone().unwrap_or_else(|| client.clone()),
            component,
        )
    }

    /// Starts one Node watch and one Service watch (all namespaces) feeding the caches, until
    /// `shutdown`.
    pub fn start_informers(
        &self,
        client: kube::Client,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        let cfg = kube::runtime::watcher::Config::default();
        tokio::spawn(self.nodes.clone().run(
            kube::Api::<Node>::all(client.clone()),
            cfg.clone(),
            shutdown.clone(),
        ));
        tokio::spawn(
            self.services
                .clone()
                .run(kube::Api::<Service>::all(client), cfg, shutdown),
        );
    }
}

/// Why a controller did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Not started, and that is fine (upstream logs and skips): e.g. the provider has no routes.
    #[error("{0}")]
    Skipped(String),
    /// Configuration that must stop the process, naming the flag and the fix (e.g. a missing
    /// `--cluster-cidr` while routes are configured).
    #[error("{0}")]
    Invalid(String),
}

/// Which Nodes have all their routes, published by the route controller so the cloud-node
/// controller can fold `NetworkUnavailable=False` into the status write it makes anyway — one
/// API write per Node less during a burst (upstream writes the condition separately).
#[derive(Clone, Default)]
pub struct RoutedNodes {
    inner: Arc<RoutedInner>,
}

#[derive(Default)]
struct RoutedInner {
    /// The route controller is running and publishing.
    active: std::sync::atomic::AtomicBool,
    /// The cloud-node controller writes the condition for Nodes it initializes.
    node_folds: std::sync::atomic::AtomicBool,
    nodes: parking_lot::RwLock<std::collections::BTreeSet<String>>,
    changed: tokio::sync::Notify,
}

impl RoutedNodes {
    /// Called by the route controller when it starts.
    pub fn activate(&self) {
        self.inner
            .active
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// True while a route controller publishes.
    pub fn is_active(&self) -> bool {
        self.inner.active.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Called by the cloud-node controller when it folds the condition into its writes; the
    /// route controller then leaves uninitialized Nodes' condition to it.
    pub fn set_node_folds(&self, on: bool) {
        self.inner
            .node_folds
            .store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// True when the cloud-node controller writes the condition for Nodes it initializes.
    pub fn node_folds(&self) -> bool {
        self.inner
            .node_folds
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Replaces the set of Nodes whose routes all exist.
    pub fn publish(&self, nodes: std::collections::BTreeSet<String>) {
        *self.inner.nodes.write() = nodes;
        self.inner.changed.notify_waiters();
    }

    /// True when every route of `node` exists.
    pub fn contains(&self, node: &str) -> bool {
        self.inner.nodes.read().contains(node)
    }

    /// Waits until every one of `nodes` has its routes, or `timeout` passes.
    pub async fn wait_all(&self, nodes: &[String], timeout: std::time::Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.inner.changed.notified();
            futures::pin_mut!(notified);
            notified.as_mut().enable();
            if nodes.iter().all(|n| self.contains(n)) {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return;
            }
        }
    }
}
