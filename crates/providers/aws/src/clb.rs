//! Classic ELBs (upstream's default): one listener per Service port to the NodePort, instance
//! registration, a health check, a security group of its own (`k8s-elb-<name>`) open to the
//! Service's source ranges, and an allow-all rule from that group on the nodes' groups.

use std::collections::BTreeSet;

use aws_sdk_ec2::types::{
    Filter, IpPermission, IpRange, ResourceType, TagSpecification, UserIdGroupPair,
};
use aws_sdk_elasticloadbalancing::types::{
    CrossZoneLoadBalancing, HealthCheck, Instance, Listener, LoadBalancerAttributes,
    LoadBalancerDescription, Tag,
};
use ccm_cloud::{CloudError, CloudResult, Node};

use crate::annotations::LbSpec;
use crate::cloud::AwsCloud;
use crate::error;
use crate::lb::resource_tags;

fn built<T, E: std::fmt::Display>(r: Result<T, E>) -> CloudResult<T> {
    r.map_err(|e| CloudError::Permanent(format!("building an AWS request: {e}")))
}

/// The security group name upstream gives a Classic ELB.
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

    /// The ELB's own security group, created (tagged, open on the listener ports) if missing.
    async fn clb_security_group(
        &self,
        cluster: &str,
        name: &str,
        vpc: &str,
        spec: &LbSpec,
    ) -> CloudResult<String> {
        let ec2 = self.clients().await?.ec2.clone();
        let group = sg_name(name);
        let found = self
            .call(
                "DescribeSecurityGroups",
                ec2.describe_security_groups()
                    .filters(Filter::builder().name("group-name").values(&group).build())
                    .filters(Filter::builder().name("vpc-id").values(vpc).build())
                    .send(),
            )
            .await?;
        let (id, perms) = match found.security_groups().first() {
            Some(g) => (
                g.group_id().unwrap_or_default().to_string(),
                g.ip_permissions().to_vec(),
            ),
            None => {
                let tags = resource_tags(self, cluster, spec);
                let out = self
                    .call(
                        "CreateSecurityGroup",
                        ec2.create_security_group()
                            .group_name(&group)
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
                                                aws_sdk_ec2::types::Tag::builder()
                                                    .key(k)
                                                    .value(v)
                                                    .build()
                                            })
                                            .collect(),
                                    ))
                                    .build(),
                            )
                            .send(),
                    )
                    .await?;
                (out.group_id().unwrap_or_default().to_string(), Vec::new())
            }
        };
        let has = |port: i32, cidr: &str| {
            perms.iter().any(|p| {
                p.from_port() == Some(port)
                    && p.to_port() == Some(port)
                    && p.ip_ranges().iter().any(|r| r.cidr_ip() == Some(cidr))
            })
        };
        let missing: Vec<IpPermission> = spec
            .ports
            .iter()
            .flat_map(|p| spec.source_ranges.iter().map(move |c| (p.port, c)))
            .filter(|(port, cidr)| !has(*port, cidr))
            .map(|(port, cidr)| {
                IpPermission::builder()
                    .ip_protocol("tcp")
                    .from_port(port)
                    .to_port(port)
                    .ip_ranges(IpRange::builder().cidr_ip(cidr).build())
                    .build()
            })
            .collect();
        if !missing.is_empty() {
            self.authorize(&id, missing).await?;
        }
        Ok(id)
    }

    pub(crate) async fn authorize(&self, group: &str, perms: Vec<IpPermission>) -> CloudResult<()> {
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
            Ok(_) => Ok(()),
            Err(e) if error::code(&e) == Some("InvalidPermission.Duplicate") => Ok(()),
            Err(e) => Err(error::map("AuthorizeSecurityGroupIngress", e)),
        }
    }

    /// Lets traffic from the ELB's group into every node group (once per pair: remembered).
    async fn allow_from(&self, node_groups: &BTreeSet<String>, source: &str) -> CloudResult<()> {
        for g in node_groups {
            let key = (g.clone(), source.to_string());
            if self.inner.memory.lock().sg_rules.contains(&key) {
                continue;
            }
            let perm = IpPermission::builder()
                .ip_protocol("-1")
                .user_id_group_pairs(UserIdGroupPair::builder().group_id(source).build())
                .build();
            self.authorize(g, vec![perm]).await?;
            self.inner.memory.lock().sg_rules.insert(key);
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
        nodes: &[Node],
    ) -> CloudResult<String> {
        let ids = self.node_instance_ids(nodes).await?;
        let vpc = self.vpc(&ids).await?;
        let sg = self.clb_security_group(cluster, name, &vpc, spec).await?;
        let elb = self.clients().await?.elb.clone();
        let listeners: Vec<Listener> = spec
            .ports
            .iter()
            .map(|p| {
                built(
                    Listener::builder()
                        .protocol("TCP")
                        .load_balancer_port(p.port)
                        .instance_protocol("TCP")
                        .instance_port(p.node_port)
                        .build(),
                )
            })
            .collect::<CloudResult<_>>()?;
        let existing = self.clb_describe(name).await?;
        let desc = match existing {
            Some(d) => {
                self.clb_sync_listeners(name, &d, &listeners).await?;
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
                    .security_groups(&sg)
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
        if let Some(on) = spec.cross_zone {
            self.clb_cross_zone(name, on).await?;
        }
        self.clb_sync_instances(name, &desc, &ids).await?;
        let node_groups = self.node_security_groups(&ids).await?;
        self.allow_from(&node_groups, &sg).await?;
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
        if !stale.is_empty() {
            self.call(
                "DeleteLoadBalancerListeners",
                elb.delete_load_balancer_listeners()
                    .load_balancer_name(name)
                    .set_load_balancer_ports(Some(stale))
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

    async fn clb_cross_zone(&self, name: &str, on: bool) -> CloudResult<()> {
        let elb = self.clients().await?.elb.clone();
        let now = self
            .call(
                "DescribeLoadBalancerAttributes",
                elb.describe_load_balancer_attributes()
                    .load_balancer_name(name)
                    .send(),
            )
            .await?;
        let current = now
            .load_balancer_attributes()
            .and_then(|a| a.cross_zone_load_balancing())
            .map(|c| c.enabled());
        if current == Some(on) {
            return Ok(());
        }
        let attrs = LoadBalancerAttributes::builder()
            .cross_zone_load_balancing(CrossZoneLoadBalancing::builder().enabled(on).build())
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

    pub(crate) async fn clb_update(
        &self,
        _cluster: &str,
        name: &str,
        nodes: &[Node],
    ) -> CloudResult<()> {
        let Some(d) = self.clb_describe(name).await? else {
            return Err(CloudError::Permanent(format!(
                "ELB {name} does not exist; it is created by ensure"
            )));
        };
        let ids = self.node_instance_ids(nodes).await?;
        self.clb_sync_instances(name, &d, &ids).await?;
        if let Some(sg) = d.security_groups().first() {
            let node_groups = self.node_security_groups(&ids).await?;
            self.allow_from(&node_groups, sg).await?;
        }
        Ok(())
    }

    pub(crate) async fn clb_delete(&self, _cluster: &str, name: &str) -> CloudResult<()> {
        let ec2 = self.clients().await?.ec2.clone();
        let elb = self.clients().await?.elb.clone();
        let groups: Vec<String> = match self.clb_describe(name).await? {
            Some(d) => {
                let groups = d.security_groups().to_vec();
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
