//! The sim provider's `--cloud-config` (TOML): parsed as `register` parses it, checked, built;
//! a parsed config serializes and reads back to the same config.
#![no_main]
use ccm_provider_sim::SimConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cfg) = ccm_cloud::parse_toml_str::<SimConfig>(text) else {
        return;
    };
    if let Ok(out) = toml::to_string(&cfg) {
        let back: SimConfig = ccm_cloud::parse_toml_str(&out)
            .unwrap_or_else(|e| panic!("serialized config does not read back: {e}\n{out}"));
        assert_eq!(toml::to_string(&back).ok().as_deref(), Some(out.as_str()));
    }
    if cfg.validate().is_ok() && cfg.endpoint.is_none() {
        let _ = cfg.build_cloud();
    }
});
