//! Kubernetes Events with upstream reasons, written in the background.
//!
//! Upstream CCM controllers record core/v1 Events (what `kubectl describe` and
//! `kubectl get events` show) with a `source.component` per controller. ccm-rs does the same,
//! off the controllers' hot path: `publish` never waits for the API server, and a repeat of the
//! same event on the same object within the dedup window becomes a count bump (as client-go's
//! correlator does) instead of a new object.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;
use tokio::time::Instant;

/// `Normal` or `Warning`, as Kubernetes spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Something expected happened.
    Normal,
    /// Something an operator should look at.
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// How long a repeated event is folded into the first one.
const DEDUP_WINDOW: Duration = Duration::from_secs(600);
/// Bound on queued events; past it events are dropped (counted, and summarised in the log)
/// rather than blocking.
pub const QUEUE_CAPACITY: usize = 4096;
/// How often a recorder that drops Events says so in the log: one line per interval and cause
/// (queue full, write failed), however many Events it dropped.
pub const DROP_SUMMARY_INTERVAL: Duration = Duration::from_secs(10);

/// Labels of `ccm_events_dropped_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabels {
    /// The recorder's `source.component`.
    component: String,
    /// `queue_full` (the writer is behind), `writer_stopped` (its task ended) or
    /// `write_failed` (the API server refused or did not answer the write).
    reason: &'static str,
}

/// Events that never reached the API server, for every recorder of the process. Process-wide
/// because recorders are made wherever a controller needs one; the manager registers it once.
static DROPPED: LazyLock<Family<DropLabels, Counter>> = LazyLock::new(Family::default);

/// Registers `ccm_events_dropped_total{component,reason}` (client-go has no such metric: it logs
/// each dropped Event). Call once per registry.
pub fn register_metrics(registry: &mut Registry) {
    registry.register(
        "ccm_events_dropped",
        "Events recorded but never written to the API server, by recorder and reason",
        DROPPED.clone(),
    );
}

/// Why an Event was dropped, as the `reason` label says it.
const DROP_REASONS: [&str; 3] = ["queue_full", "writer_stopped", "write_failed"];

/// Creates a recorder's series at 0, so the first drop shows in `rate()`/`increase()` (a
/// counter born at 1 hides its first increase from them).
fn init_drop_series(component: &str) {
    for reason in DROP_REASONS {
        drop(DROPPED.get_or_create(&DropLabels {
            component: component.to_string(),
            reason,
        }));
    }
}

fn count_drop(component: &str, reason: &'static str) {
    DROPPED
        .get_or_create(&DropLabels {
            component: component.to_string(),
            reason,
        })
        .inc();
}

/// Why a summarised drop happened: its `reason` label and its words in the log.
#[derive(Clone, Copy)]
enum Cause {
    /// The writer is behind: the queue is full.
    QueueFull,
    /// The API server refused the write or did not answer.
    WriteFailed,
}

impl Cause {
    fn reason(self) -> &'static str {
        match self {
            Cause::QueueFull => "queue_full",
            Cause::WriteFailed => "write_failed",
        }
    }

    fn words(self) -> &'static str {
        match self {
            Cause::QueueFull => "queue full",
            Cause::WriteFailed => "write failed",
        }
    }
}

/// Drops of one cause not yet logged, and whether a task is due to log them.
///
/// The first drop of a quiet spell arms one task; it logs the count at the end of each
/// interval and ends after an interval without drops. Nothing runs while no Event is dropped.
struct DropLog {
    cause: Cause,
    pending: AtomicU64,
    armed: AtomicBool,
    /// The latest write error, shown in the summary (a storm of 429s says so once).
    last_error: parking_lot::Mutex<Option<String>>,
}

impl DropLog {
    fn new(cause: Cause) -> Arc<Self> {
        Arc::new(DropLog {
            cause,
            pending: AtomicU64::new(0),
            armed: AtomicBool::new(false),
            last_error: parking_lot::Mutex::new(None),
        })
    }

    fn dropped(self: &Arc<Self>, component: &Arc<str>, error: Option<String>) {
        count_drop(component, self.cause.reason());
        if error.is_some() {
            *self.last_error.lock() = error;
        }
        self.pending.fetch_add(1, Ordering::Relaxed);
        if self.armed.swap(true, Ordering::AcqRel) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(self.clone().report(component.clone()));
            }
            Err(_) => {
                self.armed.store(false, Ordering::Release);
                let n = self.pending.swap(0, Ordering::AcqRel);
                tracing::warn!(component = %component, "dropped {n} events ({})", self.cause.words());
            }
        }
    }

    async fn report(self: Arc<Self>, component: Arc<str>) {
        loop {
            tokio::time::sleep(DROP_SUMMARY_INTERVAL).await;
            let n = self.pending.swap(0, Ordering::AcqRel);
            if n > 0 {
                let error = self.last_error.lock().take().unwrap_or_default();
                tracing::warn!(
                    component = %component,
                    dropped = n,
                    error,
                    "dropped {n} events in the last {}s ({})",
                    DROP_SUMMARY_INTERVAL.as_secs(),
                    self.cause.words()
                );
                continue;
            }
            self.armed.store(false, Ordering::Release);
            // A drop between the swap and the store saw `armed` still set and spawned nothing:
            // keep reporting for it unless a new task took over.
            if self.pending.load(Ordering::Acquire) == 0 || self.armed.swap(true, Ordering::AcqRel)
            {
                return;
            }
        }
    }
}

struct Pending {
    reference: ObjectReference,
    type_: EventType,
    reason: String,
    message: String,
}

/// Publishes Events for one controller (`source.component`). Cheap to clone.
#[derive(Clone)]
pub struct Recorder {
    tx: Option<mpsc::Sender<Pending>>,
    component: Arc<str>,
    drops: Arc<DropLog>,
}

impl Recorder {
    /// A recorder writing through `client` as `component` (e.g. `cloud-node-controller`).
    /// Must be called inside a Tokio runtime: it spawns the writer task.
    pub fn new(client: kube::Client, component: &str) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let component: Arc<str> = Arc::from(component);
        init_drop_series(&component);
        tokio::spawn(writer(client, component.clone(), rx));
        Recorder {
            tx: Some(tx),
            component,
            drops: DropLog::new(Cause::QueueFull),
        }
    }

    /// A recorder that only logs (for unit tests and dry runs).
    pub fn disabled(component: &str) -> Self {
        Recorder {
            tx: None,
            component: Arc::from(component),
            drops: DropLog::new(Cause::QueueFull),
        }
    }

    /// Records an event about `obj`. Never blocks; drops the event if the writer is far behind
    /// (counted in `ccm_events_dropped_total`, logged once per [`DROP_SUMMARY_INTERVAL`]).
    pub fn publish<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        message: impl Into<String>,
    ) {
        let message = message.into();
        match type_ {
            EventType::Normal => {
                tracing::debug!(component = %self.component, object = %obj.name_any(), reason, %message, "event")
            }
            EventType::Warning => {
                tracing::warn!(component = %self.component, object = %obj.name_any(), reason, %message, "event")
            }
        }
        let Some(tx) = &self.tx else { return };
        let reference = object_reference(obj);
        let sent = tx.try_send(Pending {
            reference,
            type_,
            reason: reason.to_string(),
            message,
        });
        match sent {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => self.drops.dropped(&self.component, None),
            Err(TrySendError::Closed(_)) => count_drop(&self.component, "writer_stopped"),
        }
    }
}

/// An ObjectReference for `obj`, as event `involvedObject`s carry it.
pub fn object_reference<K: Resource<DynamicType = ()>>(obj: &K) -> ObjectReference {
    let meta = obj.meta();
    ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(K::kind(&()).into_owned()),
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        resource_version: None,
        field_path: None,
    }
}

/// (object uid/name, reason, message): what makes two events "the same".
type Key = (String, String, String);

/// An Event already written: its name, its count, and when it was first seen.
#[derive(Clone)]
struct Written {
    name: String,
    count: i32,
    first_seen: Instant,
}

/// The events written within the dedup window, forgotten in the order they were first seen.
///
/// Expiry pops from the front of a queue ordered by first sight, so recording an event costs
/// O(1) amortized however many objects have events (a map-wide scan per event made a
/// 5,000-node burst quadratic).
#[derive(Default)]
struct Dedup {
    // The queue shares each key with the map rather than holding a second copy.
    written: HashMap<Arc<Key>, Written>,
    order: VecDeque<(Instant, Arc<Key>)>,
}

impl Dedup {
    /// The earlier Event this one repeats, if it was first seen within the window.
    fn prior(&mut self, key: &Key, now: Instant) -> Option<Written> {
        self.expire(now);
        self.written.get(key).cloned()
    }

    /// Remembers a new Event (count 1) or a repeat's new count.
    fn record(&mut self, key: Key, name: String, count: i32, first_seen: Instant) {
        let written = Written {
            name,
            count,
            first_seen,
        };
        if count > 1
            && let Some(w) = self.written.get_mut(&key)
        {
            *w = written;
            return;
        }
        let key = Arc::new(key);
        self.order.push_back((first_seen, key.clone()));
        self.written.insert(key, written);
    }

    fn expire(&mut self, now: Instant) {
        while let Some((seen, _)) = self.order.front() {
            if now.duration_since(*seen) < DEDUP_WINDOW {
                break;
            }
            let Some((seen, key)) = self.order.pop_front() else {
                break;
            };
            // A key re-created after expiring has a newer entry; only drop its own.
            if self.written.get(&key).is_some_and(|w| w.first_seen == seen) {
                self.written.remove(&key);
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.written.len()
    }
}

async fn writer(client: kube::Client, component: Arc<str>, mut rx: mpsc::Receiver<Pending>) {
    let mut seen = Dedup::default();
    let mut seq: u64 = 0;
    let failed = DropLog::new(Cause::WriteFailed);
    while let Some(p) = rx.recv().await {
        let namespace = p
            .reference
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string());
        let obj_id = p
            .reference
            .uid
            .clone()
            .or_else(|| p.reference.name.clone())
            .unwrap_or_default();
        let key = (obj_id, p.reason.clone(), p.message.clone());
        let now = Timestamp::now();
        let api: Api<Event> = Api::namespaced(client.clone(), &namespace);
        if let Some(prior) = seen.prior(&key, Instant::now()) {
            let patch = serde_json::json!({
                "count": prior.count + 1,
                "lastTimestamp": Time(now),
            });
            match api
                .patch(&prior.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    seen.record(key, prior.name, prior.count + 1, prior.first_seen);
                    continue;
                }
                Err(e) => tracing::debug!(error = %e, "event count bump failed; creating anew"),
            }
        }
        seq += 1;
        let base = p.reference.name.clone().unwrap_or_default();
        let name = format!(
            "{base}.{:x}{:04x}",
            now.as_nanosecond() as u64,
            seq & 0xffff
        );
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            involved_object: p.reference,
            reason: Some(p.reason),
            message: Some(p.message),
            type_: Some(p.type_.as_str().to_string()),
            source: Some(EventSource {
                component: Some(component.to_string()),
                host: None,
            }),
            reporting_component: Some(component.to_string()),
            reporting_instance: None,
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: None::<MicroTime>,
            count: Some(1),
            ..Default::default()
        };
        match api.create(&PostParams::default(), &event).await {
            Ok(_) => seen.record(key, name, 1, Instant::now()),
            Err(e) => failed.dropped(&component, Some(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(obj: &str) -> Key {
        (obj.to_string(), "Reason".to_string(), "message".to_string())
    }

    #[tokio::test(start_paused = true)]
    async fn a_repeat_within_the_window_folds_and_one_after_it_does_not() {
        let mut dedup = Dedup::default();
        let t0 = Instant::now();
        dedup.record(key("a"), "a.1".into(), 1, t0);
        tokio::time::advance(Duration::from_secs(300)).await;
        let prior = dedup
            .prior(&key("a"), Instant::now())
            .expect("within window");
        assert_eq!((prior.name.as_str(), prior.count), ("a.1", 1));
        dedup.record(key("a"), prior.name, 2, prior.first_seen);
        // The window counts from the first sight, as client-go's correlator does.
        tokio::time::advance(Duration::from_secs(300)).await;
        assert!(dedup.prior(&key("a"), Instant::now()).is_none());
        assert_eq!(dedup.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn expiry_forgets_old_events_only() {
        let mut dedup = Dedup::default();
        for i in 0..1000 {
            dedup.record(
                key(&format!("old{i}")),
                format!("old{i}.1"),
                1,
                Instant::now(),
            );
        }
        tokio::time::advance(Duration::from_secs(400)).await;
        dedup.record(key("new"), "new.1".into(), 1, Instant::now());
        tokio::time::advance(Duration::from_secs(250)).await;
        assert!(dedup.prior(&key("new"), Instant::now()).is_some());
        assert_eq!(dedup.len(), 1, "the 1,000 older events are forgotten");
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_written_again_after_expiry_is_not_dropped_by_its_old_entry() {
        let mut dedup = Dedup::default();
        dedup.record(key("a"), "a.1".into(), 1, Instant::now());
        tokio::time::advance(DEDUP_WINDOW).await;
        assert!(dedup.prior(&key("a"), Instant::now()).is_none());
        // A failed count bump re-creates the Event while its first entry is still queued.
        let mut dedup = Dedup::default();
        dedup.record(key("a"), "a.1".into(), 1, Instant::now());
        tokio::time::advance(Duration::from_secs(100)).await;
        dedup.record(key("a"), "a.2".into(), 1, Instant::now());
        tokio::time::advance(DEDUP_WINDOW - Duration::from_secs(50)).await;
        let prior = dedup
            .prior(&key("a"), Instant::now())
            .expect("the newer Event");
        assert_eq!(prior.name, "a.2");
    }
}
