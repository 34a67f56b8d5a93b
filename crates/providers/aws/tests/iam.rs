//! The IAM policy docs/providers/aws.md lists is exactly what the provider needs: moto with IAM
//! enforcement on (`INITIAL_NO_AUTH_ACTION_COUNT`: the setup's calls go through, every later
//! call is signed, checked and authorised against IAM), the CCM running under a user that holds
//! only that policy — read from the doc itself, so a missing action there fails here — brings
//! up Nodes, routes and an NLB and deletes the NLB. And the list names exactly the actions the
//! provider's source calls (as the RBAC exactness test does for Kubernetes permissions).
//!
//! Not covered: the Classic ELB path. Under enforcement moto answers any request with a space
//! in a parameter value with `AuthFailure` (its signature check disagrees with the SDK's; a
//! probe: `CreateSecurityGroup` with description "plain" passes, "with space" fails), and the
//! Classic ELB's security-group description has spaces. That is moto, not a missing action.

mod common;

use std::time::Duration;

use anyhow::Context as _;
use aws_config::{BehaviorVersion, Region};
use ccm_controllers::nodeutil::{TAINT_UNINITIALIZED, has_taint};
use ccm_provider_aws::AwsCloud;
use common::{AwsWorld, Cluster, Moto, cloud_config, pod_cidr, wait_for};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Calls the setup makes before enforcement starts: the world (VPC, 2 subnets, route table,
/// security group), its internet gateway (create, attach, find the main route table, default
/// route: an internet-facing NLB goes only into public subnets), 2 `RunInstances`, and 3 IAM
/// calls for the CCM's user.
const SETUP_CALLS: &str = "14";
const NODES: usize = 4;

/// The JSON block under "## IAM policy" in docs/providers/aws.md.
fn documented_policy() -> anyhow::Result<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../docs/providers/aws.md"
    );
    let doc = std::fs::read_to_string(path)?;
    let section = doc
        .split("\n## IAM policy")
        .nth(1)
        .context("IAM policy section")?;
    let block = section.split("```json\n").nth(1).context("json block")?;
    let json = block.split("\n```").next().context("end of block")?;
    serde_json::from_str::<serde_json::Value>(json).context("the documented policy is JSON")?;
    Ok(json.to_string())
}

fn form_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One IAM query call during the unauthenticated setup window (moto checks no signature
/// then; the Authorization header only routes the request to IAM).
async fn iam(url: &str, params: &[(&str, &str)]) -> anyhow::Result<String> {
    let host = url.strip_prefix("http://").context("http url")?;
    let mut body = String::from("Version=2010-05-08");
    for (k, v) in params {
        body += &format!("&{k}={}", form_encode(v));
    }
    let req = format!(
        "POST / HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Authorization: AWS4-HMAC-SHA256 Credential=setup/20260101/us-east-1/iam/aws4_request, SignedHeaders=host, Signature=0\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut s = tokio::net::TcpStream::connect(host).await?;
    s.write_all(req.as_bytes()).await?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await?;
    let text = String::from_utf8_lossy(&out).to_string();
    anyhow::ensure!(text.starts_with("HTTP/1.1 200"), "IAM {params:?}: {text}");
    Ok(text)
}

fn xml(text: &str, tag: &str) -> anyhow::Result<String> {
    let start = format!("<{tag}>");
    let v = text
        .split(&start)
        .nth(1)
        .and_then(|r| r.split(&format!("</{tag}>")).next());
    v.map(String::from)
        .with_context(|| format!("no {tag} in {text}"))
}

async fn sdk_as(region: &str, key: &str, secret: &str) -> aws_config::SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(region.to_string()))
        .credentials_provider(aws_sdk_ec2::config::Credentials::new(
            key, secret, None, None, "iam-user",
        ))
        .http_client(ccm_provider_aws::https_client())
        .load()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_policy_is_enough_under_iam_enforcement() -> anyhow::Result<()> {
    let policy = documented_policy()?;
    let region = "us-east-1";
    let moto = Moto::start_with_env(&[("INITIAL_NO_AUTH_ACTION_COUNT", SETUP_CALLS)]);
    let world = AwsWorld::create(&moto, region).await?;
    world.with_internet_gateway().await?;
    let mut instances = world.run_instances(NODES as i32 / 2, 0).await?;
    instances.extend(world.run_instances(NODES as i32 / 2, 1).await?);
    iam(&moto.url, &[("Action", "CreateUser"), ("UserName", "ccm")]).await?;
    iam(
        &moto.url,
        &[
            ("Action", "PutUserPolicy"),
            ("UserName", "ccm"),
            ("PolicyName", "ccm-rs"),
            ("PolicyDocument", &policy),
        ],
    )
    .await?;
    let key = iam(
        &moto.url,
        &[("Action", "CreateAccessKey"), ("UserName", "ccm")],
    )
    .await?;
    let sdk = sdk_as(
        region,
        &xml(&key, "AccessKeyId")?,
        &xml(&key, "SecretAccessKey")?,
    )
    .await;

    // Enforcement is on: the setup's credentials are refused, and the CCM's user may do only
    // what the policy allows.
    let ec2 = aws_sdk_ec2::Client::from_conf(
        aws_sdk_ec2::config::Builder::from(&sdk)
            .endpoint_url(&moto.url)
            .build(),
    );
    let elbv2 = aws_sdk_elasticloadbalancingv2::Client::from_conf(
        aws_sdk_elasticloadbalancingv2::config::Builder::from(&sdk)
            .endpoint_url(&moto.url)
            .build(),
    );
    assert!(
        world.ec2.describe_vpcs().send().await.is_err(),
        "enforcement is off"
    );
    let denied = ec2.create_vpc().cidr_block("10.9.0.0/16").send().await;
    let code = denied
        .as_ref()
        .err()
        .and_then(|e| e.as_service_error())
        .and_then(|e| aws_sdk_ec2::error::ProvideErrorMetadata::code(e).map(String::from));
    assert_eq!(code.as_deref(), Some("AccessDenied"), "{denied:?}");

    let provider = AwsCloud::with_sdk_config(cloud_config(&moto.url), sdk.clone());
    let mut cluster = Cluster::start().await?;
    cluster.start_ccm(provider.clone(), &[]).await?;
    for (i, (_, dns)) in instances.iter().enumerate() {
        cluster.add_node(dns, &pod_cidr(i)).await?;
    }
    cluster
        .create_service(
            "nlb",
            json!({"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"}),
            &[443],
        )
        .await?;
    let metrics = || {
        let mut registry = prometheus_client::registry::Registry::default();
        provider.metrics().register(&mut registry);
        let mut text = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        text.lines()
            .filter(|l| l.starts_with("cloudprovider_aws_api_request_errors{"))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let ingress = |svc: Option<k8s_openapi::api::core::v1::Service>| {
        svc.and_then(|s| s.status)
            .and_then(|s| s.load_balancer)
            .and_then(|l| l.ingress)
            .is_some_and(|i| !i.is_empty())
    };
    wait_for("nodes, routes and the NLB under the documented policy", Duration::from_secs(90), || async {
        let nodes = cluster.nodes().await?;
        let init = nodes.iter().filter(|n| !has_taint(n, TAINT_UNINITIALIZED)).count();
        let tables = ec2.describe_route_tables().route_table_ids(&world.route_table).send().await?;
        let routes = tables.route_tables().iter().flat_map(|t| t.routes()).filter(|r| r.instance_id().is_some()).count();
        let nlb = ingress(cluster.service("nlb").await?);
        Ok(if init == NODES && routes == NODES && nlb {
            Ok(())
        } else {
            let events = kube::Api::<k8s_openapi::api::core::v1::Event>::all(cluster.client.clone())
                .list(&Default::default())
                .await?;
            let warnings: Vec<String> = events
                .items
                .iter()
                .filter(|e| e.type_.as_deref() == Some("Warning"))
                .filter_map(|e| e.message.clone())
                .collect();
            Err(format!("{init}/{NODES} initialized, {routes} routes, NLB {nlb}; AWS errors: {}; warnings: {warnings:?}", metrics()))
        })
    })
    .await?;

    cluster.delete_service("nlb").await?;
    wait_for(
        "the NLB deleted under the documented policy",
        Duration::from_secs(60),
        || async {
            let nlbs = elbv2
                .describe_load_balancers()
                .send()
                .await?
                .load_balancers()
                .len();
            let gone = cluster.service("nlb").await?.is_none();
            Ok(if nlbs == 0 && gone {
                Ok(())
            } else {
                Err(format!(
                    "{nlbs} NLBs left, Service gone: {gone}; AWS errors: {}",
                    metrics()
                ))
            })
        },
    )
    .await?;
    cluster.stop_ccm().await
}

/// The AWS actions the provider's source calls: the action names its metered call wrappers
/// (`call("…")`, `call_raw("…")`) are given.
fn called_actions() -> anyhow::Result<std::collections::BTreeSet<String>> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
    let mut out = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "rs") || path.ends_with("mocked.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        for marker in [".call(", ".call_raw("] {
            for rest in text.split(marker).skip(1) {
                let rest = rest.trim_start();
                if let Some(quoted) = rest.strip_prefix('"')
                    && let Some(name) = quoted.split('"').next()
                    && name.chars().all(|c| c.is_ascii_alphanumeric())
                {
                    out.insert(name.to_string());
                }
            }
        }
    }
    Ok(out)
}

#[test]
fn the_documented_policy_names_exactly_the_actions_the_source_calls() -> anyhow::Result<()> {
    let policy: serde_json::Value = serde_json::from_str(&documented_policy()?)?;
    let documented: std::collections::BTreeSet<String> = policy["Statement"]
        .as_array()
        .context("statements")?
        .iter()
        .flat_map(|s| s["Action"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| {
            a.as_str()
                .and_then(|a| a.split_once(':'))
                .map(|(_, n)| n.to_string())
        })
        .collect();
    let called = called_actions()?;
    assert!(called.len() > 20, "source scan found {called:?}");
    let missing: Vec<_> = called.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "called but not in the documented policy: {missing:?}"
    );
    // Tagging at creation (TagSpecifications / Tags) needs these without a call of its own.
    let tag_on_create = ["AddTags", "CreateTags"].map(String::from);
    let unused: Vec<_> = documented
        .difference(&called)
        .filter(|a| !tag_on_create.contains(a))
        .collect();
    assert!(
        unused.is_empty(),
        "in the documented policy but never called: {unused:?}"
    );
    Ok(())
}
