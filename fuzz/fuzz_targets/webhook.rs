//! The manager's admission webhook server: `--webhooks` (the first input line) and the
//! AdmissionReview bodies (the rest) POSTed to `/<name>`, served by the router the manager
//! serves, with the PersistentVolume labeler on a sim cloud behind it.
#![no_main]
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use ccm_cloud::webhook::Webhook;
use ccm_manager::webhook::{self, WebhookMetrics, pvlabel::PvLabeler};
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use tokio::runtime::Runtime;
use tower::ServiceExt;

fn runtime() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| Runtime::new().expect("tokio runtime"))
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (flags, body) = text.split_once('\n').unwrap_or((&text, ""));
    let flags: Vec<String> = flags.split(',').map(str::to_string).collect();
    // The labeler starts its batching task on the current runtime.
    let _rt = runtime().enter();
    let labeler: Arc<dyn Webhook> =
        Arc::new(PvLabeler::new(Arc::new(ccm_provider_sim::SimCloud::new())));
    if webhook::check_syntax(&flags).is_ok() {
        let _ = webhook::select(&flags, &[labeler.name()]);
    }
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = WebhookMetrics::new(&mut registry);
    let app = webhook::router(&[labeler.clone()], &metrics);
    let content_type = if body.starts_with('{') {
        "application/json"
    } else {
        "text/plain"
    };
    let req = http::Request::post(format!("/{}", labeler.name()))
        .header("content-type", content_type)
        .body(axum::body::Body::from(Bytes::copy_from_slice(
            body.as_bytes(),
        )))
        .expect("request");
    runtime().block_on(async {
        let resp = app.oneshot(req).await.expect("the router answers");
        let status = resp.status();
        let out = resp.into_body().collect().await.expect("body").to_bytes();
        if status.is_success() {
            let v: serde_json::Value =
                serde_json::from_slice(&out).expect("an AdmissionReview answer is JSON");
            assert!(
                v["response"]["uid"].is_string(),
                "answer without the request's uid: {v}"
            );
        }
    });
});
