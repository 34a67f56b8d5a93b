//! Whole requests to kube-sim, served in process as its listener serves them: method, path,
//! query parameters (selectors, `dryRun`, `fieldManager`, `limit`/`continue`, …), headers
//! (`Content-Type`, `Accept` with protobuf and Table negotiation) and JSON, protobuf or patch
//! bodies. Input: `METHOD /path?query` on the first line, `Name: value` header lines, an empty
//! line, the body. Watches are skipped (their response never ends), and so are admission
//! webhook configurations (kube-sim would call the URLs they name; a failed call is a 500, as
//! upstream's). The server keeps its state across inputs, as a real one would.
#![no_main]
use std::sync::OnceLock;

use bytes::Bytes;
use ccm_kube_sim::{Config, DEFAULT_TOKEN, KubeSim};
use http_body_util::{BodyExt, Full};
use libfuzzer_sys::fuzz_target;
use tokio::runtime::Runtime;

fn server() -> &'static (Runtime, KubeSim) {
    static SERVER: OnceLock<(Runtime, KubeSim)> = OnceLock::new();
    SERVER.get_or_init(|| {
        let rt = Runtime::new().expect("tokio runtime");
        let sim = rt
            .block_on(KubeSim::start(Config::default()))
            .expect("kube-sim starts");
        (rt, sim)
    })
}

fn request(data: &[u8]) -> Option<http::Request<Full<Bytes>>> {
    let split = data.windows(2).position(|w| w == b"\n\n");
    let (head, body) = match split {
        Some(i) => (&data[..i], &data[i + 2..]),
        None => (data, &[][..]),
    };
    let head = std::str::from_utf8(head).ok()?;
    let mut lines = head.lines();
    let (method, target) = lines.next()?.split_once(' ')?;
    if target.contains("watch") || target.contains("admissionregistration") {
        return None;
    }
    let mut b = http::Request::builder().method(method).uri(target);
    let mut auth = false;
    for l in lines {
        let (k, v) = l.split_once(':')?;
        auth |= k.eq_ignore_ascii_case("authorization");
        b = b.header(k.trim(), v.trim());
    }
    if !auth {
        b = b.header("authorization", format!("Bearer {DEFAULT_TOKEN}"));
    }
    b.body(Full::new(Bytes::copy_from_slice(body))).ok()
}

fuzz_target!(|data: &[u8]| {
    let Some(req) = request(data) else {
        return;
    };
    let (rt, sim) = server();
    rt.block_on(async {
        let resp = sim.serve_one(req).await;
        let status = resp.status();
        // A body that never ends shows as a libFuzzer timeout (`-timeout`).
        let body = resp.into_body().collect().await.map(|b| b.to_bytes());
        // A client's request never makes kube-sim fail inside (500).
        assert!(
            status != http::StatusCode::INTERNAL_SERVER_ERROR,
            "HTTP 500 for a client's request: {body:?}"
        );
    });
});
