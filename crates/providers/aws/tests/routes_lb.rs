//! Routes, Classic ELBs and NLBs against moto through the real controllers on kube-sim.

mod common;

use std::time::Duration;

use aws_sdk_ec2::error::DisplayErrorContext;
use ccm_provider_aws::AwsCloud;
use common::{AwsWorld, Cluster, Moto, pod_cidr, wait_for};
use serde_json::json;

const NODES: usize = 6;

type Instances = Vec<(String, String)>;
type Setup = (AwsWorld, Cluster, Instances, AwsCloud);

/// A cluster of `NODES` initialized nodes in `region` of the shared moto server.
async fn cluster(region: &str) -> anyhow::Result<Setup> {
    cluster_on(Moto::shared(), region, NODES, &[]).await
}

/// `nodes` nodes (half per zone) registered with a CCM started with `flags` on `moto`; the
/// provider shares its metrics (AWS calls by action) with the CCM's.
async fn cluster_on(
    moto: &Moto,
    region: &str,
    nodes: usize,
    flags: &[&str],
) -> anyhow::Result<Setup> {
    let world = AwsWorld::create(moto, region).await?;
    world.with_internet_gateway().await?;
    let mut instances = world.run_instances(nodes as i32 / 2, 0).await?;
    instances.extend(world.run_instances(nodes as i32 / 2, 1).await?);
    let mut cluster = Cluster::start().await?;
    let aws = world.provider().await;
    cluster.start_ccm(aws.clone(), flags).await?;
    for (i, (_, dns)) in instances.iter().enumerate() {
        cluster.add_node(dns, &pod_cidr(i)).await?;
    }
    Ok((world, cluster, instances, aws))
}

/// Targets registered in each of the NLB's target groups.
async fn target_counts(world: &AwsWorld, lb_arn: &str) -> anyhow::Result<Vec<usize>> {
    let tgs = world
        .elbv2
        .describe_target_groups()
        .load_balancer_arn(lb_arn)
        .send()
        .await;
    // moto answers TargetGroupNotFound for an NLB without target groups (yet).
    let tgs = match tgs {
        Err(e)
            if e.as_service_error().and_then(|s| s.meta().code())
                == Some("TargetGroupNotFound") =>
        {
            return Ok(vec![0]);
        }
        r => r.map_err(|e| anyhow::anyhow!("DescribeTargetGroups: {}", DisplayErrorContext(e)))?,
    };
    let mut counts = Vec::new();
    for tg in tgs.target_groups() {
        let h = world
            .elbv2
            .describe_target_health()
            .target_group_arn(tg.target_group_arn().unwrap_or_default())
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("DescribeTargetHealth: {}", DisplayErrorContext(e)))?;
        counts.push(h.target_health_descriptions().len());
    }
    Ok(counts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_go_to_the_tagged_table_and_follow_nodes() -> anyhow::Result<()> {
    let (world, mut cluster, instances, _) = cluster("us-west-2").await?;
    let want: std::collections::BTreeMap<String, String> = instances
        .iter()
        .enumerate()
        .map(|(i, (id, _))| (pod_cidr(i), id.clone()))
        .collect();
    wait_for(
        "a route per node in the tagged table",
        Duration::from_secs(60),
        || async {
            let routes = world.routes().await?;
            Ok(if routes == want {
                Ok(())
            } else {
                Err(format!("{routes:?}"))
            })
        },
    )
    .await?;
    // Route targets have source/dest check off, as upstream sets it.
    let out = world
        .ec2
        .describe_instances()
        .instance_ids(&instances[0].0)
        .send()
        .await?;
    let inst = &out.reservations()[0].instances()[0];
    assert_eq!(inst.source_dest_check(), Some(false));

    // A node whose Node object goes loses its route.
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(cluster.client.clone());
    nodes.delete(&instances[0].1, &Default::default()).await?;
    wait_for(
        "the deleted node's route removed",
        Duration::from_secs(60),
        || async {
            let routes = world.routes().await?;
            Ok(
                if !routes.contains_key(&pod_cidr(0)) && routes.len() == NODES - 1 {
                    Ok(())
                } else {
                    Err(format!("{routes:?}"))
                },
            )
        },
    )
    .await?;
    cluster.stop_ccm().await
}

fn ingress_host(svc: &k8s_openapi::api::core::v1::Service) -> Option<String> {
    svc.status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .first()?
        .hostname
        .clone()
}

async fn wait_ingress(
    cluster: &Cluster,
    name: &str,
) -> anyhow::Result<(k8s_openapi::api::core::v1::Service, String)> {
    wait_for(
        "DNS ingress on the Service",
        Duration::from_secs(60),
        || async {
            let svc = cluster
                .service(name)
                .await?
                .ok_or_else(|| anyhow::anyhow!("service gone"))?;
            Ok(match ingress_host(&svc) {
                Some(h) => Ok((svc, h)),
                None => Err("no ingress yet".to_string()),
            })
        },
    )
    .await
}

async fn wait_service_gone(cluster: &Cluster, name: &str) -> anyhow::Result<()> {
    wait_for(
        "the Service deleted (finalizer released)",
        Duration::from_secs(60),
        || async {
            Ok(match cluster.service(name).await? {
                None => Ok(()),
                Some(_) => Err("still there".into()),
            })
        },
    )
    .await
}

/// Rules on the node group admitting `group` (CLB) or carrying `desc` (NLB).
async fn node_rules(world: &AwsWorld) -> anyhow::Result<Vec<aws_sdk_ec2::types::IpPermission>> {
    let out = world
        .ec2
        .describe_security_groups()
        .group_ids(&world.node_sg)
        .send()
        .await?;
    Ok(out.security_groups()[0].ip_permissions().to_vec())
}

fn lb_name(svc: &k8s_openapi::api::core::v1::Service) -> String {
    ccm_cloud::default_load_balancer_name(svc)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_elb_lifecycle() -> anyhow::Result<()> {
    let (world, mut cluster, _, _) = cluster("eu-west-1").await?;
    cluster.create_service("web", json!({"service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags": "team=shop"}), &[80, 443]).await?;
    let (svc, host) = wait_ingress(&cluster, "web").await?;
    let name = lb_name(&svc);
    let d = world
        .elb
        .describe_load_balancers()
        .load_balancer_names(&name)
        .send()
        .await?;
    assert_eq!(d.load_balancer_descriptions().len(), 1);
    let lb = &d.load_balancer_descriptions()[0];
    assert_eq!(lb.dns_name(), Some(host.as_str()));
    let node_ports: std::collections::BTreeMap<i32, i32> = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .map(|p| (p.port, p.node_port.unwrap_or(0)))
        .collect();
    let mut listeners: Vec<(i32, i32)> = lb
        .listener_descriptions()
        .iter()
        .filter_map(|l| l.listener())
        .map(|l| (l.load_balancer_port(), l.instance_port()))
        .collect();
    listeners.sort();
    assert_eq!(
        listeners,
        node_ports.iter().map(|(a, b)| (*a, *b)).collect::<Vec<_>>()
    );
    assert_eq!(lb.instances().len(), NODES);
    assert_eq!(
        lb.health_check().map(|h| h.target()),
        Some(format!("TCP:{}", node_ports[&80]).as_str())
    );
    let tags = world
        .elb
        .describe_tags()
        .load_balancer_names(&name)
        .send()
        .await?;
    let tags: Vec<(String, String)> = tags.tag_descriptions()[0]
        .tags()
        .iter()
        .map(|t| {
            (
                t.key().to_string(),
                t.value().unwrap_or_default().to_string(),
            )
        })
        .collect();
    for want in [
        ("kubernetes.io/cluster/ccmtest", "owned"),
        ("kubernetes.io/service-name", "default/web"),
        ("team", "shop"),
    ] {
        assert!(
            tags.contains(&(want.0.to_string(), want.1.to_string())),
            "{tags:?}"
        );
    }
    let elb_sg = lb.security_groups()[0].clone();
    assert!(
        node_rules(&world).await?.iter().any(|p| p
            .user_id_group_pairs()
            .iter()
            .any(|u| u.group_id() == Some(elb_sg.as_str()))),
        "node group admits the ELB group"
    );

    // A node joins: it becomes a backend.
    let joined = world.run_instances(1, 0).await?;
    cluster.add_node(&joined[0].1, &pod_cidr(NODES)).await?;
    wait_for(
        "the new node registered with the ELB",
        Duration::from_secs(60),
        || async {
            let d = world
                .elb
                .describe_load_balancers()
                .load_balancer_names(&name)
                .send()
                .await?;
            let n = d.load_balancer_descriptions()[0].instances().len();
            Ok(if n == NODES + 1 {
                Ok(())
            } else {
                Err(format!("{n} instances"))
            })
        },
    )
    .await?;

    // Delete: no ELB, no ELB group, no rule on the node group.
    cluster.delete_service("web").await?;
    wait_service_gone(&cluster, "web").await?;
    let gone = world
        .elb
        .describe_load_balancers()
        .load_balancer_names(&name)
        .send()
        .await;
    assert!(
        gone.is_err()
            || gone
                .as_ref()
                .map(|d| d.load_balancer_descriptions().is_empty())
                .unwrap_or(false)
    );
    let groups = world.ec2.describe_security_groups().send().await?;
    assert!(
        !groups
            .security_groups()
            .iter()
            .any(|g| g.group_id() == Some(elb_sg.as_str())),
        "ELB group deleted"
    );
    assert!(
        !node_rules(&world).await?.iter().any(|p| p
            .user_id_group_pairs()
            .iter()
            .any(|u| u.group_id() == Some(elb_sg.as_str()))),
        "node group rule removed"
    );
    assert!(
        node_rules(&world).await?.is_empty(),
        "nothing else was on the node group"
    );
    cluster.stop_ccm().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_load_balancer_lifecycle() -> anyhow::Result<()> {
    let (world, mut cluster, _, _) = cluster("eu-central-1").await?;
    cluster
        .create_service(
            "api",
            json!({
                "service.beta.kubernetes.io/aws-load-balancer-type": "nlb",
                "service.beta.kubernetes.io/aws-load-balancer-cross-zone-load-balancing-enabled": "true",
            }),
            &[80, 443],
        )
        .await?;
    let (svc, host) = wait_ingress(&cluster, "api").await?;
    let name = lb_name(&svc);
    let lbs = world
        .elbv2
        .describe_load_balancers()
        .names(&name)
        .send()
        .await?;
    assert_eq!(lbs.load_balancers().len(), 1, "exactly one NLB");
    let lb = &lbs.load_balancers()[0];
    assert_eq!(lb.dns_name(), Some(host.as_str()));
    let arn = lb.load_balancer_arn().unwrap_or_default().to_string();
    let listeners = world
        .elbv2
        .describe_listeners()
        .load_balancer_arn(&arn)
        .send()
        .await?;
    let mut ports: Vec<i32> = listeners
        .listeners()
        .iter()
        .filter_map(|l| l.port())
        .collect();
    ports.sort();
    assert_eq!(ports, vec![80, 443]);
    assert_eq!(target_counts(&world, &arn).await?, vec![NODES; 2]);
    let attrs = world
        .elbv2
        .describe_load_balancer_attributes()
        .load_balancer_arn(&arn)
        .send()
        .await?;
    assert!(
        attrs
            .attributes()
            .iter()
            .any(|a| a.key() == Some("load_balancing.cross_zone.enabled")
                && a.value() == Some("true"))
    );
    let rules = node_rules(&world).await?;
    let described = |d: &str| {
        rules
            .iter()
            .filter(|p| p.ip_ranges().iter().any(|r| r.description() == Some(d)))
            .count()
    };
    assert_eq!(
        described(&format!("kubernetes.io/rule/nlb/client={name}")),
        2,
        "{rules:?}"
    );
    // Health checks go to the traffic ports, which the client rules (0.0.0.0/0) open to the
    // VPC already: no health rules (upstream would add two more).
    assert_eq!(
        described(&format!("kubernetes.io/rule/nlb/health={name}")),
        0,
        "{rules:?}"
    );

    // Ensure again (a Service update): still one LB, two listeners, two groups.
    let api: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(cluster.client.clone(), "default");
    api.patch("api", &Default::default(), &kube::api::Patch::Merge(json!({"metadata": {"annotations": {"service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags": "x=y"}}}))).await?;
    let joined = world.run_instances(1, 1).await?;
    cluster.add_node(&joined[0].1, &pod_cidr(NODES)).await?;
    wait_for(
        "the new node in both target groups",
        Duration::from_secs(60),
        || async {
            let counts = target_counts(&world, &arn).await?;
            Ok(if counts == vec![NODES + 1; 2] {
                Ok(())
            } else {
                Err(format!("{counts:?}"))
            })
        },
    )
    .await?;
    assert_eq!(
        world
            .elbv2
            .describe_load_balancers()
            .names(&name)
            .send()
            .await?
            .load_balancers()
            .len(),
        1
    );
    assert_eq!(
        world
            .elbv2
            .describe_listeners()
            .load_balancer_arn(&arn)
            .send()
            .await?
            .listeners()
            .len(),
        2
    );

    cluster.delete_service("api").await?;
    wait_service_gone(&cluster, "api").await?;
    let after = world.elbv2.describe_load_balancers().send().await?;
    assert!(after.load_balancers().is_empty(), "NLB deleted");
    let tgs = world.elbv2.describe_target_groups().send().await?;
    assert!(
        tgs.target_groups().is_empty(),
        "target groups deleted: {:?}",
        tgs.target_groups()
    );
    assert!(
        node_rules(&world).await?.is_empty(),
        "NLB rules removed from the node group"
    );
    cluster.stop_ccm().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_cluster_costs_only_the_batched_address_refresh() -> anyhow::Result<()> {
    // A moto of its own: its call recorder must see this cluster's calls only. A short
    // refresh period stands in for upstream's 5 minutes.
    let moto = Moto::start();
    let flags = ["--node-status-update-frequency=2s"];
    let (world, mut cluster, instances, _) = cluster_on(&moto, "us-east-1", 4, &flags).await?;
    cluster.create_service("web", json!({}), &[80]).await?;
    let nlb = json!({"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"});
    cluster.create_service("api", nlb, &[80]).await?;
    wait_ingress(&cluster, "web").await?;
    wait_ingress(&cluster, "api").await?;
    wait_for("a route per node", Duration::from_secs(60), || async {
        let n = world.routes().await?.len();
        Ok(if n == instances.len() {
            Ok(())
        } else {
            Err(format!("{n} routes"))
        })
    })
    .await?;
    // Let the last writes (ingress status, route sync) settle, then watch 8 s of quiet.
    tokio::time::sleep(Duration::from_secs(2)).await;
    moto.start_recording().await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let calls = moto.recorded().await;
    let describes = calls.get("DescribeInstances").copied().unwrap_or(0);
    assert!(
        calls.keys().all(|a| a == "DescribeInstances"),
        "an idle cluster made other calls: {calls:?}"
    );
    // One call per refresh for all 4 nodes (8 s / 2 s, plus one in flight at either edge).
    assert!((1..=5).contains(&describes), "{calls:?}");
    cluster.stop_ccm().await
}

/// Load balancers in the fifty-LB test, every second one an NLB.
const MANY_LBS: usize = 50;

/// Waits until each of the `MANY_LBS` load balancers has exactly `nodes` backends.
async fn every_lb_has(world: &AwsWorld, nodes: usize, timeout: Duration) -> anyhow::Result<()> {
    let what = format!("every LB with {nodes} nodes");
    wait_for(&what, timeout, || async {
        let b = backends(world).await?;
        let full = b.iter().filter(|n| **n == nodes).count();
        Ok(if full == MANY_LBS {
            Ok(())
        } else {
            Err(format!("{full}/{MANY_LBS}: {b:?}"))
        })
    })
    .await
}

/// Each LB's backends: instances of a Classic ELB, or targets of each NLB target group.
async fn backends(world: &AwsWorld) -> anyhow::Result<Vec<usize>> {
    let mut out: Vec<usize> = world
        .elb
        .describe_load_balancers()
        .send()
        .await?
        .load_balancer_descriptions()
        .iter()
        .map(|l| l.instances().len())
        .collect();
    for lb in world
        .elbv2
        .describe_load_balancers()
        .send()
        .await?
        .load_balancers()
    {
        out.extend(target_counts(world, lb.load_balancer_arn().unwrap_or_default()).await?);
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_load_balancers_half_nlb_fit_one_node_group_and_take_a_joining_node()
-> anyhow::Result<()> {
    // AWS (and moto) allow 60 inbound rules per security group; every LB here needs the same
    // node group: 25 CLB group rules + 25 NLB client rules + the one ICMP path-MTU rule the
    // NLBs share (as upstream, which also skips health rules when clients come from anywhere).
    let (world, mut cluster, _, aws) = cluster_on(Moto::shared(), "ap-south-1", 2, &[]).await?;
    for i in 0..MANY_LBS {
        let ann = if i % 2 == 1 {
            json!({"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"})
        } else {
            json!({})
        };
        cluster
            .create_service(&format!("svc-{i}"), ann, &[80])
            .await?;
    }
    every_lb_has(&world, 2, Duration::from_secs(240)).await?;
    for i in 0..MANY_LBS {
        let name = format!("svc-{i}");
        let svc = cluster
            .service(&name)
            .await?
            .ok_or_else(|| anyhow::anyhow!("{name} gone"))?;
        assert!(ingress_host(&svc).is_some(), "{name} has no ingress");
    }
    // As AWS counts them: each source (CIDR or group) of each permission is a rule.
    let rules: usize = node_rules(&world)
        .await?
        .iter()
        .map(|p| p.ip_ranges().len() + p.ipv6_ranges().len() + p.user_id_group_pairs().len())
        .sum();
    assert_eq!(rules, MANY_LBS + 1);

    // A node joins a quiet cluster: it becomes a backend of all 50, found by one lookup and
    // reaching every LB with its describe and register calls, no security-group writes.
    let before = aws.metrics().snapshot();
    let joined = world.run_instances(1, 0).await?;
    cluster.add_node(&joined[0].1, &pod_cidr(2)).await?;
    every_lb_has(&world, 3, Duration::from_secs(120)).await?;
    // The route and any lagging update settle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = aws.metrics().snapshot();
    let join: std::collections::BTreeMap<&str, u64> = after
        .iter()
        .map(|(k, v)| (k.as_str(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect();
    let total: u64 = join.values().sum();
    eprintln!("node join with {MANY_LBS} LBs (half NLB): {total} AWS calls {join:?}");
    let n = |a: &str| join.get(a).copied().unwrap_or(0);
    assert!(n("DescribeInstances") <= 1, "{join:?}");
    // Each LB is written once, though the controller may update each twice (the Node's
    // arrival, then its providerID: the same instance). A Classic ELB is read once for its
    // instances; an NLB's target groups are known from its ensure, only their targets are read.
    assert!(
        n("DescribeLoadBalancers") <= MANY_LBS as u64 / 2,
        "{join:?}"
    );
    assert_eq!(n("DescribeTargetGroups"), 0, "{join:?}");
    assert!(n("DescribeTargetHealth") <= MANY_LBS as u64 / 2, "{join:?}");
    assert_eq!(n("RegisterInstancesWithLoadBalancer"), MANY_LBS as u64 / 2);
    assert_eq!(n("RegisterTargets"), MANY_LBS as u64 / 2);
    assert!(
        !join.keys().any(|k| k.contains("SecurityGroup")),
        "a join changes no security group: {join:?}"
    );
    cluster.stop_ccm().await
}
