//! `ccm run`: build the provider and clients, serve health and metrics, win the lease, start
//! the enabled controllers, and stop cleanly.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use ccm_cloud::{CloudMetrics, CloudProvider, InitContext, MeterOptions, ProviderRegistry};
use ccm_controllers::node::{CloudNodeConfig, CloudNodeController, CloudNodeHandle};
use ccm_controllers::node_lifecycle::{
    NodeLifecycleConfig, NodeLifecycleController, NodeLifecycleHandle,
};
use ccm_controllers::route::{RouteConfig, RouteController, RouteHandle, RouteMode};
use ccm_controllers::service::{ServiceConfig, ServiceController, ServiceHandle};
use ccm_controllers::{Shared, StartError};
use parking_lot::RwLock;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::adaptive::{AdaptiveLimit, AdaptiveMetrics, Baseline, FLOOR};
use crate::client::{
    InFlight, MAX_IN_FLIGHT, NODE_INIT_IN_FLIGHT, RateLimitLayer, USER_AGENT_BASE,
    build_metered_client_in_flight, load_config, service_in_flight,
};
use crate::client_metrics::RestClientMetrics;
use crate::leader::{LeaderElectionConfig, LeaderElector, LeaderStatus};
use crate::options::Validated;
use crate::serve::{Health, ProcessCollector};

/// Name of the manager in `running_managed_controllers`.
pub const MANAGER: &str = "cloud-controller-manager";
/// How long in-flight work may take to finish after SIGTERM before the lease is released.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ManagedLabels {
    name: String,
    manager: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NameLabel {
    name: String,
}

/// Probes of the running controllers, for `ccm demo`, `ccm bench` and tests.
#[derive(Clone, Default)]
pub struct ControllerHandles {
    /// cloud-node, if running.
    pub node: Option<CloudNodeHandle>,
    /// cloud-node-lifecycle, if running.
    pub lifecycle: Option<NodeLifecycleHandle>,
    /// route, if running.
    pub route: Option<RouteHandle>,
    /// service, if running.
    pub service: Option<ServiceHandle>,
}

impl ControllerHandles {
    /// Work queued, delayed or in flight across all controllers: 0 means idle.
    pub fn pending(&self) -> usize {
        self.node.as_ref().map_or(0, |h| h.pending())
            + self.lifecycle.as_ref().map_or(0, |h| h.pending())
            + self.route.as_ref().map_or(0, |h| h.pending())
            + self.service.as_ref().map_or(0, |h| h.pending())
    }

    /// Adds the probes `other` has (controllers started under another lease).
    fn merge(&mut self, other: ControllerHandles) {
        self.node = other.node.or(self.node.take());
        self.lifecycle = other.lifecycle.or(self.lifecycle.take());
        self.route = other.route.or(self.route.take());
        self.service = other.service.or(self.service.take());
    }
}

/// Everything `run` needs besides options: where the provider comes from and where metrics go.
pub struct Runtime {
    /// The process metrics registry, served at `/metrics`.
    pub registry: Arc<RwLock<Registry>>,
    /// Health and readiness checks.
    pub health: Health,
    /// Cloud API call counts (also in the registry).
    pub cloud_metrics: CloudMetrics,
    /// client-go's `rest_client_*` families, fed by every Kubernetes client (also in the
    /// registry).
    pub rest_metrics: RestClientMetrics,
    /// The adaptive in-flight limits' gauges (also in the registry).
    pub adaptive_metrics: AdaptiveMetrics,
    /// The API server's baseline latency, learned by every client of the process.
    pub baseline: Baseline,
    /// Published when controllers start (None again when they stop).
    pub handles: watch::Sender<Option<ControllerHandles>>,
    /// Leader status, for health and metrics.
    pub leader: LeaderStatus,
    /// Admission webhooks the binary offers besides the provider's; `--webhooks` picks which
    /// are served.
    pub webhooks: Vec<Arc<dyn crate::webhook::Webhook>>,
}

impl Default for Runtime {
    fn default() -> Self {
        let mut registry = Registry::default();
        let cloud_metrics = CloudMetrics::new(&mut registry);
        let rest_metrics = RestClientMetrics::new(&mut registry);
        let adaptive_metrics = AdaptiveMetrics::new(&mut registry);
        // Process-wide: the leader-election recorder drops Events too, before any controller runs.
        ccm_controllers::events::register_metrics(&mut registry);
        registry.register_collector(Box::new(ProcessCollector));
        Runtime {
            registry: Arc::new(RwLock::new(registry)),
            health: Health::default(),
            cloud_metrics,
            rest_metrics,
            baseline: Baseline::with_metrics(adaptive_metrics.clone()),
            adaptive_metrics,
            handles: watch::channel(None).0,
            leader: LeaderStatus::default(),
            webhooks: Vec::new(),
        }
    }
}

/// How `run` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Shut down on request (SIGTERM): exit 0.
    Shutdown,
    /// Leadership lost: exit non-zero so the kubelet restarts the process as a fresh candidate.
    LeaderLost,
}

/// Builds the provider named by `--cloud-provider` and wraps it with metering.
pub fn build_provider(
    v: &Validated,
    providers: &ProviderRegistry,
    metrics: &CloudMetrics,
) -> anyhow::Result<Arc<dyn CloudProvider>> {
    let o = &v.options;
    let inner = providers.build(&o.cloud_provider, o.cloud_config.as_deref())?;
    Ok(ccm_cloud::metered(
        inner,
        metrics.clone(),
        MeterOptions {
            rate_limit: (o.cloud_api_qps > 0.0).then_some((o.cloud_api_qps, o.cloud_api_burst)),
        },
    ))
}

/// A controller client's bound on requests in flight: `max`, adaptive below it with
/// `--kube-api-adaptive-concurrency` (reported under `client`).
fn in_flight(o: &crate::options::RunOptions, rt: &Runtime, client: &str, max: usize) -> InFlight {
    if !o.kube_api_adaptive_concurrency {
        return InFlight::Fixed(max);
    }
    let limit = AdaptiveLimit::new(rt.baseline.clone(), FLOOR, max);
    InFlight::Adaptive(limit.reported(&rt.adaptive_metrics, client))
}

/// Runs the CCM until `shutdown` or lost leadership.
pub async fn run(
    v: Validated,
    providers: &ProviderRegistry,
    rt: &Runtime,
    shutdown: CancellationToken,
) -> anyhow::Result<Exit> {
    let o = &v.options;
    for notice in o.notices() {
        tracing::warn!("{notice}");
    }
    if o.allow_untagged_cloud {
        tracing::warn!("--allow-untagged-cloud is deprecated and has no effect in ccm-rs");
    }
    let provider = build_provider(&v, providers, &rt.cloud_metrics)?;
    provider.register_metrics(&mut rt.registry.write());
    if !provider.has_cluster_id() && !o.allow_untagged_cloud {
        anyhow::bail!(
            "cloud provider {:?} cannot scope resources to this cluster (no cluster ID); pass --allow-untagged-cloud to run anyway",
            provider.provider_name()
        );
    }
    let base = load_config(o.kubeconfig.as_deref(), o.master.as_deref()).await?;
    let limit = RateLimitLayer::new(o.kube_api_qps, o.kube_api_burst);
    // The leader elector's client: a fixed bound, so lease renewals never wait behind an
    // adaptive limit; its answers teach the shared baseline.
    let admin = build_metered_client_in_flight(
        base.clone(),
        USER_AGENT_BASE,
        &limit,
        &rt.rest_metrics,
        InFlight::Observed(MAX_IN_FLIGHT, rt.baseline.clone()),
    )?;

    let serve_shutdown = shutdown.child_token();
    if o.serving.secure_port != 0 {
        let addr = std::net::SocketAddr::new(o.serving.bind_address, o.serving.secure_port);
        let serving = crate::serve_setup::secure_serving(o, &base, &rt.rest_metrics).await?;
        let local = crate::serve::serve(
            addr,
            serving,
            rt.health.clone(),
            rt.registry.clone(),
            serve_shutdown.clone(),
        )
        .await?;
        tracing::info!(%local, "serving /healthz /readyz /livez /metrics over HTTPS");
    } else {
        tracing::info!("--secure-port=0: not serving health or metrics");
    }

    let webhook_shutdown = serve_shutdown.clone();
    crate::webhook::setup::start(&v, &provider, &rt.webhooks, &rt.registry, webhook_shutdown)
        .await?;

    let master_status: Family<NameLabel, Gauge> = Family::default();
    rt.registry.write().register(
        "leader_election_master_status",
        "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name",
        master_status.clone(),
    );

    let exit = if o.leader_elect {
        lead(&v, provider, &admin, &base, rt, &shutdown, &master_status).await?
    } else {
        // Without leader election every enabled controller runs, leader migration or not
        // (upstream: leader migration needs --leader-elect).
        let controllers = shutdown.child_token();
        let launch = Launch::prepare(&v, provider, &admin, &base, rt, controllers.clone()).await?;
        let mut handles = ControllerHandles::default();
        let tasks = launch.start(&|_, _| Pick::Here, &mut handles).await?;
        rt.handles.send_replace(Some(handles));
        shutdown.cancelled().await;
        let _ = tokio::time::timeout(DRAIN_TIMEOUT, futures::future::join_all(tasks)).await;
        Exit::Shutdown
    };
    serve_shutdown.cancel();
    Ok(exit)
}

/// Why leading ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// `shutdown` fired while every lease was still held.
    Shutdown,
    /// The main lease could not be renewed or was taken: exit non-zero, as upstream's
    /// OnStoppedLeading does.
    MainLost,
    /// Likewise for the migration lease: upstream exits too.
    MigrationLost,
}

/// The leader elector's own client, with its own connection and request budget, as upstream's
/// `leader-election` clientset: a renewal must not queue behind the admin client's informer
/// relists, which at 50,000 Nodes are hundreds of megabytes on one connection (a 50,000-Node
/// burst lost its lease a minute into such a relist while the admin client renewed it). Its
/// answers still teach the shared baseline.
fn lease_client(
    o: &crate::options::RunOptions,
    base: &kube::Config,
    rt: &Runtime,
) -> anyhow::Result<kube::Client> {
    build_metered_client_in_flight(
        base.clone(),
        &format!("{USER_AGENT_BASE}/leader-election"),
        &RateLimitLayer::new(o.kube_api_qps, o.kube_api_burst),
        &rt.rest_metrics,
        InFlight::Observed(MAX_IN_FLIGHT, rt.baseline.clone()),
    )
}

/// The leader-elected path: win the main lease, run the controllers it guards, and with
/// leader migration also contend for the migration lease and run the migrated controllers
/// while holding it. Losing either lease stops everything.
async fn lead(
    v: &Validated,
    provider: Arc<dyn CloudProvider>,
    admin: &kube::Client,
    base: &kube::Config,
    rt: &Runtime,
    shutdown: &CancellationToken,
    master_status: &Family<NameLabel, Gauge>,
) -> anyhow::Result<Exit> {
    let o = &v.options;
    let main_label = NameLabel {
        name: o.leader_elect_resource_name.clone(),
    };
    // A candidate reports 0 ("backup") until it holds the lease, as upstream's
    // NewLeaderElector does: dashboards count leaders and backups per lease.
    master_status.get_or_create(&main_label).set(0);
    let identity = format!("{}_{}", hostname(), uuid_v4());
    let lease_client = lease_client(o, base, rt)?;
    let mut elector = LeaderElector::new(
        lease_client.clone(),
        election_config(o, &o.leader_elect_resource_name, &identity),
    );
    add_lease_health(rt, "leaderElection", rt.leader.clone(), o);
    let events = ccm_controllers::events::Recorder::new(admin.clone(), MANAGER);
    tracing::info!(%identity, lease = %format!("{}/{}", o.leader_elect_resource_namespace, o.leader_elect_resource_name), "waiting to become leader");
    if !elector.acquire(shutdown).await {
        return Ok(Exit::Shutdown);
    }
    tracing::info!(%identity, "became leader");
    lease_event(
        &events,
        o,
        &o.leader_elect_resource_name,
        &identity,
        "became leader",
    );
    master_status.get_or_create(&main_label).set(1);
    let controllers = shutdown.child_token();
    let mut handles = ControllerHandles::default();
    let migration = v.leader_migration.as_ref();
    let launch = Launch::prepare(v, provider, admin, base, rt, controllers.clone()).await;
    let started = match launch {
        Ok(launch) => {
            let pick = |canonical: &str, alias: &str| main_pick(migration, canonical, alias);
            let tasks = launch.start(&pick, &mut handles).await;
            tasks.map(|t| (launch, t))
        }
        Err(e) => Err(e),
    };
    let (launch, mut tasks) = match started {
        Ok(x) => x,
        Err(e) => {
            controllers.cancel();
            elector.release().await;
            return Err(e);
        }
    };
    rt.handles.send_replace(Some(handles.clone()));
    let mut migration_elector = None;
    let ending = match migration {
        None => keep(
            elector.keep_renewing(&rt.leader, shutdown).await,
            Ending::MainLost,
        ),
        Some(m) => {
            tracing::info!(
                "leader migration: main controllers started; contending for the migration lease"
            );
            let mig = migration_elector.insert(LeaderElector::new(
                lease_client.clone(),
                election_config(o, &m.leader_name, &identity),
            ));
            let mut migrated = Migrated {
                launch: &launch,
                config: m,
                elector: mig,
                handles: &mut handles,
                tasks: &mut tasks,
                master_status,
                events: &events,
                identity: &identity,
            };
            tokio::select! {
                still = elector.keep_renewing(&rt.leader, shutdown) => keep(still, Ending::MainLost),
                r = migrated.run(shutdown) => r?,
            }
        }
    };
    controllers.cancel();
    rt.handles.send_replace(None);
    for label in master_status_labels(o, migration) {
        master_status.get_or_create(&label).set(0);
    }
    if ending == Ending::Shutdown {
        // SIGTERM: let in-flight work finish (bounded), then hand the leases over.
        let _ = tokio::time::timeout(DRAIN_TIMEOUT, futures::future::join_all(tasks)).await;
        if let (Some(mig), Some(m)) = (migration_elector.as_mut(), migration) {
            mig.release().await;
            lease_event(&events, o, &m.leader_name, &identity, "stopped leading");
        }
        elector.release().await;
        lease_event(
            &events,
            o,
            &o.leader_elect_resource_name,
            &identity,
            "stopped leading",
        );
        rt.leader.lost();
        Ok(Exit::Shutdown)
    } else {
        if ending == Ending::MainLost {
            lease_event(
                &events,
                o,
                &o.leader_elect_resource_name,
                &identity,
                "stopped leading",
            );
            tracing::error!("leaderelection lost");
        }
        Ok(Exit::LeaderLost)
    }
}

fn keep(still_leading: bool, lost: Ending) -> Ending {
    if still_leading {
        Ending::Shutdown
    } else {
        lost
    }
}

/// Which controllers the main lease runs: all, or with leader migration those the
/// configuration does not list.
fn main_pick(
    migration: Option<&crate::leader_migration::LeaderMigrationConfig>,
    canonical: &str,
    alias: &str,
) -> Pick {
    use crate::leader_migration::Placement;
    match migration.map(|m| m.placement(canonical, alias)) {
        None | Some(Placement::Main) => Pick::Here,
        Some(Placement::Migrated) => Pick::Elsewhere,
        Some(Placement::Unowned(component)) => {
            Pick::Say(format!("runs in {component} (leader migration)"))
        }
    }
}

fn master_status_labels(
    o: &crate::options::RunOptions,
    migration: Option<&crate::leader_migration::LeaderMigrationConfig>,
) -> Vec<NameLabel> {
    let mut out = vec![NameLabel {
        name: o.leader_elect_resource_name.clone(),
    }];
    out.extend(migration.map(|m| NameLabel {
        name: m.leader_name.clone(),
    }));
    out
}

fn election_config(
    o: &crate::options::RunOptions,
    lease: &str,
    identity: &str,
) -> LeaderElectionConfig {
    LeaderElectionConfig {
        namespace: o.leader_elect_resource_namespace.clone(),
        name: lease.to_string(),
        identity: identity.to_string(),
        lease_duration: o.leader_elect_lease_duration.0,
        renew_deadline: o.leader_elect_renew_deadline.0,
        retry_period: o.leader_elect_retry_period.0,
    }
}

/// `/healthz` fails when a held lease has not been renewed for lease duration + 20s
/// (upstream's HealthzAdaptor timeout).
fn add_lease_health(
    rt: &Runtime,
    check: &str,
    status: LeaderStatus,
    o: &crate::options::RunOptions,
) {
    let tolerance = o.leader_elect_lease_duration.0 + Duration::from_secs(20);
    rt.health.add_health(
        check,
        Arc::new(move || match status.since_renew() {
            Some(d) if d > tolerance => Err(format!(
                "the lease was last renewed {d:?} ago, more than the lease duration + 20s"
            )),
            _ => Ok(()),
        }),
    );
}

/// client-go's `LeaseLock.RecordEvent`: a Normal `LeaderElection` Event on the Lease,
/// "<identity> became leader" / "<identity> stopped leading".
fn lease_event(
    events: &ccm_controllers::events::Recorder,
    o: &crate::options::RunOptions,
    lease: &str,
    identity: &str,
    what: &str,
) {
    let subject = k8s_openapi::api::coordination::v1::Lease {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(lease.to_string()),
            namespace: Some(o.leader_elect_resource_namespace.clone()),
            ..Default::default()
        },
        spec: None,
    };
    events.publish(
        &subject,
        ccm_controllers::events::EventType::Normal,
        "LeaderElection",
        format!("{identity} {what}"),
    );
}

/// The migration lease's side of [`lead`].
struct Migrated<'a, 'b> {
    launch: &'a Launch<'b>,
    config: &'a crate::leader_migration::LeaderMigrationConfig,
    elector: &'a mut LeaderElector,
    handles: &'a mut ControllerHandles,
    tasks: &'a mut Vec<tokio::task::JoinHandle<()>>,
    master_status: &'a Family<NameLabel, Gauge>,
    events: &'a ccm_controllers::events::Recorder,
    identity: &'a str,
}

impl Migrated<'_, '_> {
    /// Waits for the migration lease (upstream starts this election only once the main lease
    /// is held, as here), starts the migrated controllers, and renews until the lease is lost
    /// or `shutdown` fires.
    async fn run(&mut self, shutdown: &CancellationToken) -> anyhow::Result<Ending> {
        let o = &self.launch.v.options;
        let name = &self.config.leader_name;
        let label = NameLabel { name: name.clone() };
        self.master_status.get_or_create(&label).set(0);
        let status = LeaderStatus::default();
        add_lease_health(self.launch.rt, "leaderMigration", status.clone(), o);
        tracing::info!(lease = %format!("{}/{name}", o.leader_elect_resource_namespace), "leader migration: waiting for the migration lease");
        if !self.elector.acquire(shutdown).await {
            return Ok(Ending::Shutdown);
        }
        tracing::info!(identity = %self.identity, lease = %name, "leader migration: became leader of the migration lease; starting migrated controllers");
        lease_event(self.events, o, name, self.identity, "became leader");
        self.master_status.get_or_create(&label).set(1);
        let config = self.config;
        let pick = |canonical: &str, alias: &str| {
            if config.placement(canonical, alias) == crate::leader_migration::Placement::Migrated {
                Pick::Here
            } else {
                Pick::Elsewhere
            }
        };
        let tasks = self.launch.start(&pick, self.handles).await?;
        self.tasks.extend(tasks);
        self.launch
            .rt
            .handles
            .send_replace(Some(self.handles.clone()));
        let still = self.elector.keep_renewing(&status, shutdown).await;
        if !still {
            tracing::error!(lease = %name, "migration leaderelection lost");
            lease_event(self.events, o, name, self.identity, "stopped leading");
        }
        Ok(keep(still, Ending::MigrationLost))
    }
}

/// What [`Launch::start`] does with one controller.
enum Pick {
    /// Start it in this round.
    Here,
    /// Another round (the other lease) starts it: say nothing.
    Elsewhere,
    /// Not started by this process; print why.
    Say(String),
}

/// What every lease's controllers share, built once when the first lease is won: the
/// initialized provider, the informers, the per-controller client recipe.
struct Launch<'a> {
    v: &'a Validated,
    admin: kube::Client,
    base: kube::Config,
    rt: &'a Runtime,
    shared: Shared,
    running: Family<ManagedLabels, Gauge>,
    token_dir: std::path::PathBuf,
    shutdown: CancellationToken,
}

impl<'a> Launch<'a> {
    /// Initializes the provider and starts the shared informers.
    async fn prepare(
        v: &'a Validated,
        provider: Arc<dyn CloudProvider>,
        admin: &kube::Client,
        base: &kube::Config,
        rt: &'a Runtime,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Self> {
        let o = &v.options;
        provider
            .initialize(InitContext {
                client: admin.clone(),
                shutdown: shutdown.clone(),
            })
            .await
            .context("cloud provider initialization failed")?;

        let shared = {
            let mut s = Shared::new(provider, o.cluster_name.clone());
            s.queue_metrics = ccm_controllers::queue::QueueMetrics::new(&mut rt.registry.write());
            // Events get their own client and request budget: they must never slow real work.
            s.event_client = Some(build_metered_client_in_flight(
                base.clone(),
                &format!("{USER_AGENT_BASE}/events"),
                &RateLimitLayer::new(o.kube_api_qps, o.kube_api_burst),
                &rt.rest_metrics,
                in_flight(o, rt, "events", MAX_IN_FLIGHT),
            )?);
            s
        };
        shared.start_informers(admin.clone(), shutdown.clone());
        add_readiness(rt, &shared);
        let running: Family<ManagedLabels, Gauge> = Family::default();
        rt.registry.write().register(
            "running_managed_controllers",
            "Indicates where instances of a controller are currently running",
            running.clone(),
        );
        Ok(Launch {
            v,
            admin: admin.clone(),
            base: base.clone(),
            rt,
            shared,
            running,
            token_dir: std::env::temp_dir().join(format!("ccm-rs-tokens-{}", std::process::id())),
            shutdown,
        })
    }

    /// Each controller gets its own client and so its own request budget, as upstream's
    /// per-controller clientsets do.
    async fn client_for(
        &self,
        account: &'static str,
        ua: &'static str,
        max_in_flight: usize,
    ) -> anyhow::Result<kube::Client> {
        let o = &self.v.options;
        let limit = RateLimitLayer::new(o.kube_api_qps, o.kube_api_burst);
        let metrics = &self.rt.rest_metrics;
        let user_agent = format!("{USER_AGENT_BASE}/{ua}");
        let in_flight = in_flight(o, self.rt, ua, max_in_flight);
        if o.use_service_account_credentials {
            std::fs::create_dir_all(&self.token_dir)?;
            let cfg = crate::client::service_account_config(
                &self.admin,
                &self.base,
                account,
                &self.token_dir,
                self.shutdown.clone(),
            )
            .await?;
            build_metered_client_in_flight(cfg, &user_agent, &limit, metrics, in_flight)
        } else {
            build_metered_client_in_flight(
                self.base.clone(),
                &user_agent,
                &limit,
                metrics,
                in_flight,
            )
        }
    }

    fn report(&self, name: &str, alias: &str, result: &Result<(), StartError>) {
        match result {
            Ok(()) => {
                self.running
                    .get_or_create(&ManagedLabels {
                        name: alias.to_string(),
                        manager: MANAGER.to_string(),
                    })
                    .set(1);
                println!("{name}: started");
                tracing::info!(controller = name, "started");
            }
            Err(StartError::Skipped(why)) => {
                println!("{name}: skipped: {why}");
                tracing::info!(controller = name, reason = %why, "skipped");
            }
            Err(StartError::Invalid(_)) => {}
        }
    }

    /// Whether to start `name` in this round; prints the line for those not started.
    fn wanted(&self, pick: &(dyn Fn(&str, &str) -> Pick + Sync), name: &str, alias: &str) -> bool {
        if !self.v.controllers.enabled(name) {
            if matches!(pick(name, alias), Pick::Here) {
                println!("{name}: disabled by --controllers");
            }
            return false;
        }
        match pick(name, alias) {
            Pick::Here => true,
            Pick::Elsewhere => false,
            Pick::Say(why) => {
                println!("{name}: not started: {why}");
                tracing::info!(controller = name, reason = %why, "not started");
                false
            }
        }
    }

    /// Starts the enabled controllers `pick` chooses; prints one line per controller: started,
    /// or skipped and why. Their probes are added to `all`.
    async fn start(
        &self,
        pick: &(dyn Fn(&str, &str) -> Pick + Sync),
        all: &mut ControllerHandles,
    ) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
        let (v, o, rt, shared) = (self.v, &self.v.options, self.rt, &self.shared);
        let shutdown = &self.shutdown;
        let mut tasks = Vec::new();
        let mut handles = ControllerHandles::default();

        // cloud-node
        let name = "cloud-node-controller";
        if self.wanted(pick, name, "cloud-node") {
            let client = self
                .client_for(
                    "node-controller",
                    "cloud-node-controller",
                    NODE_INIT_IN_FLIGHT,
                )
                .await?;
            let cfg = CloudNodeConfig {
                node_status_update_frequency: o.node_status_update_frequency.0,
                concurrent_node_syncs: o.concurrent_node_syncs as usize,
                concurrent_node_status_updates: o.concurrent_node_status_updates as usize,
                ..Default::default()
            };
            let r = CloudNodeController::new(shared.clone(), client, cfg, &mut rt.registry.write());
            let result = r.map(|c| {
                handles.node = Some(c.handle());
                tasks.push(tokio::spawn(c.run(shutdown.clone())));
            });
            self.report(name, "cloud-node", &result);
            if let Err(StartError::Invalid(e)) = result {
                anyhow::bail!("{name}: {e}");
            }
        }

        // cloud-node-lifecycle
        let name = "cloud-node-lifecycle-controller";
        if self.wanted(pick, name, "cloud-node-lifecycle") {
            start_pause(o, tasks.len()).await;
            let client = self
                .client_for(
                    "node-controller",
                    "cloud-node-lifecycle-controller",
                    MAX_IN_FLIGHT,
                )
                .await?;
            let cfg = NodeLifecycleConfig {
                node_monitor_period: o.node_monitor_period.0,
                event_driven_resync_period: o.node_lifecycle_resync_period.0,
                ..Default::default()
            };
            let r =
                NodeLifecycleController::new(shared.clone(), client, cfg, &mut rt.registry.write());
            let result = r.map(|c| {
                handles.lifecycle = Some(c.handle());
                tasks.push(tokio::spawn(c.run(shutdown.clone())));
            });
            self.report(name, "cloud-node-lifecycle", &result);
            if let Err(StartError::Invalid(e)) = result {
                anyhow::bail!("{name}: {e}");
            }
        }

        // route
        let name = "node-route-controller";
        if self.wanted(pick, name, "route") {
            start_pause(o, tasks.len()).await;
            let client = self
                .client_for("route-controller", "node-route-controller", MAX_IN_FLIGHT)
                .await?;
            let watch = v
                .gates
                .get("CloudControllerManagerWatchBasedRoutesReconciliation")
                .copied()
                .unwrap_or(true);
            let cfg = RouteConfig {
                cluster_cidrs: v.cluster_cidrs.clone(),
                configure_cloud_routes: o.configure_cloud_routes,
                mode: if watch {
                    RouteMode::Watch
                } else {
                    RouteMode::Interval
                },
                reconciliation_period: o.route_reconciliation_period.0,
                min_sync_interval: o.route_min_sync_interval.0,
                resync_period: o.route_resync_period.0,
                ..Default::default()
            };
            let r = RouteController::new(shared.clone(), client, cfg, &mut rt.registry.write());
            let result = r.map(|c| {
                handles.route = Some(c.handle());
                tasks.push(tokio::spawn(c.run(shutdown.clone())));
            });
            self.report(name, "route", &result);
            if let Err(StartError::Invalid(e)) = result {
                anyhow::bail!("{name}: {e}");
            }
        }

        // service
        let name = "service-lb-controller";
        if self.wanted(pick, name, "service") {
            start_pause(o, tasks.len()).await;
            let in_flight = service_in_flight(o.concurrent_service_syncs as usize);
            let client = self
                .client_for("service-controller", "service-lb-controller", in_flight)
                .await?;
            let drift = o.service_drift_check_period.0;
            let cfg = ServiceConfig {
                concurrent_service_syncs: o.concurrent_service_syncs as usize,
                drift_check_period: (!drift.is_zero()).then_some(drift),
                ..Default::default()
            };
            let r = ServiceController::new(shared.clone(), client, cfg, &mut rt.registry.write());
            let result = r.map(|c| {
                handles.service = Some(c.handle());
                tasks.push(tokio::spawn(c.run(shutdown.clone())));
            });
            self.report(name, "service", &result);
            if let Err(StartError::Invalid(e)) = result {
                anyhow::bail!("{name}: {e}");
            }
        }

        for (n, h) in [
            ("cloud-node-controller", handles.node.is_some()),
            (
                "cloud-node-lifecycle-controller",
                handles.lifecycle.is_some(),
            ),
            ("node-route-controller", handles.route.is_some()),
            ("service-lb-controller", handles.service.is_some()),
        ] {
            if h {
                rt.health.add_health(n, Arc::new(|| Ok(())));
            }
        }
        all.merge(handles);
        Ok(tasks)
    }
}

/// `/readyz` checks: controllers started, caches synced.
fn add_readiness(rt: &Runtime, shared: &Shared) {
    let handles = rt.handles.subscribe();
    rt.health.add_ready(
        "controllers-started",
        Arc::new(move || {
            if handles.borrow().is_some() {
                Ok(())
            } else {
                Err("controllers are starting".to_string())
            }
        }),
    );
    let (nodes, services) = (shared.nodes.clone(), shared.services.clone());
    rt.health.add_ready(
        "informer-sync",
        Arc::new(move || {
            if nodes.is_ready() && services.is_ready() {
                Ok(())
            } else {
                Err("caches not synced yet".to_string())
            }
        }),
    );
}

/// `--controller-start-interval`: upstream sleeps a jittered interval (up to 2x) after each
/// started controller.
async fn start_pause(o: &crate::options::RunOptions, started: usize) {
    let base = o.controller_start_interval.0;
    if started > 0 && !base.is_zero() {
        let factor = 1.0 + rand::random::<f64>();
        tokio::time::sleep(base.mul_f64(factor)).await;
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_string())
}

fn uuid_v4() -> String {
    let b: [u8; 16] = rand::random();
    format!(
        "{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-4{:01x}{:02x}-{:01x}{:01x}{:02x}-{}",
        b[0],
        b[1],
        b[2],
        b[3],
        b[4],
        b[5],
        b[6] & 0x0f,
        b[7],
        8 | (b[8] & 0x3),
        b[8] >> 4,
        b[9],
        b[10..16]
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect::<String>()
    )
}
