//! Node checks: the uninitialized taint, the CNI-waits-for-CCM deadlock, kubelets not started
//! with `--cloud-provider=external`, and what initialization should have written.

use ccm_controllers::nodeutil::{
    LABEL_INSTANCE_TYPE, LABEL_REGION, LABEL_ZONE, TAINT_UNINITIALIZED, has_taint, is_ready, taints,
};
use k8s_openapi::api::core::v1::Node;

use super::{ccm, group_nodes, list_some, name};
use crate::doctor::report::{Finding, Verdict};
use crate::doctor::snapshot::{Snapshot, human};

const ID_TAINT: &str = "uninitialized-taint";
const ID_DEADLOCK: &str = "network-deadlock";
const ID_KUBELET: &str = "kubelet-cloud-provider";
const ID_METADATA: &str = "node-metadata";
const ID_NETWORK: &str = "node-network";

fn provider_id(n: &Node) -> &str {
    n.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .unwrap_or_default()
}

/// How long the node has carried the taint: since the taint's `timeAdded`, else since the Node
/// was created (kubelets register with the taint).
fn tainted_for(snap: &Snapshot, n: &Node) -> std::time::Duration {
    let added = taints(n)
        .iter()
        .find(|t| t.key == TAINT_UNINITIALIZED)
        .and_then(|t| t.time_added.as_ref());
    snap.age(added.or(n.metadata.creation_timestamp.as_ref()))
}

/// Nodes still carrying `node.cloudprovider.kubernetes.io/uninitialized`, and for how long.
pub fn uninitialized_taint(snap: &Snapshot) -> Finding {
    let mut tainted: Vec<(&Node, std::time::Duration)> = snap
        .nodes
        .iter()
        .filter(|n| has_taint(n, TAINT_UNINITIALIZED))
        .map(|n| (n, tainted_for(snap, n)))
        .collect();
    if tainted.is_empty() {
        return Finding::new(
            ID_TAINT,
            Verdict::Ok,
            format!("no node carries {TAINT_UNINITIALIZED}"),
        );
    }
    tainted.sort_by_key(|t| std::cmp::Reverse(t.1));
    let (oldest, longest) = (name(tainted[0].0), tainted[0].1);
    let stuck = longest > snap.settings.grace;
    let verdict = if stuck { Verdict::Fail } else { Verdict::Warn };
    let summary = format!(
        "{} of {} nodes still tainted {TAINT_UNINITIALIZED} (longest {} )",
        tainted.len(),
        snap.nodes.len(),
        human(longest)
    )
    .replace(" )", ")");
    let evidence = group_nodes(
        tainted
            .iter()
            .map(|(n, d)| (name(n), format!("tainted for {}", human(*d)))),
    );
    let mut f = Finding::new(ID_TAINT, verdict, summary).evidence(evidence);
    if stuck {
        f = f
            .fix(format!(
                "the CCM removes this taint once it has looked the node up in the cloud; see ccm-pods and leader-election below, then `kubectl describe node {oldest}` for its events"
            ))
            .fix("until then no pod without a toleration schedules on these nodes");
    } else {
        f = f.fix(format!(
            "being initialized (under {}); run doctor again if node {oldest} keeps the taint",
            human(snap.settings.grace)
        ));
    }
    f
}

fn ready_reason(n: &Node) -> String {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map(|c| {
            let mut s = format!("Ready={}", c.status);
            if let Some(r) = &c.reason {
                s.push_str(&format!(" ({r}"));
                if let Some(m) = c.message.as_deref().filter(|m| !m.is_empty()) {
                    s.push_str(&format!(": {m}"));
                }
                s.push(')');
            }
            s
        })
        .unwrap_or_else(|| "no Ready condition".into())
}

/// Nodes NotReady *and* uninitialized: the CNI waits for the CCM (routes, addresses) while the
/// CCM cannot run on a node without a network unless it uses hostNetwork and tolerates both.
pub fn network_deadlock(snap: &Snapshot) -> Finding {
    let stuck: Vec<&Node> = snap
        .nodes
        .iter()
        .filter(|n| has_taint(n, TAINT_UNINITIALIZED) && !is_ready(n))
        .collect();
    if stuck.is_empty() {
        return Finding::new(
            ID_DEADLOCK,
            Verdict::Ok,
            "no node is both NotReady and uninitialized",
        );
    }
    let mut evidence = group_nodes(stuck.iter().map(|n| (name(n), ready_reason(n))));
    let pods = snap.ccm_pods();
    if pods.is_empty() {
        evidence.push(format!(
            "no cloud-controller-manager pod in {}",
            snap.settings.namespace
        ));
    }
    evidence.extend(pods.iter().map(|(p, _)| ccm::pod_state(p)));
    let target = pods
        .first()
        .map(|(p, _)| ccm::owner_hint(p))
        .unwrap_or_else(|| {
            format!(
                "the CCM's Deployment/DaemonSet in {}",
                snap.settings.namespace
            )
        });
    Finding::new(
        ID_DEADLOCK,
        Verdict::Fail,
        format!(
            "{} nodes are NotReady and uninitialized: the network waits for the CCM, the CCM for the network",
            stuck.len()
        ),
    )
    .evidence(evidence)
    .fix(format!(
        "run the CCM with `hostNetwork: true` and tolerations for {TAINT_UNINITIALIZED}:NoSchedule and node.kubernetes.io/not-ready:NoSchedule ({target})"
    ))
    .fix("then the CCM initializes the nodes, routes get created and the CNI becomes ready")
}

/// Nodes neither tainted nor given a providerID: their kubelet was not started with
/// `--cloud-provider=external`, so no CCM will ever initialize them.
pub fn kubelet_cloud_provider(snap: &Snapshot) -> Finding {
    let bad: Vec<&Node> = snap
        .nodes
        .iter()
        .filter(|n| !has_taint(n, TAINT_UNINITIALIZED) && provider_id(n).is_empty())
        .collect();
    let Some(first) = bad.first() else {
        return Finding::new(
            ID_KUBELET,
            Verdict::Ok,
            "every node was registered for an external cloud provider (tainted or with a providerID)",
        );
    };
    let first = name(first);
    Finding::new(
        ID_KUBELET,
        Verdict::Fail,
        format!(
            "{} nodes have no providerID and no {TAINT_UNINITIALIZED} taint",
            bad.len()
        ),
    )
    .evidence(list_some(bad.iter().map(|n| {
        format!("node {}: spec.providerID empty, not tainted", name(n))
    })))
    .fix(format!(
        "start the kubelet on node {first} with --cloud-provider=external, so it registers tainted and the CCM initializes it"
    ))
    .fix(format!(
        "for the existing Node: `kubectl taint node {first} {TAINT_UNINITIALIZED}=true:NoSchedule` hands it to the CCM"
    ))
}

/// What initialization writes: topology and instance-type labels, addresses.
pub fn node_metadata(snap: &Snapshot) -> Finding {
    let mut gaps = Vec::new();
    let mut first = None;
    let initialized: Vec<&Node> = snap
        .nodes
        .iter()
        .filter(|n| !has_taint(n, TAINT_UNINITIALIZED) && !provider_id(n).is_empty())
        .collect();
    if initialized.is_empty() {
        return Finding::new(
            ID_METADATA,
            Verdict::Skip,
            "no initialized node to check yet",
        );
    }
    for n in initialized {
        let labels = n.metadata.labels.clone().unwrap_or_default();
        let mut missing: Vec<String> = [LABEL_ZONE, LABEL_REGION, LABEL_INSTANCE_TYPE]
            .into_iter()
            .filter(|l| !labels.contains_key(*l))
            .map(|l| format!("label {l}"))
            .collect();
        let has_ip = n
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .is_some_and(|a| {
                a.iter()
                    .any(|a| a.type_ == "InternalIP" || a.type_ == "ExternalIP")
            });
        if !has_ip {
            missing.push("InternalIP/ExternalIP address".into());
        }
        if !missing.is_empty() {
            first.get_or_insert_with(|| name(n).to_string());
            gaps.push(format!("node {}: missing {}", name(n), missing.join(", ")));
        }
    }
    let Some(first) = first else {
        return Finding::new(
            ID_METADATA,
            Verdict::Ok,
            "initialized nodes have zone, region and instance-type labels and IP addresses",
        );
    };
    Finding::new(
        ID_METADATA,
        Verdict::Warn,
        format!("{} initialized nodes lack labels or addresses", gaps.len()),
    )
    .evidence(list_some(gaps))
    .fix(format!(
        "labels are written once, at initialization, from the provider's instance metadata: if the cloud now reports them, re-taint node {first} (`kubectl taint node {first} {TAINT_UNINITIALIZED}=true:NoSchedule`) to re-initialize it"
    ))
    .fix("a provider without zones (some bare-metal setups) leaves them unset by design")
}

fn network_unavailable(n: &Node) -> Option<(String, Option<jiff::Timestamp>)> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "NetworkUnavailable" && c.status == "True")
        .map(|c| {
            (
                c.reason.clone().unwrap_or_default(),
                c.last_transition_time.as_ref().map(|t| t.0),
            )
        })
}

fn pod_cidr(n: &Node) -> Option<&str> {
    n.spec
        .as_ref()
        .and_then(|s| s.pod_cidr.as_deref())
        .filter(|c| !c.is_empty())
}

/// The route controller's side of node networking: `NetworkUnavailable` cleared once a node's
/// route exists, and a `spec.podCIDR` on every node (the route controller skips a node without
/// one). Whether routes are the CCM's job follows from its flags.
pub fn node_network(snap: &Snapshot) -> Finding {
    if snap.nodes.is_empty() {
        return Finding::new(ID_NETWORK, Verdict::Skip, "no nodes");
    }
    let pods = snap.ccm_pods();
    let flags = pods.first().map(|(_, f)| f.clone());
    let routes = flags.as_ref().map(|f| {
        f.bool("configure-cloud-routes", true)
            && f.get("cluster-cidr").is_some_and(|c| !c.is_empty())
    });
    let unavailable: Vec<(&Node, String, std::time::Duration)> = snap
        .nodes
        .iter()
        .filter_map(|n| network_unavailable(n).map(|(r, t)| (n, r, snap.since(t))))
        .collect();
    let no_cidr: Vec<&Node> = snap
        .nodes
        .iter()
        .filter(|n| pod_cidr(n).is_none())
        .collect();
    let mut evidence = group_nodes(unavailable.iter().map(|(n, r, d)| {
        (
            name(n),
            format!("NetworkUnavailable=True ({r}) for {}", human(*d)),
        )
    }));
    if routes == Some(true) {
        evidence.extend(group_nodes(
            no_cidr
                .iter()
                .map(|n| (name(n), "no spec.podCIDR".to_string())),
        ));
    }
    let stuck = unavailable.iter().any(|(_, _, d)| *d > snap.settings.grace);
    match routes {
        Some(true) if !unavailable.is_empty() => Finding::new(
            ID_NETWORK,
            if stuck { Verdict::Fail } else { Verdict::Warn },
            format!("{} of {} nodes still NetworkUnavailable: their cloud routes are missing", unavailable.len(), snap.nodes.len()),
        )
        .evidence(evidence)
        .fix("the CCM's route controller creates the routes and clears the condition: see route-syncs and the CCM's logs; a node without spec.podCIDR gets no route (kube-controller-manager --allocate-node-cidrs assigns them)"),
        Some(true) if !no_cidr.is_empty() => Finding::new(
            ID_NETWORK,
            Verdict::Warn,
            format!("{} of {} nodes have no spec.podCIDR: the route controller skips them", no_cidr.len(), snap.nodes.len()),
        )
        .evidence(evidence)
        .fix("run kube-controller-manager (or the CCM) with --allocate-node-cidrs=true and --cluster-cidr, or let the CNI route (--configure-cloud-routes=false)"),
        _ if !unavailable.is_empty() => Finding::new(
            ID_NETWORK,
            Verdict::Warn,
            format!("{} of {} nodes are NetworkUnavailable and the CCM does not configure routes", unavailable.len(), snap.nodes.len()),
        )
        .evidence(evidence)
        .fix("the CNI clears NetworkUnavailable when it routes pods itself; with cloud routes, run the CCM with --cluster-cidr (and --configure-cloud-routes, the default)"),
        Some(true) => Finding::new(ID_NETWORK, Verdict::Ok, "every node has a podCIDR and no NetworkUnavailable condition"),
        Some(false) => Finding::new(ID_NETWORK, Verdict::Ok, "no node is NetworkUnavailable (the CCM configures no routes; podCIDRs are the CNI's business)"),
        None => Finding::new(ID_NETWORK, Verdict::Ok, "no node is NetworkUnavailable"),
    }
}
