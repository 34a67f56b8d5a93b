//! The test world: moto with a VPC laid out as a cluster needs it, kube-sim, kubelets that
//! register Nodes, and the real CCM (`ccm_manager::run`) with `--cloud-provider=aws`.

#![allow(dead_code)]

pub mod moto;
pub mod throttle;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use aws_config::{BehaviorVersion, Region};
use aws_sdk_ec2::types::{Filter, ResourceType, Tag, TagSpecification};
use ccm_controllers::nodeutil::TAINT_UNINITIALIZED;
use ccm_kube_sim::KubeSim;
use ccm_manager::options::RunOptions;
use ccm_manager::run::{ControllerHandles, Exit, Runtime};
use ccm_provider_aws::{AwsCloud, AwsConfig, Service as AwsService, ServiceOverride};
use clap::Parser;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

pub use moto::Moto;

/// `--cluster-name` of every test cluster.
pub const CLUSTER: &str = "ccmtest";
/// Pod CIDRs come from here.
pub const CLUSTER_CIDR: &str = "10.128.0.0/9";

/// SDK config for moto: static test credentials, the given region.
pub async fn sdk_config(region: &str) -> aws_config::SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(region.to_string()))
        .credentials_provider(aws_sdk_ec2::config::Credentials::new(
            "testing", "testing", None, None, "moto",
        ))
        .http_client(ccm_provider_aws::https_client())
        .load()
        .await
}

/// The cloud-config that points every service at `url`.
pub fn cloud_config(url: &str) -> AwsConfig {
    let over = |service| ServiceOverride {
        service,
        url: url.to_string(),
    };
    AwsConfig {
        service_override: vec![
            over(AwsService::Ec2),
            over(AwsService::Elasticloadbalancing),
            over(AwsService::Elasticloadbalancingv2),
        ],
        node_ip_families: vec![ccm_provider_aws::IpFamily::Ipv4],
        kubernetes_cluster_id: Some(CLUSTER.to_string()),
        ..Default::default()
    }
}

fn tag(k: &str, v: &str) -> Tag {
    Tag::builder().key(k).value(v).build()
}

fn tags(kind: ResourceType, t: &[(&str, &str)]) -> TagSpecification {
    TagSpecification::builder()
        .resource_type(kind)
        .set_tags(Some(t.iter().map(|(k, v)| tag(k, v)).collect()))
        .build()
}

/// A VPC in one moto region, as a cluster's infrastructure: two /20 subnets in two zones
/// tagged for the cluster and for public ELBs, a tagged route table, a tagged node SG.
pub struct AwsWorld {
    pub region: String,
    pub ec2: aws_sdk_ec2::Client,
    pub elb: aws_sdk_elasticloadbalancing::Client,
    pub elbv2: aws_sdk_elasticloadbalancingv2::Client,
    pub vpc: String,
    pub subnets: Vec<String>,
    pub route_table: String,
    pub node_sg: String,
    pub url: String,
}

impl AwsWorld {
    pub async fn create(moto: &Moto, region: &str) -> anyhow::Result<AwsWorld> {
        let sdk = sdk_config(region).await;
        let ec2 = aws_sdk_ec2::Client::from_conf(
            aws_sdk_ec2::config::Builder::from(&sdk)
                .endpoint_url(&moto.url)
                .build(),
        );
        let elb = aws_sdk_elasticloadbalancing::Client::from_conf(
            aws_sdk_elasticloadbalancing::config::Builder::from(&sdk)
                .endpoint_url(&moto.url)
                .build(),
        );
        let elbv2 = aws_sdk_elasticloadbalancingv2::Client::from_conf(
            aws_sdk_elasticloadbalancingv2::config::Builder::from(&sdk)
                .endpoint_url(&moto.url)
                .build(),
        );
        let cluster_tag = format!("kubernetes.io/cluster/{CLUSTER}");
        let vpc = ec2
            .create_vpc()
            .cidr_block("10.0.0.0/16")
            .send()
            .await?
            .vpc
            .and_then(|v| v.vpc_id)
            .context("vpc id")?;
        let mut subnets = Vec::new();
        for (i, zone) in ["a", "b"].iter().enumerate() {
            let s = ec2
                .create_subnet()
                .vpc_id(&vpc)
                .cidr_block(format!("10.0.{}.0/20", i * 16))
                .availability_zone(format!("{region}{zone}"))
                .tag_specifications(tags(
                    ResourceType::Subnet,
                    &[(&cluster_tag, "owned"), ("kubernetes.io/role/elb", "1")],
                ))
                .send()
                .await?
                .subnet
                .and_then(|s| s.subnet_id)
                .context("subnet id")?;
            subnets.push(s);
        }
        let route_table = ec2
            .create_route_table()
            .vpc_id(&vpc)
            .tag_specifications(tags(ResourceType::RouteTable, &[(&cluster_tag, "owned")]))
            .send()
            .await?
            .route_table
            .and_then(|r| r.route_table_id)
            .context("route table id")?;
        let node_sg = ec2
            .create_security_group()
            .vpc_id(&vpc)
            .group_name("nodes")
            .description("cluster nodes")
            .tag_specifications(tags(
                ResourceType::SecurityGroup,
                &[(&cluster_tag, "owned")],
            ))
            .send()
            .await?
            .group_id
            .context("sg id")?;
        Ok(AwsWorld {
            region: region.to_string(),
            ec2,
            elb,
            elbv2,
            vpc,
            subnets,
            route_table,
            node_sg,
            url: moto.url.clone(),
        })
    }

    /// An internet gateway and a default route to it in the VPC's main route table: the
    /// subnets become public, as internet-facing load balancers need.
    pub async fn with_internet_gateway(&self) -> anyhow::Result<String> {
        let igw = self
            .ec2
            .create_internet_gateway()
            .send()
            .await?
            .internet_gateway
            .and_then(|g| g.internet_gateway_id)
            .context("igw id")?;
        self.ec2
            .attach_internet_gateway()
            .internet_gateway_id(&igw)
            .vpc_id(&self.vpc)
            .send()
            .await?;
        let main = self
            .ec2
            .describe_route_tables()
            .filters(Filter::builder().name("vpc-id").values(&self.vpc).build())
            .filters(
                Filter::builder()
                    .name("association.main")
                    .values("true")
                    .build(),
            )
            .send()
            .await?;
        let main = main.route_tables()[0]
            .route_table_id()
            .context("main route table")?
            .to_string();
        self.ec2
            .create_route()
            .route_table_id(main)
            .destination_cidr_block("0.0.0.0/0")
            .gateway_id(&igw)
            .send()
            .await?;
        Ok(igw)
    }

    /// Launches `n` instances of the cluster (tagged `kubernetes.io/cluster/<CLUSTER>`, as
    /// kOps and EKS node groups tag theirs) in subnet `subnet`; returns (instance id, private
    /// DNS name) in launch order.
    pub async fn run_instances(
        &self,
        n: i32,
        subnet: usize,
    ) -> anyhow::Result<Vec<(String, String)>> {
        let out = self
            .ec2
            .run_instances()
            .image_id("ami-12c6146b")
            .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
            .min_count(n)
            .max_count(n)
            .subnet_id(&self.subnets[subnet])
            .security_group_ids(&self.node_sg)
            .tag_specifications(tags(
                ResourceType::Instance,
                &[(&format!("kubernetes.io/cluster/{CLUSTER}"), "owned")],
            ))
            .send()
            .await
            .context("RunInstances")?;
        Ok(out
            .instances()
            .iter()
            .map(|i| {
                (
                    i.instance_id().unwrap_or_default().to_string(),
                    i.private_dns_name().unwrap_or_default().to_string(),
                )
            })
            .collect())
    }

    /// The provider under test, pointed at moto.
    pub async fn provider(&self) -> AwsCloud {
        AwsCloud::with_sdk_config(cloud_config(&self.url), sdk_config(&self.region).await)
    }

    /// Routes of the cluster's route table: destination → instance id (or "blackhole").
    pub async fn routes(&self) -> anyhow::Result<BTreeMap<String, String>> {
        let out = self
            .ec2
            .describe_route_tables()
            .filters(
                Filter::builder()
                    .name("route-table-id")
                    .values(&self.route_table)
                    .build(),
            )
            .send()
            .await?;
        let mut routes = BTreeMap::new();
        for t in out.route_tables() {
            for r in t.routes() {
                let dest = r
                    .destination_cidr_block()
                    .or(r.destination_ipv6_cidr_block());
                if let (Some(d), Some(i)) = (dest, r.instance_id()) {
                    routes.insert(d.to_string(), i.to_string());
                }
            }
        }
        Ok(routes)
    }
}

/// kube-sim, kubelet and user clients, and the real CCM on the AWS provider.
pub struct Cluster {
    pub kube: KubeSim,
    pub client: kube::Client,
    pub ccm: Option<Ccm>,
    kubeconfig_dir: std::path::PathBuf,
}

pub struct Ccm {
    pub rt: Arc<Runtime>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<Exit>>,
    pub handles: ControllerHandles,
}

#[derive(Parser)]
struct RunArgs {
    #[command(flatten)]
    options: RunOptions,
}

impl Cluster {
    pub async fn start() -> anyhow::Result<Cluster> {
        Cluster::start_with(ccm_kube_sim::Config::default()).await
    }

    /// A cluster whose Services may have both families (IPv4 first).
    #[allow(dead_code)]
    pub async fn start_dual_stack() -> anyhow::Result<Cluster> {
        let mut cfg = ccm_kube_sim::Config::default();
        cfg.service_cidrs.push("fd00:96::/108".parse()?);
        Cluster::start_with(cfg).await
    }

    async fn start_with(cfg: ccm_kube_sim::Config) -> anyhow::Result<Cluster> {
        let kube = KubeSim::start(cfg).await?;
        let client = kube.client()?;
        let dir = std::env::temp_dir().join(format!(
            "ccm-aws-test-{}-{}",
            std::process::id(),
            kube.addr().port()
        ));
        std::fs::create_dir_all(&dir)?;
        kube.write_kubeconfig(&dir.join("kubeconfig"))?;
        Ok(Cluster {
            kube,
            client,
            ccm: None,
            kubeconfig_dir: dir,
        })
    }

    /// Starts the CCM with `--cloud-provider=aws` and waits until its controllers run.
    pub async fn start_ccm(&mut self, provider: AwsCloud, extra: &[&str]) -> anyhow::Result<()> {
        let mut argv = vec![
            "ccm".to_string(),
            "--cloud-provider=aws".into(),
            format!(
                "--kubeconfig={}",
                self.kubeconfig_dir.join("kubeconfig").display()
            ),
            format!("--cluster-name={CLUSTER}"),
            format!("--cluster-cidr={CLUSTER_CIDR}"),
            "--secure-port=0".into(),
            "--leader-elect=false".into(),
        ];
        argv.extend(extra.iter().map(|s| s.to_string()));
        let validated = RunArgs::try_parse_from(argv)?.options.validate()?;
        let mut providers = ccm_cloud::ProviderRegistry::new();
        providers.register("aws", move |_| {
            Ok(Arc::new(provider.clone()) as Arc<dyn ccm_cloud::CloudProvider>)
        })?;
        let rt = Arc::new(Runtime::default());
        let shutdown = CancellationToken::new();
        let mut rx = rt.handles.subscribe();
        let task = {
            let (rt, shutdown) = (rt.clone(), shutdown.clone());
            tokio::spawn(async move {
                ccm_manager::run::run(validated, &providers, &rt, shutdown).await
            })
        };
        let handles = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                if let Some(h) = rx.borrow_and_update().clone() {
                    return Ok::<_, anyhow::Error>(h);
                }
                rx.changed()
                    .await
                    .context("CCM stopped before its controllers started")?;
            }
        })
        .await
        .context("controllers did not start within 60s")??;
        self.ccm = Some(Ccm {
            rt,
            shutdown,
            task,
            handles,
        });
        Ok(())
    }

    /// Starts the CCM from `providers` with exactly `args` (plus the test's kubeconfig,
    /// `--secure-port=0`, `--leader-elect=false`), as an operator's manifest would: the
    /// provider is built by its registry factory from `--cloud-config`. A CCM that stops
    /// before its controllers run returns its own error.
    pub async fn start_ccm_with(
        &mut self,
        providers: ccm_cloud::ProviderRegistry,
        args: &[String],
    ) -> anyhow::Result<()> {
        let mut argv = vec![
            "ccm".to_string(),
            format!(
                "--kubeconfig={}",
                self.kubeconfig_dir.join("kubeconfig").display()
            ),
            "--secure-port=0".into(),
            "--leader-elect=false".into(),
        ];
        argv.extend(args.iter().cloned());
        let validated = RunArgs::try_parse_from(argv)?.options.validate()?;
        let rt = Arc::new(Runtime::default());
        let shutdown = CancellationToken::new();
        let mut rx = rt.handles.subscribe();
        let mut task = {
            let (rt, shutdown) = (rt.clone(), shutdown.clone());
            tokio::spawn(async move {
                ccm_manager::run::run(validated, &providers, &rt, shutdown).await
            })
        };
        let started = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                if let Some(h) = rx.borrow_and_update().clone() {
                    return Some(h);
                }
                if rx.changed().await.is_err() {
                    return None;
                }
            }
        });
        let handles = tokio::select! {
            h = started => h.context("controllers did not start within 60s")?,
            done = &mut task => {
                done??;
                anyhow::bail!("CCM exited before its controllers started");
            }
        };
        let Some(handles) = handles else {
            (&mut task).await??;
            anyhow::bail!("CCM stopped before its controllers started");
        };
        self.ccm = Some(Ccm {
            rt,
            shutdown,
            task,
            handles,
        });
        Ok(())
    }

    pub async fn stop_ccm(&mut self) -> anyhow::Result<()> {
        if let Some(c) = self.ccm.take() {
            c.shutdown.cancel();
            c.task.await??;
        }
        Ok(())
    }

    /// What a kubelet with `--cloud-provider=external` registers: a Node named after the
    /// instance's private DNS name, tainted uninitialized, with a pod CIDR, then Ready.
    pub async fn add_node(&self, name: &str, pod_cidr: &str) -> anyhow::Result<()> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {
                "podCIDR": pod_cidr, "podCIDRs": [pod_cidr],
                "taints": [{"key": TAINT_UNINITIALIZED, "value": "true", "effect": "NoSchedule"}],
            },
        }))?;
        nodes
            .create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("creating node {name}"))?;
        self.set_ready(name, true).await
    }

    pub async fn set_ready(&self, name: &str, ready: bool) -> anyhow::Result<()> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let now = jiff_now();
        let patch = json!({"status": {"conditions": [{
            "type": "Ready", "status": if ready { "True" } else { "Unknown" },
            "reason": if ready { "KubeletReady" } else { "NodeStatusUnknown" },
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }]}});
        nodes
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
            .with_context(|| format!("status of {name}"))?;
        Ok(())
    }

    pub async fn nodes(&self) -> anyhow::Result<Vec<Node>> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        Ok(nodes.list(&ListParams::default()).await?.items)
    }

    pub async fn create_service(
        &self,
        name: &str,
        annotations: serde_json::Value,
        ports: &[i32],
    ) -> anyhow::Result<Service> {
        let api: Api<Service> = Api::namespaced(self.client.clone(), "default");
        let ports: Vec<_> = ports
            .iter()
            .map(|p| json!({"name": format!("p{p}"), "port": p, "targetPort": 8080, "protocol": "TCP"}))
            .collect();
        let svc: Service = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations},
            "spec": {"type": "LoadBalancer", "selector": {"app": name}, "ports": ports},
        }))?;
        Ok(api.create(&PostParams::default(), &svc).await?)
    }

    pub async fn service(&self, name: &str) -> anyhow::Result<Option<Service>> {
        let api: Api<Service> = Api::namespaced(self.client.clone(), "default");
        Ok(api.get_opt(name).await?)
    }

    pub async fn delete_service(&self, name: &str) -> anyhow::Result<()> {
        let api: Api<Service> = Api::namespaced(self.client.clone(), "default");
        api.delete(name, &Default::default()).await?;
        Ok(())
    }
}

fn jiff_now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Polls `check` every 200 ms until it returns `Some`, or fails after `timeout` with the last
/// state `describe` reports.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Result<T, String>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let last = check().await?;
        match last {
            Ok(v) => return Ok(v),
            Err(state) if tokio::time::Instant::now() >= deadline => {
                anyhow::bail!("timed out after {timeout:?} waiting for {what}; last state: {state}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// A per-node index → pod CIDR in [`CLUSTER_CIDR`].
pub fn pod_cidr(i: usize) -> String {
    format!("10.{}.{}.0/24", 128 + i / 256, i % 256)
}
