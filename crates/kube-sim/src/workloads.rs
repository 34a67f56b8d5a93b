//! apps/v1 Deployments and DaemonSets, policy/v1 PodDisruptionBudgets: the defaults and the
//! validation kube-apiserver applies, so `kubectl apply --dry-run=server` of a CCM's manifests
//! fails here where it would fail on a real cluster and echoes the defaulted object.
//!
//! Covered: `SetDefaults_Deployment` / `_DaemonSet` and the pod template's `SetDefaults_PodSpec`,
//! container, port and probe defaults; selector presence, immutability and agreement with the
//! template's labels; containers with names and images; `restartPolicy: Always`;
//! PodDisruptionBudget's minAvailable/maxUnavailable exclusivity. Not covered: the rest of
//! PodSpec validation (volumes, resources quantities, securityContext fields).

use serde_json::{Map, Value, json};

use crate::kinds::KindCtx;
use crate::status::FieldError;

/// Go's "unset": a missing or null field, or the empty string a Go string field holds when
/// nobody set it. Clients built on client-go send those empty strings (protobuf always writes
/// non-pointer string fields; JSON writes them unless `omitempty`), and kube-apiserver's
/// `SetDefaults_*` functions test `== ""`, so `kubectl create deployment` arrives with
/// `restartPolicy: ""` and leaves with `Always`.
fn unset(v: Option<&Value>) -> bool {
    v.is_none_or(|v| v.is_null() || v.as_str() == Some(""))
}

fn default(obj: &mut Map<String, Value>, key: &str, v: Value) {
    if unset(obj.get(key)) {
        obj.insert(key.into(), v);
    }
}

/// `strategy` / `updateStrategy`: an empty or typeless strategy becomes `RollingUpdate`, and a
/// rolling update gets its missing bounds, as `SetDefaults_Deployment` / `_DaemonSet` do.
fn default_strategy(spec: &mut Map<String, Value>, key: &str, bounds: &Value) {
    default(spec, key, json!({}));
    let Some(s) = spec.get_mut(key).and_then(Value::as_object_mut) else {
        return;
    };
    default(s, "type", json!("RollingUpdate"));
    if s.get("type").and_then(Value::as_str) != Some("RollingUpdate") {
        return;
    }
    default(s, "rollingUpdate", json!({}));
    if let (Some(ru), Some(b)) = (
        s.get_mut("rollingUpdate").and_then(Value::as_object_mut),
        bounds.as_object(),
    ) {
        for (k, v) in b {
            default(ru, k, v.clone());
        }
    }
}

fn obj_at<'a>(v: &'a mut Value, key: &str) -> Option<&'a mut Map<String, Value>> {
    v.get_mut(key).and_then(Value::as_object_mut)
}

fn default_probe(p: &mut Value) {
    let Some(m) = p.as_object_mut() else { return };
    default(m, "timeoutSeconds", json!(1));
    default(m, "periodSeconds", json!(10));
    default(m, "successThreshold", json!(1));
    default(m, "failureThreshold", json!(3));
    if let Some(h) = obj_at(p, "httpGet") {
        default(h, "scheme", json!("HTTP"));
    }
}

fn default_container(c: &mut Value) {
    let Some(m) = c.as_object_mut() else { return };
    default(m, "terminationMessagePath", json!("/dev/termination-log"));
    default(m, "terminationMessagePolicy", json!("File"));
    let image = m.get("image").and_then(Value::as_str).unwrap_or_default();
    let tag = image
        .rsplit('/')
        .next()
        .and_then(|last| last.split_once(':'));
    let policy = match tag {
        _ if image.contains('@') => "IfNotPresent",
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    };
    default(m, "imagePullPolicy", json!(policy));
    for port in m
        .get_mut("ports")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if let Some(p) = port.as_object_mut() {
            default(p, "protocol", json!("TCP"));
        }
    }
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        if let Some(p) = m.get_mut(probe) {
            default_probe(p);
        }
    }
}

/// `SetDefaults_PodSpec` and what it implies for containers and volumes.
fn default_pod_spec(spec: &mut Value) {
    let Some(m) = spec.as_object_mut() else {
        return;
    };
    default(m, "restartPolicy", json!("Always"));
    default(m, "dnsPolicy", json!("ClusterFirst"));
    default(m, "terminationGracePeriodSeconds", json!(30));
    default(m, "securityContext", json!({}));
    default(m, "schedulerName", json!("default-scheduler"));
    for key in ["containers", "initContainers"] {
        for c in m
            .get_mut(key)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            default_container(c);
        }
    }
    for v in m
        .get_mut("volumes")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if let Some(s) = obj_at(v, "secret") {
            default(s, "defaultMode", json!(420));
        }
        if let Some(h) = obj_at(v, "hostPath") {
            default(h, "type", json!(""));
        }
    }
}

fn default_template(obj: &mut Value) {
    if let Some(spec) = obj.pointer_mut("/spec/template/spec") {
        default_pod_spec(spec);
    }
}

fn go_map(v: &Value) -> String {
    let pairs: Vec<String> = v
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k:?}:{:?}", v.as_str().unwrap_or_default()))
        .collect();
    format!("map[string]string{{{}}}", pairs.join(", "))
}

fn validate_template(ctx: &KindCtx, obj: &Value, errs: &mut Vec<FieldError>) {
    let selector = obj.pointer("/spec/selector");
    let labels = obj
        .pointer("/spec/template/metadata/labels")
        .cloned()
        .unwrap_or(json!({}));
    match selector
        .and_then(|s| s.get("matchLabels"))
        .and_then(Value::as_object)
    {
        None if selector.and_then(|s| s.get("matchExpressions")).is_none() => {
            errs.push(FieldError::required("spec.selector", ""));
        }
        Some(ml) if ml.iter().any(|(k, v)| labels.get(k) != Some(v)) => {
            errs.push(FieldError::invalid(
                "spec.template.metadata.labels",
                &json!(go_map(&labels)),
                "`selector` does not match template `labels`",
            ));
        }
        _ => {}
    }
    if let Some(old) = ctx.old
        && old.pointer("/spec/selector") != selector
    {
        errs.push(FieldError::invalid(
            "spec.selector",
            selector.unwrap_or(&Value::Null),
            "field is immutable",
        ));
    }
    let containers = obj
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array);
    match containers {
        None => errs.push(FieldError::required("spec.template.spec.containers", "")),
        Some(cs) if cs.is_empty() => {
            errs.push(FieldError::required("spec.template.spec.containers", ""));
        }
        Some(cs) => {
            for (i, c) in cs.iter().enumerate() {
                for f in ["name", "image"] {
                    if c.get(f).and_then(Value::as_str).is_none_or(str::is_empty) {
                        errs.push(FieldError::required(
                            format!("spec.template.spec.containers[{i}].{f}"),
                            "",
                        ));
                    }
                }
            }
        }
    }
    if let Some(rp) = obj.pointer("/spec/template/spec/restartPolicy")
        && rp != "Always"
    {
        errs.push(FieldError::not_supported(
            "spec.template.spec.restartPolicy",
            rp,
            &["Always"],
        ));
    }
}

/// apps/v1 Deployment.
pub fn deployment(ctx: &KindCtx, obj: &mut Value, errs: &mut Vec<FieldError>) {
    if let Some(spec) = obj_at(obj, "spec") {
        default(spec, "replicas", json!(1));
        default(spec, "revisionHistoryLimit", json!(10));
        default(spec, "progressDeadlineSeconds", json!(600));
        default_strategy(
            spec,
            "strategy",
            &json!({"maxUnavailable": "25%", "maxSurge": "25%"}),
        );
    }
    if obj
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .is_some_and(|r| r < 0)
    {
        errs.push(FieldError::invalid(
            "spec.replicas",
            &obj["spec"]["replicas"],
            "must be greater than or equal to 0",
        ));
    }
    default_template(obj);
    validate_template(ctx, obj, errs);
}

/// apps/v1 DaemonSet.
pub fn daemonset(ctx: &KindCtx, obj: &mut Value, errs: &mut Vec<FieldError>) {
    if let Some(spec) = obj_at(obj, "spec") {
        default(spec, "revisionHistoryLimit", json!(10));
        default_strategy(
            spec,
            "updateStrategy",
            &json!({"maxUnavailable": 1, "maxSurge": 0}),
        );
    }
    default_template(obj);
    validate_template(ctx, obj, errs);
}

/// policy/v1 PodDisruptionBudget.
pub fn pdb(obj: &Value, errs: &mut Vec<FieldError>) {
    let spec = obj.get("spec");
    let set = |k: &str| spec.and_then(|s| s.get(k)).is_some_and(|v| !v.is_null());
    if set("minAvailable") && set("maxUnavailable") {
        errs.push(FieldError::invalid(
            "spec",
            spec.unwrap_or(&Value::Null),
            "minAvailable and maxUnavailable cannot be both set",
        ));
    }
}
