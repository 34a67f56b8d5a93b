//! The CCM itself: its pods (present, scheduled, running, not crash-looping), its leader
//! election, and kube-controller-manager no longer running the cloud loops.

use k8s_openapi::api::core::v1::{Pod, Taint, Toleration};

use super::events_for;
use crate::doctor::report::{Finding, Verdict};
use crate::doctor::snapshot::{Flags, Snapshot, human};

const ID_PODS: &str = "ccm-pods";
const ID_LEADER: &str = "leader-election";
const ID_KCM: &str = "kcm-cloud-provider";

/// Restarts from which a running CCM counts as restarting.
const RESTARTS_WARN: i32 = 3;

fn full_name(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or_default(),
        name_of(p)
    )
}

fn name_of(p: &Pod) -> &str {
    p.metadata.name.as_deref().unwrap_or_default()
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Unknown")
}

fn node_name(p: &Pod) -> Option<&str> {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

fn host_network(p: &Pod) -> bool {
    p.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

/// The object to edit to change the pod: its Deployment or DaemonSet, else the pod.
pub fn owner_hint(p: &Pod) -> String {
    let ns = p.metadata.namespace.as_deref().unwrap_or("kube-system");
    let owner = p.metadata.owner_references.iter().flatten().next();
    let target = match owner {
        Some(o) if o.kind == "ReplicaSet" => match o.name.rsplit_once('-') {
            Some((deploy, _)) => format!("deployment/{deploy}"),
            None => format!("replicaset/{}", o.name),
        },
        Some(o) => format!("{}/{}", o.kind.to_ascii_lowercase(), o.name),
        None => format!("pod/{}", name_of(p)),
    };
    format!("kubectl -n {ns} edit {target}")
}

/// Whether one toleration tolerates one taint (the scheduler's rule).
pub(super) fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    let effect_ok = t
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    let key_ok = match t.operator.as_deref() {
        Some("Exists") => t
            .key
            .as_deref()
            .is_none_or(|k| k.is_empty() || k == taint.key),
        _ => {
            t.key.as_deref() == Some(taint.key.as_str())
                && t.value.as_deref().unwrap_or_default()
                    == taint.value.as_deref().unwrap_or_default()
        }
    };
    effect_ok && key_ok
}

fn untolerated<'a>(p: &Pod, node: &'a k8s_openapi::api::core::v1::Node) -> Vec<&'a Taint> {
    let tolerations: &[Toleration] = p
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    ccm_controllers::nodeutil::taints(node)
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .filter(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
        .collect()
}

/// Why an unscheduled pod cannot be placed, from the pod and the nodes alone.
fn unschedulable_reasons(snap: &Snapshot, p: &Pod) -> Vec<String> {
    let mut out = Vec::new();
    let nodes = &snap.nodes;
    if nodes.is_empty() {
        out.push("there are no nodes".into());
        return out;
    }
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    let mut blocked = 0;
    for n in nodes {
        let u = untolerated(p, n);
        if !u.is_empty() {
            blocked += 1;
        }
        for t in u {
            *counts.entry(format!("{}:{}", t.key, t.effect)).or_default() += 1;
        }
    }
    if blocked == nodes.len() {
        for (taint, c) in counts {
            out.push(format!(
                "taint {taint} not tolerated ({c} of {} nodes)",
                nodes.len()
            ));
        }
    }
    let selector = p.spec.as_ref().and_then(|s| s.node_selector.clone());
    if let Some(sel) = selector.filter(|s| !s.is_empty()) {
        let matches = nodes.iter().any(|n| {
            let labels = n.metadata.labels.clone().unwrap_or_default();
            sel.iter().all(|(k, v)| labels.get(k) == Some(v))
        });
        if !matches {
            let s: Vec<String> = sel.iter().map(|(k, v)| format!("{k}={v}")).collect();
            out.push(format!("nodeSelector {} matches no node", s.join(",")));
        }
    }
    out
}

/// Why a scheduled pod does not run: image pulls, waiting containers, no network.
fn not_running_reasons(snap: &Snapshot, p: &Pod, node: &str) -> Vec<String> {
    let mut out = Vec::new();
    for cs in p
        .status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
    {
        if let Some(w) = cs.state.as_ref().and_then(|s| s.waiting.as_ref()) {
            let reason = w.reason.as_deref().unwrap_or("Waiting");
            let msg = w.message.as_deref().unwrap_or_default();
            if matches!(
                reason,
                "ErrImagePull" | "ImagePullBackOff" | "InvalidImageName"
            ) {
                out.push(
                    format!("image pull of {} fails: {reason} {msg}", cs.image)
                        .trim_end()
                        .to_string(),
                );
            } else if reason != "CrashLoopBackOff" {
                out.push(
                    format!("container {} waiting: {reason} {msg}", cs.name)
                        .trim_end()
                        .to_string(),
                );
            }
        }
    }
    let node_ready = snap
        .nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(node))
        .map(ccm_controllers::nodeutil::is_ready);
    if !host_network(p) && node_ready == Some(false) {
        out.push(format!(
            "no hostNetwork while node {node} is NotReady: the pod needs the CNI, which waits for the CCM"
        ));
    }
    out
}

fn restart_reasons(p: &Pod) -> Vec<String> {
    let mut out = Vec::new();
    for cs in p
        .status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
    {
        let crashloop = cs
            .state
            .as_ref()
            .and_then(|s| s.waiting.as_ref())
            .is_some_and(|w| w.reason.as_deref() == Some("CrashLoopBackOff"));
        if crashloop || cs.restart_count >= RESTARTS_WARN {
            let last = cs
                .last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .map(|t| {
                    format!(
                        ", last exit {} ({})",
                        t.exit_code,
                        t.reason.as_deref().unwrap_or("?")
                    )
                })
                .unwrap_or_default();
            out.push(format!(
                "container {} restarted {} times{}{last}",
                cs.name,
                cs.restart_count,
                if crashloop { ", CrashLoopBackOff" } else { "" }
            ));
        }
    }
    out
}

/// How a pod is doing, in one line, for other checks' evidence.
pub fn pod_state(p: &Pod) -> String {
    let base = format!("pod {}: {}", full_name(p), phase(p));
    match node_name(p) {
        Some(n) => format!("{base} on node {n}"),
        None => format!("{base}, not scheduled"),
    }
}

/// The pod's line followed by its reasons, indented.
fn pod_evidence(p: &Pod, why: &[String]) -> Vec<String> {
    std::iter::once(pod_state(p))
        .chain(why.iter().map(|w| format!("  {w}")))
        .collect()
}

/// The verdict for one CCM pod and the reasons behind it.
fn assess(snap: &Snapshot, p: &Pod) -> (Verdict, Vec<String>) {
    let mut why = Vec::new();
    let ns = p.metadata.namespace.as_deref().unwrap_or_default();
    let latest_event = |reasons: &[&str]| {
        events_for(snap, "Pod", ns, name_of(p))
            .into_iter()
            .find(|e| e.reason.as_deref().is_some_and(|r| reasons.contains(&r)))
            .and_then(|e| e.message.clone())
    };
    match (phase(p), node_name(p)) {
        ("Pending", None) => {
            why = unschedulable_reasons(snap, p);
            if let Some(m) = latest_event(&["FailedScheduling"]) {
                why.push(format!("FailedScheduling: {m}"));
            }
            if why.is_empty() {
                why.push("not scheduled yet".into());
            }
            (Verdict::Fail, why)
        }
        ("Pending", Some(node)) => {
            why = not_running_reasons(snap, p, node);
            if let Some(m) = latest_event(&["FailedCreatePodSandBox", "Failed"]) {
                why.push(m);
            }
            (Verdict::Fail, why)
        }
        ("Running", _) => {
            why = restart_reasons(p);
            let verdict = if why.is_empty() {
                Verdict::Ok
            } else {
                Verdict::Warn
            };
            let crashloop = why.iter().any(|w| w.contains("CrashLoopBackOff"));
            (if crashloop { Verdict::Fail } else { verdict }, why)
        }
        (other, _) => {
            why.push(format!("phase {other}"));
            (Verdict::Fail, why)
        }
    }
}

/// The CCM's pods: present? Pending, and why? Restarting?
pub fn ccm_pods(snap: &Snapshot) -> Finding {
    let ns = &snap.settings.namespace;
    if let Err(e) = &snap.system_pods {
        return Finding::new(
            ID_PODS,
            Verdict::Warn,
            format!("cannot list pods in {ns}: {e}"),
        )
        .fix(format!("doctor needs `list pods` in {ns}"));
    }
    let pods = snap.ccm_pods();
    if pods.is_empty() {
        return no_ccm_pod(snap);
    }
    let assessed: Vec<(&Pod, Verdict, Vec<String>)> = pods
        .iter()
        .map(|(p, _)| {
            let (v, why) = assess(snap, p);
            (*p, v, why)
        })
        .collect();
    let healthy = assessed
        .iter()
        .filter(|(_, v, _)| *v == Verdict::Ok)
        .count();
    let worst = assessed
        .iter()
        .map(|(_, v, _)| *v)
        .max()
        .unwrap_or(Verdict::Ok);
    let verdict = match (healthy, worst) {
        (0, _) => Verdict::Fail,
        (_, Verdict::Ok) => Verdict::Ok,
        _ => Verdict::Warn,
    };
    let evidence: Vec<String> = assessed
        .iter()
        .flat_map(|(p, _, why)| pod_evidence(p, why))
        .collect();
    let summary = format!(
        "{healthy} of {} cloud-controller-manager pods in {ns} running",
        pods.len()
    );
    let mut f = Finding::new(ID_PODS, verdict, summary).evidence(evidence);
    if let Some((p, _, why)) = assessed.iter().find(|(_, v, _)| *v != Verdict::Ok) {
        f = f.fix(pod_fix(p, why));
    }
    f
}

fn pod_fix(p: &Pod, why: &[String]) -> String {
    let edit = owner_hint(p);
    let joined = why.join(" ");
    if joined.contains("not tolerated") {
        format!(
            "add tolerations for the taints above to the CCM's pod template ({edit}); a CCM must tolerate node.cloudprovider.kubernetes.io/uninitialized"
        )
    } else if joined.contains("nodeSelector") {
        format!(
            "fix the nodeSelector of the CCM's pod template ({edit}) or label a control-plane node to match"
        )
    } else if joined.contains("no hostNetwork") {
        format!("set `hostNetwork: true` in the CCM's pod template ({edit})")
    } else if joined.contains("image pull") {
        format!("fix the image reference or pull secret ({edit})")
    } else if joined.contains("restarted") {
        format!(
            "read why it exits: `kubectl -n {} logs {} --previous`",
            p.metadata.namespace.as_deref().unwrap_or_default(),
            name_of(p)
        )
    } else {
        format!(
            "`kubectl -n {} describe pod {}`",
            p.metadata.namespace.as_deref().unwrap_or_default(),
            name_of(p)
        )
    }
}

fn no_ccm_pod(snap: &Snapshot) -> Finding {
    let ns = &snap.settings.namespace;
    if let Some((holder, age)) = fresh_holder(snap) {
        return Finding::new(
            ID_PODS,
            Verdict::Warn,
            format!("no cloud-controller-manager pod in {ns}, but its Lease is held"),
        )
        .evidence([format!(
            "Lease {}/{} held by {holder}, renewed {} ago",
            snap.lease.namespace,
            snap.lease.name,
            human(age)
        )])
        .fix("the CCM runs outside the cluster or in another namespace (pass --namespace NS); pod checks are skipped");
    }
    if let Some(w) = super::workload::ccm_workloads(snap).first() {
        return Finding::new(
            ID_PODS,
            Verdict::Fail,
            format!(
                "no cloud-controller-manager pod in {ns}: {} exists but runs none",
                w.reference()
            ),
        )
        .evidence([format!(
            "{}: {} of {} pods ready",
            w.reference(),
            w.ready,
            w.desired
        )])
        .fix("see ccm-workload below for why it places no pod");
    }
    Finding::new(
        ID_PODS,
        Verdict::Fail,
        format!("no cloud-controller-manager pod in {ns}, and no CCM holds the Lease"),
    )
    .evidence([format!(
        "looked for pods in {ns} named or labelled cloud-controller-manager, or running the `ccm` binary"
    )])
    .fix(format!(
        "deploy the cloud-controller-manager into {ns} (or pass --namespace where it runs); nodes stay tainted and LoadBalancer Services pending until it runs"
    ))
}

/// The Lease's holder and time since renewal, if it is still within its duration.
fn fresh_holder(snap: &Snapshot) -> Option<(String, std::time::Duration)> {
    let lease = snap.lease.result.as_ref().ok()?.as_ref()?;
    let spec = lease.spec.as_ref()?;
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty())?;
    let since = snap.since(spec.renew_time.as_ref().map(|t| t.0));
    let duration =
        std::time::Duration::from_secs(spec.lease_duration_seconds.unwrap_or(15).max(0) as u64);
    (since <= duration + std::time::Duration::from_secs(2)).then_some((holder, since))
}

/// Whether a Lease holder identity (`hostname_uuid`) is this pod: the hostname is the pod's
/// name, or its node's name with hostNetwork.
fn holder_is(holder: &str, p: &Pod) -> bool {
    let host = holder.rsplit_once('_').map_or(holder, |(h, _)| h);
    let short = host.split('.').next().unwrap_or(host);
    name_of(p) == host
        || (host_network(p)
            && node_name(p).is_some_and(|n| n == host || n.split('.').next() == Some(short)))
}

/// Leader election: the Lease exists, is fresh, its holder is a running CCM pod; replicas
/// without `--leader-elect` are a failure.
pub fn leader_election(snap: &Snapshot) -> Finding {
    let pods = snap.ccm_pods();
    let running: Vec<&(&Pod, Flags)> = pods.iter().filter(|(p, _)| phase(p) == "Running").collect();
    let unelected: Vec<&(&Pod, Flags)> = running
        .iter()
        .copied()
        .filter(|(_, f)| !f.bool("leader-elect", true))
        .collect();
    if unelected.len() > 1 {
        return Finding::new(
            ID_LEADER,
            Verdict::Fail,
            format!("{} CCM replicas run with --leader-elect=false", unelected.len()),
        )
        .evidence(unelected.iter().map(|(p, _)| format!("pod {}: --leader-elect=false", full_name(p))))
        .fix(format!(
            "set --leader-elect=true ({}) or run one replica: both replicas act on every node and load balancer",
            owner_hint(unelected[0].0)
        ));
    }
    if !running.is_empty() && unelected.len() == running.len() {
        return Finding::new(
            ID_LEADER,
            Verdict::Ok,
            "leader election off, one replica running",
        );
    }
    let lease_ref = format!("{}/{}", snap.lease.namespace, snap.lease.name);
    let lease = match &snap.lease.result {
        Err(e) => {
            return Finding::new(
                ID_LEADER,
                Verdict::Warn,
                format!("cannot read Lease {lease_ref}: {e}"),
            )
            .fix(format!(
                "doctor needs `get leases` in {}",
                snap.lease.namespace
            ));
        }
        Ok(None) => {
            return Finding::new(
                ID_LEADER,
                Verdict::Fail,
                format!("Lease {lease_ref} does not exist: no CCM ever became leader"),
            )
            .fix("a CCM creates it when it starts leading; see ccm-pods (or it runs with another --leader-elect-resource-name)");
        }
        Ok(Some(l)) => l,
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let Some((holder, since)) = fresh_holder(snap) else {
        let renewed = spec
            .renew_time
            .as_ref()
            .map(|t| human(snap.since(Some(t.0))))
            .unwrap_or_else(|| "never".into());
        return Finding::new(
            ID_LEADER,
            Verdict::Fail,
            format!("Lease {lease_ref} is stale: no CCM is leading"),
        )
        .evidence([format!(
            "holder {:?}, last renewed {renewed} ago, lease duration {}s",
            holder,
            spec.lease_duration_seconds.unwrap_or(15)
        )])
        .fix("the leader stopped renewing and no replica took over: see ccm-pods, and the CCM's logs for \"leaderelection lost\"");
    };
    let evidence = format!("holder {holder}, renewed {} ago", human(since));
    match running.iter().find(|(p, _)| holder_is(&holder, p)) {
        Some((p, _)) => Finding::new(
            ID_LEADER,
            Verdict::Ok,
            format!("Lease {lease_ref} is fresh, held by running pod {}", full_name(p)),
        )
        .evidence([evidence]),
        None if pods.is_empty() => Finding::new(
            ID_LEADER,
            Verdict::Ok,
            format!("Lease {lease_ref} is fresh (holder runs outside {})", snap.settings.namespace),
        )
        .evidence([evidence]),
        None => Finding::new(
            ID_LEADER,
            Verdict::Warn,
            format!("Lease {lease_ref} is held by {holder}, which is none of the running CCM pods"),
        )
        .evidence([evidence])
        .evidence(pods.iter().map(|(p, _)| pod_state(p)))
        .fix("another CCM (an old Deployment, another namespace, a process outside the cluster) leads: find and remove it, or the pods above never act"),
    }
}

/// In-tree providers kube-controller-manager knew before they were removed.
const IN_TREE: &[&str] = &["aws", "azure", "gce", "openstack", "vsphere"];

/// `(major, minor)` of an image tag such as `registry.k8s.io/kube-controller-manager:v1.36.0`.
fn image_version(p: &Pod) -> Option<(u32, u32)> {
    let image = p.spec.as_ref()?.containers.first()?.image.as_deref()?;
    let tag = image.rsplit_once(':')?.1.trim_start_matches('v');
    let mut parts = tag.split(['.', '-', '+']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// Why a pod's main container keeps restarting, when it does: the waiting reason and the last
/// termination's message.
fn crash_loop(p: &Pod) -> Option<String> {
    let cs = p.status.as_ref()?.container_statuses.as_ref()?.first()?;
    let waiting = cs
        .state
        .as_ref()
        .and_then(|s| s.waiting.as_ref())
        .and_then(|w| w.reason.clone())
        .unwrap_or_default();
    if waiting != "CrashLoopBackOff" && cs.restart_count < RESTARTS_WARN {
        return None;
    }
    let last = cs
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .map(|t| {
            format!(
                "exit code {}{}",
                t.exit_code,
                t.message
                    .as_deref()
                    .map(|m| format!(": {}", m.trim()))
                    .unwrap_or_default()
            )
        })
        .unwrap_or_else(|| "no termination message".into());
    Some(format!(
        "{} restarts{}, last {last}",
        cs.restart_count,
        if waiting.is_empty() {
            String::new()
        } else {
            format!(", {waiting}")
        }
    ))
}

/// kube-controller-manager must not run the cloud loops (`--cloud-provider` other than
/// `external`) once a CCM does. From 1.29 it refuses an in-tree provider altogether (the
/// `DisableCloudProviders` gate is on; the providers' code is gone since 1.31): it exits, and
/// a kubelet restarts it in a loop — no cloud loops, but no node IPAM, garbage collection or
/// anything else it runs either.
pub fn kcm_cloud_provider(snap: &Snapshot) -> Finding {
    if let Err(e) = &snap.system_pods {
        return Finding::new(
            ID_KCM,
            Verdict::Warn,
            format!("cannot list pods in kube-system: {e}"),
        );
    }
    let kcm = snap.kcm_pods();
    if kcm.is_empty() {
        return Finding::new(
            ID_KCM,
            Verdict::Skip,
            "no kube-controller-manager pod visible in kube-system (managed control plane?)",
        );
    }
    let evidence: Vec<String> = kcm
        .iter()
        .map(|(p, f)| {
            let version = image_version(p)
                .map(|(a, b)| format!("v{a}.{b}"))
                .unwrap_or_else(|| "version unknown".into());
            match f.get("cloud-provider") {
                Some(v) => format!("pod {} ({version}): --cloud-provider={v}", full_name(p)),
                None => format!("pod {} ({version}): no --cloud-provider", full_name(p)),
            }
        })
        .collect();
    let static_file = |p: &Pod| match node_name(p) {
        Some(n) => format!(
            " (static pod: /etc/kubernetes/manifests/kube-controller-manager.yaml on node {n})"
        ),
        None => String::new(),
    };
    let in_tree = |f: &Flags| {
        f.get("cloud-provider")
            .filter(|v| IN_TREE.contains(v))
            .map(str::to_string)
    };
    let refuses = |p: &Pod| image_version(p).is_some_and(|v| v >= (1, 29));
    if let Some((p, f, why)) = kcm
        .iter()
        .find_map(|(p, f)| crash_loop(p).map(|w| (*p, f, w)))
    {
        let mut finding = Finding::new(
            ID_KCM,
            Verdict::Fail,
            format!("kube-controller-manager {} is crash-looping", full_name(p)),
        )
        .evidence([why])
        .evidence(evidence);
        finding = match in_tree(f) {
            Some(v) if refuses(p) => finding.fix(format!(
                "set --cloud-provider=external on pod {}{}: since 1.29 kube-controller-manager exits on --cloud-provider={v} (in-tree providers disabled, removed in 1.31); the CCM does that work",
                full_name(p),
                static_file(p)
            )),
            _ => finding.fix(format!(
                "read why it exits: `kubectl -n kube-system logs {} --previous`; until it runs, nothing allocates pod CIDRs or collects garbage",
                name_of(p)
            )),
        };
        return finding;
    }
    let Some((p, v)) = kcm.iter().find_map(|(p, f)| {
        in_tree(f)
            .or_else(|| {
                f.get("cloud-provider")
                    .filter(|v| !v.is_empty() && *v != "external")
                    .map(str::to_string)
            })
            .map(|v| (*p, v))
    }) else {
        return Finding::new(
            ID_KCM,
            Verdict::Ok,
            "kube-controller-manager runs no cloud loops",
        )
        .evidence(evidence);
    };
    let (summary, why) = if refuses(p) {
        (
            format!(
                "kube-controller-manager refuses --cloud-provider={v} since 1.29: it exits at its next start"
            ),
            "it stops instead of running the cloud loops, and takes node IPAM and garbage collection down with it",
        )
    } else {
        (
            format!("kube-controller-manager runs with --cloud-provider={v}"),
            "otherwise it and the CCM both manage nodes, routes and load balancers",
        )
    };
    Finding::new(ID_KCM, Verdict::Fail, summary)
        .evidence(evidence)
        .fix(format!(
            "set --cloud-provider=external on pod {}{}: {why}",
            full_name(p),
            static_file(p)
        ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tol(v: serde_json::Value) -> Toleration {
        serde_json::from_value(v).expect("toleration")
    }

    #[test]
    fn toleration_matching_follows_the_scheduler() {
        let taint = Taint {
            key: "node.cloudprovider.kubernetes.io/uninitialized".into(),
            value: Some("true".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        };
        assert!(tolerates(
            &tol(serde_json::json!({"operator": "Exists"})),
            &taint
        ));
        assert!(tolerates(
            &tol(
                serde_json::json!({"key": taint.key, "operator": "Exists", "effect": "NoSchedule"})
            ),
            &taint
        ));
        assert!(tolerates(
            &tol(serde_json::json!({"key": taint.key, "value": "true", "effect": "NoSchedule"})),
            &taint
        ));
        assert!(!tolerates(
            &tol(serde_json::json!({"key": taint.key, "value": "false"})),
            &taint
        ));
        assert!(!tolerates(
            &tol(
                serde_json::json!({"key": taint.key, "operator": "Exists", "effect": "NoExecute"})
            ),
            &taint
        ));
        assert!(!tolerates(
            &tol(serde_json::json!({"key": "other", "operator": "Exists"})),
            &taint
        ));
    }
}
