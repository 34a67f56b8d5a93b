//! What runs the CCM: its Deployment or DaemonSet (and a Deployment's ReplicaSets). A pod
//! list shows what runs now; the pod template shows what the next pod will be. A DaemonSet
//! whose nodeSelector matches no node has no pod at all, and a CCM without hostNetwork or the
//! tolerations runs fine until the day every node is new — "works now, breaks when …".

use k8s_openapi::api::core::v1::{Node, PodSpec, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::ccm::tolerates;
use crate::doctor::report::{Finding, Verdict};
use crate::doctor::snapshot::{Flags, Snapshot, is_ccm};

const ID: &str = "ccm-workload";
/// The taints every new node carries until the CCM and the CNI have done their work.
const BOOTSTRAP_TAINTS: &[&str] = &[
    "node.cloudprovider.kubernetes.io/uninitialized",
    "node.kubernetes.io/not-ready",
];

/// One Deployment or DaemonSet of the CCM, as the checks need it.
#[derive(Debug, Clone)]
pub struct View<'a> {
    /// `Deployment` or `DaemonSet`.
    pub kind: &'static str,
    /// Its metadata.
    pub meta: &'a ObjectMeta,
    /// The pod template's spec.
    pub spec: Option<&'a PodSpec>,
    /// Pods wanted (replicas, or nodes the DaemonSet selects).
    pub desired: i32,
    /// Pods ready.
    pub ready: i32,
    /// Pods of the current template.
    pub updated: i32,
    /// Why its rollout stopped, when the controller says so.
    pub stalled: Option<String>,
}

impl View<'_> {
    /// `deployment/name`, as kubectl takes it.
    pub fn reference(&self) -> String {
        format!(
            "{}/{}",
            self.kind.to_ascii_lowercase(),
            self.meta.name.as_deref().unwrap_or_default()
        )
    }
}

/// The CCM's Deployments and DaemonSets in its namespace.
pub fn ccm_workloads(snap: &Snapshot) -> Vec<View<'_>> {
    let w = &snap.workloads;
    let mut out = Vec::new();
    for d in w.deployments.iter().flatten() {
        let spec = d.spec.as_ref();
        let tpl = spec.map(|s| &s.template);
        if !is_ccm(&d.metadata, tpl.and_then(|t| t.spec.as_ref())) {
            continue;
        }
        let st = d.status.clone().unwrap_or_default();
        let stalled = st
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Progressing" && c.status == "False")
            .map(|c| {
                format!(
                    "{}: {}",
                    c.reason.clone().unwrap_or_default(),
                    c.message.clone().unwrap_or_default()
                )
            });
        out.push(View {
            kind: "Deployment",
            meta: &d.metadata,
            spec: tpl.and_then(|t| t.spec.as_ref()),
            desired: spec.and_then(|s| s.replicas).unwrap_or(1),
            ready: st.ready_replicas.unwrap_or(0),
            updated: st.updated_replicas.unwrap_or(0),
            stalled,
        });
    }
    for d in w.daemonsets.iter().flatten() {
        let tpl = d.spec.as_ref().map(|s| &s.template);
        if !is_ccm(&d.metadata, tpl.and_then(|t| t.spec.as_ref())) {
            continue;
        }
        let st = d.status.clone().unwrap_or_default();
        out.push(View {
            kind: "DaemonSet",
            meta: &d.metadata,
            spec: tpl.and_then(|t| t.spec.as_ref()),
            desired: st.desired_number_scheduled,
            ready: st.number_ready,
            updated: st.updated_number_scheduled.unwrap_or(0),
            stalled: None,
        });
    }
    out
}

fn labels(n: &Node) -> impl Iterator<Item = (&String, &String)> {
    n.metadata.labels.iter().flatten()
}

/// Nodes the template's nodeSelector admits.
fn selected<'a>(snap: &'a Snapshot, spec: Option<&PodSpec>) -> Vec<&'a Node> {
    let selector = spec.and_then(|s| s.node_selector.as_ref());
    snap.nodes
        .iter()
        .filter(|n| {
            selector.iter().flat_map(|s| s.iter()).all(|(k, v)| {
                n.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(k))
                    .is_some_and(|nv| nv == v)
            })
        })
        .collect()
}

fn tolerations(spec: Option<&PodSpec>) -> &[Toleration] {
    spec.and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default()
}

fn tolerated(spec: Option<&PodSpec>, key: &str, effect: &str) -> bool {
    let taint = Taint {
        key: key.into(),
        effect: effect.into(),
        value: Some("true".into()),
        time_added: None,
    };
    tolerations(spec).iter().any(|t| tolerates(t, &taint))
}

/// What is wrong now (fail) and what breaks later (warn), for one workload.
fn assess(snap: &Snapshot, w: &View) -> (Vec<String>, Vec<String>) {
    let (mut now, mut later) = (Vec::new(), Vec::new());
    let r = w.reference();
    let nodes = selected(snap, w.spec);
    if nodes.is_empty() {
        let selector = w
            .spec
            .and_then(|s| s.node_selector.as_ref())
            .map(|s| {
                s.iter()
                    .map(|(k, v)| format!("{k}={v:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        let mut line = format!(
            "{r}: nodeSelector {{{selector}}} matches none of the {} nodes",
            snap.nodes.len()
        );
        let keys: Vec<&String> = w
            .spec
            .and_then(|s| s.node_selector.as_ref())
            .map(|s| s.keys().collect())
            .unwrap_or_default();
        let seen: Vec<String> = snap
            .nodes
            .iter()
            .flat_map(labels)
            .filter(|(k, _)| keys.contains(k))
            .map(|(k, v)| format!("{k}={v:?}"))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if !seen.is_empty() {
            line.push_str(&format!(" (the nodes carry {})", seen.join(", ")));
        }
        if w.desired > 0 && w.ready >= w.desired {
            // Its pods run where the labels were: the next reschedule has nowhere to go.
            later.push(format!(
                "{line} — works now, breaks when its pods are rescheduled"
            ));
        } else {
            now.push(line);
        }
    } else {
        let blocked: Vec<&Node> = nodes
            .iter()
            .copied()
            .filter(|n| {
                ccm_controllers::nodeutil::taints(n)
                    .iter()
                    .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
                    .any(|t| !tolerations(w.spec).iter().any(|tol| tolerates(tol, t)))
            })
            .collect();
        if blocked.len() == nodes.len() && w.ready < w.desired {
            now.push(format!(
                "{r}: every node its nodeSelector admits has a taint the pod template does not tolerate"
            ));
        }
    }
    if let Some(why) = &w.stalled {
        now.push(format!("{r}: rollout stalled ({why})"));
    } else if w.updated < w.desired && w.ready < w.desired {
        later.push(format!(
            "{r}: rollout in progress, {} of {} pods updated, {} ready",
            w.updated, w.desired, w.ready
        ));
    }
    let host_network = w.spec.and_then(|s| s.host_network).unwrap_or(false);
    if !host_network {
        later.push(format!(
            "{r}: no hostNetwork — works now, breaks when its pod is rescheduled onto a node whose CNI waits for the CCM (a rebuilt node, a new cluster): the pod needs the pod network the CCM has to set up first"
        ));
    }
    for key in BOOTSTRAP_TAINTS {
        if !tolerated(w.spec, key, "NoSchedule") {
            later.push(format!(
                "{r}: does not tolerate {key}:NoSchedule — works now, breaks when every node is new (cluster rebuild, control-plane nodes replaced): new nodes carry it until the CCM runs"
            ));
        }
    }
    let flags = w
        .spec
        .and_then(|s| s.containers.first())
        .map(|c| {
            Flags::parse(
                c.command
                    .iter()
                    .flatten()
                    .chain(c.args.iter().flatten())
                    .map(String::as_str),
            )
        })
        .unwrap_or_default();
    if w.desired > 1 && !flags.bool("leader-elect", true) {
        now.push(format!(
            "{r}: {} replicas with --leader-elect=false: each acts on every node and load balancer",
            w.desired
        ));
    }
    (now, later)
}

/// The CCM's Deployment/DaemonSet: can it place its pods, is its rollout moving, and will its
/// template still work on a cluster of new nodes?
pub fn ccm_workload(snap: &Snapshot) -> Finding {
    let ns = &snap.settings.namespace;
    let w = &snap.workloads;
    if let Some(e) = [&w.deployments.as_ref().err(), &w.daemonsets.as_ref().err()]
        .into_iter()
        .flatten()
        .next()
    {
        return Finding::new(
            ID,
            Verdict::Warn,
            format!("cannot list workloads in {ns}: {e}"),
        )
        .fix(format!(
            "doctor needs `list deployments,daemonsets,replicasets` in {ns}"
        ));
    }
    let views = ccm_workloads(snap);
    if views.is_empty() {
        return Finding::new(
            ID,
            Verdict::Skip,
            format!(
                "no Deployment or DaemonSet in {ns} runs a cloud-controller-manager (static pod, or outside the cluster?)"
            ),
        );
    }
    let (mut now, mut later) = (Vec::new(), Vec::new());
    for v in &views {
        let (n, l) = assess(snap, v);
        now.extend(n);
        later.extend(l);
    }
    let first = &views[0];
    let status = |v: &View| {
        format!(
            "{}: {}/{} ready, {} updated",
            v.reference(),
            v.ready,
            v.desired,
            v.updated
        )
    };
    let mut evidence: Vec<String> = views.iter().map(status).collect();
    evidence.extend(replica_sets(snap, first));
    let edit = format!("kubectl -n {ns} edit {}", first.reference());
    if !now.is_empty() {
        let fix = if now.iter().any(|l| l.contains("nodeSelector")) {
            format!(
                "{edit}: set the nodeSelector to a label your control-plane nodes carry (k3s and RKE2: node-role.kubernetes.io/control-plane: \"true\")"
            )
        } else if now.iter().any(|l| l.contains("taint")) {
            format!(
                "{edit}: add the tolerations of docs/deploy.md (uninitialized, not-ready, unreachable, network-unavailable, control-plane)"
            )
        } else if now.iter().any(|l| l.contains("leader-elect")) {
            format!("{edit}: set --leader-elect=true")
        } else {
            format!(
                "kubectl -n {ns} rollout status {}; `kubectl -n {ns} describe {}`",
                first.reference(),
                first.reference()
            )
        };
        return Finding::new(ID, Verdict::Fail, now[0].clone())
            .evidence(now.into_iter().skip(1).chain(later).chain(evidence))
            .fix(fix);
    }
    if !later.is_empty() {
        return Finding::new(ID, Verdict::Warn, format!("{} runs, but its pod template will not survive a rebuild", first.reference()))
            .evidence(later.into_iter().chain(evidence))
            .fix(format!("{edit}: hostNetwork: true and the tolerations of docs/deploy.md, before the next node rebuild needs them"));
    }
    Finding::new(
        ID,
        Verdict::Ok,
        format!(
            "{} up to date and ready",
            views
                .iter()
                .map(View::reference)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
    .evidence(evidence)
}

/// A Deployment's ReplicaSets with their pods: an old one still serving shows the rollout.
fn replica_sets(snap: &Snapshot, w: &View) -> Vec<String> {
    if w.kind != "Deployment" {
        return Vec::new();
    }
    let uid = w.meta.uid.as_deref();
    let name = w.meta.name.as_deref();
    snap.workloads
        .replicasets
        .iter()
        .flatten()
        .filter(|rs| {
            rs.metadata.owner_references.iter().flatten().any(|o| {
                o.kind == "Deployment"
                    && (Some(o.uid.as_str()) == uid || Some(o.name.as_str()) == name)
            })
        })
        .map(|rs| {
            let st = rs.status.clone().unwrap_or_default();
            format!(
                "replicaset {}: {} pods, {} ready",
                rs.metadata.name.as_deref().unwrap_or_default(),
                st.replicas,
                st.ready_replicas.unwrap_or(0)
            )
        })
        .collect()
}
