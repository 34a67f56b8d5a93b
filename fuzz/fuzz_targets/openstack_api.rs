//! The OpenStack answers the provider parses itself: Keystone's token (expiry, service
//! catalog), Nova's server list (pages) and server, Neutron's ports, then the Node addresses
//! made of them. A loopback HTTP server answers with the input: the first byte picks which
//! call gets it (Keystone's token answer, or a Nova / Neutron answer after a fixed valid
//! token) and the status code.
#![no_main]
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::extract::State;
use axum::response::IntoResponse;
use ccm_provider_openstack::config::{GlobalOpts, NetworkingOpts};
use ccm_provider_openstack::http::Http;
use ccm_provider_openstack::keystone::Keystone;
use ccm_provider_openstack::{Secret, get_server, list_servers, node_addresses, ports_of};
use libfuzzer_sys::fuzz_target;
use tokio::runtime::Runtime;

/// What the fake cloud answers: the Keystone answer is the input or a fixed token; every
/// other call gets the input.
#[derive(Default)]
struct Answer {
    keystone_fuzzed: bool,
    status: u16,
    body: Vec<u8>,
}

type Shared = Arc<Mutex<Answer>>;

async fn answer(State(s): State<Shared>, req: axum::extract::Request) -> axum::response::Response {
    let a = s.lock().expect("answer");
    let status = http::StatusCode::from_u16(a.status).unwrap_or(http::StatusCode::OK);
    if req.uri().path().ends_with("/auth/tokens") {
        let host = req
            .headers()
            .get("host")
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let body = if a.keystone_fuzzed {
            a.body.clone()
        } else {
            serde_json::to_vec(&serde_json::json!({"token": {
                "expires_at": "2999-01-01T00:00:00Z",
                "catalog": [
                    {"type": "compute", "endpoints": [{"interface": "public", "region_id": "r1", "url": format!("http://{host}/compute")}]},
                    {"type": "network", "endpoints": [{"interface": "public", "region_id": "r1", "url": format!("http://{host}/network")}]}
                ]
            }}))
            .expect("json")
        };
        let status = if a.keystone_fuzzed {
            status
        } else {
            http::StatusCode::CREATED
        };
        return (status, [("x-subject-token", "fuzz-token")], body).into_response();
    }
    (status, a.body.clone()).into_response()
}

fn cloud() -> &'static (Runtime, Shared, String) {
    static CLOUD: OnceLock<(Runtime, Shared, String)> = OnceLock::new();
    CLOUD.get_or_init(|| {
        let rt = Runtime::new().expect("tokio runtime");
        let shared = Shared::default();
        let app = axum::Router::new()
            .fallback(answer)
            .with_state(shared.clone());
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("loopback listener");
        let url = format!("http://{}/v3", listener.local_addr().expect("address"));
        rt.spawn(async move { axum::serve(listener, app).await });
        (rt, shared, url)
    })
}

const PASSWORD: &str = "Fuzz0Secret0Password";

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let (rt, shared, url) = cloud();
    *shared.lock().expect("answer") = Answer {
        keystone_fuzzed: pick & 3 == 0,
        status: [200, 201, 404, 429, 500, 401][usize::from(pick >> 2) % 6],
        body: body.to_vec(),
    };
    let auth = GlobalOpts {
        auth_url: url.clone(),
        username: "demo".into(),
        password: Secret::new(PASSWORD),
        tenant_name: "demo".into(),
        domain_name: "Default".into(),
        region: "r1".into(),
        ..GlobalOpts::default()
    };
    let http = Arc::new(Http::new(None, false, Duration::from_secs(5)).expect("http client"));
    let ks = Keystone::new(http, auth, "public".into());
    let errors = rt.block_on(async {
        let mut errors = Vec::new();
        match pick & 3 {
            0 => errors.extend(ks.endpoint("compute").await.err()),
            1 => match list_servers(&ks).await {
                Ok(servers) => {
                    for s in &servers {
                        let _ = node_addresses(s, &[], &NetworkingOpts::default());
                    }
                }
                Err(e) => errors.push(e),
            },
            2 => errors.extend(get_server(&ks, "srv-1").await.err()),
            _ => match ports_of(&ks, &["srv-1", "srv-2"]).await {
                Ok(ports) => {
                    let s = ccm_provider_openstack::Server {
                        id: "srv-1".into(),
                        ..Default::default()
                    };
                    let refs: Vec<_> = ports.iter().collect();
                    let _ = node_addresses(&s, &refs, &NetworkingOpts::default());
                }
                Err(e) => errors.push(e),
            },
        }
        errors
    });
    for e in errors {
        assert!(
            !e.to_string().contains(PASSWORD),
            "the password shows in an error: {e}"
        );
    }
});
