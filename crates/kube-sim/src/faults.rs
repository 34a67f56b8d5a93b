//! Fault injection: what a real control plane does to clients on a bad day.
//!
//! Controllers must survive throttling (429 with Retry-After), server errors, slow responses,
//! dropped watches and expired resourceVersions; these knobs make each happen on demand, in
//! tests and from the CLI.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;

use crate::metrics::Verb;
use crate::store::Store;

#[derive(Debug, Default, Clone)]
pub(crate) struct FaultConfig {
    pub latency: Duration,
    pub rate_429: HashMap<Option<Verb>, f64>,
    pub rate_500: HashMap<Option<Verb>, f64>,
    pub retry_after: u32,
    /// (verb, resource, subresource) → how many more such requests get 409 Conflict.
    pub conflicts: HashMap<(Verb, String, String), u32>,
    /// 429s and 500s go only to clients whose User-Agent starts with this (all when `None`).
    pub client_prefix: Option<String>,
    /// Until then every request is answered 503: the server is restarting.
    pub down_until: Option<Instant>,
    /// Share of watch events after which the watch is closed instead of delivering them.
    pub watch_drop_rate: f64,
    /// API Priority and Fairness for the clients of `client_prefix`: seats and a queue.
    pub priority_level: Option<Arc<PriorityLevel>>,
}

/// One APF priority level, as kube-apiserver gives a flow schema's clients: at most `seats`
/// requests executing, up to `queue` more waiting (at most [`PriorityLevel::MAX_WAIT`]), and
/// 429 with `Retry-After` for the rest. Unlike a fixed refusal rate, the refusals follow the
/// client's own concurrency: a client that slows down is refused less.
#[derive(Debug)]
pub struct PriorityLevel {
    seats: Arc<tokio::sync::Semaphore>,
    queue: usize,
    waiting: std::sync::atomic::AtomicUsize,
}

impl PriorityLevel {
    /// How long a queued request may wait for a seat before it is refused (kube-apiserver
    /// rejects a queued request well before its 60 s timeout).
    pub const MAX_WAIT: Duration = Duration::from_secs(15);

    fn new(seats: usize, queue: usize) -> Self {
        PriorityLevel {
            seats: Arc::new(tokio::sync::Semaphore::new(seats.max(1))),
            queue,
            waiting: Default::default(),
        }
    }

    /// A seat for one request, held until it is dropped; `None`: refuse with 429.
    pub async fn admit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        use std::sync::atomic::Ordering;
        if let Ok(seat) = self.seats.clone().try_acquire_owned() {
            return Some(seat);
        }
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.queue {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        let seat = tokio::time::timeout(Self::MAX_WAIT, self.seats.clone().acquire_owned()).await;
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        seat.ok().and_then(Result::ok)
    }
}

impl FaultConfig {
    fn rate(map: &HashMap<Option<Verb>, f64>, verb: Verb) -> f64 {
        map.get(&Some(verb))
            .or_else(|| map.get(&None))
            .copied()
            .unwrap_or(0.0)
    }

    /// Decides the fate of a request of `client` (its User-Agent): `Some(429|500|503)` to
    /// fail it.
    pub fn roll(&self, verb: Verb, client: &str) -> Option<u16> {
        if self.down_until.is_some_and(|t| Instant::now() < t) {
            return Some(503);
        }
        if self
            .client_prefix
            .as_deref()
            .is_some_and(|p| !client.starts_with(p))
        {
            return None;
        }
        let p429 = Self::rate(&self.rate_429, verb);
        let p500 = Self::rate(&self.rate_500, verb);
        if p429 <= 0.0 && p500 <= 0.0 {
            return None;
        }
        let x: f64 = rand::random();
        if x < p429 {
            Some(429)
        } else if x < p429 + p500 {
            Some(500)
        } else {
            None
        }
    }
}

impl FaultConfig {
    /// The priority level `client`'s requests of `verb` are admitted by, if any: watches (long
    /// running, as in APF) and clients outside `client_prefix` go straight through.
    pub fn priority_level(&self, verb: Verb, client: &str) -> Option<Arc<PriorityLevel>> {
        let level = self.priority_level.as_ref()?;
        let outside = self
            .client_prefix
            .as_deref()
            .is_some_and(|p| !client.starts_with(p));
        (verb != Verb::Watch && !outside).then(|| level.clone())
    }

    /// Whether a watch drops this event (and closes, as kube-apiserver closes a watcher it
    /// cannot deliver to; the client resumes from the last resourceVersion it saw).
    pub fn drop_watch_event(&self) -> bool {
        self.watch_drop_rate > 0.0 && rand::random::<f64>() < self.watch_drop_rate
    }

    /// Whether this request is one of the next ones scheduled to conflict (and counts it).
    pub fn take_conflict(&mut self, verb: Verb, resource: &str, subresource: &str) -> bool {
        let key = (verb, resource.to_string(), subresource.to_string());
        match self.conflicts.get_mut(&key) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }
}

/// A handle to change faults on a running simulator.
#[derive(Clone)]
pub struct Faults {
    pub(crate) cfg: Arc<RwLock<FaultConfig>>,
    pub(crate) disconnect: Arc<tokio::sync::watch::Sender<u64>>,
    pub(crate) store: Arc<Store>,
}

impl Faults {
    /// Delays every API request (discovery and health excluded) by `d`.
    pub fn set_latency(&self, d: Duration) {
        self.cfg.write().latency = d;
    }

    /// Fails a fraction `p` (0.0–1.0) of requests of `verb` (all verbs when `None`) with 429
    /// TooManyRequests and `Retry-After`.
    pub fn set_429_rate(&self, verb: Option<Verb>, p: f64) {
        self.cfg.write().rate_429.insert(verb, p.clamp(0.0, 1.0));
    }

    /// Fails a fraction `p` of requests of `verb` (all when `None`) with 500 InternalError.
    pub fn set_500_rate(&self, verb: Option<Verb>, p: f64) {
        self.cfg.write().rate_500.insert(verb, p.clamp(0.0, 1.0));
    }

    /// Answers the next `n` requests of `verb` on `resource` (plural; `subresource` empty for
    /// the object itself) with 409 Conflict, as a write racing another writer gets — so the
    /// re-read-and-retry paths of controllers run on demand.
    pub fn conflict_next(&self, verb: Verb, resource: &str, subresource: &str, n: u32) {
        self.cfg
            .write()
            .conflicts
            .insert((verb, resource.to_string(), subresource.to_string()), n);
    }

    /// Seconds sent in `Retry-After` with injected 429s (default 1).
    pub fn set_retry_after(&self, secs: u32) {
        self.cfg.write().retry_after = secs;
    }

    /// Sends the 429s and 500s of [`Self::set_429_rate`] and [`Self::set_500_rate`] only to
    /// clients whose User-Agent starts with `prefix` (`None`: every client), so a benchmark
    /// can throttle the component under test and not the load it drives.
    pub fn set_client_prefix(&self, prefix: Option<String>) {
        self.cfg.write().client_prefix = prefix;
    }

    /// Admits the requests of the clients of [`Self::set_client_prefix`] through one APF
    /// priority level of `seats` concurrent requests and a queue of `queue` (`None`: off).
    /// Refusals are 429 with the `Retry-After` of [`Self::set_retry_after`].
    pub fn set_priority_level(&self, level: Option<(usize, usize)>) {
        self.cfg.write().priority_level =
            level.map(|(seats, queue)| Arc::new(PriorityLevel::new(seats, queue)));
    }

    /// Closes a watch instead of delivering an event, for a fraction `p` of events: what
    /// kube-apiserver does to a watcher that cannot keep up. Nothing is lost for a client that
    /// resumes from its last resourceVersion (or relists on 410).
    pub fn set_watch_drop_rate(&self, p: f64) {
        self.cfg.write().watch_drop_rate = p.clamp(0.0, 1.0);
    }

    /// A restart of the API server with its storage kept: watches are cut, every retained
    /// event is forgotten (resumed watches get 410 Expired and relist), and every request is
    /// answered 503 ServiceUnavailable for `down`. Connections are not refused: the listener
    /// stays up, as a load balancer in front of the API server would.
    pub fn restart(&self, down: Duration) {
        self.cfg.write().down_until = Some(Instant::now() + down);
        self.store.compact();
        self.disconnect_watches();
    }

    /// Removes every injected error and latency.
    pub fn clear(&self) {
        let mut c = self.cfg.write();
        let retry_after = c.retry_after;
        *c = FaultConfig {
            retry_after,
            ..FaultConfig::default()
        };
    }

    /// Closes every open watch now; clients re-watch from their last resourceVersion.
    pub fn disconnect_watches(&self) {
        self.disconnect.send_modify(|g| *g += 1);
    }

    /// Keeps only the last `n` events per kind; watches resuming from older versions get 410.
    pub fn set_retention(&self, n: usize) {
        self.store.set_retention(n);
    }

    /// Forgets all retained events, so every resumed watch gets 410 Expired and relists
    /// (what an etcd compaction does to a real cluster).
    pub fn compact(&self) {
        self.store.compact();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two seats and a queue of one: two requests execute, a third waits for a seat, a fourth
    /// is refused; the waiting one runs as soon as a seat frees.
    #[tokio::test(start_paused = true)]
    async fn a_priority_level_executes_its_seats_queues_its_queue_and_refuses_the_rest() {
        let level = Arc::new(PriorityLevel::new(2, 1));
        let first = level.admit().await.expect("a seat");
        let _second = level.admit().await.expect("a seat");
        let queued = tokio::spawn({
            let level = level.clone();
            async move { level.admit().await.is_some() }
        });
        tokio::task::yield_now().await;
        assert!(level.admit().await.is_none(), "the queue is full");
        drop(first);
        assert!(
            queued.await.unwrap(),
            "the queued request gets the freed seat"
        );
    }

    /// A queued request that never gets a seat is refused after the wait limit.
    #[tokio::test(start_paused = true)]
    async fn a_request_queued_too_long_is_refused() {
        let level = PriorityLevel::new(1, 10);
        let _only = level.admit().await.expect("a seat");
        let start = tokio::time::Instant::now();
        assert!(level.admit().await.is_none());
        assert_eq!(start.elapsed(), PriorityLevel::MAX_WAIT);
    }
}
