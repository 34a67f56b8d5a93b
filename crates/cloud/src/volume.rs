//! Disk topology: the capability the PersistentVolume labeler (the CCM-hosted replacement for
//! kube-apiserver's deprecated `PersistentVolumeLabel` admission plugin) is built from.

use std::collections::HashMap;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::PersistentVolumeSpec;

use crate::error::CloudResult;

/// Where a disk lives: the values of a PV's `topology.kubernetes.io/zone` and `/region` labels.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VolumeTopology {
    /// e.g. `us-east-1a`.
    pub zone: String,
    /// e.g. `us-east-1`.
    pub region: String,
}

/// Disk lookups for the PersistentVolume labeler. A provider that offers it (from
/// [`crate::CloudProvider::volumes`]) gets the `persistentvolumelabel` webhook without writing
/// any webhook code: the manager builds, batches and caches around these two methods.
#[async_trait]
pub trait Volumes: Send + Sync + 'static {
    /// The cloud disk id behind a PV, or `None` when the PV is not one of this cloud's disks
    /// (another driver, NFS, a local volume): such a PV is admitted unchanged. Pure: no cloud
    /// call.
    fn volume_id(&self, spec: &PersistentVolumeSpec) -> Option<String>;

    /// The topology of each *known* disk among `ids`, in one cloud call where the cloud allows
    /// it (the labeler passes at most [`Volumes::max_batch_size`] ids, so a burst of PVs costs
    /// one call, not one each). A disk missing from the map does not exist: its PV is admitted
    /// without labels. An `Err` is "no answer" and is never read as "absent": the labeler then
    /// refuses the PV (failure policy Fail) rather than admit one that could be scheduled where
    /// its disk cannot attach.
    async fn volume_topology(&self, ids: &[String])
    -> CloudResult<HashMap<String, VolumeTopology>>;

    /// The most ids worth passing to one [`Volumes::volume_topology`] call.
    fn max_batch_size(&self) -> usize {
        200
    }
}
