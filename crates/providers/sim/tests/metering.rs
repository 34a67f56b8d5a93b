//! ccm-cloud's metering wrapper counts exactly what the cloud received: same operations, same
//! results, failures and throttling included; a native batch is one call.

use std::sync::Arc;

use ccm_cloud::{CloudMetrics, CloudProvider, MeterOptions, Route, metered, op};
use ccm_provider_sim::fixtures::{node, service};
use ccm_provider_sim::{InstanceSpec, SimCloud, Throttle};

#[tokio::test(start_paused = true)]
async fn metering_matches_the_clouds_own_accounting() {
    let sim = SimCloud::seeded(11);
    for i in 0..5 {
        sim.add_instance(InstanceSpec::new(format!("n{i}")));
    }
    let metrics = CloudMetrics::default();
    let provider = metered(
        Arc::new(sim.clone()) as Arc<dyn CloudProvider>,
        metrics.clone(),
        MeterOptions::default(),
    );
    let instances = provider.instances().expect("instances");
    let lb = provider.load_balancer().expect("lb");
    let routes = provider.routes().expect("routes");
    assert!(
        instances.native_batching(),
        "the wrapper passes native batching through"
    );

    sim.fail_next(op::INSTANCE_EXISTS, 3).expect("op");
    sim.set_error_rate(op::GET_LOAD_BALANCER, 0.3).expect("op");
    sim.set_throttle(op::LIST_ROUTES, Some(Throttle { qps: 1.0, burst: 4 }))
        .expect("op");
    sim.fail_next_with(
        op::INSTANCES_STATUS,
        2,
        ccm_cloud::CloudError::retry_after(std::time::Duration::from_secs(1), "later"),
    )
    .expect("op");

    let nodes: Vec<_> = (0..5)
        .map(|i| Arc::new(node(&format!("n{i}"), None)))
        .collect();
    let mut made = 0;
    for n in &nodes {
        let _ = instances.instance_exists(n).await;
        let _ = instances.instance_metadata(n).await;
        made += 2;
    }
    for _ in 0..4 {
        // One existing node in each batch, so "the whole batch failed" means the call failed.
        let batch = instances.instances_status(&nodes).await;
        assert_eq!(batch.len(), 5);
        let _ = instances.instances_metadata(&nodes[..2]).await;
        made += 2;
    }
    let svc = service("ns", "s", "u", &[("TCP", 80, 30080)]);
    for _ in 0..20 {
        let _ = lb.get_load_balancer("c", &svc).await;
        made += 1;
    }
    let _ = lb.ensure_load_balancer("c", &svc, &nodes).await;
    let _ = lb.ensure_load_balancer_deleted("c", &svc).await;
    made += 2;
    let route = Route {
        target_node: "n0".into(),
        destination_cidr: "10.244.0.0/24".into(),
        ..Default::default()
    };
    let _ = routes.create_route("c", "h", &route).await;
    let _ = routes.create_route("c", "h", &route).await; // RouteAlreadyExists: permanent
    made += 2;
    for _ in 0..10 {
        let _ = routes.list_routes("c").await;
        made += 1;
    }

    let seen = sim.calls();
    assert_eq!(
        metrics.snapshot(),
        seen,
        "metering and the cloud agree call by call"
    );
    assert_eq!(metrics.total(), made);
    assert_eq!(
        metrics.count(op::INSTANCES_STATUS),
        4,
        "a native batch is one call"
    );
    assert_eq!(metrics.count(op::INSTANCES_METADATA), 4);
    assert_eq!(metrics.count(op::INSTANCE_EXISTS), 5);
    let get = |o: &str, r: &str| seen.get(&(o.to_string(), r.to_string())).copied();
    assert_eq!(get(op::INSTANCE_EXISTS, "transient"), Some(3));
    assert_eq!(get(op::INSTANCES_STATUS, "retry"), Some(2));
    assert_eq!(get(op::LIST_ROUTES, "throttled"), Some(6));
    assert_eq!(get(op::CREATE_ROUTE, "permanent"), Some(1));
    assert!(get(op::GET_LOAD_BALANCER, "transient").is_some_and(|n| n > 0));
}
