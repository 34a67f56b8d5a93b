//! Pure decisions of the cloud-node controller: (Node, cloud metadata) → what to write.
//!
//! Everything here is a function of its arguments, so every rule of upstream's `syncNode`,
//! `updateNodeAddress` and `GetNodeAddressesFromNodeIP` is unit- and property-tested without an
//! API server or a cloud. The async loop in [`super`] only gathers inputs and sends the patches
//! built here.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ccm_cloud::{InstanceMetadata, node_provider_id};
use k8s_openapi::api::core::v1::{Node, NodeAddress, Taint};
use serde_json::{Value, json};

use crate::nodeutil::{
    ANNOTATION_PROVIDED_NODE_IP, LABEL_INSTANCE_TYPE, LABEL_INSTANCE_TYPE_BETA, LABEL_REGION,
    LABEL_REGION_BETA, LABEL_ZONE, LABEL_ZONE_BETA, TAINT_UNINITIALIZED, taints,
};

/// Why a Node cannot be initialized from the metadata the cloud returned. The Node stays
/// tainted, is retried with backoff and gets a Warning event carrying this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The kubelet's `alpha.kubernetes.io/provided-node-ip` does not parse or matches no cloud
    /// address (upstream: "provided node ip for node %q is not valid").
    #[error("provided node ip for node {node:?} is not valid: {reason}")]
    ProvidedNodeIp {
        /// The Node.
        node: String,
        /// What is wrong with the annotation.
        reason: String,
    },
    /// Neither the Node nor the cloud has a providerID (upstream PR #123713).
    #[error("cloud provider does not set node provider ID for node {node}")]
    ProviderIdMissing {
        /// The Node.
        node: String,
    },
}

/// What initialization changes on one Node. Every field holds only differences from the
/// observed Node, so an empty update means "nothing to write".
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeUpdate {
    /// New `spec.providerID` (only when the Node has none).
    pub provider_id: Option<String>,
    /// Labels to set (only those absent or with another value).
    pub labels: BTreeMap<String, String>,
    /// New `status.addresses`, when they differ from the Node's.
    pub addresses: Option<Vec<NodeAddress>>,
    /// The Node's taints without the uninitialized taint, when it carried one.
    pub taints: Option<Vec<Taint>>,
}

impl NodeUpdate {
    /// True when the object (metadata/spec) needs a write.
    pub fn needs_object_write(&self) -> bool {
        self.provider_id.is_some() || !self.labels.is_empty() || self.taints.is_some()
    }

    /// True when nothing at all changes.
    pub fn is_noop(&self) -> bool {
        self.addresses.is_none() && !self.needs_object_write()
    }
}

fn labels(node: &Node) -> Option<&BTreeMap<String, String>> {
    node.metadata.labels.as_ref()
}

fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    labels(node).and_then(|l| l.get(key)).map(String::as_str)
}

fn node_name(node: &Node) -> String {
    node.metadata.name.clone().unwrap_or_default()
}

fn addresses(node: &Node) -> &[NodeAddress] {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or(&[])
}

/// Upstream's filter for provider-supplied labels: the regex `(^|\.)(kubernetes|k8s)\.io/`,
/// i.e. keys in the `kubernetes.io` / `k8s.io` namespaces (or their subdomains) are reserved.
pub fn is_reserved_label_key(key: &str) -> bool {
    let bytes = key.as_bytes();
    (0..bytes.len()).any(|i| {
        (i == 0 || bytes[i - 1] == b'.')
            && (key[i..].starts_with("kubernetes.io/") || key[i..].starts_with("k8s.io/"))
    })
}

/// Parses `alpha.kubernetes.io/provided-node-ip` as upstream's `ParseNodeIPAnnotation`: one
/// IP, or two IPs of different families, neither unspecified. No trimming.
pub fn parse_provided_node_ips(annotation: &str) -> Result<Vec<IpAddr>, String> {
    let mut ips = Vec::new();
    for part in annotation.split(',') {
        let ip: IpAddr = part
            .parse()
            .map_err(|_| format!("could not parse {part:?}"))?;
        ips.push(ip);
    }
    if ips.len() > 2 || (ips.len() == 2 && ips[0].is_ipv6() == ips[1].is_ipv6()) {
        return Err("must contain either a single IP or a dual-stack pair of IPs".into());
    }
    if ips.len() == 2 && ips.iter().any(IpAddr::is_unspecified) {
        return Err("dual-stack must not contain unspecified IPs".into());
    }
    Ok(ips)
}

/// Upstream's `GetNodeAddressesFromNodeIP`: cloud addresses equal to each provided IP come
/// first (keeping their cloud type), then every cloud address of a type no provided IP
/// matched. The node IP thereby wins exclusively within its type.
pub fn addresses_from_node_ips(
    ips: &[IpAddr],
    cloud: &[NodeAddress],
) -> Result<Vec<NodeAddress>, String> {
    let mut out = Vec::new();
    let mut matched_types = BTreeSet::new();
    for ip in ips {
        // Upstream compares the cloud's text with Go's canonical form of the IP.
        let text = ip.to_string();
        let mut matched = false;
        for a in cloud.iter().filter(|a| a.address == text) {
            out.push(a.clone());
            matched_types.insert(a.type_.clone());
            matched = true;
        }
        if !matched {
            return Err(format!(
                "failed to get node address from cloud provider that matches ip: {ip}"
            ));
        }
    }
    out.extend(
        cloud
            .iter()
            .filter(|a| !matched_types.contains(&a.type_))
            .cloned(),
    );
    Ok(out)
}

/// The addresses the Node should carry given the cloud's (upstream `updateNodeAddress` steps
/// 2–4): `Ok(None)` when the cloud returned none (existing addresses are kept); the Node's
/// `Hostname` addresses are carried over when the cloud has none; the provided node IP is
/// enforced.
pub fn desired_addresses(
    node: &Node,
    cloud: &[NodeAddress],
) -> Result<Option<Vec<NodeAddress>>, PlanError> {
    if cloud.is_empty() {
        return Ok(None);
    }
    let mut wanted = cloud.to_vec();
    if !wanted.iter().any(|a| a.type_ == "Hostname") {
        wanted.extend(
            addresses(node)
                .iter()
                .filter(|a| a.type_ == "Hostname")
                .cloned(),
        );
    }
    if let Some(annotation) = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_PROVIDED_NODE_IP))
    {
        let invalid = |reason: String| PlanError::ProvidedNodeIp {
            node: node_name(node),
            reason,
        };
        let ips = parse_provided_node_ips(annotation).map_err(invalid)?;
        wanted = addresses_from_node_ips(&ips, &wanted).map_err(invalid)?;
    }
    Ok(Some(wanted))
}

/// Upstream's `nodeAddressesChangeDetected(old, new)` — lengths differ, or a new address
/// differs from the old address of its type (last one wins) — except that an identical list
/// is never a change. (Upstream reports a change on every pass for a Node with two distinct
/// addresses of one type, and then sends an empty patch every period.)
pub fn addresses_changed(old: &[NodeAddress], new: &[NodeAddress]) -> bool {
    if old == new {
        return false;
    }
    if old.len() != new.len() {
        return true;
    }
    let by_type: BTreeMap<&str, &str> = old
        .iter()
        .map(|a| (a.type_.as_str(), a.address.as_str()))
        .collect();
    new.iter()
        .any(|a| by_type.get(a.type_.as_str()) != Some(&a.address.as_str()))
}

/// Initialization of a Node carrying the uninitialized taint (upstream `syncNode` step 5 plus
/// the address update that upstream runs right after): providerID, GA and beta labels,
/// filtered additional labels, addresses, and removal of the uninitialized taint.
pub fn plan_initialization(node: &Node, meta: &InstanceMetadata) -> Result<NodeUpdate, PlanError> {
    let mut update = NodeUpdate::default();

    if node_provider_id(node).is_empty() {
        if meta.provider_id.is_empty() {
            return Err(PlanError::ProviderIdMissing {
                node: node_name(node),
            });
        }
        update.provider_id = Some(meta.provider_id.clone());
    }

    // Validated before anything is written: a mismatch keeps the Node tainted. Upstream checks
    // the annotation against the cloud list even when that list is empty (then nothing matches).
    if meta.node_addresses.is_empty()
        && let Some(annotation) = provided_node_ip(node)
    {
        let invalid = |reason: String| PlanError::ProvidedNodeIp {
            node: node_name(node),
            reason,
        };
        let ips = parse_provided_node_ips(&annotation).map_err(invalid)?;
        addresses_from_node_ips(&ips, &[]).map_err(invalid)?;
    }
    let wanted = desired_addresses(node, &meta.node_addresses)?;
    if let Some(w) = wanted
        && addresses_changed(addresses(node), &w)
    {
        update.addresses = Some(w);
    }

    let mut set = |key: &str, value: &str| {
        if !value.is_empty() && label(node, key) != Some(value) {
            update.labels.insert(key.to_string(), value.to_string());
        }
    };
    set(LABEL_INSTANCE_TYPE, &meta.instance_type);
    set(LABEL_INSTANCE_TYPE_BETA, &meta.instance_type);
    set(LABEL_ZONE, &meta.zone);
    set(LABEL_ZONE_BETA, &meta.zone);
    set(LABEL_REGION, &meta.region);
    set(LABEL_REGION_BETA, &meta.region);

    for (key, value) in &meta.additional_labels {
        if is_reserved_label_key(key) {
            tracing::warn!(node = %node_name(node), label = %key, "dropping cloud label in a reserved namespace (kubernetes.io, k8s.io)");
            continue;
        }
        match label(node, key) {
            Some(existing) => {
                if existing != value {
                    tracing::warn!(node = %node_name(node), label = %key, existing, cloud = %value, "not overwriting existing label");
                }
            }
            None => {
                update.labels.insert(key.clone(), value.clone());
            }
        }
    }

    let all = taints(node);
    if all.iter().any(|t| t.key == TAINT_UNINITIALIZED) {
        update.taints = Some(
            all.iter()
                .filter(|t| t.key != TAINT_UNINITIALIZED)
                .cloned()
                .collect(),
        );
    }
    Ok(update)
}

fn provided_node_ip(node: &Node) -> Option<String> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_PROVIDED_NODE_IP))
        .cloned()
}

/// Periodic address refresh of an initialized Node (upstream `updateNodeAddress`): the new
/// address list when it changed, `Ok(None)` when there is nothing to write (still tainted,
/// cloud returned no addresses, or unchanged).
pub fn plan_address_refresh(
    node: &Node,
    cloud: &[NodeAddress],
) -> Result<Option<Vec<NodeAddress>>, PlanError> {
    if crate::nodeutil::has_taint(node, TAINT_UNINITIALIZED) {
        return Ok(None);
    }
    Ok(desired_addresses(node, cloud)?.filter(|w| addresses_changed(addresses(node), w)))
}

/// Beta→GA label reconciliation for initialized Nodes (upstream §2.6): for each pair whose
/// beta (primary) label is set, the GA label must carry the same value. Returns labels to set.
pub fn plan_ga_labels(node: &Node) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (primary, secondary) in [
        (LABEL_ZONE_BETA, LABEL_ZONE),
        (LABEL_REGION_BETA, LABEL_REGION),
        (LABEL_INSTANCE_TYPE_BETA, LABEL_INSTANCE_TYPE),
    ] {
        if let Some(v) = label(node, primary)
            && label(node, secondary) != Some(v)
        {
            out.insert(secondary.to_string(), v.to_string());
        }
    }
    out
}

/// JSON merge patch for `nodes/{name}/status` setting `status.addresses` (the caller adds
/// `metadata.resourceVersion`).
pub fn status_patch(addresses: &[NodeAddress]) -> Value {
    json!({ "status": { "addresses": addresses } })
}

/// JSON merge patch for the Node object: providerID, labels and the taint list (`null` when
/// no taint remains). `None` when the update changes nothing there.
pub fn object_patch(update: &NodeUpdate) -> Option<Value> {
    if !update.needs_object_write() {
        return None;
    }
    let mut patch = json!({});
    if !update.labels.is_empty() {
        patch["metadata"]["labels"] = json!(update.labels);
    }
    if let Some(id) = &update.provider_id {
        patch["spec"]["providerID"] = json!(id);
    }
    if let Some(t) = &update.taints {
        patch["spec"]["taints"] = taints_value(t);
    }
    Some(patch)
}

/// JSON merge patch setting a Node's labels.
pub fn labels_patch(labels: &BTreeMap<String, String>) -> Value {
    json!({ "metadata": { "labels": labels } })
}

/// A taint list as a merge-patch value: merge patches replace lists whole, and `null` removes
/// the field when no taint remains.
pub fn taints_value(taints: &[Taint]) -> Value {
    if taints.is_empty() {
        Value::Null
    } else {
        json!(taints)
    }
}

/// Whether a Node being initialized should wait (bounded by `wait`) for its own route before
/// its status write, so the write can carry `NetworkUnavailable=False`: only when the fold is
/// on, a route controller publishes, the cloud lookup found the instance and the Node has pod
/// CIDRs to route. A Node never waits for any other Node's route.
pub fn waits_for_route(
    wait: std::time::Duration,
    routes_published: bool,
    metadata_found: bool,
    has_pod_cidrs: bool,
) -> bool {
    !wait.is_zero() && routes_published && metadata_found && has_pod_cidrs
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use proptest::prelude::*;

    fn addr(t: &str, a: &str) -> NodeAddress {
        NodeAddress {
            type_: t.into(),
            address: a.into(),
        }
    }

    fn taint(key: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: "NoSchedule".into(),
            value: Some("true".into()),
            ..Default::default()
        }
    }

    fn node(name: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(vec![taint(TAINT_UNINITIALIZED)]),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                addresses: Some(vec![addr("Hostname", name)]),
                ..Default::default()
            }),
        }
    }

    fn with_annotation(mut n: Node, v: &str) -> Node {
        n.metadata.annotations = Some(BTreeMap::from([(
            ANNOTATION_PROVIDED_NODE_IP.to_string(),
            v.to_string(),
        )]));
        n
    }

    fn meta() -> InstanceMetadata {
        InstanceMetadata {
            provider_id: "sim://i-1".into(),
            instance_type: "m5.large".into(),
            zone: "zone-a".into(),
            region: "region-1".into(),
            node_addresses: vec![
                addr("InternalIP", "10.0.0.1"),
                addr("ExternalIP", "1.2.3.4"),
            ],
            additional_labels: BTreeMap::from([
                ("example.com/team".to_string(), "a".to_string()),
                ("node.kubernetes.io/evil".to_string(), "x".to_string()),
                ("foo.k8s.io/evil".to_string(), "x".to_string()),
            ]),
        }
    }

    #[test]
    fn initializes_everything() {
        let n = node("n1");
        let u = plan_initialization(&n, &meta()).unwrap();
        assert_eq!(u.provider_id.as_deref(), Some("sim://i-1"));
        assert_eq!(
            u.labels,
            BTreeMap::from(
                [
                    (LABEL_INSTANCE_TYPE, "m5.large"),
                    (LABEL_INSTANCE_TYPE_BETA, "m5.large"),
                    (LABEL_ZONE, "zone-a"),
                    (LABEL_ZONE_BETA, "zone-a"),
                    (LABEL_REGION, "region-1"),
                    (LABEL_REGION_BETA, "region-1"),
                    ("example.com/team", "a"),
                ]
                .map(|(k, v)| (k.to_string(), v.to_string()))
            )
        );
        assert_eq!(
            u.addresses,
            Some(vec![
                addr("InternalIP", "10.0.0.1"),
                addr("ExternalIP", "1.2.3.4"),
                addr("Hostname", "n1"),
            ])
        );
        assert_eq!(u.taints, Some(vec![]));
        let p = object_patch(&u).unwrap();
        assert_eq!(p["spec"]["taints"], Value::Null);
        assert_eq!(p["spec"]["providerID"], "sim://i-1");
    }

    #[test]
    fn existing_labels_and_provider_id_are_kept() {
        let mut n = node("n1");
        n.metadata.labels = Some(BTreeMap::from([
            ("example.com/team".to_string(), "b".to_string()),
            (LABEL_ZONE.to_string(), "zone-a".to_string()),
        ]));
        n.spec.as_mut().unwrap().provider_id = Some("sim://other".into());
        let u = plan_initialization(&n, &meta()).unwrap();
        assert_eq!(u.provider_id, None);
        assert!(!u.labels.contains_key("example.com/team"));
        assert!(!u.labels.contains_key(LABEL_ZONE));
        assert!(u.labels.contains_key(LABEL_ZONE_BETA));
    }

    #[test]
    fn empty_provider_id_rule() {
        let mut m = meta();
        m.provider_id.clear();
        assert!(matches!(
            plan_initialization(&node("n1"), &m),
            Err(PlanError::ProviderIdMissing { .. })
        ));
        let mut n = node("n1");
        n.spec.as_mut().unwrap().provider_id = Some("sim://i-1".into());
        assert!(plan_initialization(&n, &m).is_ok());
    }

    #[test]
    fn other_taints_survive() {
        let mut n = node("n1");
        n.spec.as_mut().unwrap().taints = Some(vec![taint("a"), taint(TAINT_UNINITIALIZED)]);
        let u = plan_initialization(&n, &meta()).unwrap();
        assert_eq!(u.taints, Some(vec![taint("a")]));
    }

    #[test]
    fn reserved_label_keys() {
        for k in [
            "kubernetes.io/x",
            "node.kubernetes.io/x",
            "k8s.io/x",
            "foo.k8s.io/x",
        ] {
            assert!(is_reserved_label_key(k), "{k}");
        }
        for k in [
            "example.com/x",
            "mykubernetes.io/x",
            "k8s.io",
            "xk8s.io/y",
            "team",
        ] {
            assert!(!is_reserved_label_key(k), "{k}");
        }
    }

    #[test]
    fn provided_node_ip_single() {
        let cloud = vec![
            addr("InternalIP", "10.0.0.1"),
            addr("InternalIP", "10.0.0.2"),
            addr("ExternalIP", "1.2.3.4"),
        ];
        let n = with_annotation(node("n1"), "10.0.0.2");
        assert_eq!(
            desired_addresses(&n, &cloud).unwrap().unwrap(),
            vec![
                addr("InternalIP", "10.0.0.2"),
                addr("ExternalIP", "1.2.3.4"),
                addr("Hostname", "n1"),
            ]
        );
    }

    #[test]
    fn provided_node_ip_dual_stack() {
        let cloud = vec![
            addr("InternalIP", "10.0.0.1"),
            addr("InternalIP", "fd00::1"),
            addr("InternalIP", "fd00::2"),
            addr("Hostname", "h"),
        ];
        let n = with_annotation(node("n1"), "fd00::2,10.0.0.1");
        assert_eq!(
            desired_addresses(&n, &cloud).unwrap().unwrap(),
            vec![
                addr("InternalIP", "fd00::2"),
                addr("InternalIP", "10.0.0.1"),
                addr("Hostname", "h"),
            ]
        );
    }

    #[test]
    fn provided_node_ip_errors() {
        let cloud = vec![addr("InternalIP", "10.0.0.1")];
        for bad in [
            "10.0.0.9",
            "",
            " 10.0.0.1",
            "10.0.0.1,10.0.0.2",
            "0.0.0.0,::1",
            "1.1.1.1,::1,2.2.2.2",
            "nope",
        ] {
            let n = with_annotation(node("n1"), bad);
            assert!(
                matches!(
                    plan_initialization(
                        &n,
                        &InstanceMetadata {
                            node_addresses: cloud.clone(),
                            ..meta()
                        }
                    ),
                    Err(PlanError::ProvidedNodeIp { .. })
                ),
                "{bad:?}"
            );
        }
        // Empty cloud addresses cannot match the annotation either.
        let n = with_annotation(node("n1"), "10.0.0.1");
        let m = InstanceMetadata {
            node_addresses: vec![],
            ..meta()
        };
        assert!(plan_initialization(&n, &m).is_err());
    }

    #[test]
    fn change_detection_matches_upstream_except_identical() {
        let a = vec![addr("InternalIP", "1"), addr("ExternalIP", "2")];
        let b = vec![addr("ExternalIP", "2"), addr("InternalIP", "1")];
        assert!(
            !addresses_changed(&a, &b),
            "reorder across types is no change"
        );
        assert!(addresses_changed(&a, &a[..1]));
        let dup = vec![addr("InternalIP", "1"), addr("InternalIP", "2")];
        assert!(
            !addresses_changed(&dup, &dup),
            "identical is never a change"
        );
    }

    #[test]
    fn refresh_skips_tainted_and_empty() {
        let n = node("n1");
        assert_eq!(plan_address_refresh(&n, &meta().node_addresses), Ok(None));
        let mut n = node("n1");
        n.spec.as_mut().unwrap().taints = None;
        assert_eq!(plan_address_refresh(&n, &[]), Ok(None));
        let new = plan_address_refresh(&n, &meta().node_addresses)
            .unwrap()
            .unwrap();
        n.status.as_mut().unwrap().addresses = Some(new);
        assert_eq!(plan_address_refresh(&n, &meta().node_addresses), Ok(None));
    }

    #[test]
    fn ga_labels_follow_beta() {
        let mut n = node("n1");
        n.metadata.labels = Some(BTreeMap::from([
            (LABEL_ZONE_BETA.to_string(), "z".to_string()),
            (LABEL_ZONE.to_string(), "old".to_string()),
            (LABEL_REGION.to_string(), "r".to_string()),
            (LABEL_INSTANCE_TYPE_BETA.to_string(), "t".to_string()),
            (LABEL_INSTANCE_TYPE.to_string(), "t".to_string()),
        ]));
        assert_eq!(
            plan_ga_labels(&n),
            BTreeMap::from([(LABEL_ZONE.to_string(), "z".to_string())])
        );
    }

    // ---- properties ------------------------------------------------------------------------

    fn arb_addr() -> impl Strategy<Value = NodeAddress> {
        (
            prop::sample::select(vec!["InternalIP", "ExternalIP", "Hostname", "InternalDNS"]),
            prop::sample::select(vec![
                "10.0.0.1", "10.0.0.2", "1.2.3.4", "fd00::1", "fd00::2", "host-a",
            ]),
        )
            .prop_map(|(t, a)| addr(t, a))
    }

    fn arb_labels() -> impl Strategy<Value = BTreeMap<String, String>> {
        prop::collection::btree_map(
            prop::sample::select(vec![
                "example.com/a",
                "example.com/b",
                "kubernetes.io/c",
                "x.k8s.io/d",
                LABEL_ZONE,
                LABEL_ZONE_BETA,
                LABEL_INSTANCE_TYPE_BETA,
            ])
            .prop_map(String::from),
            prop::sample::select(vec!["v1", "v2"]).prop_map(String::from),
            0..5,
        )
    }

    prop_compose! {
        fn arb_node()(
            labels in arb_labels(),
            addrs in prop::collection::vec(arb_addr(), 0..4),
            pid in prop::option::of(Just("sim://i-9".to_string())),
            other_taint in any::<bool>(),
            tainted in any::<bool>(),
            annotation in prop::option::of(prop::sample::select(vec!["10.0.0.1", "fd00::1", "10.0.0.2,fd00::2", "bad"])),
        ) -> Node {
            let mut ts = vec![];
            if other_taint { ts.push(taint("other")); }
            if tainted { ts.push(taint(TAINT_UNINITIALIZED)); }
            let mut n = node("n");
            n.metadata.labels = Some(labels);
            n.status.as_mut().unwrap().addresses = Some(addrs);
            n.spec.as_mut().unwrap().provider_id = pid;
            n.spec.as_mut().unwrap().taints = Some(ts);
            if let Some(a) = annotation { n = with_annotation(n, a); }
            n
        }
    }

    prop_compose! {
        fn arb_meta()(
            addrs in prop::collection::vec(arb_addr(), 0..5),
            extra in arb_labels(),
            pid in prop::sample::select(vec!["", "sim://i-1"]),
            zone in prop::sample::select(vec!["", "z1"]),
        ) -> InstanceMetadata {
            InstanceMetadata {
                provider_id: pid.into(),
                instance_type: "t".into(),
                node_addresses: addrs,
                zone: zone.into(),
                region: "r".into(),
                additional_labels: extra,
            }
        }
    }

    /// Applies an update the way the API server would apply our two patches.
    fn apply(node: &Node, u: &NodeUpdate) -> Node {
        let mut n = node.clone();
        if let Some(a) = &u.addresses {
            n.status.get_or_insert_default().addresses = Some(a.clone());
        }
        for (k, v) in &u.labels {
            n.metadata
                .labels
                .get_or_insert_default()
                .insert(k.clone(), v.clone());
        }
        if let Some(p) = &u.provider_id {
            n.spec.get_or_insert_default().provider_id = Some(p.clone());
        }
        if let Some(t) = &u.taints {
            n.spec.get_or_insert_default().taints = Some(t.clone());
        }
        n
    }

    proptest! {
        #[test]
        fn init_plan_is_idempotent_and_safe(n in arb_node(), m in arb_meta()) {
            match plan_initialization(&n, &m) {
                Err(_) => {}
                Ok(u) => {
                    let after = apply(&n, &u);
                    // Never overwrites an existing non-topology label.
                    for (k, v) in n.metadata.labels.iter().flatten() {
                        if !k.contains("topology.kubernetes.io") && !k.contains("beta.kubernetes.io") && !k.starts_with("node.kubernetes.io/instance-type") {
                            prop_assert_eq!(label(&after, k), Some(v.as_str()));
                        }
                    }
                    // No reserved key arrives from additional labels.
                    for k in u.labels.keys() {
                        let topo = [LABEL_INSTANCE_TYPE, LABEL_INSTANCE_TYPE_BETA, LABEL_ZONE, LABEL_ZONE_BETA, LABEL_REGION, LABEL_REGION_BETA].contains(&k.as_str());
                        prop_assert!(topo || !is_reserved_label_key(k));
                    }
                    // Uninitialized taint gone, others kept in order.
                    let kept: Vec<_> = taints(&n).iter().filter(|t| t.key != TAINT_UNINITIALIZED).cloned().collect();
                    prop_assert_eq!(taints(&after).to_vec(), kept);
                    // Node ends with a providerID.
                    prop_assert!(!node_provider_id(&after).is_empty());
                    // Applying the plan reaches a fixed point: nothing more to write.
                    let again = plan_initialization(&after, &m).unwrap();
                    prop_assert!(again.is_noop(), "{:?}", again);
                    // Empty cloud addresses keep the node's addresses.
                    if m.node_addresses.is_empty() {
                        prop_assert!(u.addresses.is_none());
                    }
                    // Every written address comes from the cloud or is a carried Hostname.
                    if let Some(a) = &u.addresses {
                        for x in a {
                            prop_assert!(m.node_addresses.contains(x) || (x.type_ == "Hostname" && addresses(&n).contains(x)));
                        }
                    }
                }
            }
        }

        #[test]
        fn refresh_reaches_fixed_point(n in arb_node(), cloud in prop::collection::vec(arb_addr(), 0..5)) {
            if let Ok(Some(a)) = plan_address_refresh(&n, &cloud) {
                let mut after = n.clone();
                after.status.as_mut().unwrap().addresses = Some(a);
                prop_assert_eq!(plan_address_refresh(&after, &cloud), Ok(None));
            }
        }

        #[test]
        fn ga_plan_reaches_fixed_point(n in arb_node()) {
            let set = plan_ga_labels(&n);
            let after = apply(&n, &NodeUpdate { labels: set, ..Default::default() });
            prop_assert!(plan_ga_labels(&after).is_empty());
        }

        #[test]
        fn node_ip_result_is_subset_and_prefix(cloud in prop::collection::vec(arb_addr(), 0..6), which in 0usize..6) {
            if let Some(target) = cloud.get(which) && let Ok(ip) = target.address.parse::<IpAddr>() {
                let out = addresses_from_node_ips(&[ip], &cloud).unwrap();
                prop_assert_eq!(&out[0].address, &target.address);
                for a in &out { prop_assert!(cloud.contains(a)); }
            }
        }
    }

    #[test]
    fn route_wait_only_when_it_can_help() {
        let w = std::time::Duration::from_secs(2);
        assert!(waits_for_route(w, true, true, true));
        assert!(
            !waits_for_route(std::time::Duration::ZERO, true, true, true),
            "fold off"
        );
        assert!(
            !waits_for_route(w, false, true, true),
            "no route controller"
        );
        assert!(
            !waits_for_route(w, true, false, true),
            "lookup failed: fail fast"
        );
        assert!(!waits_for_route(w, true, true, false), "nothing to route");
    }
}
