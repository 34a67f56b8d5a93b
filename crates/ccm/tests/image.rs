//! The container image recipe (deploy/image) builds with Debian's buildah in this sandbox
//! (`--isolation chroot --storage-driver vfs`, no daemon) from the `ccm-controller-manager`
//! binary (the CCM without the tools) and the image runs `ccm --version` as its non-root user
//! from its own filesystem.
//!
//! Fails (never skips) when buildah is missing: `.ci/setup.d/50-deploy.sh` installs it.

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

fn find_buildah() -> Option<PathBuf> {
    ["/usr/bin/buildah", "/usr/local/bin/buildah"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

fn buildah() -> PathBuf {
    find_buildah().unwrap_or_else(|| {
        panic!("buildah not found: run .ci/test (or .ci/setup.d/50-deploy.sh) to install it")
    })
}

struct Store(PathBuf);

impl Store {
    fn cmd(&self) -> Command {
        self.cmd_with(buildah())
    }

    fn cmd_with(&self, buildah: PathBuf) -> Command {
        let mut c = Command::new(buildah);
        c.arg("--root")
            .arg(self.0.join("root"))
            .arg("--runroot")
            .arg(self.0.join("run"))
            .arg("--storage-driver")
            .arg("vfs");
        c
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.cmd().args(args).output().expect("buildah");
        assert!(
            out.status.success(),
            "buildah {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

/// Never panics: a panic here, while a failed test unwinds (buildah missing, say), would abort
/// the whole test binary instead of reporting the failure.
impl Drop for Store {
    fn drop(&mut self) {
        if let Some(b) = find_buildah() {
            let _ = self.cmd_with(b.clone()).args(["rm", "--all"]).output();
            let _ = self.cmd_with(b).args(["rmi", "--all", "--force"]).output();
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_image_builds_and_runs_ccm_version_as_non_root() {
    let tmp = std::env::temp_dir().join(format!(
        "ccm-image-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    let rootfs = tmp.join("rootfs");
    let ws = workspace();
    let prep = Command::new(ws.join("deploy/image/prepare-rootfs.sh"))
        .arg(env!("CARGO_BIN_EXE_ccm-controller-manager"))
        .arg(&rootfs)
        .output()
        .expect("prepare-rootfs.sh");
    assert!(
        prep.status.success(),
        "{}",
        String::from_utf8_lossy(&prep.stderr)
    );
    let store = Store(tmp.join("storage"));
    let containerfile = ws.join("deploy/image/Containerfile");
    store.ok(&[
        "bud",
        "--isolation",
        "chroot",
        "-f",
        containerfile.to_str().expect("path"),
        "-t",
        "localhost/ccm-rs:test",
        rootfs.to_str().expect("path"),
    ]);
    let config = store.ok(&[
        "inspect",
        "--format",
        "{{.OCIv1.Config.User}} {{.OCIv1.Config.Entrypoint}}",
        "localhost/ccm-rs:test",
    ]);
    assert_eq!(config, "65532:65532 [/usr/local/bin/ccm]");
    let ctr = store.ok(&["from", "localhost/ccm-rs:test"]);
    // Runs from the image's filesystem (chroot), as the image's user.
    let version = store.ok(&[
        "run",
        "--isolation",
        "chroot",
        &ctr,
        "--",
        "/usr/local/bin/ccm",
        "--version",
    ]);
    assert_eq!(version, format!("ccm-rs v{}", env!("CARGO_PKG_VERSION")));
    // Nothing but the binary, its libraries, CA certificates and the user database.
    let mount = PathBuf::from(store.ok(&["mount", &ctr]));
    assert!(!mount.join("bin/sh").exists(), "the image has a shell");
    assert!(mount.join("etc/ssl/certs/ca-certificates.crt").is_file());
    store.ok(&["umount", &ctr]);
    drop(store);
    let _ = std::fs::remove_dir_all(&tmp);
}
