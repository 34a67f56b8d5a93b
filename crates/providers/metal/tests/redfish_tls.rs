//! Redfish over HTTPS against sushy-tools serving a certificate from a test CA: verified with
//! `ca_file`, refused without it, accepted with `insecure_skip_verify`.

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_bmcs_are_verified_against_the_configured_ca() {
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
        &[("m", UUID, "On")],
        Some((&leaf.pem(), &leaf_key.serialize_pem())),
    );
    assert!(sushy.endpoint.starts_with("https://"), "{}", sushy.endpoint);
    let dir = TempDir::new("tls");
    let ca_file = dir.0.join("ca.pem");
    std::fs::write(&ca_file, ca_cert.pem()).expect("ca file");
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
