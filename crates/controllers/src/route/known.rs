//! The cloud's routes as the route controller knows them between listings, indexed by target
//! node so a node change plans over that node's routes only.
//!
//! A fast-path sync used to rebuild a view of every Node and plan over every route for each
//! change: while Nodes trickle in a few per sync, a burst of N Nodes cost O(N²). With this
//! index a sync costs what changed; the full plan runs only on the listings (startup, safety
//! resync, confirmation, retries).

use std::collections::{HashMap, HashSet};

use ccm_cloud::Route;
use ipnet::IpNet;

use super::planner;

/// The last `ListRoutes` plus the controller's own successful creates and deletes since.
#[derive(Debug, Default)]
pub(crate) struct KnownRoutes {
    by_node: HashMap<String, Vec<Route>>,
    /// Routes inside the cluster CIDRs (the `route_controller_managed_routes` gauge).
    managed: i64,
}

impl KnownRoutes {
    /// The index of one listing.
    pub(crate) fn from_listing(routes: Vec<Route>, cidrs: &[IpNet]) -> Self {
        let mut known = KnownRoutes::default();
        for r in routes {
            known.push(r, cidrs);
        }
        known
    }

    /// A route the cloud just created.
    pub(crate) fn push(&mut self, r: Route, cidrs: &[IpNet]) {
        if planner::is_responsible(&r, cidrs) {
            self.managed += 1;
        }
        // Room for one: a Node has one route per pod CIDR, mostly one (an empty Vec's first
        // push makes room for four).
        self.by_node
            .entry(r.target_node.clone())
            .or_insert_with(|| Vec::with_capacity(1))
            .push(known_route(r));
    }

    /// A route the cloud just deleted (matched by target node and destination, as listed).
    pub(crate) fn remove(&mut self, r: &Route, cidrs: &[IpNet]) {
        let Some(routes) = self.by_node.get_mut(&r.target_node) else {
            return;
        };
        let before = routes.len();
        routes.retain(|k| k.destination_cidr != r.destination_cidr);
        let removed = (before - routes.len()) as i64;
        if removed > 0 && planner::is_responsible(r, cidrs) {
            self.managed -= removed;
        }
        if routes.is_empty() {
            self.by_node.remove(&r.target_node);
        }
    }

    /// The known routes that point at one of `nodes`, in no particular order.
    pub(crate) fn for_nodes(&self, nodes: &HashSet<String>) -> Vec<Route> {
        nodes
            .iter()
            .filter_map(|n| self.by_node.get(n))
            .flatten()
            .cloned()
            .collect()
    }

    /// The target Nodes whose routes here differ from those in `other` (either way), names
    /// aside: a route this controller created is known by the name it asked for, listed by
    /// the cloud's.
    pub(crate) fn differing_nodes(&self, other: &KnownRoutes) -> Vec<String> {
        let differs = |node: &str, routes: &[Route], others: &KnownRoutes| {
            others
                .by_node
                .get(node)
                .is_none_or(|theirs| !same_routes(routes, theirs))
        };
        let mut out: Vec<String> = self
            .by_node
            .iter()
            .filter(|(node, routes)| differs(node, routes, other))
            .map(|(node, _)| node.clone())
            .collect();
        out.extend(
            other
                .by_node
                .keys()
                .filter(|node| !self.by_node.contains_key(*node))
                .cloned(),
        );
        out
    }

    /// How many known routes lie inside the cluster CIDRs.
    pub(crate) fn managed(&self) -> i64 {
        self.managed
    }
}

/// Whether two lists of one Node's routes hold the same routes in any order, names aside
/// (a Node has one or two).
fn same_routes(a: &[Route], b: &[Route]) -> bool {
    let same = |x: &Route, y: &Route| {
        x.destination_cidr == y.destination_cidr
            && x.blackhole == y.blackhole
            && x.enable_node_addresses == y.enable_node_addresses
            && x.target_node_addresses == y.target_node_addresses
    };
    a.len() == b.len() && a.iter().all(|x| b.iter().any(|y| same(x, y)))
}

/// A route as the known listing keeps it: what the planner reads. Addresses only matter for
/// routes that track them.
fn known_route(mut r: Route) -> Route {
    if !r.enable_node_addresses {
        r.target_node_addresses = Vec::new();
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(node: &str, cidr: &str) -> Route {
        Route {
            target_node: node.into(),
            destination_cidr: cidr.into(),
            ..Route::default()
        }
    }

    #[test]
    fn indexes_by_node_and_counts_only_cluster_routes() {
        let cidrs = ["10.0.0.0/16".parse().unwrap()];
        let mut known = KnownRoutes::from_listing(
            vec![
                route("a", "10.0.1.0/24"),
                route("b", "10.0.2.0/24"),
                route("b", "192.168.0.0/24"),
            ],
            &cidrs,
        );
        assert_eq!(known.managed(), 2);
        let only_b: HashSet<String> = ["b".to_string()].into();
        assert_eq!(known.for_nodes(&only_b).len(), 2);
        known.remove(&route("b", "10.0.2.0/24"), &cidrs);
        assert_eq!(known.managed(), 1);
        assert_eq!(known.for_nodes(&only_b), vec![route("b", "192.168.0.0/24")]);
        known.push(route("c", "10.0.3.0/24"), &cidrs);
        assert_eq!(known.managed(), 2);
        known.remove(&route("zz", "10.0.9.0/24"), &cidrs);
        assert_eq!(
            known.managed(),
            2,
            "removing an unknown route changes nothing"
        );
    }

    #[test]
    fn differing_nodes_are_those_whose_routes_changed_names_aside() {
        let cidrs = ["10.0.0.0/16".parse().unwrap()];
        let mut known = KnownRoutes::from_listing(
            vec![route("a", "10.0.1.0/24"), route("b", "10.0.2.0/24")],
            &cidrs,
        );
        // As created by the controller: the name it asked for, not the cloud's.
        known.push(route("c", "10.0.3.0/24"), &cidrs);
        let named = |node: &str, cidr: &str| Route {
            name: format!("cloud-{node}"),
            ..route(node, cidr)
        };
        let blackholed = Route {
            blackhole: true,
            ..named("b", "10.0.2.0/24")
        };
        let listed = KnownRoutes::from_listing(
            vec![
                named("a", "10.0.1.0/24"),
                blackholed,
                named("c", "10.0.3.0/24"),
                named("d", "10.0.4.0/24"),
            ],
            &cidrs,
        );
        let mut d = listed.differing_nodes(&known);
        d.sort();
        assert_eq!(d, ["b", "d"], "b blackholed, d made behind our back");
        let gone = KnownRoutes::from_listing(vec![named("a", "10.0.1.0/24")], &cidrs);
        let mut d = gone.differing_nodes(&known);
        d.sort();
        assert_eq!(d, ["b", "c"], "routes deleted behind our back");
        assert!(known.differing_nodes(&known).is_empty());
    }
}
