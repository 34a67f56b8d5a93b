//! A BMC that goes silent — its packets dropped, no RST, no ICMP — times out within the
//! configured bound and is an error, never "gone"; when it answers again, lookups work again.
//! sushy-tools runs in a "bmc" network namespace, the Redfish client on a thread in a "client"
//! namespace, a veth pair between them; silence is a blackhole route for the client's address
//! in the BMC's namespace (every reply vanishes). Needs root (network namespaces).

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use ccm_provider_metal::MetalConfig;
use ccm_provider_metal::redfish::{BmcError, Power, Redfish};
use support::*;

const UUID: &str = "5e5e5e5e-0000-4000-8000-00000000005e";
const TIMEOUT_MS: u64 = 1500;

struct Netns(u32);

impl Netns {
    fn name(&self, role: &str) -> String {
        format!("mbmc-{}-{role}", self.0)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for role in ["cl", "bmc"] {
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

fn setup(ns: &Netns) {
    let (cl, bmc) = (ns.name("cl"), ns.name("bmc"));
    ip(&["netns", "add", &cl]);
    ip(&["netns", "add", &bmc]);
    let (a, b) = (
        format!("mbc{}", ns.0 % 100_000),
        format!("mbb{}", ns.0 % 100_000),
    );
    ip(&[
        "-n", &cl, "link", "add", &a, "type", "veth", "peer", "name", &b, "netns", &bmc,
    ]);
    ip(&["-n", &cl, "addr", "add", "10.213.0.1/30", "dev", &a]);
    ip(&["-n", &bmc, "addr", "add", "10.213.0.2/30", "dev", &b]);
    for (n, dev) in [(&cl, &a), (&bmc, &b)] {
        ip(&["-n", n, "link", "set", dev, "up"]);
        ip(&["-n", n, "link", "set", "lo", "up"]);
    }
}

/// Runs `f` on a new thread whose network namespace is `ns`, with its own tokio runtime, so
/// every socket the Redfish client opens lives there.
fn in_netns<T: Send + 'static>(
    ns: String,
    f: impl FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = T>>> + Send + 'static,
) -> T {
    std::thread::spawn(move || {
        let file = std::fs::File::open(format!("/run/netns/{ns}")).expect("netns file");
        nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(f())
    })
    .join()
    .expect("client thread")
}

#[test]
fn a_silent_bmc_times_out_within_the_bound_and_keeps_the_node() {
    let ns = Netns(std::process::id());
    setup(&ns);
    let exec = ["ip", "netns", "exec", &ns.name("bmc")];
    let sushy = Sushy::start_cmd(
        &[("System.Embedded.1", UUID, "On")],
        None,
        None,
        "10.213.0.2",
        8000,
        &exec,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let config = format!(
        "[bmc]\ntimeout_ms = {TIMEOUT_MS}\n[[machines]]\nname = \"node-a\"\n[machines.bmc]\nendpoint = \"{}\"\n",
        sushy.endpoint
    );
    let (bmc_ns, cl) = (ns.name("bmc"), ns.name("cl"));
    let results = in_netns(cl, move || {
        Box::pin(async move {
            let cfg = MetalConfig::parse(&config).expect("config");
            let bmc = cfg
                .machine("node-a")
                .and_then(|m| m.bmc.clone())
                .expect("bmc");
            let redfish = Redfish::new(cfg.bmc_concurrency, cfg.bmc_timeout);
            let before = redfish.power(&bmc, "node-a").await;
            // Silence: the BMC's replies to the client vanish (pooled connection and new ones).
            ip(&["-n", &bmc_ns, "route", "add", "blackhole", "10.213.0.1/32"]);
            let started = Instant::now();
            let pooled = redfish.power(&bmc, "node-a").await;
            let pooled_took = started.elapsed();
            let fresh_client = Redfish::new(cfg.bmc_concurrency, cfg.bmc_timeout);
            let started = Instant::now();
            let fresh = fresh_client.power(&bmc, "node-a").await;
            let fresh_took = started.elapsed();
            ip(&["-n", &bmc_ns, "route", "del", "blackhole", "10.213.0.1/32"]);
            let after = Redfish::new(1, Duration::from_secs(10))
                .power(&bmc, "node-a")
                .await;
            (before, (pooled, pooled_took), (fresh, fresh_took), after)
        })
    });
    let (before, pooled, fresh, after) = results;
    assert_eq!(before, Ok(Power::On));
    // The bound is the configured timeout; the slack only absorbs a loaded test machine.
    let bound = Duration::from_millis(TIMEOUT_MS) * 2;
    for (what, (r, took)) in [("pooled connection", pooled), ("new connection", fresh)] {
        assert!(
            matches!(r, Err(BmcError::Timeout { .. })),
            "{what}: a silent BMC is a timeout error, got {r:?}"
        );
        assert!(took < bound, "{what}: took {took:?}, bound {bound:?}");
    }
    assert_eq!(after, Ok(Power::On), "answers again once the BMC does");
    drop(sushy);
}
