//! ccm-cloud's default batch methods call the per-node methods exactly once per node (and
//! `instance_shutdown` only for nodes that exist), in order; through the metering wrapper such a
//! batch counts one request per per-node call.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use ccm_cloud::{
    CloudMetrics, CloudProvider, CloudResult, InstanceMetadata, Instances, MeterOptions, Node,
    metered, node_name, op,
};
use ccm_provider_sim::fixtures::node;
use ccm_provider_sim::{InstanceSpec, SimCloud};
use parking_lot::Mutex;
use proptest::prelude::*;

/// Forwards per-node calls to the sim and counts them; batch methods are the trait defaults.
struct PerNode {
    sim: SimCloud,
    counts: Mutex<BTreeMap<(&'static str, String), u32>>,
}

impl PerNode {
    fn count(&self, op: &'static str, node: &Node) {
        *self
            .counts
            .lock()
            .entry((op, node_name(node).to_string()))
            .or_default() += 1;
    }
    fn get(&self, op: &'static str, name: &str) -> u32 {
        self.counts
            .lock()
            .get(&(op, name.to_string()))
            .copied()
            .unwrap_or(0)
    }
}

#[async_trait]
impl Instances for PerNode {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        self.count(op::INSTANCE_EXISTS, node);
        self.sim.instance_exists(node).await
    }
    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        self.count(op::INSTANCE_SHUTDOWN, node);
        self.sim.instance_shutdown(node).await
    }
    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        self.count(op::INSTANCE_METADATA, node);
        self.sim.instance_metadata(node).await
    }
}

struct PerNodeProvider(Arc<PerNode>);

impl CloudProvider for PerNodeProvider {
    fn provider_name(&self) -> &str {
        "per-node"
    }
    fn instances(&self) -> Option<Arc<dyn Instances>> {
        Some(self.0.clone())
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Running,
    Stopped,
    Terminated,
    Missing,
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Running),
        Just(Kind::Stopped),
        Just(Kind::Terminated),
        Just(Kind::Missing)
    ]
}

fn setup(kinds: &[Kind], by_provider_id: &[bool]) -> (Arc<PerNode>, Vec<Arc<Node>>) {
    let sim = SimCloud::seeded(1);
    let mut nodes = Vec::new();
    for (i, (k, by_pid)) in kinds.iter().zip(by_provider_id).enumerate() {
        let name = format!("n{i}");
        let id = match k {
            Kind::Missing => format!("i-missing{i}"),
            _ => sim.add_instance(InstanceSpec::new(&name)),
        };
        match k {
            Kind::Stopped => drop(sim.stop_instance(&id)),
            Kind::Terminated => drop(sim.terminate_instance(&id)),
            _ => {}
        }
        let pid = format!("sim://{id}");
        nodes.push(Arc::new(node(&name, by_pid.then_some(pid.as_str()))));
    }
    let per_node = Arc::new(PerNode {
        sim,
        counts: Mutex::default(),
    });
    (per_node, nodes)
}

fn exists(k: Kind) -> bool {
    matches!(k, Kind::Running | Kind::Stopped)
}

proptest! {
    #[test]
    fn defaults_call_each_node_exactly_once(
        spec in proptest::collection::vec((kind(), any::<bool>()), 0..60),
    ) {
        let kinds: Vec<Kind> = spec.iter().map(|(k, _)| *k).collect();
        let by_pid: Vec<bool> = spec.iter().map(|(_, b)| *b).collect();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let (per_node, nodes) = setup(&kinds, &by_pid);
            prop_assert!(!per_node.native_batching());

            let md = per_node.instances_metadata(&nodes).await;
            prop_assert_eq!(md.len(), nodes.len());
            let st = per_node.instances_status(&nodes).await;
            prop_assert_eq!(st.len(), nodes.len());
            for (i, k) in kinds.iter().enumerate() {
                let name = format!("n{i}");
                prop_assert_eq!(per_node.get(op::INSTANCE_METADATA, &name), 1);
                prop_assert_eq!(per_node.get(op::INSTANCE_EXISTS, &name), 1);
                prop_assert_eq!(per_node.get(op::INSTANCE_SHUTDOWN, &name), u32::from(exists(*k)));
                // Results are in input order.
                match &md[i] {
                    Ok(Some(m)) => {
                        prop_assert!(exists(*k));
                        let want = per_node.sim.instance_id(&name).map(|id| format!("sim://{id}"));
                        prop_assert_eq!(Some(m.provider_id.clone()), want);
                    }
                    Err(ccm_cloud::CloudError::InstanceNotFound) => prop_assert!(!exists(*k)),
                    other => prop_assert!(false, "unexpected {:?}", other),
                }
                let s = st[i].clone().expect("status");
                prop_assert_eq!(s.exists, exists(*k));
                prop_assert_eq!(s.shutdown, *k == Kind::Stopped);
            }

            // Through the metering wrapper: one request per per-node call, none for the batch.
            per_node.sim.reset_calls();
            let metrics = CloudMetrics::default();
            let wrapped = metered(
                Arc::new(PerNodeProvider(per_node.clone())),
                metrics.clone(),
                MeterOptions::default(),
            );
            let inst = wrapped.instances().expect("instances");
            inst.instances_status(&nodes).await;
            inst.instances_metadata(&nodes).await;
            let n = nodes.len() as u64;
            let existing = kinds.iter().filter(|k| exists(**k)).count() as u64;
            prop_assert_eq!(metrics.count(op::INSTANCE_EXISTS), n);
            prop_assert_eq!(metrics.count(op::INSTANCE_SHUTDOWN), existing);
            prop_assert_eq!(metrics.count(op::INSTANCE_METADATA), n);
            prop_assert_eq!(metrics.count(op::INSTANCES_STATUS), 0);
            prop_assert_eq!(metrics.count(op::INSTANCES_METADATA), 0);
            prop_assert_eq!(metrics.snapshot(), per_node.sim.calls());
            Ok(())
        })?;
    }

    /// A failing `instance_exists` is not retried, and `instance_shutdown` is not asked for it.
    #[test]
    fn failures_are_not_retried(
        n in 1usize..40,
        fails in 0u32..40,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let kinds = vec![Kind::Running; n];
            let (per_node, nodes) = setup(&kinds, &vec![false; n]);
            per_node.sim.fail_next(op::INSTANCE_EXISTS, fails).expect("op");
            let st = per_node.instances_status(&nodes).await;
            let failed = st.iter().filter(|r| r.is_err()).count();
            prop_assert_eq!(failed, (fails as usize).min(n));
            for (i, r) in st.iter().enumerate() {
                let name = format!("n{i}");
                prop_assert_eq!(per_node.get(op::INSTANCE_EXISTS, &name), 1);
                prop_assert_eq!(per_node.get(op::INSTANCE_SHUTDOWN, &name), u32::from(r.is_ok()));
            }
            Ok(())
        })?;
    }
}
