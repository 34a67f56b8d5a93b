//! The load-balancer scenario against the real Octavia of testenv/stack.sh (`octavia`), run on
//! the shared stack by tests/neutron.rs: Octavia's API and controller worker, amphora provider on
//! no-op compute/amphora drivers, VIP ports and floating IPs in the real Neutron; checked with the
//! real `openstack` client (python-octaviaclient).

use std::sync::Arc;
use std::time::Duration;

use ccm_cloud::k8s_openapi::api::core::v1::{NodeAddress, NodeStatus, ServicePort, ServiceSpec};
use ccm_cloud::{CloudError, CloudProvider, LoadBalancer, LoadBalancerStatus, Node, Service};
use ccm_provider_openstack::OpenStackCloud;
use serde_json::Value;

use super::{Stack, delta, total};

/// The cluster name of the scenario.
pub const CLUSTER: &str = "kubernetes";

/// A Node with one InternalIP, shared as the service controller hands Nodes to providers.
pub fn node(name: &str, ip: &str) -> Arc<Node> {
    let mut n = Node::default();
    n.metadata.name = Some(name.into());
    n.status = Some(NodeStatus {
        addresses: Some(vec![NodeAddress {
            type_: "InternalIP".into(),
            address: ip.into(),
        }]),
        ..Default::default()
    });
    Arc::new(n)
}

/// A LoadBalancer Service: (protocol, port, nodePort) per port, source ranges.
pub fn service(name: &str, ports: &[(&str, i32, i32)], ranges: &[&str]) -> Service {
    let mut s = Service::default();
    s.metadata.name = Some(name.into());
    s.metadata.namespace = Some("default".into());
    s.metadata.uid = Some(format!("uid-{name}"));
    s.spec = Some(ServiceSpec {
        type_: Some("LoadBalancer".into()),
        ports: Some(
            ports
                .iter()
                .map(|(proto, port, node_port)| ServicePort {
                    protocol: Some((*proto).into()),
                    port: *port,
                    node_port: Some(*node_port),
                    ..Default::default()
                })
                .collect(),
        ),
        load_balancer_source_ranges: (!ranges.is_empty())
            .then(|| ranges.iter().map(|r| r.to_string()).collect()),
        ..Default::default()
    });
    s
}

/// The floating IPs on the VIP port of `lb` (an `openstack loadbalancer show`).
fn floating_ips_on(stack: &Stack, lb: &Value) -> Value {
    let port = lb["vip_port_id"].as_str().expect("the LB's VIP port");
    json(stack, &["floating", "ip", "list", "--port", port])
}

fn json(stack: &Stack, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.extend(["-f", "json"]);
    serde_json::from_str(&stack.openstack(&a)).expect("json")
}

/// Runs `f` until it is not a [`CloudError::Retry`] (Octavia provisioning), at most 40 times.
async fn until_done<T, F, Fut>(mut f: F) -> Result<T, CloudError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, CloudError>>,
{
    for _ in 0..40 {
        match f().await {
            Err(CloudError::Retry { after, message }) => {
                eprintln!("retry: {message}");
                tokio::time::sleep(after.min(Duration::from_secs(2))).await;
            }
            other => return other,
        }
    }
    panic!("still provisioning after 40 tries");
}

fn ip_of(st: &LoadBalancerStatus) -> String {
    st.ingress.as_ref().expect("ingress")[0]
        .ip
        .clone()
        .expect("ip")
}

/// (name, protocol, port, allowed_cidrs) of the LB's listeners.
fn listeners(stack: &Stack, lb: &str) -> Vec<(String, String, i64, Vec<String>)> {
    let list = json(
        stack,
        &["loadbalancer", "listener", "list", "--loadbalancer", lb],
    );
    let mut out: Vec<_> = list
        .as_array()
        .expect("list")
        .iter()
        .map(|l| {
            let id = l["id"].as_str().expect("id");
            let full = json(stack, &["loadbalancer", "listener", "show", id]);
            let mut cidrs: Vec<String> = full["allowed_cidrs"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|c| c.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            cidrs.sort();
            (
                full["name"].as_str().expect("name").to_string(),
                full["protocol"].as_str().expect("protocol").to_string(),
                full["protocol_port"].as_i64().expect("port"),
                cidrs,
            )
        })
        .collect();
    out.sort();
    out
}

/// (address, port) of a pool's members.
fn members(stack: &Stack, pool: &str) -> Vec<(String, i64)> {
    let list = json(stack, &["loadbalancer", "member", "list", pool]);
    let mut out: Vec<_> = list
        .as_array()
        .expect("list")
        .iter()
        .map(|m| {
            (
                m["address"].as_str().expect("address").to_string(),
                m["protocol_port"].as_i64().expect("port"),
            )
        })
        .collect();
    out.sort();
    out
}

fn pools(stack: &Stack, lb: &str) -> Vec<(String, String)> {
    let list = json(
        stack,
        &["loadbalancer", "pool", "list", "--loadbalancer", lb],
    );
    let mut out: Vec<_> = list
        .as_array()
        .expect("list")
        .iter()
        .map(|p| {
            (
                p["name"].as_str().expect("name").to_string(),
                p["id"].as_str().expect("id").to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

fn lb_id(stack: &Stack, name: &str) -> String {
    json(stack, &["loadbalancer", "show", name])["id"]
        .as_str()
        .expect("id")
        .to_string()
}

/// Create, steady state, Node change, source ranges, port removal, adoption of an LB laid out
/// as upstream's, delete; prints the calls of each step.
pub async fn scenario(stack: &Stack) {
    let t0 = std::time::Instant::now();
    let public = stack.env("PUBLIC_NET_ID");
    let net = stack.openstack(&["network", "create", "-f", "value", "-c", "id", "lb-net"]);
    let subnet = stack.openstack(&[
        "subnet",
        "create",
        "--network",
        &net,
        "--subnet-range",
        "10.1.0.0/24",
        "-f",
        "value",
        "-c",
        "id",
        "lb-sub",
    ]);
    // Floating IPs reach the subnet through a router on the public network, as in a real cloud.
    let router = stack.openstack(&["router", "create", "-f", "value", "-c", "id", "lb-router"]);
    stack.openstack(&["router", "set", "--external-gateway", &public, &router]);
    stack.openstack(&["router", "add", "subnet", &router, &subnet]);
    let conf = format!(
        "[LoadBalancer]\nsubnet-id = {subnet}\nfloating-network-id = {public}\ncreate-monitor = true\n"
    );
    let cloud = stack.cloud_with("ccm-secret", &conf);
    let lbs = cloud.load_balancer().expect("load balancers");
    let (a, b, c) = (
        node("node-a", "10.1.0.11"),
        node("node-b", "10.1.0.12"),
        node("node-c", "10.1.0.13"),
    );
    let ab = [a.clone(), b.clone()];
    let ac = [a.clone(), c.clone()];

    // Create: one LB, a listener per port, pools, members = the nodes, monitors, a FIP.
    let web = service(
        "web",
        &[("TCP", 80, 30080), ("UDP", 53, 30053)],
        &["192.168.0.0/16", "10.0.0.0/8"],
    );
    let before = cloud.api_calls();
    let st = until_done(|| lbs.ensure_load_balancer(CLUSTER, &web, &ab))
        .await
        .expect("ensure");
    let create_calls = delta(&cloud, &before);
    eprintln!("create: {} calls {create_calls:?}", total(&create_calls));
    let name = "kube_service_kubernetes_default_web";
    let lb = json(stack, &["loadbalancer", "show", name]);
    assert_eq!(lb["provisioning_status"], "ACTIVE");
    let fips = floating_ips_on(stack, &lb);
    assert_eq!(fips.as_array().expect("list").len(), 1, "{fips}");
    assert_eq!(
        ip_of(&st),
        fips[0]["Floating IP Address"].as_str().expect("fip")
    );
    let ranges = vec!["10.0.0.0/8".to_string(), "192.168.0.0/16".to_string()];
    assert_eq!(
        listeners(stack, name),
        vec![
            (
                format!("listener_0_{name}"),
                "TCP".into(),
                80,
                ranges.clone()
            ),
            (
                format!("listener_1_{name}"),
                "UDP".into(),
                53,
                ranges.clone()
            ),
        ]
    );
    let web_pools = pools(stack, name);
    assert_eq!(
        web_pools.iter().map(|p| p.0.clone()).collect::<Vec<_>>(),
        vec![format!("pool_0_{name}"), format!("pool_1_{name}")]
    );
    assert_eq!(
        members(stack, &web_pools[0].1),
        vec![("10.1.0.11".into(), 30080), ("10.1.0.12".into(), 30080)]
    );
    let monitors = json(stack, &["loadbalancer", "healthmonitor", "list"]);
    assert_eq!(monitors.as_array().expect("list").len(), 2, "{monitors}");

    // Nothing changed: no write.
    let before = cloud.api_calls();
    until_done(|| lbs.ensure_load_balancer(CLUSTER, &web, &ab))
        .await
        .expect("ensure again");
    let steady = delta(&cloud, &before);
    eprintln!("steady ensure: {} calls {steady:?}", total(&steady));
    assert!(steady.keys().all(|k| k.contains(" GET ")), "{steady:?}");

    // Node change: one members listing and one batch update per pool.
    let before = cloud.api_calls();
    until_done(|| lbs.update_load_balancer(CLUSTER, &web, &ac))
        .await
        .expect("update");
    let update = delta(&cloud, &before);
    eprintln!("update: {} calls {update:?}", total(&update));
    assert_eq!(
        update.get("load-balancer GET /v2/lbaas/pools/{id}/members"),
        Some(&2)
    );
    assert_eq!(
        update.get("load-balancer PUT /v2/lbaas/pools/{id}/members"),
        Some(&2)
    );
    assert_eq!(
        members(stack, &web_pools[1].1),
        vec![("10.1.0.11".into(), 30053), ("10.1.0.13".into(), 30053)]
    );

    // A refused annotation on the existing LB: the ensure is an error naming it (the
    // controller's Warning Event), and the members still follow the Nodes.
    let mut refused = web.clone();
    refused.metadata.annotations = Some(
        [(
            "loadbalancer.openstack.org/default-tls-container-ref".to_string(),
            "https://barbican.example/v1/containers/x".to_string(),
        )]
        .into(),
    );
    let e = until_done(|| lbs.ensure_load_balancer(CLUSTER, &refused, &ab))
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("default-tls-container-ref"), "{e}");
    assert_eq!(
        members(stack, &web_pools[0].1),
        vec![("10.1.0.11".into(), 30080), ("10.1.0.12".into(), 30080)]
    );
    until_done(|| lbs.update_load_balancer(CLUSTER, &refused, &ac))
        .await
        .expect("members follow the Nodes despite the refused annotation");
    assert_eq!(
        members(stack, &web_pools[0].1),
        vec![("10.1.0.11".into(), 30080), ("10.1.0.13".into(), 30080)]
    );

    // Narrower source ranges: the listeners admit exactly the new set.
    let narrow = service(
        "web",
        &[("TCP", 80, 30080), ("UDP", 53, 30053)],
        &["10.0.0.0/8"],
    );
    until_done(|| lbs.ensure_load_balancer(CLUSTER, &narrow, &ac))
        .await
        .expect("narrow");
    let l = listeners(stack, name);
    assert!(
        l.iter().all(|x| x.3 == vec!["10.0.0.0/8".to_string()]),
        "{l:?}"
    );

    local_traffic_policy(stack, lbs.as_ref(), &cloud, name, &narrow, &ac).await;

    // A port dropped: its listener and pool go; the other stays as it was.
    let one = service("web", &[("TCP", 80, 30080)], &["10.0.0.0/8"]);
    until_done(|| lbs.ensure_load_balancer(CLUSTER, &one, &ac))
        .await
        .expect("one port");
    assert_eq!(listeners(stack, name).len(), 1);
    assert_eq!(pools(stack, name), vec![web_pools[0].clone()]);

    adopt_upstream_layout(stack, &subnet, lbs.as_ref(), &cloud, &ab).await;
    honoured_annotations(stack, lbs.as_ref(), &ab).await;
    class_and_ingress_hostname(stack, &subnet, &ab).await;

    // Delete: the LBs and their floating IPs are gone.
    for svc in [&one, &service("legacy", &[("TCP", 8080, 30100)], &[])] {
        let before = cloud.api_calls();
        until_done(|| lbs.ensure_load_balancer_deleted(CLUSTER, svc))
            .await
            .expect("delete");
        let d = delta(&cloud, &before);
        eprintln!("delete: {} calls {d:?}", total(&d));
    }
    let mut gone = false;
    for _ in 0..60 {
        let left = json(stack, &["loadbalancer", "list"]);
        if left.as_array().expect("list").is_empty() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(gone, "load balancers left after delete");
    let fips = json(stack, &["floating", "ip", "list"]);
    assert_eq!(fips.as_array().expect("list").len(), 0, "{fips}");
    assert_eq!(
        lbs.get_load_balancer(CLUSTER, &one).await.expect("get"),
        None
    );
    assert_eq!(
        lbs.ensure_load_balancer_deleted(CLUSTER, &one).await,
        Ok(()),
        "deleting what is gone is done"
    );
    eprintln!("load-balancer scenario: {:?}", t0.elapsed());
}

/// `externalTrafficPolicy: Local`: every pool's monitor becomes upstream's HTTP `GET /healthz`
/// and the members are probed on the `healthCheckNodePort` (Octavia 2.30 here, so the UDP pool
/// too); a second ensure writes nothing; back to `Cluster`, the traffic ports are probed again.
async fn local_traffic_policy(
    stack: &Stack,
    lbs: &dyn LoadBalancer,
    cloud: &OpenStackCloud,
    name: &str,
    svc: &Service,
    nodes: &[Arc<Node>],
) {
    let mut local = svc.clone();
    let spec = local.spec.as_mut().expect("spec");
    spec.external_traffic_policy = Some("Local".into());
    spec.health_check_node_port = Some(32000);
    until_done(|| lbs.ensure_load_balancer(CLUSTER, &local, nodes))
        .await
        .expect("externalTrafficPolicy Local");
    let ps = pools(stack, name);
    let http = ("HTTP".to_string(), Some("/healthz".to_string()));
    for (_, pool) in &ps {
        assert_eq!(monitor_of(stack, pool), http);
    }
    assert_eq!(member_monitor_ports(stack, &ps[0].1), vec![Some(32000); 2]);
    let before = cloud.api_calls();
    until_done(|| lbs.ensure_load_balancer(CLUSTER, &local, nodes))
        .await
        .expect("ensure again");
    let steady = delta(cloud, &before);
    assert!(steady.keys().all(|k| k.contains(" GET ")), "{steady:?}");

    until_done(|| lbs.ensure_load_balancer(CLUSTER, svc, nodes))
        .await
        .expect("back to Cluster");
    assert_eq!(monitor_of(stack, &ps[0].1), ("TCP".into(), None));
    assert_eq!(monitor_of(stack, &ps[1].1), ("UDP-CONNECT".into(), None));
    assert_eq!(member_monitor_ports(stack, &ps[0].1), vec![None; 2]);
}

/// (type, url_path) of a pool's health monitor.
fn monitor_of(stack: &Stack, pool: &str) -> (String, Option<String>) {
    let p = json(stack, &["loadbalancer", "pool", "show", pool]);
    let id = p["healthmonitor_id"].as_str().expect("a monitor");
    let m = json(stack, &["loadbalancer", "healthmonitor", "show", id]);
    let path = m["url_path"].as_str().filter(|s| !s.is_empty());
    (
        m["type"].as_str().expect("type").to_string(),
        path.map(str::to_string),
    )
}

/// The `monitor_port` of each of a pool's members.
fn member_monitor_ports(stack: &Stack, pool: &str) -> Vec<Option<i64>> {
    let list = json(stack, &["loadbalancer", "member", "list", pool]);
    list.as_array()
        .expect("list")
        .iter()
        .map(|m| {
            let id = m["id"].as_str().expect("id");
            json(stack, &["loadbalancer", "member", "show", pool, id])["monitor_port"].as_i64()
        })
        .collect()
}

/// An LB made as openstack-cloud-controller-manager makes it is adopted: same LB, listener
/// and pool, members brought to the nodes, nothing deleted.
async fn adopt_upstream_layout(
    stack: &Stack,
    subnet: &str,
    lbs: &dyn LoadBalancer,
    cloud: &OpenStackCloud,
    nodes: &[Arc<Node>],
) {
    let name = "kube_service_kubernetes_default_legacy";
    let id = stack.openstack(&[
        "loadbalancer",
        "create",
        "--name",
        name,
        "--vip-subnet-id",
        subnet,
        "--wait",
        "-f",
        "value",
        "-c",
        "id",
    ]);
    let listener = stack.openstack(&[
        "loadbalancer",
        "listener",
        "create",
        "--name",
        &format!("listener_0_{name}"),
        "--protocol",
        "TCP",
        "--protocol-port",
        "8080",
        "--wait",
        "-f",
        "value",
        "-c",
        "id",
        &id,
    ]);
    let pool = stack.openstack(&[
        "loadbalancer",
        "pool",
        "create",
        "--name",
        &format!("pool_0_{name}"),
        "--protocol",
        "TCP",
        "--lb-algorithm",
        "ROUND_ROBIN",
        "--listener",
        &listener,
        "--wait",
        "-f",
        "value",
        "-c",
        "id",
    ]);
    stack.openstack(&[
        "loadbalancer",
        "member",
        "create",
        "--address",
        "10.1.0.11",
        "--protocol-port",
        "30100",
        "--name",
        "node-a",
        "--wait",
        &pool,
    ]);
    let legacy = service("legacy", &[("TCP", 8080, 30100)], &[]);
    let before = cloud.api_calls();
    until_done(|| lbs.ensure_load_balancer(CLUSTER, &legacy, nodes))
        .await
        .expect("adopt");
    let d = delta(cloud, &before);
    eprintln!("adopt: {} calls {d:?}", total(&d));
    assert!(
        d.keys().all(|k| !k.contains("DELETE")
            && !k.contains("POST /v2/lbaas/loadbalancers")
            && !k.contains("POST /v2/lbaas/listeners")),
        "adoption recreated something: {d:?}"
    );
    assert_eq!(lb_id(stack, name), id);
    assert_eq!(
        pools(stack, name),
        vec![(format!("pool_0_{name}"), pool.clone())]
    );
    assert_eq!(
        members(stack, &pool),
        vec![("10.1.0.11".into(), 30100), ("10.1.0.12".into(), 30100)]
    );
}

/// `manage-security-groups = true` on the real Neutron: the Service's group admits exactly its
/// NodePorts (and health-check NodePort) from the members' subnet, sits on the member Nodes'
/// ports and on no other, loses a removed port's rule, and is gone after the delete; groups it
/// did not make stay where they are.
pub async fn security_group_scenario(stack: &Stack) {
    let t0 = std::time::Instant::now();
    let net = stack.openstack(&["network", "create", "-f", "value", "-c", "id", "sg-net"]);
    let subnet = stack.openstack(&[
        "subnet",
        "create",
        "--network",
        &net,
        "--subnet-range",
        "10.2.0.0/24",
        "-f",
        "value",
        "-c",
        "id",
        "sg-sub",
    ]);
    // The Nodes' ports: device ids stand for their servers (the providerIDs name them).
    let mut ports = Vec::new();
    for (i, dev) in ["a", "b", "c"].iter().enumerate() {
        let device = format!("00000000-0000-4000-8000-00000000000{i}");
        let id = stack.openstack(&[
            "port",
            "create",
            "--network",
            &net,
            "--fixed-ip",
            &format!("subnet={subnet},ip-address=10.2.0.1{i}"),
            "--device",
            &device,
            "--device-owner",
            "compute:nova",
            "-f",
            "value",
            "-c",
            "id",
            &format!("sg-port-{dev}"),
        ]);
        let mut n = node(&format!("sg-node-{dev}"), &format!("10.2.0.1{i}"));
        Arc::make_mut(&mut n).spec = Some(ccm_cloud::k8s_openapi::api::core::v1::NodeSpec {
            provider_id: Some(format!("openstack:///{device}")),
            ..Default::default()
        });
        ports.push((id, n));
    }
    // A group of the operator's on port a: never touched.
    let theirs = stack.openstack(&[
        "security",
        "group",
        "create",
        "-f",
        "value",
        "-c",
        "id",
        "operators-own",
    ]);
    stack.openstack(&["port", "set", "--security-group", &theirs, &ports[0].0]);
    let conf = format!("[LoadBalancer]\nsubnet-id = {subnet}\nmanage-security-groups = true\n");
    let cloud = stack.cloud_with("ccm-secret", &conf);
    let lbs = cloud.load_balancer().expect("load balancers");
    let groups_of = |port: &str| -> Vec<String> {
        let v = json(stack, &["port", "show", port]);
        let mut g: Vec<String> = v["security_group_ids"]
            .as_array()
            .expect("groups")
            .iter()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect();
        g.sort();
        g
    };
    let tags_of = |port: &str| -> Vec<String> {
        let v = json(stack, &["port", "show", port]);
        v["tags"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    // (direction, ethertype, protocol, remote prefix, min port, max port) of the group's rules.
    let rules_of = |sg: &str| -> Vec<String> {
        let list = json(stack, &["security", "group", "rule", "list", "--long", sg]);
        let mut out: Vec<String> = list
            .as_array()
            .expect("rules")
            .iter()
            .map(|r| {
                format!(
                    "{} {} {} {} {}",
                    r["Direction"].as_str().unwrap_or("-"),
                    r["Ethertype"].as_str().unwrap_or("-"),
                    r["IP Protocol"].as_str().unwrap_or("any"),
                    r["IP Range"].as_str().unwrap_or("-"),
                    r["Port Range"].as_str().unwrap_or("-"),
                )
            })
            .collect();
        out.sort();
        out
    };
    let default_of_a = groups_of(&ports[0].0);

    let mut svc = service("sgweb", &[("TCP", 80, 30080), ("UDP", 53, 30053)], &[]);
    if let Some(s) = svc.spec.as_mut() {
        s.health_check_node_port = Some(32000);
        s.external_traffic_policy = Some("Local".into());
    }
    let ab = [ports[0].1.clone(), ports[1].1.clone()];
    let before = cloud.api_calls();
    until_done(|| lbs.ensure_load_balancer(CLUSTER, &svc, &ab))
        .await
        .expect("ensure");
    let d = delta(&cloud, &before);
    eprintln!("create with security group: {} calls {d:?}", total(&d));
    let sg_name = "lb-sg-uid-sgweb-default-sgweb";
    let sg = json(stack, &["security", "group", "show", sg_name]);
    assert_eq!(
        sg["description"],
        "Security Group for default/sgweb Service LoadBalancer in cluster kubernetes"
    );
    let sg = sg["id"].as_str().expect("id").to_string();
    assert_eq!(
        rules_of(&sg),
        vec![
            "ingress IPv4 tcp 10.2.0.0/24 30080:30080".to_string(),
            "ingress IPv4 tcp 10.2.0.0/24 32000:32000".to_string(),
            "ingress IPv4 udp 10.2.0.0/24 30053:30053".to_string(),
        ],
        "exactly the NodePorts and the health-check NodePort, from the members' subnet"
    );
    let mut want_a = default_of_a.clone();
    want_a.push(sg.clone());
    want_a.sort();
    assert_eq!(groups_of(&ports[0].0), want_a);
    assert!(groups_of(&ports[1].0).contains(&sg));
    assert!(!groups_of(&ports[2].0).contains(&sg));
    assert_eq!(tags_of(&ports[1].0), vec![sg.clone()]);

    // A steady ensure writes nothing.
    let before = cloud.api_calls();
    until_done(|| lbs.ensure_load_balancer(CLUSTER, &svc, &ab))
        .await
        .expect("steady");
    let d = delta(&cloud, &before);
    eprintln!(
        "steady ensure with security group: {} calls {d:?}",
        total(&d)
    );
    assert!(d.keys().all(|k| k.contains(" GET ")), "{d:?}");

    // Node b leaves, c joins (the Node-change update): the group follows the members.
    let ac = [ports[0].1.clone(), ports[2].1.clone()];
    until_done(|| lbs.update_load_balancer(CLUSTER, &svc, &ac))
        .await
        .expect("update");
    assert!(!groups_of(&ports[1].0).contains(&sg));
    assert!(tags_of(&ports[1].0).is_empty());
    assert!(groups_of(&ports[2].0).contains(&sg));

    // The UDP port and the health-check NodePort go: their rules are revoked.
    let mut one = service("sgweb", &[("TCP", 80, 30080)], &[]);
    one.metadata.uid = svc.metadata.uid.clone();
    until_done(|| lbs.ensure_load_balancer(CLUSTER, &one, &ac))
        .await
        .expect("one port");
    assert_eq!(
        rules_of(&sg),
        vec!["ingress IPv4 tcp 10.2.0.0/24 30080:30080".to_string()]
    );

    // Delete: no LB, no group, the ports as they were; the operator's group untouched.
    until_done(|| lbs.ensure_load_balancer_deleted(CLUSTER, &one))
        .await
        .expect("delete");
    let groups = json(stack, &["security", "group", "list"]);
    let names: Vec<&str> = groups
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|g| g["Name"].as_str())
        .collect();
    assert!(!names.contains(&sg_name), "{names:?}");
    assert!(names.contains(&"operators-own"), "{names:?}");
    assert_eq!(groups_of(&ports[0].0), default_of_a);
    assert!(groups_of(&ports[0].0).contains(&theirs));
    for (p, _) in &ports {
        assert!(tags_of(p).is_empty(), "{p}: {:?}", tags_of(p));
    }
    assert_eq!(
        lbs.ensure_load_balancer_deleted(CLUSTER, &one).await,
        Ok(()),
        "deleting what is gone is done"
    );
    eprintln!("security-group scenario: {:?}", t0.elapsed());
}

/// `x-forwarded-for`, `hostname` and `floating-subnet` on the real Octavia and Neutron: an
/// HTTP listener adding the header (and back to TCP when the annotation goes), the hostname as
/// the ingress, the floating IP from the subnet the pattern names — and none when no subnet
/// matches.
async fn honoured_annotations(stack: &Stack, lbs: &dyn LoadBalancer, nodes: &[Arc<Node>]) {
    let with = |anns: &[(&str, &str)]| {
        let mut s = service("xff", &[("TCP", 8080, 30180)], &[]);
        s.metadata.annotations = Some(
            anns.iter()
                .map(|(k, v)| (format!("loadbalancer.openstack.org/{k}"), v.to_string()))
                .collect(),
        );
        s
    };
    let xff = with(&[
        ("x-forwarded-for", "true"),
        ("hostname", "xff.example.com"),
        ("floating-subnet", "public-*"),
    ]);
    let st = until_done(|| lbs.ensure_load_balancer(CLUSTER, &xff, nodes))
        .await
        .expect("x-forwarded-for");
    let ing = &st.ingress.expect("ingress")[0];
    assert_eq!(
        (ing.hostname.as_deref(), ing.ip.as_deref()),
        (Some("xff.example.com"), None)
    );
    let name = "kube_service_kubernetes_default_xff";
    let listener = |stack: &Stack| {
        let l = json(
            stack,
            &["loadbalancer", "listener", "list", "--loadbalancer", name],
        );
        let id = l[0]["id"].as_str().expect("id").to_string();
        json(stack, &["loadbalancer", "listener", "show", &id])
    };
    let l = listener(stack);
    assert_eq!(l["protocol"], "HTTP", "{l}");
    assert_eq!(l["insert_headers"]["X-Forwarded-For"], "true", "{l}");
    let fips = floating_ips_on(stack, &json(stack, &["loadbalancer", "show", name]));
    assert_eq!(fips.as_array().expect("list").len(), 1, "{fips}");

    // The annotation goes: the listener is TCP again.
    let plain = with(&[("hostname", "xff.example.com")]);
    until_done(|| lbs.ensure_load_balancer(CLUSTER, &plain, nodes))
        .await
        .expect("back to TCP");
    let l = listener(stack);
    assert_eq!(l["protocol"], "TCP", "{l}");
    until_done(|| lbs.ensure_load_balancer_deleted(CLUSTER, &plain))
        .await
        .expect("delete");

    // No subnet of the floating network matches: an error naming it, no floating IP.
    let mut nosub = service("nosub", &[("TCP", 8081, 30181)], &[]);
    nosub.metadata.annotations = Some(
        [(
            "loadbalancer.openstack.org/floating-subnet".to_string(),
            "nomatch-*".to_string(),
        )]
        .into(),
    );
    let e = until_done(|| lbs.ensure_load_balancer(CLUSTER, &nosub, nodes))
        .await
        .expect_err("no matching subnet");
    assert!(e.to_string().contains("floating-subnet"), "{e}");
    let lb = json(
        stack,
        &[
            "loadbalancer",
            "show",
            "kube_service_kubernetes_default_nosub",
        ],
    );
    let fips = floating_ips_on(stack, &lb);
    assert_eq!(fips.as_array().expect("list").len(), 0, "{fips}");
    until_done(|| lbs.ensure_load_balancer_deleted(CLUSTER, &nosub))
        .await
        .expect("delete");
}

/// `[LoadBalancerClass "internet"]` with the floating network (none in `[LoadBalancer]`) and
/// `enable-ingress-hostname`: a Service of that class with `proxy-protocol` gets a floating IP
/// from the class's network and the ingress hostname `<floating IP>.nip.io`.
async fn class_and_ingress_hostname(stack: &Stack, subnet: &str, nodes: &[Arc<Node>]) {
    let public = stack.env("PUBLIC_NET_ID");
    let conf = format!(
        "[LoadBalancer]\nsubnet-id = {subnet}\nenable-ingress-hostname = true\n[LoadBalancerClass \"internet\"]\nfloating-network-id = {public}\n"
    );
    let cloud = stack.cloud_with("ccm-secret", &conf);
    let lbs = cloud.load_balancer().expect("load balancers");
    let mut svc = service("cls", &[("TCP", 8082, 30182)], &[]);
    svc.metadata.annotations = Some(
        [
            ("loadbalancer.openstack.org/class", "internet"),
            ("loadbalancer.openstack.org/proxy-protocol", "true"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    );
    let st = until_done(|| lbs.ensure_load_balancer(CLUSTER, &svc, nodes))
        .await
        .expect("class");
    let lb = json(
        stack,
        &[
            "loadbalancer",
            "show",
            "kube_service_kubernetes_default_cls",
        ],
    );
    let fips = floating_ips_on(stack, &lb);
    let fip = fips[0]["Floating IP Address"]
        .as_str()
        .expect("a floating IP from the class's network");
    assert_eq!(
        st.ingress.expect("ingress")[0].hostname.as_deref(),
        Some(format!("{fip}.nip.io").as_str())
    );
    until_done(|| lbs.ensure_load_balancer_deleted(CLUSTER, &svc))
        .await
        .expect("delete");
}
