//! Throttling surfaces as `CloudError::Throttled`, on every capability.

use std::sync::Arc;

use ccm_cloud::{CloudError, CloudResult};
use tokio::time::Instant;

use crate::harness::Fault;
use crate::instances::ccm_cloud_node;
use crate::lb::service;
use crate::rules;
use crate::suite::{Check, Ctx, fail};

fn throttled<T: std::fmt::Debug>(call: &str, r: CloudResult<T>) -> Check {
    match r {
        Err(CloudError::Throttled { .. }) => Ok(()),
        other => fail(format!(
            "{call} against a throttling cloud returned {other:?}, not CloudError::Throttled"
        )),
    }
}

pub(crate) async fn run(ctx: &Ctx) {
    let t = Instant::now();
    let check = throttling(ctx).await;
    ctx.harness.clear_faults().await;
    ctx.record(&rules::THROTTLED, "every capability", t, check);
}

async fn throttling(ctx: &Ctx) -> Check {
    ctx.need_destructive()?;
    ctx.harness.inject(Fault::Throttle).await?;
    let node = ctx
        .nodes
        .lock()
        .first()
        .cloned()
        .unwrap_or_else(|| ccm_cloud_node("conformance-throttled"));
    if let Some(i) = ctx.provider.instances() {
        throttled("instance_exists", i.instance_exists(&node).await)?;
        let batch = i.instances_status(&[Arc::new(node.clone())]).await;
        throttled(
            "instances_status",
            batch.into_iter().next().unwrap_or(Ok(Default::default())),
        )?;
    }
    let local = ctx.harness.local_capabilities();
    if let Some(lb) = ctx
        .provider
        .load_balancer()
        .filter(|_| !local.contains(&"load_balancer"))
    {
        let svc = service("conformance-throttled", 80, 30080);
        throttled(
            "get_load_balancer",
            lb.get_load_balancer(ctx.cluster(), &svc).await,
        )?;
    }
    if let Some(r) = ctx.provider.routes().filter(|_| !local.contains(&"routes")) {
        throttled("list_routes", r.list_routes(ctx.cluster()).await)?;
    }
    Ok(())
}
