//! Token buckets: the client-side limit in front of a provider, and the throttling model of the
//! simulated cloud.
//!
//! The bucket itself is a pure value advanced by explicit instants, so its guarantee (never more
//! than `burst + qps·t` grants in any window of length `t`) is property-tested without sleeping.

use std::time::Duration;

use tokio::time::Instant;

/// A token bucket holding at most `burst` tokens, refilled at `qps` tokens per second.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket. `qps <= 0` means the bucket never refills; `burst` is at least 1.
    pub fn new(qps: f64, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            qps: qps.max(0.0),
            burst,
            tokens: burst,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        if now > self.last {
            let elapsed = now.duration_since(self.last).as_secs_f64();
            self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
            self.last = now;
        }
    }

    /// Takes a token if one is available at `now`.
    pub fn try_take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Reserves a token, possibly in the future: returns how long the caller must wait before
    /// using it. Reservations queue fairly, like client-go's `Wait`.
    pub fn reserve(&mut self, now: Instant) -> Duration {
        self.refill(now);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else if self.qps > 0.0 {
            Duration::from_secs_f64(-self.tokens / self.qps)
        } else {
            // A bucket that never refills: the best honest answer is "a very long time".
            Duration::from_secs(3600)
        }
    }
}

/// An async rate limiter shared by every caller of one provider.
#[derive(Debug)]
pub struct RateLimiter {
    bucket: parking_lot::Mutex<TokenBucket>,
}

impl RateLimiter {
    /// A limiter granting `qps` calls per second with bursts of `burst`.
    pub fn new(qps: f64, burst: u32) -> Self {
        RateLimiter {
            bucket: parking_lot::Mutex::new(TokenBucket::new(qps, burst, Instant::now())),
        }
    }

    /// Waits for a token and returns how long it waited.
    pub async fn acquire(&self) -> Duration {
        let wait = self.bucket.lock().reserve(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// In any window of length t, a bucket grants at most burst + qps·t tokens.
        #[test]
        fn never_more_than_burst_plus_rate(
            qps in 0.5f64..200.0,
            burst in 1u32..50,
            gaps_ms in proptest::collection::vec(0u64..200, 1..400),
        ) {
            let start = Instant::now();
            let mut bucket = TokenBucket::new(qps, burst, start);
            let mut now = start;
            let mut grants = Vec::new();
            for gap in gaps_ms {
                now += Duration::from_millis(gap);
                if bucket.try_take(now) {
                    grants.push(now);
                }
            }
            for (i, first) in grants.iter().enumerate() {
                for (j, last) in grants.iter().enumerate().skip(i) {
                    let t = last.duration_since(*first).as_secs_f64();
                    let n = (j - i + 1) as f64;
                    prop_assert!(n <= f64::from(burst) + qps * t + 1e-6,
                        "{} grants in {}s with qps {} burst {}", n, t, qps, burst);
                }
            }
        }
    }

    #[test]
    fn reserve_spaces_callers_by_rate() {
        let now = Instant::now();
        let mut b = TokenBucket::new(10.0, 2, now);
        assert_eq!(b.reserve(now), Duration::ZERO);
        assert_eq!(b.reserve(now), Duration::ZERO);
        let third = b.reserve(now);
        let fourth = b.reserve(now);
        assert!((third.as_secs_f64() - 0.1).abs() < 1e-9);
        assert!((fourth.as_secs_f64() - 0.2).abs() < 1e-9);
    }
}
