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
use serde::de::DeserializeOwned;
use std::fmt::Debug;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, json)) = data.split_first() else {
        return;
    };
    match pick % 4 {
        0 => same_after_trim::<Node, SlimNode>(json, trim_node),
        1 => same_after_trim::<Service, SlimService>(json, trim_service),
        2 => {
            let _ = serde_json::from_slice::<WatchEvent<SlimNode>>(json);
        }
        _ => {
            let _ = serde_json::from_slice::<WatchEvent<SlimService>>(json);
        }
    }
});

/// Decodes `json` slim (no panic); then, on the input without repeated keys, checks that
/// whatever the whole decoding accepts decodes slim too and equals it after the cache's trim.
fn same_after_trim<Full, Slim>(json: &[u8], trim: fn(&mut Full))
where
    Full: DeserializeOwned + PartialEq + Debug,
    Slim: DeserializeOwned + Into<Full>,
{
    let _ = serde_json::from_slice::<Slim>(json);
    let Some(json) = without_duplicate_keys(json) else {
        return;
    };
    let Ok(mut full) = serde_json::from_slice::<Full>(&json) else {
        return;
    };
    let slim = serde_json::from_slice::<Slim>(&json);
    let mut slim: Full = slim.expect("an object the whole decoding accepts").into();
    trim(&mut full);
    trim(&mut slim);
    assert_eq!(slim, full);
}

/// The input re-encoded from its JSON value (a repeated key keeps its last value), or None if
/// it is not JSON.
fn without_duplicate_keys(json: &[u8]) -> Option<Vec<u8>> {
    let value: serde_json::Value = serde_json::from_slice(json).ok()?;
    serde_json::to_vec(&value).ok()
}
