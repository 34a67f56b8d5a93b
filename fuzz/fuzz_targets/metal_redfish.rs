//! The Redfish answers the metal provider parses: the service root, the Systems collection,
//! a System (`PowerState`, `UUID`, `SerialNumber`) and the session answer (`Location`,
//! `X-Auth-Token`), through `Redfish::lookup` against a loopback BMC. The first byte picks
//! which resource answers with the input (the others answer as a healthy BMC), its status,
//! how the config selects the System and the auth mode. Properties: a first lookup is never
//! "gone" (only a System seen before can be); no error shows the password.
#![no_main]
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::extract::State;
use axum::response::IntoResponse;
use ccm_provider_metal::config::{BmcAuth, BmcConfig};
use ccm_provider_metal::redfish::{Lookup, Redfish};
use libfuzzer_sys::fuzz_target;
use tokio::runtime::Runtime;

#[derive(Default)]
struct Answer {
    fuzzed: &'static str,
    status: u16,
    body: Vec<u8>,
}

type Shared = Arc<Mutex<Answer>>;

const ROOT: &str = r#"{"@odata.id":"/redfish/v1/","Systems":{"@odata.id":"/redfish/v1/Systems"}}"#;
const SYSTEMS: &str =
    r#"{"Members":[{"@odata.id":"/redfish/v1/Systems/1"}],"Members@odata.count":1}"#;
const SYSTEM: &str = r#"{"@odata.id":"/redfish/v1/Systems/1","Id":"1","PowerState":"On","UUID":"38947555-7742-3448-3784-823347823834","SerialNumber":"S1"}"#;
const PASSWORD: &str = "Fuzz0Bmc0Password";

async fn answer(State(s): State<Shared>, req: axum::extract::Request) -> axum::response::Response {
    let a = s.lock().expect("answer");
    let path = req.uri().path().trim_end_matches('/');
    let (name, fixed) = match path {
        "/redfish/v1" => ("root", ROOT),
        "/redfish/v1/Systems" => ("systems", SYSTEMS),
        "/redfish/v1/SessionService/Sessions" => ("session", "{}"),
        _ => ("system", SYSTEM),
    };
    if name != a.fuzzed {
        let status = if name == "session" { 201 } else { 200 };
        let status = http::StatusCode::from_u16(status).expect("status");
        let location = "/redfish/v1/SessionService/Sessions/1";
        return (
            status,
            [("location", location), ("x-auth-token", "tok")],
            fixed,
        )
            .into_response();
    }
    let status = http::StatusCode::from_u16(a.status).unwrap_or(http::StatusCode::OK);
    let (first, rest) = match a.body.iter().position(|&b| b == b'\n') {
        Some(i) if name == "session" => (&a.body[..i], &a.body[i + 1..]),
        _ => (&b""[..], &a.body[..]),
    };
    let mut resp = (status, rest.to_vec()).into_response();
    if let Ok(v) = http::HeaderValue::from_bytes(first) {
        resp.headers_mut().insert("location", v.clone());
        resp.headers_mut().insert("x-auth-token", v);
    }
    resp
}

fn bmc_server() -> &'static (Runtime, Shared, String) {
    static BMC: OnceLock<(Runtime, Shared, String)> = OnceLock::new();
    BMC.get_or_init(|| {
        let rt = Runtime::new().expect("tokio runtime");
        let shared = Shared::default();
        let app = axum::Router::new()
            .fallback(answer)
            .with_state(shared.clone());
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("loopback listener");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        rt.spawn(async move { axum::serve(listener, app).await });
        (rt, shared, url)
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let (rt, shared, url) = bmc_server();
    *shared.lock().expect("answer") = Answer {
        fuzzed: ["root", "systems", "system", "session"][usize::from(pick & 3)],
        status: [200, 201, 401, 404, 429, 500][usize::from((pick >> 2) & 7) % 6],
        body: body.to_vec(),
    };
    let mut bmc = BmcConfig {
        endpoint: url.clone(),
        ..BmcConfig::default()
    };
    match (pick >> 5) & 3 {
        0 => bmc.system = Some("1".into()),
        1 => bmc.system_uuid = Some("38947555-7742-3448-3784-823347823834".into()),
        2 => bmc.system_serial = Some("S1".into()),
        _ => {}
    }
    if pick & 0x80 != 0 {
        bmc.auth = BmcAuth::Session;
    }
    let redfish = Redfish::new(1, Duration::from_secs(10));
    let creds = Some(("admin".to_string(), PASSWORD.to_string()));
    match rt.block_on(redfish.lookup(&bmc, "node-1", creds)) {
        Ok(Lookup::Gone { offered }) => panic!("a System never seen is gone (offered {offered:?})"),
        Ok(Lookup::Found(_)) => {}
        Err(e) => assert!(!e.to_string().contains(PASSWORD), "the password shows: {e}"),
    }
});
