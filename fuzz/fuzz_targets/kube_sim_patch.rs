//! kube-sim's PATCH bodies: JSON patch (RFC 6902), merge patch (RFC 7386) and strategic merge
//! patch, applied to a Service and a Node. The first byte picks the type and the resource.
#![no_main]
use ccm_kube_sim::RESOURCES;
use ccm_kube_sim::fuzzing::{PatchType, apply};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    let ty = match which % 3 {
        0 => PatchType::Json,
        1 => PatchType::Merge,
        _ => PatchType::Strategic,
    };
    let (plural, current) = if which & 4 == 0 {
        (
            "services",
            serde_json::json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "web", "namespace": "default", "finalizers": ["service.kubernetes.io/load-balancer-cleanup"], "labels": {"app": "web"}},
                "spec": {"type": "LoadBalancer", "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080}], "selector": {"app": "web"}},
                "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}, "conditions": [{"type": "Ready", "status": "True"}]}
            }),
        )
    } else {
        (
            "nodes",
            serde_json::json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1"}},
                "spec": {"providerID": "sim://n1", "taints": [{"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}], "podCIDRs": ["10.244.0.0/24"]},
                "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}], "conditions": [{"type": "Ready", "status": "True"}]}
            }),
        )
    };
    let Some(desc) = RESOURCES
        .iter()
        .find(|d| d.plural == plural && d.group.is_empty())
    else {
        return;
    };
    // What the store then accepts or refuses is `kube_sim_request`'s part.
    let _ = apply(desc, &current, ty, body);
});
