//! `ccm`: the ccm-rs binary.
//!
//! `ccm [flags]` and `ccm run [flags]` run the cloud-controller-manager with upstream flags;
//! `ccm demo` runs a whole simulated cluster in one process; `ccm kube-sim` serves the
//! in-memory API server for kubectl.

use std::process::ExitCode;

use ccm_manager::logging;
use clap::{Parser, Subcommand};

mod bench;
mod breakage;
mod cluster;
mod conformance;
mod demo;
mod doctor;
mod manifests;
mod plot;
mod providers;
mod token_probe;

/// ccm-rs: a Kubernetes cloud-controller-manager, event-driven and batched.
#[derive(Debug, Parser)]
#[command(
    name = "ccm",
    disable_version_flag = true,
    args_conflicts_with_subcommands = true,
    about = "ccm-rs: a Kubernetes cloud-controller-manager, event-driven and batched",
    long_about = "ccm-rs: a Kubernetes cloud-controller-manager, event-driven and batched.\n\nWith flags and no subcommand, `ccm` behaves like `ccm run`, so manifests written for an upstream cloud-controller-manager work unchanged."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: ccm_manager::options::RunOptions,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the cloud-controller-manager (the default).
    Run(Box<ccm_manager::options::RunOptions>),
    /// A whole simulated cluster in one process: API server, cloud, kubelets and the CCM.
    Demo(demo::DemoOptions),
    /// Scale benchmark: the CCM under test runs as a child process against kube-sim and the
    /// sim cloud; prints a table, optionally JSON and SVG charts.
    Bench(Box<bench::BenchOptions>),
    /// Serve the in-memory Kubernetes API server until Ctrl-C (for kubectl and tests).
    KubeSim(ccm_kube_sim::CliOptions),
    /// Print the manifests that deploy ccm-rs (the Helm chart's objects): ServiceAccounts,
    /// RBAC exactly as used, and a Deployment + PodDisruptionBudget, a DaemonSet or a static Pod.
    Manifests(manifests::ManifestOptions),
    /// Check a cluster's cloud integration, read-only (also `kubectl ccm doctor`).
    ///
    /// Uninitialized nodes, the CCM's pods and leader election, kube-controller-manager and
    /// kubelet flags, LoadBalancer Services, route syncs. Exit status 0 all ok, 1 warnings,
    /// 2 failures.
    Doctor(doctor::DoctorOptions),
    /// Check a cloud provider against every rule of the provider traits (read-only unless
    /// --destructive); JUnit XML and JSON reports. Exit status 0 all rules hold, 1 a rule broken.
    Conformance(conformance::ConformanceOptions),
}

/// Installed as `kubectl-ccm` (a link to `ccm`), the binary is a kubectl plugin:
/// `kubectl ccm doctor` runs `kubectl-ccm doctor`, which behaves as `ccm doctor`.
fn parse_cli() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let plugin = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("kubectl-ccm"));
    let mut cmd = Cli::command();
    if plugin {
        cmd = cmd.bin_name("kubectl ccm");
    }
    let matches = cmd.get_matches_from(args);
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

fn main() -> ExitCode {
    let cli = parse_cli();
    if matches!(cli.command, None | Some(Command::Run(_))) {
        ccm_manager::app::use_one_malloc_arena();
        ccm_manager::app::exit_on_panic();
    }
    ccm_manager::app::block_on(async move {
        match cli.command {
            Some(Command::Run(opts)) => ccm_manager::app::run(*opts, &providers::providers()).await,
            None => ccm_manager::app::run(cli.run, &providers::providers()).await,
            Some(Command::Demo(opts)) => {
                logging::quiet();
                demo::run(opts).await
            }
            Some(Command::Bench(opts)) => {
                logging::quiet();
                bench::run(*opts).await
            }
            Some(Command::Manifests(opts)) => manifests::run(&opts).map(|()| ExitCode::SUCCESS),
            Some(Command::Doctor(opts)) => {
                logging::quiet();
                doctor::run(opts).await
            }
            Some(Command::Conformance(opts)) => {
                logging::quiet();
                conformance::run(opts).await
            }
            Some(Command::KubeSim(opts)) => {
                logging::init(2, ccm_manager::options::LogFormat::Text);
                ccm_kube_sim::serve_cli(opts)
                    .await
                    .map(|()| ExitCode::SUCCESS)
            }
        }
    })
}
