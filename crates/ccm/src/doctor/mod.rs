//! `ccm doctor` (also `kubectl ccm doctor`): the troubleshooting checklist of a cluster's cloud
//! integration, automated. It reads the cluster once — GET and LIST only, never a write — into a
//! [`snapshot::Snapshot`], runs every check in [`checks`] as a pure function of it, and prints
//! ✅ / ⚠️ / ❌ with the evidence and the fix, or JSON. Exit status: 0 all ok, 1 warnings,
//! 2 failures.

pub mod checks;
pub mod metrics;
pub mod report;
pub mod snapshot;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use ccm_manager::options::GoDuration;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};

use metrics::MetricsProbe;
use report::{Finding, Report, Seen, Verdict};
use snapshot::{DEFAULT_SECURE_PORT, Flags, LeaseLookup, Listed, Settings, Snapshot, Workloads};

/// The User-Agent doctor's requests carry, so API server audit logs (and kube-sim's request
/// accounting) show what it read.
pub const USER_AGENT: &str = "ccm-doctor";

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// ✅ / ⚠️ / ❌ lines with evidence and fixes.
    Text,
    /// One JSON document (findings, verdict, exit code).
    Json,
}

/// Flags of `ccm doctor`.
#[derive(Debug, Clone, clap::Args)]
pub struct DoctorOptions {
    /// Kubeconfig to use (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context (default: the current context).
    #[arg(long)]
    pub context: Option<String>,
    /// Namespace the cloud-controller-manager runs in.
    #[arg(long, short = 'n', default_value = "kube-system")]
    pub namespace: String,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// How long a node may stay uninitialized, or a LoadBalancer Service wait for its address,
    /// before it is a failure instead of a warning.
    #[arg(long, default_value = "2m")]
    pub grace: GoDuration,
    /// The CCM's metrics URL (default: https://<leader pod IP>:<--secure-port>/metrics).
    #[arg(long)]
    pub metrics_url: Option<String>,
    /// PEM file with the CA that signed the CCM's serving certificate (its --tls-cert-file's
    /// issuer, or the self-signed certificate itself). Doctor sends the kubeconfig's
    /// credentials only to an endpoint whose certificate chains to this or to the kubeconfig's
    /// CA; any other endpoint is read anonymously.
    #[arg(long)]
    pub metrics_ca: Option<PathBuf>,
}

/// Runs doctor and maps the report to the exit status.
pub async fn run(opts: DoctorOptions) -> anyhow::Result<ExitCode> {
    let report = match connect(&opts).await {
        Ok((client, config)) => diagnose(&client, &config, &opts).await,
        Err(e) => Report::new(
            "(no cluster)".into(),
            Seen::default(),
            vec![
                Finding::new("api-server", Verdict::Fail, format!("{e:#}"))
                    .fix("pass --kubeconfig PATH (and --context NAME), or set KUBECONFIG"),
            ],
        ),
    };
    match opts.output {
        Output::Text => print!("{}", report.text()),
        Output::Json => println!("{}", report.json()),
    }
    Ok(ExitCode::from(report.exit_code))
}

async fn connect(opts: &DoctorOptions) -> anyhow::Result<(kube::Client, kube::Config)> {
    let kc_opts = kube::config::KubeConfigOptions {
        context: opts.context.clone(),
        ..Default::default()
    };
    let config = match &opts.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("--kubeconfig {}: cannot read", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kc_opts)
                .await
                .with_context(|| format!("--kubeconfig {}: invalid", path.display()))?
        }
        None if opts.context.is_some() => kube::Config::from_kubeconfig(&kc_opts)
            .await
            .context("loading the kubeconfig")?,
        None => kube::Config::infer()
            .await
            .context("no kubeconfig found (and not running in a cluster)")?,
    };
    let client = ccm_manager::client::build_client(
        config.clone(),
        USER_AGENT,
        &ccm_manager::client::RateLimitLayer::new(0.0, 0),
    )?;
    Ok((client, config))
}

/// Gathers the snapshot and runs the checks; an unreachable API server is itself a finding.
pub async fn diagnose(
    client: &kube::Client,
    config: &kube::Config,
    opts: &DoctorOptions,
) -> Report {
    let settings = Settings {
        namespace: opts.namespace.clone(),
        grace: opts.grace.0,
    };
    let cluster = config.cluster_url.to_string();
    let extra_ca = match opts
        .metrics_ca
        .as_deref()
        .map(metrics::read_pem_certificates)
    {
        None => Vec::new(),
        Some(Ok(certs)) => certs,
        Some(Err(e)) => {
            return Report::new(
                cluster,
                Seen::default(),
                vec![
                    Finding::new("metrics-ca", Verdict::Fail, format!("{e:#}"))
                        .fix("pass a PEM file holding the CA of the CCM's serving certificate"),
                ],
            );
        }
    };
    let metrics = MetricsTarget {
        url: opts.metrics_url.as_deref(),
        extra_ca: &extra_ca,
    };
    let snap = match gather(client, config, settings, metrics).await {
        Ok(s) => s,
        Err(e) => {
            return Report::new(
                cluster,
                Seen::default(),
                vec![Finding::new("api-server", Verdict::Fail, format!("cannot list nodes: {e}"))
                    .fix("check that the API server is reachable and the kubeconfig's user may `list nodes`")],
            );
        }
    };
    let seen = Seen {
        time: snap.now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        doctor_version: format!("ccm-rs v{}", env!("CARGO_PKG_VERSION")),
        server_version: server_version(client).await,
        context: context_name(opts),
        nodes: snap.nodes.len(),
        load_balancer_services: snap.services.as_ref().map_or(0, |s| {
            s.iter()
                .filter(|s| {
                    s.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
                })
                .count()
        }),
        ccm_pods: snap.ccm_pods().len(),
    };
    Report::new(cluster, seen, checks::run_all(&snap))
}

/// The API server's gitVersion, or why it is unknown.
async fn server_version(client: &kube::Client) -> String {
    match client.apiserver_version().await {
        Ok(v) => v.git_version,
        Err(e) => format!("unknown ({e})"),
    }
}

/// The kubeconfig context doctor used: `--context`, else the kubeconfig's current one.
fn context_name(opts: &DoctorOptions) -> String {
    if let Some(c) = &opts.context {
        return c.clone();
    }
    let kc = match &opts.kubeconfig {
        Some(path) => kube::config::Kubeconfig::read_from(path).ok(),
        None => kube::config::Kubeconfig::read().ok(),
    };
    kc.and_then(|k| k.current_context)
        .unwrap_or_else(|| "(in-cluster)".into())
}

async fn list<K>(api: Api<K>) -> Listed<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| match e {
            kube::Error::Api(s) => format!("{} {}", s.code, s.message),
            other => other.to_string(),
        })
}

/// Where and how to read the CCM's metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct MetricsTarget<'a> {
    /// `--metrics-url`; default: the leading CCM pod's.
    pub url: Option<&'a str>,
    /// CAs (DER) besides the kubeconfig's that may sign the CCM's serving certificate.
    pub extra_ca: &'a [Vec<u8>],
}

/// Reads everything the checks need: GET and LIST only.
pub async fn gather(
    client: &kube::Client,
    config: &kube::Config,
    settings: Settings,
    metrics_target_opts: MetricsTarget<'_>,
) -> anyhow::Result<Snapshot> {
    let c = client.clone();
    let ns = settings.namespace.clone();
    let (nodes, pods, services, events, slices) = tokio::join!(
        list(Api::<Node>::all(c.clone())),
        list(Api::<Pod>::namespaced(c.clone(), &ns)),
        list(Api::<Service>::all(c.clone())),
        list(Api::<Event>::all(c.clone())),
        list(Api::<EndpointSlice>::all(c.clone())),
    );
    let (deployments, daemonsets, replicasets) = tokio::join!(
        list(Api::<Deployment>::namespaced(c.clone(), &ns)),
        list(Api::<DaemonSet>::namespaced(c.clone(), &ns)),
        list(Api::<ReplicaSet>::namespaced(c.clone(), &ns)),
    );
    let nodes = nodes.map_err(|e| anyhow::anyhow!(e))?;
    let mut system_pods = pods;
    if ns != "kube-system" {
        let kube_system = list(Api::<Pod>::namespaced(c.clone(), "kube-system")).await;
        if let (Ok(all), Ok(more)) = (&mut system_pods, kube_system) {
            all.extend(more);
        }
    }
    let mut snap = Snapshot {
        now: jiff::Timestamp::now(),
        nodes,
        system_pods,
        services,
        events,
        endpoint_slices: slices,
        workloads: Workloads {
            deployments,
            daemonsets,
            replicasets,
        },
        lease: LeaseLookup {
            namespace: String::new(),
            name: String::new(),
            result: Ok(None),
        },
        metrics: MetricsProbe::NotTried(String::new()),
        settings,
    };
    let (lease_ns, lease_name) = {
        let pods = snap.ccm_pods();
        snapshot::lease_of(pods.first().map(|(_, f)| f))
    };
    let result = Api::<Lease>::namespaced(c, &lease_ns)
        .get_opt(&lease_name)
        .await
        .map_err(|e| e.to_string());
    snap.lease = LeaseLookup {
        namespace: lease_ns,
        name: lease_name,
        result,
    };
    snap.metrics = match metrics_target_opts
        .url
        .map(str::to_string)
        .ok_or(())
        .or_else(|()| metrics_target(&snap))
    {
        Ok(url) => metrics::probe(config, &url, metrics_target_opts.extra_ca).await,
        Err(reason) => MetricsProbe::NotTried(reason),
    };
    Ok(snap)
}

/// The metrics URL of the leading CCM pod (the route controller only runs on the leader), else
/// of any running one.
pub fn metrics_target(snap: &Snapshot) -> Result<String, String> {
    let pods = snap.ccm_pods();
    let holder = snap
        .lease
        .result
        .as_ref()
        .ok()
        .and_then(|l| l.as_ref())
        .and_then(|l| l.spec.as_ref())
        .and_then(|s| s.holder_identity.clone())
        .unwrap_or_default();
    let running = |p: &Pod| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            && p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some()
    };
    let host_of = |p: &Pod| -> String {
        let name = p.metadata.name.clone().unwrap_or_default();
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        if p.spec.as_ref().and_then(|s| s.host_network) == Some(true) {
            node
        } else {
            name
        }
    };
    let chosen: Option<&(&Pod, Flags)> = pods
        .iter()
        .filter(|(p, _)| running(p))
        .find(|(p, _)| !holder.is_empty() && holder.starts_with(&format!("{}_", host_of(p))))
        .or_else(|| pods.iter().find(|(p, _)| running(p)));
    let Some((pod, flags)) = chosen else {
        return Err(format!(
            "no running cloud-controller-manager pod in {} to read them from",
            snap.settings.namespace
        ));
    };
    let port = flags
        .get("secure-port")
        .and_then(|p| p.parse::<u16>().ok())
        .unwrap_or(DEFAULT_SECURE_PORT);
    if port == 0 {
        return Err("the CCM serves no metrics (--secure-port=0)".into());
    }
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_default();
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip
    };
    Ok(format!("https://{host}:{port}/metrics"))
}
