//! Load balancers (upstream `pkg/openstack/loadbalancer.go`) on Octavia's v2 API.
//!
//! A Service's LB is named as upstream (`kube_service_<cluster>_<namespace>_<name>`), with a
//! listener per port (`listener_<i>_<lb>`), its pool (`pool_<i>_<lb>`), the nodes as members
//! (InternalIP, else ExternalIP; the port's NodePort) and, when asked, a health monitor
//! (`monitor_<port>_<lb>`): an LB upstream made is found by name and adopted in place.
//!
//! A new LB is one fully-populated create. Afterwards each difference is one write; members
//! are replaced per pool with Octavia's batch member update, after one members listing per
//! pool. Octavia is asynchronous: before every write the LB must be ACTIVE, polled briefly
//! with backoff; an LB still PENDING_* after that is a [`CloudError::Retry`], never a write,
//! and an LB in ERROR is an error. Octavia's 409 (the LB became immutable meanwhile) is a retry.
//!
//! The floating IP is on the VIP port, from the Service's or the configured floating
//! network; it is deleted with the LB unless `keep-floatingip` is set or the Service chose it
//! (`spec.loadBalancerIP`), then only detached. An LB named for another Service (shared, via
//! `load-balancer-id`) is never deleted nor its floating IP touched: only this Service's
//! listeners and pools are.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ccm_cloud::k8s_openapi::api::core::v1::{LoadBalancerIngress, ServicePort};
use ccm_cloud::{CloudError, CloudResult, LoadBalancer, LoadBalancerStatus, Node, Service};
use http::Method;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::cloud::OpenStackCloud;
use crate::http::{Reply, status_error};
use crate::lbopts::{LbConfig, MonitorOpts, ServiceLb};

/// Catalog type of Octavia.
pub const SERVICE_TYPE: &str = "load-balancer";

/// Polls of an LB's provisioning status before a write: waits before each, in milliseconds.
/// A change on Octavia takes a second or two; longer waits become a retry of the Service.
pub const SETTLE_BACKOFF_MS: &[u64] = &[0, 250, 500, 1000, 2000, 4000];

/// Retry delay for a Service whose LB is still provisioning.
pub const PROVISIONING_RETRY: Duration = Duration::from_secs(5);

/// Octavia's and Neutron's longest name.
const MAX_NAME: usize = 255;

/// The LB name upstream gives a Service: `kube_service_<cluster>_<namespace>_<name>`.
pub fn lb_name(cluster: &str, svc: &Service) -> String {
    let mut n = format!(
        "kube_service_{cluster}_{}_{}",
        svc.metadata.namespace.as_deref().unwrap_or("default"),
        svc.metadata.name.as_deref().unwrap_or("")
    );
    cut(&mut n);
    n
}

fn cut(s: &mut String) {
    if s.len() > MAX_NAME {
        let mut end = MAX_NAME;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

fn named(kind: &str, i: impl std::fmt::Display, lb: &str) -> String {
    let mut n = format!("{kind}_{i}_{lb}");
    cut(&mut n);
    n
}

#[derive(Debug, Clone, Deserialize)]
struct Lb {
    id: String,
    #[serde(default)]
    name: String,
    provisioning_status: String,
    #[serde(default)]
    vip_address: String,
    #[serde(default)]
    vip_port_id: Option<String>,
    #[serde(default)]
    vip_subnet_id: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
struct Listener {
    id: String,
    #[serde(default)]
    name: String,
    protocol: String,
    protocol_port: i32,
    #[serde(default)]
    default_pool_id: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
struct Pool {
    id: String,
    protocol: String,
    lb_algorithm: String,
    #[serde(default)]
    healthmonitor_id: Option<String>,
    #[serde(default)]
    session_persistence: Option<Value>,
}

#[derive(Debug, Clone, Deserialize)]
struct Member {
    #[serde(default)]
    name: String,
    address: String,
    protocol_port: i32,
    #[serde(default)]
    subnet_id: Option<String>,
    #[serde(default)]
    monitor_port: Option<i32>,
}

#[derive(Debug, Clone, Deserialize)]
struct Monitor {
    #[serde(rename = "type")]
    kind: String,
    delay: u64,
    timeout: u64,
    max_retries: u32,
    max_retries_down: u32,
}

#[derive(Debug, Clone, Deserialize)]
struct FloatingIp {
    id: String,
    floating_ip_address: String,
    #[serde(default)]
    port_id: Option<String>,
}

/// `type: LoadBalancer` Services as Octavia load balancers.
pub struct OctaviaLb {
    pub(crate) cloud: OpenStackCloud,
    pub(crate) config: LbConfig,
}

/// Where the members' health is probed. A Service with `externalTrafficPolicy: Local` has
/// kube-proxy answer `GET /healthz` on its `healthCheckNodePort` with 200 only on Nodes that
/// hold a ready endpoint: upstream's HTTP monitor there takes the other Nodes out of the pool
/// before they drop connections. Without one, the traffic port is probed.
#[derive(Debug, Clone, Copy, Default)]
struct HealthCheck {
    node_port: Option<i32>,
    /// Octavia takes HTTP monitors on UDP pools (API 2.16 and later).
    on_udp: bool,
}

impl HealthCheck {
    /// The health-check port for a pool of `proto`, when the HTTP monitor applies to it.
    fn port_for(self, proto: &str) -> Option<i32> {
        self.node_port.filter(|_| proto != "UDP" || self.on_udp)
    }
}

/// The first Octavia API version with HTTP monitors on UDP pools (upstream's
/// `OctaviaFeatureHTTPMonitorsOnUDP`).
const HTTP_MONITORS_ON_UDP: u32 = 16;

/// What one Service port asks for.
struct Want {
    listener: Value,
    pool: Value,
    members: Vec<Value>,
    monitor: Option<Value>,
}

impl OctaviaLb {
    async fn call(
        &self,
        service: &str,
        op: &str,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> CloudResult<Reply> {
        self.cloud
            .keystone()
            .request(service, op, method, path, &[], body)
            .await
    }

    /// An Octavia call whose success statuses are `ok`; 409 (the LB is immutable now) is a
    /// retry, other statuses errors.
    async fn octavia(
        &self,
        op: &str,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> CloudResult<Reply> {
        let reply = self.call(SERVICE_TYPE, op, method, path, body).await?;
        match reply.status.as_u16() {
            200..=299 => Ok(reply),
            409 => Err(CloudError::retry_after(
                PROVISIONING_RETRY,
                format!("{op}: the load balancer is busy (HTTP 409); trying again"),
            )),
            413 => Err(CloudError::Permanent(format!(
                "{op}: Octavia refused the request as too large (HTTP 413): a load balancer's \
                 members are written in one request (about 110 bytes each), and Octavia's \
                 [oslo_middleware] max_request_body_size (112 KiB by default) holds about 1,000; \
                 raise it in octavia.conf"
            ))),
            _ => Err(status_error(op, &reply)),
        }
    }

    async fn list<T: serde::de::DeserializeOwned>(
        &self,
        op: &str,
        path: &str,
        key: &str,
    ) -> CloudResult<Vec<T>> {
        self.octavia(op, Method::GET, path, None)
            .await?
            .field(op, key)
    }

    /// The Service's LB: the annotated one, else the one of its name. Deleted and deleting
    /// LBs do not count; two of the name is an error (never a guess).
    async fn find(&self, name: &str, opts: &ServiceLb) -> CloudResult<Option<Lb>> {
        if let Some(id) = &opts.lb_id {
            return self.get_lb(id).await;
        }
        let op = "load-balancer GET /v2/lbaas/loadbalancers?name";
        let path = format!("/v2/lbaas/loadbalancers?name={}", enc(name));
        let found: Vec<Lb> = self.list(op, &path, "loadbalancers").await?;
        let mut live = found.into_iter().filter(|l| {
            l.name == name
                && !matches!(l.provisioning_status.as_str(), "DELETED" | "PENDING_DELETE")
        });
        let first = live.next();
        if live.next().is_some() {
            return Err(CloudError::Permanent(format!(
                "more than one Octavia load balancer is named {name}; delete the extra one"
            )));
        }
        Ok(first)
    }

    /// The LB of `id`; `None` only on Octavia's own 404 for it.
    async fn get_lb(&self, id: &str) -> CloudResult<Option<Lb>> {
        let op = "load-balancer GET /v2/lbaas/loadbalancers/{id}";
        let path = format!("/v2/lbaas/loadbalancers/{}", enc(id));
        let reply = self
            .call(SERVICE_TYPE, op, Method::GET, &path, None)
            .await?;
        match reply.status.as_u16() {
            200 => Ok(Some(reply.field(op, "loadbalancer")?)),
            404 => Ok(None),
            _ => Err(status_error(op, &reply)),
        }
    }

    /// Waits (briefly) for the LB to be ACTIVE: the only state it may be written in.
    async fn settle(&self, id: &str) -> CloudResult<Lb> {
        let mut last = String::new();
        for ms in SETTLE_BACKOFF_MS {
            tokio::time::sleep(Duration::from_millis(*ms)).await;
            let Some(lb) = self.get_lb(id).await? else {
                return Err(CloudError::retry_after(
                    PROVISIONING_RETRY,
                    format!("load balancer {id} disappeared while being changed"),
                ));
            };
            match lb.provisioning_status.as_str() {
                "ACTIVE" => return Ok(lb),
                "ERROR" => {
                    return Err(CloudError::Permanent(format!(
                        "Octavia load balancer {} ({id}) is in ERROR; see Octavia's logs, then delete it or fix it",
                        lb.name
                    )));
                }
                s => last = s.to_string(),
            }
        }
        Err(CloudError::retry_after(
            PROVISIONING_RETRY,
            format!("load balancer {id} is {last}; waiting for ACTIVE"),
        ))
    }

    fn options(&self, svc: &Service) -> CloudResult<ServiceLb> {
        ServiceLb::new(&self.config, svc)
    }

    /// Options for reading and deleting what exists: a refused or malformed annotation never
    /// blocks a Service's cleanup (see [`ServiceLb::for_cleanup`]).
    fn cleanup_options(&self, svc: &Service) -> CloudResult<ServiceLb> {
        ServiceLb::for_cleanup(&self.config, svc)
    }

    /// Without `manage-security-groups`: a group left from when it was on is removed. A catalog
    /// without Neutron (so no group could have been made through it) is not an error here.
    async fn no_security_group(&self, svc: &Service) -> CloudResult<()> {
        match self.delete_security_group(svc).await {
            Err(CloudError::NotImplemented) => Ok(()),
            other => other,
        }
    }

    /// What a Service whose annotations are refused still gets: the members of its existing LB
    /// follow `nodes`; nothing else is written. No LB: nothing to do (creating one is refused).
    async fn backends_only(
        &self,
        cluster: &str,
        svc: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        let opts = self.cleanup_options(svc)?;
        let name = lb_name(cluster, svc);
        let Some(lb) = self.find(&name, &opts).await? else {
            return Ok(());
        };
        self.follow_nodes(&lb, &name, svc, &opts, nodes, false)
            .await?;
        if self.config.manage_security_groups {
            self.security_group(cluster, svc, &lb, &opts, nodes).await?;
        }
        Ok(())
    }

    /// With `manage-security-groups`, the Service's group as wanted; without, none left (as
    /// upstream: turning the key off removes the groups it made).
    async fn security_group(
        &self,
        cluster: &str,
        svc: &Service,
        lb: &Lb,
        opts: &ServiceLb,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        if !self.config.manage_security_groups {
            return self.no_security_group(svc).await;
        }
        let subnet = opts
            .member_subnet_id
            .clone()
            .or_else(|| lb.vip_subnet_id.clone())
            .ok_or_else(|| {
                CloudError::Transient(format!("load balancer {} has no VIP subnet yet", lb.id))
            })?;
        self.ensure_security_group(cluster, svc, &subnet, nodes)
            .await
    }

    /// Each port's pool gets `nodes` as members (one pools listing, then per pool one members
    /// listing and, when they differ, one batch update). A port without its pool is an error
    /// when `need_pools` (the ensure builds it), else skipped.
    async fn follow_nodes(
        &self,
        lb: &Lb,
        name: &str,
        svc: &Service,
        opts: &ServiceLb,
        nodes: &[Arc<Node>],
        need_pools: bool,
    ) -> CloudResult<()> {
        let ports = svc
            .spec
            .as_ref()
            .and_then(|s| s.ports.clone())
            .unwrap_or_default();
        let pools: Vec<Value> = self
            .list(
                "load-balancer GET /v2/lbaas/pools",
                &format!("/v2/lbaas/pools?loadbalancer_id={}", enc(&lb.id)),
                "pools",
            )
            .await?;
        let hc = self.health_check(opts, svc).await?;
        for (i, port) in ports.iter().enumerate() {
            if port.node_port.unwrap_or(0) == 0 {
                continue;
            }
            let pool_name = named("pool", i, name);
            let Some(p) = pools
                .iter()
                .find(|p| p["name"].as_str() == Some(pool_name.as_str()))
            else {
                if need_pools {
                    return Err(CloudError::Transient(format!(
                        "pool {pool_name} is missing; the Service is synced again"
                    )));
                }
                continue;
            };
            let id = p["id"].as_str().unwrap_or_default().to_string();
            let want = members(opts, port, nodes, lb.vip_subnet_id.as_deref(), hc);
            self.fix_members(&lb.id, &id, want).await?;
        }
        Ok(())
    }
}

/// `network_id=…` with the tag filter of `floating-subnet-tags` (built apart from the async
/// code: the serializer is not `Send`).
fn subnet_query(net: &str, tags: Option<&str>) -> String {
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    q.append_pair("network_id", net);
    if let Some(t) = tags {
        let (key, list) = crate::lbopts::tag_filter(t);
        q.append_pair(key, &list);
    }
    q.finish()
}

pub(crate) fn enc(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

pub(crate) fn node_address(node: &Node) -> Option<String> {
    let addrs = node.status.as_ref()?.addresses.as_ref()?;
    ["InternalIP", "ExternalIP"]
        .iter()
        .find_map(|t| addrs.iter().find(|a| a.type_ == *t))
        .map(|a| a.address.clone())
}

fn protocol(port: &ServicePort) -> CloudResult<&'static str> {
    match port.protocol.as_deref().unwrap_or("TCP") {
        "TCP" => Ok("TCP"),
        "UDP" => Ok("UDP"),
        "SCTP" => Ok("SCTP"),
        p => Err(CloudError::Permanent(format!(
            "port {}: protocol {p} is not one Octavia listens on (TCP, UDP, SCTP)",
            port.port
        ))),
    }
}

fn members(
    opts: &ServiceLb,
    port: &ServicePort,
    nodes: &[Arc<Node>],
    subnet: Option<&str>,
    hc: HealthCheck,
) -> Vec<Value> {
    let monitor_port = protocol(port).ok().and_then(|p| hc.port_for(p));
    let mut out: Vec<Value> = nodes
        .iter()
        .filter_map(|n| {
            let Some(addr) = node_address(n) else {
                tracing::warn!(
                    node = n.metadata.name.as_deref().unwrap_or(""),
                    "node has no InternalIP or ExternalIP; not a load balancer member"
                );
                return None;
            };
            let mut m = json!({
                "name": n.metadata.name.clone().unwrap_or_default(),
                "address": addr,
                "protocol_port": port.node_port.unwrap_or_default(),
            });
            if let Some(s) = opts.member_subnet_id.as_deref().or(subnet) {
                m["subnet_id"] = json!(s);
            }
            if let Some(p) = monitor_port {
                m["monitor_port"] = json!(p);
            }
            Some(m)
        })
        .collect();
    out.sort_by(|a, b| a["address"].as_str().cmp(&b["address"].as_str()));
    out
}

fn monitor_body(m: &MonitorOpts, proto: &str, name: String, hc: HealthCheck) -> Value {
    let kind = match proto {
        _ if hc.port_for(proto).is_some() => "HTTP",
        "UDP" => "UDP-CONNECT",
        "SCTP" => "SCTP",
        _ => "TCP",
    };
    let mut v = json!({"name": name, "type": kind, "delay": m.delay, "timeout": m.timeout,
           "max_retries": m.max_retries, "max_retries_down": m.max_retries_down});
    if kind == "HTTP" {
        v["url_path"] = json!("/healthz");
        v["http_method"] = json!("GET");
        v["expected_codes"] = json!("200");
    }
    v
}

fn source_ranges(svc: &Service) -> Vec<String> {
    let mut v: Vec<String> = svc
        .spec
        .as_ref()
        .and_then(|s| s.load_balancer_source_ranges.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|r| r.trim().to_string())
        .filter(|r| !r.is_empty())
        .collect();
    v.sort();
    v.dedup();
    v
}

fn wants(
    opts: &ServiceLb,
    name: &str,
    svc: &Service,
    nodes: &[Arc<Node>],
    subnet: Option<&str>,
    hc: HealthCheck,
) -> CloudResult<Vec<Want>> {
    let spec = svc.spec.clone().unwrap_or_default();
    let ports = spec.ports.unwrap_or_default();
    if ports.is_empty() {
        return Err(CloudError::Permanent("the Service has no ports".into()));
    }
    let cidrs = source_ranges(svc);
    let affinity = spec.session_affinity.as_deref() == Some("ClientIP");
    ports
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let proto = protocol(p)?;
            // x-forwarded-for: an HTTP listener that adds the header (as upstream).
            let (listener_proto, pool_proto) = match (opts.x_forwarded_for, proto) {
                (false, _) => (proto, proto),
                (true, "TCP") => ("HTTP", "HTTP"),
                (true, other) => {
                    return Err(CloudError::Permanent(format!(
                        "annotation loadbalancer.openstack.org/x-forwarded-for: port {} is {other}; the header needs an HTTP listener on a TCP port",
                        p.port
                    )));
                }
            };
            if p.node_port.unwrap_or(0) == 0 {
                return Err(CloudError::Permanent(format!(
                    "port {}: no nodePort allocated yet",
                    p.port
                )));
            }
            let mut listener = json!({
                "name": named("listener", i, name), "protocol": listener_proto, "tags": [name],
                "protocol_port": p.port, "connection_limit": opts.connection_limit,
                "allowed_cidrs": if cidrs.is_empty() { Value::Null } else { json!(cidrs) },
            });
            for (k, v) in ["timeout_client_data", "timeout_member_connect", "timeout_member_data", "timeout_tcp_inspect"]
                .iter()
                .zip(opts.timeouts)
            {
                if let Some(v) = v {
                    listener[*k] = json!(v);
                }
            }
            if opts.x_forwarded_for {
                listener["insert_headers"] = json!({"X-Forwarded-For": "true"});
            }
            let pool = json!({
                "name": named("pool", i, name),
                "protocol": if opts.proxy_protocol { "PROXY" } else { pool_proto },
                "lb_algorithm": opts.lb_method,
                "session_persistence": if affinity { json!({"type": "SOURCE_IP"}) } else { Value::Null },
            });
            Ok(Want {
                listener,
                pool,
                members: members(opts, p, nodes, subnet, hc),
                monitor: opts
                    .monitor
                    .as_ref()
                    .map(|m| monitor_body(m, proto, named("monitor", p.port, name), hc)),
            })
        })
        .collect()
}

fn ours(l: &Listener, name: &str) -> bool {
    l.name.starts_with("listener_") && l.name.ends_with(&format!("_{name}"))
}

fn key_of(v: &Value) -> (String, i64) {
    (
        v["protocol"].as_str().unwrap_or_default().to_string(),
        v["protocol_port"].as_i64().unwrap_or_default(),
    )
}

impl OctaviaLb {
    async fn create(
        &self,
        name: &str,
        cluster: &str,
        svc: &Service,
        opts: &ServiceLb,
        wants: Vec<Want>,
    ) -> CloudResult<Lb> {
        let mut body = json!({
            "name": name,
            "description": format!("Kubernetes external service {}/{} from cluster {cluster}",
                svc.metadata.namespace.as_deref().unwrap_or("default"), svc.metadata.name.as_deref().unwrap_or("")),
            "tags": [name],
        });
        let set = |b: &mut Value, k: &str, v: &Option<String>| {
            if let Some(v) = v {
                b[k] = json!(v);
            }
        };
        if opts.vip_port_id.is_some() {
            set(&mut body, "vip_port_id", &opts.vip_port_id);
        } else {
            set(&mut body, "vip_subnet_id", &opts.vip_subnet_id);
            set(&mut body, "vip_network_id", &opts.vip_network_id);
        }
        if opts.internal {
            let ip = svc.spec.as_ref().and_then(|s| s.load_balancer_ip.clone());
            set(&mut body, "vip_address", &ip.filter(|s| !s.is_empty()));
        }
        set(&mut body, "provider", &opts.provider);
        set(&mut body, "flavor_id", &opts.flavor_id);
        set(&mut body, "availability_zone", &opts.availability_zone);
        if opts.vip_port_id.is_none()
            && opts.vip_subnet_id.is_none()
            && opts.vip_network_id.is_none()
        {
            return Err(CloudError::Permanent(
                "no VIP placement: set [LoadBalancer] subnet-id or network-id, or the Service annotation loadbalancer.openstack.org/subnet-id".into(),
            ));
        }
        body["listeners"] = Value::Array(wants.into_iter().map(full_listener).collect());
        let op = "load-balancer POST /v2/lbaas/loadbalancers";
        let reply = self
            .octavia(
                op,
                Method::POST,
                "/v2/lbaas/loadbalancers",
                Some(&json!({"loadbalancer": body})),
            )
            .await?;
        reply.field(op, "loadbalancer")
    }
}

fn full_listener(w: Want) -> Value {
    let mut pool = w.pool;
    pool["members"] = Value::Array(w.members);
    if let Some(m) = w.monitor {
        pool["healthmonitor"] = m;
    }
    let mut l = w.listener;
    if l["allowed_cidrs"].is_null() {
        l.as_object_mut().map(|o| o.remove("allowed_cidrs"));
    }
    if pool["session_persistence"].is_null() {
        pool.as_object_mut()
            .map(|o| o.remove("session_persistence"));
    }
    l["default_pool"] = pool;
    l
}

/// The fields of `want` whose values differ from `have` (both JSON objects).
fn differing(want: &Value, have: &Value, fields: &[&str]) -> Option<Value> {
    let mut out = serde_json::Map::new();
    for f in fields {
        let w = want.get(*f).cloned().unwrap_or(Value::Null);
        let h = have.get(*f).cloned().unwrap_or(Value::Null);
        let same = w == h
            || (w.is_null() && h.as_array().is_some_and(|a| a.is_empty()))
            || (h.is_null() && w.as_array().is_some_and(|a| a.is_empty()));
        if !(same || w.is_null() && f.starts_with("timeout_")) {
            out.insert((*f).to_string(), w);
        }
    }
    (!out.is_empty()).then_some(Value::Object(out))
}

impl OctaviaLb {
    /// Brings the LB's listeners, pools, members and monitors of this Service to `wants`.
    async fn reconcile(&self, lb: &Lb, name: &str, wants: Vec<Want>) -> CloudResult<()> {
        let id = &lb.id;
        let op = "load-balancer GET /v2/lbaas/listeners";
        let listeners_raw: Vec<Value> = self
            .list(
                op,
                &format!("/v2/lbaas/listeners?loadbalancer_id={}", enc(id)),
                "listeners",
            )
            .await?;
        let listeners: Vec<Listener> = listeners_raw
            .iter()
            .map(|v| serde_json::from_value(v.clone()))
            .collect::<Result<_, _>>()
            .map_err(|e| CloudError::Transient(format!("{op}: unexpected response body ({e})")))?;
        let pools: Vec<Value> = self
            .list(
                "load-balancer GET /v2/lbaas/pools",
                &format!("/v2/lbaas/pools?loadbalancer_id={}", enc(id)),
                "pools",
            )
            .await?;
        let wanted: BTreeSet<(String, i64)> = wants.iter().map(|w| key_of(&w.listener)).collect();
        for l in listeners.iter().filter(|l| !ours(l, name)) {
            if wanted.contains(&(l.protocol.clone(), i64::from(l.protocol_port))) {
                return Err(CloudError::Permanent(format!(
                    "port {}/{} of load balancer {id} belongs to another listener ({})",
                    l.protocol, l.protocol_port, l.name
                )));
            }
        }
        // Removed first: a port whose listener changes protocol (x-forwarded-for: TCP to
        // HTTP) needs its old listener gone before the new one takes the port.
        for l in listeners.iter().filter(|l| ours(l, name)) {
            if !wanted.contains(&(l.protocol.clone(), i64::from(l.protocol_port))) {
                self.remove_listener(id, l).await?;
            }
        }
        for w in wants {
            let key = key_of(&w.listener);
            let have = listeners.iter().zip(&listeners_raw).find(|(l, _)| {
                ours(l, name) && (l.protocol.clone(), i64::from(l.protocol_port)) == key
            });
            match have {
                None => self.add_listener(id, w).await?,
                Some((l, raw)) => self.fix_listener(id, l, raw, &pools, w).await?,
            }
        }
        Ok(())
    }

    /// A new port: the listener, then its pool (Octavia answers 500 to a listener created with
    /// a populated `default_pool` outside a whole-LB create).
    async fn add_listener(&self, lb_id: &str, w: Want) -> CloudResult<()> {
        let mut body = w.listener.clone();
        body["loadbalancer_id"] = json!(lb_id);
        if body["allowed_cidrs"].is_null() {
            body.as_object_mut().map(|o| o.remove("allowed_cidrs"));
        }
        self.settle(lb_id).await?;
        let op = "load-balancer POST /v2/lbaas/listeners";
        let mut v: Value = self
            .octavia(
                op,
                Method::POST,
                "/v2/lbaas/listeners",
                Some(&json!({"listener": body})),
            )
            .await?
            .json(op)?;
        let id = v["listener"]["id"].take();
        let id = id.as_str().ok_or_else(|| {
            CloudError::Transient(format!("{op}: unexpected response body (no listener id)"))
        })?;
        self.create_pool(lb_id, id, w).await
    }

    /// A listener's pool: the pool, its members (one batch update), its monitor.
    async fn create_pool(&self, lb_id: &str, listener_id: &str, w: Want) -> CloudResult<()> {
        let mut body = w.pool;
        body["listener_id"] = json!(listener_id);
        if body["session_persistence"].is_null() {
            body.as_object_mut()
                .map(|o| o.remove("session_persistence"));
        }
        self.settle(lb_id).await?;
        let op = "load-balancer POST /v2/lbaas/pools";
        let pool: Pool = self
            .octavia(
                op,
                Method::POST,
                "/v2/lbaas/pools",
                Some(&json!({"pool": body})),
            )
            .await?
            .field(op, "pool")?;
        if !w.members.is_empty() {
            let path = format!("/v2/lbaas/pools/{}/members", enc(&pool.id));
            self.settle(lb_id).await?;
            self.octavia(
                "load-balancer PUT /v2/lbaas/pools/{id}/members",
                Method::PUT,
                &path,
                Some(&json!({"members": w.members})),
            )
            .await?;
        }
        self.fix_monitor(lb_id, &pool, w.monitor).await
    }

    async fn remove_listener(&self, lb_id: &str, l: &Listener) -> CloudResult<()> {
        if let Some(pool) = &l.default_pool_id {
            self.settle(lb_id).await?;
            self.delete(
                "load-balancer DELETE /v2/lbaas/pools/{id}",
                &format!("/v2/lbaas/pools/{}", enc(pool)),
            )
            .await?;
        }
        self.settle(lb_id).await?;
        self.delete(
            "load-balancer DELETE /v2/lbaas/listeners/{id}",
            &format!("/v2/lbaas/listeners/{}", enc(&l.id)),
        )
        .await
    }

    /// DELETE where Octavia's 404 means done.
    async fn delete(&self, op: &str, path: &str) -> CloudResult<()> {
        let reply = self
            .call(SERVICE_TYPE, op, Method::DELETE, path, None)
            .await?;
        match reply.status.as_u16() {
            200..=299 | 404 => Ok(()),
            409 => Err(CloudError::retry_after(
                PROVISIONING_RETRY,
                format!("{op}: the load balancer is busy (HTTP 409)"),
            )),
            _ => Err(status_error(op, &reply)),
        }
    }

    async fn fix_listener(
        &self,
        lb_id: &str,
        l: &Listener,
        raw: &Value,
        pools: &[Value],
        w: Want,
    ) -> CloudResult<()> {
        let fields = [
            "connection_limit",
            "allowed_cidrs",
            "timeout_client_data",
            "timeout_member_connect",
            "timeout_member_data",
            "timeout_tcp_inspect",
        ];
        if let Some(change) = differing(&w.listener, raw, &fields) {
            self.settle(lb_id).await?;
            self.octavia(
                "load-balancer PUT /v2/lbaas/listeners/{id}",
                Method::PUT,
                &format!("/v2/lbaas/listeners/{}", enc(&l.id)),
                Some(&json!({"listener": change})),
            )
            .await?;
        }
        let pool = l
            .default_pool_id
            .as_ref()
            .and_then(|p| pools.iter().find(|v| v["id"].as_str() == Some(p.as_str())));
        let pool: Option<Pool> = pool.and_then(|p| serde_json::from_value(p.clone()).ok());
        match pool {
            Some(p) if p.protocol == w.pool["protocol"].as_str().unwrap_or_default() => {
                self.fix_pool(lb_id, &p, w).await
            }
            other => {
                if let Some(p) = other {
                    self.settle(lb_id).await?;
                    self.delete(
                        "load-balancer DELETE /v2/lbaas/pools/{id}",
                        &format!("/v2/lbaas/pools/{}", enc(&p.id)),
                    )
                    .await?;
                }
                self.create_pool(lb_id, &l.id, w).await
            }
        }
    }

    async fn fix_pool(&self, lb_id: &str, p: &Pool, w: Want) -> CloudResult<()> {
        let have = json!({"lb_algorithm": p.lb_algorithm, "session_persistence": p.session_persistence.as_ref().map(|s| json!({"type": s["type"]}))});
        if let Some(change) = differing(&w.pool, &have, &["lb_algorithm", "session_persistence"]) {
            self.settle(lb_id).await?;
            self.octavia(
                "load-balancer PUT /v2/lbaas/pools/{id}",
                Method::PUT,
                &format!("/v2/lbaas/pools/{}", enc(&p.id)),
                Some(&json!({"pool": change})),
            )
            .await?;
        }
        self.fix_members(lb_id, &p.id, w.members).await?;
        self.fix_monitor(lb_id, p, w.monitor).await
    }

    /// One listing; when the members differ, one batch update that replaces them all.
    async fn fix_members(&self, lb_id: &str, pool_id: &str, want: Vec<Value>) -> CloudResult<()> {
        let path = format!("/v2/lbaas/pools/{}/members", enc(pool_id));
        let have: Vec<Member> = self
            .list(
                "load-balancer GET /v2/lbaas/pools/{id}/members",
                &path,
                "members",
            )
            .await?;
        type Key = (String, String, i64, Option<i64>, Option<String>);
        let have: BTreeSet<Key> = have
            .into_iter()
            .map(|m| {
                let port = i64::from(m.protocol_port);
                (
                    m.address,
                    m.name,
                    port,
                    m.monitor_port.map(i64::from),
                    m.subnet_id,
                )
            })
            .collect();
        let wanted: BTreeSet<Key> = want
            .iter()
            .map(|m| {
                (
                    m["address"].as_str().unwrap_or_default().to_string(),
                    m["name"].as_str().unwrap_or_default().to_string(),
                    m["protocol_port"].as_i64().unwrap_or_default(),
                    m["monitor_port"].as_i64(),
                    m["subnet_id"].as_str().map(str::to_string),
                )
            })
            .collect();
        let same = have.len() == wanted.len()
            && have.iter().zip(&wanted).all(|(h, w)| {
                h.0 == w.0
                    && h.1 == w.1
                    && h.2 == w.2
                    && h.3 == w.3
                    && (w.4.is_none() || h.4 == w.4)
            });
        if same {
            return Ok(());
        }
        self.settle(lb_id).await?;
        self.octavia(
            "load-balancer PUT /v2/lbaas/pools/{id}/members",
            Method::PUT,
            &path,
            Some(&json!({"members": want})),
        )
        .await?;
        Ok(())
    }

    /// The pool's monitor as wanted: made, removed, updated in place, or (its type changed, as
    /// when `externalTrafficPolicy` does) replaced.
    async fn fix_monitor(&self, lb_id: &str, p: &Pool, want: Option<Value>) -> CloudResult<()> {
        match (&p.healthmonitor_id, want) {
            (None, None) => Ok(()),
            (Some(hm), None) => self.delete_monitor(lb_id, hm).await,
            (None, Some(m)) => self.create_monitor(lb_id, p, m).await,
            (Some(hm), Some(m)) => {
                let op = "load-balancer GET /v2/lbaas/healthmonitors/{id}";
                let path = format!("/v2/lbaas/healthmonitors/{}", enc(hm));
                let mut v: Value = self.octavia(op, Method::GET, &path, None).await?.json(op)?;
                let have: Monitor =
                    serde_json::from_value(v["healthmonitor"].take()).map_err(|e| {
                        CloudError::Transient(format!("{op}: unexpected response body ({e})"))
                    })?;
                if m["type"].as_str() != Some(have.kind.as_str()) {
                    self.delete_monitor(lb_id, hm).await?;
                    return self.create_monitor(lb_id, p, m).await;
                }
                let have = json!({"delay": have.delay, "timeout": have.timeout, "max_retries": have.max_retries, "max_retries_down": have.max_retries_down});
                if let Some(change) = differing(
                    &m,
                    &have,
                    &["delay", "timeout", "max_retries", "max_retries_down"],
                ) {
                    self.settle(lb_id).await?;
                    self.octavia(
                        "load-balancer PUT /v2/lbaas/healthmonitors/{id}",
                        Method::PUT,
                        &path,
                        Some(&json!({"healthmonitor": change})),
                    )
                    .await?;
                }
                Ok(())
            }
        }
    }

    async fn create_monitor(&self, lb_id: &str, p: &Pool, mut m: Value) -> CloudResult<()> {
        m["pool_id"] = json!(p.id);
        self.settle(lb_id).await?;
        self.octavia(
            "load-balancer POST /v2/lbaas/healthmonitors",
            Method::POST,
            "/v2/lbaas/healthmonitors",
            Some(&json!({"healthmonitor": m})),
        )
        .await?;
        Ok(())
    }

    async fn delete_monitor(&self, lb_id: &str, id: &str) -> CloudResult<()> {
        self.settle(lb_id).await?;
        self.delete(
            "load-balancer DELETE /v2/lbaas/healthmonitors/{id}",
            &format!("/v2/lbaas/healthmonitors/{}", enc(id)),
        )
        .await
    }

    /// The Service's [`HealthCheck`]. Octavia's API version is read only for a Service with
    /// both a health-check port and a UDP port (upstream's feature check), and never with
    /// `lb-provider = ovn`, which has no HTTP monitors.
    async fn health_check(&self, opts: &ServiceLb, svc: &Service) -> CloudResult<HealthCheck> {
        let spec = svc.spec.as_ref();
        let node_port = spec
            .and_then(|s| s.health_check_node_port)
            .filter(|p| *p > 0 && opts.provider.as_deref() != Some("ovn"));
        let udp = spec
            .and_then(|s| s.ports.as_ref())
            .is_some_and(|ps| ps.iter().any(|p| p.protocol.as_deref() == Some("UDP")));
        let on_udp = node_port.is_some() && udp && self.api_minor().await? >= HTTP_MONITORS_ON_UDP;
        Ok(HealthCheck { node_port, on_udp })
    }

    /// The highest `v2.N` Octavia's version document lists (`GET /` on its endpoint).
    async fn api_minor(&self) -> CloudResult<u32> {
        let op = "load-balancer GET /";
        let v: Value = self.octavia(op, Method::GET, "/", None).await?.json(op)?;
        api_minor_of(&v).ok_or_else(|| {
            CloudError::Transient(format!("{op}: no v2 API version in the version document"))
        })
    }
}

fn api_minor_of(doc: &Value) -> Option<u32> {
    doc["versions"]
        .as_array()?
        .iter()
        .filter_map(|v| v["id"].as_str()?.strip_prefix("v2.")?.parse().ok())
        .max()
}

// ---- Floating IPs (Neutron) ----

impl OctaviaLb {
    async fn neutron(
        &self,
        op: &str,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> CloudResult<Reply> {
        let reply = self.call("network", op, method, path, body).await?;
        if reply.status.is_success() {
            Ok(reply)
        } else {
            Err(status_error(op, &reply))
        }
    }

    async fn fips(&self, query: &str) -> CloudResult<Vec<FloatingIp>> {
        let op = "network GET /v2.0/floatingips";
        self.neutron(op, Method::GET, &format!("/v2.0/floatingips?{query}"), None)
            .await?
            .field(op, "floatingips")
    }

    async fn fip_of_port(&self, port: &str) -> CloudResult<Option<FloatingIp>> {
        Ok(self
            .fips(&format!("port_id={}", enc(port)))
            .await?
            .into_iter()
            .next())
    }

    /// The VIP's floating IP: the one on the port, else the Service's `loadBalancerIP` attached,
    /// else a new one.
    async fn ensure_fip(
        &self,
        lb: &Lb,
        svc: &Service,
        net: &str,
        opts: &ServiceLb,
    ) -> CloudResult<String> {
        let port = lb.vip_port_id.as_deref().ok_or_else(|| {
            CloudError::Transient(format!("load balancer {} has no VIP port yet", lb.id))
        })?;
        if let Some(f) = self.fip_of_port(port).await? {
            return Ok(f.floating_ip_address);
        }
        let wanted_ip = svc
            .spec
            .as_ref()
            .and_then(|s| s.load_balancer_ip.clone())
            .filter(|s| !s.is_empty());
        if let Some(ip) = &wanted_ip {
            let found = self
                .fips(&format!(
                    "floating_ip_address={}&floating_network_id={}",
                    enc(ip),
                    enc(net)
                ))
                .await?;
            if let Some(f) = found.into_iter().next() {
                if f.port_id.is_some() {
                    return Err(CloudError::Permanent(format!(
                        "loadBalancerIP {ip}: the floating IP is attached to another port"
                    )));
                }
                self.neutron(
                    "network PUT /v2.0/floatingips/{id}",
                    Method::PUT,
                    &format!("/v2.0/floatingips/{}", enc(&f.id)),
                    Some(&json!({"floatingip": {"port_id": port}})),
                )
                .await?;
                return Ok(f.floating_ip_address);
            }
        }
        let subnet = self.floating_subnet(net, opts).await?;
        let mut body = json!({"floating_network_id": net, "port_id": port,
            "description": format!("Floating IP for Kubernetes external service {} from cluster", lb.name)});
        if let Some(s) = subnet {
            body["subnet_id"] = json!(s);
        }
        if let Some(ip) = wanted_ip {
            body["floating_ip_address"] = json!(ip);
        }
        let op = "network POST /v2.0/floatingips";
        let f: FloatingIp = self
            .neutron(
                op,
                Method::POST,
                "/v2.0/floatingips",
                Some(&json!({"floatingip": body})),
            )
            .await?
            .field(op, "floatingip")?;
        Ok(f.floating_ip_address)
    }

    /// The floating IP's subnet: `floating-subnet-id`, else the first subnet of the floating
    /// network (Neutron's order) whose name matches `floating-subnet` and whose tags pass
    /// `floating-subnet-tags` (Neutron filters them); none matching is an error, never a
    /// subnet the Service did not ask for.
    async fn floating_subnet(&self, net: &str, opts: &ServiceLb) -> CloudResult<Option<String>> {
        if opts.floating_subnet_id.is_some() {
            return Ok(opts.floating_subnet_id.clone());
        }
        if opts.floating_subnet.is_none() && opts.floating_subnet_tags.is_none() {
            return Ok(None);
        }
        let matcher = opts
            .floating_subnet
            .as_deref()
            .map(crate::lbopts::name_matcher)
            .transpose()
            .map_err(|e| CloudError::Permanent(format!("floating-subnet: expected {e}")))?;
        let query = subnet_query(net, opts.floating_subnet_tags.as_deref());
        let op = "network GET /v2.0/subnets";
        let subnets: Vec<Value> = self
            .neutron(op, Method::GET, &format!("/v2.0/subnets?{query}"), None)
            .await?
            .field(op, "subnets")?;
        subnets
            .iter()
            .find(|s| {
                let name = s["name"].as_str().unwrap_or_default();
                matcher.as_ref().is_none_or(|m| m(name))
            })
            .and_then(|s| s["id"].as_str().map(|id| Some(id.to_string())))
            .ok_or_else(|| {
                CloudError::Permanent(format!(
                    "no subnet of floating network {net} matches floating-subnet {:?} and floating-subnet-tags {:?}",
                    opts.floating_subnet.as_deref().unwrap_or(""),
                    opts.floating_subnet_tags.as_deref().unwrap_or("")
                ))
            })
    }

    /// Deletes the VIP's floating IP, or only detaches it when the Service keeps it.
    async fn release_fip(&self, lb: &Lb, svc: &Service, opts: &ServiceLb) -> CloudResult<()> {
        let Some(port) = lb.vip_port_id.as_deref() else {
            return Ok(());
        };
        let Some(f) = self.fip_of_port(port).await? else {
            return Ok(());
        };
        let chosen = svc
            .spec
            .as_ref()
            .and_then(|s| s.load_balancer_ip.as_deref())
            == Some(f.floating_ip_address.as_str());
        let path = format!("/v2.0/floatingips/{}", enc(&f.id));
        if opts.keep_floating_ip || chosen {
            self.neutron(
                "network PUT /v2.0/floatingips/{id}",
                Method::PUT,
                &path,
                Some(&json!({"floatingip": {"port_id": null}})),
            )
            .await?;
            return Ok(());
        }
        let op = "network DELETE /v2.0/floatingips/{id}";
        let reply = self
            .call("network", op, Method::DELETE, &path, None)
            .await?;
        match reply.status.as_u16() {
            200..=299 | 404 => Ok(()),
            _ => Err(status_error(op, &reply)),
        }
    }

    async fn status(&self, lb: &Lb, opts: &ServiceLb) -> CloudResult<LoadBalancerStatus> {
        let mut ip = lb.vip_address.clone();
        if let (Some(_), Some(port)) = (&opts.floating_network_id, lb.vip_port_id.as_deref())
            && let Some(f) = self.fip_of_port(port).await?
        {
            ip = f.floating_ip_address;
        }
        Ok(ingress(opts, ip))
    }
}

/// The Service's ingress, as upstream: the `hostname` annotation if set; with PROXY protocol
/// and `enable-ingress-hostname`, `<address>.<ingress-hostname-suffix>`; else the address.
fn ingress(opts: &ServiceLb, ip: String) -> LoadBalancerStatus {
    let one = if let Some(h) = &opts.hostname {
        LoadBalancerIngress {
            hostname: Some(h.clone()),
            ..Default::default()
        }
    } else if let (true, Some(suffix)) = (opts.proxy_protocol, &opts.ingress_hostname_suffix) {
        LoadBalancerIngress {
            hostname: Some(format!("{ip}.{suffix}")),
            ..Default::default()
        }
    } else {
        LoadBalancerIngress {
            ip: Some(ip),
            ..Default::default()
        }
    };
    LoadBalancerStatus {
        ingress: Some(vec![one]),
    }
}

#[async_trait]
impl LoadBalancer for OctaviaLb {
    async fn get_load_balancer(
        &self,
        cluster: &str,
        svc: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        let opts = self.cleanup_options(svc)?;
        let Some(lb) = self.find(&lb_name(cluster, svc), &opts).await? else {
            return Ok(None);
        };
        Ok(Some(self.status(&lb, &opts).await?))
    }

    fn load_balancer_name(&self, cluster: &str, svc: &Service) -> String {
        lb_name(cluster, svc)
    }

    async fn ensure_load_balancer(
        &self,
        cluster: &str,
        svc: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        let opts = match self.options(svc) {
            Ok(o) => o,
            Err(e) => {
                // The error becomes the Service's Warning Event; an LB that exists keeps
                // serving the Nodes there are. Only a new LB is refused.
                if let Err(b) = self.backends_only(cluster, svc, nodes).await {
                    tracing::warn!(service = ?svc.metadata.name, error = %b, "members of a load balancer with refused annotations");
                }
                return Err(e);
            }
        };
        let name = lb_name(cluster, svc);
        let (lb, created) = match self.find(&name, &opts).await? {
            Some(lb) => (lb, false),
            None if opts.lb_id.is_some() => {
                return Err(CloudError::Permanent(format!(
                    "annotation loadbalancer.openstack.org/load-balancer-id: Octavia has no load balancer {}",
                    opts.lb_id.as_deref().unwrap_or("")
                )));
            }
            None => {
                let hc = self.health_check(&opts, svc).await?;
                let w = wants(&opts, &name, svc, nodes, opts.vip_subnet_id.as_deref(), hc)?;
                (self.create(&name, cluster, svc, &opts, w).await?, true)
            }
        };
        let lb = self.settle(&lb.id).await?;
        if !created {
            let hc = self.health_check(&opts, svc).await?;
            let w = match wants(&opts, &name, svc, nodes, lb.vip_subnet_id.as_deref(), hc) {
                Ok(w) => w,
                Err(e) => {
                    // A port the LB cannot serve as asked: reported, and the members still
                    // follow the Nodes.
                    if let Err(b) = self
                        .follow_nodes(&lb, &name, svc, &opts, nodes, false)
                        .await
                    {
                        tracing::warn!(lb = %name, error = %b, "members of a load balancer whose Service is refused");
                    }
                    return Err(e);
                }
            };
            self.reconcile(&lb, &name, w).await?;
        }
        // A shared LB's floating IP is its owner's.
        let status = match &opts.floating_network_id {
            Some(net) if lb.name == name => {
                let ip = self.ensure_fip(&lb, svc, net, &opts).await?;
                ingress(&opts, ip)
            }
            _ => self.status(&lb, &opts).await?,
        };
        self.security_group(cluster, svc, &lb, &opts, nodes).await?;
        Ok(status)
    }

    async fn update_load_balancer(
        &self,
        cluster: &str,
        svc: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        let opts = match self.options(svc) {
            Ok(o) => o,
            Err(e) => {
                // A refused or malformed annotation never stops the members following the
                // Nodes: the ensure reports it (a Warning Event) and retries.
                tracing::warn!(service = ?svc.metadata.name, error = %e, "updating only the members");
                return self.backends_only(cluster, svc, nodes).await;
            }
        };
        let name = lb_name(cluster, svc);
        let Some(lb) = self.find(&name, &opts).await? else {
            return Err(CloudError::Transient(format!(
                "load balancer {name} does not exist yet"
            )));
        };
        self.follow_nodes(&lb, &name, svc, &opts, nodes, true)
            .await?;
        if self.config.manage_security_groups {
            self.security_group(cluster, svc, &lb, &opts, nodes).await?;
        }
        Ok(())
    }

    async fn ensure_load_balancer_deleted(&self, cluster: &str, svc: &Service) -> CloudResult<()> {
        let opts = self.cleanup_options(svc)?;
        let name = lb_name(cluster, svc);
        // The Service's security group goes last, also when the LB is already gone (a delete
        // that failed after the LB).
        let Some(lb) = self.find(&name, &opts).await? else {
            return self.no_security_group(svc).await;
        };
        if lb.provisioning_status != "PENDING_DELETE" {
            let lb = self.settle(&lb.id).await?;
            if lb.name != name {
                // Shared: only this Service's listeners go.
                self.reconcile_delete_listeners(&lb, &name).await?;
            } else {
                self.release_fip(&lb, svc, &opts).await?;
                self.delete(
                    "load-balancer DELETE /v2/lbaas/loadbalancers/{id}",
                    &format!("/v2/lbaas/loadbalancers/{}?cascade=true", enc(&lb.id)),
                )
                .await?;
            }
        }
        self.no_security_group(svc).await
    }
}

impl OctaviaLb {
    async fn reconcile_delete_listeners(&self, lb: &Lb, name: &str) -> CloudResult<()> {
        let listeners: Vec<Listener> = self
            .list(
                "load-balancer GET /v2/lbaas/listeners",
                &format!("/v2/lbaas/listeners?loadbalancer_id={}", enc(&lb.id)),
                "listeners",
            )
            .await?;
        for l in listeners.iter().filter(|l| ours(l, name)) {
            self.remove_listener(&lb.id, l).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_upstreams() {
        let mut s = Service::default();
        s.metadata.namespace = Some("ns".into());
        s.metadata.name = Some("web".into());
        assert_eq!(lb_name("kubernetes", &s), "kube_service_kubernetes_ns_web");
        assert_eq!(named("listener", 0, "lb"), "listener_0_lb");
        s.metadata.name = Some("x".repeat(300));
        assert_eq!(lb_name("c", &s).len(), 255);
    }

    #[test]
    fn differing_treats_null_and_empty_lists_alike() {
        let want = json!({"allowed_cidrs": null, "connection_limit": -1});
        let have = json!({"allowed_cidrs": [], "connection_limit": -1});
        assert_eq!(
            differing(&want, &have, &["allowed_cidrs", "connection_limit"]),
            None
        );
        let want = json!({"allowed_cidrs": ["10.0.0.0/8"]});
        assert!(differing(&want, &have, &["allowed_cidrs"]).is_some());
    }

    fn web(anns: &[(&str, &str)]) -> Service {
        let mut s = Service::default();
        s.metadata.namespace = Some("ns".into());
        s.metadata.name = Some("web".into());
        s.metadata.annotations = Some(
            anns.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        s.spec = Some(ccm_cloud::k8s_openapi::api::core::v1::ServiceSpec {
            ports: Some(vec![ServicePort {
                protocol: Some("TCP".into()),
                port: 80,
                node_port: Some(30080),
                ..Default::default()
            }]),
            ..Default::default()
        });
        s
    }

    #[test]
    fn x_forwarded_for_makes_http_listeners_that_add_the_header() {
        let cfg = LbConfig::default();
        let svc = web(&[("loadbalancer.openstack.org/x-forwarded-for", "true")]);
        let opts = ServiceLb::new(&cfg, &svc).expect("honoured");
        let w = wants(&opts, "lb", &svc, &[], None, HealthCheck::default()).expect("wants");
        assert_eq!(w[0].listener["protocol"], "HTTP");
        assert_eq!(
            w[0].listener["insert_headers"],
            json!({"X-Forwarded-For": "true"})
        );
        assert_eq!(w[0].pool["protocol"], "HTTP");
        let plain = web(&[]);
        let opts = ServiceLb::new(&cfg, &plain).expect("plain");
        let w = wants(&opts, "lb", &plain, &[], None, HealthCheck::default()).expect("wants");
        assert_eq!(w[0].listener["protocol"], "TCP");
        assert!(w[0].listener.get("insert_headers").is_none());
    }

    #[test]
    fn a_health_check_port_makes_http_monitors_on_it_and_member_monitor_ports() {
        let cfg = LbConfig {
            create_monitor: true,
            ..LbConfig::default()
        };
        let mut svc = web(&[]);
        let spec = svc.spec.as_mut().expect("spec");
        spec.ports.as_mut().expect("ports").push(ServicePort {
            protocol: Some("UDP".into()),
            port: 53,
            node_port: Some(30053),
            ..Default::default()
        });
        let opts = ServiceLb::new(&cfg, &svc).expect("honoured");
        let mut node = Node::default();
        node.metadata.name = Some("n1".into());
        node.status = Some(ccm_cloud::k8s_openapi::api::core::v1::NodeStatus {
            addresses: Some(vec![ccm_cloud::k8s_openapi::api::core::v1::NodeAddress {
                type_: "InternalIP".into(),
                address: "10.0.0.1".into(),
            }]),
            ..Default::default()
        });
        let nodes = [Arc::new(node)];
        let kinds = |hc: HealthCheck| {
            let w = wants(&opts, "lb", &svc, &nodes, None, hc).expect("wants");
            w.iter()
                .map(|w| {
                    let m = w.monitor.as_ref().expect("monitor");
                    (
                        m["type"].as_str().unwrap_or_default().to_string(),
                        m["url_path"].as_str().map(str::to_string),
                        w.members[0]["monitor_port"].as_i64(),
                    )
                })
                .collect::<Vec<_>>()
        };
        let http = |port| ("HTTP".to_string(), Some("/healthz".to_string()), Some(port));
        assert_eq!(
            kinds(HealthCheck::default()),
            vec![
                ("TCP".into(), None, None),
                ("UDP-CONNECT".into(), None, None)
            ]
        );
        let local = HealthCheck {
            node_port: Some(32000),
            on_udp: false,
        };
        assert_eq!(
            kinds(local),
            vec![http(32000), ("UDP-CONNECT".into(), None, None)],
            "an Octavia older than 2.16 has no HTTP monitors on UDP pools"
        );
        let on_udp = HealthCheck {
            on_udp: true,
            ..local
        };
        assert_eq!(kinds(on_udp), vec![http(32000), http(32000)]);
    }

    #[test]
    fn the_api_version_is_the_highest_v2_listed() {
        let doc = json!({"versions": [{"id": "v2.0", "status": "SUPPORTED"},
            {"id": "v2.30", "status": "CURRENT"}, {"id": "v2.9", "status": "SUPPORTED"}]});
        assert_eq!(api_minor_of(&doc), Some(30));
        assert_eq!(api_minor_of(&json!({"versions": [{"id": "v1"}]})), None);
        assert_eq!(api_minor_of(&json!({"error": "x"})), None);
    }

    #[test]
    fn the_ingress_is_the_hostname_when_asked() {
        let cfg = LbConfig {
            enable_ingress_hostname: true,
            ..LbConfig::default()
        };
        let ip = || "203.0.113.5".to_string();
        let h = ServiceLb::new(
            &cfg,
            &web(&[("loadbalancer.openstack.org/hostname", "lb.example.com")]),
        )
        .expect("ok");
        let st = ingress(&h, ip());
        let i = &st.ingress.expect("ingress")[0];
        assert_eq!(
            (i.hostname.as_deref(), i.ip.as_deref()),
            (Some("lb.example.com"), None)
        );
        let proxy = ServiceLb::new(
            &cfg,
            &web(&[("loadbalancer.openstack.org/proxy-protocol", "true")]),
        )
        .expect("ok");
        let st = ingress(&proxy, ip());
        assert_eq!(
            st.ingress.expect("ingress")[0].hostname.as_deref(),
            Some("203.0.113.5.nip.io")
        );
        let plain = ServiceLb::new(&cfg, &web(&[])).expect("ok");
        assert_eq!(
            ingress(&plain, ip()).ingress.expect("ingress")[0]
                .ip
                .as_deref(),
            Some("203.0.113.5")
        );
    }
}
