//! A throwaway certificate authority and serving certificate for TLS mode.
//!
//! kubectl refuses plain HTTP servers only by configuration, but kube-rs and people expect
//! `https://`; a per-process CA written into the kubeconfig gives real verification without
//! any files to manage.

use std::sync::Arc;

use anyhow::Context as _;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// The generated CA and serving certificate.
pub struct TlsMaterial {
    /// The CA certificate, PEM (goes into the kubeconfig).
    pub ca_pem: String,
    /// The CA certificate, DER (goes into kube::Config::root_cert).
    pub ca_der: Vec<u8>,
    cert_der: Vec<u8>,
    key_der: Vec<u8>,
}

/// Generates a CA and a serving certificate valid for `hosts` (DNS names or IP addresses).
pub fn generate(hosts: &[String]) -> anyhow::Result<TlsMaterial> {
    let ca_key = KeyPair::generate().context("generating CA key")?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name = DistinguishedName::new();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "kube-sim-ca");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = ca_params.self_signed(&ca_key).context("signing CA")?;

    let key = KeyPair::generate().context("generating serving key")?;
    let mut params = CertificateParams::new(hosts.to_vec())?;
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    let cert = params
        .signed_by(&key, &ca, &ca_key)
        .context("signing serving certificate")?;
    Ok(TlsMaterial {
        ca_pem: ca.pem(),
        ca_der: ca.der().to_vec(),
        cert_der: cert.der().to_vec(),
        key_der: key.serialize_der(),
    })
}

impl TlsMaterial {
    /// A rustls acceptor offering HTTP/2 and HTTP/1.1.
    pub fn acceptor(&self) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(self.cert_der.clone())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone())),
            )?;
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(cfg)))
    }
}
