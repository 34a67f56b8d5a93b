//! The Nodes that back load balancers, kept sorted by name as Node changes arrive, so handing
//! providers the current list costs a copy of pointers, not a pass over the cluster.
//!
//! Built per call from the node cache, the list cost a listing, a sort by name and a digest of
//! every Node: ~0.2 s of CPU at 50,000 Nodes, paid by every node-sync pass (a join makes three)
//! and every Service ensured after a Node changed. The index is updated per change in
//! O(log N), and so is its [`NodeSet`] (a sum of per-Node digests); the list handed out is
//! rebuilt from it only after a change.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use k8s_openapi::api::core::v1::Node;

use super::planner::{NodeSet, node_in_lb_set};

/// The eligible Nodes by name, and the last list handed out.
#[derive(Default)]
pub(super) struct LbNodes {
    nodes: BTreeMap<String, Arc<Node>>,
    /// The set of `nodes`, kept per change.
    set: NodeSet,
    /// Moves with every change to `nodes`.
    version: u64,
    /// Moves when the set or a member's providerID or addresses change.
    hosts_version: u64,
    last: Option<Handed>,
}

/// A list handed out and the versions it was built at.
struct Handed {
    version: u64,
    hosts_version: u64,
    /// Held while no Node changed since, so a burst of syncs shares one list; after a change
    /// only the provider calls still using it hold it, and the Node versions it names are freed
    /// when they end (kept, kubelets' status updates at rest would double the Nodes' memory).
    held: Option<Arc<Vec<Arc<Node>>>>,
    list: Weak<Vec<Arc<Node>>>,
    set: Arc<NodeSet>,
}

impl LbNodes {
    /// Applies one change of the node cache (`old: None` an add, `new: None` a delete).
    pub(super) fn apply(&mut self, old: Option<&Arc<Node>>, new: Option<&Arc<Node>>) {
        let Some(name) = new.or(old).and_then(|n| n.metadata.name.clone()) else {
            return;
        };
        let kept = new.filter(|n| node_in_lb_set(n));
        let before = match kept {
            Some(n) => self.nodes.insert(name, n.clone()),
            None => self.nodes.remove(&name),
        };
        let hosts_moved = match (&before, kept) {
            (None, None) => return,
            (Some(b), Some(a)) => !same_host(b, a),
            _ => true,
        };
        if let Some(b) = &before {
            self.set.remove(b);
        }
        if let Some(a) = kept {
            self.set.insert(a);
        }
        self.version += 1;
        if hosts_moved {
            self.hosts_version += 1;
        }
        if let Some(h) = self.last.as_mut() {
            h.held = None;
        }
    }

    /// The current list, sorted by name, and its set.
    pub(super) fn current(&mut self) -> (Arc<Vec<Arc<Node>>>, Arc<NodeSet>) {
        if let Some(h) = &self.last
            && h.version == self.version
            && let Some(list) = h.list.upgrade()
        {
            return (list, h.set.clone());
        }
        let list = Arc::new(self.nodes.values().cloned().collect::<Vec<_>>());
        let set = match &self.last {
            Some(h) if h.hosts_version == self.hosts_version => h.set.clone(),
            _ => Arc::new(self.set.clone()),
        };
        self.last = Some(Handed {
            version: self.version,
            hosts_version: self.hosts_version,
            held: Some(list.clone()),
            list: Arc::downgrade(&list),
            set: set.clone(),
        });
        (list, set)
    }
}

/// Whether two versions of a Node give a provider the same host: providerID and addresses.
fn same_host(a: &Node, b: &Node) -> bool {
    ccm_cloud::node_provider_id(a) == ccm_cloud::node_provider_id(b) && addresses(a) == addresses(b)
}

fn addresses(n: &Node) -> Option<&Vec<k8s_openapi::api::core::v1::NodeAddress>> {
    n.status.as_ref().and_then(|s| s.addresses.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, provider_id: &str, ip: &str, tainted: bool) -> Arc<Node> {
        let taints = if tainted {
            serde_json::json!([{"key": "node.cloudprovider.kubernetes.io/uninitialized",
                                "value": "true", "effect": "NoSchedule"}])
        } else {
            serde_json::json!([])
        };
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "spec": {"providerID": provider_id, "taints": taints},
                "status": {"addresses": [{"type": "InternalIP", "address": ip}]},
            }))
            .expect("node"),
        )
    }

    fn names(list: &[Arc<Node>]) -> Vec<&str> {
        list.iter().map(|n| ccm_cloud::node_name(n)).collect()
    }

    #[test]
    fn the_list_follows_changes_sorted_and_shares_what_did_not_change() {
        let mut lb = LbNodes::default();
        for n in ["c", "a", "b"] {
            lb.apply(
                None,
                Some(&node(n, &format!("sim://{n}"), "10.0.0.1", false)),
            );
        }
        let (first, set) = lb.current();
        assert_eq!(names(&first), ["a", "b", "c"]);
        let (again, same_set) = lb.current();
        assert!(Arc::ptr_eq(&first, &again) && Arc::ptr_eq(&set, &same_set));

        // A joining Node still tainted is not a host; once initialized it is.
        let d = node("d", "", "10.0.0.4", true);
        lb.apply(None, Some(&d));
        let (list, s) = lb.current();
        assert_eq!(names(&list), ["a", "b", "c"]);
        assert!(Arc::ptr_eq(&s, &set), "the set did not move");
        let d2 = node("d", "sim://d", "10.0.0.4", false);
        lb.apply(Some(&d), Some(&d2));
        let (list, s) = lb.current();
        assert_eq!(names(&list), ["a", "b", "c", "d"]);
        assert_ne!(*s, *set);

        // A change that gives the same host (a label, a condition): the same set, a new list
        // naming the new version.
        let d3 = node("d", "sim://d", "10.0.0.4", false);
        lb.apply(Some(&d2), Some(&d3));
        let (after, s3) = lb.current();
        assert!(Arc::ptr_eq(&s, &s3));
        assert!(Arc::ptr_eq(&after[3], &d3));

        // A delete leaves the set.
        lb.apply(Some(&d3), None);
        assert_eq!(names(&lb.current().0), ["a", "b", "c"]);
    }

    #[test]
    fn the_set_kept_per_change_is_the_set_of_the_list() {
        use crate::service::planner::lb_node_set;
        let mut lb = LbNodes::default();
        let of_list = |lb: &mut LbNodes| {
            let (list, set) = lb.current();
            assert_eq!(*set, lb_node_set(list.iter().map(|n| &**n)));
            (*set).clone()
        };
        let a = node("a", "sim://a", "10.0.0.1", false);
        let b = node("b", "", "10.0.0.2", true);
        lb.apply(None, Some(&a));
        lb.apply(None, Some(&b));
        let one = of_list(&mut lb);
        let b2 = node("b", "sim://b", "10.0.0.2", false);
        lb.apply(Some(&b), Some(&b2));
        of_list(&mut lb);
        let a2 = node("a", "sim://a-moved", "10.0.0.9", false);
        lb.apply(Some(&a), Some(&a2));
        of_list(&mut lb);
        lb.apply(Some(&b2), None);
        lb.apply(Some(&a2), Some(&a));
        assert_eq!(of_list(&mut lb), one, "back where it started");
        lb.apply(Some(&a), None);
        assert!(of_list(&mut lb).is_empty());
    }

    #[test]
    fn a_list_handed_out_is_let_go_once_a_node_changes() {
        let mut lb = LbNodes::default();
        let a = node("a", "sim://a", "10.0.0.1", false);
        lb.apply(None, Some(&a));
        let old = Arc::downgrade(&a);
        drop(lb.current());
        let a2 = node("a", "sim://a", "10.0.0.1", false);
        lb.apply(Some(&a), Some(&a2));
        drop(a);
        assert!(old.upgrade().is_none(), "the replaced version is freed");
    }
}
