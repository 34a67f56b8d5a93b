//! Disks of the simulated cloud, for the PersistentVolume labeler: each has a zone and a
//! region, and one `volume_topology` call answers a whole batch, as EC2's DescribeVolumes does.

use std::collections::HashMap;

use async_trait::async_trait;
use ccm_cloud::k8s_openapi::api::core::v1::PersistentVolumeSpec;
use ccm_cloud::{CloudResult, VolumeTopology, Volumes, op};
use serde::{Deserialize, Serialize};

use crate::cloud::SimCloud;

/// The CSI driver whose `volumeHandle` is a sim disk id: a PV of this driver gets its disk's
/// zone and region from the labeler.
pub const SIM_CSI_DRIVER: &str = "disk.csi.sim.ccm-rs.io";

/// A disk to create (control API and `[[volumes]]` in the config file).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeSpec {
    /// The disk id (`vol-…` when omitted).
    pub id: Option<String>,
    /// Default `region-1a`, the zone instances get by default.
    pub zone: Option<String>,
    /// Default `region-1`.
    pub region: Option<String>,
}

/// A disk as the sim stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimVolume {
    /// Its id, the PV's `csi.volumeHandle`.
    pub id: String,
    /// Where it can attach.
    pub zone: String,
    /// The zone's region.
    pub region: String,
}

impl SimCloud {
    /// Creates a disk and returns its id. An existing id is replaced (its zone changes).
    pub fn add_volume(&self, spec: VolumeSpec) -> String {
        self.tx(|tx| {
            tx.state.next_volume += 1;
            let id = spec
                .id
                .unwrap_or_else(|| format!("vol-{:017x}", tx.state.next_volume));
            let volume = SimVolume {
                id: id.clone(),
                zone: spec.zone.unwrap_or_else(|| "region-1a".into()),
                region: spec.region.unwrap_or_else(|| "region-1".into()),
            };
            tx.state.volumes.insert(id.clone(), volume);
            tx.log("add_volume", format!("volume/{id}"), true);
            id
        })
    }

    /// Deletes a disk; `false` if there was none.
    pub fn delete_volume(&self, id: &str) -> bool {
        self.tx(|tx| {
            let gone = tx.state.volumes.remove(id).is_some();
            tx.log("delete_volume", format!("volume/{id}"), gone);
            gone
        })
    }

    /// A snapshot of every disk.
    pub fn disks(&self) -> Vec<SimVolume> {
        self.inner.state.lock().volumes.values().cloned().collect()
    }
}

#[async_trait]
impl Volumes for SimCloud {
    fn volume_id(&self, spec: &PersistentVolumeSpec) -> Option<String> {
        let csi = spec.csi.as_ref()?;
        (csi.driver == SIM_CSI_DRIVER).then(|| csi.volume_handle.clone())
    }

    async fn volume_topology(
        &self,
        ids: &[String],
    ) -> CloudResult<HashMap<String, VolumeTopology>> {
        self.check_batch(ids.len())?;
        self.call(op::VOLUME_TOPOLOGY, |tx| {
            Ok(ids
                .iter()
                .filter_map(|id| tx.state.volumes.get(id))
                .map(|v| {
                    let topo = VolumeTopology {
                        zone: v.zone.clone(),
                        region: v.region.clone(),
                    };
                    (v.id.clone(), topo)
                })
                .collect())
        })
        .await
    }

    fn max_batch_size(&self) -> usize {
        self.inner.max_batch_size.min(200)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ccm_cloud::CloudProvider;

    #[tokio::test]
    async fn one_call_answers_the_known_disks_and_a_fault_is_an_error_not_absence() {
        let sim = SimCloud::seeded(1);
        let a = sim.add_volume(VolumeSpec {
            zone: Some("region-1b".into()),
            ..VolumeSpec::default()
        });
        let volumes = CloudProvider::volumes(&sim).expect("sim offers volumes");
        let ids = [a.clone(), "vol-gone".to_string()];
        let found = volumes.volume_topology(&ids).await.expect("lookup");
        assert_eq!(found.len(), 1, "unknown disks are left out: {found:?}");
        assert_eq!(found[&a].zone, "region-1b");
        assert_eq!(found[&a].region, "region-1");
        assert_eq!(sim.call_count(op::VOLUME_TOPOLOGY), 1);

        sim.fail_next(op::VOLUME_TOPOLOGY, 1).expect("known op");
        assert!(volumes.volume_topology(&ids).await.is_err());
        assert!(sim.delete_volume(&a));
        assert!(
            volumes
                .volume_topology(&ids)
                .await
                .expect("lookup")
                .is_empty()
        );
    }

    #[test]
    fn only_pvs_of_the_sim_driver_are_sim_disks() {
        let sim = SimCloud::new();
        let spec = |driver: &str| PersistentVolumeSpec {
            csi: Some(
                ccm_cloud::k8s_openapi::api::core::v1::CSIPersistentVolumeSource {
                    driver: driver.into(),
                    volume_handle: "vol-1".into(),
                    ..Default::default()
                },
            ),
            ..Default::default()
        };
        assert_eq!(
            sim.volume_id(&spec(SIM_CSI_DRIVER)).as_deref(),
            Some("vol-1")
        );
        assert_eq!(sim.volume_id(&spec("ebs.csi.aws.com")), None);
        assert_eq!(sim.volume_id(&PersistentVolumeSpec::default()), None);
    }
}
