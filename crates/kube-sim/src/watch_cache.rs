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
//! kind's *cursor*. A watcher sends a live event only once the cursor has reached it.

use std::sync::{Arc, OnceLock, Weak};

use tokio::sync::{broadcast, watch};

use crate::resources::RESOURCES;
use crate::server::Shared;
use crate::store::WatchEvent;

/// One cursor per kind, started the first time a cost model with dispatch CPU is set.
#[derive(Default)]
pub(crate) struct Dispatch {
    cursors: OnceLock<Vec<watch::Receiver<u64>>>,
}

impl Dispatch {
    /// Starts the cachers (once; later calls do nothing). They read the cost model at each
    /// event, so a model set later takes effect at once, and a free one makes them pass events
    /// through. They hold the server weakly and end with its store.
    pub(crate) fn start(shared: &Arc<Shared>) {
        shared.dispatch.cursors.get_or_init(|| {
            (0..RESOURCES.len())
                .map(|res| {
                    let (rx, rv) = shared.store.subscribe(res);
                    let (tx, cursor) = watch::channel(rv);
                    tokio::spawn(run_cacher(Arc::downgrade(shared), rx, tx));
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

/// At most this many events share one burn: the cacher's CPU is spent in a few handoffs to a
/// blocking thread rather than one per event (each handoff waits for a core on a busy machine,
/// which a goroutine handing an event to the next does not), while no event waits behind more
/// than a batch of others' CPU.
const BATCH: usize = 32;

/// One kind's cacher: the events' dispatch CPU, in order, then the cursor moves past them.
async fn run_cacher(
    shared: Weak<Shared>,
    mut rx: broadcast::Receiver<Arc<WatchEvent>>,
    cursor: watch::Sender<u64>,
) {
    loop {
        let first = match rx.recv().await {
            Ok(ev) => ev,
            Err(e) => match skipped(&shared, e) {
                Some(rv) => {
                    cursor.send_replace(rv);
                    continue;
                }
                None => return,
            },
        };
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(ev) => batch.push(ev),
                // Empty, or behind: the next `recv` says which.
                Err(_) => break,
            }
        }
        let Some(s) = shared.upgrade() else { return };
        let cost = s.cost.read().clone();
        drop(s);
        if !cost.dispatch.is_zero() {
            // The serialized line is what the watchers send: computing it is the cacher's
            // encoding, and they share it.
            let cpu = batch
                .iter()
                .map(|ev| cost.dispatch.of(ev.line().len()))
                .sum();
            crate::cost::burn_on_blocking_thread(cpu).await;
        }
        if let Some(last) = batch.last() {
            cursor.send_replace(last.rv);
        }
    }
}

/// After a receive error: the resourceVersion up to which events count as dispatched (the
/// cacher fell behind its own channel, so no watcher may wait for an event it will never
/// see), or `None` when the server is gone.
fn skipped(shared: &Weak<Shared>, e: broadcast::error::RecvError) -> Option<u64> {
    match e {
        broadcast::error::RecvError::Lagged(_) => shared.upgrade().map(|s| s.store.rv()),
        broadcast::error::RecvError::Closed => None,
    }
}
