//! The `scale` subresource of Deployments and ReplicaSets (`autoscaling/v1` Scale): what
//! `kubectl scale` and the HorizontalPodAutoscaler read and write instead of the whole object.
//!
//! A Scale is a view: reading builds it from the object (`spec.replicas`, `status.replicas`,
//! `spec.selector` as a selector string); writing changes only the object's `spec.replicas`,
//! with the Scale's `resourceVersion`/`uid` as preconditions, as kube-apiserver's scale REST does.

use serde_json::{Value, json};

use crate::Verb;
use crate::patch::{self, PatchType};
use crate::resources::{RESOURCES, ResourceDesc};
use crate::status::{ApiError, FieldError};
use crate::store::{Endpoint, Store};

/// Whether kind `res` has a scale subresource.
pub(crate) fn scalable(res: usize) -> bool {
    RESOURCES
        .get(res)
        .is_some_and(|d| d.group == "apps" && matches!(d.plural, "deployments" | "replicasets"))
}

/// The Scale kind, for error wording and discovery.
pub(crate) const SCALE: ResourceDesc = ResourceDesc {
    group: "autoscaling",
    version: "v1",
    plural: "scale",
    singular: "",
    kind: "Scale",
    namespaced: true,
    short_names: &[],
    status_subresource: false,
    has_spec: true,
    fields: &[],
    patch_lists: &[],
    categories: &[],
};

/// The `autoscaling/v1` Scale of a stored Deployment or ReplicaSet.
pub(crate) fn to_scale(obj: &Value) -> Value {
    let m = |k: &str| obj.pointer(&format!("/metadata/{k}")).cloned();
    let mut meta = serde_json::Map::new();
    for k in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        if let Some(v) = m(k) {
            meta.insert(k.into(), v);
        }
    }
    let replicas = |p: &str| obj.pointer(p).and_then(Value::as_i64).unwrap_or(0);
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": meta,
        "spec": {"replicas": replicas("/spec/replicas")},
        "status": {
            "replicas": replicas("/status/replicas"),
            "selector": selector_string(obj.pointer("/spec/selector")),
        },
    })
}

/// `metav1.FormatLabelSelector`: `a=b,c in (d,e),!f`, keys sorted as `labels.Selector` sorts.
fn selector_string(sel: Option<&Value>) -> String {
    let Some(sel) = sel else {
        return String::new();
    };
    let mut parts: Vec<(String, String)> = Vec::new();
    if let Some(ml) = sel.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in ml {
            parts.push((k.clone(), format!("{k}={}", v.as_str().unwrap_or_default())));
        }
    }
    for e in sel
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let key = e.get("key").and_then(Value::as_str).unwrap_or_default();
        let mut vals: Vec<&str> = e
            .get("values")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        vals.sort_unstable();
        let text = match e
            .get("operator")
            .and_then(Value::as_str)
            .unwrap_or_default()
        {
            "In" => format!("{key} in ({})", vals.join(",")),
            "NotIn" => format!("{key} notin ({})", vals.join(",")),
            "Exists" => key.to_string(),
            "DoesNotExist" => format!("!{key}"),
            _ => continue,
        };
        parts.push((key.to_string(), text));
    }
    parts.sort_by(|a, b| a.0.cmp(&b.0));
    parts
        .into_iter()
        .map(|(_, t)| t)
        .collect::<Vec<_>>()
        .join(",")
}

/// How a write reaches the scale subresource.
pub(crate) enum Write<'a> {
    /// PUT of a whole Scale.
    Update(&'a [u8]),
    /// PATCH of the Scale view.
    Patch(PatchType, &'a [u8]),
}

/// The object after a write to its Scale: only `spec.replicas` changes, and the Scale's
/// `resourceVersion` / `uid` become preconditions the store checks.
pub(crate) fn apply(res: usize, current: &Value, write: &Write<'_>) -> Result<Value, ApiError> {
    let scale = match write {
        Write::Update(body) => serde_json::from_slice::<Value>(body).map_err(|e| {
            ApiError::bad_request(format!("the object provided is unrecognized: {e}"))
        })?,
        Write::Patch(ty, body) => patch::apply(&RESOURCES[res], &to_scale(current), *ty, body)?,
    };
    let replicas = scale.pointer("/spec/replicas");
    let n = match replicas {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_i64()
            .filter(|n| *n >= 0)
            .ok_or_else(|| invalid(&scale, v))?,
    };
    let mut out = current.clone();
    out["spec"]["replicas"] = json!(n);
    for k in ["resourceVersion", "uid"] {
        match scale.pointer(&format!("/metadata/{k}")) {
            Some(v) if !v.is_null() => out["metadata"][k] = v.clone(),
            _ => {}
        }
    }
    Ok(out)
}

/// 422 as kube-apiserver words a bad Scale.
fn invalid(scale: &Value, got: &Value) -> ApiError {
    let name = scale
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    ApiError::invalid(
        &SCALE,
        name,
        &[FieldError::invalid(
            "spec.replicas",
            got,
            "must be greater than or equal to 0",
        )],
    )
}

/// Serves `GET`, `PUT` and `PATCH` of `{deployments,replicasets}/{name}/scale`; the answer is
/// the Scale after the write.
pub(crate) fn serve(
    store: &Store,
    verb: Verb,
    res: usize,
    (ns, name): (&str, &str),
    body: &[u8],
    content_type: &str,
    dry_run: bool,
) -> Result<Value, ApiError> {
    let write = match verb {
        Verb::Get => return Ok(to_scale(&*store.get(res, ns, name)?)),
        Verb::Update => Write::Update(body),
        Verb::Patch => Write::Patch(PatchType::from_content_type(content_type)?, body),
        other => return Err(ApiError::method_not_supported(&SCALE, other.as_str())),
    };
    let out = store.update_opts(
        res,
        ns,
        name,
        Endpoint::Main,
        &mut |cur| apply(res, cur, &write),
        dry_run,
    )?;
    Ok(to_scale(&out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deploy() -> Value {
        json!({"metadata": {"name": "web", "namespace": "default", "uid": "u", "resourceVersion": "7"},
               "spec": {"replicas": 2, "selector": {"matchLabels": {"tier": "fe", "app": "web"},
                 "matchExpressions": [{"key": "env", "operator": "In", "values": ["prod", "dev"]}]}},
               "status": {"replicas": 1}})
    }

    #[test]
    fn scale_view_of_a_deployment() {
        let s = to_scale(&deploy());
        assert_eq!(s["spec"]["replicas"], 2);
        assert_eq!(s["status"]["replicas"], 1);
        assert_eq!(s["status"]["selector"], "app=web,env in (dev,prod),tier=fe");
        assert_eq!(s["metadata"]["resourceVersion"], "7");
    }

    #[test]
    fn writes_change_replicas_only_and_refuse_negative() {
        let d = deploy();
        let deployments = crate::resources::ids::DEPLOYMENTS;
        let out = apply(
            deployments,
            &d,
            &Write::Patch(PatchType::Merge, br#"{"spec":{"replicas":5}}"#),
        )
        .expect("patch");
        assert_eq!(out["spec"]["replicas"], 5);
        assert_eq!(out["spec"]["selector"], d["spec"]["selector"]);
        assert_eq!(out["status"], d["status"]);
        let e = apply(
            deployments,
            &d,
            &Write::Update(br#"{"spec":{"replicas":-1}}"#),
        );
        assert_eq!(e.err().map(|e| e.code), Some(422));
    }
}
