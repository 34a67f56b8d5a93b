//! Load-balancer node lists sent once, then named by id.
//!
//! The service controller hands every load balancer the same node list while the set of Nodes
//! is unchanged, and each `EnsureLoadBalancer` / `UpdateLoadBalancer` carries all of it: a Node
//! joining a 50,000-Node cluster with 1,000 LBs serialized 1,000 lists of 50,000 names in the
//! CCM (3.5 GB of JSON, 30 s of its CPU) — the sim's transport, not CCM work, since a real
//! provider receives the list in process. So the client sends a list in full once with an id
//! for the server to keep ([`ListRef::Keep`]), and later calls with the very same list name it
//! ([`ListRef::Same`]). A server that does not hold the id (restarted, or the list evicted)
//! answers [`super::wire::WireError::UnknownNodeList`] and the client sends it in full again.
//! Every call still reaches the sim cloud as before: call counts and the mutation log are
//! unchanged.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ccm_cloud::Node;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// How a load-balancer call names its node list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ListRef {
    /// The nodes are in the call; keep them under this id.
    Keep(u64),
    /// The call carries no nodes: use the list kept under this id.
    Same(u64),
}

impl ListRef {
    pub(crate) fn id(self) -> u64 {
        match self {
            ListRef::Keep(id) | ListRef::Same(id) => id,
        }
    }
}

/// The client's side: the last list sent, held by its `Arc`s so that a list equal element by
/// element (pointer equality, the service controller's shared copies) is known to be the same
/// list — a held `Arc`'s address cannot be reused by another Node.
pub(crate) struct SentLists {
    last: Mutex<Option<Sent>>,
    next_id: AtomicU64,
}

struct Sent {
    id: u64,
    nodes: Vec<Arc<Node>>,
    /// The server answered a call that carried it: later calls may name it.
    kept: bool,
}

impl SentLists {
    /// Ids start at a value of this process and moment, so two clients of one server (two
    /// CCMs during a failover) do not name each other's lists.
    pub(crate) fn new() -> Self {
        let seed = u64::from(std::process::id()) << 40 ^ rand::random::<u64>() >> 24;
        SentLists {
            last: Mutex::new(None),
            next_id: AtomicU64::new(seed),
        }
    }

    /// How to send `nodes`: by name when the server keeps this very list, else in full.
    pub(crate) fn reference(&self, nodes: &[Arc<Node>]) -> ListRef {
        let mut last = self.last.lock();
        if let Some(s) = last.as_ref()
            && s.nodes.len() == nodes.len()
            && s.nodes.iter().zip(nodes).all(|(a, b)| Arc::ptr_eq(a, b))
        {
            return if s.kept {
                ListRef::Same(s.id)
            } else {
                ListRef::Keep(s.id)
            };
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        *last = Some(Sent {
            id,
            nodes: nodes.to_vec(),
            kept: false,
        });
        ListRef::Keep(id)
    }

    /// The server answered a call that carried list `id`.
    pub(crate) fn kept(&self, id: u64) {
        if let Some(s) = self.last.lock().as_mut().filter(|s| s.id == id) {
            s.kept = true;
        }
    }

    /// The server does not hold list `id`: the next call sends it in full.
    pub(crate) fn lost(&self, id: u64) {
        let mut last = self.last.lock();
        if let Some(s) = last.as_mut().filter(|s| s.id == id) {
            s.kept = false;
        }
    }
}

/// Lists the server keeps: the most recent few, enough for the clients of one cloud.
pub(crate) const KEPT_LISTS: usize = 16;

/// The server's side: the host names of the last [`KEPT_LISTS`] lists, by id.
#[derive(Default)]
pub(crate) struct KeptLists(Mutex<VecDeque<(u64, Arc<Vec<String>>)>>);

impl KeptLists {
    pub(crate) fn keep(&self, id: u64, hosts: Arc<Vec<String>>) {
        let mut lists = self.0.lock();
        lists.retain(|(i, _)| *i != id);
        if lists.len() == KEPT_LISTS {
            lists.pop_front();
        }
        lists.push_back((id, hosts));
    }

    pub(crate) fn get(&self, id: u64) -> Option<Arc<Vec<String>>> {
        let lists = self.0.lock();
        lists.iter().find(|(i, _)| *i == id).map(|(_, h)| h.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str) -> Arc<Node> {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        Arc::new(n)
    }

    #[test]
    fn a_list_is_named_only_once_the_server_kept_it_and_only_while_it_is_the_same() {
        let sent = SentLists::new();
        let list = vec![node("a"), node("b")];
        let first = sent.reference(&list);
        assert!(matches!(first, ListRef::Keep(_)));
        // Not answered yet: a concurrent call sends it in full too, under the same id.
        assert_eq!(sent.reference(&list), first);
        sent.kept(first.id());
        assert_eq!(sent.reference(&list), ListRef::Same(first.id()));
        // Equal names, other objects (a Node changed and was copied): a new list.
        let copies = vec![node("a"), node("b")];
        let second = sent.reference(&copies);
        assert!(matches!(second, ListRef::Keep(id) if id != first.id()));
        sent.kept(second.id());
        // The server lost it: sent in full again.
        sent.lost(second.id());
        assert_eq!(sent.reference(&copies), ListRef::Keep(second.id()));
        // A shorter list sharing a prefix is another list.
        assert!(matches!(sent.reference(&copies[..1]), ListRef::Keep(id) if id != second.id()));
    }

    #[test]
    fn the_server_keeps_the_newest_lists() {
        let kept = KeptLists::default();
        for id in 0..(KEPT_LISTS as u64 + 1) {
            kept.keep(id, Arc::new(vec![id.to_string()]));
        }
        assert!(kept.get(0).is_none(), "the oldest is evicted");
        assert_eq!(kept.get(1).as_deref(), Some(&vec!["1".to_string()]));
        assert!(kept.get(KEPT_LISTS as u64).is_some());
    }
}
