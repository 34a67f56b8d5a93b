//! Routes against the real Neutron of testenv/stack.sh, then the conformance suite against the
//! whole stack, the load-balancer and security-group scenarios (support/lb.rs) and the Nova
//! instances checks (support/nova.rs), on one stack start.
//!
//! Routes: a network, subnet and router with an interface on it, made with the real
//! `openstack` client; "Nodes" are Nova servers (fake driver, no NIC) each holding a Neutron
//! port on that network (`device_id` = the server; the agentless ML2 cannot bind a NIC to a
//! server). Routes created, listed and deleted through the provider are checked with
//! `openstack router show` and the ports' `allowed_address_pairs`; an address change moves the
//! next hop; a deleted server makes its route a blackhole; a wrong router id and a stopped
//! Neutron are errors.

mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ccm_cloud::{
    CloudProvider, CloudResult, InstanceMetadata, InstanceStatus, Instances, LoadBalancer,
    LoadBalancerStatus, Node, NodeAddressKey, Route, Routes, Service, node_name,
};
use ccm_conformance::{
    Fault, Harness, HarnessError, HarnessResult, Inventory, LbRecord, Level, Outcome, Suite,
    SuiteOptions, rules,
};
use ccm_provider_openstack::{OpenStackCloud, OpenStackConfig, route_tag};
use k8s_openapi::api::core::v1::{NodeAddress, NodeSpec, NodeStatus};
use kube::api::ObjectMeta;
use parking_lot::Mutex;
use support::{Stack, delta, start_stack_with, total};

const CIDR_A: &str = "10.244.1.0/24";
const CIDR_B: &str = "10.244.2.0/24";

fn internal(ip: &str) -> Vec<NodeAddressKey> {
    vec![NodeAddressKey {
        type_: "InternalIP".into(),
        address: ip.into(),
    }]
}

fn route(node: &str, ip: &str, cidr: &str) -> Route {
    Route {
        target_node: node.into(),
        target_node_addresses: internal(ip),
        destination_cidr: cidr.into(),
        ..Route::default()
    }
}

fn json(stack: &Stack, args: &[&str]) -> serde_json::Value {
    let mut a = args.to_vec();
    a.extend(["-f", "json"]);
    serde_json::from_str(&stack.openstack(&a)).expect("openstack -f json")
}

/// `(destination, nexthop)` of the router, as `openstack router show` has them.
fn router_routes(stack: &Stack, router: &str) -> Vec<(String, String)> {
    let v = json(stack, &["router", "show", router]);
    let mut out: Vec<(String, String)> = v["routes"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|r| {
            (
                r["destination"].as_str().unwrap_or_default().to_string(),
                r["nexthop"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

fn pairs(stack: &Stack, port: &str) -> Vec<String> {
    let v = json(stack, &["port", "show", port]);
    v["allowed_address_pairs"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|p| p["ip_address"].as_str().unwrap_or_default().to_string())
        .collect()
}

struct Net {
    router: String,
    subnet: String,
}

/// Network 10.20.0.0/24 behind a router; a port per (name, ip, server id).
fn network(stack: &Stack) -> Net {
    stack.openstack(&["network", "create", "pods-net"]);
    let subnet = stack.openstack(&[
        "subnet",
        "create",
        "--network",
        "pods-net",
        "--subnet-range",
        "10.20.0.0/24",
        "-f",
        "value",
        "-c",
        "id",
        "pods-sub",
    ]);
    let router = stack.openstack(&["router", "create", "-f", "value", "-c", "id", "r1"]);
    stack.openstack(&["router", "add", "subnet", "r1", "pods-sub"]);
    Net { router, subnet }
}

fn port(stack: &Stack, name: &str, ip: &str, server: &str) -> String {
    stack.openstack(&[
        "port",
        "create",
        "--network",
        "pods-net",
        "--fixed-ip",
        &format!("subnet=pods-sub,ip-address={ip}"),
        "--device",
        server,
        "--device-owner",
        "compute:nova",
        "-f",
        "value",
        "-c",
        "id",
        name,
    ])
}

fn routes_of(cloud: &OpenStackCloud) -> std::sync::Arc<dyn Routes> {
    cloud.routes().expect("[Route] router-id set: routes")
}

#[tokio::test(flavor = "multi_thread")]
async fn neutron_routes_and_conformance_on_one_stack() {
    let t0 = Instant::now();
    let stack = tokio::task::spawn_blocking(|| start_stack_with(true))
        .await
        .expect("start");
    let net = network(&stack);
    let id_a = stack.boot("node-a");
    let id_b = stack.boot("node-b");
    let port_a = port(&stack, "port-a", "10.20.0.11", &id_a);
    let port_a2 = port(&stack, "port-a2", "10.20.0.21", &id_a);
    let port_b = port(&stack, "port-b", "10.20.0.12", &id_b);
    let conf = format!(
        "[Route]\nrouter-id = {}\n[LoadBalancer]\nsubnet-id = {}\n",
        net.router, net.subnet
    );
    let cloud = stack.cloud_with("ccm-secret", &conf);
    let r = routes_of(&cloud);
    let k = "kubernetes";

    // Nothing yet: one router GET (after the one extensions check).
    let before = cloud.api_calls();
    assert_eq!(r.list_routes(k).await.expect("list"), vec![]);
    let d = delta(&cloud, &before);
    eprintln!("list_routes, no routes: {d:?}");
    assert_eq!(d.get("network GET /v2.0/routers/{id}"), Some(&1), "{d:?}");

    // Create: an extraroute to the Node's InternalIP, the pod CIDR on its port.
    let before = cloud.api_calls();
    r.create_route(k, "uid-a", &route("node-a", "10.20.0.11", CIDR_A))
        .await
        .expect("create");
    let d = delta(&cloud, &before);
    eprintln!("create_route: {d:?}");
    assert_eq!(
        d.get("network PUT /v2.0/routers/{id}/add_extraroutes"),
        Some(&1)
    );
    assert!(
        !d.contains_key("network PUT /v2.0/routers/{id}"),
        "no whole-list update: {d:?}"
    );
    assert_eq!(
        router_routes(&stack, "r1"),
        vec![(CIDR_A.to_string(), "10.20.0.11".to_string())]
    );
    assert_eq!(pairs(&stack, &port_a), vec![CIDR_A.to_string()]);
    let tags = json(&stack, &["router", "show", "r1"])["tags"].to_string();
    assert!(
        tags.contains(&route_tag(k, &CIDR_A.parse().expect("cidr"))),
        "{tags}"
    );

    // Listed once, named by the server of the next hop's port, with the create's addresses.
    let before = cloud.api_calls();
    let listed = r.list_routes(k).await.expect("list");
    let d = delta(&cloud, &before);
    eprintln!("list_routes, 1 route: {d:?} ({} calls)", total(&d));
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].target_node, "node-a");
    assert!(!listed[0].blackhole);
    assert!(listed[0].enable_node_addresses);
    assert_eq!(listed[0].target_node_addresses, internal("10.20.0.11"));

    // Create twice: still one route, no second add.
    let before = cloud.api_calls();
    r.create_route(k, "uid-a", &route("node-a", "10.20.0.11", CIDR_A))
        .await
        .expect("create again");
    let d = delta(&cloud, &before);
    eprintln!("create_route again: {d:?}");
    assert!(!d.contains_key("network PUT /v2.0/routers/{id}/add_extraroutes"));
    assert!(!d.contains_key("network PUT /v2.0/ports/{id}"));
    assert_eq!(router_routes(&stack, "r1").len(), 1);
    assert_eq!(r.list_routes(k).await.expect("list").len(), 1);

    // Another cluster sees none of it, and deleting through it touches nothing.
    assert_eq!(r.list_routes("other").await.expect("list other"), vec![]);
    r.delete_route("other", &listed[0])
        .await
        .expect("delete in other cluster");
    assert_eq!(router_routes(&stack, "r1").len(), 1);

    // A restarted CCM still lists the route and its Node, without addresses to compare.
    let fresh = stack.cloud_with("ccm-secret", &conf);
    let again = routes_of(&fresh).list_routes(k).await.expect("list");
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].target_node, "node-a");
    assert!(!again[0].enable_node_addresses && !again[0].blackhole);

    // Address change: the controller deletes the listed route and creates it with the Node's
    // new addresses: the next hop and the pair move to the port of the new InternalIP.
    let before = cloud.api_calls();
    r.delete_route(k, &listed[0]).await.expect("delete");
    let d = delta(&cloud, &before);
    eprintln!("delete_route: {d:?} ({} calls)", total(&d));
    r.create_route(k, "uid-a", &route("node-a", "10.20.0.21", CIDR_A))
        .await
        .expect("create at the new address");
    assert_eq!(
        router_routes(&stack, "r1"),
        vec![(CIDR_A.to_string(), "10.20.0.21".to_string())]
    );
    assert!(pairs(&stack, &port_a).is_empty());
    assert_eq!(pairs(&stack, &port_a2), vec![CIDR_A.to_string()]);
    let listed = r.list_routes(k).await.expect("list");
    assert_eq!(listed[0].target_node_addresses, internal("10.20.0.21"));

    // Delete, twice: gone from the router and the port; the second is a no-op.
    r.delete_route(k, &listed[0]).await.expect("delete");
    assert!(router_routes(&stack, "r1").is_empty());
    assert!(pairs(&stack, &port_a2).is_empty());
    r.delete_route(k, &listed[0]).await.expect("delete again");
    assert!(r.list_routes(k).await.expect("list").is_empty());

    // Blackhole: the server behind the next hop is deleted.
    r.create_route(k, "uid-b", &route("node-b", "10.20.0.12", CIDR_B))
        .await
        .expect("create b");
    assert_eq!(pairs(&stack, &port_b), vec![CIDR_B.to_string()]);
    stack.openstack(&["server", "delete", "--wait", &id_b]);
    let listed = r.list_routes(k).await.expect("list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(listed[0].blackhole, "{listed:?}");
    assert_eq!(listed[0].target_node, "10.20.0.12");
    r.delete_route(k, &listed[0])
        .await
        .expect("delete blackhole");
    assert!(router_routes(&stack, "r1").is_empty());

    // Errors, never an empty answer: a router that does not exist …
    let wrong = stack.cloud_with(
        "ccm-secret",
        "[Route]\nrouter-id = 00000000-0000-4000-8000-000000000000\n",
    );
    let w = routes_of(&wrong);
    let e = w.list_routes(k).await.expect_err("wrong router: list");
    assert!(e.to_string().contains("router-id"), "{e}");
    assert!(
        w.create_route(k, "x", &route("node-a", "10.20.0.11", CIDR_A))
            .await
            .is_err()
    );
    assert!(
        w.delete_route(k, &route("node-a", "10.20.0.11", CIDR_A))
            .await
            .is_err()
    );

    conformance(&stack, &net).await;
    // Octavia load balancers on the same stack (one stack start for CI).
    support::lb::scenario(&stack).await;
    support::lb::security_group_scenario(&stack).await;
    let (instances, nova_nodes) = support::nova::instances_scenario(&stack).await;

    // … and a Neutron that does not answer.
    r.create_route(k, "uid-a", &route("node-a", "10.20.0.11", CIDR_A))
        .await
        .expect("create");
    let pid = std::fs::read_to_string(stack.dir.join("neutron.gpid")).expect("neutron pid");
    let _ = Command::new("kill").arg(pid.trim()).status();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if r.list_routes(k).await.is_err() {
            break;
        }
        assert!(Instant::now() < deadline, "Neutron still answering");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        r.create_route(k, "x", &route("node-a", "10.20.0.11", CIDR_B))
            .await
            .is_err()
    );
    assert!(
        r.delete_route(k, &route("node-a", "10.20.0.11", CIDR_A))
            .await
            .is_err()
    );
    support::nova::nova_down(&stack, &instances, &nova_nodes).await;
    drop(stack);
    eprintln!("wall time: {:?}", t0.elapsed());
}

// ---- The conformance suite on the same stack ----

/// A stand-in OpenStack for the fault rules: `POST /v3/auth/tokens` gets a token whose catalog
/// puts compute and network here too, every other call the injected fault (500, 401, 429, a
/// 404 that is not Nova's, or no answer), so the faults reach the Nova and Neutron calls.
struct FaultServer {
    url: String,
    fault: Arc<Mutex<Fault>>,
}

impl FaultServer {
    async fn start() -> FaultServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let fault = Arc::new(Mutex::new(Fault::ServerError));
        let (f, base) = (fault.clone(), url.clone());
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let fault = *f.lock();
                let base = base.clone();
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut buf = [0u8; 16384];
                    let n = sock.read(&mut buf).await.unwrap_or(0);
                    let head = String::from_utf8_lossy(&buf[..n]).to_string();
                    let resp = if head.starts_with("POST /v3/auth/tokens") {
                        let ep = |t: &str| {
                            serde_json::json!({"type": t, "endpoints": [
                            {"interface": "public", "region_id": "RegionOne", "region": "RegionOne", "url": base}]})
                        };
                        let body = serde_json::json!({"token": {
                            "expires_at": "2099-01-01T00:00:00Z",
                            "catalog": [ep("compute"), ep("network"), ep("load-balancer")]}})
                        .to_string();
                        format!(
                            "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\nx-subject-token: injected\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        )
                    } else {
                        let (code, extra) = match fault {
                            Fault::ServerError => (500, ""),
                            Fault::Forbidden => (403, ""),
                            Fault::Throttle => (429, "retry-after: 1\r\n"),
                            Fault::NotFound => (404, ""),
                            Fault::Timeout | Fault::Latency(_) => {
                                tokio::time::sleep(Duration::from_secs(120)).await;
                                return;
                            }
                        };
                        let body = "{\"error\": \"injected by the conformance suite\"}";
                        format!(
                            "HTTP/1.1 {code} Injected\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        )
                    };
                    let _ = sock.write_all(resp.as_bytes()).await;
                });
            }
        });
        FaultServer { url, fault }
    }
}

/// The provider on the stack, or the same provider code pointed at the fault server.
struct Switching {
    normal: OpenStackCloud,
    faulty: OpenStackCloud,
    fault: AtomicBool,
}

impl Switching {
    fn now(&self) -> &OpenStackCloud {
        if self.fault.load(Ordering::SeqCst) {
            &self.faulty
        } else {
            &self.normal
        }
    }
    fn i(&self) -> Arc<dyn Instances> {
        self.now().instances().expect("openstack has Instances")
    }
    fn r(&self) -> Arc<dyn Routes> {
        self.now().routes().expect("[Route] router-id set")
    }
}

struct SwitchingProvider(Arc<Switching>);

#[async_trait]
impl CloudProvider for SwitchingProvider {
    fn provider_name(&self) -> &str {
        self.0.normal.provider_name()
    }
    fn instances(&self) -> Option<Arc<dyn Instances>> {
        Some(self.0.clone())
    }
    fn routes(&self) -> Option<Arc<dyn Routes>> {
        Some(self.0.clone())
    }
    fn load_balancer(&self) -> Option<Arc<dyn LoadBalancer>> {
        Some(self.0.clone())
    }
}

impl Switching {
    fn lb(&self) -> Arc<dyn LoadBalancer> {
        self.now().load_balancer().expect("[LoadBalancer] enabled")
    }
}

#[async_trait]
impl LoadBalancer for Switching {
    async fn get_load_balancer(
        &self,
        c: &str,
        s: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        self.lb().get_load_balancer(c, s).await
    }
    fn load_balancer_name(&self, c: &str, s: &Service) -> String {
        self.lb().load_balancer_name(c, s)
    }
    async fn ensure_load_balancer(
        &self,
        c: &str,
        s: &Service,
        n: &[std::sync::Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        self.lb().ensure_load_balancer(c, s, n).await
    }
    async fn update_load_balancer(
        &self,
        c: &str,
        s: &Service,
        n: &[std::sync::Arc<Node>],
    ) -> CloudResult<()> {
        self.lb().update_load_balancer(c, s, n).await
    }
    async fn ensure_load_balancer_deleted(&self, c: &str, s: &Service) -> CloudResult<()> {
        self.lb().ensure_load_balancer_deleted(c, s).await
    }
}

#[async_trait]
impl Instances for Switching {
    async fn instance_exists(&self, n: &Node) -> CloudResult<bool> {
        self.i().instance_exists(n).await
    }
    async fn instance_shutdown(&self, n: &Node) -> CloudResult<bool> {
        self.i().instance_shutdown(n).await
    }
    async fn instance_metadata(&self, n: &Node) -> CloudResult<Option<InstanceMetadata>> {
        self.i().instance_metadata(n).await
    }
    async fn instances_metadata(
        &self,
        n: &[Arc<Node>],
    ) -> Vec<CloudResult<Option<InstanceMetadata>>> {
        self.i().instances_metadata(n).await
    }
    async fn instances_status(&self, n: &[Arc<Node>]) -> Vec<CloudResult<InstanceStatus>> {
        self.i().instances_status(n).await
    }
    fn native_batching(&self) -> bool {
        self.normal.native_batching()
    }
    fn max_batch_size(&self) -> usize {
        self.normal.max_batch_size()
    }
}

#[async_trait]
impl Routes for Switching {
    async fn list_routes(&self, c: &str) -> CloudResult<Vec<Route>> {
        self.r().list_routes(c).await
    }
    async fn create_route(&self, c: &str, h: &str, r: &Route) -> CloudResult<()> {
        self.r().create_route(c, h, r).await
    }
    async fn delete_route(&self, c: &str, r: &Route) -> CloudResult<()> {
        self.r().delete_route(c, r).await
    }
}

struct OsHarness {
    provider: Arc<dyn CloudProvider>,
    switch: Arc<Switching>,
    faults: FaultServer,
    ks: String,
    /// Node name → server id.
    ids: Mutex<BTreeMap<String, String>>,
    next_ip: Mutex<u8>,
    serial: tokio::sync::Mutex<()>,
}

fn k8s_node(name: &str, ip: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: ip.into(),
            }]),
            ..Default::default()
        }),
    }
}

impl OsHarness {
    fn id(&self, node: &Node) -> HarnessResult<String> {
        self.ids
            .lock()
            .get(node_name(node))
            .cloned()
            .ok_or_else(|| HarnessError::Failed(format!("no server for {}", node_name(node))))
    }

    async fn os(&self, args: Vec<String>) -> HarnessResult<String> {
        let ks = self.ks.clone();
        tokio::task::spawn_blocking(move || {
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            support::openstack_at(&ks, &a)
        })
        .await
        .map_err(|e| HarnessError::Failed(e.to_string()))?
        .map_err(HarnessError::Failed)
    }

    async fn os_json(&self, args: &[&str]) -> HarnessResult<Vec<serde_json::Value>> {
        let mut a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        a.extend(["-f".into(), "json".into()]);
        let out = self.os(a).await?;
        serde_json::from_str(&out).map_err(|e| HarnessError::Failed(format!("{args:?}: {e}")))
    }

    async fn octavia_inventory(&self, cluster: &str) -> HarnessResult<Inventory> {
        let prefix = format!("kube_service_{cluster}_");
        let mut inv = Inventory::default();
        for lb in self.os_json(&["loadbalancer", "list"]).await? {
            let name = lb["name"].as_str().unwrap_or_default().to_string();
            let id = lb["id"].as_str().unwrap_or_default().to_string();
            if !name.starts_with(&prefix) {
                continue;
            }
            let mut ports: Vec<i32> = Vec::new();
            for l in self
                .os_json(&["loadbalancer", "listener", "list", "--loadbalancer", &id])
                .await?
            {
                ports.extend(
                    l["protocol_port"]
                        .as_i64()
                        .and_then(|p| i32::try_from(p).ok()),
                );
            }
            let mut hosts: Vec<String> = Vec::new();
            for p in self
                .os_json(&["loadbalancer", "pool", "list", "--loadbalancer", &id])
                .await?
            {
                let pool = p["id"].as_str().unwrap_or_default();
                for m in self
                    .os_json(&["loadbalancer", "member", "list", pool])
                    .await?
                {
                    hosts.extend(m["name"].as_str().map(str::to_string));
                }
            }
            ports.sort();
            hosts.sort();
            hosts.dedup();
            inv.load_balancers.push(LbRecord {
                name,
                service: None,
                service_uid: None,
                ports: Some(ports),
                hosts: Some(hosts),
            });
        }
        Ok(inv)
    }

    async fn wait(&self, id: &str, want: &str) -> HarnessResult<()> {
        for _ in 0..120 {
            let s = self
                .os(vec![
                    "server".into(),
                    "show".into(),
                    "-f".into(),
                    "value".into(),
                    "-c".into(),
                    "status".into(),
                    id.into(),
                ])
                .await?;
            if s == want {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Err(HarnessError::Failed(format!(
            "server {id} never reached {want}"
        )))
    }
}

#[async_trait]
impl Harness for OsHarness {
    fn provider(&self) -> Arc<dyn CloudProvider> {
        self.provider.clone()
    }

    /// A server (fake driver, no NIC) and a port on the router's network holding its
    /// InternalIP (`device_id` = the server).
    async fn create_instance(&self, name: &str) -> HarnessResult<Node> {
        let (name_c, ks) = (name.to_string(), self.ks.clone());
        // One cloud change at a time: Nova on sqlite fails builds that overlap other writes.
        let _one = self.serial.lock().await;
        let id = tokio::task::spawn_blocking(move || support::boot_at(&ks, &name_c))
            .await
            .map_err(|e| HarnessError::Failed(e.to_string()))?
            .map_err(HarnessError::Failed)?;
        let ip = {
            let mut n = self.next_ip.lock();
            *n += 1;
            format!("10.20.0.{}", *n)
        };
        self.os([
            "port",
            "create",
            "--network",
            "pods-net",
            "--fixed-ip",
            &format!("subnet=pods-sub,ip-address={ip}"),
            "--device",
            &id,
            "--device-owner",
            "compute:nova",
            &format!("{name}-port"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect())
            .await?;
        self.ids.lock().insert(name.to_string(), id);
        Ok(k8s_node(name, &ip))
    }

    async fn stop_instance(&self, node: &Node) -> HarnessResult<()> {
        let id = self.id(node)?;
        let _one = self.serial.lock().await;
        self.os(vec!["server".into(), "stop".into(), id.clone()])
            .await?;
        self.wait(&id, "SHUTOFF").await
    }

    async fn start_instance(&self, node: &Node) -> HarnessResult<()> {
        let id = self.id(node)?;
        let _one = self.serial.lock().await;
        self.os(vec!["server".into(), "start".into(), id.clone()])
            .await?;
        self.wait(&id, "ACTIVE").await
    }

    async fn terminate_instance(&self, node: &Node) -> HarnessResult<()> {
        let id = self.id(node)?;
        let _one = self.serial.lock().await;
        match self
            .os(vec!["server".into(), "delete".into(), "--wait".into(), id])
            .await
        {
            // The sweep terminates what the suite created, the already terminated included.
            Err(HarnessError::Failed(e)) if e.contains("No Server found") => Ok(()),
            r => r.map(drop),
        }
    }

    async fn inject(&self, fault: Fault) -> HarnessResult<()> {
        if let Fault::Latency(_) = fault {
            return Err(HarnessError::Unsupported(
                "the fault endpoint answers at once or never; it cannot be made slow".into(),
            ));
        }
        *self.faults.fault.lock() = fault;
        self.switch.fault.store(true, Ordering::SeqCst);
        Ok(())
    }

    async fn clear_faults(&self) {
        self.switch.fault.store(false, Ordering::SeqCst);
    }

    /// The cluster's Octavia LBs (by upstream's name prefix), their listener ports and member
    /// names, read with the `openstack` client. `None` when a read fails.
    async fn inventory(&self, cluster: &str) -> Option<Inventory> {
        match self.octavia_inventory(cluster).await {
            Ok(inv) => Some(inv),
            Err(e) => {
                eprintln!("inventory: {e}");
                None
            }
        }
    }

    async fn sweep(&self, cluster: &str) -> Vec<String> {
        let mut out = Vec::new();
        let r = self.switch.normal.routes().expect("routes");
        for c in [cluster.to_string(), format!("{cluster}-other")] {
            for route in r.list_routes(&c).await.unwrap_or_default() {
                if r.delete_route(&c, &route).await.is_ok() {
                    out.push(format!("route {} ({c})", route.destination_cidr));
                }
            }
        }
        for lb in self
            .octavia_inventory(cluster)
            .await
            .map(|i| i.load_balancers)
            .unwrap_or_default()
        {
            let args = ["loadbalancer", "delete", "--cascade", lb.name.as_str()];
            if self
                .os(args.iter().map(|s| s.to_string()).collect())
                .await
                .is_ok()
            {
                out.push(format!("load balancer {}", lb.name));
            }
        }
        out
    }

    /// Nova on the fake driver stops and deletes in a second or two.
    fn settle_timeout(&self) -> Duration {
        Duration::from_secs(30)
    }
}

async fn conformance(stack: &Stack, net: &Net) {
    let t = Instant::now();
    let faults = FaultServer::start().await;
    let conf = format!(
        "[Route]\nrouter-id = {}\n[LoadBalancer]\nsubnet-id = {}\n",
        net.router, net.subnet
    );
    let faulty = {
        let text = format!(
            "[Global]\nauth-url = {}/v3\nusername = ccm\npassword = x\ntenant-name = ccm\ndomain-id = default\nregion = RegionOne\n[Metadata]\nrequest-timeout = 3s\n{conf}",
            faults.url
        );
        let cfg = OpenStackConfig::parse(&text).expect("parses");
        OpenStackCloud::with_regional_provider_id(cfg, false).expect("provider")
    };
    let switch = Arc::new(Switching {
        normal: stack.cloud_with("ccm-secret", &conf),
        faulty,
        fault: AtomicBool::new(false),
    });
    let harness = OsHarness {
        provider: Arc::new(SwitchingProvider(switch.clone())),
        switch,
        faults,
        ks: stack.ks_url.clone(),
        ids: Mutex::new(BTreeMap::new()),
        next_ip: Mutex::new(100),
        serial: tokio::sync::Mutex::new(()),
    };
    let suite = Suite::new(Arc::new(harness), SuiteOptions::new(Level::Destructive));
    let report = suite.run().await;
    println!("{}", report.summary());
    eprintln!("conformance: {:?}", t.elapsed());
    assert!(report.passed(), "{}", report.summary());
    // Every rule runs, the load-balancer ones on the stack's Octavia.
    for c in &report.results {
        if let Outcome::NotRun { reason } = &c.outcome {
            eprintln!("NOT RUN {} ({}): {reason}", c.rule.id, c.case);
        }
        assert!(
            !matches!(c.outcome, Outcome::NotRun { .. }),
            "{} ({}) not run",
            c.rule.id,
            c.case
        );
    }
    for r in [
        &rules::ERROR_NEVER_GONE,
        &rules::INSTANCE_STOPPED,
        &rules::INSTANCE_TERMINATED,
        &rules::THROTTLED,
        &rules::ROUTE_CREATE_LISTED,
        &rules::ROUTES_ONLY_THIS_CLUSTER,
        &rules::ROUTE_CREATE_NO_DUPLICATE,
        &rules::ROUTE_DELETE_IDEMPOTENT,
        &rules::ROUTE_BLACKHOLE,
        &rules::LB_ENSURE_STATUS,
        &rules::LB_UPDATE_HOSTS,
        &rules::LB_DELETE_REMOVES,
        &rules::CANCEL_NOTHING_HALF_MADE,
    ] {
        assert!(
            report.of(r.id).any(|c| c.outcome == Outcome::Pass)
                && report.of(r.id).all(|c| c.outcome == Outcome::Pass),
            "{}: {}",
            r.id,
            report.summary()
        );
    }
}

/// A Neutron without `extraroute-atomic`: every routes call is an error naming it, and nothing
/// is written (no whole-list rewrite of the router's routes as a fallback). A stand-in Neutron
/// (Keystone token, catalog, an extensions list without the extension, a router with one route
/// of this cluster), no stack needed.
#[tokio::test]
async fn without_extraroute_atomic_routes_are_an_error_and_nothing_is_written() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let writes = Arc::new(Mutex::new(Vec::<String>::new()));
    let (w, b) = (writes.clone(), base.clone());
    let cidr: ipnet::IpNet = CIDR_A.parse().expect("cidr");
    let tag = route_tag("kubernetes", &cidr);
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let (w, b, tag) = (w.clone(), b.clone(), tag.clone());
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = [0u8; 16384];
                let n = sock.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                let line = head.lines().next().unwrap_or_default().to_string();
                let (code, extra, body) = if line.starts_with("POST /v3/auth/tokens") {
                    let body = serde_json::json!({"token": {"expires_at": "2099-01-01T00:00:00Z",
                        "catalog": [{"type": "network", "endpoints": [{"interface": "public",
                        "region_id": "RegionOne", "url": b}]}]}});
                    (201, "x-subject-token: t\r\n", body.to_string())
                } else if line.starts_with("GET /v2.0/extensions") {
                    let body = serde_json::json!({"extensions": [
                        {"alias": "extraroute"}, {"alias": "standard-attr-tag"},
                        {"alias": "allowed-address-pairs"}]});
                    (200, "", body.to_string())
                } else if line.starts_with("GET /v2.0/routers/") {
                    let body = serde_json::json!({"router": {"id": "r1", "tags": [tag],
                        "routes": [{"destination": CIDR_A, "nexthop": "10.20.0.11"}]}});
                    (200, "", body.to_string())
                } else {
                    w.lock().push(line);
                    (200, "", "{}".to_string())
                };
                let resp = format!(
                    "HTTP/1.1 {code} X\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(resp.as_bytes()).await;
            });
        }
    });
    let text = format!(
        "[Global]\nauth-url = {base}/v3\nusername = ccm\npassword = x\ntenant-name = ccm\ndomain-id = default\nregion = RegionOne\n[Route]\nrouter-id = r1\n"
    );
    let cloud = OpenStackCloud::with_regional_provider_id(
        OpenStackConfig::parse(&text).expect("parses"),
        false,
    )
    .expect("provider");
    let r = routes_of(&cloud);
    let k = "kubernetes";
    let e = r.list_routes(k).await.expect_err("list");
    assert!(e.to_string().contains("extraroute-atomic"), "{e}");
    let e = r
        .create_route(k, "u", &route("node-a", "10.20.0.12", CIDR_B))
        .await
        .expect_err("create");
    assert!(e.to_string().contains("extraroute-atomic"), "{e}");
    let e = r
        .delete_route(k, &route("node-a", "10.20.0.11", CIDR_A))
        .await
        .expect_err("delete");
    assert!(e.to_string().contains("extraroute-atomic"), "{e}");
    assert!(writes.lock().is_empty(), "writes: {:?}", writes.lock());
}
