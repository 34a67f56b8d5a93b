//! HTTPS for the secure port, as upstream's `SecureServingOptions`:
//!
//! - `--tls-cert-file`/`--tls-private-key-file`: served, and reloaded when either file changes
//!   (checked every [`RELOAD_CHECK`]; a bad new pair is logged and the old one kept);
//! - otherwise a self-signed certificate (a CA plus a serving certificate for `localhost`,
//!   127.0.0.1 and the bind address), written to `--cert-dir` as
//!   `cloud-controller-manager.crt`/`.key` when given (and reused from there), else in memory;
//! - `--client-ca-file`: client certificates signed by it are verified during the handshake
//!   (optional: bearer tokens still work without one).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use parking_lot::RwLock;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::options::TlsMin;

/// Upstream's pair name: `<cert-dir>/cloud-controller-manager.crt` and `.key`.
pub const PAIR_NAME: &str = "cloud-controller-manager";

/// How often certificate files are checked for changes.
pub const RELOAD_CHECK: Duration = Duration::from_secs(1);

/// Where the serving certificate comes from.
#[derive(Debug, Clone)]
pub enum CertSource {
    /// `--tls-cert-file`/`--tls-private-key-file`, reloaded on change.
    Files {
        /// Certificate chain (PEM).
        cert: PathBuf,
        /// Private key (PEM).
        key: PathBuf,
    },
    /// Self-signed; written to and reused from this directory when given.
    SelfSigned {
        /// `--cert-dir`.
        dir: Option<PathBuf>,
        /// File names in `dir`: [`PAIR_NAME`], or upstream's `cloud-controller-manager-webhook`
        /// for the webhook server, so the two never overwrite each other's pair.
        pair: &'static str,
    },
}

/// TLS settings of the secure port.
#[derive(Debug, Clone)]
pub struct TlsSettings {
    /// The certificate.
    pub cert: CertSource,
    /// `--client-ca-file` contents (PEM), if any.
    pub client_ca_pem: Option<Vec<u8>>,
    /// `--tls-min-version`.
    pub min_version: TlsMin,
    /// `--http2-max-streams-per-connection` (0 = default).
    pub http2_max_streams: u32,
}

/// The peer certificate chain of a TLS connection, put into each request's extensions so
/// authentication can read it.
#[derive(Debug, Clone)]
pub struct PeerCertificates(pub Arc<Vec<CertificateDer<'static>>>);

/// Reads a PEM certificate chain and key, naming the file that is wrong.
pub fn load_pair(cert: &Path, key: &Path) -> anyhow::Result<Arc<CertifiedKey>> {
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
            "--tls-private-key-file {}: cannot read a PEM private key",
            key.display()
        )
    })?;
    certified(certs, key)
        .context("--tls-cert-file/--tls-private-key-file: the key does not match the certificate")
}

fn certified(
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> anyhow::Result<Arc<CertifiedKey>> {
    let provider = rustls::crypto::ring::default_provider();
    let ck = CertifiedKey::from_der(certs, key, &provider)?;
    Ok(Arc::new(ck))
}

/// A self-signed CA and serving certificate: (chain PEM = serving cert then CA, key PEM), as
/// upstream's `GenerateSelfSignedCertKey`.
pub fn self_signed(bind: IpAddr) -> anyhow::Result<(String, String)> {
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair,
        KeyUsagePurpose, SanType,
    };
    let stamp = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let ca_key = KeyPair::generate().context("generating the CA key")?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name = DistinguishedName::new();
    ca.distinguished_name
        .push(DnType::CommonName, format!("localhost-ca@{stamp}"));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).context("signing the CA")?;

    let key = KeyPair::generate().context("generating the serving key")?;
    let mut params = CertificateParams::new(vec!["localhost".to_string()])?;
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, format!("localhost@{stamp}"));
    params
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::from([127, 0, 0, 1])));
    if !bind.is_unspecified() && !bind.is_loopback() {
        params.subject_alt_names.push(SanType::IpAddress(bind));
    }
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params
        .signed_by(&key, &ca_cert, &ca_key)
        .context("signing the serving certificate")?;
    Ok((
        format!("{}{}", cert.pem(), ca_cert.pem()),
        key.serialize_pem(),
    ))
}

/// A certificate resolver that swaps in new files when they change.
#[derive(Debug)]
struct Reloading {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().clone())
    }
}

fn mtimes(paths: &[&Path]) -> Vec<Option<SystemTime>> {
    paths
        .iter()
        .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .collect()
}

/// Starts a task that reloads `cert`/`key` into `resolver` when their modification times
/// change, until `shutdown`.
fn watch_files(resolver: Arc<Reloading>, cert: PathBuf, key: PathBuf, shutdown: CancellationToken) {
    tokio::spawn(async move {
        let mut seen = mtimes(&[&cert, &key]);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(RELOAD_CHECK) => {}
            }
            let now = mtimes(&[&cert, &key]);
            if now == seen {
                continue;
            }
            match load_pair(&cert, &key) {
                Ok(ck) => {
                    *resolver.current.write() = ck;
                    seen = now;
                    tracing::info!(cert = %cert.display(), "reloaded the serving certificate");
                }
                // Half-written files are common mid-rotation: keep serving the old pair and
                // retry on the next change check.
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "serving certificate changed but cannot be loaded; keeping the previous one")
                }
            }
        }
    });
}

/// The certificate to serve, from the settings: files, a reused/generated pair in
/// `--cert-dir`, or in memory.
fn initial_pair(settings: &TlsSettings, bind: IpAddr) -> anyhow::Result<Arc<CertifiedKey>> {
    match &settings.cert {
        CertSource::Files { cert, key } => load_pair(cert, key),
        CertSource::SelfSigned {
            dir: Some(dir),
            pair,
        } => {
            let (cert, key) = (
                dir.join(format!("{pair}.crt")),
                dir.join(format!("{pair}.key")),
            );
            if cert.exists() && key.exists() {
                return load_pair(&cert, &key).with_context(|| {
                    format!(
                        "--cert-dir {}: existing certificate unusable",
                        dir.display()
                    )
                });
            }
            let (cert_pem, key_pem) = self_signed(bind)?;
            std::fs::create_dir_all(dir)
                .with_context(|| format!("--cert-dir {}: cannot create", dir.display()))?;
            std::fs::write(&cert, &cert_pem)
                .with_context(|| format!("--cert-dir: cannot write {}", cert.display()))?;
            write_private(&key, key_pem.as_bytes())
                .with_context(|| format!("--cert-dir: cannot write {}", key.display()))?;
            tracing::info!(cert = %cert.display(), key = %key.display(), "generated a self-signed certificate");
            load_pair(&cert, &key)
        }
        CertSource::SelfSigned { dir: None, .. } => {
            let (cert_pem, key_pem) = self_signed(bind)?;
            let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .context("generated certificate")?;
            let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).context("generated key")?;
            tracing::info!("generated a self-signed certificate in memory");
            certified(certs, key)
        }
    }
}

fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    opts.open(path)?.write_all(data)
}

/// Builds the acceptor; file certificates are watched until `shutdown`.
pub fn acceptor(
    settings: &TlsSettings,
    bind: IpAddr,
    shutdown: &CancellationToken,
) -> anyhow::Result<TlsAcceptor> {
    let resolver = Arc::new(Reloading {
        current: RwLock::new(initial_pair(settings, bind)?),
    });
    if let CertSource::Files { cert, key } = &settings.cert {
        watch_files(
            resolver.clone(),
            cert.clone(),
            key.clone(),
            shutdown.clone(),
        );
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&rustls::SupportedProtocolVersion] = match settings.min_version {
        TlsMin::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsMin::Tls13 => &[&rustls::version::TLS13],
    };
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .context("TLS protocol versions")?;
    let builder = match &settings.client_ca_pem {
        None => builder.with_no_client_auth(),
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(pem) {
                roots
                    .add(c.context("--client-ca-file: not a PEM certificate bundle")?)
                    .context("--client-ca-file: unusable CA certificate")?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .context("--client-ca-file: no usable CA certificate")?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Binds `addr` with `--permit-port-sharing` / `--permit-address-sharing`.
pub fn bind(
    addr: SocketAddr,
    reuse_port: bool,
    reuse_addr: bool,
) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(reuse_addr)?;
    #[cfg(unix)]
    socket.set_reuseport(reuse_port)?;
    #[cfg(not(unix))]
    let _ = reuse_port;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Accepts TLS connections and serves `app` on each until `shutdown`; each request carries the
/// connection's [`PeerCertificates`].
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    acceptor: TlsAcceptor,
    app: Router,
    http2_max_streams: u32,
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
            let peer = PeerCertificates(Arc::new(
                tls.get_ref()
                    .1
                    .peer_certificates()
                    .map(|c| c.iter().map(|d| d.clone().into_owned()).collect())
                    .unwrap_or_default(),
            ));
            let app = tower::ServiceExt::map_request(app, move |mut req: http::Request<_>| {
                req.extensions_mut().insert(peer.clone());
                req
            });
            let svc = TowerToHyperService::new(app);
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            if http2_max_streams > 0 {
                builder.http2().max_concurrent_streams(http2_max_streams);
            }
            let _ = builder.serve_connection(TokioIo::new(tls), svc).await;
        });
    }
}
