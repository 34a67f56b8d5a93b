//! The faults `ccm bench chaos` and `--api-429-rate` inject, seen through kube-rs: throttling
//! one client only, a restart (503 while down, resourceVersions expired after), and watches
//! closed instead of delivering an event.

use std::time::Duration;

use ccm_kube_sim::{Config, KubeSim};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use serde_json::json;

/// Generous bound for anything that should happen "soon" on a loaded 2-core machine.
const SOON: Duration = Duration::from_secs(60);

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
}

async fn sim() -> KubeSim {
    KubeSim::start(Config::default()).await.unwrap()
}

/// A client that sees every answer: kube-rs retries 429 and 503 by default.
fn client(sim: &KubeSim, user_agent: &str) -> kube::Client {
    let mut config = sim.kube_config(user_agent).unwrap();
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

fn api_code(e: kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("expected an API error, got {other}"),
    }
}

#[tokio::test]
async fn throttling_reaches_only_the_clients_of_the_prefix() {
    let sim = sim().await;
    sim.faults().set_client_prefix(Some("throttled".into()));
    sim.faults().set_429_rate(None, 1.0);
    let spared: Api<ConfigMap> = Api::namespaced(client(&sim, "spared/1"), "default");
    let throttled: Api<ConfigMap> = Api::namespaced(client(&sim, "throttled/1"), "default");
    spared
        .create(&PostParams::default(), &config_map("a"))
        .await
        .expect("a client outside the prefix is not throttled");
    let err = throttled
        .create(&PostParams::default(), &config_map("b"))
        .await
        .unwrap_err();
    assert_eq!(api_code(err), 429);
    assert!(spared.get_opt("b").await.unwrap().is_none());
}

#[tokio::test]
async fn a_restart_answers_503_then_resumed_watches_get_410() {
    let sim = sim().await;
    let cms: Api<ConfigMap> = Api::namespaced(client(&sim, "test"), "default");
    let made = cms
        .create(&PostParams::default(), &config_map("before"))
        .await
        .unwrap();
    let rv = made.metadata.resource_version.unwrap();
    cms.create(&PostParams::default(), &config_map("after"))
        .await
        .unwrap();
    // Down for far longer than the test: every request is refused until the fault is cleared.
    sim.faults().restart(Duration::from_secs(3600));
    let err = cms.get("before").await.unwrap_err();
    assert_eq!(api_code(err), 503);
    sim.faults().clear();
    assert!(
        cms.get_opt("before").await.unwrap().is_some(),
        "storage kept"
    );
    let stream = cms.watch(&WatchParams::default(), &rv).await.unwrap();
    futures::pin_mut!(stream);
    let first = tokio::time::timeout(SOON, stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    match first {
        WatchEvent::Error(e) => assert_eq!(e.code, 410),
        other => panic!("expected 410 Expired on resume, got {other:?}"),
    }
}

#[tokio::test]
async fn a_dropped_watch_event_closes_the_watch_and_is_replayed_on_resume() {
    let sim = sim().await;
    let cms: Api<ConfigMap> = Api::namespaced(client(&sim, "test"), "default");
    let made = cms
        .create(&PostParams::default(), &config_map("first"))
        .await
        .unwrap();
    let rv = made.metadata.resource_version.unwrap();
    sim.faults().set_watch_drop_rate(1.0);
    let stream = cms.watch(&WatchParams::default(), &rv).await.unwrap();
    futures::pin_mut!(stream);
    cms.create(&PostParams::default(), &config_map("second"))
        .await
        .unwrap();
    let end = tokio::time::timeout(SOON, stream.next()).await.unwrap();
    assert!(end.is_none(), "the watch closes without the event: {end:?}");
    sim.faults().set_watch_drop_rate(0.0);
    let stream = cms.watch(&WatchParams::default(), &rv).await.unwrap();
    futures::pin_mut!(stream);
    let ev = tokio::time::timeout(SOON, stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    match ev {
        WatchEvent::Added(cm) => assert_eq!(cm.metadata.name.as_deref(), Some("second")),
        other => panic!("expected the dropped ADDED on resume, got {other:?}"),
    }
}
