//! Instances: the inventory answers what a machine is; its BMC answers whether it is on.

use async_trait::async_trait;
use ccm_cloud::{
    CloudError, CloudResult, InstanceMetadata, InstanceStatus, Instances, Node, node_name,
    node_provider_id,
};
use futures::future::join_all;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

use crate::config::Machine;
use crate::provider::{MetalCloud, PROVIDER_NAME, provider_id};
use crate::redfish::{Lookup, Power};

impl MetalCloud {
    /// The machine name for `node`: from `metal://<machine>` if set, else the node name. A
    /// providerID of another provider is an error, not a lookup by name.
    fn machine_name(node: &Node) -> CloudResult<String> {
        let pid = node_provider_id(node);
        if pid.is_empty() {
            return Ok(node_name(node).to_string());
        }
        match pid.strip_prefix(&format!("{PROVIDER_NAME}://")) {
            Some(name) if !name.is_empty() => Ok(name.to_string()),
            _ => Err(CloudError::Permanent(format!(
                "node {} has providerID {pid:?}, not metal://<machine>",
                node_name(node)
            ))),
        }
    }

    fn lookup(&self, node: &Node) -> CloudResult<Option<(String, Machine)>> {
        let name = Self::machine_name(node)?;
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
        let credentials = match &bmc.credentials_secret {
            Some(secret) => Some(
                self.bmc_credentials(secret, bmc.username.as_deref())
                    .await?,
            ),
            None => None,
        };
        match self.inner.redfish.lookup(bmc, &name, credentials).await {
            Ok(Lookup::Found(system)) => Ok(InstanceStatus {
                exists: true,
                shutdown: system.power == Power::Off,
            }),
            Ok(Lookup::Gone { offered }) => {
                tracing::warn!(machine = %name, ?offered, "the BMC no longer lists the machine's System: instance gone");
                Ok(InstanceStatus {
                    exists: false,
                    shutdown: false,
                })
            }
            // Never "gone": a Node must not be deleted because a BMC did not answer.
            Err(e) => Err(CloudError::Transient(format!("machine {name}: {e}"))),
        }
    }
}

impl MetalCloud {
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
        Ok(Some(InstanceMetadata {
            provider_id: provider_id(&name),
            instance_type: m.instance_type,
            node_addresses: m.addresses,
            zone: m.zone,
            region: m.region,
            additional_labels: m.labels,
        }))
    }

    /// All BMCs of the batch are asked at once; the shared bound in the Redfish client keeps
    /// the number in flight at `bmc.concurrency`.
    async fn instances_status(&self, nodes: &[Node]) -> Vec<CloudResult<InstanceStatus>> {
        join_all(nodes.iter().map(|n| self.status(n))).await
    }

    async fn instances_metadata(
        &self,
        nodes: &[Node],
    ) -> Vec<CloudResult<Option<InstanceMetadata>>> {
        join_all(nodes.iter().map(|n| self.instance_metadata(n))).await
    }

    fn max_batch_size(&self) -> usize {
        500
    }
}
