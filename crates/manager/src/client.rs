//! Kubernetes clients: from `--kubeconfig`/`--master` or in-cluster, with the client-side rate
//! limit of `--kube-api-qps`/`--kube-api-burst`, a per-controller User-Agent, and optionally a
//! per-controller service account (`--use-service-account-credentials`).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use ccm_cloud::TokenBucket;
use http::header::{HeaderValue, USER_AGENT};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use kube::client::{Body, ClientBuilder, DynBody};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::time::Instant;
use tower::{BoxError, Layer, Service};

use crate::adaptive::{AdaptiveConcurrencyLayer, AdaptiveLimit, Baseline, ObserveLayer};
use crate::client_metrics::{RestClientMetrics, RestMetricsLayer, host_label};

/// Requests in flight per client (watches included).
pub const MAX_IN_FLIGHT: usize = 16;

/// Requests in flight for the cloud-node controller's client. A burst of registrations is a
/// race for the API server between the kubelets (32 in flight in the issue 17 load generator;
/// 2 writes per Node) and this controller (2 writes per Node too): at 16 it got a third of the
/// server, fell behind during the burst and initialized the last Node 1.1–1.6 s after the last
/// registration on the calibrated model.
pub const NODE_INIT_IN_FLIGHT: usize = 64;

/// Most requests in flight for the service controller's client; see [`service_in_flight`].
pub const SERVICE_MAX_IN_FLIGHT: usize = 128;

/// Requests in flight for the service controller's client: one per worker
/// (`--concurrent-service-syncs`, each worker has at most one API request open), at least
/// [`MAX_IN_FLIGHT`] and at most [`SERVICE_MAX_IN_FLIGHT`]. With 100 workers behind 16 slots, 200
/// Services created at once waited ~50 ms per finalizer or status patch for a slot (a patch
/// took ~2 ms once it had one; `ccm bench services`, 1,000 nodes, free kube-sim).
pub fn service_in_flight(concurrent_service_syncs: usize) -> usize {
    concurrent_service_syncs.clamp(MAX_IN_FLIGHT, SERVICE_MAX_IN_FLIGHT)
}

/// User agent prefix, as upstream's `cloud-controller-manager`.
pub const USER_AGENT_BASE: &str = "cloud-controller-manager";

/// Reads a kubeconfig file. Its errors keep the first line only (what is wrong, at which line
/// and column): the YAML parser adds an excerpt of the file around the error, which would put
/// the tokens and passwords on neighbouring lines into the log.
pub fn read_kubeconfig(path: &Path) -> anyhow::Result<Kubeconfig> {
    // kube-client 5.0 panics on a UTF-16 file of an odd length (its byte-order-mark decoding
    // indexes past the last byte; found by fuzzing): refuse such a file here.
    if let Ok(bytes) = std::fs::read(path)
        && matches!(bytes.as_slice(), [0xFF, 0xFE, ..] | [0xFE, 0xFF, ..])
        && !bytes.len().is_multiple_of(2)
    {
        anyhow::bail!("not a kubeconfig: UTF-16 text with an odd number of bytes");
    }
    Kubeconfig::read_from(path).map_err(|e| {
        let text = e.to_string();
        anyhow::anyhow!("{}", text.lines().next().unwrap_or_default().trim_end())
    })
}

/// Reads `--kubeconfig` (or the in-cluster / default config) and applies `--master`.
pub async fn load_config(
    kubeconfig: Option<&Path>,
    master: Option<&str>,
) -> anyhow::Result<kube::Config> {
    let mut config = match kubeconfig {
        Some(path) => {
            let kc = read_kubeconfig(path)
                .with_context(|| format!("--kubeconfig {}: cannot read", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("--kubeconfig {}: invalid", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no --kubeconfig given and no in-cluster or default kubeconfig found")?,
    };
    if let Some(master) = master {
        config.cluster_url = master
            .parse()
            .with_context(|| format!("--master {master:?}: not a URL"))?;
    }
    Ok(config)
}

/// A token bucket in front of a client, shared by every clone of it.
#[derive(Clone)]
pub struct RateLimitLayer {
    bucket: Option<Arc<parking_lot::Mutex<TokenBucket>>>,
    /// Where each request's wait is reported (`rest_client_rate_limiter_duration_seconds`),
    /// with the API server's host label.
    observer: Option<(RestClientMetrics, Arc<str>)>,
}

impl RateLimitLayer {
    /// `qps <= 0` disables the limit.
    pub fn new(qps: f64, burst: u32) -> Self {
        RateLimitLayer {
            bucket: (qps > 0.0).then(|| {
                Arc::new(parking_lot::Mutex::new(TokenBucket::new(
                    qps,
                    burst,
                    Instant::now(),
                )))
            }),
            observer: None,
        }
    }

    /// The same bucket, reporting each request's wait into `metrics` under `host`.
    pub fn observed(&self, metrics: RestClientMetrics, host: &str) -> Self {
        RateLimitLayer {
            bucket: self.bucket.clone(),
            observer: Some((metrics, host.into())),
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            bucket: self.bucket.clone(),
            observer: self.observer.clone(),
            pending: None,
            reserved: None,
        }
    }
}

/// The service produced by [`RateLimitLayer`]: readiness waits for a token, so requests leave
/// at most `qps` per second (after a burst), in order.
pub struct RateLimited<S> {
    inner: S,
    bucket: Option<Arc<parking_lot::Mutex<TokenBucket>>>,
    observer: Option<(RestClientMetrics, Arc<str>)>,
    /// The wait for the token reserved for the next call, once reserved.
    pending: Option<Pin<Box<tokio::time::Sleep>>>,
    /// How long the next call waits for its reserved token, once reserved.
    reserved: Option<Duration>,
}

impl<S, B> Service<http::Request<B>> for RateLimited<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if let Some(bucket) = &self.bucket
            && self.reserved.is_none()
        {
            let wait = bucket.lock().reserve(Instant::now());
            self.reserved = Some(wait);
            if !wait.is_zero() {
                self.pending = Some(Box::pin(tokio::time::sleep(wait)));
            }
        }
        if let Some(sleep) = self.pending.as_mut() {
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.pending = None;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if let (Some(wait), Some((metrics, host))) = (self.reserved.take(), &self.observer) {
            metrics.observe_rate_limiter(req.method().as_str(), host, wait);
        }
        self.inner.call(req)
    }
}

/// How a client bounds its requests in flight.
#[derive(Clone)]
pub enum InFlight {
    /// A fixed bound.
    Fixed(usize),
    /// A fixed bound, its responses teaching the shared [`Baseline`]: the leader elector's
    /// client, whose lease renewals must never wait behind an adaptive limit and measure the
    /// idle server, and the admin client.
    Observed(usize, Baseline),
    /// An [`AdaptiveLimit`]: a controller's client.
    Adaptive(AdaptiveLimit),
}

/// Builds a client from `config` with a User-Agent and a rate limit (unmetered: for one-shot
/// tools such as `ccm doctor`; the CCM's own clients use [`build_metered_client`]).
pub fn build_client(
    config: kube::Config,
    user_agent: &str,
    limit: &RateLimitLayer,
) -> anyhow::Result<kube::Client> {
    build(
        config,
        user_agent,
        limit,
        None,
        InFlight::Fixed(MAX_IN_FLIGHT),
    )
}

/// Like [`build_client`], counting and timing every request in `metrics` (client-go's
/// `rest_client_*` families).
pub fn build_metered_client(
    config: kube::Config,
    user_agent: &str,
    limit: &RateLimitLayer,
    metrics: &RestClientMetrics,
) -> anyhow::Result<kube::Client> {
    let in_flight = InFlight::Fixed(MAX_IN_FLIGHT);
    build(config, user_agent, limit, Some(metrics), in_flight)
}

/// [`build_metered_client`] with its requests in flight bounded by `in_flight` instead of
/// [`MAX_IN_FLIGHT`].
pub fn build_metered_client_in_flight(
    config: kube::Config,
    user_agent: &str,
    limit: &RateLimitLayer,
    metrics: &RestClientMetrics,
    in_flight: InFlight,
) -> anyhow::Result<kube::Client> {
    build(config, user_agent, limit, Some(metrics), in_flight)
}

fn build(
    mut config: kube::Config,
    user_agent: &str,
    limit: &RateLimitLayer,
    metrics: Option<&RestClientMetrics>,
    in_flight: InFlight,
) -> anyhow::Result<kube::Client> {
    let host = host_label(&config.cluster_url);
    config.headers.retain(|(name, _)| name != USER_AGENT);
    config.headers.push((
        USER_AGENT,
        HeaderValue::from_str(user_agent).context("user agent")?,
    ));
    // Inside kube-rs's retry layer (HTTPS: our own stack) the adaptive gate sees each attempt:
    // every 429, latencies without the retries' Retry-After waits, and no slot held during
    // them. kube-rs's own stack (plain HTTP, proxies, exec plugins) has no place for it: there
    // the gate wraps whole requests.
    let gate = match &in_flight {
        InFlight::Adaptive(l) => Some(AdaptiveConcurrencyLayer::new(l.clone())),
        _ => None,
    };
    let (builder, gated) = match crate::http2::builder(&config, gate)? {
        Some(builder) => (builder, true),
        None => (
            ClientBuilder::try_from(config).context("building the Kubernetes client")?,
            false,
        ),
    };
    let builder = bound_in_flight(builder, in_flight, gated);
    Ok(match metrics {
        Some(m) => builder
            .with_layer(&limit.observed(m.clone(), &host))
            .with_layer(&RestMetricsLayer::new(m.clone(), host))
            .build(),
        None => builder.with_layer(limit).build(),
    })
}

/// The client stack as kube-rs's builder boxes it.
type Boxed = tower::util::BoxService<http::Request<Body>, http::Response<Box<DynBody>>, BoxError>;

/// Bounded requests in flight per client: the API server's share of this client, and over
/// HTTP/1.1 (plain-HTTP servers) every concurrent request is a connection, so a burst of
/// hundreds of parallel writes would leave hundreds of idle connections (and their buffers)
/// behind. 64 in flight still moves thousands of writes/s.
/// `gated`: an adaptive gate inside the retry layer already bounds them.
fn bound_in_flight(
    builder: ClientBuilder<Boxed>,
    in_flight: InFlight,
    gated: bool,
) -> ClientBuilder<Boxed> {
    use tower::layer::layer_fn;
    use tower::limit::ConcurrencyLimitLayer;
    match in_flight {
        InFlight::Fixed(n) => builder
            .with_layer(&ConcurrencyLimitLayer::new(n.max(1)))
            .with_layer(&layer_fn(Boxed::new)),
        InFlight::Observed(n, baseline) => builder
            .with_layer(&ObserveLayer::baseline(baseline))
            .with_layer(&ConcurrencyLimitLayer::new(n.max(1)))
            .with_layer(&layer_fn(Boxed::new)),
        InFlight::Adaptive(_) if gated => builder,
        InFlight::Adaptive(limit) => builder
            .with_layer(&AdaptiveConcurrencyLayer::new(limit))
            .with_layer(&layer_fn(Boxed::new)),
    }
}

/// How long minted service-account tokens live; they are refreshed at half that.
const TOKEN_TTL: Duration = Duration::from_secs(3600);

/// Mints a token for `kube-system/<account>` with the TokenRequest API and returns a config
/// that authenticates with it. The token lives in a file that a background task refreshes,
/// and kube-rs re-reads token files, so the client never expires.
pub async fn service_account_config(
    admin: &kube::Client,
    base: &kube::Config,
    account: &str,
    token_dir: &Path,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<kube::Config> {
    let path: PathBuf = token_dir.join(format!("{account}.token"));
    write_token(admin, account, &path).await?;
    let admin = admin.clone();
    let account_owned = account.to_string();
    let refresh_path = path.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(TOKEN_TTL / 2) => {}
            }
            if let Err(e) = write_token(&admin, &account_owned, &refresh_path).await {
                tracing::warn!(account = %account_owned, error = %e, "could not refresh service account token");
            }
        }
    });
    let mut config = base.clone();
    config.auth_info = kube::config::AuthInfo {
        token_file: Some(path.display().to_string()),
        ..Default::default()
    };
    Ok(config)
}

async fn write_token(admin: &kube::Client, account: &str, path: &Path) -> anyhow::Result<()> {
    let api: Api<ServiceAccount> = Api::namespaced(admin.clone(), "kube-system");
    let req = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: None,
            expiration_seconds: Some(TOKEN_TTL.as_secs() as i64),
            bound_object_ref: None,
        }),
        ..Default::default()
    };
    let resp = api
        .create_token_request(account, &PostParams::default(), &req)
        .await
        .with_context(|| {
            format!("--use-service-account-credentials: cannot mint a token for kube-system/{account} (does the service account exist, and may the CCM create serviceaccounts/token?)")
        })?;
    let token = resp
        .status
        .and_then(|s| s.token)
        .filter(|t| !t.is_empty())
        .with_context(|| format!("TokenRequest for kube-system/{account} returned no token"))?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, token).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_utf16_kubeconfig_of_an_odd_length_is_an_error_not_a_panic() {
        let path = std::env::temp_dir().join(format!("ccm-kc-utf16-{}", std::process::id()));
        std::fs::write(&path, [0xFE, 0xFF, 0x00, 0x61, 0x00]).expect("write");
        let e = super::read_kubeconfig(&path).expect_err("odd UTF-16");
        assert!(e.to_string().contains("UTF-16"), "{e}");
        let _ = std::fs::remove_file(&path);
    }

    use super::*;

    #[test]
    fn the_service_client_has_a_slot_per_worker_within_bounds() {
        assert_eq!(service_in_flight(100), 100, "the default: one per worker");
        assert_eq!(service_in_flight(1), MAX_IN_FLIGHT, "upstream's 1 worker");
        assert_eq!(service_in_flight(10_000), SERVICE_MAX_IN_FLIGHT);
    }

    /// Found by the `kubeconfig` fuzz target: the YAML error quoted the lines around it,
    /// password included.
    #[tokio::test]
    async fn a_kubeconfig_syntax_error_does_not_show_its_neighbouring_credentials() {
        let dir = std::env::temp_dir().join(format!("ccm-kubeconfig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("kubeconfig");
        let text = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://10.0.0.1:6443\n    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLSer:\n    username: admin\n    password: adminPassw1rd\n";
        std::fs::write(&path, text).expect("write");
        let err = load_config(Some(path.as_path()), None)
            .await
            .expect_err("not YAML");
        let msg = format!("{err:#}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
        assert!(!msg.contains("adminPassw1rd"), "{msg}");
        assert!(msg.contains("line 7"), "the error still says where: {msg}");
    }
}
