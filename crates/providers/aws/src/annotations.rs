//! The `service.beta.kubernetes.io/aws-load-balancer-*` annotations this provider reads, parsed
//! once per call into [`LbSpec`]. Malformed values are errors naming the annotation.

use std::collections::BTreeMap;

use ccm_cloud::{CloudError, CloudResult, Service};

const PREFIX: &str = "service.beta.kubernetes.io/aws-load-balancer-";

/// `aws-load-balancer-type`: `nlb` selects a Network Load Balancer.
pub const TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-type";
/// `aws-load-balancer-internal`: any value but `false` makes the LB internal (upstream).
pub const INTERNAL: &str = "service.beta.kubernetes.io/aws-load-balancer-internal";
/// `aws-load-balancer-scheme`: `internal` or `internet-facing`.
pub const SCHEME: &str = "service.beta.kubernetes.io/aws-load-balancer-scheme";
/// `aws-load-balancer-cross-zone-load-balancing-enabled`: `true` / `false`.
pub const CROSS_ZONE: &str =
    "service.beta.kubernetes.io/aws-load-balancer-cross-zone-load-balancing-enabled";
/// `aws-load-balancer-additional-resource-tags`: `k1=v1,k2=v2`.
pub const EXTRA_TAGS: &str =
    "service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags";
/// `aws-load-balancer-subnets`: subnet ids or Name tags, comma-separated.
pub const SUBNETS: &str = "service.beta.kubernetes.io/aws-load-balancer-subnets";
/// `aws-load-balancer-nlb-target-type`: only `instance` is supported.
pub const NLB_TARGET_TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-nlb-target-type";

/// `load-balancer-source-ranges`: the older form of `spec.loadBalancerSourceRanges`, read when
/// the spec has none (upstream's `GetLoadBalancerSourceRanges`).
pub const SOURCE_RANGES: &str = "service.beta.kubernetes.io/load-balancer-source-ranges";
/// `aws-load-balancer-security-groups`: the Classic ELB's groups instead of one of its own.
pub const SECURITY_GROUPS: &str = "service.beta.kubernetes.io/aws-load-balancer-security-groups";
/// `aws-load-balancer-extra-security-groups`: groups added to the Classic ELB's.
pub const EXTRA_SECURITY_GROUPS: &str =
    "service.beta.kubernetes.io/aws-load-balancer-extra-security-groups";

/// `aws-load-balancer-proxy-protocol`: `*` sends PROXY protocol to the backends.
pub const PROXY_PROTOCOL: &str = "service.beta.kubernetes.io/aws-load-balancer-proxy-protocol";
/// `aws-load-balancer-target-node-labels`: `k=v,k2`: only matching nodes become backends.
pub const TARGET_NODE_LABELS: &str =
    "service.beta.kubernetes.io/aws-load-balancer-target-node-labels";
/// `aws-load-balancer-eip-allocations`: one Elastic IP allocation per NLB subnet.
pub const EIP_ALLOCATIONS: &str = "service.beta.kubernetes.io/aws-load-balancer-eip-allocations";
/// `aws-load-balancer-private-ipv4-addresses`: one address per subnet of an internal NLB.
pub const PRIVATE_IPV4: &str =
    "service.beta.kubernetes.io/aws-load-balancer-private-ipv4-addresses";
/// `aws-load-balancer-target-group-attributes`: `k=v,...` on each NLB target group.
pub const TG_ATTRIBUTES: &str =
    "service.beta.kubernetes.io/aws-load-balancer-target-group-attributes";
/// Access logs (Classic ELB and NLB).
pub const ACCESS_LOG_ENABLED: &str =
    "service.beta.kubernetes.io/aws-load-balancer-access-log-enabled";
/// Minutes between Classic ELB access-log files (5 or 60).
pub const ACCESS_LOG_INTERVAL: &str =
    "service.beta.kubernetes.io/aws-load-balancer-access-log-emit-interval";
/// The access logs' S3 bucket.
pub const ACCESS_LOG_BUCKET: &str =
    "service.beta.kubernetes.io/aws-load-balancer-access-log-s3-bucket-name";
/// The access logs' key prefix.
pub const ACCESS_LOG_PREFIX: &str =
    "service.beta.kubernetes.io/aws-load-balancer-access-log-s3-bucket-prefix";
/// Classic ELB connection draining on/off.
pub const DRAINING_ENABLED: &str =
    "service.beta.kubernetes.io/aws-load-balancer-connection-draining-enabled";
/// Classic ELB connection draining timeout (seconds).
pub const DRAINING_TIMEOUT: &str =
    "service.beta.kubernetes.io/aws-load-balancer-connection-draining-timeout";
/// Classic ELB idle timeout (seconds; upstream's default 60).
pub const IDLE_TIMEOUT: &str =
    "service.beta.kubernetes.io/aws-load-balancer-connection-idle-timeout";

/// `aws-load-balancer-ssl-cert`: an ACM or IAM certificate ARN for TLS listeners.
pub const SSL_CERT: &str = "service.beta.kubernetes.io/aws-load-balancer-ssl-cert";
/// `aws-load-balancer-ssl-ports`: `*` or port numbers / names that get the certificate.
pub const SSL_PORTS: &str = "service.beta.kubernetes.io/aws-load-balancer-ssl-ports";
/// `aws-load-balancer-ssl-negotiation-policy`: a predefined AWS TLS policy.
pub const SSL_POLICY: &str = "service.beta.kubernetes.io/aws-load-balancer-ssl-negotiation-policy";
/// `aws-load-balancer-backend-protocol`: `http`, `https`, `ssl` or `tcp`.
pub const BACKEND_PROTOCOL: &str = "service.beta.kubernetes.io/aws-load-balancer-backend-protocol";

/// TLS settings of the Service: the certificate, its policy and the backend protocol.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tls {
    pub cert: Option<String>,
    pub policy: Option<String>,
    /// Lowercase, validated: `http`, `https`, `ssl` or `tcp`.
    pub backend: Option<String>,
}

fn tls(ann: &BTreeMap<String, String>) -> CloudResult<Tls> {
    let backend = ann
        .get(BACKEND_PROTOCOL)
        .map(|v| v.trim().to_lowercase())
        .filter(|v| !v.is_empty());
    if let Some(b) = &backend
        && !["http", "https", "ssl", "tcp"].contains(&b.as_str())
    {
        return Err(bad(BACKEND_PROTOCOL, b, "http, https, ssl or tcp"));
    }
    let non_empty = |k: &str| {
        ann.get(k)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    Ok(Tls {
        cert: non_empty(SSL_CERT),
        policy: non_empty(SSL_POLICY),
        backend,
    })
}

/// Whether a port gets the certificate: every port without `ssl-ports` (or with `*`), else
/// those it names by number or name, as upstream's `getPortSets`.
fn tls_port(ann: &BTreeMap<String, String>, port: i32, name: &str) -> bool {
    match ann.get(SSL_PORTS).map(|v| v.trim()) {
        None | Some("") | Some("*") => true,
        Some(list) => list
            .split(',')
            .map(str::trim)
            .any(|p| p == port.to_string() || (!name.is_empty() && p.eq_ignore_ascii_case(name))),
    }
}

/// Health check settings (`aws-load-balancer-healthcheck-*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// `TCP`, `HTTP` or `HTTPS`.
    pub protocol: String,
    /// `traffic-port` or a port number.
    pub port: String,
    /// Path for HTTP(S) checks.
    pub path: String,
    pub healthy: i32,
    pub unhealthy: i32,
    pub timeout: i32,
    pub interval: i32,
}

/// Which kind of load balancer a Service gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Classic ELB (upstream's default).
    Classic,
    /// Network Load Balancer.
    Network,
}

/// One Service port: listener port and the NodePort it forwards to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PortMap {
    pub port: i32,
    pub node_port: i32,
    /// A UDP port (NLB only); else TCP.
    pub udp: bool,
    /// The port serves TLS with the ssl-cert annotation's certificate.
    pub tls: bool,
}

impl PortMap {
    /// The ELBv2 protocol name of the port's traffic.
    pub fn protocol(&self) -> &'static str {
        if self.udp { "UDP" } else { "TCP" }
    }
}

/// Everything about the LB a Service asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct LbSpec {
    pub kind: Kind,
    pub internal: bool,
    pub cross_zone: Option<bool>,
    pub extra_tags: BTreeMap<String, String>,
    pub subnets: Vec<String>,
    pub ports: Vec<PortMap>,
    pub health: HealthCheck,
    pub source_ranges: Vec<String>,
    /// The security-groups annotation: the Classic ELB's groups (none: one of its own).
    pub security_groups: Vec<String>,
    /// The extra-security-groups annotation.
    pub extra_security_groups: Vec<String>,
    /// PROXY protocol to the backends (CLB backend policy; NLB target-group attribute).
    pub proxy_protocol: bool,
    /// Only nodes with these labels (an empty value: any value) are backends.
    pub target_node_labels: BTreeMap<String, String>,
    /// NLB: an Elastic IP allocation per subnet, at creation.
    pub eip_allocations: Vec<String>,
    /// Internal NLB: a private address per subnet, at creation.
    pub private_ipv4: Vec<String>,
    /// NLB target-group attributes.
    pub tg_attributes: BTreeMap<String, String>,
    /// Access logs, draining, idle timeout: the Classic ELB's attributes (access logs also NLB).
    pub attributes: Attributes,
    /// Certificate, TLS policy, backend protocol.
    pub tls: Tls,
    /// The NLB answers on IPv6 too (`IpAddressType: dualstack`).
    pub dualstack: bool,
    /// The NLB's target groups reach the nodes over IPv6.
    pub ipv6_targets: bool,
    /// `namespace/name`, for the `kubernetes.io/service-name` tag.
    pub service_name: String,
}

/// Load-balancer attributes with upstream's defaults: access logs off, draining off, idle
/// timeout 60 s.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Attributes {
    pub access_log: bool,
    pub access_log_interval: Option<i32>,
    pub access_log_bucket: String,
    pub access_log_prefix: String,
    pub draining: bool,
    pub draining_timeout: Option<i32>,
    pub idle_timeout: i32,
}

fn number(ann: &BTreeMap<String, String>, key: &str) -> CloudResult<Option<i32>> {
    match ann.get(key).map(|v| v.trim()) {
        None | Some("") => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| bad(key, v, "an integer")),
    }
}

fn attributes(ann: &BTreeMap<String, String>) -> CloudResult<Attributes> {
    Ok(Attributes {
        access_log: boolean(ann, ACCESS_LOG_ENABLED)?.unwrap_or(false),
        access_log_interval: number(ann, ACCESS_LOG_INTERVAL)?,
        access_log_bucket: ann.get(ACCESS_LOG_BUCKET).cloned().unwrap_or_default(),
        access_log_prefix: ann.get(ACCESS_LOG_PREFIX).cloned().unwrap_or_default(),
        draining: boolean(ann, DRAINING_ENABLED)?.unwrap_or(false),
        draining_timeout: number(ann, DRAINING_TIMEOUT)?,
        idle_timeout: number(ann, IDLE_TIMEOUT)?.unwrap_or(60),
    })
}

/// `k1=v1,k2` as upstream's `getKeyValuePropertiesFromAnnotation` reads it.
pub fn key_values(ann: &BTreeMap<String, String>, key: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for kv in list(ann, key) {
        let mut it = kv.split('=');
        let k = it.next().unwrap_or_default().trim();
        if !k.is_empty() {
            out.insert(
                k.to_string(),
                it.next().unwrap_or_default().trim().to_string(),
            );
        }
    }
    out
}

/// The target-node-labels annotation alone: it never fails, so the backends can follow the
/// nodes even while another annotation is refused.
pub fn target_node_labels(svc: &Service) -> BTreeMap<String, String> {
    let ann = svc.metadata.annotations.clone().unwrap_or_default();
    key_values(&ann, TARGET_NODE_LABELS)
}

fn proxy_protocol(ann: &BTreeMap<String, String>) -> CloudResult<bool> {
    match ann.get(PROXY_PROTOCOL).map(|v| v.trim()) {
        None | Some("") => Ok(false),
        Some("*") => Ok(true),
        Some(v) => Err(bad(
            PROXY_PROTOCOL,
            v,
            "* (the only value upstream supports)",
        )),
    }
}

impl LbSpec {
    /// The protocol of the NLB client rules on the node groups.
    pub fn client_protocol(&self) -> String {
        if self.ports.iter().any(|p| p.udp) {
            "udp".to_string()
        } else {
            "tcp".to_string()
        }
    }
}

fn bad(key: &str, value: &str, expected: &str) -> CloudError {
    CloudError::Permanent(format!("annotation {key}={value:?}: expected {expected}"))
}

fn int(ann: &BTreeMap<String, String>, key: &str, default: i32) -> CloudResult<i32> {
    let full = format!("{PREFIX}healthcheck-{key}");
    match ann.get(&full) {
        None => Ok(default),
        Some(v) => v
            .trim()
            .parse()
            .ok()
            .filter(|n: &i32| *n > 0)
            .ok_or_else(|| bad(&full, v, "a positive integer")),
    }
}

fn boolean(ann: &BTreeMap<String, String>, key: &str) -> CloudResult<Option<bool>> {
    match ann.get(key).map(|v| v.trim()) {
        None => Ok(None),
        Some("true") => Ok(Some(true)),
        Some("false") => Ok(Some(false)),
        Some(v) => Err(bad(key, v, "true or false")),
    }
}

fn list(ann: &BTreeMap<String, String>, key: &str) -> Vec<String> {
    ann.get(key)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

fn tags(ann: &BTreeMap<String, String>) -> CloudResult<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for kv in list(ann, EXTRA_TAGS) {
        let (k, v) = kv.split_once('=').unwrap_or((kv.as_str(), ""));
        if k.trim().is_empty() {
            return Err(bad(EXTRA_TAGS, &kv, "key=value pairs separated by commas"));
        }
        out.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(out)
}

fn kind(ann: &BTreeMap<String, String>) -> CloudResult<Kind> {
    match ann.get(TYPE).map(|v| v.trim()) {
        None | Some("") | Some("classic") => Ok(Kind::Classic),
        Some("nlb") => Ok(Kind::Network),
        // Upstream leaves these to the AWS Load Balancer Controller.
        Some("external") | Some("nlb-ip") => Err(CloudError::ImplementedElsewhere),
        Some(v) => Err(bad(TYPE, v, "nlb (or no annotation for a Classic ELB)")),
    }
}

fn internal(ann: &BTreeMap<String, String>) -> CloudResult<bool> {
    if let Some(s) = ann.get(SCHEME).map(|v| v.trim()) {
        return match s {
            "internal" => Ok(true),
            "internet-facing" => Ok(false),
            v => Err(bad(SCHEME, v, "internal or internet-facing")),
        };
    }
    Ok(ann.get(INTERNAL).is_some_and(|v| v.trim() != "false"))
}

fn health(ann: &BTreeMap<String, String>, svc: &Service, kind: Kind) -> CloudResult<HealthCheck> {
    let spec = svc.spec.as_ref();
    let local = spec.and_then(|s| s.external_traffic_policy.as_deref()) == Some("Local");
    let hcnp = spec
        .and_then(|s| s.health_check_node_port)
        .filter(|_| local);
    let get = |k: &str| {
        ann.get(&format!("{PREFIX}healthcheck-{k}"))
            .map(|v| v.trim().to_string())
    };
    // Upstream: ETP Local checks kube-proxy's healthCheckNodePort over HTTP at /healthz;
    // otherwise a TCP check of the traffic port.
    let (def_proto, def_port, def_path) = match hcnp {
        Some(p) => ("HTTP".to_string(), p.to_string(), "/healthz".to_string()),
        None => (
            "TCP".to_string(),
            "traffic-port".to_string(),
            "/".to_string(),
        ),
    };
    let protocol = get("protocol")
        .map(|p| p.to_uppercase())
        .unwrap_or(def_proto);
    if !["TCP", "HTTP", "HTTPS"].contains(&protocol.as_str()) {
        return Err(bad(
            &format!("{PREFIX}healthcheck-protocol"),
            &protocol,
            "TCP, HTTP or HTTPS",
        ));
    }
    let port = get("port").unwrap_or(def_port);
    if port != "traffic-port" && port.parse::<u16>().is_err() {
        return Err(bad(
            &format!("{PREFIX}healthcheck-port"),
            &port,
            "traffic-port or a port number",
        ));
    }
    // Upstream's defaults: Classic 2/6/5 s/10 s; NLB 3/3/10 s/30 s, and for ETP Local
    // 2/2/10 s/10 s (the timeout is not sent for NLBs: AWS fixes it per protocol).
    let (healthy, unhealthy, timeout, interval) = match (kind, hcnp.is_some()) {
        (Kind::Classic, _) => (2, 6, 5, 10),
        (Kind::Network, false) => (3, 3, 10, 30),
        (Kind::Network, true) => (2, 2, 10, 10),
    };
    Ok(HealthCheck {
        protocol,
        port,
        path: get("path").unwrap_or(def_path),
        healthy: int(ann, "healthy-threshold", healthy)?,
        unhealthy: int(ann, "unhealthy-threshold", unhealthy)?,
        timeout: int(ann, "timeout", timeout)?,
        interval: int(ann, "interval", interval)?,
    })
}

/// Who may connect, as upstream's `GetLoadBalancerSourceRanges`: the spec's ranges, else the
/// annotation's, else everyone (`0.0.0.0/0`, and `::/0` on a dualstack NLB). Each must be a
/// CIDR: a typo must not widen access.
fn source_ranges(
    svc: &Service,
    ann: &BTreeMap<String, String>,
    dualstack: bool,
) -> CloudResult<Vec<String>> {
    let from_spec: Vec<String> = svc
        .spec
        .as_ref()
        .and_then(|s| s.load_balancer_source_ranges.clone())
        .unwrap_or_default()
        .iter()
        .map(|r| r.trim().to_string())
        .filter(|r| !r.is_empty())
        .collect();
    let (field, ranges) = if !from_spec.is_empty() {
        ("spec.loadBalancerSourceRanges", from_spec)
    } else {
        (SOURCE_RANGES, list(ann, SOURCE_RANGES))
    };
    if ranges.is_empty() {
        let mut all = vec!["0.0.0.0/0".to_string()];
        if dualstack {
            all.push("::/0".to_string());
        }
        return Ok(all);
    }
    let mut out = Vec::new();
    for r in ranges {
        let net: ipnet::IpNet = r.parse().map_err(|_| {
            CloudError::Permanent(format!(
                "{field}: {r:?} is not valid. Expecting a comma-separated list of source IP ranges. For example, 10.0.0.0/24,192.168.2.0/24"
            ))
        })?;
        // AWS keeps the network address: so does the comparison with what it returns.
        out.push(net.trunc().to_string());
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// The Service's ports, checked as upstream checks them: some ports, one protocol for all
/// (upstream refuses mixed protocols), TCP, or UDP on an NLB; no `loadBalancerIP` and no
/// session affinity (ELBs have none for TCP). Each refusal names the field.
fn ports(svc: &Service, kind: Kind, ann: &BTreeMap<String, String>) -> CloudResult<Vec<PortMap>> {
    let cert = ann.get(SSL_CERT).is_some_and(|c| !c.trim().is_empty());
    let spec = svc.spec.as_ref();
    let field = |f: &str, msg: String| CloudError::Permanent(format!("{f}: {msg}"));
    if let Some(a) = spec.and_then(|s| s.session_affinity.as_deref())
        && !a.is_empty()
        && a != "None"
    {
        return Err(field(
            "spec.sessionAffinity",
            format!("unsupported load balancer affinity: {a}"),
        ));
    }
    if spec
        .and_then(|s| s.load_balancer_ip.as_deref())
        .is_some_and(|ip| !ip.is_empty())
    {
        return Err(field(
            "spec.loadBalancerIP",
            "LoadBalancerIP cannot be specified for AWS ELB".into(),
        ));
    }
    let list: Vec<_> = spec
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .collect();
    if list.is_empty() {
        return Err(field(
            "spec.ports",
            "requested load balancer with no ports".into(),
        ));
    }
    let proto = |p: &&ccm_cloud::k8s_openapi::api::core::v1::ServicePort| {
        p.protocol.clone().unwrap_or_else(|| "TCP".into())
    };
    let first = proto(&list[0]);
    if list.iter().any(|p| proto(p) != first) {
        return Err(field(
            "spec.ports",
            "mixed protocol is not supported for LoadBalancer".into(),
        ));
    }
    let mut out = Vec::new();
    for p in &list {
        let udp = match (proto(p).as_str(), kind) {
            ("TCP", _) => false,
            ("UDP", Kind::Network) => true,
            (other, _) => {
                return Err(field(
                    "spec.ports",
                    format!(
                        "Protocol {other} not supported by LoadBalancer (TCP; UDP only on an NLB)"
                    ),
                ));
            }
        };
        let node_port = p.node_port.ok_or_else(|| {
            CloudError::retry_after(
                std::time::Duration::from_secs(1),
                format!("port {} has no nodePort yet", p.port),
            )
        })?;
        let name = p.name.as_deref().unwrap_or_default();
        out.push(PortMap {
            port: p.port,
            node_port,
            udp,
            tls: cert && !udp && tls_port(ann, p.port, name),
        });
    }
    out.sort();
    Ok(out)
}

/// `aws-load-balancer-ip-address-type`: `ipv4` or `dualstack` (NLB only, upstream).
pub const IP_ADDRESS_TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-ip-address-type";
/// `aws-load-balancer-target-group-ip-address-type`: `ipv4` or `ipv6` (NLB only, upstream).
pub const TG_IP_ADDRESS_TYPE: &str =
    "service.beta.kubernetes.io/aws-load-balancer-target-group-ip-address-type";

/// Upstream's `validateServiceAnnotations`: what only NLBs take and the target-group
/// attributes it supports (the LB type change is checked against AWS in `lb.rs`); plus the
/// address types, which ccm-rs serves as IPv4 only.
fn validate(svc: &Service, ann: &BTreeMap<String, String>, kind: Kind) -> CloudResult<()> {
    let nlb = kind == Kind::Network;
    let refuse =
        |key: &str, why: &str| Err(CloudError::Permanent(format!("annotation {key}: {why}")));
    if nlb {
        for key in [SECURITY_GROUPS, EXTRA_SECURITY_GROUPS] {
            if ann.contains_key(key) {
                return refuse(
                    key,
                    "bring-your-own security groups are not supported by NLB",
                );
            }
        }
    } else {
        for key in [TG_ATTRIBUTES, IP_ADDRESS_TYPE, TG_IP_ADDRESS_TYPE] {
            if ann.contains_key(key) {
                return refuse(key, "only supported for NLB");
            }
        }
    }
    let udp = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .is_some_and(|p| p.iter().any(|p| p.protocol.as_deref() == Some("UDP")));
    for (k, v) in key_values(ann, TG_ATTRIBUTES) {
        match (k.as_str(), v.as_str()) {
            ("preserve_client_ip.enabled", "false") if udp => {
                return refuse(
                    TG_ATTRIBUTES,
                    "client IP preservation can't be disabled for UDP ports",
                );
            }
            ("preserve_client_ip.enabled" | "proxy_protocol_v2.enabled", "true" | "false") => {}
            ("preserve_client_ip.enabled" | "proxy_protocol_v2.enabled", v) => {
                return Err(bad(TG_ATTRIBUTES, v, &format!("true or false for {k}")));
            }
            (k, _) => {
                return refuse(
                    TG_ATTRIBUTES,
                    &format!(
                        "the attribute {k:?} is not supported (preserve_client_ip.enabled, proxy_protocol_v2.enabled)"
                    ),
                );
            }
        }
    }
    ip_family_policy(svc, kind)
}

/// Upstream's `validateIPFamilyPolicy`: RequireDualStack only on an NLB and with both
/// families; no IPv6-only load balancer.
fn ip_family_policy(svc: &Service, kind: Kind) -> CloudResult<()> {
    let spec = svc.spec.as_ref();
    let families = spec.and_then(|s| s.ip_families.clone()).unwrap_or_default();
    let has = |f: &str| families.iter().any(|x| x == f);
    let field = |f: &str, why: &str| Err(CloudError::Permanent(format!("{f}: {why}")));
    match spec.and_then(|s| s.ip_family_policy.as_deref()) {
        Some("RequireDualStack") if kind != Kind::Network => field(
            "spec.ipFamilyPolicy",
            &format!("RequireDualStack is only supported for NLB (set annotation {TYPE}: nlb)"),
        ),
        Some("RequireDualStack") if !(has("IPv4") && has("IPv6")) => field(
            "spec.ipFamilies",
            "ipFamilyPolicy RequireDualStack requires both IPv4 and IPv6",
        ),
        Some("SingleStack") if families == ["IPv6"] => field(
            "spec.ipFamilies",
            "IPv6-only load balancers are not supported by AWS (use ipFamilyPolicy: PreferDualStack with ipFamilies: [IPv6, IPv4])",
        ),
        _ => Ok(()),
    }
}

/// The address families of an NLB: `(dualstack, ipv6 targets)`. The ip-address-type
/// annotations when set, else the Service's families: dualstack when it has IPv6, IPv6 target
/// groups when IPv6 is its primary family. A Classic ELB is IPv4 only.
fn address_types(
    svc: &Service,
    ann: &BTreeMap<String, String>,
    kind: Kind,
) -> CloudResult<(bool, bool)> {
    if kind != Kind::Network {
        return Ok((false, false));
    }
    let families = svc
        .spec
        .as_ref()
        .and_then(|s| s.ip_families.clone())
        .unwrap_or_default();
    let get = |k: &str| ann.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
    let dualstack = match get(IP_ADDRESS_TYPE) {
        None => families.iter().any(|f| f == "IPv6"),
        Some("ipv4") => false,
        Some("dualstack") => true,
        Some(v) => return Err(bad(IP_ADDRESS_TYPE, v, "ipv4 or dualstack")),
    };
    let ipv6 = match get(TG_IP_ADDRESS_TYPE) {
        None => dualstack && families.first().is_some_and(|f| f == "IPv6"),
        Some("ipv4") => false,
        Some("ipv6") => true,
        Some(v) => return Err(bad(TG_IP_ADDRESS_TYPE, v, "ipv4 or ipv6")),
    };
    if ipv6 && !dualstack {
        return Err(CloudError::Permanent(format!(
            "annotation {TG_IP_ADDRESS_TYPE}: an IPv6 target group needs a dualstack load balancer ({IP_ADDRESS_TYPE}: dualstack)"
        )));
    }
    Ok((dualstack, ipv6))
}

/// Reads the Service into an [`LbSpec`].
pub fn parse(svc: &Service) -> CloudResult<LbSpec> {
    let ann = svc.metadata.annotations.clone().unwrap_or_default();
    let kind = kind(&ann)?;
    validate(svc, &ann, kind)?;
    if kind == Kind::Network
        && let Some(t) = ann.get(NLB_TARGET_TYPE).map(|v| v.trim())
        && t != "instance"
    {
        return Err(bad(
            NLB_TARGET_TYPE,
            t,
            "instance (ip targets are not supported yet)",
        ));
    }
    let ports = ports(svc, kind, &ann)?;
    let (dualstack, ipv6_targets) = address_types(svc, &ann, kind)?;
    let source_ranges = source_ranges(svc, &ann, dualstack)?;
    Ok(LbSpec {
        kind,
        internal: internal(&ann)?,
        cross_zone: boolean(&ann, CROSS_ZONE)?,
        extra_tags: tags(&ann)?,
        subnets: list(&ann, SUBNETS),
        health: health(&ann, svc, kind)?,
        ports,
        source_ranges,
        security_groups: list(&ann, SECURITY_GROUPS),
        extra_security_groups: list(&ann, EXTRA_SECURITY_GROUPS),
        proxy_protocol: proxy_protocol(&ann)?,
        target_node_labels: key_values(&ann, TARGET_NODE_LABELS),
        eip_allocations: list(&ann, EIP_ALLOCATIONS),
        private_ipv4: list(&ann, PRIVATE_IPV4),
        tg_attributes: key_values(&ann, TG_ATTRIBUTES),
        attributes: attributes(&ann)?,
        tls: tls(&ann)?,
        dualstack,
        ipv6_targets,
        service_name: format!(
            "{}/{}",
            svc.metadata.namespace.as_deref().unwrap_or("default"),
            svc.metadata.name.as_deref().unwrap_or("")
        ),
    })
}

/// The LB kind without reading the rest (for get/delete, which must work on any Service).
pub fn kind_of(svc: &Service) -> Kind {
    let ann = svc.metadata.annotations.clone().unwrap_or_default();
    kind(&ann).unwrap_or(Kind::Classic)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(ann: &[(&str, &str)], local: bool) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "1234",
                "annotations": ann.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()},
            "spec": {"type": "LoadBalancer", "externalTrafficPolicy": if local { "Local" } else { "Cluster" },
                "healthCheckNodePort": 32000,
                "ports": [{"port": 443, "nodePort": 30443, "protocol": "TCP"}, {"port": 80, "nodePort": 30080}]},
        }))
        .expect("service")
    }

    #[test]
    fn defaults_are_upstreams() {
        let s = parse(&svc(&[], false)).expect("ok");
        assert_eq!(s.kind, Kind::Classic);
        assert!(!s.internal);
        assert_eq!(
            s.ports,
            vec![
                PortMap {
                    port: 80,
                    node_port: 30080,
                    udp: false,
                    tls: false
                },
                PortMap {
                    port: 443,
                    node_port: 30443,
                    udp: false,
                    tls: false
                }
            ]
        );
        assert_eq!(
            (s.health.protocol.as_str(), s.health.port.as_str()),
            ("TCP", "traffic-port")
        );
        assert_eq!(
            (
                s.health.healthy,
                s.health.unhealthy,
                s.health.timeout,
                s.health.interval
            ),
            (2, 6, 5, 10)
        );
        assert_eq!(s.source_ranges, vec!["0.0.0.0/0"]);
        assert_eq!(s.service_name, "shop/web");
        let local = parse(&svc(&[], true)).expect("ok");
        assert_eq!(
            (
                local.health.protocol.as_str(),
                local.health.port.as_str(),
                local.health.path.as_str()
            ),
            ("HTTP", "32000", "/healthz")
        );
    }

    #[test]
    fn annotations_are_read() {
        let s = parse(&svc(
            &[
                (TYPE, "nlb"),
                (INTERNAL, "true"),
                (CROSS_ZONE, "true"),
                (EXTRA_TAGS, "team=a, cost=b"),
                (SUBNETS, "subnet-1, subnet-2"),
                (
                    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval",
                    "30",
                ),
            ],
            false,
        ))
        .expect("ok");
        assert_eq!(s.kind, Kind::Network);
        assert!(s.internal);
        assert_eq!(s.cross_zone, Some(true));
        assert_eq!(s.extra_tags.get("cost").map(String::as_str), Some("b"));
        assert_eq!(s.subnets, vec!["subnet-1", "subnet-2"]);
        assert_eq!(s.health.interval, 30);
        assert!(
            !parse(&svc(
                &[(INTERNAL, "true"), (SCHEME, "internet-facing")],
                false
            ))
            .expect("ok")
            .internal
        );
    }

    #[test]
    fn upstream_validation_names_the_annotation() {
        for (anns, key) in [
            (
                vec![(TG_ATTRIBUTES, "preserve_client_ip.enabled=false")],
                TG_ATTRIBUTES,
            ),
            (
                vec![(TYPE, "nlb"), (TG_ATTRIBUTES, "stickiness.enabled=true")],
                TG_ATTRIBUTES,
            ),
            (
                vec![(TYPE, "nlb"), (SECURITY_GROUPS, "sg-1")],
                SECURITY_GROUPS,
            ),
            (vec![(IP_ADDRESS_TYPE, "dualstack")], IP_ADDRESS_TYPE),
            (
                vec![(TYPE, "nlb"), (IP_ADDRESS_TYPE, "both")],
                IP_ADDRESS_TYPE,
            ),
            (
                vec![(TYPE, "nlb"), (TG_IP_ADDRESS_TYPE, "ipv6")],
                TG_IP_ADDRESS_TYPE,
            ),
        ] {
            let e = parse(&svc(&anns, false)).expect_err(key);
            assert!(e.to_string().contains(key), "{e}");
        }
        let ok = [
            (TYPE, "nlb"),
            (TG_ATTRIBUTES, "preserve_client_ip.enabled=false"),
        ];
        assert!(parse(&svc(&ok, false)).is_ok());
    }

    #[test]
    fn bad_values_name_the_annotation() {
        for (k, v) in [
            (TYPE, "alb"),
            (CROSS_ZONE, "yes"),
            (
                "service.beta.kubernetes.io/aws-load-balancer-healthcheck-timeout",
                "5s",
            ),
            (SCHEME, "public"),
        ] {
            let e = parse(&svc(&[(k, v)], false)).expect_err(k);
            assert!(e.to_string().contains(k), "{e}");
        }
        for t in ["external", "nlb-ip"] {
            assert!(matches!(
                parse(&svc(&[(TYPE, t)], false)),
                Err(CloudError::ImplementedElsewhere)
            ));
        }
    }

    #[test]
    fn the_certificate_goes_to_the_ssl_ports() {
        let cert = (SSL_CERT, "arn:aws:acm:us-east-1:1:certificate/x");
        let s = parse(&svc(&[cert], false)).expect("ok");
        assert!(s.ports.iter().all(|p| p.tls), "no ssl-ports: every port");
        let s = parse(&svc(&[cert, (SSL_PORTS, "443")], false)).expect("ok");
        let tls: Vec<i32> = s.ports.iter().filter(|p| p.tls).map(|p| p.port).collect();
        assert_eq!(tls, vec![443]);
        let e = parse(&svc(&[cert, (BACKEND_PROTOCOL, "grpc")], false)).expect_err("bad");
        assert!(e.to_string().contains(BACKEND_PROTOCOL), "{e}");
        assert!(
            !parse(&svc(&[], false))
                .expect("ok")
                .ports
                .iter()
                .any(|p| p.tls)
        );
    }
}

#[cfg(test)]
mod family_tests {
    use super::*;

    fn svc(ann: &[(&str, &str)], policy: &str, families: &[&str]) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop",
                "annotations": ann.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()},
            "spec": {"type": "LoadBalancer", "ipFamilyPolicy": policy, "ipFamilies": families,
                "ports": [{"port": 80, "nodePort": 30080}]},
        }))
        .expect("service")
    }

    #[test]
    fn families_choose_the_address_types_and_default_ranges() {
        let nlb = [(TYPE, "nlb")];
        let s = parse(&svc(&nlb, "SingleStack", &["IPv4"])).expect("ok");
        assert_eq!((s.dualstack, s.ipv6_targets), (false, false));
        assert_eq!(s.source_ranges, vec!["0.0.0.0/0"]);
        let s = parse(&svc(&nlb, "PreferDualStack", &["IPv4", "IPv6"])).expect("ok");
        assert_eq!((s.dualstack, s.ipv6_targets), (true, false));
        assert_eq!(s.source_ranges, vec!["0.0.0.0/0", "::/0"]);
        let s = parse(&svc(&nlb, "RequireDualStack", &["IPv6", "IPv4"])).expect("ok");
        assert_eq!((s.dualstack, s.ipv6_targets), (true, true));
        // The annotations win over the families.
        let ann = [(TYPE, "nlb"), (IP_ADDRESS_TYPE, "ipv4")];
        let s = parse(&svc(&ann, "PreferDualStack", &["IPv6", "IPv4"])).expect("ok");
        assert_eq!((s.dualstack, s.ipv6_targets), (false, false));
        let ann = [
            (TYPE, "nlb"),
            (IP_ADDRESS_TYPE, "dualstack"),
            (TG_IP_ADDRESS_TYPE, "ipv6"),
        ];
        let s = parse(&svc(&ann, "SingleStack", &["IPv4"])).expect("ok");
        assert_eq!((s.dualstack, s.ipv6_targets), (true, true));
        // A Classic ELB is IPv4 whatever the Service's families.
        let s = parse(&svc(&[], "PreferDualStack", &["IPv6", "IPv4"])).expect("ok");
        assert_eq!((s.dualstack, s.ipv6_targets), (false, false));
    }

    #[test]
    fn upstreams_family_policy_checks_name_the_field() {
        for (ann, policy, families, field) in [
            (
                vec![],
                "RequireDualStack",
                vec!["IPv4", "IPv6"],
                "spec.ipFamilyPolicy",
            ),
            (
                vec![(TYPE, "nlb")],
                "RequireDualStack",
                vec!["IPv4"],
                "spec.ipFamilies",
            ),
            (
                vec![(TYPE, "nlb")],
                "SingleStack",
                vec!["IPv6"],
                "spec.ipFamilies",
            ),
            (vec![], "SingleStack", vec!["IPv6"], "spec.ipFamilies"),
        ] {
            let e = parse(&svc(&ann, policy, &families)).expect_err(field);
            assert!(e.to_string().contains(field), "{e}");
        }
    }
}
