//! Webhook hosting (KEP-2699): admission webhooks served next to the controllers on
//! `--webhook-bind-address:--webhook-secure-port` (10260), over HTTPS with their own certificate.
//!
//! Each [`Webhook`] is served at `/<name>` and answers `admission.k8s.io/v1` AdmissionReviews,
//! as upstream's `cloud-provider/app/webhooks.go`: a body that is not JSON or carries no
//! `request` gets **400**; the response echoes `request.uid`. Unlike upstream (a handler error
//! is a 500 and kube-apiserver's failurePolicy decides), a handler's error or timeout is
//! answered here as the webhook's own [`FailurePolicy`] says (a panic counts as an error), so a failing cloud lookup never
//! depends on how the WebhookConfiguration was written.

pub mod pvlabel;
pub mod setup;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use base64::Engine as _;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

pub use ccm_cloud::webhook::{Admission, AdmissionRequest, FailurePolicy, Webhook, WebhookError};

/// The webhooks the manager builds itself from a provider capability; `--webhooks` accepts
/// these and the names of the provider's own [`ccm_cloud::CloudProvider::webhooks`].
pub const KNOWN: &[&str] = &[pvlabel::NAME];

/// Checks `--webhooks` entries for what can be told before the provider exists: no empty
/// `-` and no name that is not a DNS label (a path segment). Which names exist is checked at
/// startup, against the provider ([`select`]).
pub fn check_syntax(flags: &[String]) -> Result<(), String> {
    for raw in flags
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty() && *s != "*")
    {
        let name = raw.strip_prefix('-').unwrap_or(raw);
        let label = !name.is_empty()
            && name.len() <= 63
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !name.starts_with('-')
            && !name.ends_with('-');
        if !label {
            return Err(format!(
                "--webhooks: {raw:?} is not a webhook name (lower-case letters, digits and '-'; prefix '-' disables, '*' enables all)"
            ));
        }
    }
    Ok(())
}

/// Resolves `--webhooks` as upstream: a name enables it, `-name` disables it, `*` enables the
/// rest; empty enables none. Unknown names (not in `available`) are errors naming the flag.
pub fn select(flags: &[String], available: &[&str]) -> Result<Vec<String>, String> {
    let mut on = BTreeSet::new();
    let mut off = BTreeSet::new();
    let mut star = false;
    for raw in flags.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        if raw == "*" {
            star = true;
            continue;
        }
        let (name, set) = match raw.strip_prefix('-') {
            Some(n) => (n, &mut off),
            None => (raw, &mut on),
        };
        if !available.contains(&name) {
            return Err(format!(
                "--webhooks: {name:?} is not in the list of known webhooks ({})",
                available.join(", ")
            ));
        }
        set.insert(name.to_string());
    }
    Ok(available
        .iter()
        .filter(|n| !off.contains(**n) && (on.contains(**n) || star))
        .map(|n| n.to_string())
        .collect())
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    code: String,
    webhook: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WebhookLabel {
    webhook: String,
}

/// Per-webhook request counts, latency and rejections.
#[derive(Clone)]
pub struct WebhookMetrics {
    requests: Family<CodeLabels, Counter>,
    duration: Family<CodeLabels, Histogram>,
    rejections: Family<WebhookLabel, Counter>,
    failures: Family<WebhookLabel, Counter>,
}

impl WebhookMetrics {
    /// Registers upstream's `cloud_provider_webhook_request_*` families plus ccm-rs's
    /// rejection and handler-failure counts.
    pub fn new(registry: &mut Registry) -> Self {
        let m = WebhookMetrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(|| {
                Histogram::new([0.25, 0.5, 0.7, 1.0, 1.5, 3.0, 5.0, 10.0])
            }),
            rejections: Family::default(),
            failures: Family::default(),
        };
        registry.register(
            "cloud_provider_webhook_request",
            "[ALPHA] Number of admission requests processed.",
            m.requests.clone(),
        );
        registry.register(
            "cloud_provider_webhook_request_duration_seconds",
            "[ALPHA] Approximate latency in seconds of admission requests.",
            m.duration.clone(),
        );
        registry.register(
            "cloud_provider_webhook_rejection",
            "Admission requests a webhook refused (including refusals by failure policy).",
            m.rejections.clone(),
        );
        registry.register(
            "cloud_provider_webhook_handler_failure",
            "Admission requests whose handler failed or timed out (answered per failure policy).",
            m.failures.clone(),
        );
        m
    }
}

#[derive(Clone)]
struct Hook {
    webhook: Arc<dyn Webhook>,
    metrics: WebhookMetrics,
}

/// The router: `POST /<name>` per webhook.
pub fn router(webhooks: &[Arc<dyn Webhook>], metrics: &WebhookMetrics) -> Router {
    let mut app = Router::new();
    for w in webhooks {
        let hook = Hook {
            webhook: w.clone(),
            metrics: metrics.clone(),
        };
        app = app.route(&format!("/{}", w.name()), post(handle).with_state(hook));
    }
    app
}

async fn handle(State(hook): State<Hook>, headers: HeaderMap, body: Bytes) -> Response {
    let start = Instant::now();
    let name = hook.webhook.name().to_string();
    let (code, response) = respond(&hook, &headers, &body).await;
    let labels = CodeLabels {
        code: code.as_u16().to_string(),
        webhook: name,
    };
    hook.metrics.requests.get_or_create(&labels).inc();
    hook.metrics
        .duration
        .get_or_create(&labels)
        .observe(start.elapsed().as_secs_f64());
    response
}

async fn respond(hook: &Hook, headers: &HeaderMap, body: &[u8]) -> (StatusCode, Response) {
    let bad = |msg: String| {
        (
            StatusCode::BAD_REQUEST,
            (StatusCode::BAD_REQUEST, msg).into_response(),
        )
    };
    let json_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(';').next().map(str::trim) == Some("application/json"));
    if !json_type {
        return bad("contentType must be application/json".into());
    }
    #[derive(Deserialize)]
    struct Review {
        request: Option<AdmissionRequest>,
    }
    let req = match serde_json::from_slice::<Review>(body) {
        Ok(Review { request: Some(r) }) => r,
        Ok(_) => return bad("AdmissionReview has no request".into()),
        Err(e) => return bad(format!("cannot decode AdmissionReview: {e}")),
    };
    let verdict = decide(hook, &req).await;
    let body = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response_json(&req.uid, verdict),
    });
    (StatusCode::OK, axum::Json(body).into_response())
}

/// Runs the handler under its timeout; failures become the failure policy's answer.
async fn decide(hook: &Hook, req: &AdmissionRequest) -> (Admission, Option<String>) {
    let w = &hook.webhook;
    let label = WebhookLabel {
        webhook: w.name().to_string(),
    };
    // A panicking handler is a failed handler: answered by policy, the server keeps serving.
    let guarded = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(w.admit(req)));
    let failed = match tokio::time::timeout(w.timeout(), guarded).await {
        Ok(Err(_)) => format!("webhook {:?} panicked", w.name()),
        Ok(Ok(Ok(a))) => {
            if matches!(a, Admission::Deny(_)) {
                hook.metrics.rejections.get_or_create(&label).inc();
            }
            return (a, None);
        }
        Ok(Ok(Err(e))) => format!("webhook {:?} failed: {e}", w.name()),
        Err(_) => format!("webhook {:?} timed out after {:?}", w.name(), w.timeout()),
    };
    hook.metrics.failures.get_or_create(&label).inc();
    tracing::warn!(webhook = w.name(), uid = %req.uid, error = %failed, "admission handler failed");
    match w.failure_policy() {
        FailurePolicy::Fail => {
            hook.metrics.rejections.get_or_create(&label).inc();
            (Admission::Deny(failed), Some("InternalError".into()))
        }
        FailurePolicy::Ignore => (
            Admission::Allow,
            Some(format!(
                "{failed}; admitted unchanged (failure policy Ignore)"
            )),
        ),
    }
}

fn response_json(uid: &str, (verdict, note): (Admission, Option<String>)) -> Value {
    let mut r = json!({ "uid": uid, "allowed": true });
    match verdict {
        Admission::Allow => {
            if let Some(w) = note {
                r["warnings"] = json!([w]);
            }
        }
        Admission::Patch(ops) => {
            let patch = serde_json::to_vec(&ops).unwrap_or_default();
            r["patchType"] = json!("JSONPatch");
            r["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(patch));
        }
        Admission::Deny(message) => {
            let internal = note.is_some();
            r["allowed"] = json!(false);
            r["status"] = json!({
                "status": "Failure",
                "message": message,
                "reason": if internal { "InternalError" } else { "Forbidden" },
                "code": if internal { 500 } else { 403 },
            });
        }
    }
    r
}

/// Serves `webhooks` over HTTPS on `addr` until `shutdown`; returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    tls: crate::tls::TlsSettings,
    webhooks: &[Arc<dyn Webhook>],
    metrics: &WebhookMetrics,
    shutdown: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let listener = crate::tls::bind(addr, false, false).map_err(|e| {
        anyhow::anyhow!("--webhook-bind-address/--webhook-secure-port {addr}: cannot listen: {e}")
    })?;
    let local = listener.local_addr()?;
    let acceptor = crate::tls::acceptor(&tls, addr.ip(), &shutdown)?;
    tokio::spawn(crate::tls::serve_tls(
        listener,
        acceptor,
        router(webhooks, metrics),
        tls.http2_max_streams,
        shutdown,
    ));
    Ok(local)
}
