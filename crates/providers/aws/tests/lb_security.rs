//! Load-balancer security groups never fail open, and a refused annotation never stops an
//! existing load balancer's backends following the nodes — on moto, through the real
//! controllers on kube-sim.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use aws_sdk_ec2::types::{IpPermission, ResourceType, Tag, TagSpecification};
use ccm_provider_aws::{AwsCloud, AwsConfig};
use common::{AwsWorld, Cluster, Moto, cloud_config, pod_cidr, sdk_config, wait_for};
use k8s_openapi::api::core::v1::{Event, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const NLB: &str = "service.beta.kubernetes.io/aws-load-balancer-type";
const RANGES: &str = "service.beta.kubernetes.io/load-balancer-source-ranges";

/// A world whose instances are in the cluster's node group and in a "corp" group the cluster
/// does not own (it carries an SSH rule of the operator's).
struct Setup {
    world: AwsWorld,
    cluster: Cluster,
    corp: String,
    corp_before: BTreeSet<String>,
}

/// Flat rules of a group, as text: `proto from-to source [desc]`.
async fn rules(world: &AwsWorld, group: &str) -> anyhow::Result<BTreeSet<String>> {
    let out = world
        .ec2
        .describe_security_groups()
        .group_ids(group)
        .send()
        .await?;
    Ok(out.security_groups()[0]
        .ip_permissions()
        .iter()
        .flat_map(flat)
        .collect())
}

fn flat(p: &IpPermission) -> Vec<String> {
    let head = format!(
        "{} {}-{}",
        p.ip_protocol().unwrap_or_default(),
        p.from_port().unwrap_or(-1),
        p.to_port().unwrap_or(-1)
    );
    let mut out = Vec::new();
    for r in p.ip_ranges() {
        let d = r.description().map(|d| format!(" {d}")).unwrap_or_default();
        out.push(format!("{head} {}{d}", r.cidr_ip().unwrap_or_default()));
    }
    for r in p.ipv6_ranges() {
        let d = r.description().map(|d| format!(" {d}")).unwrap_or_default();
        out.push(format!("{head} {}{d}", r.cidr_ipv6().unwrap_or_default()));
    }
    for u in p.user_id_group_pairs() {
        out.push(format!("{head} {}", u.group_id().unwrap_or_default()));
    }
    out
}

fn set(v: &[String]) -> BTreeSet<String> {
    v.iter().cloned().collect()
}

async fn launch(world: &AwsWorld, corp: &str, subnet: usize) -> anyhow::Result<(String, String)> {
    let out = world
        .ec2
        .run_instances()
        .image_id("ami-12c6146b")
        .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
        .min_count(1)
        .max_count(1)
        .subnet_id(&world.subnets[subnet])
        .security_group_ids(&world.node_sg)
        .security_group_ids(corp)
        // The cluster's instances carry its tag, as kOps and EKS node groups tag theirs: Nodes
        // are looked up by private DNS name inside the cluster only.
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::Instance)
                .tags(
                    Tag::builder()
                        .key(format!("kubernetes.io/cluster/{}", common::CLUSTER))
                        .value("owned")
                        .build(),
                )
                .build(),
        )
        .send()
        .await?;
    let i = &out.instances()[0];
    Ok((
        i.instance_id().unwrap_or_default().to_string(),
        i.private_dns_name().unwrap_or_default().to_string(),
    ))
}

async fn setup(region: &str, tweak: impl FnOnce(&mut AwsConfig)) -> anyhow::Result<Setup> {
    let world = AwsWorld::create(Moto::shared(), region).await?;
    world.with_internet_gateway().await?;
    let corp = world
        .ec2
        .create_security_group()
        .vpc_id(&world.vpc)
        .group_name("corp")
        .description("the company's, not the cluster's")
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::SecurityGroup)
                .tags(Tag::builder().key("team").value("it").build())
                .build(),
        )
        .send()
        .await?
        .group_id
        .unwrap_or_default();
    world
        .ec2
        .authorize_security_group_ingress()
        .group_id(&corp)
        .ip_protocol("tcp")
        .from_port(22)
        .to_port(22)
        .cidr_ip("10.0.0.0/8")
        .send()
        .await?;
    let corp_before = rules(&world, &corp).await?;
    let mut cfg = cloud_config(&world.url);
    tweak(&mut cfg);
    let aws = AwsCloud::with_sdk_config(cfg, sdk_config(region).await);
    let mut cluster = Cluster::start_dual_stack().await?;
    cluster.start_ccm(aws, &[]).await?;
    for i in 0..2 {
        let (_, dns) = launch(&world, &corp, i).await?;
        cluster.add_node(&dns, &pod_cidr(i)).await?;
    }
    Ok(Setup {
        world,
        cluster,
        corp,
        corp_before,
    })
}

async fn create(
    cluster: &Cluster,
    name: &str,
    annotations: serde_json::Value,
    ports: &[i32],
    ranges: &[&str],
) -> anyhow::Result<()> {
    let api: Api<Service> = Api::namespaced(cluster.client.clone(), "default");
    let ports: Vec<_> = ports
        .iter()
        .map(|p| json!({"name": format!("p{p}"), "port": p, "targetPort": 8080, "protocol": "TCP"}))
        .collect();
    let svc: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {"type": "LoadBalancer", "selector": {"app": name}, "ports": ports,
            "loadBalancerSourceRanges": ranges},
    }))?;
    api.create(&PostParams::default(), &svc).await?;
    Ok(())
}

async fn patch(cluster: &Cluster, name: &str, body: serde_json::Value) -> anyhow::Result<Service> {
    let api: Api<Service> = Api::namespaced(cluster.client.clone(), "default");
    Ok(api
        .patch(name, &PatchParams::default(), &Patch::Merge(body))
        .await?)
}

/// The Service once it has an ingress hostname.
async fn ready(cluster: &Cluster, name: &str) -> anyhow::Result<Service> {
    wait_for("an ingress hostname", Duration::from_secs(60), || async {
        let svc = cluster
            .service(name)
            .await?
            .ok_or_else(|| anyhow::anyhow!("{name} gone"))?;
        let host = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref())
            .and_then(|i| i.first())
            .and_then(|i| i.hostname.clone());
        Ok(match host {
            Some(_) => Ok(svc),
            None => Err("no ingress yet".to_string()),
        })
    })
    .await
}

async fn gone(cluster: &Cluster, name: &str) -> anyhow::Result<()> {
    cluster.delete_service(name).await?;
    wait_for("the Service deleted", Duration::from_secs(60), || async {
        Ok(match cluster.service(name).await? {
            None => Ok(()),
            Some(_) => Err("still there".to_string()),
        })
    })
    .await
}

/// Waits until `group` has exactly `want`.
async fn rules_become(world: &AwsWorld, group: &str, want: BTreeSet<String>) -> anyhow::Result<()> {
    wait_for(
        &format!("rules of {group}: {want:?}"),
        Duration::from_secs(60),
        || async {
            let have = rules(world, group).await?;
            Ok(if have == want {
                Ok(())
            } else {
                Err(format!("{have:?}"))
            })
        },
    )
    .await
}

async fn elb_group(world: &AwsWorld, svc: &Service) -> anyhow::Result<String> {
    let d = world
        .elb
        .describe_load_balancers()
        .load_balancer_names(ccm_cloud::default_load_balancer_name(svc))
        .send()
        .await?;
    Ok(d.load_balancer_descriptions()[0].security_groups()[0].clone())
}

fn node_port(svc: &Service, port: i32) -> i32 {
    svc.spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .find(|p| p.port == port)
        .and_then(|p| p.node_port)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_elb_rules_admit_exactly_the_source_ranges() -> anyhow::Result<()> {
    let Setup {
        world,
        mut cluster,
        corp,
        corp_before,
    } = setup("sa-east-1", |_| {}).await?;
    create(&cluster, "web", json!({}), &[80, 443], &["203.0.113.0/24"]).await?;
    let svc = ready(&cluster, "web").await?;
    let sg = elb_group(&world, &svc).await?;
    let office = "203.0.113.0/24";
    rules_become(
        &world,
        &sg,
        set(&[
            format!("tcp 80-80 {office}"),
            format!("tcp 443-443 {office}"),
            format!("icmp 3-4 {office}"),
        ]),
    )
    .await?;
    rules_become(&world, &world.node_sg, set(&[format!("-1 -1--1 {sg}")])).await?;

    // Narrower ranges and one port fewer: the old rules go.
    patch(
        &cluster,
        "web",
        json!({"spec": {"loadBalancerSourceRanges": ["203.0.113.128/25"],
            "ports": [{"name": "p80", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}}),
    )
    .await?;
    let narrow = "203.0.113.128/25";
    rules_become(
        &world,
        &sg,
        set(&[format!("tcp 80-80 {narrow}"), format!("icmp 3-4 {narrow}")]),
    )
    .await?;

    // The annotation, when the spec has no ranges: not 0.0.0.0/0.
    create(
        &cluster,
        "legacy",
        json!({RANGES: "192.0.2.0/24"}),
        &[80],
        &[],
    )
    .await?;
    let legacy = ready(&cluster, "legacy").await?;
    let legacy_sg = elb_group(&world, &legacy).await?;
    rules_become(
        &world,
        &legacy_sg,
        set(&[
            "tcp 80-80 192.0.2.0/24".into(),
            "icmp 3-4 192.0.2.0/24".into(),
        ]),
    )
    .await?;

    gone(&cluster, "web").await?;
    gone(&cluster, "legacy").await?;
    rules_become(&world, &world.node_sg, BTreeSet::new()).await?;
    assert_eq!(
        rules(&world, &corp).await?,
        corp_before,
        "corp group edited"
    );
    cluster.stop_ccm().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nlb_node_rules_follow_the_source_ranges_and_go_with_the_service() -> anyhow::Result<()> {
    let Setup {
        world,
        mut cluster,
        corp,
        corp_before,
    } = setup("ca-central-1", |_| {}).await?;
    create(
        &cluster,
        "api",
        json!({NLB: "nlb", RANGES: "203.0.113.0/24"}),
        &[80],
        &[],
    )
    .await?;
    let svc = ready(&cluster, "api").await?;
    let lb = ccm_cloud::default_load_balancer_name(&svc);
    let np = node_port(&svc, 80);
    let client = format!("kubernetes.io/rule/nlb/client={lb}");
    let health = format!("kubernetes.io/rule/nlb/health={lb}");
    let mtu = "kubernetes.io/rule/nlb/mtu";
    rules_become(
        &world,
        &world.node_sg,
        set(&[
            format!("tcp {np}-{np} 203.0.113.0/24 {client}"),
            format!("tcp {np}-{np} 10.0.0.0/16 {health}"),
            format!("icmp 3-4 203.0.113.0/24 {mtu}"),
        ]),
    )
    .await?;

    // The spec's ranges win over the annotation's; the old client and MTU rules go.
    patch(
        &cluster,
        "api",
        json!({"spec": {"loadBalancerSourceRanges": ["198.51.100.0/24"]}}),
    )
    .await?;
    rules_become(
        &world,
        &world.node_sg,
        set(&[
            format!("tcp {np}-{np} 198.51.100.0/24 {client}"),
            format!("tcp {np}-{np} 10.0.0.0/16 {health}"),
            format!("icmp 3-4 198.51.100.0/24 {mtu}"),
        ]),
    )
    .await?;

    gone(&cluster, "api").await?;
    rules_become(&world, &world.node_sg, BTreeSet::new()).await?;
    assert_eq!(
        rules(&world, &corp).await?,
        corp_before,
        "corp group edited"
    );
    cluster.stop_ccm().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_group_ingress_can_be_left_to_the_operator() -> anyhow::Result<()> {
    let Setup {
        world, mut cluster, ..
    } = setup("ap-northeast-2", |c| {
        c.disable_security_group_ingress = true
    })
    .await?;
    create(&cluster, "web", json!({}), &[80], &[]).await?;
    create(&cluster, "api", json!({NLB: "nlb"}), &[80], &[]).await?;
    ready(&cluster, "web").await?;
    ready(&cluster, "api").await?;
    assert!(rules(&world, &world.node_sg).await?.is_empty());
    cluster.stop_ccm().await
}

/// Warning Events of the Service whose message names `what`.
async fn warnings(cluster: &Cluster, what: &str) -> anyhow::Result<usize> {
    let events: Api<Event> = Api::namespaced(cluster.client.clone(), "default");
    Ok(events
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .filter(|e| e.message.as_deref().is_some_and(|m| m.contains(what)))
        .count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_annotation_never_stops_the_backends_following_the_nodes() -> anyhow::Result<()>
{
    let Setup {
        world,
        mut cluster,
        corp,
        ..
    } = setup("eu-north-1", |_| {}).await?;
    create(&cluster, "web", json!({}), &[80], &[]).await?;
    create(&cluster, "api", json!({NLB: "nlb"}), &[80], &[]).await?;
    let web = ready(&cluster, "web").await?;
    let api = ready(&cluster, "api").await?;
    let interval = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval";
    for name in ["web", "api"] {
        patch(
            &cluster,
            name,
            json!({"metadata": {"annotations": {interval: "soon"}}}),
        )
        .await?;
    }
    wait_for(
        "a Warning naming the annotation",
        Duration::from_secs(60),
        || async {
            let n = warnings(&cluster, interval).await?;
            Ok(if n > 0 {
                Ok(())
            } else {
                Err("none".to_string())
            })
        },
    )
    .await?;
    let (_, dns) = launch(&world, &corp, 0).await?;
    cluster.add_node(&dns, &pod_cidr(2)).await?;
    let clb = ccm_cloud::default_load_balancer_name(&web);
    let nlb = ccm_cloud::default_load_balancer_name(&api);
    wait_for(
        "the new node behind both LBs",
        Duration::from_secs(60),
        || async {
            let d = world
                .elb
                .describe_load_balancers()
                .load_balancer_names(&clb)
                .send()
                .await?;
            let instances = d.load_balancer_descriptions()[0].instances().len();
            let lb = world
                .elbv2
                .describe_load_balancers()
                .names(&nlb)
                .send()
                .await?;
            let arn = lb.load_balancers()[0]
                .load_balancer_arn()
                .unwrap_or_default();
            let tgs = world
                .elbv2
                .describe_target_groups()
                .load_balancer_arn(arn)
                .send()
                .await?;
            let tg = tgs.target_groups()[0]
                .target_group_arn()
                .unwrap_or_default();
            let targets = world
                .elbv2
                .describe_target_health()
                .target_group_arn(tg)
                .send()
                .await?
                .target_health_descriptions()
                .len();
            Ok(if (instances, targets) == (3, 3) {
                Ok(())
            } else {
                Err(format!("CLB {instances} instances, NLB {targets} targets"))
            })
        },
    )
    .await?;
    cluster.stop_ccm().await
}

/// The NLB's security groups as AWS shows them.
async fn nlb_groups(world: &AwsWorld, lb: &str) -> anyhow::Result<Vec<String>> {
    let d = world
        .elbv2
        .describe_load_balancers()
        .names(lb)
        .send()
        .await?;
    Ok(d.load_balancers()[0].security_groups().to_vec())
}

/// Security groups named `name` in the world's VPC, with their tags as `key=value`.
async fn groups_named(world: &AwsWorld, name: &str) -> anyhow::Result<Vec<BTreeSet<String>>> {
    let out = world
        .ec2
        .describe_security_groups()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("group-name")
                .values(name)
                .build(),
        )
        .send()
        .await?;
    Ok(out
        .security_groups()
        .iter()
        .map(|g| {
            g.tags()
                .iter()
                .map(|t| {
                    format!(
                        "{}={}",
                        t.key().unwrap_or_default(),
                        t.value().unwrap_or_default()
                    )
                })
                .collect()
        })
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managed_nlb_group_admits_exactly_the_source_ranges_and_goes_with_the_service()
-> anyhow::Result<()> {
    use ccm_provider_aws::config::NlbSecurityGroupMode;
    let Setup {
        world,
        mut cluster,
        corp,
        corp_before,
    } = setup("eu-west-3", |c| {
        c.nlb_security_group_mode = Some(NlbSecurityGroupMode::Managed)
    })
    .await?;
    let office = "203.0.113.0/24";
    create(&cluster, "api", json!({NLB: "nlb"}), &[80, 443], &[office]).await?;
    let svc = ready(&cluster, "api").await?;
    let lb = ccm_cloud::default_load_balancer_name(&svc);
    let groups = nlb_groups(&world, &lb).await?;
    assert_eq!(groups.len(), 1, "one managed group on the NLB: {groups:?}");
    let sg = groups[0].clone();
    let tags = groups_named(&world, &format!("k8s-elb-{lb}")).await?;
    assert_eq!(tags.len(), 1, "{tags:?}");
    for t in [
        format!("kubernetes.io/cluster/{}=owned", common::CLUSTER),
        "kubernetes.io/cloud-provider-aws/NLBSecurityGroupMode=Managed".to_string(),
        "kubernetes.io/service-name=default/api".to_string(),
    ] {
        assert!(tags[0].contains(&t), "{t} missing: {:?}", tags[0]);
    }
    // The NLB's group: the listener ports and path MTU from the ranges; the nodes admit the
    // NLB's group, not client CIDRs.
    rules_become(
        &world,
        &sg,
        set(&[
            format!("tcp 80-80 {office}"),
            format!("tcp 443-443 {office}"),
            format!("icmp 3-4 {office}"),
        ]),
    )
    .await?;
    rules_become(&world, &world.node_sg, set(&[format!("-1 -1--1 {sg}")])).await?;

    // Narrower ranges and one port fewer: the old rules go.
    let narrow = "203.0.113.128/25";
    patch(
        &cluster,
        "api",
        json!({"spec": {"loadBalancerSourceRanges": [narrow],
            "ports": [{"name": "p80", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}}),
    )
    .await?;
    rules_become(
        &world,
        &sg,
        set(&[format!("tcp 80-80 {narrow}"), format!("icmp 3-4 {narrow}")]),
    )
    .await?;
    rules_become(&world, &world.node_sg, set(&[format!("-1 -1--1 {sg}")])).await?;

    gone(&cluster, "api").await?;
    rules_become(&world, &world.node_sg, BTreeSet::new()).await?;
    wait_for(
        "the managed group deleted",
        Duration::from_secs(60),
        || async {
            let left = groups_named(&world, &format!("k8s-elb-{lb}")).await?;
            Ok(if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{left:?}"))
            })
        },
    )
    .await?;
    let tgs = world.elbv2.describe_target_groups().send().await?;
    assert!(tgs.target_groups().is_empty(), "target groups left");
    assert_eq!(
        rules(&world, &corp).await?,
        corp_before,
        "corp group edited"
    );
    cluster.stop_ccm().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nlb_made_without_a_group_keeps_cidr_rules_when_managed_mode_comes() -> anyhow::Result<()>
{
    use ccm_provider_aws::config::NlbSecurityGroupMode;
    let Setup {
        world, mut cluster, ..
    } = setup("ap-southeast-1", |_| {}).await?;
    let office = "203.0.113.0/24";
    create(&cluster, "api", json!({NLB: "nlb"}), &[80], &[office]).await?;
    let svc = ready(&cluster, "api").await?;
    let lb = ccm_cloud::default_load_balancer_name(&svc);
    let np = node_port(&svc, 80);
    let client = format!("tcp {np}-{np} {office} kubernetes.io/rule/nlb/client={lb}");
    rules_become(
        &world,
        &world.node_sg,
        set(&[
            client.clone(),
            format!("tcp {np}-{np} 10.0.0.0/16 kubernetes.io/rule/nlb/health={lb}"),
            format!("icmp 3-4 {office} kubernetes.io/rule/nlb/mtu"),
        ]),
    )
    .await?;
    // The mode turned on: AWS cannot add a group to this NLB, so its node rules stay by CIDR
    // and still follow the Service.
    cluster.stop_ccm().await?;
    let mut cfg = cloud_config(&world.url);
    cfg.nlb_security_group_mode = Some(NlbSecurityGroupMode::Managed);
    let aws = AwsCloud::with_sdk_config(cfg, sdk_config("ap-southeast-1").await);
    cluster.start_ccm(aws, &[]).await?;
    let narrow = "203.0.113.128/25";
    patch(
        &cluster,
        "api",
        json!({"spec": {"loadBalancerSourceRanges": [narrow]}}),
    )
    .await?;
    rules_become(
        &world,
        &world.node_sg,
        set(&[
            format!("tcp {np}-{np} {narrow} kubernetes.io/rule/nlb/client={lb}"),
            format!("tcp {np}-{np} 10.0.0.0/16 kubernetes.io/rule/nlb/health={lb}"),
            format!("icmp 3-4 {narrow} kubernetes.io/rule/nlb/mtu"),
        ]),
    )
    .await?;
    assert!(nlb_groups(&world, &lb).await?.is_empty());
    assert!(
        groups_named(&world, &format!("k8s-elb-{lb}"))
            .await?
            .is_empty()
    );
    gone(&cluster, "api").await?;
    rules_become(&world, &world.node_sg, BTreeSet::new()).await?;
    cluster.stop_ccm().await
}

/// The NLB's address type, and its listeners' target groups (by ARN) with their address type
/// and target count. (Read through the listeners: moto does not link a group a listener was
/// modified to forward to with the NLB.)
async fn address_types(
    world: &AwsWorld,
    lb: &str,
) -> anyhow::Result<(String, Vec<(String, String)>)> {
    let d = world
        .elbv2
        .describe_load_balancers()
        .names(lb)
        .send()
        .await?;
    let lb = &d.load_balancers()[0];
    let ip = lb
        .ip_address_type()
        .map(|t| t.as_str().to_string())
        .unwrap_or_default();
    let listeners = world
        .elbv2
        .describe_listeners()
        .load_balancer_arn(lb.load_balancer_arn().unwrap_or_default())
        .send()
        .await?;
    let arns: Vec<String> = listeners
        .listeners()
        .iter()
        .flat_map(|l| {
            l.default_actions()
                .iter()
                .filter_map(|a| a.target_group_arn())
        })
        .map(String::from)
        .collect();
    let tgs = world
        .elbv2
        .describe_target_groups()
        .set_target_group_arns(Some(arns))
        .send()
        .await?;
    let mut out = Vec::new();
    for g in tgs.target_groups() {
        let arn = g.target_group_arn().unwrap_or_default().to_string();
        let targets = world
            .elbv2
            .describe_target_health()
            .target_group_arn(&arn)
            .send()
            .await?
            .target_health_descriptions()
            .len();
        let ip = g.ip_address_type().map(|t| t.as_str()).unwrap_or("ipv4");
        out.push((arn, format!("{ip} targets={targets}")));
    }
    Ok((ip, out))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dualstack_nlb_admits_ipv6_ranges_and_follows_its_address_types() -> anyhow::Result<()> {
    let Setup {
        world,
        mut cluster,
        corp,
        corp_before,
    } = setup("me-south-1", |_| {}).await?;
    let v6 = world
        .ec2
        .associate_vpc_cidr_block()
        .vpc_id(&world.vpc)
        .amazon_provided_ipv6_cidr_block(true)
        .send()
        .await?
        .ipv6_cidr_block_association
        .and_then(|a| a.ipv6_cidr_block)
        .ok_or_else(|| anyhow::anyhow!("no IPv6 block for the VPC"))?;
    let ip = "service.beta.kubernetes.io/aws-load-balancer-ip-address-type";
    let (office, office6) = ("203.0.113.0/24", "2001:db8::/32");
    // IPv6 first: a dualstack NLB with IPv6 target groups.
    let api: Api<Service> = Api::namespaced(cluster.client.clone(), "default");
    let svc: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "api", "namespace": "default", "annotations": {NLB: "nlb"}},
        "spec": {"type": "LoadBalancer", "selector": {"app": "api"},
            "ipFamilyPolicy": "PreferDualStack", "ipFamilies": ["IPv6", "IPv4"],
            "loadBalancerSourceRanges": [office, office6],
            "ports": [{"name": "p80", "port": 80, "targetPort": 8080, "protocol": "TCP"}]},
    }))?;
    api.create(&PostParams::default(), &svc).await?;
    let svc = ready(&cluster, "api").await?;
    let lb = ccm_cloud::default_load_balancer_name(&svc);
    let np = node_port(&svc, 80);
    let (lb_ip, groups) = address_types(&world, &lb).await?;
    assert_eq!(lb_ip, "dualstack");
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(groups[0].1, "ipv6 targets=2");
    let client = format!("kubernetes.io/rule/nlb/client={lb}");
    let health = format!("kubernetes.io/rule/nlb/health={lb}");
    let mtu = "kubernetes.io/rule/nlb/mtu";
    rules_become(
        &world,
        &world.node_sg,
        set(&[
            format!("tcp {np}-{np} {office} {client}"),
            format!("tcp {np}-{np} {office6} {client}"),
            format!("tcp {np}-{np} 10.0.0.0/16 {health}"),
            format!("tcp {np}-{np} {v6} {health}"),
            format!("icmp 3-4 {office} {mtu}"),
            format!("58 2-0 {office6} {mtu}"),
        ]),
    )
    .await?;

    // The annotation wins over the families: back to IPv4, a new IPv4 target group with its
    // targets, the IPv6 one gone, the NLB IPv4 only; health checks no longer come over IPv6.
    patch(
        &cluster,
        "api",
        json!({"metadata": {"annotations": {ip: "ipv4"}}}),
    )
    .await?;
    wait_for("an IPv4 NLB", Duration::from_secs(60), || async {
        // The listener may still name the target group being replaced: a read between the
        // two is "not yet", not a failure.
        let now = match address_types(&world, &lb).await {
            Ok(now) => now,
            Err(e) => return Ok(Err(format!("{e:#}"))),
        };
        // The region is this test's: every target group in it is this NLB's.
        let all = world.elbv2.describe_target_groups().send().await?;
        let want = ("ipv4".to_string(), vec!["ipv4 targets=2".to_string()], 1);
        let have = (
            now.0.clone(),
            now.1.iter().map(|g| g.1.clone()).collect(),
            all.target_groups().len(),
        );
        Ok(if have == want {
            Ok(())
        } else {
            Err(format!("{now:?}"))
        })
    })
    .await?;
    rules_become(
        &world,
        &world.node_sg,
        set(&[
            format!("tcp {np}-{np} {office} {client}"),
            format!("tcp {np}-{np} {office6} {client}"),
            format!("tcp {np}-{np} 10.0.0.0/16 {health}"),
            format!("icmp 3-4 {office} {mtu}"),
            format!("58 2-0 {office6} {mtu}"),
        ]),
    )
    .await?;
    gone(&cluster, "api").await?;
    rules_become(&world, &world.node_sg, BTreeSet::new()).await?;
    assert_eq!(
        rules(&world, &corp).await?,
        corp_before,
        "corp group edited"
    );
    cluster.stop_ccm().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_family_policy_is_a_warning_naming_the_field() -> anyhow::Result<()> {
    let Setup { mut cluster, .. } = setup("eu-south-1", |_| {}).await?;
    let api: Api<Service> = Api::namespaced(cluster.client.clone(), "default");
    let svc: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"type": "LoadBalancer", "selector": {"app": "web"},
            "ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv4", "IPv6"],
            "ports": [{"name": "p80", "port": 80, "targetPort": 8080, "protocol": "TCP"}]},
    }))?;
    api.create(&PostParams::default(), &svc).await?;
    wait_for(
        "a Warning naming spec.ipFamilyPolicy",
        Duration::from_secs(60),
        || async {
            let n = warnings(&cluster, "spec.ipFamilyPolicy").await?;
            Ok(if n > 0 {
                Ok(())
            } else {
                Err("none".to_string())
            })
        },
    )
    .await?;
    cluster.stop_ccm().await
}
