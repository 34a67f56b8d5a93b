//! The PersistentVolume labeler on EBS volumes in moto: a burst of PVs (known volumes in two
//! zones, unknown ids, PVs of other drivers) gets its labels from ONE `DescribeVolumes` with the
//! ids as a `volume-id` filter — an unknown id in the batch does not fail the call, its PV is
//! admitted unchanged — and a second burst of the same volumes costs no call at all.

mod common;

use std::sync::Arc;

use aws_sdk_ec2::types::VolumeType;
use ccm_cloud::CloudProvider;
use ccm_manager::webhook::pvlabel::PvLabeler;
use ccm_manager::webhook::{Admission, AdmissionRequest, Webhook};
use common::{AwsWorld, Moto};
use serde_json::{Value, json};

const KNOWN: usize = 60;
const UNKNOWN: usize = 20;

fn request(i: usize, spec: Value) -> AdmissionRequest {
    AdmissionRequest {
        uid: format!("uid-{i}"),
        operation: "CREATE".into(),
        kind: json!({"group": "", "version": "v1", "kind": "PersistentVolume"}),
        object: Some(json!({
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": format!("pv-{i}")},
            "spec": spec,
        })),
    }
}

fn label(ops: &[Value], key: &str) -> Option<String> {
    ops.iter()
        .find(|op| op["path"] == "/metadata/labels")
        .and_then(|op| op["value"][key].as_str())
        .map(str::to_string)
}

async fn create_volume(world: &AwsWorld, zone: &str) -> anyhow::Result<String> {
    let out = world
        .ec2
        .create_volume()
        .availability_zone(zone)
        .size(1)
        .volume_type(VolumeType::Gp3)
        .send()
        .await?;
    Ok(out.volume_id.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_pvs_costs_one_describe_volumes() -> anyhow::Result<()> {
    let moto = Moto::start();
    let region = "eu-west-3";
    let world = AwsWorld::create(&moto, region).await?;
    let mut volumes = Vec::new();
    for i in 0..KNOWN {
        let zone = if i % 2 == 0 {
            "eu-west-3a"
        } else {
            "eu-west-3b"
        };
        volumes.push((create_volume(&world, zone).await?, zone));
    }
    let provider = world.provider().await;
    let labeler = Arc::new(PvLabeler::new(
        provider.volumes().expect("aws offers volumes"),
    ));

    let mut requests = Vec::new();
    for (i, (id, _)) in volumes.iter().enumerate() {
        // Half in-tree (the `aws://<zone>/` form), half CSI.
        let spec = if i % 2 == 0 {
            json!({"awsElasticBlockStore": {"volumeID": format!("aws://eu-west-3a/{id}")}})
        } else {
            json!({"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": id}})
        };
        requests.push(request(i, spec));
    }
    for j in 0..UNKNOWN {
        let spec =
            json!({"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": format!("vol-{j:017x}")}});
        requests.push(request(KNOWN + j, spec));
    }
    requests.push(request(999, json!({"nfs": {"server": "nfs", "path": "/"}})));
    requests.push(request(
        998,
        json!({"csi": {"driver": "other.csi.example.com", "volumeHandle": "vol-1"}}),
    ));

    moto.start_recording().await;
    let answers = futures::future::join_all(requests.iter().map(|r| labeler.admit(r))).await;
    let calls = moto.recorded_calls().await;
    let describes: Vec<&(String, String)> = calls
        .iter()
        .filter(|(a, _)| a == "DescribeVolumes")
        .collect();
    assert_eq!(
        describes.len(),
        1,
        "one DescribeVolumes for the burst: {calls:?}"
    );
    assert!(
        describes[0].1.contains("volume-id") && !describes[0].1.contains("VolumeId.1"),
        "the ids go in a volume-id filter, not VolumeIds: {}",
        describes[0].1
    );

    for (i, answer) in answers.iter().enumerate() {
        let answer = answer.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
        if i < KNOWN {
            let Admission::Patch(ops) = answer else {
                anyhow::bail!("pv-{i} not labelled: {answer:?}");
            };
            assert_eq!(
                label(ops, "topology.kubernetes.io/zone").as_deref(),
                Some(volumes[i].1)
            );
            assert_eq!(
                label(ops, "topology.kubernetes.io/region").as_deref(),
                Some(region)
            );
        } else {
            assert_eq!(answer, &Admission::Allow, "request {i} admitted unchanged");
        }
    }

    // The same volumes again: answered from the cache (a disk never changes zone).
    moto.start_recording().await;
    for r in requests.iter().take(KNOWN) {
        assert!(matches!(labeler.admit(r).await, Ok(Admission::Patch(_))));
    }
    let again = moto.recorded().await;
    assert_eq!(again.get("DescribeVolumes"), None, "{again:?}");
    Ok(())
}
