//! The metal provider's Service inputs: MetalLB / kube-vip address, pool and sharing
//! annotations and `spec.loadBalancerIP` (`ipam::request_from`), and the kube-vip annotation
//! it maintains (`kube_vip`). Input: `key=value` lines; a key without `/` gets
//! `metallb.universe.tf/`.
#![no_main]
use ccm_provider_metal::{ipam, kube_vip};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let svc = ccm_fuzz::service(data, "metallb.universe.tf/");
    let _ = ipam::request_from(&svc);
    let ips = kube_vip::status_ips(&svc);
    let _ = kube_vip::plan(&svc, &ips);
    let _ = kube_vip::desired(&svc, Some(ips.as_slice()));
    let _ = kube_vip::ours_within(&svc, &ips);
    let _ = ccm_provider_metal::adoption_order(std::slice::from_ref(&svc));
});
