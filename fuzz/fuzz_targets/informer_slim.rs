//! The informers' slim decoding of what the API server sends (`informer::slim`): a Node or a
//! Service, alone or in a watch event. The first byte picks the shape. Beyond not panicking,
//! slim decoding must never lose an object the whole decoding accepts, and must keep exactly
//! what the cache's trim of the whole object keeps.
#![no_main]
use ccm_controllers::informer::slim::{SlimNode, SlimService};
use ccm_controllers::informer::{trim_node, trim_service};
use k8s_openapi::api::core::v1::{Node, Service};
use kube_core::WatchEvent;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, json)) = data.split_first() else {
        return;
    };
    match pick % 4 {
        0 => {
            if let Ok(mut full) = serde_json::from_slice::<Node>(json) {
                let slim = serde_json::from_slice::<SlimNode>(json);
                let mut slim: Node = slim.expect("a Node the whole decoding accepts").into();
                trim_node(&mut full);
                trim_node(&mut slim);
                assert_eq!(slim, full);
            }
        }
        1 => {
            if let Ok(mut full) = serde_json::from_slice::<Service>(json) {
                let slim = serde_json::from_slice::<SlimService>(json);
                let mut slim: Service = slim.expect("a Service the whole decoding accepts").into();
                trim_service(&mut full);
                trim_service(&mut slim);
                assert_eq!(slim, full);
            }
        }
        2 => {
            let _ = serde_json::from_slice::<WatchEvent<SlimNode>>(json);
        }
        _ => {
            let _ = serde_json::from_slice::<WatchEvent<SlimService>>(json);
        }
    }
});
