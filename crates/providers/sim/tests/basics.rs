//! The sim cloud's contracts, one behaviour per test.

use std::sync::Arc;
use std::time::Duration;

use ccm_cloud::{
    CloudError, CloudProvider, InstanceEventKind, LoadBalancer, ProviderRegistry, Route, Routes, op,
};
use ccm_provider_sim::fixtures::{node, service};
use ccm_provider_sim::{
    InstanceSpec, InstanceState, Latency, SimCloud, SimConfig, Throttle, register,
};
use futures::StreamExt;

fn route(target: &str, cidr: &str) -> Route {
    Route {
        target_node: target.into(),
        destination_cidr: cidr.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn lookup_by_provider_id_then_name_and_power_states() {
    let sim = SimCloud::seeded(1);
    let id = sim.add_instance(InstanceSpec::new("n1"));
    let inst = CloudProvider::instances(&sim).expect("instances");
    let pid = format!("sim://{id}");

    assert!(inst.instance_exists(&node("n1", None)).await.expect("ok"));
    assert!(
        inst.instance_exists(&node("renamed", Some(&pid)))
            .await
            .expect("ok")
    );
    // A providerID wins over the name: a Node pointing at another id is not this instance.
    assert!(
        !inst
            .instance_exists(&node("n1", Some("sim://i-ffffffffffffffff")))
            .await
            .expect("ok")
    );
    assert!(matches!(
        inst.instance_exists(&node("n1", Some("aws:///zone/i-1")))
            .await,
        Err(CloudError::Permanent(_))
    ));

    let md = inst
        .instance_metadata(&node("n1", None))
        .await
        .expect("ok")
        .expect("some");
    assert_eq!(md.provider_id, pid);
    assert_eq!(md.node_addresses.len(), 2, "InternalIP and Hostname");

    sim.stop_instance(&id).expect("stop");
    let st = inst
        .instances_status(&[node("n1", None)].map(Arc::new))
        .await;
    assert_eq!(
        st[0].clone().expect("ok"),
        ccm_cloud::InstanceStatus {
            exists: true,
            shutdown: true
        }
    );

    sim.terminate_instance(&id).expect("terminate");
    let st = inst
        .instances_status(&[node("n1", Some(&pid))].map(Arc::new))
        .await;
    assert!(!st[0].clone().expect("ok").exists);
    assert_eq!(
        inst.instance_metadata(&node("n1", None)).await,
        Err(CloudError::InstanceNotFound)
    );
    assert_eq!(
        sim.start_instance(&id),
        Err(ccm_provider_sim::SimError::Terminated(id.clone()))
    );
    assert_eq!(
        sim.instances_snapshot_state(&id),
        Some(InstanceState::Terminated)
    );
}

trait SnapshotExt {
    fn instances_snapshot_state(&self, id: &str) -> Option<InstanceState>;
}
impl SnapshotExt for SimCloud {
    fn instances_snapshot_state(&self, id: &str) -> Option<InstanceState> {
        self.instances()
            .into_iter()
            .find(|i| i.id == id)
            .map(|i| i.state)
    }
}

#[tokio::test]
async fn batches_are_one_call_and_bounded() {
    let sim = SimCloud::with_options(ccm_provider_sim::SimOptions {
        max_batch_size: 3,
        seed: Some(1),
        ..Default::default()
    });
    for n in ["a", "b"] {
        sim.add_instance(InstanceSpec::new(n));
    }
    let inst = CloudProvider::instances(&sim).expect("instances");
    assert!(inst.native_batching());
    assert_eq!(inst.max_batch_size(), 3);
    let nodes = [node("a", None), node("b", None), node("missing", None)].map(Arc::new);
    let md = inst.instances_metadata(&nodes).await;
    assert!(md[0].is_ok() && md[1].is_ok());
    assert_eq!(md[2], Err(CloudError::InstanceNotFound));
    assert_eq!(sim.call_count(op::INSTANCES_METADATA), 1);
    assert_eq!(sim.call_count(op::INSTANCE_METADATA), 0);

    let too_many: Vec<_> = (0..4)
        .map(|i| Arc::new(node(&format!("n{i}"), None)))
        .collect();
    let st = inst.instances_status(&too_many).await;
    assert_eq!(st.len(), 4);
    assert!(
        st.iter()
            .all(|r| matches!(r, Err(CloudError::Permanent(_))))
    );
}

#[tokio::test]
async fn instance_events_for_add_stop_start_terminate() {
    let sim = SimCloud::seeded(1);
    let mut events = CloudProvider::instances(&sim)
        .expect("instances")
        .instance_events()
        .expect("sim has events");
    let id = sim.add_instance(InstanceSpec::new("n1"));
    sim.stop_instance(&id).expect("stop");
    assert_eq!(sim.stop_instance(&id), Ok(false), "no event for a no-op");
    sim.start_instance(&id).expect("start");
    sim.terminate_instance(&id).expect("terminate");
    let mut kinds = Vec::new();
    for _ in 0..4 {
        let ev = events.next().await.expect("event");
        assert_eq!(ev.provider_id, format!("sim://{id}"));
        assert_eq!(ev.node_name.as_deref(), Some("n1"));
        kinds.push(ev.kind);
    }
    use InstanceEventKind::*;
    assert_eq!(kinds, [Created, Stopped, Started, Terminated]);
}

#[tokio::test]
async fn load_balancer_lifecycle() {
    let sim = SimCloud::with_options(ccm_provider_sim::SimOptions {
        vip_range: "10.9.0.0/30".parse().expect("cidr"),
        ..Default::default()
    });
    let lb = sim.load_balancer().expect("lb");
    let svc = service("default", "web", "1111-2222", &[("TCP", 80, 30080)]);
    let svc2 = service("default", "api", "3333-4444", &[("TCP", 443, 30443)]);
    let svc3 = service("default", "x", "5555", &[("TCP", 1, 30001)]);

    assert_eq!(lb.get_load_balancer("c", &svc).await, Ok(None));
    let st = lb
        .ensure_load_balancer(
            "c",
            &svc,
            &[node("b", None), node("a", None)].map(std::sync::Arc::new),
        )
        .await
        .expect("ensure");
    let ip = st.ingress.expect("ingress")[0].ip.clone().expect("ip");
    assert_eq!(ip, "10.9.0.1");
    let st2 = lb
        .ensure_load_balancer("c", &svc2, &[])
        .await
        .expect("ensure");
    assert_eq!(
        st2.ingress.expect("ingress")[0].ip.as_deref(),
        Some("10.9.0.2")
    );
    // The range holds two VIPs.
    assert!(matches!(
        lb.ensure_load_balancer("c", &svc3, &[]).await,
        Err(CloudError::Permanent(m)) if m.contains("AddressLimitExceeded")
    ));

    lb.update_load_balancer("c", &svc, &[node("z", None)].map(std::sync::Arc::new))
        .await
        .expect("update");
    let lbs = sim.load_balancers();
    assert_eq!(lbs[0].hosts, ["z"]);
    assert_eq!(lbs[0].name, "a11112222");
    assert_eq!(lbs[0].ports[0].node_port, 30080);

    lb.ensure_load_balancer_deleted("c", &svc)
        .await
        .expect("delete");
    lb.ensure_load_balancer_deleted("c", &svc)
        .await
        .expect("idempotent");
    assert_eq!(lb.get_load_balancer("c", &svc).await, Ok(None));
    assert!(matches!(
        lb.update_load_balancer("c", &svc, &[]).await,
        Err(CloudError::Permanent(m)) if m.contains("LoadBalancerNotFound")
    ));
    let no_ports = service("default", "none", "9", &[]);
    assert!(lb.ensure_load_balancer("c", &no_ports, &[]).await.is_err());
}

#[tokio::test]
async fn routes_follow_ec2() {
    let sim = SimCloud::seeded(3);
    let id = sim.add_instance(InstanceSpec::new("n1"));
    let routes = CloudProvider::routes(&sim).expect("routes");
    routes
        .create_route("c", "uid1", &route("n1", "10.244.1.0/24"))
        .await
        .expect("create");
    routes
        .create_route("c", "uid1", &route("n1", "fd00:1::/64"))
        .await
        .expect("dual-stack create");
    assert!(matches!(
        routes.create_route("c", "uid1", &route("n1", "10.244.1.0/24")).await,
        Err(CloudError::Permanent(m)) if m.starts_with("RouteAlreadyExists")
    ));
    assert!(matches!(
        routes.create_route("c", "uid2", &route("ghost", "10.244.2.0/24")).await,
        Err(CloudError::Permanent(m)) if m.starts_with("InvalidInstanceID.NotFound")
    ));
    assert!(
        routes
            .create_route("c", "u", &route("n1", "10.244.3.1/24"))
            .await
            .is_err()
    );

    let listed = routes.list_routes("c").await.expect("list");
    assert_eq!(listed.len(), 2);
    assert_ne!(listed[0].name, listed[1].name, "dual-stack names differ");
    assert!(listed.iter().all(|r| !r.blackhole));
    assert!(routes.list_routes("other").await.expect("list").is_empty());

    sim.terminate_instance(&id).expect("terminate");
    let listed = routes.list_routes("c").await.expect("list");
    assert!(
        listed.iter().all(|r| r.blackhole),
        "routes to a terminated instance are blackholes"
    );

    routes.delete_route("c", &listed[0]).await.expect("delete");
    routes
        .delete_route("c", &listed[0])
        .await
        .expect("delete is idempotent");
    assert!(sim.delete_route_out_of_band("c", "fd00:1::/64"));
    assert!(routes.list_routes("c").await.expect("list").is_empty());
}

#[tokio::test]
async fn mutation_log_records_actor_and_changes() {
    let sim = SimCloud::seeded(1);
    sim.add_instance(InstanceSpec::new("n1"));
    let a = sim.with_actor("ccm-a");
    let b = sim.with_actor("ccm-b");
    let svc = service("ns", "s", "u1", &[("TCP", 80, 30080)]);
    a.ensure_load_balancer("c", &svc, &[])
        .await
        .expect("ensure");
    b.ensure_load_balancer_deleted("c", &svc)
        .await
        .expect("delete");
    b.ensure_load_balancer_deleted("c", &svc)
        .await
        .expect("delete again");
    // A failed call is not a mutation.
    a.fail_next(op::CREATE_ROUTE, 1).expect("op");
    assert!(
        a.create_route("c", "h", &route("n1", "10.0.0.0/24"))
            .await
            .is_err()
    );

    let log: Vec<_> = sim
        .mutations()
        .into_iter()
        .map(|m| (m.seq, m.actor, m.operation, m.changed))
        .collect();
    assert_eq!(
        log,
        [
            (1, "default".into(), "add_instance".into(), true),
            (2, "ccm-a".into(), "ensure_load_balancer".into(), true),
            (
                3,
                "ccm-b".into(),
                "ensure_load_balancer_deleted".into(),
                true
            ),
            (
                4,
                "ccm-b".into(),
                "ensure_load_balancer_deleted".into(),
                false
            ),
        ]
    );
    assert_eq!(sim.calls_by("ccm-a").values().sum::<u64>(), 2);
    assert_eq!(
        sim.calls_by("ccm-a")
            .get(&(op::CREATE_ROUTE.to_string(), "transient".to_string())),
        Some(&1)
    );
}

#[tokio::test(start_paused = true)]
async fn latency_uses_tokio_time() {
    let sim = SimCloud::seeded(5);
    sim.set_latency("*", Latency::from_millis(100, 50))
        .expect("op");
    sim.set_latency(op::LIST_ROUTES, Latency::from_millis(1000, 0))
        .expect("op");
    let routes = CloudProvider::routes(&sim).expect("routes");
    let start = tokio::time::Instant::now();
    routes.list_routes("c").await.expect("list");
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(1),
        "per-op setting wins"
    );
    let start = tokio::time::Instant::now();
    CloudProvider::instances(&sim)
        .expect("instances")
        .instance_exists(&node("x", None))
        .await
        .expect("exists");
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(100) && took <= Duration::from_millis(150),
        "{took:?}"
    );
    assert!(
        sim.set_latency("list_route", Latency::default()).is_err(),
        "typos are refused"
    );
}

#[tokio::test]
async fn seeded_error_rates_replay() {
    async fn run(seed: u64) -> Vec<bool> {
        let sim = SimCloud::seeded(seed);
        sim.set_error_rate(op::LIST_ROUTES, 0.5).expect("op");
        let routes = CloudProvider::routes(&sim).expect("routes");
        let mut out = Vec::new();
        for _ in 0..64 {
            out.push(routes.list_routes("c").await.is_ok());
        }
        out
    }
    let a = run(9).await;
    assert_eq!(a, run(9).await);
    assert!(a.iter().any(|ok| *ok) && a.iter().any(|ok| !*ok));
}

#[tokio::test(start_paused = true)]
async fn throttled_calls_say_request_limit_exceeded() {
    let sim = SimCloud::seeded(1);
    sim.set_throttle(op::LIST_ROUTES, Some(Throttle { qps: 1.0, burst: 2 }))
        .expect("op");
    let routes = CloudProvider::routes(&sim).expect("routes");
    assert!(routes.list_routes("c").await.is_ok());
    assert!(routes.list_routes("c").await.is_ok());
    match routes.list_routes("c").await {
        Err(CloudError::Throttled {
            message,
            retry_after,
        }) => {
            assert!(message.starts_with("RequestLimitExceeded"), "{message}");
            assert_eq!(retry_after, Some(Duration::from_secs(1)));
        }
        other => panic!("expected throttling, got {other:?}"),
    }
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(routes.list_routes("c").await.is_ok());
    assert_eq!(
        sim.calls()
            .get(&(op::LIST_ROUTES.to_string(), "throttled".to_string())),
        Some(&1)
    );
}

fn registry() -> ProviderRegistry {
    let mut r = ProviderRegistry::new();
    register(&mut r).expect("register");
    r
}

#[test]
fn example_config_loads_through_the_registry() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/sim-cloud.toml");
    let provider = registry()
        .build("sim", Some(&path))
        .expect("example config is valid");
    assert_eq!(provider.provider_name(), "sim");

    let text = std::fs::read_to_string(&path).expect("read");
    let cfg: SimConfig = ccm_cloud::parse_toml_str(&text).expect("parse");
    let sim = cfg.build_cloud().expect("build");
    let names: Vec<_> = sim
        .instances()
        .into_iter()
        .map(|i| (i.name, i.state))
        .collect();
    assert_eq!(
        names,
        [
            ("node-1".to_string(), InstanceState::Running),
            ("node-2".to_string(), InstanceState::Stopped)
        ]
    );
    assert_eq!(sim.vip_range().to_string(), "198.18.0.0/24");
}

#[test]
fn config_errors_name_the_field() {
    let dir = std::env::temp_dir().join(format!("ccm-sim-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let cases = [
        ("seeed = 1\n", "unknown field `seeed`"),
        (
            "[latency.create_rout]\nfixed_ms = 1\n",
            "field latency.create_rout",
        ),
        (
            "[latency.create_route]\nfixed_ms = \"5ms\"\n",
            "field latency.create_route.fixed_ms",
        ),
        (
            "[error_rate]\nlist_routes = 1.5\n",
            "field error_rate.list_routes",
        ),
        ("vip_range = \"nope\"\n", "field vip_range"),
        (
            "[[instances]]\nname = \"a\"\nzones = \"x\"\n",
            "unknown field `zones`",
        ),
        (
            "endpoint = \"http://127.0.0.1:1\"\nseed = 1\n",
            "field seed",
        ),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        let path = dir.join(format!("c{i}.toml"));
        std::fs::write(&path, text).expect("write");
        let err = registry()
            .build("sim", Some(&path))
            .err()
            .expect("bad config");
        let msg = err.to_string();
        assert!(msg.contains(want), "{text:?}: {msg}");
        assert!(msg.contains(&path.display().to_string()), "{msg}");
    }
    let msg = registry()
        .build(
            "sim",
            Some(&{
                let p = dir.join("typo.toml");
                std::fs::write(&p, "[throttle.lst_routes]\nqps = 1.0\nburst = 1\n").expect("write");
                p
            }),
        )
        .err()
        .expect("typo")
        .to_string();
    assert!(msg.contains("did you mean \"list_routes\"?"), "{msg}");
}
