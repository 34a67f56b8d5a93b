//! Pod-CIDR routes in the cluster's VPC route tables: the tables tagged
//! `kubernetes.io/cluster/<cluster id>` (owned or shared) or with the legacy
//! `KubernetesCluster=<cluster id>`, or those named in the cloud-config. Routes target
//! instances; upstream names them `<cluster>-<cidr>`. Creating a route turns off the target's
//! source/dest check (once per instance: the provider remembers it). Which Node a route's
//! instance is comes from memory, else — after a restart — from one listing of the Nodes
//! (providerIDs and instance-id names), else from the instance's private DNS name.

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use aws_sdk_ec2::types::{AttributeBooleanValue, Filter, RouteState, RouteTable};
use ccm_cloud::{CloudError, CloudResult, Route, Routes};

use crate::cloud::AwsCloud;
use crate::error;
use crate::identity::{ClusterId, LEGACY_CLUSTER_TAG};
use crate::providerid::{NodeKind, classify, instance_id_name};

/// The cluster ownership tag key prefix (upstream `TagNameKubernetesClusterPrefix`).
pub const CLUSTER_TAG_PREFIX: &str = crate::identity::CLUSTER_TAG_PREFIX;

/// One destination in one table: its target instance, or a blackhole.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Instance(String),
    Blackhole,
}

fn targets(table: &RouteTable) -> BTreeMap<String, Target> {
    let mut out = BTreeMap::new();
    for r in table.routes() {
        let Some(cidr) = r
            .destination_cidr_block()
            .or(r.destination_ipv6_cidr_block())
        else {
            continue;
        };
        if r.state() == Some(&RouteState::Blackhole) {
            out.insert(cidr.to_string(), Target::Blackhole);
        } else if let Some(id) = r.instance_id() {
            out.insert(cidr.to_string(), Target::Instance(id.to_string()));
        }
    }
    out
}

/// Destinations every table agrees on. A destination missing or different in one table is left
/// out, so the route controller creates it again, and create replaces it everywhere.
fn agreed(tables: &[RouteTable]) -> BTreeMap<String, Target> {
    let mut per_table = tables.iter().map(targets);
    let Some(mut out) = per_table.next() else {
        return BTreeMap::new();
    };
    for t in per_table {
        out.retain(|cidr, target| match t.get(cidr) {
            Some(other) if other == target => true,
            Some(Target::Blackhole) => {
                *target = Target::Blackhole;
                true
            }
            _ => false,
        });
    }
    out
}

impl AwsCloud {
    async fn describe_tables(&self, cluster: &str) -> CloudResult<Vec<RouteTable>> {
        let ec2 = self.clients().await?.ec2.clone();
        let cfg = &self.inner.cfg;
        let id = self.cluster_id(cluster);
        let owner = self.cluster().cloned().unwrap_or_else(|| ClusterId {
            id: id.to_string(),
            legacy: false,
        });
        // Either tag marks the cluster's tables: one call for both keys, the legacy tag's value
        // checked here.
        let filter = if cfg.route_table_id.is_empty() {
            Filter::builder()
                .name("tag-key")
                .values(format!("{CLUSTER_TAG_PREFIX}{id}"))
                .values(LEGACY_CLUSTER_TAG)
                .build()
        } else {
            Filter::builder()
                .name("route-table-id")
                .set_values(Some(cfg.route_table_id.clone()))
                .build()
        };
        let mut tables = Vec::new();
        let mut token = None;
        loop {
            let page = self
                .call(
                    "DescribeRouteTables",
                    ec2.describe_route_tables()
                        .filters(filter.clone())
                        .set_next_token(token)
                        .send(),
                )
                .await?;
            tables.extend(
                page.route_tables()
                    .iter()
                    .filter(|t| !cfg.route_table_id.is_empty() || owner.owns_table(t.tags()))
                    .cloned(),
            );
            match page.next_token() {
                Some(t) if !t.is_empty() => token = Some(t.to_string()),
                _ => break,
            }
        }
        if tables.is_empty() {
            return Err(CloudError::Permanent(format!(
                "no route table tagged {CLUSTER_TAG_PREFIX}{id} (owned or shared) or {LEGACY_CLUSTER_TAG}={id}: tag the cluster's route table, or set RouteTableID in --cloud-config"
            )));
        }
        let ids = tables
            .iter()
            .filter_map(|t| t.route_table_id().map(String::from))
            .collect();
        self.inner
            .memory
            .lock()
            .route_tables
            .insert(id.to_string(), ids);
        Ok(tables)
    }

    async fn table_ids(&self, cluster: &str) -> CloudResult<Vec<String>> {
        let id = self.cluster_id(cluster);
        if let Some(ids) = self.inner.memory.lock().route_tables.get(id) {
            return Ok(ids.clone());
        }
        self.describe_tables(cluster).await?;
        Ok(self
            .inner
            .memory
            .lock()
            .route_tables
            .get(id)
            .cloned()
            .unwrap_or_default())
    }

    /// Node names of instances, from memory, else (once, after a restart) from the Nodes'
    /// providerIDs and instance-id names, else from one `DescribeInstances` (private DNS name).
    /// Instances that are gone map to nothing.
    async fn node_names(&self, ids: Vec<String>) -> CloudResult<HashMap<String, String>> {
        let any_unknown = {
            let mem = self.inner.memory.lock();
            ids.iter().any(|id| !mem.instance_to_node.contains_key(id))
        };
        if any_unknown {
            self.learn_from_nodes().await;
        }
        let unknown: Vec<String> = {
            let mem = self.inner.memory.lock();
            ids.iter()
                .filter(|id| !mem.instance_to_node.contains_key(*id))
                .cloned()
                .collect()
        };
        let live = if unknown.is_empty() {
            HashMap::new()
        } else {
            self.instances_by_id(unknown).await?
        };
        let mut mem = self.inner.memory.lock();
        for (id, inst) in &live {
            let terminated = inst.state().and_then(|s| s.name())
                == Some(&aws_sdk_ec2::types::InstanceStateName::Terminated);
            if let Some(dns) = inst.private_dns_name().filter(|_| !terminated) {
                mem.instance_to_node.insert(id.clone(), dns.to_string());
            }
        }
        Ok(ids
            .into_iter()
            .filter_map(|id| mem.instance_to_node.get(&id).map(|n| (id, n.clone())))
            .collect())
    }

    /// Maps instances to Nodes from one listing of the Nodes, the first time a route's
    /// instance is unknown (a restarted CCM): by providerID, and by instance-id Node names.
    /// Fargate and hybrid Nodes are remembered as such. Without a Kubernetes client (a provider
    /// never initialized) or when the listing fails, the private-DNS fallback remains.
    async fn learn_from_nodes(&self) {
        let Some(client) = self.inner.kube.get().cloned() else {
            return;
        };
        if self
            .inner
            .nodes_listed
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        let api = kube::Api::<ccm_cloud::Node>::all(client);
        let list = match api.list(&kube::api::ListParams::default()).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "listing Nodes to map route targets failed; using private DNS names");
                self.inner
                    .nodes_listed
                    .store(false, std::sync::atomic::Ordering::SeqCst);
                return;
            }
        };
        let mut mem = self.inner.memory.lock();
        for node in &list.items {
            let name = ccm_cloud::node_name(node).to_string();
            let pid = ccm_cloud::node_provider_id(node);
            let id = match classify(pid) {
                _ if pid.is_empty() => instance_id_name(&name).map(String::from),
                Ok(NodeKind::Ec2(id)) => Some(id.to_string()),
                Ok(_) => {
                    mem.not_ec2.insert(name.clone());
                    None
                }
                Err(_) => None,
            };
            if let Some(id) = id {
                mem.node_to_instance.insert(name.clone(), id.clone());
                mem.instance_to_node.insert(id, name);
            }
        }
    }

    /// The instance a route to `node` targets: from memory, the Node's instance-id name, or the
    /// one live instance of the cluster with that private DNS name. `Ok(None)`: a Fargate or
    /// hybrid Node, which has no instance to route to.
    async fn instance_for_node(&self, node: &str) -> CloudResult<Option<String>> {
        {
            let mem = self.inner.memory.lock();
            if let Some(id) = mem.node_to_instance.get(node) {
                return Ok(Some(id.clone()));
            }
            if mem.not_ec2.contains(node) {
                return Ok(None);
            }
        }
        if let Some(id) = instance_id_name(node) {
            return Ok(Some(id.to_string()));
        }
        // Through the shared batcher: a burst's route creations share the lookups (and the VPC
        // listing) of the cloud-node and service controllers.
        self.instance_by_name(node)
            .await?
            .and_then(|i| i.instance_id().map(String::from))
            .map(Some)
            .ok_or_else(|| {
                CloudError::Permanent(format!(
                    "no live EC2 instance of the cluster for node {node:?} (looked up by private DNS name)"
                ))
            })
    }

    async fn disable_source_dest_check(&self, instance: &str) -> CloudResult<()> {
        let off = self
            .inner
            .memory
            .lock()
            .instances
            .get(instance)
            .and_then(|k| k.source_dest_check)
            == Some(false);
        if off {
            return Ok(());
        }
        let ec2 = self.clients().await?.ec2.clone();
        self.call(
            "ModifyInstanceAttribute",
            ec2.modify_instance_attribute()
                .instance_id(instance)
                .source_dest_check(AttributeBooleanValue::builder().value(false).build())
                .send(),
        )
        .await?;
        let mut mem = self.inner.memory.lock();
        mem.instances
            .entry(instance.to_string())
            .or_default()
            .source_dest_check = Some(false);
        Ok(())
    }

    async fn put_route(&self, table: &str, cidr: &str, instance: &str) -> CloudResult<()> {
        let ec2 = self.clients().await?.ec2.clone();
        let v6 = cidr.contains(':');
        let mut create = ec2
            .create_route()
            .route_table_id(table)
            .instance_id(instance);
        create = if v6 {
            create.destination_ipv6_cidr_block(cidr)
        } else {
            create.destination_cidr_block(cidr)
        };
        match self.call_raw("CreateRoute", create.send()).await {
            Ok(_) => Ok(()),
            Err(e) if error::code(&e) == Some("RouteAlreadyExists") => {
                let mut replace = ec2
                    .replace_route()
                    .route_table_id(table)
                    .instance_id(instance);
                replace = if v6 {
                    replace.destination_ipv6_cidr_block(cidr)
                } else {
                    replace.destination_cidr_block(cidr)
                };
                self.call("ReplaceRoute", replace.send()).await.map(|_| ())
            }
            Err(e) => Err(error::map("CreateRoute", e)),
        }
    }
}

#[async_trait]
impl Routes for AwsCloud {
    async fn list_routes(&self, cluster: &str) -> CloudResult<Vec<Route>> {
        let tables = self.describe_tables(cluster).await?;
        let agreed = agreed(&tables);
        let ids: Vec<String> = agreed
            .values()
            .filter_map(|t| match t {
                Target::Instance(id) => Some(id.clone()),
                Target::Blackhole => None,
            })
            .collect();
        let names = self.node_names(ids).await?;
        Ok(agreed
            .into_iter()
            .map(|(cidr, target)| {
                let node = match &target {
                    Target::Instance(id) => names.get(id).cloned(),
                    Target::Blackhole => None,
                };
                Route {
                    name: format!("{cluster}-{cidr}"),
                    blackhole: node.is_none(),
                    target_node: node.unwrap_or_default(),
                    destination_cidr: cidr,
                    ..Default::default()
                }
            })
            .collect())
    }

    async fn create_route(
        &self,
        cluster: &str,
        _name_hint: &str,
        route: &Route,
    ) -> CloudResult<()> {
        let Some(instance) = self.instance_for_node(&route.target_node).await? else {
            tracing::info!(node = %route.target_node, cidr = %route.destination_cidr, "Fargate or hybrid node: no EC2 instance to route to; skipped");
            return Ok(());
        };
        self.disable_source_dest_check(&instance).await?;
        for table in self.table_ids(cluster).await? {
            self.put_route(&table, &route.destination_cidr, &instance)
                .await?;
        }
        Ok(())
    }

    async fn delete_route(&self, cluster: &str, route: &Route) -> CloudResult<()> {
        let ec2 = self.clients().await?.ec2.clone();
        let cidr = route.destination_cidr.as_str();
        for table in self.table_ids(cluster).await? {
            let mut req = ec2.delete_route().route_table_id(&table);
            req = if cidr.contains(':') {
                req.destination_ipv6_cidr_block(cidr)
            } else {
                req.destination_cidr_block(cidr)
            };
            match self.call_raw("DeleteRoute", req.send()).await {
                Ok(_) => {}
                Err(e) if error::code(&e) == Some("InvalidRoute.NotFound") => {}
                Err(e) => return Err(error::map("DeleteRoute", e)),
            }
        }
        Ok(())
    }
}
