//! Helpers shared by the tests that start CCM processes.

use std::path::PathBuf;

/// A fresh directory under the system temp dir, unique per process and call.
pub fn tmpdir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "ccm-{tag}-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    dir
}

/// A loopback port nobody listens on right now, for a CCM's `--secure-port`.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}
