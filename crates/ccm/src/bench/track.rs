//! Watching objects reach a state, the simulated kubelets and clients, and the request
//! accounting every scenario shares.

use std::collections::{BTreeMap, HashMap};
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_controllers::nodeutil::{
    ConditionStatus, TAINT_UNINITIALIZED, condition_status, has_taint,
};
use ccm_manager::client::USER_AGENT_BASE;
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use parking_lot::Mutex;

use super::BenchOptions;
use super::env::Env;
use super::report::ScenarioResult;
use crate::cluster::SimCluster;

/// Records when each object first satisfied a predicate, from a watch, and when the watch
/// first showed it at all: the API server's lag behind its own writes, which every watcher —
/// the CCM's informers too — waits out before it can act.
pub(super) struct Tracker {
    pub(super) first: Arc<Mutex<HashMap<String, Instant>>>,
    pub(super) seen: Arc<Mutex<HashMap<String, Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Tracker {
    /// Watches every object of kind `K` and notes when each first satisfies `pred`.
    pub(super) fn watch<K>(client: kube::Client, pred: fn(&K) -> bool) -> Self
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug
            + Send
            + 'static,
    {
        let first: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
        let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
        let (f, s) = (first.clone(), seen.clone());
        let task = tokio::spawn(async move {
            // Backoff matters: without it a watch error (the API server going away at the end of
            // a scenario) is retried in a tight loop that never yields to the runtime.
            let stream = watcher::watcher(Api::<K>::all(client), watcher::Config::default())
                .default_backoff();
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                let obj = match ev {
                    Ok(watcher::Event::Apply(o)) | Ok(watcher::Event::InitApply(o)) => o,
                    _ => continue,
                };
                let Some(name) = obj.meta().name.clone() else {
                    continue;
                };
                let now = Instant::now();
                if pred(&obj) {
                    f.lock().entry(name.clone()).or_insert(now);
                }
                s.lock().entry(name).or_insert(now);
            }
        });
        Tracker { first, seen, task }
    }

    pub(super) fn nodes(client: kube::Client, pred: fn(&Node) -> bool) -> Self {
        Self::watch(client, pred)
    }

    pub(super) fn services(client: kube::Client) -> Self {
        Self::watch::<Service>(client, |svc| {
            svc.status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|l| l.ingress.as_ref())
                .is_some_and(|i| !i.is_empty())
        })
    }

    pub(super) fn count(&self) -> usize {
        self.first.lock().len()
    }

    pub(super) fn latencies(&self, created: &HashMap<String, Instant>) -> Vec<f64> {
        let first = self.first.lock();
        created
            .iter()
            .filter_map(|(n, c)| {
                first
                    .get(n)
                    .map(|f| f.saturating_duration_since(*c).as_secs_f64())
            })
            .collect()
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub(super) fn initialized(n: &Node) -> bool {
    !has_taint(n, TAINT_UNINITIALIZED)
        && n.spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .is_some_and(|p| !p.is_empty())
}

pub(super) fn spinner(msg: &str) -> ProgressBar {
    if std::io::stderr().is_terminal() {
        let pb = ProgressBar::new_spinner();
        pb.set_style(
            ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        pb.set_message(msg.to_string());
        pb.enable_steady_tick(Duration::from_millis(120));
        pb
    } else {
        eprintln!("bench: {msg}");
        ProgressBar::hidden()
    }
}

/// Registers nodes `range` concurrently; returns each node's creation instant.
pub(super) async fn add_nodes(
    cluster: &SimCluster,
    range: std::ops::Range<u32>,
    kubelets: usize,
) -> anyhow::Result<HashMap<String, Instant>> {
    Ok(register_nodes(cluster, range, kubelets)
        .await?
        .into_iter()
        .map(|(n, (start, _))| (n, start))
        .collect())
}

/// Registers nodes `range` concurrently; returns when each kubelet started (just before its
/// POST) and finished (after its status PATCH).
pub(super) async fn register_nodes(
    cluster: &SimCluster,
    range: std::ops::Range<u32>,
    kubelets: usize,
) -> anyhow::Result<HashMap<String, (Instant, Instant)>> {
    let results: Vec<anyhow::Result<(String, (Instant, Instant))>> = futures::stream::iter(range)
        .map(|i| async move {
            let t = Instant::now();
            let name = cluster.add_node(i).await?;
            Ok((name, (t, Instant::now())))
        })
        .buffer_unordered(kubelets.max(1))
        .collect()
        .await;
    results.into_iter().collect()
}

/// `NetworkUnavailable=False`: the route controller (or the fold) says the node is routed.
pub(super) fn routed(n: &Node) -> bool {
    condition_status(n, "NetworkUnavailable") == ConditionStatus::False
}

/// Clients creating the Services of the services and idle scenarios.
pub(super) const SERVICE_CLIENTS: usize = 64;

/// Creates `n` LoadBalancer Services from `clients` at once. Each one's time zero is when its
/// create returned, as the reference run timed its Nodes: a create's own wait (its turn at the
/// allocator) is the server's, not the CCM's.
pub(super) async fn add_services(
    cluster: &SimCluster,
    prefix: &str,
    n: u32,
    clients: usize,
) -> anyhow::Result<HashMap<String, Instant>> {
    let results: Vec<anyhow::Result<(String, Instant)>> = futures::stream::iter(0..n)
        .map(|i| async move {
            let name = format!("{prefix}-{i}");
            cluster.add_service(&name).await?;
            Ok((name, Instant::now()))
        })
        .buffer_unordered(clients.max(1))
        .collect()
        .await;
    results.into_iter().collect()
}

pub(super) async fn api_stats(env: &Env, nodes: u32, r: &mut ScenarioResult) {
    if env.cluster.kube.is_some() && nodes > 0 {
        r.api_node_writes_per_node =
            Some(env.cluster.ccm_writes(Some("nodes")) as f64 / f64::from(nodes));
        r.api_writes_per_node = Some(env.cluster.ccm_writes(None) as f64 / f64::from(nodes));
    }
    r.api_requests = env.cluster.ccm_requests();
    if nodes > 0 {
        r.api_requests_per_node = per_node_by_verb(&r.api_requests, nodes);
    }
    r.cloud_calls = env.cloud_calls().await;
    r.api_429_answers = env
        .cluster
        .kube
        .as_ref()
        .map(|k| k.count_requests(|k| k.client.starts_with(USER_AGENT_BASE) && k.code == 429))
        .filter(|n| *n > 0);
}

/// `"verb resource" → count` folded to `verb → count per node`, leader-election leases left
/// out (they cost the same whatever the cluster size).
pub(super) fn per_node_by_verb(
    requests: &BTreeMap<String, u64>,
    nodes: u32,
) -> BTreeMap<String, f64> {
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    for (key, n) in requests {
        let mut parts = key.split(' ');
        let (Some(verb), Some(resource)) = (parts.next(), parts.next()) else {
            continue;
        };
        if resource.starts_with("leases") {
            continue;
        }
        *out.entry(verb.to_string()).or_default() += *n as f64 / f64::from(nodes);
    }
    out
}

/// Per node: time from its kubelet's first request until both `a` and `b` had happened.
pub(super) fn both_latencies(
    a: &Tracker,
    b: &Tracker,
    started: &HashMap<String, Instant>,
) -> (Vec<f64>, Option<Instant>) {
    let (fa, fb) = (a.first.lock(), b.first.lock());
    let mut last = None;
    let v = started
        .iter()
        .filter_map(|(n, c)| {
            let done = (*fa.get(n)?).max(*fb.get(n)?);
            last = Some(last.map_or(done, |l: Instant| l.max(done)));
            Some(done.saturating_duration_since(*c).as_secs_f64())
        })
        .collect();
    (v, last)
}

pub(super) async fn add_cluster_ip_services(cluster: &SimCluster, n: u32) -> anyhow::Result<()> {
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(0..n)
        .map(|i| async move { cluster.add_cluster_ip_service(&format!("cip-{i}")).await })
        .buffer_unordered(64)
        .collect()
        .await;
    results.into_iter().collect()
}

/// One Node's join, as [`join_one`] measured it.
pub(super) struct Joined {
    /// Initialized and routed within the timeout.
    pub ok: bool,
    /// Seconds from its registration to initialized.
    pub initialized: f64,
    /// Seconds from its registration to routed.
    pub routed: f64,
    /// When its kubelet started registering it: what the join's other figures count from (not
    /// the trackers' listing of the cluster before it, seconds at 50,000 Nodes).
    pub at: Instant,
    /// The CCM's CPU seconds then.
    pub cpu_before: f64,
}

/// Node number `i` joins, once the trackers have listed the cluster.
pub(super) async fn join_one(env: &Env, opts: &BenchOptions, i: u32) -> anyhow::Result<Joined> {
    let client = env.cluster.user_client();
    let (init, net) = (
        Tracker::nodes(client.clone(), initialized),
        Tracker::nodes(client, routed),
    );
    // Both trackers list what exists (Nodes 0..i) first; the join is timed from after that.
    let settled = i as usize;
    env.until(opts.timeout.0, || async {
        Ok(init.count() >= settled && net.count() >= settled)
    })
    .await?;
    let cpu_before = env.usage().cpu_seconds;
    let (name, t) = env.cluster.register(i).await?;
    let ok = env
        .until(opts.timeout.0, || async {
            Ok(init.first.lock().contains_key(&name) && net.first.lock().contains_key(&name))
        })
        .await?;
    let created = HashMap::from([(name, t)]);
    let one = |t: &Tracker| t.latencies(&created).first().copied().unwrap_or(f64::NAN);
    Ok(Joined {
        ok,
        initialized: one(&init),
        routed: one(&net),
        at: t,
        cpu_before,
    })
}
