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
    let url = fault_server("503 Unavailable").await;
    let lbs = lbs_at(&url);
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

/// Octavia's 413 (its request body limit) is an error that says which setting to raise.
#[tokio::test]
async fn an_octavia_413_names_the_limit_to_raise() {
    let url = fault_server("413 Request Entity Too Large").await;
    let lbs = lbs_at(&url);
    let svc = service("web", &[("TCP", 80, 30080)], &[]);
    let ens = lbs
        .ensure_load_balancer(CLUSTER, &svc, &[node("a", "10.0.0.1")])
        .await;
    assert!(
        matches!(&ens, Err(CloudError::Permanent(m)) if m.contains("max_request_body_size")),
        "{ens:?}"
    );
}

/// The provider's load balancers, with Keystone (and so the catalog) at `url`.
fn lbs_at(url: &str) -> std::sync::Arc<dyn ccm_cloud::LoadBalancer> {
    let conf = format!(
        "[Global]\nauth-url = {url}/v3\nusername = u\npassword = p\ntenant-name = t\ndomain-id = default\nregion = RegionOne\n[LoadBalancer]\nsubnet-id = s\n"
    );
    let cfg = ccm_provider_openstack::OpenStackConfig::parse(&conf).expect("parses");
    let cloud = OpenStackCloud::with_regional_provider_id(cfg, false).expect("provider");
    cloud.load_balancer().expect("lb")
}

/// Keystone's token call gets a catalog pointing here; every other call `status`.
async fn fault_server(status: &'static str) -> String {
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
                    (status, "", "{\"faultstring\": \"injected\"}".to_string())
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

/// One request the stand-in Octavia received: method, path, body.
type Seen = std::sync::Arc<parking_lot::Mutex<Vec<(String, String, String)>>>;

/// A stand-in that answers Keystone and, for Octavia, one ACTIVE LB named `lb` with one pool
/// `pool_0_<lb>` and no members; records every request. Writes answer 202.
async fn one_lb_server(lb: &str) -> (String, Seen) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let seen: Seen = Default::default();
    let (b, s, lb) = (base.clone(), seen.clone(), lb.to_string());
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let (base, seen, lb) = (b.clone(), s.clone(), lb.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 16384];
                let (head, body) = loop {
                    let n = sock.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    let Some((head, body)) = text.split_once("\r\n\r\n") else {
                        continue;
                    };
                    let len = head
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse::<usize>().ok())?
                        })
                        .unwrap_or(0);
                    if body.len() >= len {
                        break (head.to_string(), body.to_string());
                    }
                };
                let mut words = head.split_whitespace();
                let method = words.next().unwrap_or_default().to_string();
                let path = words.next().unwrap_or_default().to_string();
                seen.lock().push((method.clone(), path.clone(), body));
                let lb_json = serde_json::json!({"id": "lb-1", "name": lb, "provisioning_status": "ACTIVE",
                    "vip_address": "10.0.0.5", "vip_port_id": "vip-port", "vip_subnet_id": "sub"});
                let (status, extra, body) = if path.starts_with("/v3/auth/tokens") {
                    let ep = |t: &str| {
                        serde_json::json!({"type": t, "endpoints": [
                        {"interface": "public", "region_id": "RegionOne", "region": "RegionOne", "url": base}]})
                    };
                    let body = serde_json::json!({"token": {"expires_at": "2099-01-01T00:00:00Z",
                        "catalog": [ep("load-balancer"), ep("network")]}});
                    ("201 Created", "x-subject-token: t\r\n", body.to_string())
                } else if method != "GET" {
                    ("202 Accepted", "", "{}".to_string())
                } else if path.starts_with("/v2/lbaas/loadbalancers?") {
                    (
                        "200 OK",
                        "",
                        serde_json::json!({"loadbalancers": [lb_json]}).to_string(),
                    )
                } else if path.starts_with("/v2/lbaas/loadbalancers/") {
                    (
                        "200 OK",
                        "",
                        serde_json::json!({"loadbalancer": lb_json}).to_string(),
                    )
                } else if path.starts_with("/v2/lbaas/pools?") {
                    let pool = serde_json::json!({"id": "pool-0", "name": format!("pool_0_{lb}"),
                        "protocol": "TCP", "lb_algorithm": "ROUND_ROBIN"});
                    (
                        "200 OK",
                        "",
                        serde_json::json!({"pools": [pool]}).to_string(),
                    )
                } else if path.starts_with("/v2.0/security-groups?") {
                    ("200 OK", "", "{\"security_groups\": []}".to_string())
                } else if path.starts_with("/v2.0/floatingips?") {
                    ("200 OK", "", "{\"floatingips\": []}".to_string())
                } else if path.contains("/members") {
                    ("200 OK", "", "{\"members\": []}".to_string())
                } else {
                    ("404 Not Found", "", "{}".to_string())
                };
                let resp = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(resp.as_bytes()).await;
            });
        }
    });
    (base, seen)
}

/// A refused annotation on a Service whose LB exists is an error for the ensure (the
/// controller's Warning Event names it) but the members still follow the Nodes: in the ensure
/// and in the Node-change update. Nothing but the members is written.
#[tokio::test]
async fn a_refused_annotation_never_stops_the_members_of_an_existing_lb() {
    let name = "kube_service_kubernetes_default_web";
    let (url, seen) = one_lb_server(name).await;
    let lbs = lbs_at(&url);
    let mut svc = service("web", &[("TCP", 80, 30080)], &[]);
    svc.metadata.annotations = Some(
        [(
            "loadbalancer.openstack.org/default-tls-container-ref".to_string(),
            "https://barbican/v1/containers/x".to_string(),
        )]
        .into(),
    );
    let writes = |seen: &Seen| -> Vec<(String, String, String)> {
        seen.lock()
            .iter()
            .filter(|(m, p, _)| m != "GET" && !p.starts_with("/v3/"))
            .cloned()
            .collect()
    };
    let e = lbs
        .ensure_load_balancer(CLUSTER, &svc, &[node("a", "10.0.0.1")])
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("default-tls-container-ref"), "{e}");
    let w = writes(&seen);
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(
        (w[0].0.as_str(), w[0].1.as_str()),
        ("PUT", "/v2/lbaas/pools/pool-0/members")
    );
    assert!(
        w[0].2.contains("10.0.0.1") && w[0].2.contains("30080"),
        "{w:?}"
    );

    seen.lock().clear();
    lbs.update_load_balancer(
        CLUSTER,
        &svc,
        &[node("a", "10.0.0.1"), node("b", "10.0.0.2")],
    )
    .await
    .expect("the members follow the Nodes");
    let w = writes(&seen);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].2.contains("10.0.0.2"), "{w:?}");

    // x-forwarded-for on a UDP port is refused too (a listener cannot serve it as asked):
    // an error naming it, and the members still follow.
    seen.lock().clear();
    let mut udp = service("web", &[("UDP", 53, 30053)], &[]);
    udp.metadata.annotations = Some(
        [(
            "loadbalancer.openstack.org/x-forwarded-for".to_string(),
            "true".to_string(),
        )]
        .into(),
    );
    let e = lbs
        .ensure_load_balancer(CLUSTER, &udp, &[node("c", "10.0.0.3")])
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("x-forwarded-for"), "{e}");
    let w = writes(&seen);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].2.contains("10.0.0.3") && w[0].2.contains("30053"),
        "{w:?}"
    );

    // Cleanup is not blocked either: the delete goes through.
    seen.lock().clear();
    lbs.ensure_load_balancer_deleted(CLUSTER, &svc)
        .await
        .expect("deleted");
    assert!(
        writes(&seen)
            .iter()
            .any(|(m, p, _)| m == "DELETE" && p.starts_with("/v2/lbaas/loadbalancers/lb-1")),
        "{:?}",
        writes(&seen)
    );
}
