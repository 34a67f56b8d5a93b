//! `--cloud-provider=metal` Instances end to end: the real CCM against kube-sim, machines from
//! the cloud-config inventory, power state from the sushy-tools Redfish emulator.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use support::*;

const SHUTDOWN: &str = "node.cloudprovider.kubernetes.io/shutdown";
const UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
const UUID_A: &str = "0a0a0a0a-0000-4000-8000-00000000000a";
const UUID_B: &str = "0b0b0b0b-0000-4000-8000-00000000000b";

fn config(sushy: &str, extra: &str) -> String {
    format!(
        r#"
[bmc]
concurrency = 4
timeout_ms = 2000

[[machines]]
name = "node-a"
instance_type = "r640"
zone = "rack-1"
region = "dc-1"
internal_ips = ["192.168.50.11"]
hostname = "node-a.lab"
[machines.bmc]
endpoint = "{sushy}"
system = "{UUID_A}"

[[machines]]
name = "node-b"
zone = "rack-2"
[machines.bmc]
endpoint = "{sushy}"
system = "{UUID_B}"

# Its BMC does not answer (nothing listens on port 9 here).
[[machines]]
name = "node-dead-bmc"
[machines.bmc]
endpoint = "http://127.0.0.1:9"

# The BMC answers, but has no such System.
[[machines]]
name = "node-no-system"
[machines.bmc]
endpoint = "{sushy}"
system = "no-such-system"

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
    let sushy = Sushy::start(&[("node-a", UUID_A, "On"), ("node-b", UUID_B, "On")]);
    let dir = TempDir::new("instances");
    let (_kube, kubeconfig, client) = kube_sim(&dir.0).await;
    let cloud_config = dir.0.join("metal.toml");
    std::fs::write(&cloud_config, config(&sushy.endpoint, "")).expect("config");
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
        "node-no-system",
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
    sushy.reset(UUID_A, "ForceOff").await;
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

    // A System the BMC does not have is an instance that does not exist: the NotReady Node goes.
    set_ready(&client, "node-no-system", false).await;
    wait_for("node-no-system deleted", || async {
        node(&nodes, "node-no-system").await.is_none()
    })
    .await;

    // Power back on; once the BMC says On the kubelet reports Ready → taint gone.
    sushy.reset(UUID_A, "On").await;
    let cfg = ccm_provider_metal::MetalConfig::parse(&config(&sushy.endpoint, "")).expect("cfg");
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
        config(
            &sushy.endpoint,
            "[[machines]]\nname = \"late\"\nzone = \"rack-9\"\n",
        ),
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
