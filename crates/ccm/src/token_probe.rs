//! `ccm demo --break token-probe`: a TLS listener that is not the CCM, on the port the CCM's
//! pod declares. It stands for whatever answers on a pod IP and port once the pod is gone (a
//! hostNetwork process that took the port, a rogue pod): its certificate chains to no CA the
//! operator trusts, and it records every credential a client hands it. `ccm doctor` must send
//! it none.

use std::sync::Arc;

use anyhow::Context as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// What the probe saw of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The User-Agent header.
    pub user_agent: String,
    /// The request carried an `Authorization` header.
    pub credentials: bool,
}

/// Starts the probe on a free loopback port; every request is reported to `on_request` and
/// answered 401.
pub async fn start(
    on_request: impl Fn(Seen) + Send + Sync + 'static,
) -> anyhow::Result<(u16, tokio::task::JoinHandle<()>)> {
    let acceptor = acceptor()?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("token probe: bind")?;
    let port = listener.local_addr()?.port();
    let on_request = Arc::new(on_request);
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, on_request) = (acceptor.clone(), on_request.clone());
            tokio::spawn(async move {
                if let Ok(mut tls) = acceptor.accept(tcp).await
                    && let Some(seen) = read_head(&mut tls).await
                {
                    on_request(seen);
                    let _ = tls
                        .write_all(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                        .await;
                    let _ = tls.shutdown().await;
                }
            });
        }
    });
    Ok((port, task))
}

fn acceptor() -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let key = rcgen::KeyPair::generate()?;
    let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".into()])?;
    let cert = params.self_signed(&key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(cfg)))
}

/// The request head's User-Agent and whether it carries credentials (HTTP/1.1: the probe
/// offers no ALPN, so clients fall back to it).
async fn read_head<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> Option<Seen> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 2048];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 64 * 1024 {
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), s.read(&mut chunk))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&buf);
    let header = |name: &str| {
        head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    Some(Seen {
        user_agent: header("user-agent").unwrap_or_default(),
        credentials: header("authorization").is_some(),
    })
}
