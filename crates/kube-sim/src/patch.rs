//! Three of the four patch types kube-apiserver accepts (server-side apply is `crate::apply`).
//!
//! Strategic merge patch is the one clients lean on most (kubectl, client-go's
//! `PatchNodeStatus`, the cloud-provider node controller), and its list semantics depend on
//! struct tags of the Go types; [`crate::resources::ResourceDesc::patch_lists`] carries those
//! tags for the fields of the kinds served here. Lists without a tag are replaced, as upstream.

use serde_json::{Map, Value};

use crate::resources::{ListStrategy, ResourceDesc};
use crate::status::ApiError;

/// The patch content types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// RFC 6902 (`application/json-patch+json`).
    Json,
    /// RFC 7386 (`application/merge-patch+json`).
    Merge,
    /// Kubernetes strategic merge patch (`application/strategic-merge-patch+json`).
    Strategic,
}

impl PatchType {
    /// Maps a `Content-Type` to a patch type; `Err` carries the 415 for anything else.
    pub fn from_content_type(ct: &str) -> Result<Self, ApiError> {
        let base = ct.split(';').next().unwrap_or_default().trim();
        match base {
            "application/json-patch+json" => Ok(Self::Json),
            "application/merge-patch+json" => Ok(Self::Merge),
            "application/strategic-merge-patch+json" => Ok(Self::Strategic),
            other => Err(ApiError::unsupported_media_type(other)),
        }
    }
}

/// Applies a patch body to a copy of `current`.
pub fn apply(
    desc: &ResourceDesc,
    current: &Value,
    ty: PatchType,
    body: &[u8],
) -> Result<Value, ApiError> {
    let mut doc = current.clone();
    match ty {
        PatchType::Json => {
            let p: json_patch::Patch = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            json_patch::patch(&mut doc, &p).map_err(ApiError::patch_failed)?;
        }
        PatchType::Merge => {
            let p: Value = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            json_patch::merge(&mut doc, &p);
        }
        PatchType::Strategic => {
            let p: Value = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            let Value::Object(pm) = p else {
                return Err(ApiError::bad_request(
                    "unable to find api field in struct for the patch: patch must be a JSON object",
                ));
            };
            let Value::Object(dm) = &mut doc else {
                return Err(ApiError::internal("stored object is not a map"));
            };
            merge_map(desc, dm, pm, "").map_err(ApiError::patch_failed)?;
        }
    }
    Ok(doc)
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Strategic merge of `patch` into `orig`, in place.
fn merge_map(
    desc: &ResourceDesc,
    orig: &mut Map<String, Value>,
    mut patch: Map<String, Value>,
    path: &str,
) -> Result<(), String> {
    if let Some(d) = patch.remove("$patch") {
        match d.as_str() {
            Some("replace") => {
                *orig = patch;
                strip_directives(orig);
                return Ok(());
            }
            Some("delete") => {
                orig.clear();
                return Ok(());
            }
            Some("merge") | None => {}
            Some(other) => return Err(format!("Unknown patch type: {other}")),
        }
    }
    if let Some(keep) = patch.remove("$retainKeys") {
        let keep: Vec<String> = keep
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        orig.retain(|k, _| keep.contains(k));
    }
    // Directive keys first, so a delete-from-list and a list merge on the same key compose.
    let keys: Vec<String> = patch.keys().cloned().collect();
    for k in &keys {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let Some(v) = patch.remove(k) else { continue };
            let del: Vec<Value> = v.as_array().cloned().unwrap_or_default();
            if let Some(Value::Array(list)) = orig.get_mut(field) {
                list.retain(|x| !del.contains(x));
            }
        } else if k.starts_with("$setElementOrder/") {
            // Only orders the merged list upstream; accepted and ignored here.
            patch.remove(k);
        }
    }
    for (k, pv) in patch {
        let p = join(path, &k);
        match pv {
            Value::Null => {
                orig.remove(&k);
            }
            Value::Object(pm) => match orig.get_mut(&k) {
                Some(Value::Object(om)) => merge_map(desc, om, pm, &p)?,
                _ => {
                    let mut fresh = Map::new();
                    merge_map(desc, &mut fresh, pm, &p)?;
                    orig.insert(k, Value::Object(fresh));
                }
            },
            Value::Array(items) => {
                let merged = match (desc.list_strategy(&p), orig.remove(&k)) {
                    (Some(ListStrategy::MergeByKey(key)), Some(Value::Array(o))) => {
                        merge_keyed(desc, o, items, key, &p)?
                    }
                    (Some(ListStrategy::MergePrimitives), Some(Value::Array(mut o))) => {
                        if let Some(r) = list_replace(&items) {
                            r
                        } else {
                            for it in items {
                                if !o.contains(&it) {
                                    o.push(it);
                                }
                            }
                            o
                        }
                    }
                    (Some(ListStrategy::MergeByKey(key)), _) => {
                        merge_keyed(desc, Vec::new(), items, key, &p)?
                    }
                    _ => {
                        let mut items = list_replace(&items).unwrap_or(items);
                        for it in &mut items {
                            if let Value::Object(m) = it {
                                strip_directives(m);
                            }
                        }
                        items
                    }
                };
                orig.insert(k, Value::Array(merged));
            }
            scalar => {
                orig.insert(k, scalar);
            }
        }
    }
    Ok(())
}

/// A `{"$patch": "replace"}` element turns the list into a replacement of the other elements.
fn list_replace(items: &[Value]) -> Option<Vec<Value>> {
    let is_replace = |v: &Value| {
        v.get("$patch").and_then(Value::as_str) == Some("replace")
            && v.as_object().is_some_and(|m| m.len() == 1)
    };
    if items.iter().any(is_replace) {
        Some(items.iter().filter(|v| !is_replace(v)).cloned().collect())
    } else {
        None
    }
}

fn strip_directives(m: &mut Map<String, Value>) {
    m.retain(|k, _| !k.starts_with('$'));
    for v in m.values_mut() {
        if let Value::Object(inner) = v {
            strip_directives(inner);
        }
    }
}

fn merge_keyed(
    desc: &ResourceDesc,
    mut orig: Vec<Value>,
    items: Vec<Value>,
    key: &str,
    path: &str,
) -> Result<Vec<Value>, String> {
    if let Some(r) = list_replace(&items) {
        return Ok(r);
    }
    for it in items {
        let Value::Object(mut pm) = it else {
            return Err(format!(
                "unable to merge list {path}: element is not a map but merge key {key:?} is set"
            ));
        };
        let kv = pm.get(key).cloned();
        let Some(kv) = kv else {
            return Err(format!(
                "map: {pm:?} does not contain declared merge key: {key}"
            ));
        };
        let pos = orig.iter().position(|o| o.get(key) == Some(&kv));
        let directive = pm.get("$patch").and_then(Value::as_str).map(String::from);
        match (directive.as_deref(), pos) {
            (Some("delete"), Some(i)) => {
                orig.remove(i);
            }
            (Some("delete"), None) => {}
            (Some("replace"), Some(i)) => {
                pm.remove("$patch");
                strip_directives(&mut pm);
                orig[i] = Value::Object(pm);
            }
            (_, Some(i)) => {
                if let Value::Object(om) = &mut orig[i] {
                    merge_map(desc, om, pm, path)?;
                }
            }
            (_, None) => {
                let mut fresh = Map::new();
                merge_map(desc, &mut fresh, pm, path)?;
                orig.push(Value::Object(fresh));
            }
        }
    }
    Ok(orig)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{RESOURCES, ids};
    use serde_json::json;

    fn smp(cur: Value, p: Value) -> Value {
        apply(
            &RESOURCES[ids::NODES],
            &cur,
            PatchType::Strategic,
            p.to_string().as_bytes(),
        )
        .unwrap()
    }

    #[test]
    fn conditions_merge_by_type() {
        let cur = json!({"status": {"conditions": [
            {"type": "Ready", "status": "False"}, {"type": "DiskPressure", "status": "False"}]}});
        let out = smp(
            cur,
            json!({"status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "X", "status": "Unknown"}]}}),
        );
        assert_eq!(
            out,
            json!({"status": {"conditions": [
                {"type": "Ready", "status": "True"}, {"type": "DiskPressure", "status": "False"},
                {"type": "X", "status": "Unknown"}]}})
        );
    }

    #[test]
    fn finalizers_set_and_delete_from_primitive_list() {
        let cur = json!({"metadata": {"finalizers": ["a", "b"]}});
        let out = smp(cur.clone(), json!({"metadata": {"finalizers": ["b", "c"]}}));
        assert_eq!(out, json!({"metadata": {"finalizers": ["a", "b", "c"]}}));
        let out = smp(
            cur,
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"], "$setElementOrder/finalizers": ["b"]}}),
        );
        assert_eq!(out, json!({"metadata": {"finalizers": ["b"]}}));
    }

    #[test]
    fn delete_and_replace_directives() {
        let cur = json!({"status": {"addresses": [{"type": "InternalIP", "address": "1"}, {"type": "Hostname", "address": "h"}]},
                         "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}});
        let out = smp(
            cur.clone(),
            json!({"status": {"addresses": [{"type": "Hostname", "$patch": "delete"}]},
                   "spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]}}),
        );
        assert_eq!(
            out,
            json!({"status": {"addresses": [{"type": "InternalIP", "address": "1"}]},
                   "spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]}})
        );
        let out = smp(
            cur,
            json!({"status": {"addresses": [{"$patch": "replace"}, {"type": "ExternalIP", "address": "2"}]}}),
        );
        assert_eq!(
            out["status"]["addresses"],
            json!([{"type": "ExternalIP", "address": "2"}])
        );
    }

    #[test]
    fn map_replace_and_null() {
        let cur = json!({"metadata": {"labels": {"a": "1", "b": "2"}}});
        assert_eq!(
            smp(cur.clone(), json!({"metadata": {"labels": {"a": null}}})),
            json!({"metadata": {"labels": {"b": "2"}}})
        );
        assert_eq!(
            smp(
                cur,
                json!({"metadata": {"labels": {"$patch": "replace", "c": "3"}}})
            ),
            json!({"metadata": {"labels": {"c": "3"}}})
        );
    }

    #[test]
    fn json_patch_test_failure_is_422() {
        let err = apply(
            &RESOURCES[ids::NODES],
            &json!({"a": 1}),
            PatchType::Json,
            br#"[{"op":"test","path":"/a","value":2}]"#,
        )
        .unwrap_err();
        assert_eq!(err.code, 422);
    }
}
