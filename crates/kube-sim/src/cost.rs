//! A cost model that makes kube-sim as expensive per request as kube-apiserver + etcd.
//!
//! kube-sim answers from memory in microseconds; a real API server decodes, admits, validates,
//! converts, writes to etcd (a Raft commit and an fsync) and encodes again, on the same cores as
//! everything else. A benchmark on a free server therefore flatters whoever makes many
//! requests. With a [`CostModel`], every request *burns* server CPU for real — on blocking
//! threads, so it competes with the CCM and the load generator for the machine's cores as a
//! real server does — and every write also waits a commit latency (etcd's fsync, which costs
//! time, not CPU). Both grow with the object's size.
//!
//! [`CostModel::calibrated`] is tuned so that ccm-rs's 1,000-node burst on kube-sim reproduces
//! what was measured on kube-apiserver 1.36 + etcd 3.6 on a 2-core machine (docs/BENCHMARKS.md).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::metrics::Verb;

/// Cost of one request of one verb: `base + per_kib × KiB` (the larger of request and
/// response body).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Cost {
    /// Fixed part.
    pub base: Duration,
    /// Per KiB of object.
    pub per_kib: Duration,
}

impl Cost {
    /// A cost of `base_us` µs plus `per_kib_us` µs per KiB.
    pub const fn micros(base_us: u64, per_kib_us: u64) -> Self {
        Cost {
            base: Duration::from_micros(base_us),
            per_kib: Duration::from_micros(per_kib_us),
        }
    }

    /// True when it costs nothing at any size.
    pub fn is_zero(&self) -> bool {
        self.base.is_zero() && self.per_kib.is_zero()
    }

    /// The cost for `bytes` of object.
    pub fn of(&self, bytes: usize) -> Duration {
        self.base + self.per_kib.mul_f64(bytes as f64 / 1024.0)
    }
}

/// Server CPU per request by verb, plus commit latency per write.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CostModel {
    /// CPU burned for a GET.
    pub get: Cost,
    /// CPU burned for a LIST (per KiB of the whole list).
    pub list: Cost,
    /// CPU burned to start a WATCH.
    pub watch: Cost,
    /// CPU burned for a write (create/update/patch/delete), including fanning the change out
    /// to watchers.
    pub write: Cost,
    /// CPU the watch cache spends on each event before any watcher may send it (per KiB of
    /// the serialized event), serially per kind: how far watchers trail a busy server
    /// (`crate::watch_cache`).
    pub dispatch: Cost,
    /// CPU a watcher spends on each chunk of events it sends (per KiB of the chunk): a real
    /// server's watch handler encodes, frames, encrypts and writes, and flushes only once no
    /// further event is waiting (`serveWatch`), on the same cores as every request. While a
    /// burst keeps the cores busy the write waits for one, the events dispatched meanwhile go
    /// out with the next write, and a watcher receives the burst in clumps, not one event per
    /// read.
    pub send: Cost,
    /// Time a write waits for its commit (etcd Raft + fsync), not CPU.
    pub commit: Cost,
    /// Extra commit wait per write already committing when this one starts (`base + per_kib ×`
    /// this write's KiB), not CPU: a write that arrives behind others waits for them, and a
    /// quiet server commits sooner than a busy one. With a per-KiB part a small write gets
    /// through a busy server sooner than a large one, as goroutines sharing a real server's
    /// cores do: each waits in proportion to its own work.
    pub commit_queue: Cost,
    /// Time etcd takes to commit one *batch* of writes (`base + per_kib ×` the batch's KiB), not
    /// CPU: etcd's Raft loop commits the proposals that arrived while the previous batch was
    /// being written, together, with one fsync, and its watch hands the apiserver the batch's
    /// events together. One batch commits at a time, so under a write burst batches grow, each
    /// takes longer, and watchers hear of changes in clumps a batch apart; a quiet server
    /// commits each write on its own. Added to [`Self::commit`]; zero: no batching.
    pub group_commit: Cost,
    /// How often a cacher that is behind moves its watchers on, not CPU. Presumably what etcd
    /// does to a watch that could not take its events when they were committed: it serves it
    /// from its backlog on a 100 ms timer. While a burst keeps the cacher behind, watchers
    /// receive the events in chunks this far apart, and a controller that batches what arrives
    /// together sees few, large batches. A cacher that keeps up passes each event on at once.
    /// Zero: every event as soon as it is dispatched.
    pub catch_up: Duration,
    /// Time a Service create spends on its ClusterIP and NodePort allocations (etcd
    /// transactions on a real server), not CPU, one create at a time: what spreads a burst of
    /// creates out.
    pub allocate: Cost,
    /// CPU of one TLS handshake beyond kube-sim's own (rustls with an ECDSA P-256 key): a real
    /// server signs each handshake with its serving key, RSA-2048 where kubeadm made it.
    pub handshake: Cost,
}

impl CostModel {
    /// No cost: kube-sim as it is (the default).
    pub fn free() -> Self {
        Self::default()
    }

    /// Calibrated against kube-apiserver 1.36.2 + etcd 3.6.8 on a 2-core machine: `ccm bench
    /// reference` plays the workload of that server's reference run (32 clients register
    /// 1,000 Nodes with the reference run's bodies, 200 LoadBalancer Services from 32 clients,
    /// a join; the sim cloud in the CCM's process) against the CCM measured there (main
    /// 1fc782c), and these costs reproduce it (docs/BENCHMARKS.md lists every figure, and the
    /// ones the model does not reproduce: LB ingress at p99, the kubelets' registrations, the
    /// CCM's CPU after the burst, which a server without cost does not reproduce either).
    ///
    /// kube-sim's own request handling (JSON and protobuf, strategic-merge patches,
    /// managedFields, watch fan-out) is real CPU on the same cores, and with bodies the size a
    /// real cluster's are it is most of what a real server spends; the model adds only the
    /// rest: a write 0.55 ms + 0.07 ms/KiB of CPU, a GET 0.15 ms + 0.02 ms/KiB, a LIST 0.3 ms +
    /// 0.06 ms/KiB, a WATCH 0.3 ms to start, and etcd's commit as time, not CPU: 2 ms +
    /// 0.5 ms/KiB per write (what a quiet server's LB ingress leaves for two writes beside a
    /// 50 ms cloud call), plus 0.5 ms per write already committing (a burst's 32 kubelets wait
    /// behind each other; a quiet server's writes do not). The watch cache spends 20 µs on
    /// each event, one at a time per kind, and each watcher 40 µs + 5 µs/KiB on each write it
    /// sends: together they make watchers trail a busy server by the second the real one
    /// showed. A cacher that is behind moves its watchers on every 100 ms, so the CCM gets a
    /// burst's Nodes in chunks: the real CCM asked the cloud for instance metadata 52 times
    /// for 1,000 Nodes, one call per chunk, and spent 0.68 s of CPU; fed one event at a time
    /// it asks 120–136 times and spends 0.7–1.2 s. A Service create takes its turn at the
    /// allocator for 3 ms, one at a time: the real server's 200 creates from 32 clients took
    /// 0.9 s.
    pub fn calibrated() -> Self {
        CostModel {
            get: Cost::micros(150, 20),
            list: Cost::micros(300, 60),
            watch: Cost::micros(300, 0),
            write: Cost::micros(550, 70),
            dispatch: Cost::micros(20, 0),
            send: Cost::micros(40, 5),
            commit: Cost::micros(2_000, 500),
            commit_queue: Cost::micros(500, 0),
            group_commit: Cost::default(),
            catch_up: Duration::from_millis(100),
            allocate: Cost::micros(3_000, 0),
            handshake: Cost::default(),
        }
    }

    /// The same model with every request's CPU multiplied by `factor` (commit latency kept):
    /// a slower or faster server than the one it was calibrated on.
    pub fn cpu_scaled(self, factor: f64) -> Self {
        let scale = |c: Cost| Cost {
            base: c.base.mul_f64(factor.max(0.0)),
            per_kib: c.per_kib.mul_f64(factor.max(0.0)),
        };
        CostModel {
            get: scale(self.get),
            list: scale(self.list),
            watch: scale(self.watch),
            write: scale(self.write),
            dispatch: scale(self.dispatch),
            send: scale(self.send),
            commit: self.commit,
            commit_queue: self.commit_queue,
            group_commit: self.group_commit,
            catch_up: self.catch_up,
            allocate: self.allocate,
            handshake: scale(self.handshake),
        }
    }

    /// Sets one knob from `KNOB=BASE_US+PER_KIB_US` (e.g. `write=1800+200`), `KNOB` one of
    /// `get`, `list`, `watch`, `write`, `dispatch`, `send`, `commit`, `commit-queue` (µs per write
    /// ahead), `group-commit`, `catch-up` (µs between chunks, no per-KiB part),
    /// `allocate`, `handshake`: to fit the model to another server, or to ask how
    /// a figure moves with one cost.
    pub fn set_knob(&mut self, spec: &str) -> Result<(), String> {
        let usage = || {
            format!(
                "{spec:?}: expected KNOB=BASE_US+PER_KIB_US with KNOB one of get, list, watch, \
                 write, dispatch, send, commit, commit-queue, group-commit, \
                 catch-up (BASE_US only), allocate, handshake (e.g. write=1800+200)"
            )
        };
        let (knob, value) = spec.split_once('=').ok_or_else(usage)?;
        let (base, per_kib) = value.split_once('+').unwrap_or((value, "0"));
        let (Ok(base), Ok(per_kib)) = (base.trim().parse(), per_kib.trim().parse()) else {
            return Err(usage());
        };
        let cost = Cost::micros(base, per_kib);
        match knob.trim() {
            "get" => self.get = cost,
            "list" => self.list = cost,
            "watch" => self.watch = cost,
            "write" => self.write = cost,
            "dispatch" => self.dispatch = cost,
            "send" => self.send = cost,
            "commit" => self.commit = cost,
            "commit-queue" => self.commit_queue = cost,
            "group-commit" => self.group_commit = cost,
            "catch-up" if cost.per_kib.is_zero() => self.catch_up = cost.base,
            "allocate" => self.allocate = cost,
            "handshake" => self.handshake = cost,
            _ => return Err(usage()),
        }
        Ok(())
    }

    /// True when every cost is zero.
    pub fn is_free(&self) -> bool {
        *self == Self::default()
    }

    /// CPU to burn for a request of `verb` over `bytes` of object.
    pub fn cpu(&self, verb: Verb, bytes: usize) -> Duration {
        match verb {
            Verb::Get => self.get.of(bytes),
            Verb::List => self.list.of(bytes),
            Verb::Watch => self.watch.of(0),
            Verb::Create | Verb::Update | Verb::Patch | Verb::Delete => self.write.of(bytes),
        }
    }

    /// Time a write of `bytes` waits for its commit behind `ahead` writes already committing;
    /// zero for reads.
    pub fn commit(&self, verb: Verb, bytes: usize, ahead: usize) -> Duration {
        if verb.is_write() {
            let ahead = u32::try_from(ahead).unwrap_or(u32::MAX);
            self.commit.of(bytes) + self.commit_queue.of(bytes).saturating_mul(ahead)
        } else {
            Duration::ZERO
        }
    }

    /// Waits a Service create's allocations, holding `allocator` meanwhile: a real server
    /// keeps each range's bitmap in one etcd key and updates it with compare-and-swap, so
    /// concurrent creates retry until their turn and allocate one at a time.
    pub(crate) async fn charge_allocation(&self, allocator: &tokio::sync::Mutex<()>) {
        let wait = self.allocate.of(0);
        if !wait.is_zero() {
            let _turn = allocator.lock().await;
            tokio::time::sleep(wait).await;
        }
    }

    /// Burns one TLS handshake's CPU on a blocking thread.
    pub(crate) async fn charge_handshake(&self) {
        burn_on_blocking_thread(self.handshake.of(0)).await;
    }

    /// Burns one watch event's dispatch CPU on a blocking thread.
    pub(crate) async fn charge_dispatch(&self, bytes: usize) {
        burn_on_blocking_thread(self.dispatch.of(bytes)).await;
    }

    /// Burns the CPU of one watch write of `bytes` on a blocking thread (none when `send` is
    /// free: the write goes out at once).
    pub(crate) async fn charge_send(&self, bytes: usize) {
        burn_on_blocking_thread(self.send.of(bytes)).await;
    }

    /// Charges one request: burns its CPU on a blocking thread (real cores, real contention);
    /// a write then waits for its batch to commit (`group_commit`), then its own commit
    /// latency behind the writes already committing (`commit_queue`).
    pub(crate) async fn charge(&self, verb: Verb, bytes: usize, etcd: &Etcd) {
        burn_on_blocking_thread(self.cpu(verb, bytes)).await;
        if !verb.is_write() {
            return;
        }
        if !self.group_commit.is_zero() {
            etcd.batches.commit(self.group_commit, bytes).await;
        }
        let queued = Queued::join(&etcd.committing);
        let commit = self.commit(verb, bytes, queued.ahead);
        if !commit.is_zero() {
            tokio::time::sleep(commit).await;
        }
    }
}

/// What a server's writes wait for together: the writes committing now and etcd's batches.
#[derive(Default)]
pub(crate) struct Etcd {
    /// Writes waiting for their commit now ([`CostModel::commit_queue`]).
    pub(crate) committing: AtomicUsize,
    /// Batches of writes committing one after another ([`CostModel::group_commit`]).
    pub(crate) batches: Arc<GroupCommit>,
}

/// etcd's group commit: one batch commits at a time, and the writes that arrive meanwhile join
/// the next batch. A committer task (not a request's future, which a client may drop) writes
/// the batches until none is waiting.
#[derive(Default)]
pub(crate) struct GroupCommit {
    state: parking_lot::Mutex<Batches>,
}

#[derive(Default)]
struct Batches {
    /// True while the committer task runs.
    committing: bool,
    /// The batch writes join now: its size so far and what its writes wait on.
    next: Option<(usize, watch::Sender<bool>)>,
}

impl GroupCommit {
    /// Joins the next batch with `bytes` and waits until that batch has committed, each batch
    /// taking `cost` of its total size.
    async fn commit(self: &Arc<Self>, cost: Cost, bytes: usize) {
        let mut done = {
            let mut st = self.state.lock();
            let (size, tx) = st.next.get_or_insert_with(|| (0, watch::channel(false).0));
            *size += bytes;
            let rx = tx.subscribe();
            if !st.committing {
                st.committing = true;
                tokio::spawn(Arc::clone(self).run(cost));
            }
            rx
        };
        // An error means the committer is gone (the runtime shuts down): nothing to wait for.
        let _ = done.wait_for(|committed| *committed).await;
    }

    /// Commits batch after batch until no write waits.
    async fn run(self: Arc<Self>, cost: Cost) {
        loop {
            let batch = {
                let mut st = self.state.lock();
                match st.next.take() {
                    Some(b) => b,
                    None => {
                        st.committing = false;
                        return;
                    }
                }
            };
            tokio::time::sleep(cost.of(batch.0)).await;
            let _ = batch.1.send(true);
        }
    }
}

/// One write in the commit queue, counted out again however its request ends (a client that
/// hangs up drops the request's future mid-commit).
struct Queued<'a> {
    committing: &'a AtomicUsize,
    /// Writes that were committing when this one joined.
    ahead: usize,
}

impl<'a> Queued<'a> {
    fn join(committing: &'a AtomicUsize) -> Self {
        let ahead = committing.fetch_add(1, Ordering::Relaxed);
        Queued { committing, ahead }
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.committing.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Burns `cpu` on a blocking thread: real cores, real contention, and the async caller's
/// worker stays free meanwhile.
async fn burn_on_blocking_thread(cpu: Duration) {
    if !cpu.is_zero() {
        let _ = tokio::task::spawn_blocking(move || burn(cpu)).await;
    }
}

/// Spins for `cpu` of this thread's CPU time (not wall time: a descheduled thread has not
/// done the work yet, exactly as a real server's goroutine would not have).
fn burn(cpu: Duration) {
    let start_cpu = thread_cpu();
    let start_wall = Instant::now();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    loop {
        for _ in 0..2_000 {
            x = x.rotate_left(5) ^ x.wrapping_mul(0x2545_f491_4f6c_dd1d);
        }
        std::hint::black_box(x);
        let spent = match (start_cpu, thread_cpu()) {
            (Some(a), Some(b)) => b.saturating_sub(a),
            _ => start_wall.elapsed(),
        };
        // Never spin forever if the clock misbehaves.
        if spent >= cpu || start_wall.elapsed() >= cpu * 50 {
            return;
        }
    }
}

/// This thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`, nanosecond resolution).
fn thread_cpu() -> Option<Duration> {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Some(Duration::new(
        u64::try_from(t.tv_sec).ok()?,
        u32::try_from(t.tv_nsec).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_grow_with_size_and_only_writes_commit() {
        let m = CostModel::calibrated();
        assert!(m.cpu(Verb::Patch, 4096) > m.cpu(Verb::Patch, 1024));
        assert!(m.cpu(Verb::List, 1 << 20) > m.cpu(Verb::Get, 4096));
        assert_eq!(m.commit(Verb::Get, 4096, 0), Duration::ZERO);
        assert!(m.commit(Verb::Create, 4096, 0) > Duration::ZERO);
        assert!(CostModel::free().is_free());
        assert_eq!(CostModel::free().cpu(Verb::Create, 1 << 20), Duration::ZERO);
    }

    #[test]
    fn a_knob_sets_one_cost_and_a_malformed_one_is_named() {
        let mut m = CostModel::calibrated();
        m.set_knob("write=1800+200").expect("valid knob");
        assert_eq!(m.write, Cost::micros(1_800, 200));
        m.set_knob("get=500").expect("per KiB defaults to 0");
        assert_eq!(m.get, Cost::micros(500, 0));
        m.set_knob("send=40+3").expect("a watch write's CPU");
        assert_eq!(m.send, Cost::micros(40, 3));
        m.set_knob("handshake=1500").expect("a TLS handshake's CPU");
        assert_eq!(m.handshake, Cost::micros(1_500, 0));
        let err = m.set_knob("wrte=1+1").expect_err("unknown knob");
        assert!(err.contains("wrte=1+1") && err.contains("write"), "{err}");
        assert!(m.set_knob("write=fast").is_err());
        m.set_knob("commit-queue=300").expect("µs per write ahead");
        assert_eq!(m.commit_queue, Cost::micros(300, 0));
        m.set_knob("commit-queue=100+200")
            .expect("and per KiB of this write");
        assert_eq!(m.commit_queue, Cost::micros(100, 200));
        let err = m.set_knob("catch-up=300+10").expect_err("no per-KiB part");
        assert!(err.contains("catch-up (BASE_US only)"), "{err}");
    }

    /// A 2-ms commit and `queue` per write ahead, nothing else.
    fn queued_commits(queue: Cost) -> CostModel {
        CostModel {
            commit: Cost::micros(2_000, 0),
            commit_queue: queue,
            ..CostModel::free()
        }
    }

    /// How long a PATCH of `bytes` takes to be charged.
    async fn timed_patch(model: &CostModel, etcd: &Etcd, bytes: usize) -> Duration {
        let start = tokio::time::Instant::now();
        model.charge(Verb::Patch, bytes, etcd).await;
        start.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_behind_others_commits_later_than_one_on_a_quiet_server() {
        let model = queued_commits(Cost::micros(1_000, 0));
        let etcd = Etcd::default();
        let write = || timed_patch(&model, &etcd, 0);
        assert_eq!(
            write().await,
            Duration::from_millis(2),
            "alone: the commit only"
        );
        // Paused time: the three start together and each waits for those that joined first.
        let (a, b, c) = tokio::join!(write(), write(), write());
        let mut waits = [a, b, c];
        waits.sort();
        assert_eq!(waits.map(|d| d.as_millis()), [2, 3, 4]);
        assert_eq!(
            etcd.committing.load(Ordering::Relaxed),
            0,
            "every write left the queue"
        );
        assert_eq!(write().await, Duration::from_millis(2), "quiet again");
    }

    #[tokio::test(start_paused = true)]
    async fn behind_the_same_writes_a_small_write_commits_sooner_than_a_large_one() {
        let model = queued_commits(Cost::micros(0, 1_000));
        let etcd = Etcd::default();
        let write = |kib: usize| {
            let (model, etcd) = (&model, &etcd);
            async move { timed_patch(model, etcd, kib * 1024).await.as_millis() }
        };
        assert_eq!(write(4).await, 2, "alone: the commit only");
        // Paused time: the three join together; each waits 1 ms per KiB of its own for each
        // write ahead of it.
        let (first, small, large) = tokio::join!(write(8), write(1), write(4));
        assert_eq!((first, small, large), (2, 3, 10));
    }

    #[tokio::test(start_paused = true)]
    async fn writes_that_arrive_during_a_commit_commit_together_in_the_next_batch() {
        let mut model = CostModel::free();
        model.group_commit = Cost::micros(2_000, 1_000);
        let etcd = Etcd::default();
        let write = |after_ms: u64| {
            let (model, etcd) = (&model, &etcd);
            async move {
                let t0 = tokio::time::Instant::now();
                tokio::time::sleep(Duration::from_millis(after_ms)).await;
                model.charge(Verb::Patch, 1024, etcd).await;
                t0.elapsed().as_millis()
            }
        };
        assert_eq!(write(0).await, 3, "alone: a batch of one KiB");
        // The first commits alone (0–3 ms); the two that arrive meanwhile commit together,
        // a batch of two KiB (3–7 ms); the last arrives after it and commits alone (8–11 ms).
        let done = tokio::join!(write(0), write(1), write(2), write(8));
        assert_eq!(<[u128; 4]>::from(done), [3, 7, 7, 11]);
        assert_eq!(write(0).await, 3, "quiet again: no batch left waiting");
    }

    #[tokio::test(start_paused = true)]
    async fn service_creates_take_turns_at_the_allocator() {
        let mut model = CostModel::free();
        model.allocate = Cost::micros(10_000, 0);
        let allocator = tokio::sync::Mutex::new(());
        let start = tokio::time::Instant::now();
        let create = || async {
            model.charge_allocation(&allocator).await;
            start.elapsed()
        };
        let (a, b) = tokio::join!(create(), create());
        // Paused time: the clock moves only by the sleeps, so overlap would end both at 10 ms.
        let (first, last) = (a.min(b), a.max(b));
        assert_eq!(first, Duration::from_millis(10));
        assert_eq!(last, Duration::from_millis(20));
    }

    #[test]
    fn burn_spends_the_cpu_it_is_asked_for() {
        let before = thread_cpu().expect("thread CPU clock");
        burn(Duration::from_millis(20));
        let spent = thread_cpu().expect("thread CPU clock") - before;
        assert!(spent >= Duration::from_millis(20), "burned only {spent:?}");
    }
}
