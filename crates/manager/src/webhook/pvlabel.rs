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

use super::{Admission, AdmissionRequest, FailurePolicy, Webhook};

/// The webhook's name in `--webhooks` and its path.
pub const NAME: &str = "persistentvolumelabel";
/// How long the first request of a batch waits for others.
pub const BATCH_WINDOW: Duration = Duration::from_millis(20);
/// Most volumes in one lookup (EC2 DescribeVolumes takes up to 500 ids per filter).
pub const MAX_BATCH: usize = 200;
const CACHE_LIMIT: usize = 50_000;
const ZONE: &str = "topology.kubernetes.io/zone";
const REGION: &str = "topology.kubernetes.io/region";

/// Where a disk lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeTopology {
    /// e.g. `us-east-1a`.
    pub zone: String,
    /// e.g. `us-east-1`.
    pub region: String,
}

/// The cloud capability the labeler needs: many disks' zones in one call.
#[async_trait::async_trait]
pub trait VolumeZones: Send + Sync + 'static {
    /// Topology of each known volume; a volume absent from the map does not exist. An `Err`
    /// means "no authoritative answer" and is never read as "absent".
    async fn volume_topology(
        &self,
        ids: &[String],
    ) -> anyhow::Result<HashMap<String, VolumeTopology>>;
}

type Reply = oneshot::Sender<Result<Option<VolumeTopology>, String>>;

/// Which PV sources are this cloud's disks.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// In-tree `awsElasticBlockStore` (`vol-…` or `aws://<zone>/vol-…`).
    pub aws_ebs_in_tree: bool,
    /// A CSI driver name whose `volumeHandle` is the disk id (e.g. `ebs.csi.aws.com`).
    pub csi_driver: Option<String>,
}

/// The labeler webhook.
pub struct PvLabeler {
    sources: Sources,
    queue: mpsc::UnboundedSender<(String, Reply)>,
    timeout: Duration,
}

impl PvLabeler {
    /// Starts the batching task (on the current Tokio runtime) over `zones`.
    pub fn new(zones: Arc<dyn VolumeZones>, sources: Sources) -> Self {
        let (queue, rx) = mpsc::unbounded_channel();
        tokio::spawn(batcher(zones, rx));
        PvLabeler {
            sources,
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

    /// The disk id of a PV of this cloud, or None for any other PV.
    fn volume_id(&self, pv: &Value) -> Option<String> {
        let spec = pv.get("spec")?;
        if self.sources.aws_ebs_in_tree
            && let Some(id) = spec
                .pointer("/awsElasticBlockStore/volumeID")
                .and_then(Value::as_str)
        {
            return id.rsplit('/').next().map(str::to_string);
        }
        let csi = spec.get("csi")?;
        let driver = self.sources.csi_driver.as_deref()?;
        (csi.get("driver")?.as_str()? == driver)
            .then(|| csi.get("volumeHandle")?.as_str().map(str::to_string))?
    }

    async fn lookup(&self, id: String) -> anyhow::Result<Option<VolumeTopology>> {
        let (tx, rx) = oneshot::channel();
        self.queue
            .send((id, tx))
            .map_err(|_| anyhow::anyhow!("volume lookup task stopped"))?;
        rx.await
            .map_err(|_| anyhow::anyhow!("volume lookup task stopped"))?
            .map_err(|e| anyhow::anyhow!("volume lookup failed: {e}"))
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
    async fn admit(&self, req: &AdmissionRequest) -> anyhow::Result<Admission> {
        let pv = match &req.object {
            Some(pv) if req.operation == "CREATE" && is_pv(&req.kind) => pv,
            _ => return Ok(Admission::Allow),
        };
        let Some(id) = self.volume_id(pv) else {
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
async fn batcher(zones: Arc<dyn VolumeZones>, mut rx: mpsc::UnboundedReceiver<(String, Reply)>) {
    let mut cache: HashMap<String, VolumeTopology> = HashMap::new();
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + BATCH_WINDOW;
        while batch.len() < MAX_BATCH {
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
                let msg = format!("{e:#}");
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
