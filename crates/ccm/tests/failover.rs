//! Leader election as an operator relies on it: two `ccm run` processes against one API server
//! and one cloud — exactly one acts, a killed leader is replaced, SIGTERM hands over at once,
//! a leader cut off from the API server stops acting, and the cloud never sees two writers.
//!
//! Durations are short (lease 4s) so the suite runs quickly; the bounds asserted are the
//! protocol's (lease duration + retry period) plus generous slack for a loaded machine. The
//! measured times are printed for the record.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_kube_sim::KubeSim;
use ccm_provider_sim::{InstanceSpec, SimCloud, SimServer};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const LEASE: Duration = Duration::from_secs(4);
const RENEW: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_millis(500);
/// Slack for a shared, noisy 2-core machine.
const SLACK: Duration = Duration::from_secs(15);

struct Proc {
    name: String,
    child: Child,
    /// When this process logged "became leader".
    led_at: Arc<Mutex<Option<Instant>>>,
}

impl Proc {
    fn is_leader(&self) -> bool {
        self.led_at.lock().is_some()
    }
    fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }
}

struct World {
    kube: KubeSim,
    sim: SimCloud,
    _server: SimServer,
    endpoint: String,
    dir: PathBuf,
    kubeconfig: PathBuf,
}

async fn world() -> World {
    let kube = KubeSim::start(ccm_kube_sim::Config::default())
        .await
        .expect("kube-sim");
    let dir = std::env::temp_dir().join(format!(
        "ccm-failover-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    let kubeconfig = dir.join("kubeconfig");
    kube.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let sim = SimCloud::seeded(3);
    let server = SimServer::start(sim.clone(), SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("sim server");
    let endpoint = server.endpoint();
    World {
        kube,
        sim,
        _server: server,
        endpoint,
        dir,
        kubeconfig,
    }
}

fn spawn(w: &World, name: &str) -> Proc {
    let cfg = w.dir.join(format!("{name}.toml"));
    std::fs::write(
        &cfg,
        format!("endpoint = \"{}\"\nactor = \"{name}\"\n", w.endpoint),
    )
    .expect("cloud config");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ccm"))
        .arg("run")
        .arg("--cloud-provider=sim")
        .arg(format!("--cloud-config={}", cfg.display()))
        .arg(format!("--kubeconfig={}", w.kubeconfig.display()))
        .arg("--cluster-cidr=10.128.0.0/9")
        .arg("--secure-port=0")
        .arg(format!(
            "--leader-elect-lease-duration={}s",
            LEASE.as_secs()
        ))
        .arg(format!(
            "--leader-elect-renew-deadline={}s",
            RENEW.as_secs()
        ))
        .arg(format!(
            "--leader-elect-retry-period={}ms",
            RETRY.as_millis()
        ))
        .arg("--node-monitor-period=1s")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn ccm");
    let led_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let stderr = child.stderr.take().expect("stderr");
    let led = led_at.clone();
    let tag = name.to_string();
    tokio::spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("became leader") {
                led.lock().get_or_insert_with(Instant::now);
            }
            if std::env::var_os("CCM_TEST_LOGS").is_some() {
                eprintln!("[{tag}] {line}");
            }
        }
    });
    Proc {
        name: name.to_string(),
        child,
        led_at,
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

/// A kubelet registering a node: the leader then writes to the cloud (route create).
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

/// Actors of the cloud's mutation log never interleave: each actor's writes form one block.
fn assert_no_overlapping_writers(sim: &SimCloud) -> Vec<String> {
    let mut order: Vec<String> = Vec::new();
    for m in sim
        .mutations()
        .into_iter()
        .filter(|m| m.actor.starts_with("ccm-"))
    {
        if order.last() != Some(&m.actor) {
            assert!(
                !order.contains(&m.actor),
                "actor {} wrote again after another leader had written: {order:?}",
                m.actor
            );
            order.push(m.actor.clone());
        }
    }
    order
}

fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("kill");
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_kill9_failover_and_sigterm_handover() {
    let w = world().await;
    let mut a = spawn(&w, "ccm-a");
    let mut b = spawn(&w, "ccm-b");
    assert!(
        wait_for(Duration::from_secs(60), || a.is_leader() || b.is_leader()).await,
        "nobody became leader"
    );
    // Give the standby several retry periods: it must stay a standby.
    tokio::time::sleep(RETRY * 6).await;
    assert!(a.is_leader() != b.is_leader(), "exactly one leads");
    let (leader, standby) = if a.is_leader() {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };

    // The leader acts: a node gets its route in the cloud.
    add_node(&w, 1).await;
    assert!(
        wait_for(Duration::from_secs(60), || w.sim.routes().len() == 1).await,
        "leader did not create the route"
    );

    // kill -9: no release; the standby must wait out the lease.
    let killed_at = Instant::now();
    signal(leader.pid(), "KILL");
    let _ = leader.child.wait().await;
    assert!(
        wait_for(LEASE + RETRY + SLACK, || standby.is_leader()).await,
        "standby did not take over after kill -9"
    );
    let failover = standby
        .led_at
        .lock()
        .expect("led")
        .duration_since(killed_at);
    println!(
        "kill -9 failover: {:.2}s (lease {}s + retry {}ms)",
        failover.as_secs_f64(),
        LEASE.as_secs(),
        RETRY.as_millis()
    );
    assert!(failover <= LEASE + RETRY + SLACK);

    // The new leader acts too.
    add_node(&w, 2).await;
    assert!(
        wait_for(Duration::from_secs(60), || w.sim.routes().len() == 2).await,
        "new leader did not create the route"
    );

    // SIGTERM: the leader releases the lease; a fresh standby takes over within a retry period.
    let mut c = spawn(&w, "ccm-c");
    tokio::time::sleep(RETRY * 4).await;
    assert!(
        !c.is_leader(),
        "a third process must wait while the leader renews"
    );
    let termed_at = Instant::now();
    signal(standby.pid(), "TERM");
    let status = standby.child.wait().await.expect("wait");
    assert!(status.success(), "SIGTERM must exit 0, got {status:?}");
    assert!(
        wait_for(RETRY * 3 + SLACK, || c.is_leader()).await,
        "no handover after SIGTERM"
    );
    let handover = c.led_at.lock().expect("led").duration_since(termed_at);
    println!(
        "SIGTERM handover: {:.2}s (retry {}ms)",
        handover.as_secs_f64(),
        RETRY.as_millis()
    );
    assert!(
        handover < LEASE,
        "a released lease must be taken before it would have expired ({handover:?})"
    );

    add_node(&w, 3).await;
    assert!(
        wait_for(Duration::from_secs(60), || w.sim.routes().len() == 3).await,
        "third leader did not create the route"
    );
    let order = assert_no_overlapping_writers(&w.sim);
    println!("writers in order: {order:?} ({} first leader)", leader.name);
    assert!(order.len() >= 3, "three leaders wrote: {order:?}");
    let _ = c.child.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_cut_off_from_the_api_server_stops_acting() {
    let w = world().await;
    let mut a = spawn(&w, "ccm-solo");
    assert!(
        wait_for(Duration::from_secs(60), || a.is_leader()).await,
        "did not become leader"
    );
    add_node(&w, 1).await;
    assert!(wait_for(Duration::from_secs(60), || w.sim.routes().len() == 1).await);

    // The API server starts failing every request: renewals fail.
    let cut_at = Instant::now();
    w.kube.faults().set_500_rate(None, 1.0);
    let status = tokio::time::timeout(RENEW + SLACK + Duration::from_secs(30), a.child.wait())
        .await
        .expect("the leader must exit when it cannot renew")
        .expect("wait");
    println!(
        "stopped acting {:.2}s after the API server went away (renew deadline {}s)",
        cut_at.elapsed().as_secs_f64(),
        RENEW.as_secs()
    );
    assert_eq!(status.code(), Some(1), "lost leadership exits non-zero");
    let writes_after = w
        .sim
        .mutations()
        .iter()
        .filter(|m| m.actor.starts_with("ccm-"))
        .filter(|m| m.at > tokio::time::Instant::from_std(cut_at + RENEW + Duration::from_secs(1)))
        .count();
    assert_eq!(writes_after, 0, "no cloud writes after leadership was lost");
}
