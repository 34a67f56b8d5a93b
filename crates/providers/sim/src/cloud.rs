//! The simulated cloud's state, its control API and its inspection API.

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ccm_cloud::{CloudError, CloudResult, InstanceEvent, InstanceEventKind, NodeAddress};
use ipnet::Ipv4Net;
use parking_lot::Mutex;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;
use tokio::time::Instant;

use crate::faults::{Decision, Faults, Latency, Throttle, known_op};

/// The provider name: `--cloud-provider sim`, and the scheme of `sim://<instance-id>` IDs.
pub const PROVIDER_NAME: &str = "sim";

/// Default for [`crate::SimConfig::max_batch_size`]: EC2 takes 1,000 ids per call; half that
/// keeps a default sim honest about chunking without making every test build huge batches.
pub const DEFAULT_MAX_BATCH_SIZE: usize = 500;

/// Default VIP range: RFC 2544's benchmarking block, 131,070 usable addresses, so `ccm bench`
/// never runs out and no VIP collides with a real network.
pub const DEFAULT_VIP_RANGE: &str = "198.18.0.0/15";

/// The actor recorded for calls made through a handle that never called
/// [`SimCloud::with_actor`].
pub const DEFAULT_ACTOR: &str = "default";

/// Instance events are broadcast to every subscriber; a subscriber more than this many events
/// behind loses the oldest ones (and a warning is logged), as with any cloud event bus.
const EVENT_CAPACITY: usize = 4096;

/// Power state of a simulated instance.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InstanceState {
    /// Powered on: exists, not shut down.
    #[default]
    Running,
    /// Powered off: exists, shut down (the Node gets the shutdown taint).
    Stopped,
    /// Gone for good: lookups no longer find it, routes to it become blackholes. Kept in
    /// [`SimCloud::instances`] so tests can see what happened.
    Terminated,
}

/// A node address as the sim stores it (serializable, unlike `k8s_openapi::NodeAddress`'s
/// hash-less form).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SimAddress {
    /// `InternalIP`, `ExternalIP` or `Hostname`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The address.
    pub address: String,
}

impl From<&SimAddress> for NodeAddress {
    fn from(a: &SimAddress) -> Self {
        NodeAddress {
            type_: a.type_.clone(),
            address: a.address.clone(),
        }
    }
}

impl From<&ccm_cloud::NodeAddressKey> for SimAddress {
    fn from(a: &ccm_cloud::NodeAddressKey) -> Self {
        SimAddress {
            type_: a.type_.clone(),
            address: a.address.clone(),
        }
    }
}

impl From<&SimAddress> for ccm_cloud::NodeAddressKey {
    fn from(a: &SimAddress) -> Self {
        ccm_cloud::NodeAddressKey {
            type_: a.type_.clone(),
            address: a.address.clone(),
        }
    }
}

/// What to create with [`SimCloud::add_instance`] (and the `[[instances]]` entries of the config
/// file). Only `name` is required; the rest defaults to something plausible so tests stay short.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceSpec {
    /// The Kubernetes node name the instance will register as.
    pub name: String,
    /// Instance type; default `sim.medium`.
    pub instance_type: Option<String>,
    /// Zone; default `region-1a`.
    pub zone: Option<String>,
    /// Region; default `region-1`.
    pub region: Option<String>,
    /// InternalIP; default the next address of 10.0.0.0/8.
    pub internal_ip: Option<IpAddr>,
    /// ExternalIP; default none.
    pub external_ip: Option<IpAddr>,
    /// Hostname address; default the name.
    pub hostname: Option<String>,
    /// Initial state (`running` or `stopped`); default running.
    #[serde(default)]
    pub state: InstanceState,
    /// Extra labels reported in the instance metadata.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

impl InstanceSpec {
    /// A running instance named `name` with default everything else.
    pub fn new(name: impl Into<String>) -> Self {
        InstanceSpec {
            name: name.into(),
            ..Default::default()
        }
    }
}

/// One simulated instance, as the cloud sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimInstance {
    /// `i-` and 17 hex digits, like EC2; the provider ID is `sim://<id>`.
    pub id: String,
    /// Node name.
    pub name: String,
    /// Instance type.
    pub instance_type: String,
    /// Zone.
    pub zone: String,
    /// Region.
    pub region: String,
    /// Addresses reported as the Node's `status.addresses`.
    pub addresses: Vec<SimAddress>,
    /// Power state.
    pub state: InstanceState,
    /// Extra labels reported in the metadata.
    pub labels: BTreeMap<String, String>,
}

impl SimInstance {
    /// `sim://<id>`, the value for the Node's `spec.providerID`.
    pub fn provider_id(&self) -> String {
        provider_id(&self.id)
    }
}

/// `sim://<id>` for an instance id.
pub fn provider_id(instance_id: &str) -> String {
    format!("{PROVIDER_NAME}://{instance_id}")
}

/// One entry of a cluster's route table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimRoute {
    /// The cluster that owns the route (each cluster has its own table).
    pub cluster: String,
    /// Derived from the name hint and the CIDR, so both CIDRs of a dual-stack node get
    /// distinct names.
    pub name: String,
    /// Canonical destination CIDR: the table's key.
    pub destination_cidr: String,
    /// Node name given at creation.
    pub target_node: String,
    /// The instance the node name resolved to at creation; the route is a blackhole once it is
    /// terminated, as in EC2.
    pub target_instance: String,
    /// Echoed back by `list_routes`.
    pub target_node_addresses: Vec<SimAddress>,
    /// Echoed back by `list_routes`.
    pub enable_node_addresses: bool,
}

/// One listener of a load balancer.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SimPort {
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// The Service port.
    pub port: i32,
    /// The node port traffic is forwarded to.
    pub node_port: i32,
}

/// One simulated load balancer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimLoadBalancer {
    /// The cluster that owns it.
    pub cluster: String,
    /// Cloud name, from [`ccm_cloud::LoadBalancer::load_balancer_name`].
    pub name: String,
    /// Service namespace.
    pub service_namespace: String,
    /// Service name.
    pub service_name: String,
    /// Service UID.
    pub service_uid: String,
    /// Listeners.
    pub ports: Vec<SimPort>,
    /// Backend node names, sorted.
    pub hosts: Vec<String>,
    /// The virtual IP, unique among live LBs; reported as the Service's ingress IP.
    pub vip: Ipv4Addr,
}

/// One change to the cloud, for tests that must prove who wrote what and when (e.g. that two
/// leaders never wrote at the same time).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mutation {
    /// Position in the log, starting at 1 and never reused (not even after
    /// [`SimCloud::take_mutations`]): a total order even when clocks tie.
    pub seq: u64,
    /// Wall-clock time, for humans and for comparing with other processes' logs.
    pub wall: SystemTime,
    /// Monotonic (tokio) time, so paused-time tests can reason about it. Not sent over HTTP:
    /// a [`crate::RemoteSim`] reader gets its receive time here; use `seq`/`since_start`.
    #[serde(skip, default = "Instant::now")]
    pub at: Instant,
    /// Monotonic time since the sim was created; survives the trip over HTTP.
    pub since_start: Duration,
    /// Who made the call ([`SimCloud::with_actor`], or the `x-sim-actor` header over HTTP).
    pub actor: String,
    /// The operation (a [`ccm_cloud::op`] name, or a control action such as `stop_instance`).
    pub operation: String,
    /// What it touched: `instance/<id>`, `route/<cluster>/<cidr>`, `lb/<cluster>/<name>`.
    pub object: String,
    /// False for successful calls that found nothing to do (e.g. deleting a missing LB): still a
    /// write attempt, which matters to a failover test.
    pub changed: bool,
}

/// Why a control-API call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// No instance has this id.
    #[error("no instance {0:?} in the simulated cloud")]
    UnknownInstance(String),
    /// The instance is terminated and cannot change state any more.
    #[error("instance {0:?} is terminated")]
    Terminated(String),
    /// The operation name is not one of [`crate::SIM_OPS`] or `"*"`.
    #[error("unknown operation {0:?}; expected \"*\" or one of: {ops}", ops = crate::SIM_OPS.join(", "))]
    UnknownOp(String),
    /// A value was out of range.
    #[error("invalid value: {0}")]
    Invalid(String),
}

/// The simulated cloud: a cheaply clonable, thread-safe handle.
///
/// It implements [`ccm_cloud::CloudProvider`] (with instances, load balancers and routes) and
/// adds a control API (add/stop/start/terminate instances, faults) and an inspection API
/// (snapshots, call accounting, mutation log). Clones share one cloud; [`SimCloud::with_actor`]
/// makes a clone whose calls are recorded under another identity.
///
/// `SimCloud` implements [`ccm_cloud::Instances`], [`ccm_cloud::LoadBalancer`] and
/// [`ccm_cloud::Routes`] itself, so with those traits in scope `sim.create_route(..)` works. Its
/// inspection methods [`SimCloud::instances`] and [`SimCloud::routes`] shadow the
/// [`ccm_cloud::CloudProvider`] methods of the same names: call those as
/// `CloudProvider::instances(&sim)`, or go through [`SimCloud::provider`].
#[derive(Clone)]
pub struct SimCloud {
    pub(crate) inner: Arc<Inner>,
    pub(crate) actor: Arc<str>,
}

impl std::fmt::Debug for SimCloud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimCloud")
            .field("actor", &&*self.actor)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner {
    pub(crate) state: Mutex<State>,
    faults: Mutex<Faults>,
    rng: Mutex<StdRng>,
    calls: Mutex<BTreeMap<(String, &'static str, &'static str), u64>>,
    pub(crate) events: broadcast::Sender<InstanceEvent>,
    pub(crate) max_batch_size: usize,
    pub(crate) vip_range: Ipv4Net,
    start: Instant,
}

pub(crate) struct State {
    pub(crate) instances: BTreeMap<String, SimInstance>,
    next_instance: u64,
    pub(crate) routes: BTreeMap<(String, String), SimRoute>,
    pub(crate) lbs: BTreeMap<(String, String), SimLoadBalancer>,
    pub(crate) volumes: BTreeMap<String, crate::SimVolume>,
    pub(crate) next_volume: u64,
    vip_cursor: u32,
    log: Vec<Mutation>,
    next_seq: u64,
}

/// Handed to state-changing code so it can log and emit without re-locking.
pub(crate) struct Tx<'a> {
    pub(crate) state: &'a mut State,
    inner: &'a Inner,
    actor: &'a str,
}

impl Tx<'_> {
    pub(crate) fn log(&mut self, operation: &str, object: String, changed: bool) {
        self.state.next_seq += 1;
        let seq = self.state.next_seq;
        let at = Instant::now();
        self.state.log.push(Mutation {
            seq,
            wall: SystemTime::now(),
            at,
            since_start: at.saturating_duration_since(self.inner.start),
            actor: self.actor.to_string(),
            operation: operation.to_string(),
            object,
            changed,
        });
    }

    pub(crate) fn emit(&self, kind: InstanceEventKind, inst: &SimInstance) {
        // No receivers is fine: nobody is watching yet.
        let _ = self.inner.events.send(InstanceEvent {
            kind,
            provider_id: inst.provider_id(),
            node_name: Some(inst.name.clone()),
        });
    }

    /// A free VIP, scanning from where the last allocation stopped so a just-freed address is
    /// not handed out again at once (a stale DNS record must not reach a new Service).
    pub(crate) fn allocate_vip(&mut self) -> CloudResult<Ipv4Addr> {
        let range = self.inner.vip_range;
        let (first, count) = vip_span(range);
        let used: HashSet<Ipv4Addr> = self.state.lbs.values().map(|lb| lb.vip).collect();
        for k in 0..count {
            let idx = (self.state.vip_cursor.wrapping_add(k)) % count;
            let ip = Ipv4Addr::from(first.wrapping_add(idx));
            if !used.contains(&ip) {
                self.state.vip_cursor = idx.wrapping_add(1) % count;
                return Ok(ip);
            }
        }
        Err(CloudError::Permanent(format!(
            "AddressLimitExceeded: no free VIP left in {range}"
        )))
    }
}

/// First usable address and how many there are (network and broadcast excluded when the prefix
/// leaves room for them).
fn vip_span(range: Ipv4Net) -> (u32, u32) {
    let net = u32::from(range.network());
    let host_bits = 32 - u32::from(range.prefix_len());
    let size = if host_bits >= 32 {
        u32::MAX
    } else {
        1u32 << host_bits
    };
    if host_bits >= 2 {
        (net + 1, size - 2)
    } else {
        (net, size)
    }
}

impl Default for SimCloud {
    fn default() -> Self {
        SimCloud::new()
    }
}

/// How a [`SimCloud`] is built; the programmatic twin of [`crate::SimConfig`].
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// Seed for the fault RNG; `None` seeds from the OS (not reproducible).
    pub seed: Option<u64>,
    /// Where VIPs come from.
    pub vip_range: Ipv4Net,
    /// Largest batch one `instances_*` call accepts.
    pub max_batch_size: usize,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            seed: None,
            // DEFAULT_VIP_RANGE, without a runtime parse.
            vip_range: Ipv4Net::new_assert(Ipv4Addr::new(198, 18, 0, 0), 15),
            max_batch_size: DEFAULT_MAX_BATCH_SIZE,
        }
    }
}

impl SimCloud {
    /// An empty cloud with default options: no instances, no faults, OS-seeded RNG.
    pub fn new() -> Self {
        SimCloud::with_options(SimOptions::default())
    }

    /// An empty cloud whose fault RNG is seeded, so a test replays the same faults every run.
    pub fn seeded(seed: u64) -> Self {
        SimCloud::with_options(SimOptions {
            seed: Some(seed),
            ..SimOptions::default()
        })
    }

    /// An empty cloud with explicit options.
    pub fn with_options(options: SimOptions) -> Self {
        let rng = match options.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        let (events, _) = broadcast::channel(EVENT_CAPACITY);
        SimCloud {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    instances: BTreeMap::new(),
                    next_instance: 1,
                    routes: BTreeMap::new(),
                    lbs: BTreeMap::new(),
                    volumes: BTreeMap::new(),
                    next_volume: 0,
                    vip_cursor: 0,
                    log: Vec::new(),
                    next_seq: 0,
                }),
                faults: Mutex::new(Faults::new()),
                rng: Mutex::new(rng),
                calls: Mutex::new(BTreeMap::new()),
                events,
                max_batch_size: options.max_batch_size.max(1),
                vip_range: options.vip_range,
                start: Instant::now(),
            }),
            actor: Arc::from(DEFAULT_ACTOR),
        }
    }

    /// A handle on the same cloud whose calls (provider and control) are recorded under
    /// `actor` in the mutation log and the call accounting.
    pub fn with_actor(&self, actor: impl AsRef<str>) -> SimCloud {
        SimCloud {
            inner: self.inner.clone(),
            actor: Arc::from(actor.as_ref()),
        }
    }

    /// This handle's actor identity.
    pub fn actor(&self) -> &str {
        &self.actor
    }

    /// This handle as a provider, for code that takes `Arc<dyn CloudProvider>`.
    pub fn provider(&self) -> Arc<dyn ccm_cloud::CloudProvider> {
        Arc::new(self.clone())
    }

    pub(crate) fn tx<R>(&self, f: impl FnOnce(&mut Tx<'_>) -> R) -> R {
        let mut state = self.inner.state.lock();
        let mut tx = Tx {
            state: &mut state,
            inner: &self.inner,
            actor: &self.actor,
        };
        f(&mut tx)
    }

    /// Runs one simulated API call of `op`: accounting, throttling, injected faults and
    /// latency, then `apply` under the state lock (never held across the sleep).
    pub(crate) async fn call<T>(
        &self,
        op: &'static str,
        apply: impl FnOnce(&mut Tx<'_>) -> CloudResult<T>,
    ) -> CloudResult<T> {
        let decision = {
            let mut rng = self.inner.rng.lock();
            self.inner
                .faults
                .lock()
                .decide(op, &mut rng, Instant::now())
        };
        let result = match decision {
            Decision::Throttled(e) => Err(e),
            Decision::Run { delay, fail } => {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                match fail {
                    Some(e) => Err(e),
                    None => self.tx(apply),
                }
            }
        };
        let label = CloudError::result_label(&result);
        *self
            .inner
            .calls
            .lock()
            .entry((self.actor.to_string(), op, label))
            .or_default() += 1;
        result
    }

    // ---- control API -------------------------------------------------------------------

    /// Creates an instance and emits `Created` (and `Stopped` if it starts stopped). Returns
    /// its id.
    pub fn add_instance(&self, spec: InstanceSpec) -> String {
        self.tx(|tx| {
            let n = tx.state.next_instance;
            tx.state.next_instance += 1;
            let id = format!("i-{n:017x}");
            let internal = spec.internal_ip.unwrap_or_else(|| {
                // 10.0.0.0/8 minus .0 and .255 of each /24: distinct for 16 million instances.
                let host = (n % 254) + 1;
                let net = n / 254;
                IpAddr::V4(Ipv4Addr::new(
                    10,
                    ((net >> 8) & 0xff) as u8,
                    (net & 0xff) as u8,
                    host as u8,
                ))
            });
            let mut addresses = vec![SimAddress {
                type_: "InternalIP".into(),
                address: internal.to_string(),
            }];
            if let Some(ext) = spec.external_ip {
                addresses.push(SimAddress {
                    type_: "ExternalIP".into(),
                    address: ext.to_string(),
                });
            }
            addresses.push(SimAddress {
                type_: "Hostname".into(),
                address: spec.hostname.clone().unwrap_or_else(|| spec.name.clone()),
            });
            let state = match spec.state {
                InstanceState::Terminated => InstanceState::Running,
                s => s,
            };
            let inst = SimInstance {
                id: id.clone(),
                name: spec.name,
                instance_type: spec.instance_type.unwrap_or_else(|| "sim.medium".into()),
                zone: spec.zone.unwrap_or_else(|| "region-1a".into()),
                region: spec.region.unwrap_or_else(|| "region-1".into()),
                addresses,
                state,
                labels: spec.labels,
            };
            tx.emit(InstanceEventKind::Created, &inst);
            if state == InstanceState::Stopped {
                tx.emit(InstanceEventKind::Stopped, &inst);
            }
            tx.state.instances.insert(id.clone(), inst);
            tx.log("add_instance", format!("instance/{id}"), true);
            id
        })
    }

    fn transition(
        &self,
        id: &str,
        action: &str,
        to: InstanceState,
        kind: InstanceEventKind,
    ) -> Result<bool, SimError> {
        self.tx(|tx| {
            let inst = tx
                .state
                .instances
                .get_mut(id)
                .ok_or_else(|| SimError::UnknownInstance(id.to_string()))?;
            match inst.state {
                InstanceState::Terminated if to == InstanceState::Terminated => return Ok(false),
                InstanceState::Terminated => return Err(SimError::Terminated(id.to_string())),
                s if s == to => return Ok(false),
                _ => {}
            }
            inst.state = to;
            let inst = inst.clone();
            tx.emit(kind, &inst);
            tx.log(action, format!("instance/{id}"), true);
            Ok(true)
        })
    }

    /// Powers an instance off and emits `Stopped`. `Ok(false)`: it already was.
    pub fn stop_instance(&self, id: &str) -> Result<bool, SimError> {
        self.transition(
            id,
            "stop_instance",
            InstanceState::Stopped,
            InstanceEventKind::Stopped,
        )
    }

    /// Powers an instance on and emits `Started`. `Ok(false)`: it already was.
    pub fn start_instance(&self, id: &str) -> Result<bool, SimError> {
        self.transition(
            id,
            "start_instance",
            InstanceState::Running,
            InstanceEventKind::Started,
        )
    }

    /// Terminates an instance and emits `Terminated`; lookups stop finding it at once and its
    /// routes turn into blackholes. `Ok(false)`: it already was terminated.
    pub fn terminate_instance(&self, id: &str) -> Result<bool, SimError> {
        self.transition(
            id,
            "terminate_instance",
            InstanceState::Terminated,
            InstanceEventKind::Terminated,
        )
    }

    /// Deletes a route behind the controller's back (someone clicked in the console). Returns
    /// whether a route was there. `destination_cidr` may be in any form that parses.
    pub fn delete_route_out_of_band(&self, cluster: &str, destination_cidr: &str) -> bool {
        let Some(cidr) = canonical_cidr(destination_cidr) else {
            return false;
        };
        self.tx(|tx| {
            let removed = tx
                .state
                .routes
                .remove(&(cluster.to_string(), cidr.clone()))
                .is_some();
            if removed {
                tx.log(
                    "delete_route_out_of_band",
                    format!("route/{cluster}/{cidr}"),
                    true,
                );
            }
            removed
        })
    }

    /// The id of the live (not terminated) instance named `name`.
    pub fn instance_id(&self, name: &str) -> Option<String> {
        let st = self.inner.state.lock();
        live_by_name(&st, name).map(|i| i.id.clone())
    }

    // ---- faults --------------------------------------------------------------------------

    fn op(name: &str) -> Result<&'static str, SimError> {
        known_op(name).ok_or_else(|| SimError::UnknownOp(name.to_string()))
    }

    /// Sets the latency of `op` (`"*"`: every op without its own setting).
    pub fn set_latency(&self, op: &str, latency: Latency) -> Result<(), SimError> {
        let op = Self::op(op)?;
        self.inner.faults.lock().set_latency(op, Some(latency));
        Ok(())
    }

    /// Sets the probability (0..=1) that a call of `op` fails with a transient error.
    pub fn set_error_rate(&self, op: &str, rate: f64) -> Result<(), SimError> {
        let op = Self::op(op)?;
        if !(0.0..=1.0).contains(&rate) {
            return Err(SimError::Invalid(format!(
                "error rate {rate} is not between 0 and 1"
            )));
        }
        self.inner.faults.lock().set_error_rate(op, Some(rate));
        Ok(())
    }

    /// Makes the next `n` calls of `op` fail with a transient error (replacing any pending
    /// count); `n = 0` cancels.
    pub fn fail_next(&self, op: &str, n: u32) -> Result<(), SimError> {
        self.fail_next_with(
            op,
            n,
            CloudError::Transient(format!("InternalError: injected failure of {op}")),
        )
    }

    /// Makes the next `n` calls of `op` fail with `error`, e.g. a `Retry` to test requeueing.
    pub fn fail_next_with(&self, op: &str, n: u32, error: CloudError) -> Result<(), SimError> {
        let op = Self::op(op)?;
        self.inner.faults.lock().fail_next(op, n, error);
        Ok(())
    }

    /// Limits `op` (`"*"`: the whole API) to a token bucket, starting full; `None` lifts it.
    pub fn set_throttle(&self, op: &str, throttle: Option<Throttle>) -> Result<(), SimError> {
        let op = Self::op(op)?;
        if let Some(t) = throttle
            && !(t.qps.is_finite() && t.qps >= 0.0)
        {
            return Err(SimError::Invalid(format!("qps {} is not >= 0", t.qps)));
        }
        self.inner.faults.lock().set_throttle(op, throttle);
        Ok(())
    }

    /// Removes every latency, error rate, pending failure and throttle.
    pub fn clear_faults(&self) {
        self.inner.faults.lock().clear();
    }

    // ---- inspection ----------------------------------------------------------------------

    /// Every instance ever created, terminated ones included, ordered by id.
    pub fn instances(&self) -> Vec<SimInstance> {
        self.inner
            .state
            .lock()
            .instances
            .values()
            .cloned()
            .collect()
    }

    /// Every route of every cluster, ordered by (cluster, CIDR).
    pub fn routes(&self) -> Vec<SimRoute> {
        self.inner.state.lock().routes.values().cloned().collect()
    }

    /// Every load balancer, ordered by (cluster, name).
    pub fn load_balancers(&self) -> Vec<SimLoadBalancer> {
        self.inner.state.lock().lbs.values().cloned().collect()
    }

    /// How many routes exist, all clusters together, without copying them: `ccm bench` polls
    /// it every 20 ms during a burst, and copying 5,000 routes each time took a fifth of the
    /// bench process's CPU, which the CCM under test competes for.
    pub fn route_count(&self) -> usize {
        self.inner.state.lock().routes.len()
    }

    /// The number of hosts of every load balancer, ordered by (cluster, name), without copying
    /// the host lists (200 LBs × 1,000 hosts per poll in `ccm bench services`).
    pub fn load_balancer_host_counts(&self) -> Vec<usize> {
        self.inner
            .state
            .lock()
            .lbs
            .values()
            .map(|lb| lb.hosts.len())
            .collect()
    }

    /// The mutation log, oldest first.
    pub fn mutations(&self) -> Vec<Mutation> {
        self.inner.state.lock().log.clone()
    }

    /// Removes and returns the mutation log so far; sequence numbers keep counting. A long
    /// benchmark drains the log periodically instead of holding every write in memory.
    pub fn take_mutations(&self) -> Vec<Mutation> {
        std::mem::take(&mut self.inner.state.lock().log)
    }

    /// Calls received, by `(operation, result)`, whoever made them, including failed and
    /// throttled ones: the same shape as [`ccm_cloud::CloudMetrics::snapshot`], so the two
    /// can be compared directly.
    pub fn calls(&self) -> BTreeMap<(String, String), u64> {
        self.calls_where(|_| true)
    }

    /// Calls received from one actor, by `(operation, result)`.
    pub fn calls_by(&self, actor: &str) -> BTreeMap<(String, String), u64> {
        self.calls_where(|a| a == actor)
    }

    fn calls_where(&self, keep: impl Fn(&str) -> bool) -> BTreeMap<(String, String), u64> {
        let mut out = BTreeMap::new();
        for ((actor, op, result), n) in self.inner.calls.lock().iter() {
            if keep(actor) {
                *out.entry((op.to_string(), result.to_string())).or_default() += n;
            }
        }
        out
    }

    /// Calls received for `op`, whatever their result or actor.
    pub fn call_count(&self, op: &str) -> u64 {
        self.inner
            .calls
            .lock()
            .iter()
            .filter(|((_, o, _), _)| *o == op)
            .map(|(_, n)| n)
            .sum()
    }

    /// Calls received in total.
    pub fn total_calls(&self) -> u64 {
        self.inner.calls.lock().values().sum()
    }

    /// Forgets the call accounting, e.g. between the warm-up and the measured phase of a bench.
    pub fn reset_calls(&self) {
        self.inner.calls.lock().clear();
    }

    /// The largest batch one `instances_*` call accepts.
    pub fn max_batch_size(&self) -> usize {
        self.inner.max_batch_size
    }

    /// The range VIPs are allocated from.
    pub fn vip_range(&self) -> Ipv4Net {
        self.inner.vip_range
    }
}

pub(crate) fn live_by_name<'a>(st: &'a State, name: &str) -> Option<&'a SimInstance> {
    // Newest first: a re-created node name must resolve to the new instance.
    st.instances
        .values()
        .rev()
        .find(|i| i.name == name && i.state != InstanceState::Terminated)
}

/// The canonical text of a CIDR (`10.244.1.0/24`), or `None` if it does not parse or has host
/// bits set.
pub(crate) fn canonical_cidr(text: &str) -> Option<String> {
    let net: ipnet::IpNet = text.trim().parse().ok()?;
    (net.trunc() == net).then(|| net.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vip_span_excludes_network_and_broadcast() {
        let (first, count) = vip_span("10.0.0.0/30".parse().expect("cidr"));
        assert_eq!(Ipv4Addr::from(first), Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(count, 2);
        let (first, count) = vip_span("10.0.0.7/32".parse().expect("cidr"));
        assert_eq!(Ipv4Addr::from(first), Ipv4Addr::new(10, 0, 0, 7));
        assert_eq!(count, 1);
    }

    #[test]
    fn cidrs_are_canonical() {
        assert_eq!(
            canonical_cidr("10.244.1.0/24").as_deref(),
            Some("10.244.1.0/24")
        );
        assert_eq!(canonical_cidr("10.244.1.1/24"), None);
        assert_eq!(
            canonical_cidr("fd00:1::/64").as_deref(),
            Some("fd00:1::/64")
        );
        assert_eq!(canonical_cidr("nope"), None);
    }
}
