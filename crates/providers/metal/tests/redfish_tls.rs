//! Redfish over HTTPS against sushy-tools serving a certificate from a test CA: verified with
//! `ca_file`, refused without it, accepted with `insecure_skip_verify`; a rotated CA file is
//! read again without a restart.

mod support;

use std::time::Duration;

use ccm_provider_metal::MetalConfig;
use ccm_provider_metal::redfish::{BmcError, Power, Redfish};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use support::*;

const UUID: &str = "0c0c0c0c-0000-4000-8000-00000000000c";

fn bmc(config: &str) -> ccm_provider_metal::config::BmcConfig {
    MetalConfig::parse(config)
        .expect("config")
        .machine("m")
        .and_then(|m| m.bmc.clone())
        .expect("bmc")
}

/// A CA and a sushy-tools emulator serving a certificate it signed: `(CA PEM, emulator)`.
fn ca_and_bmc() -> (String, Sushy) {
    let ca_key = KeyPair::generate().expect("ca key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).expect("ca cert");
    let leaf_key = KeyPair::generate().expect("leaf key");
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .expect("leaf params")
        .signed_by(&leaf_key, &ca_cert, &ca_key)
        .expect("leaf cert");
    let sushy = Sushy::start_with(
        &[("System.Embedded.1", UUID, "On")],
        Some((&leaf.pem(), &leaf_key.serialize_pem())),
    );
    (ca_cert.pem(), sushy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_ca_file_is_read_again() {
    let (ca_old, old_bmc) = ca_and_bmc();
    let (ca_new, new_bmc) = ca_and_bmc();
    let dir = TempDir::new("tls-rotate");
    let ca_file = dir.0.join("ca.pem");
    std::fs::write(&ca_file, &ca_old).expect("ca file");
    let redfish = Redfish::new(2, Duration::from_secs(5));
    let cfg = |endpoint: &str| {
        bmc(&format!(
            "[[machines]]\nname = \"m\"\n[machines.bmc]\nendpoint = \"{endpoint}\"\nca_file = \"{}\"\n",
            ca_file.display()
        ))
    };
    assert_eq!(
        redfish.power(&cfg(&old_bmc.endpoint), "m").await,
        Ok(Power::On)
    );
    // The BMC certificates and the mounted CA file are rotated together.
    std::fs::write(&ca_file, &ca_new).expect("rotate ca file");
    assert_eq!(
        redfish.power(&cfg(&new_bmc.endpoint), "m").await,
        Ok(Power::On),
        "the new CA is used without a restart"
    );
    assert!(
        redfish.power(&cfg(&old_bmc.endpoint), "m").await.is_err(),
        "the old CA is no longer trusted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_bmcs_are_verified_against_the_configured_ca() {
    let (ca_pem, sushy) = ca_and_bmc();
    assert!(sushy.endpoint.starts_with("https://"), "{}", sushy.endpoint);
    let dir = TempDir::new("tls");
    let ca_file = dir.0.join("ca.pem");
    std::fs::write(&ca_file, ca_pem).expect("ca file");
    let redfish = Redfish::new(2, Duration::from_secs(5));
    let base = format!(
        "[[machines]]\nname = \"m\"\n[machines.bmc]\nendpoint = \"{}\"\nsystem = \"{UUID}\"\n",
        sushy.endpoint
    );

    let verified = bmc(&format!("{base}ca_file = \"{}\"\n", ca_file.display()));
    assert_eq!(redfish.power(&verified, "m").await, Ok(Power::On));

    let system_roots = bmc(&base);
    match redfish.power(&system_roots, "m").await {
        Err(BmcError::Failed { message, .. }) => {
            assert!(message.to_lowercase().contains("certificate"), "{message}")
        }
        other => panic!("an unknown CA must be refused, got {other:?}"),
    }

    let insecure = bmc(&format!("{base}insecure_skip_verify = true\n"));
    assert_eq!(redfish.power(&insecure, "m").await, Ok(Power::On));
}
