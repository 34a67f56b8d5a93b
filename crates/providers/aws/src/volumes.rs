//! EBS volumes for the PersistentVolume labeler: one `DescribeVolumes` per batch of up to 200
//! volume ids, each volume's `AvailabilityZone` as its zone and the provider's region as its
//! region (upstream's `GetLabelsForVolume`, batched).

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_ec2::types::Filter;
use ccm_cloud::k8s_openapi::api::core::v1::PersistentVolumeSpec;
use ccm_cloud::{CloudResult, VolumeTopology, Volumes};

use crate::cloud::AwsCloud;

/// Volume ids per `DescribeVolumes` call: EC2 takes up to 200 values per filter.
pub const MAX_VOLUMES_PER_CALL: usize = 200;
/// The EBS CSI driver: its `volumeHandle` is the EBS volume id.
pub const EBS_CSI_DRIVER: &str = "ebs.csi.aws.com";
/// What an in-tree EBS PV names its volume while it is still being provisioned (upstream's
/// `ProvisionedVolumeName`): no disk yet, nothing to label.
const PLACEHOLDER: &str = "placeholder-for-provisioning";

/// The EBS volume id of an in-tree `awsElasticBlockStore` volume id: `vol-…`,
/// `aws:///vol-…` or `aws://<zone>/vol-…` (upstream's `KubernetesVolumeID` forms).
fn ebs_volume_id(raw: &str) -> Option<String> {
    if raw == PLACEHOLDER {
        return None;
    }
    let id = match raw.strip_prefix("aws://") {
        Some(rest) => rest.rsplit('/').next()?,
        None => raw,
    };
    id.starts_with("vol-").then(|| id.to_string())
}

#[async_trait]
impl Volumes for AwsCloud {
    fn volume_id(&self, spec: &PersistentVolumeSpec) -> Option<String> {
        if let Some(ebs) = &spec.aws_elastic_block_store {
            return ebs_volume_id(&ebs.volume_id);
        }
        let csi = spec.csi.as_ref()?;
        (csi.driver == EBS_CSI_DRIVER && csi.volume_handle.starts_with("vol-"))
            .then(|| csi.volume_handle.clone())
    }

    /// One `DescribeVolumes` per [`MAX_VOLUMES_PER_CALL`] ids, with the ids as a `volume-id`
    /// *filter*: given as `VolumeIds`, one unknown id fails the whole call
    /// (`InvalidVolume.NotFound`), while a filter answers the volumes that exist. A volume
    /// left out of the answer does not exist; a failed call is an error for every id.
    async fn volume_topology(
        &self,
        ids: &[String],
    ) -> CloudResult<HashMap<String, VolumeTopology>> {
        let clients = self.clients().await?;
        let (ec2, region) = (clients.ec2.clone(), clients.region.clone());
        let mut out = HashMap::new();
        for chunk in ids.chunks(MAX_VOLUMES_PER_CALL) {
            let filter = Filter::builder()
                .name("volume-id")
                .set_values(Some(chunk.to_vec()))
                .build();
            let mut token: Option<String> = None;
            loop {
                let req = ec2
                    .describe_volumes()
                    .filters(filter.clone())
                    .max_results(500)
                    .set_next_token(token.take());
                let page = self.call("DescribeVolumes", req.send()).await?;
                for v in page.volumes() {
                    if let (Some(id), Some(zone)) = (v.volume_id(), v.availability_zone()) {
                        let topo = VolumeTopology {
                            zone: zone.to_string(),
                            region: region.clone(),
                        };
                        out.insert(id.to_string(), topo);
                    }
                }
                match page.next_token() {
                    Some(t) if !t.is_empty() => token = Some(t.to_string()),
                    _ => break,
                }
            }
        }
        Ok(out)
    }

    fn max_batch_size(&self) -> usize {
        MAX_VOLUMES_PER_CALL
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_tree_volume_ids_in_every_upstream_form() {
        assert_eq!(ebs_volume_id("vol-0abc").as_deref(), Some("vol-0abc"));
        assert_eq!(
            ebs_volume_id("aws:///vol-0abc").as_deref(),
            Some("vol-0abc")
        );
        assert_eq!(
            ebs_volume_id("aws://us-east-1a/vol-0abc").as_deref(),
            Some("vol-0abc")
        );
        assert_eq!(ebs_volume_id(PLACEHOLDER), None);
        assert_eq!(ebs_volume_id("snap-0abc"), None);
    }
}
