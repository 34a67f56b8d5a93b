//! A keyed work queue with client-go workqueue semantics, plus batching.
//!
//! - A key is queued at most once, and never handed to two workers at once: a key added while
//!   it is being processed is marked dirty and comes back after [`WorkQueue::done`].
//! - [`WorkQueue::add_rate_limited`] delays a key by its own exponential backoff, so one broken
//!   object never slows the others; [`WorkQueue::forget`] resets it.
//! - [`WorkQueue::get_batch`] hands out many ready keys at once, which is how the node
//!   controller turns a burst of new Nodes into one cloud call.
//!
//! Metrics use the upstream `workqueue_*` names with the queue's `name` label.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Per-key exponential backoff: `base · 2^failures`, capped at `max`.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// Delay after the first failure.
    pub base: Duration,
    /// Longest delay.
    pub max: Duration,
}

impl Backoff {
    /// The delay after `failures` consecutive failures (1 = first failure).
    pub fn delay(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(40);
        let secs = self.base.as_secs_f64() * 2f64.powi(exp as i32);
        Duration::from_secs_f64(secs.min(self.max.as_secs_f64()))
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    name: String,
}

/// What a queue shows of its keys in processing, for the scrape-time gauges.
trait InFlight: Send + Sync {
    /// The sum and the longest of the seconds each key in processing has been processed.
    fn in_flight(&self, now: Instant) -> (f64, f64);
}

/// Every queue sharing a [`QueueMetrics`], by name (weak: a dropped queue disappears).
type QueueList = Arc<Mutex<Vec<(String, Weak<dyn InFlight>)>>>;

/// Upstream-named workqueue metrics, shared by all queues of a process.
#[derive(Clone)]
pub struct QueueMetrics {
    adds: Family<QueueLabels, Counter>,
    depth: Family<QueueLabels, Gauge>,
    retries: Family<QueueLabels, Counter>,
    queue_duration: Family<QueueLabels, Histogram>,
    work_duration: Family<QueueLabels, Histogram>,
    queues: QueueList,
}

fn latency_histogram() -> Histogram {
    // component-base's workqueue buckets: ExponentialBuckets(10e-7, 10, 10), 1e-6 … 1e3 s.
    Histogram::new(go_exponential_buckets(1e-6, 10.0, 10))
}

/// client_golang's `ExponentialBuckets`: each bound the previous one times `factor`, so the
/// bounds are the same floats as upstream's (9.999999999999999e-06, not 1e-05).
fn go_exponential_buckets(start: f64, factor: f64, count: usize) -> Vec<f64> {
    std::iter::successors(Some(start), |b| Some(b * factor))
        .take(count)
        .collect()
}

/// `workqueue_unfinished_work_seconds` and `workqueue_longest_running_processor_seconds`,
/// computed from the queues' processing keys when scraped (client-go refreshes them every
/// 500 ms; reading at scrape time is as fresh and costs nothing between scrapes).
#[derive(Debug)]
struct InFlightCollector {
    queues: QueueList,
}

impl InFlightCollector {
    fn totals(&self) -> BTreeMap<String, (f64, f64)> {
        let now = Instant::now();
        let mut out: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        let mut queues = self.queues.lock();
        queues.retain(|(_, q)| q.strong_count() > 0);
        for (name, q) in queues.iter() {
            let (sum, max) = q.upgrade().map_or((0.0, 0.0), |q| q.in_flight(now));
            let e = out.entry(name.clone()).or_default();
            e.0 += sum;
            e.1 = e.1.max(max);
        }
        out
    }
}

impl Collector for InFlightCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let totals = self.totals();
        for (metric, help, pick) in [
            (
                "workqueue_unfinished_work_seconds",
                "How many seconds of work has done that is in progress and hasn't been observed by work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate at which this increases.",
                (|t: &(f64, f64)| t.0) as fn(&(f64, f64)) -> f64,
            ),
            (
                "workqueue_longest_running_processor_seconds",
                "How many seconds has the longest running processor for workqueue been running.",
                |t: &(f64, f64)| t.1,
            ),
        ] {
            let mut family = encoder.encode_descriptor(metric, help, None, MetricType::Gauge)?;
            for (name, t) in &totals {
                let labels = QueueLabels { name: name.clone() };
                ConstGauge::new(pick(t)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

impl Default for QueueMetrics {
    fn default() -> Self {
        QueueMetrics {
            adds: Family::default(),
            depth: Family::default(),
            retries: Family::default(),
            queue_duration: Family::new_with_constructor(latency_histogram),
            work_duration: Family::new_with_constructor(latency_histogram),
            queues: QueueList::default(),
        }
    }
}

impl QueueMetrics {
    /// Metrics registered into `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let m = QueueMetrics::default();
        registry.register(
            "workqueue_adds",
            "Total number of adds handled by workqueue",
            m.adds.clone(),
        );
        registry.register(
            "workqueue_depth",
            "Current depth of workqueue",
            m.depth.clone(),
        );
        registry.register(
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            m.retries.clone(),
        );
        registry.register(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            m.queue_duration.clone(),
        );
        registry.register(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            m.work_duration.clone(),
        );
        registry.register_collector(Box::new(InFlightCollector {
            queues: m.queues.clone(),
        }));
        m
    }
}

struct State<K> {
    queue: VecDeque<K>,
    /// Keys waiting in `queue` or to be re-queued after processing, with when they were added.
    dirty: HashMap<K, Instant>,
    processing: HashMap<K, Instant>,
    /// Delayed keys: (due, sequence) ordered, plus each key's earliest due time.
    delayed: BTreeSet<(Instant, u64, K)>,
    delayed_due: HashMap<K, Instant>,
    failures: HashMap<K, u32>,
    seq: u64,
}

impl<K: Send + Sync> InFlight for Shared<K> {
    fn in_flight(&self, now: Instant) -> (f64, f64) {
        let st = self.state.lock();
        st.processing
            .values()
            .fold((0.0, 0.0), |(sum, max), started| {
                let secs = now.saturating_duration_since(*started).as_secs_f64();
                (sum + secs, f64::max(max, secs))
            })
    }
}

struct Shared<K> {
    name: QueueLabels,
    state: Mutex<State<K>>,
    notify: Notify,
    backoff: Backoff,
    metrics: QueueMetrics,
    shutdown: CancellationToken,
}

/// A work queue of keys (see the module docs). Cheap to clone; clones share the queue.
pub struct WorkQueue<K> {
    shared: Arc<Shared<K>>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        WorkQueue {
            shared: self.shared.clone(),
        }
    }
}

impl<K> WorkQueue<K>
where
    K: Hash + Eq + Ord + Clone + Send + Sync + 'static,
{
    /// A queue named `name` (the `name` label of its metrics) with per-key `backoff`. `get`
    /// returns `None` once `shutdown` is cancelled.
    pub fn new(
        name: &str,
        backoff: Backoff,
        metrics: QueueMetrics,
        shutdown: CancellationToken,
    ) -> Self {
        // Every series exists from the start, at zero, as client-go's per-queue metrics do:
        // `rate(workqueue_retries_total[5m])` is 0, not absent, for a queue that never failed.
        let labels = QueueLabels {
            name: name.to_string(),
        };
        drop(metrics.adds.get_or_create(&labels));
        drop(metrics.depth.get_or_create(&labels));
        drop(metrics.retries.get_or_create(&labels));
        drop(metrics.queue_duration.get_or_create(&labels));
        drop(metrics.work_duration.get_or_create(&labels));
        let queues = metrics.queues.clone();
        let queue = WorkQueue {
            shared: Arc::new(Shared {
                name: QueueLabels {
                    name: name.to_string(),
                },
                state: Mutex::new(State {
                    queue: VecDeque::new(),
                    dirty: HashMap::new(),
                    processing: HashMap::new(),
                    delayed: BTreeSet::new(),
                    delayed_due: HashMap::new(),
                    failures: HashMap::new(),
                    seq: 0,
                }),
                notify: Notify::new(),
                backoff,
                metrics,
                shutdown,
            }),
        };
        let weak: Weak<dyn InFlight> = Arc::downgrade(&(queue.shared.clone() as Arc<dyn InFlight>));
        let mut list = queues.lock();
        list.retain(|(_, q)| q.strong_count() > 0);
        list.push((name.to_string(), weak));
        drop(list);
        queue
    }

    /// Queues `key` now (no-op if already queued).
    pub fn add(&self, key: K) {
        let mut st = self.shared.state.lock();
        self.add_locked(&mut st, key);
    }

    fn add_locked(&self, st: &mut State<K>, key: K) {
        if st.dirty.contains_key(&key) {
            return;
        }
        self.shared
            .metrics
            .adds
            .get_or_create(&self.shared.name)
            .inc();
        st.dirty.insert(key.clone(), Instant::now());
        if !st.processing.contains_key(&key) {
            st.queue.push_back(key);
            self.shared
                .metrics
                .depth
                .get_or_create(&self.shared.name)
                .set(st.queue.len() as i64);
            self.shared.notify.notify_one();
        }
    }

    /// Queues `key` after `delay` (an earlier pending delay for the same key wins).
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let due = Instant::now() + delay;
        let mut st = self.shared.state.lock();
        if let Some(existing) = st.delayed_due.get(&key).copied() {
            if existing <= due {
                return;
            }
            st.delayed.retain(|(_, _, k)| k != &key);
        }
        st.seq += 1;
        let seq = st.seq;
        st.delayed.insert((due, seq, key.clone()));
        st.delayed_due.insert(key, due);
        drop(st);
        // Wake a waiting worker so it re-computes its sleep deadline.
        self.shared.notify.notify_one();
    }

    /// Queues `key` after its backoff delay and counts a failure for it.
    pub fn add_rate_limited(&self, key: K) -> Duration {
        let delay = {
            let mut st = self.shared.state.lock();
            let n = st.failures.entry(key.clone()).or_default();
            *n += 1;
            self.shared.backoff.delay(*n)
        };
        self.shared
            .metrics
            .retries
            .get_or_create(&self.shared.name)
            .inc();
        self.add_after(key.clone(), delay);
        delay
    }

    /// Like [`WorkQueue::add_rate_limited`], but waits at least `min` (a throttled cloud's
    /// `retry_after` hint): backing off less than the cloud asked only earns another refusal.
    pub fn add_rate_limited_min(&self, key: K, min: Duration) -> Duration {
        let delay = {
            let mut st = self.shared.state.lock();
            let n = st.failures.entry(key.clone()).or_default();
            *n += 1;
            self.shared.backoff.delay(*n).max(min)
        };
        self.shared
            .metrics
            .retries
            .get_or_create(&self.shared.name)
            .inc();
        self.add_after(key, delay);
        delay
    }

    /// Consecutive failures recorded for `key`.
    pub fn failures(&self, key: &K) -> u32 {
        self.shared
            .state
            .lock()
            .failures
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    /// Clears `key`'s failure count (call after a success).
    pub fn forget(&self, key: &K) {
        self.shared.state.lock().failures.remove(key);
    }

    /// Marks `key` finished; if it was added meanwhile it is queued again.
    pub fn done(&self, key: &K) {
        let mut st = self.shared.state.lock();
        if let Some(started) = st.processing.remove(key) {
            self.shared
                .metrics
                .work_duration
                .get_or_create(&self.shared.name)
                .observe(started.elapsed().as_secs_f64());
        }
        if st.dirty.contains_key(key) {
            st.queue.push_back(key.clone());
            self.shared
                .metrics
                .depth
                .get_or_create(&self.shared.name)
                .set(st.queue.len() as i64);
            self.shared.notify.notify_one();
        }
    }

    /// Keys queued and ready now.
    pub fn len(&self) -> usize {
        self.shared.state.lock().queue.len()
    }

    /// True when nothing is ready now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys queued, delayed or being processed: zero means the controller is idle.
    pub fn pending(&self) -> usize {
        let st = self.shared.state.lock();
        st.queue.len() + st.delayed.len() + st.processing.len()
    }

    /// Moves due delayed keys into the queue; returns the next due time, if any.
    fn promote(&self, st: &mut State<K>) -> Option<Instant> {
        let now = Instant::now();
        while let Some((due, _, _)) = st.delayed.first() {
            if *due > now {
                return Some(*due);
            }
            if let Some((_, _, key)) = st.delayed.pop_first() {
                st.delayed_due.remove(&key);
                self.add_locked(st, key);
            }
        }
        None
    }

    fn pop_locked(&self, st: &mut State<K>) -> Option<K> {
        let key = st.queue.pop_front()?;
        if let Some(added) = st.dirty.remove(&key) {
            self.shared
                .metrics
                .queue_duration
                .get_or_create(&self.shared.name)
                .observe(added.elapsed().as_secs_f64());
        }
        st.processing.insert(key.clone(), Instant::now());
        self.shared
            .metrics
            .depth
            .get_or_create(&self.shared.name)
            .set(st.queue.len() as i64);
        Some(key)
    }

    /// Waits for the next key; `None` after shutdown. Call [`WorkQueue::done`] when finished.
    pub async fn get(&self) -> Option<K> {
        loop {
            let notified = self.shared.notify.notified();
            futures::pin_mut!(notified);
            notified.as_mut().enable();
            let next_due = {
                let mut st = self.shared.state.lock();
                let next_due = self.promote(&mut st);
                if let Some(key) = self.pop_locked(&mut st) {
                    if !st.queue.is_empty() {
                        // Pass the baton: more work is ready for another worker.
                        self.shared.notify.notify_one();
                    }
                    return Some(key);
                }
                next_due
            };
            if self.shared.shutdown.is_cancelled() {
                return None;
            }
            let sleep = async {
                match next_due {
                    Some(due) => tokio::time::sleep_until(due).await,
                    None => futures::future::pending().await,
                }
            };
            tokio::select! {
                _ = notified => {}
                _ = sleep => {}
                _ = self.shared.shutdown.cancelled() => return None,
            }
        }
    }

    /// Waits for at least one key, then gathers more for up to `window` (stopping early at
    /// `max`). Each returned key must be passed to [`WorkQueue::done`].
    pub async fn get_batch(&self, max: usize, window: Duration) -> Option<Vec<K>> {
        let first = self.get().await?;
        let mut batch = vec![first];
        let deadline = Instant::now() + window;
        while batch.len() < max {
            {
                let mut st = self.shared.state.lock();
                self.promote(&mut st);
                while batch.len() < max {
                    match self.pop_locked(&mut st) {
                        Some(k) => batch.push(k),
                        None => break,
                    }
                }
            }
            if batch.len() >= max || Instant::now() >= deadline {
                break;
            }
            let notified = self.shared.notify.notified();
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(deadline) => {}
                _ = self.shared.shutdown.cancelled() => break,
            }
        }
        Some(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> WorkQueue<String> {
        WorkQueue::new(
            "test",
            Backoff {
                base: Duration::from_millis(5),
                max: Duration::from_secs(1000),
            },
            QueueMetrics::default(),
            CancellationToken::new(),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn dedups_and_never_hands_a_key_to_two_workers() {
        let q = queue();
        q.add("a".into());
        q.add("a".into());
        q.add("b".into());
        assert_eq!(q.len(), 2);
        let k = q.get().await.expect("key");
        assert_eq!(k, "a");
        // Added while processing: not handed out again until done.
        q.add("a".into());
        assert_eq!(q.get().await.as_deref(), Some("b"));
        assert_eq!(q.len(), 0);
        q.done(&"b".to_string());
        q.done(&k);
        assert_eq!(q.get().await.as_deref(), Some("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_grows_per_key_and_forget_resets() {
        let q = queue();
        assert_eq!(q.add_rate_limited("x".into()), Duration::from_millis(5));
        assert_eq!(q.add_rate_limited("x".into()), Duration::from_millis(10));
        assert_eq!(q.add_rate_limited("y".into()), Duration::from_millis(5));
        q.forget(&"x".to_string());
        assert_eq!(q.add_rate_limited("x".into()), Duration::from_millis(5));
        let start = Instant::now();
        let k = q.get().await.expect("key");
        assert!(start.elapsed() >= Duration::from_millis(5));
        assert!(k == "x" || k == "y");
    }

    #[tokio::test(start_paused = true)]
    async fn batch_gathers_within_window() {
        let q = queue();
        q.add("a".into());
        let q2 = q.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            q2.add("b".into());
            q2.add("c".into());
        });
        let batch = q
            .get_batch(10, Duration::from_millis(20))
            .await
            .expect("batch");
        assert_eq!(batch, vec!["a", "b", "c"]);
    }

    fn scrape(reg: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, reg).expect("encode");
        out
    }

    #[tokio::test(start_paused = true)]
    async fn in_flight_gauges_follow_processing_keys() {
        let mut reg = Registry::default();
        let metrics = QueueMetrics::new(&mut reg);
        let q: WorkQueue<String> = WorkQueue::new(
            "Nodes",
            Backoff {
                base: Duration::from_millis(5),
                max: Duration::from_secs(1),
            },
            metrics,
            CancellationToken::new(),
        );
        let out = scrape(&reg);
        assert!(
            out.contains(r#"workqueue_longest_running_processor_seconds{name="Nodes"} 0.0"#),
            "{out}"
        );
        assert!(
            out.contains(r#"workqueue_retries_total{name="Nodes"} 0"#),
            "{out}"
        );
        q.add("a".into());
        q.add("b".into());
        let a = q.get().await.expect("a");
        tokio::time::advance(Duration::from_secs(2)).await;
        let b = q.get().await.expect("b");
        tokio::time::advance(Duration::from_secs(1)).await;
        let out = scrape(&reg);
        // a: 3 s, b: 1 s in processing.
        assert!(
            out.contains(r#"workqueue_unfinished_work_seconds{name="Nodes"} 4.0"#),
            "{out}"
        );
        assert!(
            out.contains(r#"workqueue_longest_running_processor_seconds{name="Nodes"} 3.0"#),
            "{out}"
        );
        assert!(
            out.contains(r#"workqueue_adds_total{name="Nodes"} 2"#),
            "{out}"
        );
        q.done(&a);
        q.done(&b);
        let out = scrape(&reg);
        assert!(
            out.contains(r#"workqueue_unfinished_work_seconds{name="Nodes"} 0.0"#),
            "{out}"
        );
        assert!(
            out.contains(r#"workqueue_work_duration_seconds_count{name="Nodes"} 2"#),
            "{out}"
        );
        drop(q);
        assert!(!scrape(&reg).contains("workqueue_unfinished_work_seconds{"));
    }

    #[test]
    fn backoff_caps() {
        let b = Backoff {
            base: Duration::from_secs(5),
            max: Duration::from_secs(300),
        };
        assert_eq!(b.delay(1), Duration::from_secs(5));
        assert_eq!(b.delay(2), Duration::from_secs(10));
        assert_eq!(b.delay(7), Duration::from_secs(300));
        assert_eq!(b.delay(1000), Duration::from_secs(300));
    }
}
