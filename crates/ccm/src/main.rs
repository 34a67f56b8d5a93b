//! `ccm`: the ccm-rs binary.
//!
//! `ccm [flags]` and `ccm run [flags]` run the cloud-controller-manager with upstream flags;
//! `ccm demo` runs a whole simulated cluster in one process; `ccm kube-sim` serves the
//! in-memory API server for kubectl.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod cluster;
mod demo;
mod logging;
mod manifests;
mod plot;

/// ccm-rs: a Kubernetes cloud-controller-manager, event-driven and batched.
#[derive(Debug, Parser)]
#[command(
    name = "ccm",
    version,
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
    Bench(bench::BenchOptions),
    /// Serve the in-memory Kubernetes API server until Ctrl-C (for kubectl and tests).
    KubeSim(ccm_kube_sim::CliOptions),
    /// Print the manifests that deploy ccm-rs (the Helm chart's objects): ServiceAccounts,
    /// RBAC exactly as used, and a Deployment + PodDisruptionBudget, a DaemonSet or a static Pod.
    Manifests(manifests::ManifestOptions),
}

/// Providers compiled into this binary.
fn providers() -> ccm_cloud::ProviderRegistry {
    let mut registry = ccm_cloud::ProviderRegistry::new();
    // Invariant: a fresh registry has no "sim" yet, so registering cannot collide.
    ccm_provider_sim::register(&mut registry).expect("fresh registry");
    registry
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Some(Command::Run(opts)) => run(*opts).await,
            None => run(cli.run).await,
            Some(Command::Demo(opts)) => {
                logging::quiet();
                demo::run(opts).await
            }
            Some(Command::Bench(opts)) => {
                logging::quiet();
                bench::run(opts).await
            }
            Some(Command::Manifests(opts)) => manifests::run(&opts).map(|()| ExitCode::SUCCESS),
            Some(Command::KubeSim(opts)) => {
                logging::init(2, ccm_manager::options::LogFormat::Text);
                ccm_kube_sim::serve_cli(opts)
                    .await
                    .map(|()| ExitCode::SUCCESS)
            }
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(opts: ccm_manager::options::RunOptions) -> anyhow::Result<ExitCode> {
    logging::init(opts.verbosity, opts.log_format);
    let validated = opts.validate()?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    spawn_signal_handler(shutdown.clone());
    let rt = ccm_manager::run::Runtime::default();
    let exit = ccm_manager::run::run(validated, &providers(), &rt, shutdown).await?;
    Ok(match exit {
        ccm_manager::run::Exit::Shutdown => ExitCode::SUCCESS,
        ccm_manager::run::Exit::LeaderLost => ExitCode::from(1),
    })
}

/// Cancels `token` on SIGTERM or Ctrl-C.
fn spawn_signal_handler(token: tokio_util::sync::CancellationToken) {
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let mut term = match signal(SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for SIGTERM");
                    let _ = tokio::signal::ctrl_c().await;
                    token.cancel();
                    return;
                }
            };
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
                _ = tokio::signal::ctrl_c() => tracing::info!("interrupted: shutting down"),
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        token.cancel();
    });
}
