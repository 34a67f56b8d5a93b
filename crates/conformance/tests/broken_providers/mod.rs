//! Providers that each break one rule of the traits on purpose, wrapped around the sim
//! (shared by the contract and cluster tests of the suite).
#![allow(dead_code)]

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use async_trait::async_trait;
use ccm_cloud::{
    CloudProvider, CloudResult, InstanceMetadata, InstanceStatus, Instances, LoadBalancer,
    LoadBalancerStatus, Node, Route, Routes, Service,
};
use ccm_conformance::{Level, Report, SimHarness, Suite, SuiteOptions};
use ccm_provider_sim::SimCloud;
use parking_lot::Mutex;

/// Which rule the wrapper breaks.
#[derive(Clone, Copy, PartialEq)]
pub enum Break {
    /// `instance_exists` / `instances_status` turn any error into "gone".
    GoneOnError,
    /// `list_routes` returns every cluster's routes.
    AllClustersRoutes,
    /// Every ensure builds a new LB (a fresh UID, so a fresh name and VIP).
    EnsureNotIdempotent,
    /// Delete forgets the LB but leaves it in the cloud; `get` then says `None`.
    LeakOnDelete,
}

struct Broken {
    sim: SimCloud,
    how: Break,
    ensures: AtomicU32,
    forgotten: Mutex<HashSet<String>>,
}

struct Wrapper(Arc<Broken>);

impl CloudProvider for Wrapper {
    fn provider_name(&self) -> &str {
        ccm_provider_sim::PROVIDER_NAME
    }
    fn instances(&self) -> Option<Arc<dyn Instances>> {
        Some(self.0.clone())
    }
    fn load_balancer(&self) -> Option<Arc<dyn LoadBalancer>> {
        Some(self.0.clone())
    }
    fn routes(&self) -> Option<Arc<dyn Routes>> {
        Some(self.0.clone())
    }
}

#[async_trait]
impl Instances for Broken {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        match self.sim.instance_exists(node).await {
            Err(_) if self.how == Break::GoneOnError => Ok(false),
            r => r,
        }
    }
    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        self.sim.instance_shutdown(node).await
    }
    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        self.sim.instance_metadata(node).await
    }
    async fn instances_status(&self, nodes: &[Arc<Node>]) -> Vec<CloudResult<InstanceStatus>> {
        let out = self.sim.instances_status(nodes).await;
        if self.how != Break::GoneOnError {
            return out;
        }
        out.into_iter()
            .map(|r| r.or(Ok(InstanceStatus::default())))
            .collect()
    }
}

fn key(svc: &Service) -> String {
    format!("{:?}/{:?}", svc.metadata.namespace, svc.metadata.name)
}

#[async_trait]
impl LoadBalancer for Broken {
    async fn get_load_balancer(
        &self,
        cluster: &str,
        svc: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        if self.forgotten.lock().contains(&key(svc)) {
            return Ok(None);
        }
        self.sim.get_load_balancer(cluster, svc).await
    }
    fn load_balancer_name(&self, cluster: &str, svc: &Service) -> String {
        self.sim.load_balancer_name(cluster, svc)
    }
    async fn ensure_load_balancer(
        &self,
        cluster: &str,
        svc: &Service,
        nodes: &[std::sync::Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        self.forgotten.lock().remove(&key(svc));
        if self.how != Break::EnsureNotIdempotent {
            return self.sim.ensure_load_balancer(cluster, svc, nodes).await;
        }
        let n = self.ensures.fetch_add(1, Ordering::Relaxed);
        let mut fresh = svc.clone();
        fresh.metadata.uid = Some(format!(
            "{n:08x}-{}",
            svc.metadata.uid.clone().unwrap_or_default()
        ));
        self.sim.ensure_load_balancer(cluster, &fresh, nodes).await
    }
    async fn update_load_balancer(
        &self,
        cluster: &str,
        svc: &Service,
        nodes: &[std::sync::Arc<Node>],
    ) -> CloudResult<()> {
        self.sim.update_load_balancer(cluster, svc, nodes).await
    }
    async fn ensure_load_balancer_deleted(&self, cluster: &str, svc: &Service) -> CloudResult<()> {
        if self.how == Break::LeakOnDelete {
            self.forgotten.lock().insert(key(svc));
            return Ok(());
        }
        self.sim.ensure_load_balancer_deleted(cluster, svc).await
    }
}

#[async_trait]
impl Routes for Broken {
    async fn list_routes(&self, cluster: &str) -> CloudResult<Vec<Route>> {
        if self.how != Break::AllClustersRoutes {
            return self.sim.list_routes(cluster).await;
        }
        Ok(self
            .sim
            .routes()
            .into_iter()
            .map(|r| Route {
                name: r.name,
                target_node: r.target_node,
                destination_cidr: r.destination_cidr,
                ..Default::default()
            })
            .collect())
    }
    async fn create_route(&self, cluster: &str, hint: &str, route: &Route) -> CloudResult<()> {
        self.sim.create_route(cluster, hint, route).await
    }
    async fn delete_route(&self, cluster: &str, route: &Route) -> CloudResult<()> {
        self.sim.delete_route(cluster, route).await
    }
}

/// A suite over the sim wrapped to break `how`.
pub fn broken_suite(how: Break) -> (Suite, SimCloud) {
    let sim = SimCloud::seeded(11);
    let broken = Arc::new(Broken {
        sim: sim.clone(),
        how,
        ensures: AtomicU32::new(0),
        forgotten: Mutex::default(),
    });
    let harness = SimHarness::with_provider(sim.clone(), Arc::new(Wrapper(broken)));
    let suite = Suite::new(Arc::new(harness), SuiteOptions::new(Level::Destructive));
    (suite, sim)
}

/// The contract level against the sim wrapped to break `how`.
pub async fn run_broken(how: Break) -> (Report, SimCloud) {
    let (suite, sim) = broken_suite(how);
    (suite.run().await, sim)
}
