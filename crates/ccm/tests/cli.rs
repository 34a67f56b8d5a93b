//! The command line as an operator meets it: help text, and errors that name the flag and the fix.

use std::process::Command;

fn ccm(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ccm"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("run ccm");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn help_lists_subcommands_and_upstream_flags() {
    let (code, out, _) = ccm(&["--help"]);
    assert_eq!(code, 0);
    insta::assert_snapshot!("help", out);
}

#[test]
fn run_help_documents_every_flag() {
    let (code, out, _) = ccm(&["run", "--help"]);
    assert_eq!(code, 0);
    for flag in [
        "--cloud-provider",
        "--cloud-config",
        "--kubeconfig",
        "--master",
        "--controllers",
        "--leader-elect",
        "--leader-elect-lease-duration",
        "--leader-elect-renew-deadline",
        "--leader-elect-retry-period",
        "--leader-elect-resource-name",
        "--leader-elect-resource-namespace",
        "--leader-elect-resource-lock",
        "--cluster-name",
        "--cluster-cidr",
        "--configure-cloud-routes",
        "--allocate-node-cidrs",
        "--route-reconciliation-period",
        "--node-monitor-period",
        "--node-status-update-frequency",
        "--concurrent-node-syncs",
        "--concurrent-service-syncs",
        "--feature-gates",
        "--kube-api-qps",
        "--kube-api-burst",
        "--bind-address",
        "--secure-port",
        "--use-service-account-credentials",
        "--v",
        "--log-format",
        "--tls-cert-file",
        "--tls-private-key-file",
    ] {
        assert!(out.contains(flag), "run --help lacks {flag}");
    }
    insta::assert_snapshot!("run_help", out);
}

#[test]
fn unknown_flag_names_the_nearest_known_one() {
    let (code, _, err) = ccm(&["--cloud-provder=sim"]);
    assert_eq!(code, 2);
    assert!(err.contains("--cloud-provder"), "{err}");
    assert!(err.contains("--cloud-provider"), "{err}");
    insta::assert_snapshot!("unknown_flag", err);
}

#[test]
fn malformed_duration_names_the_flag() {
    let (code, _, err) = ccm(&["--cloud-provider=sim", "--node-monitor-period=5"]);
    assert_eq!(code, 2);
    assert!(err.contains("--node-monitor-period"), "{err}");
    insta::assert_snapshot!("bad_duration", err);
}

#[test]
fn validation_reports_every_problem_at_once() {
    let (code, _, err) = ccm(&[
        "--allocate-node-cidrs=true",
        "--controllers=*,rout",
        "--feature-gates=CloudControllerManagerWatchBasedRoutesReconcilation=true",
        "--cluster-cidr=10.0.0.0/8,10.1.0.0/16",
        "--leader-elect-renew-deadline=20s",
    ]);
    assert_eq!(code, 1);
    for needle in [
        "--cloud-provider is required",
        "--allocate-node-cidrs=true",
        "did you mean \"route\"",
        "did you mean \"CloudControllerManagerWatchBasedRoutesReconciliation\"",
        "one IPv4 and one IPv6",
        "--leader-elect-renew-deadline (20s) must be less than --leader-elect-lease-duration (15s)",
    ] {
        assert!(err.contains(needle), "missing {needle:?} in:\n{err}");
    }
    insta::assert_snapshot!("validation", err);
}

#[test]
fn unknown_provider_suggests_a_known_one() {
    let (code, _, err) = ccm(&["--cloud-provider=smi", "--kubeconfig=/nonexistent"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("unknown cloud provider \"smi\" (did you mean \"sim\"?)"),
        "{err}"
    );
}

#[test]
fn bad_cloud_config_names_file_and_field() {
    let dir = std::env::temp_dir().join(format!("ccm-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    let cfg = dir.join("cloud.toml");
    std::fs::write(&cfg, "max_batch_size = \"lots\"\n").expect("write");
    let (code, _, err) = ccm(&[
        "--cloud-provider=sim",
        &format!("--cloud-config={}", cfg.display()),
    ]);
    assert_eq!(code, 1);
    assert!(err.contains(&cfg.display().to_string()), "{err}");
    assert!(err.contains("max_batch_size"), "{err}");
}
