//! Watch mode's storm limiter, as a pure state machine (instants in, instants out).
//!
//! A storm of node changes is coalesced by the work queue itself: changes that arrive while a
//! sync runs fold into the *next* sync, which then creates all their routes at once. Syncs
//! therefore run back to back, each batching every route that became due meanwhile, and no
//! node ever waits for a timer while the cloud answers normally.
//!
//! Only when the cloud *throttles* (a [`ccm_cloud::CloudError::Throttled`] answer in a sync)
//! are syncs spaced: the next one starts no earlier than the cloud's `retry_after` hint, and
//! then at most one per `min_sync_interval` until [`PACING_MEMORY`] passes without another
//! refusal.

use std::time::Duration;

use tokio::time::Instant;

/// How long syncs stay paced after the last throttled answer.
pub const PACING_MEMORY: Duration = Duration::from_secs(10);

/// When the next watch-mode sync may start.
#[derive(Debug, Clone)]
pub struct StormLimiter {
    min_interval: Duration,
    last_start: Option<Instant>,
    /// No sync before this (the cloud's retry-after).
    resume_at: Option<Instant>,
    /// Syncs are spaced by `min_interval` until this instant.
    paced_until: Option<Instant>,
}

impl StormLimiter {
    /// A limiter that spaces syncs by `min_interval` while the cloud throttles.
    pub fn new(min_interval: Duration) -> Self {
        StormLimiter {
            min_interval,
            last_start: None,
            resume_at: None,
            paced_until: None,
        }
    }

    /// Records that a sync starts at `now`.
    pub fn started(&mut self, now: Instant) {
        self.last_start = Some(now);
    }

    /// Records how a sync ended: `throttled` is the cloud's retry-after hint (or a default) when
    /// any call of the sync was throttled.
    pub fn ended(&mut self, now: Instant, throttled: Option<Duration>) {
        if let Some(hint) = throttled {
            let resume = now + hint;
            self.resume_at = Some(self.resume_at.map_or(resume, |r| r.max(resume)));
            self.paced_until = Some(now + PACING_MEMORY.max(hint * 2));
        }
    }

    /// The instant the next sync may start; `None`: at once.
    pub fn next_start(&self, now: Instant) -> Option<Instant> {
        let paced = self.paced_until.is_some_and(|u| u > now);
        if !paced {
            return None;
        }
        let gate = self.last_start.map(|s| s + self.min_interval);
        let at = match (gate, self.resume_at) {
            (Some(g), Some(r)) => g.max(r),
            (g, r) => g.or(r)?,
        };
        (at > now).then_some(at)
    }

    /// True while syncs are being spaced because the cloud throttled.
    pub fn is_pacing(&self, now: Instant) -> bool {
        self.paced_until.is_some_and(|u| u > now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn back_to_back_syncs_never_wait_while_the_cloud_answers() {
        let t0 = Instant::now();
        let mut l = StormLimiter::new(S);
        for i in 0..50u32 {
            let now = t0 + Duration::from_millis(100) * i;
            assert_eq!(l.next_start(now), None, "sync {i} delayed");
            l.started(now);
            l.ended(now + Duration::from_millis(100), None);
        }
    }

    #[test]
    fn a_throttled_sync_paces_the_next_ones_then_pacing_ends() {
        let t0 = Instant::now();
        let mut l = StormLimiter::new(S);
        l.started(t0);
        l.ended(
            t0 + Duration::from_millis(100),
            Some(Duration::from_secs(3)),
        );
        // The cloud asked for 3 s: nothing before.
        assert_eq!(
            l.next_start(t0 + Duration::from_millis(200)),
            Some(t0 + Duration::from_millis(3100))
        );
        // Then one sync per min interval.
        let t1 = t0 + Duration::from_millis(3100);
        l.started(t1);
        l.ended(t1 + Duration::from_millis(100), None);
        assert_eq!(l.next_start(t1 + Duration::from_millis(200)), Some(t1 + S));
        assert!(l.is_pacing(t1 + S));
        // PACING_MEMORY after the refusal, syncs run back to back again.
        let later = t0 + Duration::from_millis(100) + PACING_MEMORY;
        assert!(!l.is_pacing(later));
        assert_eq!(l.next_start(later), None);
    }

    #[test]
    fn an_earlier_hint_never_shortens_a_longer_pause() {
        let t0 = Instant::now();
        let mut l = StormLimiter::new(Duration::from_millis(10));
        l.ended(t0, Some(Duration::from_secs(5)));
        l.ended(t0, Some(Duration::from_secs(1)));
        assert_eq!(l.next_start(t0), Some(t0 + Duration::from_secs(5)));
    }
}
