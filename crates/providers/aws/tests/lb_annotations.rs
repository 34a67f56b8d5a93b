//! Upstream's Service annotations, each set, changed and removed: the AWS resources follow —
//! on moto, through the real controllers on kube-sim.

mod common;

use std::time::Duration;

use common::{AwsWorld, Cluster, Moto, pod_cidr, wait_for};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

const P: &str = "service.beta.kubernetes.io/aws-load-balancer-";

fn a(suffix: &str) -> String {
    format!("{P}{suffix}")
}

async fn setup(region: &str) -> anyhow::Result<(AwsWorld, Cluster, Vec<(String, String)>)> {
    let world = AwsWorld::create(Moto::shared(), region).await?;
    world.with_internet_gateway().await?;
    let mut instances = world.run_instances(1, 0).await?;
    instances.extend(world.run_instances(1, 1).await?);
    let mut cluster = Cluster::start().await?;
    cluster.start_ccm(world.provider().await, &[]).await?;
    for (i, (_, dns)) in instances.iter().enumerate() {
        cluster.add_node(dns, &pod_cidr(i)).await?;
    }
    Ok((world, cluster, instances))
}

async fn annotate(cluster: &Cluster, name: &str, ann: serde_json::Value) -> anyhow::Result<()> {
    let api: Api<Service> = Api::namespaced(cluster.client.clone(), "default");
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": ann}})),
    )
    .await?;
    Ok(())
}

async fn lb_name(cluster: &Cluster, name: &str) -> anyhow::Result<String> {
    let svc = cluster
        .service(name)
        .await?
        .ok_or_else(|| anyhow::anyhow!("{name} gone"))?;
    Ok(ccm_cloud::default_load_balancer_name(&svc))
}

/// The Classic ELB as a comparable summary: idle timeout, draining (on, timeout), access log
/// (on, bucket), ports with PROXY protocol, instances.
async fn clb_state(world: &AwsWorld, lb: &str) -> anyhow::Result<String> {
    let attrs = world
        .elb
        .describe_load_balancer_attributes()
        .load_balancer_name(lb)
        .send()
        .await?;
    let attrs = attrs.load_balancer_attributes();
    let d = world
        .elb
        .describe_load_balancers()
        .load_balancer_names(lb)
        .send()
        .await?;
    let d = &d.load_balancer_descriptions()[0];
    let proxy: Vec<i32> = d
        .backend_server_descriptions()
        .iter()
        .filter(|b| {
            b.policy_names()
                .iter()
                .any(|p| p == "k8s-proxyprotocol-enabled")
        })
        .filter_map(|b| b.instance_port())
        .collect();
    Ok(format!(
        "idle={:?} draining={:?}/{:?} log={:?}/{:?} proxy={} instances={}",
        attrs
            .and_then(|a| a.connection_settings())
            .map(|c| c.idle_timeout()),
        attrs
            .and_then(|a| a.connection_draining())
            .map(|c| c.enabled()),
        attrs
            .and_then(|a| a.connection_draining())
            .and_then(|c| c.timeout()),
        attrs.and_then(|a| a.access_log()).map(|c| c.enabled()),
        attrs
            .and_then(|a| a.access_log())
            .and_then(|c| c.s3_bucket_name()),
        proxy.len(),
        d.instances().len()
    ))
}

async fn clb_becomes(world: &AwsWorld, lb: &str, want: &str) -> anyhow::Result<()> {
    wait_for(want, Duration::from_secs(60), || async {
        let s = clb_state(world, lb).await?;
        Ok(if s == want { Ok(()) } else { Err(s) })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_elb_annotations_set_changed_removed() -> anyhow::Result<()> {
    let (world, mut cluster, instances) = setup("us-west-1").await?;
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let labelled = json!({"metadata": {"labels": {"lb": "yes"}}});
    nodes
        .patch(
            &instances[0].1,
            &PatchParams::default(),
            &Patch::Merge(&labelled),
        )
        .await?;
    cluster
        .create_service(
            "web",
            json!({
                a("connection-idle-timeout"): "120",
                a("connection-draining-enabled"): "true",
                a("connection-draining-timeout"): "30",
                a("access-log-enabled"): "true",
                a("access-log-s3-bucket-name"): "logs",
                a("proxy-protocol"): "*",
                a("target-node-labels"): "lb=yes",
            }),
            &[80],
        )
        .await?;
    let lb = wait_for("the ELB", Duration::from_secs(60), || async {
        let name = lb_name(&cluster, "web").await?;
        let d = world.elb.describe_load_balancers().send().await?;
        Ok(
            if d.load_balancer_descriptions()
                .iter()
                .any(|l| l.load_balancer_name() == Some(name.as_str()))
            {
                Ok(name)
            } else {
                Err("none yet".to_string())
            },
        )
    })
    .await?;
    // Only the node labelled lb=yes is a backend.
    clb_becomes(&world, &lb, "idle=Some(120) draining=Some(true)/Some(30) log=Some(true)/Some(\"logs\") proxy=1 instances=1").await?;

    annotate(
        &cluster,
        "web",
        json!({a("connection-idle-timeout"): "300", a("proxy-protocol"): null}),
    )
    .await?;
    clb_becomes(&world, &lb, "idle=Some(300) draining=Some(true)/Some(30) log=Some(true)/Some(\"logs\") proxy=0 instances=1").await?;

    annotate(
        &cluster,
        "web",
        json!({
            a("connection-idle-timeout"): null,
            a("connection-draining-enabled"): null,
            a("connection-draining-timeout"): null,
            a("access-log-enabled"): null,
            a("access-log-s3-bucket-name"): null,
            a("target-node-labels"): null,
        }),
    )
    .await?;
    wait_for(
        "upstream's defaults and every node",
        Duration::from_secs(60),
        || async {
            let s = clb_state(&world, &lb).await?;
            let ok = s.starts_with("idle=Some(60) draining=Some(false)")
                && s.contains("log=Some(false)")
                && s.ends_with("proxy=0 instances=2");
            Ok(if ok { Ok(()) } else { Err(s) })
        },
    )
    .await?;
    cluster.stop_ccm().await
}

/// Each target group's attributes the test looks at, and the NLB's.
async fn nlb_state(world: &AwsWorld, lb: &str) -> anyhow::Result<Option<String>> {
    let lbs = world.elbv2.describe_load_balancers().names(lb).send().await;
    let Ok(lbs) = lbs else { return Ok(None) };
    let arn = lbs.load_balancers()[0]
        .load_balancer_arn()
        .unwrap_or_default()
        .to_string();
    let listeners = world
        .elbv2
        .describe_listeners()
        .load_balancer_arn(&arn)
        .send()
        .await?;
    let Some(tg) = listeners
        .listeners()
        .first()
        .and_then(|l| l.default_actions().first())
        .and_then(|a| a.target_group_arn())
        .map(String::from)
    else {
        return Ok(None);
    };
    let attrs = world
        .elbv2
        .describe_target_group_attributes()
        .target_group_arn(&tg)
        .send()
        .await?;
    let get = |k: &str| {
        attrs
            .attributes()
            .iter()
            .find(|a| a.key() == Some(k))
            .and_then(|a| a.value())
            .unwrap_or("-")
            .to_string()
    };
    let lb_attrs = world
        .elbv2
        .describe_load_balancer_attributes()
        .load_balancer_arn(&arn)
        .send()
        .await?;
    let lb_get = |k: &str| {
        lb_attrs
            .attributes()
            .iter()
            .find(|a| a.key() == Some(k))
            .and_then(|a| a.value())
            .unwrap_or("-")
            .to_string()
    };
    Ok(Some(format!(
        "preserve={} proxy={} logs={}",
        get("preserve_client_ip.enabled"),
        get("proxy_protocol_v2.enabled"),
        lb_get("access_logs.s3.enabled"),
    )))
}

async fn nlb_becomes(world: &AwsWorld, lb: &str, want: &str) -> anyhow::Result<()> {
    wait_for(want, Duration::from_secs(60), || async {
        let s = nlb_state(world, lb).await?;
        Ok(if s.as_deref() == Some(want) {
            Ok(())
        } else {
            Err(format!("{s:?}"))
        })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nlb_annotations_set_changed_removed() -> anyhow::Result<()> {
    let (world, mut cluster, _) = setup("eu-west-2").await?;
    cluster
        .create_service(
            "api",
            json!({
                a("type"): "nlb",
                a("target-group-attributes"): "preserve_client_ip.enabled=false",
                a("proxy-protocol"): "*",
                a("access-log-enabled"): "true",
                a("access-log-s3-bucket-name"): "logs",
            }),
            &[80],
        )
        .await?;
    let lb = lb_name(&cluster, "api").await?;
    nlb_becomes(&world, &lb, "preserve=false proxy=true logs=true").await?;
    annotate(
        &cluster,
        "api",
        json!({a("target-group-attributes"): "preserve_client_ip.enabled=true,proxy_protocol_v2.enabled=true"}),
    )
    .await?;
    nlb_becomes(&world, &lb, "preserve=true proxy=true logs=true").await?;
    annotate(
        &cluster,
        "api",
        json!({a("target-group-attributes"): null, a("proxy-protocol"): null, a("access-log-enabled"): null}),
    )
    .await?;
    nlb_becomes(&world, &lb, "preserve=true proxy=false logs=false").await?;

    // A value upstream refuses: a Warning naming it, the LB left as it is.
    annotate(&cluster, "api", json!({a("proxy-protocol"): "v2"})).await?;
    wait_for(
        "a Warning naming proxy-protocol",
        Duration::from_secs(60),
        || async {
            let events: Api<k8s_openapi::api::core::v1::Event> =
                Api::namespaced(cluster.client.clone(), "default");
            let n = events
                .list(&Default::default())
                .await?
                .items
                .iter()
                .filter(|e| e.type_.as_deref() == Some("Warning"))
                .filter(|e| {
                    e.message
                        .as_deref()
                        .is_some_and(|m| m.contains(&a("proxy-protocol")))
                })
                .count();
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

/// The Classic ELB's listeners as `port:PROTO:cert?:policies` (moto reports the front protocol
/// as the instance protocol, so that one is not compared).
async fn clb_listeners(world: &AwsWorld, lb: &str) -> anyhow::Result<Vec<String>> {
    let d = world
        .elb
        .describe_load_balancers()
        .load_balancer_names(lb)
        .send()
        .await?;
    let mut out: Vec<String> = d.load_balancer_descriptions()[0]
        .listener_descriptions()
        .iter()
        .filter_map(|l| {
            let x = l.listener()?;
            Some(format!(
                "{}:{}:{}:{}",
                x.load_balancer_port(),
                x.protocol().to_uppercase(),
                x.ssl_certificate_id().is_some(),
                l.policy_names().join("+")
            ))
        })
        .collect();
    out.sort();
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_listeners_follow_the_certificate_annotations() -> anyhow::Result<()> {
    let (world, mut cluster, _) = setup("ap-south-2").await?;
    // moto checks no IAM certificate ARN on Classic ELBs, nor TLS certificates on NLBs.
    let cert = "arn:aws:iam::123456789012:server-certificate/web";
    let policy = "ELBSecurityPolicy-TLS-1-2-2017-01";
    cluster
        .create_service(
            "web",
            json!({a("ssl-cert"): cert, a("ssl-ports"): "443", a("backend-protocol"): "http",
                a("ssl-negotiation-policy"): policy}),
            &[80, 443],
        )
        .await?;
    cluster
        .create_service(
            "api",
            json!({a("type"): "nlb", a("ssl-cert"): cert, a("ssl-negotiation-policy"): policy}),
            &[443],
        )
        .await?;
    let clb = wait_for("the ELB", Duration::from_secs(60), || async {
        let name = lb_name(&cluster, "web").await?;
        Ok(match clb_listeners(&world, &name).await {
            Ok(_) => Ok(name),
            Err(e) => Err(e.to_string()),
        })
    })
    .await?;
    let want = vec![
        "443:HTTPS:true:k8s-SSLNegotiationPolicy-ELBSecurityPolicy-TLS-1-2-2017-01".to_string(),
        "80:HTTP:false:".to_string(),
    ];
    wait_for(
        "HTTPS on 443, HTTP on 80",
        Duration::from_secs(60),
        || async {
            let have = clb_listeners(&world, &clb).await?;
            Ok(if have == want {
                Ok(())
            } else {
                Err(format!("{have:?}"))
            })
        },
    )
    .await?;
    let nlb = lb_name(&cluster, "api").await?;
    let listener = || async {
        let lbs = world
            .elbv2
            .describe_load_balancers()
            .names(&nlb)
            .send()
            .await?;
        let arn = lbs.load_balancers()[0]
            .load_balancer_arn()
            .unwrap_or_default()
            .to_string();
        let l = world
            .elbv2
            .describe_listeners()
            .load_balancer_arn(&arn)
            .send()
            .await?;
        let l = l.listeners().first().cloned();
        anyhow::Ok(l.map(|l| {
            format!(
                "{:?} {:?} {:?}",
                l.protocol(),
                l.certificates()
                    .first()
                    .and_then(|c| c.certificate_arn().map(String::from)),
                l.ssl_policy()
            )
        }))
    };
    let tls = format!("Some(Tls) Some({cert:?}) Some({policy:?})");
    wait_for(
        "a TLS listener on the NLB",
        Duration::from_secs(60),
        || async {
            let have = listener().await.unwrap_or_default();
            Ok(if have.as_deref() == Some(tls.as_str()) {
                Ok(())
            } else {
                Err(format!("{have:?}"))
            })
        },
    )
    .await?;

    // Certificate removed: plain TCP again, the same listeners changed in place.
    let off = json!({a("ssl-cert"): null, a("ssl-ports"): null, a("backend-protocol"): null, a("ssl-negotiation-policy"): null});
    annotate(&cluster, "web", off.clone()).await?;
    annotate(&cluster, "api", off).await?;
    wait_for("TCP listeners", Duration::from_secs(60), || async {
        let have = clb_listeners(&world, &clb).await?;
        let nlb_now = listener().await.unwrap_or_default().unwrap_or_default();
        let ok = have.iter().all(|l| l.contains(":TCP:false")) && nlb_now.starts_with("Some(Tcp)");
        Ok(if ok {
            Ok(())
        } else {
            Err(format!(
                "{have:?} {nlb_now} {:?}",
                warnings_of(&cluster).await?
            ))
        })
    })
    .await?;
    cluster.stop_ccm().await
}

async fn warnings_of(cluster: &Cluster) -> anyhow::Result<Vec<String>> {
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
