//! `/healthz`, `/readyz`, `/livez` and `/metrics` on `--bind-address:--secure-port`.
//!
//! - `/healthz`: every check (leader-election watchdog, one per running controller), with
//!   `/healthz/<check>` and `?verbose` as upstream.
//! - `/livez`: the process serves requests (no dependency checks, so a kubelet never restarts a
//!   CCM because the API server is down).
//! - `/readyz`: caches are synced and the health checks pass.
//! - `/metrics`: the whole registry (controllers, provider, workqueues, leader election,
//!   `rest_client_*`, `process_*`): OpenMetrics when the scraper asks for it, else the
//!   Prometheus text format upstream serves (see [`crate::expfmt`]).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path as AxPath, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use parking_lot::RwLock;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// A named check: `Ok` when healthy, `Err(reason)` otherwise.
pub type Check = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Health and readiness checks, added as components start.
#[derive(Clone, Default)]
pub struct Health {
    health: Arc<RwLock<Vec<(String, Check)>>>,
    ready: Arc<RwLock<Vec<(String, Check)>>>,
}

impl Health {
    /// Adds a check to `/healthz` (and so to `/readyz`).
    pub fn add_health(&self, name: &str, check: Check) {
        self.health.write().push((name.to_string(), check));
    }
    /// Adds a check to `/readyz` only (e.g. "caches synced").
    pub fn add_ready(&self, name: &str, check: Check) {
        self.ready.write().push((name.to_string(), check));
    }

    fn run(&self, include_ready: bool, only: Option<&str>, exclude: &[String]) -> (bool, String) {
        let mut lines = vec!["[+]ping ok".to_string()];
        let mut ok = true;
        let health = self.health.read();
        let ready = self.ready.read();
        let mut checks: Vec<&(String, Check)> = health.iter().collect();
        if include_ready {
            checks.extend(ready.iter());
        }
        let mut found = only.is_none();
        for (name, check) in checks {
            if exclude.iter().any(|e| e == name) || only.is_some_and(|o| o != name) {
                continue;
            }
            found = true;
            match check() {
                Ok(()) => lines.push(format!("[+]{name} ok")),
                Err(reason) => {
                    ok = false;
                    lines.push(format!("[-]{name} failed: {reason}"));
                }
            }
        }
        if !found {
            return (
                false,
                format!("no such check {:?}", only.unwrap_or_default()),
            );
        }
        (ok, lines.join("\n"))
    }
}

/// Shared state of the HTTP handlers.
#[derive(Clone)]
struct AppState {
    health: Health,
    registry: Arc<RwLock<Registry>>,
}

#[derive(serde::Deserialize, Default)]
struct CheckQuery {
    verbose: Option<String>,
    exclude: Option<String>,
}

fn check_response(health: &Health, ready: bool, only: Option<&str>, q: &CheckQuery) -> Response {
    let exclude: Vec<String> = q
        .exclude
        .as_deref()
        .map(|e| e.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    let (ok, detail) = health.run(ready, only, &exclude);
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    let body = if q.verbose.is_some() || !ok {
        format!(
            "{detail}\n{} check {}\n",
            if ready { "readyz" } else { "healthz" },
            if ok { "passed" } else { "failed" }
        )
    } else {
        "ok".to_string()
    };
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

async fn healthz(State(s): State<AppState>, Query(q): Query<CheckQuery>) -> Response {
    check_response(&s.health, false, None, &q)
}

async fn healthz_one(
    State(s): State<AppState>,
    AxPath(name): AxPath<String>,
    Query(q): Query<CheckQuery>,
) -> Response {
    check_response(&s.health, false, Some(&name), &q)
}

async fn readyz(State(s): State<AppState>, Query(q): Query<CheckQuery>) -> Response {
    check_response(&s.health, true, None, &q)
}

async fn livez() -> &'static str {
    "ok"
}

async fn metrics(State(s): State<AppState>, headers: header::HeaderMap) -> Response {
    let mut body = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut body, &s.registry.read()) {
        return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response();
    }
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (content_type, body) = if crate::expfmt::wants_openmetrics(accept) {
        (crate::expfmt::OPENMETRICS_CONTENT_TYPE, body)
    } else {
        (
            crate::expfmt::TEXT_CONTENT_TYPE,
            crate::expfmt::openmetrics_to_text(&body),
        )
    };
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// The router, for tests and for embedding.
pub fn router(health: Health, registry: Arc<RwLock<Registry>>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/healthz/{name}", get(healthz_one))
        .route("/readyz", get(readyz))
        .route("/livez", get(livez))
        .route("/metrics", get(metrics))
        .with_state(AppState { health, registry })
}

/// How the secure port serves: TLS, the auth guard, socket options.
pub struct SecureServing {
    /// Certificate, client CA, TLS version, HTTP/2 streams.
    pub tls: crate::tls::TlsSettings,
    /// Delegated authentication and authorization.
    pub guard: Arc<crate::auth::Guard>,
    /// `--permit-port-sharing`.
    pub reuse_port: bool,
    /// `--permit-address-sharing`.
    pub reuse_addr: bool,
}

/// Serves HTTPS with delegated authn/authz until `shutdown`, as upstream's secure port: there
/// is no plain-HTTP mode.
pub async fn serve(
    addr: SocketAddr,
    serving: SecureServing,
    health: Health,
    registry: Arc<RwLock<Registry>>,
    shutdown: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let app = router(health, registry).layer(axum::middleware::from_fn_with_state(
        serving.guard.clone(),
        crate::auth::Guard::layer,
    ));
    let listener = crate::tls::bind(addr, serving.reuse_port, serving.reuse_addr)
        .map_err(|e| anyhow::anyhow!("--bind-address/--secure-port {addr}: cannot listen: {e}"))?;
    let local = listener.local_addr()?;
    let acceptor = crate::tls::acceptor(&serving.tls, addr.ip(), &shutdown)?;
    tokio::spawn(crate::tls::serve_tls(
        listener,
        acceptor,
        app,
        serving.tls.http2_max_streams,
        shutdown,
    ));
    Ok(local)
}

/// `process_*` metrics read from /proc on each scrape (Linux), as Go's process collector.
#[derive(Debug)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(p) = crate::procfs::read_self() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(p.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        for (name, help, value) in [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                p.rss_bytes as f64,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                p.vsize_bytes as f64,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                p.start_time_seconds,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                p.open_fds as f64,
            ),
        ] {
            let g = ConstGauge::new(value);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        Ok(())
    }
}
