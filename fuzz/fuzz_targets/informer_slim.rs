//! The informers' slim decoding of what the API server sends (`informer::slim`): a Node or a
//! Service, alone or in a watch event. The first byte picks the shape. Beyond not panicking,
//! slim decoding must never lose an object the whole decoding accepts, and must keep exactly
//! what the cache's trim of the whole object keeps — for JSON without duplicate keys, which
//! is all an API server sends: k8s-openapi's decoders take a repeated field, serde's derived
//! ones (the slim types') refuse the object.
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
            let _ = serde_json::from_slice::<SlimNode>(json);
            if let Some(json) = without_duplicate_keys(json) {
                if let Ok(mut full) = serde_json::from_slice::<Node>(&json) {
                    let slim = serde_json::from_slice::<SlimNode>(&json);
                    let mut slim: Node = slim.expect("a Node the whole decoding accepts").into();
                    trim_node(&mut full);
                    trim_node(&mut slim);
                    assert_eq!(slim, full);
                }
            }
        }
        1 => {
            let _ = serde_json::from_slice::<SlimService>(json);
            if let Some(json) = without_duplicate_keys(json) {
                if let Ok(mut full) = serde_json::from_slice::<Service>(&json) {
                    let slim = serde_json::from_slice::<SlimService>(&json);
                    let mut slim: Service =
                        slim.expect("a Service the whole decoding accepts").into();
                    trim_service(&mut full);
                    trim_service(&mut slim);
                    assert_eq!(slim, full);
                }
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

/// The input re-encoded from its JSON value (a repeated key keeps its last value), or None if
/// it is not JSON.
fn without_duplicate_keys(json: &[u8]) -> Option<Vec<u8>> {
    let value: serde_json::Value = serde_json::from_slice(json).ok()?;
    serde_json::to_vec(&value).ok()
}
