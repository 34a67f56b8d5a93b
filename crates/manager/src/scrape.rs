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

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::Full;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    use super::*;

    /// A TLS server answering every request `200 m 1`, closing each connection after one answer
    /// when `one_per_connection`: its address, its CA chain (PEM) and a count of connections.
    async fn server(one_per_connection: bool) -> (SocketAddr, String, Arc<AtomicUsize>) {
        let ip = std::net::Ipv4Addr::LOCALHOST;
        let (chain, key) = crate::tls::self_signed(ip.into()).expect("certificate");
        let certs = CertificateDer::pem_slice_iter(chain.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("chain");
        let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = hyper::service::service_fn(|_req| async {
                        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from("m 1"))))
                    });
                    let mut builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    builder.http1().keep_alive(!one_per_connection);
                    let _ = builder.serve_connection(TokioIo::new(tls), svc).await;
                });
            }
        });
        (addr, chain, accepted)
    }

    fn kept_alive(addr: SocketAddr, ca: &str) -> Scraper {
        Scraper::new(addr, ca.as_bytes(), None)
            .expect("scraper")
            .keep_alive()
    }

    #[tokio::test]
    async fn a_kept_alive_scraper_reads_on_one_connection_and_a_plain_one_on_one_each() {
        let (addr, ca, accepted) = server(false).await;
        let kept = kept_alive(addr, &ca);
        for _ in 0..5 {
            assert_eq!(
                kept.get("/metrics").await.expect("read"),
                (200, "m 1".into())
            );
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one TLS handshake for five reads"
        );
        let plain = Scraper::new(addr, ca.as_bytes(), None).expect("scraper");
        for _ in 0..3 {
            assert_eq!(plain.get("/metrics").await.expect("read").0, 200);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn a_kept_alive_scraper_reconnects_when_the_server_closed_its_connection() {
        let (addr, ca, accepted) = server(true).await;
        let kept = kept_alive(addr, &ca);
        for _ in 0..3 {
            assert_eq!(kept.get("/metrics").await.expect("read").0, 200);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }
}
