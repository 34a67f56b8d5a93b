//! What the watches decode Nodes and Services into: only the fields the caches keep.
//!
//! A kubelet's Node is mostly `managedFields` (arbitrary JSON, which would be decoded into a
//! tree of `serde_json::Value`s), the image list and the system info, all of which the cache's
//! trim drops. These types name only the kept fields, so serde skips the rest while parsing
//! and builds nothing of it: a burst costs the CCM a fifth less CPU than decoding whole
//! objects and trimming them after (watch events and the Node writes' replies; see
//! docs/BENCHMARKS.md). A field of `ObjectMeta` added by a later API version is dropped too:
//! nothing reads it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, Service, ServiceSpec, ServiceStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::Deserialize;

/// `ObjectMeta` without `managedFields`.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct Meta {
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

impl From<Meta> for ObjectMeta {
    fn from(m: Meta) -> Self {
        ObjectMeta {
            annotations: m.annotations,
            creation_timestamp: m.creation_timestamp,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            deletion_timestamp: m.deletion_timestamp,
            finalizers: m.finalizers,
            generate_name: m.generate_name,
            generation: m.generation,
            labels: m.labels,
            managed_fields: None,
            name: m.name,
            namespace: m.namespace,
            owner_references: m.owner_references,
            resource_version: m.resource_version,
            self_link: m.self_link,
            uid: m.uid,
        }
    }
}

/// Of a Node's status, the addresses and conditions.
#[derive(Deserialize, Default)]
#[serde(default)]
struct WireNodeStatus {
    addresses: Option<Vec<NodeAddress>>,
    conditions: Option<Vec<NodeCondition>>,
}

#[derive(Deserialize)]
struct WireNode {
    #[serde(default)]
    metadata: Meta,
    spec: Option<NodeSpec>,
    status: Option<WireNodeStatus>,
}

#[derive(Deserialize)]
struct WireService {
    #[serde(default)]
    metadata: Meta,
    spec: Option<ServiceSpec>,
    status: Option<ServiceStatus>,
}

/// A Node decoded with only its metadata (no `managedFields`), spec, addresses and conditions:
/// what [`super::trim_node`] keeps.
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "WireNode")]
pub struct SlimNode(pub Node);

impl From<WireNode> for SlimNode {
    fn from(w: WireNode) -> Self {
        let mut metadata: ObjectMeta = w.metadata.into();
        metadata.finalizers = tight(metadata.finalizers);
        let spec = w.spec.map(|s| NodeSpec {
            pod_cidrs: tight(s.pod_cidrs),
            taints: tight(s.taints),
            ..s
        });
        SlimNode(Node {
            metadata,
            spec,
            status: w.status.map(|s| NodeStatus {
                addresses: tight(s.addresses),
                conditions: tight(s.conditions),
                ..Default::default()
            }),
        })
    }
}

/// A decoded list without the room it grew into: serde fills a `Vec` by pushing (JSON gives no
/// length), so a Node's five conditions sat in room for eight and its one pod CIDR in room for
/// four. The lists' buffers were a quarter of the cached Nodes' heap (heaptrack, 10,000 Nodes),
/// much of it that unused room.
fn tight<T>(list: Option<Vec<T>>) -> Option<Vec<T>> {
    list.map(|mut l| {
        l.shrink_to_fit();
        l
    })
}

/// A Service decoded without `managedFields`.
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "WireService")]
pub struct SlimService(pub Service);

impl From<WireService> for SlimService {
    fn from(w: WireService) -> Self {
        SlimService(Service {
            metadata: w.metadata.into(),
            spec: w.spec,
            status: w.status,
        })
    }
}

impl From<SlimNode> for Node {
    fn from(s: SlimNode) -> Self {
        s.0
    }
}

impl From<SlimService> for Service {
    fn from(s: SlimService) -> Self {
        s.0
    }
}

/// Makes a wrapper the same API resource as the object it wraps (URL, kind, scope), so
/// `kube::Api` lists and watches it as that object.
macro_rules! same_resource {
    ($slim:ty, $full:ty) => {
        impl k8s_openapi::Resource for $slim {
            const API_VERSION: &'static str = <$full as k8s_openapi::Resource>::API_VERSION;
            const GROUP: &'static str = <$full as k8s_openapi::Resource>::GROUP;
            const KIND: &'static str = <$full as k8s_openapi::Resource>::KIND;
            const VERSION: &'static str = <$full as k8s_openapi::Resource>::VERSION;
            const URL_PATH_SEGMENT: &'static str =
                <$full as k8s_openapi::Resource>::URL_PATH_SEGMENT;
            type Scope = <$full as k8s_openapi::Resource>::Scope;
        }

        impl k8s_openapi::Metadata for $slim {
            type Ty = ObjectMeta;
            fn metadata(&self) -> &ObjectMeta {
                &self.0.metadata
            }
            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.0.metadata
            }
        }
    };
}

same_resource!(SlimNode, Node);
same_resource!(SlimService, Service);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::informer::{trim_node, trim_service};
    use serde_json::json;

    /// Every field of `ObjectMeta` set, `managedFields` included.
    fn full_meta(name: &str) -> serde_json::Value {
        json!({
            "name": name, "namespace": "default", "uid": "u1", "resourceVersion": "7",
            "generateName": "web-", "generation": 3, "selfLink": "/x",
            "creationTimestamp": "2026-11-29T01:00:00Z",
            "deletionTimestamp": "2026-11-29T02:00:00Z", "deletionGracePeriodSeconds": 30,
            "finalizers": ["service.kubernetes.io/load-balancer-cleanup"],
            "labels": {"app": "web", "kubernetes.io/hostname": name},
            "annotations": {"a": "b", "kubectl.kubernetes.io/last-applied-configuration": "{}"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u0", "controller": true}],
            "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                               "time": "2026-11-29T01:00:00Z", "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:status": {"f:images": {}, "f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}}}}}}],
        })
    }

    fn kubelet_node() -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": full_meta("n1"),
            "spec": {"podCIDR": "10.0.1.0/24", "podCIDRs": ["10.0.1.0/24"], "providerID": "sim://n1",
                     "unschedulable": true,
                     "taints": [{"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}]},
            "status": {
                "addresses": [{"type": "InternalIP", "address": "10.1.0.1"}, {"type": "Hostname", "address": "n1"}],
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "lastHeartbeatTime": "2026-11-29T01:00:00Z", "lastTransitionTime": "2026-11-29T01:00:00Z"}],
                "capacity": {"cpu": "4", "memory": "16Gi"},
                "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "6.1", "osImage": "Debian",
                             "containerRuntimeVersion": "containerd://2.0", "kubeletVersion": "v1.36.0", "kubeProxyVersion": "",
                             "operatingSystem": "linux", "architecture": "amd64"},
                "images": [{"names": ["registry.k8s.io/pause:3.10"], "sizeBytes": 320000}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            },
        })
    }

    fn lb_service() -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": full_meta("web"),
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}],
                     "selector": {"app": "web"}, "clusterIP": "10.96.0.10", "externalTrafficPolicy": "Local",
                     "healthCheckNodePort": 31000, "loadBalancerClass": "x"},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1", "ipMode": "VIP"}]},
                       "conditions": [{"type": "T", "status": "True", "reason": "R", "message": "m",
                                       "lastTransitionTime": "2026-11-29T01:00:00Z"}]},
        })
    }

    #[test]
    fn a_slim_node_is_the_full_node_trimmed() {
        let mut full: Node = serde_json::from_value(kubelet_node()).expect("full");
        trim_node(&mut full);
        let mut slim: Node = serde_json::from_value::<SlimNode>(kubelet_node())
            .expect("slim")
            .into();
        trim_node(&mut slim);
        assert_eq!(slim, full);
        assert!(
            slim.metadata.deletion_timestamp.is_some() && slim.metadata.owner_references.is_some()
        );
    }

    #[test]
    fn a_slim_service_is_the_full_service_without_managed_fields() {
        for value in [lb_service(), json!({"metadata": {"name": "bare"}})] {
            let mut full: Service = serde_json::from_value(value.clone()).expect("full");
            trim_service(&mut full);
            let mut slim: Service = serde_json::from_value::<SlimService>(value)
                .expect("slim")
                .into();
            trim_service(&mut slim);
            assert_eq!(slim, full);
        }
    }

    #[test]
    fn watch_events_decode_into_slim_objects() {
        let line = json!({"type": "MODIFIED", "object": kubelet_node()}).to_string();
        match serde_json::from_str::<kube::api::WatchEvent<SlimNode>>(&line).expect("event") {
            kube::api::WatchEvent::Modified(n) => {
                assert_eq!(n.0.metadata.name.as_deref(), Some("n1"));
                assert!(n.0.metadata.managed_fields.is_none());
            }
            other => panic!("{other:?}"),
        }
        let bookmark = json!({"type": "BOOKMARK", "object": {"kind": "Node", "apiVersion": "v1",
            "metadata": {"resourceVersion": "12"}}})
        .to_string();
        assert!(matches!(
            serde_json::from_str::<kube::api::WatchEvent<SlimNode>>(&bookmark).expect("bookmark"),
            kube::api::WatchEvent::Bookmark(_)
        ));
    }
}
