//! The TLS handshake's cost (`--api-cost-knob handshake=…`) and the connection count the
//! reference bench reports per phase: a client pays the handshake once per connection, and a
//! request on a kept-alive connection pays nothing more.

use std::time::{Duration, Instant};

use ccm_kube_sim::cost::{Cost, CostModel};
use ccm_kube_sim::{Config, KubeSim};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;

const HANDSHAKE: Duration = Duration::from_millis(150);

async fn timed_list(api: &Api<ConfigMap>) -> Duration {
    let start = Instant::now();
    api.list(&Default::default()).await.expect("list");
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_connection_pays_the_handshake_once() {
    let sim = KubeSim::start(Config {
        tls: true,
        ..Config::default()
    })
    .await
    .expect("kube-sim");
    let mut model = CostModel::free();
    model.handshake = Cost {
        base: HANDSHAKE,
        per_kib: Duration::ZERO,
    };
    sim.set_cost_model(model);
    let before = sim.accepted_connections();
    let api: Api<ConfigMap> = Api::namespaced(sim.client().expect("client"), "default");

    let first = timed_list(&api).await;
    assert!(first >= HANDSHAKE, "a new connection: {first:?}");
    assert_eq!(sim.accepted_connections() - before, 1);
    api.list(&Default::default()).await.expect("list");
    assert_eq!(
        sim.accepted_connections() - before,
        1,
        "the kept-alive connection, no second handshake"
    );

    let other: Api<ConfigMap> = Api::namespaced(sim.client().expect("client"), "default");
    assert!(
        timed_list(&other).await >= HANDSHAKE,
        "another client's connection"
    );
    assert_eq!(sim.accepted_connections() - before, 2);
}
