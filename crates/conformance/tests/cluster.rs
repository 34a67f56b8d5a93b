//! The cluster level on the sim: the real manager on kube-sim, node join, stop/start,
//! terminate, routes, LB lifecycle with the finalizer, restart and failover mid-operation.

mod broken_providers;

use std::sync::Arc;

use ccm_conformance::{Level, Outcome, SimHarness, Suite, SuiteOptions, rules};
use ccm_provider_sim::SimCloud;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_passes_the_cluster_level() {
    let sim = SimCloud::seeded(21);
    let suite = Suite::new(
        Arc::new(SimHarness::new(sim.clone())),
        SuiteOptions::new(Level::Destructive),
    );
    let report = suite.run_cluster().await;
    println!("{}", report.summary());
    assert!(report.passed(), "{}", report.summary());
    for rule in rules::CLUSTER {
        assert!(
            report.of(rule.id).any(|r| r.outcome == Outcome::Pass),
            "rule {} not proved:\n{}",
            rule.id,
            report.summary()
        );
    }
    assert!(
        sim.load_balancers().is_empty(),
        "{:?}",
        sim.load_balancers()
    );
    assert!(sim.routes().is_empty(), "{:?}", sim.routes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_whose_ensure_is_not_idempotent_fails_the_lb_scenarios() {
    let (suite, sim) = broken_providers::broken_suite(broken_providers::Break::EnsureNotIdempotent);
    let report = suite.run_cluster().await;
    assert!(!report.passed(), "{}", report.summary());
    assert!(
        report
            .of(rules::CLUSTER_LB.id)
            .any(|r| r.outcome.is_failure()),
        "{}",
        report.summary()
    );
    // Node scenarios do not depend on the LB: they still pass.
    assert!(
        report
            .of(rules::CLUSTER_NODE_JOIN.id)
            .all(|r| r.outcome == Outcome::Pass)
    );
    assert!(
        sim.load_balancers().is_empty(),
        "swept: {:?}",
        sim.load_balancers()
    );
}
