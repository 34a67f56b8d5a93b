//! The controller manager runs with one glibc malloc arena (`GLIBC_TUNABLES`, set by
//! re-executing itself at start-up): with an arena per thread, an idle CCM's RSS grew with
//! every periodic refresh while its heap stayed flat (docs/BENCHMARKS.md).

#![cfg(all(target_os = "linux", target_env = "gnu"))]

use std::time::{Duration, Instant};

use ccm_kube_sim::{Config, KubeSim};

mod support;
use support::{ccm_command, tmpdir};

/// The inode of the socket listening on 127.0.0.1:`port`, from the process's view of the
/// network namespace's TCP table (`/proc/<pid>/net/tcp`, state 0A = LISTEN).
fn listening_inode(pid: u32, port: u16) -> Option<String> {
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).ok()?;
    let local = format!("0100007F:{port:04X}");
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.get(1) == Some(&local.as_str()) && f.get(3) == Some(&"0A"))
            .then(|| f.get(9).map(|s| s.to_string()))
            .flatten()
    })
}

/// Whether process `pid` itself holds the socket listening on `port`. A successful connect
/// alone proves nothing: the port was free when picked and another test's server may have
/// taken it since, and the CCM may still be about to re-execute itself.
fn serves(pid: u32, port: u16) -> bool {
    let Some(inode) = listening_inode(pid, port) else {
        return false;
    };
    let want = format!("socket:[{inode}]");
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy() == want))
}

/// `GLIBC_TUNABLES` of the running CCM started with `preset` in its environment, read from
/// /proc once the process itself listens on its secure port (it re-executes before that). A
/// CCM that exits first (its port taken in between) is started again on another port.
async fn tunables_of_running_ccm(preset: Option<&str>) -> Option<String> {
    let kube = KubeSim::start(Config::default()).await.expect("kube-sim");
    for _attempt in 0..5 {
        let dir = tmpdir("allocator");
        let (mut cmd, port) =
            ccm_command(env!("CARGO_BIN_EXE_ccm-controller-manager"), &kube, &dir);
        cmd.arg(format!("--cert-dir={}", dir.join("certs").display()))
            .env_remove("GLIBC_TUNABLES");
        if let Some(v) = preset {
            cmd.env("GLIBC_TUNABLES", v);
        }
        let mut child = cmd.spawn().expect("spawn");
        let pid = child.id().expect("pid");
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut exited = false;
        while !serves(pid, port) {
            if child.try_wait().expect("wait").is_some() {
                exited = true;
                break;
            }
            assert!(Instant::now() < deadline, "the CCM never served its port");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if exited {
            let _ = std::fs::remove_dir_all(&dir);
            continue;
        }
        // Same pid: the process replaced itself, it did not fork a second one.
        let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("environ of the CCM");
        let _ = child.kill().await;
        let _ = std::fs::remove_dir_all(&dir);
        return environ
            .split(|b| *b == 0)
            .filter_map(|kv| std::str::from_utf8(kv).ok())
            .find_map(|kv| kv.strip_prefix("GLIBC_TUNABLES="))
            .map(String::from);
    }
    panic!("the CCM exited before serving, five times over");
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
