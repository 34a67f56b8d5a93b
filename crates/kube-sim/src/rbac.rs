//! RBAC authorization, evaluated as kube-apiserver's RBAC authorizer does.
//!
//! Tests of "RBAC exactly as used" are only worth something if kube-sim denies what a real
//! cluster denies and allows what it allows, so this follows upstream's
//! `plugin/pkg/auth/authorizer/rbac` step for step: ClusterRoleBindings first, then (for a
//! namespaced request) the RoleBindings of that namespace; subjects match by User name, Group
//! membership or ServiceAccount (`system:serviceaccount:<ns>:<name>`, a RoleBinding's own
//! namespace standing in for an unqualified one); a rule allows when verb, API group,
//! `resource[/subresource]` (with `*` and `*/subresource`) and `resourceNames` match, or for
//! non-resource requests verb and path (with a trailing `*` prefix match). Members of
//! `system:masters` are allowed before RBAC is asked, as by the apiserver's privileged-group
//! authorizer.
//!
//! One entry point serves both enforcement and the SubjectAccessReview endpoint:
//! [`authorize`] over a [`Policy`] snapshot (see `Store::rbac_policy`) with [`Attributes`].
//! Not modelled: aggregated ClusterRoles (`aggregationRule` is stored but the rules are not
//! filled in), the Node and Webhook authorizers, and escalation checks on RBAC writes.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::status::FieldError;

/// The group whose members are allowed everything, as kube-apiserver's `system:masters`.
pub const MASTERS_GROUP: &str = "system:masters";

/// Who is asking: what an authenticator (bearer token, TokenReview) resolved.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UserInfo {
    /// `system:serviceaccount:kube-system:node-controller`, `kube-sim-admin`, ...
    pub name: String,
    /// Groups, including `system:authenticated` and, for service accounts,
    /// `system:serviceaccounts` and `system:serviceaccounts:<namespace>`.
    pub groups: Vec<String>,
}

impl UserInfo {
    /// The identity of a service account token, with the groups kube-apiserver gives it.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        Self {
            name: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
        }
    }

    /// A cluster administrator (member of `system:masters`): never subject to RBAC.
    pub fn admin(name: &str) -> Self {
        Self {
            name: name.into(),
            groups: vec![MASTERS_GROUP.into(), "system:authenticated".into()],
        }
    }

    /// Whether RBAC is bypassed for this user.
    pub fn is_master(&self) -> bool {
        self.groups.iter().any(|g| g == MASTERS_GROUP)
    }
}

/// What is asked for: a resource (group, resource, subresource, namespace, name) or a
/// non-resource path (`/healthz`, `/metrics`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A resource request. Empty strings mean "none" (core group, no subresource, cluster
    /// scope, no name), as in `authorizer.AttributesRecord`.
    Resource {
        /// API group; empty for core.
        group: String,
        /// Plural resource name.
        resource: String,
        /// Subresource (`status`, `token`) or empty.
        subresource: String,
        /// Namespace, empty for cluster-scoped requests and all-namespace lists.
        namespace: String,
        /// Object name, empty for collections and creates.
        name: String,
    },
    /// A non-resource request.
    NonResource {
        /// URL path.
        path: String,
    },
}

/// One authorization question: kube-apiserver's `authorizer.Attributes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    /// Who asks.
    pub user: UserInfo,
    /// RBAC verb: `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, ...
    pub verb: String,
    /// For what.
    pub target: Target,
}

impl Attributes {
    /// A resource request.
    pub fn resource(
        user: UserInfo,
        verb: &str,
        group: &str,
        resource: &str,
        subresource: &str,
        namespace: &str,
        name: &str,
    ) -> Self {
        Self {
            user,
            verb: verb.into(),
            target: Target::Resource {
                group: group.into(),
                resource: resource.into(),
                subresource: subresource.into(),
                namespace: namespace.into(),
                name: name.into(),
            },
        }
    }

    /// A non-resource request.
    pub fn non_resource(user: UserInfo, verb: &str, path: &str) -> Self {
        Self {
            user,
            verb: verb.into(),
            target: Target::NonResource { path: path.into() },
        }
    }

    /// kube-apiserver's `forbiddenMessage`: `User "u" cannot list resource "nodes" in API
    /// group "" at the cluster scope`.
    pub fn forbidden_message(&self) -> String {
        let user = &self.user.name;
        let verb = &self.verb;
        match &self.target {
            Target::NonResource { path } => format!("User {user:?} cannot {verb} path {path:?}"),
            Target::Resource {
                group,
                resource,
                subresource,
                namespace,
                ..
            } => {
                let res = if subresource.is_empty() {
                    resource.clone()
                } else {
                    format!("{resource}/{subresource}")
                };
                if namespace.is_empty() {
                    format!(
                        "User {user:?} cannot {verb} resource {res:?} in API group {group:?} at the cluster scope"
                    )
                } else {
                    format!(
                        "User {user:?} cannot {verb} resource {res:?} in API group {group:?} in the namespace {namespace:?}"
                    )
                }
            }
        }
    }
}

/// The answer, as SubjectAccessReview's `status.allowed` / `status.reason`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request may proceed.
    pub allowed: bool,
    /// Upstream's reason text: `RBAC: allowed by ClusterRoleBinding "b" of ClusterRole "r" to
    /// ServiceAccount "sa/ns"` when allowed; empty, or `RBAC: [clusterrole... not found]` when
    /// bindings point at missing roles, when denied.
    pub reason: String,
}

/// A snapshot of the stored RBAC objects (JSON as stored).
#[derive(Debug, Default, Clone)]
pub struct Policy {
    /// `rbac.authorization.k8s.io/v1` ClusterRoles.
    pub cluster_roles: Vec<Arc<Value>>,
    /// ClusterRoleBindings.
    pub cluster_role_bindings: Vec<Arc<Value>>,
    /// Roles (namespaced).
    pub roles: Vec<Arc<Value>>,
    /// RoleBindings (namespaced).
    pub role_bindings: Vec<Arc<Value>>,
}

fn s<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn strs(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

impl Policy {
    fn rules_of(
        &self,
        role_ref: &Value,
        binding_ns: &str,
    ) -> Result<(&'static str, Vec<Value>), String> {
        let kind = s(role_ref, "/kind");
        let name = s(role_ref, "/name");
        let (list, ns, label, kind_name) = match kind {
            "ClusterRole" => (&self.cluster_roles, "", "clusterrole", "ClusterRole"),
            "Role" => (&self.roles, binding_ns, "role", "Role"),
            _ => return Err(format!("unsupported role reference kind: {kind:?}")),
        };
        list.iter()
            .find(|r| s(r, "/metadata/name") == name && s(r, "/metadata/namespace") == ns)
            .map(|r| {
                let rules = r
                    .get("rules")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                (kind_name, rules)
            })
            .ok_or_else(|| format!("{label}.rbac.authorization.k8s.io {name:?} not found"))
    }
}

fn subject_matches(subject: &Value, user: &UserInfo, binding_ns: &str) -> bool {
    let name = s(subject, "/name");
    match s(subject, "/kind") {
        "User" => user.name == name,
        "Group" => user.groups.iter().any(|g| g == name),
        "ServiceAccount" => {
            let ns = match s(subject, "/namespace") {
                "" => binding_ns,
                ns => ns,
            };
            !ns.is_empty() && user.name == format!("system:serviceaccount:{ns}:{name}")
        }
        _ => false,
    }
}

fn describe_subject(subject: &Value, binding_ns: &str) -> String {
    let kind = s(subject, "/kind");
    let name = s(subject, "/name");
    if kind == "ServiceAccount" {
        let ns = match s(subject, "/namespace") {
            "" => binding_ns,
            ns => ns,
        };
        format!("{kind} {:?}", format!("{name}/{ns}"))
    } else {
        format!("{kind} {name:?}")
    }
}

fn has(list: &[String], want: &str) -> bool {
    list.iter().any(|x| x == "*" || x == want)
}

/// `rbac.RuleAllows`: whether one PolicyRule covers the request.
pub fn rule_allows(rule: &Value, verb: &str, target: &Target) -> bool {
    if !has(&strs(rule, "verbs"), verb) {
        return false;
    }
    match target {
        Target::Resource {
            group,
            resource,
            subresource,
            name,
            ..
        } => {
            if !has(&strs(rule, "apiGroups"), group) {
                return false;
            }
            let combined = if subresource.is_empty() {
                resource.clone()
            } else {
                format!("{resource}/{subresource}")
            };
            let resource_ok = strs(rule, "resources").iter().any(|r| {
                r == "*"
                    || *r == combined
                    || (!subresource.is_empty()
                        && r.strip_prefix("*/") == Some(subresource.as_str()))
            });
            let names = strs(rule, "resourceNames");
            resource_ok && (names.is_empty() || names.iter().any(|n| n == name))
        }
        Target::NonResource { path } => strs(rule, "nonResourceURLs").iter().any(|u| {
            u == "*"
                || u == path
                || u.strip_suffix('*')
                    .is_some_and(|prefix| path.starts_with(prefix))
        }),
    }
}

/// Decides one request. Members of `system:masters` are allowed with an empty reason (the
/// privileged-group authorizer answers before RBAC); everyone else needs a binding whose role
/// has a matching rule.
pub fn authorize(policy: &Policy, attrs: &Attributes) -> Decision {
    if attrs.user.is_master() {
        return Decision {
            allowed: true,
            reason: String::new(),
        };
    }
    let mut errors: Vec<String> = Vec::new();
    let mut visit = |binding: &Value, kind: &str, ns: &str| -> Option<String> {
        let subjects = binding.get("subjects").and_then(Value::as_array)?;
        let subject = subjects
            .iter()
            .find(|sub| subject_matches(sub, &attrs.user, ns))?;
        let role_ref = binding.get("roleRef")?;
        let (role_kind, rules) = match policy.rules_of(role_ref, ns) {
            Ok(r) => r,
            Err(e) => {
                errors.push(e);
                return None;
            }
        };
        if !rules
            .iter()
            .any(|r| rule_allows(r, &attrs.verb, &attrs.target))
        {
            return None;
        }
        let name = s(binding, "/metadata/name");
        let shown = if ns.is_empty() {
            name.to_string()
        } else {
            format!("{name}/{ns}")
        };
        Some(format!(
            "RBAC: allowed by {kind} {shown:?} of {role_kind} {:?} to {}",
            s(role_ref, "/name"),
            describe_subject(subject, ns)
        ))
    };
    for b in &policy.cluster_role_bindings {
        if let Some(reason) = visit(b, "ClusterRoleBinding", "") {
            return Decision {
                allowed: true,
                reason,
            };
        }
    }
    if let Target::Resource { namespace, .. } = &attrs.target
        && !namespace.is_empty()
    {
        for b in policy
            .role_bindings
            .iter()
            .filter(|b| s(b, "/metadata/namespace") == namespace)
        {
            if let Some(reason) = visit(b, "RoleBinding", namespace) {
                return Decision {
                    allowed: true,
                    reason,
                };
            }
        }
    }
    let reason = if errors.is_empty() {
        String::new()
    } else if errors.len() == 1 {
        format!("RBAC: {}", errors[0])
    } else {
        format!("RBAC: [{}]", errors.join(", "))
    };
    Decision {
        allowed: false,
        reason,
    }
}

const GROUP: &str = "rbac.authorization.k8s.io";

/// Validation of Roles and ClusterRoles (`ValidatePolicyRule` for each rule).
pub(crate) fn validate_role(obj: &Value, namespaced: bool, errs: &mut Vec<FieldError>) {
    let Some(rules) = obj.get("rules").and_then(Value::as_array) else {
        return;
    };
    for (i, rule) in rules.iter().enumerate() {
        let path = format!("rules[{i}]");
        if strs(rule, "verbs").is_empty() {
            errs.push(FieldError::required(
                format!("{path}.verbs"),
                "verbs must contain at least one value",
            ));
        }
        let urls = strs(rule, "nonResourceURLs");
        let has_resources =
            !strs(rule, "apiGroups").is_empty() || !strs(rule, "resources").is_empty();
        if !urls.is_empty() {
            if namespaced {
                errs.push(FieldError::invalid(
                    format!("{path}.nonResourceURLs"),
                    &json!(urls),
                    "namespaced rules cannot apply to non-resource URLs",
                ));
            }
            if has_resources || !strs(rule, "resourceNames").is_empty() {
                errs.push(FieldError::invalid(
                    format!("{path}.nonResourceURLs"),
                    &json!(urls),
                    "rules cannot apply to both regular resources and non-resource URLs",
                ));
            }
            continue;
        }
        if strs(rule, "apiGroups").is_empty() {
            errs.push(FieldError::required(
                format!("{path}.apiGroups"),
                "resource rules must supply at least one api group",
            ));
        }
        if strs(rule, "resources").is_empty() {
            errs.push(FieldError::required(
                format!("{path}.resources"),
                "resource rules must supply at least one resource",
            ));
        }
    }
}

/// Validation of RoleBindings and ClusterRoleBindings (`ValidateRoleBinding`,
/// `ValidateRoleBindingSubject`, and `roleRef` immutability on update).
pub(crate) fn validate_binding(
    obj: &Value,
    old: Option<&Value>,
    namespaced: bool,
    errs: &mut Vec<FieldError>,
) {
    let role_ref = obj.get("roleRef").cloned().unwrap_or(json!({}));
    if s(&role_ref, "/apiGroup") != GROUP {
        errs.push(FieldError::not_supported(
            "roleRef.apiGroup",
            &json!(s(&role_ref, "/apiGroup")),
            &[GROUP],
        ));
    }
    let kinds: &[&str] = if namespaced {
        &["Role", "ClusterRole"]
    } else {
        &["ClusterRole"]
    };
    if !kinds.contains(&s(&role_ref, "/kind")) {
        errs.push(FieldError::not_supported(
            "roleRef.kind",
            &json!(s(&role_ref, "/kind")),
            kinds,
        ));
    }
    if s(&role_ref, "/name").is_empty() {
        errs.push(FieldError::required("roleRef.name", ""));
    }
    if let Some(old) = old
        && old.get("roleRef") != obj.get("roleRef")
    {
        errs.push(FieldError::invalid(
            "roleRef",
            &role_ref,
            "cannot change roleRef",
        ));
    }
    let subjects = obj
        .get("subjects")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for (i, sub) in subjects.iter().enumerate() {
        let path = format!("subjects[{i}]");
        if s(sub, "/name").is_empty() {
            errs.push(FieldError::required(format!("{path}.name"), ""));
        }
        let group = s(sub, "/apiGroup");
        match s(sub, "/kind") {
            "ServiceAccount" => {
                if !group.is_empty() {
                    errs.push(FieldError::not_supported(
                        format!("{path}.apiGroup"),
                        &json!(group),
                        &[""],
                    ));
                }
                if !namespaced && s(sub, "/namespace").is_empty() {
                    errs.push(FieldError::required(format!("{path}.namespace"), ""));
                }
            }
            "User" | "Group" => {
                if group != GROUP {
                    errs.push(FieldError::not_supported(
                        format!("{path}.apiGroup"),
                        &json!(group),
                        &[GROUP],
                    ));
                }
            }
            other => errs.push(FieldError::not_supported(
                format!("{path}.kind"),
                &json!(other),
                &["ServiceAccount", "User", "Group"],
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            cluster_roles: vec![
                Arc::new(json!({"metadata": {"name": "nodes-rw"}, "rules": [
                    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
                    {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
                ]})),
                Arc::new(json!({"metadata": {"name": "any-status"}, "rules": [
                    {"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["get"]},
                ]})),
                Arc::new(json!({"metadata": {"name": "health"}, "rules": [
                    {"nonResourceURLs": ["/healthz", "/debug/*"], "verbs": ["get"]},
                ]})),
            ],
            cluster_role_bindings: vec![
                Arc::new(json!({"metadata": {"name": "node-controller"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "nodes-rw"},
                    "subjects": [{"kind": "ServiceAccount", "name": "node-controller", "namespace": "kube-system"}]})),
                Arc::new(json!({"metadata": {"name": "all-sas"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "any-status"},
                    "subjects": [{"kind": "Group", "name": "system:serviceaccounts"}]})),
                Arc::new(json!({"metadata": {"name": "alice-health"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "health"},
                    "subjects": [{"kind": "User", "name": "alice"}]})),
                Arc::new(json!({"metadata": {"name": "dangling"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gone"},
                    "subjects": [{"kind": "User", "name": "bob"}]})),
            ],
            roles: vec![Arc::new(
                json!({"metadata": {"name": "lease", "namespace": "kube-system"}, "rules": [
                    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["ccm"], "verbs": ["get", "update"]},
                ]}),
            )],
            role_bindings: vec![Arc::new(
                json!({"metadata": {"name": "lease", "namespace": "kube-system"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "lease"},
                    "subjects": [{"kind": "ServiceAccount", "name": "ccm"}]}),
            )],
        }
    }

    fn sa(name: &str) -> UserInfo {
        UserInfo::service_account("kube-system", name)
    }

    fn res(u: UserInfo, verb: &str, g: &str, r: &str, sub: &str, ns: &str, n: &str) -> Decision {
        authorize(&policy(), &Attributes::resource(u, verb, g, r, sub, ns, n))
    }

    #[test]
    fn cluster_role_binding_to_service_account() {
        let d = res(sa("node-controller"), "list", "", "nodes", "", "", "");
        assert!(d.allowed);
        assert_eq!(
            d.reason,
            r#"RBAC: allowed by ClusterRoleBinding "node-controller" of ClusterRole "nodes-rw" to ServiceAccount "node-controller/kube-system""#
        );
        assert!(
            res(
                sa("node-controller"),
                "patch",
                "",
                "nodes",
                "status",
                "",
                "n1"
            )
            .allowed
        );
        // patch of the main resource is not patch of the status subresource.
        assert!(!res(sa("node-controller"), "patch", "", "nodes", "", "", "n1").allowed);
        assert!(!res(sa("route-controller"), "list", "", "nodes", "", "", "").allowed);
        // Another namespace's account of the same name is someone else.
        let other = UserInfo::service_account("default", "node-controller");
        assert!(!res(other, "list", "", "nodes", "", "", "").allowed);
    }

    #[test]
    fn wildcards_groups_and_subresource_stars() {
        let d = res(
            sa("anyone"),
            "get",
            "apps",
            "deployments",
            "status",
            "ns",
            "d",
        );
        assert!(d.allowed, "{d:?}");
        assert!(!res(sa("anyone"), "get", "apps", "deployments", "", "ns", "d").allowed);
        let user = UserInfo {
            name: "carol".into(),
            groups: vec!["system:authenticated".into()],
        };
        assert!(!res(user, "get", "", "services", "status", "ns", "s").allowed);
    }

    #[test]
    fn role_binding_defaults_subject_namespace_and_checks_resource_names() {
        let ok = res(
            sa("ccm"),
            "get",
            "coordination.k8s.io",
            "leases",
            "",
            "kube-system",
            "ccm",
        );
        assert!(ok.allowed);
        assert_eq!(
            ok.reason,
            r#"RBAC: allowed by RoleBinding "lease/kube-system" of Role "lease" to ServiceAccount "ccm/kube-system""#
        );
        let other_name = res(
            sa("ccm"),
            "get",
            "coordination.k8s.io",
            "leases",
            "",
            "kube-system",
            "x",
        );
        assert!(!other_name.allowed);
        // A rule with resourceNames never covers a create or a list (no name).
        let list = res(
            sa("ccm"),
            "list",
            "coordination.k8s.io",
            "leases",
            "",
            "kube-system",
            "",
        );
        assert!(!list.allowed);
        // The RoleBinding only counts in its own namespace.
        let elsewhere = res(
            sa("ccm"),
            "get",
            "coordination.k8s.io",
            "leases",
            "",
            "default",
            "ccm",
        );
        assert!(!elsewhere.allowed);
    }

    #[test]
    fn non_resource_paths_with_prefix_star() {
        let alice = || UserInfo {
            name: "alice".into(),
            groups: vec![],
        };
        let p = policy();
        let q = |path: &str| authorize(&p, &Attributes::non_resource(alice(), "get", path));
        assert!(q("/healthz").allowed);
        assert!(q("/debug/pprof/heap").allowed);
        assert!(!q("/metrics").allowed);
        assert!(!q("/healthz/ping").allowed);
    }

    #[test]
    fn masters_bypass_and_missing_roles_give_a_reason() {
        let d = res(UserInfo::admin("root"), "delete", "", "nodes", "", "", "x");
        assert!(d.allowed);
        let bob = UserInfo {
            name: "bob".into(),
            groups: vec![],
        };
        let d = res(bob, "get", "", "nodes", "", "", "x");
        assert!(!d.allowed);
        assert_eq!(
            d.reason,
            r#"RBAC: clusterrole.rbac.authorization.k8s.io "gone" not found"#
        );
    }

    #[test]
    fn forbidden_messages_match_kube_apiserver() {
        let a = Attributes::resource(sa("x"), "list", "", "nodes", "", "", "");
        assert_eq!(
            a.forbidden_message(),
            r#"User "system:serviceaccount:kube-system:x" cannot list resource "nodes" in API group "" at the cluster scope"#
        );
        let a = Attributes::resource(
            sa("x"),
            "update",
            "coordination.k8s.io",
            "leases",
            "",
            "kube-system",
            "l",
        );
        assert_eq!(
            a.forbidden_message(),
            r#"User "system:serviceaccount:kube-system:x" cannot update resource "leases" in API group "coordination.k8s.io" in the namespace "kube-system""#
        );
        let a = Attributes::non_resource(sa("x"), "get", "/metrics");
        assert_eq!(
            a.forbidden_message(),
            r#"User "system:serviceaccount:kube-system:x" cannot get path "/metrics""#
        );
    }
}
