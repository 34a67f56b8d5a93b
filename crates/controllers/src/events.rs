//! Kubernetes Events with upstream reasons, written in the background.
//!
//! Upstream CCM controllers record core/v1 Events (what `kubectl describe` and
//! `kubectl get events` show) with a `source.component` per controller. ccm-rs does the same,
//! off the controllers' hot path: `publish` never waits for the API server, and a repeat of the
//! same event on the same object within the dedup window becomes a count bump (as client-go's
//! correlator does) instead of a new object.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// `Normal` or `Warning`, as Kubernetes spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Something expected happened.
    Normal,
    /// Something an operator should look at.
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// How long a repeated event is folded into the first one.
const DEDUP_WINDOW: Duration = Duration::from_secs(600);
/// Bound on queued events; past it events are dropped (and logged) rather than blocking.
const QUEUE_CAPACITY: usize = 4096;

struct Pending {
    reference: ObjectReference,
    type_: EventType,
    reason: String,
    message: String,
}

/// Publishes Events for one controller (`source.component`). Cheap to clone.
#[derive(Clone)]
pub struct Recorder {
    tx: Option<mpsc::Sender<Pending>>,
    component: Arc<str>,
}

impl Recorder {
    /// A recorder writing through `client` as `component` (e.g. `cloud-node-controller`).
    /// Must be called inside a Tokio runtime: it spawns the writer task.
    pub fn new(client: kube::Client, component: &str) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let component: Arc<str> = Arc::from(component);
        tokio::spawn(writer(client, component.clone(), rx));
        Recorder {
            tx: Some(tx),
            component,
        }
    }

    /// A recorder that only logs (for unit tests and dry runs).
    pub fn disabled(component: &str) -> Self {
        Recorder {
            tx: None,
            component: Arc::from(component),
        }
    }

    /// Records an event about `obj`. Never blocks; drops the event if the writer is far behind.
    pub fn publish<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        message: impl Into<String>,
    ) {
        let message = message.into();
        match type_ {
            EventType::Normal => {
                tracing::debug!(component = %self.component, object = %obj.name_any(), reason, %message, "event")
            }
            EventType::Warning => {
                tracing::warn!(component = %self.component, object = %obj.name_any(), reason, %message, "event")
            }
        }
        let Some(tx) = &self.tx else { return };
        let reference = object_reference(obj);
        if tx
            .try_send(Pending {
                reference,
                type_,
                reason: reason.to_string(),
                message,
            })
            .is_err()
        {
            tracing::warn!(component = %self.component, "event queue full; dropping event");
        }
    }
}

/// An ObjectReference for `obj`, as event `involvedObject`s carry it.
pub fn object_reference<K: Resource<DynamicType = ()>>(obj: &K) -> ObjectReference {
    let meta = obj.meta();
    ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(K::kind(&()).into_owned()),
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        resource_version: None,
        field_path: None,
    }
}

async fn writer(client: kube::Client, component: Arc<str>, mut rx: mpsc::Receiver<Pending>) {
    // (object uid/name, reason, message) → (event name, namespace, count, first seen)
    type Key = (String, String, String);
    let seen: Mutex<HashMap<Key, (String, String, i32, Instant)>> = Mutex::default();
    let mut seq: u64 = 0;
    while let Some(p) = rx.recv().await {
        let namespace = p
            .reference
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string());
        let obj_id = p
            .reference
            .uid
            .clone()
            .or_else(|| p.reference.name.clone())
            .unwrap_or_default();
        let key = (obj_id, p.reason.clone(), p.message.clone());
        let now = Timestamp::now();
        let api: Api<Event> = Api::namespaced(client.clone(), &namespace);
        let prior = {
            let mut seen = seen.lock();
            seen.retain(|_, (_, _, _, at)| at.elapsed() < DEDUP_WINDOW);
            seen.get(&key).cloned()
        };
        if let Some((name, ns, count, at)) = prior {
            let patch = serde_json::json!({
                "count": count + 1,
                "lastTimestamp": Time(now),
            });
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    seen.lock().insert(key, (name, ns, count + 1, at));
                    continue;
                }
                Err(e) => tracing::debug!(error = %e, "event count bump failed; creating anew"),
            }
        }
        seq += 1;
        let base = p.reference.name.clone().unwrap_or_default();
        let name = format!(
            "{base}.{:x}{:04x}",
            now.as_nanosecond() as u64,
            seq & 0xffff
        );
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            involved_object: p.reference,
            reason: Some(p.reason),
            message: Some(p.message),
            type_: Some(p.type_.as_str().to_string()),
            source: Some(EventSource {
                component: Some(component.to_string()),
                host: None,
            }),
            reporting_component: Some(component.to_string()),
            reporting_instance: None,
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: None::<MicroTime>,
            count: Some(1),
            ..Default::default()
        };
        match api.create(&PostParams::default(), &event).await {
            Ok(_) => {
                seen.lock()
                    .insert(key, (name, namespace, 1, Instant::now()));
            }
            Err(e) => tracing::warn!(error = %e, "could not write event"),
        }
    }
}
