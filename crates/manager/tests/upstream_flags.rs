//! An upstream manifest's flags start ccm-rs: every flag of upstream's cloud-controller-manager
//! (the table in docs/upstream-flags.md) parses, and every flag ccm-rs does not act on says so.

use ccm_manager::options::RunOptions;
use clap::Parser;

#[derive(Debug, Parser)]
struct Cmd {
    #[command(flatten)]
    options: RunOptions,
}

struct Row {
    flag: String,
    status: String,
    example: String,
}

fn rows() -> Vec<Row> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/upstream-flags.md");
    let text = std::fs::read_to_string(path).expect("docs/upstream-flags.md");
    let mut out = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("| `--")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // ["", flag, section, default, ccm-rs, example, ""]
        assert_eq!(cells.len(), 7, "malformed row: {line}");
        let flag = cells[1]
            .split('`')
            .nth(1)
            .expect("flag in backticks")
            .to_string();
        let example = cells[5].trim_matches('`').to_string();
        out.push(Row {
            flag,
            status: cells[4].to_string(),
            example,
        });
    }
    out
}

fn parse(args: &[&str]) -> Result<RunOptions, clap::Error> {
    let mut argv = vec!["cloud-controller-manager"];
    argv.extend_from_slice(args);
    Cmd::try_parse_from(argv).map(|c| c.options)
}

#[test]
fn the_table_covers_upstreams_sections() {
    let rows = rows();
    assert!(rows.len() >= 80, "only {} flags listed", rows.len());
    for must in [
        "--authentication-kubeconfig",
        "--authorization-kubeconfig",
        "--authorization-always-allow-paths",
        "--webhook-secure-port",
        "--enable-leader-migration",
        "--cert-dir",
        "--concurrent-node-status-updates",
    ] {
        assert!(rows.iter().any(|r| r.flag == must), "{must} missing");
    }
}

#[test]
fn every_upstream_flag_parses() {
    for row in rows() {
        if row.flag == "--help" {
            let err = parse(&["--help"]).expect_err("--help prints help");
            assert_eq!(err.kind(), clap::error::ErrorKind::DisplayHelp);
            continue;
        }
        let parsed = parse(&[&row.example]);
        assert!(
            parsed.is_ok(),
            "{} ({}) rejected: {}",
            row.flag,
            row.example,
            parsed.err().map(|e| e.to_string()).unwrap_or_default()
        );
    }
}

#[test]
fn every_flag_without_effect_prints_a_notice() {
    for row in rows().iter().filter(|r| r.status.starts_with("no effect")) {
        if row.flag == "--profiling" {
            continue; // on by default upstream; the notice would greet every operator
        }
        let o = parse(&[&row.example]).expect("parses");
        let notices = o.notices();
        let key = if row.flag.starts_with("--requestheader-") {
            "--requestheader-*"
        } else {
            row.flag.as_str()
        };
        assert!(
            notices
                .iter()
                .any(|n| n.starts_with(key) && n.contains("no effect")),
            "{}: no startup notice in {notices:?}",
            row.flag
        );
    }
}

#[test]
fn an_upstream_manifest_starts_unchanged() {
    // The argument list of a typical upstream CCM DaemonSet (kOps/kubeadm style).
    let o = parse(&[
        "--cloud-provider=sim",
        "--authentication-kubeconfig=/etc/kubernetes/cloud-controller-manager.conf",
        "--authorization-kubeconfig=/etc/kubernetes/cloud-controller-manager.conf",
        "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
        "--bind-address=127.0.0.1",
        "--secure-port=10258",
        "--cert-dir=/var/run/kubernetes",
        "--webhook-secure-port=0",
        "--enable-leader-migration",
        "--leader-elect=true",
        "--use-service-account-credentials=true",
        "--configure-cloud-routes=false",
        "--cluster-name=kubernetes",
        "--kubeconfig=/etc/kubernetes/cloud-controller-manager.conf",
        "--profiling=false",
        "--v=2",
    ])
    .expect("parses");
    let v = o.validate().expect("validates");
    assert_eq!(v.options.serving.secure_port, 10258);
    assert_eq!(
        v.options.authz.authorization_always_allow_paths,
        ["/healthz", "/readyz", "/livez", "/metrics"]
    );
    // Leader migration with upstream's default configuration.
    let m = v.leader_migration.as_ref().expect("leader migration on");
    assert_eq!(m.leader_name, "cloud-provider-extraction-migration");
}

#[test]
fn webhook_names_are_rejected_as_upstream() {
    // Names are checked against the provider at startup (tests/webhook.rs); what no provider
    // could offer is refused here already.
    let o = parse(&["--cloud-provider=sim", "--webhooks=Foo_Bar"]).expect("parses");
    let err = o.validate().expect_err("not a webhook name");
    assert!(err.to_string().contains("--webhooks: \"Foo_Bar\""), "{err}");
    let o = parse(&["--cloud-provider=sim", "--webhook-secure-port=10258"]).expect("parses");
    let err = o.validate().expect_err("same port");
    assert!(err.to_string().contains("--webhook-secure-port"), "{err}");
}
