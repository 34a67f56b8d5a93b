//! `authentication.k8s.io/v1` TokenReview and SelfSubjectReview, `authorization.k8s.io/v1`
//! SubjectAccessReview and SelfSubjectAccessReview: what components with delegated
//! authentication and authorization (a cloud-controller-manager protecting `/metrics`) ask the
//! API server, and what `kubectl auth whoami` / `kubectl auth can-i` ask. All are create-only
//! and stored nowhere.
//!
//! TokenReview resolves the bearer tokens kube-sim accepts (the admin tokens, TokenRequest and
//! service-account tokens); SubjectAccessReview answers with the RBAC evaluator in
//! [`crate::rbac`], plus kube-apiserver's privileged-group rule: `system:masters` may do anything.
//! The two self reviews answer for the requesting user and, as the bootstrap `system:basic-user`
//! ClusterRole grants them to `system:authenticated`, need no RBAC grant themselves.

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
    /// `POST /apis/authentication.k8s.io/v1/selfsubjectreviews` (`kubectl auth whoami`)
    SelfSubject,
    /// `POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews` (`kubectl auth can-i`)
    SelfSubjectAccess,
}

/// Who asks a review, as the server knows them: the self reviews answer about this user.
pub(crate) struct Requester<'a> {
    /// The authenticated identity of the request.
    pub user: &'a UserInfo,
    /// The user's UID when it has one (a service account's object UID).
    pub uid: Option<String>,
    /// Whether the server enforces RBAC: when it does not, every request is allowed, and
    /// `can-i` says so instead of answering for a policy nobody enforces.
    pub rbac_enforced: bool,
}

impl Review {
    /// The endpoint a path names, if any.
    /// Every review endpoint, in discovery order.
    pub(crate) const ALL: [Review; 4] = [
        Review::SelfSubject,
        Review::Token,
        Review::SelfSubjectAccess,
        Review::SubjectAccess,
    ];

    /// The endpoint a path names, if any.
    pub(crate) fn from_path(segs: &[&str]) -> Option<Self> {
        match segs {
            ["apis", group, "v1", plural] => Self::ALL
                .into_iter()
                .find(|r| r.resource() == (*group, *plural)),
            _ => None,
        }
    }

    /// `(group, plural)` for accounting and RBAC.
    pub(crate) fn resource(self) -> (&'static str, &'static str) {
        match self {
            Review::Token => (AUTHN, "tokenreviews"),
            Review::SelfSubject => (AUTHN, "selfsubjectreviews"),
            Review::SubjectAccess => (AUTHZ, "subjectaccessreviews"),
            Review::SelfSubjectAccess => (AUTHZ, "selfsubjectaccessreviews"),
        }
    }

    /// The kind of request and answer.
    pub(crate) fn kind(self) -> &'static str {
        match self {
            Review::Token => "TokenReview",
            Review::SubjectAccess => "SubjectAccessReview",
            Review::SelfSubject => "SelfSubjectReview",
            Review::SelfSubjectAccess => "SelfSubjectAccessReview",
        }
    }

    /// Whether the review answers about the requester; such reviews are open to every
    /// authenticated user (bootstrap `system:basic-user`).
    pub(crate) fn is_self(self) -> bool {
        matches!(self, Review::SelfSubject | Review::SelfSubjectAccess)
    }
}

const AUTHN: &str = "authentication.k8s.io";
const AUTHZ: &str = "authorization.k8s.io";

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
    Review::ALL
        .into_iter()
        .find(|r| r.kind() == kind)
        .map_or(AUTHZ, |r| r.resource().0)
}

/// Answers a review request body; `lookup` resolves a bearer token to its identity.
pub(crate) fn answer(
    review: Review,
    body: &Value,
    who: &Requester<'_>,
    lookup: impl Fn(&str) -> Option<UserInfo>,
    authorize: impl Fn(&Attributes) -> Decision,
) -> Result<Value, ApiError> {
    let spec = body.get("spec").cloned().unwrap_or_else(|| json!({}));
    let status = match review {
        Review::Token => token_status(&spec, lookup)?,
        Review::SubjectAccess => access_status(&spec, authorize)?,
        Review::SelfSubject => self_status(who),
        Review::SelfSubjectAccess => self_access_status(&spec, who, authorize)?,
    };
    let (group, _) = review.resource();
    let mut out = json!({
        "kind": review.kind(),
        "apiVersion": format!("{group}/v1"),
        "metadata": {"creationTimestamp": null},
        "spec": spec,
        "status": status,
    });
    if review == Review::SelfSubject {
        // SelfSubjectReview has no spec.
        out.as_object_mut().map(|o| o.remove("spec"));
    }
    Ok(out)
}

/// `status.userInfo` of a SelfSubjectReview: the requester as the authenticator saw them.
fn self_status(who: &Requester<'_>) -> Value {
    let mut info = json!({"username": who.user.name, "groups": who.user.groups});
    if let Some(uid) = who.uid.as_deref().filter(|u| !u.is_empty()) {
        info["uid"] = json!(uid);
    }
    json!({ "userInfo": info })
}

/// SelfSubjectAccessReview: the spec's attributes, asked for the requester.
fn self_access_status(
    spec: &Value,
    who: &Requester<'_>,
    authorize: impl Fn(&Attributes) -> Decision,
) -> Result<Value, ApiError> {
    let attrs = attributes_of("SelfSubjectAccessReview", spec, who.user)?;
    if !who.rbac_enforced {
        return Ok(json!({"allowed": true, "reason": ""}));
    }
    Ok(decide(&attrs, authorize))
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
    let attrs = attributes_of(kind, spec, &user)?;
    Ok(decide(&attrs, authorize))
}

/// The authorizer attributes a review's `resourceAttributes` or `nonResourceAttributes` name.
fn attributes_of(kind: &str, spec: &Value, user: &UserInfo) -> Result<Attributes, ApiError> {
    let res = spec.get("resourceAttributes").filter(|v| !v.is_null());
    let non = spec.get("nonResourceAttributes").filter(|v| !v.is_null());
    let s = |v: &Value, k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    match (res, non) {
        (Some(r), None) => Ok(Attributes::resource(
            user.clone(),
            &s(r, "verb"),
            &s(r, "group"),
            &s(r, "resource"),
            &s(r, "subresource"),
            &s(r, "namespace"),
            &s(r, "name"),
        )),
        (None, Some(n)) => Ok(Attributes::non_resource(
            user.clone(),
            &s(n, "verb"),
            &s(n, "path"),
        )),
        _ => Err(invalid(
            kind,
            "spec.resourceAttributes",
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )),
    }
}

/// `status` of an access review: `system:masters` first, then RBAC.
fn decide(attrs: &Attributes, authorize: impl Fn(&Attributes) -> Decision) -> Value {
    if attrs.user.is_master() {
        return json!({"allowed": true, "reason": ""});
    }
    let d = authorize(attrs);
    json!({"allowed": d.allowed, "reason": d.reason})
}

/// The UID a real server reports for `user`: a service account's object UID (none for the
/// static tokens, which have none on a real server either).
pub(crate) fn uid_of(store: &crate::store::Store, user: &UserInfo) -> Option<String> {
    let rest = user.name.strip_prefix("system:serviceaccount:")?;
    let (ns, name) = rest.split_once(':')?;
    let sa = store
        .get(crate::resources::ids::SERVICEACCOUNTS, ns, name)
        .ok()?;
    sa.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .map(String::from)
}

/// RBAC attributes of creating a review (granted by the `system:auth-delegator` ClusterRole).
pub(crate) fn create_attributes(review: Review, user: &UserInfo) -> Attributes {
    let (group, plural) = review.resource();
    rbac::Attributes::resource(user.clone(), "create", group, plural, "", "", "")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nobody() -> Requester<'static> {
        static USER: std::sync::LazyLock<UserInfo> = std::sync::LazyLock::new(|| UserInfo {
            name: "nobody".into(),
            groups: vec!["system:authenticated".into()],
        });
        Requester {
            user: &USER,
            uid: None,
            rbac_enforced: true,
        }
    }

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
            &nobody(),
            lookup,
            deny,
        )
        .expect("answer");
        assert_eq!(ok["status"]["authenticated"], true);
        assert_eq!(ok["status"]["user"]["username"], "root");
        let bad = answer(
            Review::Token,
            &json!({"spec": {"token": "bad"}}),
            &nobody(),
            lookup,
            deny,
        )
        .expect("answer");
        assert_eq!(bad["status"]["authenticated"], false);
        let empty = answer(Review::Token, &json!({"spec": {}}), &nobody(), lookup, deny);
        assert_eq!(empty.err().map(|e| e.code), Some(422));
    }

    #[test]
    fn access_review_needs_a_subject_and_one_kind_of_attributes() {
        let none = |_: &str| None;
        let e = answer(
            Review::SubjectAccess,
            &json!({"spec": {"nonResourceAttributes": {"path": "/metrics", "verb": "get"}}}),
            &nobody(),
            none,
            deny,
        );
        assert_eq!(e.err().map(|e| e.code), Some(422));
        let e = answer(
            Review::SubjectAccess,
            &json!({"spec": {"user": "u"}}),
            &nobody(),
            none,
            deny,
        );
        assert_eq!(e.err().map(|e| e.code), Some(422));
        let masters = answer(
            Review::SubjectAccess,
            &json!({"spec": {"user": "u", "groups": ["system:masters"],
                    "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}}),
            &nobody(),
            none,
            deny,
        )
        .expect("answer");
        assert_eq!(masters["status"]["allowed"], true);
    }
}

#[cfg(test)]
mod self_tests {
    use super::*;

    fn allow_create_nodes(a: &Attributes) -> Decision {
        Decision {
            allowed: a.verb == "create",
            reason: String::new(),
        }
    }

    fn ask(user: &UserInfo, enforced: bool, verb: &str) -> Value {
        let who = Requester {
            user,
            uid: None,
            rbac_enforced: enforced,
        };
        let body = json!({"spec": {"resourceAttributes": {"verb": verb, "resource": "nodes"}}});
        answer(
            Review::SelfSubjectAccess,
            &body,
            &who,
            |_| None,
            allow_create_nodes,
        )
        .expect("answer")
    }

    #[test]
    fn self_access_review_asks_for_the_requester() {
        let sa = UserInfo::service_account("kube-system", "x");
        assert_eq!(ask(&sa, true, "create")["status"]["allowed"], true);
        assert_eq!(ask(&sa, true, "delete")["status"]["allowed"], false);
        // Without enforcement everything is allowed, and can-i says so.
        assert_eq!(ask(&sa, false, "delete")["status"]["allowed"], true);
        assert_eq!(
            ask(&UserInfo::admin("root"), true, "delete")["status"]["allowed"],
            true
        );
        let who = Requester {
            user: &sa,
            uid: None,
            rbac_enforced: true,
        };
        let e = answer(
            Review::SelfSubjectAccess,
            &json!({"spec": {}}),
            &who,
            |_| None,
            allow_create_nodes,
        );
        assert_eq!(e.err().map(|e| e.code), Some(422));
    }

    #[test]
    fn self_review_reports_the_requester() {
        let sa = UserInfo::service_account("kube-system", "x");
        let who = Requester {
            user: &sa,
            uid: Some("u-1".into()),
            rbac_enforced: true,
        };
        let v = answer(
            Review::SelfSubject,
            &json!({}),
            &who,
            |_| None,
            allow_create_nodes,
        )
        .expect("answer");
        assert_eq!(v["kind"], "SelfSubjectReview");
        assert_eq!(v["apiVersion"], "authentication.k8s.io/v1");
        assert_eq!(
            v["status"]["userInfo"]["username"],
            "system:serviceaccount:kube-system:x"
        );
        assert_eq!(v["status"]["userInfo"]["uid"], "u-1");
        assert_eq!(
            v["status"]["userInfo"]["groups"][0],
            "system:serviceaccounts"
        );
        assert!(v.get("spec").is_none());
    }

    #[test]
    fn paths_name_their_reviews() {
        for r in Review::ALL {
            let (g, p) = r.resource();
            assert_eq!(Review::from_path(&["apis", g, "v1", p]), Some(r));
        }
        assert_eq!(
            Review::from_path(&["apis", AUTHZ, "v1", "selfsubjectrulesreviews"]),
            None
        );
    }
}
