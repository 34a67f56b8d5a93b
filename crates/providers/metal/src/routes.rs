//! Routes: `<podCIDR> via <node InternalIP>` as kernel routes in a dedicated table, marked with
//! a dedicated protocol number so listing and deleting only ever see ccm-rs's own routes.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use async_trait::async_trait;
use ccm_cloud::{CloudError, CloudResult, Route, Routes};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node as K8sNode;
use kube::api::{Api, ListParams};
use parking_lot::RwLock;
use tokio::sync::OnceCell;

use crate::config::RoutesSettings;
use crate::netlink::{KernelRoute, NetlinkTable};
use crate::provider::MetalCloud;

/// Route state: the netlink table (opened on first use) and which gateway is which Node.
pub(crate) struct RouteState {
    settings: RoutesSettings,
    table: OnceCell<Arc<NetlinkTable>>,
    /// Gateway address → Node name, learned from Nodes at start, from the inventory and from
    /// every route created, so listed routes name their target Node.
    gateways: RwLock<HashMap<IpAddr, String>>,
}

impl RouteState {
    pub(crate) fn new(settings: &RoutesSettings) -> Self {
        RouteState {
            settings: settings.clone(),
            table: OnceCell::new(),
            gateways: RwLock::new(HashMap::new()),
        }
    }

    /// Learns every Node's InternalIPs (one LIST at the start of a leadership term), so routes
    /// made by an earlier process are recognised instead of re-created.
    pub(crate) async fn learn_nodes(&self, client: &kube::Client) {
        match Api::<K8sNode>::all(client.clone())
            .list(&ListParams::default())
            .await
        {
            Ok(list) => {
                let mut g = self.gateways.write();
                for node in &list.items {
                    for ip in internal_ips(node) {
                        g.insert(ip, node.metadata.name.clone().unwrap_or_default());
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "metal: cannot list Nodes to name existing routes; they are re-created at the first sync")
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
        self.inner.routes.as_ref().ok_or(CloudError::NotImplemented)
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
        let routes = state
            .table()
            .await?
            .list()
            .await
            .map_err(|e| CloudError::Transient(format!("listing kernel routes: {e}")))?;
        let gateways = state.gateways.read();
        Ok(routes
            .into_iter()
            .map(|r| Route {
                name: r.dst.to_string(),
                target_node: gateways.get(&r.gateway).cloned().unwrap_or_default(),
                destination_cidr: r.dst.to_string(),
                ..Default::default()
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
        state
            .gateways
            .write()
            .insert(gateway, route.target_node.clone());
        state
            .table()
            .await?
            .replace(&KernelRoute { dst, gateway })
            .await
            .map_err(|e| CloudError::Transient(format!("adding route {dst} via {gateway}: {e}")))
    }

    async fn delete_route(&self, _cluster: &str, route: &Route) -> CloudResult<()> {
        let state = self.route_state()?;
        let dst: IpNet = route.destination_cidr.parse().map_err(|_| {
            CloudError::Permanent(format!("route {:?} is not a CIDR", route.destination_cidr))
        })?;
        state
            .table()
            .await?
            .delete(dst)
            .await
            .map_err(|e| CloudError::Transient(format!("deleting route {dst}: {e}")))
    }
}
