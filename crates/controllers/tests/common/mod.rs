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
