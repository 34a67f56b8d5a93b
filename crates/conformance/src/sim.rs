//! The harness for the sim provider: the reference every other harness is measured against,
//! and the base of the suite's own tests (broken providers wrap the sim).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ccm_cloud::k8s_openapi::api::core::v1::{NodeAddress, NodeStatus};
use ccm_cloud::{CloudError, CloudProvider, LoadBalancer, Node, Routes, node_name};
use ccm_provider_sim::{InstanceSpec, InstanceState, Latency, SimCloud, Throttle};

use crate::harness::{Fault, Harness, HarnessError, HarnessResult, Inventory, LbRecord};
use crate::instances::ccm_cloud_node;

/// Drives a [`SimCloud`] behind the provider under test (the sim itself, or a wrapper).
pub struct SimHarness {
    sim: SimCloud,
    provider: Arc<dyn CloudProvider>,
}

impl SimHarness {
    /// The sim provider itself.
    pub fn new(sim: SimCloud) -> Self {
        let provider = sim.provider();
        SimHarness { sim, provider }
    }

    /// `provider` under test, backed by `sim` (e.g. a wrapper that breaks a rule).
    pub fn with_provider(sim: SimCloud, provider: Arc<dyn CloudProvider>) -> Self {
        SimHarness { sim, provider }
    }

    fn id(&self, node: &Node) -> HarnessResult<String> {
        self.sim
            .instance_id(node_name(node))
            .ok_or_else(|| HarnessError::Failed(format!("no live instance {}", node_name(node))))
    }

    fn sim_err(e: ccm_provider_sim::SimError) -> HarnessError {
        HarnessError::Failed(e.to_string())
    }
}

fn node_of(sim: &SimCloud, name: &str) -> Node {
    let mut node = ccm_cloud_node(name);
    let addresses = sim
        .instances()
        .into_iter()
        .find(|i| i.name == name && i.state != InstanceState::Terminated)
        .map(|i| i.addresses.iter().map(NodeAddress::from).collect());
    node.status = Some(NodeStatus {
        addresses,
        ..Default::default()
    });
    node
}

#[async_trait]
impl Harness for SimHarness {
    fn provider(&self) -> Arc<dyn CloudProvider> {
        self.provider.clone()
    }

    async fn create_instance(&self, name: &str) -> HarnessResult<Node> {
        self.sim.add_instance(InstanceSpec::new(name));
        Ok(node_of(&self.sim, name))
    }

    async fn stop_instance(&self, node: &Node) -> HarnessResult<()> {
        self.sim
            .stop_instance(&self.id(node)?)
            .map(drop)
            .map_err(Self::sim_err)
    }

    async fn start_instance(&self, node: &Node) -> HarnessResult<()> {
        self.sim
            .start_instance(&self.id(node)?)
            .map(drop)
            .map_err(Self::sim_err)
    }

    async fn terminate_instance(&self, node: &Node) -> HarnessResult<()> {
        // Already gone: nothing to do (the sweep terminates every suite instance again).
        let Some(id) = self.sim.instance_id(node_name(node)) else {
            return Ok(());
        };
        self.sim
            .terminate_instance(&id)
            .map(drop)
            .map_err(Self::sim_err)
    }

    async fn inject(&self, fault: Fault) -> HarnessResult<()> {
        let all = ccm_provider_sim::ALL_OPS;
        let r = match fault {
            Fault::ServerError => self.sim.set_error_rate(all, 1.0),
            Fault::Forbidden => self.sim.fail_next_with(
                all,
                u32::MAX,
                CloudError::Permanent(
                    "UnauthorizedOperation: You are not authorized to perform this operation."
                        .into(),
                ),
            ),
            Fault::Timeout => self
                .sim
                .set_latency(all, Latency::from_millis(3_600_000, 0)),
            Fault::Throttle => {
                let r = self
                    .sim
                    .set_throttle(all, Some(Throttle { qps: 0.0, burst: 1 }));
                // A bucket starts with one token: spend it, so the provider's calls all meet
                // the limit.
                let _ = Routes::list_routes(&self.sim, "ccm-conformance-drain").await;
                r
            }
            Fault::NotFound => {
                return Err(HarnessError::Unsupported(
                    "the sim API has no 404 that is not an answer".into(),
                ));
            }
            Fault::Latency(d) => self.sim.set_latency(
                all,
                Latency {
                    fixed: d,
                    jitter: Duration::ZERO,
                },
            ),
        };
        r.map_err(Self::sim_err)
    }

    async fn clear_faults(&self) {
        self.sim.clear_faults();
    }

    async fn inventory(&self, cluster: &str) -> Option<Inventory> {
        let load_balancers = self
            .sim
            .load_balancers()
            .into_iter()
            .filter(|lb| lb.cluster == cluster)
            .map(|lb| LbRecord {
                name: lb.name,
                service: Some(format!("{}/{}", lb.service_namespace, lb.service_name)),
                service_uid: Some(lb.service_uid),
                ports: Some(lb.ports.iter().map(|p| p.port).collect()),
                hosts: Some(lb.hosts),
            })
            .collect();
        Some(Inventory {
            load_balancers,
            other: Vec::new(),
        })
    }

    async fn sweep(&self, cluster: &str) -> Vec<String> {
        let mut out = Vec::new();
        for lb in self
            .sim
            .load_balancers()
            .into_iter()
            .filter(|l| l.cluster == cluster)
        {
            let svc = ccm_provider_sim::fixtures::service(
                &lb.service_namespace,
                &lb.service_name,
                &lb.service_uid,
                &[("TCP", 80, 30080)],
            );
            let _ = LoadBalancer::ensure_load_balancer_deleted(&self.sim, cluster, &svc).await;
            out.push(format!("lb/{cluster}/{}", lb.name));
        }
        for r in self
            .sim
            .routes()
            .into_iter()
            .filter(|r| r.cluster == cluster)
        {
            self.sim
                .delete_route_out_of_band(cluster, &r.destination_cidr);
            out.push(format!("route/{cluster}/{}", r.destination_cidr));
        }
        for i in self.sim.instances() {
            if i.name.starts_with(cluster) && i.state != InstanceState::Terminated {
                let _ = self.sim.terminate_instance(&i.id);
                out.push(format!("instance/{}", i.id));
            }
        }
        let _ = Routes::list_routes(&self.sim, cluster).await;
        out
    }

    fn max_lb_name_len(&self) -> usize {
        32
    }

    fn settle_timeout(&self) -> Duration {
        Duration::from_secs(1)
    }
}
