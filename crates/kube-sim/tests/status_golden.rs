//! Golden `metav1.Status` bodies for each error kind, over raw HTTP so nothing in between
//! (retries, decoding) hides what the server sent.

use ccm_kube_sim::{Config, KubeSim, Verb};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Resp {
    code: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
    fn header(&self, k: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(h, _)| h.eq_ignore_ascii_case(k))
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request with `Connection: close`, de-chunking the body.
async fn raw(
    sim: &KubeSim,
    method: &str,
    path: &str,
    token: Option<&str>,
    ct: &str,
    body: &str,
) -> Resp {
    let mut s = TcpStream::connect(sim.addr()).await.unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nUser-Agent: golden\r\n"
    );
    if let Some(t) = token {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    if !body.is_empty() {
        req.push_str(&format!(
            "Content-Type: {ct}\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let code = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| {
            l.split_once(": ")
                .map(|(a, b)| (a.to_string(), b.to_string()))
        })
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v == "chunked");
    let body = if chunked {
        let mut out = String::new();
        let mut r = rest;
        while let Some((len, after)) = r.split_once("\r\n") {
            let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
            if n == 0 {
                break;
            }
            out.push_str(&after[..n]);
            r = &after[n + 2..];
        }
        out
    } else {
        rest.to_string()
    };
    Resp {
        code,
        headers,
        body,
    }
}

async fn sim() -> KubeSim {
    KubeSim::start(Config::default()).await.unwrap()
}

const TOKEN: Option<&str> = Some(ccm_kube_sim::DEFAULT_TOKEN);
const NODE: &str = r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1"}}"#;

#[tokio::test]
async fn golden_status_bodies() {
    let sim = sim().await;
    let json = "application/json";

    let r = raw(&sim, "GET", "/api/v1/nodes", None, json, "").await;
    assert_eq!(r.code, 401);
    insta::assert_json_snapshot!("unauthorized", r.json());

    let r = raw(&sim, "GET", "/api/v1/nodes/missing", TOKEN, json, "").await;
    assert_eq!(r.code, 404);
    insta::assert_json_snapshot!("not_found", r.json());

    let r = raw(
        &sim,
        "GET",
        "/apis/coordination.k8s.io/v1/namespaces/default/leases/missing",
        TOKEN,
        json,
        "",
    )
    .await;
    insta::assert_json_snapshot!("not_found_grouped", r.json());

    let r = raw(&sim, "GET", "/api/v1/widgets", TOKEN, json, "").await;
    assert_eq!(r.code, 404);
    insta::assert_json_snapshot!("unknown_resource", r.json());

    let r = raw(
        &sim,
        "POST",
        "/api/v1/namespaces/missing/configmaps",
        TOKEN,
        json,
        r#"{"metadata":{"name":"x"}}"#,
    )
    .await;
    assert_eq!(r.code, 404);
    insta::assert_json_snapshot!("namespace_not_found", r.json());

    assert_eq!(
        raw(&sim, "POST", "/api/v1/nodes", TOKEN, json, NODE)
            .await
            .code,
        201
    );
    let r = raw(&sim, "POST", "/api/v1/nodes", TOKEN, json, NODE).await;
    assert_eq!(r.code, 409);
    insta::assert_json_snapshot!("already_exists", r.json());

    let stale =
        r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1","resourceVersion":"1"}}"#;
    let r = raw(&sim, "PUT", "/api/v1/nodes/n1", TOKEN, json, stale).await;
    assert_eq!(r.code, 409);
    insta::assert_json_snapshot!("conflict", r.json());

    let r = raw(
        &sim,
        "DELETE",
        "/api/v1/nodes/n1",
        TOKEN,
        json,
        r#"{"preconditions":{"uid":"00000000-0000-0000-0000-000000000000"}}"#,
    )
    .await;
    assert_eq!(r.code, 409);
    let mut v = r.json();
    // The object's uid is random; keep the shape.
    let msg = v["message"].as_str().unwrap().to_string();
    let cut = msg.find("UID in object meta: ").unwrap() + "UID in object meta: ".len();
    v["message"] = Value::String(format!("{}<uid>", &msg[..cut]));
    insta::assert_json_snapshot!("precondition_failed", v);

    let svc = r#"{"metadata":{"name":"s"},"spec":{"type":"Bogus","ports":[{"port":80}]}}"#;
    let r = raw(
        &sim,
        "POST",
        "/api/v1/namespaces/default/services",
        TOKEN,
        json,
        svc,
    )
    .await;
    assert_eq!(r.code, 422);
    insta::assert_json_snapshot!("invalid_single", r.json());

    let svc = r#"{"metadata":{"name":"s"},"spec":{"ports":[{"port":0,"targetPort":80},{"name":"b","port":70000,"protocol":"ICMP"}]}}"#;
    let r = raw(
        &sim,
        "POST",
        "/api/v1/namespaces/default/services",
        TOKEN,
        json,
        svc,
    )
    .await;
    insta::assert_json_snapshot!("invalid_multiple", r.json());

    let taint = r#"{"spec":{"taints":[{"key":"k","effect":"Sometimes"}]}}"#;
    let r = raw(
        &sim,
        "PATCH",
        "/api/v1/nodes/n1",
        TOKEN,
        "application/strategic-merge-patch+json",
        taint,
    )
    .await;
    insta::assert_json_snapshot!("invalid_taint", r.json());

    let r = raw(
        &sim,
        "PATCH",
        "/api/v1/nodes/n1",
        TOKEN,
        "application/json-patch+json",
        r#"[{"op":"test","path":"/metadata/name","value":"other"}]"#,
    )
    .await;
    assert_eq!(r.code, 422);
    insta::assert_json_snapshot!("json_patch_test_failed", r.json());

    let r = raw(
        &sim,
        "PATCH",
        "/api/v1/nodes/n1",
        TOKEN,
        "application/apply-patch+yaml",
        "metadata: {}",
    )
    .await;
    assert_eq!(r.code, 400);
    insta::assert_json_snapshot!("apply_requires_field_manager", r.json());

    let r = raw(
        &sim,
        "GET",
        "/api/v1/nodes?fieldSelector=spec.bogus%3Dx",
        TOKEN,
        json,
        "",
    )
    .await;
    assert_eq!(r.code, 400);
    insta::assert_json_snapshot!("bad_field_selector", r.json());

    let r = raw(&sim, "POST", "/api/v1/nodes/n1/status", TOKEN, json, NODE).await;
    assert_eq!(r.code, 405);
    insta::assert_json_snapshot!("method_not_allowed", r.json());

    // Watch from an expired resourceVersion: 200 with one ERROR event carrying 410 Expired.
    sim.faults().compact();
    let r = raw(
        &sim,
        "GET",
        "/api/v1/nodes?watch=1&resourceVersion=1",
        TOKEN,
        json,
        "",
    )
    .await;
    assert_eq!(r.code, 200);
    let ev: Value = serde_json::from_str(r.body.trim()).unwrap();
    insta::assert_json_snapshot!("watch_expired", ev);

    sim.faults().set_429_rate(Some(Verb::List), 1.0);
    sim.faults().set_retry_after(3);
    let r = raw(&sim, "GET", "/api/v1/nodes", TOKEN, json, "").await;
    assert_eq!(r.code, 429);
    assert_eq!(r.header("retry-after"), Some("3"));
    insta::assert_json_snapshot!("too_many_requests", r.json());
    sim.faults().clear();

    sim.faults().set_500_rate(Some(Verb::Get), 1.0);
    let r = raw(&sim, "GET", "/api/v1/nodes/n1", TOKEN, json, "").await;
    assert_eq!(r.code, 500);
    insta::assert_json_snapshot!("internal_error", r.json());
    sim.faults().clear();

    // Plain delete without finalizers: Status Success with details.
    let r = raw(&sim, "DELETE", "/api/v1/nodes/n1", TOKEN, json, "").await;
    assert_eq!(r.code, 200);
    let mut v = r.json();
    assert!(v["details"]["uid"].is_string());
    v["details"]["uid"] = Value::String("<uid>".into());
    insta::assert_json_snapshot!("delete_success", v);
}

#[tokio::test]
async fn token_request_and_metrics() {
    let sim = sim().await;
    let json = "application/json";
    let r = raw(
        &sim,
        "POST",
        "/api/v1/namespaces/kube-system/serviceaccounts",
        TOKEN,
        json,
        r#"{"metadata":{"name":"node-controller"}}"#,
    )
    .await;
    assert_eq!(r.code, 201, "{}", r.body);
    let r = raw(&sim, "POST", "/api/v1/namespaces/kube-system/serviceaccounts/node-controller/token", TOKEN, json,
        r#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"audiences":[]}}"#).await;
    assert_eq!(r.code, 201, "{}", r.body);
    let v = r.json();
    assert_eq!(v["kind"], "TokenRequest");
    let tok = v["status"]["token"].as_str().unwrap().to_string();
    assert!(v["status"]["expirationTimestamp"].is_string());
    // The new token is accepted.
    let r = raw(&sim, "GET", "/api/v1/nodes", Some(&tok), json, "").await;
    assert_eq!(r.code, 200);
    let r = raw(&sim, "GET", "/api/v1/nodes", Some("wrong"), json, "").await;
    assert_eq!(r.code, 401);

    assert_eq!(
        raw(&sim, "POST", "/api/v1/nodes", TOKEN, json, NODE)
            .await
            .code,
        201
    );
    assert_eq!(
        raw(
            &sim,
            "PATCH",
            "/api/v1/nodes/n1",
            TOKEN,
            "application/merge-patch+json",
            r#"{"metadata":{"labels":{"a":"b"}}}"#
        )
        .await
        .code,
        200
    );
    assert_eq!(sim.count_writes("golden"), 4);
    let r = raw(&sim, "GET", "/metrics", TOKEN, json, "").await;
    assert!(r.body.contains(r#"apiserver_request_total{client="golden",code="201",component="apiserver",group="",resource="nodes",scope="",subresource="",verb="POST",version=""} 1"#), "{}", r.body);
    assert!(
        r.body
            .contains(r#"resource="serviceaccounts",scope="",subresource="token",verb="POST""#),
        "{}",
        r.body
    );

    // Discovery and health are served.
    for p in [
        "/version",
        "/api",
        "/apis",
        "/api/v1",
        "/apis/coordination.k8s.io/v1",
        "/healthz",
        "/openapi/v3",
    ] {
        assert_eq!(raw(&sim, "GET", p, TOKEN, json, "").await.code, 200, "{p}");
    }
    let v = raw(&sim, "GET", "/api/v1", TOKEN, json, "").await.json();
    let names: Vec<&str> = v["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    for n in [
        "nodes",
        "nodes/status",
        "services",
        "services/status",
        "serviceaccounts/token",
        "namespaces",
        "events",
    ] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
}
