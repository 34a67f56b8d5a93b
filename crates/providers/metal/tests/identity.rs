//! Stable machine identity (`[bmc] provider_id = "uuid"` / `"serial"`): the providerID names
//! the System the BMC reports, a machine swapped under a name is an error rather than a silent
//! re-bind, and two Nodes claiming one machine are both refused. The BMC is the hand-written
//! fake (tests/support/fake_bmc.rs: it serves UUID and SerialNumber, which sushy-tools' fake
//! driver cannot set), the cluster is kube-sim.

mod support;

use ccm_cloud::{CloudProvider, InitContext};
use ccm_provider_metal::{MetalCloud, MetalConfig};
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use kube::api::{Api, PostParams};
use std::sync::Arc;
use support::fake_bmc::{FakeBmc, FakeSystem};
use support::*;
use tokio_util::sync::CancellationToken;

const U1: &str = "4C4C4544-0042-3510-8052-B4C04F563232";
const U9: &str = "4C4C4544-0042-3510-8052-999999999999";

fn node(name: &str, provider_id: Option<&str>) -> Node {
    let mut n = Node::default();
    n.metadata.name = Some(name.into());
    n.spec = Some(NodeSpec {
        provider_id: provider_id.map(str::to_string),
        ..Default::default()
    });
    n
}

/// The provider, a client, and what must live as long as the test (kube-sim, its dir).
async fn cloud(
    from: &str,
    machines: &[(&str, &str)],
) -> (MetalCloud, kube::Client, (ccm_kube_sim::KubeSim, TempDir)) {
    let dir = TempDir::new("identity");
    let (sim, _kubeconfig, client) = kube_sim(&dir.0).await;
    let mut text = format!("[bmc]\nprovider_id = \"{from}\"\n");
    for (name, endpoint) in machines {
        text.push_str(&format!(
            "[[machines]]\nname = \"{name}\"\n[machines.bmc]\nendpoint = \"{endpoint}\"\n"
        ));
    }
    let cloud = MetalCloud::new(MetalConfig::parse(&text).expect("config")).expect("cloud");
    cloud
        .initialize(InitContext {
            client: client.clone(),
            shutdown: CancellationToken::new(),
        })
        .await
        .expect("initialize");
    (cloud, client, (sim, dir))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_ids_name_the_machine_and_a_swap_is_refused() {
    let bmc = FakeBmc::start(vec![FakeSystem::new(
        "System.Embedded.1",
        U1,
        "7XK2L33",
        "On",
    )])
    .await;
    let (cloud, client, _dir) = cloud("uuid", &[("node-a", &bmc.endpoint)]).await;
    let instances = cloud.instances().expect("instances");
    let meta = instances
        .instance_metadata(&node("node-a", None))
        .await
        .expect("metadata")
        .expect("some");
    let want = format!("metal://{}", U1.to_lowercase());
    assert_eq!(meta.provider_id, want);

    // The machine behind node-a is swapped (another mainboard, same BMC address and name).
    bmc.state.lock().systems[0].uuid = U9.into();
    let bound = node("node-a", Some(&want));
    let err = instances
        .instance_exists(&bound)
        .await
        .expect_err("a swapped machine is an error, not gone and not re-bound");
    assert!(
        err.to_string().contains(&U9.to_lowercase()) && err.to_string().contains(&want),
        "{err}"
    );
    let err = instances
        .instance_metadata(&bound)
        .await
        .expect_err("not re-bound");
    assert!(err.to_string().contains("different machine"), "{err}");
    // One Warning Event on the Node says so (no controller reports this error).
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client, "default")
        .list(&Default::default())
        .await
        .expect("events")
        .items;
    let swaps: Vec<_> = events
        .iter()
        .filter(|e| {
            e.involved_object.name.as_deref() == Some("node-a")
                && e.reason.as_deref() == Some("MachineIdentityChanged")
                && e.type_.as_deref() == Some("Warning")
        })
        .collect();
    assert_eq!(swaps.len(), 1, "{events:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_on_one_machine_are_both_refused() {
    let bmc = FakeBmc::start(vec![FakeSystem::new("1", U1, "7XK2L33", "On")]).await;
    // A copy-pasted inventory entry: two names, one BMC, one System.
    let (cloud, client, _dir) = cloud(
        "serial",
        &[("node-a", &bmc.endpoint), ("node-b", &bmc.endpoint)],
    )
    .await;
    let instances = cloud.instances().expect("instances");
    let got = instances
        .instances_metadata(&[node("node-a", None), node("node-b", None)].map(Arc::new))
        .await;
    for (r, other) in got.iter().zip(["node-b", "node-a"]) {
        let err = r.as_ref().expect_err("both refused");
        assert!(
            err.to_string().contains("metal://7XK2L33") && err.to_string().contains(other),
            "{err}"
        );
    }
    // A Node already bound to the machine keeps it; a newcomer is refused.
    Api::<Node>::all(client)
        .create(
            &PostParams::default(),
            &node("node-a", Some("metal://7XK2L33")),
        )
        .await
        .expect("bound node");
    let got = instances
        .instances_metadata(&[node("node-b", None)].map(Arc::new))
        .await;
    let err = got[0].as_ref().expect_err("machine taken");
    assert!(err.to_string().contains("node-a"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ccm_initializes_neither_node_of_one_machine_and_warns() {
    let bmc = FakeBmc::start(vec![FakeSystem::new("1", U1, "7XK2L33", "On")]).await;
    let other = FakeBmc::start(vec![FakeSystem::new("1", U9, "8YL3M44", "On")]).await;
    let dir = TempDir::new("identity-ccm");
    let (_kube, kubeconfig, client) = kube_sim(&dir.0).await;
    let cloud_config = dir.0.join("metal.toml");
    let entry = |name: &str, endpoint: &str| {
        format!("[[machines]]\nname = \"{name}\"\n[machines.bmc]\nendpoint = \"{endpoint}\"\n")
    };
    std::fs::write(
        &cloud_config,
        format!(
            "[bmc]\nprovider_id = \"uuid\"\n{}{}{}",
            entry("node-a", &bmc.endpoint),
            entry("node-b", &bmc.endpoint),
            entry("node-c", &other.endpoint)
        ),
    )
    .expect("config");
    // Both Nodes wait for initialization when the CCM looks (a later Node on an already
    // bound machine is refused on its own, see above).
    for name in ["node-a", "node-b", "node-c"] {
        register_node(&client, name, &[], &[("InternalIP", "10.0.0.9")]).await;
    }
    let ccm = Ccm::start(&kubeconfig, &cloud_config, &["--controllers=cloud-node"])
        .await
        .expect("ccm starts");
    let nodes: Api<Node> = Api::all(client.clone());
    wait_for("node-c initialized with its System's UUID", || async {
        nodes.get("node-c").await.is_ok_and(|n| {
            n.spec.and_then(|s| s.provider_id) == Some(format!("metal://{}", U9.to_lowercase()))
        })
    })
    .await;
    wait_for("Warning Events on node-a and node-b", || async {
        let events = Api::<k8s_openapi::api::core::v1::Event>::all(client.clone())
            .list(&Default::default())
            .await
            .expect("events")
            .items;
        if std::env::var_os("DEBUG_EVENTS").is_some() {
            for e in &events {
                eprintln!("{:?} {:?} {:?}", e.involved_object.name, e.type_, e.message);
            }
        }
        ["node-a", "node-b"].iter().all(|n| {
            events.iter().any(|e| {
                e.involved_object.name.as_deref() == Some(*n)
                    && e.type_.as_deref() == Some("Warning")
                    && e.message
                        .as_deref()
                        .is_some_and(|m| m.contains("both map to machine"))
            })
        })
    })
    .await;
    for name in ["node-a", "node-b"] {
        let n = nodes.get(name).await.expect("node");
        assert!(
            has_taint(&n, "node.cloudprovider.kubernetes.io/uninitialized"),
            "{name} must stay uninitialized"
        );
        assert_eq!(n.spec.and_then(|s| s.provider_id), None, "{name}");
    }
    ccm.stop().await;
}
