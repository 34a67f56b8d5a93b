//! Pure decisions of the cloud-node-lifecycle controller.
//!
//! Two steps, so the cheap one never touches the cloud: [`plan_local`] looks at a cached Node
//! alone (Ready → maybe drop the shutdown taint; NotReady → ask the cloud), and
//! [`plan_with_status`] turns the cloud's answer into delete / taint / nothing.

use ccm_cloud::{InstanceEvent, InstanceStatus, node_provider_id};
use k8s_openapi::api::core::v1::{Node, Taint};

use crate::nodeutil::{TAINT_SHUTDOWN, is_ready, taints};

/// The effect of the shutdown taint, as upstream.
pub const SHUTDOWN_EFFECT: &str = "NoSchedule";

/// What to do with a Node before asking the cloud anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalAction {
    /// Ready, no shutdown taint: nothing (and no cloud call).
    Nothing,
    /// Ready with the shutdown taint: remove it (no cloud call).
    RemoveShutdownTaint,
    /// Not Ready (False, Unknown or missing): the cloud must say whether the instance exists.
    CheckCloud,
}

/// What to do with a NotReady Node given its instance status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloudAction {
    /// Exists and runs, or already tainted: nothing.
    Nothing,
    /// The instance is gone: delete the Node.
    Delete,
    /// The instance is shut down: add the shutdown taint.
    AddShutdownTaint,
}

fn is_shutdown_taint(t: &Taint) -> bool {
    t.key == TAINT_SHUTDOWN && t.effect == SHUTDOWN_EFFECT
}

/// Upstream `MonitorNodes` steps 1–2 for one Node.
pub fn plan_local(node: &Node) -> LocalAction {
    if !is_ready(node) {
        LocalAction::CheckCloud
    } else if taints(node).iter().any(is_shutdown_taint) {
        LocalAction::RemoveShutdownTaint
    } else {
        LocalAction::Nothing
    }
}

/// Upstream `MonitorNodes` steps 3–5 for a Node, given the cloud's answer. A Ready Node is never
/// deleted or tainted, whatever the cloud says (the Node may have turned Ready since the check).
pub fn plan_with_status(node: &Node, status: InstanceStatus) -> CloudAction {
    if is_ready(node) {
        CloudAction::Nothing
    } else if !status.exists {
        CloudAction::Delete
    } else if status.shutdown && !taints(node).iter().any(is_shutdown_taint) {
        CloudAction::AddShutdownTaint
    } else {
        CloudAction::Nothing
    }
}

/// The taint list with the shutdown taint added.
pub fn taints_with_shutdown(node: &Node) -> Option<Vec<Taint>> {
    let all = taints(node);
    if all.iter().any(is_shutdown_taint) {
        return None;
    }
    let mut out = all.to_vec();
    out.push(Taint {
        key: TAINT_SHUTDOWN.to_string(),
        effect: SHUTDOWN_EFFECT.to_string(),
        ..Default::default()
    });
    Some(out)
}

/// The taint list without the shutdown taint, if it had one.
pub fn taints_without_shutdown(node: &Node) -> Option<Vec<Taint>> {
    let all = taints(node);
    if !all.iter().any(is_shutdown_taint) {
        return None;
    }
    Some(
        all.iter()
            .filter(|t| !is_shutdown_taint(t))
            .cloned()
            .collect(),
    )
}

/// The Node an instance event is about: by providerID, else (for a Node without one yet) by
/// the instance's node name.
pub fn node_for_event<'a, N: AsRef<Node>>(nodes: &'a [N], ev: &InstanceEvent) -> Option<&'a N> {
    nodes
        .iter()
        .find(|n| !ev.provider_id.is_empty() && node_provider_id(n.as_ref()) == ev.provider_id)
        .or_else(|| {
            let name = ev.node_name.as_deref()?;
            nodes.iter().find(|n| {
                n.as_ref().metadata.name.as_deref() == Some(name)
                    && node_provider_id(n.as_ref()).is_empty()
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ccm_cloud::InstanceEventKind;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use proptest::prelude::*;

    fn node(name: &str, ready: Option<&str>, taints: Vec<Taint>, pid: Option<&str>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(taints),
                provider_id: pid.map(Into::into),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                conditions: ready.map(|s| {
                    vec![NodeCondition {
                        type_: "Ready".into(),
                        status: s.into(),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
        }
    }

    fn shutdown() -> Taint {
        Taint {
            key: TAINT_SHUTDOWN.into(),
            effect: SHUTDOWN_EFFECT.into(),
            ..Default::default()
        }
    }

    #[test]
    fn local_decisions() {
        assert_eq!(
            plan_local(&node("a", Some("True"), vec![], None)),
            LocalAction::Nothing
        );
        assert_eq!(
            plan_local(&node("a", Some("True"), vec![shutdown()], None)),
            LocalAction::RemoveShutdownTaint
        );
        for s in [Some("False"), Some("Unknown"), None] {
            assert_eq!(
                plan_local(&node("a", s, vec![], None)),
                LocalAction::CheckCloud
            );
        }
    }

    #[test]
    fn cloud_decisions() {
        let nr = node("a", Some("False"), vec![], None);
        let gone = InstanceStatus {
            exists: false,
            shutdown: false,
        };
        let off = InstanceStatus {
            exists: true,
            shutdown: true,
        };
        let on = InstanceStatus {
            exists: true,
            shutdown: false,
        };
        assert_eq!(plan_with_status(&nr, gone), CloudAction::Delete);
        assert_eq!(plan_with_status(&nr, off), CloudAction::AddShutdownTaint);
        assert_eq!(plan_with_status(&nr, on), CloudAction::Nothing);
        let tainted = node("a", Some("Unknown"), vec![shutdown()], None);
        assert_eq!(plan_with_status(&tainted, off), CloudAction::Nothing);
        let ready = node("a", Some("True"), vec![], None);
        assert_eq!(plan_with_status(&ready, gone), CloudAction::Nothing);
    }

    #[test]
    fn event_matching() {
        let nodes = vec![
            std::sync::Arc::new(node("a", None, vec![], Some("sim://i-1"))),
            std::sync::Arc::new(node("b", None, vec![], None)),
        ];
        let ev = |pid: &str, name: Option<&str>| InstanceEvent {
            kind: InstanceEventKind::Terminated,
            provider_id: pid.into(),
            node_name: name.map(Into::into),
        };
        let name_of = |n: Option<&std::sync::Arc<Node>>| n.and_then(|n| n.metadata.name.clone());
        assert_eq!(
            name_of(node_for_event(&nodes, &ev("sim://i-1", Some("x")))),
            Some("a".into())
        );
        assert_eq!(
            name_of(node_for_event(&nodes, &ev("sim://i-2", Some("b")))),
            Some("b".into())
        );
        // A name match on a Node with another providerID is a different instance.
        assert_eq!(
            name_of(node_for_event(&nodes, &ev("sim://i-2", Some("a")))),
            None
        );
    }

    fn arb_taints() -> impl Strategy<Value = Vec<Taint>> {
        prop::collection::vec(
            (
                prop::sample::select(vec![
                    TAINT_SHUTDOWN,
                    "other",
                    "node.cloudprovider.kubernetes.io/uninitialized",
                ]),
                prop::sample::select(vec!["NoSchedule", "NoExecute"]),
            )
                .prop_map(|(k, e)| Taint {
                    key: k.into(),
                    effect: e.into(),
                    ..Default::default()
                }),
            0..4,
        )
    }

    proptest! {
        #[test]
        fn ready_nodes_never_reach_the_cloud_and_are_never_deleted(
            ready in prop::sample::select(vec![Some("True"), Some("False"), Some("Unknown"), None]),
            ts in arb_taints(),
            exists in any::<bool>(),
            off in any::<bool>(),
        ) {
            let n = node("a", ready, ts, None);
            let local = plan_local(&n);
            let cloud = plan_with_status(&n, InstanceStatus { exists, shutdown: off });
            if ready == Some("True") {
                prop_assert_ne!(local, LocalAction::CheckCloud);
                prop_assert_eq!(cloud, CloudAction::Nothing);
            } else {
                prop_assert_eq!(local, LocalAction::CheckCloud);
                prop_assert_eq!(cloud == CloudAction::Delete, !exists);
            }
        }

        #[test]
        fn taint_edits_are_inverse_and_keep_others(ts in arb_taints()) {
            let n = node("a", None, ts.clone(), None);
            if let Some(with) = taints_with_shutdown(&n) {
                let n2 = node("a", None, with.clone(), None);
                prop_assert!(taints_with_shutdown(&n2).is_none());
                let back = taints_without_shutdown(&n2).unwrap();
                let expect: Vec<_> = ts.iter().filter(|t| !is_shutdown_taint(t)).cloned().collect();
                prop_assert_eq!(back, expect);
            }
            if let Some(without) = taints_without_shutdown(&n) {
                prop_assert!(!without.iter().any(is_shutdown_taint));
                prop_assert_eq!(without.len(), ts.iter().filter(|t| !is_shutdown_taint(t)).count());
            }
        }
    }
}
