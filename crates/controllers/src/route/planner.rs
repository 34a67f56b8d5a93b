//! The route controller's decision, as a pure function: (nodes, cloud routes, cluster CIDRs) →
//! which routes to create, which to delete, and which `NetworkUnavailable` conditions to write.
//!
//! This is upstream's `reconcile()` (`controllers/route/route_controller.go`) with the I/O taken
//! out, rule for rule (see the reference §4.3):
//! - per node with `spec.podCIDRs`, per CIDR: `keep` when a route to the node has exactly this
//!   destination (string equality) and either does not track node addresses or tracks the same
//!   set; `update` (delete, then create) when it tracks different addresses; `add` otherwise;
//! - a listed route is deleted only if the controller is responsible for it (its first or last
//!   IP lies in a cluster CIDR) and it is a blackhole, or no `keep` entry exists for its
//!   (target node, CIDR);
//! - the condition of a node is `False`/`RouteCreated` when all its CIDRs ended `keep`,
//!   `True`/`NoRouteCreated` otherwise (or when routes point at it but it has no pod CIDRs),
//!   and is not written when status and reason already match.
//!
//! One deliberate divergence: a blackhole route the controller is about to delete does not count
//! as the node's route (upstream keeps the action `keep`, deletes the blackhole, reports
//! `RouteCreated` and creates the route only at the next sync — which in watch mode may be hours
//! away). Here the route is re-created in the same sync, after the delete.
//!
//! Because conditions depend on which creates succeeded, [`RoutePlan::conditions_after`]
//! recomputes them from the failed creates; [`RoutePlan::conditions`] is the all-succeeded case.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use ccm_cloud::{NodeAddressKey, Route};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;

/// The condition type the route controller owns.
pub const NETWORK_UNAVAILABLE: &str = "NetworkUnavailable";

/// What the planner needs to know about one Node (a small, comparable slice of it, so the
/// planner can be proptested without building whole Nodes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeView {
    /// `metadata.name`: routes point at nodes by name.
    pub name: String,
    /// `metadata.uid`: the name hint for the node's routes, as upstream.
    pub uid: String,
    /// `spec.podCIDRs` (the singular `spec.podCIDR` is ignored, as upstream).
    pub pod_cidrs: Vec<String>,
    /// `status.addresses`, compared with routes that track node addresses.
    pub addresses: Vec<NodeAddressKey>,
    /// The current `NetworkUnavailable` condition as `(status, reason)`, if any: a write is
    /// skipped when both already match.
    pub network_unavailable: Option<(String, String)>,
}

impl NodeView {
    /// The planner's view of a Node.
    pub fn from_node(node: &Node) -> Self {
        let status = node.status.as_ref();
        let network_unavailable = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == NETWORK_UNAVAILABLE))
            .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()));
        NodeView {
            name: node.metadata.name.clone().unwrap_or_default(),
            uid: node.metadata.uid.clone().unwrap_or_default(),
            pod_cidrs: crate::nodeutil::pod_cidrs(node).to_vec(),
            addresses: status
                .and_then(|s| s.addresses.as_ref())
                .map(|a| a.iter().map(NodeAddressKey::from).collect())
                .unwrap_or_default(),
            network_unavailable,
        }
    }
}

/// The `NetworkUnavailable` condition values the route controller writes (upstream strings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NetworkCondition {
    /// `False` / `RouteCreated`: every pod CIDR of the node has its route.
    RouteCreated,
    /// `True` / `NoRouteCreated`: some route is missing (or the node has no pod CIDRs while
    /// routes point at it).
    NoRouteCreated,
}

impl NetworkCondition {
    /// The condition's `status`.
    pub fn status(self) -> &'static str {
        match self {
            NetworkCondition::RouteCreated => "False",
            NetworkCondition::NoRouteCreated => "True",
        }
    }

    /// The condition's `reason`.
    pub fn reason(self) -> &'static str {
        match self {
            NetworkCondition::RouteCreated => "RouteCreated",
            NetworkCondition::NoRouteCreated => "NoRouteCreated",
        }
    }

    /// The condition's `message`, as upstream.
    pub fn message(self) -> &'static str {
        match self {
            NetworkCondition::RouteCreated => "RouteController created a route",
            NetworkCondition::NoRouteCreated => "RouteController failed to create a route",
        }
    }

    /// True when a node's current `(status, reason)` already says this (no write needed).
    pub fn matches(self, current: Option<&(String, String)>) -> bool {
        current.is_some_and(|(s, r)| s == self.status() && r == self.reason())
    }
}

/// One condition write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionUpdate {
    /// The node to patch.
    pub node: String,
    /// What to write.
    pub condition: NetworkCondition,
}

/// One route to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteCreate {
    /// The node's UID: providers name routes after it (both CIDRs of a dual-stack node share it).
    pub name_hint: String,
    /// The route: target node, its addresses, the pod CIDR.
    pub route: Route,
}

/// Everything one sync must do, in order: deletes (before creates when
/// [`RoutePlan::deletes_before_creates`]), creates, then condition writes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoutePlan {
    /// Routes to create (actions `add` and `update`), in node-name order.
    pub creates: Vec<RouteCreate>,
    /// Routes to delete, exactly as listed.
    pub deletes: Vec<Route>,
    /// Wait for every delete before creating: upstream does so when the first listed route
    /// tracks node addresses (an `update` deletes and re-creates the same CIDR); ccm-rs also
    /// does when a create reuses the CIDR of a route being deleted, which a cloud with one route
    /// per destination would otherwise refuse.
    pub deletes_before_creates: bool,
    /// Condition writes if every create succeeds.
    pub conditions: Vec<ConditionUpdate>,
    /// Per node with routes or pod CIDRs: what its condition depends on.
    nodes: Vec<NodeOutcome>,
}

/// Whether a node's routes are all in place, given which creates fail.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeOutcome {
    name: String,
    current: Option<(String, String)>,
    /// The node's pod CIDRs and whether each needs a create.
    cidrs: Vec<(String, bool)>,
}

impl RoutePlan {
    /// True when the sync has nothing to do: the steady state.
    pub fn is_empty(&self) -> bool {
        self.creates.is_empty() && self.deletes.is_empty() && self.conditions.is_empty()
    }

    /// The condition writes once the creates in `failed` (by `(node, CIDR)`) did not happen.
    pub fn conditions_after(&self, failed: &HashSet<(String, String)>) -> Vec<ConditionUpdate> {
        self.nodes
            .iter()
            .filter_map(|n| {
                let all_created = !n.cidrs.is_empty()
                    && n.cidrs.iter().all(|(cidr, create)| {
                        !create || !failed.contains(&(n.name.clone(), cidr.clone()))
                    });
                let condition = if all_created {
                    NetworkCondition::RouteCreated
                } else {
                    NetworkCondition::NoRouteCreated
                };
                (!condition.matches(n.current.as_ref())).then(|| ConditionUpdate {
                    node: n.name.clone(),
                    condition,
                })
            })
            .collect()
    }

    /// Nodes whose every pod CIDR has its route once the creates in `failed` did not happen:
    /// what the node controller and `ccm demo` ask ("is this node routable yet?").
    pub fn routed_nodes(&self, failed: &HashSet<(String, String)>) -> BTreeSet<String> {
        self.nodes
            .iter()
            .filter(|n| {
                !n.cidrs.is_empty()
                    && n.cidrs.iter().all(|(c, create)| {
                        !create || !failed.contains(&(n.name.clone(), c.clone()))
                    })
            })
            .map(|n| n.name.clone())
            .collect()
    }
}

impl RoutePlan {
    /// Nodes routed before any create of this plan runs: every pod CIDR already has its route.
    pub fn routed_without_creates(&self) -> BTreeSet<String> {
        self.nodes
            .iter()
            .filter(|n| !n.cidrs.is_empty() && n.cidrs.iter().all(|(_, create)| !create))
            .map(|n| n.name.clone())
            .collect()
    }

    /// Creates per node: a node is routed once that many of its creates have succeeded.
    pub fn creates_per_node(&self) -> HashMap<String, usize> {
        let mut out: HashMap<String, usize> = HashMap::new();
        for c in &self.creates {
            *out.entry(c.route.target_node.clone()).or_default() += 1;
        }
        out
    }
}

/// Upstream `isResponsibleForRoute`: the route's CIDR parses and its first or last IP lies in a
/// cluster CIDR. Routes elsewhere belong to someone else and are never deleted.
pub fn is_responsible(route: &Route, cluster_cidrs: &[IpNet]) -> bool {
    let Ok(net) = route.destination_cidr.trim().parse::<IpNet>() else {
        return false;
    };
    let (first, last) = (net.network(), net.broadcast());
    cluster_cidrs
        .iter()
        .any(|c| c.contains(&first) || c.contains(&last))
}

/// Upstream `equalNodeAddrs`: same length and every node address found among the route's
/// (an unordered comparison).
fn equal_addresses(node: &[NodeAddressKey], route: &[NodeAddressKey]) -> bool {
    node.len() == route.len() && node.iter().all(|a| route.contains(a))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Keep,
    Add,
    Update,
}

/// Plans one sync. Pure: the same inputs give the same plan. `nodes` in any order (the plan is
/// ordered by node name); `routes` in the provider's order (the first route decides
/// [`RoutePlan::deletes_before_creates`], as upstream).
pub fn plan(nodes: &[NodeView], routes: &[Route], cluster_cidrs: &[IpNet]) -> RoutePlan {
    let mut sorted: Vec<&NodeView> = nodes.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));

    // Routes by target node; blackholes we are about to delete do not count as a node's route.
    let mut by_node: HashMap<&str, Vec<&Route>> = HashMap::new();
    for r in routes.iter().filter(|r| !r.target_node.is_empty()) {
        by_node.entry(r.target_node.as_str()).or_default().push(r);
    }

    // (node, cidr) → action, for nodes with pod CIDRs.
    let mut actions: HashMap<(&str, &str), Action> = HashMap::new();
    let mut creates = Vec::new();
    let mut outcomes = Vec::new();
    let mut seen_nodes: HashSet<&str> = HashSet::new();
    for node in &sorted {
        // Two cached nodes cannot share a name; be safe with planner inputs that do.
        if !seen_nodes.insert(node.name.as_str()) {
            continue;
        }
        let node_routes = by_node
            .get(node.name.as_str())
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let mut cidrs: Vec<(String, bool)> = Vec::new();
        for cidr in &node.pod_cidrs {
            if cidrs.iter().any(|(c, _)| c == cidr) {
                continue;
            }
            let action = node_routes
                .iter()
                .filter(|r| !(r.blackhole && is_responsible(r, cluster_cidrs)))
                .find(|r| &r.destination_cidr == cidr)
                .map(|r| {
                    if !r.enable_node_addresses
                        || equal_addresses(&node.addresses, &r.target_node_addresses)
                    {
                        Action::Keep
                    } else {
                        Action::Update
                    }
                })
                .unwrap_or(Action::Add);
            actions.insert((node.name.as_str(), cidr.as_str()), action);
            let create = action != Action::Keep;
            if create {
                creates.push(RouteCreate {
                    name_hint: node.uid.clone(),
                    route: Route {
                        target_node: node.name.clone(),
                        target_node_addresses: node.addresses.clone(),
                        destination_cidr: cidr.clone(),
                        ..Route::default()
                    },
                });
            }
            cidrs.push((cidr.clone(), create));
        }
        // Upstream's routeMap has an entry for nodes with pod CIDRs or with routes to them.
        if !cidrs.is_empty() || !node_routes.is_empty() {
            outcomes.push(NodeOutcome {
                name: node.name.clone(),
                current: node.network_unavailable.clone(),
                cidrs,
            });
        }
    }

    let deletes: Vec<Route> = routes
        .iter()
        .filter(|r| is_responsible(r, cluster_cidrs))
        .filter(|r| {
            r.blackhole
                || actions.get(&(r.target_node.as_str(), r.destination_cidr.as_str()))
                    != Some(&Action::Keep)
        })
        .cloned()
        .collect();

    let deleted_cidrs: BTreeMap<&str, ()> = deletes
        .iter()
        .map(|r| (r.destination_cidr.as_str(), ()))
        .collect();
    let deletes_before_creates = !deletes.is_empty()
        && !creates.is_empty()
        && (routes.first().is_some_and(|r| r.enable_node_addresses)
            || creates
                .iter()
                .any(|c| deleted_cidrs.contains_key(c.route.destination_cidr.as_str())));

    let mut plan = RoutePlan {
        creates,
        deletes,
        deletes_before_creates,
        conditions: Vec::new(),
        nodes: outcomes,
    };
    plan.conditions = plan.conditions_after(&HashSet::new());
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cidrs(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|c| c.parse().expect("cidr")).collect()
    }

    fn node(name: &str, pod_cidrs: &[&str]) -> NodeView {
        NodeView {
            name: name.into(),
            uid: format!("uid-{name}"),
            pod_cidrs: pod_cidrs.iter().map(|s| s.to_string()).collect(),
            addresses: vec![addr("10.0.0.1")],
            network_unavailable: None,
        }
    }

    fn addr(ip: &str) -> NodeAddressKey {
        NodeAddressKey {
            type_: "InternalIP".into(),
            address: ip.into(),
        }
    }

    fn route(target: &str, cidr: &str) -> Route {
        Route {
            name: format!("r-{target}-{cidr}"),
            target_node: target.into(),
            destination_cidr: cidr.into(),
            ..Route::default()
        }
    }

    #[test]
    fn keep_add_and_stale_delete() {
        let cluster = cidrs(&["10.244.0.0/16"]);
        let nodes = [node("a", &["10.244.1.0/24"]), node("b", &["10.244.2.0/24"])];
        let routes = [route("a", "10.244.1.0/24"), route("b", "10.244.9.0/24")];
        let p = plan(&nodes, &routes, &cluster);
        assert_eq!(p.creates.len(), 1);
        assert_eq!(p.creates[0].route.target_node, "b");
        assert_eq!(p.creates[0].route.destination_cidr, "10.244.2.0/24");
        assert_eq!(p.creates[0].name_hint, "uid-b");
        assert_eq!(p.deletes, vec![route("b", "10.244.9.0/24")]);
        assert!(!p.deletes_before_creates);
        assert_eq!(
            p.conditions,
            vec![
                ConditionUpdate {
                    node: "a".into(),
                    condition: NetworkCondition::RouteCreated
                },
                ConditionUpdate {
                    node: "b".into(),
                    condition: NetworkCondition::RouteCreated
                },
            ]
        );
        let failed = HashSet::from([("b".to_string(), "10.244.2.0/24".to_string())]);
        assert_eq!(
            p.conditions_after(&failed)[1].condition,
            NetworkCondition::NoRouteCreated
        );
        assert_eq!(p.routed_nodes(&failed), BTreeSet::from(["a".to_string()]));
    }

    #[test]
    fn routed_before_and_during_execution() {
        let cluster = cidrs(&["10.244.0.0/16", "fd00:10::/56"]);
        let nodes = [
            node("a", &["10.244.1.0/24"]),
            node("b", &["10.244.2.0/24"]),
            node("dual", &["10.244.3.0/24", "fd00:10:0:3::/64"]),
            node("nocidr", &[]),
        ];
        let routes = [route("a", "10.244.1.0/24")];
        let p = plan(&nodes, &routes, &cluster);
        // Only a is routed before the sync's creates run.
        assert_eq!(
            p.routed_without_creates(),
            BTreeSet::from(["a".to_string()])
        );
        // b needs one create, the dual-stack node two (one per family) before it counts.
        assert_eq!(
            p.creates_per_node(),
            HashMap::from([("b".to_string(), 1), ("dual".to_string(), 2)])
        );
    }

    #[test]
    fn responsibility_is_first_or_last_ip() {
        let cluster = cidrs(&["10.244.0.0/16"]);
        let r = |c: &str| route("x", c);
        assert!(is_responsible(&r("10.244.3.0/24"), &cluster));
        // Host bits are ignored, like Go's ParseCIDR.
        assert!(is_responsible(&r("10.244.3.7/24"), &cluster));
        // Starts inside.
        assert!(is_responsible(&r("10.244.0.0/14"), &cluster));
        // Contains the cluster CIDR, but neither end is inside: not ours.
        assert!(!is_responsible(&r("10.240.0.0/13"), &cluster));
        assert!(!is_responsible(&r("10.0.0.0/24"), &cluster));
        assert!(!is_responsible(&r("not-a-cidr"), &cluster));
        let dual = cidrs(&["10.244.0.0/16", "fd00:10::/56"]);
        assert!(is_responsible(&r("fd00:10:0:1::/64"), &dual));
        assert!(!is_responsible(&r("fd00:11::/64"), &dual));
    }

    #[test]
    fn foreign_and_deleted_and_blackhole_routes() {
        let cluster = cidrs(&["10.244.0.0/16"]);
        let nodes = [node("a", &["10.244.1.0/24"])];
        let mut hole = route("a", "10.244.1.0/24");
        hole.blackhole = true;
        let routes = [
            route("gone", "10.244.7.0/24"),  // node deleted → delete
            route("", "10.244.8.0/24"),      // no target → delete
            route("gone", "192.168.0.0/24"), // outside → untouched
            hole.clone(),                    // blackhole → delete and re-create
        ];
        let p = plan(&nodes, &routes, &cluster);
        assert_eq!(
            p.deletes,
            vec![routes[0].clone(), routes[1].clone(), hole.clone()]
        );
        assert_eq!(p.creates.len(), 1);
        assert!(p.deletes_before_creates, "same CIDR deleted and created");
        // A node without pod CIDRs that routes point at gets True/NoRouteCreated.
        let nodes = [node("a", &[]), node("c", &[])];
        let p = plan(&nodes, &[route("a", "10.244.1.0/24")], &cluster);
        assert_eq!(
            p.conditions,
            vec![ConditionUpdate {
                node: "a".into(),
                condition: NetworkCondition::NoRouteCreated
            }]
        );
    }

    #[test]
    fn node_addresses_update_deletes_first() {
        let cluster = cidrs(&["10.244.0.0/16"]);
        let nodes = [node("a", &["10.244.1.0/24"]), node("b", &["10.244.2.0/24"])];
        let mut ra = route("a", "10.244.1.0/24");
        ra.enable_node_addresses = true;
        ra.target_node_addresses = vec![addr("10.0.0.9")];
        let mut rb = route("b", "10.244.2.0/24");
        rb.enable_node_addresses = true;
        rb.target_node_addresses = vec![addr("10.0.0.1")];
        let p = plan(&nodes, &[ra.clone(), rb], &cluster);
        assert_eq!(p.deletes, vec![ra]);
        assert_eq!(p.creates.len(), 1);
        assert_eq!(
            p.creates[0].route.target_node_addresses,
            vec![addr("10.0.0.1")]
        );
        assert!(p.deletes_before_creates);
    }

    #[test]
    fn unordered_address_comparison() {
        let a = [addr("1.1.1.1"), addr("2.2.2.2")];
        let b = [addr("2.2.2.2"), addr("1.1.1.1")];
        assert!(equal_addresses(&a, &b));
        assert!(!equal_addresses(&a, &b[..1]));
    }

    #[test]
    fn dual_stack_one_route_per_family_same_hint() {
        let cluster = cidrs(&["10.244.0.0/16", "fd00:10::/56"]);
        let nodes = [node("a", &["10.244.1.0/24", "fd00:10:0:1::/64"])];
        let p = plan(&nodes, &[], &cluster);
        assert_eq!(p.creates.len(), 2);
        assert!(p.creates.iter().all(|c| c.name_hint == "uid-a"));
    }

    #[test]
    fn condition_skipped_only_when_status_and_reason_match() {
        let cluster = cidrs(&["10.244.0.0/16"]);
        let mut n = node("a", &["10.244.1.0/24"]);
        let routes = [route("a", "10.244.1.0/24")];
        n.network_unavailable = Some(("False".into(), "RouteCreated".into()));
        assert!(plan(std::slice::from_ref(&n), &routes, &cluster).is_empty());
        // A CNI's reason is overwritten (upstream PR #136561).
        n.network_unavailable = Some(("False".into(), "CalicoIsUp".into()));
        assert_eq!(plan(&[n], &routes, &cluster).conditions.len(), 1);
    }

    // ---- properties ------------------------------------------------------------------------

    /// Pod CIDRs are /24s inside 10.244.0.0/16 or /64s inside fd00:10::/56; foreign routes live
    /// in 192.168.0.0/16 or 10.0.0.0/16.
    fn arb_cidr() -> impl Strategy<Value = String> {
        prop_oneof![
            (0u8..8).prop_map(|i| format!("10.244.{i}.0/24")),
            (0u8..4).prop_map(|i| format!("fd00:10:0:{i}::/64")),
        ]
    }

    fn arb_foreign_cidr() -> impl Strategy<Value = String> {
        prop_oneof![
            (0u8..4).prop_map(|i| format!("192.168.{i}.0/24")),
            (0u8..4).prop_map(|i| format!("10.0.{i}.0/24")),
            Just("10.240.0.0/13".to_string()),
            Just("garbage".to_string()),
        ]
    }

    fn arb_name() -> impl Strategy<Value = String> {
        prop_oneof![(0u8..6).prop_map(|i| format!("n{i}")), Just(String::new()),]
    }

    fn arb_addrs() -> impl Strategy<Value = Vec<NodeAddressKey>> {
        proptest::collection::vec((0u8..3).prop_map(|i| addr(&format!("10.0.0.{i}"))), 0..3)
    }

    fn arb_condition() -> impl Strategy<Value = Option<(String, String)>> {
        proptest::option::of(prop_oneof![
            Just(("False".to_string(), "RouteCreated".to_string())),
            Just(("True".to_string(), "NoRouteCreated".to_string())),
            Just(("False".to_string(), "CniSaysSo".to_string())),
        ])
    }

    fn arb_nodes() -> impl Strategy<Value = Vec<NodeView>> {
        proptest::collection::btree_map(
            0u8..6,
            (
                proptest::collection::vec(arb_cidr(), 0..3),
                arb_addrs(),
                arb_condition(),
            ),
            0..6,
        )
        .prop_map(|m| {
            m.into_iter()
                .map(
                    |(i, (pod_cidrs, addresses, network_unavailable))| NodeView {
                        name: format!("n{i}"),
                        uid: format!("uid-{i}"),
                        pod_cidrs,
                        addresses,
                        network_unavailable,
                    },
                )
                .collect()
        })
    }

    fn arb_routes() -> impl Strategy<Value = Vec<Route>> {
        proptest::collection::vec(
            (
                arb_name(),
                prop_oneof![arb_cidr(), arb_foreign_cidr()],
                any::<bool>(),
                any::<bool>(),
                arb_addrs(),
            )
                .prop_map(|(target, cidr, enable, blackhole, addrs)| Route {
                    name: format!("{target}/{cidr}"),
                    target_node: target,
                    enable_node_addresses: enable,
                    target_node_addresses: addrs,
                    destination_cidr: cidr,
                    blackhole,
                }),
            0..10,
        )
    }

    fn arb_cluster() -> impl Strategy<Value = Vec<IpNet>> {
        prop_oneof![
            Just(cidrs(&["10.244.0.0/16"])),
            Just(cidrs(&["10.244.0.0/16", "fd00:10::/56"])),
        ]
    }

    /// Applies a plan to a model cloud and cluster, as a perfect executor would.
    fn apply(
        p: &RoutePlan,
        nodes: &mut [NodeView],
        routes: &mut Vec<Route>,
        tracks_addresses: bool,
    ) {
        for d in &p.deletes {
            if let Some(i) = routes.iter().position(|r| r == d) {
                routes.remove(i);
            }
        }
        for c in &p.creates {
            routes.push(Route {
                name: format!("{}-{}", c.name_hint, c.route.destination_cidr),
                enable_node_addresses: tracks_addresses,
                ..c.route.clone()
            });
        }
        for u in &p.conditions {
            let n = nodes.iter_mut().find(|n| n.name == u.node).expect("node");
            n.network_unavailable =
                Some((u.condition.status().into(), u.condition.reason().into()));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn never_deletes_outside_the_cluster_cidrs(
            nodes in arb_nodes(), routes in arb_routes(), cluster in arb_cluster()
        ) {
            let p = plan(&nodes, &routes, &cluster);
            for d in &p.deletes {
                prop_assert!(is_responsible(d, &cluster), "deleted foreign route {d:?}");
                prop_assert!(routes.contains(d), "deleted a route that was not listed");
            }
        }

        #[test]
        fn creates_are_exactly_the_missing_pod_cidrs(
            nodes in arb_nodes(), routes in arb_routes(), cluster in arb_cluster()
        ) {
            let p = plan(&nodes, &routes, &cluster);
            for c in &p.creates {
                let n = nodes.iter().find(|n| n.name == c.route.target_node).expect("node");
                prop_assert!(n.pod_cidrs.contains(&c.route.destination_cidr));
                prop_assert_eq!(&c.name_hint, &n.uid);
                prop_assert_eq!(&c.route.target_node_addresses, &n.addresses);
            }
            let set: HashSet<_> = p.creates.iter()
                .map(|c| (&c.route.target_node, &c.route.destination_cidr)).collect();
            prop_assert_eq!(set.len(), p.creates.len(), "duplicate creates");
            // Every pod CIDR is either created or served by a surviving route.
            for n in &nodes {
                for cidr in &n.pod_cidrs {
                    let created = set.contains(&(&n.name, cidr));
                    let kept = routes.iter().any(|r| r.target_node == n.name
                        && &r.destination_cidr == cidr && !p.deletes.contains(r));
                    prop_assert!(created || kept, "{} {} neither created nor kept", n.name, cidr);
                }
            }
        }

        #[test]
        fn conditions_are_consistent(
            nodes in arb_nodes(), routes in arb_routes(), cluster in arb_cluster()
        ) {
            let p = plan(&nodes, &routes, &cluster);
            for u in &p.conditions {
                let n = nodes.iter().find(|n| n.name == u.node).expect("node");
                // Never rewrite what is already there.
                prop_assert_ne!(
                    n.network_unavailable.clone(),
                    Some((u.condition.status().to_string(), u.condition.reason().to_string()))
                );
                // All creates succeed → RouteCreated exactly for nodes with pod CIDRs.
                prop_assert_eq!(
                    u.condition == NetworkCondition::RouteCreated,
                    !n.pod_cidrs.is_empty()
                );
            }
            // Failing every create flips every node that needed one to NoRouteCreated.
            let failed: HashSet<_> = p.creates.iter()
                .map(|c| (c.route.target_node.clone(), c.route.destination_cidr.clone()))
                .collect();
            for u in p.conditions_after(&failed) {
                let needed = failed.iter().any(|(n, _)| n == &u.node);
                if needed {
                    prop_assert_eq!(u.condition, NetworkCondition::NoRouteCreated);
                }
            }
        }

        #[test]
        fn applying_the_plan_converges(
            mut nodes in arb_nodes(), mut routes in arb_routes(), cluster in arb_cluster(),
            tracks in any::<bool>()
        ) {
            // A pod CIDR outside every cluster CIDR is a misconfiguration upstream does not
            // converge on either (a stale route there can never be deleted): leave it out.
            for n in &mut nodes {
                n.pod_cidrs.retain(|c| is_responsible(&route("", c), &cluster));
            }
            let first = plan(&nodes, &routes, &cluster);
            apply(&first, &mut nodes, &mut routes, tracks);
            let second = plan(&nodes, &routes, &cluster);
            prop_assert!(second.is_empty(), "second plan not empty: {second:?}");
        }
    }
}
