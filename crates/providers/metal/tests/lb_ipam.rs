//! `--cloud-provider=metal` LoadBalancer IPs end to end: the real service controller on
//! kube-sim assigns addresses from the pools; exhaustion is a Warning Event naming the pool;
//! a restart rebuilds the table from the Services and moves nothing.

mod support;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Event, Service, ServicePort, ServiceSpec};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use support::*;

const CONFIG: &str = r#"
[[pools]]
name = "public"
addresses = ["192.0.2.10-192.0.2.12"]

[[pools]]
name = "manual"
addresses = ["198.51.100.0/30"]
auto_assign = false
"#;

fn service(name: &str, annotations: &[(&str, &str)], ports: &[(i32, &str)]) -> Service {
    let mut svc = Service::default();
    svc.metadata.name = Some(name.into());
    svc.metadata.namespace = Some("default".into());
    svc.metadata.annotations = Some(
        annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
    );
    svc.spec = Some(ServiceSpec {
        type_: Some("LoadBalancer".into()),
        selector: Some([("app".to_string(), name.to_string())].into()),
        ports: Some(
            ports
                .iter()
                .map(|(port, proto)| ServicePort {
                    port: *port,
                    protocol: Some(proto.to_string()),
                    name: Some(format!("p{port}")),
                    ..Default::default()
                })
                .collect(),
        ),
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

async fn warnings(client: &kube::Client, name: &str) -> Vec<String> {
    Api::<Event>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .filter_map(|e| e.message)
        .collect()
}

/// kube-sim and a CCM running the service controller on [`CONFIG`] with kube-vip's annotation
/// on.
async fn with_kube_vip_annotation(
    tag: &str,
) -> (TempDir, ccm_kube_sim::KubeSim, kube::Client, Ccm) {
    let dir = TempDir::new(tag);
    let (kube, kubeconfig, client) = kube_sim(&dir.0).await;
    let cloud_config = dir.0.join("metal.toml");
    std::fs::write(
        &cloud_config,
        format!("{CONFIG}\n[load_balancer]\nkube_vip_annotation = true\n"),
    )
    .expect("config");
    let ccm = Ccm::start(&kubeconfig, &cloud_config, &["--controllers=service"])
        .await
        .expect("ccm starts");
    (dir, kube, client, ccm)
}

/// The Service's `kube-vip.io/loadbalancerIPs` annotation.
async fn kube_vip_note(api: &Api<Service>, name: &str) -> Option<String> {
    api.get(name)
        .await
        .expect("get service")
        .metadata
        .annotations
        .unwrap_or_default()
        .remove("kube-vip.io/loadbalancerIPs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_requests_sharing_exhaustion_and_restart() {
    let dir = TempDir::new("lb");
    let (_kube, kubeconfig, client) = kube_sim(&dir.0).await;
    let cloud_config = dir.0.join("metal.toml");
    std::fs::write(&cloud_config, CONFIG).expect("config");
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();

    // Another implementation's Service already shows 192.0.2.10 (kube-vip-cloud-provider #34:
    // that address must never be handed out again).
    let mut foreign = service("traefik", &[], &[(443, "TCP")]);
    foreign.spec.as_mut().expect("spec").load_balancer_class = Some("example.com/other".into());
    api.create(&pp, &foreign).await.expect("foreign");
    api.patch_status(
        "traefik",
        &PatchParams::default(),
        &Patch::Merge(
            serde_json::json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}}),
        ),
    )
    .await
    .expect("foreign status");

    let ccm = Ccm::start(&kubeconfig, &cloud_config, &["--controllers=service"])
        .await
        .expect("ccm starts");
    api.create(&pp, &service("web", &[], &[(80, "TCP")]))
        .await
        .expect("web");
    wait_for("web gets an address", || async {
        !ingress(&api, "web").await.is_empty()
    })
    .await;
    assert_eq!(ingress(&api, "web").await, vec!["192.0.2.11"]);

    // MetalLB's request annotation, from the auto_assign = false pool.
    api.create(
        &pp,
        &service(
            "db",
            &[("metallb.io/loadBalancerIPs", "198.51.100.2")],
            &[(5432, "TCP")],
        ),
    )
    .await
    .expect("db");
    // Sharing: same key, different ports → one address.
    api.create(
        &pp,
        &service(
            "dns-tcp",
            &[("metal.ccm-rs.io/allow-shared-ip", "dns")],
            &[(53, "TCP")],
        ),
    )
    .await
    .expect("dns-tcp");
    wait_for("db and dns-tcp get addresses", || async {
        !ingress(&api, "db").await.is_empty() && !ingress(&api, "dns-tcp").await.is_empty()
    })
    .await;
    api.create(
        &pp,
        &service(
            "dns-udp",
            &[("metallb.io/allow-shared-ip", "dns")],
            &[(53, "UDP")],
        ),
    )
    .await
    .expect("dns-udp");
    wait_for("dns-udp shares", || async {
        !ingress(&api, "dns-udp").await.is_empty()
    })
    .await;
    assert_eq!(ingress(&api, "db").await, vec!["198.51.100.2"]);
    assert_eq!(ingress(&api, "dns-tcp").await, vec!["192.0.2.12"]);
    assert_eq!(ingress(&api, "dns-udp").await, vec!["192.0.2.12"]);

    // The pool is full: Warning Event naming the pool, Service pending, nobody else moves.
    api.create(&pp, &service("late", &[], &[(80, "TCP")]))
        .await
        .expect("late");
    wait_for("a Warning Event naming the pool", || async {
        warnings(&client, "late")
            .await
            .iter()
            .any(|m| m.contains("\"public\""))
    })
    .await;
    // A request for an address in use without a common sharing key: Warning naming the holder.
    api.create(
        &pp,
        &service(
            "thief",
            &[("kube-vip.io/loadbalancerIPs", "192.0.2.11")],
            &[(8080, "TCP")],
        ),
    )
    .await
    .expect("thief");
    wait_for("a Warning Event naming the holder", || async {
        warnings(&client, "thief")
            .await
            .iter()
            .any(|m| m.contains("default/web"))
    })
    .await;
    assert!(ingress(&api, "late").await.is_empty());
    assert!(ingress(&api, "thief").await.is_empty());

    // Restart: the new process rebuilds from the Services before allocating; pending Services
    // stay pending and bound ones keep their addresses (MetalLB #1774 / #2443).
    ccm.stop().await;
    let ccm = Ccm::start(&kubeconfig, &cloud_config, &["--controllers=service"])
        .await
        .expect("ccm restarts");
    api.create(&pp, &service("after-restart", &[], &[(80, "TCP")]))
        .await
        .expect("after");
    wait_for("after-restart reported as exhausted", || async {
        warnings(&client, "after-restart")
            .await
            .iter()
            .any(|m| m.contains("\"public\""))
    })
    .await;
    assert_eq!(ingress(&api, "web").await, vec!["192.0.2.11"]);
    assert_eq!(ingress(&api, "dns-tcp").await, vec!["192.0.2.12"]);
    assert_eq!(ingress(&api, "dns-udp").await, vec!["192.0.2.12"]);
    assert_eq!(ingress(&api, "db").await, vec!["198.51.100.2"]);
    assert!(ingress(&api, "late").await.is_empty());
    assert!(ingress(&api, "thief").await.is_empty());

    // Deleting web frees 192.0.2.11 for exactly one waiting Service.
    api.delete("web", &DeleteParams::default())
        .await
        .expect("delete web");
    wait_for("a waiting Service gets the freed address", || async {
        let mut got = 0;
        for s in ["late", "thief", "after-restart"] {
            got += ingress(&api, s).await.len();
        }
        got == 1
    })
    .await;
    ccm.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_vip_annotation_publishes_auto_assigned_addresses() {
    let (_dir, _kube, client, ccm) = with_kube_vip_annotation("lb-kv").await;
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &service("web", &[], &[(80, "TCP")]))
        .await
        .expect("web");
    wait_for(
        "kube-vip annotation equals the assigned address",
        || async {
            let note = kube_vip_note(&api, "web").await;
            note.is_some() && note == ingress(&api, "web").await.first().cloned()
        },
    )
    .await;
    assert_eq!(ingress(&api, "web").await, vec!["192.0.2.10"]);
    ccm.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack_services_get_one_address_per_family() {
    let dir = TempDir::new("lb-ds");
    let config = ccm_kube_sim::Config {
        service_cidrs: vec![
            "10.96.0.0/12".parse().expect("cidr"),
            "fd00:96::/112".parse().expect("cidr"),
        ],
        ..Default::default()
    };
    let (_kube, kubeconfig, client) = kube_sim_with(&dir.0, config).await;
    let cloud_config = dir.0.join("metal.toml");
    std::fs::write(
        &cloud_config,
        "[[pools]]\nname = \"v4\"\naddresses = [\"192.0.2.0/30\"]\n[[pools]]\nname = \"v6\"\naddresses = [\"2001:db8:5::/126\"]\n",
    )
    .expect("config");
    let ccm = Ccm::start(&kubeconfig, &cloud_config, &["--controllers=service"])
        .await
        .expect("ccm starts");
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    let mut dual = service("dual", &[], &[(80, "TCP")]);
    dual.spec.as_mut().expect("spec").ip_family_policy = Some("RequireDualStack".into());
    api.create(&PostParams::default(), &dual)
        .await
        .expect("dual");
    // The second Service is created once the first has its addresses, so
    // which pool address each one gets does not depend on worker order.
    wait_for("the dual-stack Service gets addresses", || async {
        !ingress(&api, "dual").await.is_empty()
    })
    .await;
    assert_eq!(
        ingress(&api, "dual").await,
        vec!["192.0.2.1", "2001:db8:5::1"],
        "the CIDRs' network addresses are skipped"
    );
    let mut v6 = service("v6only", &[], &[(80, "TCP")]);
    v6.spec.as_mut().expect("spec").ip_families = Some(vec!["IPv6".into()]);
    api.create(&PostParams::default(), &v6).await.expect("v6");
    wait_for("the IPv6 Service gets an address", || async {
        !ingress(&api, "v6only").await.is_empty()
    })
    .await;
    assert_eq!(ingress(&api, "v6only").await, vec!["2001:db8:5::2"]);
    ccm.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_a_pool_edit_leaves_uncovered_is_kept_and_reported() {
    let dir = TempDir::new("lb-orphan");
    let (_kube, kubeconfig, client) = kube_sim(&dir.0).await;
    let cloud_config = dir.0.join("metal.toml");
    std::fs::write(&cloud_config, CONFIG).expect("config");
    let ccm = Ccm::start(&kubeconfig, &cloud_config, &["--controllers=service"])
        .await
        .expect("ccm starts");
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &service("web", &[], &[(80, "TCP")]))
        .await
        .expect("web");
    wait_for("web gets an address", || async {
        ingress(&api, "web").await == vec!["192.0.2.10"]
    })
    .await;
    // The operator moves the public pool; web's address is now in no pool.
    std::fs::write(
        &cloud_config,
        CONFIG.replace("192.0.2.10-192.0.2.12", "192.0.2.20-192.0.2.22"),
    )
    .expect("edit pools");
    wait_for("a Warning Event names the uncovered address", || async {
        warnings(&client, "web")
            .await
            .iter()
            .any(|m| m.contains("192.0.2.10") && m.contains("no configured pool"))
    })
    .await;
    assert_eq!(
        ingress(&api, "web").await,
        vec!["192.0.2.10"],
        "nothing moves"
    );
    ccm.stop().await;
}

/// A sharer whose ports come to clash with its partner's gives the shared address up; when
/// the first clean-up write is refused (a 409 on kube-vip's annotation), the retry still takes
/// the address off it — it must not keep showing an IP:port another Service holds — and it
/// goes on to an address of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharer_that_gave_its_address_up_is_cleared_even_when_the_first_clean_up_conflicts() {
    let (_dir, kube, client, ccm) = with_kube_vip_annotation("lb-giveup").await;
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    let key = [("metal.ccm-rs.io/allow-shared-ip", "k")];
    for (name, port) in [("share-a", 80), ("share-b", 81)] {
        api.create(
            &PostParams::default(),
            &service(name, &key, &[(port, "TCP")]),
        )
        .await
        .expect("create");
    }
    wait_for("one shared address", || async {
        let (a, b) = (
            ingress(&api, "share-a").await,
            ingress(&api, "share-b").await,
        );
        !a.is_empty() && a == b
    })
    .await;
    let shared = ingress(&api, "share-a").await;
    // The CCM's next write to a Service object (the annotation's clean-up) is refused once;
    // the port change below is an update, not a patch.
    kube.faults()
        .conflict_next(ccm_kube_sim::Verb::Patch, "services", "", 1);
    let mut b = api.get("share-b").await.expect("share-b");
    b.spec
        .as_mut()
        .expect("spec")
        .ports
        .as_mut()
        .expect("ports")[0]
        .port = 80;
    api.replace("share-b", &PostParams::default(), &b)
        .await
        .expect("clashing port");
    // Cleared, then (auto-assigned: it asked for no address) an address of its own.
    wait_for("share-b no longer shows the shared address", || async {
        let note = kube_vip_note(&api, "share-b").await.unwrap_or_default();
        let shown = ingress(&api, "share-b").await;
        !shown.iter().any(|ip| shared.contains(ip)) && !shared.iter().any(|ip| note.contains(ip))
    })
    .await;
    assert_eq!(
        ingress(&api, "share-a").await,
        shared,
        "the holder keeps it"
    );
    ccm.stop().await;
}
