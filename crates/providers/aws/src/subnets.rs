//! Which subnets a load balancer goes into, chosen as upstream's `findELBSubnets`: subnets of
//! the VPC not tagged for another cluster (role tags alone suffice, as on EKS since 1.19), only
//! those with an internet-gateway route for an internet-facing LB, one per zone preferring the
//! role tag, then the cluster tag, then the lowest subnet id; local, wavelength and outpost
//! zones skipped (they take no CLB or NLB).

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_ec2::types::{Filter, RouteTable, Subnet};
use ccm_cloud::{CloudError, CloudResult};

use crate::annotations::{self, LbSpec};
use crate::cloud::AwsCloud;
use crate::routes::CLUSTER_TAG_PREFIX;

/// Role tag of subnets for internet-facing load balancers.
pub const ROLE_ELB: &str = "kubernetes.io/role/elb";
/// Role tag of subnets for internal load balancers.
pub const ROLE_INTERNAL_ELB: &str = "kubernetes.io/role/internal-elb";

fn has_tag(s: &Subnet, key: &str) -> bool {
    s.tags().iter().any(|t| t.key() == Some(key))
}

/// Whether the subnet's route table (its own, else the VPC's main one) routes to an internet
/// gateway, as upstream's `isSubnetPublic`.
pub(crate) fn is_public(tables: &[RouteTable], subnet: &str) -> bool {
    let own = tables.iter().find(|t| {
        t.associations()
            .iter()
            .any(|a| a.subnet_id() == Some(subnet))
    });
    let table = own.or_else(|| {
        tables
            .iter()
            .find(|t| t.associations().iter().any(|a| a.main() == Some(true)))
    });
    table.is_some_and(|t| {
        t.routes()
            .iter()
            .any(|r| r.gateway_id().is_some_and(|g| g.starts_with("igw")))
    })
}

/// Upstream's choice among the VPC's subnets. `zone_types`: zone name → type
/// (`availability-zone`, `local-zone`, `wavelength-zone`, ...); a zone it does not list counts
/// as a regular one.
pub(crate) fn choose(
    subnets: &[Subnet],
    tables: &[RouteTable],
    internal: bool,
    cluster_id: &str,
    zone_types: &BTreeMap<String, String>,
) -> Vec<String> {
    let ours = format!("{CLUSTER_TAG_PREFIX}{cluster_id}");
    let role = if internal {
        ROLE_INTERNAL_ELB
    } else {
        ROLE_ELB
    };
    let mut by_zone: BTreeMap<&str, (bool, bool, std::cmp::Reverse<&str>)> = BTreeMap::new();
    for s in subnets {
        let (Some(zone), Some(id)) = (s.availability_zone(), s.subnet_id()) else {
            continue;
        };
        let cluster_tag = has_tag(s, &ours);
        let other_cluster = s.tags().iter().any(|t| {
            t.key()
                .is_some_and(|k| k.starts_with(CLUSTER_TAG_PREFIX) && k != ours)
        });
        if other_cluster && !cluster_tag {
            continue;
        }
        if zone_types
            .get(zone)
            .is_some_and(|t| t != "availability-zone")
        {
            continue;
        }
        if !internal && !is_public(tables, id) {
            continue;
        }
        let key = (has_tag(s, role), cluster_tag, std::cmp::Reverse(id));
        if by_zone.get(zone).is_none_or(|had| key > *had) {
            by_zone.insert(zone, key);
        }
    }
    by_zone
        .into_values()
        .map(|(_, _, id)| id.0.to_string())
        .collect()
}

impl AwsCloud {
    /// Subnets for the LB: the annotation's (ids or Name tags), else [`choose`]'s.
    pub(crate) async fn lb_subnets(
        &self,
        cluster: &str,
        vpc: &str,
        spec: &LbSpec,
    ) -> CloudResult<Vec<String>> {
        let ec2 = self.clients().await?.ec2.clone();
        let in_vpc = || Filter::builder().name("vpc-id").values(vpc).build();
        let out = self
            .call(
                "DescribeSubnets",
                ec2.describe_subnets().filters(in_vpc()).send(),
            )
            .await?;
        if !spec.subnets.is_empty() {
            return named(out.subnets(), &spec.subnets, vpc);
        }
        let tables = if spec.internal {
            Vec::new()
        } else {
            self.call(
                "DescribeRouteTables",
                ec2.describe_route_tables().filters(in_vpc()).send(),
            )
            .await?
            .route_tables()
            .to_vec()
        };
        let zones: BTreeSet<String> = out
            .subnets()
            .iter()
            .filter_map(|s| s.availability_zone().map(String::from))
            .collect();
        let zone_types = self.zone_types(zones).await?;
        let chosen = choose(
            out.subnets(),
            &tables,
            spec.internal,
            self.cluster_id(cluster),
            &zone_types,
        );
        if chosen.is_empty() {
            return Err(CloudError::Permanent(format!(
                "could not find any suitable subnets for creating the ELB in {vpc}: tag {} subnets {} (internet-facing ones need an internet-gateway route) or set the {} annotation",
                if spec.internal { "private" } else { "public" },
                if spec.internal {
                    ROLE_INTERNAL_ELB
                } else {
                    ROLE_ELB
                },
                annotations::SUBNETS
            )));
        }
        Ok(chosen)
    }

    /// The types of `zones`, from what the provider learnt of the account's zones; one
    /// `DescribeAvailabilityZones` when one of them is new to it.
    async fn zone_types(&self, zones: BTreeSet<String>) -> CloudResult<BTreeMap<String, String>> {
        let missing = || {
            let mem = self.inner.memory.lock();
            zones.iter().any(|z| !mem.zone_types.contains_key(z))
        };
        if missing() {
            let _one = self.inner.zone_flight.lock().await;
            if missing() {
                self.learn_zones().await?;
            }
        }
        let mem = self.inner.memory.lock();
        Ok(zones
            .into_iter()
            .filter_map(|z| mem.zone_types.get(&z).map(|t| (z, t.clone())))
            .collect())
    }
}

/// The annotation's subnets, each by id or Name tag; one that is not there is an error.
fn named(subnets: &[Subnet], wanted: &[String], vpc: &str) -> CloudResult<Vec<String>> {
    let mut chosen = Vec::new();
    for want in wanted {
        let hit = subnets.iter().find(|s| {
            s.subnet_id() == Some(want.as_str())
                || s.tags()
                    .iter()
                    .any(|t| t.key() == Some("Name") && t.value() == Some(want.as_str()))
        });
        match hit.and_then(|s| s.subnet_id()) {
            Some(id) => chosen.push(id.to_string()),
            None => {
                return Err(CloudError::Permanent(format!(
                    "annotation {}: no subnet {want:?} (by id or Name tag) in {vpc}",
                    annotations::SUBNETS
                )));
            }
        }
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_ec2::types::{Route, RouteTableAssociation, Tag};

    fn subnet(id: &str, zone: &str, tags: &[&str]) -> Subnet {
        Subnet::builder()
            .subnet_id(id)
            .availability_zone(zone)
            .set_tags(Some(
                tags.iter()
                    .map(|k| Tag::builder().key(*k).value("1").build())
                    .collect(),
            ))
            .build()
    }

    /// The main table routes to an internet gateway; `private` subnets have one without.
    fn tables(private: &[&str]) -> Vec<RouteTable> {
        let main = RouteTable::builder()
            .associations(RouteTableAssociation::builder().main(true).build())
            .routes(Route::builder().gateway_id("igw-1").build())
            .build();
        let mut nat = RouteTable::builder().routes(Route::builder().gateway_id("local").build());
        for p in private {
            nat = nat.associations(RouteTableAssociation::builder().subnet_id(*p).build());
        }
        vec![main, nat.build()]
    }

    const OURS: &str = "kubernetes.io/cluster/prod";

    #[test]
    fn role_tags_alone_suffice_other_clusters_subnets_do_not() {
        let s = [
            subnet("subnet-a", "z1", &[ROLE_ELB]),
            subnet("subnet-b", "z2", &["kubernetes.io/cluster/other", ROLE_ELB]),
        ];
        let got = choose(&s, &tables(&[]), false, "prod", &BTreeMap::new());
        assert_eq!(got, vec!["subnet-a"]);
    }

    #[test]
    fn internet_facing_only_in_public_subnets_internal_anywhere() {
        let s = [
            subnet("subnet-a", "z1", &[OURS, ROLE_ELB]),
            subnet("subnet-b", "z1", &[OURS]),
        ];
        // subnet-a has the role tag but no internet route: the public one wins.
        let got = choose(&s, &tables(&["subnet-a"]), false, "prod", &BTreeMap::new());
        assert_eq!(got, vec!["subnet-b"]);
        let got = choose(
            &s,
            &tables(&["subnet-a", "subnet-b"]),
            false,
            "prod",
            &BTreeMap::new(),
        );
        assert!(got.is_empty());
        let got = choose(&s, &[], true, "prod", &BTreeMap::new());
        assert_eq!(
            got,
            vec!["subnet-a"],
            "internal: both qualify, the lowest id wins"
        );
    }

    #[test]
    fn ties_go_to_role_tag_then_cluster_tag_then_lowest_id() {
        let t = tables(&[]);
        let none = BTreeMap::new();
        let pick = |s: &[Subnet]| choose(s, &t, false, "prod", &none);
        assert_eq!(
            pick(&[
                subnet("subnet-1", "z", &[OURS]),
                subnet("subnet-2", "z", &[ROLE_ELB])
            ]),
            vec!["subnet-2"]
        );
        assert_eq!(
            pick(&[
                subnet("subnet-1", "z", &[]),
                subnet("subnet-2", "z", &[OURS])
            ]),
            vec!["subnet-2"]
        );
        assert_eq!(
            pick(&[
                subnet("subnet-2", "z", &[OURS]),
                subnet("subnet-1", "z", &[OURS])
            ]),
            vec!["subnet-1"]
        );
    }

    #[test]
    fn local_and_wavelength_zones_are_skipped() {
        let s = [
            subnet("subnet-a", "us-west-2a", &[ROLE_ELB]),
            subnet("subnet-l", "us-west-2-lax-1a", &[ROLE_ELB]),
            subnet("subnet-w", "us-west-2-wl1-las-wlz-1", &[ROLE_ELB]),
        ];
        let types: BTreeMap<String, String> = [
            ("us-west-2a", "availability-zone"),
            ("us-west-2-lax-1a", "local-zone"),
            ("us-west-2-wl1-las-wlz-1", "wavelength-zone"),
        ]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        assert_eq!(
            choose(&s, &tables(&[]), false, "prod", &types),
            vec!["subnet-a"]
        );
    }
}
