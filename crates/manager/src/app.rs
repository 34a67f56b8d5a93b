//! The library entrypoint for a cloud-controller-manager binary, as upstream's
//! `app.NewCloudControllerManagerCommand`: a provider author builds a [`ProviderRegistry`] and
//! hands it to [`main`]; flags, logging, signals, serving, leader election, the controllers and
//! exit codes are the same as the `ccm` binary's.
//!
//! ```no_run
//! fn main() -> std::process::ExitCode {
//!     let mut providers = ccm_cloud::ProviderRegistry::new();
//!     // providers.register("mycloud", |config| Ok(std::sync::Arc::new(MyCloud::new(config)?)))?;
//!     ccm_manager::app::main(providers)
//! }
//! ```

use std::process::ExitCode;

use ccm_cloud::ProviderRegistry;
use clap::Parser;
use tokio_util::sync::CancellationToken;

use crate::options::RunOptions;
use crate::run::{Exit, Runtime};

/// The command line of a provider binary: upstream's flags, nothing else.
#[derive(Debug, Parser)]
#[command(
    about = "A Kubernetes cloud-controller-manager built on ccm-rs",
    long_about = "The Cloud controller manager is a daemon that embeds the cloud specific control loops shipped with Kubernetes (built on ccm-rs).",
    disable_version_flag = true
)]
pub struct Command {
    /// The options.
    #[command(flatten)]
    pub options: RunOptions,
}

/// Parses the process arguments and runs until SIGTERM (exit 0), lost leadership (exit 1) or a
/// startup error (exit 1, the error on stderr). Bad flags exit 2 with clap's message.
pub fn main(providers: ProviderRegistry) -> ExitCode {
    let cmd = Command::parse();
    block_on(run(cmd.options, &providers))
}

/// Runs `fut` on a fresh multi-threaded runtime, turning errors into exit code 1.
pub fn block_on(fut: impl std::future::Future<Output = anyhow::Result<ExitCode>>) -> ExitCode {
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
    match runtime.block_on(fut) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// What `ccm run` does with parsed options: `--version`, logging, validation, signals, then
/// [`crate::run::run`].
pub async fn run(opts: RunOptions, providers: &ProviderRegistry) -> anyhow::Result<ExitCode> {
    if let Some(v) = opts.version.as_deref()
        && v != "false"
    {
        println!("{}", version_line(v == "raw"));
        return Ok(ExitCode::SUCCESS);
    }
    crate::logging::init(opts.verbosity, opts.log_format);
    let validated = opts.validate()?;
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone());
    let rt = Runtime::default();
    let exit = crate::run::run(validated, providers, &rt, shutdown).await?;
    Ok(match exit {
        Exit::Shutdown => ExitCode::SUCCESS,
        Exit::LeaderLost => ExitCode::from(1),
    })
}

fn version_line(raw: bool) -> String {
    let v = env!("CARGO_PKG_VERSION");
    if raw {
        format!(
            "ccm-rs {v} (cloud-controller-manager for Kubernetes 1.36; {} {})",
            std::env::consts::OS,
            std::env::consts::ARCH
        )
    } else {
        format!("ccm-rs v{v}")
    }
}

/// Cancels `token` on SIGTERM or Ctrl-C.
pub fn spawn_signal_handler(token: CancellationToken) {
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
