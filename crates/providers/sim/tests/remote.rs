//! One sim cloud shared over HTTP: a RemoteSim client's calls land in the server's cloud under
//! the client's actor name, errors and events cross the wire, bad requests get a 4xx.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use ccm_cloud::{CloudError, CloudProvider, InstanceEventKind, ProviderRegistry, Route, op};
use ccm_provider_sim::fixtures::{node, service};
use ccm_provider_sim::{InstanceSpec, RemoteSim, SimCloud, SimServer, register};
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn local() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

#[tokio::test]
async fn remote_client_shares_the_cloud_and_is_named_in_the_log() {
    let sim = SimCloud::seeded(1);
    let id = sim.add_instance(InstanceSpec::new("n1"));
    sim.add_instance(InstanceSpec::new("n2"));
    let server = SimServer::start(sim.clone(), local()).await.expect("bind");

    // Selected through the registry, as a CCM child process would.
    let dir = std::env::temp_dir().join(format!("ccm-sim-remote-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path: PathBuf = dir.join("cloud.toml");
    std::fs::write(
        &path,
        format!("endpoint = \"{}\"\nactor = \"ccm-a\"\n", server.endpoint()),
    )
    .expect("write");
    let mut registry = ProviderRegistry::new();
    register(&mut registry).expect("register");
    let provider = registry.build("sim", Some(&path)).expect("remote config");
    assert_eq!(provider.provider_name(), "sim");

    let lb = provider.load_balancer().expect("lb");
    let routes = provider.routes().expect("routes");
    let instances = provider.instances().expect("instances");

    let svc = service("ns", "web", "u-1", &[("TCP", 80, 30080)]);
    assert_eq!(lb.get_load_balancer("c", &svc).await, Ok(None));
    let status = lb
        .ensure_load_balancer(
            "c",
            &svc,
            &[node("n1", None), node("n2", None)].map(std::sync::Arc::new),
        )
        .await
        .expect("ensure");
    let ip = status.ingress.expect("ingress")[0].ip.clone().expect("ip");
    assert_eq!(sim.load_balancers()[0].vip.to_string(), ip);
    assert_eq!(sim.load_balancers()[0].hosts, ["n1", "n2"]);
    // Hosts cross the wire as names: kept sorted and once each, as the in-process sim does.
    lb.update_load_balancer(
        "c",
        &svc,
        &[node("n3", None), node("n1", None), node("n3", None)].map(std::sync::Arc::new),
    )
    .await
    .expect("update");
    assert_eq!(sim.load_balancers()[0].hosts, ["n1", "n3"]);
    assert_eq!(sim.load_balancer_host_counts(), [2]);

    let route = Route {
        target_node: "n1".into(),
        destination_cidr: "10.244.1.0/24".into(),
        ..Default::default()
    };
    assert_eq!(sim.route_count(), 0);
    routes
        .create_route("c", "uid-1", &route)
        .await
        .expect("create");
    assert_eq!(sim.route_count(), 1);
    assert!(matches!(
        routes.create_route("c", "uid-1", &route).await,
        Err(CloudError::Permanent(m)) if m.starts_with("RouteAlreadyExists")
    ));
    sim.fail_next(op::LIST_ROUTES, 1).expect("op");
    assert!(matches!(
        routes.list_routes("c").await,
        Err(CloudError::Transient(_))
    ));
    let listed = routes.list_routes("c").await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].target_node, "n1");

    let pid = format!("sim://{id}");
    let st = instances
        .instances_status(&[node("x", Some(&pid)), node("gone", None)].map(Arc::new))
        .await;
    assert!(st[0].clone().expect("ok").exists);
    assert!(!st[1].clone().expect("ok").exists);
    let md = instances
        .instances_metadata(&[node("n2", None)].map(Arc::new))
        .await;
    assert_eq!(
        md[0].clone().expect("ok").expect("some").instance_type,
        "sim.medium"
    );
    assert_eq!(
        sim.call_count(op::INSTANCES_STATUS),
        1,
        "one HTTP call, one cloud call"
    );

    let writes: Vec<_> = sim
        .mutations()
        .into_iter()
        .filter(|m| m.actor == "ccm-a")
        .map(|m| (m.operation, m.object))
        .collect();
    assert_eq!(
        writes,
        [
            ("ensure_load_balancer".to_string(), "lb/c/au1".to_string()),
            ("update_load_balancer".to_string(), "lb/c/au1".to_string()),
            (
                "create_route".to_string(),
                "route/c/10.244.1.0/24".to_string()
            ),
        ]
    );
    assert_eq!(sim.calls_by("ccm-a").values().sum::<u64>(), 9);

    // Control and inspection over HTTP too.
    let remote = RemoteSim::new(&server.endpoint(), "bench").expect("client");
    let id3 = remote
        .add_instance(&InstanceSpec::new("n3"))
        .await
        .expect("add");
    let mut events = remote.subscribe_events().await.expect("subscribe");
    assert_eq!(remote.stop_instance(&id3).await, Ok(true));
    let ev = events.next().await.expect("event");
    assert_eq!(ev.kind, InstanceEventKind::Stopped);
    assert_eq!(ev.provider_id, format!("sim://{id3}"));
    sim.terminate_instance(&id3).expect("terminate");
    assert_eq!(
        events.next().await.expect("event").kind,
        InstanceEventKind::Terminated
    );
    assert!(remote.start_instance(&id3).await.is_err(), "terminated");
    assert!(remote.stop_instance("i-nope").await.is_err());
    assert!(remote.fail_next("no_such_op", 1).await.is_err());
    assert_eq!(remote.routes().await.expect("routes").len(), 1);
    assert_eq!(remote.calls().await.expect("calls"), sim.calls());
    let log = remote.mutations().await.expect("log");
    assert_eq!(log.len(), sim.mutations().len());
    assert!(
        log.iter()
            .any(|m| m.actor == "bench" && m.operation == "stop_instance")
    );
    assert_eq!(
        remote.delete_route_out_of_band("c", "10.244.1.0/24").await,
        Ok(true)
    );

    // The provider-level event stream (reconnecting) works over HTTP as well.
    let mut stream = instances.instance_events().expect("events");
    // Its subscription is made in the background; keep creating until one event arrives.
    let mut attempts = 0;
    let ev = loop {
        attempts += 1;
        assert!(attempts < 300, "no event over HTTP after a minute");
        sim.add_instance(InstanceSpec::new("later"));
        if let Ok(Some(ev)) =
            tokio::time::timeout(std::time::Duration::from_millis(200), stream.next()).await
        {
            break ev;
        }
    };
    assert_eq!(ev.kind, InstanceEventKind::Created);

    drop(stream);
    drop(events);
    server.shutdown().await.expect("clean shutdown");
}

async fn raw(addr: SocketAddr, request: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(request.as_bytes()).await.expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    out
}

#[tokio::test]
async fn bad_requests_get_4xx_not_a_crash() {
    let sim = SimCloud::seeded(1);
    let server = SimServer::start(sim.clone(), local()).await.expect("bind");
    let addr = server.local_addr();
    let post = |path: &str, body: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    for (path, body, code) in [
        ("/v1/call", "{not json", "400"),
        ("/v1/call", r#"{"op":"launch_missiles","args":{}}"#, "400"),
        (
            "/v1/call",
            r#"{"op":"list_routes","args":{"cluster":7}}"#,
            "400",
        ),
        ("/v1/instances", r#"{"name":""}"#, "400"),
        ("/v1/instances/i-1/explode", "", "404"),
        (
            "/v1/faults",
            r#"{"action":"throttle","op":"*","qps":1.0}"#,
            "400",
        ),
    ] {
        let answer = raw(addr, &post(path, body)).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {code}")),
            "{path} {body}: {answer}"
        );
    }
    // Still serving.
    let ok = raw(
        addr,
        "GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert_eq!(sim.total_calls(), 0);
    server.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn unreachable_server_is_a_transient_error() {
    // Bind and drop to get a port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let remote = RemoteSim::new(&format!("http://127.0.0.1:{port}"), "a").expect("client");
    let routes = CloudProvider::routes(&remote).expect("routes");
    assert!(matches!(
        routes.list_routes("c").await,
        Err(CloudError::Transient(_))
    ));
    assert!(RemoteSim::new("https://example.com", "a").is_err());
    assert!(RemoteSim::new("http://127.0.0.1:1", "bad\nactor").is_err());
}

/// Serves `sim` at `addr` (port 0: any) with the router the sim server uses, recording each
/// call's body; returns the bound address and a way to stop it.
async fn recording_server(
    sim: SimCloud,
    addr: SocketAddr,
    bodies: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) -> (SocketAddr, tokio_util::sync::CancellationToken) {
    let stop = tokio_util::sync::CancellationToken::new();
    let app = ccm_provider_sim::remote::router(sim, stop.clone()).layer(axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| {
            let bodies = bodies.clone();
            async move {
                let (parts, body) = req.into_parts();
                let bytes = axum::body::to_bytes(body, usize::MAX).await.expect("body");
                bodies
                    .lock()
                    .expect("bodies")
                    .push(String::from_utf8_lossy(&bytes).into_owned());
                next.run(axum::extract::Request::from_parts(parts, bytes.into()))
                    .await
            }
        },
    ));
    let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let s = stop.clone();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(s.cancelled_owned())
            .await
    });
    (addr, stop)
}

/// The service controller hands every LB the same node list: it crosses the wire once, later
/// calls name it; a server that lost it (restarted) gets it in full again, and every LB ends
/// with the right hosts.
#[tokio::test]
async fn a_shared_node_list_crosses_the_wire_once_and_again_after_a_restart() {
    let sim = SimCloud::seeded(1);
    let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (addr, stop) = recording_server(sim.clone(), local(), bodies.clone()).await;
    let remote = RemoteSim::new(&format!("http://{addr}"), "a").expect("client");
    let lb = CloudProvider::load_balancer(&remote).expect("lb");
    let nodes = [node("n1", None), node("n2", None)].map(std::sync::Arc::new);
    let web = service("ns", "web", "u-1", &[("TCP", 80, 30080)]);
    let api = service("ns", "api", "u-2", &[("TCP", 443, 30443)]);
    lb.ensure_load_balancer("c", &web, &nodes)
        .await
        .expect("web");
    lb.ensure_load_balancer("c", &api, &nodes)
        .await
        .expect("api");
    let sent: Vec<String> = std::mem::take(&mut *bodies.lock().expect("bodies"));
    assert!(
        sent[0].contains("\"n1\""),
        "the first call carries the nodes: {}",
        sent[0]
    );
    assert!(
        !sent[1].contains("\"n1\""),
        "the second names them: {}",
        sent[1]
    );

    // The server restarts on the same port and forgets the list; the cloud stays.
    stop.cancel();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let (_, stop) = recording_server(sim.clone(), addr, bodies.clone()).await;
    lb.update_load_balancer("c", &web, &nodes)
        .await
        .expect("web, after the restart");
    let sent: Vec<String> = std::mem::take(&mut *bodies.lock().expect("bodies"));
    assert_eq!(sent.len(), 2, "named, refused, then in full: {sent:?}");
    assert!(
        !sent[0].contains("\"n1\"") && sent[1].contains("\"n1\""),
        "{sent:?}"
    );
    lb.update_load_balancer("c", &api, &nodes[..1])
        .await
        .expect("api, fewer");
    // By LB name: web's ("au-1"), then api's.
    let hosts: Vec<Vec<String>> = sim.load_balancers().into_iter().map(|l| l.hosts).collect();
    assert_eq!(
        hosts,
        [vec!["n1".to_string(), "n2".into()], vec!["n1".into()]]
    );
    stop.cancel();
}
