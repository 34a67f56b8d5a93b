//! BMC credentials from a Kubernetes Secret (`credentials_secret`) against sushy-tools with
//! HTTP basic auth: the right Secret reads the power state; a wrong password or a missing
//! Secret is an error, never "instance gone".

mod support;

use ccm_cloud::{CloudProvider, InitContext};
use ccm_provider_metal::{MetalCloud, MetalConfig};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, PostParams};
use std::sync::Arc;
use support::*;
use tokio_util::sync::CancellationToken;

const UUID: &str = "0d0d0d0d-0000-4000-8000-00000000000d";

fn secret(name: &str, user: &str, password: &str) -> Secret {
    let mut s = Secret::default();
    s.metadata.name = Some(name.into());
    s.metadata.namespace = Some("kube-system".into());
    s.data = Some(
        [
            ("username".to_string(), ByteString(user.as_bytes().to_vec())),
            (
                "password".to_string(),
                ByteString(password.as_bytes().to_vec()),
            ),
        ]
        .into(),
    );
    s
}

fn node(name: &str) -> Node {
    let mut n = Node::default();
    n.metadata.name = Some(name.into());
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bmc_credentials_come_from_a_secret() {
    let sushy = Sushy::start_full(
        &[("System.Embedded.1", UUID, "Off")],
        None,
        Some(("ccm", "s3cret")),
    );
    let dir = TempDir::new("auth");
    let (_kube, _kubeconfig, client) = kube_sim(&dir.0).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "kube-system");
    let pp = PostParams::default();
    secrets
        .create(&pp, &secret("bmc-good", "ccm", "s3cret"))
        .await
        .expect("secret");
    secrets
        .create(&pp, &secret("bmc-wrong", "ccm", "nope"))
        .await
        .expect("secret");
    let machine = |name: &str, secret: &str| {
        format!(
            "[[machines]]\nname = \"{name}\"\n[machines.bmc]\nendpoint = \"{}\"\ncredentials_secret = \"{secret}\"\n",
            sushy.endpoint
        )
    };
    let config = [
        machine("good", "kube-system/bmc-good"),
        machine("wrong", "kube-system/bmc-wrong"),
        machine("missing", "kube-system/bmc-missing"),
    ]
    .concat();
    let cloud = MetalCloud::new(MetalConfig::parse(&config).expect("config")).expect("cloud");
    cloud
        .initialize(InitContext {
            client,
            shutdown: CancellationToken::new(),
        })
        .await
        .expect("initialize");
    let instances = cloud.instances().expect("instances");

    assert_eq!(instances.instance_shutdown(&node("good")).await, Ok(true));
    let status = instances
        .instances_status(&[node("wrong"), node("missing")].map(Arc::new))
        .await;
    let wrong = status[0].as_ref().expect_err("401 is an error");
    assert!(wrong.to_string().contains("401"), "{wrong}");
    let missing = status[1]
        .as_ref()
        .expect_err("a missing Secret is an error");
    assert!(
        missing.to_string().contains("kube-system/bmc-missing"),
        "{missing}"
    );
    assert!(
        !wrong.to_string().contains("nope"),
        "the password is never in a message"
    );
}
