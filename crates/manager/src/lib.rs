//! # ccm-manager: what turns controllers into a cloud-controller-manager
//!
//! Upstream-compatible flags ([`options`]), leader election on a Lease ([`leader`]), the
//! health and metrics server ([`serve`]) and the wiring that starts the enabled controllers
//! against one client and one provider ([`run`]).

pub mod adaptive;
pub mod app;
pub mod auth;
pub mod client;
pub mod client_metrics;
pub mod expfmt;
mod http2;
pub mod leader;
pub mod leader_migration;
pub mod logging;
pub mod options;
pub mod procfs;
pub mod run;
pub mod scrape;
pub mod serve;
pub mod serve_setup;
pub mod serving_options;
pub mod tls;
pub mod webhook;
