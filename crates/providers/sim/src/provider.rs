//! [`SimCloud`] as a [`CloudProvider`]: instances (natively batched, with events), load
//! balancers and routes.

use std::sync::Arc;

use async_trait::async_trait;
use ccm_cloud::k8s_openapi::api::core::v1::LoadBalancerIngress;
use ccm_cloud::{
    CloudError, CloudProvider, CloudResult, InstanceEvent, InstanceMetadata, InstanceStatus,
    Instances, LoadBalancer, LoadBalancerStatus, Node, Route, Routes, Service, node_name,
    node_provider_id, op,
};
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;

use crate::cloud::{
    InstanceState, PROVIDER_NAME, SimCloud, SimInstance, SimLoadBalancer, SimPort, SimRoute, State,
    canonical_cidr, live_by_name,
};

/// Finds the instance behind a Node the InstancesV2 way: by providerID when the Node has one,
/// else by name. `Ok(None)`: no live instance (terminated ones are gone, as in EC2 after a
/// while).
fn lookup<'a>(st: &'a State, node: &Node) -> CloudResult<Option<&'a SimInstance>> {
    let pid = node_provider_id(node);
    if pid.is_empty() {
        return Ok(live_by_name(st, node_name(node)));
    }
    let id = parse_provider_id(pid)?;
    Ok(st
        .instances
        .get(id)
        .filter(|i| i.state != InstanceState::Terminated))
}

/// The instance id in `sim://<id>` (extra slashes tolerated, as upstream's AWS parser does).
pub fn parse_provider_id(provider_id: &str) -> CloudResult<&str> {
    provider_id
        .strip_prefix(PROVIDER_NAME)
        .and_then(|rest| rest.strip_prefix("://"))
        .map(|rest| rest.trim_start_matches('/'))
        .filter(|id| !id.is_empty() && !id.contains('/'))
        .ok_or_else(|| {
            CloudError::Permanent(format!(
                "providerID {provider_id:?} is not a sim instance (expected sim://<instance-id>)"
            ))
        })
}

fn metadata(inst: &SimInstance) -> InstanceMetadata {
    InstanceMetadata {
        provider_id: inst.provider_id(),
        instance_type: inst.instance_type.clone(),
        node_addresses: inst.addresses.iter().map(Into::into).collect(),
        zone: inst.zone.clone(),
        region: inst.region.clone(),
        additional_labels: inst.labels.clone(),
    }
}

fn status(inst: Option<&SimInstance>) -> InstanceStatus {
    InstanceStatus {
        exists: inst.is_some(),
        shutdown: inst.is_some_and(|i| i.state == InstanceState::Stopped),
    }
}

impl CloudProvider for SimCloud {
    fn provider_name(&self) -> &str {
        PROVIDER_NAME
    }

    fn instances(&self) -> Option<Arc<dyn Instances>> {
        Some(Arc::new(self.clone()))
    }

    fn load_balancer(&self) -> Option<Arc<dyn LoadBalancer>> {
        Some(Arc::new(self.clone()))
    }

    fn routes(&self) -> Option<Arc<dyn Routes>> {
        Some(Arc::new(self.clone()))
    }

    fn volumes(&self) -> Option<Arc<dyn ccm_cloud::Volumes>> {
        Some(Arc::new(self.clone()))
    }
}

impl SimCloud {
    pub(crate) fn check_batch(&self, n: usize) -> CloudResult<()> {
        if n > self.inner.max_batch_size {
            return Err(CloudError::Permanent(format!(
                "InvalidParameterValue: {n} instances in one call; at most {} allowed",
                self.inner.max_batch_size
            )));
        }
        Ok(())
    }
}

#[async_trait]
impl Instances for SimCloud {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        self.call(op::INSTANCE_EXISTS, |tx| {
            Ok(lookup(tx.state, node)?.is_some())
        })
        .await
    }

    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        self.call(op::INSTANCE_SHUTDOWN, |tx| {
            let inst = lookup(tx.state, node)?.ok_or(CloudError::InstanceNotFound)?;
            Ok(inst.state == InstanceState::Stopped)
        })
        .await
    }

    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        self.call(op::INSTANCE_METADATA, |tx| {
            let inst = lookup(tx.state, node)?.ok_or(CloudError::InstanceNotFound)?;
            Ok(Some(metadata(inst)))
        })
        .await
    }

    async fn instances_metadata(
        &self,
        nodes: &[Arc<Node>],
    ) -> Vec<CloudResult<Option<InstanceMetadata>>> {
        let out = self
            .call(op::INSTANCES_METADATA, |tx| {
                self.check_batch(nodes.len())?;
                Ok(nodes
                    .iter()
                    .map(|n| {
                        let inst = lookup(tx.state, n)?.ok_or(CloudError::InstanceNotFound)?;
                        Ok(Some(metadata(inst)))
                    })
                    .collect::<Vec<_>>())
            })
            .await;
        out.unwrap_or_else(|e| vec![Err(e); nodes.len()])
    }

    async fn instances_status(&self, nodes: &[Arc<Node>]) -> Vec<CloudResult<InstanceStatus>> {
        let out = self
            .call(op::INSTANCES_STATUS, |tx| {
                self.check_batch(nodes.len())?;
                Ok(nodes
                    .iter()
                    .map(|n| Ok(status(lookup(tx.state, n)?)))
                    .collect::<Vec<_>>())
            })
            .await;
        out.unwrap_or_else(|e| vec![Err(e); nodes.len()])
    }

    fn native_batching(&self) -> bool {
        true
    }

    fn max_batch_size(&self) -> usize {
        self.inner.max_batch_size
    }

    fn instance_events(&self) -> Option<BoxStream<'static, InstanceEvent>> {
        let rx = self.inner.events.subscribe();
        Some(
            BroadcastStream::new(rx)
                .filter_map(|r| async move {
                    match r {
                        Ok(ev) => Some(ev),
                        Err(BroadcastStreamRecvError::Lagged(n)) => {
                            tracing::warn!(missed = n, "instance event subscriber fell behind");
                            None
                        }
                    }
                })
                .boxed(),
        )
    }
}

/// The listeners of a Service; an LB without any is refused, as every cloud does.
fn ports_of(service: &Service) -> CloudResult<Vec<SimPort>> {
    let mut ports: Vec<SimPort> = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .map(|ports| {
            ports
                .iter()
                .map(|p| SimPort {
                    protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    port: p.port,
                    node_port: p.node_port.unwrap_or(0),
                })
                .collect()
        })
        .unwrap_or_default();
    if ports.is_empty() {
        return Err(CloudError::Permanent(format!(
            "ValidationError: service {} has no ports; a load balancer needs at least one listener",
            service_key(service)
        )));
    }
    ports.sort();
    Ok(ports)
}

fn hosts_of(nodes: &[Arc<Node>]) -> Vec<String> {
    let mut hosts: Vec<String> = nodes.iter().map(|n| node_name(n).to_string()).collect();
    hosts.sort();
    hosts.dedup();
    hosts
}

fn service_key(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or(""),
        service.metadata.name.as_deref().unwrap_or("")
    )
}

/// The upstream default (`a` + Service UID); for a Service without a UID (hand-made test
/// objects) `<namespace>-<name>`, so such LBs still get distinct names.
pub(crate) fn sim_load_balancer_name(_cluster: &str, service: &Service) -> String {
    if service
        .metadata
        .uid
        .as_deref()
        .is_some_and(|u| !u.is_empty())
    {
        ccm_cloud::default_load_balancer_name(service)
    } else {
        service_key(service).replace('/', "-")
    }
}

fn lb_status(lb: &SimLoadBalancer) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: Some(vec![LoadBalancerIngress {
            ip: Some(lb.vip.to_string()),
            ip_mode: Some("VIP".into()),
            ..Default::default()
        }]),
    }
}

impl SimCloud {
    /// `EnsureLoadBalancer` with the host names already sorted and deduplicated (what the
    /// LB keeps): the sim server calls it with the wire's names, without building `Node`s.
    pub(crate) async fn ensure_load_balancer_hosts(
        &self,
        cluster: &str,
        service: &Service,
        hosts: Vec<String>,
    ) -> CloudResult<LoadBalancerStatus> {
        let name = self.load_balancer_name(cluster, service);
        let key = (cluster.to_string(), name.clone());
        self.call(op::ENSURE_LOAD_BALANCER, |tx| {
            let ports = ports_of(service)?;
            let vip = match tx.state.lbs.get(&key) {
                Some(lb) => lb.vip,
                None => tx.allocate_vip()?,
            };
            let lb = SimLoadBalancer {
                cluster: cluster.to_string(),
                name: name.clone(),
                service_namespace: service.metadata.namespace.clone().unwrap_or_default(),
                service_name: service.metadata.name.clone().unwrap_or_default(),
                service_uid: service.metadata.uid.clone().unwrap_or_default(),
                ports,
                hosts,
                vip,
            };
            let status = lb_status(&lb);
            let changed = tx.state.lbs.get(&key) != Some(&lb);
            tx.state.lbs.insert(key.clone(), lb);
            tx.log(
                op::ENSURE_LOAD_BALANCER,
                format!("lb/{cluster}/{name}"),
                changed,
            );
            Ok(status)
        })
        .await
    }

    /// `UpdateLoadBalancer` with the host names already sorted and deduplicated.
    pub(crate) async fn update_load_balancer_hosts(
        &self,
        cluster: &str,
        service: &Service,
        hosts: Vec<String>,
    ) -> CloudResult<()> {
        let name = self.load_balancer_name(cluster, service);
        let key = (cluster.to_string(), name.clone());
        self.call(op::UPDATE_LOAD_BALANCER, |tx| {
            let lb = tx.state.lbs.get_mut(&key).ok_or_else(|| {
                CloudError::Permanent(format!(
                    "LoadBalancerNotFound: load balancer {name} of cluster {cluster} does not exist"
                ))
            })?;
            let changed = lb.hosts != hosts;
            lb.hosts = hosts;
            tx.log(
                op::UPDATE_LOAD_BALANCER,
                format!("lb/{cluster}/{name}"),
                changed,
            );
            Ok(())
        })
        .await
    }
}

#[async_trait]
impl LoadBalancer for SimCloud {
    async fn get_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        let key = (
            cluster.to_string(),
            self.load_balancer_name(cluster, service),
        );
        self.call(op::GET_LOAD_BALANCER, |tx| {
            Ok(tx.state.lbs.get(&key).map(lb_status))
        })
        .await
    }

    /// Upstream's default (`a` + Service UID); for a Service without a UID (hand-made test
    /// objects) `<namespace>-<name>`, so such LBs still get distinct names.
    fn load_balancer_name(&self, cluster: &str, service: &Service) -> String {
        sim_load_balancer_name(cluster, service)
    }

    async fn ensure_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        self.ensure_load_balancer_hosts(cluster, service, hosts_of(nodes))
            .await
    }

    async fn update_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        self.update_load_balancer_hosts(cluster, service, hosts_of(nodes))
            .await
    }

    async fn ensure_load_balancer_deleted(
        &self,
        cluster: &str,
        service: &Service,
    ) -> CloudResult<()> {
        let name = self.load_balancer_name(cluster, service);
        let key = (cluster.to_string(), name.clone());
        self.call(op::ENSURE_LOAD_BALANCER_DELETED, |tx| {
            let changed = tx.state.lbs.remove(&key).is_some();
            tx.log(
                op::ENSURE_LOAD_BALANCER_DELETED,
                format!("lb/{cluster}/{name}"),
                changed,
            );
            Ok(())
        })
        .await
    }
}

/// The cloud name of a route: the name hint plus the CIDR, so the two CIDRs of a dual-stack
/// Node (which share the hint, the Node UID) get distinct names.
pub fn route_name(name_hint: &str, destination_cidr: &str) -> String {
    let cidr: String = destination_cidr
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    if name_hint.is_empty() {
        cidr
    } else {
        format!("{name_hint}-{cidr}")
    }
}

fn invalid_cidr(cidr: &str) -> CloudError {
    CloudError::Permanent(format!(
        "InvalidParameterValue: destination {cidr:?} is not a canonical CIDR"
    ))
}

fn route_of(st: &State, r: &SimRoute) -> Route {
    let target_live = st
        .instances
        .get(&r.target_instance)
        .is_some_and(|i| i.state != InstanceState::Terminated);
    Route {
        name: r.name.clone(),
        target_node: r.target_node.clone(),
        enable_node_addresses: r.enable_node_addresses,
        target_node_addresses: r.target_node_addresses.iter().map(Into::into).collect(),
        destination_cidr: r.destination_cidr.clone(),
        blackhole: !target_live,
    }
}

/// Routes follow EC2: one route per destination per table; creating a destination that exists
/// fails with `RouteAlreadyExists` (a permanent error) even if the target is the same, and the
/// target node must resolve to a live instance (`InvalidInstanceID.NotFound` otherwise). Routes
/// whose instance is terminated are listed as blackholes. Deleting a route that is already gone
/// succeeds, as upstream's GCE provider treats a 404 on delete.
#[async_trait]
impl Routes for SimCloud {
    async fn list_routes(&self, cluster: &str) -> CloudResult<Vec<Route>> {
        self.call(op::LIST_ROUTES, |tx| {
            let st = &*tx.state;
            Ok(st
                .routes
                .range((cluster.to_string(), String::new())..)
                .take_while(|((c, _), _)| c == cluster)
                .map(|(_, r)| route_of(st, r))
                .collect())
        })
        .await
    }

    async fn create_route(&self, cluster: &str, name_hint: &str, route: &Route) -> CloudResult<()> {
        self.call(op::CREATE_ROUTE, |tx| {
            let cidr = canonical_cidr(&route.destination_cidr)
                .ok_or_else(|| invalid_cidr(&route.destination_cidr))?;
            let key = (cluster.to_string(), cidr.clone());
            if tx.state.routes.contains_key(&key) {
                return Err(CloudError::Permanent(format!(
                    "RouteAlreadyExists: the route identified by {cidr} already exists"
                )));
            }
            let target = live_by_name(tx.state, &route.target_node).ok_or_else(|| {
                CloudError::Permanent(format!(
                    "InvalidInstanceID.NotFound: no instance for node {:?}",
                    route.target_node
                ))
            })?;
            let r = SimRoute {
                cluster: cluster.to_string(),
                name: route_name(name_hint, &cidr),
                destination_cidr: cidr.clone(),
                target_node: route.target_node.clone(),
                target_instance: target.id.clone(),
                target_node_addresses: route.target_node_addresses.iter().map(Into::into).collect(),
                enable_node_addresses: route.enable_node_addresses,
            };
            tx.state.routes.insert(key, r);
            tx.log(op::CREATE_ROUTE, format!("route/{cluster}/{cidr}"), true);
            Ok(())
        })
        .await
    }

    async fn delete_route(&self, cluster: &str, route: &Route) -> CloudResult<()> {
        self.call(op::DELETE_ROUTE, |tx| {
            let cidr = canonical_cidr(&route.destination_cidr)
                .ok_or_else(|| invalid_cidr(&route.destination_cidr))?;
            let changed = tx
                .state
                .routes
                .remove(&(cluster.to_string(), cidr.clone()))
                .is_some();
            tx.log(op::DELETE_ROUTE, format!("route/{cluster}/{cidr}"), changed);
            Ok(())
        })
        .await
    }
}
