//! Security-group rules as upstream manages them, reconciled instead of only added: a rule is
//! granted when the Service asks for it and revoked when it no longer does, and only groups the
//! cluster owns (tagged `kubernetes.io/cluster/<id>`) are ever edited.
//!
//! Rules are compared flat — one protocol, port range and source each — because AWS groups and
//! splits permissions as it likes; a flat rule is what AWS counts against its quota.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_ec2::types::{
    Filter, IpPermission, IpRange, Ipv6Range, SecurityGroup, UserIdGroupPair,
};
use ccm_cloud::{CloudError, CloudResult};

use crate::cloud::AwsCloud;
use crate::error;
use crate::routes::CLUSTER_TAG_PREFIX;

/// Description of the ICMP "fragmentation needed" rules upstream adds next to NLB client rules.
pub const MTU_RULE: &str = "kubernetes.io/rule/nlb/mtu";

/// Where a rule admits traffic from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Source {
    V4(String),
    V6(String),
    Group(String),
}

/// One inbound rule as AWS counts it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Rule {
    pub proto: String,
    pub from: i32,
    pub to: i32,
    pub source: Source,
    /// Compared too: NLB rules are told apart by their description.
    pub desc: Option<String>,
}

impl Rule {
    /// A rule on `port` (or the ICMP type/code pair) from a CIDR of either family.
    pub fn cidr(proto: &str, from: i32, to: i32, cidr: &str, desc: Option<&str>) -> Rule {
        let source = if cidr.contains(':') {
            Source::V6(cidr.to_string())
        } else {
            Source::V4(cidr.to_string())
        };
        Rule {
            proto: proto.to_string(),
            from,
            to,
            source,
            desc: desc.map(String::from),
        }
    }

    /// ICMP "destination unreachable / fragmentation needed" (type 3, code 4) from `cidr`:
    /// path-MTU discovery through the load balancer. ICMPv6 "packet too big" for IPv6 ranges.
    pub fn mtu(cidr: &str, desc: Option<&str>) -> Rule {
        if cidr.contains(':') {
            Rule::cidr("58", 2, 0, cidr, desc)
        } else {
            Rule::cidr("icmp", 3, 4, cidr, desc)
        }
    }

    pub fn cidr_text(&self) -> Option<&str> {
        match &self.source {
            Source::V4(c) | Source::V6(c) => Some(c),
            Source::Group(_) => None,
        }
    }

    /// The same rule without its description (what a revoke matches on).
    fn bare(&self) -> Rule {
        Rule {
            desc: None,
            ..self.clone()
        }
    }

    pub fn permission(&self) -> IpPermission {
        let mut p = IpPermission::builder().ip_protocol(&self.proto);
        if self.proto != "-1" {
            p = p.from_port(self.from).to_port(self.to);
        }
        let desc = self.desc.clone();
        match &self.source {
            Source::V4(c) => {
                p.ip_ranges(IpRange::builder().cidr_ip(c).set_description(desc).build())
            }
            Source::V6(c) => p.ipv6_ranges(
                Ipv6Range::builder()
                    .cidr_ipv6(c)
                    .set_description(desc)
                    .build(),
            ),
            Source::Group(g) => p.user_id_group_pairs(
                UserIdGroupPair::builder()
                    .group_id(g)
                    .set_description(desc)
                    .build(),
            ),
        }
        .build()
    }
}

/// A permission as AWS returns it, split into flat rules.
pub(crate) fn flatten(p: &IpPermission) -> Vec<Rule> {
    let proto = p.ip_protocol().unwrap_or("-1").to_string();
    let (from, to) = if proto == "-1" {
        (-1, -1)
    } else {
        (p.from_port().unwrap_or(-1), p.to_port().unwrap_or(-1))
    };
    let rule = |source, desc: Option<&str>| Rule {
        proto: proto.clone(),
        from,
        to,
        source,
        desc: desc.map(String::from),
    };
    let mut out = Vec::new();
    for r in p.ip_ranges() {
        if let Some(c) = r.cidr_ip() {
            out.push(rule(Source::V4(c.to_string()), r.description()));
        }
    }
    for r in p.ipv6_ranges() {
        if let Some(c) = r.cidr_ipv6() {
            out.push(rule(Source::V6(c.to_string()), r.description()));
        }
    }
    for u in p.user_id_group_pairs() {
        if let Some(g) = u.group_id() {
            out.push(rule(Source::Group(g.to_string()), u.description()));
        }
    }
    out
}

/// Every rule of a group.
pub(crate) fn rules_of(g: &SecurityGroup) -> BTreeSet<Rule> {
    g.ip_permissions().iter().flat_map(flatten).collect()
}

/// Whether the group carries the cluster's tag (any value: owned or shared), as upstream's
/// `hasClusterTag`.
pub(crate) fn cluster_tagged(g: &SecurityGroup, cluster_id: &str) -> bool {
    let key = format!("{CLUSTER_TAG_PREFIX}{cluster_id}");
    g.tags().iter().any(|t| {
        t.key() == Some(key.as_str())
            || (t.key() == Some("KubernetesCluster") && t.value() == Some(cluster_id))
    })
}

/// The group of an instance that load-balancer traffic is opened on, as upstream's
/// `findSecurityGroupForInstance`: the one group tagged for the cluster. Several tagged groups
/// are an error (the operator must tag one); none means the instance is skipped — upstream
/// falls back to a lone untagged group, which would edit a group the cluster does not own.
pub(crate) fn node_group(
    instance: &str,
    groups: &[String],
    tagged: &BTreeSet<String>,
) -> CloudResult<Option<String>> {
    let mine: Vec<&String> = groups.iter().filter(|g| tagged.contains(*g)).collect();
    match mine.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some((*one).clone())),
        many => Err(CloudError::Permanent(format!(
            "instance {instance} has several security groups tagged for the cluster ({}); tag only the one load-balancer traffic should be opened on",
            many.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// What a change to one group does.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Plan {
    pub grant: Vec<Rule>,
    pub revoke: Vec<Rule>,
}

/// Rules to grant and revoke so that, among the rules `ours` selects, the group has exactly
/// `want`. Rules `ours` does not select are never touched.
pub(crate) fn plan(
    have: &BTreeSet<Rule>,
    want: &BTreeSet<Rule>,
    ours: impl Fn(&Rule) -> bool,
) -> Plan {
    Plan {
        grant: want.difference(have).cloned().collect(),
        revoke: have
            .iter()
            .filter(|r| ours(r) && !want.contains(r))
            .cloned()
            .collect(),
    }
}

/// The MTU rules a node group needs after its NLB rules changed: one per CIDR any NLB client
/// rule admits (upstream's `updateInstanceSecurityGroupForNLBMTU`).
pub(crate) fn mtu_rules(rules: &BTreeSet<Rule>, client_prefix: &str) -> BTreeSet<Rule> {
    rules
        .iter()
        .filter(|r| {
            r.desc
                .as_deref()
                .is_some_and(|d| d.starts_with(client_prefix))
        })
        .filter_map(|r| r.cidr_text())
        .map(|c| Rule::mtu(c, Some(MTU_RULE)))
        .collect()
}

/// Applies a plan to `rules` (the group's state afterwards).
pub(crate) fn applied(rules: &BTreeSet<Rule>, p: &Plan) -> BTreeSet<Rule> {
    let mut out = rules.clone();
    for r in &p.revoke {
        out.remove(r);
    }
    out.extend(p.grant.iter().cloned());
    out
}

impl AwsCloud {
    /// The security groups tagged for the cluster, with their rules (one call).
    pub(crate) async fn cluster_groups(
        &self,
        cluster: &str,
    ) -> CloudResult<BTreeMap<String, SecurityGroup>> {
        let ec2 = self.clients().await?.ec2.clone();
        let id = self.cluster_id(cluster).to_string();
        let out = self
            .call(
                "DescribeSecurityGroups",
                ec2.describe_security_groups()
                    .filters(
                        Filter::builder()
                            .name("tag-key")
                            .values(format!("{CLUSTER_TAG_PREFIX}{id}"))
                            .build(),
                    )
                    .send(),
            )
            .await?;
        let groups: BTreeMap<String, SecurityGroup> = out
            .security_groups()
            .iter()
            .filter(|g| cluster_tagged(g, &id))
            .filter_map(|g| Some((g.group_id()?.to_string(), g.clone())))
            .collect();
        self.inner.memory.lock().lb_groups.tagged = Some(groups.keys().cloned().collect());
        Ok(groups)
    }

    /// The node groups of `instances` (see [`node_group`]), from remembered facts when every
    /// instance's groups were classified before and not `fresh`, else after one
    /// `DescribeSecurityGroups`.
    pub(crate) async fn node_groups_of(
        &self,
        cluster: &str,
        instances: &BTreeSet<String>,
        fresh: bool,
    ) -> CloudResult<BTreeSet<String>> {
        let per_instance: Vec<(String, Vec<String>)> = {
            let mut missing = Vec::new();
            {
                let mem = self.inner.memory.lock();
                for id in instances {
                    if !mem.instances.contains_key(id) {
                        missing.push(id.clone());
                    }
                }
            }
            if !missing.is_empty() {
                self.instances_by_id(missing).await?;
            }
            let mem = self.inner.memory.lock();
            instances
                .iter()
                .filter_map(|id| Some((id.clone(), mem.instances.get(id)?.security_groups.clone())))
                .collect()
        };
        let known = self.inner.memory.lock().lb_groups.tagged.clone();
        let tagged = match known {
            Some(t) if !fresh && self.all_classified(&per_instance) => t,
            _ => {
                let t: BTreeSet<String> = self.cluster_groups(cluster).await?.into_keys().collect();
                let mut mem = self.inner.memory.lock();
                mem.lb_groups
                    .classified
                    .extend(per_instance.iter().flat_map(|(_, g)| g.iter().cloned()));
                t
            }
        };
        let mut out = BTreeSet::new();
        for (id, groups) in &per_instance {
            match node_group(id, groups, &tagged)? {
                Some(g) => {
                    out.insert(g);
                }
                None => tracing::warn!(
                    instance = %id,
                    "no security group of the instance is tagged {CLUSTER_TAG_PREFIX}<cluster>; load-balancer traffic is not opened on it"
                ),
            }
        }
        Ok(out)
    }

    fn all_classified(&self, per_instance: &[(String, Vec<String>)]) -> bool {
        let mem = self.inner.memory.lock();
        per_instance
            .iter()
            .flat_map(|(_, g)| g.iter())
            .all(|g| mem.lb_groups.classified.contains(g))
    }

    /// Revokes, then grants, as `p` says (one call each at most).
    pub(crate) async fn apply_plan(&self, group: &str, p: &Plan) -> CloudResult<()> {
        let ec2 = self.clients().await?.ec2.clone();
        if !p.revoke.is_empty() {
            let perms: Vec<IpPermission> = p.revoke.iter().map(|r| r.bare().permission()).collect();
            match self
                .call_raw(
                    "RevokeSecurityGroupIngress",
                    ec2.revoke_security_group_ingress()
                        .group_id(group)
                        .set_ip_permissions(Some(perms))
                        .send(),
                )
                .await
            {
                Ok(_) => {}
                Err(e) if error::code(&e) == Some("InvalidPermission.NotFound") => {}
                Err(e) => return Err(error::map("RevokeSecurityGroupIngress", e)),
            }
        }
        if p.grant.len() == 1 {
            self.authorize(group, vec![p.grant[0].permission()]).await?;
        } else if !p.grant.is_empty() {
            let perms = p.grant.iter().map(Rule::permission).collect();
            // One rule already there (say, the operator's, with another description) fails the
            // whole batch as a duplicate: then rule by rule, so none of the others is lost.
            if !self.authorize_new(group, perms).await? {
                for r in &p.grant {
                    self.authorize(group, vec![r.permission()]).await?;
                }
            }
        }
        Ok(())
    }
}

/// What the load-balancer code remembers about security groups between calls.
#[derive(Debug, Default)]
pub(crate) struct GroupMemory {
    /// The cluster-tagged groups, as the last `DescribeSecurityGroups` found them.
    pub tagged: Option<BTreeSet<String>>,
    /// Every instance group seen when `tagged` was read: those need no new lookup.
    pub classified: BTreeSet<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(rules: &[Rule]) -> BTreeSet<Rule> {
        rules.iter().cloned().collect()
    }

    #[test]
    fn the_plan_revokes_only_what_is_ours_and_unwanted() {
        let open = Rule::cidr(
            "tcp",
            80,
            80,
            "0.0.0.0/0",
            Some("kubernetes.io/rule/nlb/client=a"),
        );
        let office = Rule::cidr(
            "tcp",
            80,
            80,
            "203.0.113.0/24",
            Some("kubernetes.io/rule/nlb/client=a"),
        );
        let other_lb = Rule::cidr(
            "tcp",
            81,
            81,
            "0.0.0.0/0",
            Some("kubernetes.io/rule/nlb/client=b"),
        );
        let ssh = Rule::cidr("tcp", 22, 22, "10.0.0.0/8", None);
        let have = set(&[open.clone(), other_lb.clone(), ssh.clone()]);
        let p = plan(&have, &set(std::slice::from_ref(&office)), |r| {
            r.desc.as_deref() == Some("kubernetes.io/rule/nlb/client=a")
        });
        assert_eq!(p.grant, vec![office]);
        assert_eq!(p.revoke, vec![open]);
    }

    #[test]
    fn one_tagged_group_is_chosen_several_are_an_error_none_is_skipped() {
        let tagged: BTreeSet<String> = ["sg-nodes".to_string(), "sg-other".to_string()].into();
        let g = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            node_group("i-1", &g(&["sg-corp", "sg-nodes"]), &tagged).expect("ok"),
            Some("sg-nodes".to_string())
        );
        assert_eq!(
            node_group("i-1", &g(&["sg-corp"]), &tagged).expect("ok"),
            None
        );
        assert!(node_group("i-1", &g(&["sg-nodes", "sg-other"]), &tagged).is_err());
    }

    #[test]
    fn mtu_rules_follow_the_client_rules() {
        let rules = set(&[
            Rule::cidr(
                "tcp",
                30080,
                30080,
                "203.0.113.0/24",
                Some("kubernetes.io/rule/nlb/client=a"),
            ),
            Rule::cidr(
                "tcp",
                30080,
                30080,
                "10.0.0.0/16",
                Some("kubernetes.io/rule/nlb/health=a"),
            ),
        ]);
        assert_eq!(
            mtu_rules(&rules, "kubernetes.io/rule/nlb/client="),
            set(&[Rule::cidr("icmp", 3, 4, "203.0.113.0/24", Some(MTU_RULE))])
        );
    }
}
