//! Per-kind defaulting, allocation and validation, as kube-apiserver's registry strategies do.
//!
//! Only what this project reads and writes is modelled: Service defaults and ClusterIP/NodePort
//! allocation (the service controller reads them), Node pod CIDRs / taints / providerID (the
//! node and route controllers write them), Lease fields (leader election), object names and
//! label syntax. Each message is worded as upstream's `field.Error`.

use std::collections::HashSet;
use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::{Map, Value, json};

use crate::resources::{ResourceDesc, ids};
use crate::status::{ApiError, FieldError};
use crate::store::Endpoint;

/// The context of one write.
pub struct KindCtx<'a> {
    /// Resource id.
    pub res: usize,
    /// Its descriptor.
    pub desc: &'static ResourceDesc,
    /// The stored object for updates.
    pub old: Option<&'a Value>,
    /// Which endpoint the write came through.
    pub endpoint: Endpoint,
}

/// ClusterIP and NodePort bookkeeping, like the apiserver's allocators. Cloned for dry runs,
/// so what a dry run allocates is never taken from the real pools.
#[derive(Clone)]
pub struct Allocator {
    cidrs: Vec<IpNet>,
    node_ports: (u16, u16),
    used_ips: HashSet<IpAddr>,
    used_ports: HashSet<u16>,
}

impl Allocator {
    /// An allocator over the service CIDRs (one per family) and NodePort range.
    pub fn new(cidrs: Vec<IpNet>, node_ports: (u16, u16)) -> Self {
        Self {
            cidrs,
            node_ports,
            used_ips: HashSet::new(),
            used_ports: HashSet::new(),
        }
    }

    fn family_cidr(&self, v6: bool) -> Option<IpNet> {
        self.cidrs
            .iter()
            .find(|c| matches!(c, IpNet::V6(_)) == v6)
            .copied()
    }

    fn alloc_ip(&mut self, net: IpNet) -> Option<IpAddr> {
        let (base, bits): (u128, u32) = match net {
            IpNet::V4(n) => (u32::from(n.network()) as u128, 32 - n.prefix_len() as u32),
            IpNet::V6(n) => (u128::from(n.network()), 128 - n.prefix_len() as u32),
        };
        let size: u128 = if bits >= 64 {
            u64::MAX as u128
        } else {
            1u128 << bits
        };
        if size < 4 {
            return None;
        }
        let to_ip = |off: u128| -> IpAddr {
            match net {
                IpNet::V4(_) => IpAddr::V4(std::net::Ipv4Addr::from((base + off) as u32)),
                IpNet::V6(_) => IpAddr::V6(std::net::Ipv6Addr::from(base + off)),
            }
        };
        // Random first (as upstream), then a scan so a nearly full range still allocates.
        for _ in 0..64 {
            let off = 1 + (rand::random::<u64>() as u128) % (size - 2);
            let ip = to_ip(off);
            if self.used_ips.insert(ip) {
                return Some(ip);
            }
        }
        let mut off = 1u128;
        while off < size - 1 && off < 1 << 24 {
            let ip = to_ip(off);
            if self.used_ips.insert(ip) {
                return Some(ip);
            }
            off += 1;
        }
        None
    }

    fn alloc_port(&mut self) -> Option<u16> {
        let (lo, hi) = self.node_ports;
        let span = (hi - lo) as u32 + 1;
        for _ in 0..64 {
            let p = lo + (rand::random::<u32>() % span) as u16;
            if self.used_ports.insert(p) {
                return Some(p);
            }
        }
        (lo..=hi).find(|p| self.used_ports.insert(*p))
    }
}

fn qualified_name_ok(s: &str) -> bool {
    let (prefix, name) = match s.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(p) = prefix
        && !dns1123_subdomain(p)
    {
        return false;
    }
    !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn label_value_ok(s: &str) -> bool {
    s.is_empty() || qualified_name_ok(s) && !s.contains('/')
}

fn dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && s.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

fn dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(dns1123_label)
}

fn dns1035_label(s: &str) -> bool {
    dns1123_label(s) && s.starts_with(|c: char| c.is_ascii_lowercase())
}

const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1035_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
const PATH_SEGMENT_MSG: &str = "may not be '.' or '..' and may not contain '/' or '%'";
const QNAME_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

fn validate_meta(ctx: &KindCtx, obj: &Value, errs: &mut Vec<FieldError>) {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if ctx.old.is_none() {
        let (ok, msg) = match ctx.res {
            ids::SERVICES => (dns1035_label(name), DNS1035_MSG),
            ids::NAMESPACES => (dns1123_label(name), LABEL_MSG),
            // RBAC names are path segments (`system:cloud-controller-manager` is valid).
            ids::CLUSTERROLES | ids::CLUSTERROLEBINDINGS | ids::ROLES | ids::ROLEBINDINGS => (
                !name.is_empty() && !name.contains(['/', '%']) && name != "." && name != "..",
                PATH_SEGMENT_MSG,
            ),
            _ if ctx.desc.plural == "events" || ctx.desc.plural == "configmaps" => (
                !name.contains('/') && name != "." && name != "..",
                SUBDOMAIN_MSG,
            ),
            _ => (dns1123_subdomain(name), SUBDOMAIN_MSG),
        };
        if !ok {
            errs.push(FieldError::invalid("metadata.name", &json!(name), msg));
        }
    }
    if let Some(labels) = obj.pointer("/metadata/labels").and_then(Value::as_object) {
        for (k, v) in labels {
            if !qualified_name_ok(k) {
                errs.push(FieldError::invalid("metadata.labels", &json!(k), QNAME_MSG));
            }
            match v.as_str() {
                Some(s) if label_value_ok(s) => {}
                _ => errs.push(FieldError::invalid("metadata.labels", v, LABEL_VALUE_MSG)),
            }
        }
    }
    if let Some(ann) = obj
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
    {
        for (k, v) in ann {
            if !qualified_name_ok(k) {
                errs.push(FieldError::invalid(
                    "metadata.annotations",
                    &json!(k),
                    QNAME_MSG,
                ));
            }
            if !v.is_string() {
                errs.push(FieldError::invalid(
                    format!("metadata.annotations.{k}"),
                    v,
                    "must be a string",
                ));
            }
        }
    }
}

/// Defaults, allocates and validates `obj` for a create (`ctx.old` None) or an update.
pub fn prepare(ctx: &KindCtx, obj: &mut Value, alloc: &mut Allocator) -> Result<(), ApiError> {
    let mut errs = Vec::new();
    validate_meta(ctx, obj, &mut errs);
    match ctx.res {
        ids::NODES => node(ctx, obj, &mut errs),
        ids::SERVICES if errs.is_empty() => service(ctx, obj, alloc, &mut errs),
        ids::NAMESPACES if ctx.old.is_none() => {
            let name = obj
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            obj["status"] = json!({"phase": "Active"});
            obj["spec"] = json!({"finalizers": ["kubernetes"]});
            let m = &mut obj["metadata"];
            if !m.get("labels").is_some_and(Value::is_object) {
                m["labels"] = json!({});
            }
            m["labels"]["kubernetes.io/metadata.name"] = Value::String(name);
        }
        ids::LEASES => lease(obj, &mut errs),
        ids::CLUSTERROLES => crate::rbac::validate_role(obj, false, &mut errs),
        ids::ROLES => crate::rbac::validate_role(obj, true, &mut errs),
        ids::CLUSTERROLEBINDINGS => {
            crate::rbac::validate_binding(obj, ctx.old, false, &mut errs);
        }
        ids::ROLEBINDINGS => crate::rbac::validate_binding(obj, ctx.old, true, &mut errs),
        ids::DEPLOYMENTS if ctx.endpoint == Endpoint::Main => {
            crate::workloads::deployment(ctx, obj, &mut errs);
        }
        ids::DAEMONSETS if ctx.endpoint == Endpoint::Main => {
            crate::workloads::daemonset(ctx, obj, &mut errs);
        }
        ids::PODDISRUPTIONBUDGETS => crate::workloads::pdb(obj, &mut errs),
        ids::MUTATINGWEBHOOKCONFIGURATIONS => {
            crate::admission::validate_config(obj, true, &mut errs)
        }
        ids::VALIDATINGWEBHOOKCONFIGURATIONS => {
            crate::admission::validate_config(obj, false, &mut errs)
        }
        _ => {}
    }
    if errs.is_empty() {
        Ok(())
    } else {
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        Err(ApiError::invalid(ctx.desc, name, &errs))
    }
}

/// Frees what an object held (service IPs and ports) when it is deleted.
pub fn release(res: usize, obj: &Value, alloc: &mut Allocator) {
    if res == ids::SERVICES {
        for ip in service_ips(obj) {
            alloc.used_ips.remove(&ip);
        }
        for p in service_ports(obj) {
            alloc.used_ports.remove(&p);
        }
    }
}

fn lease(obj: &Value, errs: &mut Vec<FieldError>) {
    let spec = obj.get("spec");
    if let Some(d) = spec.and_then(|s| s.get("leaseDurationSeconds"))
        && !d.is_null()
        && d.as_i64().is_none_or(|d| d <= 0)
    {
        errs.push(FieldError::invalid(
            "spec.leaseDurationSeconds",
            d,
            "must be greater than 0",
        ));
    }
    if let Some(t) = spec.and_then(|s| s.get("leaseTransitions"))
        && !t.is_null()
        && t.as_i64().is_none_or(|t| t < 0)
    {
        errs.push(FieldError::invalid(
            "spec.leaseTransitions",
            t,
            "must be greater than or equal to 0",
        ));
    }
    if let Some(p) = spec.and_then(|s| s.get("preferredHolder"))
        && p.as_str().is_some_and(|p| !p.is_empty())
        && spec
            .and_then(|s| s.get("strategy"))
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
    {
        errs.push(FieldError::forbidden(
            "spec.preferredHolder",
            "preferredHolder is only allowed if strategy is set",
        ));
    }
}

fn node(ctx: &KindCtx, obj: &mut Value, errs: &mut Vec<FieldError>) {
    // v1 conversion keeps podCIDR and podCIDRs[0] in step.
    if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
        let single = spec
            .get("podCIDR")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let has_list = spec
            .get("podCIDRs")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty());
        if has_list {
            let first = spec["podCIDRs"][0].clone();
            spec.insert("podCIDR".into(), first);
        } else if !single.is_empty() {
            spec.insert("podCIDRs".into(), json!([single]));
        }
    }
    // SetDefaults_NodeStatus: allocatable defaults to capacity.
    if let Some(status) = obj.get_mut("status").and_then(Value::as_object_mut)
        && !status.contains_key("allocatable")
        && let Some(c) = status.get("capacity").cloned()
    {
        status.insert("allocatable".into(), c);
    }
    let cidrs: Vec<Value> = obj
        .pointer("/spec/podCIDRs")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut v4 = 0;
    let mut v6 = 0;
    for (i, c) in cidrs.iter().enumerate() {
        match c.as_str().and_then(|s| s.parse::<IpNet>().ok()) {
            Some(IpNet::V4(_)) => v4 += 1,
            Some(IpNet::V6(_)) => v6 += 1,
            None => errs.push(FieldError::invalid(
                format!("spec.podCIDRs[{i}]"),
                c,
                "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
            )),
        }
    }
    if cidrs.len() > 2 || v4 > 1 || v6 > 1 {
        errs.push(FieldError::invalid(
            "spec.podCIDRs",
            &Value::String(
                cidrs
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            "may specify no more than one CIDR for each IP family",
        ));
    }
    let taints: Vec<Value> = obj
        .pointer("/spec/taints")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut seen = HashSet::new();
    for (i, t) in taints.iter().enumerate() {
        let key = t.get("key").and_then(Value::as_str).unwrap_or_default();
        if !qualified_name_ok(key) {
            errs.push(FieldError::invalid(
                format!("spec.taints[{i}].key"),
                &json!(key),
                QNAME_MSG,
            ));
        }
        if let Some(v) = t.get("value").and_then(Value::as_str)
            && !label_value_ok(v)
        {
            errs.push(FieldError::invalid(
                format!("spec.taints[{i}].value"),
                &json!(v),
                LABEL_VALUE_MSG,
            ));
        }
        let effect = t.get("effect").and_then(Value::as_str).unwrap_or_default();
        match effect {
            "" => errs.push(FieldError::required(format!("spec.taints[{i}].effect"), "")),
            "NoSchedule" | "PreferNoSchedule" | "NoExecute" => {}
            other => errs.push(FieldError::not_supported(
                format!("spec.taints[{i}].effect"),
                &json!(other),
                &["NoExecute", "NoSchedule", "PreferNoSchedule"],
            )),
        }
        if !seen.insert((key.to_string(), effect.to_string())) {
            errs.push(FieldError::duplicate(
                format!("spec.taints[{i}]"),
                &json!(format!("{key}:{effect}")),
            ));
        }
    }
    if let Some(old) = ctx.old {
        let old_cidrs = old.pointer("/spec/podCIDRs").and_then(Value::as_array);
        if let Some(oc) = old_cidrs
            && !oc.is_empty()
            && Some(oc) != obj.pointer("/spec/podCIDRs").and_then(Value::as_array)
        {
            errs.push(FieldError::forbidden(
                "spec.podCIDRs",
                "node updates may not change podCIDR except from \"\" to valid",
            ));
        }
        let old_pid = old
            .pointer("/spec/providerID")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let new_pid = obj
            .pointer("/spec/providerID")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !old_pid.is_empty() && old_pid != new_pid {
            errs.push(FieldError::forbidden(
                "spec.providerID",
                "node updates may not change providerID except from \"\" to valid",
            ));
        }
    }
}

fn service_ips(obj: &Value) -> Vec<IpAddr> {
    obj.pointer("/spec/clusterIPs")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str()?.parse().ok()).collect())
        .unwrap_or_default()
}

fn service_ports(obj: &Value) -> Vec<u16> {
    let mut out: Vec<u16> = obj
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|p| p.get("nodePort")?.as_u64())
                .filter_map(|p| u16::try_from(p).ok())
                .collect()
        })
        .unwrap_or_default();
    if let Some(h) = obj
        .pointer("/spec/healthCheckNodePort")
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
    {
        out.push(h);
    }
    out
}

fn s<'a>(m: &'a Map<String, Value>, k: &str) -> &'a str {
    m.get(k).and_then(Value::as_str).unwrap_or_default()
}

const SERVICE_TYPES: &[&str] = &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"];

/// kube-apiserver's `dropTypeDependentFields`: when an update changes the type so that a field
/// no longer applies, and the user left that field as it was, the server clears it — so
/// `LoadBalancer` → `ClusterIP` does not fail on the allocated nodePorts.
fn drop_type_dependent_fields(old: &Map<String, Value>, new: &mut Map<String, Value>) {
    let ty = |m: &Map<String, Value>| {
        let t = s(m, "type");
        if t.is_empty() {
            "ClusterIP".to_string()
        } else {
            t.to_string()
        }
    };
    let (old_ty, new_ty) = (ty(old), ty(new));
    if old_ty == new_ty {
        return;
    }
    let needs_node_port = |t: &str| t == "NodePort" || t == "LoadBalancer";
    let node_ports = |m: &Map<String, Value>| -> Vec<Option<Value>> {
        m.get("ports")
            .and_then(Value::as_array)
            .map(|ps| ps.iter().map(|p| p.get("nodePort").cloned()).collect())
            .unwrap_or_default()
    };
    if needs_node_port(&old_ty)
        && !needs_node_port(&new_ty)
        && node_ports(old) == node_ports(new)
        && let Some(Value::Array(ports)) = new.get_mut("ports")
    {
        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
            p.remove("nodePort");
        }
    }
    let needs_hc = |t: &str, m: &Map<String, Value>| {
        t == "LoadBalancer" && s(m, "externalTrafficPolicy") == "Local"
    };
    if needs_hc(&old_ty, old)
        && !needs_hc(&new_ty, new)
        && old.get("healthCheckNodePort") == new.get("healthCheckNodePort")
    {
        new.remove("healthCheckNodePort");
    }
    if old_ty == "LoadBalancer" && new_ty != "LoadBalancer" {
        if new
            .get("allocateLoadBalancerNodePorts")
            .is_some_and(|v| !v.is_null())
            && old.get("allocateLoadBalancerNodePorts") == new.get("allocateLoadBalancerNodePorts")
        {
            new.remove("allocateLoadBalancerNodePorts");
        }
        if old.get("loadBalancerClass") == new.get("loadBalancerClass") {
            new.remove("loadBalancerClass");
        }
    }
    let externally_accessible = |t: &str, m: &Map<String, Value>| {
        needs_node_port(t)
            || m.get("externalIPs")
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty())
    };
    if externally_accessible(&old_ty, old)
        && !externally_accessible(&new_ty, new)
        && old.get("externalTrafficPolicy") == new.get("externalTrafficPolicy")
    {
        new.remove("externalTrafficPolicy");
    }
}

fn service(ctx: &KindCtx, obj: &mut Value, alloc: &mut Allocator, errs: &mut Vec<FieldError>) {
    let old = ctx.old;
    if old.is_none()
        && let Some(o) = obj.as_object_mut()
    {
        // serviceStrategy.PrepareForCreate: status is not settable on create.
        o.remove("status");
    }
    if !obj.get("spec").is_some_and(Value::is_object) {
        obj["spec"] = json!({});
    }
    // SetDefaults_Service runs on every decoded object, including the result of a status write.
    if let Some(ings) = obj
        .pointer_mut("/status/loadBalancer/ingress")
        .and_then(Value::as_array_mut)
    {
        for ing in ings {
            if let Some(m) = ing.as_object_mut()
                && !s(m, "ip").is_empty()
                && !m.contains_key("ipMode")
            {
                m.insert("ipMode".into(), json!("VIP"));
            }
        }
    }
    if ctx.endpoint == Endpoint::Status {
        return;
    }
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if s(spec, "type").is_empty() {
        spec.insert("type".into(), json!("ClusterIP"));
    }
    if s(spec, "sessionAffinity").is_empty() {
        spec.insert("sessionAffinity".into(), json!("None"));
    }
    match s(spec, "sessionAffinity") {
        "None" => {
            spec.remove("sessionAffinityConfig");
        }
        "ClientIP" => {
            if spec
                .get("sessionAffinityConfig")
                .and_then(|c| c.pointer("/clientIP/timeoutSeconds"))
                .is_none()
            {
                spec.insert(
                    "sessionAffinityConfig".into(),
                    json!({"clientIP": {"timeoutSeconds": 10800}}),
                );
            }
        }
        other => errs.push(FieldError::not_supported(
            "spec.sessionAffinity",
            &json!(other),
            &["ClientIP", "None"],
        )),
    }
    let ty = s(spec, "type").to_string();
    if !SERVICE_TYPES.contains(&ty.as_str()) {
        errs.push(FieldError::not_supported(
            "spec.type",
            &json!(ty),
            SERVICE_TYPES,
        ));
        return;
    }
    let external = ty == "NodePort" || ty == "LoadBalancer";
    if let Some(os) = old.and_then(|o| o.get("spec")).and_then(Value::as_object) {
        drop_type_dependent_fields(os, spec);
    }
    if let Some(Value::Array(ports)) = spec.get_mut("ports") {
        for p in ports.iter_mut() {
            if let Some(pm) = p.as_object_mut() {
                if s(pm, "protocol").is_empty() {
                    pm.insert("protocol".into(), json!("TCP"));
                }
                let tp = pm.get("targetPort");
                let unset = match tp {
                    None | Some(Value::Null) => true,
                    Some(Value::Number(n)) => n.as_i64() == Some(0),
                    Some(Value::String(s)) => s.is_empty(),
                    _ => false,
                };
                if unset && let Some(port) = pm.get("port").cloned() {
                    pm.insert("targetPort".into(), port);
                }
            }
        }
    }
    let has_external_ips = spec
        .get("externalIPs")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    if (external || has_external_ips) && s(spec, "externalTrafficPolicy").is_empty() {
        spec.insert("externalTrafficPolicy".into(), json!("Cluster"));
    }
    if ty != "ExternalName" && spec.get("internalTrafficPolicy").is_none_or(Value::is_null) {
        spec.insert("internalTrafficPolicy".into(), json!("Cluster"));
    }
    if ty == "LoadBalancer"
        && spec
            .get("allocateLoadBalancerNodePorts")
            .is_none_or(Value::is_null)
    {
        spec.insert("allocateLoadBalancerNodePorts".into(), json!(true));
    }

    // Carry over allocated values a PUT left out (`patchAllocatedValues` upstream).
    let old_spec = old.and_then(|o| o.get("spec")).and_then(Value::as_object);
    if let Some(os) = old_spec {
        if s(spec, "clusterIP").is_empty() && !s(os, "clusterIP").is_empty() && ty != "ExternalName"
        {
            for k in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
                if let Some(v) = os.get(k)
                    && spec.get(k).is_none_or(Value::is_null)
                {
                    spec.insert(k.into(), v.clone());
                }
            }
        }
        let old_ports: Vec<Value> = os
            .get("ports")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if external && let Some(Value::Array(ports)) = spec.get_mut("ports") {
            for p in ports.iter_mut() {
                let port = p.get("port").cloned();
                if p.get("nodePort")
                    .is_none_or(|v| v.as_u64().unwrap_or(0) == 0)
                    && let Some(op) = old_ports.iter().find(|op| op.get("port") == port.as_ref())
                    && let Some(np) = op.get("nodePort")
                {
                    p["nodePort"] = np.clone();
                }
            }
        }
        if spec.get("healthCheckNodePort").is_none()
            && let Some(h) = os.get("healthCheckNodePort")
        {
            spec.insert("healthCheckNodePort".into(), h.clone());
        }
    }

    // Validation of the fields this project reads and writes.
    let ports: Vec<Value> = spec
        .get("ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let headless = s(spec, "clusterIP") == "None";
    if ports.is_empty() && !headless && ty != "ExternalName" {
        errs.push(FieldError::required("spec.ports", ""));
    }
    if ty == "ExternalName" && s(spec, "externalName").is_empty() {
        errs.push(FieldError::required("spec.externalName", ""));
    }
    let mut names = HashSet::new();
    let mut seen_ports = HashSet::new();
    for (i, p) in ports.iter().enumerate() {
        let path = format!("spec.ports[{i}]");
        let name = p.get("name").and_then(Value::as_str).unwrap_or_default();
        if ports.len() > 1 && name.is_empty() {
            errs.push(FieldError::required(format!("{path}.name"), ""));
        } else if !name.is_empty() && !names.insert(name.to_string()) {
            errs.push(FieldError::duplicate(format!("{path}.name"), &json!(name)));
        }
        let port = p.get("port").cloned().unwrap_or(json!(0));
        match port.as_i64() {
            Some(1..=65535) => {}
            _ => errs.push(FieldError::invalid(
                format!("{path}.port"),
                &port,
                "must be between 1 and 65535, inclusive",
            )),
        }
        let proto = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
        if !["TCP", "UDP", "SCTP"].contains(&proto) {
            errs.push(FieldError::not_supported(
                format!("{path}.protocol"),
                &json!(proto),
                &["SCTP", "TCP", "UDP"],
            ));
        }
        if !seen_ports.insert((port.as_i64(), proto.to_string())) {
            errs.push(FieldError::duplicate(
                path.clone(),
                &json!(format!("{}/{proto}", port)),
            ));
        }
        match p.get("targetPort") {
            Some(Value::Number(n)) if !matches!(n.as_i64(), Some(1..=65535)) => {
                errs.push(FieldError::invalid(
                    format!("{path}.targetPort"),
                    &Value::Number(n.clone()),
                    "must be between 1 and 65535, inclusive",
                ))
            }
            _ => {}
        }
        if let Some(np) = p.get("nodePort").and_then(Value::as_i64)
            && np != 0
        {
            if !external {
                errs.push(FieldError::forbidden(
                    format!("{path}.nodePort"),
                    format!("may not be used when `type` is '{ty}'"),
                ));
            } else if np < alloc.node_ports.0 as i64 || np > alloc.node_ports.1 as i64 {
                errs.push(FieldError::invalid(
                    format!("{path}.nodePort"),
                    &json!(np),
                    format!(
                        "provided port is not in the valid range. The range of valid ports is {}-{}",
                        alloc.node_ports.0, alloc.node_ports.1
                    ),
                ));
            }
        }
    }
    let etp = s(spec, "externalTrafficPolicy").to_string();
    if !etp.is_empty() {
        if !["Cluster", "Local"].contains(&etp.as_str()) {
            errs.push(FieldError::not_supported(
                "spec.externalTrafficPolicy",
                &json!(etp),
                &["Cluster", "Local"],
            ));
        } else if !external && !has_external_ips {
            errs.push(FieldError::invalid(
                "spec.externalTrafficPolicy",
                &json!(etp),
                "may only be set when `type` is 'NodePort' or 'LoadBalancer'",
            ));
        }
    }
    let lbc = spec.get("loadBalancerClass").cloned();
    if let Some(Value::String(c)) = &lbc {
        if ty != "LoadBalancer" {
            errs.push(FieldError::forbidden(
                "spec.loadBalancerClass",
                "may only be used when `type` is 'LoadBalancer'",
            ));
        } else if !qualified_name_ok(c) {
            errs.push(FieldError::invalid(
                "spec.loadBalancerClass",
                &json!(c),
                QNAME_MSG,
            ));
        }
    }
    if let Some(os) = old_spec {
        let old_lbc = os.get("loadBalancerClass").filter(|v| !v.is_null());
        let new_lbc = lbc.as_ref().filter(|v| !v.is_null());
        if s(os, "type") == "LoadBalancer" && ty == "LoadBalancer" && old_lbc != new_lbc {
            errs.push(FieldError::invalid(
                "spec.loadBalancerClass",
                new_lbc.unwrap_or(&Value::Null),
                "may not change once set",
            ));
        }
        let old_ip = s(os, "clusterIP");
        if !old_ip.is_empty()
            && s(os, "type") != "ExternalName"
            && ty != "ExternalName"
            && s(spec, "clusterIP") != old_ip
        {
            errs.push(FieldError::invalid(
                "spec.clusterIPs[0]",
                &json!(s(spec, "clusterIP")),
                "may not change once set",
            ));
        }
    }
    let policy = s(spec, "ipFamilyPolicy").to_string();
    if !policy.is_empty()
        && !["SingleStack", "PreferDualStack", "RequireDualStack"].contains(&policy.as_str())
    {
        errs.push(FieldError::not_supported(
            "spec.ipFamilyPolicy",
            &json!(policy),
            &["PreferDualStack", "RequireDualStack", "SingleStack"],
        ));
    }
    if policy == "RequireDualStack" && alloc.cidrs.len() < 2 {
        errs.push(FieldError::invalid(
            "spec.ipFamilyPolicy",
            &json!(policy),
            "this cluster is not configured for dual-stack services",
        ));
    }
    if !errs.is_empty() {
        return;
    }

    // Allocation. First release what the old object held but the new one drops.
    let old_ips: Vec<IpAddr> = old.map(service_ips).unwrap_or_default();
    let old_ports: Vec<u16> = old.map(service_ports).unwrap_or_default();
    if ty == "ExternalName" {
        for k in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
            spec.remove(k);
        }
    } else if s(spec, "clusterIP").is_empty() {
        let mut families: Vec<String> = spec
            .get("ipFamilies")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        if families.is_empty() {
            let primary = if matches!(alloc.cidrs.first(), Some(IpNet::V6(_))) {
                "IPv6"
            } else {
                "IPv4"
            };
            families.push(primary.into());
            if policy != "SingleStack" && !policy.is_empty() && alloc.cidrs.len() > 1 {
                families.push(if primary == "IPv4" { "IPv6" } else { "IPv4" }.into());
            }
        }
        let mut ips = Vec::new();
        for (i, f) in families.iter().enumerate() {
            let net = alloc.family_cidr(f == "IPv6");
            match net.and_then(|n| alloc.alloc_ip(n)) {
                Some(ip) => ips.push(json!(ip.to_string())),
                None => {
                    errs.push(FieldError::invalid(
                        format!("spec.ipFamilies[{i}]"),
                        &json!(f),
                        "not configured on this cluster",
                    ));
                    return;
                }
            }
        }
        spec.insert("clusterIP".into(), ips[0].clone());
        spec.insert("clusterIPs".into(), Value::Array(ips));
        spec.insert("ipFamilies".into(), json!(families));
        if policy.is_empty() {
            spec.insert(
                "ipFamilyPolicy".into(),
                json!(if families.len() > 1 {
                    "PreferDualStack"
                } else {
                    "SingleStack"
                }),
            );
        }
    } else if headless {
        spec.insert("clusterIPs".into(), json!(["None"]));
        if spec.get("ipFamilies").is_none_or(Value::is_null) {
            let primary = if matches!(alloc.cidrs.first(), Some(IpNet::V6(_))) {
                "IPv6"
            } else {
                "IPv4"
            };
            spec.insert("ipFamilies".into(), json!([primary]));
        }
        if policy.is_empty() {
            spec.insert("ipFamilyPolicy".into(), json!("SingleStack"));
        }
    } else {
        // A requested ClusterIP: must be in range and free (unless it is ours already).
        let ip_s = s(spec, "clusterIP").to_string();
        match ip_s.parse::<IpAddr>() {
            Ok(ip) => {
                let in_range = alloc.cidrs.iter().any(|c| c.contains(&ip));
                if !old_ips.contains(&ip) {
                    if !in_range {
                        errs.push(FieldError::invalid(
                            "spec.clusterIPs",
                            &json!([ip_s]),
                            format!(
                                "failed to allocate IP {ip_s}: the provided IP ({ip_s}) is not in the valid range. The range of valid IPs is {}",
                                alloc.cidrs.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",")
                            ),
                        ));
                        return;
                    }
                    if !alloc.used_ips.insert(ip) {
                        errs.push(FieldError::invalid(
                            "spec.clusterIPs",
                            &json!([ip_s]),
                            format!(
                                "failed to allocate IP {ip_s}: provided IP is already allocated"
                            ),
                        ));
                        return;
                    }
                }
                spec.insert("clusterIPs".into(), json!([ip_s]));
                let fam = if ip.is_ipv6() { "IPv6" } else { "IPv4" };
                spec.insert("ipFamilies".into(), json!([fam]));
                if policy.is_empty() {
                    spec.insert("ipFamilyPolicy".into(), json!("SingleStack"));
                }
            }
            Err(_) => {
                errs.push(FieldError::invalid(
                    "spec.clusterIPs[0]",
                    &json!(ip_s),
                    "must be empty, 'None', or a valid IP address",
                ));
                return;
            }
        }
    }

    let wants_node_ports = ty == "NodePort"
        || (ty == "LoadBalancer"
            && spec
                .get("allocateLoadBalancerNodePorts")
                .and_then(Value::as_bool)
                .unwrap_or(true));
    let mut held: Vec<u16> = Vec::new();
    if let Some(Value::Array(ports)) = spec.get_mut("ports") {
        for (i, p) in ports.iter_mut().enumerate() {
            let cur = p
                .get("nodePort")
                .and_then(Value::as_u64)
                .and_then(|v| u16::try_from(v).ok())
                .filter(|v| *v != 0);
            match cur {
                Some(np) if external => {
                    if !old_ports.contains(&np)
                        && !held.contains(&np)
                        && !alloc.used_ports.insert(np)
                    {
                        errs.push(FieldError::invalid(
                            format!("spec.ports[{i}].nodePort"),
                            &json!(np),
                            "provided port is already allocated",
                        ));
                    }
                    held.push(np);
                }
                Some(_) => {
                    if let Some(m) = p.as_object_mut() {
                        m.remove("nodePort");
                    }
                }
                None if wants_node_ports => match alloc.alloc_port() {
                    Some(np) => {
                        p["nodePort"] = json!(np);
                        held.push(np);
                    }
                    None => errs.push(FieldError::invalid(
                        format!("spec.ports[{i}].nodePort"),
                        &json!(0),
                        "range is full",
                    )),
                },
                None => {}
            }
        }
    }
    let needs_hc = ty == "LoadBalancer" && s(spec, "externalTrafficPolicy") == "Local";
    if needs_hc {
        let cur = spec
            .get("healthCheckNodePort")
            .and_then(Value::as_u64)
            .and_then(|v| u16::try_from(v).ok())
            .filter(|v| *v != 0);
        match cur {
            Some(h) => {
                if !old_ports.contains(&h) && !held.contains(&h) && !alloc.used_ports.insert(h) {
                    errs.push(FieldError::invalid(
                        "spec.healthCheckNodePort",
                        &json!(h),
                        "provided port is already allocated",
                    ));
                }
                held.push(h);
            }
            None => match alloc.alloc_port() {
                Some(h) => {
                    spec.insert("healthCheckNodePort".into(), json!(h));
                    held.push(h);
                }
                None => errs.push(FieldError::invalid(
                    "spec.healthCheckNodePort",
                    &json!(0),
                    "range is full",
                )),
            },
        }
    } else {
        spec.remove("healthCheckNodePort");
    }
    if !errs.is_empty() {
        // Roll back what this write took.
        for p in &held {
            if !old_ports.contains(p) {
                alloc.used_ports.remove(p);
            }
        }
        for ip in service_ips(obj) {
            if !old_ips.contains(&ip) {
                alloc.used_ips.remove(&ip);
            }
        }
        return;
    }
    for p in old_ports {
        if !held.contains(&p) {
            alloc.used_ports.remove(&p);
        }
    }
    let now_ips = service_ips(obj);
    for ip in old_ips {
        if !now_ips.contains(&ip) {
            alloc.used_ips.remove(&ip);
        }
    }
}
