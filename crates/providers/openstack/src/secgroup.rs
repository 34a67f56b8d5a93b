//! `[LoadBalancer] manage-security-groups = true` (upstream `pkg/openstack/loadbalancer_sg.go`):
//! a Neutron security group per Service, `lb-sg-<service uid>-<namespace>-<name>`, whose
//! ingress rules admit exactly the Service's NodePorts (and its `healthCheckNodePort`, TCP) from
//! the members' subnet — where the amphorae connect from — or, with the `ovn` provider, which
//! keeps the clients' addresses, from `loadBalancerSourceRanges` (`0.0.0.0/0` or `::/0` when
//! none). The group goes on the Neutron ports of the member Nodes that hold the member address.
//!
//! The rules are planned as a pure function ([`wanted_rules`], [`plan`]): every rule of the
//! group that is not wanted is deleted, Neutron's default egress rules included (as upstream),
//! so the group admits exactly what the Service asks for. The group is found by its name only
//! (the Service's uid is in it); a group of another name is never read or written. A port
//! update names the port's `revision_number` (`If-Match`): a port changed meanwhile fails the
//! call (retried), never a lost security group. Ports are tagged with the group's id as
//! upstream tags them, so either CCM finds them; the group is taken off ports found by Neutron's
//! `security_groups` filter (every port that has it, tagged or not).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ccm_cloud::{CloudError, CloudResult, Node, Service};
use http::Method;
use ipnet::IpNet;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::http::status_error;
use crate::octavia::{OctaviaLb, enc, node_address};

/// Neutron's longest name.
const MAX_NAME: usize = 255;

/// Ports asked for per Neutron call (`device_id=…` repeated).
const PORTS_PER_CALL: usize = 50;

/// Upstream's group name: `lb-sg-<uid>-<namespace>-<name>`, cut at 255 bytes.
pub fn sg_name(svc: &Service) -> String {
    let mut n = format!(
        "lb-sg-{}-{}-{}",
        svc.metadata.uid.as_deref().unwrap_or(""),
        svc.metadata.namespace.as_deref().unwrap_or("default"),
        svc.metadata.name.as_deref().unwrap_or("")
    );
    if n.len() > MAX_NAME {
        let mut end = MAX_NAME;
        while !n.is_char_boundary(end) {
            end -= 1;
        }
        n.truncate(end);
    }
    n
}

/// Upstream's group description.
pub fn sg_description(cluster: &str, svc: &Service) -> String {
    format!(
        "Security Group for {}/{} Service LoadBalancer in cluster {cluster}",
        svc.metadata.namespace.as_deref().unwrap_or("default"),
        svc.metadata.name.as_deref().unwrap_or("")
    )
}

/// One security-group rule, as compared with what Neutron has (upstream compares direction,
/// protocol, ethertype, remote prefix and port range).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rule {
    /// `ingress` or `egress`.
    pub direction: String,
    /// `IPv4` or `IPv6`.
    pub ethertype: String,
    /// Lower-case protocol (`tcp`, `udp`, `sctp`); `None`: any.
    pub protocol: Option<String>,
    /// Remote CIDR, normalized (host bits cleared); `None`: any (or a remote group).
    pub remote_ip_prefix: Option<String>,
    /// First port.
    pub port_range_min: Option<i64>,
    /// Last port.
    pub port_range_max: Option<i64>,
}

/// A rule as Neutron lists it.
#[derive(Debug, Clone, Deserialize)]
pub struct ExistingRule {
    /// Rule id.
    pub id: String,
    /// `ingress`/`egress`.
    pub direction: String,
    /// `IPv4`/`IPv6`.
    pub ethertype: String,
    /// Protocol name or number.
    #[serde(default)]
    pub protocol: Option<String>,
    /// Remote CIDR.
    #[serde(default)]
    pub remote_ip_prefix: Option<String>,
    /// Remote security group (never one of the wanted rules).
    #[serde(default)]
    pub remote_group_id: Option<String>,
    /// First port.
    #[serde(default)]
    pub port_range_min: Option<i64>,
    /// Last port.
    #[serde(default)]
    pub port_range_max: Option<i64>,
}

impl ExistingRule {
    fn key(&self) -> Option<Rule> {
        if self.remote_group_id.is_some() {
            return None;
        }
        Some(Rule {
            direction: self.direction.clone(),
            ethertype: self.ethertype.clone(),
            protocol: self.protocol.as_ref().map(|p| p.to_ascii_lowercase()),
            remote_ip_prefix: self.remote_ip_prefix.as_deref().map(normalize),
            port_range_min: self.port_range_min,
            port_range_max: self.port_range_max,
        })
    }
}

fn normalize(cidr: &str) -> String {
    cidr.trim()
        .parse::<IpNet>()
        .map(|n| n.trunc().to_string())
        .unwrap_or_else(|_| cidr.trim().to_string())
}

fn ethertype(net: &IpNet) -> &'static str {
    match net {
        IpNet::V4(_) => "IPv4",
        IpNet::V6(_) => "IPv6",
    }
}

fn ingress(net: &IpNet, protocol: &str, port: i64) -> Rule {
    Rule {
        direction: "ingress".into(),
        ethertype: ethertype(net).into(),
        protocol: Some(protocol.to_ascii_lowercase()),
        remote_ip_prefix: Some(net.trunc().to_string()),
        port_range_min: Some(port),
        port_range_max: Some(port),
    }
}

/// The rules the Service's group must hold: per port with a NodePort, one ingress rule from each
/// source CIDR to that NodePort; with a `healthCheckNodePort`, TCP to it from the members'
/// subnet. The sources are `member_cidr` (the amphorae's subnet) unless `ovn` (the provider
/// keeps the clients' addresses): then `loadBalancerSourceRanges`, or everything of the Service's
/// first IP family when none. A source range that is not a CIDR is an error naming it.
pub fn wanted_rules(svc: &Service, member_cidr: &str, ovn: bool) -> CloudResult<Vec<Rule>> {
    let spec = svc.spec.clone().unwrap_or_default();
    let member: IpNet = member_cidr.parse().map_err(|_| {
        CloudError::Permanent(format!(
            "the members' subnet has CIDR {member_cidr:?}, not a CIDR"
        ))
    })?;
    let sources: Vec<IpNet> = if ovn {
        let ranges: Vec<String> = spec
            .load_balancer_source_ranges
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|r| r.trim().to_string())
            .filter(|r| !r.is_empty())
            .collect();
        if ranges.is_empty() {
            let v6 = spec
                .ip_families
                .as_ref()
                .and_then(|f| f.first())
                .is_some_and(|f| f == "IPv6");
            vec![if v6 { "::/0" } else { "0.0.0.0/0" }.parse().expect("cidr")]
        } else {
            ranges
                .iter()
                .map(|r| {
                    r.parse::<IpNet>().map_err(|_| {
                        CloudError::Permanent(format!(
                            "spec.loadBalancerSourceRanges: {r:?} is not a CIDR"
                        ))
                    })
                })
                .collect::<CloudResult<_>>()?
        }
    } else {
        vec![member]
    };
    let mut out = BTreeSet::new();
    if let Some(hc) = spec.health_check_node_port.filter(|p| *p != 0) {
        out.insert(ingress(&member, "tcp", i64::from(hc)));
    }
    for p in spec.ports.unwrap_or_default() {
        let Some(node_port) = p.node_port.filter(|n| *n != 0) else {
            continue;
        };
        let proto = p.protocol.as_deref().unwrap_or("TCP");
        for net in &sources {
            out.insert(ingress(net, proto, i64::from(node_port)));
        }
    }
    Ok(out.into_iter().collect())
}

/// What to create and which rule ids to delete so that the group holds exactly `wanted`.
pub fn plan(wanted: &[Rule], existing: &[ExistingRule]) -> (Vec<Rule>, Vec<String>) {
    let have: BTreeSet<Rule> = existing.iter().filter_map(ExistingRule::key).collect();
    let want: BTreeSet<&Rule> = wanted.iter().collect();
    let create = wanted
        .iter()
        .filter(|r| !have.contains(*r))
        .cloned()
        .collect();
    let mut seen = BTreeSet::new();
    let delete = existing
        .iter()
        .filter(|e| match e.key() {
            // A second copy of a wanted rule goes too.
            Some(k) => !want.contains(&k) || !seen.insert(k),
            None => true,
        })
        .map(|e| e.id.clone())
        .collect();
    (create, delete)
}

#[derive(Debug, Clone, Deserialize)]
struct Group {
    id: String,
    #[serde(default)]
    name: String,
}

#[derive(Debug, Clone, Deserialize)]
struct FixedIp {
    ip_address: String,
    #[serde(default)]
    subnet_id: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
struct SgPort {
    id: String,
    #[serde(default)]
    fixed_ips: Vec<FixedIp>,
    #[serde(default)]
    security_groups: Vec<String>,
    #[serde(default = "yes")]
    port_security_enabled: bool,
    #[serde(default)]
    revision_number: Option<u64>,
}

/// `device_id=a&device_id=b` (built apart from the async code: the serializer is not `Send`).
fn device_query(ids: &[&String]) -> String {
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    for id in ids {
        q.append_pair("device_id", id);
    }
    q.finish()
}

fn yes() -> bool {
    true
}

fn is_member_port(port: &SgPort, addr: &str, member_subnet: Option<&str>) -> bool {
    port.fixed_ips.iter().any(|ip| {
        ip.ip_address == addr && member_subnet.is_none_or(|s| ip.subnet_id.as_deref() == Some(s))
    })
}

impl OctaviaLb {
    async fn net(
        &self,
        op: &str,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> CloudResult<crate::http::Reply> {
        self.cloud
            .keystone()
            .request("network", op, method, path, headers, body)
            .await
    }

    /// The Service's group, by its exact name; two of the name is an error (never a guess).
    async fn find_group(&self, name: &str) -> CloudResult<Option<Group>> {
        let op = "network GET /v2.0/security-groups";
        let reply = self
            .net(
                op,
                Method::GET,
                &format!(
                    "/v2.0/security-groups?name={}&fields=id&fields=name",
                    enc(name)
                ),
                &[],
                None,
            )
            .await?;
        if !reply.status.is_success() {
            return Err(status_error(op, &reply));
        }
        let found: Vec<Group> = reply.field(op, "security_groups")?;
        let mut it = found.into_iter().filter(|g| g.name == name);
        let first = it.next();
        if it.next().is_some() {
            return Err(CloudError::Permanent(format!(
                "more than one security group is named {name}; delete the extra one"
            )));
        }
        Ok(first)
    }

    async fn subnet_cidr(&self, id: &str) -> CloudResult<String> {
        let op = "network GET /v2.0/subnets/{id}";
        let reply = self
            .net(
                op,
                Method::GET,
                &format!("/v2.0/subnets/{}", enc(id)),
                &[],
                None,
            )
            .await?;
        if !reply.status.is_success() {
            return Err(status_error(op, &reply));
        }
        let v: Value = reply.field(op, "subnet")?;
        v["cidr"].as_str().map(str::to_string).ok_or_else(|| {
            CloudError::Transient(format!("{op}: unexpected response body (no cidr)"))
        })
    }

    async fn list_ports(&self, query: &str) -> CloudResult<Vec<SgPort>> {
        let op = "network GET /v2.0/ports";
        let reply = self
            .net(op, Method::GET, &format!("/v2.0/ports?{query}"), &[], None)
            .await?;
        if !reply.status.is_success() {
            return Err(status_error(op, &reply));
        }
        reply.field(op, "ports")
    }

    /// Sets a port's security groups, naming its revision: a port changed meanwhile is a
    /// transient error (retried), never an overwrite.
    async fn set_port_groups(&self, port: &SgPort, groups: Vec<String>) -> CloudResult<()> {
        let op = "network PUT /v2.0/ports/{id}";
        let if_match = port.revision_number.map(|r| format!("revision_number={r}"));
        let headers: Vec<(&str, &str)> = if_match
            .as_deref()
            .map(|v| vec![("if-match", v)])
            .unwrap_or_default();
        let reply = self
            .net(
                op,
                Method::PUT,
                &format!("/v2.0/ports/{}", enc(&port.id)),
                &headers,
                Some(&json!({"port": {"security_groups": groups}})),
            )
            .await?;
        match reply.status.as_u16() {
            200..=299 => Ok(()),
            412 => Err(CloudError::Transient(format!(
                "{op}: port {} changed while its security groups were updated; retrying later",
                port.id
            ))),
            _ => Err(status_error(op, &reply)),
        }
    }

    async fn tag_port(&self, port: &str, tag: &str, add: bool) -> CloudResult<()> {
        let (op, method) = if add {
            ("network PUT /v2.0/ports/{id}/tags/{tag}", Method::PUT)
        } else {
            ("network DELETE /v2.0/ports/{id}/tags/{tag}", Method::DELETE)
        };
        let reply = self
            .net(
                op,
                method,
                &format!("/v2.0/ports/{}/tags/{}", enc(port), enc(tag)),
                &[],
                None,
            )
            .await?;
        match reply.status.as_u16() {
            200..=299 => Ok(()),
            404 if !add => Ok(()),
            _ => Err(status_error(op, &reply)),
        }
    }

    /// Takes `sg` off `port` (and the tag upstream puts beside it).
    async fn detach(&self, port: &SgPort, sg: &str) -> CloudResult<()> {
        if port.security_groups.iter().any(|g| g == sg) {
            let rest = port
                .security_groups
                .iter()
                .filter(|g| *g != sg)
                .cloned()
                .collect();
            self.set_port_groups(port, rest).await?;
        }
        self.tag_port(&port.id, sg, false).await
    }

    /// Ports that have `sg` (Neutron's `security_groups` filter; checked again here).
    async fn ports_with(&self, sg: &str) -> CloudResult<Vec<SgPort>> {
        Ok(self
            .list_ports(&format!("security_groups={}", enc(sg)))
            .await?
            .into_iter()
            .filter(|p| p.security_groups.iter().any(|g| g == sg))
            .collect())
    }

    /// The group of `svc` with exactly the wanted rules, on the member Nodes' ports and on no
    /// other port.
    pub(crate) async fn ensure_security_group(
        &self,
        cluster: &str,
        svc: &Service,
        member_subnet: &str,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        let name = sg_name(svc);
        let sg = match self.find_group(&name).await? {
            Some(g) => g.id,
            None => {
                let op = "network POST /v2.0/security-groups";
                let body = json!({"security_group": {"name": name, "description": sg_description(cluster, svc)}});
                let reply = self
                    .net(op, Method::POST, "/v2.0/security-groups", &[], Some(&body))
                    .await?;
                if !reply.status.is_success() {
                    return Err(status_error(op, &reply));
                }
                let g: Group = reply.field(op, "security_group")?;
                g.id
            }
        };
        let cidr = self.subnet_cidr(member_subnet).await?;
        let ovn = self.config.provider.as_deref() == Some("ovn");
        let wanted = wanted_rules(svc, &cidr, ovn)?;
        let op = "network GET /v2.0/security-group-rules";
        let reply = self
            .net(
                op,
                Method::GET,
                &format!("/v2.0/security-group-rules?security_group_id={}", enc(&sg)),
                &[],
                None,
            )
            .await?;
        if !reply.status.is_success() {
            return Err(status_error(op, &reply));
        }
        let existing: Vec<ExistingRule> = reply.field(op, "security_group_rules")?;
        let (create, delete) = plan(&wanted, &existing);
        for r in create {
            let op = "network POST /v2.0/security-group-rules";
            let body = json!({"security_group_rule": {
                "security_group_id": sg, "direction": r.direction, "ethertype": r.ethertype,
                "protocol": r.protocol, "remote_ip_prefix": r.remote_ip_prefix,
                "port_range_min": r.port_range_min, "port_range_max": r.port_range_max}});
            let reply = self
                .net(
                    op,
                    Method::POST,
                    "/v2.0/security-group-rules",
                    &[],
                    Some(&body),
                )
                .await?;
            // 409: the rule exists (a concurrent writer); what is wanted is there.
            if !(reply.status.is_success() || reply.status.as_u16() == 409) {
                return Err(status_error(op, &reply));
            }
        }
        for id in delete {
            let op = "network DELETE /v2.0/security-group-rules/{id}";
            let reply = self
                .net(
                    op,
                    Method::DELETE,
                    &format!("/v2.0/security-group-rules/{}", enc(&id)),
                    &[],
                    None,
                )
                .await?;
            if !(reply.status.is_success() || reply.status.as_u16() == 404) {
                return Err(status_error(op, &reply));
            }
        }

        // The member ports: the Node's port holding its member address on the members' subnet
        // (as upstream).
        let region = self.cloud.config().global.region.clone();
        let mut addr_of: BTreeMap<String, String> = BTreeMap::new();
        for n in nodes {
            let Some(addr) = node_address(n) else {
                continue;
            };
            let pid = n
                .spec
                .as_ref()
                .and_then(|s| s.provider_id.as_deref())
                .unwrap_or_default();
            let server = crate::instances::server_id(pid, &region).map_err(|e| {
                CloudError::Permanent(format!(
                    "node {}: {e}; its port cannot get the load balancer's security group",
                    n.metadata.name.as_deref().unwrap_or("")
                ))
            })?;
            addr_of.insert(server, addr);
        }
        let servers: Vec<&String> = addr_of.keys().collect();
        let subnet_filter = Some(member_subnet);
        let mut members = BTreeSet::new();
        for chunk in servers.chunks(PORTS_PER_CALL) {
            let ports = self.list_ports(&device_query(chunk)).await?;
            for port in ports {
                if !chunk
                    .iter()
                    .any(|s| is_member_port(&port, &addr_of[*s], subnet_filter))
                {
                    continue;
                }
                members.insert(port.id.clone());
                // A port without port security cannot take a security group (as upstream).
                if !port.port_security_enabled || port.security_groups.contains(&sg) {
                    continue;
                }
                let mut groups = port.security_groups.clone();
                groups.push(sg.clone());
                self.set_port_groups(&port, groups).await?;
                self.tag_port(&port.id, &sg, true).await?;
            }
        }
        // Ports that left the load balancer (a Node removed) lose the group.
        for port in self.ports_with(&sg).await? {
            if !members.contains(&port.id) {
                self.detach(&port, &sg).await?;
            }
        }
        Ok(())
    }

    /// The Service's group off every port, then deleted; none: done. A group Neutron still
    /// finds in use (409) is an error, retried.
    pub(crate) async fn delete_security_group(&self, svc: &Service) -> CloudResult<()> {
        let Some(g) = self.find_group(&sg_name(svc)).await? else {
            return Ok(());
        };
        for port in self.ports_with(&g.id).await? {
            self.detach(&port, &g.id).await?;
        }
        let op = "network DELETE /v2.0/security-groups/{id}";
        let reply = self
            .net(
                op,
                Method::DELETE,
                &format!("/v2.0/security-groups/{}", enc(&g.id)),
                &[],
                None,
            )
            .await?;
        match reply.status.as_u16() {
            200..=299 | 404 => Ok(()),
            _ => Err(status_error(op, &reply)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ccm_cloud::k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};

    fn svc(ports: &[(&str, i32)], ranges: &[&str], hc: Option<i32>) -> Service {
        let mut s = Service::default();
        s.metadata.name = Some("web".into());
        s.metadata.namespace = Some("ns".into());
        s.metadata.uid = Some("1234".into());
        s.spec = Some(ServiceSpec {
            ports: Some(
                ports
                    .iter()
                    .enumerate()
                    .map(|(i, (proto, np))| ServicePort {
                        protocol: Some((*proto).into()),
                        port: 80 + i as i32,
                        node_port: Some(*np),
                        ..Default::default()
                    })
                    .collect(),
            ),
            load_balancer_source_ranges: (!ranges.is_empty())
                .then(|| ranges.iter().map(|r| r.to_string()).collect()),
            health_check_node_port: hc,
            ..Default::default()
        });
        s
    }

    fn rule(proto: &str, cidr: &str, port: i64) -> Rule {
        ingress(&cidr.parse().expect("cidr"), proto, port)
    }

    fn existing(id: &str, r: &Rule) -> ExistingRule {
        ExistingRule {
            id: id.into(),
            direction: r.direction.clone(),
            ethertype: r.ethertype.clone(),
            protocol: r.protocol.clone(),
            remote_ip_prefix: r.remote_ip_prefix.clone(),
            remote_group_id: None,
            port_range_min: r.port_range_min,
            port_range_max: r.port_range_max,
        }
    }

    #[test]
    fn names_are_upstreams() {
        let s = svc(&[("TCP", 30080)], &[], None);
        assert_eq!(sg_name(&s), "lb-sg-1234-ns-web");
        assert_eq!(
            sg_description("kubernetes", &s),
            "Security Group for ns/web Service LoadBalancer in cluster kubernetes"
        );
    }

    #[test]
    fn amphorae_get_the_node_ports_from_the_member_subnet_only() {
        let s = svc(
            &[("TCP", 30080), ("UDP", 30053), ("TCP", 0)],
            &["192.168.0.0/16"],
            Some(32000),
        );
        let w = wanted_rules(&s, "10.1.0.0/24", false).expect("rules");
        assert_eq!(
            w,
            vec![
                rule("tcp", "10.1.0.0/24", 30080),
                rule("tcp", "10.1.0.0/24", 32000),
                rule("udp", "10.1.0.0/24", 30053),
            ]
        );
    }

    #[test]
    fn ovn_admits_exactly_the_source_ranges_or_everything() {
        let s = svc(&[("TCP", 30080)], &["10.0.0.1/8", "192.168.0.0/16"], None);
        let w = wanted_rules(&s, "10.1.0.0/24", true).expect("rules");
        assert_eq!(
            w,
            vec![
                rule("tcp", "10.0.0.0/8", 30080),
                rule("tcp", "192.168.0.0/16", 30080)
            ]
        );
        let open = svc(&[("TCP", 30080)], &[], None);
        assert_eq!(
            wanted_rules(&open, "10.1.0.0/24", true).expect("rules"),
            vec![rule("tcp", "0.0.0.0/0", 30080)]
        );
        let bad = svc(&[("TCP", 30080)], &["ten"], None);
        let e = wanted_rules(&bad, "10.1.0.0/24", true).expect_err("not a CIDR");
        assert!(e.to_string().contains("loadBalancerSourceRanges"), "{e}");
    }

    #[test]
    fn stale_rules_and_neutrons_default_egress_are_revoked() {
        let wanted = vec![rule("tcp", "10.0.0.0/8", 30080)];
        let mut egress = existing("e4", &rule("tcp", "0.0.0.0/0", 1));
        egress.direction = "egress".into();
        egress.protocol = None;
        egress.remote_ip_prefix = None;
        egress.port_range_min = None;
        egress.port_range_max = None;
        let have = vec![
            egress,
            existing("keep", &rule("TCP", "10.0.0.0/8", 30080)),
            existing("dup", &rule("tcp", "10.0.0.0/8", 30080)),
            existing("wide", &rule("tcp", "0.0.0.0/0", 30080)),
            existing("oldport", &rule("tcp", "10.0.0.0/8", 30053)),
        ];
        let (create, delete) = plan(&wanted, &have);
        assert!(create.is_empty(), "{create:?}");
        assert_eq!(delete, vec!["e4", "dup", "wide", "oldport"]);
        let (create, delete) = plan(&wanted, &[]);
        assert_eq!((create, delete), (wanted.clone(), vec![]));
    }
}
