//! # ccm-provider-sim: the simulated cloud
//!
//! The cloud that ccm-rs's tests, `ccm demo` and `ccm bench` run on. It behaves like a small
//! EC2-flavoured cloud — instances, a route table per cluster, load balancers with VIPs — and
//! lets a test make it behave badly on purpose: latency, random and scripted failures, and
//! throttling, per operation. It counts every call it receives and logs every write with the
//! identity of the caller, so a test can prove how much a controller cost the cloud and who
//! wrote what.
//!
//! ```
//! use ccm_cloud::{CloudProvider, op};
//! use ccm_provider_sim::{InstanceSpec, SimCloud, fixtures};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let sim = SimCloud::seeded(7);
//! let id = sim.add_instance(InstanceSpec::new("node-1"));
//! sim.fail_next(op::INSTANCES_STATUS, 1).expect("known op");
//!
//! // `sim.instances()` is the inspection snapshot; the capability is `CloudProvider::instances`.
//! let instances = CloudProvider::instances(&sim).expect("sim has instances");
//! let node = std::sync::Arc::new(fixtures::node("node-1", None));
//! assert!(instances.instances_status(&[node.clone()]).await[0].is_err()); // injected
//! let status = instances.instances_status(&[node]).await;
//! assert!(status[0].as_ref().expect("second call succeeds").exists);
//! assert_eq!(sim.call_count(op::INSTANCES_STATUS), 2);
//!
//! sim.stop_instance(&id).expect("exists"); // emits a Stopped instance event
//! # }
//! ```
//!
//! ## Behaviour, and what it copies
//! - **Instances**: provider IDs are `sim://<id>`; lookups go by providerID, then by node name
//!   (InstancesV2). Stopped instances exist and are shut down; terminated ones stop existing at
//!   once. `instances_metadata`/`instances_status` are one API call per batch and refuse
//!   batches above `max_batch_size`. The control API emits `instance_events`.
//! - **Routes**: one route per destination CIDR in each cluster's table, named
//!   `<name hint>-<cidr>`. As in EC2, creating an existing destination fails with
//!   `RouteAlreadyExists` and the target node must be a live instance; routes to terminated
//!   instances are listed as blackholes. Deleting a missing route succeeds.
//! - **Load balancers**: keyed by cluster and name (`a` + Service UID, upstream's default).
//!   Ensure creates or updates and reports the VIP as ingress IP; update replaces only the
//!   backend hosts and fails for a missing LB; delete is idempotent. VIPs are unique among live
//!   LBs and not reused right away.
//! - **Volumes** (disks): each has a zone and a region; `volume_topology` answers a batch of
//!   ids in one call (unknown ids are left out), for PVs of the [`SIM_CSI_DRIVER`] driver.
//! - **Faults** happen before a call touches state, so a failed call changes nothing. Throttled
//!   calls fail at once with `RequestLimitExceeded`; other calls first sleep their latency
//!   (`tokio::time::sleep`, so paused-time tests run instantly).
//!
//! ## Config file (`--cloud-provider sim --cloud-config FILE`)
//! Registered by [`register`]; parsed into [`SimConfig`]. Unknown fields and operation names
//! are errors that name the field.
//! ```toml
#![doc = include_str!("../examples/sim-cloud.toml")]
//! ```
//!
//! ## Sharing one cloud between processes
//! [`SimServer::start`] serves a [`SimCloud`] over HTTP; a config with `endpoint` (and `actor`)
//! selects [`RemoteSim`], a provider that forwards every call there. See [`remote`].

pub mod cloud;
mod config;
pub mod faults;
pub mod fixtures;
mod provider;
pub mod remote;
mod volumes;

pub use cloud::{
    DEFAULT_ACTOR, DEFAULT_MAX_BATCH_SIZE, DEFAULT_VIP_RANGE, InstanceSpec, InstanceState,
    Mutation, PROVIDER_NAME, SimAddress, SimCloud, SimError, SimInstance, SimLoadBalancer,
    SimOptions, SimPort, SimRoute, provider_id,
};
pub use config::{LatencyConfig, SimConfig, ThrottleConfig, register};
pub use faults::{ALL_OPS, Latency, SIM_OPS, Throttle, known_op};
pub use provider::{parse_provider_id, route_name};
pub use remote::{RemoteSim, SimServer};
pub use volumes::{SIM_CSI_DRIVER, SimVolume, VolumeSpec};
