//! The shared driver: kube-sim (or another API server) and the sim cloud in this process, the
//! CCM under test as a child process, its /proc usage and /metrics. The reference scenario
//! puts the sim cloud in the CCM's process instead, as its real run did
//! ([`BenchOptions::cloud_in_ccm`]); then the cloud's calls are read from the CCM's /metrics.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ccm_manager::client::USER_AGENT_BASE;
use ccm_manager::scrape::Scraper;
use ccm_provider_sim::{LatencyConfig, SimCloud, SimConfig, SimServer};
use tokio::process::{Child, Command};

use super::BenchOptions;
use super::report::Usage;
use crate::cluster::{CLUSTER_CIDR, SimCluster, wait_until};
use crate::doctor::metrics::{label, samples};

/// The CCM under test, as a child process, with the sim cloud served to it.
pub(super) struct Env {
    pub(super) cluster: SimCluster,
    pub(super) server: SimServer,
    pub(super) child: Child,
    pub(super) pid: u32,
    pub(super) http: Scraper,
    launch: Launch,
    /// The CCM under test runs its own sim cloud: `cluster.cloud` is not the one it calls.
    cloud_in_ccm: bool,
}

/// How the CCM under test is started (again, after a kill).
struct Launch {
    bin: PathBuf,
    args: Vec<String>,
    log_path: PathBuf,
    addr: SocketAddr,
    cert_dir: PathBuf,
    token: Option<String>,
}

impl Launch {
    /// Starts the CCM; its log is appended to `log_path`.
    fn spawn(&self) -> anyhow::Result<(Child, u32)> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .with_context(|| format!("--ccm-log {}", self.log_path.display()))?;
        let child = Command::new(&self.bin)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        let pid = child.id().context("child pid")?;
        Ok((child, pid))
    }

    /// Waits up to 60 s for the CCM's /readyz; a client for its secure port.
    async fn ready(&self, pid: u32) -> anyhow::Result<Scraper> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if exited(pid) {
                anyhow::bail!(self.exit_report());
            }
            // One connection for all the bench's reads, as Prometheus keeps one per target.
            if let Ok(s) = Scraper::for_cert_dir(self.addr, &self.cert_dir, self.token.clone())
                .map(Scraper::keep_alive)
                && matches!(s.get("/readyz").await, Ok((200, _)))
            {
                return Ok(s);
            }
        }
        anyhow::bail!(
            "the CCM under test did not become ready within 60s (log: {})",
            self.log_path.display()
        )
    }

    /// What to say when the CCM under test has exited: its log's path and last lines.
    fn exit_report(&self) -> String {
        format!(
            "the CCM under test exited; its log ({}) ends with:\n{}",
            self.log_path.display(),
            log_tail(&self.log_path, 20)
        )
    }
}

/// The bearer token of the kubeconfig's current user, to scrape the CCM's /metrics with (the
/// CCM confirms it with a TokenReview; kube-sim's admin is in system:masters).
pub(super) fn bearer_token(kubeconfig: &Path) -> Option<String> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).ok()?;
    let ctx_name = kc.current_context.clone()?;
    let ctx = kc
        .contexts
        .iter()
        .find(|c| c.name == ctx_name)?
        .context
        .clone()?;
    let user = kc
        .auth_infos
        .iter()
        .find(|a| a.name == ctx.user.clone().unwrap_or_default())?;
    // kube keeps tokens in a SecretString; its serializer writes the value back out.
    let info = serde_json::to_value(user.auth_info.as_ref()?).ok()?;
    info.get("token")?.as_str().map(String::from)
}

/// A `kB` field of /proc/<pid>/status, in kB (0 when absent).
pub(super) fn status_kb(status: &str, field: &str) -> f64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// The binary an operator runs: `ccm-controller-manager` beside this one (the image's binary:
/// the CCM without the tools, so its code pages are what production maps). A `cargo run` of
/// `ccm` alone may not have built it; then this binary's `ccm run` is measured, with a warning,
/// because its resident set includes the tools' code.
pub(super) fn ccm_under_test() -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe().context("locating the ccm binary")?;
    let slim = me.with_file_name("ccm-controller-manager");
    if slim.is_file() {
        return Ok(slim);
    }
    eprintln!(
        "bench: {} not found (build it: cargo build --release -p ccm); measuring `{} run`, \
         whose RSS includes the code of the tools",
        slim.display(),
        me.display()
    );
    Ok(me)
}

/// The CCM's secure port, which a `CcmKill` restart binds again: from below the ephemeral
/// range, so no outgoing connection takes it meanwhile.
pub(super) fn free_port() -> anyhow::Result<u16> {
    Ok(ccm_kube_sim::ports::free_loopback_ports(1)?)
}

/// The bench's sim cloud: `--cloud-latency` plus up to a tenth more, or exactly it where a
/// scenario plays a workload whose cloud had no jitter.
pub(super) fn sim_cloud(opts: &BenchOptions, fault_rate: f64) -> anyhow::Result<SimCloud> {
    let jitter_divisor = if opts.exact_cloud_latency { 0 } else { 10 };
    crate::cluster::sim_cloud(7, opts.cloud_latency.0, jitter_divisor, fault_rate)
}

impl Env {
    pub(super) async fn start(
        opts: &BenchOptions,
        fault_rate: f64,
        extra: &[String],
    ) -> anyhow::Result<Env> {
        let cloud = sim_cloud(opts, fault_rate)?;
        let mut cluster = match &opts.kubeconfig {
            Some(path) => SimCluster::connect(path, cloud.clone()).await?,
            None => {
                let threads = (opts.api_threads > 0).then_some(opts.api_threads);
                SimCluster::start_with_threads(cloud.clone(), threads).await?
            }
        };
        cluster.bodies = opts.objects;
        if let Some(kube) = &cluster.kube {
            kube.set_cost_model(opts.cost_model()?);
            if opts.api_429_rate > 0.0 || opts.api_priority_level.is_some() {
                let faults = kube.faults();
                faults.set_client_prefix(Some(USER_AGENT_BASE.to_string()));
                faults.set_retry_after(opts.api_retry_after);
                faults.set_429_rate(None, opts.api_429_rate);
                faults.set_priority_level(opts.api_priority_level);
            }
        }
        let server = SimServer::start(cloud, SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let dir = cluster
            .kubeconfig
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(std::env::temp_dir);
        let cloud_config = dir.join(format!("bench-cloud-{}.toml", rand::random::<u32>()));
        std::fs::write(&cloud_config, cloud_config_toml(opts, &server.endpoint())?)?;
        let bin = match &opts.ccm_bin {
            Some(b) => b.clone(),
            None => ccm_under_test()?,
        };
        let port = free_port()?;
        let cert_dir = dir.join(format!("bench-certs-{}", rand::random::<u32>()));
        let mut args = vec![
            "run".to_string(),
            "--cloud-provider=sim".to_string(),
            format!("--cloud-config={}", cloud_config.display()),
            format!("--kubeconfig={}", cluster.kubeconfig.display()),
            format!("--cluster-cidr={CLUSTER_CIDR}"),
            "--bind-address=127.0.0.1".to_string(),
            format!("--secure-port={port}"),
            // SO_REUSEADDR: a CCM restarted after a SIGKILL binds the same port while the
            // killed one's closed connections sit in TIME_WAIT (EADDRINUSE without it).
            "--permit-address-sharing=true".to_string(),
            format!("--cert-dir={}", cert_dir.display()),
            "-v=1".to_string(),
        ];
        args.extend(opts.kube_api_qps.map(|q| format!("--kube-api-qps={q}")));
        args.extend(opts.kube_api_burst.map(|b| format!("--kube-api-burst={b}")));
        args.extend(opts.ccm_args.iter().cloned());
        args.extend(extra.iter().cloned());
        let launch = Launch {
            bin,
            args,
            log_path: opts.ccm_log.clone().unwrap_or_else(|| dir.join("ccm.log")),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            cert_dir,
            token: bearer_token(&cluster.kubeconfig),
        };
        let (child, pid) = launch.spawn()?;
        let http = launch.ready(pid).await?;
        Ok(Env {
            cluster,
            server,
            child,
            pid,
            http,
            launch,
            cloud_in_ccm: opts.cloud_in_ccm,
        })
    }

    /// Kills the CCM under test with SIGKILL (no shutdown of any kind: its lease stays held
    /// until it expires) and starts a new one with the same flags, ready when this returns.
    pub(super) async fn kill_and_restart(&mut self) -> anyhow::Result<()> {
        self.child
            .start_kill()
            .context("SIGKILL to the CCM under test")?;
        self.child
            .wait()
            .await
            .context("reaping the CCM under test")?;
        let (child, pid) = self.launch.spawn()?;
        (self.child, self.pid) = (child, pid);
        self.http = self.launch.ready(pid).await?;
        Ok(())
    }

    /// [`wait_until`] that gives up as soon as the CCM under test has exited, with its log's
    /// path and last lines: a crashed CCM is an error of the run, not a slow convergence.
    pub(super) async fn until<F, Fut>(
        &self,
        timeout: Duration,
        mut check: F,
    ) -> anyhow::Result<bool>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<bool>>,
    {
        wait_until(timeout, || {
            let exited = self.ccm_exited();
            let fut = check();
            async move {
                if exited {
                    anyhow::bail!(self.launch.exit_report());
                }
                fut.await
            }
        })
        .await
    }

    /// Whether the CCM under test has exited (for loops that sample rather than wait).
    pub(super) fn ccm_exited(&self) -> bool {
        exited(self.pid)
    }

    pub(super) fn usage(&self) -> Usage {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap_or_default();
        ccm_manager::procfs::read_pid(self.pid)
            .map(|p| Usage {
                peak_rss_mb: p.peak_rss_bytes as f64 / 1e6,
                rss_mb: p.rss_bytes as f64 / 1e6,
                cpu_seconds: p.cpu_seconds,
                rss_anon_mb: status_kb(&status, "RssAnon:") / 1e3,
                rss_file_mb: status_kb(&status, "RssFile:") / 1e3,
            })
            .unwrap_or_default()
    }

    /// `UpdateLoadBalancer` calls the cloud has answered so far.
    pub(super) async fn lb_updates(&self) -> u64 {
        if self.cloud_in_ccm {
            let calls = self.cloud_calls().await;
            return calls
                .get(ccm_cloud::op::UPDATE_LOAD_BALANCER)
                .copied()
                .unwrap_or(0);
        }
        self.cluster
            .cloud
            .call_count(ccm_cloud::op::UPDATE_LOAD_BALANCER)
    }

    /// Waits until there are `lbs` load balancers, each with `hosts` hosts (a join reached them
    /// all); false on timeout.
    pub(super) async fn until_lbs_have(
        &self,
        timeout: Duration,
        lbs: usize,
        hosts: usize,
    ) -> anyhow::Result<bool> {
        self.until(timeout, || async {
            let counts = self.cluster.cloud.load_balancer_host_counts();
            Ok(counts.len() == lbs && counts.iter().all(|h| *h == hosts))
        })
        .await
    }

    /// `UpdateLoadBalancer` calls since the count was `before`, once the count has not moved
    /// for `quiet`, and how long after `t1` it last moved: every update a join causes, not only
    /// the first pass (a second one lands up to a node-sync window later).
    pub(super) async fn lb_updates_settled(
        &self,
        before: u64,
        t1: Instant,
        quiet: Duration,
    ) -> (u64, Duration) {
        let updates = || async { self.lb_updates().await.saturating_sub(before) };
        // Updates already made count as made now (the caller waited for them): an upper bound.
        let mut seen = updates().await;
        let mut last_change = if seen > 0 {
            t1.elapsed()
        } else {
            Duration::ZERO
        };
        while t1.elapsed() < last_change + quiet {
            tokio::time::sleep(self.lb_poll_interval(t1.elapsed().saturating_sub(last_change)))
                .await;
            let now = updates().await;
            if now != seen {
                (seen, last_change) = (now, t1.elapsed());
            }
        }
        (seen, last_change)
    }

    /// How long to wait before looking at the update count again, `since` its last move: ten
    /// a second while the count moves, one a second once it has been still for two, so that
    /// the CCM's CPU for rendering /metrics stays a small part of what the run measures.
    fn lb_poll_interval(&self, since: Duration) -> Duration {
        match (self.cloud_in_ccm, since < Duration::from_secs(2)) {
            (false, _) => Duration::from_millis(20),
            (true, true) => Duration::from_millis(100),
            (true, false) => Duration::from_secs(1),
        }
    }

    /// The CCM's /metrics page; empty when it cannot be read.
    async fn metrics_page(&self) -> String {
        match self.http.get("/metrics").await {
            Ok((200, body)) => body,
            _ => String::new(),
        }
    }

    /// The sum of `family`'s samples over all their labels (0 when the page cannot be read).
    pub(super) async fn metric(&self, family: &str) -> u64 {
        let page = self.metrics_page().await;
        samples(&page)
            .filter(|(name, _, _)| *name == family)
            .map(|(_, _, v)| v)
            .sum::<f64>() as u64
    }

    /// Cloud calls so far by operation, whatever their result: as the sim cloud counted them,
    /// or, when it runs in the CCM's process, as the CCM's /metrics do (empty if unreadable).
    pub(super) async fn cloud_calls(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        if self.cloud_in_ccm {
            let page = self.metrics_page().await;
            let calls =
                samples(&page).filter(|(name, _, _)| *name == "cloudprovider_api_requests_total");
            for (_, series, n) in calls {
                *out.entry(label(series, "operation").unwrap_or_default())
                    .or_default() += n as u64;
            }
            return out;
        }
        for ((op, _), n) in self.cluster.cloud.calls() {
            *out.entry(op).or_default() += n;
        }
        out
    }

    pub(super) async fn stop(mut self) {
        #[cfg(unix)]
        {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(self.pid.to_string())
                .status()
                .await;
            let _ = tokio::time::timeout(Duration::from_secs(15), self.child.wait()).await;
        }
        let _ = self.child.kill().await;
        let _ = self.server.shutdown().await;
    }
}

/// The CCM's `--cloud-config`: the bench's served cloud, or with
/// [`BenchOptions::cloud_in_ccm`] a cloud of its own with the bench's latency and an instance for
/// each Node the scenario may register (twice `--nodes` and 100 more: the reference run's 2,100
/// at 1,000 Nodes).
fn cloud_config_toml(opts: &BenchOptions, endpoint: &str) -> anyhow::Result<String> {
    if !opts.cloud_in_ccm {
        return Ok(format!(
            "endpoint = \"{endpoint}\"\nactor = \"ccm-under-test\"\n"
        ));
    }
    let fixed_ms = u64::try_from(opts.cloud_latency.0.as_millis())?;
    let jitter_ms = if opts.exact_cloud_latency {
        0
    } else {
        fixed_ms / 10
    };
    let own = SimConfig {
        seed: Some(7),
        latency: [(
            "*".to_string(),
            LatencyConfig {
                fixed_ms,
                jitter_ms,
            },
        )]
        .into(),
        instances: (0..opts.nodes * 2 + 100)
            .map(SimCluster::registered_instance)
            .collect(),
        ..Default::default()
    };
    Ok(toml::to_string(&own)?)
}

/// Whether process `pid` is gone or a zombie (exited, not yet reaped).
fn exited(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        // The state follows the command name, which is in parentheses and may hold spaces.
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| matches!(state, "Z" | "X"))
    })
}

/// The last `n` lines of `path` (empty when it cannot be read).
fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Args {
        #[command(flatten)]
        bench: BenchOptions,
    }

    /// The CCM's own cloud must hold every Node the scenario registers (the burst and both
    /// joins), each at the IP its kubelet reports, and answer in exactly the bench's latency:
    /// a Node it lacks would never be initialized.
    #[test]
    fn a_ccm_with_its_own_cloud_knows_every_node_the_bench_registers() {
        let mut opts = Args::parse_from(["bench", "--nodes=1000"]).bench;
        opts.cloud_in_ccm = true;
        opts.exact_cloud_latency = true;
        let text = cloud_config_toml(&opts, "http://unused").expect("config");
        let config: SimConfig = toml::from_str(&text).expect("the CCM's parser reads it");
        assert_eq!(config.endpoint, None);
        assert_eq!(config.instances.len(), 2_100);
        let cloud = config.build_cloud().expect("a valid sim config");
        for i in [0, 999, 1000, 1001] {
            let node = SimCluster::registered_instance(i);
            let found = cloud
                .instances()
                .into_iter()
                .find(|inst| inst.name == node.name)
                .unwrap_or_else(|| panic!("no instance {}", node.name));
            let internal = found.addresses.iter().find(|a| a.type_ == "InternalIP");
            let want = node.internal_ip.map(|ip| ip.to_string());
            assert_eq!(internal.map(|a| a.address.clone()), want, "{}", node.name);
        }
        assert_eq!(
            config.latency["*"],
            LatencyConfig {
                fixed_ms: 50,
                jitter_ms: 0
            }
        );
    }
}
