//! `--kubeconfig` (and the delegated-auth kubeconfigs) as the manager loads them:
//! `client::load_config` reads the file and builds the client config.
#![no_main]
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tokio::runtime::Runtime;

fn runtime() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| Runtime::new().expect("tokio runtime"))
}

fuzz_target!(|data: &[u8]| {
    let path = std::env::temp_dir().join(format!("ccm-fuzz-kubeconfig-{}", std::process::id()));
    if std::fs::write(&path, data).is_err() {
        return;
    }
    let text = String::from_utf8_lossy(data);
    let result = runtime().block_on(ccm_manager::client::load_config(Some(path.as_path()), None));
    if let Err(e) = result {
        let msg = format!("{e:#}");
        for secret in ccm_fuzz::values_of_yaml(&text, &["token", "password", "client-key-data"]) {
            ccm_fuzz::assert_hidden(&msg, secret);
        }
    }
});
