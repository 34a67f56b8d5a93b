//! Routes (upstream `pkg/openstack/routes.go`): a Node's pod CIDR is a Neutron extraroute on
//! `[Route] router-id` whose next hop is the Node's InternalIP of the CIDR's family, and the
//! Node's port lets the pod CIDR through (`allowed_address_pairs`; skipped when the port has
//! port security off or Neutron lacks `allowed-address-pairs`).
//!
//! Routes are added and removed with Neutron's atomic `add_extraroutes` /
//! `remove_extraroutes` only; without the `extraroute-atomic` extension every call is an error
//! naming it (upstream's fallback — rewrite the router's whole route list under a process
//! lock — loses routes other writers add meanwhile, and is not offered).
//!
//! Extraroutes carry no name or tag, so a route belongs to a cluster by a router tag
//! `k8s:<10 hex of the cluster name's FNV-1a>:<cidr with / as _>` (Neutron tags are at most
//! 60 characters), added after the route, removed after it. `list_routes` reports only routes
//! with this cluster's tag; upstream reports every route of the router, whatever cluster made
//! it.
//!
//! Node names come from Neutron and Nova, not the cluster: next hop → the port holding that
//! fixed IP on one of the router's networks → its `device_id` → the Nova server of that id →
//! its name (the Node's name, as for instances by name). A next hop whose port is absent from
//! the listing, or whose server is absent from Nova's listing and confirmed by Nova's own 404,
//! is a blackhole; any error, or a server of an unreachable cell, fails the listing. `target_node_addresses` is what the route was
//! created with, remembered in memory with `enable_node_addresses = true`, so an address change
//! re-creates the route; a route created before this process started is reported with
//! `enable_node_addresses = false` (kept as it is) until it is created again.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use async_trait::async_trait;
use ccm_cloud::{CloudError, CloudResult, NodeAddressKey, Route, Routes};
use http::Method;
use ipnet::IpNet;
use serde::Deserialize;
use serde_json::json;

use crate::cloud::OpenStackCloud;
use crate::http::{Reply, status_error};
use crate::nova::{self, PORTS_PER_CALL};

/// Neutron's longest tag.
pub const MAX_TAG_LEN: usize = 60;

/// Extensions the routes need from Neutron.
pub const EXT_ATOMIC: &str = "extraroute-atomic";
/// Router tags mark a route's cluster.
pub const EXT_TAGS: &str = "standard-attr-tag";
/// Optional: without it the ports are not touched (as upstream).
pub const EXT_PAIRS: &str = "allowed-address-pairs";

/// (cluster, canonical CIDR) → (next hop, the Node's addresses on create).
type Created = HashMap<(String, String), (String, Vec<NodeAddressKey>)>;

/// What this process remembers per route it created: the next hop and the Node's addresses.
#[derive(Default)]
pub(crate) struct RouteState {
    created: parking_lot::Mutex<Created>,
    /// `Some(allowed-address-pairs present)` once the extensions were checked.
    extensions: parking_lot::Mutex<Option<bool>>,
}

/// The router tag that says `cidr` on the router belongs to `cluster`.
pub fn route_tag(cluster: &str, cidr: &IpNet) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in cluster.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!(
        "k8s:{:010x}:{}",
        h & 0xff_ffff_ffff,
        cidr.to_string().replace('/', "_")
    )
}

#[derive(Deserialize)]
struct RouterBody {
    router: Router,
}

#[derive(Deserialize)]
struct Router {
    #[serde(default)]
    routes: Vec<ExtraRoute>,
    #[serde(default)]
    tags: Vec<String>,
}

#[derive(Deserialize, Clone, Debug)]
struct ExtraRoute {
    destination: String,
    nexthop: String,
}

#[derive(Deserialize)]
struct Extensions {
    extensions: Vec<Extension>,
}

#[derive(Deserialize)]
struct Extension {
    alias: String,
}

#[derive(Deserialize)]
struct NetPorts {
    ports: Vec<NetPort>,
}

#[derive(Deserialize, Clone, Debug)]
struct NetPort {
    #[serde(default)]
    id: String,
    #[serde(default)]
    device_id: String,
    #[serde(default)]
    network_id: String,
    #[serde(default)]
    fixed_ips: Vec<nova::FixedIp>,
    #[serde(default)]
    port_security_enabled: Option<bool>,
    #[serde(default)]
    allowed_address_pairs: Vec<serde_json::Value>,
    #[serde(default)]
    revision_number: Option<u64>,
}

fn enc(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

fn parse_cidr(cidr: &str) -> CloudResult<IpNet> {
    cidr.parse::<IpNet>().map(|n| n.trunc()).map_err(|e| {
        CloudError::Permanent(format!(
            "route destination_cidr {cidr:?} is not a CIDR: {e}"
        ))
    })
}

fn same_dest(a: &str, b: &IpNet) -> bool {
    a.parse::<IpNet>().is_ok_and(|a| a.trunc() == *b)
}

fn same_ip(a: &str, b: &str) -> bool {
    match (a.parse::<IpAddr>(), b.parse::<IpAddr>()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// The next hop for `cidr`: the first InternalIP of the CIDR's family among `addresses`.
pub fn next_hop(node: &str, addresses: &[NodeAddressKey], cidr: &IpNet) -> CloudResult<String> {
    let v6 = matches!(cidr, IpNet::V6(_));
    addresses
        .iter()
        .filter(|a| a.type_ == "InternalIP")
        .find_map(|a| match a.address.parse::<IpAddr>() {
            Ok(ip) if ip.is_ipv6() == v6 => Some(ip.to_string()),
            _ => None,
        })
        .ok_or_else(|| {
            CloudError::Permanent(format!(
                "route {cidr} to node {node:?}: the route's target_node_addresses have no IPv{} InternalIP for the next hop",
                if v6 { 6 } else { 4 }
            ))
        })
}

/// The Routes capability of an [`OpenStackCloud`] with `[Route] router-id` set.
pub(crate) struct NeutronRoutes {
    pub(crate) cloud: OpenStackCloud,
    pub(crate) router_id: String,
}

impl NeutronRoutes {
    fn state(&self) -> &RouteState {
        self.cloud.route_state()
    }

    async fn call(
        &self,
        op: &str,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&serde_json::Value>,
    ) -> CloudResult<Reply> {
        self.cloud
            .keystone()
            .request("network", op, method, path, headers, body)
            .await
    }

    /// Checks Neutron's extensions once (a failed check is asked again next time) and says
    /// whether `allowed-address-pairs` is there.
    async fn extensions(&self) -> CloudResult<bool> {
        if let Some(pairs) = *self.state().extensions.lock() {
            return Ok(pairs);
        }
        let op = "network GET /v2.0/extensions";
        let reply = self
            .call(op, Method::GET, "/v2.0/extensions", &[], None)
            .await?;
        if !reply.status.is_success() {
            return Err(status_error(op, &reply));
        }
        let exts: Extensions = reply.json(op)?;
        let has = |a: &str| exts.extensions.iter().any(|e| e.alias == a);
        for (alias, why) in [
            (
                EXT_ATOMIC,
                "routes are added and removed one at a time with add_extraroutes/remove_extraroutes; rewriting the router's whole route list is not done",
            ),
            (EXT_TAGS, "router tags record which cluster owns a route"),
        ] {
            if !has(alias) {
                return Err(CloudError::Permanent(format!(
                    "[Route] router-id: Neutron lacks the {alias:?} extension ({why})"
                )));
            }
        }
        let pairs = has(EXT_PAIRS);
        *self.state().extensions.lock() = Some(pairs);
        Ok(pairs)
    }

    async fn router(&self) -> CloudResult<Router> {
        let op = "network GET /v2.0/routers/{id}";
        let path = format!("/v2.0/routers/{}", enc(&self.router_id));
        let reply = self.call(op, Method::GET, &path, &[], None).await?;
        if !reply.status.is_success() {
            return Err(status_error(
                &format!("{op} ([Route] router-id {:?})", self.router_id),
                &reply,
            ));
        }
        Ok(reply.json::<RouterBody>(op)?.router)
    }

    async fn extraroutes(&self, add: bool, routes: &[(String, String)]) -> CloudResult<()> {
        let (op, verb) = if add {
            (
                "network PUT /v2.0/routers/{id}/add_extraroutes",
                "add_extraroutes",
            )
        } else {
            (
                "network PUT /v2.0/routers/{id}/remove_extraroutes",
                "remove_extraroutes",
            )
        };
        let path = format!("/v2.0/routers/{}/{verb}", enc(&self.router_id));
        let body = json!({"router": {"routes": routes.iter()
            .map(|(d, n)| json!({"destination": d, "nexthop": n})).collect::<Vec<_>>()}});
        let reply = self.call(op, Method::PUT, &path, &[], Some(&body)).await?;
        if !reply.status.is_success() {
            return Err(status_error(op, &reply));
        }
        Ok(())
    }

    async fn tag(&self, add: bool, tag: &str) -> CloudResult<()> {
        let (op, method) = if add {
            ("network PUT /v2.0/routers/{id}/tags/{tag}", Method::PUT)
        } else {
            (
                "network DELETE /v2.0/routers/{id}/tags/{tag}",
                Method::DELETE,
            )
        };
        let path = format!("/v2.0/routers/{}/tags/{}", enc(&self.router_id), enc(tag));
        let reply = self.call(op, method, &path, &[], None).await?;
        match reply.status.as_u16() {
            200..=299 => Ok(()),
            404 if !add => Ok(()),
            _ => Err(status_error(op, &reply)),
        }
    }

    async fn get_ports(&self, query: &str) -> CloudResult<Vec<NetPort>> {
        let op = "network GET /v2.0/ports";
        let reply = self
            .call(op, Method::GET, &format!("/v2.0/ports?{query}"), &[], None)
            .await?;
        if !reply.status.is_success() {
            return Err(status_error(op, &reply));
        }
        Ok(reply.json::<NetPorts>(op)?.ports)
    }

    /// The networks the router has interfaces on (upstream's `getRouterNetworkIDs`).
    async fn router_networks(&self) -> CloudResult<Vec<String>> {
        let q = query(&[("device_id", &self.router_id), ("fields", "network_id")]);
        let mut nets: Vec<String> = self
            .get_ports(&q)
            .await?
            .into_iter()
            .map(|p| p.network_id)
            .filter(|n| !n.is_empty())
            .collect();
        nets.sort();
        nets.dedup();
        Ok(nets)
    }

    /// Ports on `networks` holding any of `ips` as a fixed IP, `PORTS_PER_CALL` IPs a call.
    async fn ports_by_ip(&self, networks: &[String], ips: &[String]) -> CloudResult<Vec<NetPort>> {
        let mut out = Vec::new();
        if networks.is_empty() {
            return Ok(out);
        }
        for chunk in ips.chunks(PORTS_PER_CALL) {
            let mut pairs: Vec<(&str, String)> = Vec::new();
            for ip in chunk {
                pairs.push(("fixed_ips", format!("ip_address={ip}")));
            }
            for n in networks {
                pairs.push(("network_id", n.clone()));
            }
            for f in [
                "id",
                "device_id",
                "network_id",
                "fixed_ips",
                "port_security_enabled",
                "allowed_address_pairs",
                "revision_number",
            ] {
                pairs.push(("fields", f.to_string()));
            }
            let refs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
            out.extend(self.get_ports(&query(&refs)).await?);
        }
        Ok(out)
    }

    /// The one port holding `ip` on the router's networks (upstream's `getPortByIP`);
    /// `Ok(None)` when there is none.
    async fn port_of(&self, networks: &[String], ip: &str) -> CloudResult<Option<NetPort>> {
        let ports: Vec<NetPort> = self
            .ports_by_ip(networks, &[ip.to_string()])
            .await?
            .into_iter()
            .filter(|p| p.fixed_ips.iter().any(|f| same_ip(&f.ip_address, ip)))
            .collect();
        match ports.len() {
            0 => Ok(None),
            1 => Ok(ports.into_iter().next()),
            n => Err(CloudError::Permanent(format!(
                "next hop {ip}: {n} ports hold it on the networks of router {:?}; which one is the Node's is ambiguous",
                self.router_id
            ))),
        }
    }

    /// Adds (or removes) `cidr` in the port's `allowed_address_pairs`. Neutron has no atomic
    /// call for one pair, so the update names the port's `revision_number` (`If-Match`): a port
    /// changed meanwhile is an error to retry, never a lost pair.
    async fn update_pairs(&self, port: &NetPort, cidr: &IpNet, add: bool) -> CloudResult<bool> {
        if port.port_security_enabled == Some(false) {
            tracing::debug!(port = %port.id, "port security off; allowed_address_pairs untouched");
            return Ok(false);
        }
        let is_it = |p: &serde_json::Value| {
            p.get("ip_address")
                .and_then(|v| v.as_str())
                .is_some_and(|a| same_dest(a, cidr) || a == cidr.to_string())
        };
        let present = port.allowed_address_pairs.iter().any(is_it);
        let pairs: Vec<serde_json::Value> = if add {
            if present {
                return Ok(false);
            }
            let mut p = port.allowed_address_pairs.clone();
            p.push(json!({"ip_address": cidr.to_string()}));
            p
        } else {
            if !present {
                return Ok(false);
            }
            port.allowed_address_pairs
                .iter()
                .filter(|p| !is_it(p))
                .cloned()
                .collect()
        };
        let op = "network PUT /v2.0/ports/{id}";
        let path = format!("/v2.0/ports/{}", enc(&port.id));
        let if_match = port.revision_number.map(|r| format!("revision_number={r}"));
        let headers: Vec<(&str, &str)> = if_match
            .as_deref()
            .map(|v| vec![("if-match", v)])
            .unwrap_or_default();
        let body = json!({"port": {"allowed_address_pairs": pairs}});
        let reply = self
            .call(op, Method::PUT, &path, &headers, Some(&body))
            .await?;
        match reply.status.as_u16() {
            200..=299 => Ok(true),
            412 => Err(CloudError::Transient(format!(
                "{op}: port {} changed while its allowed_address_pairs were updated; retrying later",
                port.id
            ))),
            _ => Err(status_error(op, &reply)),
        }
    }
}

fn query(pairs: &[(&str, &str)]) -> String {
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        q.append_pair(k, v);
    }
    q.finish()
}

#[async_trait]
impl Routes for NeutronRoutes {
    async fn list_routes(&self, cluster: &str) -> CloudResult<Vec<Route>> {
        self.extensions().await?;
        let router = self.router().await?;
        let mine: Vec<(IpNet, ExtraRoute)> = router
            .routes
            .iter()
            .filter_map(|r| {
                let dest = r.destination.parse::<IpNet>().ok()?.trunc();
                router
                    .tags
                    .contains(&route_tag(cluster, &dest))
                    .then(|| (dest, r.clone()))
            })
            .collect();
        if mine.is_empty() {
            return Ok(Vec::new());
        }
        let networks = self.router_networks().await?;
        let mut hops: Vec<String> = mine.iter().map(|(_, r)| r.nexthop.clone()).collect();
        hops.sort();
        hops.dedup();
        let ports = self.ports_by_ip(&networks, &hops).await?;
        let mut servers: BTreeMap<String, String> = if ports.iter().any(|p| !p.device_id.is_empty())
        {
            nova::list_servers(self.cloud.keystone())
                .await?
                .into_iter()
                .map(|s| (s.id, s.name))
                .collect()
        } else {
            BTreeMap::new()
        };
        // A device missing from the listing is absent only on Nova's own 404 for it (as for
        // instances); a server of a cell Nova cannot reach has no name: an error, not a
        // blackhole.
        for p in &ports {
            if p.device_id.is_empty() || servers.contains_key(&p.device_id) {
                continue;
            }
            if let Some(s) = nova::get_server(self.cloud.keystone(), &p.device_id).await? {
                servers.insert(s.id, s.name);
            }
        }
        if let Some((id, _)) = servers
            .iter()
            .find(|(id, name)| name.is_empty() && ports.iter().any(|p| &p.device_id == *id))
        {
            return Err(CloudError::Transient(format!(
                "list_routes: server {id} behind a next hop has no name in Nova's listing (a cell Nova cannot reach?); its route's Node is unknown"
            )));
        }
        let created = self.state().created.lock().clone();
        let mut out = Vec::with_capacity(mine.len());
        for (dest, r) in mine {
            let owners: Vec<&NetPort> = ports
                .iter()
                .filter(|p| {
                    p.fixed_ips
                        .iter()
                        .any(|f| same_ip(&f.ip_address, &r.nexthop))
                })
                .collect();
            let node = match owners.as_slice() {
                [] => None,
                [p] => servers.get(&p.device_id),
                _ => {
                    return Err(CloudError::Permanent(format!(
                        "list_routes: next hop {} of route {dest}: {} ports hold it on the networks of router {:?}; which Node it is, is ambiguous",
                        r.nexthop,
                        owners.len(),
                        self.router_id
                    )));
                }
            };
            let cidr = dest.to_string();
            out.push(match node {
                Some(name) => {
                    let remembered = created
                        .get(&(cluster.to_string(), cidr.clone()))
                        .filter(|(hop, _)| same_ip(hop, &r.nexthop));
                    Route {
                        name: cidr.clone(),
                        target_node: name.clone(),
                        enable_node_addresses: remembered.is_some(),
                        target_node_addresses: remembered
                            .map(|(_, a)| a.clone())
                            .unwrap_or_default(),
                        destination_cidr: cidr,
                        blackhole: false,
                    }
                }
                None => Route {
                    name: cidr.clone(),
                    // As upstream: the next hop stands in for the unknown Node.
                    target_node: r.nexthop.clone(),
                    enable_node_addresses: false,
                    target_node_addresses: Vec::new(),
                    destination_cidr: cidr,
                    blackhole: true,
                },
            });
        }
        Ok(out)
    }

    async fn create_route(
        &self,
        cluster: &str,
        _name_hint: &str,
        route: &Route,
    ) -> CloudResult<()> {
        let cidr = parse_cidr(&route.destination_cidr)?;
        let hop = next_hop(&route.target_node, &route.target_node_addresses, &cidr)?;
        let pairs_ext = self.extensions().await?;
        let router = self.router().await?;
        let tag = route_tag(cluster, &cidr);
        let exists = router
            .routes
            .iter()
            .any(|r| same_dest(&r.destination, &cidr) && same_ip(&r.nexthop, &hop));
        let new = [(cidr.to_string(), hop.clone())];
        if !exists {
            self.extraroutes(true, &new).await?;
        }
        let ports = async {
            let networks = self.router_networks().await?;
            let port = self.port_of(&networks, &hop).await?.ok_or_else(|| {
                CloudError::Permanent(format!(
                    "route {cidr} to node {:?}: no port holds next hop {hop} on the networks of router {:?}",
                    route.target_node, self.router_id
                ))
            })?;
            if pairs_ext {
                self.update_pairs(&port, &cidr, true).await?;
            }
            if !router.tags.contains(&tag) {
                self.tag(true, &tag).await?;
            }
            Ok::<(), CloudError>(())
        };
        if let Err(e) = ports.await {
            if !exists && let Err(u) = self.extraroutes(false, &new).await {
                tracing::warn!(error = %u, route = %cidr, "could not take back the route after a failed create");
            }
            return Err(e);
        }
        self.state().created.lock().insert(
            (cluster.to_string(), cidr.to_string()),
            (hop, route.target_node_addresses.clone()),
        );
        Ok(())
    }

    async fn delete_route(&self, cluster: &str, route: &Route) -> CloudResult<()> {
        let cidr = parse_cidr(&route.destination_cidr)?;
        let pairs_ext = self.extensions().await?;
        let router = self.router().await?;
        let tag = route_tag(cluster, &cidr);
        if !router.tags.contains(&tag) {
            // Not this cluster's (or already deleted): nothing to do.
            self.state()
                .created
                .lock()
                .remove(&(cluster.to_string(), cidr.to_string()));
            return Ok(());
        }
        let old: Vec<(String, String)> = router
            .routes
            .iter()
            .filter(|r| same_dest(&r.destination, &cidr))
            .map(|r| (r.destination.clone(), r.nexthop.clone()))
            .collect();
        if !old.is_empty() {
            self.extraroutes(false, &old).await?;
            if pairs_ext {
                let networks = self.router_networks().await?;
                for (_, hop) in &old {
                    if let Some(port) = self.port_of(&networks, hop).await? {
                        self.update_pairs(&port, &cidr, false).await?;
                    }
                }
            }
        }
        self.tag(false, &tag).await?;
        self.state()
            .created
            .lock()
            .remove(&(cluster.to_string(), cidr.to_string()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(t: &str, ip: &str) -> NodeAddressKey {
        NodeAddressKey {
            type_: t.into(),
            address: ip.into(),
        }
    }

    #[test]
    fn tags_fit_neutron_and_differ_by_cluster() {
        let v6: IpNet = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00/120"
            .parse()
            .unwrap();
        let t = route_tag("a-very-long-cluster-name-that-goes-on-and-on-and-on", &v6);
        assert!(t.len() <= MAX_TAG_LEN, "{t} is {} long", t.len());
        assert!(!t.contains('/') && !t.contains(','));
        let c: IpNet = "10.244.1.0/24".parse().unwrap();
        assert_ne!(route_tag("a", &c), route_tag("b", &c));
        assert_eq!(route_tag("a", &c), route_tag("a", &c));
    }

    #[test]
    fn next_hop_is_the_internal_ip_of_the_cidrs_family() {
        let addrs = [
            a("ExternalIP", "203.0.113.5"),
            a("InternalIP", "fd00::5"),
            a("InternalIP", "10.0.0.5"),
        ];
        let v4: IpNet = "10.244.1.0/24".parse().unwrap();
        let v6: IpNet = "fd10::/64".parse().unwrap();
        assert_eq!(next_hop("n", &addrs, &v4).unwrap(), "10.0.0.5");
        assert_eq!(next_hop("n", &addrs, &v6).unwrap(), "fd00::5");
        let e = next_hop("n", &addrs[..1], &v4).unwrap_err();
        assert!(e.to_string().contains("InternalIP"), "{e}");
    }

    #[test]
    fn a_bad_cidr_is_an_error_naming_the_field() {
        let e = parse_cidr("10.0.0.0/33").unwrap_err();
        assert!(e.to_string().contains("destination_cidr"), "{e}");
    }
}
