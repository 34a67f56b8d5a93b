//! Instances (upstream InstancesV2) answered in batches: one servers listing (all its pages)
//! answers every Node of a batch, by providerID or by name, and one Neutron ports call per 50
//! servers gives their addresses. Upstream makes a GET per Node per call (plus a ports list).
//!
//! "Gone" is said only on authority: a Node whose server is missing from a complete listing is
//! gone only when Nova's own 404 for that server id confirms it; a Node known by name only is
//! gone when a complete listing without down-cell records has no server of that name. Every
//! error — transport, 401/403, 5xx, a parse error, a 404 that is not Nova's — is an error.

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use ccm_cloud::{
    CloudError, CloudResult, InstanceMetadata, InstanceStatus, Instances, Node, node_name,
    node_provider_id,
};

use crate::cloud::OpenStackCloud;
use crate::nova::{self, STATUS_UNKNOWN, Server};

/// The only server status upstream calls shut down (volumes can be detached at once).
pub const STATUS_SHUTOFF: &str = "SHUTOFF";

/// How a Node names its server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    /// By id, from `spec.providerID`.
    Id(String),
    /// By name (no providerID yet).
    Name(String),
}

/// The server id in `provider_id` (`openstack:///<id>`, `openstack://<region>/<id>`, or a
/// bare `<id>` as some kubelets wrote it, k/k #85731), checked against the configured region.
pub fn server_id(provider_id: &str, region: &str) -> Result<String, CloudError> {
    let full = if provider_id.contains("://") {
        provider_id.to_string()
    } else {
        format!("openstack://{provider_id}")
    };
    let bad = || {
        CloudError::Permanent(format!(
            "providerID {provider_id:?} is not openstack:///<server-id> or openstack://<region>/<server-id>"
        ))
    };
    let rest = full.strip_prefix("openstack://").ok_or_else(bad)?;
    let (node_region, id) = rest.split_once('/').ok_or_else(bad)?;
    if id.is_empty() || id.contains('/') {
        return Err(bad());
    }
    if !node_region.is_empty() && node_region != region {
        return Err(CloudError::Permanent(format!(
            "providerID {provider_id:?} is in region {node_region:?}; this CCM serves region {region:?} (one region per CCM)"
        )));
    }
    Ok(id.to_string())
}

/// The providerID of a server: regional when `OS_CCM_REGIONAL=true`, as upstream.
pub fn provider_id(id: &str, region: &str, regional: bool) -> String {
    if regional {
        format!("openstack://{region}/{id}")
    } else {
        format!("openstack:///{id}")
    }
}

/// What one listing says about the Nodes of a batch.
struct Snapshot {
    by_id: HashMap<String, Server>,
    by_name: HashMap<String, Vec<String>>,
    /// Some server is in a cell Nova cannot reach: name lookups that find nothing prove
    /// nothing.
    down_cells: bool,
}

impl OpenStackCloud {
    fn key(&self, node: &Node) -> CloudResult<Key> {
        let pid = node_provider_id(node);
        if pid.is_empty() {
            Ok(Key::Name(node_name(node).to_string()))
        } else {
            server_id(pid, &self.config().global.region).map(Key::Id)
        }
    }

    async fn snapshot(&self, keys: &[CloudResult<Key>]) -> CloudResult<Snapshot> {
        let servers = nova::list_servers(self.keystone()).await?;
        let mut s = Snapshot {
            by_id: HashMap::new(),
            by_name: HashMap::new(),
            down_cells: false,
        };
        for server in servers {
            s.down_cells |= server.status == STATUS_UNKNOWN;
            if !server.name.is_empty() {
                s.by_name
                    .entry(server.name.clone())
                    .or_default()
                    .push(server.id.clone());
            }
            s.by_id.insert(server.id.clone(), server);
        }
        // Ids the listing lacks: confirm each with Nova's own answer for that id.
        for key in keys {
            if let Ok(Key::Id(id)) = key
                && !s.by_id.contains_key(id)
                && let Some(server) = nova::get_server(self.keystone(), id).await?
            {
                s.by_id.insert(id.clone(), server);
            }
        }
        Ok(s)
    }

    /// The server for `key` in `snap`: `Ok(None)` when it is authoritatively absent.
    fn lookup<'a>(&self, snap: &'a Snapshot, key: &Key) -> CloudResult<Option<&'a Server>> {
        match key {
            Key::Id(id) => Ok(snap.by_id.get(id)),
            Key::Name(name) => match snap.by_name.get(name).map(Vec::as_slice) {
                Some([id]) => Ok(snap.by_id.get(id)),
                Some(ids) if ids.len() > 1 => Err(CloudError::Permanent(format!(
                    "{} servers are named {name:?}; set the Node's providerID",
                    ids.len()
                ))),
                _ if snap.down_cells => Err(CloudError::Transient(format!(
                    "no server named {name:?} in the listing, but Nova cannot reach some cells; not calling it gone"
                ))),
                _ => Ok(None),
            },
        }
    }

    /// Generic over how the Nodes are held: the batch calls get the controllers' shared Nodes,
    /// the single calls one borrowed Node, and neither is copied.
    async fn statuses<N: Borrow<Node>>(&self, nodes: &[N]) -> Vec<CloudResult<InstanceStatus>> {
        let keys: Vec<_> = nodes.iter().map(|n| self.key(n.borrow())).collect();
        let snap = match self.snapshot(&keys).await {
            Ok(s) => s,
            Err(e) => return nodes.iter().map(|_| Err(e.clone())).collect(),
        };
        keys.into_iter()
            .map(|key| {
                let server = self.lookup(&snap, &key?)?;
                Ok(match server {
                    None => InstanceStatus {
                        exists: false,
                        shutdown: false,
                    },
                    Some(s) => InstanceStatus {
                        exists: true,
                        shutdown: s.status == STATUS_SHUTOFF,
                    },
                })
            })
            .collect()
    }

    async fn metadata<N: Borrow<Node>>(
        &self,
        nodes: &[N],
    ) -> Vec<CloudResult<Option<InstanceMetadata>>> {
        let keys: Vec<_> = nodes.iter().map(|n| self.key(n.borrow())).collect();
        let snap = match self.snapshot(&keys).await {
            Ok(s) => s,
            Err(e) => return nodes.iter().map(|_| Err(e.clone())).collect(),
        };
        let found: Vec<CloudResult<Option<&Server>>> = keys
            .iter()
            .map(|k| match k {
                Ok(k) => self.lookup(&snap, k),
                Err(e) => Err(e.clone()),
            })
            .collect();
        let ids: Vec<&str> = found
            .iter()
            .filter_map(|f| f.as_ref().ok().copied().flatten())
            .map(|s| s.id.as_str())
            .collect();
        let ports = match self.ports(&ids).await {
            Ok(p) => p,
            Err(e) => return nodes.iter().map(|_| Err(e.clone())).collect(),
        };
        found
            .into_iter()
            .map(|f| match f? {
                None => Err(CloudError::InstanceNotFound),
                Some(server) => self.instance_metadata_of(server, &ports).map(Some),
            })
            .collect()
    }

    /// Ports by server id, or none when the catalog has no network service.
    async fn ports(&self, ids: &[&str]) -> CloudResult<BTreeMap<String, Vec<nova::Port>>> {
        let mut out: BTreeMap<String, Vec<nova::Port>> = BTreeMap::new();
        if ids.is_empty() || !self.keystone().has_service("network").await? {
            return Ok(out);
        }
        for p in nova::ports_of(self.keystone(), ids).await? {
            out.entry(p.device_id.clone()).or_default().push(p);
        }
        Ok(out)
    }

    fn instance_metadata_of(
        &self,
        s: &Server,
        ports: &BTreeMap<String, Vec<nova::Port>>,
    ) -> CloudResult<InstanceMetadata> {
        if s.status == STATUS_UNKNOWN {
            return Err(CloudError::Transient(format!(
                "server {} is in a cell Nova cannot reach; its metadata is unknown",
                s.id
            )));
        }
        let instance_type = match s.flavor.original_name.as_deref() {
            Some(f) if is_label_value(f) => f.to_string(),
            other => {
                return Err(CloudError::Permanent(format!(
                    "server {}: flavor name {other:?} is not a valid label value",
                    s.id
                )));
            }
        };
        let cfg = self.config();
        let mine: Vec<&nova::Port> = ports
            .get(&s.id)
            .map(|v| v.iter().collect())
            .unwrap_or_default();
        Ok(InstanceMetadata {
            provider_id: provider_id(&s.id, &cfg.global.region, self.regional_provider_id()),
            instance_type,
            node_addresses: crate::addresses::node_addresses(s, &mine, &cfg.networking),
            zone: sanitize_label(&s.availability_zone),
            region: cfg.global.region.clone(),
            additional_labels: BTreeMap::new(),
        })
    }
}

/// A Kubernetes label value: at most 63 of `[A-Za-z0-9._-]`, alphanumeric at both ends.
fn is_label_value(v: &str) -> bool {
    v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        && v.chars().next().is_none_or(|c| c.is_ascii_alphanumeric())
        && v.chars().last().is_none_or(|c| c.is_ascii_alphanumeric())
}

/// Upstream's `SanitizeLabel`: invalid characters become `-`, the ends are trimmed to
/// alphanumerics, the result is cut to 63 characters.
fn sanitize_label(v: &str) -> String {
    let s: String = v
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect();
    let s: String = s.chars().take(63).collect();
    s.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

#[async_trait]
impl Instances for OpenStackCloud {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        let mut r = self.statuses(std::slice::from_ref(node)).await;
        r.pop().expect("one result per node").map(|s| s.exists)
    }

    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        let mut r = self.statuses(std::slice::from_ref(node)).await;
        match r.pop().expect("one result per node")? {
            s if s.exists => Ok(s.shutdown),
            _ => Err(CloudError::InstanceNotFound),
        }
    }

    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        let mut r = self.metadata(std::slice::from_ref(node)).await;
        r.pop().expect("one result per node")
    }

    async fn instances_metadata(
        &self,
        nodes: &[Arc<Node>],
    ) -> Vec<CloudResult<Option<InstanceMetadata>>> {
        self.metadata(nodes).await
    }

    async fn instances_status(&self, nodes: &[Arc<Node>]) -> Vec<CloudResult<InstanceStatus>> {
        self.statuses(nodes).await
    }

    fn native_batching(&self) -> bool {
        true
    }

    fn max_batch_size(&self) -> usize {
        1000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids_as_upstream() {
        assert_eq!(server_id("openstack:///abc", "R").unwrap(), "abc");
        assert_eq!(server_id("openstack://R/abc", "R").unwrap(), "abc");
        assert_eq!(server_id("/abc", "R").unwrap(), "abc", "k/k #85731 form");
        assert!(server_id("openstack://Other/abc", "R").is_err());
        assert!(server_id("aws:///us-east-1a/i-1", "R").is_err());
        assert!(server_id("openstack:///", "R").is_err());
        assert_eq!(provider_id("abc", "R", false), "openstack:///abc");
        assert_eq!(provider_id("abc", "R", true), "openstack://R/abc");
    }

    #[test]
    fn labels() {
        assert!(is_label_value("m1.small"));
        assert!(!is_label_value("m1 small"));
        assert_eq!(sanitize_label("nova zone/1"), "nova-zone-1");
        assert_eq!(sanitize_label("-az-"), "az");
    }
}
