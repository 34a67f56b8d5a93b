//! client-go's `rest_client_*` metrics, produced by the Kubernetes clients themselves: a tower
//! layer on every kube-rs client counts each request as it leaves (lists, writes, watches,
//! lease renewals, TokenReviews alike), and the client-side rate limiter reports how long each
//! request waited for a token. Names, labels and buckets are upstream's
//! (`k8s.io/component-base/metrics/prometheus/restclient`), so dashboards built on upstream's
//! CCM keep working.
//!
//! As client-go does: `rest_client_requests_total` counts every response by status code (or
//! `<error>` when none arrived), watches included; `rest_client_request_duration_seconds`
//! covers non-watch requests, from the moment the request waits for the rate limiter; the
//! rate-limiter histogram gets one observation per request that went through a limiter.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::time::Instant;
use tower::{Layer, Service};

/// Upstream's latency buckets for both request and rate-limiter histograms.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

/// The label client-go uses for a request that got no HTTP response.
pub const ERROR_CODE: &str = "<error>";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    code: String,
    host: String,
    method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbHost {
    host: String,
    verb: String,
}

/// The process's `rest_client_*` families, shared by every client (clone freely).
#[derive(Clone)]
pub struct RestClientMetrics {
    requests: Family<ResultLabels, Counter>,
    duration: Family<VerbHost, Histogram>,
    rate_limiter: Family<VerbHost, Histogram>,
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

impl Default for RestClientMetrics {
    fn default() -> Self {
        RestClientMetrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(latency_histogram),
            rate_limiter: Family::new_with_constructor(latency_histogram),
        }
    }
}

impl RestClientMetrics {
    /// The families, registered under upstream's names and help texts.
    pub fn new(registry: &mut Registry) -> Self {
        let m = RestClientMetrics::default();
        registry.register(
            "rest_client_requests",
            "Number of HTTP requests, partitioned by status code, method, and host",
            m.requests.clone(),
        );
        registry.register(
            "rest_client_request_duration_seconds",
            "Request latency in seconds. Broken down by verb, and host",
            m.duration.clone(),
        );
        registry.register(
            "rest_client_rate_limiter_duration_seconds",
            "Client side rate limiter latency in seconds. Broken down by verb, and host",
            m.rate_limiter.clone(),
        );
        m
    }

    /// Counts one finished request (`code` is the status, or [`ERROR_CODE`]).
    pub fn count(&self, code: &str, method: &str, host: &str) {
        self.requests
            .get_or_create(&ResultLabels {
                code: code.to_string(),
                host: host.to_string(),
                method: method.to_string(),
            })
            .inc();
    }

    /// Records a request's latency.
    pub fn observe_request(&self, verb: &str, host: &str, latency: Duration) {
        self.duration
            .get_or_create(&verb_host(verb, host))
            .observe(latency.as_secs_f64());
    }

    /// Records how long a request waited for the client-side rate limiter.
    pub fn observe_rate_limiter(&self, verb: &str, host: &str, wait: Duration) {
        self.rate_limiter
            .get_or_create(&verb_host(verb, host))
            .observe(wait.as_secs_f64());
    }
}

fn verb_host(verb: &str, host: &str) -> VerbHost {
    VerbHost {
        host: host.to_string(),
        verb: verb.to_string(),
    }
}

/// `host[:port]` of the API server URL, as client-go's `url.URL.Host` labels it.
pub fn host_label(url: &http::Uri) -> String {
    url.authority()
        .map(|a| {
            a.as_str()
                .rsplit('@')
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .unwrap_or_default()
}

/// True for `?watch=true` / `?watch=1` requests, which client-go leaves out of the latency
/// histogram (they last as long as the watch).
fn is_watch(uri: &http::Uri) -> bool {
    uri.query().is_some_and(|q| {
        q.split('&')
            .any(|kv| matches!(kv, "watch=true" | "watch=1" | "watch=True"))
    })
}

/// The outermost layer of a client: counts and times its requests.
#[derive(Clone)]
pub struct RestMetricsLayer {
    metrics: RestClientMetrics,
    host: String,
}

impl RestMetricsLayer {
    /// Metrics for a client talking to `host` (see [`host_label`]).
    pub fn new(metrics: RestClientMetrics, host: String) -> Self {
        RestMetricsLayer { metrics, host }
    }
}

impl<S> Layer<S> for RestMetricsLayer {
    type Service = RestMetered<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RestMetered {
            inner,
            layer: self.clone(),
            waiting_since: None,
        }
    }
}

/// The service produced by [`RestMetricsLayer`].
pub struct RestMetered<S> {
    inner: S,
    layer: RestMetricsLayer,
    /// When the next request started waiting for readiness (the rate limiter, the in-flight
    /// bound): its latency counts from there, as client-go's starts before `tryThrottle`.
    waiting_since: Option<Instant>,
}

impl<S, B, RB> Service<http::Request<B>> for RestMetered<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.waiting_since.get_or_insert_with(Instant::now);
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let start = self.waiting_since.take().unwrap_or_else(Instant::now);
        let method = req.method().as_str().to_string();
        let watch = is_watch(req.uri());
        let layer = self.layer.clone();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let result = fut.await;
            let code = match &result {
                Ok(resp) => resp.status().as_u16().to_string(),
                Err(_) => ERROR_CODE.to_string(),
            };
            layer.metrics.count(&code, &method, &layer.host);
            if !watch {
                layer
                    .metrics
                    .observe_request(&method, &layer.host, start.elapsed());
            }
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn host_is_authority_without_credentials() {
        let u: http::Uri = "https://10.0.0.1:6443/api".parse().unwrap();
        assert_eq!(host_label(&u), "10.0.0.1:6443");
        let u: http::Uri = "https://user:pw@kube.example".parse().unwrap();
        assert_eq!(host_label(&u), "kube.example");
    }

    #[test]
    fn watches_are_recognized() {
        let w: http::Uri = "/api/v1/nodes?resourceVersion=5&watch=true"
            .parse()
            .unwrap();
        let l: http::Uri = "/api/v1/nodes?limit=500".parse().unwrap();
        assert!(is_watch(&w));
        assert!(!is_watch(&l));
    }

    #[tokio::test]
    async fn counts_codes_and_errors_and_times_non_watches() {
        let mut reg = Registry::default();
        let m = RestClientMetrics::new(&mut reg);
        let svc = tower::service_fn(|req: http::Request<()>| async move {
            if req.uri().path() == "/fail" {
                return Err("connection refused");
            }
            Ok::<_, &str>(
                http::Response::builder()
                    .status(if req.method() == http::Method::POST {
                        201
                    } else {
                        200
                    })
                    .body(())
                    .unwrap(),
            )
        });
        let mut s = RestMetricsLayer::new(m, "h:1".into()).layer(svc);
        for (method, uri) in [
            ("GET", "/api/v1/nodes"),
            ("POST", "/api/v1/nodes"),
            ("GET", "/api/v1/nodes?watch=true"),
            ("GET", "/fail"),
        ] {
            let req = http::Request::builder()
                .method(method)
                .uri(uri)
                .body(())
                .unwrap();
            std::future::poll_fn(|cx| s.poll_ready(cx)).await.unwrap();
            let _ = s.call(req).await;
        }
        let mut out = String::new();
        encode(&mut out, &reg).unwrap();
        for line in [
            r#"rest_client_requests_total{code="200",host="h:1",method="GET"} 2"#,
            r#"rest_client_requests_total{code="201",host="h:1",method="POST"} 1"#,
            r#"rest_client_requests_total{code="<error>",host="h:1",method="GET"} 1"#,
            // The watch is counted but not timed: 2 GETs (one failed) and 1 POST timed.
            r#"rest_client_request_duration_seconds_count{host="h:1",verb="GET"} 2"#,
            r#"rest_client_request_duration_seconds_count{host="h:1",verb="POST"} 1"#,
            r#"rest_client_request_duration_seconds_bucket{le="0.005",host="h:1",verb="GET"}"#,
            r#"rest_client_request_duration_seconds_bucket{le="60.0",host="h:1",verb="GET"}"#,
        ] {
            assert!(out.contains(line), "missing {line} in\n{out}");
        }
    }
}
