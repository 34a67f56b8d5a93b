//! Field ownership (`metadata.managedFields`) as kube-apiserver's field manager keeps it.
//!
//! A field set is a set of paths; each path element is written as in `fieldsV1`
//! (`f:name`, `k:{"type":"Ready"}`, `v:"10.0.0.0/24"`, `i:0`). Which lists are associative
//! (`x-kubernetes-list-type: map` and its keys) or sets, and which maps are atomic, comes from
//! [`list_type`]. Every write records an entry: `Update` for create/update/patch (the manager
//! takes the fields it changed, others lose them), `Apply` for server-side apply
//! (`crate::apply`).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use crate::resources::ResourceDesc;
use crate::store::{Endpoint, now_rfc3339};

/// One path in a field set, as `fieldsV1` keys.
pub type Path = Vec<String>;
/// A set of owned fields.
pub type Set = BTreeSet<Path>;

/// How the schema treats a list or map at a dotted field path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListType {
    /// Replaced whole; owned as one field.
    Atomic,
    /// `x-kubernetes-list-type: set`: items are scalars, owned one by one.
    Set,
    /// `x-kubernetes-list-type: map` with these `x-kubernetes-list-map-keys`; a key missing
    /// from an item takes the default given here (e.g. `protocol` → `TCP`).
    Map(&'static [(&'static str, Option<&'static str>)]),
}

const NAME: &[(&str, Option<&str>)] = &[("name", None)];
const TYPE: &[(&str, Option<&str>)] = &[("type", None)];

/// Lists of a PodSpec, relative to the PodSpec (upstream `+listType`/`+listMapKey` markers).
fn pod_spec_list(rel: &str) -> Option<ListType> {
    Some(match rel {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "imagePullSecrets"
        | "resourceClaims"
        | "schedulingGates" => ListType::Map(NAME),
        "containers.ports" | "initContainers.ports" => {
            ListType::Map(&[("containerPort", None), ("protocol", Some("TCP"))])
        }
        "containers.env" | "initContainers.env" => ListType::Map(NAME),
        "containers.volumeMounts" | "initContainers.volumeMounts" => {
            ListType::Map(&[("mountPath", None)])
        }
        "containers.volumeDevices" | "initContainers.volumeDevices" => {
            ListType::Map(&[("devicePath", None)])
        }
        "hostAliases" => ListType::Map(&[("ip", None)]),
        "topologySpreadConstraints" => {
            ListType::Map(&[("topologyKey", None), ("whenUnsatisfiable", None)])
        }
        _ => return None,
    })
}

/// The list type of the list at dotted path `p` of a `desc` object; lists not named here are
/// atomic, as lists without a `+listType` marker are.
pub fn list_type(desc: &ResourceDesc, p: &str) -> ListType {
    let known = match p {
        "metadata.finalizers" => Some(ListType::Set),
        "metadata.ownerReferences" => Some(ListType::Map(&[("uid", None)])),
        "status.conditions" => Some(ListType::Map(TYPE)),
        _ => None,
    };
    if let Some(t) = known {
        return t;
    }
    let by_kind = match (desc.group, desc.plural) {
        ("", "nodes") => match p {
            "spec.podCIDRs" => Some(ListType::Set),
            "status.addresses" => Some(ListType::Map(TYPE)),
            _ => None,
        },
        ("", "services") => match p {
            "spec.ports" => Some(ListType::Map(&[("port", None), ("protocol", Some("TCP"))])),
            _ => None,
        },
        ("", "serviceaccounts") => (p == "secrets").then_some(ListType::Map(NAME)),
        ("", "pods") => p.strip_prefix("spec.").and_then(pod_spec_list),
        ("apps", _) => p
            .strip_prefix("spec.template.spec.")
            .and_then(pod_spec_list),
        _ => None,
    };
    by_kind.unwrap_or(ListType::Atomic)
}

/// Maps and structs that are replaced whole (`+mapType=atomic` / `+structType=atomic`).
fn atomic_map(desc: &ResourceDesc, p: &str) -> bool {
    match (desc.group, desc.plural, p) {
        ("", "services", "spec.selector") => true,
        ("apps" | "policy", _, "spec.selector") => true,
        ("rbac.authorization.k8s.io", _, "roleRef") => true,
        _ => p.ends_with("valueFrom.secretKeyRef") || p.ends_with("valueFrom.configMapKeyRef"),
    }
}

/// Walks objects with the schema facts of one kind.
pub struct Walker<'a> {
    desc: &'a ResourceDesc,
}

fn schema_path(path: &[String]) -> String {
    let mut out = String::new();
    for e in path {
        if let Some(f) = e.strip_prefix("f:") {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(f);
        }
    }
    out
}

fn child(path: &[String], elem: String) -> Path {
    let mut p = path.to_vec();
    p.push(elem);
    p
}

/// The `k:` element of an item of a map list, or `None` when a key without default is missing.
pub fn item_key(keys: &[(&str, Option<&str>)], item: &Value) -> Option<String> {
    let mut k = Map::new();
    for (name, default) in keys {
        let v = match (item.get(*name), default) {
            (Some(v), _) if !v.is_null() => v.clone(),
            (_, Some(d)) => json!(d),
            _ => return None,
        };
        k.insert((*name).to_string(), v);
    }
    Some(format!("k:{}", Value::Object(k)))
}

/// A list's items by their path element (items without a usable key are skipped).
fn list_items(lt: ListType, items: &[Value]) -> Vec<(String, &Value)> {
    items
        .iter()
        .filter_map(|it| {
            let e = match lt {
                ListType::Set => Some(format!("v:{it}")),
                ListType::Map(keys) => item_key(keys, it),
                ListType::Atomic => None,
            }?;
            Some((e, it))
        })
        .collect()
}

impl<'a> Walker<'a> {
    /// A walker for objects of `desc`.
    pub fn new(desc: &'a ResourceDesc) -> Self {
        Self { desc }
    }

    fn granular_list(&self, path: &[String]) -> Option<ListType> {
        match list_type(self.desc, &schema_path(path)) {
            ListType::Atomic => None,
            t => Some(t),
        }
    }

    fn granular_map(&self, path: &[String]) -> bool {
        !path.is_empty() && !atomic_map(self.desc, &schema_path(path))
    }

    /// The fields `v` at `path` sets (`ToFieldSet`): leaves, empty maps, nulls and list items.
    pub fn to_set(&self, v: &Value, path: &[String], out: &mut Set) {
        let is_item = path
            .last()
            .is_some_and(|e| e.starts_with("k:") || e.starts_with("v:"));
        match v {
            Value::Object(m) if path.is_empty() || self.granular_map(path) => {
                if m.is_empty() || is_item {
                    out.insert(path.to_vec());
                }
                for (k, cv) in m {
                    self.to_set(cv, &child(path, format!("f:{k}")), out);
                }
            }
            Value::Array(items) => match self.granular_list(path) {
                Some(lt) => {
                    for (e, it) in list_items(lt, items) {
                        self.to_set(it, &child(path, e), out);
                    }
                }
                None => {
                    out.insert(path.to_vec());
                }
            },
            _ => {
                out.insert(path.to_vec());
            }
        }
    }

    /// The fields that differ between `old` and `new` below `path`: `(added or modified, removed)`.
    pub fn compare(&self, old: Option<&Value>, new: Option<&Value>, path: &[String], d: &mut Diff) {
        if old == new {
            return;
        }
        match (old, new) {
            (Some(Value::Object(a)), Some(Value::Object(b)))
                if path.is_empty() || self.granular_map(path) =>
            {
                let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
                for k in keys {
                    self.compare(a.get(k), b.get(k), &child(path, format!("f:{k}")), d);
                }
            }
            (Some(Value::Array(a)), Some(Value::Array(b)))
                if self.granular_list(path).is_some() =>
            {
                let lt = self.granular_list(path).unwrap_or(ListType::Atomic);
                let a: BTreeMap<String, &Value> = list_items(lt, a).into_iter().collect();
                let b: BTreeMap<String, &Value> = list_items(lt, b).into_iter().collect();
                let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
                for k in keys {
                    let (x, y) = (a.get(k).copied(), b.get(k).copied());
                    self.compare(x, y, &child(path, k.clone()), d);
                }
            }
            (Some(_), Some(n)) => {
                d.changed.insert(path.to_vec());
                self.to_set(n, path, &mut d.changed);
            }
            (None, Some(n)) => {
                added_path(path, &mut d.changed);
                self.to_set(n, path, &mut d.changed);
            }
            (Some(o), None) => {
                added_path(path, &mut d.removed);
                self.to_set(o, path, &mut d.removed);
            }
            (None, None) => {}
        }
    }
}

/// A map that appears or disappears is itself a member of the change, except the top-level
/// `metadata`, `spec` and `status`, which exist in the zero value of every kind's Go type.
fn added_path(path: &[String], set: &mut Set) {
    let top = matches!(path, [one] if matches!(one.as_str(), "f:metadata" | "f:spec" | "f:status"));
    if !path.is_empty() && !top {
        set.insert(path.to_vec());
    }
}

/// What a write changed.
#[derive(Debug, Default)]
pub struct Diff {
    /// Fields added or given another value.
    pub changed: Set,
    /// Fields removed.
    pub removed: Set,
}

/// Top-level fields the field manager never records (`stripmeta`), and the half of the object
/// an endpoint resets (`status` on the main resource of kinds with a status subresource,
/// everything else on `/status`).
pub fn strip(desc: &ResourceDesc, endpoint: Endpoint, set: &mut Set) {
    const META: &[&str] = &[
        "name",
        "namespace",
        "creationTimestamp",
        "selfLink",
        "uid",
        "generation",
        "managedFields",
        "resourceVersion",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    ];
    set.retain(|p| {
        let top = p.first().map(String::as_str).unwrap_or_default();
        if matches!(top, "f:apiVersion" | "f:kind") || p.len() == 1 && top == "f:metadata" {
            return false;
        }
        if top == "f:metadata"
            && p.len() >= 2
            && META.iter().any(|m| p[1].strip_prefix("f:") == Some(*m))
        {
            return false;
        }
        match endpoint {
            Endpoint::Main => !(desc.status_subresource && top == "f:status"),
            Endpoint::Status => top == "f:status",
        }
    });
}

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// `manager`.
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: String,
    /// `apiVersion`.
    pub api_version: String,
    /// `time`.
    pub time: Option<String>,
    /// `subresource`, empty for the main resource.
    pub subresource: String,
    /// `fieldsV1`.
    pub set: Set,
}

impl Entry {
    /// Whether `self` is the entry of manager `m`, operation `op` on `sub`.
    pub fn is(&self, m: &str, op: &str, sub: &str) -> bool {
        self.manager == m && self.operation == op && self.subresource == sub
    }

    /// The manager as kube-apiserver names it in a conflict (`"m" using v1`, `"m"`).
    pub fn describe(&self) -> String {
        let mut s = format!("{:?}", self.manager);
        if !self.subresource.is_empty() {
            s = format!("{s} with subresource {:?}", self.subresource);
        }
        if self.operation == "Update" {
            s = format!("{s} using {}", self.api_version);
        }
        s
    }
}

fn decode_set(v: &Value, path: &mut Path, out: &mut Set) {
    let Value::Object(m) = v else { return };
    if !path.is_empty() && (m.is_empty() || m.contains_key(".")) {
        out.insert(path.clone());
    }
    for (k, cv) in m {
        if k != "." {
            path.push(k.clone());
            decode_set(cv, path, out);
            path.pop();
        }
    }
}

/// `fieldsV1` of a set: members with children carry `"."`.
pub fn encode_set(set: &Set) -> Value {
    fn insert(node: &mut Map<String, Value>, p: &[String]) {
        match p.split_first() {
            None => {
                node.insert(".".into(), json!({}));
            }
            Some((e, rest)) => {
                if let Value::Object(m) = node.entry(e.clone()).or_insert_with(|| json!({})) {
                    insert(m, rest);
                }
            }
        }
    }
    let mut root = Map::new();
    for p in set {
        insert(&mut root, p);
    }
    fn tidy(m: &mut Map<String, Value>) {
        for (k, v) in m.iter_mut() {
            if let Value::Object(c) = v {
                if k != "." && c.len() == 1 && c.contains_key(".") {
                    c.clear();
                } else {
                    tidy(c);
                }
            }
        }
    }
    tidy(&mut root);
    Value::Object(root)
}

/// The entries of an object's `metadata.managedFields` (malformed entries are dropped).
pub fn decode(obj: &Value) -> Vec<Entry> {
    let Some(Value::Array(list)) = obj.pointer("/metadata/managedFields") else {
        return Vec::new();
    };
    let s = |e: &Value, k: &str| e.get(k).and_then(Value::as_str).map(String::from);
    list.iter()
        .filter_map(|e| {
            let mut set = Set::new();
            decode_set(e.get("fieldsV1")?, &mut Vec::new(), &mut set);
            Some(Entry {
                manager: s(e, "manager").unwrap_or_default(),
                operation: s(e, "operation")?,
                api_version: s(e, "apiVersion").unwrap_or_default(),
                time: s(e, "time"),
                subresource: s(e, "subresource").unwrap_or_default(),
                set,
            })
        })
        .collect()
}

/// Writes `entries` to `obj` in kube-apiserver's order (operation, time, manager, subresource);
/// empty sets are dropped.
pub fn encode(obj: &mut Value, mut entries: Vec<Entry>) {
    entries.retain(|e| !e.set.is_empty());
    entries.sort_by(|a, b| {
        (&a.operation, &a.time, &a.manager, &a.subresource).cmp(&(
            &b.operation,
            &b.time,
            &b.manager,
            &b.subresource,
        ))
    });
    let list: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut m = Map::new();
            m.insert("manager".into(), json!(e.manager));
            m.insert("operation".into(), json!(e.operation));
            m.insert("apiVersion".into(), json!(e.api_version));
            if let Some(t) = &e.time {
                m.insert("time".into(), json!(t));
            }
            m.insert("fieldsType".into(), json!("FieldsV1"));
            m.insert("fieldsV1".into(), encode_set(&e.set));
            if !e.subresource.is_empty() {
                m.insert("subresource".into(), json!(e.subresource));
            }
            Value::Object(m)
        })
        .collect();
    if let Some(Value::Object(meta)) = obj.get_mut("metadata") {
        if list.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(list));
        }
    }
}

/// Who writes, for the `Update` entry of a create, update or non-apply patch.
#[derive(Debug, Clone)]
pub struct Writer {
    /// The field manager (`fieldManager`, else the User-Agent up to its first `/`).
    pub manager: String,
}

impl Writer {
    /// The manager name kube-apiserver uses: `fieldManager`, else the User-Agent's product.
    pub fn new(field_manager: Option<&str>, user_agent: Option<&str>) -> Self {
        let manager = match field_manager {
            Some(m) if !m.is_empty() => m.to_string(),
            _ => user_agent
                .unwrap_or_default()
                .split('/')
                .next()
                .unwrap_or_default()
                .chars()
                .take(128)
                .collect(),
        };
        Self { manager }
    }
}

/// The subresource name of an endpoint in `managedFields`.
pub fn subresource(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Main => "",
        Endpoint::Status => "status",
    }
}

/// Records an `Update` by `w` that turned `old` (None on create) into `new`: the manager gains
/// the fields it added or changed, every other manager loses them and the removed ones. The
/// entries start from `new`'s `managedFields` (the stored ones unless the write set them).
pub fn record_update(
    desc: &ResourceDesc,
    endpoint: Endpoint,
    old: Option<&Value>,
    new: &mut Value,
    w: &Writer,
) {
    let mut entries = decode(new);
    let walker = Walker::new(desc);
    let mut d = Diff::default();
    let zero = json!({});
    walker.compare(Some(old.unwrap_or(&zero)), Some(new), &[], &mut d);
    strip(desc, endpoint, &mut d.changed);
    strip(desc, endpoint, &mut d.removed);
    if d.changed.is_empty() && d.removed.is_empty() {
        encode(new, entries);
        return;
    }
    let sub = subresource(endpoint);
    for e in &mut entries {
        if !e.is(&w.manager, "Update", sub) {
            e.set
                .retain(|p| !d.changed.contains(p) && !d.removed.contains(p));
        }
    }
    let idx = match entries.iter().position(|e| e.is(&w.manager, "Update", sub)) {
        Some(i) => i,
        None => {
            entries.push(Entry {
                manager: w.manager.clone(),
                operation: "Update".into(),
                api_version: desc.api_version(),
                time: None,
                subresource: sub.into(),
                set: Set::new(),
            });
            entries.len() - 1
        }
    };
    let e = &mut entries[idx];
    let before = e.set.clone();
    e.set.retain(|p| !d.removed.contains(p));
    e.set.extend(d.changed);
    if e.set != before || e.time.is_none() {
        e.time = Some(now_rfc3339());
    }
    e.api_version = desc.api_version();
    encode(new, entries);
}

/// A path as kube-apiserver prints it in a conflict: `.spec.ports[port=80,protocol="TCP"].name`.
pub fn path_string(p: &Path) -> String {
    let mut s = String::new();
    for e in p {
        if let Some(f) = e.strip_prefix("f:") {
            s.push('.');
            s.push_str(f);
        } else if let Some(k) = e.strip_prefix("k:") {
            let parts: Vec<String> = serde_json::from_str::<Map<String, Value>>(k)
                .map(|m| m.iter().map(|(n, v)| format!("{n}={v}")).collect())
                .unwrap_or_default();
            s.push_str(&format!("[{}]", parts.join(",")));
        } else if let Some(v) = e.strip_prefix("v:") {
            s.push_str(&format!("[={v}]"));
        } else if let Some(i) = e.strip_prefix("i:") {
            s.push_str(&format!("[{i}]"));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{RESOURCES, ids};

    #[test]
    fn fields_v1_round_trip_and_member_markers() {
        let svc = json!({"metadata": {"labels": {"a": "1"}},
            "spec": {"ports": [{"port": 80, "name": "http"}], "selector": {"app": "x"}}});
        let w = Walker::new(&RESOURCES[ids::SERVICES]);
        let mut set = Set::new();
        w.to_set(&svc, &[], &mut set);
        let enc = encode_set(&set);
        assert_eq!(
            enc,
            json!({"f:metadata": {"f:labels": {"f:a": {}}},
                "f:spec": {"f:ports": {"k:{\"port\":80,\"protocol\":\"TCP\"}": {
                    ".": {}, "f:name": {}, "f:port": {}}}, "f:selector": {}}})
        );
        let mut back = Set::new();
        decode_set(&enc, &mut Vec::new(), &mut back);
        assert_eq!(back, set);
        let p: Path = vec![
            "f:spec".into(),
            "f:ports".into(),
            "k:{\"port\":80,\"protocol\":\"TCP\"}".into(),
            "f:name".into(),
        ];
        assert_eq!(
            path_string(&p),
            ".spec.ports[port=80,protocol=\"TCP\"].name"
        );
    }

    /// `{"a": {"b": [items]}}` for path `a.b`.
    fn at(path: &str, items: Value) -> Value {
        path.rsplit('.').fold(items, |v, k| json!({ k: v }))
    }

    /// How k8s-openapi's `DeepMerge` (generated from upstream's list-type extensions) merges
    /// two one-item lists at `path`: 2 items for map and set lists, 1 for atomic ones.
    fn upstream_len<T>(path: &str, a: Value, b: Value) -> usize
    where
        T: k8s_openapi::DeepMerge + serde::de::DeserializeOwned + serde::Serialize,
    {
        let mut x: T = serde_json::from_value(at(path, json!([a]))).expect("typed");
        let y: T = serde_json::from_value(at(path, json!([b]))).expect("typed");
        x.merge_from(y);
        let v = serde_json::to_value(&x).expect("json");
        let ptr = format!("/{}", path.replace('.', "/"));
        v.pointer(&ptr)
            .and_then(Value::as_array)
            .map_or(0, Vec::len)
    }

    #[test]
    fn list_types_agree_with_upstream_definitions() {
        use k8s_openapi::api::core::v1::{Node, Pod, Service};
        let node = &RESOURCES[ids::NODES];
        let svc = &RESOURCES[ids::SERVICES];
        let pod = RESOURCES.iter().find(|r| r.plural == "pods").expect("pods");
        let cases: Vec<(&ResourceDesc, &str, usize)> = vec![
            (
                node,
                "status.addresses",
                upstream_len::<Node>(
                    "status.addresses",
                    json!({"type": "InternalIP", "address": "10.0.0.1"}),
                    json!({"type": "Hostname", "address": "h"}),
                ),
            ),
            (
                node,
                "status.conditions",
                upstream_len::<Node>(
                    "status.conditions",
                    json!({"type": "Ready", "status": "True"}),
                    json!({"type": "X", "status": "False"}),
                ),
            ),
            (
                node,
                "spec.podCIDRs",
                upstream_len::<Node>("spec.podCIDRs", json!("10.0.0.0/24"), json!("fd00::/64")),
            ),
            (
                node,
                "spec.taints",
                upstream_len::<Node>(
                    "spec.taints",
                    json!({"key": "a", "effect": "NoSchedule"}),
                    json!({"key": "b", "effect": "NoSchedule"}),
                ),
            ),
            (
                node,
                "status.images",
                upstream_len::<Node>(
                    "status.images",
                    json!({"names": ["a"]}),
                    json!({"names": ["b"]}),
                ),
            ),
            (
                svc,
                "spec.ports",
                upstream_len::<Service>("spec.ports", json!({"port": 80}), json!({"port": 81})),
            ),
            (
                svc,
                "spec.clusterIPs",
                upstream_len::<Service>("spec.clusterIPs", json!("10.0.0.1"), json!("fd00::1")),
            ),
            (
                pod,
                "spec.containers",
                upstream_len::<Pod>(
                    "spec.containers",
                    json!({"name": "a"}),
                    json!({"name": "b"}),
                ),
            ),
            (
                pod,
                "spec.tolerations",
                upstream_len::<Pod>("spec.tolerations", json!({"key": "a"}), json!({"key": "b"})),
            ),
        ];
        for (desc, path, merged) in cases {
            let ours = if list_type(desc, path) == ListType::Atomic {
                1
            } else {
                2
            };
            assert_eq!(ours, merged, "{} {path}", desc.plural);
        }
    }

    #[test]
    fn update_moves_changed_fields_to_the_writer() {
        let desc = RESOURCES
            .iter()
            .find(|r| r.plural == "configmaps")
            .expect("configmaps");
        let mut v1 = json!({"metadata": {"name": "c"}, "data": {"a": "1", "b": "2"}});
        record_update(
            desc,
            Endpoint::Main,
            None,
            &mut v1,
            &Writer::new(Some("one"), None),
        );
        let mut v2 = json!({"metadata": {"name": "c", "managedFields": v1["metadata"]["managedFields"].clone()},
            "data": {"a": "9", "b": "2"}});
        record_update(
            desc,
            Endpoint::Main,
            Some(&v1),
            &mut v2,
            &Writer::new(None, Some("two/v1.0 (linux)")),
        );
        let e = decode(&v2);
        let one = e.iter().find(|e| e.manager == "one").expect("one");
        let two = e.iter().find(|e| e.manager == "two").expect("two");
        assert_eq!(
            encode_set(&one.set),
            json!({"f:data": {".": {}, "f:b": {}}})
        );
        assert_eq!(encode_set(&two.set), json!({"f:data": {"f:a": {}}}));
    }
}
