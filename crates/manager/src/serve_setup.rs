//! From flags to the secure port's TLS settings and auth guard: the authn/authz kubeconfigs,
//! `--client-ca-file` or the CA published in `kube-system/extension-apiserver-authentication`.

use std::path::Path;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;

use crate::auth::{Guard, GuardConfig};
use crate::client::{RateLimitLayer, USER_AGENT_BASE, build_metered_client};
use crate::client_metrics::RestClientMetrics;
use crate::options::{RunOptions, tls_min_version};
use crate::serve::SecureServing;
use crate::tls::{CertSource, TlsSettings};

/// Upstream's delegated-auth clients: QPS 200, burst 400 ("this will effectively limit API
/// server responsiveness").
const REVIEW_QPS: f64 = 200.0;
const REVIEW_BURST: u32 = 400;

/// Builds the secure port's settings; errors name the flag that is wrong. The review clients'
/// requests are counted in `metrics`, as client-go counts upstream's.
pub async fn secure_serving(
    o: &RunOptions,
    main: &kube::Config,
    metrics: &RestClientMetrics,
) -> anyhow::Result<SecureServing> {
    let authn = review_client(
        o.authn.authentication_kubeconfig.as_deref(),
        "--authentication-kubeconfig",
        main,
        metrics,
    )
    .await?;
    let authz = review_client(
        o.authz.authorization_kubeconfig.as_deref(),
        "--authorization-kubeconfig",
        main,
        metrics,
    )
    .await?;
    let client_ca_pem = match &o.authn.client_ca_file {
        Some(path) => Some(
            std::fs::read(path)
                .with_context(|| format!("--client-ca-file {}: cannot read", path.display()))?,
        ),
        None if o.authn.authentication_skip_lookup => None,
        None => lookup_client_ca(&authn, o.authn.authentication_tolerate_lookup_failure).await?,
    };
    let s = &o.serving;
    let cert = match (&s.tls_cert_file, &s.tls_private_key_file) {
        (Some(cert), Some(key)) => CertSource::Files {
            cert: cert.clone(),
            key: key.clone(),
        },
        _ => CertSource::SelfSigned {
            dir: s.cert_dir.clone(),
            pair: crate::tls::PAIR_NAME,
        },
    };
    let tls = TlsSettings {
        cert,
        client_ca_pem,
        min_version: tls_min_version(s.tls_min_version.as_deref())
            .context("--tls-min-version: use VersionTLS12 or VersionTLS13")?,
        http2_max_streams: s.http2_max_streams_per_connection,
    };
    let guard = Guard::new(GuardConfig {
        token_review: Some(authn),
        token_ttl: o.authn.authentication_token_webhook_cache_ttl.0,
        access_review: Some(authz),
        allow_ttl: o.authz.authorization_webhook_cache_authorized_ttl.0,
        deny_ttl: o.authz.authorization_webhook_cache_unauthorized_ttl.0,
        always_allow_paths: o.authz.authorization_always_allow_paths.clone(),
    });
    Ok(SecureServing {
        tls,
        guard,
        reuse_port: s.permit_port_sharing,
        reuse_addr: s.permit_address_sharing,
    })
}

/// A client for TokenReview/SubjectAccessReview: from `flag`'s kubeconfig, else the main
/// connection (upstream: in-cluster config).
async fn review_client(
    kubeconfig: Option<&Path>,
    flag: &str,
    main: &kube::Config,
    metrics: &RestClientMetrics,
) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = crate::client::read_kubeconfig(path)
                .with_context(|| format!("{flag} {}: cannot read", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("{flag} {}: invalid kubeconfig", path.display()))?
        }
        None => main.clone(),
    };
    build_metered_client(
        config,
        &format!("{USER_AGENT_BASE}/delegated-auth"),
        &RateLimitLayer::new(REVIEW_QPS, REVIEW_BURST),
        metrics,
    )
}

/// The client CA the API server publishes for delegated authentication, as upstream's
/// lookup: absent is fine (a warning); any other failure is fatal unless tolerated.
async fn lookup_client_ca(
    client: &kube::Client,
    tolerate: bool,
) -> anyhow::Result<Option<Vec<u8>>> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    match api.get_opt("extension-apiserver-authentication").await {
        Ok(Some(cm)) => Ok(cm
            .data
            .and_then(|d| d.get("client-ca-file").cloned())
            .filter(|s| !s.trim().is_empty())
            .map(String::into_bytes)),
        Ok(None) => {
            tracing::warn!(
                "kube-system/extension-apiserver-authentication not found: client certificates are not accepted (pass --client-ca-file)"
            );
            Ok(None)
        }
        Err(e) if tolerate => {
            tracing::warn!(error = %e, "cannot read kube-system/extension-apiserver-authentication; continuing (--authentication-tolerate-lookup-failure)");
            Ok(None)
        }
        Err(e) => Err(anyhow::anyhow!(
            "cannot read kube-system/extension-apiserver-authentication for the client CA: {e}; grant get on that ConfigMap, or pass --authentication-skip-lookup or --authentication-tolerate-lookup-failure"
        )),
    }
}
