//! The controller manager runs with one glibc malloc arena (`GLIBC_TUNABLES`, set by
//! re-executing itself at start-up): with an arena per thread, an idle CCM's RSS grew with
//! every periodic refresh while its heap stayed flat (docs/BENCHMARKS.md, issue 17).

#![cfg(all(target_os = "linux", target_env = "gnu"))]

use std::time::{Duration, Instant};

use ccm_kube_sim::{Config, KubeSim};

mod support;
use support::{ccm_command, tmpdir};

/// `GLIBC_TUNABLES` of the running CCM started with `preset` in its environment, read from
/// /proc once the process has served its secure port (it re-executes before that).
async fn tunables_of_running_ccm(preset: Option<&str>) -> Option<String> {
    let kube = KubeSim::start(Config::default()).await.expect("kube-sim");
    let dir = tmpdir("allocator");
    let (mut cmd, port) = ccm_command(env!("CARGO_BIN_EXE_ccm-controller-manager"), &kube, &dir);
    cmd.arg(format!("--cert-dir={}", dir.join("certs").display()))
        .env_remove("GLIBC_TUNABLES");
    if let Some(v) = preset {
        cmd.env("GLIBC_TUNABLES", v);
    }
    let mut child = cmd.spawn().expect("spawn");
    let pid = child.id().expect("pid");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            child.try_wait().expect("wait").is_none(),
            "the CCM exited before serving"
        );
        assert!(Instant::now() < deadline, "the CCM never served its port");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Same pid: the process replaced itself, it did not fork a second one.
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("environ of the CCM");
    let _ = child.kill().await;
    let _ = std::fs::remove_dir_all(&dir);
    environ
        .split(|b| *b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok())
        .find_map(|kv| kv.strip_prefix("GLIBC_TUNABLES="))
        .map(String::from)
}

#[tokio::test]
async fn the_ccm_runs_with_one_malloc_arena() {
    assert_eq!(
        tunables_of_running_ccm(None).await.as_deref(),
        Some("glibc.malloc.arena_max=1")
    );
}

#[tokio::test]
async fn an_operators_glibc_tunables_are_left_as_they_are() {
    let own = "glibc.malloc.trim_threshold=1048576";
    assert_eq!(
        tunables_of_running_ccm(Some(own)).await.as_deref(),
        Some(own)
    );
}
