//! The aws provider's Service annotations (`service.beta.kubernetes.io/aws-load-balancer-*`)
//! and the spec fields it reads, as `annotations::parse` turns them into a load balancer spec.
//! Input: `key=value` lines; a key without `/` gets the aws annotation prefix.
#![no_main]
use ccm_fuzz::annotations;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let svc = ccm_fuzz::service(data, "service.beta.kubernetes.io/aws-load-balancer-");
    let _ = annotations::kind_of(&svc);
    let _ = annotations::target_node_labels(&svc);
    if let Ok(spec) = annotations::parse(&svc) {
        let _ = spec.client_protocol();
    }
});
