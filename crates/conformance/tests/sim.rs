//! The sim provider, the reference implementation, follows every rule; the read-only level
//! only reads; reports are well-formed; known defects are reported, never hidden.

use std::sync::Arc;

use ccm_conformance::{Level, Outcome, SimHarness, Suite, SuiteOptions, rules};
use ccm_provider_sim::{InstanceSpec, SimCloud};

#[tokio::test]
async fn sim_passes_every_rule_at_the_destructive_level() {
    let sim = SimCloud::seeded(5);
    let suite = Suite::new(
        Arc::new(SimHarness::new(sim.clone())),
        SuiteOptions::new(Level::Destructive),
    );
    let report = suite.run().await;
    println!("{}", report.summary());
    assert!(report.passed(), "{}", report.summary());
    for rule in rules::ALL {
        assert!(
            report.of(rule.id).any(|r| r.outcome == Outcome::Pass),
            "rule {} was not proved on the sim:\n{}",
            rule.id,
            report.summary()
        );
    }
    // Nothing of the suite's is left in the cloud.
    assert!(
        sim.load_balancers().is_empty(),
        "{:?}",
        sim.load_balancers()
    );
    assert!(sim.routes().is_empty(), "{:?}", sim.routes());
    assert!(
        sim.instances()
            .iter()
            .all(|i| i.state == ccm_provider_sim::InstanceState::Terminated),
        "{:?}",
        sim.instances()
    );
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).expect("json");
    assert_eq!(json["provider"], "sim");
    assert!(json["results"].as_array().expect("results").len() >= rules::ALL.len());
    let junit = report.to_junit();
    assert!(junit.contains("failures=\"0\""), "{junit}");
}

#[tokio::test]
async fn read_only_level_writes_nothing() {
    let sim = SimCloud::seeded(6);
    sim.add_instance(InstanceSpec::new("prod-node"));
    let before = sim.mutations().len();
    struct Existing(SimHarness);
    #[async_trait::async_trait]
    impl ccm_conformance::Harness for Existing {
        fn provider(&self) -> Arc<dyn ccm_cloud::CloudProvider> {
            self.0.provider()
        }
        async fn existing_nodes(&self) -> Vec<ccm_cloud::Node> {
            vec![ccm_provider_sim::fixtures::node("prod-node", None)]
        }
    }
    let h = Existing(SimHarness::new(sim.clone()));
    let report = Suite::new(Arc::new(h), SuiteOptions::new(Level::ReadOnly))
        .run()
        .await;
    assert!(report.passed(), "{}", report.summary());
    assert_eq!(sim.mutations().len(), before, "{:?}", sim.mutations());
    for r in [
        &rules::INSTANCE_EXISTS,
        &rules::BATCH_EQUALS_SINGLE,
        &rules::LB_GET_MISSING_NONE,
    ] {
        assert!(
            report.of(r.id).any(|c| c.outcome == Outcome::Pass),
            "{}",
            report.summary()
        );
    }
    // Rules that need writes say so instead of passing.
    assert!(
        report.of(rules::LB_ENSURE_IDEMPOTENT.id).all(
            |c| matches!(&c.outcome, Outcome::NotRun { reason } if reason.contains("destructive"))
        ),
        "{}",
        report.summary()
    );
}

#[tokio::test]
async fn a_known_defect_is_reported_and_a_stale_one_fails_the_run() {
    let sim = SimCloud::seeded(7);
    let opts = SuiteOptions::new(Level::Destructive)
        .known_defect(&rules::LB_NAME_LIMITS, "made-up defect: names too long");
    let report = Suite::new(Arc::new(SimHarness::new(sim)), opts).run().await;
    // The sim follows the rule, so the list is stale: the run fails and says so.
    assert!(!report.passed());
    assert!(
        report
            .of(rules::LB_NAME_LIMITS.id)
            .all(|c| matches!(c.outcome, Outcome::DefectFixed { .. })),
        "{}",
        report.summary()
    );
    assert!(report.summary().contains("known-defect list still names"));
}
