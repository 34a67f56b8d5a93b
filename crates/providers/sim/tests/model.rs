//! Random operation sequences with injected faults keep the sim's route table and load
//! balancers consistent with a simple model: a failed call changes nothing, a successful one
//! does exactly its thing, VIPs are unique and stable, deletion is idempotent.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::Duration;

use ccm_cloud::{CloudError, LoadBalancer, Route, Routes, op};
use ccm_provider_sim::fixtures::{node, service};
use ccm_provider_sim::{InstanceSpec, InstanceState, Latency, SimCloud, Throttle};
use proptest::prelude::*;

const NODES: [&str; 4] = ["n0", "n1", "n2", "n3"]; // n3 never has an instance
const CLUSTERS: [&str; 2] = ["c1", "c2"];
const CIDRS: [&str; 4] = [
    "10.244.0.0/24",
    "10.244.1.0/24",
    "10.244.2.0/24",
    "fd00:1::/64",
];
const FAULT_OPS: [&str; 7] = [
    "*",
    op::CREATE_ROUTE,
    op::DELETE_ROUTE,
    op::LIST_ROUTES,
    op::ENSURE_LOAD_BALANCER,
    op::UPDATE_LOAD_BALANCER,
    op::ENSURE_LOAD_BALANCER_DELETED,
];

#[derive(Debug, Clone)]
enum Op {
    CreateRoute {
        cluster: usize,
        node: usize,
        cidr: usize,
    },
    DeleteRoute {
        cluster: usize,
        cidr: usize,
    },
    DeleteRouteOutOfBand {
        cluster: usize,
        cidr: usize,
    },
    ListRoutes {
        cluster: usize,
    },
    Ensure {
        svc: usize,
        hosts: Vec<usize>,
    },
    Update {
        svc: usize,
        hosts: Vec<usize>,
    },
    Delete {
        svc: usize,
    },
    Get {
        svc: usize,
    },
    Stop(usize),
    Start(usize),
    Terminate(usize),
    FailNext {
        op: usize,
        n: u32,
    },
    ErrorRate {
        op: usize,
        rate: f64,
    },
    Throttle {
        op: usize,
        qps: f64,
        burst: u32,
    },
    ClearFaults,
    Advance(u64),
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let hosts = proptest::collection::vec(0..4usize, 0..4);
    prop_oneof![
        4 => (0..2usize, 0..4usize, 0..4usize)
            .prop_map(|(cluster, node, cidr)| Op::CreateRoute { cluster, node, cidr }),
        3 => (0..2usize, 0..4usize).prop_map(|(cluster, cidr)| Op::DeleteRoute { cluster, cidr }),
        1 => (0..2usize, 0..4usize)
            .prop_map(|(cluster, cidr)| Op::DeleteRouteOutOfBand { cluster, cidr }),
        2 => (0..2usize).prop_map(|cluster| Op::ListRoutes { cluster }),
        4 => (0..4usize, hosts.clone()).prop_map(|(svc, hosts)| Op::Ensure { svc, hosts }),
        3 => (0..4usize, hosts).prop_map(|(svc, hosts)| Op::Update { svc, hosts }),
        3 => (0..4usize).prop_map(|svc| Op::Delete { svc }),
        1 => (0..4usize).prop_map(|svc| Op::Get { svc }),
        1 => (0..3usize).prop_map(Op::Stop),
        1 => (0..3usize).prop_map(Op::Start),
        1 => (0..3usize).prop_map(Op::Terminate),
        2 => (0..FAULT_OPS.len(), 1..4u32).prop_map(|(op, n)| Op::FailNext { op, n }),
        1 => (0..FAULT_OPS.len(), 0.0..0.6f64).prop_map(|(op, rate)| Op::ErrorRate { op, rate }),
        1 => (0..FAULT_OPS.len(), 0.5..20.0f64, 1..4u32)
            .prop_map(|(op, qps, burst)| Op::Throttle { op, qps, burst }),
        1 => Just(Op::ClearFaults),
        2 => (0..3000u64).prop_map(Op::Advance),
    ]
}

#[derive(Debug, Default)]
struct Model {
    /// Instance id and state per node index 0..3.
    instances: Vec<(String, InstanceState)>,
    /// (cluster, cidr) → (target node, target instance id).
    routes: BTreeMap<(String, String), (String, String)>,
    /// service index → (sorted hosts, vip).
    lbs: BTreeMap<usize, (Vec<String>, Ipv4Addr)>,
    /// Every VIP handed out so far, to check the allocator never hands out a live one twice.
    vips_seen: BTreeSet<Ipv4Addr>,
}

impl Model {
    fn live_instance(&self, node: usize) -> Option<&str> {
        self.instances
            .get(node)
            .filter(|(_, s)| *s != InstanceState::Terminated)
            .map(|(id, _)| id.as_str())
    }
}

fn svc(i: usize) -> ccm_cloud::Service {
    service(
        "ns",
        &format!("s{i}"),
        &format!("uid-{i}"),
        &[("TCP", 80, 30000 + i as i32)],
    )
}

fn host_nodes(hosts: &[usize]) -> (Vec<std::sync::Arc<ccm_cloud::Node>>, Vec<String>) {
    let nodes: Vec<_> = hosts
        .iter()
        .map(|h| std::sync::Arc::new(node(NODES[*h], None)))
        .collect();
    let mut names: Vec<String> = hosts.iter().map(|h| NODES[*h].to_string()).collect();
    names.sort();
    names.dedup();
    (nodes, names)
}

/// An error the sim injected (as opposed to one the model predicts from the state).
fn injected(e: &CloudError) -> bool {
    matches!(e, CloudError::Transient(_) | CloudError::Throttled { .. })
}

fn check_state(sim: &SimCloud, model: &Model) -> Result<(), TestCaseError> {
    let routes: BTreeMap<_, _> = sim
        .routes()
        .into_iter()
        .map(|r| {
            (
                (r.cluster, r.destination_cidr),
                (r.target_node, r.target_instance),
            )
        })
        .collect();
    prop_assert_eq!(&routes, &model.routes);
    let lbs: BTreeMap<usize, (Vec<String>, Ipv4Addr)> = sim
        .load_balancers()
        .into_iter()
        .map(|lb| {
            let i: usize = lb.service_name[1..].parse().expect("s<i>");
            (i, (lb.hosts, lb.vip))
        })
        .collect();
    prop_assert_eq!(&lbs, &model.lbs);
    let vips: BTreeSet<_> = lbs.values().map(|(_, v)| *v).collect();
    prop_assert_eq!(vips.len(), lbs.len(), "VIPs are unique");
    Ok(())
}

async fn run(seed: u64, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let sim = SimCloud::seeded(seed);
    sim.set_latency("*", Latency::from_millis(5, 5))
        .expect("op");
    let mut model = Model::default();
    for name in &NODES[..3] {
        let id = sim.add_instance(InstanceSpec::new(*name));
        model.instances.push((id, InstanceState::Running));
    }
    let mut provider_calls = 0u64;
    for op in ops {
        let log_before = sim.mutations().len();
        let mut failed = false;
        match op {
            Op::CreateRoute {
                cluster,
                node,
                cidr,
            } => {
                provider_calls += 1;
                let (c, n, d) = (CLUSTERS[cluster], NODES[node], CIDRS[cidr]);
                let route = Route {
                    target_node: n.into(),
                    destination_cidr: d.into(),
                    ..Default::default()
                };
                let key = (c.to_string(), d.to_string());
                let expect = if model.routes.contains_key(&key) {
                    Err("RouteAlreadyExists")
                } else if let Some(id) = model.live_instance(node) {
                    Ok(id.to_string())
                } else {
                    Err("InvalidInstanceID.NotFound")
                };
                match (sim.create_route(c, "hint", &route).await, expect) {
                    (Err(e), _) if injected(&e) => failed = true,
                    (Ok(()), Ok(id)) => {
                        model.routes.insert(key, (n.to_string(), id));
                    }
                    (Err(CloudError::Permanent(m)), Err(code)) => {
                        prop_assert!(m.starts_with(code), "{m} vs {code}");
                        failed = true;
                    }
                    (got, want) => prop_assert!(false, "create_route: got {got:?}, model {want:?}"),
                }
            }
            Op::DeleteRoute { cluster, cidr } => {
                provider_calls += 1;
                let (c, d) = (CLUSTERS[cluster], CIDRS[cidr]);
                let route = Route {
                    destination_cidr: d.into(),
                    ..Default::default()
                };
                match sim.delete_route(c, &route).await {
                    Err(e) if injected(&e) => failed = true,
                    Ok(()) => {
                        model.routes.remove(&(c.to_string(), d.to_string()));
                    }
                    Err(e) => prop_assert!(false, "delete_route: {e:?}"),
                }
            }
            Op::DeleteRouteOutOfBand { cluster, cidr } => {
                let (c, d) = (CLUSTERS[cluster], CIDRS[cidr]);
                let had = model
                    .routes
                    .remove(&(c.to_string(), d.to_string()))
                    .is_some();
                prop_assert_eq!(sim.delete_route_out_of_band(c, d), had);
            }
            Op::ListRoutes { cluster } => {
                provider_calls += 1;
                let c = CLUSTERS[cluster];
                match sim.list_routes(c).await {
                    Err(e) if injected(&e) => failed = true,
                    Ok(listed) => {
                        let got: BTreeMap<_, _> = listed
                            .into_iter()
                            .map(|r| (r.destination_cidr, (r.target_node, r.blackhole)))
                            .collect();
                        let want: BTreeMap<_, _> = model
                            .routes
                            .iter()
                            .filter(|((rc, _), _)| rc == c)
                            .map(|((_, d), (n, id))| {
                                let live = model
                                    .instances
                                    .iter()
                                    .any(|(i, s)| i == id && *s != InstanceState::Terminated);
                                (d.clone(), (n.clone(), !live))
                            })
                            .collect();
                        prop_assert_eq!(got, want);
                    }
                    Err(e) => prop_assert!(false, "list_routes: {e:?}"),
                }
            }
            Op::Ensure { svc: i, hosts } => {
                provider_calls += 1;
                let (nodes, names) = host_nodes(&hosts);
                match sim.ensure_load_balancer("c", &svc(i), &nodes).await {
                    Err(e) if injected(&e) => failed = true,
                    Ok(status) => {
                        let ip: Ipv4Addr = status.ingress.expect("ingress")[0]
                            .ip
                            .as_deref()
                            .expect("ip")
                            .parse()
                            .expect("ipv4");
                        prop_assert!(sim.vip_range().contains(&ip));
                        match model.lbs.get(&i) {
                            Some((_, vip)) => prop_assert_eq!(*vip, ip, "VIP is stable"),
                            None => {
                                prop_assert!(model.lbs.values().all(|(_, v)| *v != ip));
                                prop_assert!(model.vips_seen.insert(ip), "fresh VIP {}", ip);
                            }
                        }
                        model.lbs.insert(i, (names, ip));
                    }
                    Err(e) => prop_assert!(false, "ensure: {e:?}"),
                }
            }
            Op::Update { svc: i, hosts } => {
                provider_calls += 1;
                let (nodes, names) = host_nodes(&hosts);
                match (
                    sim.update_load_balancer("c", &svc(i), &nodes).await,
                    model.lbs.get_mut(&i),
                ) {
                    (Err(e), _) if injected(&e) => failed = true,
                    (Ok(()), Some(lb)) => lb.0 = names,
                    (Err(CloudError::Permanent(m)), None) => {
                        prop_assert!(m.starts_with("LoadBalancerNotFound"), "{m}");
                        failed = true;
                    }
                    (got, want) => prop_assert!(false, "update: got {got:?}, model {want:?}"),
                }
            }
            Op::Delete { svc: i } => {
                provider_calls += 1;
                match sim.ensure_load_balancer_deleted("c", &svc(i)).await {
                    Err(e) if injected(&e) => failed = true,
                    Ok(()) => {
                        model.lbs.remove(&i);
                    }
                    Err(e) => prop_assert!(false, "delete: {e:?}"),
                }
            }
            Op::Get { svc: i } => {
                provider_calls += 1;
                match sim.get_load_balancer("c", &svc(i)).await {
                    Err(e) if injected(&e) => failed = true,
                    Ok(got) => prop_assert_eq!(got.is_some(), model.lbs.contains_key(&i)),
                    Err(e) => prop_assert!(false, "get: {e:?}"),
                }
            }
            Op::Stop(i) | Op::Start(i) | Op::Terminate(i) => {
                let (id, state) = model.instances[i].clone();
                let (result, to) = match op {
                    Op::Stop(_) => (sim.stop_instance(&id), InstanceState::Stopped),
                    Op::Start(_) => (sim.start_instance(&id), InstanceState::Running),
                    _ => (sim.terminate_instance(&id), InstanceState::Terminated),
                };
                if state == InstanceState::Terminated && to != InstanceState::Terminated {
                    prop_assert!(result.is_err());
                } else {
                    prop_assert_eq!(result, Ok(state != to));
                    model.instances[i].1 = to;
                }
            }
            Op::FailNext { op, n } => sim.fail_next(FAULT_OPS[op], n).expect("op"),
            Op::ErrorRate { op, rate } => sim.set_error_rate(FAULT_OPS[op], rate).expect("op"),
            Op::Throttle { op, qps, burst } => sim
                .set_throttle(FAULT_OPS[op], Some(Throttle { qps, burst }))
                .expect("op"),
            Op::ClearFaults => {
                sim.clear_faults();
                sim.set_latency("*", Latency::from_millis(5, 5))
                    .expect("op");
            }
            Op::Advance(ms) => tokio::time::advance(Duration::from_millis(ms)).await,
        }
        if failed {
            prop_assert_eq!(
                sim.mutations().len(),
                log_before,
                "a failed call logs nothing"
            );
        }
        check_state(&sim, &model)?;
    }
    prop_assert_eq!(sim.total_calls(), provider_calls, "every call is accounted");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn faulty_sequences_keep_state_consistent(
        seed in any::<u64>(),
        ops in proptest::collection::vec(op_strategy(), 1..80),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime");
        rt.block_on(run(seed, ops))?;
    }
}
