//! The `--cloud-config` file format of the sim provider and its registration.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ccm_cloud::{CloudConfig, CloudProvider, ConfigError, ProviderRegistry, RegistryError};
use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use crate::cloud::{
    DEFAULT_MAX_BATCH_SIZE, InstanceSpec, InstanceState, PROVIDER_NAME, SimCloud, SimOptions,
};
use crate::faults::{Latency, SIM_OPS, Throttle, known_op};
use crate::remote::RemoteSim;

/// The sim provider's config file (TOML). Every table and field is optional; unknown fields are
/// errors that name the field. See `examples/sim-cloud.toml` and the crate docs. Written out,
/// it holds only what is set, so a config written by a newer tool loads in an older CCM unless
/// it uses a newer field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimConfig {
    /// Use a sim cloud served by another process (`ccm kube-sim`, a test, `ccm bench`) at this
    /// URL instead of an in-process one. Then only `actor` may be set besides: faults and
    /// instances belong to the serving process.
    pub endpoint: Option<String>,
    /// The identity recorded in the mutation log for this process's calls.
    pub actor: Option<String>,
    /// Seed for fault and jitter randomness; omit for a different run every time.
    pub seed: Option<u64>,
    /// IPv4 CIDR that load balancer VIPs come from (default `198.18.0.0/15`).
    pub vip_range: Option<Ipv4Net>,
    /// Largest batch one `instances_*` call accepts (default 500).
    pub max_batch_size: Option<usize>,
    /// Latency per operation name, `"*"` for every operation without its own entry.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub latency: BTreeMap<String, LatencyConfig>,
    /// Probability (0..=1) that a call fails with a transient error, per operation or `"*"`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub error_rate: BTreeMap<String, f64>,
    /// Cloud-side rate limit per operation, `"*"` for the whole API.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub throttle: BTreeMap<String, ThrottleConfig>,
    /// Instances that exist from the start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<InstanceSpec>,
    /// Disks that exist from the start (for the PersistentVolume labeler).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<crate::VolumeSpec>,
}

/// `[latency.<op>]`: fixed plus uniformly random jitter, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LatencyConfig {
    /// Always added.
    #[serde(default)]
    pub fixed_ms: u64,
    /// Upper bound of the random extra.
    #[serde(default)]
    pub jitter_ms: u64,
}

/// `[throttle.<op>]`: a token bucket.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThrottleConfig {
    /// Sustained calls per second.
    pub qps: f64,
    /// Calls allowed at once from a full bucket.
    pub burst: u32,
}

fn check_op(table: &str, name: &str) -> Result<&'static str, ConfigError> {
    known_op(name).ok_or_else(|| {
        let hint = ccm_cloud::nearest(name, SIM_OPS.iter().copied())
            .map(|s| format!(" (did you mean {s:?}?)"))
            .unwrap_or_default();
        ConfigError::field(
            format!("{table}.{name}"),
            format!(
                "an operation name{hint}: \"*\" or one of {}",
                SIM_OPS.join(", ")
            ),
        )
    })
}

impl SimConfig {
    /// Checks what serde cannot: operation names, ranges, and that a remote config sets nothing
    /// the remote side owns. Errors name the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(endpoint) = &self.endpoint {
            if !(endpoint.starts_with("http://")) {
                return Err(ConfigError::field(
                    "endpoint",
                    format!("an http:// URL of a sim server, got {endpoint:?}"),
                ));
            }
            let owned_by_server = [
                ("seed", self.seed.is_some()),
                ("vip_range", self.vip_range.is_some()),
                ("max_batch_size", self.max_batch_size.is_some()),
                ("latency", !self.latency.is_empty()),
                ("error_rate", !self.error_rate.is_empty()),
                ("throttle", !self.throttle.is_empty()),
                ("instances", !self.instances.is_empty()),
                ("volumes", !self.volumes.is_empty()),
            ];
            if let Some((field, _)) = owned_by_server.iter().find(|(_, set)| *set) {
                return Err(ConfigError::field(
                    *field,
                    "nothing but `actor` next to `endpoint`: the serving process owns the cloud's settings",
                ));
            }
            return Ok(());
        }
        if self.max_batch_size == Some(0) {
            return Err(ConfigError::field("max_batch_size", "a number >= 1"));
        }
        if let Some(range) = self.vip_range
            && range.prefix_len() > 30
        {
            return Err(ConfigError::field(
                "vip_range",
                format!("an IPv4 CIDR with room for VIPs (prefix at most /30), got {range}"),
            ));
        }
        for name in self.latency.keys() {
            check_op("latency", name)?;
        }
        for (name, rate) in &self.error_rate {
            check_op("error_rate", name)?;
            if !(0.0..=1.0).contains(rate) {
                return Err(ConfigError::field(
                    format!("error_rate.{name}"),
                    format!("a probability between 0 and 1, got {rate}"),
                ));
            }
        }
        for (name, t) in &self.throttle {
            check_op("throttle", name)?;
            if !(t.qps.is_finite() && t.qps > 0.0) {
                return Err(ConfigError::field(
                    format!("throttle.{name}.qps"),
                    format!("a rate above 0, got {}", t.qps),
                ));
            }
            if t.burst == 0 {
                return Err(ConfigError::field(
                    format!("throttle.{name}.burst"),
                    "a burst of at least 1",
                ));
            }
        }
        let mut names = BTreeSet::new();
        for (i, inst) in self.instances.iter().enumerate() {
            if inst.name.is_empty() {
                return Err(ConfigError::field(
                    format!("instances[{i}].name"),
                    "a non-empty node name",
                ));
            }
            if !names.insert(inst.name.as_str()) {
                return Err(ConfigError::field(
                    format!("instances[{i}].name"),
                    format!("a unique node name; {:?} appears twice", inst.name),
                ));
            }
            if inst.state == InstanceState::Terminated {
                return Err(ConfigError::field(
                    format!("instances[{i}].state"),
                    "\"running\" or \"stopped\"",
                ));
            }
        }
        Ok(())
    }

    /// Builds the in-process cloud this config describes (ignores `endpoint` and `actor`).
    pub fn build_cloud(&self) -> Result<SimCloud, ConfigError> {
        self.validate()?;
        let defaults = SimOptions::default();
        let sim = SimCloud::with_options(SimOptions {
            seed: self.seed,
            vip_range: self.vip_range.unwrap_or(defaults.vip_range),
            max_batch_size: self.max_batch_size.unwrap_or(DEFAULT_MAX_BATCH_SIZE),
        });
        let field_err =
            |field: String| move |e: crate::SimError| ConfigError::field(field, e.to_string());
        for (name, l) in &self.latency {
            sim.set_latency(name, Latency::from_millis(l.fixed_ms, l.jitter_ms))
                .map_err(field_err(format!("latency.{name}")))?;
        }
        for (name, rate) in &self.error_rate {
            sim.set_error_rate(name, *rate)
                .map_err(field_err(format!("error_rate.{name}")))?;
        }
        for (name, t) in &self.throttle {
            sim.set_throttle(
                name,
                Some(Throttle {
                    qps: t.qps,
                    burst: t.burst,
                }),
            )
            .map_err(field_err(format!("throttle.{name}")))?;
        }
        for inst in &self.instances {
            sim.add_instance(inst.clone());
        }
        for volume in &self.volumes {
            sim.add_volume(volume.clone());
        }
        Ok(match &self.actor {
            Some(actor) => sim.with_actor(actor),
            None => sim,
        })
    }

    /// Builds the provider this config selects: a [`RemoteSim`] when `endpoint` is set, else
    /// an in-process [`SimCloud`].
    pub fn build_provider(&self) -> Result<Arc<dyn CloudProvider>, ConfigError> {
        self.validate()?;
        match &self.endpoint {
            Some(endpoint) => {
                let actor = self.actor.as_deref().unwrap_or(crate::DEFAULT_ACTOR);
                Ok(Arc::new(RemoteSim::new(endpoint, actor)?))
            }
            None => Ok(Arc::new(self.build_cloud()?)),
        }
    }
}

/// Registers the `sim` provider. Without `--cloud-config` it is an empty in-process cloud
/// (useful only with something adding instances); with one, see [`SimConfig`].
pub fn register(registry: &mut ProviderRegistry) -> Result<(), RegistryError> {
    registry.register(PROVIDER_NAME, |config: Option<&CloudConfig>| match config {
        None => Ok(Arc::new(SimCloud::new()) as Arc<dyn CloudProvider>),
        Some(config) => config
            .parse_toml::<SimConfig>()?
            .build_provider()
            .map_err(|e| e.in_file(config.path.display().to_string())),
    })
}
