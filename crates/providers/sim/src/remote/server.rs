//! The HTTP face of a [`SimCloud`]: every provider call, the control API and the inspection
//! API as JSON endpoints, so CCM processes started as children (failover test, `ccm bench`) can
//! share one simulated cloud with the process that watches it.
//!
//! | method, path | body → answer |
//! |---|---|
//! | `POST /v1/call` | `{"op": "<ccm_cloud::op name>", "args": {…}}` → `{"Ok": …}` or `{"Err": {"kind": …}}` |
//! | `GET /v1/events` | newline-delimited JSON instance events (first line empty: subscribed) |
//! | `POST /v1/instances` | an [`crate::InstanceSpec`] → `{"id": "i-…"}` |
//! | `POST /v1/instances/{id}/{stop,start,terminate}` | → `{"changed": bool}` |
//! | `POST /v1/routes/delete` | `{"cluster", "destination_cidr"}` → `{"deleted": bool}` (out of band) |
//! | `POST /v1/faults` | `{"action": "latency"/"error_rate"/"fail_next"/"throttle"/"clear", …}` |
//! | `GET /v1/{instances,routes,load_balancers,mutations,calls}` | snapshots |
//! | `GET /healthz` | `ok` |
//!
//! A load-balancer call carries its node list in full with `"list": {"keep": id}`, or names a
//! list kept before with `"list": {"same": id}` (`super::lists`).
//!
//! Cloud errors are answers (HTTP 200); 4xx means the request itself was wrong. The
//! `x-sim-actor` request header names the caller in the mutation log.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use ccm_cloud::{Instances, LoadBalancer, Routes};
use futures::StreamExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::BroadcastStream;
use tokio_util::sync::CancellationToken;

use super::lists::{KeptLists, ListRef};
use super::wire::{
    ACTOR_HEADER, Call, CallCount, DeleteRouteRequest, FaultRequest, MAX_BATCH_HEADER, WireError,
    WireEvent, WireMaybeMetadata, WireNode, WireResult, WireRoutes, WireStatus, hosts_of_wire,
    nodes_of, to_wire,
};
use crate::cloud::{InstanceSpec, SimCloud, SimError};
use crate::faults::{Latency, Throttle};

#[derive(Clone)]
struct App {
    sim: SimCloud,
    shutdown: CancellationToken,
    lists: Arc<KeptLists>,
}

/// Largest call body the server takes: room for a load-balancer call with 500,000 Nodes.
pub const MAX_CALL_BODY: usize = 64 << 20;

/// The routes of the sim server, for embedding into another axum app. Event streams end when
/// `shutdown` is cancelled (they would otherwise hold a graceful shutdown open forever).
pub fn router(sim: SimCloud, shutdown: CancellationToken) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        // A load-balancer call names every Node: ~60 bytes each, 3 MB at 50,000 Nodes, past
        // axum's 2 MB default.
        .route(
            "/v1/call",
            post(call).layer(axum::extract::DefaultBodyLimit::max(MAX_CALL_BODY)),
        )
        .route("/v1/events", get(events))
        .route("/v1/instances", post(add_instance).get(instances))
        .route("/v1/instances/{id}/{action}", post(instance_action))
        .route("/v1/routes/delete", post(delete_route))
        .route("/v1/faults", post(faults))
        .route("/v1/routes", get(routes))
        .route("/v1/load_balancers", get(load_balancers))
        .route("/v1/mutations", get(mutations))
        .route("/v1/calls", get(calls))
        .with_state(App {
            sim,
            shutdown,
            lists: Arc::default(),
        })
}

/// Serves `sim` on `listener` until `shutdown` is cancelled.
pub async fn serve(
    sim: SimCloud,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let app = router(sim, shutdown.clone());
    // Nagle off, as on the client: an answer's HEADERS and DATA frames are two small writes.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

/// A running sim server: what a test or `ccm bench` holds while child processes use the cloud.
#[derive(Debug)]
pub struct SimServer {
    addr: SocketAddr,
    shutdown: CancellationToken,
    task: JoinHandle<io::Result<()>>,
}

impl SimServer {
    /// Binds `addr` (port 0 picks a free port) and serves `sim` in a background task.
    pub async fn start(sim: SimCloud, addr: SocketAddr) -> io::Result<SimServer> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(serve(sim, listener, shutdown.clone()));
        Ok(SimServer {
            addr,
            shutdown,
            task,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The value for `endpoint` in a client's config: `http://<addr>`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops serving and waits for open requests to finish.
    pub async fn shutdown(self) -> io::Result<()> {
        self.shutdown.cancel();
        match self.task.await {
            Ok(r) => r,
            Err(e) => Err(io::Error::other(e)),
        }
    }
}

fn actor(app: &App, headers: &HeaderMap) -> SimCloud {
    match headers.get(ACTOR_HEADER).and_then(|v| v.to_str().ok()) {
        Some(a) if !a.is_empty() => app.sim.with_actor(a),
        _ => app.sim.clone(),
    }
}

fn parse<T: DeserializeOwned>(body: &Bytes) -> Result<T, (StatusCode, String)> {
    serde_json::from_slice(body)
        .map_err(|e| (StatusCode::BAD_REQUEST, format!("bad request body: {e}\n")))
}

fn json<T: Serialize>(value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

fn sim_error(e: SimError) -> Response {
    let status = match e {
        SimError::UnknownInstance(_) => StatusCode::NOT_FOUND,
        SimError::Terminated(_) => StatusCode::CONFLICT,
        SimError::UnknownOp(_) | SimError::Invalid(_) => StatusCode::BAD_REQUEST,
    };
    (status, format!("{e}\n")).into_response()
}

/// A result whose success value serializes as itself (`bool`, `()`, `LoadBalancerStatus`).
fn reply<T: Serialize>(r: ccm_cloud::CloudResult<T>) -> Response {
    json(&r.map_err(WireError::from))
}

fn batch<T, W: From<T>>(out: Vec<ccm_cloud::CloudResult<T>>) -> Vec<WireResult<W>> {
    out.into_iter().map(to_wire).collect()
}

/// A load-balancer call's hosts: from the call, kept when it asks; or from a kept list.
fn hosts(
    lists: &KeptLists,
    nodes: Vec<WireNode>,
    list: Option<ListRef>,
) -> Result<Vec<String>, WireError> {
    match list {
        None => Ok(hosts_of_wire(nodes)),
        Some(ListRef::Keep(id)) => {
            let hosts = hosts_of_wire(nodes);
            lists.keep(id, Arc::new(hosts.clone()));
            Ok(hosts)
        }
        Some(ListRef::Same(id)) => lists
            .get(id)
            .map(|h| h.as_ref().clone())
            .ok_or(WireError::UnknownNodeList { id }),
    }
}

/// Answers a load-balancer call: `op` with the call's hosts, or the error that its named list
/// is not kept here.
async fn with_hosts<T: Serialize, F: Future<Output = ccm_cloud::CloudResult<T>>>(
    lists: &KeptLists,
    nodes: Vec<WireNode>,
    list: Option<ListRef>,
    op: impl FnOnce(Vec<String>) -> F,
) -> Response {
    match hosts(lists, nodes, list) {
        Ok(hosts) => reply(op(hosts).await),
        Err(e) => json::<WireResult<()>>(&Err(e)),
    }
}

async fn call(State(app): State<App>, headers: HeaderMap, body: Bytes) -> Response {
    let call: Call = match parse(&body) {
        Ok(c) => c,
        Err(r) => return r.into_response(),
    };
    let sim = actor(&app, &headers);
    let mut response = match call {
        Call::InstanceExists { node } => reply(sim.instance_exists(&node.into_node()).await),
        Call::InstanceShutdown { node } => reply(sim.instance_shutdown(&node.into_node()).await),
        Call::InstanceMetadata { node } => json::<WireResult<WireMaybeMetadata>>(&to_wire(
            sim.instance_metadata(&node.into_node()).await,
        )),
        Call::InstancesMetadata { nodes } => json::<Vec<WireResult<WireMaybeMetadata>>>(&batch(
            sim.instances_metadata(&nodes_of(nodes)).await,
        )),
        Call::InstancesStatus { nodes } => json::<Vec<WireResult<WireStatus>>>(&batch(
            sim.instances_status(&nodes_of(nodes)).await,
        )),
        Call::GetLoadBalancer { cluster, service } => {
            reply(sim.get_load_balancer(&cluster, &service).await)
        }
        Call::EnsureLoadBalancer {
            cluster,
            service,
            nodes,
            list,
        } => {
            with_hosts(&app.lists, nodes, list, |hosts| {
                sim.ensure_load_balancer_hosts(&cluster, &service, hosts)
            })
            .await
        }
        Call::UpdateLoadBalancer {
            cluster,
            service,
            nodes,
            list,
        } => {
            with_hosts(&app.lists, nodes, list, |hosts| {
                sim.update_load_balancer_hosts(&cluster, &service, hosts)
            })
            .await
        }
        Call::EnsureLoadBalancerDeleted { cluster, service } => {
            reply(sim.ensure_load_balancer_deleted(&cluster, &service).await)
        }
        Call::ListRoutes { cluster } => {
            json::<WireResult<WireRoutes>>(&to_wire(sim.list_routes(&cluster).await))
        }
        Call::CreateRoute {
            cluster,
            name_hint,
            route,
        } => reply(sim.create_route(&cluster, &name_hint, &route.into()).await),
        Call::DeleteRoute { cluster, route } => {
            reply(sim.delete_route(&cluster, &route.into()).await)
        }
    };
    if let Ok(v) = HeaderValue::from_str(&sim.max_batch_size().to_string()) {
        response.headers_mut().insert(MAX_BATCH_HEADER, v);
    }
    response
}

async fn events(State(app): State<App>) -> Response {
    let rx = app.sim.inner.events.subscribe();
    // The first (empty) line tells the client its subscription is live, so it can make changes
    // and be sure to see their events.
    let hello = futures::stream::once(async { Ok::<Bytes, Infallible>(Bytes::from_static(b"\n")) });
    let lines = BroadcastStream::new(rx).filter_map(|r| async move {
        let ev = r.ok()?;
        let mut line = serde_json::to_vec(&WireEvent::from(&ev)).ok()?;
        line.push(b'\n');
        Some(Ok::<Bytes, Infallible>(Bytes::from(line)))
    });
    let body = hello
        .chain(lines)
        .take_until(app.shutdown.cancelled_owned());
    Response::builder()
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from_stream(body))
        .unwrap_or_else(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response())
}

async fn add_instance(State(app): State<App>, headers: HeaderMap, body: Bytes) -> Response {
    let spec: InstanceSpec = match parse(&body) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    if spec.name.is_empty() {
        return (StatusCode::BAD_REQUEST, "instance name is required\n").into_response();
    }
    let id = actor(&app, &headers).add_instance(spec);
    json(&serde_json::json!({ "id": id }))
}

async fn instance_action(
    State(app): State<App>,
    headers: HeaderMap,
    Path((id, action)): Path<(String, String)>,
) -> Response {
    let sim = actor(&app, &headers);
    let result = match action.as_str() {
        "stop" => sim.stop_instance(&id),
        "start" => sim.start_instance(&id),
        "terminate" => sim.terminate_instance(&id),
        other => {
            return (
                StatusCode::NOT_FOUND,
                format!("unknown action {other:?}; expected stop, start or terminate\n"),
            )
                .into_response();
        }
    };
    match result {
        Ok(changed) => json(&serde_json::json!({ "changed": changed })),
        Err(e) => sim_error(e),
    }
}

async fn delete_route(State(app): State<App>, headers: HeaderMap, body: Bytes) -> Response {
    let req: DeleteRouteRequest = match parse(&body) {
        Ok(r) => r,
        Err(r) => return r.into_response(),
    };
    let deleted =
        actor(&app, &headers).delete_route_out_of_band(&req.cluster, &req.destination_cidr);
    json(&serde_json::json!({ "deleted": deleted }))
}

async fn faults(State(app): State<App>, body: Bytes) -> Response {
    let req: FaultRequest = match parse(&body) {
        Ok(r) => r,
        Err(r) => return r.into_response(),
    };
    let sim = &app.sim;
    let result = match req {
        FaultRequest::Latency {
            op,
            fixed_ms,
            jitter_ms,
        } => sim.set_latency(&op, Latency::from_millis(fixed_ms, jitter_ms)),
        FaultRequest::ErrorRate { op, rate } => sim.set_error_rate(&op, rate),
        FaultRequest::FailNext { op, n } => sim.fail_next(&op, n),
        FaultRequest::Throttle { op, qps, burst } => match (qps, burst) {
            (Some(qps), Some(burst)) => sim.set_throttle(&op, Some(Throttle { qps, burst })),
            (None, None) => sim.set_throttle(&op, None),
            _ => Err(SimError::Invalid(
                "throttle needs both qps and burst, or neither to lift it".into(),
            )),
        },
        FaultRequest::Clear => {
            sim.clear_faults();
            Ok(())
        }
    };
    match result {
        Ok(()) => json(&serde_json::json!({})),
        Err(e) => sim_error(e),
    }
}

async fn instances(State(app): State<App>) -> Response {
    json(&app.sim.instances())
}

async fn routes(State(app): State<App>) -> Response {
    json(&app.sim.routes())
}

async fn load_balancers(State(app): State<App>) -> Response {
    json(&app.sim.load_balancers())
}

async fn mutations(State(app): State<App>) -> Response {
    json(&app.sim.mutations())
}

async fn calls(State(app): State<App>) -> Response {
    let counts: Vec<CallCount> = app
        .sim
        .calls()
        .into_iter()
        .map(|((operation, result), count)| CallCount {
            operation,
            result,
            count,
        })
        .collect();
    json(&counts)
}
