//! The suite is itself tested: providers that each break one rule on purpose, wrapped around
//! the sim. Each must be caught, and the failure must name the rule it breaks.

mod broken_providers;

use broken_providers::{Break, run_broken};
use ccm_conformance::{Outcome, Report, rules};

/// The report fails, and fails on `rule` (among possibly others), with a detail saying what the
/// provider did.
fn caught(report: &Report, rule: &ccm_conformance::Rule, says: &str) {
    assert!(
        !report.passed(),
        "the broken provider passed:\n{}",
        report.summary()
    );
    let failures: Vec<_> = report
        .of(rule.id)
        .filter(|r| r.outcome.is_failure())
        .collect();
    assert!(
        !failures.is_empty(),
        "rule {} not named among the failures:\n{}",
        rule.id,
        report.summary()
    );
    let details: Vec<String> = failures
        .iter()
        .map(|r| match &r.outcome {
            Outcome::Fail { detail } => detail.clone(),
            o => format!("{o:?}"),
        })
        .collect();
    assert!(
        details.iter().any(|d| d.contains(says)),
        "the failure of {} does not say what the provider did ({says:?}): {details:?}",
        rule.id
    );
    assert!(report.summary().contains(rule.id));
    assert!(report.to_junit().contains(&format!("name=\"{} [", rule.id)));
}

#[tokio::test]
async fn gone_on_error_is_caught() {
    let (report, _) = run_broken(Break::GoneOnError).await;
    caught(
        &report,
        &rules::ERROR_NEVER_GONE,
        "returned Ok(false) while the cloud answered",
    );
    caught(&report, &rules::FOREIGN_ID_NOT_GONE, "Ok(false)");
    // Only the instance rules it breaks: the LB and route rules still pass.
    for r in [
        &rules::LB_ENSURE_IDEMPOTENT,
        &rules::ROUTES_ONLY_THIS_CLUSTER,
    ] {
        assert!(
            report.of(r.id).all(|c| c.outcome == Outcome::Pass),
            "{}",
            report.summary()
        );
    }
}

#[tokio::test]
async fn other_clusters_routes_are_caught() {
    let (report, sim) = run_broken(Break::AllClustersRoutes).await;
    caught(
        &report,
        &rules::ROUTES_ONLY_THIS_CLUSTER,
        "a route this cluster never created",
    );
    // The sweep deleted only the suite's routes, and all of them, despite the broken listing.
    assert!(sim.routes().is_empty(), "{:?}", sim.routes());
}

#[tokio::test]
async fn non_idempotent_ensure_is_caught() {
    let (report, sim) = run_broken(Break::EnsureNotIdempotent).await;
    caught(
        &report,
        &rules::LB_ENSURE_IDEMPOTENT,
        "the second ensure answered ingress",
    );
    // The harness swept the LBs the provider leaked.
    assert!(
        sim.load_balancers().is_empty(),
        "{:?}",
        sim.load_balancers()
    );
    assert!(
        report.swept.iter().any(|s| s.starts_with("lb/")),
        "{:?}",
        report.swept
    );
}

#[tokio::test]
async fn leak_on_delete_is_caught() {
    let (report, sim) = run_broken(Break::LeakOnDelete).await;
    caught(&report, &rules::LB_DELETE_REMOVES, "the cloud still holds");
    caught(
        &report,
        &rules::CANCEL_NOTHING_HALF_MADE,
        "the cloud still holds",
    );
    assert!(
        sim.load_balancers().is_empty(),
        "the sweep left {:?}",
        sim.load_balancers()
    );
}
