//! Delegated authentication and authorization for the secure port, as upstream's
//! `DelegatingAuthenticationOptions` / `DelegatingAuthorizationOptions`:
//!
//! - always-allowed paths (`--authorization-always-allow-paths`, default `/healthz,/readyz,/livez`)
//!   are served to anyone;
//! - otherwise the caller is identified by a client certificate verified against
//!   `--client-ca-file` (user = CommonName, groups = Organizations) or by a bearer token the API
//!   server confirms with a TokenReview (cached for `--authentication-token-webhook-cache-ttl`,
//!   successes and failures alike, as upstream); no identity → **401**;
//! - members of `system:masters` are allowed everything; anyone else needs a
//!   SubjectAccessReview allowing `<verb>` on the non-resource path (cached for
//!   `--authorization-webhook-cache-(un)authorized-ttl`); denied → **403**.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::tls::PeerCertificates;

/// The group upstream never sends to SubjectAccessReview: its members may do anything.
pub const MASTERS_GROUP: &str = "system:masters";

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct User {
    /// User name (CommonName for certificates).
    pub name: String,
    /// Groups (Organizations for certificates).
    pub groups: Vec<String>,
}

/// Cache entries expire after a TTL; the map is pruned when it grows.
struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (V, Instant)>>,
}

const CACHE_PRUNE_AT: usize = 4096;

impl<K: std::hash::Hash + Eq + Clone, V: Clone> TtlCache<K, V> {
    fn new() -> Self {
        TtlCache {
            entries: Mutex::new(HashMap::new()),
        }
    }
    fn get(&self, k: &K) -> Option<V> {
        let map = self.entries.lock();
        map.get(k)
            .filter(|(_, exp)| *exp > Instant::now())
            .map(|(v, _)| v.clone())
    }
    fn put(&self, k: K, v: V, ttl: Duration) {
        let mut map = self.entries.lock();
        let now = Instant::now();
        if map.len() >= CACHE_PRUNE_AT {
            map.retain(|_, (_, exp)| *exp > now);
        }
        if !ttl.is_zero() {
            map.insert(k, (v, now + ttl));
        }
    }
}

/// Settings of [`Guard`].
#[derive(Clone)]
pub struct GuardConfig {
    /// Client for TokenReview (`--authentication-kubeconfig`, else the main connection).
    pub token_review: Option<kube::Client>,
    /// `--authentication-token-webhook-cache-ttl`.
    pub token_ttl: Duration,
    /// Client for SubjectAccessReview (`--authorization-kubeconfig`, else the main connection).
    pub access_review: Option<kube::Client>,
    /// `--authorization-webhook-cache-authorized-ttl`.
    pub allow_ttl: Duration,
    /// `--authorization-webhook-cache-unauthorized-ttl`.
    pub deny_ttl: Duration,
    /// `--authorization-always-allow-paths`.
    pub always_allow_paths: Vec<String>,
}

/// The authentication + authorization filter in front of every handler of the secure port.
pub struct Guard {
    cfg: GuardConfig,
    tokens: TtlCache<String, Option<User>>,
    decisions: TtlCache<(User, String, String), bool>,
}

/// Why a request is refused.
#[derive(Debug)]
enum Refusal {
    Unauthenticated,
    Forbidden(String),
    Error(String),
}

impl Guard {
    /// A guard; share it with [`Guard::layer`].
    pub fn new(cfg: GuardConfig) -> Arc<Self> {
        Arc::new(Guard {
            cfg,
            tokens: TtlCache::new(),
            decisions: TtlCache::new(),
        })
    }

    fn always_allowed(&self, path: &str) -> bool {
        self.cfg.always_allow_paths.iter().any(|p| {
            let p = p.trim();
            let p = p.strip_prefix('/').unwrap_or(p);
            let path = path.strip_prefix('/').unwrap_or(path);
            match p.strip_suffix('*') {
                Some(prefix) => path.starts_with(prefix),
                None => path == p,
            }
        })
    }

    async fn authenticate(&self, creds: Credentials) -> Result<Option<User>, Refusal> {
        if let Some(user) = creds.cert_user {
            return Ok(Some(user));
        }
        let Some(token) = creds.token else {
            return Ok(None);
        };
        let token = token.as_str();
        if let Some(cached) = self.tokens.get(&token.to_string()) {
            return Ok(cached);
        }
        let Some(client) = &self.cfg.token_review else {
            return Ok(None);
        };
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: None,
            },
            ..Default::default()
        };
        let answer = Api::<TokenReview>::all(client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| Refusal::Error(format!("TokenReview failed: {e}")))?;
        let user = answer
            .status
            .filter(|s| s.authenticated == Some(true))
            .and_then(|s| {
                s.user.map(|u| User {
                    name: u.username.unwrap_or_default(),
                    groups: u.groups.unwrap_or_default(),
                })
            });
        self.tokens
            .put(token.to_string(), user.clone(), self.cfg.token_ttl);
        Ok(user)
    }

    async fn authorize(&self, user: &User, verb: &str, path: &str) -> Result<(), Refusal> {
        if user.groups.iter().any(|g| g == MASTERS_GROUP) {
            return Ok(());
        }
        let key = (user.clone(), verb.to_string(), path.to_string());
        let allowed = match self.decisions.get(&key) {
            Some(a) => a,
            None => {
                let Some(client) = &self.cfg.access_review else {
                    return Err(Refusal::Forbidden(String::new()));
                };
                let review = SubjectAccessReview {
                    spec: SubjectAccessReviewSpec {
                        user: Some(user.name.clone()),
                        groups: Some(user.groups.clone()),
                        non_resource_attributes: Some(NonResourceAttributes {
                            path: Some(path.to_string()),
                            verb: Some(verb.to_string()),
                        }),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                let answer = Api::<SubjectAccessReview>::all(client.clone())
                    .create(&PostParams::default(), &review)
                    .await
                    .map_err(|e| Refusal::Error(format!("SubjectAccessReview failed: {e}")))?;
                let allowed = answer.status.is_some_and(|s| s.allowed);
                let ttl = if allowed {
                    self.cfg.allow_ttl
                } else {
                    self.cfg.deny_ttl
                };
                self.decisions.put(key, allowed, ttl);
                allowed
            }
        };
        if allowed {
            Ok(())
        } else {
            Err(Refusal::Forbidden(String::new()))
        }
    }

    async fn check(&self, path: String, verb: String, creds: Credentials) -> Result<(), Refusal> {
        if self.always_allowed(&path) {
            return Ok(());
        }
        let user = self
            .authenticate(creds)
            .await?
            .ok_or(Refusal::Unauthenticated)?;
        self.authorize(&user, &verb, &path)
            .await
            .map_err(|r| match r {
                Refusal::Forbidden(_) => Refusal::Forbidden(format!(
                    "forbidden: User {:?} cannot {verb} path {path:?}",
                    user.name
                )),
                other => other,
            })
    }

    /// The axum middleware: `axum::middleware::from_fn_with_state(guard, Guard::layer)`.
    pub async fn layer(State(guard): State<Arc<Guard>>, req: Request, next: Next) -> Response {
        let path = req.uri().path().to_string();
        let verb = req.method().as_str().to_ascii_lowercase();
        let creds = Credentials::of(&req);
        match guard.check(path.clone(), verb, creds).await {
            Ok(()) => next.run(req).await,
            Err(Refusal::Unauthenticated) => {
                (StatusCode::UNAUTHORIZED, "Unauthorized\n").into_response()
            }
            Err(Refusal::Forbidden(msg)) => {
                (StatusCode::FORBIDDEN, format!("{msg}\n")).into_response()
            }
            Err(Refusal::Error(msg)) => {
                tracing::warn!(error = %msg, %path, "delegated auth failed");
                (StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error\n").into_response()
            }
        }
    }
}

/// What a request presents: a verified client certificate's identity, a bearer token.
struct Credentials {
    cert_user: Option<User>,
    token: Option<String>,
}

impl Credentials {
    fn of(req: &Request) -> Self {
        let cert_user = req
            .extensions()
            .get::<PeerCertificates>()
            .and_then(|p| p.0.first().and_then(|c| user_from_cert(c)));
        let token = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(String::from);
        Credentials { cert_user, token }
    }
}

/// User and groups of a verified client certificate: CommonName and Organizations.
fn user_from_cert(der: &rustls_pki_types::CertificateDer<'_>) -> Option<User> {
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())?
        .to_string();
    let groups = subject
        .iter_organization()
        .filter_map(|a| a.as_str().ok().map(String::from))
        .collect();
    Some(User { name, groups })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(paths: &[&str]) -> Arc<Guard> {
        Guard::new(GuardConfig {
            token_review: None,
            token_ttl: Duration::from_secs(10),
            access_review: None,
            allow_ttl: Duration::from_secs(10),
            deny_ttl: Duration::from_secs(10),
            always_allow_paths: paths.iter().map(|s| s.to_string()).collect(),
        })
    }

    #[test]
    fn always_allow_paths_match_exactly_or_by_trailing_star() {
        let g = guard(&["/healthz", "readyz", "/debug/*"]);
        assert!(g.always_allowed("/healthz"));
        assert!(!g.always_allowed("/healthz/leaderElection"));
        assert!(g.always_allowed("/readyz"));
        assert!(g.always_allowed("/debug/pprof/heap"));
        assert!(!g.always_allowed("/metrics"));
    }

    #[tokio::test]
    async fn masters_skip_the_access_review_and_others_are_denied_without_one() {
        let g = guard(&[]);
        let admin = User {
            name: "a".into(),
            groups: vec![MASTERS_GROUP.into()],
        };
        assert!(g.authorize(&admin, "get", "/metrics").await.is_ok());
        let other = User {
            name: "b".into(),
            groups: vec![],
        };
        assert!(matches!(
            g.authorize(&other, "get", "/metrics").await,
            Err(Refusal::Forbidden(_))
        ));
    }
}
