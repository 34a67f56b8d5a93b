//! Load-balancer rules: a missing LB is `None`; ensure reports ingress, is idempotent and
//! converges; update replaces hosts; delete leaves nothing and is idempotent; names fit; a
//! cancelled ensure leaves nothing half made.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ccm_cloud::k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
use ccm_cloud::{LoadBalancer, LoadBalancerStatus, Node, Service, node_name};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::time::Instant;

use crate::harness::{Fault, LbRecord};
use crate::rules::{self, Rule};
use crate::suite::{Check, Ctx, Verdict, fail};

/// The namespace of every Service the suite makes up.
pub const NAMESPACE: &str = "ccm-conformance";

/// A random RFC 4122 v4 UID, as the API server gives Services.
fn uid() -> String {
    let b: [u8; 16] = rand::random();
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

/// A `type: LoadBalancer` Service of the suite with one TCP port.
pub fn service(name: &str, port: i32, node_port: i32) -> Service {
    Service {
        metadata: ObjectMeta {
            namespace: Some(NAMESPACE.into()),
            name: Some(name.into()),
            uid: Some(uid()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                protocol: Some("TCP".into()),
                port,
                node_port: Some(node_port),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

fn with_port(svc: &Service, port: i32) -> Service {
    let mut s = svc.clone();
    if let Some(p) = s
        .spec
        .as_mut()
        .and_then(|sp| sp.ports.as_mut())
        .and_then(|ps| ps.first_mut())
    {
        p.port = port;
    }
    s
}

fn key(svc: &Service) -> String {
    format!(
        "{}/{}",
        svc.metadata.namespace.as_deref().unwrap_or(""),
        svc.metadata.name.as_deref().unwrap_or("")
    )
}

fn ingress(st: &LoadBalancerStatus) -> BTreeSet<String> {
    st.ingress
        .iter()
        .flatten()
        .filter_map(|i| i.ip.clone().or_else(|| i.hostname.clone()))
        .collect()
}

pub(crate) async fn run(ctx: &Ctx) {
    const ALL: [&Rule; 9] = [
        &rules::LB_GET_MISSING_NONE,
        &rules::LB_NAME_LIMITS,
        &rules::LB_ENSURE_STATUS,
        &rules::LB_ENSURE_IDEMPOTENT,
        &rules::LB_ENSURE_CONVERGES,
        &rules::LB_UPDATE_HOSTS,
        &rules::LB_DELETE_REMOVES,
        &rules::LB_DELETE_IDEMPOTENT,
        &rules::CANCEL_NOTHING_HALF_MADE,
    ];
    let Some(lb) = ctx.provider.load_balancer() else {
        for r in ALL {
            ctx.not_run(r, "all", "the provider has no LoadBalancer");
        }
        return;
    };
    let t = Instant::now();
    let missing = service("conformance-missing", 80, 30080);
    let check = match lb.get_load_balancer(ctx.cluster(), &missing).await {
        Ok(None) => Ok(()),
        other => fail(format!(
            "get_load_balancer of a Service that never had an LB returned {other:?}"
        )),
    };
    ctx.record(&rules::LB_GET_MISSING_NONE, "never created", t, check);
    let t = Instant::now();
    ctx.record(&rules::LB_NAME_LIMITS, "long names", t, names(ctx, &*lb));
    lifecycle(ctx, &lb).await;
    let t = Instant::now();
    ctx.record(
        &rules::CANCEL_NOTHING_HALF_MADE,
        "ensure cancelled mid-call",
        t,
        cancelled_ensure(ctx, &lb).await,
    );
}

fn names(ctx: &Ctx, lb: &dyn LoadBalancer) -> Check {
    let max = ctx.harness.max_lb_name_len();
    let long = "x".repeat(63);
    let a = service(&long, 80, 30080);
    let mut b = service(&long, 80, 30080);
    b.metadata.namespace = Some(long.clone());
    let (na, nb) = (
        lb.load_balancer_name(ctx.cluster(), &a),
        lb.load_balancer_name(ctx.cluster(), &b),
    );
    for n in [&na, &nb] {
        if n.is_empty() || n.len() > max {
            return fail(format!(
                "load_balancer_name {n:?} ({} characters) for a Service with a 63-character name; the cloud allows 1 to {max}",
                n.len()
            ));
        }
    }
    if na == nb {
        return fail(format!(
            "two Services with different UIDs share the LB name {na:?}"
        ));
    }
    Ok(())
}

/// The inventory's records of `svc`'s LB: `None` when the harness has no inventory.
async fn records(ctx: &Ctx, lb: &dyn LoadBalancer, svc: &Service) -> Option<Vec<LbRecord>> {
    let inv = ctx.harness.inventory(ctx.cluster()).await?;
    let name = lb.load_balancer_name(ctx.cluster(), svc);
    let key = key(svc);
    let uid = svc.metadata.uid.clone();
    Some(
        inv.load_balancers
            .into_iter()
            .filter(|r| {
                r.name == name
                    || r.service.as_deref() == Some(key.as_str())
                    || (r.service_uid.is_some() && r.service_uid == uid)
            })
            .collect(),
    )
}

async fn ensure(
    ctx: &Ctx,
    lb: &dyn LoadBalancer,
    svc: &Service,
    nodes: &[Arc<Node>],
) -> Result<LoadBalancerStatus, Verdict> {
    ctx.ledger.service(ctx.cluster(), svc);
    // Providers answer Retry while the LB provisions: ask again, as the controller would.
    let deadline = Instant::now() + ctx.harness.settle_timeout();
    loop {
        match lb.ensure_load_balancer(ctx.cluster(), svc, nodes).await {
            Ok(st) => return Ok(st),
            Err(ccm_cloud::CloudError::Retry { after, .. }) if Instant::now() < deadline => {
                tokio::time::sleep(after.min(Duration::from_secs(1))).await;
            }
            Err(e) => return fail(format!("ensure_load_balancer failed: {e}")),
        }
    }
}

/// The suite's Nodes as the service controller hands them to a provider.
fn shared_nodes(ctx: &Ctx) -> Vec<Arc<Node>> {
    ctx.nodes.lock().iter().cloned().map(Arc::new).collect()
}

fn hosts(nodes: &[Arc<Node>]) -> Vec<String> {
    let mut h: Vec<String> = nodes.iter().map(|n| node_name(n).to_string()).collect();
    h.sort();
    h
}

async fn lifecycle(ctx: &Ctx, lb: &Arc<dyn LoadBalancer>) {
    let nodes = shared_nodes(ctx);
    let svc = service("conformance-lb", 80, 30080);
    let pre = match ctx.need_destructive() {
        Err(v) => Err(v),
        Ok(()) if nodes.is_empty() => {
            Err(Verdict::NotRun("no instance to use as a backend".into()))
        }
        Ok(()) => Ok(()),
    };
    let steps: [(&Rule, &str); 6] = [
        (&rules::LB_ENSURE_STATUS, "create"),
        (&rules::LB_ENSURE_IDEMPOTENT, "ensure twice"),
        (&rules::LB_ENSURE_CONVERGES, "port and host change"),
        (&rules::LB_UPDATE_HOSTS, "replace hosts"),
        (&rules::LB_DELETE_REMOVES, "delete"),
        (&rules::LB_DELETE_IDEMPOTENT, "delete twice"),
    ];
    if let Err(v) = pre {
        for (r, case) in steps {
            ctx.record(r, case, Instant::now(), Err(v.clone()));
        }
        return;
    }
    let lb = &**lb;
    let first = &nodes[..1];
    let t = Instant::now();
    let created = create(ctx, lb, &svc, first).await;
    let ip = created.as_ref().ok().cloned().unwrap_or_default();
    ctx.record(&rules::LB_ENSURE_STATUS, "create", t, created.map(|_| ()));
    let t = Instant::now();
    let c = idempotent(ctx, lb, &svc, first, &ip).await;
    ctx.record(&rules::LB_ENSURE_IDEMPOTENT, "ensure twice", t, c);
    let t = Instant::now();
    let c = converges(ctx, lb, &svc, &nodes, &ip).await;
    ctx.record(&rules::LB_ENSURE_CONVERGES, "port and host change", t, c);
    let t = Instant::now();
    let c = update_hosts(ctx, lb, &with_port(&svc, 8080), &nodes).await;
    ctx.record(&rules::LB_UPDATE_HOSTS, "replace hosts", t, c);
    let t = Instant::now();
    let c = deleted(ctx, lb, &svc).await;
    ctx.record(&rules::LB_DELETE_REMOVES, "delete", t, c);
    let t = Instant::now();
    let c = delete_twice(ctx, lb, &svc).await;
    ctx.record(&rules::LB_DELETE_IDEMPOTENT, "delete twice", t, c);
}

async fn create(
    ctx: &Ctx,
    lb: &dyn LoadBalancer,
    svc: &Service,
    nodes: &[Arc<Node>],
) -> Result<BTreeSet<String>, Verdict> {
    let st = ensure(ctx, lb, svc, nodes).await?;
    let ip = ingress(&st);
    if ip.is_empty() {
        return fail(format!("ensure_load_balancer returned no ingress: {st:?}"));
    }
    let found = ctx
        .settle(|| async {
            match lb.get_load_balancer(ctx.cluster(), svc).await {
                Ok(Some(_)) => Some(()),
                _ => None,
            }
        })
        .await;
    if found.is_none() {
        return fail(format!(
            "get_load_balancer after a successful ensure returned {:?}",
            lb.get_load_balancer(ctx.cluster(), svc).await
        ));
    }
    Ok(ip)
}

/// Exactly one LB for `svc` in the inventory (when the harness has one).
async fn one_lb(
    ctx: &Ctx,
    lb: &dyn LoadBalancer,
    svc: &Service,
) -> Result<Option<LbRecord>, Verdict> {
    match records(ctx, lb, svc).await {
        None => Ok(None),
        Some(rs) if rs.len() == 1 => Ok(rs.into_iter().next()),
        Some(rs) => fail(format!(
            "the cloud holds {} load balancers for Service {}: {:?}",
            rs.len(),
            key(svc),
            rs.iter().map(|r| &r.name).collect::<Vec<_>>()
        )),
    }
}

async fn idempotent(
    ctx: &Ctx,
    lb: &dyn LoadBalancer,
    svc: &Service,
    nodes: &[Arc<Node>],
    ip: &BTreeSet<String>,
) -> Check {
    let again = ingress(&ensure(ctx, lb, svc, nodes).await?);
    if &again != ip {
        return fail(format!(
            "the second ensure answered ingress {again:?}, the first {ip:?}"
        ));
    }
    one_lb(ctx, lb, svc).await.map(|_| ())
}

async fn converges(
    ctx: &Ctx,
    lb: &dyn LoadBalancer,
    svc: &Service,
    nodes: &[Arc<Node>],
    ip: &BTreeSet<String>,
) -> Check {
    let changed = with_port(svc, 8080);
    let now = ingress(&ensure(ctx, lb, &changed, nodes).await?);
    if &now != ip {
        return fail(format!(
            "changing the Service's port moved the ingress from {ip:?} to {now:?}"
        ));
    }
    let Some(rec) = one_lb(ctx, lb, svc).await? else {
        return Ok(());
    };
    if let Some(ports) = &rec.ports
        && ports != &[8080]
    {
        return fail(format!(
            "after ensure with port 8080 the LB listens on {ports:?}"
        ));
    }
    if let Some(h) = &rec.hosts
        && h != &hosts(nodes)
    {
        return fail(format!(
            "after ensure with hosts {:?} the LB has {h:?}",
            hosts(nodes)
        ));
    }
    Ok(())
}

async fn update_hosts(
    ctx: &Ctx,
    lb: &dyn LoadBalancer,
    svc: &Service,
    nodes: &[Arc<Node>],
) -> Check {
    let want = if nodes.len() > 1 { &nodes[1..] } else { nodes };
    if let Err(e) = lb.update_load_balancer(ctx.cluster(), svc, want).await {
        return fail(format!("update_load_balancer failed: {e}"));
    }
    let Some(rec) = one_lb(ctx, lb, svc).await? else {
        return Err(Verdict::NotRun(
            "the harness cannot see the LB's hosts; update_load_balancer succeeded".into(),
        ));
    };
    match &rec.hosts {
        Some(h) if h == &hosts(want) => Ok(()),
        Some(h) => fail(format!(
            "update_load_balancer with {:?} left the LB with hosts {h:?}",
            hosts(want)
        )),
        None => Err(Verdict::NotRun(
            "the harness cannot see the LB's hosts; update_load_balancer succeeded".into(),
        )),
    }
}

async fn deleted(ctx: &Ctx, lb: &dyn LoadBalancer, svc: &Service) -> Check {
    if let Err(e) = lb.ensure_load_balancer_deleted(ctx.cluster(), svc).await {
        return fail(format!("ensure_load_balancer_deleted failed: {e}"));
    }
    gone(ctx, lb, svc).await
}

/// `get` says `None` and the inventory holds nothing of `svc`'s LB nor anything else of the
/// cluster's.
async fn gone(ctx: &Ctx, lb: &dyn LoadBalancer, svc: &Service) -> Check {
    let none = ctx
        .settle(|| async {
            matches!(lb.get_load_balancer(ctx.cluster(), svc).await, Ok(None)).then_some(())
        })
        .await;
    if none.is_none() {
        return fail(format!(
            "after a successful delete get_load_balancer returns {:?}",
            lb.get_load_balancer(ctx.cluster(), svc).await
        ));
    }
    if ctx.harness.inventory(ctx.cluster()).await.is_none() {
        return Ok(());
    }
    let left = ctx
        .settle(|| async {
            let rs = records(ctx, lb, svc).await?;
            let other = ctx.harness.inventory(ctx.cluster()).await?.other;
            (rs.is_empty() && other.is_empty()).then_some(())
        })
        .await;
    if left.is_none()
        && let (Some(rs), Some(inv)) = (
            records(ctx, lb, svc).await,
            ctx.harness.inventory(ctx.cluster()).await,
        )
    {
        return fail(format!(
            "after a successful delete the cloud still holds {:?} and {:?}",
            rs.iter().map(|r| &r.name).collect::<Vec<_>>(),
            inv.other
        ));
    }
    Ok(())
}

async fn delete_twice(ctx: &Ctx, lb: &dyn LoadBalancer, svc: &Service) -> Check {
    if let Err(e) = lb.ensure_load_balancer_deleted(ctx.cluster(), svc).await {
        return fail(format!("deleting an already deleted LB failed: {e}"));
    }
    let never = service("conformance-never", 80, 30080);
    if let Err(e) = lb.ensure_load_balancer_deleted(ctx.cluster(), &never).await {
        return fail(format!("deleting an LB that never existed failed: {e}"));
    }
    Ok(())
}

async fn cancelled_ensure(ctx: &Ctx, lb: &Arc<dyn LoadBalancer>) -> Check {
    ctx.need_destructive()?;
    let nodes = shared_nodes(ctx);
    if nodes.is_empty() {
        return Err(Verdict::NotRun("no instance to use as a backend".into()));
    }
    let lb = &**lb;
    let svc = service("conformance-cancel", 81, 30081);
    ctx.ledger.service(ctx.cluster(), &svc);
    let slow = ctx
        .harness
        .inject(Fault::Latency(Duration::from_millis(200)))
        .await;
    for after in [0, 20, 100, 300] {
        let call = lb.ensure_load_balancer(ctx.cluster(), &svc, &nodes);
        let _ = tokio::time::timeout(Duration::from_millis(after), call).await;
    }
    if slow.is_ok() {
        ctx.harness.clear_faults().await;
    }
    ensure(ctx, lb, &svc, &nodes).await?;
    one_lb(ctx, lb, &svc).await?;
    if let Err(e) = lb.ensure_load_balancer_deleted(ctx.cluster(), &svc).await {
        return fail(format!("delete after cancelled ensures failed: {e}"));
    }
    gone(ctx, lb, &svc).await
}
