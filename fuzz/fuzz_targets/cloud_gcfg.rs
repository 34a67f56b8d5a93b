//! The gcfg INI reader under the aws and openstack cloud-configs (`ccm_cloud::gcfg::parse`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(sections) = ccm_cloud::gcfg::parse(text) {
        for s in &sections {
            for e in &s.entries {
                // Every entry is on a line of the input.
                assert!(e.line >= 1 && e.line <= text.lines().count().max(1));
            }
        }
    }
});
