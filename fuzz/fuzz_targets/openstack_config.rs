//! The openstack provider's `--cloud-config` (upstream's INI `cloud.conf`), as
//! `OpenStackConfig::from_cloud_config` reads and checks it. Property: no error and no debug
//! output shows a credential of the input (`password`, `trustee-password`,
//! `application-credential-secret`). `use-clouds` is left out here: `openstack_clouds_yaml`
//! fuzzes the clouds.yaml it reads.
#![no_main]
use std::path::PathBuf;

use ccm_cloud::CloudConfig;
use ccm_provider_openstack::OpenStackConfig;
use libfuzzer_sys::fuzz_target;

const SECRET_KEYS: [&str; 3] = [
    "password",
    "trustee-password",
    "application-credential-secret",
];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if text.to_ascii_lowercase().contains("use-clouds") {
        return;
    }
    let cfg = CloudConfig {
        path: PathBuf::from("/etc/kubernetes/cloud.conf"),
        contents: text.to_string(),
    };
    let shown = match OpenStackConfig::from_cloud_config(Some(&cfg)) {
        Ok(parsed) => format!("{parsed:?}"),
        Err(e) => e.to_string(),
    };
    for key in SECRET_KEYS {
        for secret in ccm_fuzz::values_of(text, key) {
            ccm_fuzz::assert_hidden(&shown, secret);
        }
    }
});
