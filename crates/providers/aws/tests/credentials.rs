//! Credentials reach no log line and no error. The provider is built the way `ccm
//! --cloud-provider=aws` builds it (registry, cloud-config file, the SDK's default chain reading
//! the environment, a role to assume through STS), logs through the CCM's own logging at its
//! most verbose (`RUST_LOG=trace`: every SDK line, request signing included), and makes calls
//! that succeed and calls that fail against moto. The secret key, the session token and the
//! assumed role's credentials appear nowhere in what it printed.
//!
//! The environment belongs to the whole process, so the provider runs in a child: this test
//! binary re-executed with the credentials in its environment and only [`child`] selected.

mod common;

use std::process::Command;
use std::sync::Arc;

use ccm_cloud::{CloudProvider, InitContext, ProviderRegistry};
use common::Moto;
use k8s_openapi::api::core::v1::{Node, NodeSpec, Service, ServicePort, ServiceSpec};
use kube::api::ObjectMeta;

const ACCESS_KEY: &str = "AKIACCMTESTACCESSKEY";
const SECRET_KEY: &str = "ccmTestSecretKeyMustNeverBeLogged0123456";
const SESSION_TOKEN: &str = "ccmTestSessionTokenMustNeverBeLogged987654";
/// Set in the child's environment to moto's URL; the child test does nothing without it.
const CHILD_ENV: &str = "CCM_AWS_CREDENTIALS_CHILD_MOTO";
/// Prefix of the lines where the child prints each call's outcome.
const OUTCOME: &str = "call outcome:";

#[test]
fn credentials_reach_no_log_line_and_no_error() {
    let moto = Moto::start();
    let exe = std::env::current_exe().expect("test binary path");
    let out = Command::new(exe)
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, &moto.url)
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_SESSION_TOKEN", SESSION_TOKEN)
        .env("RUST_LOG", "trace")
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_ROLE_ARN")
        .env_remove("AWS_WEB_IDENTITY_TOKEN_FILE")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .expect("re-running the test binary");
    let printed = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the child failed:\n{printed}");

    // The run was real: the SDK logged at trace level on its way to signing requests, assumed
    // the role through STS, and the calls came back (failures included).
    for evidence in ["modify_before_signing", "STS.AssumeRole", "error text"] {
        assert!(
            printed.contains(evidence),
            "nothing in the child's output mentions {evidence:?}: the check would prove nothing"
        );
    }
    let outcomes = printed.lines().filter(|l| l.contains(OUTCOME)).count();
    assert!(
        outcomes >= 4,
        "{outcomes} call outcomes printed:\n{printed}"
    );

    for secret in [
        SECRET_KEY,
        SESSION_TOKEN,
        "<SecretAccessKey>",
        "<SessionToken>",
    ] {
        assert!(
            !printed.contains(secret),
            "{secret:?} appears in the provider's output"
        );
    }
}

/// The provider side; runs only as the re-executed child of the test above.
#[tokio::test]
async fn child() -> anyhow::Result<()> {
    let Ok(moto) = std::env::var(CHILD_ENV) else {
        return Ok(());
    };
    ccm_manager::logging::init(10, ccm_manager::options::LogFormat::Text);
    let provider = provider_from_cloud_config(&moto)?;
    // kube is never reached: the AWS provider reads nothing from the cluster.
    let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse()?))?;
    let init = provider
        .initialize(InitContext {
            client,
            shutdown: Default::default(),
        })
        .await;
    println!("{OUTCOME} initialize {init:?}");
    init?;
    make_calls(&provider).await
}

fn provider_from_cloud_config(moto: &str) -> anyhow::Result<Arc<dyn CloudProvider>> {
    let mut toml = String::from(
        "region = \"us-east-1\"\nkubernetes_cluster_id = \"ccmtest\"\nrole_arn = \"arn:aws:iam::123456789012:role/ccm\"\n",
    );
    for service in [
        "ec2",
        "elasticloadbalancing",
        "elasticloadbalancingv2",
        "sts",
    ] {
        toml += &format!("[[service_override]]\nservice = \"{service}\"\nurl = \"{moto}\"\n");
    }
    let path = std::env::temp_dir().join(format!("ccm-aws-cred-{}.toml", std::process::id()));
    std::fs::write(&path, toml)?;
    let mut registry = ProviderRegistry::new();
    ccm_provider_aws::register(&mut registry)?;
    Ok(registry.build("aws", Some(&path))?)
}

/// Calls that succeed and calls that fail, each outcome printed with `{:?}` (the most a log
/// line or an Event could carry).
async fn make_calls(provider: &Arc<dyn CloudProvider>) -> anyhow::Result<()> {
    let instances = provider.instances().expect("instances");
    let gone = node("gone", Some("aws:///us-east-1a/i-0123456789abcdef0"));
    let malformed = node("malformed", Some("aws:///us-east-1a/i-notanid"));
    let by_name = node("ip-10-0-0-1.ec2.internal", None);
    for n in [&gone, &malformed, &by_name] {
        let r = instances.instance_exists(n).await;
        println!(
            "{OUTCOME} instance_exists {} {r:?}",
            n.metadata.name.as_deref().unwrap_or("")
        );
        if let Err(e) = &r {
            println!("{OUTCOME} error text {e}");
        }
    }
    let meta = instances
        .instances_metadata(&[gone.clone(), by_name.clone()].map(Arc::new))
        .await;
    println!("{OUTCOME} instances_metadata {meta:?}");
    let routes = provider.routes().expect("routes");
    println!(
        "{OUTCOME} list_routes {:?}",
        routes.list_routes("ccmtest").await
    );
    let lb = provider.load_balancer().expect("load balancer");
    let ensured = lb
        .ensure_load_balancer("ccmtest", &service(), &[gone.into()])
        .await;
    println!("{OUTCOME} ensure_load_balancer {ensured:?}");
    if let Err(e) = &ensured {
        println!("{OUTCOME} error text {e}");
    }
    Ok(())
}

fn node(name: &str, provider_id: Option<&str>) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: provider_id.map(String::from),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn service() -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("default".into()),
            uid: Some("0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0".into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![ServicePort {
                port: 80,
                node_port: Some(30080),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}
