//! Logging: klog-style `-v` levels mapped to tracing levels, text or JSON lines on stderr.

use crate::options::LogFormat;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. `RUST_LOG`, when set, overrides `-v`.
pub fn init(verbosity: u8, format: LogFormat) {
    let level = match verbosity {
        0 => "warn",
        1..=2 => "info",
        3..=4 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(format!(
            "{level},hyper=warn,kube_client=warn,tower=warn,rustls=warn"
        ))
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Errors only, for commands that draw their own progress output (demo, bench): the clients
/// they use to play kubelets and users log reconnects that mean nothing to the reader.
pub fn quiet() {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("error,kube_client=off,kube_runtime=off"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
