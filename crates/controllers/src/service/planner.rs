//! Pure decisions of the service load-balancer controller (upstream
//! `controllers/service/controller.go`): which Services are handled, which changes matter,
//! which Nodes back a load balancer, and what one sync does. No I/O: the async loop in
//! [`super`] gathers the inputs and executes the outcome.

use std::collections::BTreeMap;
use std::time::Duration;

use ccm_cloud::CloudError;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};

use crate::nodeutil::{
    LABEL_EXCLUDE_FROM_LB, TAINT_TO_BE_DELETED_BY_CA, TAINT_UNINITIALIZED, has_taint, parse_go_bool,
};

/// The finalizer that keeps a Service (and so the knowledge of its LB) alive until the cloud
/// LB is deleted (upstream `servicehelper.LoadBalancerCleanupFinalizer`).
pub const LOAD_BALANCER_CLEANUP_FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";

/// How many node names an `UpdateLoadBalancerFailed` message lists before "N more" (upstream).
pub const MAX_NODE_NAMES_IN_EVENT: usize = 20;

fn spec_type(svc: &Service) -> &str {
    svc.spec
        .as_ref()
        .and_then(|s| s.type_.as_deref())
        .unwrap_or("ClusterIP")
}

/// True iff the Service is `type: LoadBalancer` and its `spec.loadBalancerClass` is `class`,
/// the class the provider serves ([`ccm_cloud::LoadBalancer::load_balancer_class`]). With
/// `class = None` (upstream `wantsLoadBalancer`) that means no class at all: any class, even
/// one naming this provider, hands the Service to another controller. With `Some(c)` only
/// Services of class `c`; class-less ones belong to another controller (MetalLB `--lb-class`).
pub fn wants_load_balancer(svc: &Service, class: Option<&str>) -> bool {
    spec_type(svc) == "LoadBalancer"
        && svc
            .spec
            .as_ref()
            .and_then(|s| s.load_balancer_class.as_deref())
            == class
}

/// True when the Service carries [`LOAD_BALANCER_CLEANUP_FINALIZER`].
pub fn has_finalizer(svc: &Service) -> bool {
    svc.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == LOAD_BALANCER_CLEANUP_FINALIZER))
}

/// True when the Service has our finalizer and either is being deleted or is no longer
/// `type: LoadBalancer`: its LB must go, then the finalizer (upstream `needsCleanup`).
pub fn needs_cleanup(svc: &Service) -> bool {
    has_finalizer(svc)
        && (svc.metadata.deletion_timestamp.is_some() || spec_type(svc) != "LoadBalancer")
}

/// Whether a Service change can change its load balancer (upstream `needsUpdate`): the list
/// in the reference §5.2. Status, finalizer and label changes do not count.
pub fn needs_update(old: &Service, new: &Service, class: Option<&str>) -> bool {
    let (ow, nw) = (
        wants_load_balancer(old, class),
        wants_load_balancer(new, class),
    );
    if !ow && !nw {
        return false;
    }
    if ow != nw {
        return true;
    }
    let default = Default::default();
    let os = old.spec.as_ref().unwrap_or(&default);
    let ns = new.spec.as_ref().unwrap_or(&default);
    let empty_vec: Vec<String> = Vec::new();
    if os
        .load_balancer_source_ranges
        .as_ref()
        .unwrap_or(&empty_vec)
        != ns
            .load_balancer_source_ranges
            .as_ref()
            .unwrap_or(&empty_vec)
    {
        return true;
    }
    if ports_changed(os, ns) {
        return true;
    }
    if os.session_affinity != ns.session_affinity
        || os.session_affinity_config != ns.session_affinity_config
    {
        return true;
    }
    if os.load_balancer_ip != ns.load_balancer_ip {
        return true;
    }
    if os.external_ips.as_ref().unwrap_or(&empty_vec)
        != ns.external_ips.as_ref().unwrap_or(&empty_vec)
    {
        return true;
    }
    let no_annotations = BTreeMap::new();
    if old.metadata.annotations.as_ref().unwrap_or(&no_annotations)
        != new.metadata.annotations.as_ref().unwrap_or(&no_annotations)
    {
        return true;
    }
    if old.metadata.uid != new.metadata.uid {
        return true;
    }
    if os.external_traffic_policy != ns.external_traffic_policy {
        return true;
    }
    if os.health_check_node_port != ns.health_check_node_port {
        return true;
    }
    let families =
        |s: &k8s_openapi::api::core::v1::ServiceSpec| s.ip_families.as_ref().map_or(0, Vec::len);
    families(os) != families(ns)
}

fn ports_changed(
    os: &k8s_openapi::api::core::v1::ServiceSpec,
    ns: &k8s_openapi::api::core::v1::ServiceSpec,
) -> bool {
    let empty = Vec::new();
    let op = os.ports.as_ref().unwrap_or(&empty);
    let np = ns.ports.as_ref().unwrap_or(&empty);
    op.len() != np.len()
        || op.iter().zip(np).any(|(a, b)| {
            a.name != b.name
                || a.protocol != b.protocol
                || a.port != b.port
                || a.node_port != b.node_port
                || a.target_port != b.target_port
                || a.app_protocol != b.app_protocol
        })
}

/// Whether a Service change (from the informer) should queue the Service: an add that wants
/// an LB or needs cleanup, an update that [`needs_update`] or needs cleanup, and every delete
/// (the worker then deletes the LB of a Service that vanished without our finalizer, if it
/// remembers one — upstream has no delete handler and relies on the key being queued).
pub fn should_enqueue_service(
    old: Option<&Service>,
    new: Option<&Service>,
    class: Option<&str>,
) -> bool {
    match (old, new) {
        (None, Some(n)) => wants_load_balancer(n, class) || needs_cleanup(n),
        (Some(o), Some(n)) => needs_update(o, n, class) || needs_cleanup(n),
        (Some(_), None) => true,
        (None, None) => false,
    }
}

/// What one sync of an existing Service does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPlan {
    /// Delete the LB if it exists, clear the status, remove the finalizer.
    Delete,
    /// Add the finalizer, then `EnsureLoadBalancer` and write the status.
    Ensure,
}

/// The sync decision for a Service that still exists (upstream `syncLoadBalancerIfNeeded`):
/// the delete path when it no longer wants an LB or is being cleaned up, else the ensure path.
pub fn plan_sync(svc: &Service, class: Option<&str>) -> SyncPlan {
    if !wants_load_balancer(svc, class) || needs_cleanup(svc) {
        SyncPlan::Delete
    } else {
        SyncPlan::Ensure
    }
}

/// Whether the LB of a cached Service must be deleted before handling the current one: the
/// Service was deleted and re-created under the same name (different UID) while our cache held
/// the old one, and the old one wanted an LB.
pub fn must_delete_stale_lb(cached: &Service, current: &Service, class: Option<&str>) -> bool {
    cached.metadata.uid != current.metadata.uid && wants_load_balancer(cached, class)
}

/// The exclusion-label predicate (§5.4 item 2): a Node is excluded when it carries
/// `node.kubernetes.io/exclude-from-external-load-balancers` with a value that is not a Go
/// `ParseBool` `false` (so `""` and `"yes"` exclude, `"false"` / `"0"` / `"F"` include).
pub fn node_included(node: &Node) -> bool {
    match node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_EXCLUDE_FROM_LB))
    {
        None => true,
        Some(v) => parse_go_bool(v) == Some(false),
    }
}

/// Whether a Node backs load balancers (StableLoadBalancerNodeSet): not being deleted,
/// included (see [`node_included`]), not tainted `ToBeDeletedByClusterAutoscaler`, and
/// initialized (no `uninitialized` taint). Readiness deliberately does not count: LB health
/// checks handle it.
///
/// The last condition is not upstream's: upstream adds a joining Node to every load balancer
/// when it registers and again when its providerID arrives — two `UpdateLoadBalancer` calls per
/// LB for one join. A Node the cloud has not confirmed serves no traffic yet (the taint keeps
/// pods off it), so it joins the load balancers once, when it is initialized. A Node that never
/// had the taint (no CCM at registration, or a provider without instances) counts as before.
pub fn node_in_lb_set(node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_none()
        && node_included(node)
        && !has_taint(node, TAINT_TO_BE_DELETED_BY_CA)
        && !has_taint(node, TAINT_UNINITIALIZED)
}

/// Whether a Node update should trigger a node sync (upstream `shouldSyncUpdatedNode`): a
/// change of the exclusion predicate, of `spec.providerID`, or of the `uninitialized` taint
/// (the Node becoming eligible, see [`node_in_lb_set`]). Other taints, readiness and addresses
/// do not.
pub fn should_sync_updated_node(old: &Node, new: &Node) -> bool {
    node_included(old) != node_included(new)
        || ccm_cloud::node_provider_id(old) != ccm_cloud::node_provider_id(new)
        || has_taint(old, TAINT_UNINITIALIZED) != has_taint(new, TAINT_UNINITIALIZED)
}

/// A load balancer's backend set as the controller compares it: the set of (node name,
/// providerID) pairs, kept as its size and a keyed 128-bit digest rather than the pairs. Each
/// Service keeps the set it was last synced with, and during a burst those are many different
/// sets; as maps of names and providerIDs they cost ~150 bytes per Node each (megabytes per
/// Service at 50,000 Nodes). The digest is SipHash with a key drawn once per process, summed
/// over the pairs (so the order does not matter): sets that differ compare equal with
/// probability about 2^-128, and no one who does not know the key can make them.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct NodeSet {
    len: usize,
    digest: (u64, u64),
}

impl NodeSet {
    /// How many Nodes back the load balancer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no Node backs it.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds a Node not yet in the set (the caller keeps the pairs unique): sums make the set
    /// updatable per Node change, with no pass over the others.
    pub fn insert(&mut self, n: &Node) {
        let (h1, h2) = pair_hashes(n);
        self.len += 1;
        self.digest.0 = self.digest.0.wrapping_add(h1);
        self.digest.1 = self.digest.1.wrapping_add(h2);
    }

    /// Takes out a Node added before, as it was then.
    pub fn remove(&mut self, n: &Node) {
        let (h1, h2) = pair_hashes(n);
        self.len = self.len.saturating_sub(1);
        self.digest.0 = self.digest.0.wrapping_sub(h1);
        self.digest.1 = self.digest.1.wrapping_sub(h2);
    }
}

/// The two keyed hashes of a Node's (name, providerID) pair.
fn pair_hashes(n: &Node) -> (u64, u64) {
    use std::hash::BuildHasher;
    let (k1, k2) = node_set_keys();
    let pair = (ccm_cloud::node_name(n), ccm_cloud::node_provider_id(n));
    (k1.hash_one(pair), k2.hash_one(pair))
}

/// The two SipHash keys of this process's [`NodeSet`] digests.
fn node_set_keys() -> &'static (std::hash::RandomState, std::hash::RandomState) {
    static KEYS: std::sync::OnceLock<(std::hash::RandomState, std::hash::RandomState)> =
        std::sync::OnceLock::new();
    KEYS.get_or_init(|| (std::hash::RandomState::new(), std::hash::RandomState::new()))
}

/// The LB node set of `nodes` (those passing [`node_in_lb_set`]). Node names are unique in a
/// cluster, so the pairs are a set.
pub fn lb_node_set<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> NodeSet {
    let mut set = NodeSet::default();
    for n in nodes.into_iter().filter(|n| node_in_lb_set(n)) {
        set.insert(n);
    }
    set
}

/// Whether an LB must be updated from `old` to `new` hosts: upstream's "sufficiently equal"
/// test negated (same count and same name → providerID pairs means unchanged).
pub fn node_set_changed(old: &NodeSet, new: &NodeSet) -> bool {
    old != new
}

/// Ingress equality as upstream `LoadBalancerStatusEqual`: only `ingress`, missing == empty.
pub fn ingress_equal(a: Option<&LoadBalancerStatus>, b: Option<&LoadBalancerStatus>) -> bool {
    fn ing(s: Option<&LoadBalancerStatus>) -> &[LoadBalancerIngress] {
        s.and_then(|s| s.ingress.as_deref()).unwrap_or(&[])
    }
    ing(a) == ing(b)
}

/// The Service's current `status.loadBalancer`.
pub fn current_status(svc: &Service) -> Option<&LoadBalancerStatus> {
    svc.status.as_ref().and_then(|s| s.load_balancer.as_ref())
}

/// How a failed key is re-queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeue {
    /// After exactly this delay, without touching the key's backoff (upstream `RetryError`).
    After(Duration),
    /// After the key's exponential backoff (5s → 300s by default).
    RateLimited,
}

/// The retry policy for a failed sync whose cloud error (if it was one) is `cloud`.
pub fn requeue_for(cloud: Option<&CloudError>) -> Requeue {
    match cloud {
        Some(CloudError::Retry { after, .. }) => Requeue::After(*after),
        _ => Requeue::RateLimited,
    }
}

/// The node list of an `UpdateLoadBalancerFailed` event: at most
/// [`MAX_NODE_NAMES_IN_EVENT`] names, then `"<N more>"`, as upstream.
pub fn update_failed_message(node_names: &[String], error: &str) -> String {
    let mut shown: Vec<String> = node_names
        .iter()
        .take(MAX_NODE_NAMES_IN_EVENT)
        .cloned()
        .collect();
    if node_names.len() > MAX_NODE_NAMES_IN_EVENT {
        shown.push(format!(
            "<{} more>",
            node_names.len() - MAX_NODE_NAMES_IN_EVENT
        ));
    }
    format!(
        "Error updating load balancer with new hosts [{}] [node names limited, total number of nodes: {}], error: {error}",
        shown.join(" "),
        node_names.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, ServicePort, ServiceSpec, Taint};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use proptest::prelude::*;

    fn svc(type_: &str) -> Service {
        Service {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("s".into()),
                namespace: Some("default".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some(type_.into()),
                ports: Some(vec![ServicePort {
                    port: 80,
                    protocol: Some("TCP".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn node(name: &str) -> Node {
        Node {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                provider_id: Some(format!("sim://{name}")),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn with_label(mut n: Node, v: &str) -> Node {
        n.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(LABEL_EXCLUDE_FROM_LB.into(), v.into());
        n
    }

    fn now() -> Time {
        Time(jiff::Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn class_opts_out() {
        let mut s = svc("LoadBalancer");
        assert!(wants_load_balancer(&s, None));
        s.spec.as_mut().unwrap().load_balancer_class = Some("sim".into());
        assert!(!wants_load_balancer(&s, None));
        assert_eq!(plan_sync(&s, None), SyncPlan::Delete);
        assert!(!should_enqueue_service(None, Some(&s), None));
    }

    #[test]
    fn a_provider_serving_a_class_takes_exactly_that_class() {
        let class = Some("metal.ccm-rs.io/lb");
        let plain = svc("LoadBalancer");
        let mut ours = svc("LoadBalancer");
        ours.spec.as_mut().unwrap().load_balancer_class = class.map(str::to_string);
        let mut other = svc("LoadBalancer");
        other.spec.as_mut().unwrap().load_balancer_class = Some("other.io/lb".into());

        assert!(wants_load_balancer(&ours, class));
        assert_eq!(plan_sync(&ours, class), SyncPlan::Ensure);
        assert!(should_enqueue_service(None, Some(&ours), class));
        // Class-less Services belong to the cluster's default implementation (MetalLB
        // --lb-class), other classes to theirs.
        for s in [&plain, &other] {
            assert!(!wants_load_balancer(s, class));
            assert_eq!(plan_sync(s, class), SyncPlan::Delete);
            assert!(!should_enqueue_service(None, Some(s), class));
        }
        // Our Service turned ClusterIP still needs its cleanup; a namesake of another class
        // re-created under the cached one's name: the cached one's LB is deleted first.
        let mut done = ours.clone();
        done.metadata.finalizers = Some(vec![LOAD_BALANCER_CLEANUP_FINALIZER.into()]);
        done.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
        assert!(should_enqueue_service(Some(&ours), Some(&done), class));
        let mut namesake = plain.clone();
        namesake.metadata.uid = Some("u2".into());
        assert!(must_delete_stale_lb(&ours, &namesake, class));
        assert!(!must_delete_stale_lb(&plain, &namesake, class));
    }

    #[test]
    fn cleanup_needs_finalizer() {
        let mut s = svc("ClusterIP");
        assert!(!needs_cleanup(&s));
        s.metadata.finalizers = Some(vec![LOAD_BALANCER_CLEANUP_FINALIZER.into()]);
        assert!(needs_cleanup(&s));
        let mut l = svc("LoadBalancer");
        l.metadata.finalizers = Some(vec![LOAD_BALANCER_CLEANUP_FINALIZER.into()]);
        assert!(!needs_cleanup(&l));
        assert_eq!(plan_sync(&l, None), SyncPlan::Ensure);
        l.metadata.deletion_timestamp = Some(now());
        assert!(needs_cleanup(&l));
        assert_eq!(plan_sync(&l, None), SyncPlan::Delete);
    }

    #[test]
    fn exclusion_label_parse_bool() {
        assert!(node_included(&node("a")));
        for v in ["false", "0", "f", "F", "FALSE", "False"] {
            assert!(node_included(&with_label(node("a"), v)), "{v}");
        }
        for v in ["true", "1", "", "yes", "no", "fals"] {
            assert!(!node_included(&with_label(node("a"), v)), "{v}");
        }
    }

    #[test]
    fn lb_set_excludes_deleting_and_ca_tainted_but_not_unready() {
        let mut deleting = node("d");
        deleting.metadata.deletion_timestamp = Some(now());
        let mut tainted = node("t");
        tainted.spec.as_mut().unwrap().taints = Some(vec![Taint {
            key: TAINT_TO_BE_DELETED_BY_CA.into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]);
        let unready = node("u"); // no Ready condition at all
        let set = lb_node_set([
            &deleting,
            &tainted,
            &unready,
            &with_label(node("x"), "true"),
        ]);
        assert_eq!(set, lb_node_set([&unready]));
        assert_eq!(set.len(), 1);
    }

    #[test]
    fn update_message_limits_names() {
        let names: Vec<String> = (0..25).map(|i| format!("n{i}")).collect();
        let m = update_failed_message(&names, "boom");
        assert!(m.contains("n19 <5 more>]"), "{m}");
        assert!(m.contains("total number of nodes: 25"));
        assert!(m.ends_with("error: boom"));
    }

    #[test]
    fn retry_is_fixed_delay() {
        let e = CloudError::retry_after(Duration::from_secs(7), "provisioning");
        assert_eq!(
            requeue_for(Some(&e)),
            Requeue::After(Duration::from_secs(7))
        );
        assert_eq!(
            requeue_for(Some(&CloudError::Transient("x".into()))),
            Requeue::RateLimited
        );
        assert_eq!(requeue_for(None), Requeue::RateLimited);
    }

    // ---- property tests ------------------------------------------------------------------

    fn arb_service() -> impl Strategy<Value = Service> {
        (
            prop_oneof![Just("LoadBalancer"), Just("ClusterIP"), Just("NodePort")],
            prop::option::of(prop_oneof![Just("sim"), Just("other")]),
            any::<bool>(),
            any::<bool>(),
            prop::collection::vec((1i32..4, prop::option::of(30000i32..30003)), 0..3),
            prop::option::of(prop_oneof![Just("Local"), Just("Cluster")]),
            prop::option::of(0u8..3),
            prop::option::of(prop_oneof![Just("u1"), Just("u2")]),
            prop::option::of(prop::collection::vec(Just("IPv4".to_string()), 1..3)),
        )
            .prop_map(
                |(ty, class, fin, deleting, ports, etp, ann, uid, families)| {
                    let mut s = svc(ty);
                    let spec = s.spec.as_mut().unwrap();
                    spec.load_balancer_class = class.map(str::to_string);
                    spec.ports = Some(
                        ports
                            .into_iter()
                            .map(|(p, np)| ServicePort {
                                port: p,
                                node_port: np,
                                ..Default::default()
                            })
                            .collect(),
                    );
                    spec.external_traffic_policy = etp.map(str::to_string);
                    spec.ip_families = families;
                    if fin {
                        s.metadata.finalizers = Some(vec![LOAD_BALANCER_CLEANUP_FINALIZER.into()]);
                    }
                    if deleting {
                        s.metadata.deletion_timestamp = Some(now());
                    }
                    if let Some(a) = ann {
                        s.metadata.annotations =
                            Some([("a".to_string(), a.to_string())].into_iter().collect());
                    }
                    s.metadata.uid = uid.map(str::to_string);
                    s
                },
            )
    }

    /// The class a provider serves: none (upstream), or one the Services may carry.
    fn arb_class() -> impl Strategy<Value = Option<String>> {
        prop::option::of(prop_oneof![
            Just("sim".to_string()),
            Just("other".to_string())
        ])
    }

    fn arb_node() -> impl Strategy<Value = Node> {
        (
            0u8..6,
            prop::option::of(0u8..3),
            prop::option::of(prop_oneof![
                Just(""),
                Just("true"),
                Just("false"),
                Just("0"),
                Just("yes")
            ]),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|(name, pid, label, deleting, ca, uninit)| {
                let mut n = node(&format!("n{name}"));
                n.spec.as_mut().unwrap().provider_id = pid.map(|p| format!("sim://i-{p}"));
                if let Some(v) = label {
                    n = with_label(n, v);
                }
                if deleting {
                    n.metadata.deletion_timestamp = Some(now());
                }
                let keys = [
                    (ca, TAINT_TO_BE_DELETED_BY_CA),
                    (uninit, TAINT_UNINITIALIZED),
                ];
                let taints: Vec<Taint> = keys
                    .iter()
                    .filter(|(on, _)| *on)
                    .map(|(_, key)| Taint {
                        key: (*key).into(),
                        effect: "NoSchedule".into(),
                        ..Default::default()
                    })
                    .collect();
                if !taints.is_empty() {
                    n.spec.as_mut().unwrap().taints = Some(taints);
                }
                n
            })
    }

    proptest! {
        #[test]
        fn needs_update_is_reflexively_false_and_symmetric(a in arb_service(), b in arb_service(), class in arb_class()) {
            let class = class.as_deref();
            prop_assert!(!needs_update(&a, &a, class));
            prop_assert_eq!(needs_update(&a, &b, class), needs_update(&b, &a, class));
            if !wants_load_balancer(&a, class) && !wants_load_balancer(&b, class) {
                prop_assert!(!needs_update(&a, &b, class));
            }
            if wants_load_balancer(&a, class) != wants_load_balancer(&b, class) {
                prop_assert!(needs_update(&a, &b, class));
            }
        }

        #[test]
        fn status_and_finalizer_changes_never_need_update(a in arb_service(), fin in any::<bool>(), class in arb_class()) {
            let mut b = a.clone();
            b.metadata.finalizers = if fin { Some(vec![LOAD_BALANCER_CLEANUP_FINALIZER.into()]) } else { None };
            b.status = Some(Default::default());
            b.metadata.resource_version = Some("99".into());
            prop_assert!(!needs_update(&a, &b, class.as_deref()));
        }

        #[test]
        fn plan_is_ensure_only_for_wanted_live_services(s in arb_service(), class in arb_class()) {
            let class = class.as_deref();
            let plan = plan_sync(&s, class);
            if plan == SyncPlan::Ensure {
                prop_assert!(wants_load_balancer(&s, class));
                prop_assert_eq!(s.spec.as_ref().unwrap().load_balancer_class.as_deref(), class);
                prop_assert!(!(has_finalizer(&s) && s.metadata.deletion_timestamp.is_some()));
            }
            if needs_cleanup(&s) {
                prop_assert_eq!(plan, SyncPlan::Delete);
            }
            // A Service of a class not served is enqueued only when it carries our finalizer.
            if s.spec.as_ref().unwrap().load_balancer_class.as_deref() != class && !has_finalizer(&s) {
                prop_assert!(!should_enqueue_service(None, Some(&s), class));
            }
        }

        #[test]
        fn lb_set_members_satisfy_all_predicates(nodes in prop::collection::vec(arb_node(), 0..8)) {
            let set = lb_node_set(&nodes);
            let members: Vec<&Node> = nodes.iter().filter(|n| node_in_lb_set(n)).collect();
            prop_assert_eq!(set.len(), members.len());
            prop_assert_eq!(&set, &lb_node_set(members));
        }

        #[test]
        fn node_set_changed_is_inequality(a in prop::collection::vec(arb_node(), 0..6), b in prop::collection::vec(arb_node(), 0..6)) {
            let (sa, sb) = (lb_node_set(&a), lb_node_set(&b));
            prop_assert!(!node_set_changed(&sa, &sa));
            prop_assert_eq!(node_set_changed(&sa, &sb), node_set_changed(&sb, &sa));
            // The digest against the pairs themselves (names unique, as in a cluster).
            let pairs = |v: &[Node]| {
                let mut seen = std::collections::BTreeMap::new();
                for n in v.iter().filter(|n| node_in_lb_set(n)) {
                    seen.entry(ccm_cloud::node_name(n).to_string())
                        .or_insert_with(|| ccm_cloud::node_provider_id(n).to_string());
                }
                seen
            };
            let unique = |v: &[Node]| pairs(v).len() == v.iter().filter(|n| node_in_lb_set(n)).count();
            if unique(&a) && unique(&b) {
                prop_assert_eq!(node_set_changed(&sa, &sb), pairs(&a) != pairs(&b));
            }
        }

        #[test]
        fn node_update_trigger(a in arb_node(), b in arb_node()) {
            prop_assert!(!should_sync_updated_node(&a, &a));
            // Taint or deletion changes alone never trigger (upstream), except the
            // `uninitialized` taint coming or going: the Node's eligibility.
            let mut c = a.clone();
            c.spec.as_mut().unwrap().taints = b.spec.as_ref().unwrap().taints.clone();
            c.metadata.deletion_timestamp = b.metadata.deletion_timestamp.clone();
            let eligibility_changed =
                has_taint(&a, TAINT_UNINITIALIZED) != has_taint(&c, TAINT_UNINITIALIZED);
            prop_assert_eq!(should_sync_updated_node(&a, &c), eligibility_changed);
            if node_included(&a) != node_included(&b) {
                prop_assert!(should_sync_updated_node(&a, &b));
            }
        }

        #[test]
        fn an_uninitialized_node_backs_no_load_balancer(a in arb_node()) {
            if has_taint(&a, TAINT_UNINITIALIZED) {
                prop_assert!(!node_in_lb_set(&a));
                prop_assert!(lb_node_set([&a]).is_empty());
            }
        }
    }
}
