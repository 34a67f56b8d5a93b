//! Security-group rules as upstream manages them, reconciled instead of only added: a rule is
//! granted when the Service asks for it and revoked when it no longer does, and only groups the
//! cluster owns (tagged `kubernetes.io/cluster/<id>`) are ever edited.
//!
//! Rules are compared flat — one protocol, port range and source each — because AWS groups and
//! splits permissions as it likes; a flat rule is what AWS counts against its quota.

use std::collections::BTreeSet;

/// What the load-balancer code remembers about security groups between calls.
#[derive(Debug, Default)]
pub(crate) struct GroupMemory {
    /// The cluster-tagged groups, as the last `DescribeSecurityGroups` found them.
    pub tagged: Option<BTreeSet<String>>,
    /// Every instance group seen when `tagged` was read: those need no new lookup.
    pub classified: BTreeSet<String>,
}
