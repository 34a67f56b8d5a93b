//! Admission webhooks a provider hosts in the CCM (KEP-2699). The manager serves every webhook
//! that [`crate::CloudProvider::webhooks`] offers and `--webhooks` enables, at `/<name>` on
//! `--webhook-secure-port`, with metrics, timeouts and failure handling around each.

use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;

/// A handler's error: any error, shown to the user (per the failure policy) as its message.
pub type WebhookError = Box<dyn std::error::Error + Send + Sync>;

/// What to answer when a handler fails or exceeds its timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Deny the request (status 500 in the AdmissionResponse): nothing unchecked gets in.
    Fail,
    /// Admit the object unchanged, with a warning.
    Ignore,
}

/// A handler's verdict.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// Admit unchanged.
    Allow,
    /// Admit with these JSON-patch operations (a mutating webhook).
    Patch(Vec<Value>),
    /// Refuse, with the message the user sees.
    Deny(String),
}

/// The parts of an `admission.k8s.io/v1` `AdmissionRequest` handlers use.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    /// Echoed in the response.
    pub uid: String,
    /// CREATE, UPDATE, DELETE or CONNECT.
    #[serde(default)]
    pub operation: String,
    /// The resource's group/version/kind.
    #[serde(default)]
    pub kind: Value,
    /// The object as submitted.
    #[serde(default)]
    pub object: Option<Value>,
}

/// One admission webhook a CCM hosts.
#[async_trait]
pub trait Webhook: Send + Sync + 'static {
    /// The name `--webhooks` enables it by, and its path (`/<name>`).
    fn name(&self) -> &str;
    /// How a handler error or timeout is answered, whatever the WebhookConfiguration says.
    fn failure_policy(&self) -> FailurePolicy {
        FailurePolicy::Fail
    }
    /// The longest a handler may take; kube-apiserver's own default timeout is 10s.
    fn timeout(&self) -> Duration {
        Duration::from_secs(5)
    }
    /// Decides on one request. An `Err` is answered per [`Webhook::failure_policy`].
    async fn admit(&self, req: &AdmissionRequest) -> Result<Admission, WebhookError>;
}
