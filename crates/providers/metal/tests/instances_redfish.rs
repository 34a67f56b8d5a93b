//! `--cloud-provider=metal` Instances end to end: the real CCM against kube-sim, machines from
//! the cloud-config inventory, power state from sushy-tools Redfish emulators whose System ids
//! are UUIDs and whose System names are iDRAC's (`System.Embedded.N`), never the node names.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use support::*;

const SHUTDOWN: &str = "node.cloudprovider.kubernetes.io/shutdown";
const UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
const UUID_A: &str = "0a0a0a0a-0000-4000-8000-00000000000a";
const UUID_B: &str = "0b0b0b0b-0000-4000-8000-00000000000b";
const UUID_C: &str = "0c0c0c0c-0000-4000-8000-00000000000c";
const UUID_G: &str = "0e0e0e0e-0000-4000-8000-00000000000e";

/// The three BMCs: node-a's (one System), a two-System one, node-gone's.
struct Bmcs {
    a: Sushy,
    b: Sushy,
    g: Sushy,
}

fn config(bmcs: &Bmcs, extra: &str) -> String {
    let (a, b, g) = (&bmcs.a.endpoint, &bmcs.b.endpoint, &bmcs.g.endpoint);
    format!(
        r#"
[bmc]
concurrency = 4
timeout_ms = 2000

# Default BMC settings: the System is the collection's only member.
[[machines]]
name = "node-a"
instance_type = "r640"
zone = "rack-1"
region = "dc-1"
internal_ips = ["192.168.50.11"]
hostname = "node-a.lab"
[machines.bmc]
endpoint = "{a}"

[[machines]]
name = "node-b"
zone = "rack-2"
[machines.bmc]
endpoint = "{b}"
system_uuid = "{UUID_B}"

# Its BMC does not answer (nothing listens on port 9 here).
[[machines]]
name = "node-dead-bmc"
[machines.bmc]
endpoint = "http://127.0.0.1:9"

# Default settings on a BMC with two Systems: which one is unknown. Before, the node name
# was guessed as the System id, the BMC answered 404, and the Node was deleted.
[[machines]]
name = "node-guessed"
[machines.bmc]
endpoint = "{b}"

# Its System is removed from the BMC while the CCM runs.
[[machines]]
name = "node-gone"
[machines.bmc]
endpoint = "{g}"
system = "{UUID_G}"

[[machines]]
pattern = "edge-*"
instance_type = "nuc"
zone = "edge"
{extra}
"#
    )
}

async fn node(nodes: &Api<Node>, name: &str) -> Option<Node> {
    nodes.get_opt(name).await.expect("get node")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inventory_initializes_nodes_and_redfish_power_drives_the_shutdown_taint() {
    let mut bmcs = Bmcs {
        a: Sushy::start(&[("System.Embedded.1", UUID_A, "On")]),
        b: Sushy::start(&[
            ("System.Embedded.1", UUID_B, "On"),
            ("System.Embedded.2", UUID_C, "On"),
        ]),
        g: Sushy::start(&[("System.Embedded.1", UUID_G, "Off")]),
    };
    let dir = TempDir::new("instances");
    let (_kube, kubeconfig, client) = kube_sim(&dir.0).await;
    let cloud_config = dir.0.join("metal.toml");
    std::fs::write(&cloud_config, config(&bmcs, "")).expect("config");
    let ccm = Ccm::start(
        &kubeconfig,
        &cloud_config,
        &[
            "--controllers=cloud-node,cloud-node-lifecycle",
            "--node-monitor-period=1s",
        ],
    )
    .await
    .expect("ccm starts");
    let nodes: Api<Node> = Api::all(client.clone());
    for name in [
        "node-a",
        "node-b",
        "node-dead-bmc",
        "node-guessed",
        "node-gone",
        "edge-7",
    ] {
        register_node(&client, name, &[], &[("InternalIP", "10.0.0.99")]).await;
    }

    // Initialized from the inventory: providerID, labels, addresses.
    wait_for("node-a and edge-7 initialized", || async {
        let (a, e) = (node(&nodes, "node-a").await, node(&nodes, "edge-7").await);
        [a, e]
            .iter()
            .all(|n| n.as_ref().is_some_and(|n| !has_taint(n, UNINITIALIZED)))
    })
    .await;
    let a = node(&nodes, "node-a").await.expect("node-a");
    assert_eq!(
        a.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
        Some("metal://node-a")
    );
    let labels = a.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get("topology.kubernetes.io/zone")
            .map(String::as_str),
        Some("rack-1")
    );
    assert_eq!(
        labels
            .get("node.kubernetes.io/instance-type")
            .map(String::as_str),
        Some("r640")
    );
    let addrs: Vec<(String, String)> = a
        .status
        .and_then(|s| s.addresses)
        .unwrap_or_default()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    assert!(
        addrs.contains(&("InternalIP".into(), "192.168.50.11".into())),
        "{addrs:?}"
    );
    let e = node(&nodes, "edge-7").await.expect("edge-7");
    assert_eq!(
        e.spec.and_then(|s| s.provider_id),
        Some("metal://edge-7".into())
    );

    // Power node-a off through Redfish; its kubelet stops reporting → shutdown taint.
    bmcs.a.reset(UUID_A, "ForceOff").await;
    set_ready(&client, "node-a", false).await;
    set_ready(&client, "node-dead-bmc", false).await;
    wait_for("shutdown taint on node-a", || async {
        node(&nodes, "node-a")
            .await
            .is_some_and(|n| has_taint(&n, SHUTDOWN))
    })
    .await;
    // node-b runs: no taint. A BMC that does not answer is never "instance gone".
    assert!(!has_taint(
        &node(&nodes, "node-b").await.expect("node-b"),
        SHUTDOWN
    ));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let dead = node(&nodes, "node-dead-bmc")
        .await
        .expect("a BMC error never deletes a Node");
    assert!(!has_taint(&dead, SHUTDOWN));

    // A BMC with several Systems and no `system` setting: an error, the NotReady Node stays.
    set_ready(&client, "node-guessed", false).await;
    // node-gone's System is Off: the shutdown taint shows the CCM found it (first contact).
    set_ready(&client, "node-gone", false).await;
    wait_for("shutdown taint on node-gone", || async {
        node(&nodes, "node-gone")
            .await
            .is_some_and(|n| has_taint(&n, SHUTDOWN))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let guessed = node(&nodes, "node-guessed")
        .await
        .expect("a System the config does not identify never deletes a Node");
    assert!(!has_taint(&guessed, SHUTDOWN));
    // The machine is removed from its BMC: service root and collection answer without it.
    bmcs.g.restart(&[("System.Embedded.9", UUID_C, "On")]);
    wait_for("node-gone deleted", || async {
        node(&nodes, "node-gone").await.is_none()
    })
    .await;

    // Power back on; once the BMC says On the kubelet reports Ready → taint gone.
    bmcs.a.reset(UUID_A, "On").await;
    let cfg = ccm_provider_metal::MetalConfig::parse(&config(&bmcs, "")).expect("cfg");
    let bmc = cfg
        .machine("node-a")
        .and_then(|m| m.bmc.clone())
        .expect("bmc");
    let redfish = ccm_provider_metal::redfish::Redfish::new(1, Duration::from_secs(2));
    wait_for("the BMC reports node-a On", || async {
        redfish.power(&bmc, "node-a").await == Ok(ccm_provider_metal::redfish::Power::On)
    })
    .await;
    set_ready(&client, "node-a", true).await;
    wait_for("shutdown taint removed from node-a", || async {
        node(&nodes, "node-a")
            .await
            .is_some_and(|n| !has_taint(&n, SHUTDOWN))
    })
    .await;

    // The inventory is reloaded on change: a machine added to the file initializes its Node.
    std::fs::write(
        &cloud_config,
        config(&bmcs, "[[machines]]\nname = \"late\"\nzone = \"rack-9\"\n"),
    )
    .expect("rewrite config");
    tokio::time::sleep(ccm_provider_metal::RELOAD_PERIOD * 2).await;
    register_node(&client, "late", &[], &[]).await;
    wait_for("late initialized from the reloaded inventory", || async {
        node(&nodes, "late").await.is_some_and(|n| {
            n.metadata
                .labels
                .unwrap_or_default()
                .get("topology.kubernetes.io/zone")
                == Some(&"rack-9".to_string())
        })
    })
    .await;
    ccm.stop().await;
}
