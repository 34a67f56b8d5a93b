//! Per-Service mutual exclusion between the service workers, the node sync and the drift check.
//!
//! The work queue already hands a key to one worker at a time; the node sync and the drift
//! check run outside the queue (as upstream's node sync does), so they take the same per-key
//! lock. That is what guarantees never two cloud operations on one Service at once — upstream
//! can run `UpdateLoadBalancer` and `EnsureLoadBalancer` on one Service concurrently.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::OwnedMutexGuard;

/// A map of async locks, one per key, created on demand and dropped when unused.
#[derive(Default)]
pub(crate) struct KeyLocks {
    map: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
}

/// Holds one key's lock; dropping it releases the lock and forgets the key if nobody waits.
pub(crate) struct KeyGuard {
    guard: Option<OwnedMutexGuard<()>>,
    key: String,
    map: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
}

impl KeyLocks {
    /// Waits for `key`'s lock.
    pub(crate) async fn lock(&self, key: &str) -> KeyGuard {
        let mutex = self.map.lock().entry(key.to_string()).or_default().clone();
        let guard = mutex.lock_owned().await;
        KeyGuard {
            guard: Some(guard),
            key: key.to_string(),
            map: self.map.clone(),
        }
    }

    /// Keys with a lock held or awaited (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.lock().len()
    }
}

impl Drop for KeyGuard {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut map = self.map.lock();
        // Only the map holds the Arc: no holder, no waiter (waiters clone under this lock).
        if map
            .get(&self.key)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            map.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn one_holder_per_key_and_entries_are_dropped() {
        let locks = Arc::new(KeyLocks::default());
        let inside = Arc::new(AtomicUsize::new(0));
        let max = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (locks, inside, max) = (locks.clone(), inside.clone(), max.clone());
                tokio::spawn(async move {
                    let _g = locks.lock("ns/a").await;
                    let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    max.fetch_max(n, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        let _other = locks.lock("ns/b").await; // another key is never blocked
        for t in tasks {
            t.await.expect("task");
        }
        assert_eq!(max.load(Ordering::SeqCst), 1);
        assert_eq!(locks.len(), 1); // only ns/b, still held
    }
}
