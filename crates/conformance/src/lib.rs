//! # ccm-conformance: one suite that proves a cloud provider follows the rules
//!
//! The rules that keep a cluster safe live in the `ccm_cloud` trait docs ("`instance_exists`
//! is `Ok(false)` only when the instance is gone", "a missing LB is `Ok(None)`",
//! "`list_routes` returns only this cluster's routes"). Breaking one deletes Nodes or leaks
//! load balancers; this crate checks a live provider against every one of them.
//!
//! - [`rules`]: the catalogue, each rule with a stable id and what breaks without it.
//! - [`Harness`]: what the suite needs beyond the traits (create, stop and terminate
//!   instances, inject cloud faults, see the cloud's inventory behind the provider's back).
//!   Everything but the provider is optional; a check whose needs are missing is reported
//!   "not run" with the reason.
//! - [`Suite`]: runs the checks at a [`Level`], writes every resource it creates in a ledger
//!   *before* creating it, and sweeps the ledger at the end — also after a failure, or after
//!   Ctrl-C when the caller drops [`Suite::checks`] and calls [`Suite::finish`].
//! - [`Report`]: JSON, JUnit XML and a one-screen summary; each failure names the rule and
//!   what the provider did instead. Known defects ([`KnownDefect`]) are reported as such, and
//!   a listed defect that passes fails the run, so the list stays true.
//!
//! ```no_run
//! # async fn f() {
//! use std::sync::Arc;
//! use ccm_conformance::{Level, SimHarness, Suite, SuiteOptions};
//!
//! let harness = Arc::new(SimHarness::new(ccm_provider_sim::SimCloud::seeded(1)));
//! let report = Suite::new(harness, SuiteOptions::new(Level::Destructive)).run().await;
//! println!("{}", report.summary());
//! assert!(report.passed(), "{}", report.summary());
//! # }
//! ```

mod cluster;
mod faults;
mod harness;
mod instances;
mod lb;
mod report;
mod routes;
pub mod rules;
mod sim;
mod suite;

pub use harness::{Fault, Harness, HarnessError, HarnessResult, Inventory, LbRecord};
pub use instances::{addresses_ok, valid_label_key, valid_label_value};
pub use lb::{NAMESPACE, service};
pub use report::{CheckResult, Outcome, Report};
pub use rules::Rule;
pub use sim::SimHarness;
pub use suite::{KnownDefect, Level, Suite, SuiteOptions};
