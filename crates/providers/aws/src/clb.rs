//! Classic ELBs (upstream's default): one listener per Service port to the NodePort, instance
//! registration, a health check, a security group of its own (`k8s-elb-<name>`) open to the
//! Service's source ranges, and an allow-all rule from that group on the nodes' groups.

use std::collections::BTreeSet;
use std::sync::Arc;

use aws_sdk_ec2::types::{Filter, IpPermission, ResourceType, TagSpecification, UserIdGroupPair};
use aws_sdk_elasticloadbalancing::types::{
    AccessLog, ConnectionDraining, ConnectionSettings, CrossZoneLoadBalancing, HealthCheck,
    Instance, Listener, LoadBalancerAttributes, LoadBalancerDescription, PolicyAttribute, Tag,
};
use ccm_cloud::{CloudError, CloudResult, Node};

use crate::annotations::LbSpec;
use crate::cloud::AwsCloud;
use crate::error;
use crate::lb::resource_tags;
use crate::sg::{self, Rule};

/// What the load balancer's own group admits: each port (its protocol: TCP, or UDP on an
/// NLB) from each source range, and ICMP fragmentation-needed from them (path MTU), as
/// upstream.
pub(crate) fn clb_ingress(spec: &LbSpec) -> BTreeSet<Rule> {
    let mut out = BTreeSet::new();
    for c in &spec.source_ranges {
        for p in &spec.ports {
            let proto = p.protocol().to_ascii_lowercase();
            out.insert(Rule::cidr(&proto, p.port, p.port, c, None));
        }
        out.insert(Rule::mtu(c, None));
    }
    out
}

fn built<T, E: std::fmt::Display>(r: Result<T, E>) -> CloudResult<T> {
    r.map_err(|e| CloudError::Permanent(format!("building an AWS request: {e}")))
}

/// A Classic ELB listener as upstream's `buildListener`: with the certificate SSL to TCP, or per
/// the backend protocol (`https`/`http` → HTTPS, `ssl`/`tcp` → SSL); without it TCP, or HTTP
/// for an `http` backend.
fn clb_listener(spec: &LbSpec, p: &crate::annotations::PortMap) -> CloudResult<Listener> {
    let backend = spec.tls.backend.as_deref();
    let (front, back, cert) = if p.tls {
        let front = match backend {
            None => "SSL",
            Some("https") | Some("http") => "HTTPS",
            Some(_) => "SSL",
        };
        (front, backend.unwrap_or("tcp"), spec.tls.cert.clone())
    } else if backend == Some("http") {
        ("HTTP", "http", None)
    } else {
        ("TCP", "tcp", None)
    };
    built(
        Listener::builder()
            .protocol(front)
            .load_balancer_port(p.port)
            .instance_protocol(back.to_uppercase())
            .instance_port(p.node_port)
            .set_ssl_certificate_id(cert)
            .build(),
    )
}

/// Upstream's name for the ELB policy carrying an SSL negotiation policy.
fn ssl_policy_name(policy: &str) -> String {
    format!("k8s-SSLNegotiationPolicy-{policy}")
}

/// Upstream's PROXY protocol policy name.
pub const PROXY_POLICY: &str = "k8s-proxyprotocol-enabled";

/// Tag upstream puts on the security group it creates for an NLB in `NLBSecurityGroupMode =
/// Managed`.
pub const NLB_MODE_TAG: &str = "kubernetes.io/cloud-provider-aws/NLBSecurityGroupMode";

/// The security group name upstream gives a Classic ELB (and an NLB's managed group).
pub fn sg_name(lb: &str) -> String {
    format!("k8s-elb-{lb}")
}

fn target(spec: &LbSpec) -> String {
    let h = &spec.health;
    let port = if h.port == "traffic-port" {
        spec.ports
            .first()
            .map(|p| p.node_port.to_string())
            .unwrap_or_default()
    } else {
        h.port.clone()
    };
    match h.protocol.as_str() {
        "TCP" => format!("TCP:{port}"),
        proto => format!("{proto}:{port}{}", h.path),
    }
}

impl AwsCloud {
    async fn clb_describe(&self, name: &str) -> CloudResult<Option<LoadBalancerDescription>> {
        let elb = self.clients().await?.elb.clone();
        match self
            .call_raw(
                "DescribeLoadBalancers",
                elb.describe_load_balancers()
                    .load_balancer_names(name)
                    .send(),
            )
            .await
        {
            Ok(out) => Ok(out.load_balancer_descriptions().first().cloned()),
            Err(e) if error::code(&e) == Some("LoadBalancerNotFound") => Ok(None),
            Err(e) => Err(error::map("DescribeLoadBalancers", e)),
        }
    }

    pub(crate) async fn clb_dns(&self, name: &str) -> CloudResult<Option<String>> {
        Ok(self
            .clb_describe(name)
            .await?
            .and_then(|d| d.dns_name().map(String::from)))
    }

    /// The Classic ELB's security groups, as upstream's `buildELBSecurityGroupList`: the
    /// annotation's, else the cloud-config's `elb_security_group`, else one of its own (whose
    /// ingress this provider owns); then the extra ones. The first admits traffic on the nodes.
    async fn clb_groups(
        &self,
        cluster: &str,
        name: &str,
        vpc: &str,
        spec: &LbSpec,
    ) -> CloudResult<Vec<String>> {
        let mut out = if !spec.security_groups.is_empty() {
            spec.security_groups.clone()
        } else if let Some(g) = &self.inner.cfg.elb_security_group {
            vec![g.clone()]
        } else {
            vec![self.own_group(cluster, name, vpc, spec, false).await?]
        };
        for g in &spec.extra_security_groups {
            if !out.contains(g) {
                out.push(g.clone());
            }
        }
        Ok(out)
    }

    /// The group named `k8s-elb-<name>` in the VPC, if there is one.
    pub(crate) async fn own_group_find(
        &self,
        name: &str,
        vpc: &str,
    ) -> CloudResult<Option<aws_sdk_ec2::types::SecurityGroup>> {
        let ec2 = self.clients().await?.ec2.clone();
        let found = self
            .call(
                "DescribeSecurityGroups",
                ec2.describe_security_groups()
                    .filters(
                        Filter::builder()
                            .name("group-name")
                            .values(sg_name(name))
                            .build(),
                    )
                    .filters(Filter::builder().name("vpc-id").values(vpc).build())
                    .send(),
            )
            .await?;
        Ok(found.security_groups().first().cloned())
    }

    /// The load balancer's own group (`k8s-elb-<name>`), created if missing (an NLB's tagged
    /// with upstream's managed-mode tag), admitting exactly the Service's source ranges on its
    /// ports plus ICMP fragmentation-needed (path MTU), as upstream: whatever else it admits
    /// is revoked. A group of that name the cluster does not own is refused, never edited.
    pub(crate) async fn own_group(
        &self,
        cluster: &str,
        name: &str,
        vpc: &str,
        spec: &LbSpec,
        nlb: bool,
    ) -> CloudResult<String> {
        let group = sg_name(name);
        let found = self.own_group_find(name, vpc).await?;
        let (id, have) = match found.as_ref() {
            Some(g) => {
                if !sg::cluster_tagged(g, self.cluster_id(cluster)) {
                    return Err(CloudError::Permanent(format!(
                        "security group {group} ({}) exists but is not tagged for the cluster; it is not edited: tag it {}{} or delete it",
                        g.group_id().unwrap_or_default(),
                        crate::routes::CLUSTER_TAG_PREFIX,
                        self.cluster_id(cluster)
                    )));
                }
                (
                    g.group_id().unwrap_or_default().to_string(),
                    sg::rules_of(g),
                )
            }
            None => (
                self.create_own_group(cluster, name, vpc, spec, nlb).await?,
                BTreeSet::new(),
            ),
        };
        let have: BTreeSet<Rule> = have
            .iter()
            .map(|r| Rule {
                desc: None,
                ..r.clone()
            })
            .collect();
        let plan = sg::plan(&have, &clb_ingress(spec), |_| true);
        self.apply_plan(&id, &plan).await?;
        Ok(id)
    }

    async fn create_own_group(
        &self,
        cluster: &str,
        name: &str,
        vpc: &str,
        spec: &LbSpec,
        nlb: bool,
    ) -> CloudResult<String> {
        let ec2 = self.clients().await?.ec2.clone();
        let mut tags = resource_tags(self, cluster, spec);
        if nlb {
            tags.insert(NLB_MODE_TAG.into(), "Managed".into());
        }
        let out = self
            .call(
                "CreateSecurityGroup",
                ec2.create_security_group()
                    .group_name(sg_name(name))
                    .description(format!(
                        "Security group for Kubernetes ELB {name} ({})",
                        spec.service_name
                    ))
                    .vpc_id(vpc)
                    .tag_specifications(
                        TagSpecification::builder()
                            .resource_type(ResourceType::SecurityGroup)
                            .set_tags(Some(
                                tags.iter()
                                    .map(|(k, v)| {
                                        aws_sdk_ec2::types::Tag::builder().key(k).value(v).build()
                                    })
                                    .collect(),
                            ))
                            .build(),
                    )
                    .send(),
            )
            .await?;
        Ok(out.group_id().unwrap_or_default().to_string())
    }

    pub(crate) async fn authorize(&self, group: &str, perms: Vec<IpPermission>) -> CloudResult<()> {
        self.authorize_new(group, perms).await.map(|_| ())
    }

    /// Grants `perms`; false when AWS refused them as duplicates (none was granted then).
    pub(crate) async fn authorize_new(
        &self,
        group: &str,
        perms: Vec<IpPermission>,
    ) -> CloudResult<bool> {
        let ec2 = self.clients().await?.ec2.clone();
        match self
            .call_raw(
                "AuthorizeSecurityGroupIngress",
                ec2.authorize_security_group_ingress()
                    .group_id(group)
                    .set_ip_permissions(Some(perms))
                    .send(),
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if error::code(&e) == Some("InvalidPermission.Duplicate") => Ok(false),
            Err(e) => Err(error::map("AuthorizeSecurityGroupIngress", e)),
        }
    }

    /// Traffic from the ELB's group allowed on exactly the node groups of `ids` (the
    /// cluster-tagged group of each instance), revoked from the cluster's other groups, as
    /// upstream's `updateInstanceSecurityGroupsForLoadBalancer`. Unless `force`, nothing is
    /// asked of AWS when the node groups are those the last call left allowed.
    async fn clb_node_rules(
        &self,
        cluster: &str,
        source: &str,
        ids: &BTreeSet<String>,
        force: bool,
    ) -> CloudResult<()> {
        if self.inner.cfg.disable_security_group_ingress {
            return Ok(());
        }
        let want = self.node_groups_of(cluster, ids, force).await?;
        let remembered: BTreeSet<String> = {
            let mem = self.inner.memory.lock();
            mem.sg_rules
                .iter()
                .filter(|(_, s)| s == source)
                .map(|(g, _)| g.clone())
                .collect()
        };
        if !force && want == remembered {
            return Ok(());
        }
        let allow = Rule {
            proto: "-1".into(),
            from: -1,
            to: -1,
            source: sg::Source::Group(source.to_string()),
            desc: None,
        };
        let groups = self.cluster_groups(cluster).await?;
        for (id, g) in &groups {
            let have: BTreeSet<Rule> = sg::rules_of(g)
                .into_iter()
                .filter(|r| r.source == allow.source)
                .map(|r| Rule { desc: None, ..r })
                .collect();
            let wanted: BTreeSet<Rule> = if want.contains(id) {
                [allow.clone()].into()
            } else {
                BTreeSet::new()
            };
            self.apply_plan(id, &sg::plan(&have, &wanted, |_| true))
                .await?;
        }
        let mut mem = self.inner.memory.lock();
        mem.sg_rules.retain(|(_, s)| s != source);
        for g in want.iter().filter(|g| groups.contains_key(*g)) {
            mem.sg_rules.insert((g.clone(), source.to_string()));
        }
        Ok(())
    }

    /// Removes every rule in the VPC's groups that admits `source`, then forgets them.
    pub(crate) async fn revoke_from(&self, source: &str) -> CloudResult<()> {
        let admits = Filter::builder()
            .name("ip-permission.group-id")
            .values(source)
            .build();
        self.revoke_matching(admits, |p| {
            let ours = p
                .user_id_group_pairs()
                .iter()
                .any(|u| u.group_id() == Some(source));
            ours.then(|| {
                IpPermission::builder()
                    .set_ip_protocol(p.ip_protocol().map(String::from))
                    .set_from_port(p.from_port())
                    .set_to_port(p.to_port())
                    .user_id_group_pairs(UserIdGroupPair::builder().group_id(source).build())
                    .build()
            })
            .into_iter()
            .collect()
        })
        .await?;
        self.inner
            .memory
            .lock()
            .sg_rules
            .retain(|(_, s)| s != source);
        Ok(())
    }

    pub(crate) async fn clb_ensure(
        &self,
        cluster: &str,
        name: &str,
        spec: &LbSpec,
        nodes: &[Arc<Node>],
    ) -> CloudResult<String> {
        let ids = self.node_instance_ids(nodes).await?;
        let vpc = self.vpc(&ids).await?;
        let sgs = self.clb_groups(cluster, name, &vpc, spec).await?;
        let elb = self.clients().await?.elb.clone();
        let listeners: Vec<Listener> = spec
            .ports
            .iter()
            .map(|p| clb_listener(spec, p))
            .collect::<CloudResult<_>>()?;
        let existing = self.clb_describe(name).await?;
        // AWS cannot change the scheme of an existing ELB: it keeps its own (and the subnets
        // for it), and the ensure ends in an error naming the annotation.
        let scheme_kept = existing
            .as_ref()
            .and_then(|d| d.scheme())
            .map(|s| s == "internal")
            .filter(|internal| *internal != spec.internal);
        let kept;
        let spec = match scheme_kept {
            Some(internal) => {
                kept = LbSpec {
                    internal,
                    ..spec.clone()
                };
                &kept
            }
            None => spec,
        };
        let desc = match existing {
            Some(d) => {
                self.clb_sync_listeners(name, &d, &listeners).await?;
                self.clb_apply_groups(cluster, name, &d, &sgs).await?;
                let subnets = self.lb_subnets(cluster, &vpc, spec).await?;
                self.clb_sync_subnets(name, &d, &subnets).await?;
                self.clb_sync_tags(cluster, name, spec).await?;
                d
            }
            None => {
                let subnets = self.lb_subnets(cluster, &vpc, spec).await?;
                let tags = resource_tags(self, cluster, spec)
                    .into_iter()
                    .map(|(k, v)| built(Tag::builder().key(k).value(v).build()))
                    .collect::<CloudResult<Vec<_>>>()?;
                let mut req = elb
                    .create_load_balancer()
                    .load_balancer_name(name)
                    .set_listeners(Some(listeners))
                    .set_subnets(Some(subnets))
                    .set_security_groups(Some(sgs.clone()))
                    .set_tags(Some(tags));
                if spec.internal {
                    req = req.scheme("internal");
                }
                self.call("CreateLoadBalancer", req.send()).await?;
                self.clb_describe(name).await?.ok_or_else(|| {
                    CloudError::retry_after(
                        std::time::Duration::from_secs(5),
                        format!("ELB {name} not visible yet"),
                    )
                })?
            }
        };
        self.clb_sync_health(name, &desc, spec).await?;
        self.clb_attributes(name, spec).await?;
        self.clb_proxy_protocol(name, &desc, spec).await?;
        if let Some(policy) = &spec.tls.policy {
            self.clb_ssl_policy(name, spec, policy).await?;
        }
        self.clb_sync_instances(name, &desc, &ids).await?;
        self.clb_node_rules(cluster, &sgs[0], &ids, true).await?;
        if let Some(internal) = scheme_kept {
            return Err(crate::lb::scheme_unchangeable(internal));
        }
        desc.dns_name().map(String::from).ok_or_else(|| {
            CloudError::retry_after(
                std::time::Duration::from_secs(5),
                format!("ELB {name} has no DNS name yet"),
            )
        })
    }

    async fn clb_sync_listeners(
        &self,
        name: &str,
        d: &LoadBalancerDescription,
        want: &[Listener],
    ) -> CloudResult<()> {
        let elb = self.clients().await?.elb.clone();
        let have: Vec<&Listener> = d
            .listener_descriptions()
            .iter()
            .filter_map(|l| l.listener())
            .collect();
        let same = |a: &Listener, b: &Listener| {
            a.load_balancer_port() == b.load_balancer_port()
                && a.instance_port() == b.instance_port()
                && a.protocol().eq_ignore_ascii_case(b.protocol())
                && a.instance_protocol().map(str::to_uppercase)
                    == b.instance_protocol().map(str::to_uppercase)
                && a.ssl_certificate_id() == b.ssl_certificate_id()
        };
        let stale: Vec<i32> = have
            .iter()
            .filter(|h| !want.iter().any(|w| same(w, h)))
            .map(|h| h.load_balancer_port())
            .collect();
        let add: Vec<Listener> = want
            .iter()
            .filter(|w| !have.iter().any(|h| same(w, h)))
            .cloned()
            .collect();
        // One port per call: moto drops only some of several (listener changes are rare).
        for port in stale {
            self.call(
                "DeleteLoadBalancerListeners",
                elb.delete_load_balancer_listeners()
                    .load_balancer_name(name)
                    .load_balancer_ports(port)
                    .send(),
            )
            .await?;
        }
        if !add.is_empty() {
            self.call(
                "CreateLoadBalancerListeners",
                elb.create_load_balancer_listeners()
                    .load_balancer_name(name)
                    .set_listeners(Some(add))
                    .send(),
            )
            .await?;
        }
        Ok(())
    }

    async fn clb_sync_health(
        &self,
        name: &str,
        d: &LoadBalancerDescription,
        spec: &LbSpec,
    ) -> CloudResult<()> {
        let h = &spec.health;
        let want = built(
            HealthCheck::builder()
                .target(target(spec))
                .interval(h.interval)
                .timeout(h.timeout)
                .unhealthy_threshold(h.unhealthy)
                .healthy_threshold(h.healthy)
                .build(),
        )?;
        if d.health_check() == Some(&want) {
            return Ok(());
        }
        let elb = self.clients().await?.elb.clone();
        self.call(
            "ConfigureHealthCheck",
            elb.configure_health_check()
                .load_balancer_name(name)
                .health_check(want)
                .send(),
        )
        .await
        .map(|_| ())
    }

    /// Access logs, connection draining, idle timeout and cross-zone balancing as the
    /// annotations say, upstream's defaults where they say nothing (off, off, 60 s, off).
    async fn clb_attributes(&self, name: &str, spec: &LbSpec) -> CloudResult<()> {
        let elb = self.clients().await?.elb.clone();
        let now = self
            .call(
                "DescribeLoadBalancerAttributes",
                elb.describe_load_balancer_attributes()
                    .load_balancer_name(name)
                    .send(),
            )
            .await?;
        let a = &spec.attributes;
        let cross = spec.cross_zone.unwrap_or(false);
        // AWS's default (every 60 minutes) when the annotation is absent, so that removing it
        // takes effect.
        let interval = a.access_log_interval.unwrap_or(60);
        let now = now.load_balancer_attributes();
        let log = now.and_then(|n| n.access_log());
        let drain = now.and_then(|n| n.connection_draining());
        let same = now
            .and_then(|n| n.cross_zone_load_balancing())
            .map(|c| c.enabled())
            == Some(cross)
            && log.map(|l| l.enabled()) == Some(a.access_log)
            && (!a.access_log
                || (log.and_then(|l| l.s3_bucket_name()).unwrap_or_default()
                    == a.access_log_bucket
                    && log.and_then(|l| l.s3_bucket_prefix()).unwrap_or_default()
                        == a.access_log_prefix
                    && log.and_then(|l| l.emit_interval()) == Some(interval)))
            && drain.map(|d| d.enabled()) == Some(a.draining)
            && (a.draining_timeout.is_none()
                || drain.and_then(|d| d.timeout()) == a.draining_timeout)
            && now
                .and_then(|n| n.connection_settings())
                .map(|c| c.idle_timeout())
                == Some(a.idle_timeout);
        if same {
            return Ok(());
        }
        let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_string());
        let attrs = LoadBalancerAttributes::builder()
            .cross_zone_load_balancing(CrossZoneLoadBalancing::builder().enabled(cross).build())
            .access_log(
                AccessLog::builder()
                    .enabled(a.access_log)
                    .set_s3_bucket_name(non_empty(&a.access_log_bucket))
                    .set_s3_bucket_prefix(non_empty(&a.access_log_prefix))
                    .set_emit_interval(a.access_log.then_some(interval))
                    .build(),
            )
            .connection_draining(
                ConnectionDraining::builder()
                    .enabled(a.draining)
                    .set_timeout(a.draining_timeout)
                    .build(),
            )
            .connection_settings(built(
                ConnectionSettings::builder()
                    .idle_timeout(a.idle_timeout)
                    .build(),
            )?)
            .build();
        self.call(
            "ModifyLoadBalancerAttributes",
            elb.modify_load_balancer_attributes()
                .load_balancer_name(name)
                .load_balancer_attributes(attrs)
                .send(),
        )
        .await
        .map(|_| ())
    }

    /// The SSL negotiation policy on every SSL/HTTPS listener, as upstream: the ELB policy
    /// `k8s-SSLNegotiationPolicy-<policy>` referencing the predefined one, created if missing.
    async fn clb_ssl_policy(&self, name: &str, spec: &LbSpec, policy: &str) -> CloudResult<()> {
        let elb = self.clients().await?.elb.clone();
        let policy_name = ssl_policy_name(policy);
        let found = self
            .call_raw(
                "DescribeLoadBalancerPolicies",
                elb.describe_load_balancer_policies()
                    .load_balancer_name(name)
                    .policy_names(&policy_name)
                    .send(),
            )
            .await;
        let exists = match found {
            Ok(out) => !out.policy_descriptions().is_empty(),
            Err(e) if error::code(&e) == Some("PolicyNotFound") => false,
            Err(e) => return Err(error::map("DescribeLoadBalancerPolicies", e)),
        };
        if !exists {
            self.call(
                "CreateLoadBalancerPolicy",
                elb.create_load_balancer_policy()
                    .load_balancer_name(name)
                    .policy_name(&policy_name)
                    .policy_type_name("SSLNegotiationPolicyType")
                    .policy_attributes(
                        PolicyAttribute::builder()
                            .attribute_name("Reference-Security-Policy")
                            .attribute_value(policy)
                            .build(),
                    )
                    .send(),
            )
            .await?;
        }
        for p in spec.ports.iter().filter(|p| p.tls) {
            self.call(
                "SetLoadBalancerPoliciesOfListener",
                elb.set_load_balancer_policies_of_listener()
                    .load_balancer_name(name)
                    .load_balancer_port(p.port)
                    .policy_names(&policy_name)
                    .send(),
            )
            .await?;
        }
        Ok(())
    }

    /// PROXY protocol on every backend port when the annotation asks for it, off elsewhere,
    /// with upstream's policy `k8s-proxyprotocol-enabled`.
    async fn clb_proxy_protocol(
        &self,
        name: &str,
        d: &LoadBalancerDescription,
        spec: &LbSpec,
    ) -> CloudResult<()> {
        let on: BTreeSet<i32> = d
            .backend_server_descriptions()
            .iter()
            .filter(|b| b.policy_names().iter().any(|p| p == PROXY_POLICY))
            .filter_map(|b| b.instance_port())
            .collect();
        let want: BTreeSet<i32> = if spec.proxy_protocol {
            spec.ports.iter().map(|p| p.node_port).collect()
        } else {
            BTreeSet::new()
        };
        if on == want {
            return Ok(());
        }
        let elb = self.clients().await?.elb.clone();
        if !want.is_empty() {
            let created = self
                .call_raw(
                    "CreateLoadBalancerPolicy",
                    elb.create_load_balancer_policy()
                        .load_balancer_name(name)
                        .policy_name(PROXY_POLICY)
                        .policy_type_name("ProxyProtocolPolicyType")
                        .policy_attributes(
                            PolicyAttribute::builder()
                                .attribute_name("ProxyProtocol")
                                .attribute_value("true")
                                .build(),
                        )
                        .send(),
                )
                .await;
            match created {
                Ok(_) => {}
                Err(e) if error::code(&e) == Some("DuplicatePolicyName") => {}
                Err(e) => return Err(error::map("CreateLoadBalancerPolicy", e)),
            }
        }
        for port in want.symmetric_difference(&on) {
            let policies = if want.contains(port) {
                vec![PROXY_POLICY.to_string()]
            } else {
                Vec::new()
            };
            self.call(
                "SetLoadBalancerPoliciesForBackendServer",
                elb.set_load_balancer_policies_for_backend_server()
                    .load_balancer_name(name)
                    .instance_port(*port)
                    .set_policy_names(Some(policies))
                    .send(),
            )
            .await?;
        }
        Ok(())
    }

    async fn clb_sync_instances(
        &self,
        name: &str,
        d: &LoadBalancerDescription,
        want: &BTreeSet<String>,
    ) -> CloudResult<()> {
        let elb = self.clients().await?.elb.clone();
        let have: BTreeSet<String> = d
            .instances()
            .iter()
            .filter_map(|i| i.instance_id().map(String::from))
            .collect();
        let inst = |id: &String| Instance::builder().instance_id(id).build();
        let add: Vec<Instance> = want.difference(&have).map(inst).collect();
        let remove: Vec<Instance> = have.difference(want).map(inst).collect();
        if !add.is_empty() {
            self.call(
                "RegisterInstancesWithLoadBalancer",
                elb.register_instances_with_load_balancer()
                    .load_balancer_name(name)
                    .set_instances(Some(add))
                    .send(),
            )
            .await?;
        }
        if !remove.is_empty() {
            self.call(
                "DeregisterInstancesFromLoadBalancer",
                elb.deregister_instances_from_load_balancer()
                    .load_balancer_name(name)
                    .set_instances(Some(remove))
                    .send(),
            )
            .await?;
        }
        Ok(())
    }

    /// The additional-resource-tags annotation's tags on an existing ELB, added or changed
    /// where they differ (as upstream's `addLoadBalancerTags`; a tag no longer in the
    /// annotation stays: nothing tells it from one added by someone else).
    async fn clb_sync_tags(&self, cluster: &str, name: &str, spec: &LbSpec) -> CloudResult<()> {
        if spec.extra_tags.is_empty() {
            return Ok(());
        }
        let elb = self.clients().await?.elb.clone();
        let out = self
            .call(
                "DescribeTags",
                elb.describe_tags().load_balancer_names(name).send(),
            )
            .await?;
        let have: Vec<(&str, &str)> = out
            .tag_descriptions()
            .iter()
            .flat_map(|d| d.tags())
            .map(|t| (t.key(), t.value().unwrap_or_default()))
            .collect();
        let add = resource_tags(self, cluster, spec)
            .into_iter()
            .filter(|(k, v)| !have.contains(&(k.as_str(), v.as_str())))
            .map(|(k, v)| built(Tag::builder().key(k).value(v).build()))
            .collect::<CloudResult<Vec<_>>>()?;
        if add.is_empty() {
            return Ok(());
        }
        self.call(
            "AddTags",
            elb.add_tags()
                .load_balancer_names(name)
                .set_tags(Some(add))
                .send(),
        )
        .await
        .map(|_| ())
    }

    /// Replaces the ELB's security groups when they differ from `want`; the rules a former
    /// group had on the cluster's node groups go (its own group goes with the ELB; a group of
    /// the annotation or cloud-config keeps whatever else admits it).
    async fn clb_apply_groups(
        &self,
        cluster: &str,
        name: &str,
        d: &LoadBalancerDescription,
        want: &[String],
    ) -> CloudResult<()> {
        let have: BTreeSet<&String> = d.security_groups().iter().collect();
        if have == want.iter().collect::<BTreeSet<_>>() {
            return Ok(());
        }
        let elb = self.clients().await?.elb.clone();
        self.call(
            "ApplySecurityGroupsToLoadBalancer",
            elb.apply_security_groups_to_load_balancer()
                .load_balancer_name(name)
                .set_security_groups(Some(want.to_vec()))
                .send(),
        )
        .await?;
        for old in have.into_iter().filter(|g| !want.contains(g)) {
            self.clb_node_rules(cluster, old, &BTreeSet::new(), true)
                .await?;
        }
        Ok(())
    }

    /// Attaches the ELB to the subnets it should be in and detaches it from the others, as
    /// upstream does on every ensure (so a changed subnets annotation takes effect).
    async fn clb_sync_subnets(
        &self,
        name: &str,
        d: &LoadBalancerDescription,
        want: &[String],
    ) -> CloudResult<()> {
        let elb = self.clients().await?.elb.clone();
        let have: BTreeSet<&String> = d.subnets().iter().collect();
        let want_set: BTreeSet<&String> = want.iter().collect();
        let add: Vec<String> = want_set.difference(&have).map(|s| s.to_string()).collect();
        let remove: Vec<String> = have.difference(&want_set).map(|s| s.to_string()).collect();
        if !add.is_empty() {
            self.call(
                "AttachLoadBalancerToSubnets",
                elb.attach_load_balancer_to_subnets()
                    .load_balancer_name(name)
                    .set_subnets(Some(add))
                    .send(),
            )
            .await?;
        }
        if !remove.is_empty() {
            self.call(
                "DetachLoadBalancerFromSubnets",
                elb.detach_load_balancer_from_subnets()
                    .load_balancer_name(name)
                    .set_subnets(Some(remove))
                    .send(),
            )
            .await?;
        }
        Ok(())
    }

    /// The group whose traffic the nodes admit: the first the ELB has that is not an extra one.
    fn clb_source<'a>(d: &'a LoadBalancerDescription, spec: Option<&LbSpec>) -> Option<&'a String> {
        let extra = spec
            .map(|s| s.extra_security_groups.as_slice())
            .unwrap_or(&[]);
        let first = spec.and_then(|s| s.security_groups.first());
        d.security_groups()
            .iter()
            .find(|g| Some(*g) == first)
            .or_else(|| d.security_groups().iter().find(|g| !extra.contains(g)))
    }

    /// The backends follow the nodes; without `spec` (the Service's annotations are refused)
    /// so do the node rules of the ELB's current group, and nothing else changes.
    pub(crate) async fn clb_update(
        &self,
        cluster: &str,
        name: &str,
        spec: Option<&LbSpec>,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        let Some(d) = self.clb_describe(name).await? else {
            return Err(CloudError::Permanent(format!(
                "ELB {name} does not exist; it is created by ensure"
            )));
        };
        let ids = self.node_instance_ids(nodes).await?;
        self.clb_sync_instances(name, &d, &ids).await?;
        if let Some(sg) = Self::clb_source(&d, spec) {
            self.clb_node_rules(cluster, sg, &ids, false).await?;
        }
        Ok(())
    }

    async fn clb_is_own(&self, group: &str, name: &str) -> CloudResult<bool> {
        let ec2 = self.clients().await?.ec2.clone();
        let out = self
            .call(
                "DescribeSecurityGroups",
                ec2.describe_security_groups().group_ids(group).send(),
            )
            .await?;
        Ok(out
            .security_groups()
            .iter()
            .any(|g| g.group_name() == Some(sg_name(name).as_str())))
    }

    pub(crate) async fn clb_delete(&self, cluster: &str, name: &str) -> CloudResult<()> {
        let ec2 = self.clients().await?.ec2.clone();
        let elb = self.clients().await?.elb.clone();
        let groups: Vec<String> = match self.clb_describe(name).await? {
            Some(d) => {
                let groups = d.security_groups().to_vec();
                // A group not its own (annotation, cloud-config): only the node rules go.
                if let Some(first) = groups.first()
                    && !first.is_empty()
                    && !self.clb_is_own(first, name).await?
                {
                    self.clb_node_rules(cluster, first, &BTreeSet::new(), true)
                        .await?;
                }
                self.call(
                    "DeleteLoadBalancer",
                    elb.delete_load_balancer().load_balancer_name(name).send(),
                )
                .await?;
                groups
            }
            None => Vec::new(),
        };
        // Our own group only (by its name), even if a previous delete stopped half-way.
        let own = self
            .call(
                "DescribeSecurityGroups",
                ec2.describe_security_groups()
                    .filters(
                        Filter::builder()
                            .name("group-name")
                            .values(sg_name(name))
                            .build(),
                    )
                    .send(),
            )
            .await?;
        for g in own.security_groups() {
            let Some(id) = g.group_id() else { continue };
            if !groups.is_empty() && !groups.iter().any(|x| x == id) {
                continue;
            }
            if !sg::cluster_tagged(g, self.cluster_id(cluster)) {
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
                    // The ELB's network interfaces take a while to go away.
                    return Err(CloudError::retry_after(
                        std::time::Duration::from_secs(10),
                        format!("security group {id} of ELB {name} is still in use; retrying"),
                    ));
                }
                Err(e) if error::code(&e) == Some("InvalidGroup.NotFound") => {}
                Err(e) => return Err(error::map("DeleteSecurityGroup", e)),
            }
        }
        Ok(())
    }
}
