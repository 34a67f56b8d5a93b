#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod admission;
mod apply;
pub mod cost;
mod discovery;
mod faults;
mod kinds;
mod managed;
mod metrics;
mod openapi;
mod patch;
pub mod ports;
mod proto;
pub mod rbac;
mod realistic;
mod resources;
mod review;
mod scale;
mod selectors;
mod server;
mod status;
mod store;
mod table;
mod tls;
mod watch_cache;
mod workloads;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context as _;
use base64::Engine as _;
use ipnet::IpNet;
use parking_lot::RwLock;
use serde_json::json;
use tokio::net::TcpListener;

/// In-process entry points of kube-sim's request decoding for the fuzz targets (`fuzz/`,
/// docs/fuzzing.md): what a client's bytes reach. Not an API.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::patch::{PatchType, apply};
    pub use crate::proto::{decode_object, encode_object};
    pub use crate::selectors::{FieldSelector, LabelSelector};

    impl crate::KubeSim {
        /// Serves one request in process, as the listener does (authentication included).
        pub async fn serve_one(
            &self,
            req: http::Request<http_body_util::Full<bytes::Bytes>>,
        ) -> http::Response<axum::body::Body> {
            self.shared.clone().handle(req).await
        }
    }
}

pub use faults::Faults;
pub use metrics::{RequestCount, RequestKey, Verb};
pub use realistic::{realistic_node, realistic_node_status, realistic_service};
pub use resources::{ListStrategy, RESOURCES, ResourceDesc};
pub use status::{ApiError, FieldError, FieldErrorKind};

use kinds::Allocator;
use server::Shared;
use store::Store;

/// The default bearer token of in-process simulators (CLI mode generates one unless given).
pub const DEFAULT_TOKEN: &str = "kube-sim-admin-token";

/// The user name of the configured tokens (members of `system:masters`, never subject to RBAC).
pub const ADMIN_USER: &str = "kube-sim-admin";

/// The User-Agent of [`KubeSim::client`].
pub const DEFAULT_USER_AGENT: &str = "kube-sim-client";

/// Simulator settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where to listen; port 0 picks a free port. Loopback by default.
    pub listen: SocketAddr,
    /// Bearer tokens accepted (the first one goes into kubeconfigs and clients). They belong to
    /// [`ADMIN_USER`] in `system:masters`, which RBAC never restricts.
    pub tokens: Vec<String>,
    /// Enforce RBAC (Roles, ClusterRoles and bindings stored in the simulator) for every user
    /// outside `system:masters` — service-account tokens from TokenRequest and
    /// [`KubeSim::add_user_token`]. Off by default: every valid token may do everything.
    pub rbac: bool,
    /// Service CIDRs, at most one per IP family; the first is the primary family.
    pub service_cidrs: Vec<IpNet>,
    /// NodePort range, inclusive.
    pub node_port_range: (u16, u16),
    /// Watch history kept per kind, in events; older resourceVersions get 410 Expired.
    pub retention: usize,
    /// Events a watcher may lag behind before it is disconnected.
    pub watch_buffer: usize,
    /// How often watches with `allowWatchBookmarks` get a BOOKMARK.
    pub bookmark_interval: Duration,
    /// Watch duration when the client sends no `timeoutSeconds`.
    pub watch_timeout: Duration,
    /// Serve HTTPS with a generated CA instead of plain HTTP.
    pub tls: bool,
    /// Latency added to every API request.
    pub fault_latency: Duration,
    /// Fraction of API requests (all verbs) failed with 429.
    pub fault_429_rate: f64,
    /// Fraction of API requests (all verbs) failed with 500.
    pub fault_500_rate: f64,
    /// What each request costs the server (CPU burned for real, commit latency for writes);
    /// [`cost::CostModel::free`] by default, [`cost::CostModel::calibrated`] to behave like
    /// kube-apiserver + etcd on a small machine.
    pub cost: cost::CostModel,
    /// Serve on a runtime of its own with this many worker threads instead of the caller's: a
    /// real API server is a process of its own (GOMAXPROCS threads), so its requests and its
    /// clients' work share the cores by the kernel's scheduling, not by one queue of tasks,
    /// and a saturated server does not hold up a watcher that measures it. `None` (the
    /// default): on the caller's runtime.
    pub threads: Option<usize>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            tokens: vec![DEFAULT_TOKEN.to_string()],
            rbac: false,
            service_cidrs: vec![IpNet::V4(
                "10.96.0.0/12".parse().unwrap_or_else(|_| unreachable!()),
            )],
            node_port_range: (30000, 32767),
            retention: 10_000,
            watch_buffer: 4096,
            bookmark_interval: Duration::from_secs(10),
            watch_timeout: Duration::from_secs(1800),
            tls: false,
            fault_latency: Duration::ZERO,
            fault_429_rate: 0.0,
            fault_500_rate: 0.0,
            cost: cost::CostModel::free(),
            threads: None,
        }
    }
}

/// A running simulator. Dropping it stops serving (like [`KubeSim::shutdown`], without waiting).
pub struct KubeSim {
    addr: SocketAddr,
    shared: Arc<Shared>,
    tls: Option<tls::TlsMaterial>,
    token: String,
    faults: Faults,
    stop: tokio::sync::watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
    /// The runtime it serves on, when [`Config::threads`] gave it one of its own.
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for KubeSim {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.task.take() {
            t.abort();
        }
        // Without waiting: dropping a runtime blocks, which an async caller must not.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

fn validate_cidrs(cidrs: &[IpNet]) -> anyhow::Result<()> {
    anyhow::ensure!(!cidrs.is_empty(), "at least one service CIDR is required");
    anyhow::ensure!(
        cidrs.len() <= 2,
        "at most two service CIDRs (one per family)"
    );
    if cidrs.len() == 2 {
        anyhow::ensure!(
            matches!(cidrs[0], IpNet::V4(_)) != matches!(cidrs[1], IpNet::V4(_)),
            "two service CIDRs must be of different IP families"
        );
    }
    Ok(())
}

impl KubeSim {
    /// Starts serving on `cfg.listen` with the default namespaces and the `kubernetes` Service.
    pub async fn start(cfg: Config) -> anyhow::Result<Self> {
        let Some(threads) = cfg.threads else {
            return Self::start_here(cfg).await;
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("kube-sim")
            .enable_all()
            .build()
            .context("starting kube-sim's runtime")?;
        let started = match rt.spawn(Self::start_here(cfg)).await {
            Ok(started) => started,
            Err(e) => Err(anyhow::anyhow!("kube-sim's start failed: {e}")),
        };
        match started {
            Ok(mut sim) => {
                sim.runtime = Some(rt);
                Ok(sim)
            }
            // Not dropped: dropping a runtime blocks, which an async caller must not.
            Err(e) => {
                rt.shutdown_background();
                Err(e)
            }
        }
    }

    /// [`Self::start`] on the current runtime.
    async fn start_here(cfg: Config) -> anyhow::Result<Self> {
        validate_cidrs(&cfg.service_cidrs)?;
        anyhow::ensure!(!cfg.tokens.is_empty(), "at least one token is required");
        anyhow::ensure!(
            cfg.node_port_range.0 > 0 && cfg.node_port_range.0 <= cfg.node_port_range.1,
            "invalid NodePort range {:?}",
            cfg.node_port_range
        );
        let listener = TcpListener::bind(cfg.listen)
            .await
            .with_context(|| format!("binding {}", cfg.listen))?;
        let addr = listener.local_addr()?;
        let store = Arc::new(Store::new(
            cfg.retention,
            cfg.watch_buffer,
            Allocator::new(cfg.service_cidrs.clone(), cfg.node_port_range),
        ));
        seed(&store, &cfg)?;
        let (disconnect, _) = tokio::sync::watch::channel(0u64);
        let disconnect = Arc::new(disconnect);
        let fault_cfg = Arc::new(RwLock::new(faults::FaultConfig {
            retry_after: 1,
            latency: cfg.fault_latency,
            ..Default::default()
        }));
        let faults = Faults {
            cfg: fault_cfg.clone(),
            disconnect: disconnect.clone(),
            store: store.clone(),
        };
        if cfg.fault_429_rate > 0.0 {
            faults.set_429_rate(None, cfg.fault_429_rate);
        }
        if cfg.fault_500_rate > 0.0 {
            faults.set_500_rate(None, cfg.fault_500_rate);
        }
        let tls = if cfg.tls {
            let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
            if !addr.ip().is_unspecified() && !addr.ip().is_loopback() {
                hosts.push(addr.ip().to_string());
            }
            Some(tls::generate(&hosts)?)
        } else {
            None
        };
        let shared = Arc::new(Shared {
            store,
            metrics: metrics::Metrics::default(),
            tokens: RwLock::new(
                cfg.tokens
                    .iter()
                    .map(|t| (t.clone(), rbac::UserInfo::admin(ADMIN_USER)))
                    .collect::<HashMap<_, _>>(),
            ),
            rbac: cfg.rbac,
            faults: fault_cfg,
            disconnect,
            bookmark_interval: cfg.bookmark_interval,
            default_watch_timeout: cfg.watch_timeout,
            server_address: RwLock::new(addr.to_string()),
            connections: Default::default(),
            accepted: Default::default(),
            cost: RwLock::new(Arc::new(cfg.cost.clone())),
            allocations: tokio::sync::Mutex::new(()),
            etcd: Default::default(),
            dispatch: Default::default(),
            runtime: tokio::runtime::Handle::current(),
        });
        watch_cache::Dispatch::start_if_charged(&shared, &cfg.cost);
        let acceptor = match &tls {
            Some(t) => Some(t.acceptor()?),
            None => None,
        };
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, acceptor, shared.clone(), stop_rx));
        Ok(Self {
            addr,
            shared,
            tls,
            token: cfg.tokens[0].clone(),
            faults,
            stop,
            task: Some(task),
            runtime: None,
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL clients connect to (`http://` or `https://`).
    pub fn url(&self) -> String {
        let host = if self.addr.ip().is_unspecified() {
            "127.0.0.1".to_string()
        } else if self.addr.is_ipv6() {
            format!("[{}]", self.addr.ip())
        } else {
            self.addr.ip().to_string()
        };
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{host}:{}", self.addr.port())
    }

    /// The bearer token clients use.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Accepts another bearer token for [`ADMIN_USER`] from now on.
    pub fn add_token(&self, token: impl Into<String>) {
        self.add_user_token(token, rbac::UserInfo::admin(ADMIN_USER));
    }

    /// Accepts a bearer token for `user` from now on (subject to RBAC when [`Config::rbac`]).
    pub fn add_user_token(&self, token: impl Into<String>, user: rbac::UserInfo) {
        self.shared.tokens.write().insert(token.into(), user);
    }

    /// A token for service account `namespace/name`, as TokenRequest would mint it (the
    /// account must exist). For tests that run a client under a manifest's identity.
    pub fn service_account_token(&self, namespace: &str, name: &str) -> anyhow::Result<String> {
        self.shared
            .store
            .get(resources::ids::SERVICEACCOUNTS, namespace, name)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let r: [u8; 16] = rand::random();
        let hex: String = r.iter().map(|b| format!("{b:02x}")).collect();
        let token = format!("kube-sim.sa.{namespace}.{name}.{hex}");
        self.add_user_token(
            token.clone(),
            rbac::UserInfo::service_account(namespace, name),
        );
        Ok(token)
    }

    /// A kube client authenticating as service account `namespace/name` with `user_agent`.
    pub fn client_as_service_account(
        &self,
        namespace: &str,
        name: &str,
        user_agent: &str,
    ) -> anyhow::Result<kube::Client> {
        use http::{HeaderValue, header};
        let token = self.service_account_token(namespace, name)?;
        let mut c = self.kube_config(user_agent)?;
        c.headers.retain(|(h, _)| h != header::AUTHORIZATION);
        c.headers.push((
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}"))?,
        ));
        Ok(kube::Client::try_from(c)?)
    }

    /// Decides a request as the RBAC authorizer would, whatever [`Config::rbac`] says — what a
    /// SubjectAccessReview answers.
    pub fn authorize(&self, attrs: &rbac::Attributes) -> rbac::Decision {
        self.shared.authorize(attrs)
    }

    /// A kube client with [`DEFAULT_USER_AGENT`]. Must be called inside a tokio runtime.
    pub fn client(&self) -> anyhow::Result<kube::Client> {
        self.client_with_user_agent(DEFAULT_USER_AGENT)
    }

    /// A kube client whose requests are counted under `user_agent` (the `client` label).
    pub fn client_with_user_agent(&self, user_agent: &str) -> anyhow::Result<kube::Client> {
        Ok(kube::Client::try_from(self.kube_config(user_agent)?)?)
    }

    /// The kube client configuration behind [`Self::client_with_user_agent`], for callers that
    /// tune timeouts or retries before building a client.
    pub fn kube_config(&self, user_agent: &str) -> anyhow::Result<kube::Config> {
        use http::{HeaderValue, header};
        let mut c = kube::Config::new(self.url().parse()?);
        c.headers.push((
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {}", self.token))?,
        ));
        c.headers
            .push((header::USER_AGENT, HeaderValue::from_str(user_agent)?));
        if let Some(t) = &self.tls {
            c.root_cert = Some(vec![t.ca_der.clone()]);
        }
        Ok(c)
    }

    /// A kubeconfig (YAML) for kubectl and kube-rs.
    pub fn kubeconfig_yaml(&self) -> String {
        let ca = match &self.tls {
            Some(t) => format!(
                "    certificate-authority-data: {}\n",
                base64::engine::general_purpose::STANDARD.encode(&t.ca_pem)
            ),
            None => String::new(),
        };
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: kube-sim\n  cluster:\n    server: {}\n{ca}\
             users:\n- name: kube-sim-admin\n  user:\n    token: {}\ncontexts:\n- name: kube-sim\n  context:\n    \
             cluster: kube-sim\n    user: kube-sim-admin\n    namespace: default\ncurrent-context: kube-sim\npreferences: {{}}\n",
            self.url(),
            self.token
        )
    }

    /// Writes [`Self::kubeconfig_yaml`] to `path` (mode 0600 on Unix).
    pub fn write_kubeconfig(&self, path: &Path) -> anyhow::Result<()> {
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, self.kubeconfig_yaml())
            .with_context(|| format!("writing {}", path.display()))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        }
        Ok(())
    }

    /// The fault-injection handle.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// All request counters.
    pub fn requests(&self) -> Vec<RequestCount> {
        self.shared.metrics.snapshot()
    }

    /// Successful writes (create/update/patch/delete with a 2xx answer) sent with User-Agent `client`.
    pub fn count_writes(&self, client: &str) -> u64 {
        self.count_requests(|k| {
            k.client == client && k.verb.is_write() && (200..300).contains(&k.code)
        })
    }

    /// Sums the counters whose labels satisfy `pred`.
    pub fn count_requests(&self, pred: impl Fn(&RequestKey) -> bool) -> u64 {
        self.requests()
            .into_iter()
            .filter(|c| pred(&c.key))
            .map(|c| c.count)
            .sum()
    }

    /// Client connections open now (TLS ones counted once their handshake succeeded): how a
    /// test sees whether a client multiplexes its requests on one connection (HTTP/2) or keeps
    /// one per request it had in flight (HTTP/1.1), as an API server's connection count would.
    pub fn open_connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Relaxed)
    }

    /// Connections accepted since the start: each a TLS handshake when serving HTTPS. A
    /// client's pool drops a connection idle for long enough (hyper's: 90 s), so a burst after
    /// a quiet spell opens its connections again.
    pub fn accepted_connections(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }

    /// Changes what each request costs from now on (see [`cost::CostModel`]).
    pub fn set_cost_model(&self, model: cost::CostModel) {
        let model = Arc::new(model);
        *self.shared.cost.write() = model.clone();
        watch_cache::Dispatch::start_if_charged(&self.shared, &model);
    }

    /// Zeroes all request counters.
    pub fn reset_requests(&self) {
        self.shared.metrics.reset();
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.store.rv()
    }

    /// Stops accepting, closes open connections (watches included) and waits for the listener.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        self.faults.disconnect_watches();
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

fn seed(store: &Store, cfg: &Config) -> anyhow::Result<()> {
    use resources::ids;
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        store
            .create(ids::NAMESPACES, "", json!({"metadata": {"name": ns}}))
            .map_err(|e| anyhow::anyhow!("seeding namespace {ns}: {e}"))?;
    }
    // The apiserver's own Service takes the first address of the primary range.
    let first = match cfg.service_cidrs[0] {
        IpNet::V4(n) => std::net::IpAddr::V4((u32::from(n.network()) + 1).into()),
        IpNet::V6(n) => std::net::IpAddr::V6((u128::from(n.network()) + 1).into()),
    };
    store
        .create(
            ids::SERVICES,
            "default",
            json!({
                "metadata": {"name": "kubernetes", "labels": {"component": "apiserver", "provider": "kubernetes"}},
                "spec": {"clusterIP": first.to_string(), "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]},
            }),
        )
        .map_err(|e| anyhow::anyhow!("seeding the kubernetes Service: {e}"))?;
    // kube-apiserver's bootstrap Role for components that delegate authentication (a CCM's
    // secure port reads the client CA from this ConfigMap); CCM manifests bind it.
    store
        .create(
            ids::ROLES,
            "kube-system",
            json!({
                "metadata": {"name": "extension-apiserver-authentication-reader",
                             "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                           "resourceNames": ["extension-apiserver-authentication"],
                           "verbs": ["get", "list", "watch"]}],
            }),
        )
        .map_err(|e| anyhow::anyhow!("seeding the bootstrap Role: {e}"))?;
    Ok(())
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shared: Arc<Shared>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let (stream, _) = tokio::select! {
            _ = stop.changed() => break,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "kube-sim: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            // Reap finished connections so the set does not grow without bound.
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        let tls = tls.clone();
        conns.spawn(async move {
            let accepted = shared.clone();
            let svc =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let s = shared.clone();
                    async move { Ok::<_, Infallible>(s.handle(req).await) }
                });
            let builder =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            accepted.accepted.fetch_add(1, Ordering::Relaxed);
            let res = match tls {
                Some(acc) => match handshake(&accepted, acc, stream).await {
                    Ok(s) => {
                        let _open = OpenConnection::new(&accepted);
                        builder
                            .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                            .await
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "kube-sim: TLS handshake failed");
                        return;
                    }
                },
                None => {
                    let _open = OpenConnection::new(&accepted);
                    builder
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await
                }
            };
            if let Err(e) = res {
                tracing::debug!(error = %e, "kube-sim: connection ended with error");
            }
        });
    }
    conns.shutdown().await;
}

/// A TLS handshake, after its CPU in the cost model (none unless the `handshake` knob is set).
async fn handshake(
    shared: &Shared,
    acceptor: tokio_rustls::TlsAcceptor,
    stream: tokio::net::TcpStream,
) -> std::io::Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
    let cost = shared.cost.read().clone();
    cost.charge_handshake().await;
    acceptor.accept(stream).await
}

/// Counts a connection as open for as long as it lives.
struct OpenConnection(Arc<Shared>);

impl OpenConnection {
    fn new(shared: &Arc<Shared>) -> Self {
        shared.connections.fetch_add(1, Ordering::Relaxed);
        OpenConnection(shared.clone())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Parses durations like `250ms`, `2s`, `1m` (flags).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map(|i| s.split_at(i))
        .unwrap_or((s, "s"));
    let n: f64 = num.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" | "" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => {
            return Err(format!(
                "invalid duration unit in {s:?} (use ms, s, m or h)"
            ));
        }
    };
    if !(0.0..=1e9).contains(&secs) {
        return Err(format!("duration out of range: {s:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("invalid rate {s:?}"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("rate must be between 0 and 1, got {v}"))
    }
}

fn parse_port_range(s: &str) -> Result<(u16, u16), String> {
    let (a, b) = s
        .split_once('-')
        .ok_or_else(|| format!("invalid port range {s:?} (want LOW-HIGH)"))?;
    let lo: u16 = a
        .trim()
        .parse()
        .map_err(|_| format!("invalid port {a:?}"))?;
    let hi: u16 = b
        .trim()
        .parse()
        .map_err(|_| format!("invalid port {b:?}"))?;
    if lo == 0 || lo > hi {
        return Err(format!("invalid port range {s:?}"));
    }
    Ok((lo, hi))
}

/// Flags of `ccm kube-sim`: serve until Ctrl-C and write a kubeconfig for kubectl.
#[derive(Debug, Clone, clap::Args)]
pub struct CliOptions {
    /// Address to listen on. Loopback by default: the admin token may do anything.
    #[arg(long, default_value = "127.0.0.1:6443")]
    pub listen: SocketAddr,
    /// Where to write a kubeconfig for kubectl / kube-rs.
    #[arg(long)]
    pub kubeconfig_out: Option<PathBuf>,
    /// Bearer token to accept (a random one is generated when omitted).
    #[arg(long, env = "KUBE_SIM_TOKEN")]
    pub token: Option<String>,
    /// Service CIDR(s), comma-separated, at most one per IP family.
    #[arg(long, default_value = "10.96.0.0/12", value_delimiter = ',')]
    pub service_cidr: Vec<IpNet>,
    /// NodePort range.
    #[arg(long, default_value = "30000-32767", value_parser = parse_port_range)]
    pub service_node_port_range: (u16, u16),
    /// Watch events kept per kind; watches resuming from older resourceVersions get 410 Expired.
    #[arg(long, default_value_t = 10_000)]
    pub retention: usize,
    /// Interval between watch bookmarks.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub bookmark_interval: Duration,
    /// Latency added to every API request (e.g. 20ms).
    #[arg(long, default_value = "0ms", value_parser = parse_duration)]
    pub fault_latency: Duration,
    /// Fraction (0-1) of API requests answered 429 TooManyRequests with Retry-After.
    #[arg(long, default_value = "0", value_parser = parse_rate)]
    pub fault_429_rate: f64,
    /// Fraction (0-1) of API requests answered 500 InternalError.
    #[arg(long, default_value = "0", value_parser = parse_rate)]
    pub fault_500_rate: f64,
    /// Serve HTTPS with a generated CA (written into the kubeconfig).
    #[arg(long, overrides_with = "no_tls", default_value_t = true)]
    pub tls: bool,
    /// Serve plain HTTP.
    #[arg(long = "no-tls")]
    pub no_tls: bool,
    /// Enforce RBAC for service-account tokens (the admin token is in system:masters).
    #[arg(long)]
    pub rbac: bool,
}

impl CliOptions {
    /// The simulator configuration these flags describe.
    pub fn to_config(&self) -> Config {
        let token = self.token.clone().unwrap_or_else(|| {
            let r: [u8; 16] = rand::random();
            r.iter().map(|b| format!("{b:02x}")).collect()
        });
        Config {
            listen: self.listen,
            tokens: vec![token],
            service_cidrs: self.service_cidr.clone(),
            node_port_range: self.service_node_port_range,
            retention: self.retention,
            bookmark_interval: self.bookmark_interval,
            tls: self.tls && !self.no_tls,
            fault_latency: self.fault_latency,
            fault_429_rate: self.fault_429_rate,
            fault_500_rate: self.fault_500_rate,
            rbac: self.rbac,
            ..Config::default()
        }
    }
}

/// Runs `ccm kube-sim`: serves until Ctrl-C, after writing the kubeconfig if asked.
pub async fn serve_cli(opts: CliOptions) -> anyhow::Result<()> {
    let sim = KubeSim::start(opts.to_config()).await?;
    if let Some(p) = &opts.kubeconfig_out {
        sim.write_kubeconfig(p)?;
        eprintln!(
            "kube-sim: serving {} — kubeconfig written to {} (try: KUBECONFIG={} kubectl get nodes)",
            sim.url(),
            p.display(),
            p.display()
        );
    } else {
        eprintln!(
            "kube-sim: serving {} (bearer token {}); pass --kubeconfig-out PATH for kubectl",
            sim.url(),
            sim.token()
        );
    }
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    eprintln!("kube-sim: shutting down");
    sim.shutdown().await;
    Ok(())
}
