//! The HTTP side of every OpenStack call: one connection pool, a timeout per request
//! (`[Metadata] request-timeout`, as upstream), the status → [`CloudError`] mapping, and a
//! count of the calls made, per operation, that tests and `ccm bench` read.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use ccm_cloud::CloudError;
use http::{HeaderMap, Method, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use parking_lot::Mutex;

use crate::secret::Secret;

type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A response: OpenStack bodies are JSON documents small enough to hold whole.
#[derive(Debug)]
pub struct Reply {
    /// The HTTP status.
    pub status: StatusCode,
    /// The response headers (`X-Subject-Token`, `Retry-After`).
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
}

impl Reply {
    /// The body as `T`, or an error naming the operation (a parse error is never an answer).
    pub fn json<T: serde::de::DeserializeOwned>(&self, op: &str) -> Result<T, CloudError> {
        serde_json::from_slice(&self.body)
            .map_err(|e| CloudError::Transient(format!("{op}: unexpected response body ({e})")))
    }

    /// The body's `key` member as `T` (OpenStack wraps each answer: `{"loadbalancer": {…}}`),
    /// or an error naming the operation.
    pub fn field<T: serde::de::DeserializeOwned>(
        &self,
        op: &str,
        key: &str,
    ) -> Result<T, CloudError> {
        let mut v: serde_json::Value = self.json(op)?;
        serde_json::from_value(v[key].take())
            .map_err(|e| CloudError::Transient(format!("{op}: unexpected response body ({e})")))
    }
}

/// The shared HTTP client.
pub struct Http {
    client: HttpClient,
    timeout: Duration,
    calls: Mutex<BTreeMap<String, u64>>,
}

impl Http {
    /// A client trusting the system roots, or `ca_file`, or nothing (`insecure`).
    pub fn new(ca_file: Option<&Path>, insecure: bool, timeout: Duration) -> Result<Self, String> {
        let tls = ccm_cloud::tls::client_config("ca-file", ca_file, insecure)?;
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(timeout.min(Duration::from_secs(10))));
        http.enforce_http(false);
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Http {
            client,
            timeout,
            calls: Mutex::default(),
        })
    }

    /// Calls made so far, by operation label (`compute GET /servers/detail`).
    pub fn calls(&self) -> BTreeMap<String, u64> {
        self.calls.lock().clone()
    }

    /// Sends one request. `op` labels it in counts and errors; `token` goes in
    /// `X-Auth-Token`. Transport failures and timeouts are [`CloudError::Transient`]; every
    /// HTTP status is returned for the caller to judge. Redirects are not followed, so a token
    /// never leaves the endpoint it was meant for.
    pub async fn send(
        &self,
        op: &str,
        method: Method,
        url: &str,
        token: Option<&Secret>,
        headers: &[(&str, &str)],
        body: Option<&serde_json::Value>,
    ) -> Result<Reply, CloudError> {
        *self.calls.lock().entry(op.to_string()).or_default() += 1;
        let mut req = http::Request::builder()
            .method(method)
            .uri(url)
            .header("accept", "application/json")
            .header("user-agent", concat!("ccm-rs/", env!("CARGO_PKG_VERSION")));
        if let Some(t) = token {
            req = req.header("x-auth-token", t.expose());
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let payload = match body {
            Some(b) => {
                req = req.header("content-type", "application/json");
                Bytes::from(b.to_string())
            }
            None => Bytes::new(),
        };
        let req = req
            .body(Full::new(payload))
            .map_err(|e| CloudError::Permanent(format!("{op}: bad request URL {url}: {e}")))?;
        let exchange = async {
            let resp =
                self.client.request(req).await.map_err(|e| {
                    CloudError::Transient(format!("{op} {url}: {}", error_chain(&e)))
                })?;
            let (parts, body) = resp.into_parts();
            let body = body
                .collect()
                .await
                .map_err(|e| CloudError::Transient(format!("{op} {url}: reading the body: {e}")))?
                .to_bytes();
            Ok(Reply {
                status: parts.status,
                headers: parts.headers,
                body,
            })
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(r) => r,
            Err(_) => Err(CloudError::Transient(format!(
                "{op} {url}: no answer within {:?}",
                self.timeout
            ))),
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        out.push_str(": ");
        out.push_str(&s.to_string());
        src = s.source();
    }
    out
}

/// The error for a status the caller did not expect. 429 is throttling (with the server's
/// `Retry-After`), 5xx transient, anything else — 401 and 403 among them — permanent until
/// someone fixes the cloud. Never "not found": only callers that know a 404 is authoritative
/// turn it into "gone".
pub fn status_error(op: &str, reply: &Reply) -> CloudError {
    let snippet: String = String::from_utf8_lossy(&reply.body)
        .chars()
        .take(300)
        .collect();
    let message = format!("{op}: HTTP {}: {}", reply.status.as_u16(), snippet.trim());
    match reply.status.as_u16() {
        429 => CloudError::Throttled {
            message,
            retry_after: reply
                .headers
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs),
        },
        500..=599 => CloudError::Transient(message),
        _ => CloudError::Permanent(message),
    }
}
