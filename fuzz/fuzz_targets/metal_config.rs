//! The metal provider's `--cloud-config` (TOML: machines and their BMCs, address pools,
//! routes, BGP), as `MetalConfig::parse` reads and checks it. Properties: no error shows a BGP
//! peer's password; a checked password cannot break out of its quotes in the rendered BIRD
//! config. The pool-range and community readers get the first line on its own.
#![no_main]
use std::collections::BTreeMap;

use ccm_provider_metal::bgp::{bird, config::Community};
use ccm_provider_metal::ipam::PoolRange;
use ccm_provider_metal::{MetalConfig, config::glob_match};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let first = text.lines().next().unwrap_or_default();
    let _ = PoolRange::parse(first);
    let _ = Community::parse(first);
    let _ = glob_match(first.as_bytes(), b"node-1.example");
    match MetalConfig::parse(text) {
        Ok(cfg) => {
            let _ = cfg.machine("node-1");
            if let Some(bgp) = cfg.routes.as_ref().and_then(|r| r.bgp.as_ref()) {
                for pw in bgp.peers.iter().filter_map(|p| p.password.as_deref()) {
                    assert!(
                        !pw.chars().any(|c| c == '"' || c == '\\' || c.is_control()),
                        "password {pw:?} would break out of its BIRD string"
                    );
                }
                let _ = bird::render(bgp, &BTreeMap::new());
            }
        }
        Err(e) => {
            let msg = e.to_string();
            for pw in ccm_fuzz::values_of(text, "password") {
                ccm_fuzz::assert_hidden(&msg, pw);
            }
        }
    }
});
