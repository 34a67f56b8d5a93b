//! Octavia failing: a 5xx is an error, never "no load balancer". A stand-in server, because a
//! real Octavia does not fail on request; the scenario on the real Octavia runs in
//! tests/neutron.rs on the shared stack (support/lb.rs).

mod support;

use ccm_cloud::{CloudError, CloudProvider};
use ccm_provider_openstack::OpenStackCloud;
use support::lb::{CLUSTER, node, service};

/// Octavia answering 5xx is an error, never "no load balancer" (which would skip its cleanup).
#[tokio::test]
async fn an_octavia_5xx_is_an_error_not_gone() {
    let url = fault_server().await;
    let conf = format!(
        "[Global]\nauth-url = {url}/v3\nusername = u\npassword = p\ntenant-name = t\ndomain-id = default\nregion = RegionOne\n[LoadBalancer]\nsubnet-id = s\n"
    );
    let cfg = ccm_provider_openstack::OpenStackConfig::parse(&conf).expect("parses");
    let cloud = OpenStackCloud::with_regional_provider_id(cfg, false).expect("provider");
    let lbs = cloud.load_balancer().expect("lb");
    let svc = service("web", &[("TCP", 80, 30080)], &[]);
    let got = lbs.get_load_balancer(CLUSTER, &svc).await;
    assert!(matches!(got, Err(CloudError::Transient(_))), "{got:?}");
    let del = lbs.ensure_load_balancer_deleted(CLUSTER, &svc).await;
    assert!(matches!(del, Err(CloudError::Transient(_))), "{del:?}");
    let ens = lbs
        .ensure_load_balancer(CLUSTER, &svc, &[node("a", "10.0.0.1")])
        .await;
    assert!(matches!(ens, Err(CloudError::Transient(_))), "{ens:?}");
}

/// Keystone's token call gets a catalog pointing here; every other call a 503.
async fn fault_server() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let b = base.clone();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let base = b.clone();
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = [0u8; 16384];
                let n = sock.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                let (status, extra, body) = if head.starts_with("POST /v3/auth/tokens") {
                    let ep = |t: &str| {
                        serde_json::json!({"type": t, "endpoints": [
                        {"interface": "public", "region_id": "RegionOne", "region": "RegionOne", "url": base}]})
                    };
                    let body = serde_json::json!({"token": {"expires_at": "2099-01-01T00:00:00Z",
                        "catalog": [ep("load-balancer"), ep("network")]}});
                    ("201 Created", "x-subject-token: t\r\n", body.to_string())
                } else {
                    (
                        "503 Unavailable",
                        "",
                        "{\"faultstring\": \"injected\"}".to_string(),
                    )
                };
                let resp = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(resp.as_bytes()).await;
            });
        }
    });
    base
}
