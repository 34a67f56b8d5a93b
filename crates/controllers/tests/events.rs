//! Events as `kubectl get events` shows them: a repeated event on the same object is one
//! Event whose count grows, different messages or objects are separate Events.

use std::time::Duration;

use ccm_controllers::events::{EventType, Recorder};
use ccm_kube_sim::{Config, KubeSim};
use k8s_openapi::api::core::v1::{Event, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams};

fn node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// (object, message, count) of every Event, sorted.
async fn events(client: &kube::Client) -> Vec<(String, String, i32)> {
    let mut out: Vec<_> = Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .map(|e| {
            (
                e.involved_object.name.unwrap_or_default(),
                e.message.unwrap_or_default(),
                e.count.unwrap_or_default(),
            )
        })
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn repeats_on_one_object_fold_into_one_event_with_a_count() {
    let sim = KubeSim::start(Config::default()).await.expect("kube-sim");
    let client = sim.client().expect("client");
    let recorder = Recorder::new(client.clone(), "cloud-node-controller");
    for _ in 0..3 {
        recorder.publish(&node("a"), EventType::Warning, "Failed", "cloud said no");
    }
    recorder.publish(&node("a"), EventType::Warning, "Failed", "cloud said maybe");
    for i in 0..200 {
        recorder.publish(&node(&format!("n{i}")), EventType::Normal, "Synced", "ok");
    }
    let mut want = vec![
        ("a".to_string(), "cloud said maybe".to_string(), 1),
        ("a".to_string(), "cloud said no".to_string(), 3),
    ];
    want.extend((0..200).map(|i| (format!("n{i}"), "ok".to_string(), 1)));
    want.sort();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let got = events(&client).await;
        if got == want || tokio::time::Instant::now() > deadline {
            assert_eq!(got, want);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
