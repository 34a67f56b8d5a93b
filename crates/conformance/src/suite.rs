//! Running the checks: levels, known defects, the ledger of what the suite created and the
//! sweep that removes it.

use std::sync::Arc;
use std::time::Duration;

use ccm_cloud::{CloudProvider, Node, Route, Service};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::harness::{Harness, HarnessError};
use crate::report::{CheckResult, Outcome, Report};
use crate::rules::Rule;

/// How much the suite may do to the cloud.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Only reads: safe on a production account. Rules that need writes are reported not run.
    ReadOnly,
    /// Creates, changes and deletes the suite's own resources (and, with a harness, instances).
    Destructive,
}

impl Level {
    /// The level's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Level::ReadOnly => "read-only",
            Level::Destructive => "destructive",
        }
    }
}

/// A rule a provider is known to break today: the check still runs, its failure is reported as
/// this defect (not hidden), and a pass makes the run fail so the list is kept true.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownDefect {
    /// The rule's id.
    pub rule: String,
    /// Only this case of the rule (e.g. `NotFound` of `instances.error-is-never-gone`);
    /// `None`: every case.
    pub case: Option<String>,
    /// The defect, as a person would look it up.
    pub defect: String,
}

/// How to run the suite.
#[derive(Debug, Clone)]
pub struct SuiteOptions {
    /// Read-only or destructive.
    pub level: Level,
    /// The cluster name every call uses. Unique per run so the suite's resources are its own.
    pub cluster: String,
    /// Rules the provider is known to break.
    pub known_defects: Vec<KnownDefect>,
}

impl SuiteOptions {
    /// Options with a fresh cluster name `ccm-conformance-<8 hex digits>`.
    pub fn new(level: Level) -> Self {
        SuiteOptions {
            level,
            cluster: format!("ccm-conformance-{:08x}", rand::random::<u32>()),
            known_defects: Vec::new(),
        }
    }

    /// Adds a known defect of every case of `rule`.
    pub fn known_defect(mut self, rule: &Rule, defect: impl Into<String>) -> Self {
        self.known_defects.push(KnownDefect {
            rule: rule.id.to_string(),
            case: None,
            defect: defect.into(),
        });
        self
    }

    /// Adds a known defect of one case of `rule` (the case as the report names it).
    pub fn known_defect_case(mut self, rule: &Rule, case: &str, defect: impl Into<String>) -> Self {
        self.known_defects.push(KnownDefect {
            rule: rule.id.to_string(),
            case: Some(case.to_string()),
            defect: defect.into(),
        });
        self
    }
}

/// What a check concluded, before known defects are applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The provider broke the rule: what it did instead.
    Fail(String),
    /// The check could not run: why.
    NotRun(String),
}

/// Result of one check.
pub type Check = Result<(), Verdict>;

/// A failure with a message.
pub fn fail<T>(detail: impl Into<String>) -> Result<T, Verdict> {
    Err(Verdict::Fail(detail.into()))
}

impl From<HarnessError> for Verdict {
    fn from(e: HarnessError) -> Self {
        match e {
            HarnessError::Unsupported(why) => Verdict::NotRun(format!("harness: {why}")),
            HarnessError::Failed(why) => Verdict::NotRun(format!("harness failed: {why}")),
        }
    }
}

/// Everything the suite created, written down *before* each create call so a create that is
/// cancelled or fails half-way is swept too.
#[derive(Default)]
pub struct Ledger {
    services: Mutex<Vec<(String, Service)>>,
    routes: Mutex<Vec<(String, Route)>>,
    instances: Mutex<Vec<Node>>,
}

impl Ledger {
    pub(crate) fn service(&self, cluster: &str, svc: &Service) {
        self.services
            .lock()
            .push((cluster.to_string(), svc.clone()));
    }
    pub(crate) fn route(&self, cluster: &str, route: &Route) {
        self.routes
            .lock()
            .push((cluster.to_string(), route.clone()));
    }
    pub(crate) fn instance(&self, node: &Node) {
        self.instances.lock().push(node.clone());
    }
}

/// The state checks share.
pub struct Ctx {
    pub(crate) harness: Arc<dyn Harness>,
    pub(crate) provider: Arc<dyn CloudProvider>,
    pub(crate) opts: SuiteOptions,
    pub(crate) ledger: Arc<Ledger>,
    results: Mutex<Vec<CheckResult>>,
    /// Running instances the suite may use as route targets and LB hosts.
    pub(crate) nodes: Mutex<Vec<Node>>,
}

impl Ctx {
    pub(crate) fn cluster(&self) -> &str {
        &self.opts.cluster
    }

    pub(crate) fn destructive(&self) -> bool {
        self.opts.level == Level::Destructive
    }

    /// Records a check's result, applying the known-defect list.
    pub(crate) fn record(&self, rule: &Rule, case: &str, started: Instant, check: Check) {
        let known = self
            .opts
            .known_defects
            .iter()
            .find(|d| d.rule == rule.id && d.case.as_deref().is_none_or(|c| c == case))
            .map(|d| d.defect.clone());
        let outcome = match (check, known) {
            (Ok(()), None) => Outcome::Pass,
            (Ok(()), Some(defect)) => Outcome::DefectFixed { defect },
            (Err(Verdict::Fail(detail)), None) => Outcome::Fail { detail },
            (Err(Verdict::Fail(detail)), Some(defect)) => Outcome::KnownDefect { defect, detail },
            (Err(Verdict::NotRun(reason)), _) => Outcome::NotRun { reason },
        };
        if outcome.is_failure() {
            tracing::warn!(rule = rule.id, case, ?outcome, "conformance check failed");
        }
        self.results.lock().push(CheckResult {
            rule: *rule,
            case: case.to_string(),
            outcome,
            duration: started.elapsed(),
        });
    }

    /// Records that `rule` did not run, for `reason`.
    pub(crate) fn not_run(&self, rule: &Rule, case: &str, reason: &str) {
        self.record(
            rule,
            case,
            Instant::now(),
            Err(Verdict::NotRun(reason.to_string())),
        );
    }

    /// A check that needs the destructive level: `Err(NotRun)` at the read-only level.
    pub(crate) fn need_destructive(&self) -> Check {
        if self.destructive() {
            Ok(())
        } else {
            Err(Verdict::NotRun(
                "creates or changes cloud resources: needs the destructive level".into(),
            ))
        }
    }

    /// Polls `probe` until it returns `Some`, for at most the harness's settle timeout.
    pub(crate) async fn settle<T, F, Fut>(&self, mut probe: F) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + self.harness.settle_timeout();
        loop {
            if let Some(v) = probe().await {
                return Some(v);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Creates an instance through the harness and writes it in the ledger.
    pub(crate) async fn create_instance(&self, name: &str) -> Result<Node, Verdict> {
        let node = self.harness.create_instance(name).await?;
        self.ledger.instance(&node);
        Ok(node)
    }
}

/// One run of the suite against one harness.
pub struct Suite {
    ctx: Arc<Ctx>,
}

impl Suite {
    /// A suite for `harness` with `opts`.
    pub fn new(harness: Arc<dyn Harness>, opts: SuiteOptions) -> Self {
        let provider = harness.provider();
        Suite {
            ctx: Arc::new(Ctx {
                harness,
                provider,
                opts,
                ledger: Arc::default(),
                results: Mutex::default(),
                nodes: Mutex::default(),
            }),
        }
    }

    /// Runs every check, then sweeps. The report lists every rule's checks and what was swept.
    pub async fn run(&self) -> Report {
        self.checks().await;
        self.finish(false).await
    }

    /// Runs the checks only. Drop this future (Ctrl-C) and call [`Suite::finish`] to sweep.
    pub async fn checks(&self) {
        let ctx = &*self.ctx;
        if let Some(init) = ctx.harness.init_context().await
            && let Err(e) = ctx.provider.initialize(init).await
        {
            tracing::warn!(error = %e, "the provider's initialize failed; checks run anyway");
        }
        crate::instances::run(ctx).await;
        crate::lb::run(ctx).await;
        crate::routes::run(ctx).await;
        crate::faults::run(ctx).await;
    }

    /// Runs the cluster level (the real controllers on kube-sim with this cloud; needs the
    /// destructive level and a harness that creates instances), then sweeps.
    pub async fn run_cluster(&self) -> Report {
        crate::cluster::run(&self.ctx).await;
        self.finish(false).await
    }

    /// Sweeps what the suite created (also after a failure or an interrupted run) and builds
    /// the report from the checks that ran.
    pub async fn finish(&self, interrupted: bool) -> Report {
        self.ctx.harness.clear_faults().await;
        let swept = sweep(&self.ctx).await;
        Report {
            provider: self.ctx.provider.provider_name().to_string(),
            level: self.ctx.opts.level.name().to_string(),
            cluster: self.ctx.opts.cluster.clone(),
            results: self.ctx.results.lock().clone(),
            swept,
            interrupted,
        }
    }
}

/// Deletes every LB and route the ledger names (only those: never "whatever `list_routes`
/// returns", which a broken provider may fill with another cluster's routes), terminates the
/// suite's instances, then lets the harness remove anything left under the suite's cluster.
async fn sweep(ctx: &Ctx) -> Vec<String> {
    let mut out = Vec::new();
    let services = std::mem::take(&mut *ctx.ledger.services.lock());
    if let Some(lb) = ctx.provider.load_balancer() {
        for (cluster, svc) in &services {
            let name = lb.load_balancer_name(cluster, svc);
            if let Err(e) = lb.ensure_load_balancer_deleted(cluster, svc).await {
                out.push(format!("lb/{name}: delete failed: {e}"));
            }
        }
    }
    let routes = std::mem::take(&mut *ctx.ledger.routes.lock());
    if let Some(r) = ctx.provider.routes() {
        for (cluster, route) in &routes {
            let cidr = &route.destination_cidr;
            if let Err(e) = r.delete_route(cluster, route).await {
                out.push(format!("route/{cluster}/{cidr}: delete failed: {e}"));
            }
        }
    }
    let instances = std::mem::take(&mut *ctx.ledger.instances.lock());
    for node in &instances {
        if let Err(HarnessError::Failed(e)) = ctx.harness.terminate_instance(node).await {
            out.push(format!("instance {}: {e}", ccm_cloud::node_name(node)));
        }
    }
    for cluster in [ctx.cluster().to_string(), crate::routes::other_cluster(ctx)] {
        out.extend(ctx.harness.sweep(&cluster).await);
    }
    out
}
