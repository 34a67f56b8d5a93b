//! The cloud-node-lifecycle controller (upstream `cloud-node-lifecycle-controller`, alias
//! `cloud-node-lifecycle`): deletes Nodes whose instance is gone and taints Nodes whose instance
//! is shut down.
//!
//! Every `node_monitor_period` the Nodes that need a look are looked at: Ready Nodes lose the
//! shutdown taint (no cloud call, ever); NotReady Nodes are checked with **one**
//! [`ccm_cloud::Instances::instances_status`] call per batch. Which Nodes need a look (NotReady,
//! or Ready with the shutdown taint) is kept up to date from the node changes, so a round costs
//! what is wrong in the cluster, not its size: upstream lists every Node every period. When the
//! provider offers [`ccm_cloud::Instances::instance_events`], a stopped or terminated instance
//! is acted on as soon as its Node is NotReady, and the cloud check of NotReady Nodes only runs
//! every `event_driven_resync_period` as a safety net.

pub mod planner;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use ccm_cloud::{InstanceEvent, InstanceEventKind, InstanceStatus, Instances};
use futures::StreamExt;
use futures::future::join_all;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Preconditions};
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::context::{Shared, StartError};
use crate::events::{EventType, Recorder};
use crate::informer::Change;
use crate::node::planner::taints_value;
use crate::node::write::{self, Target};
use crate::nodeutil::is_ready;
use planner::{CloudAction, LocalAction};

/// Event source (`source.component`) of this controller's Events, as upstream.
pub const EVENT_SOURCE: &str = "cloud-node-lifecycle-controller";
/// Taint edits one round keeps in flight at once.
const WRITE_CONCURRENCY: usize = 16;

/// Flags of the cloud-node-lifecycle controller.
#[derive(Debug, Clone)]
pub struct NodeLifecycleConfig {
    /// `--node-monitor-period` (default 5s): how often cached Nodes are scanned. Ready Nodes
    /// cost no cloud call; without instance events, NotReady Nodes are checked every period.
    pub node_monitor_period: Duration,
    /// How often NotReady Nodes are checked in the cloud when the provider pushes instance
    /// events (default **5m**; ccm-rs only, flag `--node-lifecycle-resync-period`). Events cover
    /// stop and terminate at once, so this only catches a lost event (stream lag, a CCM
    /// restart): 5 minutes bounds that delay while cutting idle cloud calls 60-fold.
    pub event_driven_resync_period: Duration,
    /// Most Nodes per `instances_status` call (default 500); the provider's
    /// [`ccm_cloud::Instances::max_batch_size`] caps it further.
    pub max_batch_size: usize,
}

impl Default for NodeLifecycleConfig {
    fn default() -> Self {
        NodeLifecycleConfig {
            node_monitor_period: Duration::from_secs(5),
            event_driven_resync_period: Duration::from_secs(300),
            max_batch_size: 500,
        }
    }
}

#[derive(Default)]
struct Stats {
    rounds: AtomicU64,
    examined: AtomicU64,
    waiting: AtomicUsize,
    busy: AtomicUsize,
}

/// A cheap, cloneable probe of the lifecycle controller, for tests and `ccm demo`.
#[derive(Clone)]
pub struct NodeLifecycleHandle {
    stats: Arc<Stats>,
}

impl NodeLifecycleHandle {
    /// Instances reported stopped/terminated whose Node is still Ready (acted on when it turns
    /// NotReady), plus work in progress. Zero means idle.
    pub fn pending(&self) -> usize {
        self.stats.waiting.load(Ordering::SeqCst) + self.stats.busy.load(Ordering::SeqCst)
    }

    /// Monitor rounds completed so far.
    pub fn rounds(&self) -> u64 {
        self.stats.rounds.load(Ordering::SeqCst)
    }

    /// Nodes the monitor rounds have looked at, over all rounds: only NotReady Nodes and Ready
    /// ones still carrying the shutdown taint, so a healthy cluster of any size adds nothing.
    pub fn nodes_examined(&self) -> u64 {
        self.stats.examined.load(Ordering::SeqCst)
    }
}

/// The Nodes a monitor round must look at — NotReady, or Ready with the shutdown taint — by
/// name, kept from the node cache's changes (whose first changes are every cached Node).
#[derive(Debug, Default)]
struct Suspects(HashSet<String>);

impl Suspects {
    fn apply(&mut self, change: &Change<Node>) {
        match (&change.old, &change.new) {
            (_, Some(new)) => {
                let name = ccm_cloud::node_name(new);
                if planner::plan_local(new) == LocalAction::Nothing {
                    self.0.remove(name);
                } else if !self.0.contains(name) {
                    self.0.insert(name.to_string());
                }
            }
            (Some(old), None) => {
                self.0.remove(ccm_cloud::node_name(old));
            }
            (None, None) => {}
        }
    }
}

/// The cloud-node-lifecycle controller. Build with [`NodeLifecycleController::new`], then
/// [`NodeLifecycleController::run`].
pub struct NodeLifecycleController {
    shared: Shared,
    client: kube::Client,
    config: NodeLifecycleConfig,
    instances: Arc<dyn Instances>,
    recorder: Recorder,
    batch_max: usize,
    stats: Arc<Stats>,
    /// Nodes whose last cloud check failed: checked again every `node_monitor_period`, not
    /// only at the next full check (5 minutes apart with instance events), so a Node whose
    /// instance went away during a cloud outage is acted on soon after the cloud answers again.
    unanswered: parking_lot::Mutex<std::collections::HashSet<String>>,
}

impl NodeLifecycleController {
    /// Builds the controller. `Skipped` when the provider has no instances support; `Invalid`
    /// for a zero period. Must be called inside a Tokio runtime.
    pub fn new(
        shared: Shared,
        client: kube::Client,
        config: NodeLifecycleConfig,
        _registry: &mut Registry,
    ) -> Result<Self, StartError> {
        if config.node_monitor_period.is_zero() {
            return Err(StartError::Invalid(
                "--node-monitor-period: must be greater than 0 (e.g. 5s)".into(),
            ));
        }
        if config.event_driven_resync_period.is_zero() {
            return Err(StartError::Invalid(
                "--node-lifecycle-resync-period: must be greater than 0 (e.g. 5m)".into(),
            ));
        }
        let Some(instances) = shared.provider.instances() else {
            return Err(StartError::Skipped(format!(
                "cloud provider {:?} does not support instances; cloud-node-lifecycle-controller not started",
                shared.provider.provider_name()
            )));
        };
        let batch_max = config.max_batch_size.min(instances.max_batch_size()).max(1);
        Ok(NodeLifecycleController {
            recorder: shared.recorder(&client, EVENT_SOURCE),
            shared,
            client,
            config,
            instances,
            batch_max,
            stats: Arc::default(),
            unanswered: Default::default(),
        })
    }

    /// A probe of the controller's state.
    pub fn handle(&self) -> NodeLifecycleHandle {
        NodeLifecycleHandle {
            stats: self.stats.clone(),
        }
    }

    /// Runs until `shutdown`: monitor rounds every `node_monitor_period` (the first at once),
    /// instance events as they come.
    pub async fn run(self, shutdown: CancellationToken) {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = self.shared.nodes.wait_ready() => {}
        }
        let mut events = self.instances.instance_events();
        let mut cloud_period = if events.is_some() {
            self.config.event_driven_resync_period
        } else {
            self.config.node_monitor_period
        };
        tracing::info!(
            event_driven = events.is_some(),
            ?cloud_period,
            "starting cloud-node-lifecycle-controller"
        );
        let mut changes = self.shared.nodes.subscribe();
        let mut suspects = Suspects::default();
        let mut waiting: HashMap<String, InstanceEventKind> = HashMap::new();
        while let Ok(change) = changes.try_recv() {
            self.on_change(change, &mut suspects, &mut waiting).await;
        }
        let mut next_round = Instant::now();
        let mut last_cloud_check: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep_until(next_round) => {
                    let cloud_due = last_cloud_check.is_none_or(|t| t.elapsed() >= cloud_period);
                    if cloud_due {
                        last_cloud_check = Some(Instant::now());
                    }
                    // What the cache already holds counts: changes not yet received first.
                    while let Ok(change) = changes.try_recv() {
                        self.on_change(change, &mut suspects, &mut waiting).await;
                    }
                    self.monitor(cloud_due, &suspects).await;
                    self.stats.rounds.fetch_add(1, Ordering::SeqCst);
                    // Sliding period, as upstream's wait.Until.
                    next_round = Instant::now() + self.config.node_monitor_period;
                }
                ev = next_event(&mut events) => match ev {
                    Some(ev) => self.on_event(ev, &mut waiting).await,
                    None => {
                        tracing::warn!("instance event stream ended; NotReady nodes are now checked every node-monitor-period");
                        events = None;
                        cloud_period = self.config.node_monitor_period;
                    }
                },
                Some(change) = changes.recv() => {
                    self.on_change(change, &mut suspects, &mut waiting).await
                }
            }
            self.stats.waiting.store(waiting.len(), Ordering::SeqCst);
        }
    }

    /// One `MonitorNodes` round over the suspect Nodes, as cached now.
    async fn monitor(&self, cloud_due: bool, suspects: &Suspects) {
        self.stats.busy.fetch_add(1, Ordering::SeqCst);
        self.stats
            .examined
            .fetch_add(suspects.0.len() as u64, Ordering::SeqCst);
        let mut check = Vec::new();
        let mut untaint = Vec::new();
        for node in suspects.0.iter().filter_map(|n| self.shared.nodes.get(n)) {
            match planner::plan_local(&node) {
                LocalAction::Nothing => {}
                LocalAction::RemoveShutdownTaint => untaint.push(node),
                LocalAction::CheckCloud => check.push(node),
            }
        }
        let sem = Semaphore::new(WRITE_CONCURRENCY);
        join_all(untaint.into_iter().map(|n| async {
            let _permit = sem.acquire().await;
            self.remove_shutdown_taint(n).await
        }))
        .await;
        if !cloud_due {
            let unanswered = self.unanswered.lock();
            check.retain(|n| {
                n.metadata
                    .name
                    .as_ref()
                    .is_some_and(|name| unanswered.contains(name))
            });
        }
        if !check.is_empty() {
            self.check_cloud(check).await;
        }
        self.stats.busy.fetch_sub(1, Ordering::SeqCst);
    }

    /// One `instances_status` call per batch of NotReady Nodes, then act on each answer.
    async fn check_cloud(&self, nodes: Vec<Arc<Node>>) {
        for chunk in nodes.chunks(self.batch_max) {
            let results = self.instances.instances_status(chunk).await;
            let sem = Semaphore::new(WRITE_CONCURRENCY);
            join_all(chunk.iter().zip(results).map(|(node, res)| async {
                let _permit = sem.acquire().await;
                let name = node.metadata.name.clone().unwrap_or_default();
                match res {
                    Ok(status) => {
                        self.unanswered.lock().remove(&name);
                        self.act(node, status).await
                    }
                    // Doubt is never "gone": the Node stays, the operator is told, the next
                    // round asks again.
                    Err(e) => {
                        self.unanswered.lock().insert(name);
                        self.recorder.publish(
                        &**node,
                        EventType::Warning,
                        "CheckingInstanceFailed",
                        format!("Could not tell whether the instance of node {} exists; keeping the node and asking again: {e}", node.metadata.name.as_deref().unwrap_or_default()),
                    )
                    }
                }
            }))
            .await;
        }
    }

    async fn act(&self, checked: &Node, status: InstanceStatus) {
        let name = checked.metadata.name.clone().unwrap_or_default();
        // Decide on the freshest cached copy: the Node may have turned Ready, or been replaced
        // by a new Node of the same name, while the cloud answered.
        let Some(node) = self.shared.nodes.get(&name) else {
            return;
        };
        if node.metadata.uid != checked.metadata.uid {
            return;
        }
        match planner::plan_with_status(&node, status) {
            CloudAction::Nothing => {}
            CloudAction::Delete => self.delete(&node).await,
            CloudAction::AddShutdownTaint => {
                let api = Api::<Node>::all(self.client.clone());
                let res = write::patch_guarded(&api, (*node).clone(), Target::Object, |n| {
                    if is_ready(n) {
                        return None;
                    }
                    planner::taints_with_shutdown(n)
                        .map(|t| json!({ "spec": { "taints": taints_value(&t) } }))
                })
                .await;
                match res {
                    Ok(Some(_)) => {
                        tracing::info!(node = %name, "instance is shut down; added shutdown taint")
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(node = %name, error = %e, "failed to add shutdown taint")
                    }
                }
            }
        }
    }

    async fn delete(&self, node: &Node) {
        let name = node.metadata.name.clone().unwrap_or_default();
        self.recorder.publish(
            node,
            EventType::Normal,
            "DeletingNode",
            format!("Deleting node {name} because it does not exist in the cloud provider"),
        );
        let api = Api::<Node>::all(self.client.clone());
        // The uid precondition makes sure a Node re-registered under the same name in the
        // meantime is not deleted in its predecessor's place.
        let dp = DeleteParams {
            preconditions: node.metadata.uid.clone().map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&name, &dp).await {
            Ok(_) => tracing::info!(node = %name, "deleted node: instance does not exist"),
            Err(e) if write::is_not_found(&e) => {}
            Err(e) => {
                tracing::warn!(node = %name, error = %e, "unable to delete node");
                self.recorder.publish(
                    node,
                    EventType::Warning,
                    "DeletingNodeFailed",
                    format!("Failed deleting node {name}: {e}"),
                );
            }
        }
    }

    async fn remove_shutdown_taint(&self, node: Arc<Node>) {
        let api = Api::<Node>::all(self.client.clone());
        let res = write::patch_guarded(&api, (*node).clone(), Target::Object, |n| {
            if !is_ready(n) {
                return None;
            }
            planner::taints_without_shutdown(n)
                .map(|t| json!({ "spec": { "taints": taints_value(&t) } }))
        })
        .await;
        if let Err(e) = res {
            tracing::warn!(node = ?node.metadata.name, error = %e, "failed to remove shutdown taint");
        }
    }

    async fn on_event(&self, ev: InstanceEvent, waiting: &mut HashMap<String, InstanceEventKind>) {
        // Nothing to do for a new instance; returning before the lookup matters: it scans
        // every cached Node, and a burst of N new instances made that N² work.
        if ev.kind == InstanceEventKind::Created {
            return;
        }
        let nodes = self.shared.nodes.list();
        let Some(node) = planner::node_for_event(&nodes, &ev).cloned() else {
            return;
        };
        let name = node.metadata.name.clone().unwrap_or_default();
        match ev.kind {
            InstanceEventKind::Created => {}
            InstanceEventKind::Started => {
                waiting.remove(&name);
                if planner::plan_local(&node) == LocalAction::RemoveShutdownTaint {
                    self.remove_shutdown_taint(node).await;
                }
            }
            InstanceEventKind::Stopped | InstanceEventKind::Terminated => {
                if is_ready(&node) {
                    // Same safety rule as polling: never act on a Ready Node. Act the moment it
                    // turns NotReady (see on_change).
                    tracing::debug!(node = %name, kind = ?ev.kind, "instance event for a Ready node; waiting for NotReady");
                    waiting.insert(name, ev.kind);
                } else {
                    self.stats.busy.fetch_add(1, Ordering::SeqCst);
                    self.check_cloud(vec![node]).await;
                    self.stats.busy.fetch_sub(1, Ordering::SeqCst);
                }
            }
        }
    }

    /// A node change: the suspects follow it, and a Node an instance event is waiting for is
    /// checked once it turns NotReady.
    async fn on_change(
        &self,
        change: Change<Node>,
        suspects: &mut Suspects,
        waiting: &mut HashMap<String, InstanceEventKind>,
    ) {
        suspects.apply(&change);
        if waiting.is_empty() {
            return;
        }
        match change.new {
            None => {
                if let Some(old) = change.old.and_then(|o| o.metadata.name.clone()) {
                    waiting.remove(&old);
                }
            }
            Some(new) => {
                let name = new.metadata.name.clone().unwrap_or_default();
                if !is_ready(&new) && waiting.remove(&name).is_some() {
                    self.stats.busy.fetch_add(1, Ordering::SeqCst);
                    self.check_cloud(vec![new]).await;
                    self.stats.busy.fetch_sub(1, Ordering::SeqCst);
                }
            }
        }
    }
}

async fn next_event(
    events: &mut Option<BoxStream<'static, InstanceEvent>>,
) -> Option<InstanceEvent> {
    match events {
        Some(s) => s.next().await,
        None => futures::future::pending().await,
    }
}

#[cfg(test)]
mod spawn_check {
    /// `run` must be spawnable (Send + 'static), which generic closures easily break.
    #[allow(dead_code)]
    fn run_is_send(c: super::NodeLifecycleController) {
        tokio::spawn(c.run(tokio_util::sync::CancellationToken::new()));
    }
    #[allow(dead_code)]
    fn node_run_is_send(c: crate::node::CloudNodeController) {
        tokio::spawn(c.run(tokio_util::sync::CancellationToken::new()));
    }
}
