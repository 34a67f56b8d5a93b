//! The provider value: configuration, lazily built SDK clients, the metered call wrapper and
//! what it remembers between calls.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};
use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
use ccm_cloud::{
    CloudError, CloudProvider, CloudResult, ConfigError, InitContext, Instances, LoadBalancer,
    ProviderRegistry, RegistryError, Routes,
};
use parking_lot::Mutex;
use prometheus_client::registry::Registry;
use tokio::sync::OnceCell;

use crate::config::{AwsConfig, Service};
use crate::identity::{self, ClusterId};
use crate::metrics::AwsMetrics;

/// The `--cloud-provider` name and provider-ID scheme.
pub const PROVIDER_NAME: &str = "aws";

/// The SDK clients, built on first use (loading credentials and region is async; provider
/// construction is not).
pub(crate) struct Clients {
    pub ec2: aws_sdk_ec2::Client,
    pub elb: aws_sdk_elasticloadbalancing::Client,
    pub elbv2: aws_sdk_elasticloadbalancingv2::Client,
    pub region: String,
}

/// What the provider learned about an instance from a `DescribeInstances` answer and may reuse.
#[derive(Debug, Clone, Default)]
pub(crate) struct Known {
    pub vpc: String,
    pub source_dest_check: Option<bool>,
    pub security_groups: Vec<String>,
}

/// Facts that rarely change, kept between calls so idle reconciles cost no AWS calls.
#[derive(Default)]
pub(crate) struct Memory {
    /// Node name → instance id, learned from Nodes with a providerID and from name lookups.
    pub node_to_instance: HashMap<String, String>,
    /// Instance id → Node name, the reverse of the above.
    pub instance_to_node: HashMap<String, String>,
    /// Instance id → facts.
    pub instances: HashMap<String, Known>,
    /// Route table ids per cluster id.
    pub route_tables: HashMap<String, Vec<String>>,
    /// Availability zone name → zone id.
    pub zone_ids: HashMap<String, String>,
    /// Availability zone name → zone type (`availability-zone`, `local-zone`,
    /// `wavelength-zone`): facts that never change, learnt with the zone ids.
    pub zone_types: HashMap<String, String>,
    /// Node name → instance, as recently found by name (answers lookups while fresh).
    pub by_name: HashMap<String, crate::instances::Seen>,
    /// LB name → the instances its last successful ensure or update made its backends.
    pub lb_backends: HashMap<String, std::collections::BTreeSet<String>>,
    /// NLB name → its VPC and target groups, as the last ensure or update found them.
    pub nlbs: HashMap<String, crate::nlb::NlbTargets>,
    /// (node security group, LB security group) pairs known to have the allow rule.
    pub sg_rules: std::collections::HashSet<(String, String)>,
    /// Names of Fargate and hybrid Nodes: no EC2 instance behind them.
    pub not_ec2: std::collections::HashSet<String>,
    /// Which security groups the cluster owns, for the load-balancer rules.
    pub lb_groups: crate::sg::GroupMemory,
}

pub(crate) struct Inner {
    pub cfg: AwsConfig,
    /// Instance lookups waiting for the next `DescribeInstances` (see `instances::coalesced`).
    pub pending: Mutex<crate::instances::Pending>,
    /// Held while a coalesced lookup is in flight.
    pub flight: tokio::sync::Mutex<()>,
    /// Held while zone ids are asked for.
    pub zone_flight: tokio::sync::Mutex<()>,
    sdk: Option<SdkConfig>,
    clients: OnceCell<Clients>,
    /// The cluster id: from the cloud-config at construction, else found by `initialize`.
    cluster: std::sync::OnceLock<ClusterId>,
    sources: IdentitySources,
    /// The cluster client from `initialize`, for the one Node listing after a restart.
    pub kube: std::sync::OnceLock<kube::Client>,
    /// Whether that listing was done.
    pub nodes_listed: std::sync::atomic::AtomicBool,
    pub metrics: AwsMetrics,
    pub memory: Mutex<Memory>,
}

/// The AWS cloud provider. Cheap to clone; clones share clients, metrics and memory.
#[derive(Clone)]
pub struct AwsCloud {
    pub(crate) inner: Arc<Inner>,
}

/// The HTTPS client the provider uses: rustls on ring, the workspace's one TLS stack. Tests
/// building their own [`SdkConfig`] pass it to `aws_config::ConfigLoader::http_client`.
pub fn https_client() -> aws_sdk_ec2::config::SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https()
}

/// Where the provider may find the cluster id when the cloud-config has none.
#[derive(Debug, Clone, Default)]
pub struct IdentitySources {
    /// `--cluster-name`, only when given explicitly (its default never names a cluster).
    pub cluster_name: Option<String>,
    /// The IMDS base URL; default the SDK's (169.254.169.254, or
    /// `AWS_EC2_METADATA_SERVICE_ENDPOINT`).
    pub imds_endpoint: Option<String>,
}

/// Registers `aws` in `registry`: `--cloud-provider=aws --cloud-config=<ini or toml>`. An
/// explicit `--cluster-name` on the process's command line may serve as the cluster id.
pub fn register(registry: &mut ProviderRegistry) -> Result<(), RegistryError> {
    registry.register(PROVIDER_NAME, |cfg| {
        let cfg = AwsConfig::from_cloud_config(cfg)?;
        let sources = IdentitySources {
            cluster_name: identity::explicit_cluster_name(std::env::args()),
            imds_endpoint: None,
        };
        Ok(Arc::new(AwsCloud::with_identity(cfg, None, sources)) as Arc<dyn CloudProvider>)
    })
}

impl AwsCloud {
    /// A provider using the SDK's default credential and region chain.
    pub fn new(cfg: AwsConfig) -> Self {
        Self::build(cfg, None, IdentitySources::default())
    }

    /// A provider on a given SDK config (tests, or binaries with their own credential setup).
    /// The cloud-config's region and endpoint overrides still apply.
    pub fn with_sdk_config(cfg: AwsConfig, sdk: SdkConfig) -> Self {
        Self::build(cfg, Some(sdk), IdentitySources::default())
    }

    /// A provider that, when the cloud-config names no cluster, takes the cluster id from
    /// `sources` (an explicit `--cluster-name`, else the tags of the instance IMDS names).
    pub fn with_identity(cfg: AwsConfig, sdk: Option<SdkConfig>, sources: IdentitySources) -> Self {
        Self::build(cfg, sdk, sources)
    }

    fn build(cfg: AwsConfig, sdk: Option<SdkConfig>, sources: IdentitySources) -> Self {
        let unused = cfg.not_honoured();
        if !unused.is_empty() {
            tracing::warn!(
                keys = %unused.join(", "),
                "cloud-config settings read but not honoured by ccm-rs yet (see the migration guide in docs/providers/aws.md)"
            );
        }
        let cluster = std::sync::OnceLock::new();
        if let Ok(Some(c)) = identity::from_config(&cfg) {
            let _ = cluster.set(c);
        }
        AwsCloud {
            inner: Arc::new(Inner {
                cfg,
                pending: Mutex::default(),
                flight: tokio::sync::Mutex::new(()),
                zone_flight: tokio::sync::Mutex::new(()),
                sdk,
                clients: OnceCell::new(),
                cluster,
                sources,
                kube: std::sync::OnceLock::new(),
                nodes_listed: std::sync::atomic::AtomicBool::new(false),
                metrics: AwsMetrics::default(),
                memory: Mutex::new(Memory::default()),
            }),
        }
    }

    /// The AWS API metrics of this provider.
    pub fn metrics(&self) -> &AwsMetrics {
        &self.inner.metrics
    }

    pub(crate) async fn clients(&self) -> CloudResult<&Clients> {
        self.inner
            .clients
            .get_or_try_init(|| load_clients(&self.inner.cfg, self.inner.sdk.clone()))
            .await
    }

    /// The cluster tag id: the one `initialize` settled on (cloud-config, explicit
    /// `--cluster-name`, or the CCM host's tags). `cluster` (the `--cluster-name` value) only
    /// serves a provider that was never initialized (tests driving it directly).
    pub(crate) fn cluster_id<'a>(&'a self, cluster: &'a str) -> &'a str {
        self.cluster().map(|c| c.id.as_str()).unwrap_or(cluster)
    }

    /// The cluster id and tag style, once known.
    pub(crate) fn cluster(&self) -> Option<&ClusterId> {
        self.inner.cluster.get()
    }

    /// Finds the cluster id when the cloud-config has none: an explicit `--cluster-name`, else
    /// the tags of the instance the CCM runs on (IMDS v2 for its id, EC2 for its tags), else a
    /// startup error naming every way to set it.
    async fn discover_cluster(&self) -> CloudResult<ClusterId> {
        if let Some(name) = &self.inner.sources.cluster_name {
            return Ok(ClusterId {
                id: name.clone(),
                legacy: false,
            });
        }
        let none = "the cloud-config sets neither KubernetesClusterID nor KubernetesClusterTag and --cluster-name was not given";
        let id =
            identity::self_instance_id(self.inner.sources.imds_endpoint.as_deref(), https_client())
                .await
                .map_err(|e| {
                    identity::missing(&format!(
                        "{none}, and this host's instance could not be found through IMDS ({e})"
                    ))
                })?;
        let found = self.describe_ids(std::slice::from_ref(&id)).await?;
        let inst = found.found.get(&id).ok_or_else(|| {
            identity::missing(&format!(
                "{none}, and EC2 does not know {id}, the instance IMDS names"
            ))
        })?;
        identity::from_tags(&id, inst.tags())?.ok_or_else(|| {
            identity::missing(&format!(
                "{none}, and this host's instance {id} has no kubernetes.io/cluster/<id> or KubernetesCluster tag"
            ))
        })
    }

    /// Runs one SDK operation, recording upstream's metrics, and returns the raw SDK error so
    /// callers can act on specific codes (`InvalidInstanceID.NotFound`, `RouteAlreadyExists`).
    pub(crate) async fn call_raw<T, E: ProvideErrorMetadata, R>(
        &self,
        request: &'static str,
        fut: impl Future<Output = Result<T, SdkError<E, R>>>,
    ) -> Result<T, SdkError<E, R>> {
        let start = Instant::now();
        let out = fut.await;
        self.inner
            .metrics
            .observe(request, start.elapsed().as_secs_f64(), out.is_err());
        if let Err(SdkError::ServiceError(e)) = &out
            && e.err()
                .code()
                .is_some_and(|c| crate::error::THROTTLE_CODES.contains(&c))
        {
            self.inner.metrics.throttled(request);
        }
        out
    }

    /// [`AwsCloud::call_raw`] with the error mapped to a [`CloudError`].
    pub(crate) async fn call<T, E, R>(
        &self,
        request: &'static str,
        fut: impl Future<Output = Result<T, SdkError<E, R>>>,
    ) -> CloudResult<T>
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
        R: std::fmt::Debug + Send + Sync + 'static,
    {
        self.call_raw(request, fut)
            .await
            .map_err(|e| crate::error::map(request, e))
    }
}

async fn load_clients(cfg: &AwsConfig, sdk: Option<SdkConfig>) -> CloudResult<Clients> {
    let mut sdk = match sdk {
        Some(s) => s,
        None => {
            let mut loader =
                aws_config::defaults(BehaviorVersion::latest()).http_client(https_client());
            if let Some(r) = &cfg.region {
                loader = loader.region(Region::new(r.clone()));
            }
            loader.load().await
        }
    };
    if let Some(r) = &cfg.region {
        sdk = sdk.into_builder().region(Region::new(r.clone())).build();
    }
    if let Some(role) = &cfg.role_arn {
        sdk = assume_role(cfg, sdk, role).await;
    }
    let region = sdk.region().map(|r| r.to_string()).ok_or_else(|| {
        CloudError::Permanent(ConfigError::field("region", "no AWS region found: set region in --cloud-config, or AWS_REGION, or run on EC2 (IMDS)").to_string())
    })?;
    let mut ec2 = aws_sdk_ec2::config::Builder::from(&sdk);
    ec2.set_endpoint_url(cfg.endpoint(Service::Ec2).map(String::from));
    let mut elb = aws_sdk_elasticloadbalancing::config::Builder::from(&sdk);
    elb.set_endpoint_url(
        cfg.endpoint(Service::Elasticloadbalancing)
            .map(String::from),
    );
    let mut elbv2 = aws_sdk_elasticloadbalancingv2::config::Builder::from(&sdk);
    elbv2.set_endpoint_url(
        cfg.endpoint(Service::Elasticloadbalancingv2)
            .map(String::from),
    );
    let (ec2, elb, elbv2) = (ec2.build(), elb.build(), elbv2.build());
    tracing::info!(%region, "AWS clients ready");
    Ok(Clients {
        ec2: aws_sdk_ec2::Client::from_conf(ec2),
        elb: aws_sdk_elasticloadbalancing::Client::from_conf(elb),
        elbv2: aws_sdk_elasticloadbalancingv2::Client::from_conf(elbv2),
        region,
    })
}

async fn assume_role(cfg: &AwsConfig, sdk: SdkConfig, role: &str) -> SdkConfig {
    let mut sts_cfg = sdk.clone();
    if let Some(url) = cfg.endpoint(Service::Sts) {
        sts_cfg = sts_cfg.into_builder().endpoint_url(url).build();
    }
    let provider = aws_config::sts::AssumeRoleProvider::builder(role)
        .session_name("ccm-rs")
        .configure(&sts_cfg)
        .build()
        .await;
    sdk.into_builder()
        .credentials_provider(aws_sdk_ec2::config::SharedCredentialsProvider::new(
            provider,
        ))
        .build()
}

#[async_trait]
impl CloudProvider for AwsCloud {
    fn provider_name(&self) -> &str {
        PROVIDER_NAME
    }

    async fn initialize(&self, ctx: InitContext) -> CloudResult<()> {
        let _ = self.inner.kube.set(ctx.client);
        self.clients().await?;
        let (cluster, source) = match self.cluster() {
            Some(c) => (c.clone(), "cloud-config"),
            None => {
                let c = self.discover_cluster().await?;
                let source = if self.inner.sources.cluster_name.is_some() {
                    "--cluster-name"
                } else {
                    "instance tags (IMDS)"
                };
                (self.inner.cluster.get_or_init(|| c).clone(), source)
            }
        };
        tracing::info!(cluster_id = %cluster.id, legacy_tags = cluster.legacy, source, "cluster id");
        Ok(())
    }

    fn register_metrics(&self, registry: &mut Registry) {
        self.inner.metrics.register(registry);
    }

    fn instances(&self) -> Option<Arc<dyn Instances>> {
        Some(Arc::new(self.clone()))
    }

    fn load_balancer(&self) -> Option<Arc<dyn LoadBalancer>> {
        Some(Arc::new(self.clone()))
    }

    fn routes(&self) -> Option<Arc<dyn Routes>> {
        Some(Arc::new(self.clone()))
    }

    fn volumes(&self) -> Option<Arc<dyn ccm_cloud::Volumes>> {
        Some(Arc::new(self.clone()))
    }
}
