//! kube-rs driving the simulator: the behaviours controllers rely on.

use std::time::Duration;

use ccm_kube_sim::{Config, KubeSim};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Service};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;

/// Generous bound for anything that should happen "soon" on a loaded 2-core machine.
const SOON: Duration = Duration::from_secs(60);

fn node(name: &str, labels: serde_json::Value) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {}
    }))
    .unwrap()
}

async fn sim() -> KubeSim {
    KubeSim::start(Config::default()).await.unwrap()
}

#[tokio::test]
async fn crud_and_conflict() {
    let sim = sim().await;
    let nodes: Api<Node> = Api::all(sim.client().unwrap());
    let created = nodes
        .create(&PostParams::default(), &node("n1", json!({"a": "1"})))
        .await
        .unwrap();
    let meta = &created.metadata;
    assert!(meta.uid.is_some());
    assert!(meta.creation_timestamp.is_some());
    assert_eq!(meta.generation, Some(1));
    let rv1 = meta.resource_version.clone().unwrap();

    let err = nodes
        .create(&PostParams::default(), &node("n1", json!({})))
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 409);
            assert_eq!(s.reason, "AlreadyExists");
            assert_eq!(s.message, "nodes \"n1\" already exists");
        }
        other => panic!("unexpected {other:?}"),
    }

    // Update with the current resourceVersion succeeds; replaying the stale one conflicts.
    let mut n = created.clone();
    n.spec.as_mut().unwrap().unschedulable = Some(true);
    let updated = nodes
        .replace("n1", &PostParams::default(), &n)
        .await
        .unwrap();
    assert_ne!(
        updated.metadata.resource_version.as_deref(),
        Some(rv1.as_str())
    );
    assert_eq!(updated.metadata.generation, Some(2));
    let err = nodes
        .replace("n1", &PostParams::default(), &n)
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 409);
            assert_eq!(s.reason, "Conflict");
            assert_eq!(
                s.message,
                "Operation cannot be fulfilled on nodes \"n1\": the object has been modified; please apply your changes to the latest version and try again"
            );
        }
        other => panic!("unexpected {other:?}"),
    }

    // Status through the main endpoint is ignored; through /status it lands, and spec is ignored there.
    let mut n = updated.clone();
    n.status = Some(
        serde_json::from_value(json!({"conditions": [{"type": "Ready", "status": "True"}]}))
            .unwrap(),
    );
    let after_main = nodes
        .replace("n1", &PostParams::default(), &n)
        .await
        .unwrap();
    assert!(
        after_main
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_none()
    );
    let mut n = after_main.clone();
    n.status = Some(
        serde_json::from_value(json!({"conditions": [{"type": "Ready", "status": "True"}]}))
            .unwrap(),
    );
    n.spec.as_mut().unwrap().unschedulable = Some(false);
    let after_status = nodes
        .replace_status("n1", &PostParams::default(), &n)
        .await
        .unwrap();
    assert_eq!(
        after_status.status.unwrap().conditions.unwrap()[0].status,
        "True"
    );
    assert_eq!(after_status.spec.unwrap().unschedulable, Some(true));

    let err = nodes.get("nope").await.unwrap_err();
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 404);
            assert_eq!(s.reason, "NotFound");
            assert_eq!(s.message, "nodes \"nope\" not found");
        }
        other => panic!("unexpected {other:?}"),
    }
    nodes.delete("n1", &DeleteParams::default()).await.unwrap();
    assert!(nodes.get_opt("n1").await.unwrap().is_none());
}

#[tokio::test]
async fn patch_types() {
    let sim = sim().await;
    let nodes: Api<Node> = Api::all(sim.client().unwrap());
    nodes
        .create(&PostParams::default(), &node("p1", json!({"a": "1"})))
        .await
        .unwrap();
    let pp = PatchParams::default();

    // Merge patch.
    let n = nodes
        .patch(
            "p1",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"b": "2"}}})),
        )
        .await
        .unwrap();
    assert_eq!(n.metadata.labels.as_ref().unwrap().len(), 2);

    // Strategic merge on status conditions by type, through /status.
    nodes
        .patch_status("p1", &pp, &Patch::Strategic(json!({"status": {"conditions": [
            {"type": "Ready", "status": "False"}, {"type": "MemoryPressure", "status": "False"}]}})))
        .await
        .unwrap();
    let n = nodes
        .patch_status(
            "p1",
            &pp,
            &Patch::Strategic(
                json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
            ),
        )
        .await
        .unwrap();
    let conds = n.status.unwrap().conditions.unwrap();
    assert_eq!(conds.len(), 2);
    assert_eq!(conds[0].status, "True");

    // JSON patch, including a passing and a failing `test`.
    let p: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/labels/a", "value": "1"},
        {"op": "add", "path": "/spec/podCIDRs", "value": ["10.0.1.0/24"]}
    ]))
    .unwrap();
    let n = nodes.patch("p1", &pp, &Patch::Json::<()>(p)).await.unwrap();
    assert_eq!(
        n.spec.as_ref().unwrap().pod_cidr.as_deref(),
        Some("10.0.1.0/24")
    );
    let p: json_patch::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/metadata/labels/a", "value": "2"}]))
            .unwrap();
    match nodes
        .patch("p1", &pp, &Patch::Json::<()>(p))
        .await
        .unwrap_err()
    {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 422);
            assert_eq!(s.reason, "Invalid");
        }
        other => panic!("unexpected {other:?}"),
    }

    // Pod CIDRs may only be set once.
    match nodes
        .patch(
            "p1",
            &pp,
            &Patch::Merge(json!({"spec": {"podCIDRs": ["10.0.2.0/24"]}})),
        )
        .await
        .unwrap_err()
    {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 422);
            assert_eq!(
                s.message,
                "Node \"p1\" is invalid: spec.podCIDRs: Forbidden: node updates may not change podCIDR except from \"\" to valid"
            );
        }
        other => panic!("unexpected {other:?}"),
    }

    // Server-side apply through kube-rs: the manager owns what it applied.
    let applied = nodes
        .patch(
            "p1",
            &PatchParams::apply("test"),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Node",
                                  "metadata": {"name": "p1", "labels": {"ssa": "yes"}}})),
        )
        .await
        .unwrap();
    assert_eq!(applied.metadata.labels.unwrap()["ssa"], "yes");
    let entry = applied
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .find(|e| e.manager.as_deref() == Some("test"))
        .expect("the apply's managedFields entry");
    assert_eq!(entry.operation.as_deref(), Some("Apply"));
    assert_eq!(
        entry.fields_v1.map(|f| f.0),
        Some(json!({"f:metadata": {"f:labels": {"f:ssa": {}}}}))
    );

    // A no-op patch keeps the resourceVersion.
    let before = nodes.get("p1").await.unwrap().metadata.resource_version;
    let after = nodes
        .patch(
            "p1",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"b": "2"}}})),
        )
        .await
        .unwrap()
        .metadata
        .resource_version;
    assert_eq!(before, after);
}

#[tokio::test]
async fn finalizer_guarded_deletion() {
    let sim = sim().await;
    let cms: Api<ConfigMap> = Api::namespaced(sim.client().unwrap(), "default");
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "f1", "finalizers": ["example.com/hold"]}, "data": {"k": "v"}
    }))
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let res = cms.delete("f1", &DeleteParams::default()).await.unwrap();
    let pending = res.left().expect("object returned while finalizers remain");
    assert!(pending.metadata.deletion_timestamp.is_some());
    // Still there; new finalizers are refused.
    let got = cms.get("f1").await.unwrap();
    assert!(got.metadata.deletion_timestamp.is_some());
    let err = cms
        .patch(
            "f1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold", "x/y"]}})),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 422),
        "{err:?}"
    );
    // Removing the last finalizer removes the object.
    cms.patch(
        "f1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(cms.get_opt("f1").await.unwrap().is_none());

    // Preconditions.
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "f2"}})).unwrap();
    let created = cms.create(&PostParams::default(), &cm).await.unwrap();
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some("wrong".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let err = cms.delete("f2", &dp).await.unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 409 && s.reason == "Conflict"),
        "{err:?}"
    );
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: created.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    cms.delete("f2", &dp).await.unwrap();

    // Missing namespace.
    let other: Api<ConfigMap> = Api::namespaced(sim.client().unwrap(), "nope");
    match other.create(&PostParams::default(), &cm).await.unwrap_err() {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 404);
            assert_eq!(s.message, "namespaces \"nope\" not found");
        }
        e => panic!("unexpected {e:?}"),
    }
}

#[tokio::test]
async fn selectors_on_list_and_watch() {
    let sim = sim().await;
    let nodes: Api<Node> = Api::all(sim.client().unwrap());
    for i in 0..6 {
        let zone = if i % 2 == 0 { "a" } else { "b" };
        nodes
            .create(
                &PostParams::default(),
                &node(&format!("s{i}"), json!({"zone": zone})),
            )
            .await
            .unwrap();
    }
    let names = |l: kube::core::ObjectList<Node>| -> Vec<String> {
        l.items
            .into_iter()
            .map(|n| n.metadata.name.unwrap())
            .collect()
    };
    assert_eq!(
        names(
            nodes
                .list(&ListParams::default().labels("zone=a"))
                .await
                .unwrap()
        ),
        ["s0", "s2", "s4"]
    );
    assert_eq!(
        names(
            nodes
                .list(&ListParams::default().labels("zone in (b),zone!=x"))
                .await
                .unwrap()
        ),
        ["s1", "s3", "s5"]
    );
    assert_eq!(
        names(
            nodes
                .list(&ListParams::default().labels("!zone"))
                .await
                .unwrap()
        )
        .len(),
        0
    );
    assert_eq!(
        names(
            nodes
                .list(&ListParams::default().fields("metadata.name=s3"))
                .await
                .unwrap()
        ),
        ["s3"]
    );
    assert_eq!(
        names(
            nodes
                .list(&ListParams::default().fields("spec.unschedulable=false"))
                .await
                .unwrap()
        )
        .len(),
        6
    );
    match nodes
        .list(&ListParams::default().fields("spec.bogus=1"))
        .await
        .unwrap_err()
    {
        kube::Error::Api(s) => assert_eq!(
            (s.code, s.message.as_str()),
            (400, "field label not supported: spec.bogus")
        ),
        e => panic!("unexpected {e:?}"),
    }

    // Pagination.
    let p1 = nodes.list(&ListParams::default().limit(4)).await.unwrap();
    assert_eq!(p1.items.len(), 4);
    let cont = p1.metadata.continue_.clone().unwrap();
    let p2 = nodes
        .list(&ListParams::default().limit(4).continue_token(&cont))
        .await
        .unwrap();
    assert_eq!(names(p2), ["s4", "s5"]);

    // Watch with a selector: leaving it is DELETED, entering it is ADDED.
    let rv = nodes
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = nodes
        .watch(&WatchParams::default().labels("zone=a"), &rv)
        .await
        .unwrap()
        .boxed();
    nodes
        .patch(
            "s0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"zone": "b"}}})),
        )
        .await
        .unwrap();
    nodes
        .patch(
            "s1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"zone": "a"}}})),
        )
        .await
        .unwrap();
    nodes
        .patch(
            "s2",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let ev = tokio::time::timeout(SOON, stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seen.push(match ev {
            WatchEvent::Added(n) => format!("ADDED {}", n.metadata.name.unwrap()),
            WatchEvent::Modified(n) => format!("MODIFIED {}", n.metadata.name.unwrap()),
            WatchEvent::Deleted(n) => format!("DELETED {}", n.metadata.name.unwrap()),
            other => format!("{other:?}"),
        });
    }
    assert_eq!(seen, ["DELETED s0", "ADDED s1", "MODIFIED s2"]);
}

#[tokio::test]
async fn bookmarks_arrive() {
    let sim = KubeSim::start(Config {
        bookmark_interval: Duration::from_millis(200),
        ..Config::default()
    })
    .await
    .unwrap();
    let nodes: Api<Node> = Api::all(sim.client().unwrap());
    let mut stream = nodes
        .watch(
            &WatchParams {
                bookmarks: true,
                ..WatchParams::default()
            },
            "0",
        )
        .await
        .unwrap()
        .boxed();
    nodes
        .create(&PostParams::default(), &node("b1", json!({})))
        .await
        .unwrap();
    let mut got_added = false;
    loop {
        match tokio::time::timeout(SOON, stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            WatchEvent::Added(_) => got_added = true,
            WatchEvent::Bookmark(b) => {
                assert!(b.metadata.resource_version.parse::<u64>().unwrap() > 0);
                if got_added {
                    break;
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn reflector_survives_forced_410_relist() {
    let sim = sim().await;
    let client = sim.client().unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    for i in 0..3 {
        nodes
            .create(&PostParams::default(), &node(&format!("r{i}"), json!({})))
            .await
            .unwrap();
    }
    let (reader, writer) = reflector::store::<Node>();
    let stream = reflector(writer, watcher(nodes.clone(), watcher::Config::default()))
        .default_backoff()
        .touched_objects();
    let errors = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let errs = errors.clone();
    let task = tokio::spawn(async move {
        stream
            .for_each(|r| {
                if r.is_err() {
                    errs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                async {}
            })
            .await
    });
    tokio::time::timeout(SOON, reader.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reader.state().len(), 3);

    // Changes happen while the watch is down and the history is compacted: the resumed
    // watch gets 410 Expired and the watcher must relist to converge.
    sim.faults()
        .set_500_rate(Some(ccm_kube_sim::Verb::Watch), 1.0);
    sim.faults().disconnect_watches();
    nodes.delete("r0", &DeleteParams::default()).await.unwrap();
    for i in 3..8 {
        nodes
            .create(&PostParams::default(), &node(&format!("r{i}"), json!({})))
            .await
            .unwrap();
    }
    sim.faults().compact();
    sim.faults().clear();
    let deadline = tokio::time::Instant::now() + SOON;
    loop {
        let mut names: Vec<String> = reader
            .state()
            .iter()
            .map(|n| n.metadata.name.clone().unwrap())
            .collect();
        names.sort();
        if names == ["r1", "r2", "r3", "r4", "r5", "r6", "r7"] {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "reflector did not converge: {names:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        sim.count_requests(|k| k.verb == ccm_kube_sim::Verb::List && k.resource == "nodes") >= 2,
        "watcher relisted"
    );
    task.abort();
}

#[tokio::test]
async fn service_defaults_and_allocation() {
    let sim = sim().await;
    let svcs: Api<Service> = Api::namespaced(sim.client().unwrap(), "default");
    let s: Service = serde_json::from_value(json!({
        "metadata": {"name": "lb"},
        "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local", "ports": [{"port": 80}, {"name": "b", "port": 443}]}
    }))
    .unwrap();
    match svcs.create(&PostParams::default(), &s).await.unwrap_err() {
        kube::Error::Api(e) => {
            assert_eq!(e.code, 422);
            assert_eq!(
                e.message,
                "Service \"lb\" is invalid: spec.ports[0].name: Required value"
            );
        }
        e => panic!("unexpected {e:?}"),
    }
    let s: Service = serde_json::from_value(json!({
        "metadata": {"name": "lb"},
        "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local", "ports": [{"name": "a", "port": 80}, {"name": "b", "port": 443}]}
    }))
    .unwrap();
    let out = svcs.create(&PostParams::default(), &s).await.unwrap();
    let spec = out.spec.unwrap();
    let ip: std::net::Ipv4Addr = spec.cluster_ip.as_deref().unwrap().parse().unwrap();
    assert!(
        ipnet::Ipv4Net::new("10.96.0.0".parse().unwrap(), 12)
            .unwrap()
            .contains(&ip)
    );
    assert_eq!(spec.ip_families.unwrap(), ["IPv4"]);
    assert_eq!(spec.ip_family_policy.as_deref(), Some("SingleStack"));
    assert_eq!(spec.session_affinity.as_deref(), Some("None"));
    assert_eq!(spec.internal_traffic_policy.as_deref(), Some("Cluster"));
    assert_eq!(spec.allocate_load_balancer_node_ports, Some(true));
    let ports = spec.ports.unwrap();
    let np: Vec<i32> = ports.iter().map(|p| p.node_port.unwrap()).collect();
    assert!(np.iter().all(|p| (30000..=32767).contains(p)));
    assert_ne!(np[0], np[1]);
    assert_eq!(ports[0].protocol.as_deref(), Some("TCP"));
    assert_eq!(
        ports[0].target_port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(80))
    );
    let hc = spec.health_check_node_port.unwrap();
    assert!(!np.contains(&hc));

    let bad: Service = serde_json::from_value(
        json!({"metadata": {"name": "bad"}, "spec": {"ports": [{"port": 0, "targetPort": 8080}]}}),
    )
    .unwrap();
    match svcs.create(&PostParams::default(), &bad).await.unwrap_err() {
        kube::Error::Api(e) => assert_eq!(
            e.message,
            "Service \"bad\" is invalid: spec.ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive"
        ),
        e => panic!("unexpected {e:?}"),
    }
    // loadBalancerClass is immutable.
    let c: Service = serde_json::from_value(json!({"metadata": {"name": "cls"},
        "spec": {"type": "LoadBalancer", "loadBalancerClass": "example.com/a", "ports": [{"port": 80}]}})).unwrap();
    svcs.create(&PostParams::default(), &c).await.unwrap();
    let err = svcs
        .patch(
            "cls",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"loadBalancerClass": "example.com/b"}})),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref e) if e.code == 422 && e.message.contains("may not change once set")),
        "{err:?}"
    );

    // Status writes: ingress ipMode defaulted; finalizers via /status are kept.
    let st = svcs
        .patch_status(
            "lb",
            &PatchParams::default(),
            &Patch::Merge(json!({
            "metadata": {"finalizers": ["service.kubernetes.io/load-balancer-cleanup"]},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        st.metadata.finalizers.unwrap(),
        ["service.kubernetes.io/load-balancer-cleanup"]
    );
    let ing = &st.status.unwrap().load_balancer.unwrap().ingress.unwrap()[0];
    assert_eq!(ing.ip_mode.as_deref(), Some("VIP"));
}

#[tokio::test]
async fn events_recorder_and_leases() {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::events::v1::Event as NewEvent;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};

    let sim = sim().await;
    let client = sim.client().unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let n = nodes
        .create(&PostParams::default(), &node("e1", json!({})))
        .await
        .unwrap();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "cloud-node-controller".into(),
            instance: None,
        },
    );
    let ev = Event {
        type_: EventType::Normal,
        reason: "Synced".into(),
        note: Some("node synced".into()),
        action: "Sync".into(),
        secondary: None,
    };
    let oref = kube::Resource::object_ref(&n, &());
    recorder.publish(&ev, &oref).await.unwrap();
    // The same event again becomes a series update.
    recorder.publish(&ev, &oref).await.unwrap();
    let events: Api<NewEvent> = Api::namespaced(client.clone(), "default");
    let list = events.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].reason.as_deref(), Some("Synced"));

    // Lease validation as leader election uses it.
    let leases: Api<Lease> = Api::namespaced(client, "kube-system");
    let l: Lease = serde_json::from_value(json!({"metadata": {"name": "cloud-controller-manager"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}))
    .unwrap();
    leases.create(&PostParams::default(), &l).await.unwrap();
    let err = leases
        .patch(
            "cloud-controller-manager",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"leaseDurationSeconds": 0}})),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref e) if e.code == 422 && e.message.contains("spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0")),
        "{err:?}"
    );
}

#[tokio::test]
async fn streaming_list_watcher() {
    let sim = sim().await;
    let nodes: Api<Node> = Api::all(sim.client().unwrap());
    for i in 0..3 {
        nodes
            .create(&PostParams::default(), &node(&format!("w{i}"), json!({})))
            .await
            .unwrap();
    }
    let (reader, writer) = reflector::store::<Node>();
    let stream = reflector(
        writer,
        watcher(nodes.clone(), watcher::Config::default().streaming_lists()),
    )
    .default_backoff()
    .touched_objects();
    let task = tokio::spawn(stream.for_each(|_| async {}));
    tokio::time::timeout(SOON, reader.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reader.state().len(), 3);
    nodes
        .create(&PostParams::default(), &node("w3", json!({})))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + SOON;
    while reader.state().len() != 4 {
        assert!(tokio::time::Instant::now() < deadline, "new node not seen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    task.abort();
}

/// kube-apiserver's `dropTypeDependentFields`: switching a LoadBalancer Service to ClusterIP
/// with a patch that leaves the allocated fields alone succeeds, and the server clears them.
#[tokio::test]
async fn type_change_drops_fields_that_no_longer_apply() {
    let sim = sim().await;
    let api: Api<Service> = Api::namespaced(sim.client().expect("client"), "default");
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "lb"},
        "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                 "ports": [{"port": 80}]},
    }))
    .expect("service");
    let created = api
        .create(&PostParams::default(), &svc)
        .await
        .expect("create");
    let spec = created.spec.expect("spec");
    assert!(spec.ports.as_ref().expect("ports")[0].node_port.is_some());
    assert!(spec.health_check_node_port.is_some());

    let patched = api
        .patch(
            "lb",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"type": "ClusterIP"}})),
        )
        .await
        .expect("LoadBalancer → ClusterIP is accepted");
    let spec = patched.spec.expect("spec");
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    assert_eq!(spec.ports.as_ref().expect("ports")[0].node_port, None);
    assert_eq!(spec.health_check_node_port, None);
    assert_eq!(spec.external_traffic_policy, None);
    assert_eq!(spec.allocate_load_balancer_node_ports, None);
    assert!(spec.cluster_ip.is_some(), "the clusterIP stays");

    // A user who sets a nodePort while switching to ClusterIP is still refused, as upstream.
    let back = api
        .patch(
            "lb",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"type": "NodePort"}})),
        )
        .await
        .expect("ClusterIP → NodePort allocates");
    let np = back.spec.expect("spec").ports.expect("ports")[0].node_port;
    assert!(np.is_some());
    let err = api
        .patch(
            "lb",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"type": "ClusterIP", "ports": [{"port": 80, "nodePort": np.map(|p| p + 1)}]}})),
        )
        .await
        .expect_err("a nodePort the user changed on a ClusterIP Service is invalid");
    assert!(matches!(err, kube::Error::Api(s) if s.code == 422));
}
