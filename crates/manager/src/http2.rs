//! The CCM's API connections speak HTTP/2 when the server offers it, as client-go's do.
//!
//! kube-rs builds its HTTPS connector for HTTP/1.1 only, so every request in flight is a TCP
//! connection with its own TLS session and buffers: a 1,000-node burst opened ~80 of them
//! (about 3 MB of the CCM's heap, and as many TLS handshakes for the API server). Here the
//! same layers kube-rs stacks (base URI, retries, authentication, extra headers, timeouts) sit
//! on a connector that offers `h2` by ALPN: against kube-apiserver (or kube-sim) a client then
//! multiplexes all its requests, watches included, on one connection, and a server that only
//! speaks HTTP/1.1 still gets HTTP/1.1.

use std::time::Duration;

use anyhow::Context as _;
use http_body_util::BodyExt as _;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{Body, ClientBuilder, ConfigExt as _, DynBody};
use tower::util::BoxService;
use tower::{BoxError, ServiceBuilder, ServiceExt as _};

/// The service kube-rs's own builder produces, so both builders have one type.
type Generic = BoxService<http::Request<Body>, http::Response<Box<DynBody>>, BoxError>;

/// An idle connection is pinged this often and dropped when a ping goes unanswered for
/// [`PING_TIMEOUT`]: client-go's HTTP/2 health check (`ReadIdleTimeout` 30 s,
/// `PingTimeout` 15 s), so a dead API server is noticed even while only watches are open.
const PING_INTERVAL: Duration = Duration::from_secs(30);
/// See [`PING_INTERVAL`].
const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// TLS sessions each API client keeps for resumption (see [`connector`]).
const RESUMABLE_SESSIONS: usize = 4;

/// A client builder whose connections negotiate HTTP/2, or `None` where kube-rs's own builder
/// must serve: plain `http://` servers (no ALPN to negotiate with), proxies, and exec plugins
/// that hand out client certificates with an expiry (kube-rs tracks that privately).
/// `gate` sits inside the retry layer, where it sees every attempt's answer.
pub fn builder(
    config: &kube::Config,
    gate: Option<crate::adaptive::AdaptiveConcurrencyLayer>,
) -> anyhow::Result<Option<ClientBuilder<Generic>>> {
    let https = config.cluster_url.scheme_str() == Some("https");
    let exec = config.auth_info.exec.is_some();
    if !https || config.proxy_url.is_some() || exec {
        return Ok(None);
    }
    let connector = connector(config)?;
    let client: hyper_util::client::legacy::Client<_, Body> =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .http2_keep_alive_interval(PING_INTERVAL)
            .http2_keep_alive_timeout(PING_TIMEOUT)
            .http2_keep_alive_while_idle(true)
            // Flow-control windows that grow with the measured bandwidth-delay product: a
            // LIST of thousands of Nodes is not throttled to 64 KiB per round trip.
            .http2_adaptive_window(true)
            .build(connector);
    let retry = config
        .default_retry
        .then(|| tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry()));
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(gate)
        .option_layer(config.auth_layer().context("API server credentials")?)
        .layer(
            config
                .extra_headers_layer()
                .context("API request headers")?,
        )
        .map_err(BoxError::from)
        .service(client)
        .map_response(|res: http::Response<hyper::body::Incoming>| {
            res.map(|body| Box::new(body.map_err(BoxError::from)) as Box<DynBody>)
        })
        .boxed();
    Ok(Some(ClientBuilder::new(
        service,
        config.default_namespace.clone(),
    )))
}

/// kube-rs's TLS settings (CA, client certificate, server name) on a connector that offers
/// `h2` before `http/1.1`, with kube-rs's connect and read/write timeouts.
fn connector(
    config: &kube::Config,
) -> anyhow::Result<hyper_timeout::TimeoutConnector<hyper_rustls::HttpsConnector<HttpConnector>>> {
    let mut tls = config
        .rustls_client_config()
        .context("TLS settings of the API server connection")?;
    // One server per client: a few resumable sessions are enough, where rustls's default
    // store allocates room for 256 up front, in each of the CCM's clients (client-go keeps
    // none: it resumes no sessions).
    tls.resumption = rustls::client::Resumption::in_memory_sessions(RESUMABLE_SESSIONS);
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let mut builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only();
    if let Some(name) = &config.tls_server_name {
        let name = rustls_pki_types::ServerName::try_from(name.clone())
            .with_context(|| format!("tls-server-name {name:?} is not a valid server name"))?;
        builder =
            builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = builder.enable_all_versions().wrap_connector(http);
    let mut timeouts = hyper_timeout::TimeoutConnector::new(https);
    timeouts.set_connect_timeout(config.connect_timeout);
    timeouts.set_read_timeout(config.read_timeout);
    timeouts.set_write_timeout(config.write_timeout);
    timeouts.set_reset_reader_on_write(config.reset_reader_on_write);
    Ok(timeouts)
}
