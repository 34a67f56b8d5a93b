//! `--leader-migration-config`: a LeaderMigrationConfiguration file (YAML), parsed and
//! validated as the manager reads it; the validated config places each controller.
#![no_main]
use ccm_manager::leader_migration::LeaderMigrationConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match LeaderMigrationConfig::parse(text) {
        Ok(cfg) => {
            assert!(
                cfg.validate().is_empty(),
                "parse accepted an invalid config"
            );
            for (canonical, alias) in [
                ("cloud-node-lifecycle", "cloud-node-lifecycle"),
                ("node-route", "route"),
                ("service-lb", "service"),
            ] {
                let _ = cfg.placement(canonical, alias);
            }
        }
        Err(errs) => assert!(!errs.is_empty(), "an error without a message"),
    }
});
