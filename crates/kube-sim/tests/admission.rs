//! kube-sim as the caller of admission webhooks: ordering (mutating before validating),
//! reinvocation, selectors, denials in the real server's words, and TLS verified against the
//! caBundle. The webhooks are written here (an HTTPS server answering AdmissionReviews by path):
//! kube-sim's side is the subject; the CCM's own webhook is driven end to end in
//! crates/ccm/tests/webhook_kubectl.rs.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::routing::post;
use base64::Engine as _;
use ccm_kube_sim::{Config, KubeSim};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use parking_lot::Mutex;
use serde_json::{Value, json};

type Calls = Arc<Mutex<BTreeMap<String, u32>>>;

/// `add-first` / `add-second`: add a label; `need-second`: refuses an object without the label
/// `add-second` sets; `deny`: refuses with a message; `garbage`: answers another uid.
async fn hook(
    State(calls): State<Calls>,
    Path(name): Path<String>,
    axum::Json(review): axum::Json<Value>,
) -> axum::Json<Value> {
    *calls.lock().entry(name.clone()).or_default() += 1;
    let req = &review["request"];
    let uid = req["uid"].as_str().unwrap_or_default().to_string();
    let labels = req["object"]["metadata"]["labels"].clone();
    let has = |k: &str| labels.get(k).is_some();
    let label_patch = |k: &str| {
        let mut l = labels.as_object().cloned().unwrap_or_default();
        // Counts the labels it saw, so a reinvocation that saw more is visible.
        l.insert(
            k.into(),
            json!(format!("saw-{}", labels.as_object().map_or(0, |m| m.len()))),
        );
        let patch = json!([{"op": "add", "path": "/metadata/labels", "value": l}]);
        base64::engine::general_purpose::STANDARD.encode(patch.to_string())
    };
    let response = match name.as_str() {
        "add-first" => {
            json!({"uid": uid, "allowed": true, "patchType": "JSONPatch", "patch": label_patch("first")})
        }
        "add-second" if !has("second") => {
            json!({"uid": uid, "allowed": true, "patchType": "JSONPatch", "patch": label_patch("second")})
        }
        "need-second" if !has("second") => {
            json!({"uid": uid, "allowed": false, "status": {"message": "no label second"}})
        }
        "deny" => {
            json!({"uid": uid, "allowed": false, "status": {"code": 403, "reason": "Forbidden", "message": "configmaps named bad-* are not allowed"}})
        }
        "garbage" => json!({"uid": "not-the-uid", "allowed": true}),
        _ => json!({"uid": uid, "allowed": true}),
    };
    axum::Json(
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}),
    )
}

/// Serves the hooks over HTTPS with a fresh CA; returns (port, CA PEM, calls).
async fn webhooks() -> (u16, String, Calls) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".into()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let calls = Calls::default();
    let app = Router::new()
        .route("/{name}", post(hook))
        .with_state(calls.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper_util::service::TowerToHyperService::new(app);
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                .await;
            });
        }
    });
    (port, ca.pem(), calls)
}

fn webhook(name: &str, port: u16, ca: &str, extra: Value) -> Value {
    let mut w = json!({
        "name": format!("{name}.test.io"),
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "clientConfig": {"url": format!("https://localhost:{port}/{name}"),
            "caBundle": base64::engine::general_purpose::STANDARD.encode(ca)},
        "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}],
    });
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        w[k] = v;
    }
    w
}

async fn configure(client: &kube::Client, kind: &str, name: &str, hooks: Vec<Value>) {
    let plural = format!("{}webhookconfigurations", kind.to_lowercase());
    let body = json!({"apiVersion": "admissionregistration.k8s.io/v1",
        "kind": format!("{kind}WebhookConfiguration"), "metadata": {"name": name}, "webhooks": hooks});
    let req = http::Request::post(format!("/apis/admissionregistration.k8s.io/v1/{plural}"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).unwrap())
        .unwrap();
    client
        .request::<Value>(req)
        .await
        .expect("create configuration");
}

async fn create(api: &Api<ConfigMap>, name: &str, labels: Value) -> Result<ConfigMap, kube::Error> {
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
    api.create(&PostParams::default(), &cm).await
}

fn api_error(r: Result<ConfigMap, kube::Error>) -> kube::core::Status {
    match r {
        Err(kube::Error::Api(e)) => *e,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_are_called_as_kube_apiserver_calls_them() {
    let sim = KubeSim::start(Config::default()).await.expect("kube-sim");
    let client = sim.client().expect("client");
    let (port, ca, calls) = webhooks().await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");

    // Mutating in configuration-name order; add-first asks to be called again if a later
    // webhook changes the object; validating after all mutations.
    let only_labelled = json!({"objectSelector": {"matchLabels": {"admit": "me"}}});
    let mut first = webhook("add-first", port, &ca, only_labelled.clone());
    first["reinvocationPolicy"] = json!("IfNeeded");
    configure(&client, "Mutating", "a-first", vec![first]).await;
    configure(
        &client,
        "Mutating",
        "b-second",
        vec![webhook("add-second", port, &ca, only_labelled.clone())],
    )
    .await;
    configure(
        &client,
        "Validating",
        "c-check",
        vec![webhook("need-second", port, &ca, only_labelled)],
    )
    .await;

    let cm = create(&api, "mutated", json!({"admit": "me"}))
        .await
        .expect("admitted");
    let labels = cm.metadata.labels.expect("labels");
    assert_eq!(labels["second"], "saw-2", "add-second saw admit+first");
    assert_eq!(
        labels["first"], "saw-3",
        "add-first, reinvoked, saw admit+first+second: {labels:?}"
    );
    assert_eq!(
        calls.lock().get("add-first"),
        Some(&2),
        "called, then reinvoked once"
    );
    assert_eq!(
        calls.lock().get("need-second"),
        Some(&1),
        "validating saw the mutated object"
    );

    // objectSelector: an object without the label is not sent to any of them.
    let before = calls.lock().clone();
    create(&api, "plain", json!({})).await.expect("plain");
    assert_eq!(*calls.lock(), before);

    // A denial, as ToStatusErr shapes it.
    configure(&client, "Validating", "d-deny", vec![webhook("deny", port, &ca,
        json!({"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["default"]}]}}))]).await;
    let e = api_error(create(&api, "bad-1", json!({})).await);
    assert_eq!(e.code, 403);
    assert_eq!(e.reason, "Forbidden");
    assert_eq!(
        e.message,
        "admission webhook \"deny.test.io\" denied the request: configmaps named bad-* are not allowed"
    );

    // An answer for another request is a calling failure (Fail: 500 InternalError).
    configure(
        &client,
        "Validating",
        "e-garbage",
        vec![webhook("garbage", port, &ca, json!({}))],
    )
    .await;
    let other: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    let e = api_error(create(&other, "x", json!({})).await);
    assert_eq!((e.code, e.reason.as_str()), (500, "InternalError"));
    assert!(e.message.starts_with("Internal error occurred: failed calling webhook \"garbage.test.io\": expected response.uid="), "{}", e.message);

    // A webhook whose certificate its caBundle did not sign is never trusted.
    let (_, stranger_ca, _) = webhooks().await;
    let mut untrusted = webhook("allow", port, &stranger_ca, json!({}));
    untrusted["rules"][0]["resources"] = json!(["secrets"]);
    configure(&client, "Validating", "f-untrusted", vec![untrusted]).await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), "default");
    let s: k8s_openapi::api::core::v1::Secret =
        serde_json::from_value(json!({"metadata": {"name": "s"}})).unwrap();
    match secrets.create(&PostParams::default(), &s).await {
        Err(kube::Error::Api(e)) => assert!(
            e.message
                .contains("x509: certificate signed by unknown authority"),
            "{}",
            e.message
        ),
        other => panic!("an untrusted webhook was accepted: {other:?}"),
    }
    assert_eq!(
        calls.lock().get("allow"),
        None,
        "the untrusted endpoint saw no request"
    );

    // Configurations are validated as the real server validates them.
    let bad = json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "bad"}, "webhooks": [{"name": "x.test.io", "clientConfig": {"url": "https://localhost/"},
        "sideEffects": "Some", "admissionReviewVersions": ["v1"]}]});
    let req = http::Request::post(
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
    )
    .header("content-type", "application/json")
    .body(serde_json::to_vec(&bad).unwrap())
    .unwrap();
    let err = client.request::<Value>(req).await.unwrap_err().to_string();
    assert!(
        err.contains("webhooks[0].sideEffects: Unsupported value: \"Some\""),
        "{err}"
    );
}
