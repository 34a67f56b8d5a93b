//! Upstream's secure serving, delegated authentication and delegated authorization flags
//! (k8s.io/apiserver `SecureServingOptions`, `DelegatingAuthenticationOptions`,
//! `DelegatingAuthorizationOptions`), with the cloud-controller-manager's defaults.

use std::net::IpAddr;
use std::path::PathBuf;

use clap::{ArgAction, Args};

use crate::options::GoDuration;

fn go_bool(s: &str) -> Result<bool, String> {
    ccm_controllers::nodeutil::parse_go_bool(s)
        .ok_or_else(|| format!("invalid boolean {s:?}: use true or false"))
}

/// `--bind-address`, `--secure-port`, certificates and TLS parameters.
#[derive(Debug, Clone, Args)]
pub struct SecureServingOptions {
    /// Address for --secure-port; 0.0.0.0 or :: listens on all interfaces.
    #[arg(long, default_value = "0.0.0.0", help_heading = "Secure serving flags")]
    pub bind_address: IpAddr,

    /// HTTPS port for /healthz, /readyz, /livez and /metrics, with authentication and
    /// authorization; 0 disables serving.
    #[arg(long, default_value_t = 10258, help_heading = "Secure serving flags")]
    pub secure_port: u16,

    /// Directory of the self-signed certificate (cloud-controller-manager.crt/.key) used when
    /// --tls-cert-file is not given: reused when present, generated and written otherwise.
    /// Without it the certificate is generated in memory.
    #[arg(long, help_heading = "Secure serving flags")]
    pub cert_dir: Option<PathBuf>,

    /// Serving certificate (PEM, chain after the leaf); reloaded when the file changes.
    #[arg(long, help_heading = "Secure serving flags")]
    pub tls_cert_file: Option<PathBuf>,

    /// Private key (PEM) for --tls-cert-file; reloaded when the file changes.
    #[arg(long, help_heading = "Secure serving flags")]
    pub tls_private_key_file: Option<PathBuf>,

    /// Cipher suites (Go/IANA names). Accepted; rustls offers only modern AEAD suites
    /// (TLS 1.3 suites and ECDHE-AES-GCM/CHACHA20 for TLS 1.2), so the list has no effect.
    #[arg(long, value_delimiter = ',', help_heading = "Secure serving flags")]
    pub tls_cipher_suites: Vec<String>,

    /// Minimum TLS version: VersionTLS12 or VersionTLS13 (VersionTLS10/11 mean 1.2: rustls
    /// never speaks older versions).
    #[arg(long, help_heading = "Secure serving flags")]
    pub tls_min_version: Option<String>,

    /// SNI certificate pairs `cert,key[:names]`. Accepted, no effect: one certificate serves
    /// every name.
    #[arg(long, help_heading = "Secure serving flags")]
    pub tls_sni_cert_key: Vec<String>,

    /// HTTP/2 streams a client may open per connection (0 = library default).
    #[arg(long, default_value_t = 0, help_heading = "Secure serving flags")]
    pub http2_max_streams_per_connection: u32,

    /// Bind with SO_REUSEPORT, so more than one process may listen on the port.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, help_heading = "Secure serving flags")]
    pub permit_port_sharing: bool,

    /// Bind with SO_REUSEADDR.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, help_heading = "Secure serving flags")]
    pub permit_address_sharing: bool,
}

/// Delegated authentication: bearer tokens via TokenReview, client certificates.
#[derive(Debug, Clone, Args)]
pub struct AuthenticationOptions {
    /// kubeconfig with rights to create tokenreviews.authentication.k8s.io. ccm-rs: when
    /// omitted, the --kubeconfig / in-cluster connection is used.
    #[arg(long, help_heading = "Authentication flags")]
    pub authentication_kubeconfig: Option<PathBuf>,

    /// Do not read client-ca-file from kube-system/extension-apiserver-authentication.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, help_heading = "Authentication flags")]
    pub authentication_skip_lookup: bool,

    /// How long TokenReview answers are cached.
    #[arg(long, default_value = "10s", help_heading = "Authentication flags")]
    pub authentication_token_webhook_cache_ttl: GoDuration,

    /// Start even when the extension-apiserver-authentication lookup fails.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, help_heading = "Authentication flags")]
    pub authentication_tolerate_lookup_failure: bool,

    /// CA bundle: a client certificate it signed authenticates as its CommonName, with its
    /// Organizations as groups.
    #[arg(long, help_heading = "Authentication flags")]
    pub client_ca_file: Option<PathBuf>,

    /// Front-proxy user headers. Accepted, no effect: ccm-rs does not trust front proxies.
    #[arg(long, value_delimiter = ',', help_heading = "Authentication flags")]
    pub requestheader_username_headers: Vec<String>,

    /// Front-proxy UID headers. Accepted, no effect.
    #[arg(long, value_delimiter = ',', help_heading = "Authentication flags")]
    pub requestheader_uid_headers: Vec<String>,

    /// Front-proxy group headers. Accepted, no effect.
    #[arg(long, value_delimiter = ',', help_heading = "Authentication flags")]
    pub requestheader_group_headers: Vec<String>,

    /// Front-proxy extra header prefixes. Accepted, no effect.
    #[arg(long, value_delimiter = ',', help_heading = "Authentication flags")]
    pub requestheader_extra_headers_prefix: Vec<String>,

    /// Front-proxy client CA. Accepted, no effect.
    #[arg(long, help_heading = "Authentication flags")]
    pub requestheader_client_ca_file: Option<PathBuf>,

    /// Front-proxy client common names. Accepted, no effect.
    #[arg(long, value_delimiter = ',', help_heading = "Authentication flags")]
    pub requestheader_allowed_names: Vec<String>,
}

/// Delegated authorization: SubjectAccessReview, cached; always-allowed paths.
#[derive(Debug, Clone, Args)]
pub struct AuthorizationOptions {
    /// kubeconfig with rights to create subjectaccessreviews.authorization.k8s.io. ccm-rs: when
    /// omitted, the --kubeconfig / in-cluster connection is used.
    #[arg(long, help_heading = "Authorization flags")]
    pub authorization_kubeconfig: Option<PathBuf>,

    /// How long 'allowed' SubjectAccessReview answers are cached.
    #[arg(long, default_value = "10s", help_heading = "Authorization flags")]
    pub authorization_webhook_cache_authorized_ttl: GoDuration,

    /// How long 'denied' SubjectAccessReview answers are cached.
    #[arg(long, default_value = "10s", help_heading = "Authorization flags")]
    pub authorization_webhook_cache_unauthorized_ttl: GoDuration,

    /// Paths served without authentication or authorization (`/prefix*` matches a prefix).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "/healthz,/readyz,/livez",
        help_heading = "Authorization flags"
    )]
    pub authorization_always_allow_paths: Vec<String>,
}
