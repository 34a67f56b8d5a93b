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
    ccm_kube_sim::ports::free_loopback_ports(1).expect("free port")
}

/// A CCM binary (`CARGO_BIN_EXE_…`) set up to run against `kube` on a free secure port with
/// the sim cloud, no route controller and no leader election, output discarded, killed on
/// drop; its kubeconfig is written into `dir`. Returns the command and its port.
pub fn ccm_command(
    bin: &str,
    kube: &ccm_kube_sim::KubeSim,
    dir: &std::path::Path,
) -> (tokio::process::Command, u16) {
    let kubeconfig = dir.join("kubeconfig");
    kube.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let port = free_port();
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args([
        "--cloud-provider=sim",
        "--controllers=-route",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
    ])
    .arg(format!("--secure-port={port}"))
    .arg(format!("--kubeconfig={}", kubeconfig.display()))
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .kill_on_drop(true);
    (cmd, port)
}
