//! The short strings from outside that are parsed on their own: Node annotations and
//! fields (`alpha.kubernetes.io/provided-node-ip`, providerIDs of each provider), flag values
//! (`--cluster-cidr`, Go durations and booleans, kube-sim's durations). The first byte picks
//! the parser.
#![no_main]
use ccm_controllers::node::planner::parse_provided_node_ips;
use ccm_controllers::nodeutil::parse_go_bool;
use ccm_controllers::route::parse_cluster_cidrs;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let Ok(s) = std::str::from_utf8(rest) else {
        return;
    };
    match pick % 8 {
        0 => {
            if let Ok(ips) = parse_provided_node_ips(s) {
                assert!(!ips.is_empty() && ips.len() <= 2, "{ips:?} from {s:?}");
            }
        }
        1 => {
            if let Ok(cidrs) = parse_cluster_cidrs(s) {
                let again = cidrs
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",");
                assert_eq!(parse_cluster_cidrs(&again).ok(), Some(cidrs), "{s:?}");
            }
        }
        2 => {
            let _ = parse_go_bool(s);
        }
        3 => {
            // The openstack provider's copy (`config::parse_go_duration`) panics past Go's
            // limit too: an open finding of docs/fuzzing.md, fixed where that crate is written.
            let _ = ccm_manager::options::parse_go_duration(s);
        }
        4 => {
            let _ = ccm_kube_sim::parse_duration(s);
        }
        5 => {
            if let Ok(id) = ccm_fuzz::providerid::parse_provider_id(s) {
                assert!(s.contains(id));
            }
            let _ = ccm_fuzz::providerid::classify(s);
        }
        6 => {
            if let Ok(id) = ccm_provider_sim::parse_provider_id(s) {
                assert!(s.contains(id));
            }
        }
        _ => {
            if let Ok(id) = ccm_provider_openstack::server_id(s, "r1") {
                assert!(s.contains(&id));
            }
        }
    }
});
