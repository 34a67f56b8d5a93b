//! Service checks: LoadBalancer Services waiting for an address (with their latest Events),
//! `externalTrafficPolicy: Local` Services with no ready endpoint on a load-balancer node, and
//! the deprecated `spec.externalIPs`.

use std::collections::BTreeSet;

use ccm_controllers::nodeutil::{
    LABEL_EXCLUDE_FROM_LB, TAINT_TO_BE_DELETED_BY_CA, has_taint, parse_go_bool,
};
use k8s_openapi::api::core::v1::{Node, Service};

use super::{event_line, events_for, list_some};
use crate::doctor::report::{Finding, Verdict};
use crate::doctor::snapshot::{Snapshot, human};

const ID_PENDING: &str = "lb-pending";
const ID_LOCAL: &str = "lb-local-endpoints";
const ID_EXTERNAL_IPS: &str = "external-ips";

fn key(s: &Service) -> String {
    format!(
        "{}/{}",
        s.metadata.namespace.as_deref().unwrap_or_default(),
        s.metadata.name.as_deref().unwrap_or_default()
    )
}

fn is_lb(s: &Service) -> bool {
    s.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
}

fn has_ingress(s: &Service) -> bool {
    s.status
        .as_ref()
        .and_then(|st| st.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .is_some_and(|i| !i.is_empty())
}

fn cannot_list(id: &'static str, what: &str, e: &str) -> Finding {
    Finding::new(id, Verdict::Warn, format!("cannot list {what}: {e}"))
        .fix(format!("doctor needs `list {what}` in all namespaces"))
}

/// LoadBalancer Services the CCM serves (no `loadBalancerClass`) that have no address yet.
pub fn lb_pending(snap: &Snapshot) -> Finding {
    let services = match &snap.services {
        Ok(s) => s,
        Err(e) => return cannot_list(ID_PENDING, "services", e),
    };
    let ours: Vec<&Service> = services
        .iter()
        .filter(|s| is_lb(s))
        .filter(|s| {
            s.spec
                .as_ref()
                .and_then(|s| s.load_balancer_class.as_ref())
                .is_none()
        })
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .collect();
    if ours.is_empty() {
        return Finding::new(ID_PENDING, Verdict::Skip, "no LoadBalancer Services");
    }
    let mut pending: Vec<(&Service, std::time::Duration)> = ours
        .iter()
        .filter(|s| !has_ingress(s))
        .map(|s| (*s, snap.age(s.metadata.creation_timestamp.as_ref())))
        .collect();
    if pending.is_empty() {
        return Finding::new(
            ID_PENDING,
            Verdict::Ok,
            format!("all {} LoadBalancer Services have an address", ours.len()),
        );
    }
    pending.sort_by_key(|p| std::cmp::Reverse(p.1));
    let stuck = pending[0].1 > snap.settings.grace;
    let mut evidence = Vec::new();
    // Services without events, folded per wait: "services a, b, c and 7 more: …".
    let mut silent: Vec<(String, Vec<String>)> = Vec::new();
    for (s, age) in &pending {
        let ns = s.metadata.namespace.as_deref().unwrap_or_default();
        let name = s.metadata.name.as_deref().unwrap_or_default();
        let events = events_for(snap, "Service", ns, name);
        let line = format!("no address for {}", human(*age));
        if events.is_empty() {
            match silent.iter_mut().find(|(l, _)| *l == line) {
                Some((_, keys)) => keys.push(key(s)),
                None => silent.push((line, vec![key(s)])),
            }
            continue;
        }
        evidence.push(format!("service {}: {line}", key(s)));
        for e in events.iter().take(2) {
            evidence.push(format!("    {}", event_line(snap, e)));
        }
    }
    for (line, keys) in &silent {
        evidence.push(match keys.len() {
            1 => format!("service {}: {line}, no events", keys[0]),
            n if n <= 3 => format!("services {}: {line}, no events", keys.join(", ")),
            n => format!(
                "services {} and {} more: {line}, no events",
                keys[..3].join(", "),
                n - 3
            ),
        });
    }
    let evidence = list_some(evidence);
    let silent = !silent.is_empty();
    let first = key(pending[0].0);
    let mut f = Finding::new(
        ID_PENDING,
        if stuck { Verdict::Fail } else { Verdict::Warn },
        format!(
            "{} of {} LoadBalancer Services have no address (oldest waits {})",
            pending.len(),
            ours.len(),
            human(pending[0].1)
        ),
    )
    .evidence(evidence);
    if silent {
        f = f.fix(format!(
            "no service-controller events for {first}: the CCM's service controller is not acting on it (see ccm-pods, leader-election)"
        ));
    }
    f.fix(format!(
        "`kubectl describe service {first}`: a Warning SyncLoadBalancerFailed event carries the cloud's error"
    ))
}

/// Nodes a load balancer targets (upstream's node set: not being deleted, not excluded by
/// label, not being removed by the cluster autoscaler).
fn lb_nodes(nodes: &[Node]) -> BTreeSet<&str> {
    nodes
        .iter()
        .filter(|n| n.metadata.deletion_timestamp.is_none())
        .filter(|n| {
            let excluded = n
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_EXCLUDE_FROM_LB))
                .map(|v| parse_go_bool(v).unwrap_or(true));
            excluded != Some(true)
        })
        .filter(|n| !has_taint(n, TAINT_TO_BE_DELETED_BY_CA))
        .filter_map(|n| n.metadata.name.as_deref())
        .collect()
}

/// `externalTrafficPolicy: Local` LoadBalancer Services need a ready endpoint on a node the load
/// balancer targets, or every node fails the health check and traffic is dropped.
pub fn lb_local_endpoints(snap: &Snapshot) -> Finding {
    let services = match &snap.services {
        Ok(s) => s,
        Err(e) => return cannot_list(ID_LOCAL, "services", e),
    };
    let local: Vec<&Service> = services
        .iter()
        .filter(|s| is_lb(s))
        .filter(|s| {
            s.spec
                .as_ref()
                .and_then(|s| s.external_traffic_policy.as_deref())
                == Some("Local")
        })
        .collect();
    if local.is_empty() {
        return Finding::new(
            ID_LOCAL,
            Verdict::Skip,
            "no LoadBalancer Services with externalTrafficPolicy: Local",
        );
    }
    let slices = match &snap.endpoint_slices {
        Ok(s) => s,
        Err(e) => return cannot_list(ID_LOCAL, "endpointslices", e),
    };
    let targets = lb_nodes(&snap.nodes);
    let mut bad = Vec::new();
    for s in &local {
        let ns = s.metadata.namespace.as_deref().unwrap_or_default();
        let name = s.metadata.name.as_deref().unwrap_or_default();
        let ready_nodes: BTreeSet<&str> = slices
            .iter()
            .filter(|es| es.metadata.namespace.as_deref() == Some(ns))
            .filter(|es| {
                es.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("kubernetes.io/service-name"))
                    .is_some_and(|v| v == name)
            })
            .flat_map(|es| es.endpoints.iter().flatten())
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
            .filter_map(|e| e.node_name.as_deref())
            .collect();
        if !ready_nodes.iter().any(|n| targets.contains(n)) {
            let where_ = if ready_nodes.is_empty() {
                "no ready endpoints at all".to_string()
            } else {
                format!(
                    "ready endpoints only on {} (not load-balancer targets)",
                    ready_nodes.iter().copied().collect::<Vec<_>>().join(", ")
                )
            };
            bad.push((key(s), where_));
        }
    }
    if bad.is_empty() {
        return Finding::new(
            ID_LOCAL,
            Verdict::Ok,
            format!(
                "{} externalTrafficPolicy: Local Services have ready endpoints on load-balancer nodes",
                local.len()
            ),
        );
    }
    let first = bad[0].0.clone();
    Finding::new(
        ID_LOCAL,
        Verdict::Fail,
        format!(
            "{} externalTrafficPolicy: Local Services have no ready endpoint on a load-balancer node",
            bad.len()
        ),
    )
    .evidence(list_some(bad.iter().map(|(k, w)| format!("service {k}: {w}"))))
    .fix(format!(
        "every node fails the load balancer's health check for {first}, so its traffic is dropped: run ready pods for it on nodes without {LABEL_EXCLUDE_FROM_LB}, or set `externalTrafficPolicy: Cluster`"
    ))
}

/// `spec.externalIPs` is deprecated since Kubernetes 1.36 (KEP-5707).
pub fn external_ips(snap: &Snapshot) -> Finding {
    let services = match &snap.services {
        Ok(s) => s,
        Err(e) => return cannot_list(ID_EXTERNAL_IPS, "services", e),
    };
    let using: Vec<&Service> = services
        .iter()
        .filter(|s| {
            s.spec
                .as_ref()
                .and_then(|s| s.external_ips.as_ref())
                .is_some_and(|ips| !ips.is_empty())
        })
        .collect();
    let Some(first) = using.first() else {
        return Finding::new(
            ID_EXTERNAL_IPS,
            Verdict::Ok,
            "no Service uses spec.externalIPs",
        );
    };
    Finding::new(
        ID_EXTERNAL_IPS,
        Verdict::Warn,
        format!(
            "{} Services use spec.externalIPs, deprecated since Kubernetes 1.36",
            using.len()
        ),
    )
    .evidence(list_some(using.iter().map(|s| {
        let ips = s.spec.as_ref().and_then(|s| s.external_ips.clone()).unwrap_or_default();
        format!("service {}: externalIPs {}", key(s), ips.join(", "))
    })))
    .fix(format!(
        "make {} `type: LoadBalancer` so the cloud provider allocates and routes the address (or use Gateway API); KEP-5707 plans to disable externalIPs by default",
        key(first)
    ))
}
