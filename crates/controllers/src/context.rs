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
    /// The Services the service controller has business with
    /// ([`crate::informer::concerns_service_controller`]), trimmed by
    /// [`crate::informer::trim_service`].
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
            services: Informer::with_transform_keeping(
                crate::informer::trim_service,
                crate::informer::concerns_service_controller,
            ),
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
        use crate::informer::slim::{SlimNode, SlimService};
        let cfg = kube::runtime::watcher::Config::default();
        tokio::spawn(self.nodes.clone().run(
            kube::Api::<SlimNode>::all(client.clone()),
            cfg.clone(),
            shutdown.clone(),
        ));
        tokio::spawn(self.services.clone().run(
            kube::Api::<SlimService>::all(client),
            cfg,
            shutdown,
        ));
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
///
/// A Node counts as routed the moment its last route create returns, not when the whole sync
/// ends, and a waiter waits for its own Node only: initialization never pays for the rest of a
/// burst's routes.
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
    state: parking_lot::Mutex<RoutedState>,
}

#[derive(Default)]
struct RoutedState {
    nodes: std::collections::BTreeSet<String>,
    /// One-shot wake-ups per Node name: a publish wakes only the waiters of routed Nodes, so a
    /// 1,000-Node burst costs one wake-up per Node, not one per Node per publish.
    waiters: std::collections::HashMap<String, Vec<tokio::sync::oneshot::Sender<()>>>,
}

impl RoutedState {
    fn wake(&mut self, node: &str) {
        for w in self.waiters.remove(node).unwrap_or_default() {
            let _ = w.send(());
        }
    }
}

impl RoutedNodes {
    /// Called when the route controller is built, before any controller task runs, so no
    /// cloud-node batch can miss it.
    pub fn activate(&self) {
        self.inner
            .active
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// True while a route controller publishes.
    pub fn is_active(&self) -> bool {
        self.inner.active.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Called when the cloud-node controller is built (before any route sync can run) when it
    /// folds the condition into its writes; the route controller then leaves uninitialized
    /// Nodes' condition to it.
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

    /// Replaces the set of Nodes whose routes all exist (the end of a sync, which also
    /// forgets deleted Nodes).
    pub fn publish(&self, nodes: std::collections::BTreeSet<String>) {
        let mut st = self.inner.state.lock();
        st.nodes = nodes;
        let ready: Vec<String> = st
            .waiters
            .keys()
            .filter(|k| st.nodes.contains(*k))
            .cloned()
            .collect();
        for k in ready {
            st.wake(&k);
        }
    }

    /// Replaces what is known of the Nodes in `scope` only (a sync that planned over them):
    /// those in `routed` are routed, the others not. Costs the size of `scope`, not of the
    /// cluster.
    pub fn update(
        &self,
        scope: &std::collections::HashSet<String>,
        routed: &std::collections::BTreeSet<String>,
    ) {
        let mut st = self.inner.state.lock();
        for n in scope {
            if routed.contains(n) {
                st.nodes.insert(n.clone());
                st.wake(n);
            } else {
                st.nodes.remove(n);
            }
        }
    }

    /// Marks one Node routed (its last route create just returned), waking its waiters.
    pub fn insert(&self, node: &str) {
        let mut st = self.inner.state.lock();
        st.nodes.insert(node.to_string());
        st.wake(node);
    }

    /// True when every route of `node` exists.
    pub fn contains(&self, node: &str) -> bool {
        self.inner.state.lock().nodes.contains(node)
    }

    /// Waits until `node` has all its routes, or `timeout` passes; true when it has them.
    pub async fn wait(&self, node: &str, timeout: std::time::Duration) -> bool {
        let rx = {
            let mut st = self.inner.state.lock();
            if st.nodes.contains(node) {
                return true;
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            st.waiters.entry(node.to_string()).or_default().push(tx);
            rx
        };
        if let Ok(Ok(())) = tokio::time::timeout(timeout, rx).await {
            return true;
        }
        let mut st = self.inner.state.lock();
        if let Some(ws) = st.waiters.get_mut(node) {
            ws.retain(|w| !w.is_closed());
            if ws.is_empty() {
                st.waiters.remove(node);
            }
        }
        st.nodes.contains(node)
    }

    /// Waiters currently registered (for tests: a timed-out wait leaves none behind).
    pub fn waiting(&self) -> usize {
        self.inner.state.lock().waiters.values().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_waiter_wakes_for_its_own_node_only() {
        let routed = RoutedNodes::default();
        let (r1, r2) = (routed.clone(), routed.clone());
        let a = tokio::spawn(async move { r1.wait("a", Duration::from_secs(2)).await });
        let b = tokio::spawn(async move { r2.wait("b", Duration::from_secs(2)).await });
        tokio::task::yield_now().await;
        assert_eq!(routed.waiting(), 2);
        routed.insert("a");
        assert!(a.await.expect("join"), "a's route exists");
        assert_eq!(routed.waiting(), 1, "b still waits");
        // b's route never comes: bounded by the timeout, and no waiter is left behind.
        assert!(!b.await.expect("join"));
        assert_eq!(routed.waiting(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn publish_wakes_listed_nodes_and_forgets_others() {
        let routed = RoutedNodes::default();
        routed.insert("gone");
        let r = routed.clone();
        let w = tokio::spawn(async move { r.wait("c", Duration::from_secs(2)).await });
        tokio::task::yield_now().await;
        routed.publish(BTreeSet::from(["c".to_string()]));
        assert!(w.await.expect("join"));
        assert!(routed.contains("c"));
        assert!(!routed.contains("gone"));
        assert!(
            routed.wait("c", Duration::ZERO).await,
            "already routed: no wait"
        );
    }
}
