//! LoadBalancer addresses over BGP (`routes.bgp.announce_load_balancers`): each address a
//! Service holds is announced as a host prefix (/32, /128) with one path per Node that can
//! serve it. `externalTrafficPolicy: Cluster`: every Node the service controller passes
//! (its load-balancer node set). `Local`: only those of them with a ready endpoint of the
//! Service, from its EndpointSlices. An address with no such Node is not announced.
//!
//! The router gets the several paths of one prefix from one speaker through ADD-PATH
//! (RFC 7911); with multipath (BIRD `merge paths`, FRR `maximum-paths`) it spreads the flows
//! over the Nodes (ECMP).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::config::Community;
use crate::ipam::Pool;

/// Label of an EndpointSlice naming its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// What one Service asks to be announced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VipService {
    /// The addresses the Service holds.
    pub ips: Vec<IpAddr>,
    /// `externalTrafficPolicy: Local`.
    pub local: bool,
    /// The load-balancer Nodes and their InternalIPs.
    pub nodes: BTreeMap<String, Vec<IpAddr>>,
}

/// One announced address: its next hops (one path each) and the pool's attributes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VipRoute {
    /// The Nodes' addresses, of the address's family.
    pub next_hops: BTreeSet<IpAddr>,
    /// Communities of the address's pool.
    pub communities: Vec<Community>,
    /// LOCAL_PREF of the address's pool.
    pub local_pref: Option<u32>,
}

/// The Services' addresses and the Nodes with ready endpoints of each Service.
#[derive(Debug, Default)]
pub struct VipTable {
    services: BTreeMap<String, VipService>,
    /// Service key → EndpointSlice name → Nodes with a ready endpoint in that slice.
    endpoints: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
}

impl VipTable {
    /// Sets what `key` asks for (an empty address list removes it).
    pub fn set_service(&mut self, key: &str, svc: VipService) {
        if svc.ips.is_empty() {
            self.services.remove(key);
        } else {
            self.services.insert(key.to_string(), svc);
        }
    }

    /// The Service's entry, if it holds addresses.
    pub fn service(&self, key: &str) -> Option<&VipService> {
        self.services.get(key)
    }

    /// Forgets `key`: its addresses are withdrawn.
    pub fn remove_service(&mut self, key: &str) {
        self.services.remove(key);
    }

    /// Forgets every Service (a new term: the service controller syncs them all again).
    pub fn clear_services(&mut self) {
        self.services.clear();
    }

    /// An EndpointSlice was added or changed.
    pub fn apply_slice(&mut self, slice: &EndpointSlice) {
        if let Some((key, name, nodes)) = slice_nodes(slice) {
            self.endpoints.entry(key).or_default().insert(name, nodes);
        }
    }

    /// An EndpointSlice was deleted.
    pub fn delete_slice(&mut self, slice: &EndpointSlice) {
        if let Some((key, name, _)) = slice_nodes(slice)
            && let Some(slices) = self.endpoints.get_mut(&key)
        {
            slices.remove(&name);
            if slices.is_empty() {
                self.endpoints.remove(&key);
            }
        }
    }

    /// Every EndpointSlice, as a relisting watch reports them.
    pub fn replace_slices(&mut self, slices: &[EndpointSlice]) {
        self.endpoints.clear();
        for s in slices {
            self.apply_slice(s);
        }
    }

    /// Nodes with a ready endpoint of `key`.
    fn ready_nodes(&self, key: &str) -> BTreeSet<&str> {
        self.endpoints
            .get(key)
            .into_iter()
            .flat_map(|slices| slices.values().flatten())
            .map(String::as_str)
            .collect()
    }

    /// What is announced: each address with at least one next hop. Two Services sharing an
    /// address (a sharing key) announce the union of their Nodes.
    pub fn routes(&self, pools: &[Pool]) -> BTreeMap<IpNet, VipRoute> {
        let mut out: BTreeMap<IpNet, VipRoute> = BTreeMap::new();
        for (key, svc) in &self.services {
            let ready = svc.local.then(|| self.ready_nodes(key));
            for ip in &svc.ips {
                let hops: BTreeSet<IpAddr> = svc
                    .nodes
                    .iter()
                    .filter(|(name, _)| ready.as_ref().is_none_or(|r| r.contains(name.as_str())))
                    .flat_map(|(_, ips)| ips.iter().copied())
                    .filter(|nh| nh.is_ipv4() == ip.is_ipv4())
                    .collect();
                if hops.is_empty() {
                    continue;
                }
                let route = out.entry(IpNet::from(*ip)).or_insert_with(|| {
                    let pool = pools
                        .iter()
                        .find(|p| p.ranges.iter().any(|r| r.contains(*ip)));
                    VipRoute {
                        next_hops: BTreeSet::new(),
                        communities: pool.map(|p| p.bgp_communities.clone()).unwrap_or_default(),
                        local_pref: pool.and_then(|p| p.bgp_local_pref),
                    }
                });
                route.next_hops.extend(hops);
            }
        }
        out
    }
}

/// The Service key, the slice name and the Nodes with a ready endpoint of one EndpointSlice;
/// `None` for a slice of no Service. An endpoint whose `ready` is unset counts as ready, as
/// the API documents.
fn slice_nodes(slice: &EndpointSlice) -> Option<(String, String, BTreeSet<String>)> {
    let service = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    let ns = slice.metadata.namespace.as_deref().unwrap_or("default");
    let name = slice.metadata.name.clone()?;
    let nodes = slice
        .endpoints
        .iter()
        .flatten()
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .filter_map(|e| e.node_name.clone())
        .collect();
    Some((format!("{ns}/{service}"), name, nodes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions};

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn slice(name: &str, service: &str, eps: &[(&str, Option<bool>)]) -> EndpointSlice {
        let mut s = EndpointSlice::default();
        s.metadata.name = Some(name.into());
        s.metadata.namespace = Some("default".into());
        s.metadata.labels = Some([(SERVICE_NAME_LABEL.to_string(), service.to_string())].into());
        s.endpoints = Some(
            eps.iter()
                .map(|(node, ready)| Endpoint {
                    node_name: Some(node.to_string()),
                    conditions: Some(EndpointConditions {
                        ready: *ready,
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect(),
        );
        s
    }

    fn nodes() -> BTreeMap<String, Vec<IpAddr>> {
        BTreeMap::from([
            ("a".into(), vec![ip("192.0.2.11"), ip("2001:db8::11")]),
            ("b".into(), vec![ip("192.0.2.12")]),
        ])
    }

    fn hops(t: &VipTable, vip: &str) -> Vec<String> {
        t.routes(&[])
            .get(&IpNet::from(ip(vip)))
            .map(|r| r.next_hops.iter().map(IpAddr::to_string).collect())
            .unwrap_or_default()
    }

    #[test]
    fn cluster_policy_uses_every_node_of_the_family() {
        let mut t = VipTable::default();
        t.set_service(
            "default/web",
            VipService {
                ips: vec![ip("198.51.100.1"), ip("2001:db8:1::1")],
                local: false,
                nodes: nodes(),
            },
        );
        assert_eq!(hops(&t, "198.51.100.1"), ["192.0.2.11", "192.0.2.12"]);
        assert_eq!(hops(&t, "2001:db8:1::1"), ["2001:db8::11"]);
        let routes = t.routes(&[]);
        assert!(routes.keys().all(|n| n.prefix_len() == n.max_prefix_len()));
        t.remove_service("default/web");
        assert!(t.routes(&[]).is_empty());
    }

    #[test]
    fn local_policy_follows_ready_endpoints() {
        let mut t = VipTable::default();
        t.set_service(
            "default/web",
            VipService {
                ips: vec![ip("198.51.100.1")],
                local: true,
                nodes: nodes(),
            },
        );
        assert!(
            hops(&t, "198.51.100.1").is_empty(),
            "no endpoint: withdrawn"
        );
        t.apply_slice(&slice(
            "web-x",
            "web",
            &[("a", Some(true)), ("b", Some(false))],
        ));
        assert_eq!(hops(&t, "198.51.100.1"), ["192.0.2.11"]);
        t.apply_slice(&slice("web-x", "web", &[("b", None)]));
        assert_eq!(hops(&t, "198.51.100.1"), ["192.0.2.12"]);
        t.apply_slice(&slice("other-x", "other", &[("a", Some(true))]));
        assert_eq!(hops(&t, "198.51.100.1"), ["192.0.2.12"]);
        t.delete_slice(&slice("web-x", "web", &[]));
        assert!(hops(&t, "198.51.100.1").is_empty());
        // A ready endpoint on a Node outside the load-balancer set is no next hop.
        t.replace_slices(&[slice("web-y", "web", &[("c", Some(true))])]);
        assert!(hops(&t, "198.51.100.1").is_empty());
    }
}
