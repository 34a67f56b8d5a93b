//! Helpers shared by the controller integration tests.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// Generous: the machines are shared and noisy; waits end as soon as the condition holds.
pub const TIMEOUT: Duration = Duration::from_secs(90);

/// Polls `cond` every 20 ms until it holds; fails the test naming `what` after [`TIMEOUT`].
pub async fn wait_for<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if cond().await {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A controller running in the test's runtime, with the registry its metrics went into.
pub struct Running<H> {
    /// The controller's probe.
    pub handle: H,
    /// Stops the controller.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// The controller's task.
    pub task: tokio::task::JoinHandle<()>,
    /// Where the controller registered its metrics.
    pub registry: prometheus_client::registry::Registry,
}

impl<H> Running<H> {
    /// Stops the controller and waits for it to finish.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.expect("controller task");
    }

    /// The controller's metrics in the exposition format.
    pub fn metrics_text(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("encode");
        out
    }
}
