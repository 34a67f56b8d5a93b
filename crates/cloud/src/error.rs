//! The one error type every provider returns.
//!
//! Upstream compares sentinel errors by identity (`err == cloudprovider.InstanceNotFound`) and
//! finds `api.RetryError` anywhere in a wrapped chain. In Rust these are enum variants that
//! controllers `match` on, so no provider can accidentally wrap a sentinel into invisibility.

use std::time::Duration;

/// Errors a cloud provider returns. Controllers decide retry, backoff and events from the
/// variant, so pick the one that tells the truth about *what the caller should do next*.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CloudError {
    /// The instance does not exist in the cloud (upstream `cloudprovider.InstanceNotFound`).
    ///
    /// Note: for existence checks prefer returning `Ok(false)` / `exists: false`; like upstream
    /// InstancesV2, an `InstanceNotFound` *error* from `instance_exists` is treated as an error,
    /// never as proof that a Node may be deleted.
    #[error("instance not found")]
    InstanceNotFound,
    /// The provider does not implement this call (upstream `cloudprovider.NotImplemented`).
    #[error("unimplemented")]
    NotImplemented,
    /// Load balancers for this Service are handled by another controller (upstream
    /// `cloudprovider.ImplementedElsewhere`): ensure/update succeed without a status write.
    #[error("implemented by alternate to cloud provider")]
    ImplementedElsewhere,
    /// Ask the controller to try again after exactly `after`, without exponential backoff
    /// (upstream `api.RetryError`), e.g. while a cloud LB is still provisioning.
    #[error("{message}")]
    Retry {
        /// Delay before the controller tries again.
        after: Duration,
        /// Human-readable reason, shown in events and logs.
        message: String,
    },
    /// The cloud API refused the call because of its rate limit (AWS
    /// `RequestLimitExceeded`, HTTP 429). Controllers back off harder and never hot-loop.
    #[error("cloud API throttled the request: {message}")]
    Throttled {
        /// The provider's message.
        message: String,
        /// The cloud's hint for when to try again, if it gave one.
        retry_after: Option<Duration>,
    },
    /// A failure that is expected to go away on its own (timeouts, 5xx, connection resets).
    #[error("transient cloud error: {0}")]
    Transient(String),
    /// A failure that retrying will not fix (bad request, missing permission, invalid config).
    /// Controllers still retry with backoff, because people fix clouds, but they say so loudly.
    #[error("cloud error: {0}")]
    Permanent(String),
}

impl CloudError {
    /// Short stable label for metrics and logs (`result` label of
    /// `cloudprovider_api_requests_total`).
    pub fn kind(&self) -> &'static str {
        match self {
            CloudError::InstanceNotFound => "instance_not_found",
            CloudError::NotImplemented => "not_implemented",
            CloudError::ImplementedElsewhere => "implemented_elsewhere",
            CloudError::Retry { .. } => "retry",
            CloudError::Throttled { .. } => "throttled",
            CloudError::Transient(_) => "transient",
            CloudError::Permanent(_) => "permanent",
        }
    }

    /// True for the throttled variant, so callers can slow down rather than retry at once.
    pub fn is_throttled(&self) -> bool {
        matches!(self, CloudError::Throttled { .. })
    }

    /// Shorthand for a [`CloudError::Retry`].
    pub fn retry_after(after: Duration, message: impl Into<String>) -> Self {
        CloudError::Retry {
            after,
            message: message.into(),
        }
    }
}

/// Result alias used throughout the provider interface.
pub type CloudResult<T> = Result<T, CloudError>;

/// A cloud-config or provider-construction error that names the file, the field and the fix.
///
/// Operators meet these at startup; a message like "invalid config" costs them an hour, one like
/// `/etc/ccm/cloud.toml: field latency.fixed_ms: expected an unsigned integer, got "50ms"`
/// costs them a minute.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}: {expected}", file.as_deref().map(|f| format!("{f}: ")).unwrap_or_default(), field.as_deref().map(|f| format!("field {f}")).unwrap_or_else(|| "config".to_string()))]
pub struct ConfigError {
    /// The config file, when the error came from one.
    pub file: Option<String>,
    /// Dotted path of the offending field, when known (e.g. `latency.fixed_ms`).
    pub field: Option<String>,
    /// What was expected and what to do about it.
    pub expected: String,
}

impl ConfigError {
    /// An error about one field.
    pub fn field(field: impl Into<String>, expected: impl Into<String>) -> Self {
        ConfigError {
            file: None,
            field: Some(field.into()),
            expected: expected.into(),
        }
    }

    /// An error about the config as a whole (e.g. a required file is missing).
    pub fn general(expected: impl Into<String>) -> Self {
        ConfigError {
            file: None,
            field: None,
            expected: expected.into(),
        }
    }

    /// Attaches the file name, keeping any already set.
    pub fn in_file(mut self, file: impl Into<String>) -> Self {
        if self.file.is_none() {
            self.file = Some(file.into());
        }
        self
    }
}
