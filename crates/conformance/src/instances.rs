//! Instance rules: existence and power state, errors never "gone", batch equals single,
//! providerID round trip, well-formed addresses and labels.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use ccm_cloud::{
    CloudError, CloudResult, InstanceMetadata, InstanceStatus, Instances, Node, node_name,
};
use tokio::time::Instant;

use crate::harness::Fault;
use crate::rules::{self, Rule};
use crate::suite::{Check, Ctx, Verdict, fail};

/// A copy of `node` carrying `provider_id`.
pub(crate) fn with_provider_id(node: &Node, provider_id: &str) -> Node {
    let mut n = node.clone();
    n.spec.get_or_insert_with(Default::default).provider_id = Some(provider_id.to_string());
    n
}

fn without_provider_id(node: &Node) -> Node {
    let mut n = node.clone();
    if let Some(s) = n.spec.as_mut() {
        s.provider_id = None;
    }
    n
}

pub(crate) async fn run(ctx: &Ctx) {
    const ALL: [&Rule; 9] = [
        &rules::INSTANCE_EXISTS,
        &rules::INSTANCE_STOPPED,
        &rules::INSTANCE_TERMINATED,
        &rules::ERROR_NEVER_GONE,
        &rules::FOREIGN_ID_NOT_GONE,
        &rules::BATCH_EQUALS_SINGLE,
        &rules::PROVIDER_ID_ROUND_TRIP,
        &rules::ADDRESSES_WELL_FORMED,
        &rules::LABELS_WELL_FORMED,
    ];
    let Some(inst) = ctx.provider.instances() else {
        for r in ALL {
            ctx.not_run(r, "all", "the provider has no Instances");
        }
        return;
    };
    let nodes = suite_nodes(ctx).await;
    if nodes.is_empty() {
        for r in ALL {
            ctx.not_run(
                r,
                "all",
                "no instance to check: the harness gives no existing Node and cannot create one",
            );
        }
        return;
    }
    for node in &nodes {
        let t = Instant::now();
        let case = format!("node {}", node_name(node));
        ctx.record(
            &rules::INSTANCE_EXISTS,
            &case,
            t,
            running_exists(&*inst, node).await,
        );
        metadata_checks(ctx, &*inst, node).await;
    }
    let t = Instant::now();
    ctx.record(
        &rules::BATCH_EQUALS_SINGLE,
        "running and absent nodes",
        t,
        batch_equals_single(ctx, &*inst, &nodes).await,
    );
    foreign_ids(ctx, &*inst, &nodes[0]).await;
    errors_never_gone(ctx, &inst, &nodes[0]).await;
    // Independent instances: wait out the cloud's settle time for both at once.
    let t = Instant::now();
    let (stopped, gone) = tokio::join!(stop_start(ctx, &*inst), terminated(ctx, &*inst));
    ctx.record(&rules::INSTANCE_STOPPED, "stop then start", t, stopped);
    ctx.record(&rules::INSTANCE_TERMINATED, "terminate", t, gone);
}

/// The harness's existing Nodes plus, at the destructive level, two instances the suite
/// creates. They are shared with the route and LB checks.
async fn suite_nodes(ctx: &Ctx) -> Vec<Node> {
    let mut nodes = ctx.harness.existing_nodes().await;
    if ctx.destructive() {
        for i in 0..2 {
            let name = format!("{}-node-{i}", ctx.cluster());
            match ctx.create_instance(&name).await {
                Ok(n) => nodes.push(n),
                Err(e) => tracing::info!(?e, "harness created no instance"),
            }
        }
    }
    *ctx.nodes.lock() = nodes.clone();
    nodes
}

async fn running_exists(inst: &dyn Instances, node: &Node) -> Check {
    match inst.instance_exists(node).await {
        Ok(true) => {}
        Ok(false) => return fail("instance_exists returned Ok(false) for a running instance"),
        Err(e) => return fail(format!("instance_exists returned an error: {e}")),
    }
    match inst.instance_shutdown(node).await {
        Ok(false) => Ok(()),
        Ok(true) => fail("instance_shutdown returned Ok(true) for a running instance"),
        Err(e) => fail(format!("instance_shutdown returned an error: {e}")),
    }
}

async fn metadata_checks(ctx: &Ctx, inst: &dyn Instances, node: &Node) {
    let case = format!("node {}", node_name(node));
    let t = Instant::now();
    let md = match inst.instance_metadata(node).await {
        Ok(Some(md)) => md,
        other => {
            let detail = format!("instance_metadata of a running instance returned {other:?}");
            for r in [
                &rules::PROVIDER_ID_ROUND_TRIP,
                &rules::ADDRESSES_WELL_FORMED,
                &rules::LABELS_WELL_FORMED,
            ] {
                ctx.record(r, &case, t, fail(detail.clone()));
            }
            return;
        }
    };
    let rt = round_trip(ctx, inst, node, &md).await;
    ctx.record(&rules::PROVIDER_ID_ROUND_TRIP, &case, t, rt);
    ctx.record(&rules::ADDRESSES_WELL_FORMED, &case, t, addresses_ok(&md));
    ctx.record(&rules::LABELS_WELL_FORMED, &case, t, labels_ok(&md));
}

async fn round_trip(ctx: &Ctx, inst: &dyn Instances, node: &Node, md: &InstanceMetadata) -> Check {
    let prefix = format!("{}://", ctx.provider.provider_name());
    let pid = if md.provider_id.is_empty() {
        ccm_cloud::node_provider_id(node).to_string()
    } else {
        md.provider_id.clone()
    };
    if !pid.starts_with(&prefix) || pid.len() == prefix.len() {
        return fail(format!(
            "providerID {pid:?} is not of the form {prefix}<id>"
        ));
    }
    let again = with_provider_id(node, &pid);
    match inst.instance_exists(&again).await {
        Ok(true) => {}
        other => {
            return fail(format!(
                "a Node carrying providerID {pid:?} got instance_exists {other:?}"
            ));
        }
    }
    match inst.instance_metadata(&again).await {
        Ok(Some(md2)) if same_instance(md, &md2) => Ok(()),
        other => fail(format!(
            "metadata by providerID {pid:?} differs from metadata by name: {md:?} then {other:?}"
        )),
    }
}

fn same_instance(a: &InstanceMetadata, b: &InstanceMetadata) -> bool {
    let addrs = |m: &InstanceMetadata| -> BTreeSet<(String, String)> {
        m.node_addresses
            .iter()
            .map(|x| (x.type_.clone(), x.address.clone()))
            .collect()
    };
    (a.provider_id.is_empty() || b.provider_id.is_empty() || a.provider_id == b.provider_id)
        && a.instance_type == b.instance_type
        && a.zone == b.zone
        && a.region == b.region
        && addrs(a) == addrs(b)
}

const ADDRESS_TYPES: [&str; 5] = [
    "InternalIP",
    "ExternalIP",
    "Hostname",
    "InternalDNS",
    "ExternalDNS",
];

/// Every address has a Kubernetes type, IPs parse, nothing repeats.
pub fn addresses_ok(md: &InstanceMetadata) -> Check {
    let mut seen = BTreeSet::new();
    for a in &md.node_addresses {
        if !ADDRESS_TYPES.contains(&a.type_.as_str()) {
            return fail(format!(
                "address {:?} has type {:?}, not one of {ADDRESS_TYPES:?}",
                a.address, a.type_
            ));
        }
        if a.address.is_empty() {
            return fail(format!("an address of type {} is empty", a.type_));
        }
        if a.type_.ends_with("IP") && a.address.parse::<IpAddr>().is_err() {
            return fail(format!(
                "{} address {:?} is not an IP address",
                a.type_, a.address
            ));
        }
        if !seen.insert((a.type_.clone(), a.address.clone())) {
            return fail(format!("address {} {} is listed twice", a.type_, a.address));
        }
    }
    Ok(())
}

/// Kubernetes label-value syntax: empty, or at most 63 of `[A-Za-z0-9._-]` with alphanumeric
/// ends.
pub fn valid_label_value(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && v.starts_with(|c: char| c.is_ascii_alphanumeric())
            && v.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

/// Kubernetes label-key syntax: `[prefix/]name`, the prefix a DNS subdomain of at most 253.
pub fn valid_label_key(k: &str) -> bool {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
    });
    prefix_ok && !name.is_empty() && valid_label_value(name)
}

fn labels_ok(md: &InstanceMetadata) -> Check {
    for (what, v) in [
        ("instance type", &md.instance_type),
        ("zone", &md.zone),
        ("region", &md.region),
    ] {
        if !valid_label_value(v) {
            return fail(format!("{what} {v:?} is not a valid label value"));
        }
    }
    for (k, v) in &md.additional_labels {
        if !valid_label_key(k) {
            return fail(format!(
                "additional label key {k:?} is not a valid label key"
            ));
        }
        if !valid_label_value(v) {
            return fail(format!(
                "additional label {k}={v:?}: not a valid label value"
            ));
        }
    }
    Ok(())
}

fn same_answer<T: PartialEq + std::fmt::Debug>(
    what: &str,
    node: &Node,
    single: &CloudResult<T>,
    batch: &CloudResult<T>,
) -> Check {
    match (single, batch) {
        (Ok(a), Ok(b)) if a == b => Ok(()),
        (Err(_), Err(_)) => Ok(()),
        _ => fail(format!(
            "{what} for node {}: single call {single:?}, batch {batch:?}",
            node_name(node)
        )),
    }
}

/// Two batches, as a cluster has them (Node names are unique in each): the Nodes as kubelets
/// register them plus an absent one, then the same Nodes carrying their providerIDs.
async fn batch_equals_single(ctx: &Ctx, inst: &dyn Instances, nodes: &[Node]) -> Check {
    let mut by_name: Vec<Node> = nodes.iter().map(without_provider_id).collect();
    by_name.push(ccm_cloud_node(&format!("{}-absent", ctx.cluster())));
    let mut by_id = Vec::new();
    for n in nodes {
        if let Ok(Some(md)) = inst.instance_metadata(n).await
            && !md.provider_id.is_empty()
        {
            by_id.push(with_provider_id(n, &md.provider_id));
        }
    }
    for batch in [by_name, by_id] {
        same_batch(inst, &batch).await?;
    }
    Ok(())
}

async fn same_batch(inst: &dyn Instances, batch: &[Node]) -> Check {
    let shared: Vec<Arc<Node>> = batch.iter().cloned().map(Arc::new).collect();
    let statuses = inst.instances_status(&shared).await;
    let metas = inst.instances_metadata(&shared).await;
    if statuses.len() != batch.len() || metas.len() != batch.len() {
        return fail(format!(
            "{} Nodes in, {} statuses and {} metadata out",
            batch.len(),
            statuses.len(),
            metas.len()
        ));
    }
    for (i, n) in batch.iter().enumerate() {
        let single = single_status(inst, n).await;
        same_answer("instances_status", n, &single, &statuses[i])?;
        let single_md = inst.instance_metadata(n).await;
        same_answer("instances_metadata", n, &single_md, &metas[i])?;
    }
    Ok(())
}

/// A Node with only a name, as a kubelet registers it.
pub(crate) fn ccm_cloud_node(name: &str) -> Node {
    Node {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        ..Default::default()
    }
}

async fn single_status(inst: &dyn Instances, n: &Node) -> CloudResult<InstanceStatus> {
    let exists = inst.instance_exists(n).await?;
    let shutdown = if exists {
        match inst.instance_shutdown(n).await {
            Ok(s) => s,
            Err(CloudError::NotImplemented) => false,
            Err(e) => return Err(e),
        }
    } else {
        false
    };
    Ok(InstanceStatus { exists, shutdown })
}

/// Checks that one Node is never "gone" through any of the instance calls: `Ok(true)` or an
/// error from `instance_exists`, and `exists: true` or an error from `instances_status`.
async fn never_gone(inst: &dyn Instances, node: &Node, why: &str) -> Check {
    if let Ok(false) = inst.instance_exists(node).await {
        return fail(format!("instance_exists returned Ok(false) {why}"));
    }
    let status = inst.instances_status(&[Arc::new(node.clone())]).await;
    if let Some(Ok(s)) = status.first()
        && !s.exists
    {
        return fail(format!("instances_status returned exists: false {why}"));
    }
    Ok(())
}

async fn foreign_ids(ctx: &Ctx, inst: &dyn Instances, node: &Node) {
    let name = ctx.provider.provider_name();
    for (case, pid) in [
        (
            "another provider's id",
            "conformance-other://i-0123456789abcdef0".to_string(),
        ),
        ("empty id", format!("{name}://")),
        ("malformed", format!("{name}:/not-a-provider-id")),
    ] {
        let t = Instant::now();
        let n = with_provider_id(node, &pid);
        let why = format!("for a Node carrying providerID {pid:?}");
        ctx.record(
            &rules::FOREIGN_ID_NOT_GONE,
            case,
            t,
            never_gone(inst, &n, &why).await,
        );
    }
}

async fn errors_never_gone(ctx: &Ctx, inst: &Arc<dyn Instances>, node: &Node) {
    let pid = inst
        .instance_metadata(node)
        .await
        .ok()
        .flatten()
        .map(|m| m.provider_id)
        .filter(|p| !p.is_empty());
    for fault in Fault::ERRORS {
        let t = Instant::now();
        let check = async {
            ctx.need_destructive()?;
            ctx.harness.inject(fault).await?;
            let mut forms = vec![without_provider_id(node)];
            if let Some(pid) = &pid {
                forms.push(with_provider_id(node, pid));
            }
            for n in &forms {
                let why = format!("while the cloud answered {fault:?}");
                // A cloud that does not answer may make the call hang: not "gone" either.
                let call = never_gone(&**inst, n, &why);
                if let Ok(r) = tokio::time::timeout(ctx.harness.settle_timeout(), call).await {
                    r?;
                }
            }
            Ok::<(), Verdict>(())
        }
        .await;
        ctx.harness.clear_faults().await;
        ctx.record(&rules::ERROR_NEVER_GONE, &format!("{fault:?}"), t, check);
    }
}

async fn stop_start(ctx: &Ctx, inst: &dyn Instances) -> Check {
    ctx.need_destructive()?;
    let node = ctx
        .create_instance(&format!("{}-stop", ctx.cluster()))
        .await?;
    ctx.harness.stop_instance(&node).await?;
    let stopped = ctx
        .settle(|| async {
            match single_status(inst, &node).await {
                Ok(s) if !s.exists => Some(Err(
                    "instance_exists returned Ok(false) for a stopped instance".to_string(),
                )),
                Ok(s) if s.shutdown => Some(Ok(())),
                _ => None,
            }
        })
        .await;
    match stopped {
        Some(Ok(())) => {}
        Some(Err(e)) => return fail(e),
        None => {
            return fail(format!(
                "the stopped instance was never reported shut down; last answer {:?}",
                single_status(inst, &node).await
            ));
        }
    }
    match inst
        .instances_status(&[Arc::new(node.clone())])
        .await
        .first()
    {
        Some(Ok(InstanceStatus {
            exists: true,
            shutdown: true,
        })) => {}
        other => return fail(format!("instances_status of a stopped instance: {other:?}")),
    }
    ctx.harness.start_instance(&node).await?;
    let started = ctx
        .settle(|| async {
            matches!(
                single_status(inst, &node).await,
                Ok(InstanceStatus {
                    exists: true,
                    shutdown: false
                })
            )
            .then_some(())
        })
        .await;
    match started {
        Some(()) => Ok(()),
        None => fail(format!(
            "the started instance is still reported {:?}",
            single_status(inst, &node).await
        )),
    }
}

async fn terminated(ctx: &Ctx, inst: &dyn Instances) -> Check {
    ctx.need_destructive()?;
    let node = ctx
        .create_instance(&format!("{}-term", ctx.cluster()))
        .await?;
    let pid = match inst.instance_metadata(&node).await {
        Ok(Some(m)) if !m.provider_id.is_empty() => m.provider_id,
        other => return fail(format!("metadata of a new instance: {other:?}")),
    };
    ctx.harness.terminate_instance(&node).await?;
    for n in [without_provider_id(&node), with_provider_id(&node, &pid)] {
        // A Node without providerID (never initialized) may get InstanceNotFound instead, as
        // upstream's lookup by name answers: an error, so such a Node is never deleted on it.
        let by_name = ccm_cloud::node_provider_id(&n).is_empty();
        let gone_answer = |r: &CloudResult<bool>| match r {
            Ok(false) => true,
            Err(CloudError::InstanceNotFound) => by_name,
            _ => false,
        };
        let gone = ctx
            .settle(|| async {
                let batch = inst.instances_status(&[Arc::new(n.clone())]).await;
                let batch_gone = match batch.first() {
                    Some(Ok(s)) => !s.exists,
                    Some(Err(CloudError::InstanceNotFound)) => by_name,
                    _ => false,
                };
                (gone_answer(&inst.instance_exists(&n).await) && batch_gone).then_some(())
            })
            .await;
        if gone.is_none() {
            return fail(format!(
                "a terminated instance ({}) is still reported: instance_exists {:?}, instances_status {:?}",
                if ccm_cloud::node_provider_id(&n).is_empty() {
                    "by name"
                } else {
                    "by providerID"
                },
                inst.instance_exists(&n).await,
                inst.instances_status(&[Arc::new(n.clone())]).await
            ));
        }
    }
    Ok(())
}
