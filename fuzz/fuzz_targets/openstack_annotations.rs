//! The openstack provider's Octavia inputs: `[LoadBalancer]` / `[LoadBalancerClass]` pairs
//! (`LbConfig::from_pairs`), the Service's `loadbalancer.openstack.org/*` annotations
//! (`ServiceLb::new` and `ServiceLb::for_cleanup`), the `floating-subnet` and
//! `floating-subnet-tags` matchers, and the security-group rules of `manage-security-groups`
//! (`secgroup::wanted_rules`, `secgroup::plan`). Input: `key=value` lines; a key without `/`
//! gets `loadbalancer.openstack.org/`; `conf.<key>=v` is a `[LoadBalancer]` pair (`conf.class
//! "name" <key>=v` a class key); `spec.*` lines set Service fields as for the other providers.
//! Properties: nothing panics; cleanup options exist whenever the strict ones do, and are
//! refused only for a malformed `keep-floatingip` (a refused annotation never blocks a
//! delete); the planned rule changes leave the group holding exactly the wanted rules.
#![no_main]
use ccm_provider_openstack::lbopts::{
    ANNOTATION_PREFIX, LbConfig, ServiceLb, name_matcher, tag_filter,
};
use ccm_provider_openstack::secgroup::{ExistingRule, plan, wanted_rules};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut svc = ccm_fuzz::service(data, ANNOTATION_PREFIX);
    let conf_prefix = format!("{ANNOTATION_PREFIX}conf.");
    let mut pairs = Vec::new();
    if let Some(ann) = svc.metadata.annotations.as_mut() {
        let keys: Vec<String> = ann
            .keys()
            .filter(|k| k.starts_with(&conf_prefix))
            .cloned()
            .collect();
        for k in keys {
            let v = ann.remove(&k).unwrap_or_default();
            let key = k[conf_prefix.len()..].to_string();
            let key = match key.strip_prefix("class ") {
                Some(rest) => format!("LoadBalancerClass {rest}"),
                None => key,
            };
            pairs.push((key, v));
        }
    }
    let cfg = match LbConfig::from_pairs(&pairs) {
        Ok((cfg, _)) => cfg,
        Err(_) => LbConfig::default(),
    };
    let strict = ServiceLb::new(&cfg, &svc);
    let cleanup = ServiceLb::for_cleanup(&cfg, &svc);
    let keep = svc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(&format!("{ANNOTATION_PREFIX}keep-floatingip")));
    let keep_ok = keep.is_none_or(|v| v == "true" || v == "false");
    assert!(
        cleanup.is_ok() || (strict.is_err() && !keep_ok),
        "cleanup refused: {cleanup:?} (strict: {strict:?})"
    );
    if let Ok(o) = &strict {
        if let Some(p) = &o.floating_subnet {
            let m = name_matcher(p).expect("a pattern the strict options accepted compiles");
            let _ = m("public-subnet");
        }
        if let Some(t) = &o.floating_subnet_tags {
            let _ = tag_filter(t);
        }
    }
    for member in ["10.0.0.0/24", "2001:db8::/64"] {
        for ovn in [false, true] {
            let Ok(wanted) = wanted_rules(&svc, member, ovn) else {
                continue;
            };
            // A group holding some of them, a stale one and a duplicate.
            let mut existing: Vec<ExistingRule> = wanted
                .iter()
                .step_by(2)
                .enumerate()
                .map(|(i, r)| ExistingRule {
                    id: format!("r{i}"),
                    direction: r.direction.clone(),
                    ethertype: r.ethertype.clone(),
                    protocol: r.protocol.clone(),
                    remote_ip_prefix: r.remote_ip_prefix.clone(),
                    remote_group_id: None,
                    port_range_min: r.port_range_min,
                    port_range_max: r.port_range_max,
                })
                .collect();
            if let Some(first) = existing.first().cloned() {
                existing.push(ExistingRule {
                    id: "dup".into(),
                    ..first
                });
            }
            existing.push(ExistingRule {
                id: "stale".into(),
                direction: "ingress".into(),
                ethertype: "IPv4".into(),
                protocol: Some("tcp".into()),
                remote_ip_prefix: Some("0.0.0.0/0".into()),
                remote_group_id: None,
                port_range_min: Some(1),
                port_range_max: Some(1),
            });
            let (create, delete) = plan(&wanted, &existing);
            let kept = existing.iter().filter(|e| !delete.contains(&e.id)).count();
            assert_eq!(kept + create.len(), wanted.len(), "{wanted:?} {existing:?}");
            assert!(delete.contains(&"stale".to_string()) || wanted.iter().any(|w| w.port_range_min == Some(1)));
        }
    }
});
