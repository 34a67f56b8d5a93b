//! A hand-written Redfish BMC for what sushy-tools 2.2 cannot do: Redfish sessions
//! (it has no SessionService), chosen failures (a 404 service root, 401, 5xx on one path),
//! redirects to another origin, and a record of the headers each request carried. Systems
//! have vendor ids (`System.Embedded.1`, `1`), never node names.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;

/// One System of the fake BMC.
#[derive(Clone)]
pub struct FakeSystem {
    pub id: String,
    pub uuid: String,
    pub serial: String,
    pub power: String,
}

impl FakeSystem {
    pub fn new(id: &str, uuid: &str, serial: &str, power: &str) -> Self {
        FakeSystem {
            id: id.into(),
            uuid: uuid.into(),
            serial: serial.into(),
            power: power.into(),
        }
    }
}

/// A request as the BMC saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub authorization: Option<String>,
    pub token: Option<String>,
}

/// What the fake BMC serves; tests change it while it runs.
#[derive(Default)]
pub struct FakeState {
    pub systems: Vec<FakeSystem>,
    /// Path → status served instead of the resource.
    pub fail: HashMap<String, u16>,
    /// Path → `Location` of a 307.
    pub redirect: HashMap<String, String>,
    /// Required basic-auth credentials.
    pub basic: Option<(String, String)>,
    /// Sessions on: logins with these credentials get a token; every other request needs one.
    pub session: Option<(String, String)>,
    pub tokens: HashSet<String>,
    pub logins: usize,
    pub seen: Vec<Seen>,
}

/// The fake BMC on 127.0.0.1 and an ephemeral port; stops on drop.
pub struct FakeBmc {
    pub endpoint: String,
    pub state: Arc<Mutex<FakeState>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeBmc {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeBmc {
    pub async fn start(systems: Vec<FakeSystem>) -> Self {
        let state = Arc::new(Mutex::new(FakeState {
            systems,
            ..Default::default()
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake BMC");
        let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
        let app = axum::Router::new().fallback({
            let state = state.clone();
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let state = state.clone();
                async move { handle(&state, method, uri, headers, body) }
            }
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeBmc {
            endpoint,
            state,
            task,
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.lock().seen.clone()
    }
}

fn header(h: &HeaderMap, name: &str) -> Option<String> {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

fn json(v: serde_json::Value) -> Response {
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        v.to_string(),
    )
        .into_response()
}

fn handle(
    state: &Mutex<FakeState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut st = state.lock();
    let path = uri.path().to_string();
    st.seen.push(Seen {
        method: method.to_string(),
        path: path.clone(),
        authorization: header(&headers, "authorization"),
        token: header(&headers, "x-auth-token"),
    });
    if let Some(loc) = st.redirect.get(&path) {
        return (StatusCode::TEMPORARY_REDIRECT, [("location", loc.clone())]).into_response();
    }
    if let Some(code) = st.fail.get(&path) {
        return StatusCode::from_u16(*code)
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
            .into_response();
    }
    if method == Method::POST && path == "/redfish/v1/SessionService/Sessions" {
        return login(&mut st, &body);
    }
    if !authorized(&st, &headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    serve(&st, &path)
}

fn login(st: &mut FakeState, body: &[u8]) -> Response {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let given = (
        v["UserName"].as_str().unwrap_or("").to_string(),
        v["Password"].as_str().unwrap_or("").to_string(),
    );
    if st.session.as_ref() != Some(&given) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    st.logins += 1;
    let token = format!("token-{}", st.logins);
    st.tokens.insert(token.clone());
    (
        StatusCode::CREATED,
        [
            ("x-auth-token", token.clone()),
            (
                "location",
                format!("/redfish/v1/SessionService/Sessions/{token}"),
            ),
        ],
    )
        .into_response()
}

fn authorized(st: &FakeState, headers: &HeaderMap) -> bool {
    use base64::Engine as _;
    if let Some((u, p)) = &st.basic {
        let want = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
        );
        return header(headers, "authorization") == Some(want);
    }
    if st.session.is_some() {
        return header(headers, "x-auth-token").is_some_and(|t| st.tokens.contains(&t));
    }
    true
}

fn serve(st: &FakeState, path: &str) -> Response {
    match path.trim_end_matches('/') {
        "/redfish/v1" => json(serde_json::json!({
            "@odata.id": "/redfish/v1/",
            "Systems": {"@odata.id": "/redfish/v1/Systems"},
            "SessionService": {"@odata.id": "/redfish/v1/SessionService"},
        })),
        "/redfish/v1/Systems" => {
            let members: Vec<_> = st
                .systems
                .iter()
                .map(|s| serde_json::json!({"@odata.id": format!("/redfish/v1/Systems/{}", s.id)}))
                .collect();
            json(serde_json::json!({"Members@odata.count": members.len(), "Members": members}))
        }
        p => match p
            .strip_prefix("/redfish/v1/Systems/")
            .and_then(|id| st.systems.iter().find(|s| s.id == id))
        {
            Some(s) => json(serde_json::json!({
                "@odata.id": format!("/redfish/v1/Systems/{}", s.id),
                "Id": s.id,
                "UUID": s.uuid,
                "SerialNumber": s.serial,
                "PowerState": s.power,
            })),
            None => StatusCode::NOT_FOUND.into_response(),
        },
    }
}
