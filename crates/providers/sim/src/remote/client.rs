//! [`RemoteSim`]: a provider that forwards every call to a [`super::SimServer`].

use crate::remote::wire::WireNode;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use ccm_cloud::{
    CloudError, CloudProvider, CloudResult, ConfigError, InstanceEvent, InstanceMetadata,
    InstanceStatus, Instances, LoadBalancer, LoadBalancerStatus, Node, Route, Routes, Service,
};
use futures::StreamExt;
use futures::stream::BoxStream;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_stream::wrappers::ReceiverStream;

use super::lists::{ListRef, SentLists};
use super::wire::{
    ACTOR_HEADER, Call, CallCount, CallRef, DeleteRouteRequest, FaultRequest, MAX_BATCH_HEADER,
    WireError, WireEvent, WireMaybeMetadata, WireNodes, WireResult, WireRoute, WireRoutes,
    WireStatus, from_wire,
};
use crate::cloud::{
    DEFAULT_MAX_BATCH_SIZE, InstanceSpec, Mutation, PROVIDER_NAME, SimInstance, SimLoadBalancer,
    SimRoute,
};
use crate::faults::{Latency, Throttle};

/// How long one request may take before it counts as a transient failure. Generous: the sim's
/// own latency settings may be large on purpose.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// How long the event stream waits before reconnecting to a server that went away.
const RECONNECT_DELAY: Duration = Duration::from_secs(1);

/// A client of a sim cloud served by another process ([`super::SimServer`]). It is a full
/// [`CloudProvider`] (batching natively, with instance events), so a CCM child process runs
/// against the same cloud its parent inspects and controls. Selected by `endpoint` in the
/// config file.
#[derive(Clone)]
pub struct RemoteSim {
    inner: Arc<Inner>,
}

struct Inner {
    base: String,
    actor: String,
    client: Client<HttpConnector, Full<Bytes>>,
    max_batch_size: AtomicUsize,
    lists: SentLists,
}

impl std::fmt::Debug for RemoteSim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteSim")
            .field("endpoint", &self.inner.base)
            .field("actor", &self.inner.actor)
            .finish()
    }
}

/// A connector with Nagle's algorithm off: a call is an HTTP/2 HEADERS and a DATA frame, two
/// small writes, and with Nagle the second waited for the server's delayed ACK (40 ms on
/// Linux) — most of a 50 ms simulated call again.
fn connector() -> HttpConnector {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http
}

impl RemoteSim {
    /// A client of the server at `endpoint` (`http://host:port`), recording its calls as
    /// `actor`. Does not connect yet: a CCM may start before the cloud does.
    pub fn new(endpoint: &str, actor: &str) -> Result<RemoteSim, ConfigError> {
        let base = endpoint.trim_end_matches('/').to_string();
        let uri: http::Uri = base.parse().map_err(|e| {
            ConfigError::field("endpoint", format!("an http:// URL, got {endpoint:?}: {e}"))
        })?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return Err(ConfigError::field(
                "endpoint",
                format!("an http://host:port URL of a sim server, got {endpoint:?}"),
            ));
        }
        if http::HeaderValue::from_str(actor).is_err() {
            return Err(ConfigError::field(
                "actor",
                format!("printable ASCII without control characters, got {actor:?}"),
            ));
        }
        Ok(RemoteSim {
            inner: Arc::new(Inner {
                base,
                actor: actor.to_string(),
                // HTTP/2 over cleartext (the sim server speaks both): one connection carries
                // every concurrent call, where HTTP/1.1 opened one per call in flight — a
                // 1,000-Node burst's route creations left 1,000 idle connections and their
                // buffers in the CCM.
                client: Client::builder(TokioExecutor::new())
                    .http2_only(true)
                    .build(connector()),
                max_batch_size: AtomicUsize::new(DEFAULT_MAX_BATCH_SIZE),
                lists: SentLists::new(),
            }),
        })
    }

    /// The server's URL.
    pub fn endpoint(&self) -> &str {
        &self.inner.base
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> CloudResult<hyper::Response<Incoming>> {
        let unreachable = |e: &dyn std::fmt::Display| {
            CloudError::Transient(format!("sim endpoint {}: {e}", self.inner.base))
        };
        let request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.inner.base))
            .header(ACTOR_HEADER, &self.inner.actor)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| CloudError::Permanent(format!("building a sim request: {e}")))?;
        let response = tokio::time::timeout(REQUEST_TIMEOUT, self.inner.client.request(request))
            .await
            .map_err(|_| unreachable(&"no answer within 60s"))?
            .map_err(|e| unreachable(&e))?;
        Ok(response)
    }

    async fn request<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> CloudResult<T> {
        let response = self.send(method, path, body).await?;
        if let Some(n) = response
            .headers()
            .get(MAX_BATCH_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|n| *n > 0)
        {
            self.inner.max_batch_size.store(n, Ordering::Relaxed);
        }
        let status = response.status();
        let bytes = tokio::time::timeout(REQUEST_TIMEOUT, response.into_body().collect())
            .await
            .map_err(|_| CloudError::Transient("sim endpoint: body timed out".into()))?
            .map_err(|e| CloudError::Transient(format!("sim endpoint: reading the answer: {e}")))?
            .to_bytes();
        if status != StatusCode::OK {
            let text = String::from_utf8_lossy(&bytes).trim().to_string();
            let msg = format!("sim endpoint {path}: {status}: {text}");
            return Err(if status.is_server_error() {
                CloudError::Transient(msg)
            } else {
                CloudError::Permanent(msg)
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| {
            CloudError::Permanent(format!("sim endpoint {path}: unexpected answer: {e}"))
        })
    }

    async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> CloudResult<T> {
        let body = serde_json::to_vec(body)
            .map_err(|e| CloudError::Permanent(format!("encoding a sim request: {e}")))?;
        self.request(Method::POST, path, Some(body)).await
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> CloudResult<T> {
        self.request(Method::GET, path, None).await
    }

    async fn call<W: DeserializeOwned, T: From<W>>(&self, call: impl Serialize) -> CloudResult<T> {
        let answer: WireResult<W> = self.post("/v1/call", &call).await?;
        from_wire(answer)
    }

    /// A load-balancer call, its node list named by id when the server keeps it (see
    /// [`super::lists`]); sent in full again when the server no longer does.
    async fn lb_call<'a, W: DeserializeOwned>(
        &self,
        nodes: &'a [Arc<Node>],
        call: impl Fn(WireNodes<'a>, ListRef) -> CallRef<'a>,
    ) -> CloudResult<W> {
        let lists = &self.inner.lists;
        for _ in 0..2 {
            let list = lists.reference(nodes).await;
            let wire = match list {
                ListRef::Keep(_) => WireNodes(nodes),
                ListRef::Same(_) => WireNodes(&[]),
            };
            let answer = self
                .post::<_, WireResult<W>>("/v1/call", &call(wire, list))
                .await;
            let lost = matches!(answer, Ok(Err(WireError::UnknownNodeList { .. })));
            lists.answered(list.id(), answer.is_ok() && !lost);
            match answer? {
                Err(WireError::UnknownNodeList { .. }) => {}
                answer => return from_wire(answer),
            }
        }
        Err(CloudError::Transient(
            "the sim server lost a node list it had just kept".into(),
        ))
    }

    async fn batch<W: DeserializeOwned, T: From<W>>(
        &self,
        call: CallRef<'_>,
        n: usize,
    ) -> Vec<CloudResult<T>> {
        match self.post::<_, Vec<WireResult<W>>>("/v1/call", &call).await {
            Ok(answers) if answers.len() == n => answers.into_iter().map(from_wire).collect(),
            Ok(answers) => {
                let e = CloudError::Permanent(format!(
                    "sim endpoint answered {} results for {n} nodes",
                    answers.len()
                ));
                (0..n).map(|_| Err(e.clone())).collect()
            }
            Err(e) => (0..n).map(|_| Err(e.clone())).collect(),
        }
    }

    /// Subscribes to the server's instance events and returns once the subscription is live, so
    /// changes made afterwards are sure to be seen. The stream ends if the connection drops;
    /// [`Instances::instance_events`] reconnects instead.
    pub async fn subscribe_events(&self) -> CloudResult<BoxStream<'static, InstanceEvent>> {
        let response = self.send(Method::GET, "/v1/events", None).await?;
        if response.status() != StatusCode::OK {
            return Err(CloudError::Transient(format!(
                "sim endpoint /v1/events: {}",
                response.status()
            )));
        }
        let mut lines = LineReader {
            body: response.into_body(),
            buf: Vec::new(),
        };
        // The server's first line is empty: it means "subscribed".
        match lines.next_line().await {
            Some(_) => {}
            None => {
                return Err(CloudError::Transient(
                    "sim endpoint /v1/events closed at once".into(),
                ));
            }
        }
        Ok(futures::stream::unfold(lines, |mut lines| async move {
            loop {
                let line = lines.next_line().await?;
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                match serde_json::from_slice::<WireEvent>(&line) {
                    Ok(ev) => return Some((InstanceEvent::from(ev), lines)),
                    Err(e) => tracing::warn!(error = %e, "skipping a malformed sim event"),
                }
            }
        })
        .boxed())
    }

    // ---- control and inspection over HTTP ------------------------------------------------

    /// [`crate::SimCloud::add_instance`] on the server.
    pub async fn add_instance(&self, spec: &InstanceSpec) -> CloudResult<String> {
        #[derive(serde::Deserialize)]
        struct Id {
            id: String,
        }
        Ok(self.post::<_, Id>("/v1/instances", spec).await?.id)
    }

    async fn instance_action(&self, id: &str, action: &str) -> CloudResult<bool> {
        #[derive(serde::Deserialize)]
        struct Changed {
            changed: bool,
        }
        let id: String = id
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        let path = format!("/v1/instances/{id}/{action}");
        Ok(self.post::<_, Changed>(&path, &()).await?.changed)
    }

    /// [`crate::SimCloud::stop_instance`] on the server.
    pub async fn stop_instance(&self, id: &str) -> CloudResult<bool> {
        self.instance_action(id, "stop").await
    }

    /// [`crate::SimCloud::start_instance`] on the server.
    pub async fn start_instance(&self, id: &str) -> CloudResult<bool> {
        self.instance_action(id, "start").await
    }

    /// [`crate::SimCloud::terminate_instance`] on the server.
    pub async fn terminate_instance(&self, id: &str) -> CloudResult<bool> {
        self.instance_action(id, "terminate").await
    }

    /// [`crate::SimCloud::delete_route_out_of_band`] on the server.
    pub async fn delete_route_out_of_band(
        &self,
        cluster: &str,
        destination_cidr: &str,
    ) -> CloudResult<bool> {
        #[derive(serde::Deserialize)]
        struct Deleted {
            deleted: bool,
        }
        let req = DeleteRouteRequest {
            cluster: cluster.to_string(),
            destination_cidr: destination_cidr.to_string(),
        };
        Ok(self
            .post::<_, Deleted>("/v1/routes/delete", &req)
            .await?
            .deleted)
    }

    async fn fault(&self, req: FaultRequest) -> CloudResult<()> {
        self.post::<_, serde_json::Value>("/v1/faults", &req)
            .await
            .map(drop)
    }

    /// [`crate::SimCloud::set_latency`] on the server (millisecond precision).
    pub async fn set_latency(&self, op: &str, latency: Latency) -> CloudResult<()> {
        self.fault(FaultRequest::Latency {
            op: op.to_string(),
            fixed_ms: u64::try_from(latency.fixed.as_millis()).unwrap_or(u64::MAX),
            jitter_ms: u64::try_from(latency.jitter.as_millis()).unwrap_or(u64::MAX),
        })
        .await
    }

    /// [`crate::SimCloud::set_error_rate`] on the server.
    pub async fn set_error_rate(&self, op: &str, rate: f64) -> CloudResult<()> {
        self.fault(FaultRequest::ErrorRate {
            op: op.to_string(),
            rate,
        })
        .await
    }

    /// [`crate::SimCloud::fail_next`] on the server.
    pub async fn fail_next(&self, op: &str, n: u32) -> CloudResult<()> {
        self.fault(FaultRequest::FailNext {
            op: op.to_string(),
            n,
        })
        .await
    }

    /// [`crate::SimCloud::set_throttle`] on the server.
    pub async fn set_throttle(&self, op: &str, throttle: Option<Throttle>) -> CloudResult<()> {
        self.fault(FaultRequest::Throttle {
            op: op.to_string(),
            qps: throttle.map(|t| t.qps),
            burst: throttle.map(|t| t.burst),
        })
        .await
    }

    /// [`crate::SimCloud::clear_faults`] on the server.
    pub async fn clear_faults(&self) -> CloudResult<()> {
        self.fault(FaultRequest::Clear).await
    }

    /// [`crate::SimCloud::instances`] of the server.
    pub async fn instances(&self) -> CloudResult<Vec<SimInstance>> {
        self.get("/v1/instances").await
    }

    /// [`crate::SimCloud::routes`] of the server.
    pub async fn routes(&self) -> CloudResult<Vec<SimRoute>> {
        self.get("/v1/routes").await
    }

    /// [`crate::SimCloud::load_balancers`] of the server.
    pub async fn load_balancers(&self) -> CloudResult<Vec<SimLoadBalancer>> {
        self.get("/v1/load_balancers").await
    }

    /// [`crate::SimCloud::mutations`] of the server (`at` is this process's receive time).
    pub async fn mutations(&self) -> CloudResult<Vec<Mutation>> {
        self.get("/v1/mutations").await
    }

    /// [`crate::SimCloud::calls`] of the server.
    pub async fn calls(&self) -> CloudResult<BTreeMap<(String, String), u64>> {
        let counts: Vec<CallCount> = self.get("/v1/calls").await?;
        Ok(counts
            .into_iter()
            .map(|c| ((c.operation, c.result), c.count))
            .collect())
    }
}

/// Splits a streamed body into lines.
struct LineReader {
    body: Incoming,
    buf: Vec<u8>,
}

impl LineReader {
    async fn next_line(&mut self) -> Option<Vec<u8>> {
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let rest = self.buf.split_off(pos + 1);
                let mut line = std::mem::replace(&mut self.buf, rest);
                line.pop();
                return Some(line);
            }
            let frame = self.body.frame().await?.ok()?;
            if let Ok(data) = frame.into_data() {
                self.buf.extend_from_slice(&data);
            }
        }
    }
}

impl CloudProvider for RemoteSim {
    fn provider_name(&self) -> &str {
        PROVIDER_NAME
    }

    fn instances(&self) -> Option<Arc<dyn Instances>> {
        Some(Arc::new(self.clone()))
    }

    fn load_balancer(&self) -> Option<Arc<dyn LoadBalancer>> {
        Some(Arc::new(self.clone()))
    }

    fn routes(&self) -> Option<Arc<dyn Routes>> {
        Some(Arc::new(self.clone()))
    }
}

#[async_trait]
impl Instances for RemoteSim {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        self.call::<bool, bool>(Call::InstanceExists {
            node: WireNode::from(node),
        })
        .await
    }

    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        self.call::<bool, bool>(Call::InstanceShutdown {
            node: WireNode::from(node),
        })
        .await
    }

    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        self.call::<WireMaybeMetadata, _>(Call::InstanceMetadata {
            node: WireNode::from(node),
        })
        .await
    }

    async fn instances_metadata(
        &self,
        nodes: &[Arc<Node>],
    ) -> Vec<CloudResult<Option<InstanceMetadata>>> {
        self.batch::<WireMaybeMetadata, _>(
            CallRef::InstancesMetadata {
                nodes: WireNodes(nodes),
            },
            nodes.len(),
        )
        .await
    }

    async fn instances_status(&self, nodes: &[Arc<Node>]) -> Vec<CloudResult<InstanceStatus>> {
        self.batch::<WireStatus, _>(
            CallRef::InstancesStatus {
                nodes: WireNodes(nodes),
            },
            nodes.len(),
        )
        .await
    }

    fn native_batching(&self) -> bool {
        true
    }

    /// The server's limit as of the last answer (500 until the first call).
    fn max_batch_size(&self) -> usize {
        self.inner.max_batch_size.load(Ordering::Relaxed)
    }

    /// Events from the server, reconnecting after a dropped connection (events during the gap
    /// are lost, so consumers should still resync periodically). `None` outside a tokio runtime.
    fn instance_events(&self) -> Option<BoxStream<'static, InstanceEvent>> {
        let handle = tokio::runtime::Handle::try_current().ok()?;
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        let this = self.clone();
        handle.spawn(async move {
            loop {
                if let Ok(mut events) = this.subscribe_events().await {
                    loop {
                        tokio::select! {
                            _ = tx.closed() => return,
                            ev = events.next() => match ev {
                                Some(ev) => if tx.send(ev).await.is_err() { return },
                                None => break,
                            },
                        }
                    }
                }
                tokio::select! {
                    _ = tx.closed() => return,
                    _ = tokio::time::sleep(RECONNECT_DELAY) => {}
                }
            }
        });
        Some(ReceiverStream::new(rx).boxed())
    }
}

#[async_trait]
impl LoadBalancer for RemoteSim {
    async fn get_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        self.call::<Option<LoadBalancerStatus>, _>(Call::GetLoadBalancer {
            cluster: cluster.to_string(),
            service: Box::new(service.clone()),
        })
        .await
    }

    /// Must agree with the server's [`crate::SimCloud`] naming.
    fn load_balancer_name(&self, cluster: &str, service: &Service) -> String {
        crate::provider::sim_load_balancer_name(cluster, service)
    }

    async fn ensure_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        self.lb_call(nodes, |nodes, list| CallRef::EnsureLoadBalancer {
            cluster,
            service,
            nodes,
            list,
        })
        .await
    }

    async fn update_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        self.lb_call(nodes, |nodes, list| CallRef::UpdateLoadBalancer {
            cluster,
            service,
            nodes,
            list,
        })
        .await
    }

    async fn ensure_load_balancer_deleted(
        &self,
        cluster: &str,
        service: &Service,
    ) -> CloudResult<()> {
        self.call::<(), _>(Call::EnsureLoadBalancerDeleted {
            cluster: cluster.to_string(),
            service: Box::new(service.clone()),
        })
        .await
    }
}

#[async_trait]
impl Routes for RemoteSim {
    async fn list_routes(&self, cluster: &str) -> CloudResult<Vec<Route>> {
        self.call::<WireRoutes, _>(Call::ListRoutes {
            cluster: cluster.to_string(),
        })
        .await
    }

    async fn create_route(&self, cluster: &str, name_hint: &str, route: &Route) -> CloudResult<()> {
        self.call::<(), _>(Call::CreateRoute {
            cluster: cluster.to_string(),
            name_hint: name_hint.to_string(),
            route: WireRoute::from(route.clone()),
        })
        .await
    }

    async fn delete_route(&self, cluster: &str, route: &Route) -> CloudResult<()> {
        self.call::<(), _>(Call::DeleteRoute {
            cluster: cluster.to_string(),
            route: WireRoute::from(route.clone()),
        })
        .await
    }
}
