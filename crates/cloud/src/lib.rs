//! # ccm-cloud: the provider interface of ccm-rs
//!
//! A cloud provider author implements [`CloudProvider`] and whichever of [`Instances`],
//! [`LoadBalancer`] and [`Routes`] the cloud supports; ccm-rs supplies every controller.
//!
//! The interface mirrors upstream `k8s.io/cloud-provider` (InstancesV2, LoadBalancer, Routes,
//! sentinel errors) so its contracts carry over unchanged, and adds what lets a CCM cost the
//! cloud almost nothing when the cluster is idle:
//! - **batch lookups** ([`Instances::instances_metadata`], [`Instances::instances_status`]) with
//!   per-node fallbacks, so a provider that can answer 1,000 instances per API call does;
//! - an **instance event stream** ([`Instances::instance_events`]) so controllers react to a
//!   terminated or stopped instance instead of polling for it.
//!
//! Around any provider, [`metered`] adds the `cloudprovider_api_*` metrics and an optional
//! client-side rate limit, and [`ProviderRegistry`] maps `--cloud-provider` names to
//! constructors that receive `--cloud-config`.
//!
//! | upstream (`k8s.io/cloud-provider`) | ccm-cloud |
//! |---|---|
//! | `Interface.Initialize(clientBuilder, stop)` | [`CloudProvider::initialize`] with [`InitContext`] |
//! | `Interface.InstancesV2() (InstancesV2, bool)` | [`CloudProvider::instances`] → `Option` |
//! | `Interface.Instances()`, `Zones()`, `Clusters()` | not offered: external providers use InstancesV2 |
//! | `Interface.LoadBalancer()` / `Routes()` | [`CloudProvider::load_balancer`] / [`CloudProvider::routes`] |
//! | `ProviderName()`, `HasClusterID()` | [`CloudProvider::provider_name`], [`CloudProvider::has_cluster_id`] |
//! | `InstanceExists` / `InstanceShutdown` / `InstanceMetadata` | same names on [`Instances`] |
//! | — | [`Instances::instances_metadata`], [`Instances::instances_status`], [`Instances::instance_events`] |
//! | — | [`LoadBalancer::load_balancer_class`], [`LoadBalancer::service_requeues`] |
//! | `GetLoadBalancer` `(status, exists, err)` | [`LoadBalancer::get_load_balancer`] → `Option<status>` |
//! | `EnsureLoadBalancer`, `UpdateLoadBalancer`, `EnsureLoadBalancerDeleted` | same names |
//! | `ListRoutes`, `CreateRoute(nameHint)`, `DeleteRoute` | same names on [`Routes`] |
//! | app `WebhookConfigs` (KEP-2699) | [`CloudProvider::webhooks`]; the PV labeler from [`CloudProvider::volumes`] |
//! | `InstanceNotFound`, `NotImplemented`, `ImplementedElsewhere`, `api.RetryError` | [`CloudError`] variants |
//! | `RegisterCloudProvider` (global, fatal on duplicate) | [`ProviderRegistry::register`] (a value; error on duplicate) |

mod error;
pub mod gcfg;
mod metering;
mod provider;
mod ratelimit;
mod registry;
pub mod tls;
mod types;
mod volume;
pub mod webhook;

pub use error::{CloudError, CloudResult, ConfigError};
pub use metering::{CloudMetrics, MeterOptions, metered, op};
pub use provider::{
    CloudProvider, DEFAULT_FALLBACK_CONCURRENCY, InitContext, Instances, LoadBalancer, Routes,
    ServiceRequeue, fallback_instances_metadata, fallback_instances_status,
};
pub use ratelimit::{RateLimiter, TokenBucket};
pub use registry::{
    CloudConfig, ProviderFactory, ProviderRegistry, RegistryError, nearest, parse_toml_str,
};
pub use types::{
    InstanceEvent, InstanceEventKind, InstanceMetadata, InstanceStatus, LoadBalancerStatus, Node,
    NodeAddress, NodeAddressKey, Route, Service, default_load_balancer_name, node_name,
    node_provider_id,
};
pub use volume::{VolumeTopology, Volumes};

/// Re-exported so providers name the same Kubernetes API version as the controllers.
pub use k8s_openapi;
