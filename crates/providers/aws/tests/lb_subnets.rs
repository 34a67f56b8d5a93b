//! Subnets chosen as upstream's `findELBSubnets` on moto: role-tag-only subnets qualify, an
//! internet-facing LB goes only into subnets routed to an internet gateway, the role tag wins a
//! zone, and a changed subnets annotation is applied to an existing Classic ELB. (Local and
//! wavelength zones and the lowest-id tie are unit tests: moto has no such zones.)

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
use common::{AwsWorld, CLUSTER, Cluster, Moto, pod_cidr, wait_for};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

async fn subnet(world: &AwsWorld, cidr: &str, zone: &str, tags: &[&str]) -> anyhow::Result<String> {
    let spec = TagSpecification::builder()
        .resource_type(ResourceType::Subnet)
        .set_tags(Some(
            tags.iter()
                .map(|k| Tag::builder().key(*k).value("1").build())
                .collect(),
        ))
        .build();
    Ok(world
        .ec2
        .create_subnet()
        .vpc_id(&world.vpc)
        .cidr_block(cidr)
        .availability_zone(format!("{}{zone}", world.region))
        .tag_specifications(spec)
        .send()
        .await?
        .subnet
        .and_then(|s| s.subnet_id)
        .unwrap_or_default())
}

async fn clb_subnets(
    world: &AwsWorld,
    cluster: &Cluster,
    name: &str,
) -> anyhow::Result<BTreeSet<String>> {
    let Some(svc) = cluster.service(name).await? else {
        return Ok(BTreeSet::new());
    };
    let lb = ccm_cloud::default_load_balancer_name(&svc);
    let d = world
        .elb
        .describe_load_balancers()
        .load_balancer_names(&lb)
        .send()
        .await;
    Ok(d.ok()
        .and_then(|d| d.load_balancer_descriptions().first().cloned())
        .map(|l| l.subnets().iter().cloned().collect())
        .unwrap_or_default())
}

async fn subnets_become(
    world: &AwsWorld,
    cluster: &Cluster,
    name: &str,
    want: BTreeSet<String>,
) -> anyhow::Result<()> {
    wait_for(
        &format!("{name} in {want:?}"),
        Duration::from_secs(60),
        || async {
            let have = clb_subnets(world, cluster, name).await?;
            Ok(if have == want {
                Ok(())
            } else {
                Err(format!("{have:?}"))
            })
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subnets_are_chosen_as_upstream_and_the_annotation_is_reapplied() -> anyhow::Result<()> {
    let world = AwsWorld::create(Moto::shared(), "ap-southeast-2").await?;
    world.with_internet_gateway().await?;
    let ours = format!("kubernetes.io/cluster/{CLUSTER}");
    // Zone c: only the role tag (no cluster tag), public through the main table.
    let role_only = subnet(&world, "10.0.64.0/20", "c", &["kubernetes.io/role/elb"]).await?;
    // Zone a: a private subnet with every tag, on a table without an internet route.
    let private = subnet(
        &world,
        "10.0.80.0/20",
        "a",
        &[
            &ours,
            "kubernetes.io/role/elb",
            "kubernetes.io/role/internal-elb",
        ],
    )
    .await?;
    let table = world
        .ec2
        .create_route_table()
        .vpc_id(&world.vpc)
        .send()
        .await?
        .route_table
        .and_then(|t| t.route_table_id)
        .unwrap_or_default();
    world
        .ec2
        .associate_route_table()
        .route_table_id(&table)
        .subnet_id(&private)
        .send()
        .await?;
    // Another cluster's subnet in zone c: never used.
    subnet(
        &world,
        "10.0.96.0/20",
        "c",
        &["kubernetes.io/cluster/other", "kubernetes.io/role/elb"],
    )
    .await?;

    let instances = world.run_instances(1, 0).await?;
    let mut cluster = Cluster::start().await?;
    cluster.start_ccm(world.provider().await, &[]).await?;
    cluster.add_node(&instances[0].1, &pod_cidr(0)).await?;
    cluster.create_service("public", json!({}), &[80]).await?;
    let internal = json!({"service.beta.kubernetes.io/aws-load-balancer-internal": "true"});
    cluster.create_service("private", internal, &[80]).await?;

    let set = |v: &[&String]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    subnets_become(
        &world,
        &cluster,
        "public",
        set(&[&world.subnets[0], &world.subnets[1], &role_only]),
    )
    .await?;
    // Internal: the private subnet has the internal-elb role tag, zone a's public one has not.
    subnets_become(
        &world,
        &cluster,
        "private",
        set(&[&private, &world.subnets[1], &role_only]),
    )
    .await?;

    let api: Api<Service> = Api::namespaced(cluster.client.clone(), "default");
    let only_b = json!({"metadata": {"annotations": {
        "service.beta.kubernetes.io/aws-load-balancer-subnets": world.subnets[1].clone()}}});
    api.patch("public", &PatchParams::default(), &Patch::Merge(only_b))
        .await?;
    subnets_become(&world, &cluster, "public", set(&[&world.subnets[1]])).await?;
    cluster.stop_ccm().await
}
