//! Instances (Nova) on the shared stack of tests/neutron.rs: servers booted, stopped and
//! deleted with the real `openstack` client, the provider answering many Nodes with one
//! servers listing; a stopped server is shut down, a deleted one gone, and an unreachable Nova
//! or refused credentials are errors, never "gone".

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_cloud::Instances;
use ccm_cloud::k8s_openapi::api::core::v1::{Node, NodeSpec};
use ccm_provider_openstack::OpenStackCloud;

use super::Stack;

fn node(name: &str, provider_id: Option<String>) -> Node {
    let mut n = Node::default();
    n.metadata.name = Some(name.into());
    n.spec = Some(NodeSpec {
        provider_id,
        ..Default::default()
    });
    n
}

fn calls(c: &OpenStackCloud, op: &str) -> u64 {
    c.api_calls().get(op).copied().unwrap_or(0)
}

const LIST: &str = "compute GET /servers/detail";
const GET: &str = "compute GET /servers/{id}";

/// Batched metadata and status, `SHUTOFF`, a deleted server gone after Nova's own 404, wrong
/// credentials an error. Returns the provider and the Nodes for [`nova_down`].
pub async fn instances_scenario(stack: &Stack) -> (OpenStackCloud, Vec<Arc<Node>>) {
    let ids: Vec<String> = ["nova-a", "nova-b", "nova-c"]
        .iter()
        .map(|n| stack.boot(n))
        .collect();
    let nodes = vec![
        node("nova-a", Some(format!("openstack:///{}", ids[0]))),
        node("nova-b", None),
        node("nova-c", Some(format!("openstack://RegionOne/{}", ids[2]))),
    ]
    .into_iter()
    .map(Arc::new)
    .collect::<Vec<_>>();
    let cloud = stack.cloud("ccm-secret");
    cloud.check().await.expect("compute in the catalog");

    // Metadata for three Nodes (by id, by name, by regional id): one listing.
    let md = cloud.instances_metadata(&nodes).await;
    for (i, m) in md.iter().enumerate() {
        let m = m.as_ref().expect("metadata").as_ref().expect("some");
        assert_eq!(m.provider_id, format!("openstack:///{}", ids[i]));
        assert_eq!(m.instance_type, "m1.small");
        assert_eq!(m.zone, "nova");
        assert_eq!(m.region, "RegionOne");
    }
    assert_eq!(calls(&cloud, LIST), 1, "{:?}", cloud.api_calls());
    assert!(
        calls(&cloud, "network GET /v2.0/ports") <= 1,
        "{:?}",
        cloud.api_calls()
    );

    // Status: all running, one listing more.
    let st = cloud.instances_status(&nodes).await;
    assert!(
        st.iter()
            .all(|s| s.as_ref().is_ok_and(|s| s.exists && !s.shutdown)),
        "{st:?}"
    );
    assert_eq!(calls(&cloud, LIST), 2);

    // `openstack server stop` → SHUTOFF → shut down (still exists).
    stack.openstack(&["server", "stop", &ids[0]]);
    stack.wait_status(&ids[0], Some("SHUTOFF"));
    let st = cloud.instances_status(&nodes).await;
    assert!(st[0].as_ref().expect("status").shutdown);
    assert!(st[0].as_ref().expect("status").exists);

    // Delete → gone, confirmed by Nova's own 404 for that id.
    stack.openstack(&["server", "delete", "--wait", &ids[2]]);
    stack.wait_status(&ids[2], None);
    let before = calls(&cloud, GET);
    let st = cloud.instances_status(&nodes).await;
    let gone = st[2].as_ref().expect("status");
    assert!(!gone.exists, "deleted server is gone");
    assert_eq!(
        calls(&cloud, GET),
        before + 1,
        "one confirming GET, only for the missing one"
    );
    assert!(st[1].as_ref().expect("status").exists);

    // Wrong credentials (Keystone's 401): errors for every Node, never gone.
    let bad = stack.cloud("not-the-password");
    for r in bad.instances_status(&nodes).await {
        assert!(r.is_err(), "{r:?}");
    }

    (cloud, nodes)
}

/// Nova's API stopped: errors for every Node, never gone. Stops Nova: run it last.
pub async fn nova_down(stack: &Stack, cloud: &OpenStackCloud, nodes: &[Arc<Node>]) {
    let pid = std::fs::read_to_string(stack.dir.join("nova.gpid")).expect("nova pid");
    let _ = Command::new("kill").arg(pid.trim()).status();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = cloud.instances_status(nodes).await;
        if r.iter().all(|r| r.is_err()) {
            break;
        }
        assert!(Instant::now() < deadline, "Nova still answering: {r:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
