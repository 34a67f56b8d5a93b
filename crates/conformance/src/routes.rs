//! Route rules: only this cluster's routes, created routes listed once, delete idempotent,
//! blackholes reported.

use ccm_cloud::{NodeAddressKey, Route, Routes, node_name};
use ipnet::{IpNet, Ipv4Net};
use tokio::time::Instant;

use crate::rules::{self, Rule};
use crate::suite::{Check, Ctx, Verdict, fail};

/// The second cluster name the suite uses, to prove routes stay apart.
pub(crate) fn other_cluster(ctx: &Ctx) -> String {
    format!("{}-other", ctx.cluster())
}

fn same_cidr(a: &str, b: &str) -> bool {
    match (a.parse::<IpNet>(), b.parse::<IpNet>()) {
        (Ok(x), Ok(y)) => x.trunc() == y.trunc(),
        _ => a == b,
    }
}

pub(crate) fn subnet(ctx: &Ctx, i: usize) -> Ipv4Net {
    let base = ctx.harness.route_cidr_base();
    base.subnets(24)
        .ok()
        .and_then(|mut s| s.nth(i))
        .unwrap_or(base)
}

fn route_to(node: &ccm_cloud::Node, cidr: Ipv4Net) -> Route {
    Route {
        name: String::new(),
        target_node: node_name(node).to_string(),
        enable_node_addresses: false,
        target_node_addresses: node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .map(|a| a.iter().map(NodeAddressKey::from).collect())
            .unwrap_or_default(),
        destination_cidr: cidr.to_string(),
        blackhole: false,
    }
}

async fn list(r: &dyn Routes, cluster: &str) -> Result<Vec<Route>, Verdict> {
    r.list_routes(cluster)
        .await
        .or_else(|e| fail(format!("list_routes({cluster}) failed: {e}")))
}

fn matching<'a>(routes: &'a [Route], cidr: &str) -> Vec<&'a Route> {
    routes
        .iter()
        .filter(|r| same_cidr(&r.destination_cidr, cidr))
        .collect()
}

pub(crate) async fn run(ctx: &Ctx) {
    const ALL: [&Rule; 5] = [
        &rules::ROUTE_CREATE_LISTED,
        &rules::ROUTES_ONLY_THIS_CLUSTER,
        &rules::ROUTE_CREATE_NO_DUPLICATE,
        &rules::ROUTE_DELETE_IDEMPOTENT,
        &rules::ROUTE_BLACKHOLE,
    ];
    let Some(r) = ctx.provider.routes() else {
        for rule in ALL {
            ctx.not_run(rule, "all", "the provider has no Routes");
        }
        return;
    };
    let r = &*r;
    // Read-only: a cluster name nobody ever used owns no routes.
    let t = Instant::now();
    let fresh = match r.list_routes(ctx.cluster()).await {
        Ok(rs) if rs.is_empty() => Ok(()),
        Ok(rs) => fail(format!(
            "list_routes of a cluster name never used returned {} routes, e.g. {:?}",
            rs.len(),
            rs.first()
        )),
        Err(e) => fail(format!("list_routes failed: {e}")),
    };
    ctx.record(
        &rules::ROUTES_ONLY_THIS_CLUSTER,
        "fresh cluster name",
        t,
        fresh,
    );
    let nodes = ctx.nodes.lock().clone();
    let pre = ctx.need_destructive().and_then(|()| {
        if nodes.is_empty() {
            Err(Verdict::NotRun("no instance to route to".into()))
        } else {
            Ok(())
        }
    });
    if let Err(v) = pre {
        for rule in ALL {
            if rule.id != rules::ROUTES_ONLY_THIS_CLUSTER.id {
                ctx.record(rule, "all", Instant::now(), Err(v.clone()));
            }
        }
        return;
    }
    let node = &nodes[0];
    let a = route_to(node, subnet(ctx, 0));
    let t = Instant::now();
    let created = create_listed(ctx, r, &a).await;
    let ok = created.is_ok();
    ctx.record(&rules::ROUTE_CREATE_LISTED, "create", t, created);
    if !ok {
        return;
    }
    let t = Instant::now();
    let c = only_this_cluster(ctx, r, &a, route_to(node, subnet(ctx, 1))).await;
    ctx.record(&rules::ROUTES_ONLY_THIS_CLUSTER, "two clusters", t, c);
    let t = Instant::now();
    let c = create_again(ctx, r, &a).await;
    ctx.record(&rules::ROUTE_CREATE_NO_DUPLICATE, "create twice", t, c);
    let t = Instant::now();
    let c = delete_twice(ctx, r, &a).await;
    ctx.record(&rules::ROUTE_DELETE_IDEMPOTENT, "delete twice", t, c);
    let t = Instant::now();
    let c = blackhole(ctx, r).await;
    ctx.record(&rules::ROUTE_BLACKHOLE, "terminated target", t, c);
}

async fn create_in(ctx: &Ctx, r: &dyn Routes, cluster: &str, route: &Route) -> Check {
    ctx.ledger.route(cluster, route);
    let hint = format!(
        "conformance-{}",
        route.destination_cidr.replace(['.', '/'], "-")
    );
    r.create_route(cluster, &hint, route).await.or_else(|e| {
        fail(format!(
            "create_route({}) failed: {e}",
            route.destination_cidr
        ))
    })
}

async fn listed(ctx: &Ctx, r: &dyn Routes, cluster: &str, cidr: &str) -> Option<Vec<Route>> {
    ctx.settle(|| async {
        let rs = r.list_routes(cluster).await.ok()?;
        (!matching(&rs, cidr).is_empty()).then_some(rs)
    })
    .await
}

async fn create_listed(ctx: &Ctx, r: &dyn Routes, a: &Route) -> Check {
    create_in(ctx, r, ctx.cluster(), a).await?;
    let Some(rs) = listed(ctx, r, ctx.cluster(), &a.destination_cidr).await else {
        return fail(format!(
            "route {} created without error is not listed: list_routes gives {:?}",
            a.destination_cidr,
            r.list_routes(ctx.cluster()).await
        ));
    };
    let m = matching(&rs, &a.destination_cidr);
    if m[0].target_node != a.target_node || m[0].blackhole {
        return fail(format!(
            "route {} to node {} is listed as {:?}",
            a.destination_cidr, a.target_node, m[0]
        ));
    }
    Ok(())
}

async fn only_this_cluster(ctx: &Ctx, r: &dyn Routes, a: &Route, b: Route) -> Check {
    let other = other_cluster(ctx);
    create_in(ctx, r, &other, &b).await?;
    if listed(ctx, r, &other, &b.destination_cidr).await.is_none() {
        return fail(format!(
            "route {} created in cluster {other} is not listed there",
            b.destination_cidr
        ));
    }
    let mine = list(r, ctx.cluster()).await?;
    if let Some(x) = mine
        .iter()
        .find(|x| !same_cidr(&x.destination_cidr, &a.destination_cidr))
    {
        return fail(format!(
            "list_routes({}) returned {:?}, a route this cluster never created (cluster {other} did)",
            ctx.cluster(),
            x
        ));
    }
    let theirs = list(r, &other).await?;
    if !matching(&theirs, &a.destination_cidr).is_empty() {
        return fail(format!(
            "list_routes({other}) returned route {} of cluster {}",
            a.destination_cidr,
            ctx.cluster()
        ));
    }
    let _ = r.delete_route(&other, &b).await;
    Ok(())
}

async fn create_again(ctx: &Ctx, r: &dyn Routes, a: &Route) -> Check {
    // An error (EC2's RouteAlreadyExists) is allowed; a second route is not.
    let _ = create_in(ctx, r, ctx.cluster(), a).await;
    let rs = list(r, ctx.cluster()).await?;
    match matching(&rs, &a.destination_cidr).len() {
        1 => Ok(()),
        n => fail(format!(
            "after creating route {} twice, list_routes holds {n} routes for it",
            a.destination_cidr
        )),
    }
}

async fn delete_twice(ctx: &Ctx, r: &dyn Routes, a: &Route) -> Check {
    let rs = list(r, ctx.cluster()).await?;
    let Some(listed) = matching(&rs, &a.destination_cidr).first().cloned().cloned() else {
        return fail(format!(
            "route {} vanished before delete",
            a.destination_cidr
        ));
    };
    if let Err(e) = r.delete_route(ctx.cluster(), &listed).await {
        return fail(format!("delete_route of a listed route failed: {e}"));
    }
    let gone = ctx
        .settle(|| async {
            let rs = r.list_routes(ctx.cluster()).await.ok()?;
            matching(&rs, &a.destination_cidr).is_empty().then_some(())
        })
        .await;
    if gone.is_none() {
        return fail(format!(
            "route {} is still listed after a successful delete_route",
            a.destination_cidr
        ));
    }
    r.delete_route(ctx.cluster(), &listed)
        .await
        .or_else(|e| fail(format!("deleting a route that is already gone failed: {e}")))
}

async fn blackhole(ctx: &Ctx, r: &dyn Routes) -> Check {
    let node = ctx
        .create_instance(&format!("{}-blackhole", ctx.cluster()))
        .await?;
    let c = route_to(&node, subnet(ctx, 2));
    create_in(ctx, r, ctx.cluster(), &c).await?;
    if listed(ctx, r, ctx.cluster(), &c.destination_cidr)
        .await
        .is_none()
    {
        return fail(format!(
            "route {} is not listed after create",
            c.destination_cidr
        ));
    }
    ctx.harness.terminate_instance(&node).await?;
    let reported = ctx
        .settle(|| async {
            let rs = r.list_routes(ctx.cluster()).await.ok()?;
            let m = matching(&rs, &c.destination_cidr);
            (m.is_empty() || m.iter().all(|x| x.blackhole)).then_some(())
        })
        .await;
    let result = if reported.is_some() {
        Ok(())
    } else {
        fail(format!(
            "the route to terminated node {} is still listed as live: {:?}",
            node_name(&node),
            r.list_routes(ctx.cluster()).await
        ))
    };
    let _ = r.delete_route(ctx.cluster(), &c).await;
    result
}
