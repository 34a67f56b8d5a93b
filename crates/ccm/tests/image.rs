//! The container image recipe (`deploy/image/build.sh`, what docs/deploy.md tells operators to
//! run) builds with Debian's buildah in this sandbox (`--isolation chroot --storage-driver vfs`,
//! no daemon) from the `ccm-controller-manager` binary with every provider (`--features
//! aws,openstack`), and the image runs as its non-root user from its own filesystem: `ccm
//! --version`, and `--cloud-provider=aws` and `metal` are known providers there. The image packs
//! the binary this test's own build made (`CCM_BINARY`, a debug build): building it again in
//! the script (`cargo build -p ccm`) would compile the whole dependency tree, the AWS SDK
//! included, a second time with `-p ccm`'s feature set, and a `dist` build with the SDK does not
//! fit CI's time on 2 cores (docs/deploy.md).
//!
//! Compiled only with both provider features (`.ci/test` runs it so, beside the AWS RBAC
//! check). Fails (never skips) when buildah is missing: `.ci/setup.d/50-deploy.sh` installs it.
#![cfg(all(feature = "aws", feature = "openstack"))]

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

/// Runs the image's `ccm` with `args` in a fresh container; (exit code, stdout, stderr).
/// `buildah run --isolation chroot` now and then returns a container's output empty; every
/// command here prints something, so an empty answer is run again (at most five times).
fn run_in_image(store: &Store, args: &[&str]) -> (i32, String, String) {
    for _ in 0..5 {
        let ctr = store.ok(&["from", "localhost/ccm-rs:test"]);
        let out = store
            .cmd()
            .args([
                "run",
                "--isolation",
                "chroot",
                &ctr,
                "--",
                "/usr/local/bin/ccm",
            ])
            .args(args)
            .output()
            .expect("buildah run");
        let _ = store.cmd().args(["rm", &ctr]).output();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        );
        if !stdout.is_empty() || !stderr.trim().is_empty() {
            return (out.status.code().unwrap_or(-1), stdout, stderr);
        }
    }
    panic!("ccm {args:?} in the image printed nothing, five times");
}

#[test]
fn the_image_has_every_provider_and_runs_as_non_root() {
    let tmp = std::env::temp_dir().join(format!(
        "ccm-image-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    let ws = workspace();
    let store = Store(tmp.join("storage"));
    let buildah_cmd = format!(
        "{} --root {} --runroot {} --storage-driver vfs",
        buildah().display(),
        store.0.join("root").display(),
        store.0.join("run").display()
    );
    let build = Command::new(ws.join("deploy/image/build.sh"))
        .arg("localhost/ccm-rs:test")
        .env("CCM_BINARY", env!("CARGO_BIN_EXE_ccm-controller-manager"))
        .env("BUILDAH", buildah_cmd)
        .output()
        .expect("deploy/image/build.sh");
    assert!(
        build.status.success(),
        "{}",
        String::from_utf8_lossy(&build.stderr)
    );
    let config = store.ok(&[
        "inspect",
        "--format",
        "{{.OCIv1.Config.User}} {{.OCIv1.Config.Entrypoint}}",
        "localhost/ccm-rs:test",
    ]);
    assert_eq!(config, "65532:65532 [/usr/local/bin/ccm]");
    // Runs from the image's filesystem (chroot), as the image's user.
    let (code, version, _) = run_in_image(&store, &["--version"]);
    assert_eq!(
        (code, version),
        (0, format!("ccm-rs v{}", env!("CARGO_PKG_VERSION")))
    );
    let (code, help, err) = run_in_image(&store, &["--cloud-provider=aws", "--help"]);
    assert_eq!(code, 0, "{err}");
    assert!(help.contains("--cloud-provider"), "{help}");
    // Every provider is compiled in: past the provider lookup, the run stops at the missing
    // kubeconfig; an unknown one stops at the lookup.
    for provider in ["aws", "metal", "sim"] {
        let (code, _, err) = run_in_image(
            &store,
            &[
                &format!("--cloud-provider={provider}"),
                "--kubeconfig=/nonexistent",
            ],
        );
        assert_ne!(code, 0);
        assert!(!err.contains("unknown cloud provider"), "{provider}: {err}");
        assert!(
            err.contains("--kubeconfig /nonexistent")
                || err.contains(&format!("could not init cloud provider \"{provider}\"")),
            "{provider}: {err}"
        );
    }
    let (_, _, err) = run_in_image(
        &store,
        &["--cloud-provider=bogus", "--kubeconfig=/nonexistent"],
    );
    assert!(err.contains("unknown cloud provider \"bogus\""), "{err}");
    // Nothing but the binary, its libraries, CA certificates and the user database.
    let ctr = store.ok(&["from", "localhost/ccm-rs:test"]);
    let mount = PathBuf::from(store.ok(&["mount", &ctr]));
    assert!(!mount.join("bin/sh").exists(), "the image has a shell");
    assert!(mount.join("etc/ssl/certs/ca-certificates.crt").is_file());
    store.ok(&["umount", &ctr]);
    drop(store);
    let _ = std::fs::remove_dir_all(&tmp);
}
