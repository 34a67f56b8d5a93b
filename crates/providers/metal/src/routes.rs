//! Routes: `<podCIDR> via <node InternalIP>` as kernel routes in a dedicated table, marked with
//! a dedicated protocol number so listing, replacing and deleting only ever touch ccm-rs's own
//! routes. Each listed route carries the target Node's addresses as of its creation, so the
//! route controller moves a route whose Node changed address; the table is emptied when the
//! leadership term ends, so a host that stopped leading keeps no stale next hops.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use async_trait::async_trait;
use ccm_cloud::{CloudError, CloudResult, NodeAddressKey, Route, Routes};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node as K8sNode;
use kube::api::{Api, ListParams};
use parking_lot::RwLock;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use crate::bgp::BgpState;
use crate::config::RoutesSettings;
use crate::netlink::{KernelRoute, NetlinkTable};
use crate::provider::MetalCloud;

/// Route state: the netlink table (opened on first use) and which gateway is which Node.
pub(crate) struct RouteState {
    settings: RoutesSettings,
    table: OnceCell<Arc<NetlinkTable>>,
    /// Gateway address → the Node and its addresses, learned from Nodes at the start of a
    /// leadership term, so routes an earlier process made are recognised.
    gateways: RwLock<HashMap<IpAddr, Target>>,
    /// Pod CIDR → the Node, its addresses and the gateway, as this process created the route.
    created: RwLock<HashMap<IpNet, (IpAddr, Target)>>,
    /// Held (shared) by each table change; taken (exclusive) when the term ends, so no create
    /// lands after the table was emptied. `true` once the term ended.
    ended: tokio::sync::RwLock<bool>,
    /// `Some` in BGP mode: routes are announced, the kernel table is not used.
    pub(crate) bgp: Option<Arc<BgpState>>,
}

/// A route's target as listed to the route controller: a Node and its addresses.
#[derive(Debug, Clone, Default)]
pub(crate) struct Target {
    pub(crate) node: String,
    pub(crate) addresses: Vec<NodeAddressKey>,
}

impl RouteState {
    pub(crate) fn new(settings: &RoutesSettings, pools: Vec<crate::ipam::Pool>) -> Self {
        RouteState {
            settings: settings.clone(),
            table: OnceCell::new(),
            gateways: RwLock::new(HashMap::new()),
            created: RwLock::new(HashMap::new()),
            ended: tokio::sync::RwLock::new(false),
            bgp: settings
                .bgp
                .as_ref()
                .map(|b| Arc::new(BgpState::new(b, settings.netns.clone(), pools))),
        }
    }

    /// Starts a leadership term: learns the Nodes, puts the `unreachable` guards in the table,
    /// and empties the table of ccm-rs's routes when `shutdown` fires (lost leadership or
    /// SIGTERM): a host that no longer leads must not keep next hops nobody updates.
    pub(crate) async fn start_term(
        self: &Arc<Self>,
        client: &kube::Client,
        vips: crate::bgp::InitialVips,
        shutdown: CancellationToken,
        warn: Arc<dyn Fn(String, &'static str, String) + Send + Sync>,
    ) {
        *self.ended.write().await = false;
        let nodes = self.learn_nodes(client).await;
        if let Some(bgp) = &self.bgp {
            bgp.start_term(initial_routes(&nodes), vips, shutdown, warn)
                .await;
            return;
        }
        if let Err(e) = self.guard_cluster_cidrs().await {
            tracing::error!(error = %e, "metal: cannot put the unreachable routes for the cluster CIDRs in the route table");
        }
        let me = self.clone();
        tokio::spawn(async move {
            shutdown.cancelled().await;
            me.end_term().await;
        });
    }

    async fn guard_cluster_cidrs(&self) -> CloudResult<()> {
        let table = self.table().await?;
        for &cidr in &self.settings.cluster_cidrs {
            let foreign = table.foreign_owner(cidr).await.map_err(transient)?;
            if let Some(p) = foreign {
                tracing::warn!(%cidr, protocol = p, "metal: another tool's route holds the cluster CIDR in the route table; no unreachable route added");
                continue;
            }
            table.ensure_unreachable(cidr).await.map_err(transient)?;
        }
        Ok(())
    }

    async fn end_term(&self) {
        let mut ended = self.ended.write().await;
        *ended = true;
        let result = async {
            let table = self.table().await?;
            for r in table.list().await.map_err(transient)? {
                table.delete(r.dst).await.map_err(transient)?;
            }
            Ok::<_, CloudError>(())
        }
        .await;
        match result {
            Ok(()) => tracing::info!(
                "metal: leadership ended; ccm-rs's routes removed from the route table"
            ),
            Err(e) => {
                tracing::error!(error = %e, "metal: leadership ended but the route table could not be emptied")
            }
        }
        self.created.write().clear();
    }

    /// The target a listed route reports: as created by this process if the gateway is the
    /// same, else the Node that had the gateway as InternalIP when the term started, else
    /// unknown (the route controller then replaces the route).
    fn target_of(&self, dst: &IpNet, gateway: &IpAddr) -> Target {
        if let Some((gw, t)) = self.created.read().get(dst)
            && gw == gateway
        {
            return t.clone();
        }
        self.gateways
            .read()
            .get(gateway)
            .cloned()
            .unwrap_or_default()
    }

    /// Learns every Node's InternalIPs (one LIST at the start of a leadership term), so routes
    /// made by an earlier process are recognised instead of re-created.
    async fn learn_nodes(&self, client: &kube::Client) -> Vec<K8sNode> {
        match Api::<K8sNode>::all(client.clone())
            .list(&ListParams::default())
            .await
        {
            Ok(list) => {
                let mut g = self.gateways.write();
                g.clear();
                for node in &list.items {
                    let target = Target {
                        node: node.metadata.name.clone().unwrap_or_default(),
                        addresses: node_addresses(node),
                    };
                    for ip in internal_ips(node) {
                        g.insert(ip, target.clone());
                    }
                }
                list.items
            }
            Err(e) => {
                tracing::warn!(error = %e, "metal: cannot list Nodes to name existing routes; they are re-created at the first sync");
                Vec::new()
            }
        }
    }

    async fn table(&self) -> CloudResult<Arc<NetlinkTable>> {
        self.table
            .get_or_try_init(|| async {
                NetlinkTable::open(&self.settings)
                    .await
                    .map(Arc::new)
                    .map_err(|e| CloudError::Permanent(format!("opening rtnetlink: {e}")))
            })
            .await
            .cloned()
    }
}

/// The routes the route controller would create for `nodes`: each pod CIDR via the Node's
/// InternalIP of its family. A BGP term starts announcing these at once.
fn initial_routes(nodes: &[K8sNode]) -> Vec<(IpNet, IpAddr, Target)> {
    let mut out = Vec::new();
    for node in nodes {
        let target = Target {
            node: node.metadata.name.clone().unwrap_or_default(),
            addresses: node_addresses(node),
        };
        let cidrs = node
            .spec
            .as_ref()
            .and_then(|s| {
                s.pod_cidrs
                    .clone()
                    .or_else(|| s.pod_cidr.clone().map(|c| vec![c]))
            })
            .unwrap_or_default();
        for cidr in cidrs {
            let Ok(net) = cidr.parse::<IpNet>() else {
                continue;
            };
            if let Some(gw) = internal_ips(node)
                .into_iter()
                .find(|ip| ip.is_ipv4() == net.addr().is_ipv4())
            {
                out.push((net, gw, target.clone()));
            }
        }
    }
    out
}

fn transient(e: rtnetlink::Error) -> CloudError {
    CloudError::Transient(format!("route table: {e}"))
}

fn node_addresses(node: &K8sNode) -> Vec<NodeAddressKey> {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| a.iter().map(NodeAddressKey::from).collect())
        .unwrap_or_default()
}

fn internal_ips(node: &K8sNode) -> Vec<IpAddr> {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| {
            a.iter()
                .filter(|a| a.type_ == "InternalIP")
                .filter_map(|a| a.address.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

impl MetalCloud {
    fn route_state(&self) -> CloudResult<&RouteState> {
        self.inner
            .routes
            .as_deref()
            .ok_or(CloudError::NotImplemented)
    }

    /// The gateway for `route`: the target's InternalIP of the CIDR's family, from the Node's
    /// addresses or else from the inventory.
    fn gateway_for(&self, route: &Route, dst: &IpNet) -> CloudResult<IpAddr> {
        let same_family = |ip: &IpAddr| ip.is_ipv4() == dst.addr().is_ipv4();
        let from_node = route
            .target_node_addresses
            .iter()
            .filter(|a| a.type_ == "InternalIP")
            .filter_map(|a| a.address.parse::<IpAddr>().ok())
            .find(same_family);
        let from_inventory = || {
            self.config().machine(&route.target_node).and_then(|m| {
                m.addresses
                    .iter()
                    .filter(|a| a.type_ == "InternalIP")
                    .filter_map(|a| a.address.parse::<IpAddr>().ok())
                    .find(same_family)
            })
        };
        from_node.or_else(from_inventory).ok_or_else(|| {
            CloudError::Permanent(format!(
                "node {} has no {} InternalIP to route {dst} to",
                route.target_node,
                if dst.addr().is_ipv4() { "IPv4" } else { "IPv6" }
            ))
        })
    }
}

#[async_trait]
impl Routes for MetalCloud {
    async fn list_routes(&self, _cluster: &str) -> CloudResult<Vec<Route>> {
        let state = self.route_state()?;
        if let Some(bgp) = &state.bgp {
            return bgp.list();
        }
        let routes = state
            .table()
            .await?
            .list()
            .await
            .map_err(|e| CloudError::Transient(format!("listing kernel routes: {e}")))?;
        Ok(routes
            .into_iter()
            .map(|r| {
                let target = state.target_of(&r.dst, &r.gateway);
                Route {
                    name: r.dst.to_string(),
                    target_node: target.node,
                    enable_node_addresses: true,
                    target_node_addresses: target.addresses,
                    destination_cidr: r.dst.to_string(),
                    blackhole: false,
                }
            })
            .collect())
    }

    async fn create_route(
        &self,
        _cluster: &str,
        _name_hint: &str,
        route: &Route,
    ) -> CloudResult<()> {
        let state = self.route_state()?;
        let dst: IpNet = route.destination_cidr.parse().map_err(|_| {
            CloudError::Permanent(format!(
                "pod CIDR {:?} is not a CIDR",
                route.destination_cidr
            ))
        })?;
        let gateway = self.gateway_for(route, &dst)?;
        let target = Target {
            node: route.target_node.clone(),
            addresses: route.target_node_addresses.clone(),
        };
        if let Some(bgp) = &state.bgp {
            return bgp.announce(dst, gateway, target).await;
        }
        let ended = state.ended.read().await;
        if *ended {
            return Err(CloudError::Transient(
                "the leadership term ended; no route is added".into(),
            ));
        }
        let table = state.table().await?;
        if let Some(p) = table.foreign_owner(dst).await.map_err(transient)? {
            // The kernel's replace ignores the protocol: it would overwrite another tool's route.
            return Err(CloudError::Permanent(format!(
                "table {} already has a route to {dst} of protocol {p} (not ccm-rs's {}); it is left as it is",
                state.settings.table, state.settings.protocol
            )));
        }
        table
            .replace(&KernelRoute { dst, gateway })
            .await
            .map_err(|e| CloudError::Transient(format!("adding route {dst} via {gateway}: {e}")))?;
        state.created.write().insert(dst, (gateway, target));
        Ok(())
    }

    async fn delete_route(&self, _cluster: &str, route: &Route) -> CloudResult<()> {
        let state = self.route_state()?;
        let dst: IpNet = route.destination_cidr.parse().map_err(|_| {
            CloudError::Permanent(format!("route {:?} is not a CIDR", route.destination_cidr))
        })?;
        if let Some(bgp) = &state.bgp {
            return bgp.withdraw(dst).await;
        }
        let _ended = state.ended.read().await;
        state
            .table()
            .await?
            .delete(dst)
            .await
            .map_err(|e| CloudError::Transient(format!("deleting route {dst}: {e}")))?;
        state.created.write().remove(&dst);
        Ok(())
    }
}
