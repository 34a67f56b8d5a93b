//! A small HTTPS client for the secure port, for whoever reads a running CCM's `/metrics` and
//! health from outside: `ccm bench`, tests, tooling. It verifies the server against a given CA
//! (e.g. the self-signed one the CCM wrote to `--cert-dir`) and authenticates with a bearer
//! token, as Prometheus does.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};

/// Reads `/metrics` and health endpoints of one CCM.
#[derive(Clone)]
pub struct Scraper {
    addr: SocketAddr,
    tls: tokio_rustls::TlsConnector,
    token: Option<String>,
    /// With [`Scraper::keep_alive`]: the connection to send the next request on.
    kept: Option<Arc<tokio::sync::Mutex<Option<Connection>>>>,
}

type Connection = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

impl Scraper {
    /// Trusts the CA certificates in `ca_pem` (a chain file works: every certificate in it is
    /// trusted) and sends `token` as `Authorization: Bearer`.
    pub fn new(addr: SocketAddr, ca_pem: &[u8], token: Option<String>) -> anyhow::Result<Self> {
        Self::build(addr, ca_pem, token, None)
    }

    /// Like [`Scraper::new`], presenting a client certificate (PEM chain and key) instead of a
    /// token, for a CCM started with `--client-ca-file`.
    pub fn with_client_cert(
        addr: SocketAddr,
        ca_pem: &[u8],
        cert_pem: &[u8],
        key_pem: &[u8],
    ) -> anyhow::Result<Self> {
        let certs = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .context("client certificate: not PEM")?;
        let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(key_pem)
            .context("client key: not PEM")?;
        Self::build(addr, ca_pem, None, Some((certs, key)))
    }

    fn build(
        addr: SocketAddr,
        ca_pem: &[u8],
        token: Option<String>,
        client: Option<(
            Vec<CertificateDer<'static>>,
            rustls_pki_types::PrivateKeyDer<'static>,
        )>,
    ) -> anyhow::Result<Self> {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(ca_pem) {
            roots
                .add(c.context("CA: not PEM")?)
                .context("CA: unusable")?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
        let config = match client {
            Some((certs, key)) => config.with_client_auth_cert(certs, key)?,
            None => config.with_no_client_auth(),
        };
        Ok(Scraper {
            addr,
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
            token,
            kept: None,
        })
    }

    /// Sends every request on one connection while it lasts, as Prometheus does with each
    /// target. Without it each request is a new connection and a TLS handshake, work for the
    /// CCM that a Prometheus scraping it does not cause: a bench that reads /metrics every few
    /// seconds for minutes would measure its own reading. Clones share the connection.
    pub fn keep_alive(mut self) -> Self {
        self.kept = Some(Arc::default());
        self
    }

    /// For a CCM started with `--cert-dir=dir` (and no `--tls-cert-file`).
    pub fn for_cert_dir(
        addr: SocketAddr,
        dir: &Path,
        token: Option<String>,
    ) -> anyhow::Result<Self> {
        let path = dir.join(format!("{}.crt", crate::tls::PAIR_NAME));
        let pem = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        Self::new(addr, &pem, token)
    }

    /// GET `path`: (status, body).
    pub async fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let Some(kept) = &self.kept else {
            return self.get_on(&mut self.connect().await?, path).await;
        };
        let mut slot = kept.lock().await;
        if let Some(mut conn) = slot.take()
            && !conn.is_closed()
            && let Ok(answer) = self.get_on(&mut conn, path).await
        {
            *slot = Some(conn);
            return Ok(answer);
        }
        // No connection yet, or the CCM closed it: a new one (a GET may be sent again).
        let mut conn = self.connect().await?;
        let answer = self.get_on(&mut conn, path).await?;
        *slot = Some(conn);
        Ok(answer)
    }

    async fn connect(&self) -> anyhow::Result<Connection> {
        let tcp = tokio::net::TcpStream::connect(self.addr).await?;
        let name = ServerName::IpAddress(self.addr.ip().into());
        let tls = self.tls.connect(name, tcp).await?;
        let (send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await?;
        tokio::spawn(conn);
        Ok(send)
    }

    async fn get_on(&self, conn: &mut Connection, path: &str) -> anyhow::Result<(u16, String)> {
        conn.ready().await?;
        let mut req = http::Request::get(path).header(http::header::HOST, "localhost");
        if let Some(t) = &self.token {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let resp = conn.send_request(req.body(Empty::<Bytes>::new())?).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }
}
