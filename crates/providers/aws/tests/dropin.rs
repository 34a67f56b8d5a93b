//! ccm-rs as a drop-in for cloud-provider-aws, against moto through the real controllers:
//! a cluster laid out as kOps lays it out (legacy-tagged route table, role-tag-only subnets,
//! Nodes named by instance id and by private DNS name, a Fargate Node, a terminated instance, a
//! NotReady Node nothing resolves), the CCM started with upstream's flags and upstream's INI
//! cloud-config; the cluster id from IMDS (v2 tokens, served on loopback) and the startup error
//! without one; bad cloud-configs refused before any AWS call.

mod common;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
use bytes::Bytes;
use ccm_cloud::{CloudProvider, InitContext, ProviderRegistry};
use ccm_controllers::nodeutil::{TAINT_UNINITIALIZED, has_taint};
use ccm_provider_aws::{AwsCloud, AwsConfig, IdentitySources};
use common::{Cluster, Moto, sdk_config, wait_for};
use http_body_util::Full;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use serde_json::json;

const KOPS_CLUSTER: &str = "kops.example.com";

fn tags(kind: ResourceType, t: &[(&str, &str)]) -> TagSpecification {
    TagSpecification::builder()
        .resource_type(kind)
        .set_tags(Some(
            t.iter()
                .map(|(k, v)| Tag::builder().key(*k).value(*v).build())
                .collect(),
        ))
        .build()
}

fn ec2(moto: &Moto, sdk: &aws_config::SdkConfig) -> aws_sdk_ec2::Client {
    aws_sdk_ec2::Client::from_conf(
        aws_sdk_ec2::config::Builder::from(sdk)
            .endpoint_url(&moto.url)
            .build(),
    )
}

/// A VPC as kOps builds it: subnets with only the role tags, a route table with only the
/// legacy `KubernetesCluster` tag. Returns (vpc, subnet, route table).
async fn kops_vpc(
    ec2: &aws_sdk_ec2::Client,
    region: &str,
) -> anyhow::Result<(String, String, String)> {
    let vpc = ec2
        .create_vpc()
        .cidr_block("10.0.0.0/16")
        .send()
        .await?
        .vpc
        .and_then(|v| v.vpc_id)
        .context("vpc")?;
    let subnet = ec2
        .create_subnet()
        .vpc_id(&vpc)
        .cidr_block("10.0.0.0/20")
        .availability_zone(format!("{region}a"))
        .tag_specifications(tags(
            ResourceType::Subnet,
            &[("kubernetes.io/role/elb", "1")],
        ))
        .send()
        .await?
        .subnet
        .and_then(|s| s.subnet_id)
        .context("subnet")?;
    let rtb = ec2
        .create_route_table()
        .vpc_id(&vpc)
        .tag_specifications(tags(
            ResourceType::RouteTable,
            &[("KubernetesCluster", KOPS_CLUSTER)],
        ))
        .send()
        .await?
        .route_table
        .and_then(|r| r.route_table_id)
        .context("route table")?;
    Ok((vpc, subnet, rtb))
}

/// One instance in `subnet` with `tags`; (id, private DNS name).
async fn instance(
    ec2: &aws_sdk_ec2::Client,
    subnet: &str,
    t: &[(&str, &str)],
) -> anyhow::Result<(String, String)> {
    let out = ec2
        .run_instances()
        .image_id("ami-12c6146b")
        .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
        .min_count(1)
        .max_count(1)
        .subnet_id(subnet)
        .tag_specifications(tags(ResourceType::Instance, t))
        .send()
        .await?;
    let i = out.instances().first().context("instance")?;
    Ok((
        i.instance_id().unwrap_or_default().to_string(),
        i.private_dns_name().unwrap_or_default().to_string(),
    ))
}

/// kOps tags its instances with both cluster tags.
const KOPS_TAGS: &[(&str, &str)] = &[
    ("KubernetesCluster", KOPS_CLUSTER),
    ("kubernetes.io/cluster/kops.example.com", "owned"),
];

/// What kOps writes to /etc/kubernetes/cloud.config, plus upstream's ServiceOverride sections
/// (format from upstream's config.go) pointing at moto.
fn kops_ini(vpc: &str, region: &str, url: &str) -> String {
    let mut ini = format!(
        "[global]\nZone = {region}a\nVPC = {vpc}\nKubernetesClusterTag = {KOPS_CLUSTER}\nDisableSecurityGroupIngress = false\nNodeIPFamilies = ipv4\n\n"
    );
    for (n, service) in ["ec2", "elasticloadbalancing", "elasticloadbalancingv2"]
        .iter()
        .enumerate()
    {
        ini += &format!(
            "[ServiceOverride \"{}\"]\n  Service = {service}\n  Region = {region}\n  URL = {url}\n  SigningRegion = {region}\n  SigningMethod = v4\n\n",
            n + 1
        );
    }
    ini
}

fn write_config(name: &str, text: &str) -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("ccm-dropin-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(name);
    std::fs::write(&path, text)?;
    Ok(path)
}

/// The `aws` provider as the binary registers it (the cloud-config read from
/// `--cloud-config`), with the test's credentials and IMDS; `keep` receives the provider.
fn registry(
    sdk: &aws_config::SdkConfig,
    imds: Option<String>,
    keep: Arc<parking_lot::Mutex<Option<AwsCloud>>>,
    args: &[String],
) -> ProviderRegistry {
    let sdk = sdk.clone();
    // What `ccm_provider_aws::register` reads from the process's command line.
    let explicit = ccm_provider_aws::explicit_cluster_name(args.iter().cloned());
    let mut r = ProviderRegistry::new();
    r.register("aws", move |cfg| {
        let cfg = AwsConfig::from_cloud_config(cfg)?;
        let sdk = sdk.clone();
        let sources = IdentitySources {
            cluster_name: explicit.clone(),
            imds_endpoint: imds.clone(),
        };
        let p = AwsCloud::with_identity(cfg, Some(sdk), sources);
        *keep.lock() = Some(p.clone());
        Ok(Arc::new(p) as Arc<dyn CloudProvider>)
    })
    .expect("fresh registry");
    r
}

/// A Node as a kubelet registers it: `name`, maybe a providerID, maybe a pod CIDR, Ready or not.
async fn node(
    c: &Cluster,
    name: &str,
    provider_id: Option<&str>,
    pod_cidr: Option<&str>,
    ready: bool,
) -> anyhow::Result<()> {
    let mut spec = json!({
        "taints": [{"key": TAINT_UNINITIALIZED, "value": "true", "effect": "NoSchedule"}],
    });
    if let Some(p) = provider_id {
        spec["providerID"] = json!(p);
    }
    if let Some(cidr) = pod_cidr {
        spec["podCIDR"] = json!(cidr);
        spec["podCIDRs"] = json!([cidr]);
    }
    let n: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name}, "spec": spec,
    }))?;
    Api::<Node>::all(c.client.clone())
        .create(&PostParams::default(), &n)
        .await
        .with_context(|| format!("creating node {name}"))?;
    c.set_ready(name, ready).await
}

fn provider_id(n: &Node) -> &str {
    n.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .unwrap_or("")
}

async fn routes(ec2: &aws_sdk_ec2::Client, rtb: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let out = ec2
        .describe_route_tables()
        .route_table_ids(rtb)
        .send()
        .await?;
    Ok(out
        .route_tables()
        .iter()
        .flat_map(|t| t.routes())
        .filter_map(|r| {
            Some((
                r.destination_cidr_block()?.to_string(),
                r.instance_id()?.to_string(),
            ))
        })
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kops_cluster_with_upstream_flags_and_ini() -> anyhow::Result<()> {
    let region = "us-west-2";
    // A server of its own: the restart below counts route calls in moto's recorder.
    let moto = Moto::start();
    let sdk = sdk_config(region).await;
    let ec2 = ec2(&moto, &sdk);
    let (vpc, subnet, rtb) = kops_vpc(&ec2, region).await?;
    let (by_dns, dns) = instance(&ec2, &subnet, KOPS_TAGS).await?;
    let (by_id, _) = instance(&ec2, &subnet, KOPS_TAGS).await?;
    let (terminated, _) = instance(&ec2, &subnet, KOPS_TAGS).await?;
    ec2.terminate_instances()
        .instance_ids(&terminated)
        .send()
        .await?;
    let fargate = format!("fargate-ip-10-0-9-9.{region}.compute.internal");
    let doubt = format!("ip-10-0-99-99.{region}.compute.internal");

    let mut cluster = Cluster::start().await?;
    node(&cluster, &dns, None, Some("10.128.0.0/24"), true).await?;
    node(&cluster, &by_id, None, Some("10.128.1.0/24"), true).await?;
    let zone = format!("{region}a");
    node(
        &cluster,
        "gone",
        Some(&format!("aws:///{zone}/{terminated}")),
        None,
        false,
    )
    .await?;
    node(
        &cluster,
        &fargate,
        Some(&format!("aws:///{zone}/{fargate}")),
        None,
        false,
    )
    .await?;
    node(&cluster, &doubt, None, None, false).await?;

    let config = write_config("kops.ini", &kops_ini(&vpc, region, &moto.url))?;
    // Upstream's flags, as kOps passes them.
    let args: Vec<String> = [
        "--cloud-provider=aws".to_string(),
        format!("--cloud-config={}", config.display()),
        "--configure-cloud-routes=true".into(),
        "--cluster-cidr=10.128.0.0/16".into(),
        "--v=2".into(),
        "--node-monitor-period=1s".into(),
    ]
    .to_vec();
    let keep = Arc::new(parking_lot::Mutex::new(None));
    cluster
        .start_ccm_with(registry(&sdk, None, keep.clone(), &args), &args)
        .await?;

    let names = [dns.clone(), by_id.clone()];
    wait_for(
        "both EC2 nodes initialized and routed, the terminated one's Node deleted",
        Duration::from_secs(60),
        || async {
            let nodes = cluster.nodes().await?;
            let init = nodes
                .iter()
                .filter(|n| names.iter().any(|m| n.metadata.name.as_ref() == Some(m)))
                .filter(|n| !has_taint(n, TAINT_UNINITIALIZED))
                .count();
            let gone = !nodes
                .iter()
                .any(|n| n.metadata.name.as_deref() == Some("gone"));
            let r = routes(&ec2, &rtb).await?;
            Ok(if init == 2 && gone && r.len() == 2 {
                Ok(())
            } else {
                Err(format!(
                    "{init}/2 initialized, terminated Node deleted: {gone}, routes {r:?}"
                ))
            })
        },
    )
    .await?;
    let nodes = cluster.nodes().await?;
    let find = |name: &str| {
        nodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(name))
    };
    assert_eq!(
        provider_id(find(&dns).context("dns node")?),
        format!("aws:///{zone}/{by_dns}")
    );
    assert_eq!(
        provider_id(find(&by_id).context("id node")?),
        format!("aws:///{zone}/{by_id}")
    );
    let r = routes(&ec2, &rtb).await?;
    assert_eq!(r.get("10.128.0.0/24"), Some(&by_dns));
    assert_eq!(r.get("10.128.1.0/24"), Some(&by_id));

    // Several monitor rounds later the NotReady Node nothing resolves, and the Fargate Node,
    // are still there (upstream deletes neither either).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let nodes = cluster.nodes().await?;
    let names: Vec<&str> = nodes
        .iter()
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();
    assert!(names.contains(&doubt.as_str()), "{names:?}");
    assert!(names.contains(&fargate.as_str()), "{names:?}");
    // ... and the operator is told about the one in doubt.
    let events = Api::<k8s_openapi::api::core::v1::Event>::all(cluster.client.clone())
        .list(&Default::default())
        .await?;
    let warned = events.items.iter().any(|e| {
        e.type_.as_deref() == Some("Warning")
            && e.reason.as_deref() == Some("CheckingInstanceFailed")
            && e.involved_object.name.as_deref() == Some(doubt.as_str())
    });
    assert!(warned, "no Warning Event for {doubt}");
    assert!(
        !events.items.iter().any(
            |e| e.involved_object.name.as_deref() == Some(fargate.as_str())
                && e.type_.as_deref() == Some("Warning")
        ),
        "a Warning Event for the Fargate Node"
    );
    // The Fargate Node costs no error: its status and metadata are answers, not failures.
    let p = keep.lock().clone().context("provider built")?;
    let f = nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(fargate.as_str()))
        .context("fargate")?;
    let inst = ccm_cloud::CloudProvider::instances(&p).context("instances")?;
    assert!(
        inst.instances_status(&[Arc::new(f.clone())]).await[0]
            .as_ref()
            .is_ok_and(|s| s.exists)
    );
    assert!(matches!(
        inst.instances_metadata(&[Arc::new(f.clone())]).await[0],
        Ok(None)
    ));

    // A restarted CCM leaves every route alone and maps the routes' instances back to their
    // Nodes (the instance-id-named one too, whose instance's DNS name is not its Node name).
    cluster.stop_ccm().await?;
    moto.start_recording().await;
    cluster
        .start_ccm_with(registry(&sdk, None, Arc::default(), &args), &args)
        .await?;
    wait_for(
        "the restarted CCM listed the routes",
        Duration::from_secs(30),
        || async {
            let calls = moto.recorded().await;
            Ok(if calls.contains_key("DescribeRouteTables") {
                Ok(())
            } else {
                Err(format!("{calls:?}"))
            })
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calls = moto.recorded().await;
    for write in ["CreateRoute", "ReplaceRoute", "DeleteRoute"] {
        assert!(
            !calls.contains_key(write),
            "{write} after restart: {calls:?}"
        );
    }
    assert_eq!(routes(&ec2, &rtb).await?.len(), 2);
    // A provider that has looked nothing up yet (its Nodes' lookups by other controllers would
    // teach it the mapping) still reports each route's Node by its Node name.
    let cfg = AwsConfig::from_cloud_config(Some(&ccm_cloud::CloudConfig {
        path: config.clone(),
        contents: std::fs::read_to_string(&config)?,
    }))?;
    let p = AwsCloud::with_identity(cfg, Some(sdk.clone()), IdentitySources::default());
    p.initialize(InitContext {
        client: cluster.client.clone(),
        shutdown: Default::default(),
    })
    .await?;
    let listed = ccm_cloud::CloudProvider::routes(&p)
        .context("routes")?
        .list_routes(KOPS_CLUSTER)
        .await?;
    let targets: BTreeMap<String, String> = listed
        .into_iter()
        .map(|r| (r.destination_cidr, r.target_node))
        .collect();
    assert_eq!(targets.get("10.128.0.0/24"), Some(&dns), "{targets:?}");
    assert_eq!(targets.get("10.128.1.0/24"), Some(&by_id), "{targets:?}");
    cluster.stop_ccm().await
}

/// A loopback IMDS answering the documented IMDSv2 flow: `PUT /latest/api/token` with a TTL
/// header returns a token; metadata `GET`s without that token get 401.
struct Imds {
    url: String,
    puts: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
}

async fn imds(instance_id: String) -> anyhow::Result<Imds> {
    use hyper::service::service_fn;
    use hyper::{Method, Request, Response, StatusCode};
    const TOKEN: &str = "AQAEAtest-token==";
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let (puts, refused) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (p, r) = (puts.clone(), refused.clone());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (p, r, id) = (p.clone(), r.clone(), instance_id.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let (p, r, id) = (p.clone(), r.clone(), id.clone());
                    async move {
                        let reply = |s: StatusCode, b: String| {
                            let mut resp = Response::new(Full::new(Bytes::from(b)));
                            *resp.status_mut() = s;
                            Ok::<_, Infallible>(resp)
                        };
                        let path = req.uri().path().to_string();
                        if req.method() == Method::PUT && path == "/latest/api/token" {
                            if !req
                                .headers()
                                .contains_key("x-aws-ec2-metadata-token-ttl-seconds")
                            {
                                return reply(StatusCode::BAD_REQUEST, String::new());
                            }
                            p.fetch_add(1, Ordering::SeqCst);
                            let mut resp = reply(StatusCode::OK, TOKEN.into())?;
                            resp.headers_mut().insert(
                                "x-aws-ec2-metadata-token-ttl-seconds",
                                hyper::header::HeaderValue::from_static("21600"),
                            );
                            return Ok(resp);
                        }
                        let token = req
                            .headers()
                            .get("x-aws-ec2-metadata-token")
                            .and_then(|v| v.to_str().ok());
                        if token != Some(TOKEN) {
                            r.fetch_add(1, Ordering::SeqCst);
                            return reply(StatusCode::UNAUTHORIZED, String::new());
                        }
                        match path.as_str() {
                            "/latest/meta-data/instance-id" => reply(StatusCode::OK, id),
                            _ => reply(StatusCode::NOT_FOUND, String::new()),
                        }
                    }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, svc)
                    .await;
            });
        }
    });
    Ok(Imds { url, puts, refused })
}

fn client() -> anyhow::Result<kube::Client> {
    // The provider only keeps the client (for a Node listing routes may need); never reached here.
    Ok(kube::Client::try_from(kube::Config::new(
        "http://127.0.0.1:9".parse()?,
    ))?)
}

/// A cloud-config with nothing but moto's endpoints, as upstream's INI.
fn endpoints_only(region: &str, url: &str) -> String {
    let mut ini = String::from("[Global]\n");
    for (n, s) in ["ec2", "elasticloadbalancing", "elasticloadbalancingv2"]
        .iter()
        .enumerate()
    {
        ini += &format!(
            "[ServiceOverride \"{n}\"]\nService={s}\nRegion={region}\nURL={url}\nSigningRegion={region}\n"
        );
    }
    ini
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_id_from_imds_tags_else_a_startup_error() -> anyhow::Result<()> {
    let region = "eu-central-1";
    let moto = Moto::shared();
    let sdk = sdk_config(region).await;
    let ec2 = ec2(moto, &sdk);
    let (_, subnet, _) = kops_vpc(&ec2, region).await?;
    // A route table tagged the new way for the cluster the CCM host belongs to.
    let vpc = ec2
        .describe_subnets()
        .subnet_ids(&subnet)
        .send()
        .await?
        .subnets()[0]
        .vpc_id()
        .unwrap_or_default()
        .to_string();
    ec2.create_route_table()
        .vpc_id(&vpc)
        .tag_specifications(tags(
            ResourceType::RouteTable,
            &[("kubernetes.io/cluster/from-imds", "owned")],
        ))
        .send()
        .await?;
    let (host, _) = instance(
        &ec2,
        &subnet,
        &[("kubernetes.io/cluster/from-imds", "owned")],
    )
    .await?;
    let server = imds(host.clone()).await?;
    let cfg = AwsConfig::from_cloud_config(Some(&ccm_cloud::CloudConfig {
        path: "cloud.conf".into(),
        contents: endpoints_only(region, &moto.url),
    }))?;
    let sources = IdentitySources {
        cluster_name: None,
        imds_endpoint: Some(server.url.clone()),
    };
    let p = AwsCloud::with_identity(cfg.clone(), Some(sdk.clone()), sources);
    p.initialize(InitContext {
        client: client()?,
        shutdown: Default::default(),
    })
    .await?;
    assert!(
        server.puts.load(Ordering::SeqCst) >= 1,
        "an IMDSv2 session token was asked for"
    );
    assert_eq!(
        server.refused.load(Ordering::SeqCst),
        0,
        "every metadata GET carried the token"
    );
    // The id is the host's tag, not --cluster-name's default: the tagged table is found.
    let routes = ccm_cloud::CloudProvider::routes(&p).context("routes")?;
    routes.list_routes("kubernetes").await?;

    // The host without a cluster tag, and no IMDS at all: the CCM refuses to start and says
    // how to set the id.
    let (untagged, _) = instance(&ec2, &subnet, &[("Name", "bastion")]).await?;
    let bare = imds(untagged.clone()).await?;
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        format!("http://{}", l.local_addr()?)
    };
    let config = write_config("endpoints.ini", &endpoints_only(region, &moto.url))?;
    for (imds_url, why) in [(bare.url.clone(), untagged.as_str()), (closed, "IMDS")] {
        let mut cluster = Cluster::start().await?;
        let args = vec![
            "--cloud-provider=aws".to_string(),
            format!("--cloud-config={}", config.display()),
        ];
        let err = cluster
            .start_ccm_with(registry(&sdk, Some(imds_url), Arc::default(), &args), &args)
            .await
            .expect_err("no cluster id");
        let text = format!("{err:#}");
        assert!(
            !text.contains("test-token"),
            "the IMDS token leaked into: {text}"
        );
        for needle in [
            "no cluster id",
            why,
            "KubernetesClusterID",
            "kubernetes.io/cluster/<id>",
            "--cluster-name",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from: {text}");
        }
    }
    // An explicit --cluster-name serves without IMDS.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        format!("http://{}", l.local_addr()?)
    };
    let mut cluster = Cluster::start().await?;
    let args = vec![
        "--cloud-provider=aws".to_string(),
        format!("--cloud-config={}", config.display()),
        "--cluster-name=from-imds".into(),
        "--configure-cloud-routes=false".into(),
    ];
    let keep = Arc::new(parking_lot::Mutex::new(None));
    cluster
        .start_ccm_with(registry(&sdk, Some(closed), keep.clone(), &args), &args)
        .await?;
    let p = keep.lock().clone().context("provider built")?;
    let routes = ccm_cloud::CloudProvider::routes(&p).context("routes")?;
    routes.list_routes("from-imds").await?;
    cluster.stop_ccm().await
}

#[tokio::test]
async fn bad_cloud_configs_stop_startup_before_any_aws_call() -> anyhow::Result<()> {
    // Every service points here: a listener that counts connections.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    tokio::spawn(async move {
        while let Ok((_s, _)) = listener.accept().await {
            h.fetch_add(1, Ordering::SeqCst);
        }
    });
    let over = format!(
        "[ServiceOverride \"1\"]\nService = ec2\nRegion = us-east-1\nURL = {url}\nSigningRegion = us-east-1\n"
    );
    let cases = [
        (
            format!("[Global]\nKubernetesClusterID = c\nRegion = \"us-east-1\n{over}"),
            "line 3",
        ),
        (
            format!("[Global]\nKubernetesClusterID = c\nElbSecurityGroups = sg-1\n{over}"),
            "ElbSecurityGroups (line 3)",
        ),
        (
            format!("[Global]\nKubernetesClusterID = c\nSigningName = ec2\n{over}"),
            "SigningName (line 3)",
        ),
        (
            format!("[Global]\nKubernetesClusterID = c\n{over}VPC = vpc-1\n"),
            "VPC (line 8)",
        ),
    ];
    for (i, (text, needle)) in cases.iter().enumerate() {
        let path = write_config(&format!("bad-{i}.ini"), text)?;
        let mut registry = ProviderRegistry::new();
        ccm_provider_aws::register(&mut registry)?;
        let mut cluster = Cluster::start().await?;
        let args = vec![
            "--cloud-provider=aws".to_string(),
            format!("--cloud-config={}", path.display()),
        ];
        let err = cluster
            .start_ccm_with(registry, &args)
            .await
            .expect_err("bad config");
        let msg = format!("{err:#}");
        assert!(msg.contains(needle), "{needle:?} missing from: {msg}");
        assert!(
            msg.contains(&path.display().to_string()),
            "the file is named: {msg}"
        );
    }
    assert_eq!(hits.load(Ordering::SeqCst), 0, "nothing reached AWS");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_dns_name_is_looked_up_inside_the_cluster_only() -> anyhow::Result<()> {
    let region = "ap-southeast-2";
    let moto = Moto::shared();
    let sdk = sdk_config(region).await;
    let ec2 = ec2(moto, &sdk);
    // Two VPCs with the same CIDR: the same private IP, so the same private DNS name.
    let mut found = Vec::new();
    for cluster_tag in [
        "kubernetes.io/cluster/amb",
        "kubernetes.io/cluster/amb",
        "kubernetes.io/cluster/other",
    ] {
        let (vpc, subnet, _) = kops_vpc(&ec2, region).await?;
        let out = ec2
            .run_instances()
            .image_id("ami-12c6146b")
            .min_count(1)
            .max_count(1)
            .subnet_id(&subnet)
            .private_ip_address("10.0.0.50")
            .tag_specifications(tags(ResourceType::Instance, &[(cluster_tag, "owned")]))
            .send()
            .await?;
        let i = out.instances().first().context("instance")?;
        found.push((
            vpc,
            i.instance_id().unwrap_or_default().to_string(),
            i.private_dns_name().unwrap_or_default().to_string(),
        ));
    }
    let dns = found[0].2.clone();
    assert!(found.iter().all(|f| f.2 == dns), "same DNS name: {found:?}");
    let n: Node = serde_json::from_value(json!({"metadata": {"name": dns}}))?;
    let provider = |vpc: Option<&str>| {
        let mut cfg = common::cloud_config(&moto.url);
        cfg.kubernetes_cluster_id = Some("amb".into());
        cfg.vpc = vpc.map(String::from);
        AwsCloud::with_sdk_config(cfg, sdk.clone())
    };
    // The cluster has two instances of that name (the third is another cluster's): an error
    // naming both, never a guess.
    let p = provider(None);
    let inst = ccm_cloud::CloudProvider::instances(&p).context("instances")?;
    let err = inst
        .instances_metadata(&[Arc::new(n.clone())])
        .await
        .remove(0)
        .expect_err("ambiguous");
    let text = err.to_string();
    assert!(
        text.contains(&found[0].1) && text.contains(&found[1].1),
        "{text}"
    );
    assert!(
        !text.contains(&found[2].1),
        "another cluster's instance: {text}"
    );
    assert!(inst.instances_status(&[Arc::new(n.clone())]).await[0].is_err());
    // With the cluster's VPC configured, the one instance in it.
    let p = provider(Some(&found[1].0));
    let inst = ccm_cloud::CloudProvider::instances(&p).context("instances")?;
    let meta = inst
        .instances_metadata(&[Arc::new(n.clone())])
        .await
        .remove(0)?
        .context("metadata")?;
    assert!(
        meta.provider_id.ends_with(&found[1].1),
        "{}",
        meta.provider_id
    );
    Ok(())
}
