//! Network Load Balancers (`aws-load-balancer-type: nlb`): a TCP listener per Service port
//! forwarding to a target group of instance targets on the NodePort, and, since NLBs carry no
//! security group of their own, rules on the nodes' groups as upstream adds them: client
//! ranges to each NodePort (`kubernetes.io/rule/nlb/client=<lb>`) and the VPC to the health
//! check port (`kubernetes.io/rule/nlb/health=<lb>`).

use std::collections::BTreeSet;
use std::sync::Arc;

use aws_sdk_ec2::types::Filter;

use crate::sg::{self, Rule};
use aws_sdk_elasticloadbalancingv2::types::{
    Action, ActionTypeEnum, Certificate, IpAddressType, Listener, LoadBalancerAttribute,
    LoadBalancerSchemeEnum, LoadBalancerTypeEnum, ProtocolEnum, SubnetMapping, Tag,
    TargetDescription, TargetGroup, TargetGroupAttribute, TargetGroupIpAddressTypeEnum,
    TargetTypeEnum,
};
use ccm_cloud::{CloudError, CloudResult, Node};

use crate::annotations::{LbSpec, PortMap};
use crate::cloud::AwsCloud;
use crate::error;
use crate::lb::resource_tags;

/// An NLB as found by name.
pub(crate) struct Nlb {
    pub arn: String,
    pub dns: String,
    pub vpc: String,
    /// Its security groups: AWS attaches them only at creation.
    pub groups: Vec<String>,
    /// It answers on IPv6 too.
    pub dualstack: bool,
    /// Its scheme is `internal`.
    pub internal: bool,
}

/// What an NLB update needs to know of the NLB: its VPC and its target groups (ARN, NodePort).
#[derive(Clone, Debug)]
pub(crate) struct NlbTargets {
    pub vpc: String,
    pub groups: Vec<(String, i32)>,
    /// The NLB's managed security group, which the node groups admit traffic from.
    pub source: Option<String>,
}

/// Description prefix of the client rules upstream puts on node groups for an NLB.
pub const CLIENT_RULE: &str = "kubernetes.io/rule/nlb/client=";
/// Description prefix of the health-check rules.
pub const HEALTH_RULE: &str = "kubernetes.io/rule/nlb/health=";

/// One mapping per subnet, with the EIP allocation or private address the annotations give
/// for it, as upstream's `createSubnetMappings` (the counts must match, as upstream checks).
fn subnet_mappings(spec: &LbSpec, subnets: Vec<String>) -> CloudResult<Vec<SubnetMapping>> {
    use crate::annotations::{EIP_ALLOCATIONS, PRIVATE_IPV4};
    for (key, list) in [
        (EIP_ALLOCATIONS, &spec.eip_allocations),
        (PRIVATE_IPV4, &spec.private_ipv4),
    ] {
        if !list.is_empty() && list.len() != subnets.len() {
            return Err(CloudError::Permanent(format!(
                "annotation {key}: must have the same number of entries ({}) as the load balancer has subnets ({})",
                list.len(),
                subnets.len()
            )));
        }
    }
    if !spec.eip_allocations.is_empty() && spec.internal {
        return Err(CloudError::Permanent(format!(
            "annotation {}: Elastic IPs are for internet-facing NLBs",
            crate::annotations::EIP_ALLOCATIONS
        )));
    }
    if !spec.private_ipv4.is_empty() && !spec.internal {
        return Err(CloudError::Permanent(format!(
            "annotation {}: private IPv4 addresses are for internal NLBs",
            crate::annotations::PRIVATE_IPV4
        )));
    }
    Ok(subnets
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            SubnetMapping::builder()
                .subnet_id(s)
                .set_allocation_id(spec.eip_allocations.get(i).cloned())
                .set_private_ipv4_address(spec.private_ipv4.get(i).cloned())
                .build()
        })
        .collect())
}

/// The listener's protocol: TLS on a port with the certificate, else the port's.
fn listener_proto(p: &PortMap) -> &'static str {
    if p.tls { "TLS" } else { p.protocol() }
}

/// The target group's protocol: TLS to the nodes too with `backend-protocol: ssl`, as upstream.
fn target_proto(spec: &LbSpec, p: &PortMap) -> &'static str {
    if p.tls && spec.tls.backend.as_deref() == Some("ssl") {
        "TLS"
    } else {
        p.protocol()
    }
}

/// Whether `l` is the port's listener: same port, and UDP apart from TCP/TLS (a TCP listener
/// turns TLS in place when the certificate comes, rather than a second listener on the port).
fn listener_for(l: &Listener, p: &PortMap) -> bool {
    let udp = l.protocol() == Some(&ProtocolEnum::Udp);
    l.port() == Some(p.port) && udp == p.udp
}

/// The certificate and policy a TLS listener carries (none otherwise).
fn listener_tls(spec: &LbSpec, p: &PortMap) -> (Option<Vec<Certificate>>, Option<String>) {
    if !p.tls {
        return (None, None);
    }
    let cert = spec
        .tls
        .cert
        .as_ref()
        .map(|c| vec![Certificate::builder().certificate_arn(c).build()]);
    (cert, spec.tls.policy.clone())
}

/// Whether the listener already has the protocol, certificate and policy it should.
fn listener_same(l: &Listener, spec: &LbSpec, p: &PortMap) -> bool {
    let cert = l.certificates().first().and_then(|c| c.certificate_arn());
    l.protocol() == Some(&ProtocolEnum::from(listener_proto(p)))
        && if p.tls {
            cert == spec.tls.cert.as_deref()
                && (spec.tls.policy.is_none() || l.ssl_policy() == spec.tls.policy.as_deref())
        } else {
            // AWS drops the certificate with the change to TCP (moto keeps showing it).
            true
        }
}

fn ip_type(spec: &LbSpec) -> IpAddressType {
    match spec.dualstack {
        true => IpAddressType::Dualstack,
        false => IpAddressType::Ipv4,
    }
}

fn target_ip_type(spec: &LbSpec) -> TargetGroupIpAddressTypeEnum {
    match spec.ipv6_targets {
        true => TargetGroupIpAddressTypeEnum::Ipv6,
        false => TargetGroupIpAddressTypeEnum::Ipv4,
    }
}

/// Target-group attributes with a known default, restored when the annotation drops them.
const TG_DEFAULTS: &[(&str, &str)] = &[
    ("proxy_protocol_v2.enabled", "false"),
    ("deregistration_delay.timeout_seconds", "300"),
    (
        "deregistration_delay.connection_termination.enabled",
        "false",
    ),
    ("stickiness.enabled", "false"),
];

/// Up to 8 of the ASCII letters and digits of `s` (upstream's `invalidELBV2NameRegex` and
/// `%.8s`).
fn short(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(8)
        .collect()
}

/// Target group name exactly as upstream's `buildTargetGroupName`, so groups cloud-provider-aws
/// created are recognised: `k8s-<ns:8>-<name:8>-<sha1:10>`, the SHA-1 over the cluster id, the
/// Service, the ports and what a target group cannot change in place (target protocol and
/// type, health-check protocol and interval).
pub fn target_group_name(cluster_id: &str, spec: &LbSpec, p: &PortMap) -> String {
    use sha1::Digest as _;
    let (ns, name) = spec
        .service_name
        .split_once('/')
        .unwrap_or(("", &spec.service_name));
    let mut h = sha1::Sha1::new();
    for part in [
        cluster_id,
        ns,
        name,
        &p.port.to_string(),
        &p.node_port.to_string(),
        target_proto(spec, p),
        "instance",
        &spec.health.protocol,
        &spec.health.interval.to_string(),
    ] {
        h.update(part.as_bytes());
    }
    // An IPv6 group cannot take the IPv4 one's name (both exist while traffic moves over);
    // IPv4 groups keep upstream's names.
    if spec.ipv6_targets {
        h.update(b"ipv6");
    }
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("k8s-{}-{}-{}", short(ns), short(name), &hex[..10])
}

/// Whether an existing target group must be replaced rather than changed in place: what AWS
/// cannot modify (protocol), and what upstream replaces it for (health-check protocol and
/// interval) — so both make the same decision on the same group.
fn must_replace(g: &TargetGroup, spec: &LbSpec, p: &PortMap) -> bool {
    let ip = g
        .ip_address_type()
        .cloned()
        .unwrap_or(TargetGroupIpAddressTypeEnum::Ipv4);
    ip != target_ip_type(spec)
        || g.protocol() != Some(&ProtocolEnum::from(target_proto(spec, p)))
        || !g
            .health_check_protocol()
            .is_some_and(|p| p.as_str().eq_ignore_ascii_case(&spec.health.protocol))
        || g.health_check_interval_seconds() != Some(spec.health.interval)
}

fn health_ports(spec: &LbSpec) -> Vec<i32> {
    match spec.health.port.parse::<i32>() {
        Ok(p) => vec![p],
        Err(_) => spec.ports.iter().map(|p| p.node_port).collect(),
    }
}

/// True when `outer` contains every address of `inner` (both CIDRs; unparsable → false).
fn covers(outer: &str, inner: &str) -> bool {
    match (outer.parse::<ipnet::IpNet>(), inner.parse::<ipnet::IpNet>()) {
        (Ok(o), Ok(i)) => o.contains(&i),
        _ => false,
    }
}

/// The node-group rules an NLB needs, as (port, CIDR, description): its client ranges to each
/// NodePort, and the VPC's CIDRs to each health-check port — except where a client rule on the
/// same port already admits that CIDR. Upstream adds both; with the default `0.0.0.0/0` and a
/// traffic-port health check that is two rules where one does, and AWS allows 60 inbound rules
/// per security group: 25 Classic ELBs and 25 single-port NLBs need 50 rules here, 75 upstream.
pub(crate) fn node_rules(
    name: &str,
    spec: &LbSpec,
    vpc_cidrs: &[String],
) -> Vec<(i32, String, String)> {
    let client = format!("{CLIENT_RULE}{name}");
    let health = format!("{HEALTH_RULE}{name}");
    let mut want: Vec<(i32, String, String)> = Vec::new();
    for p in &spec.ports {
        for c in &spec.source_ranges {
            want.push((p.node_port, c.clone(), client.clone()));
        }
    }
    // Health checks are TCP (or HTTP/HTTPS) even for UDP ports: a UDP client rule admits none.
    let tcp = spec.client_protocol() == "tcp";
    for port in health_ports(spec) {
        for cidr in vpc_cidrs {
            let admitted = tcp && want.iter().any(|(p, c, _)| *p == port && covers(c, cidr));
            if !admitted {
                want.push((port, cidr.clone(), health.clone()));
            }
        }
    }
    want
}

impl AwsCloud {
    pub(crate) async fn nlb_find(&self, name: &str) -> CloudResult<Option<Nlb>> {
        let elbv2 = self.clients().await?.elbv2.clone();
        match self
            .call_raw(
                "DescribeLoadBalancers",
                elbv2.describe_load_balancers().names(name).send(),
            )
            .await
        {
            Ok(out) => Ok(out
                .load_balancers()
                .iter()
                .find(|lb| lb.r#type() == Some(&LoadBalancerTypeEnum::Network))
                .map(|lb| Nlb {
                    arn: lb.load_balancer_arn().unwrap_or_default().to_string(),
                    dns: lb.dns_name().unwrap_or_default().to_string(),
                    vpc: lb.vpc_id().unwrap_or_default().to_string(),
                    groups: lb.security_groups().to_vec(),
                    dualstack: lb.ip_address_type() == Some(&IpAddressType::Dualstack),
                    internal: lb.scheme() == Some(&LoadBalancerSchemeEnum::Internal),
                })),
            Err(e) if error::code(&e) == Some("LoadBalancerNotFound") => Ok(None),
            Err(e) => Err(error::map("DescribeLoadBalancers", e)),
        }
    }

    async fn nlb_create(
        &self,
        cluster: &str,
        name: &str,
        vpc: &str,
        spec: &LbSpec,
        group: Option<&str>,
    ) -> CloudResult<Nlb> {
        let elbv2 = self.clients().await?.elbv2.clone();
        let subnets = self.lb_subnets(cluster, vpc, spec).await?;
        let tags = resource_tags(self, cluster, spec)
            .into_iter()
            .map(|(k, v)| Tag::builder().key(k).value(v).build())
            .collect();
        let scheme = if spec.internal {
            LoadBalancerSchemeEnum::Internal
        } else {
            LoadBalancerSchemeEnum::InternetFacing
        };
        let out = self
            .call(
                "CreateLoadBalancer",
                elbv2
                    .create_load_balancer()
                    .name(name)
                    .r#type(LoadBalancerTypeEnum::Network)
                    .scheme(scheme)
                    .set_subnet_mappings(Some(subnet_mappings(spec, subnets)?))
                    .set_security_groups(group.map(|g| vec![g.to_string()]))
                    .ip_address_type(ip_type(spec))
                    .set_tags(Some(tags))
                    .send(),
            )
            .await?;
        let lb = out.load_balancers().first().ok_or_else(|| {
            CloudError::Transient(format!(
                "CreateLoadBalancer {name}: no load balancer in the answer"
            ))
        })?;
        Ok(Nlb {
            arn: lb.load_balancer_arn().unwrap_or_default().to_string(),
            dns: lb.dns_name().unwrap_or_default().to_string(),
            vpc: vpc.to_string(),
            groups: lb.security_groups().to_vec(),
            dualstack: spec.dualstack,
            internal: spec.internal,
        })
    }

    /// The additional-resource-tags annotation's tags on an existing NLB, added or changed
    /// where they differ (a tag no longer in the annotation stays, as upstream: nothing tells
    /// it from one added by someone else).
    async fn nlb_sync_tags(&self, cluster: &str, arn: &str, spec: &LbSpec) -> CloudResult<()> {
        if spec.extra_tags.is_empty() {
            return Ok(());
        }
        let elbv2 = self.clients().await?.elbv2.clone();
        let out = self
            .call(
                "DescribeTags",
                elbv2.describe_tags().resource_arns(arn).send(),
            )
            .await?;
        let have: Vec<(&str, &str)> = out
            .tag_descriptions()
            .iter()
            .flat_map(|d| d.tags())
            .map(|t| (t.key().unwrap_or_default(), t.value().unwrap_or_default()))
            .collect();
        let add: Vec<Tag> = resource_tags(self, cluster, spec)
            .into_iter()
            .filter(|(k, v)| !have.contains(&(k.as_str(), v.as_str())))
            .map(|(k, v)| Tag::builder().key(k).value(v).build())
            .collect();
        if add.is_empty() {
            return Ok(());
        }
        self.call(
            "AddTags",
            elbv2
                .add_tags()
                .resource_arns(arn)
                .set_tags(Some(add))
                .send(),
        )
        .await
        .map(|_| ())
    }

    /// Target groups of the LB (none when it has none: moto then answers TargetGroupNotFound).
    async fn nlb_target_groups(&self, lb_arn: &str) -> CloudResult<Vec<TargetGroup>> {
        let elbv2 = self.clients().await?.elbv2.clone();
        match self
            .call_raw(
                "DescribeTargetGroups",
                elbv2
                    .describe_target_groups()
                    .load_balancer_arn(lb_arn)
                    .send(),
            )
            .await
        {
            Ok(out) => Ok(out.target_groups().to_vec()),
            Err(e) if error::code(&e) == Some("TargetGroupNotFound") => Ok(Vec::new()),
            Err(e) => Err(error::map("DescribeTargetGroups", e)),
        }
    }

    async fn nlb_create_target_group(
        &self,
        cluster: &str,
        tg: &str,
        vpc: &str,
        spec: &LbSpec,
        p: &PortMap,
    ) -> CloudResult<String> {
        let elbv2 = self.clients().await?.elbv2.clone();
        let h = &spec.health;
        let tags = resource_tags(self, cluster, spec)
            .into_iter()
            .map(|(k, v)| Tag::builder().key(k).value(v).build())
            .collect();
        let mut req = elbv2
            .create_target_group()
            .name(tg)
            .protocol(ProtocolEnum::from(target_proto(spec, p)))
            .port(p.node_port)
            .vpc_id(vpc)
            .target_type(TargetTypeEnum::Instance)
            .ip_address_type(target_ip_type(spec))
            .health_check_protocol(ProtocolEnum::from(h.protocol.as_str()))
            .health_check_port(h.port.clone())
            .health_check_interval_seconds(h.interval)
            // No timeout, as upstream: AWS fixes it per protocol and refuses others.
            .healthy_threshold_count(h.healthy)
            .unhealthy_threshold_count(h.unhealthy)
            .set_tags(Some(tags));
        if h.protocol != "TCP" {
            req = req.health_check_path(h.path.clone());
        }
        let out = match self.call_raw("CreateTargetGroup", req.send()).await {
            Ok(out) => out,
            // Made by an earlier attempt that stopped before a listener used it: reuse it.
            Err(e) if error::code(&e) == Some("DuplicateTargetGroupName") => {
                return self.nlb_target_group_by_name(tg).await;
            }
            Err(e) => return Err(error::map("CreateTargetGroup", e)),
        };
        out.target_groups()
            .first()
            .and_then(|t| t.target_group_arn())
            .map(String::from)
            .ok_or_else(|| {
                CloudError::Transient(format!("CreateTargetGroup {tg}: no ARN in the answer"))
            })
    }

    async fn nlb_target_group_by_name(&self, tg: &str) -> CloudResult<String> {
        let elbv2 = self.clients().await?.elbv2.clone();
        let out = self
            .call(
                "DescribeTargetGroups",
                elbv2.describe_target_groups().names(tg).send(),
            )
            .await?;
        out.target_groups()
            .first()
            .and_then(|t| t.target_group_arn())
            .map(String::from)
            .ok_or_else(|| CloudError::Transient(format!("target group {tg} not found by name")))
    }

    /// Health settings AWS changes in place (port, thresholds, path), as upstream's
    /// `ensureTargetGroup`.
    async fn nlb_modify_health(&self, g: &TargetGroup, spec: &LbSpec) -> CloudResult<()> {
        let h = &spec.health;
        let path = (h.protocol != "TCP").then(|| h.path.clone());
        let same = g.health_check_port() == Some(h.port.as_str())
            && g.healthy_threshold_count() == Some(h.healthy)
            && g.unhealthy_threshold_count() == Some(h.unhealthy)
            && (path.is_none() || g.health_check_path() == path.as_deref());
        if same {
            return Ok(());
        }
        let elbv2 = self.clients().await?.elbv2.clone();
        self.call(
            "ModifyTargetGroup",
            elbv2
                .modify_target_group()
                .target_group_arn(g.target_group_arn().unwrap_or_default())
                .health_check_port(&h.port)
                .healthy_threshold_count(h.healthy)
                .unhealthy_threshold_count(h.unhealthy)
                .set_health_check_path(path)
                .send(),
        )
        .await
        .map(|_| ())
    }

    /// The target group for one port: the first of the existing ones of its NodePort
    /// (`same_port`, the one its listener forwards to first) when it can stay, else a new one — its targets registered before
    /// the caller points a listener at it.
    async fn nlb_port_group(
        &self,
        cluster: &str,
        lb: &Nlb,
        spec: &LbSpec,
        p: &PortMap,
        same_port: &[&TargetGroup],
        ids: &BTreeSet<String>,
    ) -> CloudResult<String> {
        let current = same_port.first().filter(|g| !must_replace(g, spec, p));
        let arn = match current {
            Some(g) => {
                self.nlb_modify_health(g, spec).await?;
                g.target_group_arn().unwrap_or_default().to_string()
            }
            None => {
                let tg = target_group_name(self.cluster_id(cluster), spec, p);
                self.nlb_create_target_group(cluster, &tg, &lb.vpc, spec, p)
                    .await?
            }
        };
        self.nlb_target_group_attributes(&arn, spec).await?;
        self.nlb_sync_targets(&arn, p.node_port, ids).await?;
        Ok(arn)
    }

    /// A listener per port, each forwarding to a target group that has its targets before the
    /// listener points at it; target groups are reused where they can stay (those
    /// cloud-provider-aws made included), and a replaced one is deleted only once no listener
    /// forwards to it. So no listener ever forwards to an empty target group.
    async fn nlb_sync_listeners(
        &self,
        cluster: &str,
        lb: &Nlb,
        spec: &LbSpec,
        ids: &BTreeSet<String>,
        fresh: bool,
    ) -> CloudResult<Vec<(String, i32)>> {
        let elbv2 = self.clients().await?.elbv2.clone();
        let (listeners, groups) = if fresh {
            (Vec::new(), Vec::new())
        } else {
            let l = self
                .call(
                    "DescribeListeners",
                    elbv2.describe_listeners().load_balancer_arn(&lb.arn).send(),
                )
                .await?
                .listeners()
                .to_vec();
            let mut g = self.nlb_target_groups(&lb.arn).await?;
            // Groups a listener forwards to that the by-LB listing missed (moto does not link
            // a group to its LB on ModifyListener): asked for by ARN.
            let missing: Vec<String> = l
                .iter()
                .flat_map(|l| {
                    l.default_actions()
                        .iter()
                        .filter_map(|a| a.target_group_arn())
                })
                .filter(|a| !g.iter().any(|t| t.target_group_arn() == Some(*a)))
                .map(String::from)
                .collect();
            if !missing.is_empty() {
                let more = self
                    .call(
                        "DescribeTargetGroups",
                        elbv2
                            .describe_target_groups()
                            .set_target_group_arns(Some(missing))
                            .send(),
                    )
                    .await?;
                g.extend(more.target_groups().iter().cloned());
            }
            (l, g)
        };
        let mut wanted = Vec::new();
        for p in &spec.ports {
            let listener = listeners.iter().find(|l| listener_for(l, p));
            let forwards_to = listener.and_then(|l| {
                l.default_actions()
                    .iter()
                    .find_map(|a| a.target_group_arn())
            });
            let mut same_port: Vec<&TargetGroup> = groups
                .iter()
                .filter(|g| g.port() == Some(p.node_port))
                .collect();
            same_port.sort_by_key(|g| g.target_group_arn() != forwards_to);
            let arn = self
                .nlb_port_group(cluster, lb, spec, p, &same_port, ids)
                .await?;
            let forward = Action::builder()
                .r#type(ActionTypeEnum::Forward)
                .target_group_arn(&arn)
                .build();
            let (certs, policy) = listener_tls(spec, p);
            match listener {
                Some(l) if forwards_to == Some(arn.as_str()) && listener_same(l, spec, p) => {}
                Some(l) => {
                    self.call(
                        "ModifyListener",
                        elbv2
                            .modify_listener()
                            .listener_arn(l.listener_arn().unwrap_or_default())
                            .protocol(ProtocolEnum::from(listener_proto(p)))
                            .set_certificates(certs)
                            .set_ssl_policy(policy)
                            .default_actions(forward)
                            .send(),
                    )
                    .await?;
                }
                None => {
                    self.call(
                        "CreateListener",
                        elbv2
                            .create_listener()
                            .load_balancer_arn(&lb.arn)
                            .protocol(ProtocolEnum::from(listener_proto(p)))
                            .port(p.port)
                            .set_certificates(certs)
                            .set_ssl_policy(policy)
                            .default_actions(forward)
                            .send(),
                    )
                    .await?;
                }
            }
            wanted.push((arn, p.node_port));
        }
        for l in &listeners {
            let kept = spec.ports.iter().any(|p| listener_for(l, p));
            if !kept {
                self.call(
                    "DeleteListener",
                    elbv2
                        .delete_listener()
                        .listener_arn(l.listener_arn().unwrap_or_default())
                        .send(),
                )
                .await?;
            }
        }
        for g in &groups {
            let Some(arn) = g.target_group_arn() else {
                continue;
            };
            if !wanted.iter().any(|(a, _)| a == arn) {
                self.call(
                    "DeleteTargetGroup",
                    elbv2.delete_target_group().target_group_arn(arn).send(),
                )
                .await?;
            }
        }
        Ok(wanted)
    }

    async fn nlb_sync_targets(
        &self,
        tg: &str,
        port: i32,
        want: &BTreeSet<String>,
    ) -> CloudResult<()> {
        let elbv2 = self.clients().await?.elbv2.clone();
        let out = self
            .call(
                "DescribeTargetHealth",
                elbv2.describe_target_health().target_group_arn(tg).send(),
            )
            .await?;
        let have: BTreeSet<String> = out
            .target_health_descriptions()
            .iter()
            .filter_map(|d| d.target().and_then(|t| t.id()).map(String::from))
            .collect();
        let target = |id: &String| TargetDescription::builder().id(id).port(port).build();
        let add: Vec<_> = want.difference(&have).map(target).collect();
        let remove: Vec<_> = have.difference(want).map(target).collect();
        if !add.is_empty() {
            self.call(
                "RegisterTargets",
                elbv2
                    .register_targets()
                    .target_group_arn(tg)
                    .set_targets(Some(add))
                    .send(),
            )
            .await?;
        }
        if !remove.is_empty() {
            self.call(
                "DeregisterTargets",
                elbv2
                    .deregister_targets()
                    .target_group_arn(tg)
                    .set_targets(Some(remove))
                    .send(),
            )
            .await?;
        }
        Ok(())
    }

    /// Cross-zone balancing and access logs as upstream's `reconcileLBAttributes`: off unless
    /// the annotations say on; the bucket and prefix only sent while logs are on (AWS refuses
    /// an empty bucket).
    async fn nlb_attributes(&self, arn: &str, spec: &LbSpec) -> CloudResult<()> {
        let elbv2 = self.clients().await?.elbv2.clone();
        let now = self
            .call(
                "DescribeLoadBalancerAttributes",
                elbv2
                    .describe_load_balancer_attributes()
                    .load_balancer_arn(arn)
                    .send(),
            )
            .await?;
        let a = &spec.attributes;
        let mut want = vec![
            (
                "load_balancing.cross_zone.enabled",
                spec.cross_zone.unwrap_or(false).to_string(),
            ),
            ("access_logs.s3.enabled", a.access_log.to_string()),
        ];
        if a.access_log {
            want.push(("access_logs.s3.bucket", a.access_log_bucket.clone()));
            want.push(("access_logs.s3.prefix", a.access_log_prefix.clone()));
        }
        let changed: Vec<LoadBalancerAttribute> = want
            .into_iter()
            .filter(|(k, v)| {
                !now.attributes()
                    .iter()
                    .any(|a| a.key() == Some(*k) && a.value().unwrap_or_default() == v)
            })
            .map(|(k, v)| LoadBalancerAttribute::builder().key(k).value(v).build())
            .collect();
        if changed.is_empty() {
            return Ok(());
        }
        self.call(
            "ModifyLoadBalancerAttributes",
            elbv2
                .modify_load_balancer_attributes()
                .load_balancer_arn(arn)
                .set_attributes(Some(changed))
                .send(),
        )
        .await
        .map(|_| ())
    }

    /// The target-group-attributes annotation's attributes, PROXY protocol v2 as the
    /// proxy-protocol annotation says, and known defaults back where the annotation dropped one.
    async fn nlb_target_group_attributes(&self, arn: &str, spec: &LbSpec) -> CloudResult<()> {
        let elbv2 = self.clients().await?.elbv2.clone();
        let now = self
            .call(
                "DescribeTargetGroupAttributes",
                elbv2
                    .describe_target_group_attributes()
                    .target_group_arn(arn)
                    .send(),
            )
            .await?;
        let current = |k: &str| {
            now.attributes()
                .iter()
                .find(|a| a.key() == Some(k))
                .and_then(|a| a.value())
                .map(String::from)
        };
        let mut want = spec.tg_attributes.clone();
        let proxy = want
            .entry("proxy_protocol_v2.enabled".into())
            .or_insert_with(|| "false".into());
        if spec.proxy_protocol {
            *proxy = "true".into();
        }
        for (k, v) in TG_DEFAULTS {
            if !want.contains_key(*k) && current(k).is_some_and(|c| c != *v) {
                want.insert(k.to_string(), v.to_string());
            }
        }
        let changed: Vec<TargetGroupAttribute> = want
            .iter()
            .filter(|(k, v)| current(k).as_deref() != Some(v.as_str()))
            .filter(|(k, v)| {
                !(current(k).is_none() && *k == "proxy_protocol_v2.enabled" && *v == "false")
            })
            .map(|(k, v)| TargetGroupAttribute::builder().key(k).value(v).build())
            .collect();
        if changed.is_empty() {
            return Ok(());
        }
        self.call(
            "ModifyTargetGroupAttributes",
            elbv2
                .modify_target_group_attributes()
                .target_group_arn(arn)
                .set_attributes(Some(changed))
                .send(),
        )
        .await
        .map(|_| ())
    }

    /// The VPC's CIDRs, where health checks come from: IPv4, and IPv6 too for IPv6 targets.
    async fn vpc_cidrs(&self, vpc: &str, ipv6: bool) -> CloudResult<Vec<String>> {
        let ec2 = self.clients().await?.ec2.clone();
        let out = self
            .call("DescribeVpcs", ec2.describe_vpcs().vpc_ids(vpc).send())
            .await?;
        Ok(out
            .vpcs()
            .iter()
            .flat_map(|v| {
                v.cidr_block_association_set()
                    .iter()
                    .filter_map(|a| a.cidr_block().map(String::from))
                    .chain(v.cidr_block().map(String::from))
                    .chain(
                        v.ipv6_cidr_block_association_set()
                            .iter()
                            .filter(|_| ipv6)
                            .filter_map(|a| a.ipv6_cidr_block().map(String::from)),
                    )
            })
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect())
    }

    /// The NLB's rules on exactly the node groups of `ids`, revoked from the cluster's other
    /// groups: with a managed `source` group, all traffic from it (as for a Classic ELB);
    /// without, the client and health rules by CIDR (and the MTU rules they imply), as
    /// upstream's `updateInstanceSecurityGroupsForNLB`. Rules of other load balancers and the
    /// operator's are never touched. `spec: None` revokes them all. New rules are granted
    /// before stale ones are revoked, so traffic the NLB still sends is never cut. Unless
    /// `force`, nothing is asked of AWS when the node groups are those the last call left.
    #[allow(clippy::too_many_arguments)]
    async fn nlb_sync_rules(
        &self,
        cluster: &str,
        name: &str,
        vpc: &str,
        spec: Option<&LbSpec>,
        ids: &BTreeSet<String>,
        force: bool,
        source: Option<&str>,
    ) -> CloudResult<()> {
        if self.inner.cfg.disable_security_group_ingress {
            return Ok(());
        }
        let want_groups = match spec {
            Some(_) => self.node_groups_of(cluster, ids, force).await?,
            None => BTreeSet::new(),
        };
        let key = format!("nlb/{name}");
        let remembered: BTreeSet<String> = {
            let mem = self.inner.memory.lock();
            mem.sg_rules
                .iter()
                .filter(|(_, k)| *k == key)
                .map(|(g, _)| g.clone())
                .collect()
        };
        if !force && want_groups == remembered {
            return Ok(());
        }
        let from_group = source.map(|g| sg::Source::Group(g.to_string()));
        let want_rules: BTreeSet<Rule> = match (spec, &from_group) {
            (Some(_), Some(g)) => [Rule {
                proto: "-1".into(),
                from: -1,
                to: -1,
                source: g.clone(),
                desc: None,
            }]
            .into(),
            (Some(s), None) => node_rules(name, s, &self.vpc_cidrs(vpc, s.ipv6_targets).await?)
                .into_iter()
                .map(|(port, cidr, desc)| {
                    let proto = match desc.starts_with(HEALTH_RULE) {
                        true => "tcp".to_string(),
                        false => s.client_protocol(),
                    };
                    Rule::cidr(&proto, port, port, &cidr, Some(&desc))
                })
                .collect(),
            (None, _) => BTreeSet::new(),
        };
        let descs = [
            format!("{CLIENT_RULE}{name}"),
            format!("{HEALTH_RULE}{name}"),
        ];
        let ours = |r: &Rule| {
            r.desc.as_ref().is_some_and(|d| descs.contains(d))
                || from_group.as_ref() == Some(&r.source)
        };
        let groups = self.cluster_groups(cluster).await?;
        for (id, g) in &groups {
            // A rule from the NLB's group is told apart by its source, whatever its text.
            let have: BTreeSet<Rule> = sg::rules_of(g)
                .into_iter()
                .map(|r| match from_group.as_ref() == Some(&r.source) {
                    true => Rule { desc: None, ..r },
                    false => r,
                })
                .collect();
            let wanted = if want_groups.contains(id) {
                want_rules.clone()
            } else {
                BTreeSet::new()
            };
            let mut p = sg::plan(&have, &wanted, ours);
            if p.grant.is_empty() && p.revoke.is_empty() {
                continue;
            }
            let after = sg::applied(&have, &p);
            let mtu = sg::plan(&after, &sg::mtu_rules(&after, CLIENT_RULE), |r| {
                r.desc.as_deref() == Some(sg::MTU_RULE)
            });
            p.grant.extend(mtu.grant);
            p.revoke.extend(mtu.revoke);
            let revoke = std::mem::take(&mut p.revoke);
            self.apply_plan(id, &p).await?;
            let p = sg::Plan {
                grant: Vec::new(),
                revoke,
            };
            self.apply_plan(id, &p).await?;
        }
        let mut mem = self.inner.memory.lock();
        mem.sg_rules.retain(|(_, k)| *k != key);
        for g in want_groups.iter().filter(|g| groups.contains_key(*g)) {
            mem.sg_rules.insert((g.clone(), key.clone()));
        }
        Ok(())
    }

    /// Revokes the rules this NLB added, wherever they are in the VPC.
    async fn nlb_revoke_rules(&self, name: &str, vpc: &str) -> CloudResult<()> {
        let ours = [
            format!("{CLIENT_RULE}{name}"),
            format!("{HEALTH_RULE}{name}"),
        ];
        let in_vpc = Filter::builder().name("vpc-id").values(vpc).build();
        self.revoke_matching(in_vpc, |p| {
            sg::flatten(p)
                .into_iter()
                .filter(|r| r.desc.as_ref().is_some_and(|d| ours.contains(d)))
                .map(|r| Rule { desc: None, ..r }.permission())
                .collect()
        })
        .await?;
        let key = format!("nlb/{name}");
        self.inner.memory.lock().sg_rules.retain(|(_, k)| *k != key);
        Ok(())
    }

    pub(crate) async fn nlb_ensure(
        &self,
        cluster: &str,
        name: &str,
        spec: &LbSpec,
        nodes: &[Arc<Node>],
    ) -> CloudResult<String> {
        let ids = self.node_instance_ids(nodes).await?;
        let vpc = self.vpc(&ids).await?;
        let existing = self.nlb_find(name).await?;
        let source = self
            .nlb_group(cluster, name, &vpc, spec, existing.as_ref())
            .await?;
        let (lb, fresh) = match existing {
            Some(lb) => (lb, false),
            None => {
                let lb = self
                    .nlb_create(cluster, name, &vpc, spec, source.as_deref())
                    .await?;
                (lb, true)
            }
        };
        // IPv6 target groups need a dualstack NLB, and an NLB goes back to IPv4 only once
        // none is left: the address type changes before the listeners or after them.
        if spec.dualstack && !lb.dualstack {
            self.nlb_set_ip_type(&lb.arn, spec).await?;
        }
        let groups = self
            .nlb_sync_listeners(cluster, &lb, spec, &ids, fresh)
            .await?;
        if !spec.dualstack && lb.dualstack {
            self.nlb_set_ip_type(&lb.arn, spec).await?;
        }
        self.nlb_attributes(&lb.arn, spec).await?;
        if !fresh {
            self.nlb_sync_tags(cluster, &lb.arn, spec).await?;
        }
        self.nlb_sync_rules(
            cluster,
            name,
            &lb.vpc,
            Some(spec),
            &ids,
            true,
            source.as_deref(),
        )
        .await?;
        if lb.dns.is_empty() {
            return Err(CloudError::retry_after(
                std::time::Duration::from_secs(5),
                format!("NLB {name} has no DNS name yet"),
            ));
        }
        let scheme_kept = lb.internal != spec.internal;
        let known = NlbTargets {
            vpc: lb.vpc,
            groups,
            source,
        };
        self.inner
            .memory
            .lock()
            .nlbs
            .insert(name.to_string(), known);
        if scheme_kept {
            return Err(crate::lb::scheme_unchangeable(lb.internal));
        }
        Ok(lb.dns)
    }

    /// The NLB's VPC and target groups with their ports (a target group's port is the
    /// NodePort its targets listen on), as the last ensure or update left them, else from AWS
    /// (two calls). Needs nothing of the Service: it works while its annotations are refused.
    async fn nlb_targets(&self, cluster: &str, name: &str) -> CloudResult<NlbTargets> {
        if let Some(known) = self.inner.memory.lock().nlbs.get(name) {
            return Ok(known.clone());
        }
        let Some(lb) = self.nlb_find(name).await? else {
            return Err(CloudError::Permanent(format!(
                "NLB {name} does not exist; it is created by ensure"
            )));
        };
        // The groups the listeners forward to, whoever named them.
        let elbv2 = self.clients().await?.elbv2.clone();
        let arns: BTreeSet<String> = self
            .call(
                "DescribeListeners",
                elbv2.describe_listeners().load_balancer_arn(&lb.arn).send(),
            )
            .await?
            .listeners()
            .iter()
            .flat_map(|l| {
                l.default_actions()
                    .iter()
                    .filter_map(|a| a.target_group_arn())
            })
            .map(String::from)
            .collect();
        let groups = if arns.is_empty() {
            Vec::new()
        } else {
            self.call(
                "DescribeTargetGroups",
                elbv2
                    .describe_target_groups()
                    .set_target_group_arns(Some(arns.into_iter().collect()))
                    .send(),
            )
            .await?
            .target_groups()
            .iter()
            .filter_map(|t| Some((t.target_group_arn()?.to_string(), t.port()?)))
            .collect()
        };
        let source = self.nlb_own_group_id(cluster, name, &lb).await?;
        Ok(NlbTargets {
            vpc: lb.vpc,
            groups,
            source,
        })
    }

    /// The targets follow the nodes; without `spec` (the Service's annotations are refused)
    /// the node security-group rules stay as they are.
    pub(crate) async fn nlb_update(
        &self,
        cluster: &str,
        name: &str,
        spec: Option<&LbSpec>,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        let known = self.nlb_targets(cluster, name).await?;
        let ids = self.node_instance_ids(nodes).await?;
        let mut out = Ok(());
        for (arn, port) in &known.groups {
            out = self.nlb_sync_targets(arn, *port, &ids).await;
            if out.is_err() {
                break;
            }
        }
        if out.is_ok()
            && let Some(spec) = spec
        {
            out = self
                .nlb_sync_rules(
                    cluster,
                    name,
                    &known.vpc,
                    Some(spec),
                    &ids,
                    false,
                    known.source.as_deref(),
                )
                .await;
        }
        // A failure may mean the NLB changed behind our back: ask AWS again next time.
        let mut mem = self.inner.memory.lock();
        match &out {
            Ok(()) => mem.nlbs.insert(name.to_string(), known),
            Err(_) => mem.nlbs.remove(name),
        };
        out
    }

    pub(crate) async fn nlb_delete(&self, cluster: &str, name: &str) -> CloudResult<()> {
        self.inner.memory.lock().nlbs.remove(name);
        let Some(lb) = self.nlb_find(name).await? else {
            // A managed group a delete that stopped half-way left behind.
            return self.nlb_delete_group(cluster, name, None).await;
        };
        let elbv2 = self.clients().await?.elbv2.clone();
        let source = self.nlb_own_group_id(cluster, name, &lb).await?;
        self.nlb_sync_rules(
            cluster,
            name,
            &lb.vpc,
            None,
            &BTreeSet::new(),
            true,
            source.as_deref(),
        )
        .await?;
        // Rules an older version left on groups not tagged for the cluster: ours, by name.
        self.nlb_revoke_rules(name, &lb.vpc).await?;
        let groups: Vec<String> = self
            .nlb_target_groups(&lb.arn)
            .await?
            .iter()
            .filter_map(|g| g.target_group_arn().map(String::from))
            .collect();
        let listeners = self
            .call(
                "DescribeListeners",
                elbv2.describe_listeners().load_balancer_arn(&lb.arn).send(),
            )
            .await?;
        for l in listeners.listeners() {
            self.call(
                "DeleteListener",
                elbv2
                    .delete_listener()
                    .listener_arn(l.listener_arn().unwrap_or_default())
                    .send(),
            )
            .await?;
        }
        self.call(
            "DeleteLoadBalancer",
            elbv2
                .delete_load_balancer()
                .load_balancer_arn(&lb.arn)
                .send(),
        )
        .await?;
        for arn in &groups {
            self.call(
                "DeleteTargetGroup",
                elbv2.delete_target_group().target_group_arn(arn).send(),
            )
            .await?;
        }
        self.nlb_delete_group(cluster, name, source.as_deref())
            .await
    }

    async fn nlb_set_ip_type(&self, arn: &str, spec: &LbSpec) -> CloudResult<()> {
        let elbv2 = self.clients().await?.elbv2.clone();
        self.call(
            "SetIpAddressType",
            elbv2
                .set_ip_address_type()
                .load_balancer_arn(arn)
                .ip_address_type(ip_type(spec))
                .send(),
        )
        .await
        .map(|_| ())
    }

    /// The NLB's managed security group (upstream's `NLBSecurityGroupMode = Managed`), its
    /// ingress reconciled (see [`AwsCloud::own_group`]): made for a new NLB in managed mode;
    /// for an existing NLB, its own group when AWS shows it attached (kept up to date even if
    /// the mode was turned off since: stale rules must go). AWS attaches groups to an NLB only
    /// at its creation, so an NLB made without one keeps the node rules by CIDR, as upstream.
    async fn nlb_group(
        &self,
        cluster: &str,
        name: &str,
        vpc: &str,
        spec: &LbSpec,
        existing: Option<&Nlb>,
    ) -> CloudResult<Option<String>> {
        use crate::config::NlbSecurityGroupMode;
        let managed = self.inner.cfg.nlb_security_group_mode == Some(NlbSecurityGroupMode::Managed);
        let Some(lb) = existing else {
            return match managed {
                true => Ok(Some(self.own_group(cluster, name, vpc, spec, true).await?)),
                false => Ok(None),
            };
        };
        match self.nlb_own_group_id(cluster, name, lb).await? {
            Some(_) => Ok(Some(
                self.own_group(cluster, name, &lb.vpc, spec, true).await?,
            )),
            None => {
                if managed && lb.groups.is_empty() {
                    tracing::info!(lb = %name, "NLB created without a security group; AWS cannot add one: the nodes keep admitting its traffic by CIDR until the Service is re-created");
                }
                Ok(None)
            }
        }
    }

    /// The NLB's own group (`k8s-elb-<name>`, tagged for the cluster) if AWS shows it attached
    /// to the NLB; groups of another owner are never ours.
    async fn nlb_own_group_id(
        &self,
        cluster: &str,
        name: &str,
        lb: &Nlb,
    ) -> CloudResult<Option<String>> {
        if lb.groups.is_empty() {
            return Ok(None);
        }
        let Some(g) = self.own_group_find(name, &lb.vpc).await? else {
            return Ok(None);
        };
        let id = g.group_id().unwrap_or_default();
        let attached = lb.groups.iter().any(|x| x == id);
        Ok((attached && sg::cluster_tagged(&g, self.cluster_id(cluster))).then(|| id.to_string()))
    }

    /// Deletes the NLB's managed group once the NLB is gone: `known` (the group the NLB had),
    /// or one named `k8s-elb-<name>` carrying the managed-mode tag; only if tagged for the
    /// cluster. Rules admitting it go first (AWS refuses to delete a referenced group); while
    /// the NLB's network interfaces linger, AWS answers DependencyViolation: retried later.
    async fn nlb_delete_group(
        &self,
        cluster: &str,
        name: &str,
        known: Option<&str>,
    ) -> CloudResult<()> {
        let ec2 = self.clients().await?.ec2.clone();
        let found = self
            .call(
                "DescribeSecurityGroups",
                ec2.describe_security_groups()
                    .filters(
                        Filter::builder()
                            .name("group-name")
                            .values(crate::clb::sg_name(name))
                            .build(),
                    )
                    .send(),
            )
            .await?;
        for g in found.security_groups() {
            let Some(id) = g.group_id() else { continue };
            let managed = g
                .tags()
                .iter()
                .any(|t| t.key() == Some(crate::clb::NLB_MODE_TAG));
            if !(known == Some(id) || managed) || !sg::cluster_tagged(g, self.cluster_id(cluster)) {
                continue;
            }
            self.revoke_from(id).await?;
            match self
                .call_raw(
                    "DeleteSecurityGroup",
                    ec2.delete_security_group().group_id(id).send(),
                )
                .await
            {
                Ok(_) => {}
                Err(e) if error::code(&e) == Some("DependencyViolation") => {
                    return Err(CloudError::retry_after(
                        std::time::Duration::from_secs(10),
                        format!("security group {id} of NLB {name} is still in use; retrying"),
                    ));
                }
                Err(e) if error::code(&e) == Some("InvalidGroup.NotFound") => {}
                Err(e) => return Err(error::map("DeleteSecurityGroup", e)),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(local: bool, ranges: &[&str]) -> LbSpec {
        let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "1234",
                "annotations": {"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"}},
            "spec": {"type": "LoadBalancer",
                "externalTrafficPolicy": if local { "Local" } else { "Cluster" },
                "healthCheckNodePort": 32000, "loadBalancerSourceRanges": ranges,
                "ports": [{"port": 443, "nodePort": 30443}, {"port": 80, "nodePort": 30080}]},
        }))
        .expect("service");
        crate::annotations::parse(&svc).expect("spec")
    }

    fn rules(spec: &LbSpec) -> Vec<(i32, String, String)> {
        let mut r = node_rules("lb", spec, &["10.0.0.0/16".to_string()]);
        r.sort();
        r
    }

    fn rule(port: i32, cidr: &str, kind: &str) -> (i32, String, String) {
        (
            port,
            cidr.to_string(),
            format!("kubernetes.io/rule/nlb/{kind}=lb"),
        )
    }

    #[test]
    fn health_rules_only_where_client_rules_do_not_admit_the_vpc() {
        // Defaults: clients from anywhere, health checks on the traffic ports — the client
        // rules admit the VPC already.
        assert_eq!(
            rules(&spec(false, &[])),
            vec![
                rule(30080, "0.0.0.0/0", "client"),
                rule(30443, "0.0.0.0/0", "client")
            ]
        );
        // ETP Local: the health-check NodePort needs its own rule.
        assert_eq!(
            rules(&spec(true, &[])),
            vec![
                rule(30080, "0.0.0.0/0", "client"),
                rule(30443, "0.0.0.0/0", "client"),
                rule(32000, "10.0.0.0/16", "health")
            ]
        );
        // Narrow client ranges do not admit the VPC's health checks.
        assert_eq!(
            rules(&spec(false, &["203.0.113.0/24"])),
            vec![
                rule(30080, "10.0.0.0/16", "health"),
                rule(30080, "203.0.113.0/24", "client"),
                rule(30443, "10.0.0.0/16", "health"),
                rule(30443, "203.0.113.0/24", "client")
            ]
        );
    }
}
