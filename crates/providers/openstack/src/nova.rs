//! Nova and Neutron reads: every server of the project in as few pages as Nova allows, the
//! ports of many servers in one Neutron call, and the one GET that confirms a server is gone.

use std::collections::{BTreeMap, HashSet};

use ccm_cloud::CloudError;
use http::Method;
use serde::Deserialize;

use crate::http::status_error;
use crate::keystone::Keystone;

/// Compute API microversion: 2.47 embeds the flavor (its `original_name`) in the server, so
/// no flavor GET per server; 2.69 lists servers of an unreachable cell as minimal records with
/// status `UNKNOWN` instead of leaving them out — a server missing from a listing is then
/// really absent, not hidden by a cell outage.
pub const COMPUTE_MICROVERSION: &str = "2.69";

/// Servers per page asked for (Nova's default `max_limit`).
pub const PAGE_SIZE: usize = 1000;

/// Ports asked for per Neutron call (`device_id=…` repeated; keeps the URL short).
pub const PORTS_PER_CALL: usize = 50;

/// Status of a server in a cell Nova cannot reach (microversion 2.69).
pub const STATUS_UNKNOWN: &str = "UNKNOWN";

/// A server as the CCM needs it.
#[derive(Debug, Clone, Deserialize, Default)]
pub struct Server {
    /// The server UUID.
    pub id: String,
    /// Its name (absent in down-cell records).
    #[serde(default)]
    pub name: String,
    /// `ACTIVE`, `SHUTOFF`, …
    #[serde(default)]
    pub status: String,
    /// The embedded flavor.
    #[serde(default)]
    pub flavor: Flavor,
    /// The availability zone.
    #[serde(rename = "OS-EXT-AZ:availability_zone", default)]
    pub availability_zone: String,
    /// Addresses by network name (a sorted map: upstream walks the networks sorted).
    #[serde(default)]
    pub addresses: BTreeMap<String, Vec<ServerAddress>>,
    /// `accessIPv4`.
    #[serde(rename = "accessIPv4", default)]
    pub access_ipv4: String,
    /// `accessIPv6`.
    #[serde(rename = "accessIPv6", default)]
    pub access_ipv6: String,
    /// Server metadata (`hostname` becomes a Hostname address).
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// The flavor embedded in a server (microversion ≥ 2.47).
#[derive(Debug, Clone, Deserialize, Default)]
pub struct Flavor {
    /// The flavor's name when the server was built.
    #[serde(default)]
    pub original_name: Option<String>,
}

/// One address of a server.
#[derive(Debug, Clone, Deserialize)]
pub struct ServerAddress {
    /// The IP.
    pub addr: String,
    /// `fixed` or `floating`.
    #[serde(rename = "OS-EXT-IPS:type", default)]
    pub kind: String,
}

/// A Neutron port as the address rules need it.
#[derive(Debug, Clone, Deserialize)]
pub struct Port {
    /// The server it is attached to.
    pub device_id: String,
    /// `ACTIVE`, `DOWN`, …
    #[serde(default)]
    pub status: String,
    /// Its fixed IPs.
    #[serde(default)]
    pub fixed_ips: Vec<FixedIp>,
}

/// A fixed IP of a port.
#[derive(Debug, Clone, Deserialize)]
pub struct FixedIp {
    /// The IP.
    pub ip_address: String,
}

#[derive(Deserialize)]
struct ServerPage {
    servers: Vec<Server>,
    #[serde(default)]
    servers_links: Vec<Link>,
}

#[derive(Deserialize)]
struct Link {
    rel: String,
}

#[derive(Deserialize)]
struct OneServer {
    server: Server,
}

#[derive(Deserialize)]
struct Ports {
    ports: Vec<Port>,
}

fn microversion_headers() -> [(&'static str, &'static str); 2] {
    [
        ("openstack-api-version", "compute 2.69"),
        ("x-openstack-nova-api-version", COMPUTE_MICROVERSION),
    ]
}

/// Every server of the project, following Nova's pages to the end. An error on any page is an
/// error for the whole listing: a partial listing proves nothing about absent servers.
pub async fn list_servers(ks: &Keystone) -> Result<Vec<Server>, CloudError> {
    let op = "compute GET /servers/detail";
    let mut out: Vec<Server> = Vec::new();
    let mut seen = HashSet::new();
    let mut marker: Option<String> = None;
    // A bound against a server that keeps answering "next": 10,000 pages of 1,000.
    for _ in 0..10_000 {
        let mut path = format!("/servers/detail?limit={PAGE_SIZE}");
        if let Some(m) = &marker {
            path.push_str("&marker=");
            path.push_str(&url::form_urlencoded::byte_serialize(m.as_bytes()).collect::<String>());
        }
        let reply = ks
            .request(
                "compute",
                op,
                Method::GET,
                &path,
                &microversion_headers(),
                None,
            )
            .await?;
        if !reply.status.is_success() {
            return Err(status_error(op, &reply));
        }
        let page: ServerPage = reply.json(op)?;
        let next = next_marker(&page, &mut seen)
            .map_err(|e| CloudError::Transient(format!("{op}: {e}")))?;
        out.extend(page.servers);
        match next {
            Some(id) => marker = Some(id),
            None => return Ok(out),
        }
    }
    Err(CloudError::Transient(format!(
        "{op}: more than 10,000 pages; refusing to go on"
    )))
}

/// The marker of the page after `page`, `None` after the last page. A marker already used
/// means the server leads in a circle (a proxy or cache answering every page alike): an error
/// at once, not thousands of requests for the same servers.
fn next_marker(page: &ServerPage, seen: &mut HashSet<String>) -> Result<Option<String>, String> {
    let more = page.servers_links.iter().any(|l| l.rel == "next");
    let Some(last) = page.servers.last().filter(|_| more) else {
        return Ok(None);
    };
    if !seen.insert(last.id.clone()) {
        return Err(format!(
            "the page after server {} was asked for already: Nova's pages go in a circle",
            last.id
        ));
    }
    Ok(Some(last.id.clone()))
}

/// One server by id: `Ok(None)` only on Nova's authoritative 404 for that exact server.
pub async fn get_server(ks: &Keystone, id: &str) -> Result<Option<Server>, CloudError> {
    let op = "compute GET /servers/{id}";
    let path = format!(
        "/servers/{}",
        url::form_urlencoded::byte_serialize(id.as_bytes()).collect::<String>()
    );
    let reply = ks
        .request(
            "compute",
            op,
            Method::GET,
            &path,
            &microversion_headers(),
            None,
        )
        .await?;
    match reply.status.as_u16() {
        200 => Ok(Some(reply.json::<OneServer>(op)?.server)),
        404 if is_nova_not_found(&reply.body) => Ok(None),
        _ => Err(status_error(op, &reply)),
    }
}

/// Nova's own "no such server" body (`{"itemNotFound": …}`), as opposed to a 404 from a proxy
/// or a wrong endpoint path, which proves nothing about the server.
fn is_nova_not_found(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .is_some_and(|v| v.get("itemNotFound").is_some())
}

/// The ports of `servers` (by device id), `PORTS_PER_CALL` servers per Neutron call.
pub async fn ports_of(ks: &Keystone, servers: &[&str]) -> Result<Vec<Port>, CloudError> {
    let op = "network GET /v2.0/ports";
    let mut out = Vec::new();
    for chunk in servers.chunks(PORTS_PER_CALL) {
        let path = format!("/v2.0/ports?{}", ports_query(chunk));
        let reply = ks
            .request("network", op, Method::GET, &path, &[], None)
            .await?;
        if !reply.status.is_success() {
            return Err(status_error(op, &reply));
        }
        out.extend(reply.json::<Ports>(op)?.ports);
    }
    Ok(out)
}

/// `device_id=a&device_id=b&fields=…` (built apart from the async code: the serializer is
/// not `Send`).
fn ports_query(ids: &[&str]) -> String {
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    for id in ids {
        q.append_pair("device_id", id);
    }
    for f in ["device_id", "status", "fixed_ips"] {
        q.append_pair("fields", f);
    }
    q.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_down_cell_record_parses_with_what_it_has() {
        let s: Server = serde_json::from_value(serde_json::json!({
            "id": "9f2c", "status": "UNKNOWN", "tenant_id": "p", "created": "2026-01-01T00:00:00Z",
            "links": []
        }))
        .expect("parses");
        assert_eq!(s.status, STATUS_UNKNOWN);
        assert!(s.name.is_empty());
    }

    #[test]
    fn only_novas_own_404_means_gone() {
        assert!(is_nova_not_found(
            br#"{"itemNotFound": {"code": 404, "message": "Instance x could not be found."}}"#
        ));
        assert!(!is_nova_not_found(b"<html>404 Not Found</html>"));
        assert!(!is_nova_not_found(br#"{"error": "not found"}"#));
    }

    fn page(ids: &[&str], next: bool) -> ServerPage {
        serde_json::from_value(serde_json::json!({
            "servers": ids.iter().map(|id| serde_json::json!({"id": id})).collect::<Vec<_>>(),
            "servers_links": if next { serde_json::json!([{"rel": "next", "href": "x"}]) } else { serde_json::json!([]) },
        }))
        .expect("page")
    }

    #[test]
    fn pages_are_followed_until_the_last_and_a_circle_is_an_error() {
        let mut seen = HashSet::new();
        assert_eq!(
            next_marker(&page(&["a", "b"], true), &mut seen),
            Ok(Some("b".into()))
        );
        assert_eq!(
            next_marker(&page(&["c"], true), &mut seen),
            Ok(Some("c".into()))
        );
        // A server answering every page alike: the second time is an error, not page 10,000.
        let again = next_marker(&page(&["b"], true), &mut seen);
        assert!(
            again.as_ref().is_err_and(|e| e.contains("circle")),
            "{again:?}"
        );
        assert_eq!(next_marker(&page(&["d"], false), &mut seen), Ok(None));
        assert_eq!(next_marker(&page(&[], true), &mut seen), Ok(None));
    }
}
