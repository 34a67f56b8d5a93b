//! The watch cache's dispatch cost (`--api-cost-knob dispatch=…`): watchers hear of writes only
//! after the kind's cacher has spent each event's CPU, one event at a time and in order, while
//! the writes themselves return without waiting for it; a cacher that is behind passes its backlog
//! on in chunks (`catch-up`).

use std::time::{Duration, Instant};

use ccm_kube_sim::cost::{Cost, CostModel};
use ccm_kube_sim::{Config, KubeSim};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use serde_json::json;

const EVENTS: usize = 4;
const PER_EVENT: Duration = Duration::from_millis(60);

async fn names_seen(
    api: &Api<ConfigMap>,
    rv: &str,
) -> impl futures::Stream<Item = kube::Result<String>> + use<> {
    let stream = api.watch(&WatchParams::default(), rv).await.unwrap();
    stream.filter_map(|e| async move {
        match e {
            Ok(WatchEvent::Added(cm)) => Some(Ok(cm.metadata.name.unwrap_or_default())),
            Ok(_) => None,
            Err(e) => Some(Err(e)),
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_hear_of_writes_after_the_cacher_dispatched_them_in_order() {
    let sim = KubeSim::start(Config::default()).await.unwrap();
    let mut model = CostModel::free();
    model.dispatch = Cost {
        base: PER_EVENT,
        per_kib: Duration::ZERO,
    };
    sim.set_cost_model(model);
    let api: Api<ConfigMap> = Api::namespaced(sim.client().unwrap(), "default");
    let rv = sim.resource_version().to_string();
    let first = Box::pin(names_seen(&api, &rv).await);
    let second = Box::pin(names_seen(&api, &rv).await);

    let start = Instant::now();
    for i in 0..EVENTS {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("cm-{i}")}})).unwrap();
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
    // Every write is stored at once: a read sees all of them whatever the watchers have heard.
    assert_eq!(
        api.list(&Default::default()).await.unwrap().items.len(),
        EVENTS
    );

    let want: Vec<String> = (0..EVENTS).map(|i| format!("cm-{i}")).collect();
    for stream in [first, second] {
        let seen: Vec<String> = stream.take(EVENTS).try_collect().await.unwrap();
        assert_eq!(seen, want, "every event, in order, to every watcher");
    }
    // One cacher per kind spends each event's CPU in turn: the last event cannot reach a
    // watcher before all of it has been spent.
    let took = start.elapsed();
    assert!(
        took >= PER_EVENT * EVENTS as u32,
        "{EVENTS} events at {PER_EVENT:?} each reached the watchers after {took:?}"
    );
}

/// The data frames of one raw watch of ConfigMaps until `events` lines have arrived.
async fn frames_until(client: &kube::Client, rv: &str, events: usize) -> Vec<usize> {
    let req = http::Request::get(format!(
        "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv}"
    ))
    .body(Vec::new())
    .unwrap();
    let mut body = client
        .send(req.map(kube::client::Body::from))
        .await
        .unwrap()
        .into_body();
    let mut lines_per_frame = Vec::new();
    while lines_per_frame.iter().sum::<usize>() < events {
        let frame = http_body_util::BodyExt::frame(&mut body)
            .await
            .expect("the watch stays open")
            .unwrap();
        if let Ok(data) = frame.into_data() {
            lines_per_frame.push(data.iter().filter(|b| **b == b'\n').count());
        }
    }
    lines_per_frame
}

/// Starts kube-sim with `model`, watches ConfigMaps raw, creates `EVENTS` of them at once and
/// returns how many events each data frame of the watch carried.
async fn frames_of_creates(model: CostModel) -> Vec<usize> {
    let sim = KubeSim::start(Config::default()).await.unwrap();
    sim.set_cost_model(model);
    let client = sim.client().unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let rv = sim.resource_version().to_string();
    let watch = tokio::spawn({
        let client = client.clone();
        async move { frames_until(&client, &rv, EVENTS).await }
    });
    // The watch is registered before the first write (a raw watch answers its headers at once).
    tokio::time::sleep(Duration::from_millis(200)).await;
    // All at once, so that every event is stored while the server is busy with the first.
    futures::future::try_join_all((0..EVENTS).map(|i| {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("cm-{i}")}})).unwrap();
        let api = api.clone();
        async move { api.create(&PostParams::default(), &cm).await }
    }))
    .await
    .unwrap();
    watch.await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_busy_writing_sends_the_events_that_arrived_meanwhile_in_one_write() {
    let mut model = CostModel::free();
    model.send = Cost {
        base: Duration::from_millis(300),
        per_kib: Duration::ZERO,
    };
    // The first write takes 300 ms of the server's CPU; the creates after it are done well
    // within that, so they leave together in the second write, not one write each.
    assert_all_in_two_writes_at_most(&frames_of_creates(model).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cacher_that_is_behind_hands_its_backlog_to_watchers_in_one_chunk() {
    let mut model = CostModel::free();
    // Long enough that every create lands while the cacher is still on the first event.
    model.dispatch = Cost {
        base: Duration::from_millis(300),
        per_kib: Duration::ZERO,
    };
    // Longer than the test: while behind, the cacher moves its watchers on only once it has
    // caught up.
    model.catch_up = Duration::from_secs(60);
    // The watcher may take the first event before the others are stored and send it alone;
    // the backlog follows in one write. Without the catch-up period each event would reach
    // the watcher once the cacher had spent its 300 ms on it: four writes, 300 ms apart.
    assert_all_in_two_writes_at_most(&frames_of_creates(model).await);
}

/// Every one of the `EVENTS` creates reached the watcher, in at most two writes: the first
/// event alone at most, the rest together.
fn assert_all_in_two_writes_at_most(frames: &[usize]) {
    assert_eq!(frames.iter().sum::<usize>(), EVENTS, "{frames:?}");
    assert!(
        frames.len() <= 2,
        "{EVENTS} events arrived in {} writes: {frames:?}",
        frames.len()
    );
}
