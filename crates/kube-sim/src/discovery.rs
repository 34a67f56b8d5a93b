//! Discovery documents: what kubectl and kube-rs read to map kinds to URLs.
//!
//! Plain (non-aggregated) discovery only: clients that prefer aggregated discovery fall back
//! to it when the server answers with a plain `APIGroupList`, as kube-apiserver before 1.26 did.

use serde_json::{Value, json};

use crate::resources::{self, RESOURCES};
use crate::review::Review;

/// The Kubernetes version the simulator claims (matches the k8s-openapi feature of the workspace).
pub const KUBE_MINOR: &str = "36";

/// `/version`.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": KUBE_MINOR,
        "emulationMajor": "1",
        "emulationMinor": KUBE_MINOR,
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "35",
        "gitVersion": format!("v1.{KUBE_MINOR}.0-kube-sim"),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `/api`.
pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn group_entry(g: &str, v: &str) -> Value {
    let gv = json!({"groupVersion": format!("{g}/{v}"), "version": v});
    json!({"name": g, "versions": [gv.clone()], "preferredVersion": gv})
}

/// Every group-version under `/apis`: the stored kinds' groups, then the groups of the
/// create-only reviews (which kubectl's `auth can-i` / `auth whoami` reach through them).
fn served_groups() -> Vec<(&'static str, &'static str)> {
    let mut out = resources::groups();
    for r in Review::ALL {
        let (g, _) = r.resource();
        if !out.iter().any(|(gg, _)| *gg == g) {
            out.push((g, "v1"));
        }
    }
    out
}

/// Whether `/apis/{group}/{version}` has a resource list.
pub fn serves(group: &str, version: &str) -> bool {
    served_groups()
        .iter()
        .any(|(g, v)| *g == group && *v == version)
}

/// `/apis`.
pub fn api_group_list() -> Value {
    let groups: Vec<Value> = served_groups()
        .iter()
        .map(|(g, v)| group_entry(g, v))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/{group}`.
pub fn api_group(g: &str) -> Option<Value> {
    let (g, v) = served_groups().into_iter().find(|(gg, _)| *gg == g)?;
    let mut e = group_entry(g, v);
    e["kind"] = json!("APIGroup");
    e["apiVersion"] = json!("v1");
    Some(e)
}

/// `/api/v1` and `/apis/{group}/{version}`.
pub fn resource_list(group: &str, version: &str) -> Value {
    let mut out = Vec::new();
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let mut e = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
        });
        if !r.short_names.is_empty() {
            e["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            e["categories"] = json!(r.categories);
        }
        out.push(e);
        if r.status_subresource {
            out.push(json!({
                "name": format!("{}/status", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        if r.group == "apps" && matches!(r.plural, "deployments" | "replicasets") {
            out.push(json!({
                "name": format!("{}/scale", r.plural),
                "singularName": "",
                "namespaced": true,
                "group": "autoscaling",
                "version": "v1",
                "kind": "Scale",
                "verbs": ["get", "patch", "update"],
            }));
        }
        if r.plural == "serviceaccounts" {
            out.push(json!({
                "name": "serviceaccounts/token",
                "singularName": "",
                "namespaced": true,
                "group": "authentication.k8s.io",
                "version": "v1",
                "kind": "TokenRequest",
                "verbs": ["create"],
            }));
        }
    }
    if version == "v1" {
        out.extend(
            Review::ALL
                .into_iter()
                .filter(|r| r.resource().0 == group)
                .map(|r| {
                    json!({
                        "name": r.resource().1,
                        "singularName": r.kind().to_lowercase(),
                        "namespaced": false,
                        "kind": r.kind(),
                        "verbs": ["create"],
                    })
                }),
        );
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": out})
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: the index of per-group-version documents.
///
/// Served so that kubectl's field-validation probe finds `fieldValidation` on PATCH and skips
/// client-side schema validation (which would need the full schema this server does not have).
pub fn openapi_v3_index() -> Value {
    let mut paths = serde_json::Map::new();
    let mut gvs: Vec<(&str, &str)> = vec![("", "v1")];
    gvs.extend(resources::groups());
    for (g, v) in gvs {
        let p = gv_path(g, v);
        paths.insert(
            p.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash=kube-sim-{KUBE_MINOR}")}),
        );
    }
    json!({ "paths": paths })
}

/// `/openapi/v3/{api/v1 | apis/g/v}`: PATCH operations tagged with their kinds and the
/// `fieldValidation` parameter, and the kinds' schemas (`crate::openapi`). The request bodies
/// omit the strategic-merge content type, so `kubectl apply` computes its patch from its
/// compiled-in types (which carry the real merge keys and directives).
pub fn openapi_v3_doc(gv: &str) -> Option<Value> {
    let mut paths = serde_json::Map::new();
    let mut found = false;
    for r in RESOURCES.iter() {
        if gv_path(r.group, r.version) != gv {
            continue;
        }
        found = true;
        let base = format!("/{gv}");
        let item = if r.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}/{{name}}", r.plural)
        } else {
            format!("{base}/{}/{{name}}", r.plural)
        };
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let params = json!([
            {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
        ]);
        let body = json!({"content": {
            "application/json-patch+json": {"schema": {"type": "object"}},
            "application/merge-patch+json": {"schema": {"type": "object"}},
        }, "required": true});
        paths.insert(
            item,
            json!({
                "patch": {
                    "operationId": format!("patch{}", r.kind),
                    "parameters": params,
                    "requestBody": body,
                    "responses": {"200": {"description": "OK"}},
                    "x-kubernetes-action": "patch",
                    "x-kubernetes-group-version-kind": gvk,
                }
            }),
        );
    }
    found.then(|| {
        json!({
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": format!("v1.{KUBE_MINOR}.0")},
            "paths": paths,
            "components": {"schemas": crate::openapi::components(gv, gv_path)},
        })
    })
}
