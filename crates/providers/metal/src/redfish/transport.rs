//! HTTP to BMCs: connection pools per TLS setting (rebuilt when a CA file changes),
//! credentials that never leave the BMC's origin, basic auth or Redfish sessions.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine as _;
use http::{StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use parking_lot::Mutex;

use crate::config::{BmcAuth, BmcConfig};

type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;
/// `(ca_file, insecure_skip_verify)`: BMCs with the same TLS setting share a connection pool.
type TlsKey = (Option<PathBuf>, bool);

/// The standard Redfish sessions collection (DSP0266); every vendor serves it there.
pub const SESSIONS_PATH: &str = "/redfish/v1/SessionService/Sessions";
const MAX_REDIRECTS: usize = 4;

/// Who the requests are made as.
#[derive(Clone)]
pub enum Auth {
    /// No credentials configured.
    None,
    /// `Authorization: Basic` on every request.
    Basic { user: String, password: String },
    /// A Redfish session for this user.
    Session { user: String, password: String },
}

impl Auth {
    /// The auth `bmc` asks for, with `(user, password)` from a Secret or its `password_file`.
    pub fn of(bmc: &BmcConfig, credentials: Option<(String, String)>) -> Result<Auth, String> {
        let (user, password) = match credentials {
            Some(c) => c,
            None => {
                let Some(user) = &bmc.username else {
                    return Ok(Auth::None);
                };
                let password = match &bmc.password_file {
                    Some(path) => std::fs::read_to_string(path)
                        .map_err(|e| format!("cannot read password_file {}: {e}", path.display()))?
                        .trim_end_matches(['\n', '\r'])
                        .to_string(),
                    None => String::new(),
                };
                (user.clone(), password)
            }
        };
        Ok(match bmc.auth {
            BmcAuth::Basic => Auth::Basic { user, password },
            BmcAuth::Session => Auth::Session { user, password },
        })
    }
}

/// A response: status and body (bodies of Redfish resources are small).
pub struct Reply {
    pub status: StatusCode,
    pub body: Bytes,
    /// `Retry-After` in seconds (a 429 or 503 may carry it; the HTTP-date form is ignored).
    pub retry_after: Option<Duration>,
}

/// Shared HTTP state of the Redfish client.
#[derive(Default)]
pub struct Transport {
    clients: Mutex<HashMap<TlsKey, (Vec<u8>, HttpClient)>>,
    /// `(endpoint, user)` → `X-Auth-Token` of the session in use.
    sessions: Mutex<HashMap<(String, String), String>>,
    connect_timeout: Duration,
}

impl Transport {
    pub fn new(connect_timeout: Duration) -> Self {
        Transport {
            connect_timeout,
            ..Default::default()
        }
    }

    /// The client for `bmc`'s TLS setting. The CA file is read at every call (a few KB) and a
    /// new client built when its contents changed, so a rotated CA takes effect at once.
    async fn client(&self, bmc: &BmcConfig) -> Result<HttpClient, String> {
        let pem = match &bmc.ca_file {
            Some(path) => tokio::fs::read(path)
                .await
                .map_err(|e| format!("ca_file {}: cannot read it: {e}", path.display()))?,
            None => Vec::new(),
        };
        let key = (bmc.ca_file.clone(), bmc.insecure_skip_verify);
        if let Some((seen, c)) = self.clients.lock().get(&key)
            && *seen == pem
        {
            return Ok(c.clone());
        }
        let ca = bmc.ca_file.as_deref().map(|p| (p, pem.as_slice()));
        let tls = ccm_cloud::tls::client_config_pem("ca_file", ca, bmc.insecure_skip_verify)?;
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(self.connect_timeout));
        http.enforce_http(false);
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        self.clients.lock().insert(key, (pem, client.clone()));
        Ok(client)
    }

    /// GET `path` on `bmc` as `auth`. A session whose token the BMC refuses (401) is replaced
    /// once; any status is returned to the caller, who decides what it means.
    pub async fn get(&self, bmc: &BmcConfig, auth: &Auth, path: &str) -> Result<Reply, String> {
        let client = self.client(bmc).await?;
        let url = join(&bmc.endpoint, path)?;
        let header = match auth {
            Auth::None => None,
            Auth::Basic { user, password } => Some(("authorization", basic(user, password))),
            Auth::Session { user, password } => {
                let token = self.session(&client, bmc, user, password, false).await?;
                Some(("x-auth-token", token))
            }
        };
        let reply = get_following_redirects(&client, url.clone(), header).await?;
        if let (StatusCode::UNAUTHORIZED, Auth::Session { user, password }) = (reply.status, auth) {
            let token = self.session(&client, bmc, user, password, true).await?;
            return get_following_redirects(&client, url, Some(("x-auth-token", token))).await;
        }
        Ok(reply)
    }

    /// The session token for `(endpoint, user)`, logging in when there is none or `renew`.
    async fn session(
        &self,
        client: &HttpClient,
        bmc: &BmcConfig,
        user: &str,
        password: &str,
        renew: bool,
    ) -> Result<String, String> {
        let key = (bmc.endpoint.clone(), user.to_string());
        if !renew && let Some(t) = self.sessions.lock().get(&key) {
            return Ok(t.clone());
        }
        let url = join(&bmc.endpoint, SESSIONS_PATH)?;
        let body = serde_json::json!({"UserName": user, "Password": password}).to_string();
        let req = http::Request::post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("bad request URL {url}: {e}"))?;
        let resp = client
            .request(req)
            .await
            .map_err(|e| format!("POST {url}: {}", error_chain(&e)))?;
        let status = resp.status();
        // A login is never sent on: a redirect is a refusal like any other non-2xx.
        if !status.is_success() {
            return Err(format!("Redfish session login POST {url}: HTTP {status}"));
        }
        let token = resp
            .headers()
            .get("x-auth-token")
            .and_then(|t| t.to_str().ok())
            .filter(|t| !t.is_empty())
            .ok_or_else(|| format!("Redfish session login POST {url}: no X-Auth-Token"))?
            .to_string();
        self.sessions.lock().insert(key, token.clone());
        Ok(token)
    }
}

/// Follows up to [`MAX_REDIRECTS`] redirects. The credential header goes only to the origin
/// (scheme, host, port) it was meant for; a redirect from https to http is refused.
async fn get_following_redirects(
    client: &HttpClient,
    mut url: Uri,
    mut header: Option<(&'static str, String)>,
) -> Result<Reply, String> {
    for _ in 0..=MAX_REDIRECTS {
        let mut req = http::Request::get(url.clone()).header("accept", "application/json");
        if let Some((name, value)) = &header {
            req = req.header(*name, value);
        }
        let req = req
            .body(Full::new(Bytes::new()))
            .map_err(|e| format!("bad request URL {url}: {e}"))?;
        let resp = client
            .request(req)
            .await
            .map_err(|e| format!("GET {url}: {}", error_chain(&e)))?;
        let status = resp.status();
        let retry_after = resp
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        if status.is_redirection() {
            let loc = resp
                .headers()
                .get(http::header::LOCATION)
                .and_then(|l| l.to_str().ok())
                .ok_or_else(|| format!("GET {url}: {status} without Location"))?;
            let next = resolve(&url, loc)?;
            if !keeps_credentials(&url, &next)? {
                header = None;
            }
            url = next;
            continue;
        }
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("GET {url}: reading the body: {e}"))?
            .to_bytes();
        return Ok(Reply {
            status,
            body,
            retry_after,
        });
    }
    Err(format!("GET {url}: too many redirects"))
}

/// Whether a redirect from `from` to `to` may carry the credentials (same origin); a
/// redirect from https to http is refused outright.
fn keeps_credentials(from: &Uri, to: &Uri) -> Result<bool, String> {
    if from.scheme_str() == Some("https") && to.scheme_str() != Some("https") {
        return Err(format!(
            "GET {from}: redirect to {to} refused (from https to http)"
        ));
    }
    Ok(origin(from) == origin(to))
}

fn join(endpoint: &str, path: &str) -> Result<Uri, String> {
    let url = format!("{}{path}", endpoint.trim_end_matches('/'));
    url.parse().map_err(|e| format!("bad BMC URL {url}: {e}"))
}

/// `location` (absolute, or a path on the current origin) as a full URL.
pub fn resolve(current: &Uri, location: &str) -> Result<Uri, String> {
    let text = if location.starts_with("http://") || location.starts_with("https://") {
        location.to_string()
    } else if location.starts_with('/') && !location.starts_with("//") {
        format!(
            "{}://{}{location}",
            current.scheme_str().unwrap_or("http"),
            current.authority().map(|a| a.as_str()).unwrap_or("")
        )
    } else {
        return Err(format!(
            "GET {current}: unsupported redirect Location {location:?}"
        ));
    };
    text.parse()
        .map_err(|e| format!("GET {current}: bad redirect Location {location:?}: {e}"))
}

/// `(scheme, host, port)` with the scheme's default port filled in.
fn origin(u: &Uri) -> (String, String, u16) {
    let scheme = u.scheme_str().unwrap_or("").to_ascii_lowercase();
    let default = if scheme == "https" { 443 } else { 80 };
    (
        scheme,
        u.host().unwrap_or("").to_ascii_lowercase(),
        u.port_u16().unwrap_or(default),
    )
}

fn basic(user: &str, password: &str) -> String {
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {token}")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_and_redirects() {
        let cur: Uri = "https://bmc:443/redfish/v1/Systems/1".parse().unwrap();
        let same = resolve(&cur, "/redfish/v1/Systems/2").unwrap();
        assert_eq!(same.to_string(), "https://bmc:443/redfish/v1/Systems/2");
        assert_eq!(origin(&same), origin(&"https://BMC/x".parse().unwrap()));
        let other = resolve(&cur, "https://evil:443/x").unwrap();
        assert_ne!(origin(&other), origin(&cur));
        assert_eq!(keeps_credentials(&cur, &same), Ok(true));
        assert_eq!(keeps_credentials(&cur, &other), Ok(false));
        let port = resolve(&cur, "https://bmc:8443/x").unwrap();
        assert_eq!(keeps_credentials(&cur, &port), Ok(false));
        let down = resolve(&cur, "http://bmc/redfish/v1/Systems/1").unwrap();
        assert!(
            keeps_credentials(&cur, &down).is_err(),
            "https to http is refused"
        );
        assert!(resolve(&cur, "relative/x").is_err());
        assert!(resolve(&cur, "//evil/x").is_err());
    }
}
