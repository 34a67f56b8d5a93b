//! HTTPS for the health and metrics server when `--tls-cert-file`/`--tls-private-key-file`
//! are given.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// Loads a PEM certificate chain and key into a TLS acceptor, naming the file that is wrong.
pub fn acceptor(cert: &Path, key: &Path) -> anyhow::Result<TlsAcceptor> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("--tls-cert-file {}: cannot read", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| {
            format!(
                "--tls-cert-file {}: not a PEM certificate chain",
                cert.display()
            )
        })?;
    if certs.is_empty() {
        anyhow::bail!("--tls-cert-file {}: no certificate found", cert.display());
    }
    let key = PrivateKeyDer::from_pem_file(key).with_context(|| {
        format!(
            "--tls-private-key-file {}: not a PEM private key",
            key.display()
        )
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context(
            "--tls-cert-file/--tls-private-key-file: the key does not match the certificate",
        )?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Accepts TLS connections and serves `app` on each until `shutdown`.
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    acceptor: TlsAcceptor,
    app: Router,
    shutdown: CancellationToken,
) {
    loop {
        let (tcp, _) = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let svc = TowerToHyperService::new(app);
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), svc)
                .await;
        });
    }
}
