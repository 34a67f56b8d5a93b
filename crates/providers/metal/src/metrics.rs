//! `ccm_metal_pool_addresses{pool,family,state}`: how full each pool is, so an alert fires
//! before a Service waits for an address.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family as MetricFamily;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::atomic::AtomicU64;

use crate::ipam::{Allocator, Family};

/// Labels of one series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    /// The pool's name.
    pub pool: String,
    /// `IPv4` or `IPv6`.
    pub family: String,
    /// `total` (in the ranges, minus skipped network/broadcast addresses), `assigned` (held
    /// by Services), `free` (the difference).
    pub state: String,
}

/// The gauge family; cheap to clone (shared).
pub type PoolGauges = MetricFamily<PoolLabels, Gauge<f64, AtomicU64>>;

/// Sets every series from the allocator (pools removed by a reload disappear).
pub fn update(gauges: &PoolGauges, alloc: &Allocator) {
    gauges.clear();
    for pool in alloc.pools() {
        for family in [Family::V4, Family::V6] {
            let ranges: Vec<_> = pool
                .ranges
                .iter()
                .filter(|r| r.family() == family)
                .collect();
            if ranges.is_empty() {
                continue;
            }
            let skipped = if pool.use_network_and_broadcast {
                0
            } else {
                ranges.iter().map(|r| r.subnet_edges()).sum()
            };
            let total: u128 = ranges.iter().map(|r| r.size()).sum::<u128>() - skipped;
            let assigned = alloc
                .holdings()
                .flat_map(|(_, ips)| ips.iter())
                .filter(|ip| Family::of(**ip) == family && ranges.iter().any(|r| r.contains(**ip)))
                .collect::<std::collections::BTreeSet<_>>()
                .len() as u128;
            let set = |state: &str, v: u128| {
                gauges
                    .get_or_create(&PoolLabels {
                        pool: pool.name.clone(),
                        family: family.to_string(),
                        state: state.into(),
                    })
                    .set(v as f64);
            };
            set("total", total);
            set("assigned", assigned);
            set("free", total.saturating_sub(assigned));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::{Pool, PoolRange, Request};

    #[test]
    fn pool_fill_by_family_and_state() {
        let pool = Pool {
            name: "public".into(),
            ranges: vec![
                PoolRange::parse("192.0.2.0/29").expect("v4"),
                PoolRange::parse("2001:db8::/120").expect("v6"),
            ],
            auto_assign: true,
            avoid_buggy_ips: false,
            use_network_and_broadcast: false,
            namespaces: vec![],
            service_selector: Default::default(),
            bgp_communities: vec![],
            bgp_local_pref: None,
        };
        let mut alloc = Allocator::new(vec![pool]);
        let req = Request {
            key: "d/web".into(),
            namespace: "d".into(),
            families: vec![Family::V4],
            ..Default::default()
        };
        alloc.assign(&req).expect("address");
        let gauges = PoolGauges::default();
        update(&gauges, &alloc);
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("ccm_metal_pool_addresses", "pool fill", gauges);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        for line in [
            r#"ccm_metal_pool_addresses{pool="public",family="IPv4",state="total"} 6.0"#,
            r#"ccm_metal_pool_addresses{pool="public",family="IPv4",state="assigned"} 1.0"#,
            r#"ccm_metal_pool_addresses{pool="public",family="IPv4",state="free"} 5.0"#,
            r#"ccm_metal_pool_addresses{pool="public",family="IPv6",state="total"} 255.0"#,
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
        promtool_accepts(&text);
    }

    /// The real `promtool check metrics` (PATH, then the workspace's `.venv/bin`).
    fn promtool_accepts(text: &str) {
        use std::io::Write as _;
        let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../.venv/bin");
        let tool = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .chain([venv])
            .map(|d| d.join("promtool"))
            .find(|p| p.is_file())
            .expect("promtool not found: run .ci/run (its setup installs promtool)");
        let mut child = std::process::Command::new(tool)
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn promtool");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("write");
        let out = child.wait_with_output().expect("promtool");
        assert!(
            out.status.success(),
            "promtool: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
