//! A small HTTP proxy in front of moto that counts calls by AWS action and fails the next N
//! calls of chosen actions the way AWS throttles: EC2 answers HTTP 503 `RequestLimitExceeded`,
//! ELB HTTP 400 `Throttling`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;

#[derive(Default)]
struct State {
    calls: BTreeMap<String, u64>,
    throttled: BTreeMap<String, u64>,
    fail_next: BTreeMap<String, u32>,
}

/// The proxy; dropped → its accept loop ends.
pub struct ThrottleProxy {
    pub url: String,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

fn action(body: &[u8]) -> String {
    String::from_utf8_lossy(body)
        .split('&')
        .find_map(|kv| kv.strip_prefix("Action="))
        .unwrap_or("?")
        .to_string()
}

fn throttle_response(action: &str) -> Response<Full<Bytes>> {
    let ec2 = !matches!(
        action,
        "DescribeLoadBalancers"
            | "CreateLoadBalancer"
            | "DeleteLoadBalancer"
            | "CreateTargetGroup"
            | "CreateListener"
            | "RegisterTargets"
            | "RegisterInstancesWithLoadBalancer"
            | "DescribeTargetGroups"
            | "DescribeListeners"
            | "DescribeTargetHealth"
            | "ConfigureHealthCheck"
    );
    let (status, body) = if ec2 {
        (
            503,
            "<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors><RequestID>proxy</RequestID></Response>",
        )
    } else {
        (
            400,
            "<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code><Message>Rate exceeded</Message></Error><RequestId>proxy</RequestId></ErrorResponse>",
        )
    };
    Response::builder()
        .status(status)
        .header("content-type", "text/xml")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .expect("static response")
}

impl ThrottleProxy {
    pub async fn start(upstream: &str) -> ThrottleProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let state = Arc::new(Mutex::new(State::default()));
        let client: Client<HttpConnector, Full<Bytes>> =
            Client::builder(TokioExecutor::new()).build_http();
        let upstream = upstream.to_string();
        let st = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (client, upstream, st) = (client.clone(), upstream.clone(), st.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let (client, upstream, st) = (client.clone(), upstream.clone(), st.clone());
                        async move { Ok::<_, Infallible>(forward(req, &client, &upstream, &st).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        ThrottleProxy { url, state, task }
    }

    /// Fails the next `n` calls of `action` with AWS's throttling error.
    pub fn fail_next(&self, action: &str, n: u32) {
        self.state.lock().fail_next.insert(action.to_string(), n);
    }

    /// Calls that reached the proxy, by action (throttled ones included).
    pub fn calls(&self) -> BTreeMap<String, u64> {
        self.state.lock().calls.clone()
    }

    /// Calls the proxy failed, by action.
    pub fn throttled(&self) -> BTreeMap<String, u64> {
        self.state.lock().throttled.clone()
    }
}

impl Drop for ThrottleProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(
    req: Request<Incoming>,
    client: &Client<HttpConnector, Full<Bytes>>,
    upstream: &str,
    st: &Mutex<State>,
) -> Response<Full<Bytes>> {
    let (mut parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let act = action(&body);
    {
        let mut s = st.lock();
        *s.calls.entry(act.clone()).or_default() += 1;
        if let Some(n) = s.fail_next.get_mut(&act).filter(|n| **n > 0) {
            *n -= 1;
            *s.throttled.entry(act.clone()).or_default() += 1;
            return throttle_response(&act);
        }
    }
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .to_string();
    parts.uri = format!("{upstream}{path}").parse().expect("upstream uri");
    let resp = match client
        .request(Request::from_parts(parts, Full::new(body)))
        .await
    {
        Ok(r) => r,
        Err(e) => {
            return Response::builder()
                .status(502)
                .body(Full::new(Bytes::from(e.to_string())))
                .expect("502");
        }
    };
    let (parts, body) = resp.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    Response::from_parts(parts, Full::new(body))
}
