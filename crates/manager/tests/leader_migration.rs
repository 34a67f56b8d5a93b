//! Leader migration as a rolling kube-controller-manager → ccm-rs upgrade relies on it.
//!
//! A harness plays kube-controller-manager: it holds the migration Lease
//! (`cloud-provider-extraction-migration`) the way client-go's elector does — create, then
//! renew every retry period — and, while holding it, acts as KCM's route controller in the
//! shared sim cloud (actor `kcm`). ccm-rs runs in-process against kube-sim with
//! `--enable-leader-migration` (upstream's default configuration) and the same cloud
//! (actor `ccm`). Checked from kube-sim's request log and the cloud's mutation log: while KCM
//! holds the lease ccm-rs runs only the non-migrated cloud-node controller; once KCM stops
//! renewing (or releases), ccm-rs takes the lease within the lease duration and runs route,
//! service and cloud-node-lifecycle; the two never write to routes or load balancers at once.
//!
//! Durations are short (lease 3s) so the suite runs in seconds; the bounds asserted are the
//! protocol's plus slack for a loaded 2-core machine. Measured times are printed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ccm_cloud::Route;
use ccm_kube_sim::KubeSim;
use ccm_manager::options::RunOptions;
use ccm_manager::run::{Exit, Runtime};
use ccm_provider_sim::{InstanceSpec, SimCloud};
use clap::Parser;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Event, Node, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, PostParams};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const LEASE: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_millis(300);
/// Slack for a shared, noisy machine.
const SLACK: Duration = Duration::from_secs(10);
const MIGRATION_LEASE: &str = "cloud-provider-extraction-migration";
const KCM: &str = "kcm-0_4b6a";

#[derive(Debug, Parser)]
struct Cmd {
    #[command(flatten)]
    options: RunOptions,
}

fn parse(args: &[String]) -> RunOptions {
    let mut argv = vec!["cloud-controller-manager".to_string()];
    argv.extend_from_slice(args);
    Cmd::try_parse_from(argv).expect("flags parse").options
}

struct World {
    kube: KubeSim,
    sim: SimCloud,
    dir: std::path::PathBuf,
}

async fn world() -> World {
    let kube = KubeSim::start(ccm_kube_sim::Config::default())
        .await
        .expect("kube-sim");
    let dir = std::env::temp_dir().join(format!(
        "ccm-migration-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    World {
        kube,
        sim: SimCloud::seeded(7),
        dir,
    }
}

/// kube-controller-manager's side: holds the migration lease and, while holding it, acts as
/// the in-tree route controller.
struct Kcm {
    leases: Api<Lease>,
    renewing: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Kcm {
    async fn start(w: &World) -> Kcm {
        let client = w
            .kube
            .client_with_user_agent("kube-controller-manager/leader-election")
            .expect("client");
        let leases: Api<Lease> = Api::namespaced(client, "kube-system");
        let now = MicroTime(Timestamp::now());
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(MIGRATION_LEASE.into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(KCM.into()),
                lease_duration_seconds: Some(LEASE.as_secs() as i32),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        leases
            .create(&PostParams::default(), &lease)
            .await
            .expect("KCM takes the migration lease");
        let renewing = Arc::new(AtomicBool::new(true));
        let task = {
            let (leases, renewing) = (leases.clone(), renewing.clone());
            tokio::spawn(async move {
                while renewing.load(Ordering::SeqCst) {
                    tokio::time::sleep(RETRY).await;
                    let Ok(mut l) = leases.get(MIGRATION_LEASE).await else {
                        continue;
                    };
                    if !renewing.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Some(spec) = l.spec.as_mut() {
                        spec.renew_time = Some(MicroTime(Timestamp::now()));
                    }
                    // replace carries the resourceVersion read: a conflict is a lost race.
                    let _ = leases
                        .replace(MIGRATION_LEASE, &PostParams::default(), &l)
                        .await;
                }
            })
        };
        Kcm {
            leases,
            renewing,
            task,
        }
    }

    /// KCM's route controller writing a route while it leads the migrated controllers.
    async fn create_route(&self, sim: &SimCloud, node: &str, cidr: &str) {
        let routes = sim.with_actor("kcm").provider().routes().expect("routes");
        routes
            .create_route(
                "kubernetes",
                node,
                &Route {
                    target_node: node.into(),
                    destination_cidr: cidr.into(),
                    ..Default::default()
                },
            )
            .await
            .expect("kcm creates a route");
    }

    /// KCM is stopped (or upgraded away): no more renewals, no more writes.
    async fn stop_renewing(self) -> Api<Lease> {
        self.renewing.store(false, Ordering::SeqCst);
        let _ = self.task.await;
        self.leases
    }
}

async fn add_node(w: &World, i: u32) {
    let name = format!("node-{i}");
    w.sim.add_instance(InstanceSpec::new(name.clone()));
    let api: Api<Node> = Api::all(w.kube.client().expect("client"));
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "podCIDRs": [format!("10.{}.{}.0/24", 128 + i / 256, i % 256)],
            "taints": [{"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}],
        },
    }))
    .expect("node");
    api.create(&PostParams::default(), &node)
        .await
        .expect("create node");
}

async fn add_lb_service(w: &World) {
    let api: Api<Service> = Api::namespaced(w.kube.client().expect("client"), "default");
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP"}]},
    }))
    .expect("service");
    api.create(&PostParams::default(), &svc)
        .await
        .expect("create service");
}

struct Ccm {
    rt: Arc<Runtime>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<Exit>>,
}

fn start_ccm(w: &World, extra: &[String]) -> Ccm {
    let kubeconfig = w.dir.join("kubeconfig");
    w.kube.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let mut args: Vec<String> = [
        "--cloud-provider=sim".to_string(),
        format!("--kubeconfig={}", kubeconfig.display()),
        "--cluster-cidr=10.128.0.0/9".into(),
        "--secure-port=0".into(),
        format!("--leader-elect-lease-duration={}s", LEASE.as_secs()),
        "--leader-elect-renew-deadline=2s".into(),
        format!("--leader-elect-retry-period={}ms", RETRY.as_millis()),
        "--node-monitor-period=1s".into(),
        "--controller-start-interval=0s".into(),
        "--enable-leader-migration".into(),
    ]
    .into();
    args.extend_from_slice(extra);
    let validated = parse(&args).validate().expect("valid options");
    let mut providers = ccm_cloud::ProviderRegistry::new();
    let provider = w.sim.with_actor("ccm").provider();
    providers
        .register("sim", move |_| Ok(provider.clone()))
        .expect("register");
    let rt = Arc::new(Runtime::default());
    let shutdown = CancellationToken::new();
    let task = {
        let (rt, shutdown) = (rt.clone(), shutdown.clone());
        tokio::spawn(
            async move { ccm_manager::run::run(validated, &providers, &rt, shutdown).await },
        )
    };
    Ccm { rt, shutdown, task }
}

impl Ccm {
    fn metrics(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.rt.registry.read())
            .expect("encode");
        out
    }

    fn master_status(&self, lease: &str) -> Option<i64> {
        let key = format!("leader_election_master_status{{name=\"{lease}\"}} ");
        self.metrics()
            .lines()
            .find_map(|l| l.strip_prefix(&key).and_then(|v| v.trim().parse().ok()))
    }

    fn handles(&self) -> Option<ccm_manager::run::ControllerHandles> {
        self.rt.handles.subscribe().borrow().clone()
    }
}

async fn wait_for(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    f()
}

async fn node_initialized(w: &World, name: &str) -> bool {
    let api: Api<Node> = Api::all(w.kube.client().expect("client"));
    api.get(name)
        .await
        .ok()
        .and_then(|n| n.spec)
        .and_then(|s| s.provider_id)
        .is_some()
}

async fn lease_holder(w: &World) -> String {
    let api: Api<Lease> = Api::namespaced(w.kube.client().expect("client"), "kube-system");
    api.get(MIGRATION_LEASE)
        .await
        .ok()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .unwrap_or_default()
}

fn is_route_or_lb(object: &str) -> bool {
    object.starts_with("route/") || object.starts_with("lb/")
}

/// Cloud calls on routes and load balancers by `actor`.
fn route_lb_calls(sim: &SimCloud, actor: &str) -> u64 {
    sim.calls_by(actor)
        .iter()
        .filter(|((op, _), _)| op.contains("route") || op.contains("load_balancer"))
        .map(|(_, n)| n)
        .sum()
}

/// Successful API writes by the migrated controllers' clients.
fn migrated_writes(kube: &KubeSim) -> u64 {
    kube.count_requests(|k| {
        k.verb.is_write()
            && (200..300).contains(&k.code)
            && [
                "node-route-controller",
                "service-lb-controller",
                "cloud-node-lifecycle-controller",
            ]
            .iter()
            .any(|c| k.client.ends_with(c))
    })
}

/// The cloud's mutation log on routes and LBs: every `kcm` write comes before every `ccm`
/// write (one block each, never interleaved), and no `ccm` write precedes `not_before`.
fn assert_one_writer_at_a_time(sim: &SimCloud, not_before: Instant) -> (usize, usize) {
    let log: Vec<_> = sim
        .mutations()
        .into_iter()
        .filter(|m| is_route_or_lb(&m.object))
        .collect();
    let first_ccm = log.iter().position(|m| m.actor == "ccm");
    let last_kcm = log.iter().rposition(|m| m.actor == "kcm");
    if let (Some(c), Some(k)) = (first_ccm, last_kcm) {
        assert!(
            k < c,
            "kcm wrote after ccm had started writing: {:?}",
            log.iter()
                .map(|m| (&m.actor, &m.operation, &m.object))
                .collect::<Vec<_>>()
        );
    }
    for m in log.iter().filter(|m| m.actor == "ccm") {
        assert!(
            m.at >= not_before,
            "ccm wrote {} {} while kube-controller-manager held the migration lease",
            m.operation,
            m.object
        );
    }
    (
        log.iter().filter(|m| m.actor == "kcm").count(),
        log.iter().filter(|m| m.actor == "ccm").count(),
    )
}

/// Phase one, shared by both hand-over tests: KCM holds the migration lease, ccm-rs holds
/// the main one and runs only cloud-node.
async fn kcm_leads(w: &World) -> (Kcm, Ccm) {
    let kcm = Kcm::start(w).await;
    add_node(w, 1).await;
    kcm.create_route(&w.sim, "node-1", "10.128.1.0/24").await;
    let ccm = start_ccm(w, &[]);
    add_node(w, 2).await;
    add_lb_service(w).await;
    // The main lease's controller acts: Nodes get initialized.
    let mut initialized = false;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline && !initialized {
        initialized = node_initialized(w, "node-1").await && node_initialized(w, "node-2").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        initialized,
        "cloud-node-controller (main lease) did not initialize the nodes"
    );
    // Several lease durations with KCM renewing: ccm-rs must stay out of the migrated loops.
    tokio::time::sleep(LEASE * 2).await;
    assert_eq!(lease_holder(w).await, KCM, "KCM keeps the migration lease");
    assert_eq!(
        route_lb_calls(&w.sim, "ccm"),
        0,
        "no route/LB cloud calls by ccm-rs: {:?}",
        w.sim.calls_by("ccm")
    );
    assert_eq!(
        migrated_writes(&w.kube),
        0,
        "no API writes by migrated controllers"
    );
    assert_eq!(w.sim.routes().len(), 1, "only KCM's route");
    assert!(w.sim.load_balancers().is_empty());
    let h = ccm.handles().expect("main controllers started");
    assert!(h.node.is_some(), "cloud-node runs under the main lease");
    assert!(
        h.route.is_none() && h.service.is_none() && h.lifecycle.is_none(),
        "migrated controllers must not run without the migration lease"
    );
    assert_eq!(ccm.master_status("cloud-controller-manager"), Some(1));
    assert_eq!(ccm.master_status(MIGRATION_LEASE), Some(0));
    // KCM still acts until the moment it stops (a route for an instance whose Node is gone:
    // ccm-rs removes it once it runs the route controller).
    w.sim.add_instance(InstanceSpec::new("node-9"));
    kcm.create_route(&w.sim, "node-9", "10.128.9.0/24").await;
    (kcm, ccm)
}

/// Phase two: ccm-rs took over; it runs the migrated controllers and reconciles.
async fn ccm_took_over(w: &World, ccm: &Ccm, kcm_stopped: Instant) {
    assert!(
        wait_for(Duration::from_secs(60), || w.sim.load_balancers().len()
            == 1
            && w.sim
                .routes()
                .iter()
                .any(|r| r.destination_cidr == "10.128.2.0/24"))
        .await,
        "after the hand-over ccm-rs must create node-2's route and the LB: routes {:?}",
        w.sim.routes()
    );
    let h = ccm.handles().expect("handles");
    assert!(h.route.is_some() && h.service.is_some() && h.lifecycle.is_some());
    assert!(
        migrated_writes(&w.kube) > 0,
        "the migrated controllers now write"
    );
    assert_eq!(ccm.master_status(MIGRATION_LEASE), Some(1));
    let (kcm_writes, ccm_writes) = assert_one_writer_at_a_time(&w.sim, kcm_stopped);
    println!("route/LB writes: kcm {kcm_writes} then ccm {ccm_writes}");
    assert!(kcm_writes >= 2 && ccm_writes >= 2);
    // client-go's lease Event, on the migration Lease.
    let events: Api<Event> = Api::namespaced(w.kube.client().expect("client"), "kube-system");
    let mut seen = false;
    for _ in 0..100 {
        let list = events.list(&ListParams::default()).await.expect("events");
        seen = list.items.iter().any(|e| {
            e.reason.as_deref() == Some("LeaderElection")
                && e.involved_object.name.as_deref() == Some(MIGRATION_LEASE)
                && e.involved_object.kind.as_deref() == Some("Lease")
                && e.message
                    .as_deref()
                    .is_some_and(|m| m.ends_with(" became leader"))
        });
        if seen {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen, "no LeaderElection Event on the migration Lease");
}

async fn stop(ccm: Ccm, w: &World) {
    ccm.shutdown.cancel();
    let exit = tokio::time::timeout(Duration::from_secs(30), ccm.task)
        .await
        .expect("ccm stops")
        .expect("join")
        .expect("run");
    assert_eq!(exit, Exit::Shutdown);
    assert_eq!(
        lease_holder(w).await,
        "",
        "SIGTERM releases the migration lease"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kcm_stops_renewing_and_ccm_takes_the_migrated_controllers_within_the_lease() {
    let w = world().await;
    let (kcm, ccm) = kcm_leads(&w).await;
    let _ = kcm.stop_renewing().await;
    let stopped = Instant::now();
    let mut holder = String::new();
    while stopped.elapsed() < LEASE + RETRY * 2 + SLACK {
        holder = lease_holder(&w).await;
        if !holder.is_empty() && holder != KCM {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = stopped.elapsed();
    println!(
        "ccm-rs took the migration lease {:.2}s after KCM stopped renewing (lease {}s, retry {}ms)",
        took.as_secs_f64(),
        LEASE.as_secs(),
        RETRY.as_millis()
    );
    assert!(
        holder != KCM && !holder.is_empty(),
        "ccm-rs never took the lease"
    );
    assert!(
        took >= LEASE - RETRY * 2,
        "took a live lease after {took:?}"
    );
    ccm_took_over(&w, &ccm, stopped).await;
    stop(ccm, &w).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kcm_releases_and_ccm_takes_over_at_once() {
    let w = world().await;
    let (kcm, ccm) = kcm_leads(&w).await;
    let leases = kcm.stop_renewing().await;
    // client-go's ReleaseOnCancel: holder cleared, duration 1s.
    let mut l = leases.get(MIGRATION_LEASE).await.expect("lease");
    if let Some(spec) = l.spec.as_mut() {
        spec.holder_identity = Some(String::new());
        spec.lease_duration_seconds = Some(1);
    }
    leases
        .replace(MIGRATION_LEASE, &PostParams::default(), &l)
        .await
        .expect("release");
    let released = Instant::now();
    assert!(
        wait_for(Duration::from_secs(60), || ccm
            .master_status(MIGRATION_LEASE)
            == Some(1))
        .await
    );
    println!(
        "ccm-rs took the released migration lease after {:.2}s",
        released.elapsed().as_secs_f64()
    );
    assert!(released.elapsed() < LEASE + SLACK);
    ccm_took_over(&w, &ccm, released).await;

    // Losing the migration lease stops everything: another holder takes it over (as a
    // kube-controller-manager would after a partition) and ccm-rs must exit non-zero at its
    // next renewal, writing nothing more to routes or load balancers.
    let mut l = leases.get(MIGRATION_LEASE).await.expect("lease");
    if let Some(spec) = l.spec.as_mut() {
        spec.holder_identity = Some(KCM.into());
        spec.lease_duration_seconds = Some(LEASE.as_secs() as i32);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
    }
    leases
        .replace(MIGRATION_LEASE, &PostParams::default(), &l)
        .await
        .expect("taken");
    let taken = Instant::now();
    let exit = tokio::time::timeout(LEASE + SLACK, ccm.task)
        .await
        .expect("ccm-rs must stop when the migration lease is taken")
        .expect("join")
        .expect("run");
    println!(
        "ccm-rs stopped {:.2}s after losing the migration lease",
        taken.elapsed().as_secs_f64()
    );
    assert_eq!(exit, Exit::LeaderLost);
    let stopped = Instant::now();
    // Nothing runs any more: a new LB Service gets no cloud call.
    let before = route_lb_calls(&w.sim, "ccm");
    let api: Api<Service> = Api::namespaced(w.kube.client().expect("client"), "default");
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "late"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 81, "protocol": "TCP"}]},
    }))
    .expect("service");
    api.create(&PostParams::default(), &svc)
        .await
        .expect("create");
    tokio::time::sleep(RETRY * 5).await;
    assert_eq!(
        route_lb_calls(&w.sim, "ccm"),
        before,
        "cloud calls after the lease was lost"
    );
    assert!(
        w.sim
            .mutations()
            .iter()
            .all(|m| m.actor != "ccm" || m.at <= stopped),
        "ccm-rs wrote to the cloud after it exited"
    );
}

#[test]
fn bad_migration_config_is_a_startup_error_naming_flag_and_field() {
    let dir = std::env::temp_dir().join(format!("ccm-migration-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let cases: &[(&str, &[&str])] = &[
        (
            "apiVersion: controllermanager.config.k8s.io/v1\nkind: LeaderMigrationConfiguration\ncontrollerLeaders:\n- name: route\n  component: '*'\n",
            &["leaderName: Required value"],
        ),
        (
            "apiVersion: controllermanager.config.k8s.io/v1beta1\nkind: LeaderMigrationConfiguration\nleaderName: m\nresourceLock: configmaps\n",
            &["resourceLock: Unsupported value: \"configmaps\""],
        ),
        (
            "apiVersion: controllermanager.config.k8s.io/v1\nkind: LeaderMigrationConfiguration\nleaderName: m\ncontrollerLeaders:\n- name: route\n- component: '*'\n",
            &[
                "controllerLeaders[0].component: Required value",
                "controllerLeaders[1].name: Required value",
            ],
        ),
        (
            "apiVersion: controllermanager.config.k8s.io/v2\nkind: LeaderMigration\nleaderName: m\n",
            &["apiVersion: Invalid value", "kind: Invalid value"],
        ),
        (
            "apiVersion: controllermanager.config.k8s.io/v1\nkind: LeaderMigrationConfiguration\nleaderName: m\ncontrolerLeaders: []\n",
            &["unknown field `controlerLeaders`"],
        ),
        (
            "apiVersion: controllermanager.config.k8s.io/v1\nkind: LeaderMigrationConfiguration\nleaderName: cloud-controller-manager\n",
            &["is the main lease"],
        ),
        (
            "leaderName: [unclosed\n",
            &["not a LeaderMigrationConfiguration"],
        ),
    ];
    for (i, (text, wants)) in cases.iter().enumerate() {
        let path = dir.join(format!("bad-{i}.yaml"));
        std::fs::write(&path, text).expect("write");
        let err = parse(&[
            "--cloud-provider=sim".into(),
            "--enable-leader-migration".into(),
            format!("--leader-migration-config={}", path.display()),
        ])
        .validate()
        .expect_err("invalid config")
        .to_string();
        for want in *wants {
            assert!(err.contains(want), "case {i}: {want:?} not in {err}");
        }
        assert!(err.contains("--leader-migration-config"), "case {i}: {err}");
    }
    let err = parse(&[
        "--cloud-provider=sim".into(),
        "--enable-leader-migration".into(),
        format!(
            "--leader-migration-config={}",
            dir.join("missing.yaml").display()
        ),
    ])
    .validate()
    .expect_err("missing file")
    .to_string();
    assert!(
        err.contains("--leader-migration-config") && err.contains("cannot read"),
        "{err}"
    );
    // Without --enable-leader-migration the file is not read (as upstream), and a notice says so.
    let o = parse(&[
        "--cloud-provider=sim".into(),
        format!(
            "--leader-migration-config={}",
            dir.join("missing.yaml").display()
        ),
    ]);
    assert!(
        o.notices()
            .iter()
            .any(|n| n.starts_with("--leader-migration-config"))
    );
    assert!(o.validate().expect("valid").leader_migration.is_none());
}

#[test]
fn default_configuration_and_the_webhook_port_check() {
    let v = parse(&[
        "--cloud-provider=sim".into(),
        "--enable-leader-migration".into(),
    ])
    .validate()
    .expect("valid");
    let m = v.leader_migration.expect("enabled");
    assert_eq!(m.leader_name, MIGRATION_LEASE);
    assert_eq!(m.resource_lock, "leases");
    let names: Vec<_> = m
        .controller_leaders
        .iter()
        .map(|l| (l.name.as_str(), l.component.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("route", "*"),
            ("service", "*"),
            ("cloud-node-lifecycle", "*")
        ]
    );
    let err = parse(&[
        "--cloud-provider=sim".into(),
        "--secure-port=10300".into(),
        "--webhook-secure-port=10300".into(),
    ])
    .validate()
    .expect_err("same port")
    .to_string();
    assert!(err.contains("--webhook-secure-port"), "{err}");
}
