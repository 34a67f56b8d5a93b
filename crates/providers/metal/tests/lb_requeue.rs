//! The metal provider with the real service controller on kube-sim, with a retry backoff of an
//! hour: a Service waiting for an address gets one only if the provider requeues it when an
//! address frees (a Service deleted, a changed request) or the pools grow; and
//! `load_balancer_class` makes the provider serve exactly the Services of its class.

mod support;

use std::sync::Arc;
use std::time::Duration;

use ccm_cloud::{CloudProvider, InitContext};
use ccm_controllers::Shared;
use ccm_controllers::queue::Backoff;
use ccm_controllers::service::planner::LOAD_BALANCER_CLEANUP_FINALIZER;
use ccm_controllers::service::{ServiceConfig, ServiceController, ServiceHandle};
use ccm_provider_metal::{MetalCloud, MetalConfig};
use k8s_openapi::api::core::v1::{Event, Service, ServicePort, ServiceSpec};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use prometheus_client::registry::Registry;
use support::*;
use tokio_util::sync::CancellationToken;

const ONE_ADDRESS: &str = r#"
[[pools]]
name = "public"
addresses = ["192.0.2.10-192.0.2.10"]
"#;

const TWO_ADDRESSES: &str = r#"
[[pools]]
name = "public"
addresses = ["192.0.2.10-192.0.2.11"]
"#;

/// [`TWO_ADDRESSES`] and a pool only a request takes from.
const TWO_AND_MANUAL: &str = r#"
[[pools]]
name = "public"
addresses = ["192.0.2.10-192.0.2.11"]

[[pools]]
name = "manual"
addresses = ["198.51.100.5-198.51.100.5"]
auto_assign = false
"#;

const CLASS: &str = "metal.example.com/lb";

fn service(name: &str, class: Option<&str>) -> Service {
    let mut svc = Service::default();
    svc.metadata.name = Some(name.into());
    svc.metadata.namespace = Some("default".into());
    svc.spec = Some(ServiceSpec {
        type_: Some("LoadBalancer".into()),
        load_balancer_class: class.map(str::to_string),
        ports: Some(vec![ServicePort {
            port: 80,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        ..Default::default()
    });
    svc
}

async fn ingress(api: &Api<Service>, name: &str) -> Vec<String> {
    api.get(name)
        .await
        .expect("get service")
        .status
        .and_then(|s| s.load_balancer)
        .and_then(|lb| lb.ingress)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|i| i.ip)
        .collect()
}

/// Whether the controller reported a failed sync (here: no address) for `name`.
async fn warned(client: &kube::Client, name: &str) -> bool {
    Api::<Event>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .iter()
        .any(|e| {
            e.involved_object.name.as_deref() == Some(name)
                && e.reason.as_deref() == Some("SyncLoadBalancerFailed")
        })
}

/// The metal provider, initialized, and the service controller with an hour-long retry
/// backoff: nothing but a Service event or the provider's requeue syncs a Service again.
struct Running {
    cloud: MetalCloud,
    handle: ServiceHandle,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

async fn start(client: &kube::Client, config: &str) -> Running {
    let cloud = MetalCloud::new(MetalConfig::parse(config).expect("config")).expect("provider");
    let shutdown = CancellationToken::new();
    cloud
        .initialize(InitContext {
            client: client.clone(),
            shutdown: shutdown.clone(),
        })
        .await
        .expect("initialize");
    let shared = Shared::new(Arc::new(cloud.clone()) as Arc<dyn CloudProvider>, "test");
    shared.start_informers(client.clone(), shutdown.clone());
    let hour = Duration::from_secs(3600);
    let config = ServiceConfig {
        concurrent_service_syncs: 4,
        backoff: Backoff {
            base: hour,
            max: hour,
        },
        drift_check_period: None,
        node_sync_window: Duration::from_millis(50),
        ..ServiceConfig::default()
    };
    let controller =
        ServiceController::new(shared, client.clone(), config, &mut Registry::default())
            .expect("controller");
    let handle = controller.handle();
    let task = tokio::spawn(controller.run(shutdown.clone()));
    Running {
        cloud,
        handle,
        shutdown,
        task,
    }
}

impl Running {
    async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_service_gets_an_address_as_soon_as_one_frees_or_the_pool_grows() {
    let dir = TempDir::new("requeue");
    let (kube, _kubeconfig, client) = kube_sim(&dir.0).await;
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    let run = start(&client, ONE_ADDRESS).await;

    api.create(&pp, &service("first", None))
        .await
        .expect("first");
    wait_for("first gets the only address", || async {
        ingress(&api, "first").await == ["192.0.2.10"]
    })
    .await;
    api.create(&pp, &service("second", None))
        .await
        .expect("second");
    wait_for("second is refused (pool full)", || async {
        warned(&client, "second").await
    })
    .await;
    assert!(ingress(&api, "second").await.is_empty());

    // Deleting first frees the address: second's next try is an hour away, so only the
    // provider's requeue can hand it over.
    api.delete("first", &DeleteParams::default())
        .await
        .expect("delete first");
    wait_for("second gets the freed address", || async {
        ingress(&api, "second").await == ["192.0.2.10"]
    })
    .await;

    // A pool edit (the cloud-config reload path) wakes a waiting Service too.
    api.create(&pp, &service("third", None))
        .await
        .expect("third");
    wait_for("third is refused (pool full)", || async {
        warned(&client, "third").await
    })
    .await;
    run.cloud
        .apply(MetalConfig::parse(TWO_AND_MANUAL).expect("config"));
    wait_for("third gets the address the pool edit added", || async {
        ingress(&api, "third").await == ["192.0.2.11"]
    })
    .await;

    // A changed request frees the old address: second moves to the manual pool, and the
    // waiting fourth takes 192.0.2.10.
    api.create(&pp, &service("fourth", None))
        .await
        .expect("fourth");
    wait_for("fourth is refused (public full)", || async {
        warned(&client, "fourth").await
    })
    .await;
    api.patch(
        "second",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
            "metal.ccm-rs.io/address-pool": "manual"}}})),
    )
    .await
    .expect("second asks for the manual pool");
    wait_for("second moves to the manual pool", || async {
        ingress(&api, "second").await == ["198.51.100.5"]
    })
    .await;
    wait_for("fourth gets the address second left", || async {
        ingress(&api, "fourth").await == ["192.0.2.10"]
    })
    .await;

    run.stop().await;
    kube.shutdown().await;
}

/// A Service deleted while it waits for the address it requested leaves no claim behind: the
/// address goes to the next Service once its holder lets it go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_request_deleted_leaves_no_claim() {
    let dir = TempDir::new("claim");
    let (kube, _kubeconfig, client) = kube_sim(&dir.0).await;
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    let run = start(&client, ONE_ADDRESS).await;

    api.create(&pp, &service("holder", None))
        .await
        .expect("holder");
    wait_for("holder gets the only address", || async {
        ingress(&api, "holder").await == ["192.0.2.10"]
    })
    .await;
    let mut asker = service("asker", None);
    asker.metadata.annotations = Some(
        [(
            "metal.ccm-rs.io/load-balancer-ips".to_string(),
            "192.0.2.10".to_string(),
        )]
        .into(),
    );
    api.create(&pp, &asker).await.expect("asker");
    wait_for("asker is refused (address held)", || async {
        warned(&client, "asker").await
    })
    .await;
    api.delete("asker", &DeleteParams::default())
        .await
        .expect("delete asker");
    wait_for("asker is gone", || async {
        api.get_opt("asker").await.expect("get").is_none()
    })
    .await;

    api.create(&pp, &service("next", None)).await.expect("next");
    wait_for("next is refused (pool full)", || async {
        warned(&client, "next").await
    })
    .await;
    api.delete("holder", &DeleteParams::default())
        .await
        .expect("delete holder");
    wait_for(
        "next gets the address: no claim of the deleted asker holds it",
        || async { ingress(&api, "next").await == ["192.0.2.10"] },
    )
    .await;

    run.stop().await;
    kube.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_class_configured_exactly_the_services_of_that_class_are_served() {
    let dir = TempDir::new("class");
    let (kube, _kubeconfig, client) = kube_sim(&dir.0).await;
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    let config = format!("[load_balancer]\nload_balancer_class = {CLASS:?}\n{TWO_ADDRESSES}");
    let run = start(&client, &config).await;

    // Created first, so the controller has seen them before it serves "ours".
    api.create(&pp, &service("plain", None))
        .await
        .expect("plain");
    api.create(&pp, &service("other", Some("other.example.com/lb")))
        .await
        .expect("other");
    api.create(&pp, &service("ours", Some(CLASS)))
        .await
        .expect("ours");
    wait_for(
        "the Service of the configured class gets an address",
        || async { ingress(&api, "ours").await == ["192.0.2.10"] },
    )
    .await;
    wait_for("the controller is idle", || async {
        run.handle.pending() == 0
    })
    .await;
    for name in ["plain", "other"] {
        let svc = api.get(name).await.expect("get");
        assert!(
            ingress(&api, name).await.is_empty(),
            "{name}: left to its own implementation, got an address"
        );
        let finalizers = svc.metadata.finalizers.unwrap_or_default();
        assert!(
            !finalizers
                .iter()
                .any(|f| f == LOAD_BALANCER_CLEANUP_FINALIZER),
            "{name}: the controller took it ({finalizers:?})"
        );
    }

    // Ours is cleaned up as before: its address goes back to the pool.
    api.delete("ours", &DeleteParams::default())
        .await
        .expect("delete ours");
    wait_for("ours is gone", || async {
        api.get_opt("ours").await.expect("get").is_none()
    })
    .await;
    api.create(&pp, &service("ours-2", Some(CLASS)))
        .await
        .expect("ours-2");
    wait_for(
        "the freed address serves the next Service of the class",
        || async { ingress(&api, "ours-2").await == ["192.0.2.10"] },
    )
    .await;

    run.stop().await;
    kube.shutdown().await;
}
