//! A third-party cloud-controller-manager binary built on ccm-rs: one trait impl, one registry
//! entry, and `main` hands over to [`ccm_manager::app::main`], which brings every upstream flag,
//! HTTPS serving with delegated authn/authz, leader election, the four controllers and signals.
//!
//! Build and run it like the real thing:
//! `cargo run -p ccm-manager --example tiny-provider -- --cloud-provider=tiny --cloud-config=tiny.toml --kubeconfig=…`
//! See docs/provider-guide.md.

use std::process::ExitCode;
use std::sync::Arc;

use async_trait::async_trait;
use ccm_cloud::{
    CloudConfig, CloudProvider, CloudResult, ConfigError, InstanceMetadata, Instances, Node,
    ProviderRegistry, node_name,
};

/// The provider's `--cloud-config` (TOML).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TinyConfig {
    /// Every node lives in this zone.
    zone: String,
    /// ... of this region.
    region: String,
}

/// A cloud where every node is a VM named after the node.
struct TinyCloud {
    config: TinyConfig,
}

#[async_trait]
impl Instances for TinyCloud {
    async fn instance_exists(&self, _node: &Node) -> CloudResult<bool> {
        Ok(true)
    }
    async fn instance_shutdown(&self, _node: &Node) -> CloudResult<bool> {
        Ok(false)
    }
    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        Ok(Some(InstanceMetadata {
            provider_id: format!("tiny://{}", node_name(node)),
            instance_type: "small".into(),
            zone: self.config.zone.clone(),
            region: self.config.region.clone(),
            ..Default::default()
        }))
    }
}

/// The root trait: name and capabilities (no load balancers, no routes).
struct Tiny(Arc<TinyCloud>);

impl CloudProvider for Tiny {
    fn provider_name(&self) -> &str {
        "tiny"
    }
    fn instances(&self) -> Option<Arc<dyn Instances>> {
        Some(self.0.clone())
    }
}

/// `--cloud-config` → provider; errors name the file and field.
fn build(config: Option<&CloudConfig>) -> Result<Arc<dyn CloudProvider>, ConfigError> {
    let config = match config {
        Some(c) => c.parse_toml::<TinyConfig>()?,
        None => TinyConfig::default(),
    };
    Ok(Arc::new(Tiny(Arc::new(TinyCloud { config }))))
}

fn main() -> ExitCode {
    let mut providers = ProviderRegistry::new();
    if let Err(e) = providers.register("tiny", build) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    ccm_manager::app::main(providers)
}
