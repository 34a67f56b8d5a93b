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
        }
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
