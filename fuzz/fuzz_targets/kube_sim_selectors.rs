//! kube-sim's `labelSelector` and `fieldSelector` query parameters (every resource's field
//! set); a parsed selector is matched against an object.
#![no_main]
use ccm_kube_sim::RESOURCES;
use ccm_kube_sim::fuzzing::{FieldSelector, LabelSelector};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let obj = serde_json::json!({
        "metadata": {"name": "n1", "namespace": "default", "labels": {"app": "web", "tier": "a-b.c_d"}},
        "spec": {"nodeName": "n1", "type": "LoadBalancer"},
        "status": {"phase": "Running"}
    });
    if let Ok(sel) = LabelSelector::parse(text) {
        let _ = sel.matches(&obj);
    }
    let desc = &RESOURCES[usize::from(which) % RESOURCES.len()];
    if let Ok(sel) = FieldSelector::parse(text, desc) {
        let _ = sel.exact_name();
        let _ = sel.matches(&obj);
    }
});
