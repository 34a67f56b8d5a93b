//! The provider page's full example parses, and `--cloud-provider=metal` without a config says
//! what to pass.

use std::path::Path;

use ccm_provider_metal::MetalConfig;

#[test]
fn the_documented_example_is_a_valid_config() {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../docs/providers/metal.md"),
    )
    .expect("docs/providers/metal.md");
    let start = doc
        .find("```toml\n# /etc/ccm/metal.toml")
        .expect("the full example");
    let body = &doc[start + "```toml\n".len()..];
    let example = &body[..body.find("```").expect("end of the example")];

    // The example names a CA file that exists on the operator's host; use a real one here.
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = params.self_signed(&key).expect("ca");
    let dir = std::env::temp_dir().join(format!("metal-docs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).expect("ca");
    let text = example.replace("/etc/ccm/bmc/ca.pem", &ca_file.display().to_string());
    let parsed = MetalConfig::parse(&text);
    let _ = std::fs::remove_dir_all(&dir);
    let config = parsed.expect("the documented example parses");

    assert_eq!(config.pools.len(), 3);
    assert!(config.kube_vip_annotation);
    assert_eq!(
        config.machine("edge-17").map(|m| m.zone.as_str()),
        Some("edge")
    );
    assert_eq!(config.machine("cp-1").map(|m| m.addresses.len()), Some(3));
    assert_eq!(
        config.routes.as_ref().map(|r| (r.table, r.protocol)),
        Some((17219, 75))
    );
}

#[test]
fn metal_without_a_cloud_config_says_what_to_pass() {
    let mut registry = ccm_cloud::ProviderRegistry::new();
    ccm_provider_metal::register(&mut registry).expect("register");
    let err = registry.build("metal", None).err().expect("needs a config");
    assert!(err.to_string().contains("--cloud-config"), "{err}");
    assert!(err.to_string().contains("docs/providers/metal.md"), "{err}");
}

#[test]
fn the_documented_bgp_example_is_a_valid_config() {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../docs/providers/metal.md"),
    )
    .expect("docs/providers/metal.md");
    let start = doc
        .find("```toml\n[routes]\nmode = \"bgp\"")
        .expect("the BGP example");
    let body = &doc[start + "```toml\n".len()..];
    let example = &body[..body.find("```").expect("end of the example")];
    let config = MetalConfig::parse(example).expect("the documented BGP example parses");
    let bgp = config
        .routes
        .and_then(|r| r.bgp)
        .expect("routes.mode = bgp");
    assert_eq!(bgp.asn, 64512);
    assert_eq!(bgp.peers.len(), 1);
    assert!(bgp.peers[0].ttl_security);
}
