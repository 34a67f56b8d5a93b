//! Server-side apply (`PATCH` with `application/apply-patch+yaml`), after structured-merge-diff:
//! the applied configuration is merged into the live object (associative lists by their keys),
//! fields the manager applied before and no longer applies are removed when nobody else owns
//! them, and a change to a field another manager owns is a 409 unless `force` takes it.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::managed::{self, Diff, Entry, ListType, Path, Set, Walker};
use crate::resources::ResourceDesc;
use crate::status::ApiError;
use crate::store::{Endpoint, now_rfc3339};

/// One apply request.
pub struct Apply<'a> {
    /// `fieldManager` (required).
    pub manager: &'a str,
    /// `force=true`: take the conflicting fields.
    pub force: bool,
    /// Main resource or `/status`.
    pub endpoint: Endpoint,
}

/// Whether a `Content-Type` is an apply patch (`application/apply-patch+yaml`; kubectl and
/// client-go send JSON under it, which is YAML too).
pub fn is_apply(content_type: &str) -> bool {
    let base = content_type.split(';').next().unwrap_or_default().trim();
    matches!(
        base,
        "application/apply-patch+yaml" | "application/apply-patch+json"
    )
}

/// Decodes an apply body (YAML or JSON) and checks what kube-apiserver checks before merging.
pub fn parse_config(desc: &ResourceDesc, body: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_yaml_ng::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "error decoding YAML: the applied configuration is not an object",
        ));
    }
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or_default();
    let api_version = v
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if kind != desc.kind || api_version != desc.api_version() {
        return Err(ApiError::bad_request(format!(
            "the apply configuration's apiVersion/kind ({api_version:?}, {kind:?}) does not match {}, {}",
            desc.api_version(),
            desc.kind
        )));
    }
    if v.pointer("/metadata/managedFields")
        .is_some_and(|m| !m.is_null())
    {
        return Err(ApiError::bad_request("metadata.managedFields must be nil"));
    }
    let mut v = v;
    match v.get("metadata") {
        None | Some(Value::Null) => v["metadata"] = json!({}),
        Some(Value::Object(_)) => {}
        Some(_) => {
            return Err(ApiError::bad_request(
                "error decoding YAML: metadata: expected an object",
            ));
        }
    }
    Ok(v)
}

fn find_item(lt: ListType, items: &[Value], elem: &str) -> Option<usize> {
    items.iter().position(|it| match lt {
        ListType::Set => format!("v:{it}") == elem,
        ListType::Map(keys) => managed::item_key(keys, it).as_deref() == Some(elem),
        ListType::Atomic => false,
    })
}

fn dotted(path: &[String]) -> String {
    path.iter()
        .filter_map(|e| e.strip_prefix("f:"))
        .collect::<Vec<_>>()
        .join(".")
}

/// Merges the applied `cfg` into `live` at `path`.
fn merge(desc: &ResourceDesc, live: &mut Value, cfg: &Value, path: &mut Path) {
    match (live, cfg) {
        (Value::Object(l), Value::Object(c)) if path.is_empty() || granular_map(desc, path) => {
            for (k, cv) in c {
                if cv.is_null() {
                    l.remove(k);
                    continue;
                }
                path.push(format!("f:{k}"));
                match l.get_mut(k) {
                    Some(lv) => merge(desc, lv, cv, path),
                    None => {
                        l.insert(k.clone(), cv.clone());
                    }
                }
                path.pop();
            }
        }
        (Value::Array(l), Value::Array(c))
            if managed::list_type(desc, &dotted(path)) != ListType::Atomic =>
        {
            let lt = managed::list_type(desc, &dotted(path));
            for it in c {
                let elem = match lt {
                    ListType::Set => Some(format!("v:{it}")),
                    ListType::Map(keys) => managed::item_key(keys, it),
                    ListType::Atomic => None,
                };
                match elem.and_then(|e| find_item(lt, l, &e)) {
                    Some(i) if lt != ListType::Set => merge(desc, &mut l[i], it, path),
                    Some(_) => {}
                    None => l.push(it.clone()),
                }
            }
        }
        (l, c) => *l = c.clone(),
    }
}

fn granular_map(desc: &ResourceDesc, path: &[String]) -> bool {
    let mut probe = Set::new();
    // An atomic map is one member; a granular one is not (its fields are).
    Walker::new(desc).to_set(&json!({"x": 1}), path, &mut probe);
    !probe.contains(path)
}

/// Removes the field at `path` from `obj` (nothing when absent).
fn remove_path(desc: &ResourceDesc, obj: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = obj;
    for (i, e) in parents.iter().enumerate() {
        let next = match (cur, e.strip_prefix("f:")) {
            (Value::Object(m), Some(f)) => m.get_mut(f),
            (Value::Array(items), None) => {
                let lt = managed::list_type(desc, &dotted(&path[..i]));
                find_item(lt, items, e).and_then(|j| items.get_mut(j))
            }
            _ => None,
        };
        let Some(n) = next else { return };
        cur = n;
    }
    match (cur, last.strip_prefix("f:")) {
        (Value::Object(m), Some(f)) => {
            m.remove(f);
        }
        (Value::Array(items), None) => {
            let lt = managed::list_type(desc, &dotted(parents));
            if let Some(j) = find_item(lt, items, last) {
                items.remove(j);
            }
        }
        _ => {}
    }
}

fn conflict_error(conflicts: &[(String, Path)]) -> ApiError {
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|(m, p)| {
            json!({"reason": "FieldManagerConflict", "message": format!("conflict with {m}"),
                   "field": managed::path_string(p)})
        })
        .collect();
    let message = if let [(m, p)] = conflicts {
        format!(
            "Apply failed with 1 conflict: conflict with {m}: {}",
            managed::path_string(p)
        )
    } else {
        let mut lines = Vec::new();
        let managers: BTreeSet<&String> = conflicts.iter().map(|(m, _)| m).collect();
        for m in managers {
            lines.push(format!("conflicts with {m}:"));
            for (_, p) in conflicts.iter().filter(|(mm, _)| mm == m) {
                lines.push(format!("- {}", managed::path_string(p)));
            }
        }
        format!(
            "Apply failed with {} conflicts: {}",
            conflicts.len(),
            lines.join("\n")
        )
    };
    ApiError::apply_conflict(message, causes)
}

/// The object after applying `cfg` as `req.manager` to `live` (None: the object is created),
/// with its `managedFields`; a 409 lists conflicts with other managers unless forced.
pub fn apply(
    desc: &ResourceDesc,
    live: Option<&Value>,
    cfg: &Value,
    req: &Apply,
) -> Result<Value, ApiError> {
    let walker = Walker::new(desc);
    let sub = managed::subresource(req.endpoint);
    let mut entries = live.map(managed::decode).unwrap_or_default();
    let mut applied = Set::new();
    walker.to_set(cfg, &[], &mut applied);
    managed::strip(desc, req.endpoint, &mut applied);
    let mut merged = live.cloned().unwrap_or_else(|| json!({}));
    merge(desc, &mut merged, cfg, &mut Vec::new());
    let own = entries.iter().position(|e| e.is(req.manager, "Apply", sub));
    if let Some(i) = own {
        let others: Set = entries
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .flat_map(|(_, e)| e.set.iter().cloned())
            .chain(applied.iter().cloned())
            .collect();
        let dropped: Vec<Path> = entries[i]
            .set
            .iter()
            .filter(|p| !others.iter().any(|o| o.starts_with(p)))
            .cloned()
            .collect();
        for p in dropped.iter().rev() {
            remove_path(desc, &mut merged, p);
        }
    }
    let mut d = Diff::default();
    walker.compare(live, Some(&merged), &[], &mut d);
    managed::strip(desc, req.endpoint, &mut d.changed);
    managed::strip(desc, req.endpoint, &mut d.removed);
    let mut conflicts = Vec::new();
    for (j, e) in entries.iter().enumerate() {
        if Some(j) != own {
            conflicts.extend(
                e.set
                    .intersection(&d.changed)
                    .map(|p| (e.describe(), p.clone())),
            );
        }
    }
    if !req.force && !conflicts.is_empty() {
        conflicts.sort();
        return Err(conflict_error(&conflicts));
    }
    for (j, e) in entries.iter_mut().enumerate() {
        if Some(j) != own {
            e.set
                .retain(|p| !d.changed.contains(p) && !d.removed.contains(p));
        }
    }
    let i = own.unwrap_or_else(|| {
        entries.push(Entry {
            manager: req.manager.to_string(),
            operation: "Apply".into(),
            api_version: desc.api_version(),
            time: None,
            subresource: sub.into(),
            set: Set::new(),
        });
        entries.len() - 1
    });
    if entries[i].set != applied || entries[i].time.is_none() {
        entries[i].time = Some(now_rfc3339());
    }
    entries[i].set = applied;
    entries[i].api_version = desc.api_version();
    managed::encode(&mut merged, entries);
    Ok(merged)
}
