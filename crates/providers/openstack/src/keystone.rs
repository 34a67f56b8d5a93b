//! Keystone v3: one token at a time, renewed before it expires and once more when a service
//! refuses it (401: revoked, or Keystone's keys rotated); the service catalog of that token,
//! searched by service type, region and interface as upstream's gophercloud does.
//!
//! Passwords and secrets are only ever put into the body of `POST /v3/auth/tokens`; the token
//! only into `X-Auth-Token` of requests to Keystone's own catalog endpoints. Neither appears
//! in an error or a log line.

use std::sync::Arc;
use std::time::Duration;

use ccm_cloud::CloudError;
use http::Method;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::GlobalOpts;
use crate::http::{Http, Reply, status_error};
use crate::secret::Secret;

/// The longest a token is kept before its expiry: renewed 5 minutes early, or at half its
/// lifetime for short-lived tokens.
const RENEW_MARGIN: Duration = Duration::from_secs(300);

#[derive(Debug, Deserialize)]
struct TokenBody {
    token: TokenInfo,
}

#[derive(Debug, Deserialize)]
struct TokenInfo {
    expires_at: jiff::Timestamp,
    #[serde(default)]
    issued_at: Option<jiff::Timestamp>,
    #[serde(default)]
    catalog: Vec<CatalogService>,
}

#[derive(Debug, Clone, Deserialize)]
struct CatalogService {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    endpoints: Vec<CatalogEndpoint>,
}

#[derive(Debug, Clone, Deserialize)]
struct CatalogEndpoint {
    interface: String,
    #[serde(default)]
    region_id: Option<String>,
    #[serde(default)]
    region: Option<String>,
    url: String,
}

struct Token {
    value: Secret,
    renew_at: jiff::Timestamp,
    catalog: Vec<CatalogService>,
}

/// The Keystone client of one provider.
pub struct Keystone {
    http: Arc<Http>,
    auth: GlobalOpts,
    interface: String,
    token: tokio::sync::Mutex<Option<Token>>,
}

impl Keystone {
    /// A client for `auth` that picks endpoints of `interface` (`public`, `internal`, `admin`).
    pub fn new(http: Arc<Http>, auth: GlobalOpts, interface: String) -> Self {
        Keystone {
            http,
            auth,
            interface,
            token: tokio::sync::Mutex::new(None),
        }
    }

    fn tokens_url(&self) -> String {
        let base = self.auth.auth_url.trim_end_matches('/');
        if base.ends_with("/v3") {
            format!("{base}/auth/tokens")
        } else {
            format!("{base}/v3/auth/tokens")
        }
    }

    /// A valid token and the URL of `service_type` in the configured region and interface.
    /// Authenticates when there is no token or it is due for renewal.
    pub async fn endpoint(&self, service_type: &str) -> Result<(Secret, String), CloudError> {
        let mut guard = self.token.lock().await;
        let due = guard
            .as_ref()
            .is_none_or(|t| jiff::Timestamp::now() >= t.renew_at);
        if due {
            *guard = Some(self.authenticate().await?);
        }
        let token = guard.as_ref().expect("set above");
        let url = self.pick(&token.catalog, service_type)?;
        Ok((token.value.clone(), url))
    }

    /// Whether the service catalog has `service_type` in the region and interface.
    pub async fn has_service(&self, service_type: &str) -> Result<bool, CloudError> {
        match self.endpoint(service_type).await {
            Ok(_) => Ok(true),
            Err(CloudError::NotImplemented) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Drops `stale` (a token a service refused) so the next call authenticates again. A newer
    /// token fetched meanwhile by another caller is kept.
    pub async fn invalidate(&self, stale: &Secret) {
        let mut guard = self.token.lock().await;
        if guard.as_ref().is_some_and(|t| t.value == *stale) {
            *guard = None;
        }
    }

    /// Sends a request to `service_type`: `path` is appended to the catalog URL. A 401 makes it
    /// authenticate once more and retry once (the token was revoked or the keys rotated).
    pub async fn request(
        &self,
        service_type: &str,
        op: &str,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Result<Reply, CloudError> {
        let mut retried = false;
        loop {
            let (token, base) = self.endpoint(service_type).await?;
            let url = format!("{}{path}", base.trim_end_matches('/'));
            let reply = self
                .http
                .send(op, method.clone(), &url, Some(&token), headers, body)
                .await?;
            if reply.status.as_u16() == 401 && !retried {
                tracing::info!(op, "token refused (HTTP 401); authenticating again");
                self.invalidate(&token).await;
                retried = true;
                continue;
            }
            return Ok(reply);
        }
    }

    fn pick(&self, catalog: &[CatalogService], service_type: &str) -> Result<String, CloudError> {
        let region = self.auth.region.as_str();
        let found = catalog
            .iter()
            .filter(|s| s.kind == service_type)
            .flat_map(|s| s.endpoints.iter())
            .find(|e| {
                e.interface == self.interface
                    && (region.is_empty()
                        || e.region_id.as_deref() == Some(region)
                        || e.region.as_deref() == Some(region))
            });
        match found {
            Some(e) => Ok(e.url.clone()),
            // The caller decides whether a missing service is fatal.
            None if catalog.iter().any(|s| !s.endpoints.is_empty()) => {
                tracing::debug!(service_type, region, interface = %self.interface, "not in the service catalog");
                Err(CloudError::NotImplemented)
            }
            None => Err(CloudError::Permanent(
                "the Keystone token has no service catalog: scope it to a project (tenant-id or tenant-name) or use an application credential".into(),
            )),
        }
    }

    async fn authenticate(&self) -> Result<Token, CloudError> {
        let op = "identity POST /auth/tokens";
        let body = self.auth_body()?;
        let url = self.tokens_url();
        let reply = self
            .http
            .send(op, Method::POST, &url, None, &[], Some(&body))
            .await?;
        if !reply.status.is_success() {
            return Err(status_error(
                &format!("Keystone authentication at {url}"),
                &reply,
            ));
        }
        let value = reply
            .headers
            .get("x-subject-token")
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| {
                CloudError::Transient(format!("{op} {url}: no X-Subject-Token in the answer"))
            })?
            .to_string();
        let info: TokenBody = reply.json(op)?;
        let t = info.token;
        let now = jiff::Timestamp::now();
        let issued = t.issued_at.unwrap_or(now);
        let lifetime = t.expires_at.duration_since(issued).unsigned_abs();
        let margin = RENEW_MARGIN.min(lifetime / 2);
        let renew_at = t
            .expires_at
            .checked_sub(jiff::SignedDuration::try_from(margin).unwrap_or_default())
            .unwrap_or(t.expires_at);
        tracing::debug!(expires_at = %t.expires_at, %renew_at, "Keystone token issued");
        Ok(Token {
            value: Secret::new(value),
            renew_at,
            catalog: t.catalog,
        })
    }

    fn auth_body(&self) -> Result<Value, CloudError> {
        let a = &self.auth;
        if !a.application_credential_secret.is_empty() {
            let mut cred = json!({"secret": a.application_credential_secret.expose()});
            if !a.application_credential_id.is_empty() {
                cred["id"] = json!(a.application_credential_id);
            } else {
                cred["name"] = json!(a.application_credential_name);
                cred["user"] = self.user(&a.user_id, &a.username);
            }
            return Ok(json!({"auth": {"identity": {
                "methods": ["application_credential"],
                "application_credential": cred,
            }}}));
        }
        if !a.trust_id.is_empty() {
            let id = if a.trustee_id.is_empty() {
                &a.user_id
            } else {
                &a.trustee_id
            };
            let pw = if a.trustee_password.is_empty() {
                &a.password
            } else {
                &a.trustee_password
            };
            let mut user = self.user(id, &a.username);
            user["password"] = json!(pw.expose());
            return Ok(json!({"auth": {
                "identity": {"methods": ["password"], "password": {"user": user}},
                "scope": {"OS-TRUST:trust": {"id": a.trust_id}},
            }}));
        }
        let mut user = self.user(&a.user_id, &a.username);
        user["password"] = json!(a.password.expose());
        let mut auth = json!({"identity": {"methods": ["password"], "password": {"user": user}}});
        if let Some(scope) = self.scope() {
            auth["scope"] = scope;
        }
        Ok(json!({ "auth": auth }))
    }

    /// A user by id, or by name in its domain (`user-domain-*`, else `domain-*`).
    fn user(&self, id: &str, name: &str) -> Value {
        let a = &self.auth;
        if !id.is_empty() {
            return json!({"id": id});
        }
        let domain = domain(&a.user_domain_id, &a.user_domain_name)
            .or_else(|| domain(&a.domain_id, &a.domain_name));
        match domain {
            Some(d) => json!({"name": name, "domain": d}),
            None => json!({"name": name}),
        }
    }

    /// The project (`tenant-id`, or `tenant-name` in `tenant-domain-*`, else `domain-*`, else the
    /// user's domain), or else the domain (`domain-*`).
    fn scope(&self) -> Option<Value> {
        let a = &self.auth;
        if !a.tenant_id.is_empty() {
            return Some(json!({"project": {"id": a.tenant_id}}));
        }
        if !a.tenant_name.is_empty() {
            let d = domain(&a.tenant_domain_id, &a.tenant_domain_name)
                .or_else(|| domain(&a.domain_id, &a.domain_name))
                .or_else(|| domain(&a.user_domain_id, &a.user_domain_name));
            let mut p = json!({"name": a.tenant_name});
            if let Some(d) = d {
                p["domain"] = d;
            }
            return Some(json!({ "project": p }));
        }
        domain(&a.domain_id, &a.domain_name).map(|d| json!({ "domain": d }))
    }
}

fn domain(id: &str, name: &str) -> Option<Value> {
    if !id.is_empty() {
        Some(json!({"id": id}))
    } else if !name.is_empty() {
        Some(json!({"name": name}))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ks(g: GlobalOpts) -> Keystone {
        let http = Arc::new(Http::new(None, false, Duration::from_secs(1)).expect("http"));
        Keystone::new(http, g, "public".into())
    }

    #[test]
    fn password_auth_scopes_to_the_project_in_its_domain() {
        let k = ks(GlobalOpts {
            auth_url: "http://ks:5000".into(),
            username: "ccm".into(),
            password: Secret::new("pw"),
            tenant_name: "k8s".into(),
            domain_name: "Default".into(),
            ..Default::default()
        });
        assert_eq!(k.tokens_url(), "http://ks:5000/v3/auth/tokens");
        let b = k.auth_body().expect("body");
        assert_eq!(
            b["auth"]["identity"]["password"]["user"],
            json!({"name": "ccm", "domain": {"name": "Default"}, "password": "pw"})
        );
        assert_eq!(
            b["auth"]["scope"],
            json!({"project": {"name": "k8s", "domain": {"name": "Default"}}})
        );
    }

    #[test]
    fn trust_and_application_credential_bodies() {
        let k = ks(GlobalOpts {
            auth_url: "http://ks:5000/v3/".into(),
            trust_id: "t1".into(),
            trustee_id: "u1".into(),
            trustee_password: Secret::new("tp"),
            ..Default::default()
        });
        assert_eq!(k.tokens_url(), "http://ks:5000/v3/auth/tokens");
        let b = k.auth_body().expect("body");
        assert_eq!(b["auth"]["scope"], json!({"OS-TRUST:trust": {"id": "t1"}}));
        assert_eq!(
            b["auth"]["identity"]["password"]["user"],
            json!({"id": "u1", "password": "tp"})
        );
        let k = ks(GlobalOpts {
            application_credential_name: "ccm".into(),
            application_credential_secret: Secret::new("s"),
            username: "u".into(),
            user_domain_id: "default".into(),
            ..Default::default()
        });
        let b = k.auth_body().expect("body");
        assert_eq!(
            b["auth"]["identity"]["application_credential"],
            json!({"name": "ccm", "secret": "s", "user": {"name": "u", "domain": {"id": "default"}}})
        );
        assert!(
            b["auth"].get("scope").is_none(),
            "app credentials carry their scope"
        );
    }

    #[test]
    fn catalog_lookup_by_region_and_interface() {
        let k = ks(GlobalOpts {
            region: "RegionTwo".into(),
            ..Default::default()
        });
        let catalog: Vec<CatalogService> = serde_json::from_value(json!([
            {"type": "compute", "endpoints": [
                {"interface": "public", "region_id": "RegionOne", "url": "http://one"},
                {"interface": "internal", "region_id": "RegionTwo", "url": "http://two-int"},
                {"interface": "public", "region_id": "RegionTwo", "url": "http://two"},
            ]},
        ]))
        .expect("catalog");
        assert_eq!(k.pick(&catalog, "compute").expect("found"), "http://two");
        assert_eq!(k.pick(&catalog, "network"), Err(CloudError::NotImplemented));
    }
}
