//! Instances: the inventory answers what a machine is; its BMC answers whether it is on.

use std::sync::Arc;

use async_trait::async_trait;
use ccm_cloud::{
    CloudError, CloudResult, InstanceMetadata, InstanceStatus, Instances, Node, node_name,
    node_provider_id,
};
use futures::future::join_all;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

use crate::config::{BmcConfig, Machine, ProviderIdFrom};
use crate::provider::{MetalCloud, PROVIDER_NAME, provider_id};
use crate::redfish::{Lookup, Power, System};

impl MetalCloud {
    /// The machine name for `node`: from `metal://<machine>` if set (and providerIDs are
    /// names), else the node name. A providerID of another provider is an error, not a
    /// lookup by name.
    fn machine_name(&self, node: &Node) -> CloudResult<String> {
        let pid = node_provider_id(node);
        if pid.is_empty() {
            return Ok(node_name(node).to_string());
        }
        match pid.strip_prefix(&format!("{PROVIDER_NAME}://")) {
            Some(_) if self.config().provider_id_from != ProviderIdFrom::Name => {
                Ok(node_name(node).to_string())
            }
            Some(name) if !name.is_empty() => Ok(name.to_string()),
            _ => Err(CloudError::Permanent(format!(
                "node {} has providerID {pid:?}, not metal://<machine>",
                node_name(node)
            ))),
        }
    }

    fn lookup(&self, node: &Node) -> CloudResult<Option<(String, Machine)>> {
        let name = self.machine_name(node)?;
        let config = self.config();
        Ok(config.machine(&name).cloned().map(|m| (name, m)))
    }

    async fn status(&self, node: &Node) -> CloudResult<InstanceStatus> {
        let Some((name, machine)) = self.lookup(node)? else {
            return Ok(InstanceStatus {
                exists: false,
                shutdown: false,
            });
        };
        let Some(bmc) = &machine.bmc else {
            return Ok(InstanceStatus {
                exists: true,
                shutdown: false,
            });
        };
        match self.system(&name, bmc).await {
            Ok(Lookup::Found(system)) => {
                // A swapped machine under the same name is not silently the Node's.
                if let Some(id) = self.identity_of(&system) {
                    self.check_same_machine(node, &name, &id).await?;
                }
                Ok(InstanceStatus {
                    exists: true,
                    shutdown: system.power == Power::Off,
                })
            }
            Ok(Lookup::Gone { offered }) => {
                tracing::warn!(machine = %name, ?offered, "the BMC no longer lists the machine's System: instance gone");
                Ok(InstanceStatus {
                    exists: false,
                    shutdown: false,
                })
            }
            Err(e) => Err(e),
        }
    }

    /// The machine's System, with its credentials. Never "gone" on a failure: a Node must
    /// not be deleted because a BMC did not answer.
    async fn system(&self, name: &str, bmc: &BmcConfig) -> CloudResult<Lookup> {
        let credentials = match &bmc.credentials_secret {
            Some(secret) => Some(
                self.bmc_credentials(secret, bmc.username.as_deref())
                    .await?,
            ),
            None => None,
        };
        self.inner
            .redfish
            .lookup(bmc, name, credentials)
            .await
            .map_err(|e| e.into_cloud_error(name))
    }

    /// The System's identity the config makes providerIDs of (`None`: the name).
    fn identity_of(&self, system: &System) -> Option<String> {
        match self.config().provider_id_from {
            ProviderIdFrom::Name => None,
            ProviderIdFrom::Uuid => Some(system.uuid.clone().unwrap_or_default().to_lowercase()),
            ProviderIdFrom::Serial => Some(system.serial.clone().unwrap_or_default()),
        }
    }

    /// The providerID of machine `name`: its name, or its System's UUID / serial.
    async fn machine_provider_id(&self, name: &str, m: &Machine) -> CloudResult<String> {
        let from = self.config().provider_id_from;
        let Some(bmc) = m.bmc.as_ref().filter(|_| from != ProviderIdFrom::Name) else {
            return Ok(provider_id(name));
        };
        match self.system(name, bmc).await? {
            Lookup::Found(system) => match self.identity_of(&system) {
                Some(id) if !id.is_empty() => Ok(provider_id(&id)),
                _ => Err(CloudError::Permanent(format!(
                    "machine {name}: the BMC reports no {from:?} for System {}; set [bmc] provider_id = \"name\"",
                    system.path
                ))),
            },
            Lookup::Gone { .. } => Err(CloudError::InstanceNotFound),
        }
    }
}

impl MetalCloud {
    /// A Node already bound to another machine than the one its name now maps to is an error
    /// (a swapped or re-cabled machine), never a silent re-bind; one Warning Event on the Node
    /// per new identity.
    async fn check_same_machine(&self, node: &Node, name: &str, id: &str) -> CloudResult<()> {
        let have = node_provider_id(node);
        let want = provider_id(id);
        if have.is_empty() || have == want {
            return Ok(());
        }
        let node_name = node_name(node).to_string();
        let message = format!(
            "node {node_name} is {have} but machine {name}'s System is now {want}: a different machine answers under this name; delete the Node (or fix the inventory) to bind it to the new machine"
        );
        let first = self
            .inner
            .swaps_reported
            .lock()
            .insert((node_name.clone(), want));
        if first
            && let Err(e) = self
                .warn(
                    "default",
                    "Node",
                    &node_name,
                    "MachineIdentityChanged",
                    message.clone(),
                )
                .await
        {
            tracing::warn!(node = %node_name, error = %e, "metal: MachineIdentityChanged Event not written");
        }
        Err(CloudError::Permanent(message))
    }
}

/// Two Nodes claiming one machine: both get an error naming the other.
fn refuse_duplicates(
    nodes: &[Arc<Node>],
    ids: &mut [CloudResult<Option<InstanceMetadata>>],
    taken: &std::collections::BTreeMap<String, String>,
) {
    let pid = |r: &CloudResult<Option<InstanceMetadata>>| {
        r.as_ref()
            .ok()
            .and_then(|m| m.as_ref())
            .map(|m| m.provider_id.clone())
    };
    let claims: Vec<Option<String>> = ids.iter().map(pid).collect();
    for (i, claim) in claims.iter().enumerate() {
        let Some(claim) = claim else { continue };
        let me = node_name(&nodes[i]);
        let other = claims
            .iter()
            .enumerate()
            .find(|(j, c)| *j != i && c.as_ref() == Some(claim))
            .map(|(j, _)| node_name(&nodes[j]).to_string())
            .or_else(|| taken.get(claim).filter(|n| n.as_str() != me).cloned());
        if let Some(other) = other {
            ids[i] = Err(CloudError::Permanent(format!(
                "nodes {me} and {other} both map to machine {claim}; neither is initialized until the inventory (or the Nodes) say which is which"
            )));
        }
    }
}

impl MetalCloud {
    /// providerID → Node name of the Nodes that have one, so a second Node cannot claim a
    /// machine (listed only when providerIDs name UUIDs or serials: names are unique by
    /// construction).
    async fn bound_provider_ids(&self) -> CloudResult<std::collections::BTreeMap<String, String>> {
        let mut out = std::collections::BTreeMap::new();
        if self.config().provider_id_from == ProviderIdFrom::Name {
            return Ok(out);
        }
        let client = self.client().ok_or_else(|| {
            CloudError::Transient("metal provider not initialized: cannot list Nodes".into())
        })?;
        let list = Api::<Node>::all(client)
            .list(&kube::api::ListParams::default())
            .await
            .map_err(|e| {
                CloudError::Transient(format!(
                    "listing Nodes to rule out two Nodes on one machine: {e}"
                ))
            })?;
        for n in list.items {
            let pid = node_provider_id(&n).to_string();
            if !pid.is_empty() {
                out.insert(pid, node_name(&n).to_string());
            }
        }
        Ok(out)
    }

    /// `(user, password)` from the Secret `namespace/name`. Failing to read it is an error,
    /// never "gone".
    async fn bmc_credentials(
        &self,
        secret: &str,
        default_user: Option<&str>,
    ) -> CloudResult<(String, String)> {
        let (ns, name) = secret.split_once('/').unwrap_or(("", secret));
        let client = self.client().ok_or_else(|| {
            CloudError::Transient("metal provider not initialized: cannot read BMC Secrets".into())
        })?;
        let s = Api::<Secret>::namespaced(client, ns)
            .get(name)
            .await
            .map_err(|e| CloudError::Transient(format!("reading BMC Secret {secret}: {e}")))?;
        let data = s.data.unwrap_or_default();
        let field = |k: &str| {
            data.get(k).map(|b| {
                String::from_utf8_lossy(&b.0)
                    .trim_end_matches(['\n', '\r'])
                    .to_string()
            })
        };
        let password = field("password").ok_or_else(|| {
            CloudError::Permanent(format!("BMC Secret {secret} has no \"password\" key"))
        })?;
        let user = field("username")
            .or_else(|| default_user.map(str::to_string))
            .ok_or_else(|| {
                CloudError::Permanent(format!(
                    "BMC Secret {secret} has no \"username\" key and the machine's bmc.username is unset"
                ))
            })?;
        Ok((user, password))
    }
}

#[async_trait]
impl Instances for MetalCloud {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        Ok(self.status(node).await?.exists)
    }

    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        Ok(self.status(node).await?.shutdown)
    }

    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        let Some((name, m)) = self.lookup(node)? else {
            return Err(CloudError::InstanceNotFound);
        };
        let pid = self.machine_provider_id(&name, &m).await?;
        if let Some(id) = pid.strip_prefix(&format!("{PROVIDER_NAME}://"))
            && self.config().provider_id_from != ProviderIdFrom::Name
        {
            self.check_same_machine(node, &name, id).await?;
        }
        Ok(Some(InstanceMetadata {
            provider_id: pid,
            instance_type: m.instance_type,
            node_addresses: m.addresses,
            zone: m.zone,
            region: m.region,
            additional_labels: m.labels,
        }))
    }

    /// All BMCs of the batch are asked at once; the shared bound in the Redfish client keeps
    /// the number in flight at `bmc.concurrency`.
    async fn instances_status(&self, nodes: &[Arc<Node>]) -> Vec<CloudResult<InstanceStatus>> {
        join_all(nodes.iter().map(|n| self.status(n))).await
    }

    async fn instances_metadata(
        &self,
        nodes: &[Arc<Node>],
    ) -> Vec<CloudResult<Option<InstanceMetadata>>> {
        let mut out = join_all(nodes.iter().map(|n| self.instance_metadata(n))).await;
        match self.bound_provider_ids().await {
            Ok(taken) => refuse_duplicates(nodes, &mut out, &taken),
            // Without the other Nodes' claims a duplicate cannot be ruled out: retry.
            Err(e) => out.iter_mut().for_each(|r| *r = Err(e.clone())),
        }
        out
    }

    /// The batch calls are the provider's own (BMC lookups at once, and the duplicate-machine
    /// check across the batch), so wrappers must call them rather than the single-Node ones.
    fn native_batching(&self) -> bool {
        true
    }

    fn max_batch_size(&self) -> usize {
        500
    }
}
