//! HTTP request handling: routing, auth, faults, accounting, and the REST verbs.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use parking_lot::RwLock;
use serde_json::{Map, Value, json};
use tokio::sync::{broadcast, mpsc};

use crate::faults::FaultConfig;
use crate::managed::Writer;
use crate::metrics::{Metrics, RequestKey, Verb};
use crate::patch::{self, PatchType};
use crate::rbac::{self, Attributes, UserInfo};
use crate::resources::{self, RESOURCES, ResourceDesc, ids};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::{
    Deleted, Endpoint, EventType, Key, Manage, Preconditions, Store, WatchEvent, WatchStart,
    event_line, now_rfc3339,
};
use crate::table::{self, IncludeObject};

const MAX_BODY: usize = 3 * 1024 * 1024;

/// State shared by all connections.
pub(crate) struct Shared {
    pub store: Arc<Store>,
    pub metrics: Metrics,
    /// Bearer token → identity.
    pub tokens: RwLock<HashMap<String, UserInfo>>,
    /// Whether RBAC is enforced for users outside `system:masters`.
    pub rbac: bool,
    pub faults: Arc<RwLock<FaultConfig>>,
    pub disconnect: Arc<tokio::sync::watch::Sender<u64>>,
    pub bookmark_interval: Duration,
    pub default_watch_timeout: Duration,
    pub server_address: RwLock<String>,
    /// Per-request server CPU and commit latency (free by default).
    pub cost: RwLock<Arc<crate::cost::CostModel>>,
    /// Held by a Service create for its allocations (`CostModel::allocate`): one at a time.
    pub allocations: tokio::sync::Mutex<()>,
    /// What writes wait for at commit (`CostModel::commit_queue`, `CostModel::group_commit`).
    pub(crate) etcd: crate::cost::Etcd,
    /// Connections open now (counted once their TLS handshake succeeded, when serving TLS).
    pub connections: std::sync::atomic::AtomicU64,
    /// Connections accepted since the start.
    pub accepted: std::sync::atomic::AtomicU64,
    /// The watch cache's per-kind cursors, when the cost model charges dispatch.
    pub dispatch: crate::watch_cache::Dispatch,
    /// The runtime it serves on, for tasks started from a caller's ([`crate::Config::threads`]).
    pub runtime: tokio::runtime::Handle,
}

/// Query parameters, percent-decoded.
struct Query(Vec<(String, String)>);

fn pct_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Query {
    fn parse(q: Option<&str>) -> Self {
        Self(
            q.unwrap_or_default()
                .split('&')
                .filter(|p| !p.is_empty())
                .map(|p| match p.split_once('=') {
                    Some((k, v)) => (pct_decode(k), pct_decode(v)),
                    None => (pct_decode(p), String::new()),
                })
                .collect(),
        )
    }
    fn get(&self, k: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(kk, _)| kk == k)
            .map(|(_, v)| v.as_str())
    }
    fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("1" | "true" | "True"))
    }
}

fn json_bytes(code: u16, body: Bytes, content_type: &str) -> Response<Body> {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(content_type).unwrap_or(HeaderValue::from_static("application/json")),
    );
    r
}

fn json_resp(code: u16, v: &Value) -> Response<Body> {
    json_bytes(
        code,
        Bytes::from(serde_json::to_vec(v).unwrap_or_default()),
        "application/json",
    )
}

fn error_resp(e: &ApiError) -> Response<Body> {
    let mut r = json_resp(e.code, &e.to_status());
    if let Some(s) = e.retry_after
        && let Ok(v) = HeaderValue::from_str(&s.to_string())
    {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

fn text_resp(code: u16, s: String) -> Response<Body> {
    let mut r = Response::new(Body::from(s));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// A parsed resource URL.
struct Target {
    res: usize,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

/// What the client asked to receive (the Accept header's `as=` parameter).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    Plain,
    Table(IncludeObject),
    Metadata,
}

/// The response encoding chosen from `Accept`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    Json,
    Protobuf,
}

/// What content negotiation settled on, as kube-apiserver negotiates it: media ranges in
/// q-value order (ties keep the client's order), the first one the server can produce wins.
#[derive(Clone, Copy)]
struct Negotiated {
    shape: Shape,
    format: Format,
    /// Whether plain JSON is acceptable too (the fallback when protobuf cannot carry a body).
    json_ok: bool,
}

/// One media range of an `Accept` header: (q, position, media type, parameters).
type MediaRange<'a> = (f32, usize, String, Vec<(&'a str, &'a str)>);

fn media_ranges(accept: &str) -> Vec<MediaRange<'_>> {
    let mut out: Vec<MediaRange<'_>> = accept
        .split(',')
        .enumerate()
        .filter_map(|(i, part)| {
            let mut it = part.split(';');
            let media = it.next()?.trim().to_ascii_lowercase();
            if media.is_empty() {
                return None;
            }
            let params: Vec<(&str, &str)> = it
                .filter_map(|p| p.split_once('='))
                .map(|(k, v)| (k.trim(), v.trim().trim_matches('"')))
                .collect();
            let q = params
                .iter()
                .find(|(k, _)| *k == "q")
                .and_then(|(_, v)| v.parse::<f32>().ok())
                .unwrap_or(1.0);
            Some((q, i, media, params))
        })
        .collect();
    out.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    out
}

fn negotiate(headers: &HeaderMap, q: &Query) -> Result<Negotiated, ApiError> {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let ranges = media_ranges(accept);
    if ranges.is_empty() {
        return Ok(Negotiated {
            shape: Shape::Plain,
            format: Format::Json,
            json_ok: true,
        });
    }
    let is_json = |m: &str| matches!(m, "application/json" | "application/*" | "*/*");
    let json_ok = ranges
        .iter()
        .any(|(qv, _, m, ps)| *qv > 0.0 && is_json(m) && !ps.iter().any(|(k, _)| *k == "as"));
    for (qv, _, media, params) in &ranges {
        if *qv <= 0.0 {
            continue;
        }
        let format = match media.as_str() {
            m if is_json(m) => Format::Json,
            crate::proto::MEDIA_TYPE => Format::Protobuf,
            _ => continue,
        };
        let param = |k: &str| params.iter().find(|(kk, _)| *kk == k).map(|(_, v)| *v);
        let meta_group = param("g").is_none_or(|g| g == "meta.k8s.io");
        let shape = match param("as") {
            None => Shape::Plain,
            // Tables exist in JSON only, as with kube-apiserver.
            Some("Table") if format == Format::Json && meta_group && param("v") == Some("v1") => {
                Shape::Table(match q.get("includeObject") {
                    Some("None") => IncludeObject::None,
                    Some("Object") => IncludeObject::Object,
                    _ => IncludeObject::Metadata,
                })
            }
            Some("PartialObjectMetadata" | "PartialObjectMetadataList")
                if param("g") == Some("meta.k8s.io") =>
            {
                Shape::Metadata
            }
            Some(_) => continue,
        };
        return Ok(Negotiated {
            shape,
            format,
            json_ok,
        });
    }
    Err(ApiError::not_acceptable())
}

/// A request body as JSON: protobuf bodies are transcoded, other media types get 415.
/// PATCH bodies are left to the patch code, which knows the patch media types.
fn json_body(verb: Verb, body: Bytes, content_type: &str) -> Result<Bytes, ApiError> {
    let media = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    if verb == Verb::Patch || body.is_empty() || matches!(media.as_str(), "" | "application/json") {
        return Ok(body);
    }
    if media != crate::proto::MEDIA_TYPE {
        return Err(ApiError::unsupported_body_type(content_type));
    }
    let obj = crate::proto::decode_object(&body)
        .map_err(|e| ApiError::bad_request(format!("the object provided is unrecognized: {e}")))?;
    Ok(Bytes::from(serde_json::to_vec(&obj).unwrap_or_default()))
}

/// Re-encodes a JSON API response as protobuf: objects, lists and Status in the `k8s\0`
/// envelope, watch streams as length-prefixed WatchEvent frames. Bodies protobuf cannot carry
/// (no message for the kind) stay JSON when the client accepts JSON, else 406.
async fn to_protobuf(resp: Response<Body>, watch: bool, json_ok: bool) -> Response<Body> {
    use futures::StreamExt as _;
    let ct = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !ct.starts_with("application/json") || ct.contains("as=Table") {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    if watch && parts.status == StatusCode::OK {
        let frames = body
            .into_data_stream()
            .map(|chunk| chunk.map(|b| Bytes::from(crate::proto::watch_lines_to_frames(&b))));
        parts.headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(crate::proto::WATCH_MEDIA_TYPE),
        );
        return Response::from_parts(parts, Body::from_stream(frames));
    }
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return error_resp(&ApiError::internal("reading the response body"));
    };
    let encoded = serde_json::from_slice::<Value>(&bytes)
        .map_err(|e| crate::proto::CodecError(e.to_string()))
        .and_then(|v| crate::proto::encode_object(&v));
    match encoded {
        Ok(b) => {
            parts.headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(crate::proto::MEDIA_TYPE),
            );
            parts.headers.remove(header::CONTENT_LENGTH);
            Response::from_parts(parts, Body::from(b))
        }
        Err(_) if json_ok => Response::from_parts(parts, Body::from(bytes)),
        Err(e) => {
            tracing::debug!(error = %e, "kube-sim: response not encodable as protobuf");
            let status = ApiError::not_acceptable();
            match crate::proto::encode_object(&status.to_status()) {
                Ok(b) => {
                    let mut r = json_bytes(406, Bytes::from(b), crate::proto::MEDIA_TYPE);
                    *r.status_mut() = StatusCode::NOT_ACCEPTABLE;
                    r
                }
                Err(_) => error_resp(&status),
            }
        }
    }
}

fn to_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
    })
}

/// Parses `/api/v1/...` and `/apis/{g}/{v}/...` into a target, kube-apiserver's RequestInfo way.
fn parse_target(segs: &[&str]) -> Result<Option<Target>, ApiError> {
    let (group, version, rest) = match segs {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Ok(None),
    };
    if rest.is_empty() {
        return Ok(None);
    }
    let mut ns = None;
    let mut parts: &[&str] = rest;
    if parts[0] == "namespaces" && parts.len() > 2 && !matches!(parts[2], "status" | "finalize") {
        ns = Some(parts[1].to_string());
        parts = &parts[2..];
    }
    let Some(res) = resources::find(group, version, parts[0]) else {
        return Err(ApiError::no_route());
    };
    let name = parts.get(1).map(|s| s.to_string());
    let sub = parts.get(2).map(|s| s.to_string());
    if parts.len() > 3 {
        return Err(ApiError::no_route());
    }
    Ok(Some(Target { res, ns, name, sub }))
}

impl Shared {
    /// The identity behind the request's bearer token, if the token is known.
    pub(crate) fn authenticate(&self, headers: &HeaderMap) -> Option<UserInfo> {
        let tok = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })?;
        self.tokens.read().get(tok.trim()).cloned()
    }

    /// Decides `attrs` against the stored RBAC objects (the SubjectAccessReview answer).
    pub(crate) fn authorize(&self, attrs: &Attributes) -> rbac::Decision {
        rbac::authorize(&self.store.rbac_policy(), attrs)
    }

    /// `Err(403)` when RBAC is enforced and denies the request, worded as kube-apiserver's.
    fn enforce(&self, user: &UserInfo, attrs: impl FnOnce() -> Attributes) -> Result<(), ApiError> {
        if !self.rbac || user.is_master() {
            return Ok(());
        }
        let attrs = attrs();
        let d = self.authorize(&attrs);
        if d.allowed {
            Ok(())
        } else {
            Err(ApiError::forbidden(&attrs, &d.reason))
        }
    }

    /// Entry point for every request: content negotiation around [`Self::handle_json`],
    /// which speaks JSON only.
    pub(crate) async fn handle<B>(self: Arc<Self>, req: Request<B>) -> Response<Body>
    where
        B: hyper::body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let path = req.uri().path();
        if !(path == "/api" || path.starts_with("/api/") || path.starts_with("/apis")) {
            return self.handle_json(req, None).await;
        }
        let q = Query::parse(req.uri().query());
        let neg = match negotiate(req.headers(), &q) {
            Ok(n) => n,
            Err(e) => return error_resp(&e),
        };
        let watch = req.method() == Method::GET && q.flag("watch");
        let resp = self.handle_json(req, Some(neg.shape)).await;
        match neg.format {
            Format::Json => resp,
            Format::Protobuf => to_protobuf(resp, watch, neg.json_ok).await,
        }
    }

    async fn handle_json<B>(
        self: Arc<Self>,
        req: Request<B>,
        shape: Option<Shape>,
    ) -> Response<Body>
    where
        B: hyper::body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (parts, body) = req.into_parts();
        let path = parts.uri.path().to_string();
        let q = Query::parse(parts.uri.query());
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();

        match segs.as_slice() {
            ["healthz"] | ["livez"] | ["readyz"] => return text_resp(200, "ok".into()),
            ["version"] => return json_resp(200, &crate::discovery::version()),
            _ => {}
        }
        let Some(user) = self.authenticate(&parts.headers) else {
            return error_resp(&ApiError::unauthorized());
        };
        match segs.as_slice() {
            ["metrics"] => {
                // Discovery stays open to every authenticated user (the bootstrap
                // system:discovery role); /metrics needs a grant, as on a real cluster.
                let check = self.enforce(&user, || {
                    Attributes::non_resource(user.clone(), "get", &path)
                });
                return match check {
                    Ok(()) => text_resp(200, self.metrics.render()),
                    Err(e) => error_resp(&e),
                };
            }
            ["api"] => {
                return json_resp(
                    200,
                    &crate::discovery::api_versions(&self.server_address.read()),
                );
            }
            ["apis"] => return json_resp(200, &crate::discovery::api_group_list()),
            ["openapi", "v3"] => return json_resp(200, &crate::discovery::openapi_v3_index()),
            ["openapi", "v3", rest @ ..] => {
                let gv = rest.join("/");
                return match crate::openapi::cached(&gv, || crate::discovery::openapi_v3_doc(&gv)) {
                    Some(b) => json_bytes(200, b, "application/json"),
                    None => error_resp(&ApiError::no_route()),
                };
            }
            ["api", "v1"] => return json_resp(200, &crate::discovery::resource_list("", "v1")),
            ["apis", g] => {
                return match crate::discovery::api_group(g) {
                    Some(v) => json_resp(200, &v),
                    None => error_resp(&ApiError::no_route()),
                };
            }
            ["apis", g, v] => {
                return if crate::discovery::serves(g, v) {
                    json_resp(200, &crate::discovery::resource_list(g, v))
                } else {
                    error_resp(&ApiError::no_route())
                };
            }
            _ => {}
        }
        if let Some(review) = crate::review::Review::from_path(&segs) {
            return self.review(review, &parts, body, &user).await;
        }
        let target = match parse_target(&segs) {
            Ok(Some(t)) => t,
            Ok(None) => return error_resp(&ApiError::no_route()),
            Err(e) => return error_resp(&e),
        };
        let client = parts
            .headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .map(|s| s.chars().take(256).collect::<String>())
            .unwrap_or_else(|| "unknown".into());
        let desc = &RESOURCES[target.res];
        let verb = match (&parts.method, target.name.is_some()) {
            (&Method::GET, false) if q.flag("watch") => Verb::Watch,
            (&Method::GET, false) => Verb::List,
            (&Method::GET, true) if q.flag("watch") => Verb::Watch,
            (&Method::GET, true) => Verb::Get,
            (&Method::POST, _) => Verb::Create,
            (&Method::PUT, true) => Verb::Update,
            (&Method::PATCH, true) => Verb::Patch,
            (&Method::DELETE, true) => Verb::Delete,
            (m, _) => {
                let e = ApiError::method_not_supported(desc, &m.as_str().to_lowercase());
                self.count(verb_guess(m), &target, e.code, &client, &user);
                return error_resp(&e);
            }
        };
        if let Err(e) = self.enforce(&user, || request_attributes(&user, verb, &target, &q)) {
            self.count(verb, &target, e.code, &client, &user);
            return error_resp(&e);
        }

        let (latency, mut fate, retry_after, level) = {
            let f = self.faults.read();
            let level = f.priority_level(verb, &client);
            (
                f.latency,
                f.roll(verb, &client),
                f.retry_after.max(1),
                level,
            )
        };
        // Held until this function returns: the request occupies its seat while it executes.
        let seat = match (fate, level) {
            (None, Some(level)) => Some(level.admit().await),
            _ => None,
        };
        if matches!(seat, Some(None)) {
            fate = Some(429);
        }
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let conflict = self.faults.write().take_conflict(
            verb,
            desc.plural,
            target.sub.as_deref().unwrap_or_default(),
        );
        let resp = match fate {
            _ if conflict => error_resp(&ApiError::conflict(
                desc,
                target.name.as_deref().unwrap_or_default(),
            )),
            Some(429) => error_resp(&ApiError::too_many_requests(retry_after)),
            Some(503) => error_resp(&ApiError::unavailable()),
            Some(_) => error_resp(&ApiError::internal("injected fault")),
            None => {
                let body = if matches!(
                    verb,
                    Verb::Create | Verb::Update | Verb::Patch | Verb::Delete
                ) {
                    match Limited::new(body, MAX_BODY).collect().await {
                        Ok(b) => b.to_bytes(),
                        Err(_) => {
                            let e = ApiError::too_large();
                            self.count(verb, &target, e.code, &client, &user);
                            return error_resp(&e);
                        }
                    }
                } else {
                    Bytes::new()
                };
                let content_type = parts
                    .headers
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("application/json")
                    .to_string();
                let body = match json_body(verb, body, &content_type) {
                    Ok(b) => b,
                    Err(e) => {
                        self.count(verb, &target, e.code, &client, &user);
                        return error_resp(&e);
                    }
                };
                let admit = crate::admission::Request {
                    verb,
                    res: target.res,
                    ns: target.ns.as_deref().unwrap_or_default(),
                    name: target.name.as_deref(),
                    subresource: target.sub.is_some(),
                    dry_run: dry_run(&q).unwrap_or(false),
                    user: &user,
                };
                let body = match crate::admission::admit(&self.store, admit, body).await {
                    Ok(b) => b,
                    Err(e) => {
                        self.count(verb, &target, e.code, &client, &user);
                        return error_resp(&e);
                    }
                };
                let shape = shape.unwrap_or(Shape::Plain);
                let cost = self.cost.read().clone();
                if !cost.is_free() && verb.is_write() {
                    // A write is paid for before anyone can see it, as on a real server where
                    // watchers hear of it only after etcd committed it.
                    // A Service's ClusterIP and NodePorts are allocated (etcd transactions of
                    // their own) before the Service itself is written.
                    if verb == Verb::Create
                        && target.sub.is_none()
                        && RESOURCES[target.res].plural == "services"
                    {
                        cost.charge_allocation(&self.allocations).await;
                    }
                    let bytes = body.len().max(self.stored_size(&target));
                    cost.charge(verb, bytes, &self.etcd).await;
                }
                // A write is counted before any snapshot of the counters can see its effect
                // (`Metrics::counting`); dispatch never awaits, so no guard spans an await.
                let resp = {
                    let _counting = self.metrics.counting();
                    let resp = match self.clone().dispatch(
                        verb,
                        &target,
                        &q,
                        body,
                        (&content_type, &client),
                        shape,
                    ) {
                        Ok(r) => r,
                        Err(e) => error_resp(&e),
                    };
                    if verb.is_write() {
                        self.count(verb, &target, resp.status().as_u16(), &client, &user);
                    }
                    resp
                };
                if !cost.is_free() && !verb.is_write() {
                    let answered = hyper::body::Body::size_hint(resp.body())
                        .exact()
                        .unwrap_or(0);
                    let answered = usize::try_from(answered).unwrap_or(usize::MAX);
                    cost.charge(verb, answered, &self.etcd).await;
                }
                if !verb.is_write() {
                    self.count(verb, &target, resp.status().as_u16(), &client, &user);
                }
                return resp;
            }
        };
        self.count(verb, &target, resp.status().as_u16(), &client, &user);
        resp
    }

    /// Encoded size of the object a write targets (0 for a create): a small patch to a large
    /// object costs a real server the whole object (decode, apply, encode, etcd write).
    fn stored_size(&self, t: &Target) -> usize {
        let Some(name) = t.name.as_deref() else {
            return 0;
        };
        self.store
            .get(t.res, t.ns.as_deref().unwrap_or_default(), name)
            .ok()
            .and_then(|v| serde_json::to_vec(&*v).ok())
            .map_or(0, |b| b.len())
    }

    /// Token, subject-access and self reviews: create-only, answered from the tokens and RBAC.
    async fn review<B>(
        &self,
        review: crate::review::Review,
        parts: &http::request::Parts,
        body: B,
        user: &UserInfo,
    ) -> Response<Body>
    where
        B: hyper::body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (group, plural) = review.resource();
        let result = async {
            if parts.method != Method::POST {
                return Err(ApiError::bad_request(format!(
                    "{plural}.{group} supports only create"
                )));
            }
            if !review.is_self() {
                self.enforce(user, || crate::review::create_attributes(review, user))?;
            }
            let bytes = Limited::new(body, MAX_BODY)
                .collect()
                .await
                .map_err(|_| ApiError::too_large())?
                .to_bytes();
            let content_type = parts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("application/json");
            let req = parse_body(&json_body(Verb::Create, bytes, content_type)?)?;
            let who = crate::review::Requester {
                user,
                uid: crate::review::uid_of(&self.store, user),
                rbac_enforced: self.rbac,
            };
            crate::review::answer(
                review,
                &req,
                &who,
                |t| self.tokens.read().get(t).cloned(),
                |a| self.authorize(a),
            )
        }
        .await;
        let resp = match result {
            Ok(v) => json_resp(201, &v),
            Err(e) => error_resp(&e),
        };
        let client = parts
            .headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("unknown");
        self.metrics.record(RequestKey {
            verb: Verb::Create,
            group: group.to_string(),
            resource: plural.to_string(),
            subresource: String::new(),
            code: resp.status().as_u16(),
            client: client.chars().take(256).collect(),
            user: user.name.clone(),
        });
        resp
    }

    fn count(&self, verb: Verb, t: &Target, code: u16, client: &str, user: &UserInfo) {
        let d = &RESOURCES[t.res];
        self.metrics.record(RequestKey {
            verb,
            group: d.group.to_string(),
            resource: d.plural.to_string(),
            subresource: t.sub.clone().unwrap_or_default(),
            code,
            client: client.to_string(),
            user: user.name.clone(),
        });
    }

    /// Synchronous on purpose: a write and its accounting happen under one guard (see
    /// `Metrics::counting`), which must not be held across an await.
    fn dispatch(
        self: Arc<Self>,
        verb: Verb,
        t: &Target,
        q: &Query,
        body: Bytes,
        (content_type, client): (&str, &str),
        shape: Shape,
    ) -> Result<Response<Body>, ApiError> {
        let desc = &RESOURCES[t.res];
        let writer = Writer::new(q.get("fieldManager"), Some(client));
        if desc.namespaced != t.ns.is_some() {
            // Namespaced kinds may be listed and watched across namespaces; nothing else.
            let all_ns_read =
                desc.namespaced && t.name.is_none() && matches!(verb, Verb::List | Verb::Watch);
            if !all_ns_read {
                return Err(ApiError::no_route());
            }
        }
        let ns = t.ns.clone().unwrap_or_default();
        let endpoint = match t.sub.as_deref() {
            None => Endpoint::Main,
            Some("status") if desc.status_subresource => Endpoint::Status,
            Some("token") if t.res == ids::SERVICEACCOUNTS && verb == Verb::Create => {
                let name = t.name.clone().unwrap_or_default();
                return self.token_request(&ns, &name, &body);
            }
            Some("scale") if crate::scale::scalable(t.res) => {
                let name = t.name.as_deref().unwrap_or_default();
                let at = (ns.as_str(), name);
                let dry = dry_run(q)?;
                let v =
                    crate::scale::serve(&self.store, verb, t.res, at, &body, content_type, dry)?;
                return Ok(json_resp(200, &v));
            }
            Some(_) => return Err(ApiError::no_route()),
        };
        if endpoint == Endpoint::Status && !matches!(verb, Verb::Get | Verb::Update | Verb::Patch) {
            return Err(ApiError::method_not_supported(desc, verb.as_str()));
        }
        let store = &self.store;
        match verb {
            Verb::List => self.list(t, q, shape),
            Verb::Watch => self.clone().watch(t, q, shape),
            Verb::Get => {
                let name = t.name.as_deref().unwrap_or_default();
                let obj = store.get(t.res, &ns, name)?;
                Ok(render_one(t.res, 200, &obj, shape))
            }
            Verb::Create => {
                if t.name.is_some() {
                    return Err(ApiError::method_not_supported(desc, "create"));
                }
                let obj = parse_body(&body)?;
                check_type(desc, &obj)?;
                strict(desc, q, &obj)?;
                let manage = Manage::Update(&writer);
                let out = store.create_as(t.res, &ns, obj, dry_run(q)?, manage)?;
                Ok(render_one(t.res, 201, &out, shape))
            }
            Verb::Update => {
                let name = t.name.as_deref().unwrap_or_default();
                let obj = parse_body(&body)?;
                check_type(desc, &obj)?;
                strict(desc, q, &obj)?;
                let out = store.update_as(
                    t.res,
                    (&ns, name),
                    endpoint,
                    &mut |_| Ok(obj.clone()),
                    dry_run(q)?,
                    Manage::Update(&writer),
                )?;
                Ok(render_one(t.res, 200, &out, shape))
            }
            Verb::Patch => {
                let name = t.name.as_deref().unwrap_or_default();
                if crate::apply::is_apply(content_type) {
                    return self.server_side_apply(t, q, endpoint, &body, shape);
                }
                let ty = PatchType::from_content_type(content_type)?;
                let out = store.update_as(
                    t.res,
                    (&ns, name),
                    endpoint,
                    &mut |cur| {
                        let out = patch::apply(desc, cur, ty, &body)?;
                        strict(desc, q, &out)?;
                        Ok(out)
                    },
                    dry_run(q)?,
                    Manage::Update(&writer),
                )?;
                Ok(render_one(t.res, 200, &out, shape))
            }
            Verb::Delete => {
                let name = t.name.as_deref().unwrap_or_default();
                let pre = delete_preconditions(&body, q)?;
                if dry_run(q)? {
                    // What would be deleted, left in place.
                    let obj = store.get(t.res, &ns, name)?;
                    return Ok(render_one(t.res, 200, &obj, shape));
                }
                match store.delete(t.res, &ns, name, &pre)? {
                    Deleted::Pending(obj) => Ok(render_one(t.res, 200, &obj, shape)),
                    Deleted::Gone(obj) => {
                        if t.res == ids::SERVICES || t.res == ids::NAMESPACES {
                            return Ok(render_one(t.res, 200, &obj, shape));
                        }
                        let mut details = Map::new();
                        details.insert("name".into(), json!(name));
                        if !desc.group.is_empty() {
                            details.insert("group".into(), json!(desc.group));
                        }
                        details.insert("kind".into(), json!(desc.plural));
                        if let Some(uid) = obj.pointer("/metadata/uid") {
                            details.insert("uid".into(), uid.clone());
                        }
                        Ok(json_resp(
                            200,
                            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                    "status": "Success", "details": details}),
                        ))
                    }
                }
            }
        }
    }

    /// `PATCH` with an apply patch: creates the object when absent, else merges into it.
    fn server_side_apply(
        &self,
        t: &Target,
        q: &Query,
        endpoint: Endpoint,
        body: &[u8],
        shape: Shape,
    ) -> Result<Response<Body>, ApiError> {
        let desc = &RESOURCES[t.res];
        let (ns, name) = (
            t.ns.as_deref().unwrap_or_default(),
            t.name.as_deref().unwrap_or_default(),
        );
        let manager = q
            .get("fieldManager")
            .filter(|m| !m.is_empty())
            .ok_or_else(|| ApiError::bad_request("fieldManager is required for apply requests"))?;
        let mut cfg = crate::apply::parse_config(desc, body)?;
        strict(desc, q, &cfg)?;
        match cfg.pointer("/metadata/name").and_then(Value::as_str) {
            Some(n) if n != name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
            Some(_) => {}
            None => {
                if let Some(m) = cfg.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.insert("name".into(), json!(name));
                }
            }
        }
        let req = crate::apply::Apply {
            manager,
            force: q.flag("force"),
            endpoint,
        };
        let dry = dry_run(q)?;
        match self.store.get(t.res, ns, name) {
            Err(e) if e.code == 404 && endpoint == Endpoint::Main => {
                let obj = crate::apply::apply(desc, None, &cfg, &req)?;
                let out = self.store.create_as(t.res, ns, obj, dry, Manage::Applied)?;
                return Ok(render_one(t.res, 201, &out, shape));
            }
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        let out = self.store.update_as(
            t.res,
            (ns, name),
            endpoint,
            &mut |cur| crate::apply::apply(desc, Some(cur), &cfg, &req),
            dry,
            Manage::Applied,
        )?;
        Ok(render_one(t.res, 200, &out, shape))
    }

    fn token_request(&self, ns: &str, name: &str, body: &[u8]) -> Result<Response<Body>, ApiError> {
        self.store.get(ids::SERVICEACCOUNTS, ns, name)?;
        let req: Value = if body.is_empty() {
            json!({})
        } else {
            parse_body(body)?
        };
        let exp = req
            .pointer("/spec/expirationSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(3600);
        if exp < 600 {
            return Err(ApiError::bad_request(
                "spec.expirationSeconds: Invalid value: must be at least 600 seconds",
            ));
        }
        let rand_part: String = (0..32)
            .map(|_| {
                let c = b"abcdefghijklmnopqrstuvwxyz0123456789"[rand::random_range(0..36)];
                c as char
            })
            .collect();
        let token = format!("kube-sim.sa.{ns}.{name}.{rand_part}");
        self.tokens
            .write()
            .insert(token.clone(), UserInfo::service_account(ns, name));
        let expires = jiff::Timestamp::now()
            .checked_add(jiff::SignedDuration::from_secs(exp))
            .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
            .unwrap_or_else(|_| now_rfc3339());
        let out = json!({
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": now_rfc3339()},
            "spec": {
                "audiences": req.pointer("/spec/audiences").cloned().unwrap_or(json!(["https://kubernetes.default.svc"])),
                "expirationSeconds": exp,
                "boundObjectRef": req.pointer("/spec/boundObjectRef").cloned().unwrap_or(Value::Null),
            },
            "status": {"token": token, "expirationTimestamp": expires},
        });
        Ok(json_resp(201, &out))
    }

    fn list(&self, t: &Target, q: &Query, shape: Shape) -> Result<Response<Body>, ApiError> {
        let desc = &RESOURCES[t.res];
        let labels = LabelSelector::parse(q.get("labelSelector").unwrap_or_default())?;
        let fields = FieldSelector::parse(q.get("fieldSelector").unwrap_or_default(), desc)?;
        let limit = q
            .get("limit")
            .and_then(|l| l.parse::<usize>().ok())
            .filter(|l| *l > 0)
            .unwrap_or(usize::MAX);
        let after = match q.get("continue").filter(|c| !c.is_empty()) {
            Some(c) => Some(decode_continue(c)?),
            None => None,
        };
        let keep = |o: &Value| labels.matches(o) && fields.matches(o);
        let (items, next, rv, remaining) = self.store.list(
            t.res,
            t.ns.as_deref(),
            after.as_ref(),
            fields.exact_name(),
            limit,
            &keep,
        );
        let cont = next.map(|k| encode_continue(rv, &k));
        match shape {
            Shape::Table(inc) => {
                let objs: Vec<&Value> = items.iter().map(|a| a.as_ref()).collect();
                let tbl = table::table(t.res, &objs, Some(rv.to_string()), cont, inc);
                Ok(json_bytes(
                    200,
                    Bytes::from(serde_json::to_vec(&tbl).unwrap_or_default()),
                    "application/json;as=Table;v=v1;g=meta.k8s.io",
                ))
            }
            _ => {
                let (kind, api_version) = if shape == Shape::Metadata {
                    (
                        "PartialObjectMetadataList".to_string(),
                        "meta.k8s.io/v1".to_string(),
                    )
                } else {
                    (format!("{}List", desc.kind), desc.api_version())
                };
                let mut meta = Map::new();
                meta.insert("resourceVersion".into(), json!(rv.to_string()));
                if let Some(c) = cont {
                    meta.insert("continue".into(), json!(c));
                    if labels.is_empty() && fields.is_empty() {
                        meta.insert("remainingItemCount".into(), json!(remaining));
                    }
                }
                let mut buf = Vec::with_capacity(256 + items.len() * 1024);
                buf.extend_from_slice(b"{\"kind\":");
                let _ = serde_json::to_writer(&mut buf, &kind);
                buf.extend_from_slice(b",\"apiVersion\":");
                let _ = serde_json::to_writer(&mut buf, &api_version);
                buf.extend_from_slice(b",\"metadata\":");
                let _ = serde_json::to_writer(&mut buf, &meta);
                buf.extend_from_slice(b",\"items\":[");
                for (i, it) in items.iter().enumerate() {
                    if i > 0 {
                        buf.push(b',');
                    }
                    if shape == Shape::Metadata {
                        let _ = serde_json::to_writer(&mut buf, &to_metadata(it));
                    } else {
                        let _ = serde_json::to_writer(&mut buf, it.as_ref());
                    }
                }
                buf.extend_from_slice(b"]}");
                Ok(json_bytes(200, Bytes::from(buf), "application/json"))
            }
        }
    }

    fn watch(
        self: Arc<Self>,
        t: &Target,
        q: &Query,
        shape: Shape,
    ) -> Result<Response<Body>, ApiError> {
        let desc = &RESOURCES[t.res];
        let labels = LabelSelector::parse(q.get("labelSelector").unwrap_or_default())?;
        let mut fields = FieldSelector::parse(q.get("fieldSelector").unwrap_or_default(), desc)?;
        if let Some(n) = &t.name {
            // Legacy GET /nodes/{name}?watch=true watches one object.
            fields = FieldSelector::parse(&format!("metadata.name={n}"), desc)?;
        }
        let bookmarks = q.flag("allowWatchBookmarks");
        let initial_events = q.flag("sendInitialEvents");
        let from = match q.get("resourceVersion") {
            _ if initial_events => None,
            None | Some("") | Some("0") => None,
            Some(s) => Some(s.parse::<u64>().map_err(|_| {
                ApiError::bad_request(format!(
                    "resourceVersion: Invalid value: {s:?}: must be a non-negative integer"
                ))
            })?),
        };
        let timeout = q
            .get("timeoutSeconds")
            .and_then(|s| s.parse::<u64>().ok())
            .map(Duration::from_secs)
            .unwrap_or(self.default_watch_timeout);
        let filter = Filter {
            ns: t.ns.clone(),
            labels,
            fields,
            res: t.res,
            shape,
        };
        let content_type = match shape {
            Shape::Table(_) => "application/json;as=Table;v=v1;g=meta.k8s.io",
            _ => "application/json",
        };
        let (start, rx, cur_rv) = match self.store.watch(t.res, from) {
            Ok(x) => x,
            Err(e) if e.code == 410 => {
                // kube-apiserver reports an expired watch start as an ERROR event in a 200.
                let line = event_line("ERROR", &e.to_status());
                return Ok(json_bytes(200, line, content_type));
            }
            Err(e) => return Err(e),
        };
        let (tx, body_rx) = mpsc::channel::<Result<Bytes, Infallible>>(32);
        let disconnect = self.disconnect.subscribe();
        let shared = self.clone();
        tokio::spawn(async move {
            let mut initial = Vec::new();
            let mut last_rv = from.unwrap_or(cur_rv);
            match start {
                WatchStart::Snapshot(objs) => {
                    for o in objs {
                        if filter.matches(&o) {
                            initial.extend_from_slice(&filter.encode("ADDED", &o));
                        }
                    }
                    last_rv = cur_rv;
                }
                WatchStart::Replay(evs) => {
                    for e in evs {
                        if let Some(b) = filter.convert(&e) {
                            initial.extend_from_slice(&b);
                        }
                        last_rv = last_rv.max(e.rv);
                    }
                }
            }
            if initial_events && bookmarks {
                let bm = json!({"kind": desc.kind, "apiVersion": desc.api_version(),
                    "metadata": {"resourceVersion": cur_rv.to_string(),
                                 "annotations": {"k8s.io/initial-events-end": "true"}}});
                initial.extend_from_slice(&event_line("BOOKMARK", &bm));
            }
            if !initial.is_empty() && tx.send(Ok(Bytes::from(initial))).await.is_err() {
                return;
            }
            run_watch(
                shared, rx, disconnect, tx, filter, timeout, bookmarks, last_rv,
            )
            .await;
        });
        let stream = tokio_stream::wrappers::ReceiverStream::new(body_rx);
        let mut r = Response::new(Body::from_stream(stream));
        r.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        Ok(r)
    }
}

/// The authorizer's view of a resource request, as kube-apiserver's RequestInfo builds it:
/// a list or watch restricted to one name by `fieldSelector=metadata.name=` carries that name.
fn request_attributes(user: &UserInfo, verb: Verb, t: &Target, q: &Query) -> Attributes {
    let d = &RESOURCES[t.res];
    let mut name = t.name.clone().unwrap_or_default();
    if name.is_empty() && matches!(verb, Verb::List | Verb::Watch) {
        let fs = q.get("fieldSelector").unwrap_or_default();
        if let Some(n) = fs
            .strip_prefix("metadata.name=")
            .or_else(|| fs.strip_prefix("metadata.name=="))
            .filter(|n| !n.contains(','))
        {
            name = n.to_string();
        }
    }
    Attributes::resource(
        user.clone(),
        verb.as_str(),
        d.group,
        d.plural,
        t.sub.as_deref().unwrap_or_default(),
        t.ns.as_deref().unwrap_or_default(),
        &name,
    )
}

/// `?dryRun=All`: validate, default and answer, never persist. Any other value is rejected
/// as kube-apiserver rejects it.
fn dry_run(q: &Query) -> Result<bool, ApiError> {
    let values: Vec<&str> =
        q.0.iter()
            .filter(|(k, _)| k == "dryRun")
            .map(|(_, v)| v.as_str())
            .collect();
    match values.as_slice() {
        [] => Ok(false),
        ["All"] => Ok(true),
        other => Err(ApiError::bad_request(format!(
            "Invalid dry run value: {:?}; supported values: \"All\"",
            other.join(",")
        ))),
    }
}

fn verb_guess(m: &Method) -> Verb {
    match *m {
        Method::POST => Verb::Create,
        Method::PUT => Verb::Update,
        Method::PATCH => Verb::Patch,
        Method::DELETE => Verb::Delete,
        _ => Verb::Get,
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_watch(
    shared: Arc<Shared>,
    mut rx: broadcast::Receiver<Arc<WatchEvent>>,
    mut disconnect: tokio::sync::watch::Receiver<u64>,
    tx: mpsc::Sender<Result<Bytes, Infallible>>,
    filter: Filter,
    timeout: Duration,
    bookmarks: bool,
    mut last_rv: u64,
) {
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let period = shared.bookmark_interval;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let desc = &RESOURCES[filter.res];
    let mut cursor = shared.dispatch.cursor(filter.res);
    loop {
        tokio::select! {
            _ = &mut deadline => break,
            _ = disconnect.changed() => break,
            _ = tx.closed() => break,
            _ = tick.tick(), if bookmarks => {
                let rv = shared.store.bookmark_rv(&rx, last_rv);
                last_rv = rv;
                let bm = json!({"kind": desc.kind, "apiVersion": desc.api_version(),
                                "metadata": {"resourceVersion": rv.to_string()}});
                if tx.send(Ok(event_line("BOOKMARK", &bm))).await.is_err() {
                    break;
                }
            }
            r = rx.recv() => {
                let first = match r {
                    Ok(_) if shared.faults.read().drop_watch_event() => break,
                    Ok(ev) => ev,
                    // A watcher that fell behind is dropped, as kube-apiserver drops slow
                    // watchers; the client re-watches from its last resourceVersion.
                    Err(_) => break,
                };
                let mut batch = vec![first];
                let mut lagged = false;
                while batch.len() <= 256 {
                    match rx.try_recv() {
                        Ok(ev) => batch.push(ev),
                        Err(broadcast::error::TryRecvError::Empty) => break,
                        Err(_) => {
                            lagged = true;
                            break;
                        }
                    }
                }
                let mut out = Outbox {
                    tx: &tx,
                    disconnect: &mut disconnect,
                    chunk: Chunk::default(),
                    cost: shared.cost.read().clone(),
                };
                if !out.send(&filter, cursor.as_mut(), batch, &mut last_rv).await || lagged {
                    break;
                }
            }
        }
    }
}

/// Watch lines on their way to one watcher, sent in as few chunks as the watch cache allows.
struct Outbox<'a> {
    tx: &'a mpsc::Sender<Result<Bytes, Infallible>>,
    disconnect: &'a mut tokio::sync::watch::Receiver<u64>,
    chunk: Chunk,
    /// The cost model when the batch arrived: what each write costs the server.
    cost: Arc<crate::cost::CostModel>,
}

impl Outbox<'_> {
    /// Sends `batch` as this watcher sees it; an event the watch cache has not dispatched yet
    /// is waited for (what went before it is sent first). False when the watch is over.
    async fn send(
        &mut self,
        filter: &Filter,
        mut cursor: Option<&mut tokio::sync::watch::Receiver<u64>>,
        batch: Vec<Arc<WatchEvent>>,
        last_rv: &mut u64,
    ) -> bool {
        for ev in batch {
            if let Some(c) = cursor.as_deref_mut()
                && *c.borrow() < ev.rv
                && !(self.flush().await && self.dispatched(c, ev.rv).await)
            {
                return false;
            }
            *last_rv = (*last_rv).max(ev.rv);
            if let Some(b) = filter.convert(&ev) {
                self.chunk.push(b);
            }
        }
        self.flush().await
    }

    /// Sends the chunk once its write's CPU is spent; events dispatched meanwhile wait for
    /// the next write, as they do behind a busy server's watch handler.
    async fn flush(&mut self) -> bool {
        match self.chunk.take() {
            Some(b) => {
                self.cost.charge_send(b.len()).await;
                self.tx.send(Ok(b)).await.is_ok()
            }
            None => true,
        }
    }

    /// Waits until the kind's cursor reaches `rv`; false if the watch ends first.
    async fn dispatched(
        &mut self,
        cursor: &mut tokio::sync::watch::Receiver<u64>,
        rv: u64,
    ) -> bool {
        tokio::select! {
            r = cursor.wait_for(|d| *d >= rv) => r.is_ok(),
            _ = self.disconnect.changed() => false,
            _ = self.tx.closed() => false,
        }
    }
}

/// Watch lines joined into one chunk; one line alone is sent as it is, without a copy.
#[derive(Default)]
struct Chunk {
    single: Option<Bytes>,
    joined: Option<Vec<u8>>,
}

impl Chunk {
    fn push(&mut self, b: Bytes) {
        match (&mut self.joined, self.single.take()) {
            (Some(c), _) => c.extend_from_slice(&b),
            (None, Some(prev)) => {
                let mut c = Vec::with_capacity(prev.len() + b.len());
                c.extend_from_slice(&prev);
                c.extend_from_slice(&b);
                self.joined = Some(c);
            }
            (None, None) => self.single = Some(b),
        }
    }

    fn take(&mut self) -> Option<Bytes> {
        self.joined.take().map(Bytes::from).or(self.single.take())
    }
}

/// Per-watch filtering and encoding.
struct Filter {
    ns: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
    res: usize,
    shape: Shape,
}

impl Filter {
    fn matches(&self, o: &Value) -> bool {
        if let Some(ns) = &self.ns
            && o.pointer("/metadata/namespace").and_then(Value::as_str) != Some(ns.as_str())
        {
            return false;
        }
        self.labels.matches(o) && self.fields.matches(o)
    }

    fn encode(&self, ty: &str, o: &Value) -> Bytes {
        match self.shape {
            Shape::Plain => event_line(ty, o),
            Shape::Metadata => event_line(ty, &to_metadata(o)),
            Shape::Table(inc) => event_line(ty, &table::table(self.res, &[o], None, None, inc)),
        }
    }

    /// The event as this watcher sees it: objects entering the selector are ADDED, leaving it
    /// DELETED (with the previous content and the new resourceVersion), as the watch cache does.
    fn convert(&self, ev: &WatchEvent) -> Option<Bytes> {
        let cur = self.matches(&ev.obj);
        match ev.ty {
            EventType::Added | EventType::Deleted => cur.then(|| self.shared(ev)),
            EventType::Modified => {
                let prev = ev.prev.as_ref().is_some_and(|p| self.matches(p));
                match (prev, cur) {
                    (true, true) => Some(self.shared(ev)),
                    (false, true) => Some(self.encode("ADDED", &ev.obj)),
                    (true, false) => {
                        let mut p = ev.prev.as_deref().cloned().unwrap_or(Value::Null);
                        if let Some(m) = p.get_mut("metadata").and_then(Value::as_object_mut) {
                            m.insert("resourceVersion".into(), json!(ev.rv.to_string()));
                        }
                        Some(self.encode("DELETED", &p))
                    }
                    (false, false) => None,
                }
            }
        }
    }

    fn shared(&self, ev: &WatchEvent) -> Bytes {
        if self.shape == Shape::Plain {
            ev.line()
        } else {
            self.encode(ev.ty.as_str(), &ev.obj)
        }
    }
}

fn render_one(res: usize, code: u16, obj: &Value, shape: Shape) -> Response<Body> {
    match shape {
        Shape::Plain => json_bytes(
            code,
            Bytes::from(serde_json::to_vec(obj).unwrap_or_default()),
            "application/json",
        ),
        Shape::Metadata => json_resp(code, &to_metadata(obj)),
        Shape::Table(inc) => {
            let rv = obj
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .map(String::from);
            json_bytes(
                code,
                Bytes::from(
                    serde_json::to_vec(&table::table(res, &[obj], rv, None, inc))
                        .unwrap_or_default(),
                ),
                "application/json;as=Table;v=v1;g=meta.k8s.io",
            )
        }
    }
}

fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice::<Value>(body)
        .map_err(|e| ApiError::bad_request(format!("the object provided is unrecognized: {e}")))
        .and_then(|v| {
            if v.is_object() {
                Ok(v)
            } else {
                Err(ApiError::bad_request(
                    "the object provided is unrecognized: not a JSON object",
                ))
            }
        })
}

/// `fieldValidation=Strict`: a field the kind's schema does not have is a 400, worded as
/// kube-apiserver's strict decoding error. `Warn` and `Ignore` store the object as sent.
fn strict(desc: &ResourceDesc, q: &Query, obj: &Value) -> Result<(), ApiError> {
    if q.get("fieldValidation") != Some("Strict") {
        return Ok(());
    }
    match crate::openapi::unknown_field(desc, obj) {
        Some(f) => Err(ApiError::bad_request(format!(
            "{k} in version {v:?} cannot be handled as a {k}: strict decoding error: unknown field {f:?}",
            k = desc.kind,
            v = desc.version
        ))),
        None => Ok(()),
    }
}

fn check_type(desc: &ResourceDesc, obj: &Value) -> Result<(), ApiError> {
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str)
        && !av.is_empty()
        && av != desc.api_version()
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({})",
            desc.api_version()
        )));
    }
    if let Some(k) = obj.get("kind").and_then(Value::as_str)
        && !k.is_empty()
        && k != desc.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({k}) does not match the expected kind ({})",
            desc.kind
        )));
    }
    Ok(())
}

fn delete_preconditions(body: &[u8], q: &Query) -> Result<Preconditions, ApiError> {
    let mut pre = Preconditions::default();
    if !body.is_empty() {
        let v: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?;
        pre.uid = v
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(String::from);
        pre.resource_version = v
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(String::from);
    }
    if let Some(u) = q.get("preconditions.uid") {
        pre.uid = Some(u.to_string());
    }
    if let Some(r) = q.get("preconditions.resourceVersion") {
        pre.resource_version = Some(r.to_string());
    }
    Ok(pre)
}

fn encode_continue(rv: u64, k: &Key) -> String {
    let start = if k.0.is_empty() {
        format!("{}\u{0}", k.1)
    } else {
        format!("{}/{}\u{0}", k.0, k.1)
    };
    let tok = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": start});
    base64::engine::general_purpose::URL_SAFE.encode(tok.to_string())
}

fn decode_continue(c: &str) -> Result<Key, ApiError> {
    let bad = || {
        ApiError::bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        )
    };
    let raw = base64::engine::general_purpose::URL_SAFE
        .decode(c)
        .or_else(|_| base64::engine::general_purpose::STANDARD.decode(c))
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let start = v.get("start").and_then(Value::as_str).ok_or_else(bad)?;
    let start = start.trim_end_matches('\u{0}');
    Ok(match start.split_once('/') {
        Some((ns, n)) => (ns.to_string(), n.to_string()),
        None => (String::new(), start.to_string()),
    })
}
