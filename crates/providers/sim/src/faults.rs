//! Fault injection: latency, error probability, "fail the next N calls", throttling.
//!
//! Every simulated API call decides what happens to it *before* it touches the
//! cloud state, so a call that fails has, by construction, changed nothing.

use std::collections::HashMap;
use std::time::Duration;

use ccm_cloud::{CloudError, TokenBucket, op};
use rand::Rng;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// The key that applies a fault setting to every operation (`"*"`), like a wildcard in the
/// config file. An operation's own setting wins over it, except throttling, where both the global
/// and the per-operation bucket must grant a token (a cloud limits its whole API *and* each
/// action).
pub const ALL_OPS: &str = "*";

/// The simulated API operations, named as in [`ccm_cloud::op`] so the sim's call accounting and
/// the metering wrapper's `operation` label line up one to one.
pub const SIM_OPS: &[&str] = &[
    op::INSTANCE_EXISTS,
    op::INSTANCE_SHUTDOWN,
    op::INSTANCE_METADATA,
    op::INSTANCES_METADATA,
    op::INSTANCES_STATUS,
    op::GET_LOAD_BALANCER,
    op::ENSURE_LOAD_BALANCER,
    op::UPDATE_LOAD_BALANCER,
    op::ENSURE_LOAD_BALANCER_DELETED,
    op::LIST_ROUTES,
    op::CREATE_ROUTE,
    op::DELETE_ROUTE,
    op::VOLUME_TOPOLOGY,
];

/// Maps an operation name (or [`ALL_OPS`]) to its `'static` spelling, so a typo fails loudly
/// instead of configuring a fault nobody ever hits.
pub fn known_op(name: &str) -> Option<&'static str> {
    if name == ALL_OPS {
        return Some(ALL_OPS);
    }
    SIM_OPS.iter().copied().find(|o| *o == name)
}

/// How long a simulated call takes: `fixed` plus a uniform random extra in `0..=jitter`.
/// Realistic latency is what exposes controllers that serialize calls they could overlap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Latency {
    /// Always added.
    pub fixed: Duration,
    /// Upper bound of the random extra.
    pub jitter: Duration,
}

impl Latency {
    /// A latency from milliseconds, the unit the config file uses.
    pub fn from_millis(fixed_ms: u64, jitter_ms: u64) -> Self {
        Latency {
            fixed: Duration::from_millis(fixed_ms),
            jitter: Duration::from_millis(jitter_ms),
        }
    }
}

/// A cloud-side rate limit (token bucket). Calls beyond it fail with
/// [`CloudError::Throttled`] carrying AWS's `RequestLimitExceeded` code, which is how
/// controllers learn to back off.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Throttle {
    /// Sustained calls per second.
    pub qps: f64,
    /// Calls allowed at once from a full bucket.
    pub burst: u32,
}

#[derive(Debug, Default)]
struct OpFaults {
    latency: Option<Latency>,
    error_rate: Option<f64>,
    fail_next: Option<(u32, CloudError)>,
    throttle: Option<(Throttle, TokenBucket)>,
}

/// What happens to one call, decided before it runs.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Refused at once by a token bucket; takes no time, like an API gateway's 429.
    Throttled(CloudError),
    /// Takes `delay`, then either fails with the error or runs.
    Run {
        delay: Duration,
        fail: Option<CloudError>,
    },
}

/// Fault settings for every operation, plus the RNG that draws errors and jitter.
#[derive(Debug)]
pub(crate) struct Faults {
    ops: HashMap<&'static str, OpFaults>,
}

impl Faults {
    pub(crate) fn new() -> Self {
        Faults {
            ops: HashMap::new(),
        }
    }

    fn entry(&mut self, op: &'static str) -> &mut OpFaults {
        self.ops.entry(op).or_default()
    }

    pub(crate) fn set_latency(&mut self, op: &'static str, latency: Option<Latency>) {
        self.entry(op).latency = latency;
    }

    pub(crate) fn set_error_rate(&mut self, op: &'static str, rate: Option<f64>) {
        self.entry(op).error_rate = rate.map(|r| r.clamp(0.0, 1.0));
    }

    pub(crate) fn fail_next(&mut self, op: &'static str, n: u32, error: CloudError) {
        self.entry(op).fail_next = (n > 0).then_some((n, error));
    }

    pub(crate) fn set_throttle(&mut self, op: &'static str, throttle: Option<Throttle>) {
        self.entry(op).throttle =
            throttle.map(|t| (t, TokenBucket::new(t.qps, t.burst, Instant::now())));
    }

    pub(crate) fn clear(&mut self) {
        self.ops.clear();
    }

    /// Decides the fate of one call of `op`. Order: throttling (global, then per-op), then
    /// "fail next N" (per-op, then global), then the error rate, then latency. RNG draws happen
    /// in a fixed order so a seeded sim replays the same faults for the same call sequence.
    pub(crate) fn decide(&mut self, op: &'static str, rng: &mut StdRng, now: Instant) -> Decision {
        for key in [ALL_OPS, op] {
            if let Some(OpFaults {
                throttle: Some((t, bucket)),
                ..
            }) = self.ops.get_mut(key)
                && !bucket.try_take(now)
            {
                // How long until a token is back: ask a copy, so the real bucket is untouched.
                let retry_after = bucket.clone().reserve(now);
                let scope = if key == ALL_OPS { "account" } else { op };
                return Decision::Throttled(CloudError::Throttled {
                    message: format!(
                        "RequestLimitExceeded: Request limit exceeded ({scope} limit {} qps, burst {})",
                        t.qps, t.burst
                    ),
                    retry_after: Some(retry_after),
                });
            }
        }

        let mut fail = None;
        for key in [op, ALL_OPS] {
            if let Some(f) = self.ops.get_mut(key)
                && let Some((n, err)) = &mut f.fail_next
            {
                fail = Some(err.clone());
                *n -= 1;
                if *n == 0 {
                    f.fail_next = None;
                }
                break;
            }
        }

        let rate = self.setting(op, |f| f.error_rate).unwrap_or(0.0);
        if fail.is_none() && rate > 0.0 && rng.random_bool(rate) {
            fail = Some(CloudError::Transient(format!(
                "InternalError: simulated failure of {op} (error rate {rate})"
            )));
        }

        let latency = self.setting(op, |f| f.latency).unwrap_or_default();
        let mut delay = latency.fixed;
        if !latency.jitter.is_zero() {
            let nanos = u64::try_from(latency.jitter.as_nanos()).unwrap_or(u64::MAX);
            delay += Duration::from_nanos(rng.random_range(0..=nanos));
        }
        Decision::Run { delay, fail }
    }

    fn setting<T>(&self, op: &'static str, get: impl Fn(&OpFaults) -> Option<T>) -> Option<T> {
        self.ops
            .get(op)
            .and_then(&get)
            .or_else(|| self.ops.get(ALL_OPS).and_then(&get))
    }
}
