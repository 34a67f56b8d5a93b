//! Dynamic admission, as kube-apiserver's `MutatingAdmissionWebhook` and
//! `ValidatingAdmissionWebhook` plugins do it: on a create or update (main resource, not a
//! subresource), every stored `admissionregistration.k8s.io/v1` webhook whose rules,
//! namespaceSelector and objectSelector match is called with an `admission.k8s.io/v1`
//! AdmissionReview — mutating webhooks first, one after another, their JSON patches applied and
//! `reinvocationPolicy: IfNeeded` webhooks called once more when a later one changed the
//! object, then validating webhooks. Denials and failures come back with the status, reason and
//! message the real server sends (`failed calling webhook …`, `admission webhook … denied the
//! request…`); `failurePolicy`, `timeoutSeconds`, `sideEffects` on dry runs and `matchPolicy`
//! behave as upstream.
//!
//! TLS is always verified: the webhook's certificate must chain to its `caBundle` (no caBundle:
//! nothing is trusted, where a real server would use its system roots) and name the host
//! dialled. A `service` clientConfig is reached as kube-apiserver reaches it with
//! `--enable-aggregator-routing`: through a ready address of the Service's EndpointSlices (else
//! its Endpoints), while the certificate is checked for `<service>.<namespace>.svc`.
//!
//! Not modelled: PATCH and DELETE requests (not sent to webhooks here), `matchConditions`,
//! warnings returned by webhooks (not passed on to the client), admission metrics.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

use crate::metrics::Verb;
use crate::rbac::UserInfo;
use crate::resources::{RESOURCES, ResourceDesc, ids};
use crate::status::{ApiError, FieldError};
use crate::store::Store;

/// One write, as the admission chain sees it.
pub(crate) struct Request<'a> {
    pub verb: Verb,
    pub res: usize,
    pub ns: &'a str,
    pub name: Option<&'a str>,
    pub subresource: bool,
    pub dry_run: bool,
    pub user: &'a UserInfo,
}

/// One webhook out of a configuration.
struct Hook {
    spec: Value,
    mutating: bool,
}

impl Hook {
    fn name(&self) -> &str {
        self.spec["name"].as_str().unwrap_or_default()
    }
    fn str_or<'a>(&'a self, key: &str, default: &'a str) -> &'a str {
        self.spec[key].as_str().unwrap_or(default)
    }
    fn timeout(&self) -> u64 {
        self.spec["timeoutSeconds"].as_u64().unwrap_or(10)
    }
}

/// Runs the admission chain over a create/update body; returns the body to store.
pub(crate) async fn admit(store: &Store, req: Request<'_>, body: Bytes) -> Result<Bytes, ApiError> {
    let op = match req.verb {
        Verb::Create => "CREATE",
        Verb::Update => "UPDATE",
        _ => return Ok(body),
    };
    // As upstream, webhook configurations are never sent to webhooks (no lock-out).
    let config_kind = matches!(
        req.res,
        ids::MUTATINGWEBHOOKCONFIGURATIONS | ids::VALIDATINGWEBHOOKCONFIGURATIONS
    );
    if req.subresource || config_kind {
        return Ok(body);
    }
    let mutating = hooks(store, ids::MUTATINGWEBHOOKCONFIGURATIONS, true);
    let validating = hooks(store, ids::VALIDATINGWEBHOOKCONFIGURATIONS, false);
    if mutating.is_empty() && validating.is_empty() {
        return Ok(body);
    }
    // A body that does not parse is refused by the write itself, with the real message.
    let Ok(mut obj) = serde_json::from_slice::<Value>(&body) else {
        return Ok(body);
    };
    let desc = &RESOURCES[req.res];
    let old = match (op, req.name) {
        ("UPDATE", Some(name)) => store.get(req.res, req.ns, name).ok(),
        _ => None,
    };
    let call = Call {
        store,
        desc,
        op,
        req: &req,
        old: old.as_deref(),
    };
    let matching: Vec<&Hook> = mutating.iter().filter(|h| call.matches(h, &obj)).collect();
    let mut reinvocable = Vec::new();
    let mut reinvoke = Vec::new();
    for (i, hook) in matching.iter().enumerate() {
        if call.run(hook, &mut obj).await? {
            reinvoke.append(&mut reinvocable);
        }
        if hook.str_or("reinvocationPolicy", "Never") == "IfNeeded" {
            reinvocable.push(i);
        }
    }
    reinvoke.sort_unstable();
    reinvoke.dedup();
    // Reinvoked webhooks must still match the object as it is now (upstream asks again).
    for i in reinvoke {
        if call.matches(matching[i], &obj) {
            call.run(matching[i], &mut obj).await?;
        }
    }
    // Validating webhooks see the final object and cannot change it.
    let checks: Vec<&Hook> = validating
        .iter()
        .filter(|h| call.matches(h, &obj))
        .collect();
    for hook in checks {
        call.run(hook, &mut obj).await?;
    }
    Ok(Bytes::from(serde_json::to_vec(&obj).unwrap_or_default()))
}

/// Every webhook of every configuration of a kind, in configuration-name order.
fn hooks(store: &Store, res: usize, mutating: bool) -> Vec<Hook> {
    let (configs, ..) = store.list(res, None, None, None, usize::MAX, &|_| true);
    configs
        .iter()
        .flat_map(|c| c["webhooks"].as_array().cloned().unwrap_or_default())
        .map(|spec| Hook { spec, mutating })
        .collect()
}

struct Call<'a> {
    store: &'a Store,
    desc: &'static ResourceDesc,
    op: &'static str,
    req: &'a Request<'a>,
    old: Option<&'a Value>,
}

impl Call<'_> {
    /// Rules, namespaceSelector and objectSelector, as `generic.Webhook.ShouldCallHook`.
    fn matches(&self, hook: &Hook, obj: &Value) -> bool {
        let exact = hook.str_or("matchPolicy", "Equivalent") == "Exact";
        let rules = hook.spec["rules"].as_array().cloned().unwrap_or_default();
        let rule_ok = rules.iter().any(|r| self.rule_matches(r, exact));
        let objects = [Some(obj), self.old];
        let object_ok = objects
            .iter()
            .flatten()
            .any(|o| selector_matches(&hook.spec["objectSelector"], o));
        rule_ok && object_ok && self.namespace_matches(&hook.spec["namespaceSelector"], obj)
    }

    fn rule_matches(&self, rule: &Value, exact: bool) -> bool {
        let has = |key: &str, want: &str| {
            rule[key]
                .as_array()
                .is_some_and(|l| l.iter().any(|v| v == "*" || v == want))
        };
        let d = self.desc;
        let resource_ok = rule["resources"]
            .as_array()
            .is_some_and(|l| l.iter().any(|v| v == "*" || v == d.plural));
        let scope_ok = match rule["scope"].as_str().unwrap_or("*") {
            "Cluster" => !d.namespaced,
            "Namespaced" => d.namespaced,
            _ => true,
        };
        // Each kind is served at one version here, so an Equivalent match is any version of
        // the same group and resource (upstream converts the object to the rule's version).
        let version_ok = !exact || has("apiVersions", d.version);
        has("operations", self.op)
            && has("apiGroups", d.group)
            && version_ok
            && resource_ok
            && scope_ok
    }

    /// A cluster-scoped object other than a Namespace matches any namespaceSelector.
    fn namespace_matches(&self, selector: &Value, obj: &Value) -> bool {
        if self.req.res == ids::NAMESPACES {
            return selector_matches(selector, obj);
        }
        if !self.desc.namespaced {
            return true;
        }
        match self.store.get(ids::NAMESPACES, "", self.req.ns) {
            Ok(ns) => selector_matches(selector, &ns),
            Err(_) => selector_matches(selector, &json!({})),
        }
    }

    /// Calls one webhook; applies its patch. `Ok(true)`: the object changed. A failure is
    /// swallowed under `failurePolicy: Ignore`, as upstream.
    async fn run(&self, hook: &Hook, obj: &mut Value) -> Result<bool, ApiError> {
        match self.call(hook, obj).await {
            Ok(changed) => Ok(changed),
            Err(Failure::Denied(e)) => Err(e),
            Err(Failure::Calling(msg)) if hook.str_or("failurePolicy", "Fail") == "Ignore" => {
                tracing::warn!(
                    webhook = hook.name(),
                    "Failed calling webhook, failing open: {msg}"
                );
                Ok(false)
            }
            Err(Failure::Calling(msg)) => Err(ApiError::internal(&msg)),
        }
    }

    async fn call(&self, hook: &Hook, obj: &mut Value) -> Result<bool, Failure> {
        let name = hook.name().to_string();
        let calling =
            |reason: String| Failure::Calling(format!("failed calling webhook {name:?}: {reason}"));
        if self.req.dry_run && !matches!(hook.str_or("sideEffects", ""), "None" | "NoneOnDryRun") {
            return Err(Failure::Denied(ApiError::bad_request(format!(
                "admission webhook {name:?} does not support dry run"
            ))));
        }
        let versions = hook.spec["admissionReviewVersions"].as_array();
        if !versions.is_some_and(|v| v.iter().any(|v| v == "v1")) {
            return Err(calling(
                "webhook does not accept known AdmissionReview versions".into(),
            ));
        }
        let uid = crate::store::new_uid();
        let review = self.review(&uid, obj);
        let target =
            Target::of(self.store, &hook.spec["clientConfig"], hook.timeout()).map_err(&calling)?;
        let response = target.post(&review).await.map_err(|e| {
            calling(format!(
                "failed to call webhook: Post {:?}: {e}",
                target.url
            ))
        })?;
        let invalid = |e: String| {
            let prefix = if hook.mutating {
                "received invalid webhook response: "
            } else {
                ""
            };
            calling(format!("{prefix}{e}"))
        };
        let result = verify(&uid, hook.mutating, &response).map_err(invalid)?;
        if result["allowed"] != true {
            return Err(Failure::Denied(denied(&name, &result["status"])));
        }
        let Some(patch) = result["patch"].as_str() else {
            return Ok(false);
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(patch)
            .map_err(|e| {
                calling(format!(
                    "received undecodable patch in webhook response: {e}"
                ))
            })?;
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).map_err(|e| {
            calling(format!(
                "received undecodable patch in webhook response: {e}"
            ))
        })?;
        let before = obj.clone();
        json_patch::patch(obj, &patch)
            .map_err(|e| Failure::Denied(ApiError::internal(&e.to_string())))?;
        Ok(*obj != before)
    }

    fn review(&self, uid: &str, obj: &Value) -> Value {
        let d = self.desc;
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .or(self.req.name)
            .unwrap_or_default();
        let kind = json!({"group": d.group, "version": d.version, "kind": d.kind});
        let resource = json!({"group": d.group, "version": d.version, "resource": d.plural});
        let options = if self.op == "CREATE" {
            "CreateOptions"
        } else {
            "UpdateOptions"
        };
        json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": kind,
                "resource": resource,
                "requestKind": kind,
                "requestResource": resource,
                "name": name,
                "namespace": if d.namespaced { self.req.ns } else { "" },
                "operation": self.op,
                "userInfo": {"username": self.req.user.name, "groups": self.req.user.groups},
                "object": obj,
                "oldObject": self.old,
                "dryRun": self.req.dry_run,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": options},
            }
        })
    }
}

enum Failure {
    /// The webhook could not be called or answered nonsense: `failurePolicy` decides.
    Calling(String),
    /// The webhook (or the dry-run rule) refused: always an error.
    Denied(ApiError),
}

/// `VerifyAdmissionResponse` for admission.k8s.io/v1.
fn verify(uid: &str, mutating: bool, review: &Value) -> Result<Value, String> {
    let (api, kind) = (review["apiVersion"].as_str(), review["kind"].as_str());
    if api != Some("admission.k8s.io/v1") || kind != Some("AdmissionReview") {
        return Err(format!(
            "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {}, Kind={}",
            api.unwrap_or_default(),
            kind.unwrap_or_default()
        ));
    }
    let r = &review["response"];
    if !r.is_object() {
        return Err("webhook response was absent".into());
    }
    let got = r["uid"].as_str().unwrap_or_default();
    if got != uid {
        return Err(format!("expected response.uid={uid:?}, got {got:?}"));
    }
    let has_patch = r["patch"].as_str().is_some_and(|p| !p.is_empty());
    if has_patch && !mutating {
        return Err("validating webhook may not return response.patch".into());
    }
    match r["patchType"].as_str() {
        None if has_patch => {
            return Err("webhook returned response.patch but not response.patchType".into());
        }
        Some(t) if t != "JSONPatch" => {
            return Err(format!(
                "webhook returned invalid response.patchType of {t:?}"
            ));
        }
        _ => {}
    }
    Ok(r.clone())
}

/// `webhookerrors.ToStatusErr`: the webhook's status, its message prefixed with who denied.
fn denied(name: &str, status: &Value) -> ApiError {
    let by = format!("admission webhook {name:?} denied the request");
    let message = match (status["message"].as_str(), status["reason"].as_str()) {
        (Some(m), _) if !m.is_empty() => format!("{by}: {m}"),
        (_, Some(r)) if !r.is_empty() => format!("{by}: {r}"),
        _ => format!("{by} without explanation"),
    };
    let code = status["code"].as_u64().unwrap_or(0).clamp(400, 599) as u16;
    let reason = status["reason"].as_str().map_or("", static_reason);
    let mut e = ApiError::bad_request(message);
    e.code = code;
    e.reason = reason;
    e.details = status.get("details").cloned();
    e
}

fn static_reason(r: &str) -> &'static str {
    const REASONS: &[&str] = &[
        "Forbidden",
        "Unauthorized",
        "NotFound",
        "AlreadyExists",
        "Conflict",
        "Invalid",
        "BadRequest",
        "MethodNotAllowed",
        "NotAcceptable",
        "TooManyRequests",
        "InternalError",
        "ServiceUnavailable",
        "Timeout",
        "Gone",
        "RequestEntityTooLarge",
        "UnsupportedMediaType",
    ];
    REASONS.iter().find(|s| **s == r).copied().unwrap_or("")
}

/// `metav1.LabelSelector` (matchLabels, matchExpressions) against an object's labels; an
/// absent or empty selector matches everything.
fn selector_matches(selector: &Value, obj: &Value) -> bool {
    let labels = obj.pointer("/metadata/labels");
    let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    let by_label = selector["matchLabels"]
        .as_object()
        .is_none_or(|m| m.iter().all(|(k, v)| label(k) == v.as_str()));
    let exprs = selector["matchExpressions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    by_label
        && exprs.iter().all(|e| {
            let key = e["key"].as_str().unwrap_or_default();
            let values = e["values"].as_array().cloned().unwrap_or_default();
            let within = label(key).is_some_and(|v| values.iter().any(|x| x == v));
            match e["operator"].as_str() {
                Some("In") => within,
                Some("NotIn") => !within,
                Some("Exists") => label(key).is_some(),
                Some("DoesNotExist") => label(key).is_none(),
                _ => false,
            }
        })
}

/// Where and how a webhook is called.
struct Target {
    /// As Go prints it in errors: `https://host:port/path?timeout=10s`.
    url: String,
    /// The name the certificate must carry (DNS name or IP).
    host: String,
    /// What is dialled.
    addr: String,
    path: String,
    ca: Vec<u8>,
    timeout: Duration,
}

impl Target {
    fn of(store: &Store, cc: &Value, timeout: u64) -> Result<Target, String> {
        let ca = match cc["caBundle"].as_str() {
            Some(b) => base64::engine::general_purpose::STANDARD
                .decode(b)
                .map_err(|e| format!("could not get REST client: invalid caBundle: {e}"))?,
            None => Vec::new(),
        };
        let query = format!("?timeout={timeout}s");
        let (host, port, path, addr) = if let Some(url) = cc["url"].as_str() {
            let uri: http::Uri = url
                .parse()
                .map_err(|e| format!("could not get REST client: {e}"))?;
            if uri.scheme_str() != Some("https") {
                return Err(format!(
                    "could not get REST client: webhook url {url:?} is not https"
                ));
            }
            let host = uri
                .host()
                .unwrap_or_default()
                .trim_matches(['[', ']'])
                .to_string();
            let port = uri.port_u16().unwrap_or(443);
            let addr = if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            };
            (host, port, uri.path().to_string(), addr)
        } else {
            let svc = &cc["service"];
            let (ns, name) = (
                svc["namespace"].as_str().unwrap_or_default(),
                svc["name"].as_str().unwrap_or_default(),
            );
            let port = svc["port"].as_u64().unwrap_or(443) as u16;
            let host = format!("{name}.{ns}.svc");
            let path = svc["path"].as_str().unwrap_or("/").to_string();
            let addr = service_address(store, ns, name, port).map_err(|e| {
                format!("failed to call webhook: Post \"https://{host}:{port}{path}{query}\": {e}")
            })?;
            (host, port, path, addr)
        };
        let url_host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.clone()
        };
        Ok(Target {
            url: format!("https://{url_host}:{port}{path}{query}"),
            host,
            addr,
            path: format!("{path}{query}"),
            ca,
            timeout: Duration::from_secs(timeout),
        })
    }

    /// POSTs the review over verified TLS within the timeout; the decoded response.
    async fn post(&self, review: &Value) -> Result<Value, String> {
        match tokio::time::timeout(self.timeout, self.exchange(review)).await {
            Ok(r) => r,
            Err(_) => Err("context deadline exceeded".into()),
        }
    }

    async fn exchange(&self, review: &Value) -> Result<Value, String> {
        let tcp = tokio::net::TcpStream::connect(self.addr.as_str())
            .await
            .map_err(|e| {
                let what = match e.kind() {
                    std::io::ErrorKind::ConnectionRefused => "connection refused".to_string(),
                    _ => e.to_string(),
                };
                format!("dial tcp {}: connect: {what}", self.addr)
            })?;
        let tls = tls_connector(&self.ca)?;
        let server_name = rustls::pki_types::ServerName::try_from(self.host.clone())
            .map_err(|e| format!("invalid server name {:?}: {e}", self.host))?;
        let stream = tls
            .connect(server_name, tcp)
            .await
            .map_err(|e| tls_error(&e))?;
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let body = serde_json::to_vec(review).unwrap_or_default();
        let req = http::Request::post(&self.path)
            .header(http::header::HOST, &self.host)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json, */*")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        if status != http::StatusCode::OK {
            let text = String::from_utf8_lossy(&bytes).trim().to_string();
            return Err(format!(
                "an error on the server ({text:?}) has prevented the request from succeeding (status {})",
                status.as_u16()
            ));
        }
        serde_json::from_slice(&bytes).map_err(|e| format!("couldn't decode the response: {e}"))
    }
}

/// A client that trusts exactly the caBundle's certificates.
fn tls_connector(ca_pem: &[u8]) -> Result<tokio_rustls::TlsConnector, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|e| format!("could not get REST client: invalid caBundle: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("could not get REST client: invalid caBundle: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(cfg)))
}

/// TLS failures in the words Go's crypto/tls uses.
fn tls_error(e: &std::io::Error) -> String {
    let inner = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
    match inner {
        // A CA of the same name that did not sign it is, to Go, no authority either.
        Some(rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer | rustls::CertificateError::BadSignature,
        )) => "tls: failed to verify certificate: x509: certificate signed by unknown authority"
            .into(),
        Some(rustls::Error::InvalidCertificate(c)) => {
            format!("tls: failed to verify certificate: x509: {c:?}")
        }
        _ => format!("remote error: tls: {e}"),
    }
}

/// A ready endpoint address of the Service for `port`: EndpointSlices first, then Endpoints.
fn service_address(store: &Store, ns: &str, name: &str, port: u16) -> Result<String, String> {
    let svc = store
        .get(ids::SERVICES, ns, name)
        .map_err(|_| format!("service \"{name}\" not found"))?;
    let ports = svc
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let sp = ports
        .iter()
        .find(|p| p["port"].as_u64() == Some(u64::from(port)))
        .ok_or_else(|| format!("service \"{name}\" has no port {port}"))?;
    let port_name = sp["name"].as_str().unwrap_or_default();
    let fallback = sp["targetPort"].as_u64().unwrap_or(u64::from(port));
    let join = |ip: &str, p: u64| {
        if ip.contains(':') {
            format!("[{ip}]:{p}")
        } else {
            format!("{ip}:{p}")
        }
    };
    let (slices, ..) = store.list(
        ids::ENDPOINTSLICES,
        Some(ns),
        None,
        None,
        usize::MAX,
        &|s| {
            s.pointer("/metadata/labels/kubernetes.io~1service-name")
                .and_then(Value::as_str)
                == Some(name)
        },
    );
    for s in &slices {
        let p = s["ports"].as_array().and_then(|ps| {
            ps.iter()
                .find(|p| p["name"].as_str().unwrap_or_default() == port_name)
        });
        let p = p.and_then(|p| p["port"].as_u64()).unwrap_or(fallback);
        let eps = s["endpoints"].as_array().cloned().unwrap_or_default();
        let ready = eps
            .iter()
            .find(|e| e.pointer("/conditions/ready") != Some(&json!(false)));
        if let Some(ip) = ready.and_then(|e| e["addresses"][0].as_str()) {
            return Ok(join(ip, p));
        }
    }
    if let Ok(ep) = store.get(ids::ENDPOINTS, ns, name) {
        for subset in ep["subsets"].as_array().cloned().unwrap_or_default() {
            let p = subset["ports"].as_array().and_then(|ps| {
                ps.iter()
                    .find(|p| p["name"].as_str().unwrap_or_default() == port_name)
            });
            let p = p.and_then(|p| p["port"].as_u64()).unwrap_or(fallback);
            if let Some(ip) = subset["addresses"][0]["ip"].as_str() {
                return Ok(join(ip, p));
            }
        }
    }
    Err(format!("no endpoints available for service \"{name}\""))
}

/// Validation of Mutating/ValidatingWebhookConfiguration objects (admissionregistration/v1).
pub(crate) fn validate_config(obj: &Value, mutating: bool, errs: &mut Vec<FieldError>) {
    let hooks = obj["webhooks"].as_array().cloned().unwrap_or_default();
    let mut names = std::collections::HashSet::new();
    for (i, h) in hooks.iter().enumerate() {
        let at = |f: &str| format!("webhooks[{i}].{f}");
        let one_of =
            |f: &str, default: Option<&str>, allowed: &[&str], errs: &mut Vec<FieldError>| match (
                h[f].as_str(),
                default,
            ) {
                (None, None) => errs.push(FieldError::required(at(f), "")),
                (Some(v), _) if !allowed.contains(&v) => {
                    errs.push(FieldError::not_supported(at(f), &h[f], allowed))
                }
                _ => {}
            };
        match h["name"].as_str() {
            None | Some("") => errs.push(FieldError::required(at("name"), "")),
            Some(n) if !names.insert(n.to_string()) => {
                errs.push(FieldError::duplicate(at("name"), &h["name"]))
            }
            _ => {}
        }
        one_of("sideEffects", None, &["None", "NoneOnDryRun"], errs);
        one_of("failurePolicy", Some("Fail"), &["Ignore", "Fail"], errs);
        one_of(
            "matchPolicy",
            Some("Equivalent"),
            &["Exact", "Equivalent"],
            errs,
        );
        if mutating {
            one_of(
                "reinvocationPolicy",
                Some("Never"),
                &["Never", "IfNeeded"],
                errs,
            );
        }
        if h["admissionReviewVersions"]
            .as_array()
            .is_none_or(Vec::is_empty)
        {
            errs.push(FieldError::required(
                at("admissionReviewVersions"),
                "must specify one of v1, v1beta1",
            ));
        }
        if let Some(t) = h.get("timeoutSeconds")
            && !t.as_u64().is_some_and(|t| (1..=30).contains(&t))
        {
            errs.push(FieldError::invalid(
                at("timeoutSeconds"),
                t,
                "the timeout value must be between 1 and 30 seconds",
            ));
        }
        let cc = &h["clientConfig"];
        match (cc.get("url"), cc.get("service")) {
            (Some(_), Some(_)) | (None, None) => errs.push(FieldError::required(
                at("clientConfig"),
                "exactly one of url or service is required",
            )),
            _ => {}
        }
    }
}
