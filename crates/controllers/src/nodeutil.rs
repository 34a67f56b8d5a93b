//! Node facts every controller reads: well-known keys, readiness, taints.

use k8s_openapi::api::core::v1::{Node, Taint};

/// Taint the kubelet puts on a Node started with `--cloud-provider=external`; the cloud-node
/// controller removes it once the Node is initialized.
pub const TAINT_UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
/// Taint the lifecycle controller puts on a Node whose instance is shut down.
pub const TAINT_SHUTDOWN: &str = "node.cloudprovider.kubernetes.io/shutdown";
/// Cluster Autoscaler's taint on a Node it is about to delete (key match only).
pub const TAINT_TO_BE_DELETED_BY_CA: &str = "ToBeDeletedByClusterAutoscaler";
/// Label that keeps a Node out of load balancers unless its value parses as `false`.
pub const LABEL_EXCLUDE_FROM_LB: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
/// Annotation with the kubelet's `--node-ip` (one IP or a dual-stack pair).
pub const ANNOTATION_PROVIDED_NODE_IP: &str = "alpha.kubernetes.io/provided-node-ip";

/// GA instance-type label.
pub const LABEL_INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
/// Beta instance-type label (the primary for beta→GA reconciliation).
pub const LABEL_INSTANCE_TYPE_BETA: &str = "beta.kubernetes.io/instance-type";
/// GA zone label.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// Beta zone label.
pub const LABEL_ZONE_BETA: &str = "failure-domain.beta.kubernetes.io/zone";
/// GA region label.
pub const LABEL_REGION: &str = "topology.kubernetes.io/region";
/// Beta region label.
pub const LABEL_REGION_BETA: &str = "failure-domain.beta.kubernetes.io/region";

/// Status of a Node condition: what `status.conditions[type=X].status` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConditionStatus {
    /// `True`
    True,
    /// `False`
    False,
    /// `Unknown`, or the condition is missing.
    Unknown,
}

/// The first condition of `type_`, as upstream reads it.
pub fn condition_status(node: &Node, type_: &str) -> ConditionStatus {
    let found = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_));
    match found.map(|c| c.status.as_str()) {
        Some("True") => ConditionStatus::True,
        Some("False") => ConditionStatus::False,
        _ => ConditionStatus::Unknown,
    }
}

/// True only when the Ready condition is `True` (missing counts as not ready).
pub fn is_ready(node: &Node) -> bool {
    condition_status(node, "Ready") == ConditionStatus::True
}

/// The Node's taints (empty if none).
pub fn taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or(&[])
}

/// True when any taint has `key`.
pub fn has_taint(node: &Node, key: &str) -> bool {
    taints(node).iter().any(|t| t.key == key)
}

/// The Node's pod CIDRs (`spec.podCIDRs`; the singular field is ignored, as upstream).
pub fn pod_cidrs(node: &Node) -> &[String] {
    node.spec
        .as_ref()
        .and_then(|s| s.pod_cidrs.as_deref())
        .unwrap_or(&[])
}

/// Go's `strconv.ParseBool`, which upstream uses for label values.
pub fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}
