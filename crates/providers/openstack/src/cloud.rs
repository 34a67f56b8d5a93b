//! The provider value and its registration as `--cloud-provider=openstack`.

use std::sync::Arc;

use async_trait::async_trait;
use ccm_cloud::{
    CloudError, CloudProvider, CloudResult, ConfigError, InitContext, Instances, LoadBalancer,
    ProviderRegistry, RegistryError, Routes,
};

use crate::config::OpenStackConfig;
use crate::http::Http;
use crate::keystone::Keystone;
use crate::lbopts::LbConfig;
use crate::octavia::OctaviaLb;
use crate::routes::{NeutronRoutes, RouteState};

/// `--cloud-provider` name and providerID scheme.
pub const PROVIDER_NAME: &str = "openstack";

/// Upstream's switch for regional providerIDs (`openstack://<region>/<id>`).
pub const REGIONAL_PROVIDER_ID_ENV: &str = "OS_CCM_REGIONAL";

struct Inner {
    config: OpenStackConfig,
    http: Arc<Http>,
    keystone: Keystone,
    regional: bool,
    routes: RouteState,
    lb: LbConfig,
}

/// The OpenStack provider: Keystone auth, batched Nova instances, Neutron extraroutes.
#[derive(Clone)]
pub struct OpenStackCloud(Arc<Inner>);

impl OpenStackCloud {
    /// A provider for `config`. No network call is made until the first lookup (or
    /// [`CloudProvider::initialize`], which authenticates once to fail fast on bad credentials).
    pub fn new(config: OpenStackConfig) -> Result<Self, ConfigError> {
        let regional = std::env::var(REGIONAL_PROVIDER_ID_ENV).is_ok_and(|v| v == "true");
        Self::with_regional_provider_id(config, regional)
    }

    /// As [`OpenStackCloud::new`], with the providerID form given instead of read from
    /// `OS_CCM_REGIONAL`.
    pub fn with_regional_provider_id(
        config: OpenStackConfig,
        regional: bool,
    ) -> Result<Self, ConfigError> {
        let g = &config.global;
        let http = Http::new(
            g.ca_file.as_deref(),
            g.tls_insecure,
            config.metadata.request_timeout,
        )
        .map_err(|e| ConfigError::field("[Global] ca-file", e))?;
        let http = Arc::new(http);
        let (lb, ignored) = LbConfig::from_pairs(&config.load_balancer)?;
        for key in ignored {
            tracing::warn!(
                key,
                "this [LoadBalancer] key is not built in ccm-rs's openstack provider; it has no effect (docs/providers/openstack.md)"
            );
        }
        let keystone = Keystone::new(http.clone(), g.clone(), config.interface());
        Ok(OpenStackCloud(Arc::new(Inner {
            config,
            http,
            keystone,
            regional,
            routes: RouteState::default(),
            lb,
        })))
    }

    /// The parsed cloud-config.
    pub fn config(&self) -> &OpenStackConfig {
        &self.0.config
    }

    /// The Keystone client (token, catalog), shared by every call of this provider.
    pub fn keystone(&self) -> &Keystone {
        &self.0.keystone
    }

    pub(crate) fn route_state(&self) -> &RouteState {
        &self.0.routes
    }

    pub(crate) fn regional_provider_id(&self) -> bool {
        self.0.regional
    }

    /// OpenStack API calls made so far, by operation (`compute GET /servers/detail`,
    /// `identity POST /auth/tokens`, …): what the cloud's quota sees.
    pub fn api_calls(&self) -> std::collections::BTreeMap<String, u64> {
        self.0.http.calls()
    }
}

#[async_trait]
impl CloudProvider for OpenStackCloud {
    fn provider_name(&self) -> &str {
        PROVIDER_NAME
    }

    async fn initialize(&self, _ctx: InitContext) -> CloudResult<()> {
        self.check().await
    }

    fn instances(&self) -> Option<Arc<dyn Instances>> {
        Some(Arc::new(self.clone()))
    }

    /// Octavia load balancers; `None` with `[LoadBalancer] enabled = false` (as upstream).
    fn load_balancer(&self) -> Option<Arc<dyn LoadBalancer>> {
        let config = self.0.lb.clone();
        config.enabled.then(|| {
            Arc::new(OctaviaLb {
                cloud: self.clone(),
                config,
            }) as Arc<dyn LoadBalancer>
        })
    }

    /// Neutron extraroutes on `[Route] router-id`; `None` when it is unset (as upstream).
    fn routes(&self) -> Option<Arc<dyn Routes>> {
        let router_id = self.config().router_id.clone().filter(|r| !r.is_empty())?;
        Some(Arc::new(NeutronRoutes {
            cloud: self.clone(),
            router_id,
        }))
    }
}

impl OpenStackCloud {
    /// Authenticates and finds compute in the catalog: what `initialize` does to fail fast on
    /// bad credentials or a wrong region (upstream authenticates when the provider is built and
    /// exits on failure).
    pub async fn check(&self) -> CloudResult<()> {
        match self.keystone().endpoint("compute").await {
            Ok(_) => Ok(()),
            Err(CloudError::NotImplemented) => Err(CloudError::Permanent(format!(
                "the service catalog has no compute endpoint for region {:?}, interface {:?}",
                self.config().global.region,
                self.config().interface()
            ))),
            Err(e) => Err(e),
        }
    }
}

/// Registers `openstack` in `registry`: `--cloud-provider=openstack --cloud-config=cloud.conf`.
pub fn register(registry: &mut ProviderRegistry) -> Result<(), RegistryError> {
    registry.register(PROVIDER_NAME, |cfg| {
        let config = OpenStackConfig::from_cloud_config(cfg)?;
        Ok(Arc::new(OpenStackCloud::new(config)?) as Arc<dyn CloudProvider>)
    })
}
