//! Load-balancer node lists sent once, then named by id.
//!
//! The service controller hands every load balancer the same node list while the set of Nodes
//! is unchanged, and each `EnsureLoadBalancer` / `UpdateLoadBalancer` carries all of it: a Node
//! joining a 50,000-Node cluster with 1,000 LBs serialized 1,000 lists of 50,000 names in the
//! CCM (3.5 GB of JSON, 30 s of its CPU) — the sim's transport, not CCM work, since a real
//! provider receives the list in process. So the client sends a list in full once with an id
//! for the server to keep ([`ListRef::Keep`]), and later calls with the very same list name it
//! ([`ListRef::Same`]). One call at a time carries a new list: the others that start meanwhile
//! (a node-sync pass starts dozens at once) wait for its answer, then name it. A server that
//! does not hold the id (restarted, or the list evicted) answers
//! [`super::wire::WireError::UnknownNodeList`] and the client sends it in full again.
//! Every call still reaches the sim cloud as before: call counts and the mutation log are
//! unchanged.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

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

/// The client's side: the last list sent, held by `Weak`s so that a list equal element by
/// element (pointer equality: the service controller hands out the node cache's own Nodes) is
/// known to be the same list. A `Weak` keeps its Node's allocation, so the address cannot be
/// reused by another Node, but not the Node: a Node version the cache replaced is freed, all
/// but the allocation, even while no new list has been sent.
pub(crate) struct SentLists {
    last: Mutex<Option<Sent>>,
    next_id: AtomicU64,
    /// Woken when a call that carried a list is answered.
    answered: tokio::sync::Notify,
}

struct Sent {
    id: u64,
    nodes: Vec<Weak<Node>>,
    /// The server answered a call that carried it: later calls may name it.
    kept: bool,
    /// A call carrying it is on its way.
    sending: bool,
}

/// How long a call waits for the answer to the call carrying its list before sending the
/// list itself (a slow cloud must not hold every other call back).
const FIRST_ANSWER_WAIT: Duration = Duration::from_secs(5);

impl SentLists {
    /// Ids start at a value of this process and moment, so two clients of one server (two
    /// CCMs during a failover) do not name each other's lists.
    pub(crate) fn new() -> Self {
        let seed = u64::from(std::process::id()) << 40 ^ rand::random::<u64>() >> 24;
        SentLists {
            last: Mutex::new(None),
            next_id: AtomicU64::new(seed),
            answered: tokio::sync::Notify::new(),
        }
    }

    /// How to send `nodes`: by name when the server keeps this very list, else in full — after
    /// waiting for a call already carrying it, if there is one. Every reference must be
    /// followed by [`SentLists::answered`].
    pub(crate) async fn reference(&self, nodes: &[Arc<Node>]) -> ListRef {
        let deadline = tokio::time::Instant::now() + FIRST_ANSWER_WAIT;
        loop {
            let answered = self.answered.notified();
            tokio::pin!(answered);
            answered.as_mut().enable();
            let carrier = match self.try_reference(nodes) {
                Ok(list) => return list,
                Err(carrier) => carrier,
            };
            if tokio::time::timeout_at(deadline, answered).await.is_err() {
                return ListRef::Keep(carrier);
            }
        }
    }

    /// The reference, or `Err(id)` while another call carries this list as `id`.
    fn try_reference(&self, nodes: &[Arc<Node>]) -> Result<ListRef, u64> {
        let mut last = self.last.lock();
        if let Some(s) = last.as_mut()
            && s.nodes.len() == nodes.len()
            && s.nodes
                .iter()
                .zip(nodes)
                .all(|(a, b)| a.as_ptr() == Arc::as_ptr(b))
        {
            if s.kept {
                return Ok(ListRef::Same(s.id));
            }
            if s.sending {
                return Err(s.id);
            }
            s.sending = true;
            return Ok(ListRef::Keep(s.id));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        *last = Some(Sent {
            id,
            nodes: nodes.iter().map(Arc::downgrade).collect(),
            kept: false,
            sending: true,
        });
        Ok(ListRef::Keep(id))
    }

    /// A call referring to list `id` got its answer: the server holds the list (`kept`), or
    /// does not (it answered that it lost it, or no answer came) and the next call sends it.
    pub(crate) fn answered(&self, id: u64, kept: bool) {
        if let Some(s) = self.last.lock().as_mut().filter(|s| s.id == id) {
            s.kept = kept;
            s.sending = false;
        }
        self.answered.notify_waiters();
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

    #[tokio::test]
    async fn a_list_is_named_only_once_the_server_kept_it_and_only_while_it_is_the_same() {
        let sent = SentLists::new();
        let list = vec![node("a"), node("b")];
        let first = sent.reference(&list).await;
        assert!(matches!(first, ListRef::Keep(_)));
        sent.answered(first.id(), true);
        assert_eq!(sent.reference(&list).await, ListRef::Same(first.id()));
        sent.answered(first.id(), true);
        // Equal names, other objects (a Node changed): a new list.
        let copies = vec![node("a"), node("b")];
        let second = sent.reference(&copies).await;
        assert!(matches!(second, ListRef::Keep(id) if id != first.id()));
        // The server lost it: sent in full again, under its id.
        sent.answered(second.id(), false);
        assert_eq!(sent.reference(&copies).await, ListRef::Keep(second.id()));
        sent.answered(second.id(), true);
        // A shorter list sharing a prefix is another list.
        let third = sent.reference(&copies[..1]).await;
        assert!(matches!(third, ListRef::Keep(id) if id != second.id()));
    }

    /// A node-sync pass starts many calls with one new list: one carries it, the others wait
    /// for its answer and name it — or, if no answer comes in time, carry it themselves.
    #[tokio::test(start_paused = true)]
    async fn one_call_carries_a_new_list_while_the_others_wait_for_its_answer() {
        let sent = Arc::new(SentLists::new());
        let list = Arc::new(vec![node("a"), node("b")]);
        let first = sent.reference(&list).await;
        let waiting = {
            let (sent, list) = (sent.clone(), list.clone());
            tokio::spawn(async move { sent.reference(&list).await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            !waiting.is_finished(),
            "a second call waits for the first one's answer"
        );
        sent.answered(first.id(), true);
        assert_eq!(waiting.await.expect("task"), ListRef::Same(first.id()));

        let other = Arc::new(vec![node("c")]);
        let carrier = sent.reference(&other).await;
        let start = tokio::time::Instant::now();
        assert_eq!(
            sent.reference(&other).await,
            carrier,
            "no answer: sent in full after all"
        );
        assert_eq!(start.elapsed(), FIRST_ANSWER_WAIT);
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
