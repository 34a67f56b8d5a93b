//! A Node's addresses from its server and ports, in upstream's order and by upstream's
//! `[Networking]` rules: the fixed IPs of the server's ACTIVE ports (InternalIP), the access
//! IPs (ExternalIP), the `hostname` metadata (Hostname), then the server's addresses network by
//! network in name order — floating IPs and `public-network-name` networks ExternalIP, the
//! others InternalIP when `internal-network-name` is unset or names them, dropped otherwise —
//! IPv6 left out when `ipv6-support-disabled`, and finally `address-sort-order`.

use std::net::IpAddr;

use ccm_cloud::NodeAddress;

use crate::config::NetworkingOpts;
use crate::nova::{Port, Server};

fn is_v6(addr: &str) -> bool {
    matches!(addr.parse::<IpAddr>(), Ok(IpAddr::V6(_)))
}

fn add(out: &mut Vec<NodeAddress>, type_: &str, address: &str) {
    if !out.iter().any(|a| a.type_ == type_ && a.address == address) {
        out.push(NodeAddress {
            type_: type_.into(),
            address: address.into(),
        });
    }
}

fn remove(out: &mut Vec<NodeAddress>, address: &str) {
    out.retain(|a| a.address != address);
}

/// The addresses of `server` whose ports are `ports`.
pub fn node_addresses(server: &Server, ports: &[&Port], opts: &NetworkingOpts) -> Vec<NodeAddress> {
    let keep = |a: &str| !(opts.ipv6_support_disabled && is_v6(a));
    let mut out = Vec::new();
    for port in ports.iter().filter(|p| p.status == "ACTIVE") {
        for ip in port.fixed_ips.iter().filter(|ip| keep(&ip.ip_address)) {
            add(&mut out, "InternalIP", &ip.ip_address);
        }
    }
    if !server.access_ipv4.is_empty() {
        add(&mut out, "ExternalIP", &server.access_ipv4);
    }
    if !server.access_ipv6.is_empty() && !opts.ipv6_support_disabled {
        add(&mut out, "ExternalIP", &server.access_ipv6);
    }
    if let Some(h) = server.metadata.get("hostname").filter(|h| !h.is_empty()) {
        add(&mut out, "Hostname", h);
    }
    for (network, addrs) in &server.addresses {
        for a in addrs {
            let type_ = if a.kind == "floating" {
                "ExternalIP"
            } else if opts.public_network_name.contains(network) {
                remove(&mut out, &a.addr);
                "ExternalIP"
            } else if opts.internal_network_name.is_empty()
                || opts.internal_network_name.contains(network)
            {
                "InternalIP"
            } else {
                remove(&mut out, &a.addr);
                continue;
            };
            if keep(&a.addr) {
                add(&mut out, type_, &a.addr);
            }
        }
    }
    if !opts.address_sort_order.is_empty() {
        sort(&mut out, opts);
    }
    out
}

/// Upstream's stable sort: addresses in an earlier `address-sort-order` CIDR first, ascending
/// within one CIDR; addresses in none keep their place after them.
fn sort(out: &mut [NodeAddress], opts: &NetworkingOpts) {
    let list = &opts.address_sort_order;
    let priority = |a: &str| -> usize {
        a.parse::<IpAddr>()
            .ok()
            .and_then(|ip| list.iter().position(|c| c.contains(&ip)))
            .map_or(0, |i| list.len() - i)
    };
    out.sort_by(|l, r| {
        let (pl, pr) = (priority(&l.address), priority(&r.address));
        if pl > 0 && pl == pr {
            let ip = |s: &str| s.parse::<IpAddr>().ok();
            ip(&l.address).cmp(&ip(&r.address))
        } else {
            pr.cmp(&pl)
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nova::{FixedIp, ServerAddress};

    fn server() -> Server {
        let mut s = Server {
            id: "s".into(),
            access_ipv4: "203.0.113.9".into(),
            ..Default::default()
        };
        s.metadata.insert("hostname".into(), "node-a".into());
        let a = |addr: &str, kind: &str| ServerAddress {
            addr: addr.into(),
            kind: kind.into(),
        };
        s.addresses.insert(
            "private".into(),
            vec![
                a("10.0.0.5", "fixed"),
                a("198.51.100.7", "floating"),
                a("fd00::5", "fixed"),
            ],
        );
        s.addresses
            .insert("public".into(), vec![a("192.0.2.5", "fixed")]);
        s.addresses
            .insert("storage".into(), vec![a("172.16.0.5", "fixed")]);
        s
    }

    fn port(status: &str, ips: &[&str]) -> Port {
        Port {
            device_id: "s".into(),
            status: status.into(),
            fixed_ips: ips
                .iter()
                .map(|i| FixedIp {
                    ip_address: (*i).into(),
                })
                .collect(),
        }
    }

    fn pairs(v: &[NodeAddress]) -> Vec<(String, String)> {
        v.iter()
            .map(|a| (a.type_.clone(), a.address.clone()))
            .collect()
    }

    fn p(t: &str, a: &str) -> (String, String) {
        (t.into(), a.into())
    }

    #[test]
    fn upstream_order_and_network_rules() {
        let opts = NetworkingOpts {
            public_network_name: vec!["public".into()],
            internal_network_name: vec!["private".into()],
            ..Default::default()
        };
        let active = port("ACTIVE", &["10.0.0.5", "172.16.0.5"]);
        let down = port("DOWN", &["10.9.9.9"]);
        let got = node_addresses(&server(), &[&active, &down], &opts);
        assert_eq!(
            pairs(&got),
            vec![
                p("InternalIP", "10.0.0.5"),
                p("ExternalIP", "203.0.113.9"),
                p("Hostname", "node-a"),
                p("ExternalIP", "198.51.100.7"),
                p("InternalIP", "fd00::5"),
                p("ExternalIP", "192.0.2.5"),
            ],
            "storage is not an internal network, so its port IP is dropped too"
        );
    }

    #[test]
    fn ipv6_switch_and_sort_order() {
        let opts = NetworkingOpts {
            ipv6_support_disabled: true,
            address_sort_order: vec![
                "192.0.2.0/24".parse().unwrap(),
                "10.0.0.0/8".parse().unwrap(),
            ],
            ..Default::default()
        };
        let got = node_addresses(&server(), &[], &opts);
        assert!(got.iter().all(|a| !a.address.contains(':')), "{got:?}");
        assert_eq!(got[0].address, "192.0.2.5");
        assert_eq!(got[1].address, "10.0.0.5");
    }
}
