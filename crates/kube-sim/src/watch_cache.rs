//! The watch cache's dispatch: when watchers hear of a committed write.
//!
//! kube-apiserver does not hand a write to its watchers itself. Each resource has one cacher:
//! one goroutine reads the resource's etcd watch, decodes each event and updates the watch
//! cache, one more dispatches it to every watcher, in order, one event at a time. That serial
//! work runs on the same cores as every request, so while a burst keeps the server busy the
//! cacher falls behind and every watcher — the CCM's informers among them — hears of each
//! change late, by an amount that grows with the load, not with the watcher's own speed.
//! kube-sim otherwise sends an event to its watchers the moment it is stored.
//!
//! With a non-zero [`CostModel::dispatch`](crate::cost::CostModel::dispatch), a [`Dispatch`]
//! keeps one cacher per kind: a task that takes the kind's events in order and burns their
//! dispatch CPU on a blocking thread (real CPU, competing for the cores), then advances the
//! kind's *cursor*. A watcher sends a live event only once the cursor has reached it, and
//! with a non-zero [`CostModel::send`](crate::cost::CostModel::send) each write it makes first
//! spends that CPU: the events dispatched meanwhile leave together in its next write, as they
//! do from a busy kube-apiserver's watch handler, which flushes only once none is waiting.
//! With a non-zero [`CostModel::catch_up`](crate::cost::CostModel::catch_up), a cacher that is
//! behind (more events already waiting) moves its cursor only that often, so watchers receive
//! a backlog in chunks rather than one event per dispatch.

use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use tokio::sync::{broadcast, watch};

use crate::cost::CostModel;
use crate::resources::RESOURCES;
use crate::server::Shared;

/// One cursor per kind, started the first time a cost model with dispatch CPU is set.
#[derive(Default)]
pub(crate) struct Dispatch {
    cursors: OnceLock<Vec<watch::Receiver<u64>>>,
}

impl Dispatch {
    /// Starts the cachers if `model` charges dispatch (once; later calls do nothing). They
    /// read the cost model at each event, so a model set later takes effect at once, and a
    /// free one makes them pass events through. They hold the server weakly and end with its
    /// store.
    pub(crate) fn start_if_charged(shared: &Arc<Shared>, model: &CostModel) {
        if model.dispatch.is_zero() {
            return;
        }
        shared.dispatch.cursors.get_or_init(|| {
            (0..RESOURCES.len())
                .map(|res| {
                    let (rx, rv) = shared.store.subscribe(res);
                    let (tx, cursor) = watch::channel(rv);
                    shared
                        .runtime
                        .spawn(run_cacher(Arc::downgrade(shared), rx, tx));
                    cursor
                })
                .collect()
        });
    }

    /// The kind's cursor, if the cachers run: the resourceVersion up to which its events have
    /// been dispatched.
    pub(crate) fn cursor(&self, res: usize) -> Option<watch::Receiver<u64>> {
        self.cursors.get().and_then(|c| c.get(res)).cloned()
    }
}

/// One kind's cacher: each event's dispatch CPU, in order, then the cursor moves past it.
async fn run_cacher(
    shared: Weak<Shared>,
    mut rx: broadcast::Receiver<Arc<crate::store::WatchEvent>>,
    cursor: watch::Sender<u64>,
) {
    let mut published = tokio::time::Instant::now();
    loop {
        // The event's resourceVersion, and how long a cacher behind waits between chunks.
        let (rv, period) = match rx.recv().await {
            Ok(ev) => {
                let Some(s) = shared.upgrade() else { return };
                let cost = s.cost.read().clone();
                drop(s);
                if !cost.dispatch.is_zero() {
                    // The serialized line is what the watchers send: computing it is the
                    // cacher's encoding, and they share it.
                    let bytes = ev.line().len();
                    cost.charge_dispatch(bytes).await;
                }
                (ev.rv, cost.catch_up)
            }
            // Fell behind its own channel: the skipped events count as dispatched, so no
            // watcher waits for an event the cacher will never see.
            Err(broadcast::error::RecvError::Lagged(_)) => match shared.upgrade() {
                Some(s) => (s.store.rv(), Duration::ZERO),
                None => return,
            },
            Err(broadcast::error::RecvError::Closed) => return,
        };
        // Behind (more events already waiting), the cacher's source hands them over in chunks
        // `catch_up` apart: watchers see the backlog in clumps, not one event at a time.
        let now = tokio::time::Instant::now();
        if rx.is_empty() || now.duration_since(published) >= period {
            cursor.send_replace(rv);
            published = now;
        }
    }
}
