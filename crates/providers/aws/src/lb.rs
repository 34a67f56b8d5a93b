//! What Classic and Network LBs share: the VPC, subnets, the nodes' instances and security
//! groups, tags, and the [`LoadBalancer`] entry points that pick the LB kind.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_ec2::types::{Filter, IpPermission};
use ccm_cloud::k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus as Status};
use ccm_cloud::{
    CloudError, CloudResult, LoadBalancer, LoadBalancerStatus, Node, Service,
    default_load_balancer_name, node_name, node_provider_id,
};

use crate::annotations::{self, Kind, LbSpec};
use crate::cloud::AwsCloud;
use crate::providerid::ec2_instance_id;
use crate::routes::CLUSTER_TAG_PREFIX;

/// Tag with the Service's `namespace/name` (upstream `kubernetes.io/service-name`).
pub const SERVICE_NAME_TAG: &str = "kubernetes.io/service-name";

/// The tags every resource created for a Service carries.
pub(crate) fn resource_tags(
    cloud: &AwsCloud,
    cluster: &str,
    spec: &LbSpec,
) -> BTreeMap<String, String> {
    let mut tags = spec.extra_tags.clone();
    tags.insert(
        format!("{CLUSTER_TAG_PREFIX}{}", cloud.cluster_id(cluster)),
        "owned".into(),
    );
    tags.insert(SERVICE_NAME_TAG.into(), spec.service_name.clone());
    tags
}

/// The error for a Service whose scheme annotation no longer matches its load balancer's:
/// AWS cannot change the scheme of an existing one (upstream leaves it as it is, silently).
pub(crate) fn scheme_unchangeable(internal: bool) -> CloudError {
    let now = if internal {
        "internal"
    } else {
        "internet-facing"
    };
    CloudError::Permanent(format!(
        "annotation {} (or {}): the load balancer is {now} and AWS cannot change the scheme of an existing one; it stays {now} (delete and re-create the Service to change it)",
        annotations::INTERNAL,
        annotations::SCHEME
    ))
}

pub(crate) fn status(dns: &str) -> LoadBalancerStatus {
    Status {
        ingress: Some(vec![LoadBalancerIngress {
            hostname: Some(dns.to_string()),
            ..Default::default()
        }]),
    }
}

impl AwsCloud {
    /// Instance ids of the Nodes, from their providerIDs, else from memory or a lookup by name.
    /// Fargate and hybrid Nodes have no instance to put behind a load balancer: they are left
    /// out, so that one of them never fails the other Nodes' backends.
    pub(crate) async fn node_instance_ids(
        &self,
        nodes: &[Arc<Node>],
    ) -> CloudResult<BTreeSet<String>> {
        let mut ids = BTreeSet::new();
        let mut names = Vec::new();
        for n in nodes {
            let pid = node_provider_id(n);
            if !pid.is_empty() {
                ids.extend(ec2_instance_id(pid)?.map(str::to_string));
            } else if let Some(id) = self.inner.memory.lock().node_to_instance.get(node_name(n)) {
                ids.insert(id.clone());
            } else {
                names.push(node_name(n).to_string());
            }
        }
        if !names.is_empty() {
            for inst in self.instances_by_name(names).await?.values() {
                ids.extend(inst.instance_id().map(String::from));
            }
        }
        Ok(ids)
    }

    /// In every security group `filter` finds, revokes the inbound permissions `pick` makes of
    /// each of the group's permissions (empty: keep it) — one call per group that has any.
    pub(crate) async fn revoke_matching(
        &self,
        filter: Filter,
        pick: impl Fn(&IpPermission) -> Vec<IpPermission>,
    ) -> CloudResult<()> {
        let ec2 = self.clients().await?.ec2.clone();
        let groups = self
            .call(
                "DescribeSecurityGroups",
                ec2.describe_security_groups().filters(filter).send(),
            )
            .await?;
        for g in groups.security_groups() {
            let Some(id) = g.group_id() else { continue };
            let perms: Vec<IpPermission> = g.ip_permissions().iter().flat_map(&pick).collect();
            if perms.is_empty() {
                continue;
            }
            self.call(
                "RevokeSecurityGroupIngress",
                ec2.revoke_security_group_ingress()
                    .group_id(id)
                    .set_ip_permissions(Some(perms))
                    .send(),
            )
            .await?;
        }
        Ok(())
    }

    /// The VPC: the cloud-config's, else the one the cluster's known instances are in.
    pub(crate) async fn vpc(&self, instance_ids: &BTreeSet<String>) -> CloudResult<String> {
        if let Some(v) = &self.inner.cfg.vpc {
            return Ok(v.clone());
        }
        let known = |mem: &crate::cloud::Memory| {
            instance_ids
                .iter()
                .filter_map(|id| mem.instances.get(id))
                .map(|k| k.vpc.clone())
                .find(|v| !v.is_empty())
        };
        if let Some(v) = known(&self.inner.memory.lock()) {
            return Ok(v);
        }
        let ids: Vec<String> = instance_ids.iter().cloned().collect();
        self.instances_by_id(ids).await?;
        known(&self.inner.memory.lock()).ok_or_else(|| {
            CloudError::Permanent(
                "cannot tell the cluster's VPC: no node instance is known; set vpc in --cloud-config".into(),
            )
        })
    }
}

/// The nodes the Service's LB sends traffic to: those carrying every label of the
/// target-node-labels annotation (an empty value matches any), as upstream's `filterTargetNodes`.
fn target_nodes(service: &Service, nodes: &[Arc<Node>]) -> Vec<Arc<Node>> {
    let want = annotations::target_node_labels(service);
    nodes
        .iter()
        .filter(|n| {
            let labels = n.metadata.labels.as_ref();
            want.iter().all(|(k, v)| {
                labels
                    .and_then(|l| l.get(k))
                    .is_some_and(|have| v.is_empty() || have == v)
            })
        })
        .cloned()
        .collect()
}

/// Whether a parse error is the Service's fault (a refused or malformed annotation or field),
/// rather than "not yet" (a nodePort to come) or "not ours" (another controller's LB type).
fn refused(e: &CloudError) -> bool {
    matches!(e, CloudError::Permanent(_))
}

impl AwsCloud {
    /// Upstream refuses to change the LB type of a Service that has its load balancer: the
    /// other kind would be created beside it. Asked of AWS only once the Service has an ingress.
    async fn type_unchanged(&self, service: &Service, name: &str, kind: Kind) -> CloudResult<()> {
        let has_ingress = service
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref())
            .is_some_and(|i| !i.is_empty());
        if !has_ingress {
            return Ok(());
        }
        let other = match kind {
            Kind::Network => self.clb_dns(name).await?.is_some(),
            Kind::Classic => self.nlb_find(name).await?.is_some(),
        };
        if other {
            return Err(CloudError::Permanent(format!(
                "annotation {}: cannot update the load balancer type after creation; delete and re-create the Service",
                annotations::TYPE
            )));
        }
        Ok(())
    }

    /// The backends of whichever LB of this name exists follow `nodes`; nothing else changes.
    async fn backends_only(
        &self,
        cluster: &str,
        name: &str,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        if self.clb_dns(name).await?.is_some() {
            self.clb_update(cluster, name, None, nodes).await?;
        }
        if self.nlb_find(name).await?.is_some() {
            self.nlb_update(cluster, name, None, nodes).await?;
        }
        Ok(())
    }
}

#[async_trait]
impl LoadBalancer for AwsCloud {
    async fn get_load_balancer(
        &self,
        _cluster: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        let name = default_load_balancer_name(service);
        let dns = match annotations::kind_of(service) {
            Kind::Classic => self.clb_dns(&name).await?,
            Kind::Network => self.nlb_find(&name).await?.map(|lb| lb.dns),
        };
        Ok(dns.map(|d| status(&d)))
    }

    async fn ensure_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        let name = default_load_balancer_name(service);
        let nodes = &target_nodes(service, nodes);
        let spec = match annotations::parse(service) {
            Ok(s) => s,
            Err(e) if !refused(&e) => return Err(e),
            Err(e) => {
                // The Warning Event says what is wrong; the LB, if it exists, keeps serving
                // the nodes there are.
                if let Err(b) = self.backends_only(cluster, &name, nodes).await {
                    tracing::warn!(lb = %name, error = %b, "backends of a load balancer with refused annotations");
                }
                return Err(e);
            }
        };
        self.type_unchanged(service, &name, spec.kind).await?;
        let ids = self.node_instance_ids(nodes).await?;
        let dns = match spec.kind {
            Kind::Classic => self.clb_ensure(cluster, &name, &spec, nodes).await?,
            Kind::Network => self.nlb_ensure(cluster, &name, &spec, nodes).await?,
        };
        self.inner.memory.lock().lb_backends.insert(name, ids);
        Ok(status(&dns))
    }

    async fn update_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        let nodes = &target_nodes(service, nodes);
        // A refused or invalid annotation never stops the backends following the nodes:
        // the ensure reports it (a Warning Event) and retries.
        let spec = match annotations::parse(service) {
            Ok(s) => Some(s),
            Err(e) if !refused(&e) => return Err(e),
            Err(e) => {
                tracing::warn!(service = ?service.metadata.name, error = %e, "updating only the backends");
                None
            }
        };
        let name = default_load_balancer_name(service);
        // The controller updates when its node set changes, which includes a new Node getting
        // its providerID: the same instances as the update before. Those cost nothing.
        let ids = self.node_instance_ids(nodes).await?;
        if self.inner.memory.lock().lb_backends.get(&name) == Some(&ids) {
            return Ok(());
        }
        match spec.as_ref().map(|s| s.kind) {
            Some(Kind::Classic) => {
                self.clb_update(cluster, &name, spec.as_ref(), nodes)
                    .await?
            }
            Some(Kind::Network) => {
                self.nlb_update(cluster, &name, spec.as_ref(), nodes)
                    .await?
            }
            None => self.backends_only(cluster, &name, nodes).await?,
        }
        self.inner.memory.lock().lb_backends.insert(name, ids);
        Ok(())
    }

    async fn ensure_load_balancer_deleted(
        &self,
        cluster: &str,
        service: &Service,
    ) -> CloudResult<()> {
        let name = default_load_balancer_name(service);
        self.inner.memory.lock().lb_backends.remove(&name);
        // Both kinds: the annotation may have changed since the LB was made. The NLB first:
        // its managed group has the Classic ELB's group name and goes only after the NLB.
        self.nlb_delete(cluster, &name).await?;
        self.clb_delete(cluster, &name).await
    }
}
