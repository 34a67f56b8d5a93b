//! kube-sim's protobuf request bodies (`application/vnd.kubernetes.protobuf`: `k8s\0` +
//! `runtime.Unknown`). A decoded object encodes, and its encoding decodes to a fixed point.
#![no_main]
use ccm_kube_sim::fuzzing::{decode_object, encode_object};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(obj) = decode_object(data) else {
        return;
    };
    let Ok(bytes) = encode_object(&obj) else {
        return;
    };
    let once = decode_object(&bytes).expect("kube-sim's own encoding decodes");
    let again = encode_object(&once).expect("a decoded object encodes");
    let twice = decode_object(&again).expect("kube-sim's own encoding decodes");
    assert_eq!(once, twice, "encode/decode is not stable");
});
