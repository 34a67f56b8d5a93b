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
/// startup error (exit 1, the error on stderr). Bad flags exit 2 with clap's message, and so
/// does a panic ([`exit_on_panic`]).
pub fn main(providers: ProviderRegistry) -> ExitCode {
    use_one_malloc_arena();
    exit_on_panic();
    let cmd = Command::parse();
    block_on(run(cmd.options, &providers))
}

/// glibc reads its malloc settings from this variable, once, at process start.
pub const GLIBC_TUNABLES: &str = "GLIBC_TUNABLES";

/// One malloc arena for the whole process (glibc's default is up to 8 per core).
pub const ONE_MALLOC_ARENA: &str = "glibc.malloc.arena_max=1";

/// Makes this process run with one glibc malloc arena, by re-executing itself once with
/// `GLIBC_TUNABLES=glibc.malloc.arena_max=1` (same pid, arguments and argv\[0\]). Call it first
/// thing in `main` of a long-running CCM.
///
/// Why: with an arena per thread, an idle CCM's periodic work (the address refresh, re-lists)
/// lands in whichever arena its worker thread holds, and each arena keeps the free memory it
/// once held: RSS rose 6 MB in 5 idle minutes with 15 address refreshes while the live heap
/// stayed at 12.4 MB (heaptrack). With one arena it stayed flat (+0.1 MB), and the 1,000-node
/// burst peaked no higher (docs/BENCHMARKS.md). A binary with its own global allocator
/// (`ccm-controller-manager` uses jemalloc) keeps glibc's malloc for what C code allocates, and
/// this then bounds only that. glibc takes the setting only from
/// the environment at start-up, hence the re-exec; an operator's own `GLIBC_TUNABLES` is left
/// as it is (add `glibc.malloc.arena_max=1` to it to keep this). Does nothing on other libcs.
pub fn use_one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::os::unix::process::CommandExt as _;
        if std::env::var_os(GLIBC_TUNABLES).is_some() {
            return;
        }
        let Ok(exe) = std::env::current_exe() else {
            return;
        };
        let mut args = std::env::args_os();
        let argv0 = args.next().unwrap_or_else(|| exe.clone().into_os_string());
        let err = std::process::Command::new(&exe)
            .arg0(argv0)
            .args(args)
            .env(GLIBC_TUNABLES, ONE_MALLOC_ARENA)
            .exec();
        // Only reached when exec failed (e.g. the binary was replaced on disk): run as is.
        eprintln!(
            "warning: could not restart with {GLIBC_TUNABLES}={ONE_MALLOC_ARENA} ({err}); running with glibc's default malloc arenas"
        );
    }
}

/// Exit code of a process ended by a panic: what a Go program's unrecovered panic exits with.
pub const PANIC_EXIT_CODE: i32 = 2;

/// Makes a panic anywhere, on any task or thread, end the process (exit 2, after the usual
/// panic message). Call it first thing in `main` of a long-running CCM.
///
/// Why: Tokio catches a panic in a spawned task and only the task ends, so a controller whose
/// worker panicked would stop reconciling while the process looked healthy. Upstream's Go CCM
/// crashes on a panic and the kubelet restarts it; the image's `dist` build (panic = abort)
/// does the same, and this gives every other build that behaviour.
pub fn exit_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        std::process::exit(PANIC_EXIT_CODE);
    }));
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

#[cfg(test)]
mod panic_tests {
    use super::*;

    const CHILD: &str = "CCM_TEST_PANIC_CHILD";

    #[test]
    fn a_panicking_task_ends_the_process() {
        if std::env::var_os(CHILD).is_some() {
            exit_on_panic();
            let rt = tokio::runtime::Runtime::new().expect("runtime");
            rt.block_on(async {
                drop(tokio::spawn(async { panic!("a controller bug") }));
                tokio::time::sleep(std::time::Duration::from_secs(20)).await;
            });
            return;
        }
        let exe = std::env::current_exe().expect("test binary");
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "--nocapture",
                "app::panic_tests::a_panicking_task_ends_the_process",
            ])
            .env(CHILD, "1")
            .output()
            .expect("child runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(PANIC_EXIT_CODE), "{stderr}");
        assert!(stderr.contains("a controller bug"), "{stderr}");
    }
}
