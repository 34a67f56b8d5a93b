//! Minimal Kubernetes objects for exercising a provider without a cluster: tests of this crate,
//! of the controllers, and the benchmark all need Nodes and Services that carry just the fields
//! providers read.

use ccm_cloud::Node;
use ccm_cloud::Service;
use ccm_cloud::k8s_openapi::api::core::v1::{NodeSpec, ServicePort, ServiceSpec};
use ccm_cloud::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// A Node named `name`, with `spec.providerID` if given.
pub fn node(name: &str, provider_id: Option<&str>) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: provider_id.map(str::to_string),
            ..Default::default()
        }),
        status: None,
    }
}

/// A `type: LoadBalancer` Service with the given UID and `(protocol, port, nodePort)` ports.
pub fn service(namespace: &str, name: &str, uid: &str, ports: &[(&str, i32, i32)]) -> Service {
    Service {
        metadata: ObjectMeta {
            namespace: Some(namespace.to_string()),
            name: Some(name.to_string()),
            uid: Some(uid.to_string()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(
                ports
                    .iter()
                    .map(|(protocol, port, node_port)| ServicePort {
                        protocol: Some(protocol.to_string()),
                        port: *port,
                        node_port: Some(*node_port),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        status: None,
    }
}
