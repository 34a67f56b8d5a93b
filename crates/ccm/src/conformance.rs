//! `ccm conformance`: the provider conformance suite against a provider's real cloud.
//!
//! The provider is built exactly as `ccm run` builds it (`--cloud-provider`, `--cloud-config`).
//! Read-only by default, so it is safe on a production account; `--destructive` lets it create
//! load balancers and routes under a cluster name of its own (`ccm-conformance-<hex>`), all of
//! which are swept at the end, also after a failure or Ctrl-C. Exit status: 0 every rule holds,
//! 1 a rule is broken (or the run was interrupted), 2 bad flags or config.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ccm_cloud::{CloudProvider, Node};
use ccm_conformance::{Harness, KnownDefect, Level, SimHarness, Suite, SuiteOptions};
use ccm_manager::options::GoDuration;

/// Flags of `ccm conformance`.
#[derive(Debug, Clone, clap::Args)]
pub struct ConformanceOptions {
    /// The provider to check, as for `ccm run`.
    #[arg(long)]
    pub cloud_provider: String,
    /// The provider's cloud-config file, as for `ccm run`.
    #[arg(long)]
    pub cloud_config: Option<PathBuf>,
    /// Create, change and delete the suite's own load balancers and routes. Without it the
    /// suite only reads.
    #[arg(long)]
    pub destructive: bool,
    /// An existing instance to read (and, with --destructive, to use as route target and LB
    /// backend): `NODE-NAME` or `NODE-NAME=PROVIDER-ID`. Repeatable. It is never changed.
    #[arg(long = "node", value_name = "NAME[=PROVIDER-ID]")]
    pub nodes: Vec<String>,
    /// The cluster name the suite's calls use (default `ccm-conformance-<random hex>`). Never
    /// the name of a real cluster: the suite deletes what it created under it.
    #[arg(long)]
    pub cluster_name: Option<String>,
    /// How long the cloud may take before a change shows (eventual consistency).
    #[arg(long, default_value = "30s")]
    pub settle_timeout: GoDuration,
    /// The cloud's longest load-balancer name (AWS ELB: 32).
    #[arg(long, default_value_t = 255)]
    pub max_lb_name_len: usize,
    /// A rule the provider is known to break today: `RULE-ID=DEFECT`. Its failure is reported as
    /// that defect; if it passes, the run fails so the list is corrected. Repeatable.
    #[arg(long = "known-defect", value_name = "RULE-ID=DEFECT")]
    pub known_defects: Vec<String>,
    /// Write the report as JUnit XML here.
    #[arg(long)]
    pub junit: Option<PathBuf>,
    /// Write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The provider plus the Nodes the operator named: no instance lifecycle, no fault injection
/// (those checks are reported not run), no inventory.
struct CliHarness {
    provider: Arc<dyn CloudProvider>,
    nodes: Vec<Node>,
    settle: Duration,
    max_lb_name_len: usize,
}

#[async_trait]
impl Harness for CliHarness {
    fn provider(&self) -> Arc<dyn CloudProvider> {
        self.provider.clone()
    }
    async fn existing_nodes(&self) -> Vec<Node> {
        self.nodes.clone()
    }
    fn max_lb_name_len(&self) -> usize {
        self.max_lb_name_len
    }
    fn settle_timeout(&self) -> Duration {
        self.settle
    }
}

fn parse_node(spec: &str) -> Node {
    let (name, pid) = match spec.split_once('=') {
        Some((n, p)) => (n, Some(p)),
        None => (spec, None),
    };
    ccm_provider_sim::fixtures::node(name, pid)
}

fn parse_defects(specs: &[String]) -> anyhow::Result<Vec<KnownDefect>> {
    specs
        .iter()
        .map(|s| {
            let (rule, defect) = s.split_once('=').ok_or_else(|| {
                anyhow::anyhow!("--known-defect {s:?}: expected RULE-ID=DEFECT, e.g. lb.delete-leaves-nothing=\"target groups leak\"")
            })?;
            if ccm_conformance::rules::by_id(rule).is_none() {
                let ids: Vec<&str> = ccm_conformance::rules::ALL.iter().map(|r| r.id).collect();
                anyhow::bail!("--known-defect: no rule {rule:?}; rules are: {}", ids.join(", "));
            }
            Ok(KnownDefect {
                rule: rule.into(),
                case: None,
                defect: defect.into(),
            })
        })
        .collect()
}

/// The harness for the flags: the sim without a cloud-config is the in-process simulated cloud
/// with its full harness (instances, faults, inventory); anything else is the provider as
/// `ccm run` builds it, with the Nodes given on the command line.
fn harness(opts: &ConformanceOptions) -> anyhow::Result<Arc<dyn Harness>> {
    if opts.cloud_provider == ccm_provider_sim::PROVIDER_NAME && opts.cloud_config.is_none() {
        return Ok(Arc::new(SimHarness::new(ccm_provider_sim::SimCloud::new())));
    }
    let provider =
        crate::providers::providers().build(&opts.cloud_provider, opts.cloud_config.as_deref())?;
    Ok(Arc::new(CliHarness {
        provider,
        nodes: opts.nodes.iter().map(|s| parse_node(s)).collect(),
        settle: opts.settle_timeout.0,
        max_lb_name_len: opts.max_lb_name_len,
    }))
}

/// Runs the suite, sweeps, writes the reports and prints the summary.
pub async fn run(opts: ConformanceOptions) -> anyhow::Result<ExitCode> {
    let setup = harness(&opts).and_then(|h| Ok((h, parse_defects(&opts.known_defects)?)));
    let (harness, known_defects) = match setup {
        Ok(x) => x,
        Err(e) => {
            eprintln!("error: {e:#}");
            return Ok(ExitCode::from(2));
        }
    };
    let level = if opts.destructive {
        Level::Destructive
    } else {
        Level::ReadOnly
    };
    let mut so = SuiteOptions::new(level);
    if let Some(c) = &opts.cluster_name {
        so.cluster.clone_from(c);
    }
    so.known_defects = known_defects;
    let suite = Suite::new(harness, so);
    let interrupted = tokio::select! {
        () = suite.checks() => false,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("interrupted: sweeping the suite's resources");
            true
        }
    };
    let report = suite.finish(interrupted).await;
    if let Some(p) = &opts.junit {
        std::fs::write(p, report.to_junit())?;
    }
    if let Some(p) = &opts.json {
        std::fs::write(p, report.to_json())?;
    }
    print!("{}", report.summary());
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
