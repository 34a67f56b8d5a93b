//! `--cloud-provider=metal` Routes with real packets: the real route controller on kube-sim
//! programs kernel routes through rtnetlink in a router namespace; a client namespace pings pod
//! addresses that live on dummy interfaces (veth pairs where the kernel has no dummy module)
//! in node namespaces. Needs root (network namespaces).
//!
//! The router also has a default route back to the client, as a real gateway has one upstream:
//! an address of the cluster CIDR without a pod route must hit ccm-rs's `unreachable` route,
//! not follow that default and loop.

mod support;

use std::process::Command;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use support::*;

const TABLE: u32 = 17219;
const PROTO: u8 = 75;

/// The test's namespaces (`metal-<id>-…`), deleted on drop even when the test fails.
struct Netns {
    id: u32,
}

impl Netns {
    fn name(&self, role: &str) -> String {
        format!("metal-{}-{role}", self.id)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for role in ["cl", "rt", "n1", "n2"] {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.name(role)])
                .status();
        }
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn in_ns(ns: &str, args: &[&str]) {
    let mut all = vec!["netns", "exec", ns];
    all.extend_from_slice(args);
    ip(&all);
}

fn ping(ns: &str, addr: &str) -> bool {
    Command::new("ip")
        .args(["netns", "exec", ns, "ping", "-c1", "-W1", "-n", "-q", addr])
        .output()
        .expect("run ping")
        .status
        .success()
}

fn table(ns: &str) -> String {
    let mut out = String::new();
    for family in ["-4", "-6"] {
        let o = Command::new("ip")
            .args([
                family,
                "-n",
                ns,
                "route",
                "show",
                "table",
                &TABLE.to_string(),
            ])
            .output()
            .expect("ip route show");
        out.push_str(&String::from_utf8_lossy(&o.stdout));
    }
    out
}

/// client ── router ── bridge ── node1, node2; pods on dummy interfaces in the nodes.
fn build(n: &Netns) {
    let (cl, rt) = (n.name("cl"), n.name("rt"));
    for role in ["cl", "rt", "n1", "n2"] {
        ip(&["netns", "add", &n.name(role)]);
        in_ns(&n.name(role), &["ip", "link", "set", "lo", "up"]);
    }
    let id = n.id;
    let (c, r) = (format!("mc{id}"), format!("mr{id}"));
    ip(&[
        "link", "add", &c, "netns", &cl, "type", "veth", "peer", "name", &r, "netns", &rt,
    ]);
    in_ns(&cl, &["ip", "addr", "add", "10.77.0.2/24", "dev", &c]);
    in_ns(
        &cl,
        &["ip", "addr", "add", "fd77::2/64", "dev", &c, "nodad"],
    );
    in_ns(&cl, &["ip", "link", "set", &c, "up"]);
    in_ns(&cl, &["ip", "route", "add", "default", "via", "10.77.0.1"]);
    in_ns(
        &cl,
        &["ip", "-6", "route", "add", "default", "via", "fd77::1"],
    );
    in_ns(&rt, &["ip", "addr", "add", "10.77.0.1/24", "dev", &r]);
    in_ns(
        &rt,
        &["ip", "addr", "add", "fd77::1/64", "dev", &r, "nodad"],
    );
    in_ns(&rt, &["ip", "link", "set", &r, "up"]);
    in_ns(&rt, &["ip", "link", "add", "br0", "type", "bridge"]);
    in_ns(&rt, &["ip", "addr", "add", "192.168.77.1/24", "dev", "br0"]);
    in_ns(
        &rt,
        &["ip", "addr", "add", "fd78::1/64", "dev", "br0", "nodad"],
    );
    in_ns(&rt, &["ip", "link", "set", "br0", "up"]);
    in_ns(&rt, &["ip", "route", "add", "default", "via", "10.77.0.2"]);
    in_ns(
        &rt,
        &["ip", "-6", "route", "add", "default", "via", "fd77::2"],
    );
    in_ns(&rt, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    in_ns(&rt, &["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]);
    // The operator's part: send pod traffic to ccm-rs's table.
    let t = TABLE.to_string();
    in_ns(
        &rt,
        &[
            "ip",
            "rule",
            "add",
            "to",
            "10.244.0.0/16",
            "lookup",
            &t,
            "pref",
            "100",
        ],
    );
    in_ns(
        &rt,
        &[
            "ip",
            "-6",
            "rule",
            "add",
            "to",
            "fd00:244::/56",
            "lookup",
            &t,
            "pref",
            "100",
        ],
    );
    for i in 1..=2 {
        let node = n.name(&format!("n{i}"));
        let (nv, bv) = (format!("n{i}v{id}"), format!("b{i}v{id}"));
        ip(&[
            "link", "add", &nv, "netns", &node, "type", "veth", "peer", "name", &bv, "netns", &rt,
        ]);
        in_ns(&rt, &["ip", "link", "set", &bv, "master", "br0", "up"]);
        in_ns(
            &node,
            &[
                "ip",
                "addr",
                "add",
                &format!("192.168.77.1{i}/24"),
                "dev",
                &nv,
            ],
        );
        in_ns(
            &node,
            &[
                "ip",
                "addr",
                "add",
                &format!("fd78::1{i}/64"),
                "dev",
                &nv,
                "nodad",
            ],
        );
        in_ns(&node, &["ip", "link", "set", &nv, "up"]);
        in_ns(
            &node,
            &["ip", "route", "add", "default", "via", "192.168.77.1"],
        );
        in_ns(
            &node,
            &["ip", "-6", "route", "add", "default", "via", "fd78::1"],
        );
        // The pod's interface. A dummy link when the kernel has the module, else one end of a
        // veth pair inside the node (as a CNI would give the pod).
        let dummy = Command::new("ip")
            .args([
                "netns", "exec", &node, "ip", "link", "add", "pod0", "type", "dummy",
            ])
            .output()
            .is_ok_and(|o| o.status.success());
        if !dummy {
            in_ns(
                &node,
                &[
                    "ip", "link", "add", "pod0", "type", "veth", "peer", "name", "pod0p",
                ],
            );
            in_ns(&node, &["ip", "link", "set", "pod0p", "up"]);
        }
        in_ns(
            &node,
            &[
                "ip",
                "addr",
                "add",
                &format!("10.244.{i}.10/32"),
                "dev",
                "pod0",
            ],
        );
        in_ns(
            &node,
            &[
                "ip",
                "addr",
                "add",
                &format!("fd00:244:0:{i}::10/128"),
                "dev",
                "pod0",
                "nodad",
            ],
        );
        in_ns(&node, &["ip", "link", "set", "pod0", "up"]);
    }
    // Someone else's routes in the same table (another protocol) and in the cluster CIDR.
    in_ns(
        &rt,
        &[
            "ip",
            "route",
            "add",
            "10.244.99.0/24",
            "via",
            "192.168.77.12",
            "table",
            &t,
            "proto",
            "static",
        ],
    );
    in_ns(
        &rt,
        &[
            "ip",
            "-6",
            "route",
            "add",
            "fd00:244:0:99::/64",
            "via",
            "fd78::12",
            "table",
            &t,
            "proto",
            "static",
        ],
    );
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// The route the router takes to `addr` (`ip route get`, through the rules).
fn route_get(ns: &str, addr: &str) -> String {
    let o = Command::new("ip")
        .args(["-n", ns, "route", "get", addr])
        .output()
        .expect("ip route get");
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Whether `ip route get` found an `unreachable` route (IPv4 reports it as an error).
fn refused(got: &str) -> bool {
    got.starts_with("unreachable") || got.contains("No route to host")
}

/// ccm-rs's unicast routes in the table (its `unreachable` guards excluded).
fn own_routes(ns: &str) -> Vec<String> {
    table(ns)
        .lines()
        .filter(|l| l.contains(&format!("proto {PROTO}")) && !l.starts_with("unreachable"))
        .map(str::to_string)
        .collect()
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

fn netns_or_skip() -> Option<Netns> {
    assert!(
        is_root(),
        "this test creates network namespaces and needs root (CI runs .ci/run as root)"
    );
    let probe = format!("metal-probe-{}", std::process::id());
    let ok = Command::new("ip")
        .args(["netns", "add", &probe])
        .status()
        .is_ok_and(|s| s.success());
    let _ = Command::new("ip").args(["netns", "del", &probe]).status();
    if !ok {
        eprintln!("SKIPPED: `ip netns add` is impossible here (no network namespaces)");
        return None;
    }
    Some(Netns {
        id: std::process::id() % 100_000,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_routes_carry_real_packets_and_go_with_the_node() {
    let Some(n) = netns_or_skip() else { return };
    build(&n);
    let (cl, rt) = (n.name("cl"), n.name("rt"));
    assert!(
        !ping(&cl, "10.244.1.10"),
        "no route yet: the pod must be unreachable"
    );

    let dir = TempDir::new("routes");
    let (_kube, kubeconfig, client) = kube_sim(&dir.0).await;
    let cloud_config = dir.0.join("metal.toml");
    std::fs::write(
        &cloud_config,
        format!(
            "[routes]\ntable = {TABLE}\nprotocol = {PROTO}\nnetns = \"/run/netns/{rt}\"\ncluster_cidrs = [\"10.244.0.0/16\", \"fd00:244::/56\"]\n\n[[machines]]\npattern = \"n*\"\n"
        ),
    )
    .expect("config");
    for i in 1..=2 {
        register_node(
            &client,
            &format!("n{i}"),
            &[&format!("10.244.{i}.0/24"), &format!("fd00:244:0:{i}::/64")],
            &[
                ("InternalIP", &format!("192.168.77.1{i}")),
                ("InternalIP", &format!("fd78::1{i}")),
            ],
        )
        .await;
    }
    let ccm = Ccm::start(
        &kubeconfig,
        &cloud_config,
        &[
            "--controllers=cloud-node,route",
            "--cluster-cidr=10.244.0.0/16,fd00:244::/56",
        ],
    )
    .await
    .expect("ccm starts");

    wait_for("routes for both nodes in the router's table", || async {
        let t = table(&rt);
        [
            "10.244.1.0/24 via 192.168.77.11",
            "10.244.2.0/24 via 192.168.77.12",
            "fd00:244:0:1::/64 via fd78::11",
            "fd00:244:0:2::/64 via fd78::12",
        ]
        .iter()
        .all(|r| t.contains(r))
    })
    .await;
    let t = table(&rt);
    assert!(t.contains(&format!("proto {PROTO}")), "{t}");
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

    // A pod network without a route is refused at the router, not sent up its default route.
    for addr in ["10.244.50.10", "fd00:244:0:50::10"] {
        let got = route_get(&rt, addr);
        assert!(
            refused(&got),
            "{addr} must hit the unreachable route of the cluster CIDR, got: {got}"
        );
    }

    // n2 moves to a new InternalIP: the route follows, and packets go by the new address only.
    let n2 = n.name("n2");
    let n2v = format!("n2v{}", n.id);
    in_ns(&n2, &["ip", "addr", "del", "192.168.77.12/24", "dev", &n2v]);
    in_ns(&n2, &["ip", "addr", "add", "192.168.77.22/24", "dev", &n2v]);
    in_ns(
        &n2,
        &["ip", "route", "replace", "default", "via", "192.168.77.1"],
    );
    set_addresses(
        &client,
        "n2",
        &[("InternalIP", "192.168.77.22"), ("InternalIP", "fd78::12")],
    )
    .await;
    wait_for("n2's IPv4 route moved to its new address", || async {
        table(&rt).contains("10.244.2.0/24 via 192.168.77.22")
    })
    .await;
    wait_for("ping n2's pod at its new next hop", || async {
        ping(&cl, "10.244.2.10")
    })
    .await;
    wait_for("n2's IPv6 route keeps its unchanged next hop", || async {
        table(&rt).contains("fd00:244:0:2::/64 via fd78::12")
    })
    .await;

    // Another tool's routes in the table (at n3's pod CIDRs) are never touched.
    let foreign_kept = |t: &str| {
        let kept = |prefix: &str| {
            t.lines()
                .any(|l| l.starts_with(prefix) && l.contains("proto static"))
        };
        kept("10.244.99.0/24 via 192.168.77.12") && kept("fd00:244:0:99::/64 via fd78::12")
    };
    Api::<Node>::all(client.clone())
        .delete("n1", &DeleteParams::default())
        .await
        .expect("delete n1");
    wait_for("n1's routes removed", || async {
        let t = table(&rt);
        !t.contains("10.244.1.0/24") && !t.contains("fd00:244:0:1::/64")
    })
    .await;
    assert!(
        !ping(&cl, "10.244.1.10"),
        "n1's pod is unreachable once n1 is gone"
    );
    assert!(!ping(&cl, "fd00:244:0:1::10"), "n1's IPv6 pod too");
    assert!(ping(&cl, "10.244.2.10"), "n2 still routed");
    let t = table(&rt);
    assert!(foreign_kept(&t), "foreign routes kept: {t}");

    // n3 joins with pod CIDRs where another tool already has routes (protocol static): the
    // controller's create is refused (a refused create backs the controller off, so last).
    register_node(
        &client,
        "n3",
        &["10.244.99.0/24", "fd00:244:0:99::/64"],
        &[("InternalIP", "192.168.77.13"), ("InternalIP", "fd78::13")],
    )
    .await;
    wait_for("the route controller reports n3's route", || async {
        Api::<Node>::all(client.clone())
            .get_status("n3")
            .await
            .ok()
            .and_then(|n| n.status?.conditions)
            .is_some_and(|c| c.iter().any(|c| c.type_ == "NetworkUnavailable"))
    })
    .await;
    let t = table(&rt);
    assert!(foreign_kept(&t), "foreign routes kept: {t}");
    assert!(
        !t.contains("192.168.77.13") && !t.contains("fd78::13"),
        "no route of ccm-rs for n3: {t}"
    );

    // The replica stops leading (SIGTERM): it leaves no next hop behind that nobody updates.
    ccm.stop().await;
    wait_for("ccm-rs's routes removed when leadership ends", || async {
        own_routes(&rt).is_empty()
    })
    .await;
    let t = table(&rt);
    assert!(foreign_kept(&t), "foreign routes kept after the term: {t}");
    assert!(
        refused(&route_get(&rt, "10.244.2.10")),
        "the cluster CIDR stays guarded: {t}"
    );
    assert!(!ping(&cl, "10.244.2.10"), "no stale route to n2's pod");
}
