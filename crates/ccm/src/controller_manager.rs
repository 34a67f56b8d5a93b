//! `ccm-controller-manager`: the cloud-controller-manager and nothing else — the binary the
//! container image runs (as `/usr/local/bin/ccm`).
//!
//! It is `ccm run` (and `ccm [flags]`) without the tools of the `ccm` binary: kube-sim, the
//! bench, the demo, doctor and the manifests are not linked in, so the process maps only the
//! controller manager's code. Code pages count in a process's resident set; with the tools
//! linked in they were about half of a 1,000-node CCM's peak RSS (docs/BENCHMARKS.md).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod providers;

/// jemalloc instead of glibc's malloc: a third of the CCM's CPU in a node burst was glibc's
/// malloc and free, and its heap fragments as the caches grow. With jemalloc a burst costs
/// 13–19 % less CPU, and 10,000 to 50,000 Nodes peak 5–8 % lower (docs/BENCHMARKS.md, "The
/// allocator"). Its settings (one arena; freed pages returned after a second by jemalloc's
/// background thread, so an idle CCM gives back what its last refresh freed) are built in
/// from .cargo/config.toml, and `_RJEM_MALLOC_CONF` overrides them at run time.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The cloud-controller-manager of ccm-rs, with upstream's flags.
#[derive(Debug, Parser)]
#[command(
    name = "ccm",
    disable_version_flag = true,
    args_conflicts_with_subcommands = true,
    about = "ccm-rs: a Kubernetes cloud-controller-manager, event-driven and batched",
    long_about = "ccm-rs: a Kubernetes cloud-controller-manager, event-driven and batched.\n\nThe controller manager alone (the image's binary): `ccm [flags]` and `ccm run [flags]` behave alike, so manifests written for an upstream cloud-controller-manager work unchanged. The tools (demo, bench, kube-sim, doctor, manifests) are in the full `ccm` binary."
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
}

fn main() -> ExitCode {
    ccm_manager::app::use_one_malloc_arena();
    ccm_manager::app::exit_on_panic();
    let cli = Cli::parse();
    let opts = match cli.command {
        Some(Command::Run(opts)) => *opts,
        None => cli.run,
    };
    ccm_manager::app::block_on(ccm_manager::app::run(opts, &providers::providers()))
}
