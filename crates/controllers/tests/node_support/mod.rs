//! Shared harness of the cloud-node and cloud-node-lifecycle integration tests: kube-sim, the
//! simulated cloud behind the metering wrapper, shared caches, and kubelet-like Node fixtures.
#![allow(dead_code, missing_docs)]

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ccm_cloud::{
    CloudMetrics, CloudProvider, CloudResult, InstanceMetadata, InstanceStatus, Instances,
    MeterOptions, metered,
};
use ccm_controllers::Shared;
use ccm_kube_sim::{Config, KubeSim};
use ccm_provider_sim::{SimCloud, SimOptions};
use k8s_openapi::api::core::v1::{Event, Node, NodeAddress, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// The controllers' User-Agent (upstream's client name for both node controllers).
pub const UA: &str = "node-controller";
pub const TAINT_UNINIT: &str = "node.cloudprovider.kubernetes.io/uninitialized";
pub const TAINT_SHUTDOWN: &str = "node.cloudprovider.kubernetes.io/shutdown";

/// The simulated cloud without its event stream, to exercise the polling paths.
pub struct NoEvents(pub SimCloud);

#[async_trait]
impl Instances for NoEvents {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        self.0.instance_exists(node).await
    }
    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        self.0.instance_shutdown(node).await
    }
    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        self.0.instance_metadata(node).await
    }
    async fn instances_metadata(
        &self,
        nodes: &[Arc<Node>],
    ) -> Vec<CloudResult<Option<InstanceMetadata>>> {
        self.0.instances_metadata(nodes).await
    }
    async fn instances_status(&self, nodes: &[Arc<Node>]) -> Vec<CloudResult<InstanceStatus>> {
        self.0.instances_status(nodes).await
    }
    fn native_batching(&self) -> bool {
        true
    }
    fn max_batch_size(&self) -> usize {
        self.0.max_batch_size()
    }
}

pub struct NoEventsProvider(pub Arc<NoEvents>);

impl CloudProvider for NoEventsProvider {
    fn provider_name(&self) -> &str {
        "sim"
    }
    fn instances(&self) -> Option<Arc<dyn Instances>> {
        Some(self.0.clone())
    }
}

pub struct Env {
    pub sim: KubeSim,
    pub cloud: SimCloud,
    pub metrics: CloudMetrics,
    pub shared: Shared,
    pub admin: kube::Client,
    pub client: kube::Client,
    pub shutdown: CancellationToken,
}

impl Env {
    pub async fn start(options: SimOptions, with_events: bool) -> Env {
        let sim = KubeSim::start(Config::default()).await.expect("kube-sim");
        let cloud = SimCloud::with_options(options);
        let metrics = CloudMetrics::default();
        let inner: Arc<dyn CloudProvider> = if with_events {
            cloud.provider()
        } else {
            Arc::new(NoEventsProvider(Arc::new(NoEvents(cloud.clone()))))
        };
        let provider = metered(inner, metrics.clone(), MeterOptions::default());
        let admin = sim.client().expect("admin client");
        let client = sim.client_with_user_agent(UA).expect("client");
        let shared = Shared::new(provider, "kubernetes");
        let shutdown = CancellationToken::new();
        shared.start_informers(client.clone(), shutdown.clone());
        Env {
            sim,
            cloud,
            metrics,
            shared,
            admin,
            client,
            shutdown,
        }
    }

    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.admin.clone())
    }

    /// Writes by the controllers to the nodes resource (all answers, so retried conflicts count).
    pub fn node_writes(&self) -> u64 {
        self.sim
            .count_requests(|k| k.client == UA && k.resource == "nodes" && k.verb.is_write())
    }

    pub async fn create_node(&self, node: &Node) -> Node {
        let api = self.nodes();
        let created = api
            .create(&PostParams::default(), node)
            .await
            .expect("create node");
        // Like the kubelet: status is written after registration, in case create dropped it,
        // with a strategic merge patch (conditions and addresses merged by type), so a
        // condition the CCM wrote in between survives as it does on a real cluster.
        if let Some(status) = &node.status {
            api.patch_status(
                node.metadata.name.as_deref().unwrap_or_default(),
                &PatchParams::default(),
                &Patch::Strategic(json!({ "status": status })),
            )
            .await
            .expect("node status")
        } else {
            created
        }
    }

    pub async fn set_ready(&self, name: &str, status: &str) {
        self.nodes()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": { "conditions": [ready_condition(status)] } })),
            )
            .await
            .expect("set ready");
    }

    pub async fn get(&self, name: &str) -> Option<Node> {
        self.nodes().get_opt(name).await.expect("get node")
    }

    pub async fn events(&self, reason: &str) -> Vec<Event> {
        Api::<Event>::all(self.admin.clone())
            .list(&ListParams::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .collect()
    }
}

pub fn ready_condition(status: &str) -> serde_json::Value {
    json!({
        "type": "Ready",
        "status": status,
        "reason": "KubeletReady",
        "lastHeartbeatTime": "2026-01-01T00:00:00Z",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    })
}

/// A Node as a kubelet with `--cloud-provider=external` registers it.
pub fn kubelet_node(name: &str, provided_ip: Option<&str>) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([(
                "kubernetes.io/hostname".to_string(),
                name.to_string(),
            )])),
            annotations: provided_ip.map(|ip| {
                BTreeMap::from([(
                    "alpha.kubernetes.io/provided-node-ip".to_string(),
                    ip.to_string(),
                )])
            }),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: Some(vec![Taint {
                key: TAINT_UNINIT.into(),
                value: Some("true".into()),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "Hostname".into(),
                address: name.into(),
            }]),
            ..Default::default()
        }),
    }
}

/// An initialized Node (providerID set, no taint) with a Ready condition.
pub fn initialized_node(name: &str, provider_id: &str, ready: &str) -> Node {
    let mut n = kubelet_node(name, None);
    n.spec = Some(NodeSpec {
        provider_id: Some(provider_id.into()),
        ..Default::default()
    });
    n.status.as_mut().unwrap().conditions = Some(vec![
        serde_json::from_value(ready_condition(ready)).unwrap(),
    ]);
    n
}

pub fn taint_keys(n: &Node) -> Vec<String> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|ts| ts.iter().map(|t| t.key.clone()).collect())
        .unwrap_or_default()
}

pub fn addresses(n: &Node) -> Vec<(String, String)> {
    n.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| {
            a.iter()
                .map(|a| (a.type_.clone(), a.address.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// Polls `cond` every 20 ms for up to 90 s (generous: shared 2-core machine).
pub async fn wait_for<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        if cond().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
