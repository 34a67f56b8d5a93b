//! `metav1.Status` errors shaped exactly as kube-apiserver shapes them.
//!
//! Clients branch on `reason` and `code` (kube-rs `ErrorResponse`, client-go `IsNotFound`,
//! `IsConflict`, ...), and people read `message`; both must match the real server or code that
//! passes here fails on a real cluster. Wording follows `k8s.io/apimachinery/pkg/api/errors`.

use serde_json::{Map, Value, json};

use crate::resources::ResourceDesc;

/// One field-level validation failure (`field.Error` upstream).
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// `FieldValueInvalid`, `FieldValueRequired`, ... (the `reason` of a status cause).
    pub kind: FieldErrorKind,
    /// The field path, e.g. `spec.ports[0].port`.
    pub field: String,
    /// The rejected value, rendered as kube-apiserver renders it (strings quoted).
    pub value: Option<String>,
    /// The detail after the value.
    pub detail: String,
}

/// The field error types kube-apiserver reports (`field.ErrorType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldErrorKind {
    /// `Invalid value`.
    Invalid,
    /// `Required value`.
    Required,
    /// `Unsupported value`.
    NotSupported,
    /// `Duplicate value`.
    Duplicate,
    /// `Forbidden`.
    Forbidden,
}

impl FieldErrorKind {
    fn reason(self) -> &'static str {
        match self {
            Self::Invalid => "FieldValueInvalid",
            Self::Required => "FieldValueRequired",
            Self::NotSupported => "FieldValueNotSupported",
            Self::Duplicate => "FieldValueDuplicate",
            Self::Forbidden => "FieldValueForbidden",
        }
    }
    fn text(self) -> &'static str {
        match self {
            Self::Invalid => "Invalid value",
            Self::Required => "Required value",
            Self::NotSupported => "Unsupported value",
            Self::Duplicate => "Duplicate value",
            Self::Forbidden => "Forbidden",
        }
    }
}

impl FieldError {
    /// `field.Invalid(path, value, detail)`.
    pub fn invalid(field: impl Into<String>, value: &Value, detail: impl Into<String>) -> Self {
        Self {
            kind: FieldErrorKind::Invalid,
            field: field.into(),
            value: Some(render_value(value)),
            detail: detail.into(),
        }
    }
    /// `field.Required(path, detail)`.
    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            kind: FieldErrorKind::Required,
            field: field.into(),
            value: None,
            detail: detail.into(),
        }
    }
    /// `field.NotSupported(path, value, supported)`.
    pub fn not_supported(field: impl Into<String>, value: &Value, supported: &[&str]) -> Self {
        let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
        Self {
            kind: FieldErrorKind::NotSupported,
            field: field.into(),
            value: Some(render_value(value)),
            detail: format!("supported values: {}", list.join(", ")),
        }
    }
    /// `field.Duplicate(path, value)`.
    pub fn duplicate(field: impl Into<String>, value: &Value) -> Self {
        Self {
            kind: FieldErrorKind::Duplicate,
            field: field.into(),
            value: Some(render_value(value)),
            detail: String::new(),
        }
    }
    /// `field.Forbidden(path, detail)`.
    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            kind: FieldErrorKind::Forbidden,
            field: field.into(),
            value: None,
            detail: detail.into(),
        }
    }

    /// The text after the field path (`ErrorBody()` upstream).
    fn body(&self) -> String {
        let mut s = self.kind.text().to_string();
        if let Some(v) = &self.value {
            s.push_str(": ");
            s.push_str(v);
        }
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }
}

/// Renders a value the way `field.Invalid` prints it: strings quoted, numbers and bools bare.
fn render_value(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Null => "null".into(),
        other => other.to_string(),
    }
}

/// An API error: an HTTP status plus the `metav1.Status` body the real server would send.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code (also `status.code`).
    pub code: u16,
    /// `status.reason`.
    pub reason: &'static str,
    /// `status.message`.
    pub message: String,
    /// `status.details`, if the real server sends one.
    pub details: Option<Value>,
    /// `Retry-After` header seconds.
    pub retry_after: Option<u32>,
}

fn details(name: &str, desc: &ResourceDesc) -> Value {
    let mut m = Map::new();
    if !name.is_empty() {
        m.insert("name".into(), Value::String(name.into()));
    }
    if !desc.group.is_empty() {
        m.insert("group".into(), Value::String(desc.group.into()));
    }
    m.insert("kind".into(), Value::String(desc.plural.into()));
    Value::Object(m)
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    /// 409 for server-side apply conflicts (`errors.NewApplyConflict`): causes, no name.
    pub fn apply_conflict(message: String, causes: Vec<Value>) -> Self {
        Self {
            details: Some(json!({ "causes": causes })),
            ..Self::new(409, "Conflict", message)
        }
    }

    /// 404 for a named object (`errors.NewNotFound`).
    pub fn not_found(desc: &ResourceDesc, name: &str) -> Self {
        Self {
            details: Some(details(name, desc)),
            ..Self::new(
                404,
                "NotFound",
                format!("{} {name:?} not found", desc.qualified()),
            )
        }
    }

    /// 404 for a URL the server has no route for.
    pub fn no_route() -> Self {
        Self {
            details: Some(json!({})),
            ..Self::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )
        }
    }

    /// 409 on create of an existing name (`errors.NewAlreadyExists`).
    pub fn already_exists(desc: &ResourceDesc, name: &str) -> Self {
        Self {
            details: Some(details(name, desc)),
            ..Self::new(
                409,
                "AlreadyExists",
                format!("{} {name:?} already exists", desc.qualified()),
            )
        }
    }

    /// 409 on a stale `resourceVersion` (`errors.NewConflict` with the optimistic-lock text).
    pub fn conflict(desc: &ResourceDesc, name: &str) -> Self {
        Self::conflict_because(
            desc,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 409 with a specific cause (`errors.NewConflict`).
    pub fn conflict_because(desc: &ResourceDesc, name: &str, why: &str) -> Self {
        Self {
            details: Some(details(name, desc)),
            ..Self::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} {name:?}: {why}",
                    desc.qualified()
                ),
            )
        }
    }

    /// 422 with field causes (`errors.NewInvalid`): note `details.kind` is the Kind here, not the plural.
    pub fn invalid(desc: &ResourceDesc, name: &str, errs: &[FieldError]) -> Self {
        let bodies: Vec<String> = errs
            .iter()
            .map(|e| format!("{}: {}", e.field, e.body()))
            .collect();
        let summary = if bodies.len() == 1 {
            bodies[0].clone()
        } else {
            format!("[{}]", bodies.join(", "))
        };
        let causes: Vec<Value> = errs
            .iter()
            .map(|e| json!({"reason": e.kind.reason(), "message": e.body(), "field": e.field}))
            .collect();
        let mut d = Map::new();
        d.insert("name".into(), Value::String(name.into()));
        if !desc.group.is_empty() {
            d.insert("group".into(), Value::String(desc.group.into()));
        }
        d.insert("kind".into(), Value::String(desc.kind.into()));
        d.insert("causes".into(), Value::Array(causes));
        Self {
            details: Some(Value::Object(d)),
            ..Self::new(
                422,
                "Invalid",
                format!("{} {name:?} is invalid: {summary}", desc.kind),
            )
        }
    }

    /// 422 for a patch that cannot be applied (upstream wraps the patch library's error with
    /// `NewGenericServerResponse(422, ...)`).
    pub fn patch_failed(err: impl std::fmt::Display) -> Self {
        Self {
            details: Some(
                json!({"causes": [{"reason": "UnexpectedServerResponse", "message": err.to_string()}]}),
            ),
            ..Self::new(
                422,
                "Invalid",
                "the server rejected our request due to an error in our request",
            )
        }
    }

    /// 503 while the server restarts (an injected fault).
    pub fn unavailable() -> Self {
        Self::new(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        )
    }

    /// 410 for a resourceVersion older than the retained window.
    pub fn expired(requested: u64, oldest: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {requested} ({oldest})"),
        )
    }

    /// 400 (`errors.NewBadRequest`).
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 401 without a valid bearer token.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// 403 from the authorizer, as kube-apiserver's `responsewriters.Forbidden` words it:
    /// `nodes "n1" is forbidden: User "u" cannot patch resource "nodes/status" in API group ""
    /// at the cluster scope` (then `: <reason>` when the authorizer gave one).
    pub fn forbidden(attrs: &crate::rbac::Attributes, reason: &str) -> Self {
        let mut msg = attrs.forbidden_message();
        if !reason.is_empty() {
            msg = format!("{msg}: {reason}");
        }
        let (message, details) = match &attrs.target {
            crate::rbac::Target::NonResource { .. } => (format!("forbidden: {msg}"), json!({})),
            crate::rbac::Target::Resource {
                group,
                resource,
                name,
                ..
            } => {
                let qualified = if group.is_empty() {
                    resource.clone()
                } else {
                    format!("{resource}.{group}")
                };
                let mut d = Map::new();
                if !name.is_empty() {
                    d.insert("name".into(), Value::String(name.clone()));
                }
                if !group.is_empty() {
                    d.insert("group".into(), Value::String(group.clone()));
                }
                d.insert("kind".into(), Value::String(resource.clone()));
                let m = if name.is_empty() {
                    format!("{qualified} is forbidden: {msg}")
                } else {
                    format!("{qualified} {name:?} is forbidden: {msg}")
                };
                (m, Value::Object(d))
            }
        };
        Self {
            details: Some(details),
            ..Self::new(403, "Forbidden", message)
        }
    }

    /// 405 for a verb the resource does not support (`errors.NewMethodNotSupported`).
    pub fn method_not_supported(desc: &ResourceDesc, action: &str) -> Self {
        let mut d = Map::new();
        if !desc.group.is_empty() {
            d.insert("group".into(), Value::String(desc.group.into()));
        }
        d.insert("kind".into(), Value::String(desc.plural.into()));
        Self {
            details: Some(Value::Object(d)),
            ..Self::new(
                405,
                "MethodNotAllowed",
                format!(
                    "{action} is not supported on resources of kind {:?}",
                    desc.qualified()
                ),
            )
        }
    }

    /// 415 for a patch content type that is none of the four kube-apiserver accepts.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: \
                 application/json-patch+json, application/merge-patch+json, \
                 application/apply-patch+yaml, application/strategic-merge-patch+json \
                 (got {content_type:?})"
            ),
        )
    }

    /// 415 for a request body in a media type kube-sim cannot read (`NewUnsupportedMediaTypeError`).
    pub fn unsupported_body_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: \
                 application/json, application/vnd.kubernetes.protobuf (kube-sim reads no YAML or \
                 CBOR bodies; got {content_type:?})"
            ),
        )
    }

    /// 406 when no media type in `Accept` can be served (`NewNotAcceptableError`).
    pub fn not_acceptable() -> Self {
        Self::new(
            406,
            "NotAcceptable",
            "only the following media types are accepted: application/json, \
             application/vnd.kubernetes.protobuf",
        )
    }

    /// 429 with `Retry-After`, as kube-apiserver's max-in-flight filter sends it.
    pub fn too_many_requests(retry_after: u32) -> Self {
        Self {
            details: Some(json!({"retryAfterSeconds": retry_after})),
            retry_after: Some(retry_after),
            ..Self::new(
                429,
                "TooManyRequests",
                "Too many requests, please try again later.",
            )
        }
    }

    /// 500 (`errors.NewInternalError`).
    pub fn internal(msg: &str) -> Self {
        Self {
            details: Some(json!({"causes": [{"message": msg}]})),
            ..Self::new(
                500,
                "InternalError",
                format!("Internal error occurred: {msg}"),
            )
        }
    }

    /// 413 for an oversized body.
    pub fn too_large() -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            "Request entity too large: limit is 3145728",
        )
    }

    /// The `metav1.Status` JSON body.
    pub fn to_status(&self) -> Value {
        let mut m = Map::new();
        m.insert("kind".into(), "Status".into());
        m.insert("apiVersion".into(), "v1".into());
        m.insert("metadata".into(), json!({}));
        m.insert("status".into(), "Failure".into());
        m.insert("message".into(), Value::String(self.message.clone()));
        m.insert("reason".into(), self.reason.into());
        if let Some(d) = &self.details {
            m.insert("details".into(), d.clone());
        }
        m.insert("code".into(), self.code.into());
        Value::Object(m)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}
