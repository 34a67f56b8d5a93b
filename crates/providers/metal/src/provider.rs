//! [`MetalCloud`]: the provider value, its registration and config reloading.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ccm_cloud::{
    CloudConfig, CloudProvider, CloudResult, ConfigError, InitContext, Instances, LoadBalancer,
    ProviderRegistry, RegistryError, Routes,
};
use parking_lot::RwLock;
use tokio_util::sync::CancellationToken;

use crate::config::MetalConfig;
use crate::lb::LbState;
use crate::redfish::Redfish;
use crate::routes::RouteState;

/// `--cloud-provider` name and providerID scheme.
pub const PROVIDER_NAME: &str = "metal";
/// How often the cloud-config file is re-read to pick up edits.
pub const RELOAD_PERIOD: Duration = Duration::from_secs(2);

/// The providerID of machine `name`.
pub fn provider_id(name: &str) -> String {
    format!("{PROVIDER_NAME}://{name}")
}

/// State shared by the capabilities.
pub(crate) struct Inner {
    pub(crate) config: RwLock<Arc<MetalConfig>>,
    pub(crate) path: Option<PathBuf>,
    pub(crate) last_text: RwLock<String>,
    pub(crate) redfish: Redfish,
    pub(crate) lb: LbState,
    pub(crate) routes: Option<Arc<RouteState>>,
    pub(crate) client: RwLock<Option<kube::Client>>,
    /// The `spec.loadBalancerClass` served, fixed at startup: the service controller reads it
    /// once, so every part of the provider must keep answering the same.
    pub(crate) class: Option<String>,
    /// `(node, new providerID)` already reported as a swapped machine.
    pub(crate) swaps_reported: parking_lot::Mutex<std::collections::BTreeSet<(String, String)>>,
}

/// The bare-metal provider. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct MetalCloud {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for MetalCloud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetalCloud")
            .field("path", &self.inner.path)
            .finish()
    }
}

/// Registers `metal` in `registry`. The provider needs `--cloud-config`.
pub fn register(registry: &mut ProviderRegistry) -> Result<(), RegistryError> {
    registry.register(PROVIDER_NAME, |config: Option<&CloudConfig>| {
        let config = config.ok_or_else(|| {
            ConfigError::general(
                "the metal provider needs --cloud-config (a TOML file with [[machines]] and [[pools]]; see docs/providers/metal.md)",
            )
        })?;
        Ok(Arc::new(MetalCloud::from_cloud_config(config)?) as Arc<dyn CloudProvider>)
    })
}

impl MetalCloud {
    /// Builds the provider from the `--cloud-config` file (reloaded while running).
    pub fn from_cloud_config(config: &CloudConfig) -> Result<Self, ConfigError> {
        let parsed = MetalConfig::parse(&config.contents)
            .map_err(|e| e.in_file(config.path.display().to_string()))?;
        Self::build(parsed, Some(config.path.clone()), config.contents.clone())
    }

    /// Builds the provider from a config value (no reloading); for tests and embedding.
    pub fn new(config: MetalConfig) -> Result<Self, ConfigError> {
        Self::build(config, None, String::new())
    }

    fn build(
        config: MetalConfig,
        path: Option<PathBuf>,
        text: String,
    ) -> Result<Self, ConfigError> {
        let routes = config
            .routes
            .as_ref()
            .map(|r| Arc::new(RouteState::new(r, config.pools.clone())));
        let class = config.load_balancer_class.clone();
        Ok(MetalCloud {
            inner: Arc::new(Inner {
                redfish: Redfish::new(config.bmc_concurrency, config.bmc_timeout),
                lb: LbState::new(config.pools.clone()),
                routes,
                config: RwLock::new(Arc::new(config)),
                path,
                last_text: RwLock::new(text),
                client: RwLock::new(None),
                class,
                swaps_reported: Default::default(),
            }),
        })
    }

    /// The config in force.
    pub fn config(&self) -> Arc<MetalConfig> {
        self.inner.config.read().clone()
    }

    /// Re-reads the cloud-config file; a bad edit is logged and the old config kept. Returns
    /// whether a new config took effect.
    pub fn reload(&self) -> Result<bool, ConfigError> {
        let Some(path) = &self.inner.path else {
            return Ok(false);
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::general(format!("cannot read the file: {e}"))
                .in_file(path.display().to_string())
        })?;
        if *self.inner.last_text.read() == text {
            return Ok(false);
        }
        let parsed =
            MetalConfig::parse(&text).map_err(|e| e.in_file(path.display().to_string()))?;
        *self.inner.last_text.write() = text;
        self.apply(parsed);
        Ok(true)
    }

    /// Puts `config` in force: machines at once, pools without moving any held address.
    /// Route table, BMC limits and timeouts keep their startup values.
    /// `load_balancer_class` keeps its startup value (a change is logged, and takes effect at
    /// the next start).
    pub fn apply(&self, config: MetalConfig) {
        if config.load_balancer_class != self.inner.class {
            tracing::warn!(
                running = ?self.inner.class,
                configured = ?config.load_balancer_class,
                "metal: load_balancer_class changed in the cloud-config; it takes effect when the CCM restarts"
            );
        }
        let pools_changed = *self.inner.lb.pools() != config.pools;
        self.inner.lb.set_pools(config.pools.clone());
        if pools_changed && let Some(bgp) = self.vip_speaker().cloned() {
            // The pools' communities and LOCAL_PREF apply to what is announced now.
            let pools = config.pools.clone();
            if tokio::runtime::Handle::try_current().is_ok() {
                tokio::spawn(async move { bgp.set_pools(pools).await });
            }
        }
        *self.inner.config.write() = Arc::new(config);
        if pools_changed {
            // Services waiting for an address try the new pools now.
            self.inner.lb.requeue_pending(None);
            if self.client().is_some() {
                let me = self.clone();
                tokio::spawn(async move { me.report_orphans().await });
            }
        }
    }

    /// Whether the provider serves `svc`'s `spec.loadBalancerClass` (the service controller's
    /// filter, for the provider's own watchers).
    pub(crate) fn serves_class(&self, svc: &ccm_cloud::Service) -> bool {
        svc.spec
            .as_ref()
            .and_then(|s| s.load_balancer_class.as_deref())
            == self.inner.class.as_deref()
    }

    fn spawn_reloader(&self, shutdown: CancellationToken) {
        if self.inner.path.is_none() {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(RELOAD_PERIOD);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tick.tick() => {}
                }
                match me.reload() {
                    Ok(true) => {
                        tracing::info!(path = ?me.inner.path, "metal cloud-config reloaded")
                    }
                    Ok(false) => {}
                    Err(e) => {
                        tracing::error!(error = %e, "metal cloud-config not reloaded; keeping the previous one")
                    }
                }
            }
        });
    }

    pub(crate) fn client(&self) -> Option<kube::Client> {
        self.inner.client.read().clone()
    }
}

#[async_trait]
impl CloudProvider for MetalCloud {
    fn provider_name(&self) -> &str {
        PROVIDER_NAME
    }

    async fn initialize(&self, ctx: InitContext) -> CloudResult<()> {
        *self.inner.client.write() = Some(ctx.client.clone());
        // A new leadership term rebuilds the LB table from the cluster before allocating.
        self.inner.lb.reset().await;
        if let Some(routes) = &self.inner.routes {
            let me = self.clone();
            let warn = Arc::new(move |peer: String, reason: &'static str, text: String| {
                let me = me.clone();
                tokio::spawn(async move { me.warn_bgp(&peer, reason, text).await });
            });
            let vips = self.initial_vips(&ctx.client).await;
            routes
                .start_term(&ctx.client, vips, ctx.shutdown.clone(), warn)
                .await;
        }
        if !self.config().pools.is_empty() {
            // Addresses a pool edit left uncovered while the CCM was down are reported too.
            let me = self.clone();
            tokio::spawn(async move { me.report_orphans().await });
        }
        self.spawn_endpoint_watch(ctx.client.clone(), ctx.shutdown.clone());
        if self.config().kube_vip_annotation {
            self.spawn_kube_vip_sync(ctx.client.clone(), ctx.shutdown.clone());
        }
        self.spawn_reloader(ctx.shutdown);
        Ok(())
    }

    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "ccm_metal_pool_addresses",
            "Addresses of each LoadBalancer pool by family and state (total, assigned, free)",
            self.inner.lb.gauges.clone(),
        );
        if let Some(bgp) = self.inner.routes.as_ref().and_then(|r| r.bgp.as_ref()) {
            let m = &bgp.metrics;
            registry.register(
                "ccm_metal_bgp_session_up",
                "1 while the BGP session to the peer is Established (routes.mode = bgp, leader only)",
                m.session_up.clone(),
            );
            registry.register(
                "ccm_metal_bgp_announced_prefixes",
                "Pod CIDRs announced over BGP, by family",
                m.announced.clone(),
            );
            if bgp.announces_load_balancers() {
                registry.register(
                    "ccm_metal_bgp_announced_load_balancer_addresses",
                    "LoadBalancer addresses announced over BGP (with at least one Node to serve them), by family",
                    m.announced_vips.clone(),
                );
                registry.register(
                    "ccm_metal_bgp_load_balancer_paths",
                    "Paths (LoadBalancer address, serving Node) announced over BGP, by family",
                    m.vip_paths.clone(),
                );
            }
            registry.register(
                "ccm_metal_bgp_daemon_restarts",
                "Unplanned exits of the BIRD daemon ccm-rs supervises",
                m.restarts.clone(),
            );
        }
    }

    fn instances(&self) -> Option<Arc<dyn Instances>> {
        Some(Arc::new(self.clone()))
    }

    fn load_balancer(&self) -> Option<Arc<dyn LoadBalancer>> {
        Some(Arc::new(self.clone()))
    }

    fn routes(&self) -> Option<Arc<dyn Routes>> {
        self.inner
            .routes
            .as_ref()
            .map(|_| Arc::new(self.clone()) as Arc<dyn Routes>)
    }
}
