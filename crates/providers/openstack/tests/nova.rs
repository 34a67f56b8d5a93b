//! The provider against a real OpenStack started on 127.0.0.1 by testenv/stack.sh (Keystone,
//! Nova on the fake virt driver, Neutron ML2 without agents, Placement, Glance; RabbitMQ and
//! MariaDB from Debian): servers booted and stopped and deleted with the real `openstack`
//! client, the provider answering many Nodes with one servers listing; a stopped server is
//! shut down, a deleted one gone, and an unreachable Nova or refused credentials are errors,
//! never "gone".

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use ccm_cloud::Instances;
use ccm_provider_openstack::OpenStackCloud;
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use kube::api::ObjectMeta;
use support::start_stack;

fn node(name: &str, provider_id: Option<String>) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn calls(c: &OpenStackCloud, op: &str) -> u64 {
    c.api_calls().get(op).copied().unwrap_or(0)
}

const LIST: &str = "compute GET /servers/detail";
const GET: &str = "compute GET /servers/{id}";

#[tokio::test(flavor = "multi_thread")]
async fn nova_instances_batched_shutdown_gone_and_errors() {
    let stack = tokio::task::spawn_blocking(start_stack)
        .await
        .expect("start");
    let ids: Vec<String> = ["node-a", "node-b", "node-c"]
        .iter()
        .map(|n| stack.boot(n))
        .collect();
    let nodes = vec![
        node("node-a", Some(format!("openstack:///{}", ids[0]))),
        node("node-b", None),
        node("node-c", Some(format!("openstack://RegionOne/{}", ids[2]))),
    ];
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

    // Nova's API down: errors, never gone.
    let pid = std::fs::read_to_string(stack.dir.join("nova.gpid")).expect("nova pid");
    let _ = Command::new("kill").arg(pid.trim()).status();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = cloud.instances_status(&nodes).await;
        if r.iter().all(|r| r.is_err()) {
            break;
        }
        assert!(Instant::now() < deadline, "Nova still answering: {r:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop(stack);
}
