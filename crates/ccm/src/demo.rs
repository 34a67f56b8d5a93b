//! `ccm demo`: a whole cluster in one process — kube-sim, the sim cloud, simulated kubelets and
//! users, and the real CCM (all four controllers, leader election) — telling a short story and
//! ending with a summary a person reads at a glance.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ccm_manager::options::{GoDuration, RunOptions};
use ccm_manager::run::{ControllerHandles, Exit, Runtime};
use ccm_provider_sim::SimCloud;
use clap::Parser;
use futures::StreamExt;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use tokio_util::sync::CancellationToken;

use crate::cluster::{CLUSTER_CIDR, ClusterState, SimCluster, wait_until};

/// Flags of `ccm demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoOptions {
    /// Nodes the simulated kubelets register at start.
    #[arg(long, default_value_t = 20)]
    pub nodes: u32,
    /// LoadBalancer Services created at start.
    #[arg(long, default_value_t = 5)]
    pub services: u32,
    /// Latency of every simulated cloud API call.
    #[arg(long, default_value = "50ms")]
    pub cloud_latency: GoDuration,
    /// Fraction of cloud API calls that fail (0.0–1.0); the controllers retry.
    #[arg(long, default_value_t = 0.0)]
    pub fault_rate: f64,
    /// Exit 0 once the story has played and everything converged (for scripts and CI).
    #[arg(long)]
    pub exit_when_converged: bool,
    /// Write a kubeconfig here so `kubectl --kubeconfig PATH get nodes -w` works meanwhile.
    #[arg(long)]
    pub kubeconfig_out: Option<PathBuf>,
    /// Write the summary as JSON here.
    #[arg(long)]
    pub summary_json: Option<PathBuf>,
    /// Run the cluster once per route mode over the same idle window and print
    /// route_controller_route_sync_total side by side.
    #[arg(long)]
    pub compare_route_modes: bool,
    /// Idle window for --compare-route-modes.
    #[arg(long, default_value = "60s")]
    pub idle_window: GoDuration,
    /// Give up when the cluster has not converged after this long.
    #[arg(long, default_value = "300s")]
    pub timeout: GoDuration,
    /// Stage a failure and keep the cluster up for `ccm doctor --kubeconfig …` to diagnose.
    #[arg(long = "break", value_enum, value_name = "SCENARIO")]
    pub breakage: Option<crate::breakage::Breakage>,
    /// A flag for the demo's CCM, e.g. `--ccm-arg=--cloud-api-qps=20` (repeatable).
    #[arg(long = "ccm-arg", value_name = "FLAG", allow_hyphen_values = true)]
    pub ccm_args: Vec<String>,
}

/// The summary printed (and written with --summary-json).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Summary {
    /// Nodes registered at start.
    pub nodes: u32,
    /// Services created at start.
    pub services: u32,
    /// Final cluster state.
    pub final_state: ClusterState,
    /// Seconds until the initial cluster converged.
    pub converge_seconds: f64,
    /// Seconds per story step.
    pub story: Vec<(String, f64)>,
    /// Cloud API calls by operation.
    pub cloud_calls: std::collections::BTreeMap<String, u64>,
    /// Cloud API calls in total.
    pub cloud_calls_total: u64,
    /// API requests by the CCM, by "verb resource[/subresource]".
    pub api_requests: std::collections::BTreeMap<String, u64>,
    /// Successful API writes by the CCM to nodes (incl. status).
    pub api_node_writes: u64,
    /// Successful API writes by the CCM in total (incl. events).
    pub api_writes_total: u64,
    /// route_controller_route_sync_total.
    pub route_syncs: u64,
    /// True when every check passed.
    pub converged: bool,
}

#[derive(Parser)]
struct RunArgs {
    #[command(flatten)]
    options: RunOptions,
}

pub(crate) struct Ccm {
    rt: Arc<Runtime>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<Exit>>,
    /// Where the CCM serves `/metrics` (HTTPS, self-signed, delegated auth).
    pub(crate) metrics_url: String,
    /// The self-signed serving certificate's chain (serving certificate, then its CA): what
    /// `ccm doctor --metrics-ca` and `curl --cacert` verify the endpoint with.
    pub(crate) serving_cert: std::path::PathBuf,
}

/// A loopback port free right now, for the demo CCM's secure port (a fixed 10258 would clash
/// with a second demo or a real CCM on the same machine).
fn free_loopback_port() -> anyhow::Result<u16> {
    Ok(ccm_kube_sim::ports::free_loopback_ports(1)?)
}

/// How to read the demo CCM's metrics, without printing the token, and sending it only to
/// the verified endpoint.
pub(crate) fn metrics_hint(ccm: &Ccm, kubeconfig: &std::path::Path) -> String {
    format!(
        "CCM metrics at {url} (HTTPS, self-signed CA in {ca}; authorized by the API server like upstream's) — try:\n  \
         ccm doctor --kubeconfig {k} --metrics-ca {ca}\n  \
         curl -s --cacert {ca} -H \"Authorization: Bearer $(kubectl --kubeconfig {k} config view --raw -o jsonpath='{{.users[0].user.token}}')\" {url}",
        url = ccm.metrics_url,
        ca = ccm.serving_cert.display(),
        k = kubeconfig.display()
    )
}

impl Ccm {
    /// Starts the real CCM against the cluster, with the cloud handed in directly.
    pub(crate) async fn start(
        cluster: &SimCluster,
        extra: &[&str],
    ) -> anyhow::Result<(Self, ControllerHandles)> {
        Self::start_advertising(cluster, extra, None).await
    }

    /// As [`Ccm::start`]; its Pod object declares `--secure-port=advertised_port` when given
    /// (another process than the CCM answers there: `--break token-probe`).
    pub(crate) async fn start_advertising(
        cluster: &SimCluster,
        extra: &[&str],
        advertised_port: Option<u16>,
    ) -> anyhow::Result<(Self, ControllerHandles)> {
        let kubeconfig = cluster.kubeconfig.display().to_string();
        let port = free_loopback_port().context("no free loopback port for the secure port")?;
        let cert_dir = cluster
            .kubeconfig
            .with_file_name(format!("ccm-serving-{port}"));
        let mut argv = vec![
            "ccm".to_string(),
            "--cloud-provider=sim".into(),
            format!("--kubeconfig={kubeconfig}"),
            format!("--cluster-cidr={CLUSTER_CIDR}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", cert_dir.display()),
            "--leader-elect-retry-period=500ms".into(),
        ];
        argv.extend(extra.iter().map(|s| s.to_string()));
        // As a Deployment's pod would run it: in-cluster config instead of --kubeconfig.
        let pod_args: Vec<String> = argv[1..]
            .iter()
            .filter(|a| !a.starts_with("--kubeconfig="))
            .map(|a| match advertised_port {
                Some(p) if a.starts_with("--secure-port=") => format!("--secure-port={p}"),
                _ => a.clone(),
            })
            .collect();
        crate::breakage::register_ccm_pod(cluster, &pod_args).await?;
        let options = RunArgs::try_parse_from(argv)?.options;
        let validated = options.validate()?;
        let mut providers = ccm_cloud::ProviderRegistry::new();
        let provider = cluster.cloud.provider();
        providers.register("sim", move |_| Ok(provider.clone()))?;
        let rt = Arc::new(Runtime::default());
        let shutdown = CancellationToken::new();
        let mut handles_rx = rt.handles.subscribe();
        let task = {
            let rt = rt.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                ccm_manager::run::run(validated, &providers, &rt, shutdown).await
            })
        };
        let handles = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                if let Some(h) = handles_rx.borrow_and_update().clone() {
                    return Ok::<_, anyhow::Error>(h);
                }
                handles_rx
                    .changed()
                    .await
                    .context("the CCM stopped before starting its controllers")?;
            }
        })
        .await
        .context("the CCM did not start its controllers within 60s")??;
        let metrics_url = format!("https://127.0.0.1:{port}/metrics");
        let serving_cert = cert_dir.join(format!("{}.crt", ccm_manager::tls::PAIR_NAME));
        Ok((
            Ccm {
                rt,
                shutdown,
                task,
                metrics_url,
                serving_cert,
            },
            handles,
        ))
    }

    pub(crate) async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        match self.task.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e),
            Err(e) => Err(anyhow::anyhow!("CCM task failed: {e}")),
        }
    }
}

pub(crate) fn cloud(opts: &DemoOptions) -> anyhow::Result<SimCloud> {
    crate::cluster::sim_cloud(42, opts.cloud_latency.0, 5, opts.fault_rate)
}

/// Progress display: bars on a terminal, plain lines otherwise.
struct Progress {
    bars: Option<(MultiProgress, Vec<ProgressBar>)>,
}

impl Progress {
    fn new(nodes: u64, services: u64) -> Self {
        if !std::io::stdout().is_terminal() {
            return Progress { bars: None };
        }
        let multi = MultiProgress::new();
        let style =
            ProgressStyle::with_template("{prefix:>18} [{bar:40.cyan/blue}] {pos:>5}/{len}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
        let mk = |label: &str, len: u64| {
            let b = multi.add(ProgressBar::new(len));
            b.set_style(style.clone());
            b.set_prefix(label.to_string());
            b
        };
        let bars = vec![
            mk("nodes initialized", nodes),
            mk("routes", nodes),
            mk("network ready", nodes),
            mk("LB ingress", services),
        ];
        Progress {
            bars: Some((multi, bars)),
        }
    }

    fn update(&self, s: &ClusterState) {
        if let Some((_, bars)) = &self.bars {
            bars[0].set_position(s.initialized as u64);
            bars[1].set_position(s.routes as u64);
            bars[2].set_position(s.network_ready as u64);
            bars[3].set_position(s.with_ingress as u64);
        }
    }

    fn finish(&self) {
        if let Some((_, bars)) = &self.bars {
            for b in bars {
                b.finish();
            }
        }
    }
}

fn converged(s: &ClusterState, nodes: usize, services: usize) -> bool {
    s.nodes == nodes
        && s.initialized == nodes
        && s.routes == nodes
        && s.network_ready == nodes
        && s.lb_services == services
        && s.with_ingress == services
        && s.cloud_lbs == services
}

async fn converge(
    cluster: &SimCluster,
    nodes: usize,
    services: usize,
    timeout: Duration,
    progress: Option<&Progress>,
) -> anyhow::Result<bool> {
    wait_until(timeout, || async {
        let s = cluster.state().await?;
        if let Some(p) = progress {
            p.update(&s);
        }
        Ok(converged(&s, nodes, services))
    })
    .await
}

pub(crate) async fn register(
    cluster: &SimCluster,
    nodes: std::ops::Range<u32>,
    services: std::ops::Range<u32>,
) -> anyhow::Result<()> {
    let node_work = futures::stream::iter(nodes)
        .map(|i| cluster.add_node(i))
        .buffer_unordered(32)
        .collect::<Vec<_>>();
    let svc_work = futures::stream::iter(services)
        .map(|i| async move { cluster.add_service(&format!("svc-{i}")).await })
        .buffer_unordered(16)
        .collect::<Vec<_>>();
    let (n, s) = tokio::join!(node_work, svc_work);
    for r in n {
        r?;
    }
    for r in s {
        r?;
    }
    Ok(())
}

impl DemoOptions {
    /// `--ccm-arg` values as the CCM's extra flags.
    pub(crate) fn ccm_arg_refs(&self) -> Vec<&str> {
        self.ccm_args.iter().map(String::as_str).collect()
    }
}

/// Runs the demo; returns the process exit code.
pub async fn run(opts: DemoOptions) -> anyhow::Result<std::process::ExitCode> {
    if opts.compare_route_modes {
        return compare_route_modes(&opts).await;
    }
    if let Some(b) = opts.breakage {
        return crate::breakage::run(&opts, b).await;
    }
    let started = Instant::now();
    let cluster = SimCluster::start(cloud(&opts)?).await?;
    if let (Some(path), Some(kube)) = (&opts.kubeconfig_out, &cluster.kube) {
        kube.write_kubeconfig(path)?;
        println!(
            "API server at {} — try: kubectl --kubeconfig {} get nodes -w",
            kube.url(),
            path.display()
        );
    }
    let (ccm, handles) = Ccm::start(&cluster, &opts.ccm_arg_refs()).await?;
    println!(
        "{}",
        metrics_hint(
            &ccm,
            opts.kubeconfig_out
                .as_deref()
                .unwrap_or(&cluster.kubeconfig)
        )
    );
    println!(
        "ccm demo: {} nodes, {} LoadBalancer services, cloud latency {}, fault rate {}",
        opts.nodes, opts.services, opts.cloud_latency, opts.fault_rate
    );

    let (n, m) = (opts.nodes as usize, opts.services as usize);
    let progress = Progress::new(n as u64, m as u64);
    let t0 = Instant::now();
    register(&cluster, 0..opts.nodes, 0..opts.services).await?;
    let ok = converge(&cluster, n, m, opts.timeout.0, Some(&progress)).await?;
    progress.finish();
    let converge_seconds = t0.elapsed().as_secs_f64();
    println!(
        "{} cluster converged in {converge_seconds:.2}s: {n} nodes initialized with routes, {m} load balancers",
        if ok { "✔" } else { "✘" }
    );
    let mut summary = Summary {
        nodes: opts.nodes,
        services: opts.services,
        converge_seconds,
        converged: ok,
        ..Default::default()
    };

    if ok {
        let steps = story(&cluster, &opts).await?;
        summary.converged = steps.iter().all(|(_, _, ok)| *ok);
        summary.story = steps.into_iter().map(|(s, t, _)| (s, t)).collect();
    }

    let state = cluster.state().await?;
    summary.final_state = state;
    for ((op, _result), count) in ccm.rt.cloud_metrics.snapshot() {
        *summary.cloud_calls.entry(op).or_default() += count;
    }
    summary.cloud_calls_total = ccm.rt.cloud_metrics.total();
    summary.api_requests = cluster.ccm_requests();
    summary.api_node_writes = cluster.ccm_writes(Some("nodes"));
    summary.api_writes_total = cluster.ccm_writes(None);
    summary.route_syncs = handles.route.as_ref().map_or(0, |r| r.syncs().total());
    print_summary(&summary, started.elapsed());
    if let Some(path) = &opts.summary_json {
        std::fs::write(path, serde_json::to_string_pretty(&summary)?)
            .with_context(|| format!("--summary-json {}", path.display()))?;
    }

    if !opts.exit_when_converged {
        println!("\nStill running: the cluster and the CCM stay up. Ctrl-C to stop.");
        let _ = tokio::signal::ctrl_c().await;
    }
    ccm.stop().await?;
    Ok(if summary.converged {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}

/// The short story: join, stop, terminate, delete. Returns (step, seconds, ok).
async fn story(
    cluster: &SimCluster,
    opts: &DemoOptions,
) -> anyhow::Result<Vec<(String, f64, bool)>> {
    let mut steps = Vec::new();
    let n = opts.nodes as usize;
    let m = opts.services as usize;
    let timeout = opts.timeout.0;

    let t = Instant::now();
    let joined = cluster.add_node(opts.nodes).await?;
    let ok = wait_until(timeout, || async {
        let s = cluster.state().await?;
        Ok(s.initialized == n + 1 && s.routes == n + 1 && s.network_ready == n + 1)
    })
    .await?;
    steps.push((
        format!("node {joined} joined → initialized, route created"),
        t.elapsed().as_secs_f64(),
        ok,
    ));
    report(steps.last());

    if n >= 2 {
        let stopped = "node-00000";
        let t = Instant::now();
        cluster.stop_node(stopped).await?;
        let ok = wait_until(timeout, || async {
            Ok(cluster.state().await?.shutdown_tainted >= 1)
        })
        .await?;
        steps.push((
            format!("instance of {stopped} stopped → shutdown taint"),
            t.elapsed().as_secs_f64(),
            ok,
        ));
        report(steps.last());

        let gone = "node-00001";
        let t = Instant::now();
        cluster.terminate_node(gone).await?;
        let ok = wait_until(timeout, || async {
            let s = cluster.state().await?;
            Ok(s.nodes == n && s.routes == n)
        })
        .await?;
        steps.push((
            format!("instance of {gone} terminated → node and its route deleted"),
            t.elapsed().as_secs_f64(),
            ok,
        ));
        report(steps.last());
    }

    if m >= 1 {
        let t = Instant::now();
        cluster.delete_service("svc-0").await?;
        let ok = wait_until(timeout, || async {
            let s = cluster.state().await?;
            Ok(s.lb_services == m - 1 && s.cloud_lbs == m - 1)
        })
        .await?;
        steps.push((
            "service svc-0 deleted → load balancer gone".to_string(),
            t.elapsed().as_secs_f64(),
            ok,
        ));
        report(steps.last());
    }
    Ok(steps)
}

fn report(step: Option<&(String, f64, bool)>) {
    if let Some((what, secs, ok)) = step {
        println!(
            "{} {what} ({secs:.2}s)",
            if *ok { "✔" } else { "✘ timed out:" }
        );
    }
}

fn print_summary(s: &Summary, total: Duration) {
    println!("\n─── summary ───────────────────────────────────────────────");
    let st = &s.final_state;
    println!(
        "nodes            {} ({} initialized, {} network ready, {} shut down)",
        st.nodes, st.initialized, st.network_ready, st.shutdown_tainted
    );
    println!("routes           {}", st.routes);
    println!(
        "load balancers   {} in the cloud, {} of {} services with ingress",
        st.cloud_lbs, st.with_ingress, st.lb_services
    );
    println!(
        "converged in     {:.2}s (whole demo {:.1}s)",
        s.converge_seconds,
        total.as_secs_f64()
    );
    println!("cloud API calls  {} total", s.cloud_calls_total);
    for (op, n) in &s.cloud_calls {
        println!("    {op:<30} {n}");
    }
    println!(
        "API writes       {} by the CCM ({} to nodes)",
        s.api_writes_total, s.api_node_writes
    );
    for (what, n) in &s.api_requests {
        println!("    {what:<30} {n}");
    }
    println!(
        "route syncs      {} (route_controller_route_sync_total)",
        s.route_syncs
    );
    println!(
        "result           {}",
        if s.converged {
            "converged ✔"
        } else {
            "NOT converged ✘"
        }
    );
}

/// Runs the cluster once per route mode over the same idle window.
async fn compare_route_modes(opts: &DemoOptions) -> anyhow::Result<std::process::ExitCode> {
    let window = opts.idle_window.0;
    println!(
        "Comparing route modes: {} nodes, idle window {}, then one node joins.",
        opts.nodes,
        GoDuration(window)
    );
    let mut rows = Vec::new();
    for (label, gate) in [
        ("interval (upstream default)", "false"),
        ("watch (ccm-rs default)", "true"),
    ] {
        let cluster = SimCluster::start(cloud(opts)?).await?;
        let gates =
            format!("--feature-gates=CloudControllerManagerWatchBasedRoutesReconciliation={gate}");
        let (ccm, handles) = Ccm::start(&cluster, &[gates.as_str()]).await?;
        let route = handles
            .route
            .clone()
            .context("route controller did not start")?;
        let n = opts.nodes as usize;
        register(&cluster, 0..opts.nodes, 0..0).await?;
        if !converge(&cluster, n, 0, opts.timeout.0, None).await? {
            anyhow::bail!("{label}: cluster did not converge");
        }
        // Let the last coalesced sync of the join burst and its confirming listing (2 s after
        // it) land: the window measures a stable cluster.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let before_idle = route.syncs().total();
        let calls_before = ccm.rt.cloud_metrics.count(ccm_cloud::op::LIST_ROUTES);
        tokio::time::sleep(window).await;
        let idle_syncs = route.syncs().total() - before_idle;
        let idle_lists = ccm.rt.cloud_metrics.count(ccm_cloud::op::LIST_ROUTES) - calls_before;
        let before_join = route.syncs().total();
        cluster.add_node(opts.nodes).await?;
        let ok = converge(&cluster, n + 1, 0, opts.timeout.0, None).await?;
        // Let any trailing sync land before counting.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let join_syncs = route.syncs().total() - before_join;
        println!(
            "  {label}: idle {idle_syncs} syncs ({idle_lists} ListRoutes), node join {join_syncs} syncs{}",
            if ok { "" } else { " (join did not converge)" }
        );
        rows.push((label, idle_syncs, join_syncs));
        ccm.stop().await?;
    }
    let per10min = |n: u64| n as f64 * 600.0 / window.as_secs_f64().max(1.0);
    println!(
        "\nroute_controller_route_sync_total over an idle window of {}:",
        GoDuration(window)
    );
    println!(
        "  {:<30} {:>8} {:>18} {:>12}",
        "mode", "idle", "per 10 idle min", "node join"
    );
    for (label, idle, join) in &rows {
        println!(
            "  {label:<30} {idle:>8} {:>18.0} {join:>12}",
            per10min(*idle)
        );
    }
    Ok(std::process::ExitCode::SUCCESS)
}
