//! The checklist: each check is a pure function of the [`Snapshot`] returning one [`Finding`].

pub mod ccm;
pub mod nodes;
pub mod routes;
pub mod services;
pub mod workload;

use k8s_openapi::api::core::v1::{Event, Node};

use super::report::Finding;
use super::snapshot::{Snapshot, human};

/// Every check, in the order an operator asks the questions.
pub fn run_all(snap: &Snapshot) -> Vec<Finding> {
    vec![
        nodes::uninitialized_taint(snap),
        nodes::network_deadlock(snap),
        ccm::ccm_pods(snap),
        workload::ccm_workload(snap),
        ccm::leader_election(snap),
        ccm::kcm_cloud_provider(snap),
        nodes::kubelet_cloud_provider(snap),
        nodes::node_metadata(snap),
        nodes::node_network(snap),
        services::lb_pending(snap),
        services::lb_local_endpoints(snap),
        services::external_ips(snap),
        routes::route_syncs(snap),
    ]
}

/// Evidence lists stay readable: at most this many lines, then a count.
const MAX_LINES: usize = 10;

fn list_some(lines: impl IntoIterator<Item = String>) -> Vec<String> {
    let all: Vec<String> = lines.into_iter().collect();
    let mut out: Vec<String> = all.iter().take(MAX_LINES).cloned().collect();
    if all.len() > MAX_LINES {
        out.push(format!("… and {} more", all.len() - MAX_LINES));
    }
    out
}

/// Folds "node X: same text" lines into one line per text, in first-seen order, so a thousand
/// nodes stuck the same way read as one line.
fn group_nodes<'a>(items: impl IntoIterator<Item = (&'a str, String)>) -> Vec<String> {
    let mut groups: Vec<(String, Vec<&str>)> = Vec::new();
    for (node, text) in items {
        match groups.iter_mut().find(|(t, _)| *t == text) {
            Some((_, names)) => names.push(node),
            None => groups.push((text, vec![node])),
        }
    }
    let lines = groups.into_iter().map(|(text, names)| match names.len() {
        1 => format!("node {}: {text}", names[0]),
        n if n <= 3 => format!("nodes {}: {text}", names.join(", ")),
        n => format!("nodes {} and {} more: {text}", names[..3].join(", "), n - 3),
    });
    list_some(lines)
}

fn name(n: &Node) -> &str {
    n.metadata.name.as_deref().unwrap_or_default()
}

fn event_time(e: &Event) -> Option<jiff::Timestamp> {
    e.last_timestamp
        .as_ref()
        .map(|t| t.0)
        .or(e.event_time.as_ref().map(|t| t.0))
        .or(e.first_timestamp.as_ref().map(|t| t.0))
        .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// Events about one object, newest first.
fn events_for<'a>(snap: &'a Snapshot, kind: &str, ns: &str, name: &str) -> Vec<&'a Event> {
    let Ok(events) = &snap.events else {
        return Vec::new();
    };
    let mut out: Vec<&Event> = events
        .iter()
        .filter(|e| {
            let o = &e.involved_object;
            o.kind.as_deref() == Some(kind)
                && o.name.as_deref() == Some(name)
                && o.namespace.as_deref().unwrap_or_default() == ns
        })
        .collect();
    out.sort_by_key(|e| std::cmp::Reverse(event_time(e)));
    out
}

fn event_line(snap: &Snapshot, e: &Event) -> String {
    let when = event_time(e)
        .map(|t| human(snap.since(Some(t))))
        .unwrap_or_else(|| "?".into());
    format!(
        "{} {} ({} ago{}): {}",
        e.type_.as_deref().unwrap_or("Normal"),
        e.reason.as_deref().unwrap_or_default(),
        when,
        match e.count {
            Some(c) if c > 1 => format!(", ×{c}"),
            _ => String::new(),
        },
        e.message.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests;
