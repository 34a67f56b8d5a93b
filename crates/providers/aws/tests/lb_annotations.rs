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

/// Waits for a Warning Event whose message contains every one of `parts`.
async fn warned(cluster: &Cluster, parts: &[&str]) -> anyhow::Result<()> {
    wait_for(
        &format!("a Warning naming {parts:?}"),
        Duration::from_secs(60),
        || async {
            let all = warnings_of(cluster).await?;
            Ok(if all.iter().any(|m| parts.iter().all(|p| m.contains(p))) {
                Ok(())
            } else {
                Err(format!("{all:?}"))
            })
        },
    )
    .await
}

/// The NodePort of the Service's first port.
async fn node_port(cluster: &Cluster, name: &str) -> anyhow::Result<i32> {
    cluster
        .service(name)
        .await?
        .and_then(|s| s.spec)
        .and_then(|s| s.ports)
        .and_then(|p| p.first().and_then(|p| p.node_port))
        .ok_or_else(|| anyhow::anyhow!("{name} has no nodePort"))
}

/// Creates a Service from its annotations and a spec given as JSON (ports and all).
async fn create_raw(
    cluster: &Cluster,
    name: &str,
    ann: serde_json::Value,
    spec: serde_json::Value,
) -> anyhow::Result<Service> {
    let api: Api<Service> = Api::namespaced(cluster.client.clone(), "default");
    let mut full = json!({"type": "LoadBalancer", "selector": {"app": name}});
    if let (Some(f), Some(s)) = (full.as_object_mut(), spec.as_object()) {
        f.extend(s.clone());
    }
    let svc: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "annotations": ann},
        "spec": full,
    }))?;
    Ok(api.create(&Default::default(), &svc).await?)
}

/// The Classic ELB's health check and access-log settings, comparable.
async fn clb_health(world: &AwsWorld, lb: &str) -> anyhow::Result<String> {
    let d = world
        .elb
        .describe_load_balancers()
        .load_balancer_names(lb)
        .send()
        .await?;
    let h = d.load_balancer_descriptions()[0].health_check().cloned();
    let attrs = world
        .elb
        .describe_load_balancer_attributes()
        .load_balancer_name(lb)
        .send()
        .await?;
    let log = attrs
        .load_balancer_attributes()
        .and_then(|a| a.access_log())
        .cloned();
    Ok(format!(
        "{} {}/{}/{}/{} log={:?}/{:?}/{:?}/{:?}",
        h.as_ref().map(|h| h.target()).unwrap_or_default(),
        h.as_ref().map(|h| h.interval()).unwrap_or_default(),
        h.as_ref().map(|h| h.timeout()).unwrap_or_default(),
        h.as_ref()
            .map(|h| h.unhealthy_threshold())
            .unwrap_or_default(),
        h.as_ref()
            .map(|h| h.healthy_threshold())
            .unwrap_or_default(),
        log.as_ref().map(|l| l.enabled()),
        log.as_ref().and_then(|l| l.s3_bucket_name()),
        log.as_ref().and_then(|l| l.s3_bucket_prefix()),
        log.as_ref().and_then(|l| l.emit_interval()),
    ))
}

async fn clb_health_becomes(world: &AwsWorld, lb: &str, want: &str) -> anyhow::Result<()> {
    wait_for(want, Duration::from_secs(60), || async {
        let s = clb_health(world, lb)
            .await
            .unwrap_or_else(|e| format!("{e:?}"));
        Ok(if s == want { Ok(()) } else { Err(s) })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_elb_health_check_and_access_log_annotations_set_changed_removed()
-> anyhow::Result<()> {
    let (world, mut cluster, _) = setup("ca-central-1").await?;
    cluster
        .create_service(
            "web",
            json!({
                a("healthcheck-protocol"): "HTTP",
                a("healthcheck-port"): "31555",
                a("healthcheck-path"): "/hz",
                a("healthcheck-healthy-threshold"): "3",
                a("healthcheck-unhealthy-threshold"): "4",
                a("healthcheck-timeout"): "7",
                a("healthcheck-interval"): "20",
                a("access-log-enabled"): "true",
                a("access-log-s3-bucket-name"): "logs",
                a("access-log-s3-bucket-prefix"): "a",
                a("access-log-emit-interval"): "5",
            }),
            &[80],
        )
        .await?;
    let lb = lb_name(&cluster, "web").await?;
    clb_health_becomes(
        &world,
        &lb,
        "HTTP:31555/hz 20/7/4/3 log=Some(true)/Some(\"logs\")/Some(\"a\")/Some(5)",
    )
    .await?;
    annotate(
        &cluster,
        "web",
        json!({
            a("healthcheck-protocol"): "HTTPS",
            a("healthcheck-port"): "31666",
            a("healthcheck-path"): "/ready",
            a("healthcheck-healthy-threshold"): "5",
            a("healthcheck-unhealthy-threshold"): "2",
            a("healthcheck-timeout"): "3",
            a("healthcheck-interval"): "15",
            a("access-log-s3-bucket-prefix"): "b",
            a("access-log-emit-interval"): "60",
        }),
    )
    .await?;
    clb_health_becomes(
        &world,
        &lb,
        "HTTPS:31666/ready 15/3/2/5 log=Some(true)/Some(\"logs\")/Some(\"b\")/Some(60)",
    )
    .await?;
    annotate(&cluster, "web", json!({a("access-log-emit-interval"): "5"})).await?;
    clb_health_becomes(
        &world,
        &lb,
        "HTTPS:31666/ready 15/3/2/5 log=Some(true)/Some(\"logs\")/Some(\"b\")/Some(5)",
    )
    .await?;
    // Removed: upstream's defaults, a TCP check of the first NodePort; logs every 60 minutes
    // (AWS's default) with no prefix.
    annotate(
        &cluster,
        "web",
        json!({
            a("healthcheck-protocol"): null,
            a("healthcheck-port"): null,
            a("healthcheck-path"): null,
            a("healthcheck-healthy-threshold"): null,
            a("healthcheck-unhealthy-threshold"): null,
            a("healthcheck-timeout"): null,
            a("healthcheck-interval"): null,
            a("access-log-s3-bucket-prefix"): null,
            a("access-log-emit-interval"): null,
        }),
    )
    .await?;
    let np = node_port(&cluster, "web").await?;
    clb_health_becomes(
        &world,
        &lb,
        &format!("TCP:{np} 10/5/6/2 log=Some(true)/Some(\"logs\")/None/Some(60)"),
    )
    .await?;
    cluster.stop_ccm().await
}

/// The health check of the target group the NLB's first listener forwards to, and its ARN.
async fn nlb_health(world: &AwsWorld, lb: &str) -> anyhow::Result<Option<(String, String)>> {
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
    let d = world
        .elbv2
        .describe_target_groups()
        .target_group_arns(&tg)
        .send()
        .await?;
    let g = &d.target_groups()[0];
    let targets = world
        .elbv2
        .describe_target_health()
        .target_group_arn(&tg)
        .send()
        .await?
        .target_health_descriptions()
        .len();
    let path = match g.health_check_protocol().map(|p| p.as_str()) {
        Some("TCP") => "",
        _ => g.health_check_path().unwrap_or_default(),
    };
    Ok(Some((
        tg.clone(),
        format!(
            "{}:{}{} {}/{}/{} targets={targets}",
            g.health_check_protocol()
                .map(|p| p.as_str())
                .unwrap_or_default(),
            g.health_check_port().unwrap_or_default(),
            path,
            g.health_check_interval_seconds().unwrap_or_default(),
            g.unhealthy_threshold_count().unwrap_or_default(),
            g.healthy_threshold_count().unwrap_or_default(),
        ),
    )))
}

async fn nlb_health_becomes(world: &AwsWorld, lb: &str, want: &str) -> anyhow::Result<String> {
    wait_for(want, Duration::from_secs(60), || async {
        // A target group replaced between the listener read and the describe is gone
        // (TargetGroupNotFound): a state in between, polled again.
        let s = match nlb_health(world, lb).await {
            Ok(s) => s,
            Err(e) => return Ok(Err(format!("{e:#}"))),
        };
        Ok(match s {
            Some((arn, s)) if s == want => Ok(arn),
            other => Err(format!("{other:?}")),
        })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nlb_health_check_annotations_set_changed_removed() -> anyhow::Result<()> {
    let (world, mut cluster, _) = setup("eu-west-3").await?;
    cluster
        .create_service(
            "api",
            json!({
                a("type"): "nlb",
                a("healthcheck-protocol"): "HTTP",
                a("healthcheck-port"): "31555",
                a("healthcheck-path"): "/hz",
                a("healthcheck-healthy-threshold"): "4",
                a("healthcheck-unhealthy-threshold"): "4",
                a("healthcheck-interval"): "10",
            }),
            &[80],
        )
        .await?;
    let lb = lb_name(&cluster, "api").await?;
    let first = nlb_health_becomes(&world, &lb, "HTTP:31555/hz 10/4/4 targets=2").await?;
    // Port, path and thresholds change in place: the same target group.
    annotate(
        &cluster,
        "api",
        json!({
            a("healthcheck-port"): "31666",
            a("healthcheck-path"): "/ready",
            a("healthcheck-healthy-threshold"): "2",
            a("healthcheck-unhealthy-threshold"): "2",
        }),
    )
    .await?;
    let same = nlb_health_becomes(&world, &lb, "HTTP:31666/ready 10/2/2 targets=2").await?;
    assert_eq!(
        first, same,
        "a target group replaced for an in-place change"
    );
    // The protocol cannot change in place: a new target group, with its targets.
    annotate(&cluster, "api", json!({a("healthcheck-protocol"): "HTTPS"})).await?;
    let https = nlb_health_becomes(&world, &lb, "HTTPS:31666/ready 10/2/2 targets=2").await?;
    assert_ne!(first, https, "the protocol changed in place");
    // Removed: upstream's NLB defaults, TCP on the traffic port 3/3 every 30 s.
    annotate(
        &cluster,
        "api",
        json!({
            a("healthcheck-protocol"): null,
            a("healthcheck-port"): null,
            a("healthcheck-path"): null,
            a("healthcheck-healthy-threshold"): null,
            a("healthcheck-unhealthy-threshold"): null,
            a("healthcheck-interval"): null,
        }),
    )
    .await?;
    nlb_health_becomes(&world, &lb, "TCP:traffic-port 30/3/3 targets=2").await?;
    wait_for("one target group left", Duration::from_secs(60), || async {
        // The region is this test's: every target group in it is this NLB's.
        let n = world
            .elbv2
            .describe_target_groups()
            .send()
            .await?
            .target_groups()
            .len();
        Ok(if n == 1 { Ok(()) } else { Err(format!("{n}")) })
    })
    .await?;
    cluster.stop_ccm().await
}

/// The scheme, cross-zone attribute and `team`/`cost` tags of the Classic ELB and the NLB.
async fn shape(world: &AwsWorld, clb: &str, nlb: &str) -> anyhow::Result<String> {
    let d = world
        .elb
        .describe_load_balancers()
        .load_balancer_names(clb)
        .send()
        .await?;
    let scheme = d.load_balancer_descriptions()[0]
        .scheme()
        .unwrap_or_default()
        .to_string();
    let cross = world
        .elb
        .describe_load_balancer_attributes()
        .load_balancer_name(clb)
        .send()
        .await?
        .load_balancer_attributes()
        .and_then(|a| a.cross_zone_load_balancing())
        .map(|c| c.enabled());
    let tags = world
        .elb
        .describe_tags()
        .load_balancer_names(clb)
        .send()
        .await?;
    let mut clb_tags: Vec<String> = tags
        .tag_descriptions()
        .iter()
        .flat_map(|t| t.tags())
        .filter(|t| ["team", "cost"].contains(&t.key()))
        .map(|t| format!("{}={}", t.key(), t.value().unwrap_or_default()))
        .collect();
    clb_tags.sort();
    let lbs = world
        .elbv2
        .describe_load_balancers()
        .names(nlb)
        .send()
        .await?;
    let n = &lbs.load_balancers()[0];
    let arn = n.load_balancer_arn().unwrap_or_default();
    let n_cross = world
        .elbv2
        .describe_load_balancer_attributes()
        .load_balancer_arn(arn)
        .send()
        .await?
        .attributes()
        .iter()
        .find(|a| a.key() == Some("load_balancing.cross_zone.enabled"))
        .and_then(|a| a.value().map(String::from));
    let tags = world
        .elbv2
        .describe_tags()
        .resource_arns(arn)
        .send()
        .await?;
    let mut nlb_tags: Vec<String> = tags
        .tag_descriptions()
        .iter()
        .flat_map(|t| t.tags())
        .filter(|t| t.key().is_some_and(|k| ["team", "cost"].contains(&k)))
        .map(|t| {
            format!(
                "{}={}",
                t.key().unwrap_or_default(),
                t.value().unwrap_or_default()
            )
        })
        .collect();
    nlb_tags.sort();
    Ok(format!(
        "clb {scheme} cross={cross:?} {clb_tags:?}; nlb {} cross={n_cross:?} {nlb_tags:?}",
        n.scheme().map(|s| s.as_str()).unwrap_or_default()
    ))
}

async fn shape_becomes(world: &AwsWorld, clb: &str, nlb: &str, want: &str) -> anyhow::Result<()> {
    wait_for(want, Duration::from_secs(60), || async {
        let s = shape(world, clb, nlb)
            .await
            .unwrap_or_else(|e| e.to_string());
        Ok(if s == want { Ok(()) } else { Err(s) })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheme_cross_zone_and_tags_set_changed_removed() -> anyhow::Result<()> {
    let (world, mut cluster, _) = setup("ap-southeast-1").await?;
    let set = json!({
        a("internal"): "true",
        a("cross-zone-load-balancing-enabled"): "true",
        a("additional-resource-tags"): "team=a,cost=1",
    });
    cluster.create_service("web", set.clone(), &[80]).await?;
    let mut nlb_set = set.clone();
    nlb_set[a("type")] = json!("nlb");
    cluster.create_service("api", nlb_set, &[80]).await?;
    let (clb, nlb) = (
        lb_name(&cluster, "web").await?,
        lb_name(&cluster, "api").await?,
    );
    let tags = "[\"cost=1\", \"team=a\"]";
    shape_becomes(
        &world,
        &clb,
        &nlb,
        &format!("clb internal cross=Some(true) {tags}; nlb internal cross=Some(\"true\") {tags}"),
    )
    .await?;

    // Changed: cross-zone and tags follow; the scheme cannot change on AWS, so it stays and
    // the Service gets a Warning naming the annotation.
    let changed = json!({
        a("internal"): "false",
        a("cross-zone-load-balancing-enabled"): "false",
        a("additional-resource-tags"): "team=b",
    });
    annotate(&cluster, "web", changed.clone()).await?;
    annotate(&cluster, "api", changed).await?;
    // A tag no longer in the annotation stays (as upstream: nothing tells it from another's).
    let tags = "[\"cost=1\", \"team=b\"]";
    shape_becomes(
        &world,
        &clb,
        &nlb,
        &format!(
            "clb internal cross=Some(false) {tags}; nlb internal cross=Some(\"false\") {tags}"
        ),
    )
    .await?;
    warned(&cluster, &[&a("internal"), "cannot change the scheme"]).await?;
    let on = json!({a("cross-zone-load-balancing-enabled"): "true"});
    annotate(&cluster, "web", on.clone()).await?;
    annotate(&cluster, "api", on).await?;
    shape_becomes(
        &world,
        &clb,
        &nlb,
        &format!("clb internal cross=Some(true) {tags}; nlb internal cross=Some(\"true\") {tags}"),
    )
    .await?;

    // Removed: cross-zone back to upstream's default (off); tags and scheme stay.
    let removed = json!({
        a("internal"): null,
        a("cross-zone-load-balancing-enabled"): null,
        a("additional-resource-tags"): null,
    });
    annotate(&cluster, "web", removed.clone()).await?;
    annotate(&cluster, "api", removed).await?;
    shape_becomes(
        &world,
        &clb,
        &nlb,
        &format!(
            "clb internal cross=Some(false) {tags}; nlb internal cross=Some(\"false\") {tags}"
        ),
    )
    .await?;
    cluster.stop_ccm().await
}

/// A security group of the VPC not tagged for the cluster (a user's).
async fn user_group(world: &AwsWorld, name: &str) -> anyhow::Result<String> {
    Ok(world
        .ec2
        .create_security_group()
        .vpc_id(&world.vpc)
        .group_name(name)
        .description("users")
        .send()
        .await?
        .group_id
        .unwrap_or_default())
}

/// The groups `group` admits traffic from, and its CIDR rules, as text.
async fn admits(world: &AwsWorld, group: &str) -> anyhow::Result<Vec<String>> {
    let d = world
        .ec2
        .describe_security_groups()
        .group_ids(group)
        .send()
        .await?;
    let mut out: Vec<String> = d
        .security_groups()
        .iter()
        .flat_map(|g| g.ip_permissions())
        .flat_map(|p| {
            let proto = p.ip_protocol().unwrap_or_default().to_string();
            p.user_id_group_pairs()
                .iter()
                .filter_map(|u| u.group_id().map(String::from))
                .chain(
                    p.ip_ranges()
                        .iter()
                        .filter_map(|r| r.cidr_ip().map(|c| format!("{proto} {c}"))),
                )
                .collect::<Vec<_>>()
        })
        .collect();
    out.sort();
    Ok(out)
}

async fn elb_groups(world: &AwsWorld, lb: &str) -> anyhow::Result<Vec<String>> {
    let d = world
        .elb
        .describe_load_balancers()
        .load_balancer_names(lb)
        .send()
        .await?;
    let mut g = d.load_balancer_descriptions()[0].security_groups().to_vec();
    g.sort();
    Ok(g)
}

/// Waits until the ELB has exactly `groups` and the node group admits exactly `from`.
async fn groups_become(
    world: &AwsWorld,
    lb: &str,
    groups: &[&str],
    from: &[&str],
) -> anyhow::Result<()> {
    let mut groups: Vec<String> = groups.iter().map(|s| s.to_string()).collect();
    groups.sort();
    let mut from: Vec<String> = from.iter().map(|s| s.to_string()).collect();
    from.sort();
    wait_for(
        &format!("ELB groups {groups:?}, nodes admitting {from:?}"),
        Duration::from_secs(60),
        || async {
            let have = (
                elb_groups(world, lb).await.unwrap_or_default(),
                admits(world, &world.node_sg).await?,
            );
            Ok(if have == (groups.clone(), from.clone()) {
                Ok(())
            } else {
                Err(format!("{have:?}"))
            })
        },
    )
    .await
}

/// The id of the ELB's own group `k8s-elb-<lb>`, once it exists.
async fn own_group(world: &AwsWorld, lb: &str) -> anyhow::Result<String> {
    wait_for("the ELB's own group", Duration::from_secs(60), || async {
        let d = world
            .ec2
            .describe_security_groups()
            .filters(
                aws_sdk_ec2::types::Filter::builder()
                    .name("group-name")
                    .values(format!("k8s-elb-{lb}"))
                    .build(),
            )
            .send()
            .await?;
        Ok(
            match d.security_groups().first().and_then(|g| g.group_id()) {
                Some(id) => Ok(id.to_string()),
                None => Err("none".to_string()),
            },
        )
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_elb_security_group_annotations_set_changed_removed() -> anyhow::Result<()> {
    let (world, mut cluster, _) = setup("sa-east-1").await?;
    let (sg_a, sg_b, sg_x) = (
        user_group(&world, "a").await?,
        user_group(&world, "b").await?,
        user_group(&world, "x").await?,
    );
    // A user's database group admitting group a: never the provider's to edit.
    let db = user_group(&world, "db").await?;
    world
        .ec2
        .authorize_security_group_ingress()
        .group_id(&db)
        .ip_permissions(
            aws_sdk_ec2::types::IpPermission::builder()
                .ip_protocol("tcp")
                .from_port(5432)
                .to_port(5432)
                .user_id_group_pairs(
                    aws_sdk_ec2::types::UserIdGroupPair::builder()
                        .group_id(&sg_a)
                        .build(),
                )
                .build(),
        )
        .send()
        .await?;
    cluster
        .create_service("web", json!({a("security-groups"): sg_a}), &[80])
        .await?;
    let lb = lb_name(&cluster, "web").await?;
    // The annotation's group instead of one of its own; the nodes admit it; its own ingress
    // is the user's (none).
    groups_become(&world, &lb, &[&sg_a], &[&sg_a]).await?;
    assert!(admits(&world, &sg_a).await?.is_empty());

    annotate(
        &cluster,
        "web",
        json!({a("security-groups"): format!("{sg_b}"), a("extra-security-groups"): sg_x}),
    )
    .await?;
    // The extra group is attached, but the nodes admit only the first.
    groups_become(&world, &lb, &[&sg_b, &sg_x], &[&sg_b]).await?;
    annotate(&cluster, "web", json!({a("extra-security-groups"): null})).await?;
    groups_become(&world, &lb, &[&sg_b], &[&sg_b]).await?;

    annotate(&cluster, "web", json!({a("security-groups"): null})).await?;
    let own = own_group(&world, &lb).await?;
    groups_become(&world, &lb, &[&own], &[&own]).await?;
    // Its own group admits the listener from everywhere (and path-MTU ICMP).
    assert_eq!(
        admits(&world, &own).await?,
        vec!["icmp 0.0.0.0/0".to_string(), "tcp 0.0.0.0/0".to_string()]
    );
    assert_eq!(
        admits(&world, &db).await?,
        vec![sg_a.clone()],
        "db group edited"
    );
    for g in [&sg_a, &sg_b, &sg_x] {
        assert!(admits(&world, g).await?.is_empty(), "{g} edited");
    }
    cluster.stop_ccm().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elb_security_group_of_the_cloud_config_set_changed_removed() -> anyhow::Result<()> {
    let world = AwsWorld::create(Moto::shared(), "ap-northeast-3").await?;
    world.with_internet_gateway().await?;
    let instances = world.run_instances(2, 0).await?;
    let (sg_c, sg_d) = (
        user_group(&world, "c").await?,
        user_group(&world, "d").await?,
    );
    let provider = |group: Option<&String>| {
        let mut cfg = common::cloud_config(&world.url);
        cfg.elb_security_group = group.cloned();
        let region = world.region.clone();
        async move {
            ccm_provider_aws::AwsCloud::with_sdk_config(cfg, common::sdk_config(&region).await)
        }
    };
    let mut cluster = Cluster::start().await?;
    cluster.start_ccm(provider(Some(&sg_c)).await, &[]).await?;
    for (i, (_, dns)) in instances.iter().enumerate() {
        cluster.add_node(dns, &pod_cidr(i)).await?;
    }
    cluster.create_service("web", json!({}), &[80]).await?;
    let lb = lb_name(&cluster, "web").await?;
    groups_become(&world, &lb, &[&sg_c], &[&sg_c]).await?;
    assert!(
        admits(&world, &sg_c).await?.is_empty(),
        "ElbSecurityGroup edited"
    );

    // Changed: the CCM restarted with another group; the ELB moves to it on its sync.
    cluster.stop_ccm().await?;
    cluster.start_ccm(provider(Some(&sg_d)).await, &[]).await?;
    groups_become(&world, &lb, &[&sg_d], &[&sg_d]).await?;

    // Removed: a group of its own.
    cluster.stop_ccm().await?;
    cluster.start_ccm(provider(None).await, &[]).await?;
    let own = own_group(&world, &lb).await?;
    groups_become(&world, &lb, &[&own], &[&own]).await?;
    for g in [&sg_c, &sg_d] {
        assert!(admits(&world, g).await?.is_empty(), "{g} edited");
    }
    cluster.stop_ccm().await
}

/// The (subnet, allocation or address) pairs of each recorded `CreateLoadBalancer` of an NLB.
fn nlb_creations(calls: &[(String, String)]) -> Vec<Vec<(String, String)>> {
    let mut out = Vec::new();
    for (action, body) in calls {
        if action != "CreateLoadBalancer" || !body.contains("Type=network") {
            continue;
        }
        let p: std::collections::BTreeMap<String, String> = body
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.replace("%2F", "/")))
            .collect();
        let mut mappings = Vec::new();
        for i in 1.. {
            let Some(subnet) = p.get(&format!("SubnetMappings.member.{i}.SubnetId")) else {
                break;
            };
            let value = p
                .get(&format!("SubnetMappings.member.{i}.AllocationId"))
                .or(p.get(&format!("SubnetMappings.member.{i}.PrivateIPv4Address")))
                .cloned()
                .unwrap_or_default();
            mappings.push((subnet.clone(), value));
        }
        mappings.sort();
        out.push(mappings);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nlb_subnet_addresses_are_set_at_creation_only() -> anyhow::Result<()> {
    // A moto of its own: its recorder must hold this test's calls only.
    let moto = Moto::start();
    let world = AwsWorld::create(&moto, "us-east-1").await?;
    world.with_internet_gateway().await?;
    let instances = world.run_instances(2, 0).await?;
    let mut cluster = Cluster::start().await?;
    cluster.start_ccm(world.provider().await, &[]).await?;
    for (i, (_, dns)) in instances.iter().enumerate() {
        cluster.add_node(dns, &pod_cidr(i)).await?;
    }
    moto.start_recording().await;
    let mut eips = Vec::new();
    for _ in 0..2 {
        eips.push(
            world
                .ec2
                .allocate_address()
                .domain(aws_sdk_ec2::types::DomainType::Vpc)
                .send()
                .await?
                .allocation_id
                .unwrap_or_default(),
        );
    }
    let (s0, s1) = (world.subnets[0].clone(), world.subnets[1].clone());
    // Subnets in zone order (a, b), as the subnets annotation gives them.
    let subnets = format!("{s0},{s1}");
    cluster
        .create_service(
            "pub",
            json!({a("type"): "nlb", a("subnets"): subnets, a("eip-allocations"): eips.join(",")}),
            &[80],
        )
        .await?;
    cluster
        .create_service(
            "priv",
            json!({a("type"): "nlb", a("internal"): "true", a("subnets"): subnets,
                a("private-ipv4-addresses"): "10.0.0.10,10.0.16.10"}),
            &[80],
        )
        .await?;
    // One allocation for two subnets: refused naming the annotation, as upstream.
    cluster
        .create_service(
            "short",
            json!({a("type"): "nlb", a("eip-allocations"): eips[0]}),
            &[80],
        )
        .await?;
    let mut want = vec![
        vec![(s0.clone(), eips[0].clone()), (s1.clone(), eips[1].clone())],
        vec![
            (s0.clone(), "10.0.0.10".to_string()),
            (s1.clone(), "10.0.16.10".to_string()),
        ],
    ];
    for w in &mut want {
        w.sort();
    }
    want.sort();
    wait_for("both NLBs created", Duration::from_secs(60), || async {
        let mut have = nlb_creations(&moto.recorded_calls().await);
        have.sort();
        Ok(if have == want {
            Ok(())
        } else {
            Err(format!("{have:?}"))
        })
    })
    .await?;
    warned(&cluster, &[&a("eip-allocations"), "same number of entries"]).await?;
    let arns = |world: &AwsWorld| {
        let elbv2 = world.elbv2.clone();
        async move {
            let d = elbv2.describe_load_balancers().send().await?;
            let mut v: Vec<String> = d
                .load_balancers()
                .iter()
                .filter_map(|l| l.load_balancer_arn().map(String::from))
                .collect();
            v.sort();
            anyhow::Ok(v)
        }
    };
    let before = arns(&world).await?;
    assert_eq!(before.len(), 2, "{before:?}");

    // Changed, then removed: AWS fixes an NLB subnet's addresses at creation, and neither
    // ccm-rs nor upstream re-creates the NLB for them — the same NLBs, no other creation.
    annotate(
        &cluster,
        "pub",
        json!({a("eip-allocations"): format!("{},{}", eips[1], eips[0])}),
    )
    .await?;
    annotate(
        &cluster,
        "priv",
        json!({a("private-ipv4-addresses"): "10.0.0.11,10.0.16.11"}),
    )
    .await?;
    annotate(&cluster, "pub", json!({a("eip-allocations"): null})).await?;
    annotate(&cluster, "priv", json!({a("private-ipv4-addresses"): null})).await?;
    // A node joins: the controller syncs both again.
    let joined = world.run_instances(1, 1).await?;
    cluster.add_node(&joined[0].1, &pod_cidr(2)).await?;
    wait_for(
        "the new node behind both NLBs",
        Duration::from_secs(60),
        || async {
            let tgs = world.elbv2.describe_target_groups().send().await?;
            let mut counts = Vec::new();
            for g in tgs.target_groups() {
                counts.push(
                    world
                        .elbv2
                        .describe_target_health()
                        .target_group_arn(g.target_group_arn().unwrap_or_default())
                        .send()
                        .await?
                        .target_health_descriptions()
                        .len(),
                );
            }
            Ok(if counts == vec![3, 3] {
                Ok(())
            } else {
                Err(format!("{counts:?}"))
            })
        },
    )
    .await?;
    assert_eq!(arns(&world).await?, before);
    assert_eq!(nlb_creations(&moto.recorded_calls().await).len(), 2);
    cluster.stop_ccm().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_group_ip_address_type_set_changed_removed() -> anyhow::Result<()> {
    let (world, mut cluster, _) = setup("eu-south-1").await?;
    world
        .ec2
        .associate_vpc_cidr_block()
        .vpc_id(&world.vpc)
        .amazon_provided_ipv6_cidr_block(true)
        .send()
        .await?;
    let tg_ip = a("target-group-ip-address-type");
    cluster
        .create_service(
            "api",
            json!({a("type"): "nlb", a("ip-address-type"): "dualstack", &tg_ip: "ipv6"}),
            &[80],
        )
        .await?;
    let lb = lb_name(&cluster, "api").await?;
    // The NLB's address type, and its target groups' (in this test's region: all the NLB's).
    let state = || async {
        let d = world
            .elbv2
            .describe_load_balancers()
            .names(&lb)
            .send()
            .await?;
        let lb_ip = d.load_balancers()[0]
            .ip_address_type()
            .map(|t| t.as_str().to_string())
            .unwrap_or_default();
        let tgs = world.elbv2.describe_target_groups().send().await?;
        let mut out = vec![lb_ip];
        for g in tgs.target_groups() {
            let n = world
                .elbv2
                .describe_target_health()
                .target_group_arn(g.target_group_arn().unwrap_or_default())
                .send()
                .await?
                .target_health_descriptions()
                .len();
            out.push(format!(
                "{} targets={n}",
                g.ip_address_type().map(|t| t.as_str()).unwrap_or("ipv4")
            ));
        }
        anyhow::Ok(out.join(" "))
    };
    let becomes = |want: &'static str| {
        let state = &state;
        async move {
            wait_for(want, Duration::from_secs(60), || async {
                let s = state().await.unwrap_or_else(|e| e.to_string());
                Ok(if s == want { Ok(()) } else { Err(s) })
            })
            .await
        }
    };
    becomes("dualstack ipv6 targets=2").await?;
    annotate(&cluster, "api", json!({&tg_ip: "ipv4"})).await?;
    becomes("dualstack ipv4 targets=2").await?;
    annotate(&cluster, "api", json!({&tg_ip: "ipv6"})).await?;
    becomes("dualstack ipv6 targets=2").await?;
    // Removed: an IPv4 Service's default, IPv4 targets.
    annotate(&cluster, "api", json!({&tg_ip: null})).await?;
    becomes("dualstack ipv4 targets=2").await?;
    cluster.stop_ccm().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_ports_get_udp_listeners_with_tcp_health_checks() -> anyhow::Result<()> {
    let (world, mut cluster, _) = setup("us-east-2").await?;
    let udp = |port: i32| json!({"name": format!("u{port}"), "port": port, "targetPort": 5353, "protocol": "UDP"});
    create_raw(
        &cluster,
        "dns",
        json!({a("type"): "nlb"}),
        json!({"ports": [udp(53)]}),
    )
    .await?;
    let lb = lb_name(&cluster, "dns").await?;
    let np = node_port(&cluster, "dns").await?;
    let listener = || async {
        let d = world
            .elbv2
            .describe_load_balancers()
            .names(&lb)
            .send()
            .await?;
        let arn = d.load_balancers()[0]
            .load_balancer_arn()
            .unwrap_or_default()
            .to_string();
        let l = world
            .elbv2
            .describe_listeners()
            .load_balancer_arn(&arn)
            .send()
            .await?;
        let Some(l) = l.listeners().first() else {
            return anyhow::Ok(String::new());
        };
        let tg = l
            .default_actions()
            .first()
            .and_then(|a| a.target_group_arn())
            .unwrap_or_default();
        let g = world
            .elbv2
            .describe_target_groups()
            .target_group_arns(tg)
            .send()
            .await?;
        let g = &g.target_groups()[0];
        Ok(format!(
            "{}:{:?} -> {:?}:{:?} health {:?}:{:?}",
            l.port().unwrap_or_default(),
            l.protocol().map(|p| p.as_str()),
            g.protocol().map(|p| p.as_str()),
            g.port(),
            g.health_check_protocol().map(|p| p.as_str()),
            g.health_check_port(),
        ))
    };
    let want = format!(
        "53:Some(\"UDP\") -> Some(\"UDP\"):Some({np}) health Some(\"TCP\"):Some(\"traffic-port\")"
    );
    wait_for("a UDP listener", Duration::from_secs(60), || async {
        let have = listener().await.unwrap_or_else(|e| e.to_string());
        Ok(if have == want { Ok(()) } else { Err(have) })
    })
    .await?;
    // Clients by UDP from anywhere, the VPC's health checks by TCP (a UDP rule admits none).
    let vpc_cidr = "10.0.0.0/16";
    wait_for(
        "UDP client and TCP health rules",
        Duration::from_secs(60),
        || async {
            let have = admits(&world, &world.node_sg).await?;
            let want = vec![
                "icmp 0.0.0.0/0".to_string(),
                format!("tcp {vpc_cidr}"),
                "udp 0.0.0.0/0".to_string(),
            ];
            Ok(if have == want {
                Ok(())
            } else {
                Err(format!("{have:?}"))
            })
        },
    )
    .await?;
    cluster.stop_ccm().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_service_fields_warn_and_the_backends_still_follow_the_nodes() -> anyhow::Result<()>
{
    let (world, mut cluster, _) = setup("eu-central-2").await?;
    let port = |p: i32, proto: &str| json!({"name": format!("{}{p}", proto.to_lowercase()), "port": p, "targetPort": 8080, "protocol": proto});
    // Refused at creation, each naming the field: no load balancer for them.
    create_raw(
        &cluster,
        "mixed",
        json!({a("type"): "nlb"}),
        json!({"ports": [port(53, "TCP"), port(53, "UDP")]}),
    )
    .await?;
    create_raw(
        &cluster,
        "udp-clb",
        json!({}),
        json!({"ports": [port(53, "UDP")]}),
    )
    .await?;
    warned(&cluster, &["spec.ports", "mixed protocol"]).await?;
    warned(&cluster, &["spec.ports", "Protocol UDP not supported"]).await?;

    // Existing load balancers whose Services then ask for what AWS ELBs cannot do.
    cluster.create_service("web", json!({}), &[80]).await?;
    cluster
        .create_service("api", json!({a("type"): "nlb"}), &[80])
        .await?;
    let (clb, nlb) = (
        lb_name(&cluster, "web").await?,
        lb_name(&cluster, "api").await?,
    );
    let backends = || async {
        let d = world
            .elb
            .describe_load_balancers()
            .load_balancer_names(&clb)
            .send()
            .await;
        let instances = d
            .ok()
            .map(|d| d.load_balancer_descriptions()[0].instances().len());
        let lbs = world
            .elbv2
            .describe_load_balancers()
            .names(&nlb)
            .send()
            .await;
        let mut targets = None;
        if let Ok(lbs) = lbs {
            let arn = lbs.load_balancers()[0]
                .load_balancer_arn()
                .unwrap_or_default()
                .to_string();
            let tgs = world
                .elbv2
                .describe_target_groups()
                .load_balancer_arn(&arn)
                .send()
                .await;
            if let Some(tg) = tgs
                .ok()
                .and_then(|t| t.target_groups().first().cloned())
                .and_then(|t| t.target_group_arn().map(String::from))
            {
                targets = Some(
                    world
                        .elbv2
                        .describe_target_health()
                        .target_group_arn(tg)
                        .send()
                        .await?
                        .target_health_descriptions()
                        .len(),
                );
            }
        }
        anyhow::Ok((instances, targets))
    };
    let wait_backends = |n: usize| {
        let backends = &backends;
        async move {
            wait_for(
                &format!("{n} backends on both LBs"),
                Duration::from_secs(60),
                || async {
                    let have = backends().await?;
                    Ok(if have == (Some(n), Some(n)) {
                        Ok(())
                    } else {
                        Err(format!("{have:?}"))
                    })
                },
            )
            .await
        }
    };
    wait_backends(2).await?;
    let api: Api<Service> = Api::namespaced(cluster.client.clone(), "default");
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"sessionAffinity": "ClientIP"}})),
    )
    .await?;
    api.patch(
        "api",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"loadBalancerIP": "203.0.113.7"}})),
    )
    .await?;
    warned(&cluster, &["spec.sessionAffinity", "ClientIP"]).await?;
    warned(&cluster, &["spec.loadBalancerIP"]).await?;
    let joined = world.run_instances(1, 1).await?;
    cluster.add_node(&joined[0].1, &pod_cidr(2)).await?;
    wait_backends(3).await?;
    for name in ["mixed", "udp-clb"] {
        let svc = cluster.service(name).await?;
        let ingress = svc
            .and_then(|s| s.status)
            .and_then(|s| s.load_balancer)
            .and_then(|l| l.ingress)
            .unwrap_or_default();
        assert!(ingress.is_empty(), "{name} got a load balancer");
    }
    cluster.stop_ccm().await
}
