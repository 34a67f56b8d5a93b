//! Shared by the metal provider's integration tests: kube-sim, the real CCM (manager + the four
//! controllers) with `--cloud-provider=metal`, the sushy-tools Redfish emulator, and helpers.

#![allow(dead_code)]

pub mod fake_bmc;

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ccm_kube_sim::KubeSim;
use clap::Parser;
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, Taint};
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio_util::sync::CancellationToken;

/// Generous: the machine is shared and noisy; waits end as soon as the condition holds.
pub const TIMEOUT: Duration = Duration::from_secs(90);

/// Polls `cond` every 50 ms until it holds; panics naming `what` after [`TIMEOUT`].
pub async fn wait_for<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        if cond().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A temp dir removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A fresh dir per call: the name carries a process-wide counter, since tests running in
    /// parallel can read the same clock value (a coarse clocksource), and two emulators
    /// sharing a dir serve each other's certificates.
    pub fn new(tag: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "metal-{tag}-{}-{n}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Finds `tool` on PATH, then in `<workspace>/.venv/bin`; panics naming `.ci/run` otherwise.
pub fn find_tool(tool: &str) -> PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(tool))
            .find(|p| p.is_file())
    });
    let venv = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../.venv/bin")
        .join(tool);
    on_path
        .or_else(|| venv.is_file().then_some(venv))
        .unwrap_or_else(|| {
            panic!("{tool} is not installed: run .ci/run once (its .ci/setup.d/40-metal.sh installs sushy-tools into .venv)")
        })
}

/// `start` until it succeeds, at most `attempts` times with `pause` between; panics with the
/// last failure, saying what could not be done.
fn retry<T>(
    what: &str,
    attempts: u32,
    pause: Duration,
    mut start: impl FnMut() -> Result<T, String>,
) -> T {
    let mut failure = String::new();
    for attempt in 0..attempts {
        if attempt > 0 {
            std::thread::sleep(pause);
        }
        match start() {
            Ok(started) => return started,
            Err(e) => failure = e,
        }
    }
    panic!("sushy-emulator did not {what}: {failure}")
}

/// A sushy-tools Redfish emulator with the fake systems driver, on 127.0.0.1; killed on drop.
pub struct Sushy {
    child: Child,
    pub endpoint: String,
    _dir: TempDir,
}

impl Drop for Sushy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Sushy {
    /// Starts the emulator with `(name, uuid, power_state)` systems.
    pub fn start(systems: &[(&str, &str, &str)]) -> Self {
        Self::start_with(systems, None)
    }

    /// As [`Sushy::start`], serving HTTPS with `(cert PEM, key PEM)` when given.
    pub fn start_with(systems: &[(&str, &str, &str)], tls: Option<(&str, &str)>) -> Self {
        Self::start_full(systems, tls, None)
    }

    /// As [`Sushy::start_with`], requiring HTTP basic auth `(user, password)` when given.
    /// The port is a free one below the kernel's ephemeral range, so that [`Sushy::restart`]
    /// gets it back (see [`ccm_kube_sim::ports::free_loopback_ports`]); should another test
    /// bind it first, the emulator starts again on another.
    pub fn start_full(
        systems: &[(&str, &str, &str)],
        tls: Option<(&str, &str)>,
        auth: Option<(&str, &str)>,
    ) -> Self {
        retry("start on five free ports", 5, Duration::ZERO, || {
            let port = ccm_kube_sim::ports::free_loopback_ports(1).expect("a free loopback port");
            Self::start_cmd(systems, tls, auth, "127.0.0.1", port, &[])
        })
    }

    /// Stops this emulator and starts one on the same address and port with other systems
    /// and fresh state: the BMC after a machine was removed from it. The port lies outside
    /// the ephemeral range, so no outgoing connection can hold it; the retries cover the
    /// moment the kernel takes to release it.
    pub fn restart(&mut self, systems: &[(&str, &str, &str)]) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let hostport = self.endpoint.rsplit("//").next().expect("endpoint");
        let (host, port) = hostport.rsplit_once(':').expect("host:port");
        let port: u16 = port.parse().expect("port");
        let host = host.to_string();
        *self = retry(
            "restart on its port",
            20,
            Duration::from_millis(250),
            || Self::start_cmd(systems, None, None, &host, port, &[]),
        );
    }

    /// The emulator on `ip:port`, run through `wrapper` (e.g. `ip netns exec <ns>`; none: run
    /// directly). Each system is `(name, uuid, power_state)`: the fake driver serves it at
    /// `/redfish/v1/Systems/<uuid>` and lists the UUID in the collection; a request by name is
    /// redirected (307) to it. On failure, says why with what the emulator printed before it
    /// exited.
    pub fn start_cmd(
        systems: &[(&str, &str, &str)],
        tls: Option<(&str, &str)>,
        auth: Option<(&str, &str)>,
        ip: &str,
        port: u16,
        wrapper: &[&str],
    ) -> Result<Self, String> {
        let dir = TempDir::new("sushy");
        let mut tls_conf = String::new();
        if let Some((user, password)) = auth {
            // sushy-tools reads an htpasswd file with bcrypt digests; bcrypt comes with it.
            let python = find_tool("sushy-emulator").with_file_name("python3");
            let out = Command::new(&python)
                .args(["-c", "import bcrypt,sys; print(bcrypt.hashpw(sys.argv[1].encode(), bcrypt.gensalt(4)).decode())", password])
                .output()
                .expect("python3 next to sushy-emulator");
            assert!(
                out.status.success(),
                "bcrypt: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let file = dir.0.join("htpasswd");
            std::fs::write(
                &file,
                format!("{user}:{}", String::from_utf8_lossy(&out.stdout).trim()),
            )
            .expect("htpasswd");
            tls_conf.push_str(&format!(
                "SUSHY_EMULATOR_AUTH_FILE = '{}'\n",
                file.display()
            ));
        }
        if let Some((cert, key)) = tls {
            let (c, k) = (dir.0.join("cert.pem"), dir.0.join("key.pem"));
            std::fs::write(&c, cert).expect("cert");
            std::fs::write(&k, key).expect("key");
            tls_conf.push_str(&format!(
                "SUSHY_EMULATOR_SSL_CERT = '{}'\nSUSHY_EMULATOR_SSL_KEY = '{}'\n",
                c.display(),
                k.display()
            ));
        }
        let list: Vec<String> = systems
            .iter()
            .map(|(name, uuid, power)| {
                format!("{{'uuid': '{uuid}', 'name': '{name}', 'power_state': '{power}', 'external_notifier': False, 'nics': []}}")
            })
            .collect();
        let conf = dir.0.join("emulator.conf");
        std::fs::write(
            &conf,
            format!(
                "SUSHY_EMULATOR_LISTEN_IP = '{ip}'\nSUSHY_EMULATOR_LISTEN_PORT = {port}\nSUSHY_EMULATOR_STATE_DIR = '{}'\nSUSHY_EMULATOR_FAKE_DRIVER = True\nSUSHY_EMULATOR_FAKE_SYSTEMS = [{}]\n{tls_conf}",
                dir.0.join("state").display(),
                list.join(", ")
            ),
        )
        .expect("write sushy config");
        let sushy = find_tool("sushy-emulator");
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&sushy);
                c
            }
            None => Command::new(&sushy),
        };
        let mut child = cmd
            .arg("--config")
            .arg(&conf)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start sushy-emulator");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // What the emulator printed, kept only until it has started; then drained unread.
            let mut printed = Some(Vec::new());
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("Running on ").nth(1) {
                    let _ = tx.send(Ok(rest.trim().to_string()));
                    printed = None;
                } else if let Some(p) = printed.as_mut() {
                    p.push(line);
                }
            }
            if let Some(p) = printed {
                let _ = tx.send(Err(p.join("\n")));
            }
        });
        let started = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(Ok(addr)) => Ok(addr),
            Ok(Err(printed)) => Err(format!("sushy-emulator exited on {ip}:{port}:\n{printed}")),
            Err(_) => Err(format!(
                "sushy-emulator did not print its address on {ip}:{port} within 30 s"
            )),
        };
        match started {
            Ok(endpoint) => Ok(Sushy {
                child,
                endpoint,
                _dir: dir,
            }),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }

    /// Sends a Redfish `ComputerSystem.Reset` (e.g. `ForceOff`, `On`) through the emulator's API.
    pub async fn reset(&self, uuid: &str, reset_type: &str) {
        let url = format!(
            "{}/redfish/v1/Systems/{uuid}/Actions/ComputerSystem.Reset",
            self.endpoint
        );
        let body = format!("{{\"ResetType\": \"{reset_type}\"}}");
        let out = tokio::process::Command::new("curl")
            .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}"])
            .args([
                "-X",
                "POST",
                "-H",
                "Content-Type: application/json",
                "-d",
                &body,
                &url,
            ])
            .output()
            .await
            .expect("curl");
        let code = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            code.starts_with('2'),
            "Reset {reset_type} of {uuid}: HTTP {code}"
        );
    }
}

/// The CCM running in this process with `--cloud-provider=metal`.
pub struct Ccm {
    pub shutdown: CancellationToken,
    /// The manager's runtime: its metrics registry, for tests that read `/metrics` series.
    pub rt: Arc<ccm_manager::run::Runtime>,
    pub task: tokio::task::JoinHandle<anyhow::Result<ccm_manager::run::Exit>>,
}

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    options: ccm_manager::options::RunOptions,
}

impl Ccm {
    /// Starts the manager with `--cloud-provider=metal --cloud-config <config>` and `extra` flags.
    pub async fn start(kubeconfig: &Path, config: &Path, extra: &[&str]) -> anyhow::Result<Self> {
        let mut argv = vec![
            "ccm".to_string(),
            "--cloud-provider=metal".into(),
            format!("--cloud-config={}", config.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            "--secure-port=0".into(),
            "--leader-elect=false".into(),
        ];
        argv.extend(extra.iter().map(|s| s.to_string()));
        let validated = Args::try_parse_from(argv)?
            .options
            .validate()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut providers = ccm_cloud::ProviderRegistry::new();
        ccm_provider_metal::register(&mut providers)?;
        let rt = Arc::new(ccm_manager::run::Runtime::default());
        let shutdown = CancellationToken::new();
        let mut handles = rt.handles.subscribe();
        let task = {
            let (rt, shutdown) = (rt.clone(), shutdown.clone());
            tokio::spawn(async move {
                ccm_manager::run::run(validated, &providers, &rt, shutdown).await
            })
        };
        tokio::time::timeout(Duration::from_secs(60), async {
            while handles.borrow_and_update().is_none() {
                handles
                    .changed()
                    .await
                    .context("the CCM stopped before starting")?;
            }
            Ok::<_, anyhow::Error>(())
        })
        .await
        .context("the CCM did not start its controllers within 60 s")??;
        Ok(Ccm { shutdown, rt, task })
    }

    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

/// kube-sim with a kubeconfig on disk.
pub async fn kube_sim(dir: &Path) -> (KubeSim, PathBuf, kube::Client) {
    kube_sim_with(dir, ccm_kube_sim::Config::default()).await
}

/// As [`kube_sim`] with a custom config (e.g. dual-stack Service CIDRs).
pub async fn kube_sim_with(
    dir: &Path,
    config: ccm_kube_sim::Config,
) -> (KubeSim, PathBuf, kube::Client) {
    let sim = KubeSim::start(config).await.expect("kube-sim");
    let kubeconfig = dir.join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let client = sim.client().expect("client");
    (sim, kubeconfig, client)
}

/// Registers a Node as a kubelet with `--cloud-provider=external` does: uninitialized taint,
/// Ready, optional pod CIDRs and addresses.
pub async fn register_node(
    client: &kube::Client,
    name: &str,
    pod_cidrs: &[&str],
    addresses: &[(&str, &str)],
) {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut node = Node::default();
    node.metadata.name = Some(name.into());
    node.spec = Some(NodeSpec {
        taints: Some(vec![Taint {
            key: "node.cloudprovider.kubernetes.io/uninitialized".into(),
            value: Some("true".into()),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]),
        pod_cidrs: (!pod_cidrs.is_empty())
            .then(|| pod_cidrs.iter().map(|s| s.to_string()).collect()),
        pod_cidr: pod_cidrs.first().map(|s| s.to_string()),
        ..Default::default()
    });
    nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("create node");
    let addrs: Vec<serde_json::Value> = addresses
        .iter()
        .map(|(t, a)| serde_json::json!({"type": t, "address": a}))
        .collect();
    nodes
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"addresses": addrs}})),
        )
        .await
        .expect("node addresses");
    set_ready(client, name, true).await;
}

/// Sets the Node's Ready condition, as the kubelet (True) or the node-lifecycle controller
/// after missed heartbeats (Unknown) would.
pub async fn set_ready(client: &kube::Client, name: &str, ready: bool) {
    let nodes: Api<Node> = Api::all(client.clone());
    for _ in 0..50 {
        let mut node = nodes.get_status(name).await.expect("get node");
        let status = node.status.get_or_insert_with(NodeStatus::default);
        let conditions = status.conditions.get_or_insert_with(Vec::new);
        conditions.retain(|c| c.type_ != "Ready");
        conditions.push(NodeCondition {
            type_: "Ready".into(),
            status: if ready { "True" } else { "Unknown" }.into(),
            reason: Some(
                if ready {
                    "KubeletReady"
                } else {
                    "NodeStatusUnknown"
                }
                .into(),
            ),
            ..Default::default()
        });
        match nodes
            .replace_status(name, &PostParams::default(), &node)
            .await
        {
            Ok(_) => return,
            // The CCM wrote the Node meanwhile: read it again, as a kubelet would.
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => panic!("set Ready on {name}: {e}"),
        }
    }
    panic!("set Ready on {name}: 50 conflicts in a row");
}

pub fn has_taint(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == key))
}
