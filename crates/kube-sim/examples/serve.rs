//! Runs the simulator standalone (what `ccm kube-sim` does): `cargo run -p ccm-kube-sim --example serve -- --kubeconfig-out /tmp/kc`.

use clap::Parser;

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    opts: ccm_kube_sim::CliOptions,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    ccm_kube_sim::serve_cli(Args::parse().opts).await
}
