//! Plain data exchanged between controllers and providers.

use std::collections::BTreeMap;

pub use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, NodeAddress, Service};

/// Everything the cloud knows about one instance, fetched in a single call (upstream
/// `cloudprovider.InstanceMetadata`). The cloud-node controller writes it onto the Node at
/// initialization and refreshes the addresses periodically.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InstanceMetadata {
    /// `<provider>://<id>`; written to `spec.providerID` only if the Node has none. Empty is
    /// allowed only when the Node already carries a providerID (upstream PR #123713).
    pub provider_id: String,
    /// Becomes `node.kubernetes.io/instance-type` (and the beta label). Empty: no label.
    pub instance_type: String,
    /// Becomes `status.addresses`. Empty keeps the Node's existing addresses.
    pub node_addresses: Vec<NodeAddress>,
    /// Becomes `topology.kubernetes.io/zone` (and the beta label). Empty: no label.
    pub zone: String,
    /// Becomes `topology.kubernetes.io/region` (and the beta label). Empty: no label.
    pub region: String,
    /// Extra labels; keys under `kubernetes.io` / `k8s.io` are dropped and existing labels are
    /// never overwritten, as upstream.
    pub additional_labels: BTreeMap<String, String>,
}

/// Existence and power state of one instance, answered for many Nodes in one batch by
/// [`crate::Instances::instances_status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InstanceStatus {
    /// False means the instance is gone: the lifecycle controller deletes a NotReady Node.
    /// Stopped instances must still report `true`.
    pub exists: bool,
    /// True when the instance exists but is powered off: the Node gets the shutdown taint.
    pub shutdown: bool,
}

/// A cloud route for pod traffic (upstream `cloudprovider.Route`).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Route {
    /// The cloud-side name; ignored on create (the name hint decides it).
    pub name: String,
    /// The Node the route points at; empty for routes whose target is unknown.
    pub target_node: String,
    /// Set by providers on routes from `list_routes` when they track node addresses: a
    /// mismatch with the Node's addresses makes the controller delete and re-create the route.
    pub enable_node_addresses: bool,
    /// The target Node's addresses (copied from `status.addresses` on create).
    pub target_node_addresses: Vec<NodeAddressKey>,
    /// The pod CIDR, as text: the controller parses it and ignores routes it cannot parse.
    pub destination_cidr: String,
    /// A route whose target is gone; always deleted when inside the cluster CIDR.
    pub blackhole: bool,
}

/// A node address as a hashable, ordered value (`k8s_openapi::NodeAddress` is neither).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeAddressKey {
    /// `InternalIP`, `ExternalIP`, `Hostname`, `InternalDNS` or `ExternalDNS`.
    pub type_: String,
    /// The address.
    pub address: String,
}

impl From<&NodeAddress> for NodeAddressKey {
    fn from(a: &NodeAddress) -> Self {
        NodeAddressKey {
            type_: a.type_.clone(),
            address: a.address.clone(),
        }
    }
}

impl From<&NodeAddressKey> for NodeAddress {
    fn from(a: &NodeAddressKey) -> Self {
        NodeAddress {
            type_: a.type_.clone(),
            address: a.address.clone(),
        }
    }
}

/// What happened to an instance, pushed by providers that can watch their cloud (EventBridge,
/// a metadata stream, the simulator) so controllers act at once instead of polling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceEvent {
    /// What changed.
    pub kind: InstanceEventKind,
    /// `<provider>://<id>` of the instance, matched against `spec.providerID`.
    pub provider_id: String,
    /// The instance's node name when the cloud knows it, used when a Node has no providerID yet.
    pub node_name: Option<String>,
}

/// The instance state changes controllers react to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InstanceEventKind {
    /// A new instance exists (a Node for it may be waiting for initialization).
    Created,
    /// The instance was powered off.
    Stopped,
    /// The instance was powered on again.
    Started,
    /// The instance is gone for good.
    Terminated,
}

/// The name of a Node, for messages: nodes are cluster-scoped, so the name is the key.
pub fn node_name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or("")
}

/// The providerID of a Node, empty when unset.
pub fn node_provider_id(node: &Node) -> &str {
    node.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .unwrap_or("")
}

/// Upstream's deprecated `DefaultLoadBalancerName`: `"a"` + the Service UID without dashes,
/// truncated to 32 characters. Kept because existing clouds hold LBs named this way.
pub fn default_load_balancer_name(svc: &Service) -> String {
    let uid = svc.metadata.uid.as_deref().unwrap_or("").replace('-', "");
    let mut name = format!("a{uid}");
    name.truncate(32);
    name
}
