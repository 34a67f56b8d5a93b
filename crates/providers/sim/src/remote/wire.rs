//! JSON shapes exchanged between [`super::SimServer`] and [`super::RemoteSim`].
//!
//! ccm-cloud's types carry no serde derives (they are the provider interface, not a wire
//! format), so the sim mirrors the few it sends. Kubernetes objects travel as themselves.

use std::collections::BTreeMap;
use std::time::Duration;

use ccm_cloud::{
    CloudError, CloudResult, InstanceEvent, InstanceEventKind, InstanceMetadata, InstanceStatus,
    Node, Route, Service,
};
use serde::{Deserialize, Serialize};

use super::lists::ListRef;
use crate::cloud::SimAddress;

/// The header carrying the caller's actor identity into the mutation log.
pub const ACTOR_HEADER: &str = "x-sim-actor";
/// The header carrying the server's max batch size back to clients.
pub const MAX_BATCH_HEADER: &str = "x-sim-max-batch-size";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum WireError {
    InstanceNotFound,
    NotImplemented,
    ImplementedElsewhere,
    Retry {
        after: Duration,
        message: String,
    },
    Throttled {
        message: String,
        retry_after: Option<Duration>,
    },
    Transient {
        message: String,
    },
    Permanent {
        message: String,
    },
    /// A load-balancer call named a node list the server does not hold: send it in full.
    UnknownNodeList {
        id: u64,
    },
}

impl From<CloudError> for WireError {
    fn from(e: CloudError) -> Self {
        match e {
            CloudError::InstanceNotFound => WireError::InstanceNotFound,
            CloudError::NotImplemented => WireError::NotImplemented,
            CloudError::ImplementedElsewhere => WireError::ImplementedElsewhere,
            CloudError::Retry { after, message } => WireError::Retry { after, message },
            CloudError::Throttled {
                message,
                retry_after,
            } => WireError::Throttled {
                message,
                retry_after,
            },
            CloudError::Transient(message) => WireError::Transient { message },
            CloudError::Permanent(message) => WireError::Permanent { message },
        }
    }
}

impl From<WireError> for CloudError {
    fn from(e: WireError) -> Self {
        match e {
            WireError::InstanceNotFound => CloudError::InstanceNotFound,
            WireError::NotImplemented => CloudError::NotImplemented,
            WireError::ImplementedElsewhere => CloudError::ImplementedElsewhere,
            WireError::Retry { after, message } => CloudError::Retry { after, message },
            WireError::Throttled {
                message,
                retry_after,
            } => CloudError::Throttled {
                message,
                retry_after,
            },
            WireError::Transient { message } => CloudError::Transient(message),
            WireError::Permanent { message } => CloudError::Permanent(message),
            WireError::UnknownNodeList { id } => {
                CloudError::Transient(format!("the sim server does not hold node list {id}"))
            }
        }
    }
}

pub(crate) type WireResult<T> = Result<T, WireError>;

pub(crate) fn to_wire<T, W: From<T>>(r: CloudResult<T>) -> WireResult<W> {
    r.map(W::from).map_err(WireError::from)
}

pub(crate) fn from_wire<W, T: From<W>>(r: WireResult<W>) -> CloudResult<T> {
    r.map(T::from).map_err(CloudError::from)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WireRoute {
    name: String,
    target_node: String,
    enable_node_addresses: bool,
    target_node_addresses: Vec<SimAddress>,
    destination_cidr: String,
    blackhole: bool,
}

impl From<Route> for WireRoute {
    fn from(r: Route) -> Self {
        WireRoute {
            target_node_addresses: r.target_node_addresses.iter().map(Into::into).collect(),
            name: r.name,
            target_node: r.target_node,
            enable_node_addresses: r.enable_node_addresses,
            destination_cidr: r.destination_cidr,
            blackhole: r.blackhole,
        }
    }
}

impl From<WireRoute> for Route {
    fn from(r: WireRoute) -> Self {
        Route {
            target_node_addresses: r.target_node_addresses.iter().map(Into::into).collect(),
            name: r.name,
            target_node: r.target_node,
            enable_node_addresses: r.enable_node_addresses,
            destination_cidr: r.destination_cidr,
            blackhole: r.blackhole,
        }
    }
}

/// `Vec<Route>` cannot take a foreign `From`; this newtype carries the list.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct WireRoutes(Vec<WireRoute>);

impl From<Vec<Route>> for WireRoutes {
    fn from(r: Vec<Route>) -> Self {
        WireRoutes(r.into_iter().map(Into::into).collect())
    }
}

impl From<WireRoutes> for Vec<Route> {
    fn from(r: WireRoutes) -> Self {
        r.0.into_iter().map(Into::into).collect()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WireMetadata {
    provider_id: String,
    instance_type: String,
    node_addresses: Vec<SimAddress>,
    zone: String,
    region: String,
    additional_labels: BTreeMap<String, String>,
}

/// `Option<InstanceMetadata>` as sent: `null` is upstream's `(nil, nil)`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct WireMaybeMetadata(Option<WireMetadata>);

impl From<Option<InstanceMetadata>> for WireMaybeMetadata {
    fn from(m: Option<InstanceMetadata>) -> Self {
        WireMaybeMetadata(m.map(|m| {
            WireMetadata {
                node_addresses: m
                    .node_addresses
                    .iter()
                    .map(|a| SimAddress {
                        type_: a.type_.clone(),
                        address: a.address.clone(),
                    })
                    .collect(),
                provider_id: m.provider_id,
                instance_type: m.instance_type,
                zone: m.zone,
                region: m.region,
                additional_labels: m.additional_labels,
            }
        }))
    }
}

impl From<WireMaybeMetadata> for Option<InstanceMetadata> {
    fn from(m: WireMaybeMetadata) -> Self {
        m.0.map(|m| InstanceMetadata {
            node_addresses: m.node_addresses.iter().map(Into::into).collect(),
            provider_id: m.provider_id,
            instance_type: m.instance_type,
            zone: m.zone,
            region: m.region,
            additional_labels: m.additional_labels,
        })
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct WireStatus {
    exists: bool,
    shutdown: bool,
}

impl From<InstanceStatus> for WireStatus {
    fn from(s: InstanceStatus) -> Self {
        WireStatus {
            exists: s.exists,
            shutdown: s.shutdown,
        }
    }
}

impl From<WireStatus> for InstanceStatus {
    fn from(s: WireStatus) -> Self {
        InstanceStatus {
            exists: s.exists,
            shutdown: s.shutdown,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum WireEventKind {
    Created,
    Stopped,
    Started,
    Terminated,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WireEvent {
    kind: WireEventKind,
    provider_id: String,
    node_name: Option<String>,
}

impl From<&InstanceEvent> for WireEvent {
    fn from(e: &InstanceEvent) -> Self {
        WireEvent {
            kind: match e.kind {
                InstanceEventKind::Created => WireEventKind::Created,
                InstanceEventKind::Stopped => WireEventKind::Stopped,
                InstanceEventKind::Started => WireEventKind::Started,
                InstanceEventKind::Terminated => WireEventKind::Terminated,
            },
            provider_id: e.provider_id.clone(),
            node_name: e.node_name.clone(),
        }
    }
}

impl From<WireEvent> for InstanceEvent {
    fn from(e: WireEvent) -> Self {
        InstanceEvent {
            kind: match e.kind {
                WireEventKind::Created => InstanceEventKind::Created,
                WireEventKind::Stopped => InstanceEventKind::Stopped,
                WireEventKind::Started => InstanceEventKind::Started,
                WireEventKind::Terminated => InstanceEventKind::Terminated,
            },
            provider_id: e.provider_id,
            node_name: e.node_name,
        }
    }
}

/// One provider call; the variant names are the [`ccm_cloud::op`] names.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", content = "args", rename_all = "snake_case")]
pub(crate) enum Call {
    InstanceExists {
        node: WireNode,
    },
    InstanceShutdown {
        node: WireNode,
    },
    InstanceMetadata {
        node: WireNode,
    },
    InstancesMetadata {
        nodes: Vec<WireNode>,
    },
    InstancesStatus {
        nodes: Vec<WireNode>,
    },
    GetLoadBalancer {
        cluster: String,
        service: Box<Service>,
    },
    EnsureLoadBalancer {
        cluster: String,
        service: Box<Service>,
        #[serde(default)]
        nodes: Vec<WireNode>,
        #[serde(default)]
        list: Option<ListRef>,
    },
    UpdateLoadBalancer {
        cluster: String,
        service: Box<Service>,
        #[serde(default)]
        nodes: Vec<WireNode>,
        #[serde(default)]
        list: Option<ListRef>,
    },
    EnsureLoadBalancerDeleted {
        cluster: String,
        service: Box<Service>,
    },
    ListRoutes {
        cluster: String,
    },
    CreateRoute {
        cluster: String,
        name_hint: String,
        route: WireRoute,
    },
    DeleteRoute {
        cluster: String,
        route: WireRoute,
    },
}

/// A control-API fault change.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum FaultRequest {
    Latency {
        op: String,
        fixed_ms: u64,
        jitter_ms: u64,
    },
    ErrorRate {
        op: String,
        rate: f64,
    },
    FailNext {
        op: String,
        n: u32,
    },
    /// `qps`/`burst` absent: lift the limit.
    Throttle {
        op: String,
        qps: Option<f64>,
        burst: Option<u32>,
    },
    Clear,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct DeleteRouteRequest {
    pub(crate) cluster: String,
    pub(crate) destination_cidr: String,
}

/// One line of the `/v1/calls` answer (a tuple-keyed map has no JSON form).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct CallCount {
    pub(crate) operation: String,
    pub(crate) result: String,
    pub(crate) count: u64,
}

/// What the sim cloud reads of a Node: its name and providerID. Sending only that keeps a call
/// with 1,000 Nodes small (a k8s-openapi `Node` is over a kilobyte even when empty), as a real
/// cloud API call naming instance IDs would be.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WireNode {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
}

impl From<&Node> for WireNode {
    fn from(n: &Node) -> Self {
        WireNode {
            name: n.metadata.name.clone().unwrap_or_default(),
            provider_id: n.spec.as_ref().and_then(|s| s.provider_id.clone()),
        }
    }
}

impl WireNode {
    /// The minimal Node the sim's lookups need.
    pub fn into_node(self) -> Node {
        Node {
            metadata: ccm_cloud::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(self.name),
                ..Default::default()
            },
            spec: self
                .provider_id
                .map(|p| ccm_cloud::k8s_openapi::api::core::v1::NodeSpec {
                    provider_id: Some(p),
                    ..Default::default()
                }),
            status: None,
        }
    }
}

/// Converts received wire nodes for the sim.
pub(crate) fn nodes_of(wire: Vec<WireNode>) -> Vec<std::sync::Arc<Node>> {
    wire.into_iter()
        .map(|n| std::sync::Arc::new(n.into_node()))
        .collect()
}

/// The host names of received wire nodes, as the sim's load balancers keep them (sorted, no
/// duplicates). The server builds no `Node`s for a load-balancer call: a 1,000-host ensure made
/// and dropped 1,000 of them, a sixth of the bench process's CPU while 200 Services were ensured
/// — CPU that a real cloud spends on its own machines, not beside the CCM.
pub(crate) fn hosts_of_wire(wire: Vec<WireNode>) -> Vec<String> {
    let mut hosts: Vec<String> = wire.into_iter().map(|n| n.name).collect();
    hosts.sort_unstable();
    hosts.dedup();
    hosts
}

/// [`WireNode`]'s JSON form, borrowed from a `Node`: the client serializes a call's node list
/// without copying every name and providerID first.
#[derive(Serialize)]
struct WireNodeRef<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    provider_id: Option<&'a str>,
}

/// A node list serialized as `[WireNode, …]` straight from the caller's shared `Node`s.
#[derive(Clone, Copy)]
pub(crate) struct WireNodes<'a>(pub(crate) &'a [std::sync::Arc<Node>]);

fn wire_node_ref(n: &Node) -> WireNodeRef<'_> {
    WireNodeRef {
        name: n.metadata.name.as_deref().unwrap_or_default(),
        provider_id: n.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
    }
}

impl Serialize for WireNodes<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|n| wire_node_ref(n)))
    }
}

/// The calls that carry a node list, serialized from borrowed data into the same JSON as the
/// matching [`Call`] variants (the server reads them as `Call`).
#[derive(Serialize)]
#[serde(tag = "op", content = "args", rename_all = "snake_case")]
pub(crate) enum CallRef<'a> {
    InstancesMetadata {
        nodes: WireNodes<'a>,
    },
    InstancesStatus {
        nodes: WireNodes<'a>,
    },
    EnsureLoadBalancer {
        cluster: &'a str,
        service: &'a Service,
        nodes: WireNodes<'a>,
        list: ListRef,
    },
    UpdateLoadBalancer {
        cluster: &'a str,
        service: &'a Service,
        nodes: WireNodes<'a>,
        list: ListRef,
    },
}
