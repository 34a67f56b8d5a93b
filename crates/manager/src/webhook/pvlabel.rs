//! The PersistentVolume labeler: the CCM-hosted replacement for kube-apiserver's deprecated
//! `PersistentVolumeLabel` admission plugin. A new PV of a cloud disk gets the disk's
//! `topology.kubernetes.io/zone`/`region` labels and a matching node-affinity requirement, so
//! the scheduler places its pods where the disk can attach.
//!
//! Lookups are batched: requests that arrive while a lookup is pending or within
//! [`BATCH_WINDOW`] share one cloud call, and answers are cached (a disk never changes zone),
//! so a burst of PVs costs a few calls, not one each. A PV of another driver, or a volume the
//! cloud does not know, is admitted unchanged; a failed lookup is an error (answered per the
//! webhook's failure policy), never "no labels".

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use ccm_cloud::k8s_openapi::api::core::v1::PersistentVolumeSpec;
use ccm_cloud::{VolumeTopology, Volumes};

use super::{Admission, AdmissionRequest, FailurePolicy, Webhook, WebhookError};

/// The webhook's name in `--webhooks` and its path.
pub const NAME: &str = "persistentvolumelabel";
/// How long the first request of a batch waits for others.
pub const BATCH_WINDOW: Duration = Duration::from_millis(20);
const CACHE_LIMIT: usize = 50_000;
const ZONE: &str = "topology.kubernetes.io/zone";
/// The PersistentVolumeSource fields that name a cloud disk.
const DISK_SOURCES: &[&str] = &[
    "awsElasticBlockStore",
    "azureDisk",
    "cinder",
    "csi",
    "gcePersistentDisk",
    "vsphereVolume",
];
const REGION: &str = "topology.kubernetes.io/region";

type Reply = oneshot::Sender<Result<Option<VolumeTopology>, String>>;

/// The labeler webhook.
pub struct PvLabeler {
    volumes: Arc<dyn Volumes>,
    queue: mpsc::UnboundedSender<(String, Reply)>,
    timeout: Duration,
}

impl PvLabeler {
    /// Starts the batching task (on the current Tokio runtime) over the provider's disks. The
    /// task ends when the labeler is dropped.
    pub fn new(volumes: Arc<dyn Volumes>) -> Self {
        let (queue, rx) = mpsc::unbounded_channel();
        tokio::spawn(batcher(volumes.clone(), rx));
        PvLabeler {
            volumes,
            queue,
            timeout: Duration::from_secs(5),
        }
    }

    /// The most a request may wait for its lookup (default 5s, half kube-apiserver's default
    /// webhook timeout, so the failure policy answers before the API server gives up).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The disk id of a PV of this cloud, or None for any other PV. Only the cloud-disk
    /// sources are decoded, so a field elsewhere in the spec that this crate's API types do
    /// not know can never make a PV of this cloud pass unlabelled.
    fn volume_id(&self, pv: &Value) -> Result<Option<String>, WebhookError> {
        let Some(spec) = pv.get("spec").and_then(Value::as_object) else {
            return Ok(None);
        };
        let sources: serde_json::Map<String, Value> = spec
            .iter()
            .filter(|(k, _)| DISK_SOURCES.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if sources.is_empty() {
            return Ok(None);
        }
        let spec: PersistentVolumeSpec = serde_json::from_value(Value::Object(sources))
            .map_err(|e| format!("cannot read the PersistentVolume's volume source: {e}"))?;
        Ok(self.volumes.volume_id(&spec))
    }

    async fn lookup(&self, id: String) -> Result<Option<VolumeTopology>, WebhookError> {
        let (tx, rx) = oneshot::channel();
        let stopped = || WebhookError::from("volume lookup task stopped");
        self.queue.send((id, tx)).map_err(|_| stopped())?;
        let answer = rx.await.map_err(|_| stopped())?;
        answer.map_err(|e| format!("volume lookup failed: {e}").into())
    }
}

#[async_trait::async_trait]
impl Webhook for PvLabeler {
    fn name(&self) -> &str {
        NAME
    }
    /// A PV admitted without its zone could be scheduled where its disk cannot attach.
    fn failure_policy(&self) -> FailurePolicy {
        FailurePolicy::Fail
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }
    async fn admit(&self, req: &AdmissionRequest) -> Result<Admission, WebhookError> {
        let pv = match &req.object {
            Some(pv) if req.operation == "CREATE" && is_pv(&req.kind) => pv,
            _ => return Ok(Admission::Allow),
        };
        let Some(id) = self.volume_id(pv)? else {
            return Ok(Admission::Allow);
        };
        match self.lookup(id).await? {
            Some(topo) => Ok(patch(pv, &topo)),
            None => Ok(Admission::Allow),
        }
    }
}

fn is_pv(kind: &Value) -> bool {
    kind.get("kind").and_then(Value::as_str) == Some("PersistentVolume")
        && kind
            .get("group")
            .and_then(Value::as_str)
            .unwrap_or("")
            .is_empty()
}

/// The JSON patch: labels merged (the cloud's values win, as upstream), and a node-affinity
/// requirement for each key a term does not already constrain.
pub fn patch(pv: &Value, topo: &VolumeTopology) -> Admission {
    let wanted: Vec<(&str, &str)> = [(ZONE, topo.zone.as_str()), (REGION, topo.region.as_str())]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .collect();
    let mut labels = pv
        .pointer("/metadata/labels")
        .cloned()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    for (k, v) in &wanted {
        labels[*k] = json!(v);
    }
    let affinity = node_affinity(pv.pointer("/spec/nodeAffinity"), &wanted);
    let mut ops = Vec::new();
    if pv.pointer("/metadata/labels") != Some(&labels) {
        ops.push(json!({"op": "add", "path": "/metadata/labels", "value": labels}));
    }
    if pv.pointer("/spec/nodeAffinity") != Some(&affinity) {
        ops.push(json!({"op": "add", "path": "/spec/nodeAffinity", "value": affinity}));
    }
    if ops.is_empty() {
        Admission::Allow
    } else {
        Admission::Patch(ops)
    }
}

fn node_affinity(current: Option<&Value>, wanted: &[(&str, &str)]) -> Value {
    let requirement = |k: &str, v: &str| json!({"key": k, "operator": "In", "values": [v]});
    let mut affinity = current.cloned().unwrap_or_else(|| json!({}));
    let terms = affinity
        .pointer_mut("/required/nodeSelectorTerms")
        .and_then(Value::as_array_mut);
    match terms {
        Some(terms) if !terms.is_empty() => {
            for term in terms {
                let exprs = &mut term["matchExpressions"];
                if !exprs.is_array() {
                    *exprs = json!([]);
                }
                let list = exprs.as_array_mut().expect("made an array");
                for (k, v) in wanted {
                    if !list
                        .iter()
                        .any(|e| e.get("key").and_then(Value::as_str) == Some(k))
                    {
                        list.push(requirement(k, v));
                    }
                }
            }
        }
        _ => {
            let exprs: Vec<Value> = wanted.iter().map(|(k, v)| requirement(k, v)).collect();
            affinity["required"] = json!({"nodeSelectorTerms": [{"matchExpressions": exprs}]});
        }
    }
    affinity
}

/// Collects requests into batches: answers cached ones at once, looks the rest up in one call.
async fn batcher(zones: Arc<dyn Volumes>, mut rx: mpsc::UnboundedReceiver<(String, Reply)>) {
    let mut cache: HashMap<String, VolumeTopology> = HashMap::new();
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let max_batch = zones.max_batch_size().max(1);
        let deadline = tokio::time::Instant::now() + BATCH_WINDOW;
        while batch.len() < max_batch {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(item)) => batch.push(item),
                Ok(None) | Err(_) => break,
            }
        }
        let mut misses: Vec<String> = batch
            .iter()
            .filter(|(id, _)| !cache.contains_key(id))
            .map(|(id, _)| id.clone())
            .collect();
        misses.sort();
        misses.dedup();
        let looked_up = if misses.is_empty() {
            Ok(HashMap::new())
        } else {
            zones.volume_topology(&misses).await
        };
        match looked_up {
            Ok(found) => {
                if cache.len() + found.len() > CACHE_LIMIT {
                    cache.clear();
                }
                cache.extend(found);
                for (id, reply) in batch {
                    let _ = reply.send(Ok(cache.get(&id).cloned()));
                }
            }
            Err(e) => {
                let msg = e.to_string();
                for (id, reply) in batch {
                    let answer = match cache.get(&id) {
                        Some(t) => Ok(Some(t.clone())),
                        None => Err(msg.clone()),
                    };
                    let _ = reply.send(answer);
                }
            }
        }
    }
}
