//! OpenAPI v3 schemas of the served kinds, from upstream's definitions as k8s-openapi carries
//! them (its `schemars` feature is generated from kube-apiserver's published spec, so names,
//! types and descriptions are upstream's). What that output lacks is added here:
//! `x-kubernetes-group-version-kind` on each kind and the list-type extensions of
//! [`crate::managed::list_type`]. The documents are built once per process and served as bytes.
//! They also answer `fieldValidation=Strict` (unknown fields).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use bytes::Bytes;
use k8s_openapi::api::{
    admissionregistration::v1 as admission, apps::v1 as apps, coordination::v1 as coordination,
    core::v1 as core, discovery::v1 as discovery, events::v1 as events, policy::v1 as policy,
    rbac::v1 as rbac,
};
use schemars::{JsonSchema, SchemaGenerator, generate::SchemaSettings};
use serde_json::{Map, Value, json};

use crate::managed::{self, ListType};
use crate::resources::{RESOURCES, ResourceDesc};

fn register<T: JsonSchema>(g: &mut SchemaGenerator) -> String {
    g.subschema_for::<T>();
    T::schema_name().into_owned()
}

/// The definition name of a served kind, registering it (and what it references) in `g`.
fn kind_schema(g: &mut SchemaGenerator, d: &ResourceDesc) -> Option<String> {
    Some(match (d.group, d.kind) {
        ("", "Node") => register::<core::Node>(g),
        ("", "Service") => register::<core::Service>(g),
        ("", "Namespace") => register::<core::Namespace>(g),
        ("", "ConfigMap") => register::<core::ConfigMap>(g),
        ("", "Secret") => register::<core::Secret>(g),
        ("", "ServiceAccount") => register::<core::ServiceAccount>(g),
        ("", "Event") => register::<core::Event>(g),
        ("", "Pod") => register::<core::Pod>(g),
        ("", "Endpoints") => register::<core::Endpoints>(g),
        ("", "PersistentVolume") => register::<core::PersistentVolume>(g),
        ("coordination.k8s.io", "Lease") => register::<coordination::Lease>(g),
        ("events.k8s.io", "Event") => register::<events::Event>(g),
        ("discovery.k8s.io", "EndpointSlice") => register::<discovery::EndpointSlice>(g),
        ("rbac.authorization.k8s.io", "ClusterRole") => register::<rbac::ClusterRole>(g),
        ("rbac.authorization.k8s.io", "ClusterRoleBinding") => {
            register::<rbac::ClusterRoleBinding>(g)
        }
        ("rbac.authorization.k8s.io", "Role") => register::<rbac::Role>(g),
        ("rbac.authorization.k8s.io", "RoleBinding") => register::<rbac::RoleBinding>(g),
        ("apps", "Deployment") => register::<apps::Deployment>(g),
        ("apps", "DaemonSet") => register::<apps::DaemonSet>(g),
        ("apps", "ReplicaSet") => register::<apps::ReplicaSet>(g),
        ("policy", "PodDisruptionBudget") => register::<policy::PodDisruptionBudget>(g),
        ("admissionregistration.k8s.io", "MutatingWebhookConfiguration") => {
            register::<admission::MutatingWebhookConfiguration>(g)
        }
        ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration") => {
            register::<admission::ValidatingWebhookConfiguration>(g)
        }
        ("flowcontrol.apiserver.k8s.io", "FlowSchema") => {
            register::<k8s_openapi::api::flowcontrol::v1::FlowSchema>(g)
        }
        ("flowcontrol.apiserver.k8s.io", "PriorityLevelConfiguration") => {
            register::<k8s_openapi::api::flowcontrol::v1::PriorityLevelConfiguration>(g)
        }
        _ => return None,
    })
}

/// Dotted paths that may hold associative or set lists (see [`managed::list_type`]).
const LIST_PATHS: &[&str] = &[
    "metadata.finalizers",
    "metadata.ownerReferences",
    "status.conditions",
    "spec.podCIDRs",
    "status.addresses",
    "spec.ports",
    "secrets",
];
const POD_SPEC_LISTS: &[&str] = &[
    "containers",
    "initContainers",
    "ephemeralContainers",
    "volumes",
    "imagePullSecrets",
    "resourceClaims",
    "schedulingGates",
    "containers.ports",
    "initContainers.ports",
    "containers.env",
    "initContainers.env",
    "containers.volumeMounts",
    "initContainers.volumeMounts",
    "hostAliases",
    "topologySpreadConstraints",
];

fn ref_name(s: &Value) -> Option<&str> {
    s.get("$ref")?
        .as_str()?
        .strip_prefix("#/components/schemas/")
}

/// The definition a property refers to: `$ref`, or `allOf: [{$ref}]` as OpenAPI v3 writes a
/// reference with a description beside it.
fn target(prop: &Value) -> Option<&str> {
    ref_name(prop).or_else(|| prop.get("allOf")?.get(0).and_then(ref_name))
}

/// Sets the list-type extensions on the property at `path` below definition `root`.
fn annotate(defs: &mut Map<String, Value>, root: &str, path: &[&str], lt: ListType) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = root.to_string();
    for p in parents {
        let Some(prop) = defs
            .get(&cur)
            .and_then(|d| d.pointer(&format!("/properties/{p}")))
        else {
            return;
        };
        let next = target(prop).or_else(|| prop.get("items").and_then(target));
        let Some(next) = next else { return };
        cur = next.to_string();
    }
    let Some(Value::Object(prop)) = defs
        .get_mut(&cur)
        .and_then(|d| d.pointer_mut(&format!("/properties/{last}")))
    else {
        return;
    };
    match lt {
        ListType::Set => {
            prop.insert("x-kubernetes-list-type".into(), json!("set"));
        }
        ListType::Map(keys) => {
            let names: Vec<&str> = keys.iter().map(|(k, _)| *k).collect();
            prop.insert("x-kubernetes-list-type".into(), json!("map"));
            prop.insert("x-kubernetes-list-map-keys".into(), json!(names));
        }
        ListType::Atomic => {}
    }
}

fn candidate_paths() -> Vec<String> {
    let mut out: Vec<String> = LIST_PATHS.iter().map(|p| (*p).to_string()).collect();
    for prefix in ["spec.", "spec.template.spec."] {
        out.extend(POD_SPEC_LISTS.iter().map(|p| format!("{prefix}{p}")));
    }
    out
}

/// The schemas of every served kind, keyed by definition name, and each kind's name.
struct Schemas {
    defs: Map<String, Value>,
    roots: BTreeMap<(&'static str, &'static str), String>,
}

fn build() -> Schemas {
    let mut g = SchemaSettings::openapi3().into_generator();
    let mut roots = BTreeMap::new();
    for d in RESOURCES.iter() {
        if let Some(name) = kind_schema(&mut g, d) {
            roots.insert((d.group, d.kind), name);
        }
    }
    let mut defs = g.take_definitions(true);
    let paths = candidate_paths();
    for d in RESOURCES.iter() {
        let Some(root) = roots.get(&(d.group, d.kind)) else {
            continue;
        };
        if let Some(Value::Object(s)) = defs.get_mut(root) {
            s.insert(
                "x-kubernetes-group-version-kind".into(),
                json!([{"group": d.group, "version": d.version, "kind": d.kind}]),
            );
        }
        for p in &paths {
            let lt = managed::list_type(d, p);
            if lt != ListType::Atomic {
                let parts: Vec<&str> = p.split('.').collect();
                annotate(&mut defs, root, &parts, lt);
            }
        }
    }
    Schemas { defs, roots }
}

fn schemas() -> &'static Schemas {
    static S: OnceLock<Schemas> = OnceLock::new();
    S.get_or_init(build)
}

/// The referenced definitions reachable from `name`, into `out`.
fn collect(defs: &Map<String, Value>, name: &str, out: &mut Map<String, Value>) {
    if out.contains_key(name) {
        return;
    }
    let Some(d) = defs.get(name) else { return };
    out.insert(name.to_string(), d.clone());
    let mut refs = Vec::new();
    find_refs(d, &mut refs);
    for r in refs {
        collect(defs, &r, out);
    }
}

fn find_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(r) = ref_name(v) {
                out.push(r.to_string());
            }
            m.values().for_each(|c| find_refs(c, out));
        }
        Value::Array(a) => a.iter().for_each(|c| find_refs(c, out)),
        _ => {}
    }
}

/// `components.schemas` for the kinds of one group-version path (`api/v1`, `apis/apps/v1`).
pub fn components(gv: &str, gv_path: impl Fn(&str, &str) -> String) -> Value {
    let s = schemas();
    let mut out = Map::new();
    for d in RESOURCES
        .iter()
        .filter(|d| gv_path(d.group, d.version) == gv)
    {
        if let Some(root) = s.roots.get(&(d.group, d.kind)) {
            collect(&s.defs, root, &mut out);
        }
    }
    Value::Object(out)
}

/// A cache of serialized documents by key, built on first use.
pub fn cached(key: &str, build: impl FnOnce() -> Option<Value>) -> Option<Bytes> {
    static DOCS: OnceLock<parking_lot::Mutex<BTreeMap<String, Option<Bytes>>>> = OnceLock::new();
    let docs = DOCS.get_or_init(Default::default);
    if let Some(b) = docs.lock().get(key) {
        return b.clone();
    }
    let b = build().map(|v| Bytes::from(serde_json::to_vec(&v).unwrap_or_default()));
    docs.lock().insert(key.to_string(), b.clone());
    b
}

/// The first field of `obj` that the schema of `d` does not know (`spec.foo`), for
/// `fieldValidation=Strict`.
pub fn unknown_field(d: &ResourceDesc, obj: &Value) -> Option<String> {
    let s = schemas();
    let root = s.roots.get(&(d.group, d.kind))?;
    let schema = s.defs.get(root)?;
    walk(&s.defs, schema, obj, "")
}

fn resolve<'a>(defs: &'a Map<String, Value>, schema: &'a Value) -> &'a Value {
    target(schema).and_then(|n| defs.get(n)).unwrap_or(schema)
}

fn walk(defs: &Map<String, Value>, schema: &Value, v: &Value, path: &str) -> Option<String> {
    let schema = resolve(defs, schema);
    let join = |k: &str| {
        if path.is_empty() {
            k.to_string()
        } else {
            format!("{path}.{k}")
        }
    };
    match v {
        Value::Object(m) => {
            if let Some(Value::Object(props)) = schema.get("properties") {
                for (k, cv) in m {
                    let Some(ps) = props.get(k) else {
                        return Some(join(k));
                    };
                    if let Some(u) = walk(defs, ps, cv, &join(k)) {
                        return Some(u);
                    }
                }
            } else if let Some(ap) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                for (k, cv) in m {
                    if let Some(u) = walk(defs, ap, cv, &join(k)) {
                        return Some(u);
                    }
                }
            }
            None
        }
        Value::Array(items) => {
            let is = schema.get("items")?;
            items
                .iter()
                .enumerate()
                .find_map(|(i, it)| walk(defs, is, it, &format!("{path}[{i}]")))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::ids;

    #[test]
    fn node_and_service_schemas_carry_gvk_and_list_types() {
        let s = schemas();
        let node = &s.defs["io.k8s.api.core.v1.Node"];
        assert_eq!(
            node["x-kubernetes-group-version-kind"],
            json!([{"group": "", "version": "v1", "kind": "Node"}])
        );
        let spec = &s.defs["io.k8s.api.core.v1.NodeSpec"];
        assert_eq!(
            spec["properties"]["podCIDRs"]["x-kubernetes-list-type"],
            "set"
        );
        let ports = &s.defs["io.k8s.api.core.v1.ServiceSpec"]["properties"]["ports"];
        assert_eq!(
            ports["x-kubernetes-list-map-keys"],
            json!(["port", "protocol"])
        );
        let c = &s.defs["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"];
        assert_eq!(c["x-kubernetes-list-map-keys"], json!(["name"]));
    }

    #[test]
    fn strict_validation_names_the_unknown_field() {
        let svc = &RESOURCES[ids::SERVICES];
        let ok = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a", "labels": {"x": "y"}},
                        "spec": {"ports": [{"port": 80, "targetPort": "http"}]}});
        assert_eq!(unknown_field(svc, &ok), None);
        let bad = json!({"spec": {"ports": [{"port": 80, "bogus": 1}]}});
        assert_eq!(
            unknown_field(svc, &bad).as_deref(),
            Some("spec.ports[0].bogus")
        );
    }
}
