//! `routes.mode = "bgp"` with a real routing daemon and real packets: ccm-rs (the real route
//! controller on kube-sim) runs its BIRD 2 speaker in a "host" namespace; a "router"
//! namespace runs BIRD 2 as the datacenter's router, learns the pod CIDRs over one BGP session
//! (IPv4 and IPv6 prefixes, multiprotocol) and installs them in its kernel; a "client" behind
//! the router pings pod addresses on dummy interfaces in "node" namespaces.
//!
//! Needs root (network namespaces) and BIRD 2 (`.ci/setup.d/45-bird.sh`). Timers are short
//! (hold 3 s, graceful-restart 4 s) so the test takes seconds.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Node, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointSlice};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use support::*;

struct Netns {
    id: u32,
    router: Option<std::process::Child>,
}

const ROLES: [&str; 6] = ["cl", "rt", "h1", "h2", "n1", "n2"];

impl Netns {
    fn name(&self, role: &str) -> String {
        format!("mbgp-{}-{role}", self.id)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Some(mut c) = self.router.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for role in ROLES {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.name(role)])
                .status();
        }
    }
}

fn run(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn ns(ns: &str, cmd: &str) {
    let mut args = vec!["ip", "netns", "exec", ns];
    args.extend(cmd.split_whitespace());
    run(&args);
}

fn ping(ns: &str, addr: &str) -> bool {
    Command::new("ip")
        .args(["netns", "exec", ns, "ping", "-c1", "-W1", "-n", "-q", addr])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn bird_bin(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// client ── router ── bridge ── host (ccm-rs's speaker), node1, node2.
fn build(n: &Netns) {
    for role in ROLES {
        run(&["ip", "netns", "add", &n.name(role)]);
        ns(&n.name(role), "ip link set lo up");
    }
    let (cl, rt, id) = (n.name("cl"), n.name("rt"), n.id);
    run(&[
        "ip",
        "link",
        "add",
        &format!("bc{id}"),
        "netns",
        &cl,
        "type",
        "veth",
        "peer",
        "name",
        &format!("br{id}"),
        "netns",
        &rt,
    ]);
    ns(&cl, &format!("ip addr add 10.79.0.2/24 dev bc{id}"));
    ns(&cl, &format!("ip addr add fd79:1::2/64 dev bc{id} nodad"));
    ns(&cl, &format!("ip link set bc{id} up"));
    ns(&cl, "ip route add default via 10.79.0.1");
    ns(&cl, "ip -6 route add default via fd79:1::1");
    ns(&rt, &format!("ip addr add 10.79.0.1/24 dev br{id}"));
    ns(&rt, &format!("ip addr add fd79:1::1/64 dev br{id} nodad"));
    ns(&rt, &format!("ip link set br{id} up"));
    ns(&rt, "ip link add br0 type bridge");
    ns(&rt, "ip addr add 192.168.79.1/24 dev br0");
    ns(&rt, "ip addr add 192.168.79.4/24 dev br0");
    ns(&rt, "ip addr add fd79::1/64 dev br0 nodad");
    ns(&rt, "ip link set br0 up");
    ns(&rt, "sysctl -qw net.ipv4.ip_forward=1");
    ns(&rt, "sysctl -qw net.ipv6.conf.all.forwarding=1");
    for (i, role) in ["h1", "h2", "n1", "n2"].iter().enumerate() {
        let host = n.name(role);
        let (hv, bv) = (format!("{role}v{id}"), format!("{role}b{id}"));
        run(&[
            "ip", "link", "add", &hv, "netns", &host, "type", "veth", "peer", "name", &bv, "netns",
            &rt,
        ]);
        ns(&rt, &format!("ip link set {bv} master br0 up"));
        let last = [2, 3, 11, 12][i];
        ns(&host, &format!("ip addr add 192.168.79.{last}/24 dev {hv}"));
        ns(
            &host,
            &format!("ip addr add fd79::{last}/64 dev {hv} nodad"),
        );
        ns(&host, &format!("ip link set {hv} up"));
        ns(&host, "ip route add default via 192.168.79.1");
        ns(&host, "ip -6 route add default via fd79::1");
        if let Some(k) = role.strip_prefix('n') {
            let dummy = Command::new("ip")
                .args([
                    "netns", "exec", &host, "ip", "link", "add", "pod0", "type", "dummy",
                ])
                .output()
                .is_ok_and(|o| o.status.success());
            if !dummy {
                ns(&host, "ip link add pod0 type veth peer name pod0p");
                ns(&host, "ip link set pod0p up");
            }
            ns(&host, &format!("ip addr add 10.244.{k}.10/32 dev pod0"));
            ns(
                &host,
                &format!("ip addr add fd00:244:0:{k}::10/128 dev pod0 nodad"),
            );
            ns(&host, "ip link set pod0 up");
        }
    }
}

/// The router's BIRD: learns from the host's speaker (AS 64512) into its kernel. A second
/// session on .4 expects AS 64999, so a speaker configured with another AS is refused there.
fn start_router(n: &mut Netns, dir: &Path) -> PathBuf {
    let conf = dir.join("router.conf");
    let sock = dir.join("router.ctl");
    std::fs::write(
        &conf,
        "router id 192.168.79.1;\nlog stderr all;\nprotocol device { scan time 5; }\n\
         protocol kernel { ipv4 { export all; }; }\nprotocol kernel { ipv6 { export all; }; }\n\
         protocol bgp host1 { local 192.168.79.1 as 64501; neighbor 192.168.79.2 as 64512; \
         hold time 3; graceful restart on; connect retry time 1; error wait time 1, 5; \
         ipv4 { import all; export none; }; ipv6 { import all; export none; }; }\n\
         protocol bgp host2 { local 192.168.79.1 as 64501; neighbor 192.168.79.3 as 64512; \
         hold time 3; graceful restart on; connect retry time 1; error wait time 1, 5; \
         ipv4 { import all; export none; }; ipv6 { import all; export none; }; }\n\
         protocol bgp wrongas { local 192.168.79.4 as 64501; neighbor 192.168.79.2 as 64999; \
         hold time 3; connect retry time 1; ipv4 { import all; export none; }; }\n",
    )
    .expect("router conf");
    let bird = bird_bin("bird").expect("bird");
    let check = Command::new(&bird)
        .arg("-p")
        .arg("-c")
        .arg(&conf)
        .output()
        .expect("bird -p");
    assert!(
        check.status.success(),
        "router config: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    let child = Command::new("ip")
        .args(["netns", "exec", &n.name("rt")])
        .arg(&bird)
        .args(["-f", "-c"])
        .arg(&conf)
        .arg("-s")
        .arg(&sock)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("router bird");
    n.router = Some(child);
    sock
}

fn birdc(sock: &Path, cmd: &str) -> String {
    let birdc = bird_bin("birdc").expect("birdc");
    let out = Command::new(birdc)
        .arg("-s")
        .arg(sock)
        .args(cmd.split_whitespace())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("birdc");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `prefix` is in the router's BGP table with next hop `via`.
fn learned(sock: &Path, prefix: &str, via: &str) -> bool {
    let out = birdc(sock, &format!("show route {prefix} all"));
    out.contains(prefix) && out.contains(&format!("BGP.next_hop: {via}"))
}

async fn set_addresses(client: &kube::Client, name: &str, addresses: &[(&str, &str)]) {
    let addrs: Vec<serde_json::Value> = addresses
        .iter()
        .map(|(t, a)| serde_json::json!({"type": t, "address": a}))
        .collect();
    Api::<Node>::all(client.clone())
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"addresses": addrs}})),
        )
        .await
        .expect("node addresses");
}

/// The CCM's `/metrics` text.
fn metrics(ccm: &Ccm) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &ccm.rt.registry.read()).expect("encode");
    out
}

fn preflight() -> bool {
    assert!(
        Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0"),
        "this test creates network namespaces and needs root (CI runs .ci/run as root)"
    );
    assert!(
        bird_bin("bird").is_some() && bird_bin("birdc").is_some(),
        "BIRD 2 not found (install it with .ci/setup.d/45-bird.sh)"
    );
    let probe = format!("mbgp-probe-{}", std::process::id());
    let ok = Command::new("ip")
        .args(["netns", "add", &probe])
        .status()
        .is_ok_and(|s| s.success());
    let _ = Command::new("ip").args(["netns", "del", &probe]).status();
    if !ok {
        eprintln!("SKIPPED: `ip netns add` is impossible here (no network namespaces)");
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_cidrs_announced_over_bgp_carry_real_packets() {
    if !preflight() {
        return;
    }
    let mut n = Netns {
        id: std::process::id() % 100_000,
        router: None,
    };
    build(&n);
    let dir = TempDir::new("bgp");
    let router = start_router(&mut n, &dir.0);
    let (cl, h1) = (n.name("cl"), n.name("h1"));

    let (_kube, kubeconfig, client) = kube_sim(&dir.0).await;
    for i in 1..=2 {
        register_node(
            &client,
            &format!("n{i}"),
            &[&format!("10.244.{i}.0/24"), &format!("fd00:244:0:{i}::/64")],
            &[
                ("InternalIP", &format!("192.168.79.1{i}")),
                ("InternalIP", &format!("fd79::1{i}")),
            ],
        )
        .await;
    }
    let cloud_config = dir.0.join("metal.toml");
    std::fs::write(
        &cloud_config,
        format!(
            "[routes]\nmode = \"bgp\"\nnetns = \"/run/netns/{h1}\"\n\n[routes.bgp]\nasn = 64512\n\
             router_id = \"192.168.79.2\"\nhold_time = 3\ngraceful_restart_time = 4\nrun_dir = \"{}\"\n\n\
             [[routes.bgp.peers]]\naddress = \"192.168.79.1\"\nasn = 64501\n\n\
             # The router answers on .4 expecting AS 64999: refused (wrong ASN).\n\
             [[routes.bgp.peers]]\naddress = \"192.168.79.4\"\nasn = 64501\n\n\
             # Nothing answers on .9 (unreachable peer).\n\
             [[routes.bgp.peers]]\naddress = \"192.168.79.9\"\nasn = 64501\n\n\
             [[machines]]\npattern = \"n*\"\n",
            dir.0.join("speaker").display()
        ),
    )
    .expect("config");
    let started = Instant::now();
    let ccm = Ccm::start(
        &kubeconfig,
        &cloud_config,
        &[
            "--controllers=route",
            "--cluster-cidr=10.244.0.0/16,fd00:244::/56",
        ],
    )
    .await
    .expect("ccm starts");

    wait_for("the router learns both nodes' pod CIDRs", || async {
        learned(&router, "10.244.1.0/24", "192.168.79.11")
            && learned(&router, "10.244.2.0/24", "192.168.79.12")
            && learned(&router, "fd00:244:0:1::/64", "fd79::11")
            && learned(&router, "fd00:244:0:2::/64", "fd79::12")
    })
    .await;
    eprintln!(
        "measured: routes at the router {:?} after the CCM started",
        started.elapsed()
    );
    for addr in [
        "10.244.1.10",
        "10.244.2.10",
        "fd00:244:0:1::10",
        "fd00:244:0:2::10",
    ] {
        wait_for(&format!("ping {addr} from the client"), || async {
            ping(&cl, addr)
        })
        .await;
    }

    // A Node joins: announced.
    register_node(
        &client,
        "n3",
        &["10.244.3.0/24"],
        &[("InternalIP", "192.168.79.13")],
    )
    .await;
    wait_for("n3's pod CIDR announced", || async {
        learned(&router, "10.244.3.0/24", "192.168.79.13")
    })
    .await;

    // n2 moves to a new InternalIP: the next hop moves, packets follow.
    let n2 = n.name("n2");
    let n2v = format!("n2v{}", n.id);
    ns(&n2, &format!("ip addr del 192.168.79.12/24 dev {n2v}"));
    ns(&n2, &format!("ip addr add 192.168.79.22/24 dev {n2v}"));
    ns(&n2, "ip route replace default via 192.168.79.1");
    set_addresses(
        &client,
        "n2",
        &[("InternalIP", "192.168.79.22"), ("InternalIP", "fd79::12")],
    )
    .await;
    wait_for("n2's next hop moved", || async {
        learned(&router, "10.244.2.0/24", "192.168.79.22")
    })
    .await;
    wait_for("ping n2's pod at the new next hop", || async {
        ping(&cl, "10.244.2.10")
    })
    .await;

    // A Node is deleted: withdrawn.
    Api::<Node>::all(client.clone())
        .delete("n1", &DeleteParams::default())
        .await
        .expect("delete n1");
    wait_for("n1's pod CIDRs withdrawn", || async {
        !birdc(&router, "show route").contains("10.244.1.0/24")
            && !birdc(&router, "show route").contains("fd00:244:0:1::/64")
    })
    .await;
    assert!(
        !ping(&cl, "10.244.1.10"),
        "n1's pod unreachable once n1 is gone"
    );
    assert!(ping(&cl, "10.244.2.10"), "n2 still reachable");

    // Bad peers: each gets a Warning naming the reason; the good session and routes stay.
    wait_for(
        "Warnings for the refused and the unreachable peer",
        || async {
            let events = Api::<Event>::namespaced(client.clone(), "kube-system")
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default();
            let texts: Vec<String> = events
                .iter()
                .filter(|e| e.reason.as_deref() == Some("BGPSessionDown"))
                .filter_map(|e| e.message.clone())
                .collect();
            texts.iter().any(|t| t.contains("192.168.79.4"))
                && texts.iter().any(|t| t.contains("192.168.79.9"))
        },
    )
    .await;
    assert!(learned(&router, "10.244.2.0/24", "192.168.79.22"));
    wait_for("metrics: sessions and announced prefixes", || async {
        let m = metrics(&ccm);
        m.contains("ccm_metal_bgp_session_up{peer=\"192.168.79.1\"} 1")
            && m.contains("ccm_metal_bgp_session_up{peer=\"192.168.79.4\"} 0")
            && m.contains("ccm_metal_bgp_session_up{peer=\"192.168.79.9\"} 0")
            && m.contains("ccm_metal_bgp_announced_prefixes{family=\"IPv4\"} 2")
            && m.contains("ccm_metal_bgp_announced_prefixes{family=\"IPv6\"} 1")
    })
    .await;
    assert!(
        birdc(&router, "show protocols host1").contains("Established"),
        "the good session stays up"
    );

    // The router resets the session: ccm-rs's speaker re-peers and re-announces.
    birdc(&router, "restart host1");
    tokio::time::sleep(Duration::from_millis(500)).await;
    wait_for(
        "re-announced after the router reset the session",
        || async {
            learned(&router, "10.244.2.0/24", "192.168.79.22")
                && learned(&router, "10.244.3.0/24", "192.168.79.13")
        },
    )
    .await;

    // SIGTERM: the speaker goes without a withdrawal; graceful restart keeps the routes at
    // the router (no ping lost) until its restart timer (4 s here) ends.
    let stopped = Instant::now();
    ccm.stop().await;
    let mut lost = 0;
    while stopped.elapsed() < Duration::from_secs(2) {
        if !ping(&cl, "10.244.2.10") {
            lost += 1;
        }
    }
    assert_eq!(lost, 0, "graceful restart keeps forwarding after SIGTERM");
    wait_for("stale routes flushed after the restart time", || async {
        !birdc(&router, "show route").contains("10.244.2.0/24")
    })
    .await;
    eprintln!(
        "measured: routes kept {:?} after SIGTERM (graceful_restart_time = 4 s)",
        stopped.elapsed()
    );
}

/// The router's BIRD for LoadBalancer addresses: an iBGP peer of the host's speaker (so the
/// pools' LOCAL_PREF reaches it), taking every path of a prefix (ADD-PATH `rx`) and
/// installing a prefix's paths as one multipath (ECMP) kernel route (`merge paths`).
fn start_ecmp_router(n: &mut Netns, dir: &Path) -> PathBuf {
    let conf = dir.join("router-ecmp.conf");
    let sock = dir.join("router-ecmp.ctl");
    std::fs::write(
        &conf,
        "router id 192.168.79.1;\nlog stderr all;\nprotocol device { scan time 5; }\n\
         protocol kernel { ipv4 { export all; }; merge paths on; }\n\
         protocol bgp host1 { local 192.168.79.1 as 64512; neighbor 192.168.79.2 as 64512; \
         direct; hold time 3; graceful restart on; connect retry time 1; error wait time 1, 5; \
         ipv4 { import all; export none; add paths rx; gateway direct; }; }\n",
    )
    .expect("router conf");
    let bird = bird_bin("bird").expect("bird");
    let check = Command::new(&bird)
        .arg("-p")
        .arg("-c")
        .arg(&conf)
        .output()
        .expect("bird -p");
    assert!(
        check.status.success(),
        "router config: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    let child = Command::new("ip")
        .args(["netns", "exec", &n.name("rt")])
        .arg(&bird)
        .args(["-f", "-c"])
        .arg(&conf)
        .arg("-s")
        .arg(&sock)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("router bird");
    n.router = Some(child);
    sock
}

fn lb_service(name: &str, policy: &str) -> Service {
    let mut svc = Service::default();
    svc.metadata.name = Some(name.into());
    svc.metadata.namespace = Some("default".into());
    svc.spec = Some(ServiceSpec {
        type_: Some("LoadBalancer".into()),
        external_traffic_policy: Some(policy.into()),
        selector: Some([("app".to_string(), name.to_string())].into()),
        ports: Some(vec![ServicePort {
            port: 80,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        ..Default::default()
    });
    svc
}

async fn ingress(api: &Api<Service>, name: &str) -> Option<String> {
    api.get(name)
        .await
        .ok()?
        .status?
        .load_balancer?
        .ingress?
        .into_iter()
        .find_map(|i| i.ip)
}

/// The EndpointSlice of Service `service` with one endpoint on `node` (the endpointslice
/// controller's job; kube-sim has none).
fn endpoint_slice(service: &str, node: &str, ready: bool) -> EndpointSlice {
    let mut s = EndpointSlice {
        address_type: "IPv4".into(),
        endpoints: Some(vec![Endpoint {
            addresses: vec!["10.244.9.10".into()],
            node_name: Some(node.into()),
            conditions: Some(EndpointConditions {
                ready: Some(ready),
                serving: Some(ready),
                terminating: Some(false),
            }),
            ..Default::default()
        }]),
        ..Default::default()
    };
    s.metadata.name = Some(format!("{service}-abcde"));
    s.metadata.namespace = Some("default".into());
    s.metadata.labels = Some(
        [(
            "kubernetes.io/service-name".to_string(),
            service.to_string(),
        )]
        .into(),
    );
    s
}

/// The router's kernel route to `vip` (`ip route show`), "" when it has none.
fn kernel_route(n: &Netns, vip: &str) -> String {
    let out = Command::new("ip")
        .args(["-n", &n.name("rt"), "route", "show", vip])
        .output()
        .expect("ip route");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Echo requests a node namespace has answered (`Icmp: InEchos` of its /proc/net/snmp).
fn echoes(ns: &str) -> u64 {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "cat", "/proc/net/snmp"])
        .output()
        .expect("snmp");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines().filter(|l| l.starts_with("Icmp:"));
    let (Some(head), Some(vals)) = (lines.next(), lines.next()) else {
        return 0;
    };
    head.split_whitespace()
        .zip(vals.split_whitespace())
        .find(|(k, _)| *k == "InEchos")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// Pings `vip` once from each client source address; returns how many were answered.
fn ping_from_sources(cl: &str, vip: &str, sources: &[String]) -> usize {
    sources
        .iter()
        .filter(|src| {
            Command::new("ip")
                .args([
                    "netns", "exec", cl, "ping", "-c1", "-W1", "-n", "-q", "-I", src, vip,
                ])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_balancer_addresses_over_bgp_reach_the_nodes_that_serve_them() {
    if !preflight() {
        return;
    }
    let mut n = Netns {
        id: std::process::id() % 100_000 + 2,
        router: None,
    };
    build(&n);
    let dir = TempDir::new("bgp-lb");
    let router = start_ecmp_router(&mut n, &dir.0);
    let (cl, h1, n1, n2) = (n.name("cl"), n.name("h1"), n.name("n1"), n.name("n2"));
    // Both nodes answer for both addresses of the pool (kube-proxy's job on a real node).
    for node in [&n1, &n2] {
        ns(node, "ip addr add 198.51.100.10/32 dev lo");
        ns(node, "ip addr add 198.51.100.11/32 dev lo");
    }
    // Several client addresses, so the router's multipath hash has flows to spread.
    let sources: Vec<String> = (20..36).map(|i| format!("10.79.0.{i}")).collect();
    for src in &sources {
        ns(&cl, &format!("ip addr add {src}/24 dev bc{}", n.id));
    }

    let (_kube, kubeconfig, client) = kube_sim(&dir.0).await;
    for i in 1..=2 {
        register_node(
            &client,
            &format!("n{i}"),
            &[],
            &[("InternalIP", &format!("192.168.79.1{i}"))],
        )
        .await;
        // Initialized, as the cloud-node controller (not run here) leaves a Node: an
        // uninitialized Node backs no load balancer.
        Api::<Node>::all(client.clone())
            .patch(
                &format!("n{i}"),
                &PatchParams::default(),
                &Patch::Merge(&serde_json::json!({"spec": {"taints": null}})),
            )
            .await
            .expect("initialize node");
    }
    let cloud_config = dir.0.join("metal.toml");
    std::fs::write(
        &cloud_config,
        format!(
            "[routes]\nmode = \"bgp\"\nnetns = \"/run/netns/{h1}\"\n\n[routes.bgp]\nasn = 64512\n\
             router_id = \"192.168.79.2\"\nhold_time = 3\ngraceful_restart_time = 30\nrun_dir = \"{}\"\n\
             announce_load_balancers = true\n\n\
             [[routes.bgp.peers]]\naddress = \"192.168.79.1\"\nasn = 64512\n\n\
             [[pools]]\nname = \"public\"\naddresses = [\"198.51.100.10-198.51.100.11\"]\n\
             bgp_communities = [\"64512:100\", \"4200000000:7:9\"]\nbgp_local_pref = 250\n\n\
             [[machines]]\npattern = \"n*\"\n",
            dir.0.join("speaker").display()
        ),
    )
    .expect("config");
    let ccm = Ccm::start(&kubeconfig, &cloud_config, &["--controllers=service"])
        .await
        .expect("ccm starts");
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();

    // Cluster policy: every node is a next hop; the router installs both (ECMP).
    services
        .create(&pp, &lb_service("web", "Cluster"))
        .await
        .expect("web");
    wait_for("web gets an address", || async {
        ingress(&services, "web").await.is_some()
    })
    .await;
    let web = ingress(&services, "web").await.unwrap_or_default();
    let web_net = format!("{web}/32");
    wait_for("the router learns web's address via both nodes", || async {
        learned(&router, &web_net, "192.168.79.11") && learned(&router, &web_net, "192.168.79.12")
    })
    .await;
    let attrs = birdc(&router, &format!("show route {web_net} all"));
    eprintln!("measured: router's view of {web_net}:\n{attrs}");
    assert!(attrs.contains("(64512,100)"), "pool community: {attrs}");
    assert!(
        attrs.contains("(4200000000, 7, 9)"),
        "pool large community: {attrs}"
    );
    assert!(
        attrs.contains("BGP.local_pref: 250"),
        "pool LOCAL_PREF: {attrs}"
    );
    wait_for("an ECMP kernel route on the router", || async {
        let r = kernel_route(&n, &web);
        r.contains("nexthop via 192.168.79.11") && r.contains("nexthop via 192.168.79.12")
    })
    .await;
    let before = (echoes(&n1), echoes(&n2));
    let answered = ping_from_sources(&cl, &web, &sources);
    let spread = (echoes(&n1) - before.0, echoes(&n2) - before.1);
    eprintln!(
        "measured: {answered}/{} pings to {web} answered; node n1 answered {}, n2 {}",
        sources.len(),
        spread.0,
        spread.1
    );
    assert_eq!(answered, sources.len(), "every client reaches the address");
    assert!(
        spread.0 > 0 && spread.1 > 0,
        "flows spread over both nodes: {spread:?}"
    );

    // Local policy: announced via the nodes with a ready endpoint only.
    services
        .create(&pp, &lb_service("local", "Local"))
        .await
        .expect("local");
    wait_for("local gets an address", || async {
        ingress(&services, "local").await.is_some()
    })
    .await;
    let local = ingress(&services, "local").await.unwrap_or_default();
    let local_net = format!("{local}/32");
    let m = metrics(&ccm);
    assert!(
        m.contains("ccm_metal_bgp_announced_load_balancer_addresses{family=\"IPv4\"} 1"),
        "no ready endpoint: local's address is not announced\n{m}"
    );
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    slices
        .create(&pp, &endpoint_slice("local", "n1", true))
        .await
        .expect("slice");
    wait_for("local's address via n1 only", || async {
        learned(&router, &local_net, "192.168.79.11")
            && !learned(&router, &local_net, "192.168.79.12")
    })
    .await;
    let before = echoes(&n2);
    assert_eq!(ping_from_sources(&cl, &local, &sources[..4]), 4);
    assert_eq!(echoes(&n2), before, "n2 has no endpoint: no packet for it");
    let moved = |node: &str, ready: bool| {
        let mut s = endpoint_slice("local", node, ready);
        s.metadata.resource_version = None;
        serde_json::to_value(s).expect("json")
    };
    slices
        .patch(
            "local-abcde",
            &PatchParams::default(),
            &Patch::Merge(moved("n2", true)),
        )
        .await
        .expect("move the endpoint");
    wait_for("local's address moved to n2", || async {
        learned(&router, &local_net, "192.168.79.12")
            && !learned(&router, &local_net, "192.168.79.11")
    })
    .await;
    wait_for("pings to local reach n2", || async {
        let before = echoes(&n2);
        ping_from_sources(&cl, &local, &sources[..1]) == 1 && echoes(&n2) > before
    })
    .await;
    wait_for("metrics: two addresses, three paths", || async {
        let m = metrics(&ccm);
        m.contains("ccm_metal_bgp_announced_load_balancer_addresses{family=\"IPv4\"} 2")
            && m.contains("ccm_metal_bgp_load_balancer_paths{family=\"IPv4\"} 3")
    })
    .await;
    slices
        .patch(
            "local-abcde",
            &PatchParams::default(),
            &Patch::Merge(moved("n2", false)),
        )
        .await
        .expect("endpoint not ready");
    wait_for("local's address withdrawn: no ready endpoint", || async {
        !birdc(&router, "show route").contains(&local_net)
    })
    .await;
    assert!(
        learned(&router, &web_net, "192.168.79.11"),
        "web's address stays"
    );

    // A new term (the CCM restarts; graceful restart keeps the routes at the router
    // meanwhile): the addresses the Services' statuses show are announced with the first
    // routes, so the new daemon's End-of-RIB flushes none of them: no ping lost. The new
    // term runs no service controller, so what the router has then comes from the term's
    // start alone.
    let web_addr: &'static str = Box::leak(web.clone().into_boxed_str());
    let pinger = Pinger::start(cl.clone(), web_addr);
    ccm.stop().await;
    let ccm = Ccm::start(
        &kubeconfig,
        &cloud_config,
        &["--controllers=route", "--cluster-cidr=10.244.0.0/16"],
    )
    .await
    .expect("ccm starts again");
    wait_for("the new term's session is up", || async {
        metrics(&ccm).contains("ccm_metal_bgp_session_up{peer=\"192.168.79.1\"} 1")
    })
    .await;
    wait_for("web's address via both nodes again", || async {
        learned(&router, &web_net, "192.168.79.11")
            && learned(&router, &web_net, "192.168.79.12")
            && !birdc(&router, &format!("show route {web_net} all")).contains("stale")
    })
    .await;
    assert_eq!(ping_from_sources(&cl, &web, &sources), sources.len());
    let (sent, lost) = pinger.stop();
    eprintln!("measured: CCM restart: {sent} pings to {web}, {lost} lost");
    assert_eq!(lost, 0, "the new term keeps web's address announced");
    ccm.stop().await;
    let ccm = Ccm::start(&kubeconfig, &cloud_config, &["--controllers=service"])
        .await
        .expect("ccm starts with the service controller");

    // The Service is deleted: its address is withdrawn.
    services
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete web");
    wait_for("web's address withdrawn", || async {
        !birdc(&router, "show route").contains(&web_net) && kernel_route(&n, &web).is_empty()
    })
    .await;
    assert_eq!(
        ping_from_sources(&cl, &web, &sources[..2]),
        0,
        "nothing routes to a deleted Service's address"
    );

    // A Service that stops being a LoadBalancer: withdrawn.
    slices
        .patch(
            "local-abcde",
            &PatchParams::default(),
            &Patch::Merge(moved("n1", true)),
        )
        .await
        .expect("endpoint ready on n1");
    wait_for("local's address via n1 again", || async {
        learned(&router, &local_net, "192.168.79.11")
    })
    .await;
    services
        .patch(
            "local",
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"spec": {"type": "ClusterIP", "externalTrafficPolicy": null}}),
            ),
        )
        .await
        .expect("local becomes ClusterIP");
    wait_for(
        "local's address withdrawn once it is no LoadBalancer",
        || async { !birdc(&router, "show route").contains(&local_net) },
    )
    .await;
    ccm.stop().await;
}

/// Options of a replica process (the manager's own flags).
#[derive(clap::Parser)]
struct ReplicaArgs {
    #[command(flatten)]
    options: ccm_manager::options::RunOptions,
}

/// Env var carrying a replica's flags (JSON list) to [`ha_replica`].
const REPLICA_ENV: &str = "METAL_BGP_REPLICA_ARGS";

/// Not a test: the body of a CCM replica process for
/// [`two_replicas_hand_the_announcements_over`], which runs this test binary again with
/// [`REPLICA_ENV`] set. Runs the manager until SIGTERM (or lost leadership), as `ccm` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a helper process of two_replicas_hand_the_announcements_over, not a test"]
async fn ha_replica() {
    use clap::Parser as _;
    let Ok(args) = std::env::var(REPLICA_ENV) else {
        return;
    };
    let argv: Vec<String> = serde_json::from_str(&args).expect("replica args");
    let validated = ReplicaArgs::try_parse_from(argv)
        .expect("replica flags")
        .options
        .validate()
        .expect("valid flags");
    ccm_manager::logging::init(2, ccm_manager::options::LogFormat::Text);
    let mut providers = ccm_cloud::ProviderRegistry::new();
    ccm_provider_metal::register(&mut providers).expect("register");
    let rt = ccm_manager::run::Runtime::default();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let on_term = shutdown.clone();
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        term.recv().await;
        on_term.cancel();
    });
    let exit = ccm_manager::run::run(validated, &providers, &rt, shutdown).await;
    eprintln!("replica exit: {exit:?}");
}

fn spawn_replica(kubeconfig: &Path, cloud_config: &Path) -> std::process::Child {
    let argv = serde_json::to_string(&[
        "ccm".to_string(),
        "--cloud-provider=metal".into(),
        format!("--cloud-config={}", cloud_config.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
        "--secure-port=0".into(),
        "--leader-elect=true".into(),
        "--leader-elect-lease-duration=4s".into(),
        "--leader-elect-renew-deadline=3s".into(),
        "--leader-elect-retry-period=500ms".into(),
        "--controllers=route".into(),
        "--cluster-cidr=10.244.0.0/16,fd00:244::/56".into(),
    ])
    .expect("json");
    Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "ha_replica",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(REPLICA_ENV, argv)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(replica_log(cloud_config))
        .spawn()
        .expect("replica")
}

/// A replica's stderr: appended to `$METAL_TEST_REPLICA_LOGS/<config name>.log` when that is
/// set (to see what a replica did), else dropped.
fn replica_log(cloud_config: &Path) -> std::process::Stdio {
    let Some(dir) = std::env::var_os("METAL_TEST_REPLICA_LOGS") else {
        return std::process::Stdio::null();
    };
    let name = cloud_config
        .file_stem()
        .unwrap_or_default()
        .to_string_lossy();
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(Path::new(&dir).join(format!("{name}.log")))
        .map(std::process::Stdio::from)
        .unwrap_or_else(|_| std::process::Stdio::null())
}

/// Pings `addr` from `ns` back to back until stopped; returns (sent, lost).
struct Pinger {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(u32, u32)>,
}

impl Pinger {
    fn start(ns: String, addr: &'static str) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut sent, mut lost) = (0, 0);
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                sent += 1;
                if !ping(&ns, addr) {
                    lost += 1;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            (sent, lost)
        });
        Pinger { stop, thread }
    }

    fn stop(self) -> (u32, u32) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().expect("pinger")
    }
}

fn replica_config(dir: &Path, n: &Netns, host: &str, last: u8) -> PathBuf {
    let path = dir.join(format!("{host}.toml"));
    std::fs::write(
        &path,
        format!(
            "[routes]\nmode = \"bgp\"\nnetns = \"/run/netns/{}\"\n\n[routes.bgp]\nasn = 64512\n\
             router_id = \"192.168.79.{last}\"\nhold_time = 3\ngraceful_restart_time = 30\nrun_dir = \"{}\"\n\n\
             [[routes.bgp.peers]]\naddress = \"192.168.79.1\"\nasn = 64501\n",
            n.name(host),
            dir.join(host).display()
        ),
    )
    .expect("replica config");
    path
}

fn established(router: &Path, proto: &str) -> bool {
    birdc(router, &format!("show protocols {proto}")).contains("Established")
}

/// Announced by `proto`'s session (the route's source in `show route all`).
fn learned_from(router: &Path, prefix: &str, proto: &str) -> bool {
    birdc(router, &format!("show route {prefix} all")).contains(&format!("[{proto} "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_hand_the_announcements_over() {
    if !preflight() {
        return;
    }
    let mut n = Netns {
        id: std::process::id() % 100_000 + 1,
        router: None,
    };
    build(&n);
    let dir = TempDir::new("bgp-ha");
    let router = start_router(&mut n, &dir.0);
    let cl = n.name("cl");
    let (_kube, kubeconfig, client) = kube_sim(&dir.0).await;
    for i in 1..=2 {
        register_node(
            &client,
            &format!("n{i}"),
            &[&format!("10.244.{i}.0/24")],
            &[("InternalIP", &format!("192.168.79.1{i}"))],
        )
        .await;
    }
    let (c1, c2) = (
        replica_config(&dir.0, &n, "h1", 2),
        replica_config(&dir.0, &n, "h2", 3),
    );
    let mut a = KillOnDrop(spawn_replica(&kubeconfig, &c1));
    wait_for("replica A leads and announces", || async {
        established(&router, "host1") && learned_from(&router, "10.244.2.0/24", "host1")
    })
    .await;
    let mut b = KillOnDrop(spawn_replica(&kubeconfig, &c2));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !established(&router, "host2"),
        "a standby has no session: only the leader announces"
    );
    wait_for("ping n1's pod", || async { ping(&cl, "10.244.1.10") }).await;

    // SIGTERM the leader A (a rolling update): its daemon goes without a withdrawal, the
    // router keeps A's routes (graceful restart) until B announces: no ping lost.
    let pinger = Pinger::start(cl.clone(), "10.244.2.10");
    let termed = Instant::now();
    run(&["kill", "-TERM", &a.0.id().to_string()]);
    wait_for("replica B leads and announces", || async {
        established(&router, "host2") && learned_from(&router, "10.244.2.0/24", "host2")
    })
    .await;
    let took = termed.elapsed();
    let _ = a.0.wait();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (sent, lost) = pinger.stop();
    eprintln!(
        "measured: SIGTERM of the leader → the other replica's routes at the router after {took:?}; pings: {sent} sent, {lost} lost"
    );
    assert_eq!(
        lost, 0,
        "graceful restart: no ping lost across a planned failover"
    );

    // A comes back as the standby; kill -9 the leader B: its daemon dies with it, the
    // standby takes the lease when it expires and announces.
    a = KillOnDrop(spawn_replica(&kubeconfig, &c1));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pinger = Pinger::start(cl.clone(), "10.244.1.10");
    let killed = Instant::now();
    b.0.kill().expect("kill -9");
    let _ = b.0.wait();
    wait_for("replica A leads again and announces", || async {
        established(&router, "host1") && learned_from(&router, "10.244.1.0/24", "host1")
    })
    .await;
    let took = killed.elapsed();
    let (sent, lost) = pinger.stop();
    eprintln!(
        "measured: kill -9 of the leader → the standby's routes at the router after {took:?}; pings during the failover: {sent} sent, {lost} lost"
    );
    wait_for("pings after the failover", || async {
        ping(&cl, "10.244.1.10") && ping(&cl, "10.244.2.10")
    })
    .await;
    drop(a);
}

/// A replica process killed (SIGKILL) when the test ends, pass or fail.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Every peer option ccm-rs renders, and LoadBalancer addresses with several next hops,
/// communities and LOCAL_PREF, is one BIRD 2 accepts (`bird -p` parses the config).
#[test]
fn every_peer_option_renders_a_config_bird_accepts() {
    let Some(bird) = bird_bin("bird") else {
        panic!("BIRD 2 not found (install it with .ci/setup.d/45-bird.sh)");
    };
    let config = ccm_provider_metal::MetalConfig::parse(
        "[routes]\nmode = \"bgp\"\n[routes.bgp]\nasn = 64512\nrouter_id = \"192.0.2.2\"\nhold_time = 30\n\
         graceful_restart_time = 300\nannounce_load_balancers = true\n\
         [[routes.bgp.peers]]\naddress = \"192.0.2.1\"\nasn = 64501\npassword = \"s3cret pw\"\nttl_security = true\n\
         [[routes.bgp.peers]]\naddress = \"2001:db8::1\"\nasn = 64512\nmultihop = 4\nhold_time = 0\nport = 1179\n\
         [[routes.bgp.peers]]\naddress = \"198.51.100.1\"\nasn = 4200000000\n",
    )
    .expect("config");
    let bgp = config.routes.and_then(|r| r.bgp).expect("bgp");
    let routes = std::collections::BTreeMap::from([
        (
            "10.244.1.0/24".parse().expect("net"),
            "192.0.2.11".parse().expect("ip"),
        ),
        (
            "fd00:244:0:1::/64".parse().expect("net"),
            "2001:db8::11".parse().expect("ip"),
        ),
    ]);
    use ccm_provider_metal::bgp::config::Community;
    use ccm_provider_metal::bgp::vips::VipRoute;
    let ip = |s: &str| s.parse::<std::net::IpAddr>().expect("ip");
    let vips = std::collections::BTreeMap::from([
        (
            "198.51.100.10/32".parse().expect("net"),
            VipRoute {
                next_hops: [ip("192.0.2.11"), ip("192.0.2.12")].into(),
                communities: vec![
                    Community::Standard(64512, 100),
                    Community::Large(4200000000, 1, 2),
                ],
                local_pref: Some(250),
            },
        ),
        (
            "2001:db8:1::10/128".parse().expect("net"),
            VipRoute {
                next_hops: [ip("2001:db8::11")].into(),
                communities: vec![],
                local_pref: None,
            },
        ),
    ]);
    let text = ccm_provider_metal::bgp::bird::render_all(&bgp, &routes, &vips);
    for want in [
        "graceful restart wait 10;",
        "add paths tx;",
        "protocol static ccm_lb4_192_0_2_11",
        "protocol static ccm_lb4_192_0_2_12",
        "protocol static ccm_lb6_2001_db8_0_0_0_0_0_11",
        "bgp_community.add((64512,100));",
        "bgp_large_community.add((4200000000,1,2));",
        "bgp_local_pref = 250;",
    ] {
        assert!(text.contains(want), "{want} missing:\n{text}");
    }
    let dir = TempDir::new("bird-parse");
    let conf = dir.0.join("bird.conf");
    std::fs::write(&conf, &text).expect("conf");
    let out = Command::new(bird)
        .arg("-p")
        .arg("-c")
        .arg(&conf)
        .output()
        .expect("bird -p");
    assert!(
        out.status.success(),
        "bird refused the rendered config: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
}
