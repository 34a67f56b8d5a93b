//! The cluster level: the real controllers (the whole manager, as `ccm run` starts it) on
//! kube-sim with the provider's cloud, driven as kubelets and users drive a cluster, checking
//! the cluster's final state and the cloud's.

use std::sync::Arc;
use std::time::Duration;

use ccm_cloud::CloudProvider;
use ccm_kube_sim::KubeSim;
use ccm_manager::options::RunOptions;
use ccm_manager::run::{Exit, Runtime};
use clap::Parser;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::harness::Fault;
use crate::rules;
use crate::suite::{Check, Ctx, Verdict, fail};

const TAINT_UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
const TAINT_SHUTDOWN: &str = "node.cloudprovider.kubernetes.io/shutdown";
const FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";
/// How long the cluster may take to converge after a step (controllers, a loaded machine).
const CONVERGE: Duration = Duration::from_secs(60);

#[derive(Parser)]
struct RunArgs {
    #[command(flatten)]
    options: RunOptions,
}

/// One in-process CCM.
struct Ccm {
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<Exit>>,
    rt: Arc<Runtime>,
}

impl Ccm {
    async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }

    fn is_leader(&self) -> bool {
        self.rt.handles.borrow().is_some()
    }
}

/// kube-sim plus the harness's cloud; CCMs are started and stopped per scenario.
struct World<'a> {
    ctx: &'a Ctx,
    _kube: KubeSim,
    client: kube::Client,
    dir: std::path::PathBuf,
    /// Numbers the Nodes that join, for distinct pod CIDRs.
    joined: std::sync::atomic::AtomicUsize,
}

impl Drop for World<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl<'a> World<'a> {
    async fn start(ctx: &'a Ctx) -> anyhow::Result<World<'a>> {
        let kube = KubeSim::start(ccm_kube_sim::Config::default()).await?;
        let client = kube.client()?;
        let dir = std::env::temp_dir().join(format!(
            "ccm-conformance-{}-{}",
            std::process::id(),
            kube.addr().port()
        ));
        std::fs::create_dir_all(&dir)?;
        kube.write_kubeconfig(&dir.join("kubeconfig"))?;
        Ok(World {
            ctx,
            _kube: kube,
            client,
            dir,
            joined: Default::default(),
        })
    }

    /// Starts a CCM with leader election (short lease, so failover takes seconds).
    async fn ccm(&self) -> anyhow::Result<Ccm> {
        let provider: Arc<dyn CloudProvider> = self.ctx.provider.clone();
        let name = provider.provider_name().to_string();
        let argv = vec![
            "ccm".to_string(),
            format!("--cloud-provider={name}"),
            format!("--kubeconfig={}", self.dir.join("kubeconfig").display()),
            format!("--cluster-name={}", self.ctx.cluster()),
            format!("--cluster-cidr={}", self.ctx.harness.route_cidr_base()),
            "--secure-port=0".into(),
            "--leader-elect=true".into(),
            "--leader-elect-lease-duration=3s".into(),
            "--leader-elect-renew-deadline=2s".into(),
            "--leader-elect-retry-period=200ms".into(),
            "--node-monitor-period=1s".into(),
        ];
        let validated = RunArgs::try_parse_from(argv)?.options.validate()?;
        let mut providers = ccm_cloud::ProviderRegistry::new();
        providers.register(&name, move |_| Ok(provider.clone()))?;
        let rt = Arc::new(Runtime::default());
        let shutdown = CancellationToken::new();
        let task = {
            let (rt, shutdown) = (rt.clone(), shutdown.clone());
            tokio::spawn(async move {
                ccm_manager::run::run(validated, &providers, &rt, shutdown).await
            })
        };
        Ok(Ccm { shutdown, task, rt })
    }

    async fn leading_ccm(&self) -> anyhow::Result<Ccm> {
        let ccm = self.ccm().await?;
        let deadline = Instant::now() + CONVERGE;
        while !ccm.is_leader() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the CCM never started its controllers"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(ccm)
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    fn services(&self) -> Api<Service> {
        Api::namespaced(self.client.clone(), "default")
    }

    /// What a kubelet with `--cloud-provider=external` does: an instance boots, its Node
    /// registers tainted with a pod CIDR (from kube-controller-manager's IPAM), then Ready.
    /// Returns the Node's name: the cloud may name the instance itself (EC2's private DNS name).
    async fn join(&self, wish: &str, i: usize) -> Result<String, Verdict> {
        let inst = self.ctx.create_instance(wish).await?;
        let name = ccm_cloud::node_name(&inst).to_string();
        let name = name.as_str();
        let cidr = crate::routes::subnet(self.ctx, 10 + i).to_string();
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {
                "podCIDR": cidr,
                "podCIDRs": [cidr],
                "taints": [{"key": TAINT_UNINITIALIZED, "value": "true", "effect": "NoSchedule"}],
            },
        }))
        .map_err(|e| Verdict::NotRun(e.to_string()))?;
        self.nodes()
            .create(&PostParams::default(), &node)
            .await
            .map_err(|e| Verdict::NotRun(format!("registering node {name}: {e}")))?;
        self.ready(name, true, &inst).await?;
        Ok(name.to_string())
    }

    async fn ready(&self, name: &str, ready: bool, inst: &Node) -> Result<(), Verdict> {
        let now = jiff::Timestamp::now().to_string();
        let addresses = inst
            .status
            .as_ref()
            .and_then(|s| s.addresses.clone())
            .unwrap_or_default();
        let patch = json!({"status": {
            "conditions": [{
                "type": "Ready",
                "status": if ready { "True" } else { "Unknown" },
                "reason": if ready { "KubeletReady" } else { "NodeStatusUnknown" },
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }],
            "addresses": addresses,
        }});
        self.nodes()
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
            .map(drop)
            .map_err(|e| Verdict::NotRun(format!("kubelet status of {name}: {e}")))
    }

    /// Polls `f` until it returns `Some`, for at most [`CONVERGE`].
    async fn until<T, F, Fut>(&self, mut f: F) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + CONVERGE;
        loop {
            if let Some(v) = f().await {
                return Some(v);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn node(&self, name: &str) -> Option<Node> {
        self.nodes().get_opt(name).await.ok().flatten()
    }
}

fn has_taint(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == key))
}

/// Runs every cluster scenario against `ctx`'s provider.
pub(crate) async fn run(ctx: &Ctx) {
    let all = [
        &rules::CLUSTER_NODE_JOIN,
        &rules::CLUSTER_NODE_SHUTDOWN,
        &rules::CLUSTER_NODE_TERMINATE,
        &rules::CLUSTER_ROUTES,
        &rules::CLUSTER_LB,
        &rules::CLUSTER_RESTART,
        &rules::CLUSTER_FAILOVER,
    ];
    if let Err(Verdict::NotRun(why)) = ctx.need_destructive() {
        for r in all {
            ctx.not_run(r, "all", &why);
        }
        return;
    }
    let world = match World::start(ctx).await {
        Ok(w) => w,
        Err(e) => {
            for r in all {
                ctx.not_run(r, "all", &format!("kube-sim did not start: {e:#}"));
            }
            return;
        }
    };
    let ccm = match world.leading_ccm().await {
        Ok(c) => c,
        Err(e) => {
            for r in all {
                ctx.record(
                    r,
                    "all",
                    Instant::now(),
                    fail(format!("the CCM did not start: {e:#}")),
                );
            }
            return;
        }
    };
    let t = Instant::now();
    let joined = node_join(&world, "join").await;
    let node = joined.as_ref().ok().cloned();
    ctx.record(&rules::CLUSTER_NODE_JOIN, "join", t, joined.map(drop));
    let t = Instant::now();
    ctx.record(
        &rules::CLUSTER_NODE_SHUTDOWN,
        "stop then start",
        t,
        stop_start(&world).await,
    );
    let t = Instant::now();
    ctx.record(
        &rules::CLUSTER_NODE_TERMINATE,
        "terminate",
        t,
        terminate(&world).await,
    );
    let t = Instant::now();
    ctx.record(
        &rules::CLUSTER_ROUTES,
        "join and leave",
        t,
        routes(&world).await,
    );
    let t = Instant::now();
    let lb = match &node {
        Some(_) => lb_lifecycle(&world, "conformance-lb").await,
        None => Err(Verdict::NotRun("no Node joined".into())),
    };
    ctx.record(&rules::CLUSTER_LB, "create, change, delete", t, lb);
    let t = Instant::now();
    let (restart, ccm) = restart(&world, ccm).await;
    ctx.record(
        &rules::CLUSTER_RESTART,
        "stop while creating an LB",
        t,
        restart,
    );
    let t = Instant::now();
    ctx.record(
        &rules::CLUSTER_FAILOVER,
        "leader stops while creating an LB",
        t,
        failover(&world, ccm).await,
    );
    ctx.harness.clear_faults().await;
}

/// A Node joins and is initialized: taint gone, providerID of this provider.
async fn node_join(w: &World<'_>, tag: &str) -> Result<String, Verdict> {
    let wish = format!("{}-{tag}", w.ctx.cluster());
    let n = w.joined.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = w.join(&wish, n).await?;
    let prefix = format!("{}://", w.ctx.provider.provider_name());
    let done = w
        .until(|| async {
            let node = w.node(&name).await?;
            let pid = ccm_cloud::node_provider_id(&node).to_string();
            (!has_taint(&node, TAINT_UNINITIALIZED) && pid.starts_with(&prefix)).then_some(())
        })
        .await;
    match done {
        Some(()) => Ok(name),
        None => fail(format!(
            "node {name} was not initialized within {CONVERGE:?}: {:?}",
            w.node(&name).await.map(|n| (n.spec, n.metadata.labels))
        )),
    }
}

async fn stop_start(w: &World<'_>) -> Check {
    let name = node_join(w, "stop").await?;
    let inst = crate::instances::ccm_cloud_node(&name);
    w.ctx.harness.stop_instance(&inst).await?;
    w.ready(&name, false, &inst).await?;
    let tainted = w
        .until(|| async { w.node(&name).await.filter(|n| has_taint(n, TAINT_SHUTDOWN)) })
        .await;
    if tainted.is_none() {
        return fail(format!(
            "the NotReady Node of a stopped instance has no shutdown taint (Node exists: {})",
            w.node(&name).await.is_some()
        ));
    }
    w.ctx.harness.start_instance(&inst).await?;
    w.ready(&name, true, &inst).await?;
    let cleared = w
        .until(|| async {
            w.node(&name)
                .await
                .filter(|n| !has_taint(n, TAINT_SHUTDOWN))
        })
        .await;
    match cleared {
        Some(_) => Ok(()),
        None => fail("the shutdown taint stayed after the instance started and the Node is Ready"),
    }
}

async fn terminate(w: &World<'_>) -> Check {
    let name = node_join(w, "term").await?;
    let inst = crate::instances::ccm_cloud_node(&name);
    w.ctx.harness.terminate_instance(&inst).await?;
    w.ready(&name, false, &inst).await?;
    let gone = w
        .until(|| async { w.node(&name).await.is_none().then_some(()) })
        .await;
    match gone {
        Some(()) => Ok(()),
        None => fail("the NotReady Node of a terminated instance was not deleted"),
    }
}

async fn cloud_routes(w: &World<'_>) -> Option<Vec<ccm_cloud::Route>> {
    w.ctx
        .provider
        .routes()?
        .list_routes(w.ctx.cluster())
        .await
        .ok()
}

async fn routes(w: &World<'_>) -> Check {
    if w.ctx.provider.routes().is_none() {
        return Err(Verdict::NotRun("the provider has no Routes".into()));
    }
    let name = node_join(w, "route").await?;
    let node = w
        .node(&name)
        .await
        .ok_or(Verdict::NotRun("node vanished".into()))?;
    let cidr = node.spec.and_then(|s| s.pod_cidr).unwrap_or_default();
    let routed = w
        .until(|| async {
            cloud_routes(w)
                .await?
                .iter()
                .any(|r| r.destination_cidr == cidr && r.target_node == name)
                .then_some(())
        })
        .await;
    if routed.is_none() {
        return fail(format!(
            "no route {cidr} → {name} after the Node joined; routes: {:?}",
            cloud_routes(w).await
        ));
    }
    w.nodes()
        .delete(&name, &DeleteParams::default())
        .await
        .map_err(|e| Verdict::NotRun(format!("deleting node: {e}")))?;
    let removed = w
        .until(|| async {
            (!cloud_routes(w)
                .await?
                .iter()
                .any(|r| r.destination_cidr == cidr))
            .then_some(())
        })
        .await;
    match removed {
        Some(()) => Ok(()),
        None => fail(format!(
            "route {cidr} of deleted Node {name} is still in the cloud"
        )),
    }
}

fn lb_service(name: &str, port: i32) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "type": "LoadBalancer",
            "selector": {"app": name},
            "ports": [{"name": "http", "port": port, "targetPort": 8080, "protocol": "TCP"}],
        },
    }))
    .expect("literal Service")
}

async fn ingress_of(w: &World<'_>, name: &str) -> Option<Service> {
    let svc = w.services().get_opt(name).await.ok().flatten()?;
    let has_ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .is_some_and(|i| !i.is_empty());
    let has_finalizer = svc
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER);
    (has_ingress && has_finalizer).then_some(svc)
}

/// The cloud's LBs for this cluster (inventory, else `get_load_balancer` of `svc`).
async fn lb_count(w: &World<'_>, svc: &Service) -> Option<usize> {
    if let Some(inv) = w.ctx.harness.inventory(w.ctx.cluster()).await {
        return Some(inv.load_balancers.len());
    }
    let lb = w.ctx.provider.load_balancer()?;
    lb.get_load_balancer(w.ctx.cluster(), svc)
        .await
        .ok()
        .map(|s| usize::from(s.is_some()))
}

/// Creates the Service, waits for its LB, and records it for the sweep.
async fn create_lb(w: &World<'_>, name: &str) -> Result<(), Verdict> {
    let created = w
        .services()
        .create(&PostParams::default(), &lb_service(name, 80))
        .await
        .map_err(|e| Verdict::NotRun(format!("creating Service {name}: {e}")))?;
    w.ctx.ledger.service(w.ctx.cluster(), &created);
    Ok(())
}

async fn converged_one(w: &World<'_>, name: &str) -> Check {
    let Some(svc) = w.until(|| ingress_of(w, name)).await else {
        return fail(format!(
            "Service {name} has no ingress and cleanup finalizer after {CONVERGE:?}: {:?}",
            w.services()
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .map(|s| (s.metadata.finalizers, s.status))
        ));
    };
    match lb_count(w, &svc).await {
        Some(1) | None => Ok(()),
        Some(n) => fail(format!(
            "the cloud holds {n} load balancers for one Service"
        )),
    }
}

async fn delete_lb(w: &World<'_>, name: &str) -> Check {
    let svc = w.services().get_opt(name).await.ok().flatten();
    w.services()
        .delete(name, &DeleteParams::default())
        .await
        .map_err(|e| Verdict::NotRun(format!("deleting Service {name}: {e}")))?;
    let gone = w
        .until(|| async {
            w.services()
                .get_opt(name)
                .await
                .ok()?
                .is_none()
                .then_some(())
        })
        .await;
    if gone.is_none() {
        return fail(format!(
            "Service {name} still exists (finalizer kept) after delete"
        ));
    }
    if let Some(svc) = svc {
        match lb_count(w, &svc).await {
            Some(0) | None => {}
            Some(n) => {
                return fail(format!(
                    "deleted Service {name} left {n} load balancers in the cloud"
                ));
            }
        }
    }
    Ok(())
}

async fn lb_lifecycle(w: &World<'_>, name: &str) -> Check {
    create_lb(w, name).await?;
    converged_one(w, name).await?;
    let patch = json!({"spec": {"ports": [{"name": "http", "port": 8080, "targetPort": 8080, "protocol": "TCP"}]}});
    w.services()
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| Verdict::NotRun(format!("patching Service: {e}")))?;
    converged_one(w, name).await?;
    if let Some(rec) = w
        .ctx
        .harness
        .inventory(w.ctx.cluster())
        .await
        .and_then(|i| i.load_balancers.into_iter().next())
        && let Some(ports) = &rec.ports
    {
        let ok = w
            .until(|| async {
                let inv = w.ctx.harness.inventory(w.ctx.cluster()).await?;
                inv.load_balancers
                    .iter()
                    .any(|l| l.ports.as_deref() == Some(&[8080]))
                    .then_some(())
            })
            .await;
        if ok.is_none() {
            return fail(format!(
                "after the port change to 8080 the LB listens on {ports:?}"
            ));
        }
    }
    delete_lb(w, name).await
}

/// Starts an LB with a slow cloud, stops the CCM while the ensure is in flight, starts a new
/// one: it must converge to one LB and clean it on delete.
async fn restart(w: &World<'_>, ccm: Ccm) -> (Check, Option<Ccm>) {
    let slow = w
        .ctx
        .harness
        .inject(Fault::Latency(Duration::from_millis(400)))
        .await;
    if let Err(e) = create_lb(w, "conformance-restart").await {
        return (Err(e), Some(ccm));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    ccm.stop().await;
    if slow.is_ok() {
        w.ctx.harness.clear_faults().await;
    }
    let ccm = match w.leading_ccm().await {
        Ok(c) => c,
        Err(e) => {
            return (
                fail(format!("the restarted CCM did not start: {e:#}")),
                None,
            );
        }
    };
    let check = async {
        converged_one(w, "conformance-restart").await?;
        delete_lb(w, "conformance-restart").await
    }
    .await;
    (check, Some(ccm))
}

/// A standby waits; the leader stops while an LB is being made; the standby converges it.
async fn failover(w: &World<'_>, leader: Option<Ccm>) -> Check {
    let Some(leader) = leader else {
        return Err(Verdict::NotRun(
            "no leader left after the restart check".into(),
        ));
    };
    let standby = w
        .ccm()
        .await
        .map_err(|e| Verdict::NotRun(format!("{e:#}")))?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    if standby.is_leader() {
        return fail("two CCMs run controllers at once");
    }
    let slow = w
        .ctx
        .harness
        .inject(Fault::Latency(Duration::from_millis(400)))
        .await;
    create_lb(w, "conformance-failover").await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    leader.stop().await;
    if slow.is_ok() {
        w.ctx.harness.clear_faults().await;
    }
    let took_over = w
        .until(|| async { standby.is_leader().then_some(()) })
        .await;
    let check = if took_over.is_none() {
        fail("the standby never took over after the leader stopped")
    } else {
        match converged_one(w, "conformance-failover").await {
            Ok(()) => delete_lb(w, "conformance-failover").await,
            e => e,
        }
    };
    standby.stop().await;
    check
}
