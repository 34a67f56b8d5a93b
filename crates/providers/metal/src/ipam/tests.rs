//! Allocator rules, peer-project bugs as regression tests, and property tests over random
//! create / update / delete / restart sequences.

use std::collections::BTreeMap;
use std::net::IpAddr;

use proptest::prelude::*;

use super::*;
use ccm_cloud::Service;

fn pool(name: &str, ranges: &[&str]) -> Pool {
    Pool {
        name: name.into(),
        ranges: ranges
            .iter()
            .map(|r| PoolRange::parse(r).expect("range"))
            .collect(),
        auto_assign: true,
        avoid_buggy_ips: false,
        use_network_and_broadcast: false,
        namespaces: vec![],
        service_selector: BTreeMap::new(),
        bgp_communities: vec![],
        bgp_local_pref: None,
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

fn req(key: &str) -> Request {
    Request {
        key: key.into(),
        namespace: key.split('/').next().unwrap_or_default().into(),
        families: vec![Family::V4],
        ports: vec![Port {
            protocol: "TCP".into(),
            port: 80,
        }],
        ..Default::default()
    }
}

fn with_current(mut r: Request, ips: &[IpAddr]) -> Request {
    r.current = ips.to_vec();
    r
}

#[test]
fn lowest_free_address_and_stability_across_deletes() {
    // MetalLB #686: deleting svc2 must not renumber svc3.
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.10-10.0.0.20"])]);
    let s1 = a.assign(&req("d/s1")).expect("s1");
    let s2 = a.assign(&req("d/s2")).expect("s2");
    let s3 = a.assign(&req("d/s3")).expect("s3");
    assert_eq!(
        (s1[0], s2[0], s3[0]),
        (ip("10.0.0.10"), ip("10.0.0.11"), ip("10.0.0.12"))
    );
    a.release("d/s2");
    assert_eq!(a.assign(&with_current(req("d/s3"), &s3)).expect("s3"), s3);
    assert_eq!(
        a.assign(&req("d/s4")).expect("s4"),
        s2,
        "freed address reused"
    );
}

#[test]
fn metallb_1774_restart_with_a_one_address_pool_does_not_duplicate() {
    // MetalLB #1774: one-address pool, svc1 bound, svc2 pending; after a restart both showed
    // the address. Rebuild first, then allocate: svc2 stays pending with an error naming the pool.
    let pools = vec![pool("only", &["192.168.0.2/32"])];
    let mut a = Allocator::new(pools.clone());
    let got = a.assign(&req("default/svc1")).expect("svc1");
    assert!(a.assign(&req("default/svc2")).is_err());

    let mut restarted = Allocator::new(pools);
    // The pending Service is processed first after the restart, as in the bug report.
    restarted
        .adopt(&req("default/svc2"))
        .expect("nothing to adopt");
    restarted
        .adopt(&with_current(req("default/svc1"), &got))
        .expect("adopt svc1");
    let err = restarted
        .assign(&req("default/svc2"))
        .expect_err("exhausted");
    assert!(
        err.to_string().contains("\"only\""),
        "names the pool: {err}"
    );
    assert_eq!(
        restarted
            .assign(&with_current(req("default/svc1"), &got))
            .expect("svc1 keeps it"),
        got
    );
}

#[test]
fn metallb_2443_pending_service_never_takes_a_requested_address_after_restart() {
    // MetalLB #2443 / PR #2004: a Service with a requested IP is bound; others are pending;
    // after a restart the pending ones were handed the requested Service's address.
    let pools = vec![pool("p", &["10.220.212.17-10.220.212.18"])];
    let mut specific = req("ns/specific");
    specific.ips = vec![ip("10.220.212.18")];
    let specific = with_current(specific, &[ip("10.220.212.18")]);
    let mut a = Allocator::new(pools);
    a.adopt(&specific).expect("adopt");
    assert_eq!(
        a.assign(&req("ns/a")).expect("a"),
        vec![ip("10.220.212.17")]
    );
    assert!(a.assign(&req("ns/b")).is_err(), "b stays pending");
    assert_eq!(a.held("ns/specific"), Some(&[ip("10.220.212.18")][..]));
}

#[test]
fn metallb_1591_removing_a_pool_moves_nothing_and_reuses_nothing() {
    // MetalLB #1591: after deleting a pool, its Services' addresses were handed out again.
    let mut a = Allocator::new(vec![
        pool("cheap", &["192.168.1.0/30"]),
        pool("default", &["192.168.10.0/30"]),
    ]);
    let mut r = req("test/ng");
    r.pool = Some("default".into());
    let held = a.assign(&r).expect("from default");
    a.set_pools(vec![
        pool("cheap", &["192.168.1.0/30"]),
        pool("new", &["192.168.10.0/30"]),
    ]);
    // A new Service in the replacement pool does not get the held address.
    let other = a.assign(&req("test/other")).expect("other");
    assert!(!other.contains(&held[0]));
    let mut n = req("test/new");
    n.pool = Some("new".into());
    assert_ne!(a.assign(&n).expect("new"), held);
    // The holder keeps its address while its request is unchanged, even though the requested
    // pool is gone (an explicit change of the annotation is what moves it).
    assert_eq!(
        a.assign(&with_current(r.clone(), &held)).expect("kept"),
        held
    );
    r.pool = Some("cheap".into());
    let moved = a
        .assign(&with_current(r, &held))
        .expect("explicit change moves");
    assert!(moved[0].to_string().starts_with("192.168.1."), "{moved:?}");
}

#[test]
fn kube_vip_cloud_provider_34_an_address_in_use_is_not_handed_out_again() {
    // kube-vip-cloud-provider #34 / kube-vip #283: a new Service received the address an
    // existing Service (traefik) already showed.
    let pools = vec![pool("global", &["192.168.99.100-192.168.99.101"])];
    let mut a = Allocator::new(pools);
    a.adopt(&with_current(
        req("kube-system/traefik"),
        &[ip("192.168.99.100")],
    ))
    .expect("adopt");
    assert_eq!(
        a.assign(&req("default/nginx")).expect("nginx"),
        vec![ip("192.168.99.101")]
    );
    let mut asks = req("default/alpine");
    asks.ips = vec![ip("192.168.99.100")];
    let err = a.assign(&asks).expect_err("in use");
    assert!(err.to_string().contains("kube-system/traefik"), "{err}");
    assert!(err.to_string().contains("\"global\""), "{err}");
}

#[test]
fn kube_vip_cloud_provider_59_annotation_and_spec_must_agree() {
    use k8s_openapi::api::core::v1::{Service, ServiceSpec};
    let mut svc = Service::default();
    svc.metadata.name = Some("s".into());
    svc.metadata.namespace = Some("d".into());
    svc.metadata.annotations = Some(
        [(
            "kube-vip.io/loadbalancerIPs".to_string(),
            "10.0.0.5".to_string(),
        )]
        .into_iter()
        .collect(),
    );
    svc.spec = Some(ServiceSpec {
        load_balancer_ip: Some("10.0.0.6".into()),
        ..Default::default()
    });
    let err = request_from(&svc).expect_err("contradiction");
    assert!(err.to_string().contains("contradicts"), "{err}");
    svc.spec.as_mut().expect("spec").load_balancer_ip = Some("10.0.0.5".into());
    assert_eq!(request_from(&svc).expect("agree").ips, vec![ip("10.0.0.5")]);
}

#[test]
fn sharing_needs_the_same_key_and_disjoint_ports() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/30"])]);
    let mut web = req("d/web");
    web.sharing_key = Some("k".into());
    let mut dns = req("d/dns");
    dns.sharing_key = Some("k".into());
    dns.ports = vec![Port {
        protocol: "UDP".into(),
        port: 53,
    }];
    let w = a.assign(&web).expect("web");
    assert_eq!(a.assign(&dns).expect("dns"), w, "joins the key's address");
    let mut clash = req("d/clash");
    clash.sharing_key = Some("k".into());
    clash.ips = w.clone();
    let err = a.assign(&clash).expect_err("port 80 twice");
    assert!(err.to_string().contains("same port"), "{err}");
    let mut other = req("d/other");
    other.ips = w.clone();
    assert!(a.assign(&other).is_err(), "no key, no sharing");
}

#[test]
fn pool_restrictions_and_auto_assign() {
    let mut manual = pool("manual", &["10.1.0.0/30"]);
    manual.auto_assign = false;
    let mut prod = pool("prod", &["10.2.0.0/30"]);
    prod.namespaces = vec!["prod".into()];
    let mut web = pool("web", &["10.3.0.0/30"]);
    web.service_selector = [("tier".to_string(), "web".to_string())].into();
    let mut a = Allocator::new(vec![manual, prod, web]);
    assert!(matches!(
        a.assign(&req("dev/x")),
        Err(AllocError::NoPool { .. })
    ));
    assert_eq!(a.assign(&req("prod/x")).expect("prod")[0], ip("10.2.0.1"));
    let mut labelled = req("dev/y");
    labelled.labels = [("tier".to_string(), "web".to_string())].into();
    assert_eq!(a.assign(&labelled).expect("web")[0], ip("10.3.0.1"));
    let mut named = req("dev/z");
    named.pool = Some("manual".into());
    assert_eq!(a.assign(&named).expect("manual")[0], ip("10.1.0.1"));
    let mut asks = req("dev/w");
    asks.ips = vec![ip("10.1.0.2")];
    assert_eq!(a.assign(&asks).expect("requested in manual pool"), asks.ips);
    let mut outside = req("dev/v");
    outside.ips = vec![ip("10.9.9.9")];
    assert!(matches!(
        a.assign(&outside),
        Err(AllocError::NotInPool { .. })
    ));
}

#[test]
fn avoid_buggy_ips_and_dual_stack() {
    let mut v4 = pool("v4", &["10.0.0.255-10.0.1.1"]);
    v4.avoid_buggy_ips = true;
    let v6 = pool("v6", &["2001:db8::/64"]);
    let mut a = Allocator::new(vec![v4, v6]);
    let mut r = req("d/ds");
    r.families = vec![Family::V6, Family::V4];
    r.require_all_families = true;
    assert_eq!(
        a.assign(&r).expect("dual"),
        vec![ip("2001:db8::1"), ip("10.0.1.1")]
    );
    let mut single4 = req("d/s4");
    single4.families = vec![Family::V4];
    assert!(a.assign(&single4).is_err(), ".0 and .255 skipped, .1 taken");
    let mut prefer = req("d/prefer");
    prefer.families = vec![Family::V4, Family::V6];
    assert_eq!(a.assign(&prefer).expect("v6 only"), vec![ip("2001:db8::2")]);
    let mut require = prefer.clone();
    require.key = "d/require".into();
    require.require_all_families = true;
    let err = a.assign(&require).expect_err("no v4 left");
    assert!(err.to_string().contains("\"v4\""), "{err}");
}

#[test]
fn an_adopted_duplicate_is_refused_not_renumbered() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/30"])]);
    a.adopt(&with_current(req("d/old"), &[ip("10.0.0.1")]))
        .expect("old");
    let dup = with_current(req("d/new"), &[ip("10.0.0.1")]);
    assert!(a.adopt(&dup).is_err());
    let err = a.assign(&dup).expect_err("refused");
    assert!(err.to_string().contains("d/old"), "{err}");
    // Still recorded: a third Service never gets the address both show.
    let mut third = req("d/third");
    third.ips = vec![ip("10.0.0.1")];
    a.release("d/old");
    assert!(a.assign(&third).is_err(), "d/new still shows it");
    assert_eq!(a.assign(&dup).expect("conflict gone"), vec![ip("10.0.0.1")]);
}

fn svc_with(annotations: &[(&str, &str)], families: &[&str], policy: &str) -> Service {
    use k8s_openapi::api::core::v1::ServiceSpec;
    let mut svc = Service::default();
    svc.metadata.name = Some("s".into());
    svc.metadata.namespace = Some("d".into());
    svc.metadata.annotations = Some(
        annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    svc.spec = Some(ServiceSpec {
        type_: Some("LoadBalancer".into()),
        ip_families: Some(families.iter().map(|f| f.to_string()).collect()),
        ip_family_policy: Some(policy.into()),
        ..Default::default()
    });
    svc
}

#[test]
fn metallb_1742_a_requested_address_of_a_family_the_service_lacks_is_refused() {
    // MetalLB #1742: an IPv4-only Service requesting an IPv6 address got it as ingress; no
    // kube-proxy rule ever matched it and traffic was black-holed without a warning.
    let v4_only = svc_with(
        &[(ANNOTATION_LOAD_BALANCER_IPS, "2001:db8::5")],
        &["IPv4"],
        "SingleStack",
    );
    let err = request_from(&v4_only).expect_err("wrong family");
    assert!(
        err.to_string().contains("2001:db8::5") && err.to_string().contains("IPv4"),
        "{err}"
    );
    // A dual-stack Service may request one address of each family.
    let dual = svc_with(
        &[(ANNOTATION_LOAD_BALANCER_IPS, "10.0.0.5,2001:db8::5")],
        &["IPv4", "IPv6"],
        "RequireDualStack",
    );
    assert_eq!(request_from(&dual).expect("both families").ips.len(), 2);
}

#[test]
fn cilium_35460_sharing_across_namespaces_needs_both_to_opt_in() {
    // Cilium #35460: the same sharing key in two namespaces shared an address with no opt-in,
    // so any tenant could attach to another's IP.
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/29"])]);
    let mut mine = req("team-a/web");
    mine.sharing_key = Some("k".into());
    let held = a.assign(&mine).expect("web");
    let mut theirs = req("team-b/dns");
    theirs.sharing_key = Some("k".into());
    theirs.ports = vec![Port {
        protocol: "UDP".into(),
        port: 53,
    }];
    theirs.ips = held.clone();
    let err = a.assign(&theirs).expect_err("no opt-in");
    assert!(err.to_string().contains("sharing-cross-namespace"), "{err}");
    theirs.share_namespaces = vec!["team-a".into()];
    assert!(a.assign(&theirs).is_err(), "one side is not enough");
    mine.share_namespaces = vec!["*".into()];
    a.assign(&mine).expect("web keeps its address");
    assert_eq!(a.assign(&theirs).expect("both opted in"), held);
    // Auto-assignment does not join another namespace's address without the opt-in either.
    let mut auto = req("team-c/x");
    auto.sharing_key = Some("k".into());
    auto.ports = vec![Port {
        protocol: "TCP".into(),
        port: 8080,
    }];
    assert_ne!(a.assign(&auto).expect("own address"), held);
}

#[test]
fn a_sharer_that_later_conflicts_or_drops_its_key_gives_the_address_up() {
    // MetalLB clears the later Service; before, both kept the same IP:port.
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/29"])]);
    let mut web = req("d/web");
    web.sharing_key = Some("k".into());
    let mut tls = req("d/tls");
    tls.sharing_key = Some("k".into());
    tls.ports = vec![Port {
        protocol: "TCP".into(),
        port: 443,
    }];
    let held = a.assign(&web).expect("web");
    assert_eq!(a.assign(&tls).expect("tls joins"), held);
    // tls now also serves port 80: it conflicts with web, which keeps the address.
    tls.ports.push(Port {
        protocol: "TCP".into(),
        port: 80,
    });
    let tls_now = with_current(tls.clone(), &held);
    let err = a.assign(&tls_now).expect_err("conflict");
    assert!(matches!(err, AllocError::Released(_)), "{err:?}");
    assert!(err.to_string().contains("d/web"), "{err}");
    assert_eq!(a.held("d/tls"), None);
    assert_eq!(a.held("d/web"), Some(&held[..]));
    assert_eq!(a.assign(&web).expect("web keeps it"), held);
    // Its status cleared, the next retry gives it its own address.
    let again = a.assign(&tls).expect("own address");
    assert_ne!(again, held);
    // A sharer that drops its key gives the address up as well.
    let mut dns = req("d/dns");
    dns.sharing_key = Some("k".into());
    dns.ports = vec![Port {
        protocol: "UDP".into(),
        port: 53,
    }];
    assert_eq!(a.assign(&dns).expect("dns joins"), held);
    dns.sharing_key = None;
    assert!(matches!(
        a.assign(&with_current(dns, &held)),
        Err(AllocError::Released(_))
    ));
    assert_eq!(a.held("d/dns"), None);
}

#[test]
fn family_changes_keep_the_ipv4_address_and_gain_the_second_family() {
    let v6_pool = pool("v6", &["2001:db8::/120"]);
    let mut a = Allocator::new(vec![pool("v4", &["10.0.0.0/29"]), v6_pool]);
    a.assign(&req("d/first")).expect("first");
    let single = req("d/s");
    let v4 = a.assign(&single).expect("single")[0];
    // SingleStack → PreferDualStack: the IPv6 address is added, the IPv4 one stays.
    let mut prefer = with_current(single.clone(), &[v4]);
    prefer.families = vec![Family::V4, Family::V6];
    let got = a.assign(&prefer).expect("prefer");
    assert_eq!(got, vec![v4, ip("2001:db8::1")]);
    // Back to SingleStack: the IPv4 address stays.
    let got = a.assign(&with_current(single.clone(), &got)).expect("down");
    assert_eq!(got, vec![v4]);
    // RequireDualStack: the IPv4 address stays, an IPv6 one is added.
    let mut require = with_current(single, &got);
    require.families = vec![Family::V4, Family::V6];
    require.require_all_families = true;
    let got = a.assign(&require).expect("require");
    assert_eq!(got[0], v4);
    assert_eq!(got.len(), 2);
}

#[test]
fn metallb_1984_a_pending_request_is_not_lost_to_auto_assignment_at_restart() {
    // MetalLB #1984: after a restart, Services without an address were processed first and
    // auto-assigned the address another, not-yet-bound Service had requested.
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.1-10.0.0.2"])]);
    let mut wants = req("d/wants-1");
    wants.ips = vec![ip("10.0.0.1")];
    a.reserve(&wants);
    assert_eq!(
        a.assign(&req("d/auto")).expect("auto"),
        vec![ip("10.0.0.2")],
        "the requested address is kept for its Service"
    );
    assert_eq!(a.assign(&wants).expect("requested"), wants.ips);
    // Deleted while pending: the reservation goes with it.
    let mut gone = req("d/gone");
    gone.ips = vec![ip("10.0.0.2")];
    let mut b = Allocator::new(vec![pool("p", &["10.0.0.1-10.0.0.2"])]);
    b.reserve(&gone);
    b.forget("d/gone");
    assert_eq!(b.assign(&req("d/x")).expect("x"), vec![ip("10.0.0.1")]);
    assert_eq!(b.assign(&req("d/y")).expect("y"), vec![ip("10.0.0.2")]);

    // While running: a request refused because its address is held keeps its claim, so when
    // the holder goes, a Service waiting for any address does not take it first.
    let mut c = Allocator::new(vec![pool("p", &["10.0.0.1-10.0.0.2"])]);
    assert_eq!(
        c.assign(&req("d/holder")).expect("holder"),
        vec![ip("10.0.0.1")]
    );
    assert_eq!(
        c.assign(&req("d/other")).expect("other"),
        vec![ip("10.0.0.2")]
    );
    let mut wants = req("d/wants");
    wants.ips = vec![ip("10.0.0.1")];
    assert!(c.assign(&wants).is_err(), "held by d/holder");
    assert!(c.assign(&req("d/waiting")).is_err(), "pool full");
    c.forget("d/holder");
    assert!(
        c.assign(&req("d/waiting")).is_err(),
        "the freed address is kept for the Service that asked for it"
    );
    assert_eq!(c.assign(&wants).expect("requested"), wants.ips);
    // A changed request drops the claim.
    let mut d = Allocator::new(vec![pool("p", &["10.0.0.1-10.0.0.1"])]);
    let mut holder = req("d/holder");
    holder.ips = vec![ip("10.0.0.1")];
    d.assign(&holder).expect("holder");
    let mut w = req("d/w");
    w.ips = vec![ip("10.0.0.1")];
    assert!(d.assign(&w).is_err());
    w.ips.clear();
    w.pool = Some("missing".into());
    assert!(d.assign(&w).is_err());
    d.forget("d/holder");
    assert_eq!(
        d.assign(&req("d/z")).expect("claim dropped"),
        vec![ip("10.0.0.1")]
    );
}

#[test]
fn cidr_network_and_broadcast_addresses_are_skipped_unless_the_pool_opts_out() {
    let mut a = Allocator::new(vec![
        pool("p", &["10.0.0.0/30"]),
        pool("v6", &["2001:db8::/126"]),
    ]);
    let got: Vec<IpAddr> = ["d/a", "d/b"]
        .iter()
        .map(|k| a.assign(&req(k)).expect("address")[0])
        .collect();
    assert_eq!(got, vec![ip("10.0.0.1"), ip("10.0.0.2")]);
    assert!(
        a.assign(&req("d/c")).is_err(),
        ".0 and .3 are not handed out"
    );
    let mut six = req("d/six");
    six.families = vec![Family::V6];
    assert_eq!(a.assign(&six).expect("v6")[0], ip("2001:db8::1"));
    // Requested explicitly, the network address is the user's choice.
    let mut asks = req("d/asks");
    asks.ips = vec![ip("10.0.0.0")];
    assert_eq!(a.assign(&asks).expect("requested"), asks.ips);
    let mut all = pool("all", &["10.1.0.0/30"]);
    all.use_network_and_broadcast = true;
    let mut b = Allocator::new(vec![all]);
    assert_eq!(b.assign(&req("d/a")).expect("a")[0], ip("10.1.0.0"));
    // A range (not a CIDR) has no network address.
    let mut c = Allocator::new(vec![pool("r", &["10.2.0.0-10.2.0.3"])]);
    assert_eq!(c.assign(&req("d/a")).expect("a")[0], ip("10.2.0.0"));
}

// ---- property tests ----

const SERVICES: usize = 6;

#[derive(Debug, Clone)]
struct Spec {
    namespace: &'static str,
    ips: Option<&'static str>,
    pool: Option<&'static str>,
    sharing_key: Option<&'static str>,
    ports: Vec<i32>,
    families: (Vec<Family>, bool),
}

#[derive(Debug, Clone)]
enum Op {
    /// Create or update Service `i` with `spec`, then the controller ensures it.
    Apply(usize, Spec),
    /// Ensure again without a change (resync, node change).
    Resync(usize),
    /// Delete Service `i`.
    Delete(usize),
    /// The CCM restarts: a new allocator adopts every Service's status, oldest first.
    Restart,
    /// The CCM allocates for `i` and dies before the status write, then restarts.
    CrashMidAllocation(usize, Spec),
    /// The pools are edited (config reload): `true` the usual set, `false` a shrunk and
    /// shifted one.
    EditPools(bool),
}

fn arb_spec() -> impl Strategy<Value = Spec> {
    (
        prop::sample::select(vec!["default", "prod"]),
        prop::option::weighted(
            0.3,
            prop::sample::select(vec![
                "10.0.0.1",
                "10.0.0.2",
                "10.0.1.1",
                "10.0.2.1",
                "10.9.0.1",
                "fd00::1",
                "10.0.0.3,fd00::2",
            ]),
        ),
        prop::option::weighted(
            0.3,
            prop::sample::select(vec!["a", "manual", "prod-only", "v6", "missing"]),
        ),
        prop::option::weighted(0.4, prop::sample::select(vec!["k1", "k2"])),
        prop::sample::subsequence(vec![53, 80, 443], 1..=2),
        prop::sample::select(vec![
            (vec![Family::V4], false),
            (vec![Family::V6], false),
            (vec![Family::V4, Family::V6], false),
            (vec![Family::V4, Family::V6], true),
        ]),
    )
        .prop_map(
            |(namespace, ips, pool, sharing_key, ports, families)| Spec {
                namespace,
                ips,
                pool,
                sharing_key,
                ports,
                families,
            },
        )
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..SERVICES, arb_spec()).prop_map(|(i, s)| Op::Apply(i, s)),
        2 => (0..SERVICES).prop_map(Op::Resync),
        2 => (0..SERVICES).prop_map(Op::Delete),
        1 => Just(Op::Restart),
        1 => (0..SERVICES, arb_spec()).prop_map(|(i, s)| Op::CrashMidAllocation(i, s)),
        1 => any::<bool>().prop_map(Op::EditPools),
    ]
}

fn prop_pools() -> Vec<Pool> {
    let mut manual = pool("manual", &["10.0.1.0-10.0.1.2"]);
    manual.auto_assign = false;
    let mut prod = pool("prod-only", &["10.0.2.0/31"]);
    prod.namespaces = vec!["prod".into()];
    vec![
        pool("a", &["10.0.0.0/30"]),
        manual,
        prod,
        pool("v6", &["fd00::/127"]),
    ]
}

/// [`prop_pools`] after an edit: "a" shrunk to half (its upper addresses now outside every
/// pool), a new pool "b" first in order.
fn edited_pools() -> Vec<Pool> {
    let mut pools = prop_pools();
    pools[0] = pool("a", &["10.0.0.0/31"]);
    pools.insert(0, pool("b", &["10.0.3.0/30"]));
    pools
}

/// One Service as the cluster stores it.
#[derive(Debug, Clone)]
struct Stored {
    spec: Spec,
    created: usize,
    status: Vec<IpAddr>,
    /// The request the status was granted for (what sharing rules are checked against).
    granted: Option<Request>,
}

fn request_of(i: usize, s: &Stored) -> Request {
    let spec = &s.spec;
    Request {
        key: format!("{}/svc{i}", spec.namespace),
        namespace: spec.namespace.into(),
        labels: BTreeMap::new(),
        families: spec.families.0.clone(),
        require_all_families: spec.families.1,
        ips: spec
            .ips
            .map(|t| t.split(',').map(ip).collect())
            .unwrap_or_default(),
        pool: spec.pool.map(str::to_string),
        sharing_key: spec.sharing_key.map(str::to_string),
        share_namespaces: vec![],
        ports: spec
            .ports
            .iter()
            .map(|&port| Port {
                protocol: "TCP".into(),
                port,
            })
            .collect(),
        current: s.status.clone(),
    }
}

struct Model {
    alloc: Allocator,
    cluster: BTreeMap<usize, Stored>,
    clock: usize,
    pools: Vec<Pool>,
    /// Requested addresses of Services pending at the last restart (MetalLB #1984).
    reserved: BTreeMap<IpAddr, usize>,
}

impl Model {
    /// As the provider's rebuild: adopt every status oldest first, then reserve the requests
    /// of Services that show nothing.
    fn restart(&mut self) {
        self.alloc = Allocator::new(self.pools.clone());
        let mut order: Vec<_> = self.cluster.iter().collect();
        order.sort_by_key(|(_, s)| s.created);
        for &(&i, s) in &order {
            let _ = self.alloc.adopt(&request_of(i, s));
        }
        self.reserved.clear();
        for &(&i, s) in &order {
            let r = request_of(i, s);
            self.alloc.reserve(&r);
            if r.current.is_empty() {
                // Only free addresses are kept for it; a held one is the holder's to share.
                let pools = self.alloc.pools();
                let grantable = |ip: &IpAddr| {
                    pools.iter().any(|p| {
                        p.contains(*ip)
                            && p.allows(&r)
                            && r.pool.as_ref().is_none_or(|name| name == &p.name)
                    })
                };
                let asked: Vec<IpAddr> = r.ips.iter().copied().filter(grantable).collect();
                for ip in asked {
                    if !self.cluster.values().any(|s| s.status.contains(&ip)) {
                        self.reserved.entry(ip).or_insert(i);
                    }
                }
            }
        }
    }

    /// Whether Service `j` still waits for the address `ip` it requested before the restart.
    fn still_reserved(&self, ip: IpAddr, j: usize) -> bool {
        self.cluster
            .get(&j)
            .is_some_and(|s| s.status.is_empty() && request_of(j, s).ips.contains(&ip))
    }

    /// The controller's ensure: assign, then write the status on success.
    fn ensure(&mut self, i: usize, commit: bool) -> Result<(), TestCaseError> {
        let stored = self.cluster.get(&i).expect("exists").clone();
        let r = request_of(i, &stored);
        let unchanged = stored.granted.as_ref().is_some_and(|g| {
            Fingerprint::of(g) == Fingerprint::of(&r)
                && g.sharing_key == r.sharing_key
                && g.ports == r.ports
        });
        let result = self.alloc.assign(&r);
        if let Err(AllocError::Released(_)) = &result {
            // The provider clears the status of a Service that gave its address up.
            prop_assert!(self.alloc.held(&r.key).is_none());
            self.cluster.get_mut(&i).expect("exists").status.clear();
        }
        if let Ok(ips) = result {
            {
                // Every address is in a pool that may serve the Service (or is the one it
                // already held).
                for &a in &ips {
                    let pooled = self
                        .alloc
                        .pools()
                        .iter()
                        .any(|p| p.contains(a) && p.allows(&r));
                    prop_assert!(
                        pooled || stored.status.contains(&a),
                        "{a} outside pools for {r:?}"
                    );
                }
                if unchanged && !stored.status.is_empty() {
                    // Nothing moves; a family still missing may be added.
                    prop_assert!(
                        stored.status.iter().all(|a| ips.contains(a))
                            && ips.iter().all(|a| stored.status.contains(a)
                                || stored
                                    .status
                                    .iter()
                                    .all(|s| Family::of(*s) != Family::of(*a))),
                        "moved without a request change: {:?} -> {:?}",
                        stored.status,
                        ips
                    );
                }
                // A family change (alone) keeps the address of every family kept.
                if let Some(g) = &stored.granted
                    && g.ips == r.ips
                    && g.pool == r.pool
                    && g.sharing_key == r.sharing_key
                    && g.ports == r.ports
                    && r.ips.is_empty()
                {
                    for a in &stored.status {
                        let f = Family::of(*a);
                        if g.families.contains(&f)
                            && r.families.contains(&f)
                            && self
                                .alloc
                                .pools()
                                .iter()
                                .any(|p| p.contains(*a) && p.allows(&r))
                        {
                            prop_assert!(
                                ips.contains(a),
                                "{a} renumbered by a family change: {:?} -> {:?}",
                                stored.status,
                                ips
                            );
                        }
                    }
                }
                // Auto-assignment never takes what a pending Service asked for before the
                // restart (MetalLB #1984).
                if r.ips.is_empty() {
                    for new in ips.iter().filter(|a| !stored.status.contains(a)) {
                        if let Some(&j) = self.reserved.get(new) {
                            prop_assert!(
                                j == i || !self.still_reserved(*new, j),
                                "{new} auto-assigned to {} while svc{j} waits for it",
                                r.key
                            );
                        }
                    }
                }
                // Nothing newly given is shown by another Service it may not share with.
                for new in ips.iter().filter(|a| !stored.status.contains(a)) {
                    for (&j, other) in &self.cluster {
                        if j != i && other.status.contains(new) {
                            let o = request_of(j, other);
                            prop_assert!(
                                may_share(&r, &o),
                                "{new} given to {} while {} shows it",
                                r.key,
                                o.key
                            );
                        }
                    }
                }
                if commit {
                    let s = self.cluster.get_mut(&i).expect("exists");
                    s.status = ips;
                    s.granted = Some(r);
                }
            }
        }
        Ok(())
    }
}

/// Legal sharing under both Services' current requests.
fn may_share(a: &Request, b: &Request) -> bool {
    a.namespace == b.namespace
        && a.sharing_key.is_some()
        && a.sharing_key == b.sharing_key
        && !a.ports.iter().any(|p| b.ports.contains(p))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_over_random_histories(ops in prop::collection::vec(arb_op(), 1..60)) {
        let mut m = Model { alloc: Allocator::new(prop_pools()), cluster: BTreeMap::new(), clock: 0, pools: prop_pools(), reserved: BTreeMap::new() };
        for op in ops {
            match op {
                Op::Apply(i, spec) => {
                    m.clock += 1;
                    let created = m.clock;
                    let entry = m.cluster.entry(i).or_insert(Stored { spec: spec.clone(), created, status: vec![], granted: None });
                    if entry.spec.namespace != spec.namespace {
                        // Another namespace is another Service: delete and re-create.
                        m.alloc.release(&request_of(i, entry).key);
                        *entry = Stored { spec: spec.clone(), created, status: vec![], granted: None };
                    }
                    entry.spec = spec;
                    m.ensure(i, true)?;
                }
                Op::Resync(i) => {
                    if m.cluster.contains_key(&i) {
                        m.ensure(i, true)?;
                    }
                }
                Op::Delete(i) => {
                    if let Some(s) = m.cluster.remove(&i) {
                        m.alloc.forget(&request_of(i, &s).key);
                    }
                }
                Op::Restart => m.restart(),
                Op::EditPools(usual) => {
                    m.pools = if usual { prop_pools() } else { edited_pools() };
                    m.alloc.set_pools(m.pools.clone());
                }
                Op::CrashMidAllocation(i, spec) => {
                    m.clock += 1;
                    let created = m.clock;
                    let entry = m.cluster.entry(i).or_insert(Stored { spec: spec.clone(), created, status: vec![], granted: None });
                    if entry.spec.namespace == spec.namespace {
                        entry.spec = spec;
                        m.ensure(i, false)?;
                    }
                    m.restart();
                }
            }
        }
        // Whatever happened, a final restart + resync of everyone moves no bound Service whose
        // request is the one it was granted for.
        m.restart();
        let keys: Vec<usize> = m.cluster.keys().copied().collect();
        for i in keys {
            m.ensure(i, true)?;
        }
    }
}

#[test]
fn a_reservation_only_keeps_what_its_service_may_get_and_blocks_sharers_too() {
    // A request no pool would grant (another namespace's pool) reserves nothing: a sharer
    // may join the address its holder requested.
    let mut prod = pool("prod-only", &["10.0.2.0-10.0.2.1"]);
    prod.namespaces = vec!["prod".into()];
    let mut a = Allocator::new(vec![prod]);
    let mut foreign = req("default/wants");
    foreign.ips = vec![ip("10.0.2.1")];
    a.reserve(&foreign);
    let mut holder = req("prod/holder");
    holder.ips = vec![ip("10.0.2.1")];
    holder.sharing_key = Some("k".into());
    assert_eq!(a.assign(&holder).expect("holder"), holder.ips);
    let mut sharer = req("prod/sharer");
    sharer.sharing_key = Some("k".into());
    sharer.ports[0].port = 443;
    assert_eq!(a.assign(&sharer).expect("sharer"), holder.ips);

    // A request its pool would grant keeps the address from auto-assigned sharers: once the
    // holder goes, the waiting Service gets it.
    let mut b = Allocator::new(vec![pool("p", &["10.0.0.1-10.0.0.1"])]);
    let mut holder = req("d/holder");
    holder.sharing_key = Some("k".into());
    assert_eq!(b.assign(&holder).expect("holder"), vec![ip("10.0.0.1")]);
    let mut wants = req("d/wants");
    wants.ips = vec![ip("10.0.0.1")];
    assert!(b.assign(&wants).is_err(), "held by d/holder");
    let mut sharer = req("d/sharer");
    sharer.sharing_key = Some("k".into());
    sharer.ports[0].port = 443;
    assert!(
        b.assign(&sharer).is_err(),
        "the address d/wants waits for is not joined"
    );
    b.forget("d/holder");
    assert_eq!(b.assign(&wants).expect("wants"), wants.ips);
}
