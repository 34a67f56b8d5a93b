//! TLS client configs for providers that call HTTPS endpoints themselves (BMCs, Keystone and
//! its catalog): the system's roots, a CA file, or — only when the operator says so — no
//! certificate verification. One implementation, so every provider's `ca-file` and "insecure"
//! settings mean the same, and errors name the provider's own config key.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, ring};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// A client config reading `ca_file` now; `key` is the provider's name for that setting
/// (`ca_file`, `ca-file`), used in errors.
pub fn client_config(
    key: &str,
    ca_file: Option<&Path>,
    insecure: bool,
) -> Result<ClientConfig, String> {
    match ca_file {
        Some(path) => {
            let pem = std::fs::read(path)
                .map_err(|e| format!("{key} {}: cannot read it: {e}", path.display()))?;
            client_config_pem(key, Some((path, &pem)), insecure)
        }
        None => client_config_pem(key, None, insecure),
    }
}

/// A client config trusting the PEM certificates `ca` (its file name, its contents): the
/// caller re-reads the file and builds a new config when the contents change (a rotated CA).
pub fn client_config_pem(
    key: &str,
    ca: Option<(&Path, &[u8])>,
    insecure: bool,
) -> Result<ClientConfig, String> {
    let provider = Arc::new(ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?;
    if insecure {
        return Ok(builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
            .with_no_client_auth());
    }
    let Some((path, pem)) = ca else {
        use hyper_rustls::ConfigBuilderExt as _;
        return builder
            .with_native_roots()
            .map(|b| b.with_no_client_auth())
            .map_err(|e| format!("loading the system's CA certificates: {e}"));
    };
    let mut roots = RootCertStore::empty();
    let bad = |e: &dyn std::fmt::Display| format!("{key} {}: {e}", path.display());
    for cert in CertificateDer::pem_slice_iter(pem) {
        roots.add(cert.map_err(|e| bad(&e))?).map_err(|e| bad(&e))?;
    }
    if roots.is_empty() {
        return Err(bad(&"no PEM certificate in the file"));
    }
    Ok(builder.with_root_certificates(roots).with_no_client_auth())
}

/// Accepts any certificate but still checks the handshake signatures, so the connection is
/// encrypted to *someone*; only for endpoints with self-signed certificates, on a trusted network, when the operator
/// asks for it.
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
