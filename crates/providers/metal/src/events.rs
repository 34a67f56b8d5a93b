//! Warning Events the provider writes itself, for what no controller reports: addresses a
//! pool edit left uncovered, machines swapped under a Node.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, PostParams};

use crate::provider::MetalCloud;

impl MetalCloud {
    /// A core/v1 Warning Event on `kind` `namespace/name` (Nodes: namespace `default`, as the
    /// kubelet's). Without an API client (not initialized) nothing is written.
    pub(crate) async fn warn(
        &self,
        namespace: &str,
        kind: &str,
        name: &str,
        reason: &str,
        message: String,
    ) -> Result<(), kube::Error> {
        let Some(client) = self.client() else {
            return Ok(());
        };
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let object_ns = (kind != "Node").then(|| namespace.to_string());
        let mut ev = Event {
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some(kind.into()),
                namespace: object_ns,
                name: Some(name.into()),
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(message),
            type_: Some("Warning".into()),
            source: Some(EventSource {
                component: Some("cloud-provider-metal".into()),
                ..Default::default()
            }),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            count: Some(1),
            ..Default::default()
        };
        ev.metadata.generate_name = Some(format!("{name}."));
        ev.metadata.namespace = Some(namespace.into());
        Api::<Event>::namespaced(client, namespace)
            .create(&PostParams::default(), &ev)
            .await
            .map(|_| ())
    }
}
