//! `authentication.k8s.io/v1` TokenReview and `authorization.k8s.io/v1` SubjectAccessReview:
//! what components with delegated authentication and authorization (a cloud-controller-manager
//! protecting `/metrics`) ask the API server. Both are create-only and stored nowhere.
//!
//! TokenReview resolves the bearer tokens kube-sim accepts (the admin tokens, TokenRequest and
//! service-account tokens); SubjectAccessReview answers with the RBAC evaluator in
//! [`crate::rbac`], plus kube-apiserver's privileged-group rule: `system:masters` may do anything.

use serde_json::{Value, json};

use crate::rbac::{self, Attributes, Decision, UserInfo};
use crate::status::ApiError;

/// The two review endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Review {
    /// `POST /apis/authentication.k8s.io/v1/tokenreviews`
    Token,
    /// `POST /apis/authorization.k8s.io/v1/subjectaccessreviews`
    SubjectAccess,
}

impl Review {
    /// The endpoint a path names, if any.
    pub(crate) fn from_path(segs: &[&str]) -> Option<Self> {
        match segs {
            ["apis", "authentication.k8s.io", "v1", "tokenreviews"] => Some(Review::Token),
            ["apis", "authorization.k8s.io", "v1", "subjectaccessreviews"] => {
                Some(Review::SubjectAccess)
            }
            _ => None,
        }
    }

    /// `(group, plural)` for accounting and RBAC.
    pub(crate) fn resource(self) -> (&'static str, &'static str) {
        match self {
            Review::Token => ("authentication.k8s.io", "tokenreviews"),
            Review::SubjectAccess => ("authorization.k8s.io", "subjectaccessreviews"),
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Review::Token => "TokenReview",
            Review::SubjectAccess => "SubjectAccessReview",
        }
    }
}

/// 422 as kube-apiserver words a review's validation failure.
fn invalid(kind: &str, field: &str, detail: &str) -> ApiError {
    ApiError {
        code: 422,
        reason: "Invalid",
        message: format!(
            "{kind}.{} \"\" is invalid: {field}: {detail}",
            group_of(kind)
        ),
        details: Some(json!({
            "kind": kind,
            "group": group_of(kind),
            "causes": [{"reason": "FieldValueRequired", "message": detail, "field": field}],
        })),
        retry_after: None,
    }
}

fn group_of(kind: &str) -> &'static str {
    if kind == "TokenReview" {
        "authentication.k8s.io"
    } else {
        "authorization.k8s.io"
    }
}

/// Answers a review request body; `lookup` resolves a bearer token to its identity.
pub(crate) fn answer(
    review: Review,
    body: &Value,
    lookup: impl Fn(&str) -> Option<UserInfo>,
    authorize: impl Fn(&Attributes) -> Decision,
) -> Result<Value, ApiError> {
    let spec = body.get("spec").cloned().unwrap_or_else(|| json!({}));
    let status = match review {
        Review::Token => token_status(&spec, lookup)?,
        Review::SubjectAccess => access_status(&spec, authorize)?,
    };
    let (group, _) = review.resource();
    Ok(json!({
        "kind": review.kind(),
        "apiVersion": format!("{group}/v1"),
        "metadata": {"creationTimestamp": null},
        "spec": spec,
        "status": status,
    }))
}

fn token_status(
    spec: &Value,
    lookup: impl Fn(&str) -> Option<UserInfo>,
) -> Result<Value, ApiError> {
    let token = spec
        .get("token")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if token.is_empty() {
        return Err(invalid("TokenReview", "spec.token", "Required value"));
    }
    let audiences = spec
        .get("audiences")
        .cloned()
        .unwrap_or_else(|| json!(["https://kubernetes.default.svc"]));
    Ok(match lookup(token) {
        Some(user) => json!({
            "authenticated": true,
            "user": {"username": user.name, "groups": user.groups},
            "audiences": audiences,
        }),
        None => json!({"authenticated": false, "user": {}, "error": "invalid bearer token"}),
    })
}

fn access_status(
    spec: &Value,
    authorize: impl Fn(&Attributes) -> Decision,
) -> Result<Value, ApiError> {
    let kind = "SubjectAccessReview";
    let name = spec.get("user").and_then(Value::as_str).unwrap_or_default();
    let groups: Vec<String> = spec
        .get("groups")
        .and_then(Value::as_array)
        .map(|g| {
            g.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    if name.is_empty() && groups.is_empty() {
        return Err(invalid(
            kind,
            "spec.user",
            "at least one of user or group must be specified",
        ));
    }
    let user = UserInfo {
        name: name.to_string(),
        groups,
    };
    let res = spec.get("resourceAttributes").filter(|v| !v.is_null());
    let non = spec.get("nonResourceAttributes").filter(|v| !v.is_null());
    let s = |v: &Value, k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let attrs = match (res, non) {
        (Some(r), None) => Attributes::resource(
            user.clone(),
            &s(r, "verb"),
            &s(r, "group"),
            &s(r, "resource"),
            &s(r, "subresource"),
            &s(r, "namespace"),
            &s(r, "name"),
        ),
        (None, Some(n)) => Attributes::non_resource(user.clone(), &s(n, "verb"), &s(n, "path")),
        _ => {
            return Err(invalid(
                kind,
                "spec.resourceAttributes",
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            ));
        }
    };
    if user.is_master() {
        return Ok(json!({"allowed": true, "reason": ""}));
    }
    let d = authorize(&attrs);
    Ok(if d.allowed {
        json!({"allowed": true, "reason": d.reason})
    } else {
        json!({"allowed": false, "reason": d.reason})
    })
}

/// RBAC attributes of creating a review (granted by the `system:auth-delegator` ClusterRole).
pub(crate) fn create_attributes(review: Review, user: &UserInfo) -> Attributes {
    let (group, plural) = review.resource();
    rbac::Attributes::resource(user.clone(), "create", group, plural, "", "", "")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deny(_: &Attributes) -> Decision {
        Decision {
            allowed: false,
            reason: String::new(),
        }
    }

    #[test]
    fn token_review_resolves_known_tokens_only() {
        let lookup = |t: &str| (t == "good").then(|| UserInfo::admin("root"));
        let ok = answer(
            Review::Token,
            &json!({"spec": {"token": "good"}}),
            lookup,
            deny,
        )
        .expect("answer");
        assert_eq!(ok["status"]["authenticated"], true);
        assert_eq!(ok["status"]["user"]["username"], "root");
        let bad = answer(
            Review::Token,
            &json!({"spec": {"token": "bad"}}),
            lookup,
            deny,
        )
        .expect("answer");
        assert_eq!(bad["status"]["authenticated"], false);
        let empty = answer(Review::Token, &json!({"spec": {}}), lookup, deny);
        assert_eq!(empty.err().map(|e| e.code), Some(422));
    }

    #[test]
    fn access_review_needs_a_subject_and_one_kind_of_attributes() {
        let none = |_: &str| None;
        let e = answer(
            Review::SubjectAccess,
            &json!({"spec": {"nonResourceAttributes": {"path": "/metrics", "verb": "get"}}}),
            none,
            deny,
        );
        assert_eq!(e.err().map(|e| e.code), Some(422));
        let e = answer(
            Review::SubjectAccess,
            &json!({"spec": {"user": "u"}}),
            none,
            deny,
        );
        assert_eq!(e.err().map(|e| e.code), Some(422));
        let masters = answer(
            Review::SubjectAccess,
            &json!({"spec": {"user": "u", "groups": ["system:masters"],
                    "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}}),
            none,
            deny,
        )
        .expect("answer");
        assert_eq!(masters["status"]["allowed"], true);
    }
}
