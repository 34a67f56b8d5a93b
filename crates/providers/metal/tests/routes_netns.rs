//! `--cloud-provider=metal` Routes with real packets: the real route controller on kube-sim
//! programs kernel routes through rtnetlink in a router namespace; a client namespace pings pod
//! addresses that live on dummy interfaces (veth pairs where the kernel has no dummy module)
//! in node namespaces. Needs root (network namespaces).

mod support;

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_routes_carry_real_packets_and_go_with_the_node() {
    assert!(
        is_root(),
        "this test creates network namespaces and needs root (CI runs .ci/run as root)"
    );
    let n = Netns {
        id: std::process::id() % 100_000,
    };
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
            "[routes]\ntable = {TABLE}\nprotocol = {PROTO}\nnetns = \"/run/netns/{rt}\"\n\n[[machines]]\npattern = \"n*\"\n"
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
    assert!(
        t.contains(&format!("proto {PROTO}")) || t.contains("proto 75"),
        "{t}"
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
    let kept = |prefix: &str| {
        t.lines()
            .any(|l| l.starts_with(prefix) && l.contains("proto static"))
    };
    assert!(
        kept("10.244.99.0/24 via 192.168.77.12"),
        "foreign IPv4 route kept: {t}"
    );
    assert!(
        kept("fd00:244:0:99::/64 via fd78::12"),
        "foreign IPv6 route kept: {t}"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    ccm.stop().await;
}
