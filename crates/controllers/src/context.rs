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
