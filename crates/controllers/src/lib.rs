//! # ccm-controllers: the cloud controllers of ccm-rs
//!
//! Four controllers with upstream names and semantics — `cloud-node`, `cloud-node-lifecycle`,
//! `route`, `service` — each a pure planner (desired vs observed → actions, proptested) and a
//! thin async loop that gathers inputs from shared caches and executes the actions.
//!
//! Shared plumbing: [`informer`] (one watch per resource, fanned out to controllers),
//! [`queue`] (keyed work queue with per-key backoff and batching), [`events`] (Kubernetes
//! Events with upstream reasons).

pub mod context;
pub mod events;
pub mod informer;
pub mod node;
pub mod node_lifecycle;
pub mod nodeutil;
pub mod queue;
pub mod route;
pub mod service;

pub use context::{RoutedNodes, Shared, StartError};
