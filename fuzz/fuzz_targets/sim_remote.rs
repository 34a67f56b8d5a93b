//! The sim cloud server's wire protocol (`ccm kube-sim`'s sim endpoint, `RemoteSim`'s peer):
//! method, path and JSON body of a request, served in process by the router it serves.
//! Input: `METHOD /path` on the first line, the body after it. Event streams are skipped
//! (their response never ends).
#![no_main]
use std::sync::OnceLock;

use ccm_provider_sim::SimCloud;
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

fn runtime() -> &'static (Runtime, SimCloud) {
    static RT: OnceLock<(Runtime, SimCloud)> = OnceLock::new();
    RT.get_or_init(|| (Runtime::new().expect("tokio runtime"), SimCloud::new()))
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (head, body) = text.split_once('\n').unwrap_or((&text, ""));
    let Some((method, path)) = head.split_once(' ') else {
        return;
    };
    if path.contains("events") {
        return;
    }
    let Ok(req) = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body.to_string()))
    else {
        return;
    };
    let (rt, sim) = runtime();
    let app = ccm_provider_sim::remote::router(sim.clone(), CancellationToken::new());
    rt.block_on(async {
        let resp = app.oneshot(req).await.expect("the router answers");
        let status = resp.status();
        let out = resp.into_body().collect().await.map(|b| b.to_bytes());
        assert!(
            status != http::StatusCode::INTERNAL_SERVER_ERROR,
            "HTTP 500 for a client's request: {out:?}"
        );
    });
});
