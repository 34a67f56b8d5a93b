//! The aws provider's `--cloud-config` as `AwsConfig::from_cloud_config` reads it: upstream's
//! gcfg INI (`[Global]`, `[ServiceOverride "n"]`) or ccm-rs's TOML, then checked.
#![no_main]
use std::path::PathBuf;

use ccm_cloud::CloudConfig;
use ccm_fuzz::config::AwsConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let cfg = CloudConfig {
        path: PathBuf::from("/etc/kubernetes/cloud.conf"),
        contents: text.to_string(),
    };
    match AwsConfig::from_cloud_config(Some(&cfg)) {
        Ok(parsed) => {
            let _ = parsed.not_honoured();
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
