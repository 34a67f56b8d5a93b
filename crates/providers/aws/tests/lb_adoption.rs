//! Load balancers cloud-provider-aws created are adopted without an outage: the test builds a
//! Classic ELB and an NLB exactly as upstream's `aws_loadbalancer.go` would (names, tags, target
//! groups, listeners, registered targets), then starts ccm-rs, and watches — by sampling and
//! through moto's call recorder — that no listener ever forwards to an empty target group, and
//! that no target group is re-created when nothing required it.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_sdk_elasticloadbalancingv2::types::{
    Action, ActionTypeEnum, LoadBalancerTypeEnum, ProtocolEnum, TargetDescription, TargetTypeEnum,
};
use common::{AwsWorld, CLUSTER, Cluster, Moto, pod_cidr, wait_for};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams};
use parking_lot::Mutex;
use serde_json::json;
use sha1::Digest as _;

const NLB: &str = "service.beta.kubernetes.io/aws-load-balancer-type";
const INTERVAL: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval";
const HEALTHY: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-healthy-threshold";

/// Upstream's `buildTargetGroupName`, written out here from its source.
fn upstream_tg_name(ns: &str, name: &str, port: i32, node_port: i32, interval: i32) -> String {
    let mut h = sha1::Sha1::new();
    for part in [
        CLUSTER.to_string(),
        ns.into(),
        name.into(),
        port.to_string(),
        node_port.to_string(),
        "TCP".into(),
        "instance".into(),
        "TCP".into(),
        interval.to_string(),
    ] {
        h.update(part.as_bytes());
    }
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    let clip = |s: &str| {
        s.chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(8)
            .collect::<String>()
    };
    format!("k8s-{}-{}-{}", clip(ns), clip(name), &hex[..10])
}

fn node_port(svc: &Service) -> i32 {
    svc.spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .map(|p| p[0].node_port.unwrap_or(0))
        .unwrap_or(0)
}

fn tags(svc: &str) -> Vec<(String, String)> {
    vec![
        (format!("kubernetes.io/cluster/{CLUSTER}"), "owned".into()),
        (
            "kubernetes.io/service-name".into(),
            format!("default/{svc}"),
        ),
    ]
}

/// The Classic ELB upstream makes: `k8s-elb-<name>` open on the port (and ICMP 3/4), a TCP
/// listener to the NodePort, the instances, health check `TCP:<nodePort>` 2/6/5/10.
async fn upstream_clb(
    world: &AwsWorld,
    name: &str,
    np: i32,
    ids: &[String],
) -> anyhow::Result<String> {
    use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
    let sg = world
        .ec2
        .create_security_group()
        .group_name(format!("k8s-elb-{name}"))
        .description(format!(
            "Security group for Kubernetes ELB {name} (default/web)"
        ))
        .vpc_id(&world.vpc)
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::SecurityGroup)
                .set_tags(Some(
                    tags("web")
                        .into_iter()
                        .map(|(k, v)| Tag::builder().key(k).value(v).build())
                        .collect(),
                ))
                .build(),
        )
        .send()
        .await?
        .group_id
        .unwrap_or_default();
    for (proto, from, to) in [("tcp", 80, 80), ("icmp", 3, 4)] {
        world
            .ec2
            .authorize_security_group_ingress()
            .group_id(&sg)
            .ip_protocol(proto)
            .from_port(from)
            .to_port(to)
            .cidr_ip("0.0.0.0/0")
            .send()
            .await?;
    }
    use aws_sdk_elasticloadbalancing::types::{HealthCheck, Instance, Listener, Tag as ElbTag};
    world
        .elb
        .create_load_balancer()
        .load_balancer_name(name)
        .listeners(
            Listener::builder()
                .protocol("tcp")
                .load_balancer_port(80)
                .instance_protocol("tcp")
                .instance_port(np)
                .build()?,
        )
        .set_subnets(Some(world.subnets.clone()))
        .security_groups(&sg)
        .set_tags(Some(
            tags("web")
                .into_iter()
                .map(|(k, v)| ElbTag::builder().key(k).value(v).build())
                .collect::<Result<_, _>>()?,
        ))
        .send()
        .await?;
    world
        .elb
        .register_instances_with_load_balancer()
        .load_balancer_name(name)
        .set_instances(Some(
            ids.iter()
                .map(|i| Instance::builder().instance_id(i).build())
                .collect(),
        ))
        .send()
        .await?;
    world
        .elb
        .configure_health_check()
        .load_balancer_name(name)
        .health_check(
            HealthCheck::builder()
                .target(format!("TCP:{np}"))
                .healthy_threshold(2)
                .unhealthy_threshold(6)
                .timeout(5)
                .interval(10)
                .build()?,
        )
        .send()
        .await?;
    Ok(sg)
}

/// The NLB upstream makes: a target group per port named by `buildTargetGroupName` (health
/// check TCP traffic-port, 3/3, 30 s), the instances registered, then a TCP listener.
async fn upstream_nlb(
    world: &AwsWorld,
    name: &str,
    np: i32,
    ids: &[String],
) -> anyhow::Result<(String, String)> {
    use aws_sdk_elasticloadbalancingv2::types::Tag;
    let t = || {
        tags("api")
            .into_iter()
            .map(|(k, v)| Tag::builder().key(k).value(v).build())
            .collect::<Vec<_>>()
    };
    let lb = world
        .elbv2
        .create_load_balancer()
        .name(name)
        .r#type(LoadBalancerTypeEnum::Network)
        .set_subnets(Some(world.subnets.clone()))
        .set_tags(Some(t()))
        .send()
        .await?;
    let lb_arn = lb.load_balancers()[0]
        .load_balancer_arn()
        .unwrap_or_default()
        .to_string();
    let tg = world
        .elbv2
        .create_target_group()
        .name(upstream_tg_name("default", "api", 80, np, 30))
        .protocol(ProtocolEnum::Tcp)
        .port(np)
        .vpc_id(&world.vpc)
        .target_type(TargetTypeEnum::Instance)
        .health_check_interval_seconds(30)
        .health_check_port("traffic-port")
        .health_check_protocol(ProtocolEnum::Tcp)
        .healthy_threshold_count(3)
        .unhealthy_threshold_count(3)
        .set_tags(Some(t()))
        .send()
        .await?;
    let tg_arn = tg.target_groups()[0]
        .target_group_arn()
        .unwrap_or_default()
        .to_string();
    world
        .elbv2
        .register_targets()
        .target_group_arn(&tg_arn)
        .set_targets(Some(
            ids.iter()
                .map(|i| TargetDescription::builder().id(i).port(np).build())
                .collect(),
        ))
        .send()
        .await?;
    world
        .elbv2
        .create_listener()
        .load_balancer_arn(&lb_arn)
        .port(80)
        .protocol(ProtocolEnum::Tcp)
        .default_actions(
            Action::builder()
                .r#type(ActionTypeEnum::Forward)
                .target_group_arn(&tg_arn)
                .build(),
        )
        .set_tags(Some(t()))
        .send()
        .await?;
    Ok((lb_arn, tg_arn))
}

/// What the sampler saw go wrong.
#[derive(Default)]
struct Seen {
    empty: Vec<String>,
    samples: usize,
}

/// One sample: the CLB's instances and, for each NLB listener, its target group's targets.
async fn sample(
    world: &AwsWorld,
    clb: &str,
    nlb_arn: &str,
    seen: &Mutex<Seen>,
) -> anyhow::Result<()> {
    let d = world
        .elb
        .describe_load_balancers()
        .load_balancer_names(clb)
        .send()
        .await?;
    let lb = &d.load_balancer_descriptions()[0];
    if lb.instances().is_empty() || lb.listener_descriptions().is_empty() {
        seen.lock().empty.push(format!(
            "CLB: {} instances, {} listeners",
            lb.instances().len(),
            lb.listener_descriptions().len()
        ));
    }
    let listeners = world
        .elbv2
        .describe_listeners()
        .load_balancer_arn(nlb_arn)
        .send()
        .await?;
    if listeners.listeners().is_empty() {
        seen.lock().empty.push("NLB without listener".into());
    }
    for l in listeners.listeners() {
        for a in l.default_actions() {
            let Some(tg) = a.target_group_arn() else {
                continue;
            };
            let n = match world
                .elbv2
                .describe_target_health()
                .target_group_arn(tg)
                .send()
                .await
            {
                Ok(h) => h.target_health_descriptions().len(),
                // Deleted since the listeners were read: fine if no listener forwards to it now.
                Err(_) => {
                    let now = world
                        .elbv2
                        .describe_listeners()
                        .load_balancer_arn(nlb_arn)
                        .send()
                        .await?;
                    let still = now.listeners().iter().any(|l| {
                        l.default_actions()
                            .iter()
                            .any(|a| a.target_group_arn() == Some(tg))
                    });
                    if still { 0 } else { 1 }
                }
            };
            if n == 0 {
                seen.lock()
                    .empty
                    .push(format!("listener {:?} → {tg} with no targets", l.port()));
            }
        }
    }
    seen.lock().samples += 1;
    Ok(())
}

fn decode(s: &str) -> String {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let Some(Ok(v)) = s.get(i + 1..i + 3).map(|h| u8::from_str_radix(h, 16))
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).to_string()
}

/// The form parameters of a recorded call.
fn params(body: &str) -> BTreeMap<String, String> {
    body.split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect()
}

/// From moto's recording, in order: every listener write points at a target group that had
/// targets registered before it.
fn listener_writes_point_at_filled_groups(calls: &[(String, String)]) -> Result<usize, String> {
    let mut filled: BTreeSet<String> = BTreeSet::new();
    let mut writes = 0;
    for (action, body) in calls {
        let p = params(body);
        match action.as_str() {
            "RegisterTargets" => {
                filled.extend(p.get("TargetGroupArn").cloned());
            }
            "CreateListener" | "ModifyListener" => {
                writes += 1;
                for (k, v) in &p {
                    if k.ends_with("TargetGroupArn") && !filled.contains(v) {
                        return Err(format!(
                            "{action} points at {v} before any target was registered in it"
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(writes)
}

async fn listener_group(
    world: &AwsWorld,
    nlb_arn: &str,
) -> anyhow::Result<(String, Option<i32>, Option<i32>)> {
    let l = world
        .elbv2
        .describe_listeners()
        .load_balancer_arn(nlb_arn)
        .send()
        .await?;
    let tg = l.listeners()[0].default_actions()[0]
        .target_group_arn()
        .unwrap_or_default()
        .to_string();
    let g = world
        .elbv2
        .describe_target_groups()
        .target_group_arns(&tg)
        .send()
        .await?;
    let g = &g.target_groups()[0];
    Ok((
        tg,
        g.health_check_interval_seconds(),
        g.healthy_threshold_count(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_balancers_upstream_made_are_adopted_without_an_empty_target_group()
-> anyhow::Result<()> {
    // A moto of its own: its recorder must hold this test's calls only.
    let moto = Moto::start();
    let world = AwsWorld::create(&moto, "us-east-2").await?;
    world.with_internet_gateway().await?;
    let mut instances = world.run_instances(1, 0).await?;
    instances.extend(world.run_instances(1, 1).await?);
    let ids: Vec<String> = instances.iter().map(|(i, _)| i.clone()).collect();
    let mut cluster = Cluster::start().await?;
    for (i, (_, dns)) in instances.iter().enumerate() {
        cluster.add_node(dns, &pod_cidr(i)).await?;
    }
    let web = cluster.create_service("web", json!({}), &[80]).await?;
    let api = cluster
        .create_service("api", json!({NLB: "nlb"}), &[80])
        .await?;
    let (clb, nlb) = (
        ccm_cloud::default_load_balancer_name(&web),
        ccm_cloud::default_load_balancer_name(&api),
    );
    moto.start_recording().await;
    let clb_sg = upstream_clb(&world, &clb, node_port(&web), &ids).await?;
    let (nlb_arn, tg_arn) = upstream_nlb(&world, &nlb, node_port(&api), &ids).await?;

    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (seen, stop) = (seen.clone(), stop.clone());
        let world = clone_world(&world);
        let (clb, nlb_arn) = (clb.clone(), nlb_arn.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                sample(&world, &clb, &nlb_arn, &seen).await?;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            anyhow::Ok(())
        })
    };

    let aws = world.provider().await;
    cluster.start_ccm(aws, &[]).await?;
    for name in ["web", "api"] {
        wait_for("an ingress hostname", Duration::from_secs(60), || async {
            let svc = cluster
                .service(name)
                .await?
                .ok_or_else(|| anyhow::anyhow!("gone"))?;
            let ok = svc
                .status
                .and_then(|s| s.load_balancer)
                .and_then(|l| l.ingress)
                .is_some_and(|i| !i.is_empty());
            Ok(if ok {
                Ok(())
            } else {
                Err("no ingress".to_string())
            })
        })
        .await?;
    }
    // The first syncs adopted both in place.
    let (tg_now, interval, _) = listener_group(&world, &nlb_arn).await?;
    assert_eq!(tg_now, tg_arn, "the target group upstream made is kept");
    assert_eq!(interval, Some(30), "upstream's NLB health-check interval");
    let groups = world
        .ec2
        .describe_security_groups()
        .group_names(format!("k8s-elb-{clb}"))
        .send()
        .await?;
    assert_eq!(groups.security_groups().len(), 1);
    assert_eq!(
        groups.security_groups()[0].group_id(),
        Some(clb_sg.as_str()),
        "the ELB's group is kept"
    );
    let calls = moto.recorded().await;
    for fresh in [
        "CreateLoadBalancer",
        "DeleteTargetGroup",
        "DeleteLoadBalancerListeners",
    ] {
        // The two upstream-made LBs are the only creations.
        let n = calls.get(fresh).copied().unwrap_or(0);
        assert!(
            n <= if fresh == "CreateLoadBalancer" { 2 } else { 0 },
            "{fresh}: {calls:?}"
        );
    }
    assert_eq!(
        calls.get("CreateTargetGroup").copied(),
        Some(1),
        "{calls:?}"
    );

    // A health setting a target group cannot change in place: a new group, filled first.
    let svcs: Api<Service> = Api::namespaced(cluster.client.clone(), "default");
    svcs.patch(
        "api",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {INTERVAL: "10"}}})),
    )
    .await?;
    let replaced = wait_for(
        "the listener on a 10 s target group",
        Duration::from_secs(60),
        || async {
            let (tg, interval, _) = listener_group(&world, &nlb_arn).await?;
            Ok(if interval == Some(10) {
                Ok(tg)
            } else {
                Err(format!("{tg}: {interval:?}"))
            })
        },
    )
    .await?;
    assert_ne!(replaced, tg_arn);
    // One it can: changed in place.
    svcs.patch(
        "api",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {HEALTHY: "5"}}})),
    )
    .await?;
    let same = wait_for(
        "the healthy threshold changed",
        Duration::from_secs(60),
        || async {
            let (tg, _, healthy) = listener_group(&world, &nlb_arn).await?;
            Ok(if healthy == Some(5) {
                Ok(tg)
            } else {
                Err(format!(
                    "{tg}: {healthy:?}; events: {:?}",
                    warnings(&cluster).await?
                ))
            })
        },
    )
    .await?;
    assert_eq!(same, replaced, "a threshold change keeps the target group");
    let left = world.elbv2.describe_target_groups().send().await?;
    assert_eq!(left.target_groups().len(), 1, "the replaced group is gone");

    stop.store(true, Ordering::Relaxed);
    sampler.await??;
    {
        let seen = seen.lock();
        assert!(seen.samples > 5, "{} samples", seen.samples);
        assert!(seen.empty.is_empty(), "{:?}", seen.empty);
    }
    let writes = listener_writes_point_at_filled_groups(&moto.recorded_calls().await)
        .map_err(anyhow::Error::msg)?;
    assert!(
        writes >= 2,
        "the upstream listener and the switch to the new group: {writes}"
    );
    cluster.stop_ccm().await
}

/// The Warning Events' messages (what a failed sync said).
async fn warnings(cluster: &Cluster) -> anyhow::Result<Vec<String>> {
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(cluster.client.clone(), "default");
    Ok(events
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .filter_map(|e| e.message)
        .collect())
}

/// A second handle on the same moto world (its clients are cheap clones).
fn clone_world(w: &AwsWorld) -> AwsWorld {
    AwsWorld {
        region: w.region.clone(),
        ec2: w.ec2.clone(),
        elb: w.elb.clone(),
        elbv2: w.elbv2.clone(),
        vpc: w.vpc.clone(),
        subnets: w.subnets.clone(),
        route_table: w.route_table.clone(),
        node_sg: w.node_sg.clone(),
        url: w.url.clone(),
    }
}
