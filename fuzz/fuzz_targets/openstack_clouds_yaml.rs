//! The `clouds.yaml` the openstack provider reads with `use-clouds = true`, merged into the
//! cloud.conf as `OpenStackConfig::from_cloud_config` does. Property: no error and no debug
//! output shows its `password` or `application_credential_secret`.
#![no_main]
use std::path::PathBuf;

use ccm_cloud::CloudConfig;
use ccm_provider_openstack::OpenStackConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = std::env::temp_dir().join(format!("ccm-fuzz-clouds-{}.yaml", std::process::id()));
    if std::fs::write(&path, data).is_err() {
        return;
    }
    let conf = format!(
        "[Global]\nuse-clouds = true\nclouds-file = {}\ncloud = fuzz\n",
        path.display()
    );
    let cfg = CloudConfig {
        path: PathBuf::from("/etc/kubernetes/cloud.conf"),
        contents: conf,
    };
    let shown = match OpenStackConfig::from_cloud_config(Some(&cfg)) {
        Ok(parsed) => format!("{parsed:?}"),
        Err(e) => e.to_string(),
    };
    for secret in ccm_fuzz::values_of_yaml(text, &["password", "application_credential_secret"]) {
        ccm_fuzz::assert_hidden(&shown, secret);
    }
});
