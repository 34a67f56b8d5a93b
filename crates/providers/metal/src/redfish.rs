//! A minimal Redfish client: read a System's `PowerState`, bounded and timed out.
//!
//! BMCs are slow and flaky, so every request has a timeout, all requests share one concurrency
//! bound, and every failure other than "the System resource does not exist" (HTTP 404) is an
//! error the caller must not read as "machine gone".

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use parking_lot::Mutex;
use tokio::sync::Semaphore;

use crate::config::BmcConfig;

/// What a BMC says about one System.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Power {
    /// `PowerState` is `On` (or `PoweringOn`, `PoweringOff`: still running).
    On,
    /// `PowerState` is `Off`.
    Off,
    /// The System resource does not exist (HTTP 404).
    NoSuchSystem,
}

/// Why a BMC gave no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BmcError {
    /// No answer within the timeout.
    #[error("BMC {endpoint} did not answer within {timeout:?}")]
    Timeout {
        /// The endpoint.
        endpoint: String,
        /// The timeout.
        timeout: Duration,
    },
    /// Connection or protocol failure, or a status other than 200/404.
    #[error("BMC {endpoint}: {message}")]
    Failed {
        /// The endpoint.
        endpoint: String,
        /// What went wrong (never includes credentials).
        message: String,
    },
}

type HttpClient = Client<HttpsConnector<HttpConnector>, Empty<Bytes>>;
/// `(ca_file, insecure_skip_verify)`: BMCs with the same TLS setting share a connection pool.
type TlsKey = (Option<PathBuf>, bool);

/// Shared Redfish client: one connection pool per TLS setting, one concurrency bound.
#[derive(Clone)]
pub struct Redfish {
    clients: Arc<Mutex<HashMap<TlsKey, HttpClient>>>,
    permits: Arc<Semaphore>,
    timeout: Duration,
}

impl std::fmt::Debug for Redfish {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redfish")
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Redfish {
    /// A client allowing `concurrency` requests in flight, each bounded by `timeout`.
    pub fn new(concurrency: usize, timeout: Duration) -> Self {
        Redfish {
            clients: Arc::new(Mutex::new(HashMap::new())),
            permits: Arc::new(Semaphore::new(concurrency.max(1))),
            timeout,
        }
    }

    fn client(&self, bmc: &BmcConfig) -> Result<HttpClient, String> {
        let key = (bmc.ca_file.clone(), bmc.insecure_skip_verify);
        if let Some(c) = self.clients.lock().get(&key) {
            return Ok(c.clone());
        }
        let tls = crate::tls::client_config(bmc.ca_file.as_deref(), bmc.insecure_skip_verify)?;
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(self.timeout));
        http.enforce_http(false);
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        self.clients.lock().insert(key, client.clone());
        Ok(client)
    }

    /// The power state of the System `bmc` names for `node`.
    pub async fn power(&self, bmc: &BmcConfig, node: &str) -> Result<Power, BmcError> {
        self.power_as(bmc, node, None).await
    }

    /// As [`Redfish::power`], with `(user, password)` from elsewhere (a Secret) instead of
    /// the config's `username` / `password_file`.
    pub async fn power_as(
        &self,
        bmc: &BmcConfig,
        node: &str,
        credentials: Option<(String, String)>,
    ) -> Result<Power, BmcError> {
        let _permit = self.permits.acquire().await.map_err(|_| BmcError::Failed {
            endpoint: bmc.endpoint.clone(),
            message: "client closed".into(),
        })?;
        let url = system_url(bmc, node);
        let auth = match credentials {
            Some((user, password)) => Some(encode_basic(&user, &password)),
            None => basic_auth(bmc).map_err(|message| BmcError::Failed {
                endpoint: bmc.endpoint.clone(),
                message,
            })?,
        };
        let client = self.client(bmc).map_err(|message| BmcError::Failed {
            endpoint: bmc.endpoint.clone(),
            message,
        })?;
        let fut = get_following_redirects(client, url, auth, &bmc.endpoint);
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(BmcError::Timeout {
                endpoint: bmc.endpoint.clone(),
                timeout: self.timeout,
            }),
        }
    }
}

async fn get_following_redirects(
    client: HttpClient,
    mut url: String,
    auth: Option<String>,
    endpoint: &str,
) -> Result<Power, BmcError> {
    let fail = |message: String| BmcError::Failed {
        endpoint: endpoint.to_string(),
        message,
    };
    for _ in 0..4 {
        let mut req = http::Request::get(&url).header("Accept", "application/json");
        if let Some(a) = &auth {
            req = req.header("Authorization", a);
        }
        let req = req
            .body(Empty::new())
            .map_err(|e| fail(format!("bad request URL {url}: {e}")))?;
        let resp = client
            .request(req)
            .await
            .map_err(|e| fail(format!("GET {url}: {}", error_chain(&e))))?;
        let status = resp.status();
        if status.is_redirection() {
            let loc = resp
                .headers()
                .get(http::header::LOCATION)
                .and_then(|l| l.to_str().ok())
                .ok_or_else(|| fail(format!("GET {url}: {status} without Location")))?;
            url = resolve(endpoint, loc);
            continue;
        }
        if status == http::StatusCode::NOT_FOUND {
            return Ok(Power::NoSuchSystem);
        }
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| fail(format!("GET {url}: reading the body: {e}")))?
            .to_bytes();
        if !status.is_success() {
            return Err(fail(format!("GET {url}: HTTP {status}")));
        }
        return parse_power(&body).map_err(|m| fail(format!("GET {url}: {m}")));
    }
    Err(fail(format!("GET {url}: too many redirects")))
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

/// The System URL: `system` may be an id or a path, with `{name}` replaced by the node name.
pub fn system_url(bmc: &BmcConfig, node: &str) -> String {
    let system = bmc
        .system
        .as_deref()
        .unwrap_or("{name}")
        .replace("{name}", node);
    let path = if system.starts_with('/') {
        system
    } else {
        format!("/redfish/v1/Systems/{system}")
    };
    format!("{}{path}", bmc.endpoint.trim_end_matches('/'))
}

fn resolve(endpoint: &str, location: &str) -> String {
    if location.starts_with("http://") || location.starts_with("https://") {
        location.to_string()
    } else {
        format!("{}{location}", endpoint.trim_end_matches('/'))
    }
}

fn basic_auth(bmc: &BmcConfig) -> Result<Option<String>, String> {
    let Some(user) = &bmc.username else {
        return Ok(None);
    };
    let password = match &bmc.password_file {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read password_file {}: {e}", path.display()))?
            .trim_end_matches(['\n', '\r'])
            .to_string(),
        None => String::new(),
    };
    Ok(Some(encode_basic(user, &password)))
}

fn encode_basic(user: &str, password: &str) -> String {
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {token}")
}

fn parse_power(body: &[u8]) -> Result<Power, String> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("not a Redfish JSON document: {e}"))?;
    match v.get("PowerState").and_then(|p| p.as_str()) {
        Some("Off") => Ok(Power::Off),
        Some("On" | "PoweringOn" | "PoweringOff" | "Paused") => Ok(Power::On),
        Some(other) => Err(format!("unknown PowerState {other:?}")),
        None => Err("the System has no PowerState".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let mut b = BmcConfig {
            endpoint: "http://bmc:8000/".into(),
            ..Default::default()
        };
        assert_eq!(
            system_url(&b, "n1"),
            "http://bmc:8000/redfish/v1/Systems/n1"
        );
        b.system = Some("/redfish/v1/Systems/{name}-sys".into());
        assert_eq!(
            system_url(&b, "n1"),
            "http://bmc:8000/redfish/v1/Systems/n1-sys"
        );
        assert_eq!(resolve("http://bmc:8000", "/x"), "http://bmc:8000/x");
    }

    #[test]
    fn power_states() {
        assert_eq!(parse_power(br#"{"PowerState":"Off"}"#), Ok(Power::Off));
        assert_eq!(parse_power(br#"{"PowerState":"On"}"#), Ok(Power::On));
        assert!(parse_power(br#"{"Name":"x"}"#).is_err());
        assert!(parse_power(b"<html>").is_err());
    }
}
