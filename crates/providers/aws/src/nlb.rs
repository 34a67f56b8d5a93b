//! Network Load Balancers (`aws-load-balancer-type: nlb`): a TCP listener per Service port
//! forwarding to a target group of instance targets on the NodePort, and, since NLBs carry no
//! security group of their own, rules on the nodes' groups as upstream adds them: client
//! ranges to each NodePort (`kubernetes.io/rule/nlb/client=<lb>`) and the VPC to the health
//! check port (`kubernetes.io/rule/nlb/health=<lb>`).

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_ec2::types::{Filter, IpPermission, IpRange};
use aws_sdk_elasticloadbalancingv2::types::{
    Action, ActionTypeEnum, LoadBalancerAttribute, LoadBalancerSchemeEnum, LoadBalancerTypeEnum,
    ProtocolEnum, Tag, TargetDescription, TargetTypeEnum,
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
}

/// What an NLB update needs to know of the NLB: its VPC and its target groups (ARN, NodePort).
#[derive(Clone, Debug)]
pub(crate) struct NlbTargets {
    pub vpc: String,
    pub groups: Vec<(String, i32)>,
}

/// Description prefix of the client rules upstream puts on node groups for an NLB.
pub const CLIENT_RULE: &str = "kubernetes.io/rule/nlb/client=";
/// Description prefix of the health-check rules.
pub const HEALTH_RULE: &str = "kubernetes.io/rule/nlb/health=";

fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn short(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(8)
        .collect()
}

/// Target group name: `k8s-<ns>-<name>-<hash>` (≤ 32 characters, as upstream), the hash over
/// everything a target group cannot change in place, so a change makes a new group.
pub fn target_group_name(lb: &str, spec: &LbSpec, p: &PortMap) -> String {
    let (ns, name) = spec
        .service_name
        .split_once('/')
        .unwrap_or(("", &spec.service_name));
    let h = &spec.health;
    let key = format!(
        "{lb}/{}/{}/TCP/instance/{}/{}/{}/{}/{}/{}/{}",
        p.port,
        p.node_port,
        h.protocol,
        h.port,
        h.path,
        h.healthy,
        h.unhealthy,
        h.timeout,
        h.interval
    );
    format!(
        "k8s-{}-{}-{:010x}",
        short(ns),
        short(name),
        fnv(&key) & 0xff_ffff_ffff
    )
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
    for port in health_ports(spec) {
        for cidr in vpc_cidrs {
            let admitted = want.iter().any(|(p, c, _)| *p == port && covers(c, cidr));
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
                    .set_subnets(Some(subnets))
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
        })
    }

    /// Target groups of the LB: name → arn.
    async fn nlb_target_groups(&self, lb_arn: &str) -> CloudResult<BTreeMap<String, String>> {
        let elbv2 = self.clients().await?.elbv2.clone();
        let out = self
            .call(
                "DescribeTargetGroups",
                elbv2
                    .describe_target_groups()
                    .load_balancer_arn(lb_arn)
                    .send(),
            )
            .await?;
        Ok(out
            .target_groups()
            .iter()
            .filter_map(|t| {
                Some((
                    t.target_group_name()?.to_string(),
                    t.target_group_arn()?.to_string(),
                ))
            })
            .collect())
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
            .protocol(ProtocolEnum::Tcp)
            .port(p.node_port)
            .vpc_id(vpc)
            .target_type(TargetTypeEnum::Instance)
            .health_check_protocol(ProtocolEnum::from(h.protocol.as_str()))
            .health_check_port(h.port.clone())
            .health_check_interval_seconds(h.interval)
            .health_check_timeout_seconds(h.timeout)
            .healthy_threshold_count(h.healthy)
            .unhealthy_threshold_count(h.unhealthy)
            .set_tags(Some(tags));
        if h.protocol != "TCP" {
            req = req.health_check_path(h.path.clone());
        }
        let out = self.call("CreateTargetGroup", req.send()).await?;
        out.target_groups()
            .first()
            .and_then(|t| t.target_group_arn())
            .map(String::from)
            .ok_or_else(|| {
                CloudError::Transient(format!("CreateTargetGroup {tg}: no ARN in the answer"))
            })
    }

    /// Listeners to target groups, one per port; stale listeners and groups go.
    async fn nlb_sync_listeners(
        &self,
        cluster: &str,
        lb: &Nlb,
        name: &str,
        spec: &LbSpec,
        fresh: bool,
    ) -> CloudResult<Vec<(String, i32)>> {
        let elbv2 = self.clients().await?.elbv2.clone();
        let mut groups = if fresh {
            BTreeMap::new()
        } else {
            self.nlb_target_groups(&lb.arn).await?
        };
        let listeners = if fresh {
            Vec::new()
        } else {
            self.call(
                "DescribeListeners",
                elbv2.describe_listeners().load_balancer_arn(&lb.arn).send(),
            )
            .await?
            .listeners()
            .to_vec()
        };
        let mut wanted = Vec::new();
        for p in &spec.ports {
            let tg = target_group_name(name, spec, p);
            let arn = match groups.get(&tg) {
                Some(a) => a.clone(),
                None => {
                    let a = self
                        .nlb_create_target_group(cluster, &tg, &lb.vpc, spec, p)
                        .await?;
                    groups.insert(tg.clone(), a.clone());
                    a
                }
            };
            let forward = Action::builder()
                .r#type(ActionTypeEnum::Forward)
                .target_group_arn(&arn)
                .build();
            let existing = listeners.iter().find(|l| l.port() == Some(p.port));
            match existing {
                Some(l)
                    if l.default_actions()
                        .iter()
                        .any(|a| a.target_group_arn() == Some(arn.as_str())) => {}
                Some(l) => {
                    self.call(
                        "ModifyListener",
                        elbv2
                            .modify_listener()
                            .listener_arn(l.listener_arn().unwrap_or_default())
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
                            .protocol(ProtocolEnum::Tcp)
                            .port(p.port)
                            .default_actions(forward)
                            .send(),
                    )
                    .await?;
                }
            }
            wanted.push((arn, p.node_port));
        }
        for l in &listeners {
            if !spec.ports.iter().any(|p| Some(p.port) == l.port()) {
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
        for arn in groups.values() {
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

    async fn nlb_cross_zone(&self, arn: &str, on: bool) -> CloudResult<()> {
        let elbv2 = self.clients().await?.elbv2.clone();
        const KEY: &str = "load_balancing.cross_zone.enabled";
        let now = self
            .call(
                "DescribeLoadBalancerAttributes",
                elbv2
                    .describe_load_balancer_attributes()
                    .load_balancer_arn(arn)
                    .send(),
            )
            .await?;
        let value = on.to_string();
        if now
            .attributes()
            .iter()
            .any(|a| a.key() == Some(KEY) && a.value() == Some(value.as_str()))
        {
            return Ok(());
        }
        self.call(
            "ModifyLoadBalancerAttributes",
            elbv2
                .modify_load_balancer_attributes()
                .load_balancer_arn(arn)
                .attributes(
                    LoadBalancerAttribute::builder()
                        .key(KEY)
                        .value(value)
                        .build(),
                )
                .send(),
        )
        .await
        .map(|_| ())
    }

    async fn vpc_cidrs(&self, vpc: &str) -> CloudResult<Vec<String>> {
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
            })
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect())
    }

    /// Client and health rules for the NLB on every node group that lacks them.
    async fn nlb_sync_rules(
        &self,
        name: &str,
        vpc: &str,
        spec: &LbSpec,
        groups: &BTreeSet<String>,
        force: bool,
    ) -> CloudResult<()> {
        let todo: Vec<String> = {
            let mem = self.inner.memory.lock();
            groups
                .iter()
                .filter(|g| {
                    force
                        || !mem
                            .sg_rules
                            .contains(&((*g).clone(), format!("nlb/{name}")))
                })
                .cloned()
                .collect()
        };
        if todo.is_empty() {
            return Ok(());
        }
        let ec2 = self.clients().await?.ec2.clone();
        let cidrs = self.vpc_cidrs(vpc).await?;
        let current = self
            .call(
                "DescribeSecurityGroups",
                ec2.describe_security_groups()
                    .set_group_ids(Some(todo.clone()))
                    .send(),
            )
            .await?;
        let want = node_rules(name, spec, &cidrs);
        for g in current.security_groups() {
            let Some(id) = g.group_id() else { continue };
            let has = |port: i32, cidr: &str| {
                g.ip_permissions().iter().any(|p| {
                    p.from_port() == Some(port)
                        && p.to_port() == Some(port)
                        && p.ip_ranges().iter().any(|r| r.cidr_ip() == Some(cidr))
                })
            };
            let missing: Vec<IpPermission> = want
                .iter()
                .filter(|(port, cidr, _)| !has(*port, cidr))
                .map(|(port, cidr, desc)| {
                    IpPermission::builder()
                        .ip_protocol("tcp")
                        .from_port(*port)
                        .to_port(*port)
                        .ip_ranges(IpRange::builder().cidr_ip(cidr).description(desc).build())
                        .build()
                })
                .collect();
            if !missing.is_empty() {
                self.authorize(id, missing).await?;
            }
            self.inner
                .memory
                .lock()
                .sg_rules
                .insert((id.to_string(), format!("nlb/{name}")));
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
            p.ip_ranges()
                .iter()
                .filter(|r| r.description().is_some_and(|d| ours.iter().any(|o| o == d)))
                .map(|r| {
                    IpPermission::builder()
                        .set_ip_protocol(p.ip_protocol().map(String::from))
                        .set_from_port(p.from_port())
                        .set_to_port(p.to_port())
                        .ip_ranges(
                            IpRange::builder()
                                .set_cidr_ip(r.cidr_ip().map(String::from))
                                .build(),
                        )
                        .build()
                })
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
        nodes: &[Node],
    ) -> CloudResult<String> {
        let ids = self.node_instance_ids(nodes).await?;
        let vpc = self.vpc(&ids).await?;
        let (lb, fresh) = match self.nlb_find(name).await? {
            Some(lb) => (lb, false),
            None => (self.nlb_create(cluster, name, &vpc, spec).await?, true),
        };
        let groups = self
            .nlb_sync_listeners(cluster, &lb, name, spec, fresh)
            .await?;
        for (tg, port) in &groups {
            self.nlb_sync_targets(tg, *port, &ids).await?;
        }
        if let Some(on) = spec.cross_zone {
            self.nlb_cross_zone(&lb.arn, on).await?;
        }
        let node_groups = self.node_security_groups(&ids).await?;
        self.nlb_sync_rules(name, &lb.vpc, spec, &node_groups, true)
            .await?;
        if lb.dns.is_empty() {
            return Err(CloudError::retry_after(
                std::time::Duration::from_secs(5),
                format!("NLB {name} has no DNS name yet"),
            ));
        }
        let known = NlbTargets {
            vpc: lb.vpc,
            groups,
        };
        self.inner
            .memory
            .lock()
            .nlbs
            .insert(name.to_string(), known);
        Ok(lb.dns)
    }

    /// The NLB's VPC and target groups with their ports, as the last ensure or update left
    /// them, else from AWS (two calls).
    async fn nlb_targets(&self, name: &str, spec: &LbSpec) -> CloudResult<NlbTargets> {
        if let Some(known) = self.inner.memory.lock().nlbs.get(name) {
            return Ok(known.clone());
        }
        let Some(lb) = self.nlb_find(name).await? else {
            return Err(CloudError::Permanent(format!(
                "NLB {name} does not exist; it is created by ensure"
            )));
        };
        let by_name = self.nlb_target_groups(&lb.arn).await?;
        let groups = spec
            .ports
            .iter()
            .filter_map(|p| {
                let arn = by_name.get(&target_group_name(name, spec, p))?;
                Some((arn.clone(), p.node_port))
            })
            .collect();
        Ok(NlbTargets {
            vpc: lb.vpc,
            groups,
        })
    }

    pub(crate) async fn nlb_update(
        &self,
        _cluster: &str,
        name: &str,
        spec: &LbSpec,
        nodes: &[Node],
    ) -> CloudResult<()> {
        let known = self.nlb_targets(name, spec).await?;
        let ids = self.node_instance_ids(nodes).await?;
        let mut out = Ok(());
        for (arn, port) in &known.groups {
            out = self.nlb_sync_targets(arn, *port, &ids).await;
            if out.is_err() {
                break;
            }
        }
        if out.is_ok() {
            out = match self.node_security_groups(&ids).await {
                Ok(g) => self.nlb_sync_rules(name, &known.vpc, spec, &g, false).await,
                Err(e) => Err(e),
            };
        }
        // A failure may mean the NLB changed behind our back: ask AWS again next time.
        let mut mem = self.inner.memory.lock();
        match &out {
            Ok(()) => mem.nlbs.insert(name.to_string(), known),
            Err(_) => mem.nlbs.remove(name),
        };
        out
    }

    pub(crate) async fn nlb_delete(&self, _cluster: &str, name: &str) -> CloudResult<()> {
        self.inner.memory.lock().nlbs.remove(name);
        let Some(lb) = self.nlb_find(name).await? else {
            return Ok(());
        };
        let elbv2 = self.clients().await?.elbv2.clone();
        self.nlb_revoke_rules(name, &lb.vpc).await?;
        let groups = self.nlb_target_groups(&lb.arn).await?;
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
        for arn in groups.values() {
            self.call(
                "DeleteTargetGroup",
                elbv2.delete_target_group().target_group_arn(arn).send(),
            )
            .await?;
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
