//! kube-vip pairing end to end: the real service controller on kube-sim with
//! `kube_vip_annotation = true`, every state of every Service recorded from a watch. The
//! invariant, checked on each recorded state: the `kube-vip.io/loadbalancerIPs` annotation
//! names only addresses in that Service's status — so kube-vip, which announces the
//! annotation, never announces one address for two Services.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use parking_lot::Mutex;
use support::*;

const KUBE_VIP: &str = "kube-vip.io/loadbalancerIPs";
const CONFIG: &str = r#"
[[pools]]
name = "public"
addresses = ["192.0.2.10-192.0.2.12"]

[load_balancer]
kube_vip_annotation = true
"#;

fn service(name: &str, annotations: &[(&str, &str)]) -> Service {
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
        ports: Some(vec![ServicePort {
            port: 80,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        ..Default::default()
    });
    svc
}

fn kube_vip(svc: &Service) -> Vec<String> {
    svc.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(KUBE_VIP))
        .map(|v| v.split(',').map(str::to_string).collect())
        .unwrap_or_default()
}

fn status(svc: &Service) -> Vec<String> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|i| i.iter().filter_map(|i| i.ip.clone()).collect())
        .unwrap_or_default()
}

/// Every state of every Service: `(name, kube-vip annotation, status, written by ccm-rs)`.
type Log = Arc<Mutex<Vec<(String, Vec<String>, Vec<String>, bool)>>>;

fn written_by_ccm(svc: &Service) -> bool {
    let a = svc.metadata.annotations.clone().unwrap_or_default();
    a.contains_key(KUBE_VIP) && a.get(KUBE_VIP) == a.get("metal.ccm-rs.io/kube-vip-written")
}

fn record(client: kube::Client) -> (Log, tokio::task::JoinHandle<()>) {
    let log: Log = Arc::default();
    let task = tokio::spawn({
        let log = log.clone();
        async move {
            let stream =
                watcher(Api::<Service>::all(client), watcher::Config::default()).applied_objects();
            futures::pin_mut!(stream);
            while let Some(Ok(svc)) = stream.next().await {
                let name = svc.metadata.name.clone().unwrap_or_default();
                log.lock()
                    .push((name, kube_vip(&svc), status(&svc), written_by_ccm(&svc)));
            }
        }
    });
    (log, task)
}

async fn get(api: &Api<Service>, name: &str) -> Service {
    api.get(name).await.expect("get service")
}

async fn set_type(api: &Api<Service>, name: &str, type_: &str) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"type": type_}})),
    )
    .await
    .expect("change type");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kube_vip_annotation_only_ever_names_the_services_own_status() {
    let dir = TempDir::new("kube-vip");
    let (_kube, kubeconfig, client) = kube_sim(&dir.0).await;
    let cloud_config = dir.0.join("metal.toml");
    std::fs::write(&cloud_config, CONFIG).expect("config");
    let (log, recorder) = record(client.clone());
    let ccm = Ccm::start(&kubeconfig, &cloud_config, &["--controllers=service"])
        .await
        .expect("ccm starts");
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();

    // a gets the first address; the annotation follows the status.
    api.create(&pp, &service("a", &[])).await.expect("a");
    wait_for("a announced", || async {
        let a = get(&api, "a").await;
        !kube_vip(&a).is_empty() && kube_vip(&a) == status(&a)
    })
    .await;
    assert_eq!(status(&get(&api, "a").await), vec!["192.0.2.10"]);

    // LoadBalancer → ClusterIP: no longer announced.
    set_type(&api, "a", "ClusterIP").await;
    wait_for("a no longer announced", || async {
        let a = get(&api, "a").await;
        kube_vip(&a).is_empty() && status(&a).is_empty()
    })
    .await;
    // b takes the freed address; a comes back and must get another one.
    api.create(&pp, &service("b", &[])).await.expect("b");
    wait_for("b announced", || async {
        kube_vip(&get(&api, "b").await) == vec!["192.0.2.10"]
    })
    .await;
    set_type(&api, "a", "LoadBalancer").await;
    wait_for("a announced again", || async {
        let a = get(&api, "a").await;
        !kube_vip(&a).is_empty() && kube_vip(&a) == status(&a)
    })
    .await;
    assert_eq!(status(&get(&api, "a").await), vec!["192.0.2.11"]);

    // A user asks kube-vip's way for b's address: refused, and never announced for c; the
    // request is kept in ccm-rs's annotation.
    api.create(&pp, &service("c", &[(KUBE_VIP, "192.0.2.10")]))
        .await
        .expect("c");
    wait_for(
        "c's refused request moved off kube-vip's annotation",
        || async {
            let c = get(&api, "c").await;
            let moved = c
                .metadata
                .annotations
                .unwrap_or_default()
                .get("metal.ccm-rs.io/load-balancer-ips")
                .cloned();
            kube_vip(&get(&api, "c").await).is_empty() && moved.as_deref() == Some("192.0.2.10")
        },
    )
    .await;
    // A request for a free address the kube-vip way is honoured.
    api.create(&pp, &service("d", &[(KUBE_VIP, "192.0.2.12")]))
        .await
        .expect("d");
    wait_for("d gets what it asked kube-vip's way", || async {
        let d = get(&api, "d").await;
        status(&d) == vec!["192.0.2.12"] && kube_vip(&d) == status(&d)
    })
    .await;
    ccm.stop().await;
    recorder.abort();

    let log = log.lock();
    for (name, announced, shown, ours) in log.iter() {
        // c and d were created with a kube-vip annotation a user wrote; until ccm-rs rewrites
        // it, it is theirs. Every annotation ccm-rs wrote, and every state of a and b, obey.
        if !ours && (name == "c" || name == "d") {
            continue;
        }
        assert!(
            announced.iter().all(|ip| shown.contains(ip)),
            "{name}: kube-vip annotation {announced:?} names addresses outside its status {shown:?}\nlog: {log:#?}"
        );
    }
    // Each address is announced for one Service at the end.
    let mut last: BTreeMap<&str, &Vec<String>> = BTreeMap::new();
    for (name, announced, _, _) in log.iter() {
        last.insert(name, announced);
    }
    let mut all: Vec<&String> = last.values().flat_map(|v| v.iter()).collect();
    let n = all.len();
    all.sort();
    all.dedup();
    assert_eq!(
        all.len(),
        n,
        "one address announced for two Services: {last:?}"
    );
}
