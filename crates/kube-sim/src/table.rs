//! Server-side printing (`meta.k8s.io/v1` Table), which `kubectl get` asks for.
//!
//! kubectl renders whatever columns the server sends, so the columns here follow the real
//! server's printers for the kinds people look at (nodes, services, namespaces, leases, core
//! events) and fall back
//! to Name + Age elsewhere.

use serde_json::{Value, json};

use crate::resources::ids;

fn col(name: &str, ty: &str, format: &str, priority: i32) -> Value {
    json!({"name": name, "type": ty, "format": format, "description": "", "priority": priority})
}

fn columns(res: usize) -> Vec<Value> {
    match res {
        ids::NODES => vec![
            col("Name", "string", "name", 0),
            col("Status", "string", "", 0),
            col("Roles", "string", "", 0),
            col("Age", "string", "", 0),
            col("Version", "string", "", 0),
            col("Internal-IP", "string", "", 1),
            col("External-IP", "string", "", 1),
        ],
        ids::SERVICES => vec![
            col("Name", "string", "name", 0),
            col("Type", "string", "", 0),
            col("Cluster-IP", "string", "", 0),
            col("External-IP", "string", "", 0),
            col("Port(s)", "string", "", 0),
            col("Age", "string", "", 0),
            col("Selector", "string", "", 1),
        ],
        ids::NAMESPACES => vec![
            col("Name", "string", "name", 0),
            col("Status", "string", "", 0),
            col("Age", "string", "", 0),
        ],
        ids::LEASES => vec![
            col("Name", "string", "name", 0),
            col("Holder", "string", "", 0),
            col("Age", "string", "", 0),
        ],
        ids::EVENTS => vec![
            col("Last Seen", "string", "", 0),
            col("Type", "string", "", 0),
            col("Reason", "string", "", 0),
            col("Object", "string", "", 0),
            col("Subobject", "string", "", 1),
            col("Source", "string", "", 1),
            col("Message", "string", "", 0),
            col("First Seen", "string", "", 1),
            col("Count", "string", "", 1),
            col("Name", "string", "name", 1),
        ],
        _ => vec![
            col("Name", "string", "name", 0),
            col("Age", "string", "", 0),
        ],
    }
}

/// `duration.HumanDuration` from apimachinery.
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    if secs < 0 {
        return "0s".into();
    }
    let (m, h) = (secs / 60, secs / 3600);
    if secs < 120 {
        format!("{secs}s")
    } else if m < 10 {
        if secs % 60 == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{}s", secs % 60)
        }
    } else if m < 180 {
        format!("{m}m")
    } else if h < 8 {
        if m % 60 == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{}m", m % 60)
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 24 * 8 {
        if h % 24 == 0 {
            format!("{}d", h / 24)
        } else {
            format!("{}d{}h", h / 24, h % 24)
        }
    } else if h < 24 * 365 * 2 {
        format!("{}d", h / 24)
    } else if h < 24 * 365 * 8 {
        format!("{}y{}d", h / 24 / 365, (h / 24) % 365)
    } else {
        format!("{}y", h / 24 / 365)
    }
}

fn age(obj: &Value) -> String {
    since(obj, "/metadata/creationTimestamp")
}

/// How long ago the timestamp at `pointer` was, as kubectl prints ages.
fn since(obj: &Value, pointer: &str) -> String {
    let ts = obj
        .pointer(pointer)
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<jiff::Timestamp>().ok());
    match ts {
        Some(t) => human_duration(jiff::Timestamp::now().as_second() - t.as_second()),
        None => "<unknown>".into(),
    }
}

fn str_at<'a>(obj: &'a Value, p: &str) -> &'a str {
    obj.pointer(p).and_then(Value::as_str).unwrap_or_default()
}

fn or_none(s: String) -> String {
    if s.is_empty() { "<none>".into() } else { s }
}

fn node_cells(obj: &Value) -> Vec<Value> {
    let ready = obj
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .map(|c| match c["status"].as_str() {
            Some("True") => "Ready",
            Some("False") => "NotReady",
            _ => "Unknown",
        })
        .unwrap_or("Unknown");
    let mut status = ready.to_string();
    if obj.pointer("/spec/unschedulable") == Some(&Value::Bool(true)) {
        status.push_str(",SchedulingDisabled");
    }
    let roles: Vec<&str> = obj
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|l| {
            l.keys()
                .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                .collect()
        })
        .unwrap_or_default();
    let addr = |ty: &str| {
        obj.pointer("/status/addresses")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().find(|x| x["type"] == ty))
            .and_then(|x| x["address"].as_str())
            .unwrap_or("<none>")
            .to_string()
    };
    vec![
        json!(str_at(obj, "/metadata/name")),
        json!(status),
        json!(or_none(roles.join(","))),
        json!(age(obj)),
        json!(str_at(obj, "/status/nodeInfo/kubeletVersion")),
        json!(addr("InternalIP")),
        json!(addr("ExternalIP")),
    ]
}

fn service_cells(obj: &Value) -> Vec<Value> {
    let ty = str_at(obj, "/spec/type");
    let ingress: Vec<String> = obj
        .pointer("/status/loadBalancer/ingress")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|i| i["ip"].as_str().or(i["hostname"].as_str()))
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    let external = if !ingress.is_empty() {
        ingress.join(",")
    } else if ty == "LoadBalancer" {
        "<pending>".into()
    } else if ty == "ExternalName" {
        str_at(obj, "/spec/externalName").to_string()
    } else {
        "<none>".into()
    };
    let ports: Vec<String> = obj
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|p| {
                    let proto = p["protocol"].as_str().unwrap_or("TCP");
                    match p.get("nodePort").and_then(Value::as_u64) {
                        Some(np) => format!("{}:{np}/{proto}", p["port"]),
                        None => format!("{}/{proto}", p["port"]),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    let selector: Vec<String> = obj
        .pointer("/spec/selector")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    vec![
        json!(str_at(obj, "/metadata/name")),
        json!(ty),
        json!(or_none(str_at(obj, "/spec/clusterIP").to_string())),
        json!(external),
        json!(or_none(ports.join(","))),
        json!(age(obj)),
        json!(or_none(selector.join(","))),
    ]
}

/// The real server's event printer: times fall back from `lastTimestamp` to `eventTime`
/// (events.k8s.io writers set only that) and to creation.
fn event_cells(obj: &Value) -> Vec<Value> {
    let first_set = |ps: &[&str]| {
        ps.iter()
            .copied()
            .find(|p| {
                obj.pointer(p)
                    .and_then(Value::as_str)
                    .is_some_and(|s| !s.is_empty())
            })
            .map(|p| since(obj, p))
            .unwrap_or_else(|| "<unknown>".into())
    };
    let last = first_set(&[
        "/series/lastObservedTime",
        "/lastTimestamp",
        "/eventTime",
        "/metadata/creationTimestamp",
    ]);
    let first = first_set(&[
        "/firstTimestamp",
        "/eventTime",
        "/metadata/creationTimestamp",
    ]);
    let object = format!(
        "{}/{}",
        str_at(obj, "/involvedObject/kind").to_lowercase(),
        str_at(obj, "/involvedObject/name")
    );
    let mut source = str_at(obj, "/source/component").to_string();
    if source.is_empty() {
        source = str_at(obj, "/reportingComponent").to_string();
    }
    let host = str_at(obj, "/source/host");
    if !host.is_empty() {
        source = format!("{source}, {host}");
    }
    let count = obj
        .pointer("/series/count")
        .or_else(|| obj.get("count"))
        .and_then(Value::as_i64)
        .unwrap_or(1);
    vec![
        json!(last),
        json!(str_at(obj, "/type")),
        json!(str_at(obj, "/reason")),
        json!(object),
        json!(str_at(obj, "/involvedObject/fieldPath")),
        json!(source),
        json!(str_at(obj, "/message").trim()),
        json!(first),
        json!(count.to_string()),
        json!(str_at(obj, "/metadata/name")),
    ]
}

fn cells(res: usize, obj: &Value) -> Vec<Value> {
    match res {
        ids::NODES => node_cells(obj),
        ids::SERVICES => service_cells(obj),
        ids::EVENTS => event_cells(obj),
        ids::NAMESPACES => vec![
            json!(str_at(obj, "/metadata/name")),
            json!(str_at(obj, "/status/phase")),
            json!(age(obj)),
        ],
        ids::LEASES => vec![
            json!(str_at(obj, "/metadata/name")),
            json!(str_at(obj, "/spec/holderIdentity")),
            json!(age(obj)),
        ],
        _ => vec![json!(str_at(obj, "/metadata/name")), json!(age(obj))],
    }
}

/// What a Table row embeds (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    /// No object.
    None,
    /// `PartialObjectMetadata` (the default).
    Metadata,
    /// The whole object.
    Object,
}

fn row(res: usize, obj: &Value, inc: IncludeObject) -> Value {
    let mut r = json!({"cells": cells(res, obj)});
    match inc {
        IncludeObject::None => {}
        IncludeObject::Metadata => {
            r["object"] = json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
            })
        }
        IncludeObject::Object => r["object"] = obj.clone(),
    }
    r
}

/// A Table of `objs`.
pub fn table(
    res: usize,
    objs: &[&Value],
    rv: Option<String>,
    cont: Option<String>,
    inc: IncludeObject,
) -> Value {
    let mut meta = serde_json::Map::new();
    if let Some(rv) = rv {
        meta.insert("resourceVersion".into(), Value::String(rv));
    }
    if let Some(c) = cont {
        meta.insert("continue".into(), Value::String(c));
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": columns(res),
        "rows": objs.iter().map(|o| row(res, o, inc)).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::human_duration;

    #[test]
    fn durations() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(150), "2m30s");
        assert_eq!(human_duration(3600), "60m");
        assert_eq!(human_duration(5 * 3600), "5h");
        assert_eq!(human_duration(50 * 3600), "2d2h");
    }
}
