//! The CCM's API clients multiplex their requests on one HTTP/2 connection when the server
//! offers `h2`, as client-go does, instead of one HTTP/1.1 connection per request in flight.

use ccm_kube_sim::{Config, KubeSim};
use ccm_manager::client::{RateLimitLayer, build_client};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams};

async fn concurrent_requests(client: &kube::Client, round: &str, n: usize) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let requests = (0..n).map(|i| {
        let api = api.clone();
        async move {
            let cm = ConfigMap {
                metadata: kube::api::ObjectMeta {
                    name: Some(format!("{round}-{i}")),
                    ..Default::default()
                },
                ..Default::default()
            };
            api.create(&PostParams::default(), &cm)
                .await
                .expect("create");
            api.list(&ListParams::default()).await.expect("list");
        }
    });
    futures::future::join_all(requests).await;
}

/// Polls kube-sim's open connections until `ok` holds (closed sockets take a moment to be
/// noticed by the server); returns the last count.
async fn settle(sim: &KubeSim, ok: impl Fn(u64) -> bool) -> u64 {
    for _ in 0..100 {
        if ok(sim.open_connections()) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    sim.open_connections()
}

#[tokio::test]
async fn a_client_keeps_one_tls_connection_for_concurrent_requests() -> anyhow::Result<()> {
    let sim = KubeSim::start(Config {
        tls: true,
        ..Config::default()
    })
    .await?;
    let config = sim.kube_config("http2-test")?;
    let client = build_client(config.clone(), "http2-test", &RateLimitLayer::new(0.0, 0))?;
    concurrent_requests(&client, "first", 64).await;
    // The first concurrent requests race to connect; hyper keeps the first connection that
    // negotiates h2 and drops the others once they have.
    let ours = settle(&sim, |n| n == 1).await;
    assert_eq!(ours, 1, "64 concurrent creates and lists: open connections");
    concurrent_requests(&client, "second", 64).await;
    assert_eq!(
        settle(&sim, |n| n == 1).await,
        1,
        "a second round reuses it"
    );

    // kube-rs's own client speaks HTTP/1.1 only: one connection per request it had in
    // flight stays open in its pool.
    let plain = kube::Client::try_from(config)?;
    concurrent_requests(&plain, "http1", 64).await;
    let theirs = sim.open_connections() - ours;
    assert!(
        theirs > 4,
        "kube-rs's HTTP/1.1 client keeps only {theirs} connections: the comparison shows nothing"
    );
    Ok(())
}

#[tokio::test]
async fn a_plain_http_server_still_gets_http1() -> anyhow::Result<()> {
    let sim = KubeSim::start(Config::default()).await?;
    let config = sim.kube_config("http1-test")?;
    assert_eq!(config.cluster_url.scheme_str(), Some("http"));
    let client = build_client(config, "http1-test", &RateLimitLayer::new(0.0, 0))?;
    concurrent_requests(&client, "plain", 8).await;
    assert!(sim.open_connections() >= 1);
    Ok(())
}
