//! The `--cloud-config` file of the metal provider (TOML), parsed and checked into the
//! structures the provider works with. Every error names the field and what to write instead.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use ccm_cloud::{ConfigError, NodeAddress};
use serde::Deserialize;

use crate::ipam::{Pool, PoolRange};

/// Default bound on concurrent BMC requests: BMCs are slow, and a rack of them answering at once
/// is plenty.
pub const DEFAULT_BMC_CONCURRENCY: usize = 8;
/// Default per-request BMC timeout.
pub const DEFAULT_BMC_TIMEOUT: Duration = Duration::from_secs(5);
/// Default routing table for pod-CIDR routes (an otherwise unused id).
pub const DEFAULT_ROUTE_TABLE: u32 = 17219;
/// Default route protocol number marking ccm-rs's routes (unassigned in `rt_protos`).
pub const DEFAULT_ROUTE_PROTOCOL: u8 = 75;

/// The file as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetalConfigFile {
    /// How BMCs are queried.
    #[serde(default)]
    pub bmc: BmcOptions,
    /// The machine inventory.
    #[serde(default)]
    pub machines: Vec<MachineConfig>,
    /// LoadBalancer address pools.
    #[serde(default)]
    pub pools: Vec<PoolConfig>,
    /// LoadBalancer behaviour.
    #[serde(default)]
    pub load_balancer: LoadBalancerOptions,
    /// Pod-CIDR routes: announced over BGP, or kernel routes on the host the CCM runs on.
    pub routes: Option<RoutesConfig>,
}

/// `[bmc]`: limits for Redfish queries.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BmcOptions {
    /// Most BMC requests in flight at once (default 8).
    pub concurrency: Option<usize>,
    /// Per-request timeout in milliseconds (default 5000).
    pub timeout_ms: Option<u64>,
    /// What `metal://<id>` names: the machine `name` (default), or its System's `uuid` or
    /// `serial` as the BMC reports it (machines without a BMC keep their name).
    #[serde(default)]
    pub provider_id: ProviderIdFrom,
}

/// Where a Node's providerID comes from.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ProviderIdFrom {
    /// The inventory name.
    #[default]
    Name,
    /// The System's `UUID` (lower case).
    Uuid,
    /// The System's `SerialNumber`.
    Serial,
}

/// `[load_balancer]`: how assigned addresses are published.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadBalancerOptions {
    /// Also write the assigned addresses to the `kube-vip.io/loadbalancerIPs` annotation,
    /// which is what kube-vip's service watcher announces (it does not read the status).
    #[serde(default)]
    pub kube_vip_annotation: bool,
    /// Serve exactly the Services whose `spec.loadBalancerClass` is this (and no class-less
    /// one), so the provider can run beside the cluster's default load-balancer
    /// implementation. Unset: class-less Services only, as upstream.
    #[serde(default)]
    pub load_balancer_class: Option<String>,
}

/// `[[machines]]`: one machine, or every machine whose node name matches `pattern`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineConfig {
    /// The machine's (and its Node's) name.
    pub name: Option<String>,
    /// A node-name pattern with `*` (any run of characters) and `?` (one character).
    pub pattern: Option<String>,
    /// `node.kubernetes.io/instance-type`.
    #[serde(default)]
    pub instance_type: String,
    /// `topology.kubernetes.io/zone`.
    #[serde(default)]
    pub zone: String,
    /// `topology.kubernetes.io/region`.
    #[serde(default)]
    pub region: String,
    /// `InternalIP` addresses.
    #[serde(default)]
    pub internal_ips: Vec<IpAddr>,
    /// `ExternalIP` addresses.
    #[serde(default)]
    pub external_ips: Vec<IpAddr>,
    /// `Hostname` address.
    pub hostname: Option<String>,
    /// Extra Node labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The machine's BMC, for power state.
    pub bmc: Option<BmcConfig>,
}

/// `[machines.bmc]`: a Redfish endpoint.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BmcConfig {
    /// Base URL, e.g. `https://10.0.0.11` or `http://10.0.0.11:8000`.
    pub endpoint: String,
    /// PEM file with the CA certificate(s) the BMC's certificate chains to (default: the
    /// system's roots).
    pub ca_file: Option<PathBuf>,
    /// Accept any certificate (self-signed BMCs on a trusted management network only).
    #[serde(default)]
    pub insecure_skip_verify: bool,
    /// The System: a member id of the BMC's Systems collection (`System.Embedded.1` on iDRAC,
    /// `1` on iLO / XCC / Supermicro) or its path (`/redfish/v1/Systems/1`); `{name}` is
    /// replaced by the node name. Unset (and no `system_uuid` / `system_serial`): the
    /// collection's only member.
    pub system: Option<String>,
    /// Find the System as the collection member whose `UUID` is this (case-insensitive).
    pub system_uuid: Option<String>,
    /// Find the System as the collection member whose `SerialNumber` is this.
    pub system_serial: Option<String>,
    /// `basic` (default: HTTP basic auth on every request) or `session` (one Redfish session
    /// per BMC and user, its `X-Auth-Token` reused until the BMC refuses it).
    #[serde(default)]
    pub auth: BmcAuth,
    /// User name for HTTP basic auth or the Redfish session.
    pub username: Option<String>,
    /// File holding the password (e.g. a mounted Secret key); read at each request, never
    /// logged.
    pub password_file: Option<PathBuf>,
    /// `namespace/name` of a Secret with keys `password` and (optionally) `username`; read
    /// through the API at each request. Needs `get` on that Secret.
    pub credentials_secret: Option<String>,
}

/// How ccm-rs authenticates to a BMC.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BmcAuth {
    /// `Authorization: Basic` on every request.
    #[default]
    Basic,
    /// A Redfish session (`POST /redfish/v1/SessionService/Sessions`), its token reused.
    Session,
}

/// `[[pools]]`: an address pool for LoadBalancer Services.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Named in events, in the request annotation and in logs.
    pub name: String,
    /// CIDRs (`192.0.2.0/28`, `2001:db8::/120`) and ranges (`192.0.2.10-192.0.2.20`).
    pub addresses: Vec<String>,
    /// When false, only Services that name the pool or request one of its addresses get one.
    #[serde(default = "yes")]
    pub auto_assign: bool,
    /// Never hand out IPv4 addresses ending in `.0` or `.255` (some clients drop them).
    #[serde(default)]
    pub avoid_buggy_ips: bool,
    /// Also hand out the network address (and, IPv4, the broadcast address) of CIDR entries;
    /// by default they are skipped, as hosts on the subnet treat them specially.
    #[serde(default)]
    pub use_network_and_broadcast: bool,
    /// Only Services in these namespaces (empty: all).
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// Only Services carrying all these labels (empty: all).
    #[serde(default)]
    pub service_selector: BTreeMap<String, String>,
    /// With `routes.bgp.announce_load_balancers`: BGP communities the pool's addresses carry,
    /// `"asn:value"` or large `"global:local1:local2"`.
    #[serde(default)]
    pub bgp_communities: Vec<String>,
    /// With `routes.bgp.announce_load_balancers`: LOCAL_PREF of the pool's addresses (iBGP
    /// peers only; BGP does not send it to eBGP peers).
    pub bgp_local_pref: Option<u32>,
}

fn yes() -> bool {
    true
}

/// `[routes]`: where pod-CIDR routes go.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutesConfig {
    /// Routing table id (default 17219). Add `ip rule add to <cluster CIDR> lookup <table>`.
    pub table: Option<u32>,
    /// Route protocol number marking ccm-rs's routes (default 75).
    pub protocol: Option<u8>,
    /// Open the netlink socket in this network namespace (a path such as `/run/netns/gw`)
    /// instead of the CCM's own.
    pub netns: Option<PathBuf>,
    /// The cluster CIDRs: each gets an `unreachable` route in the table, so an address in a
    /// pod network without a route is refused instead of falling through to the main table.
    #[serde(default)]
    pub cluster_cidrs: Vec<String>,
    /// `kernel` (default): routes in the table on the CCM's host. `bgp`: announced to the
    /// `[routes.bgp]` peers.
    pub mode: Option<String>,
    /// The BGP speaker, for `mode = "bgp"`.
    pub bgp: Option<crate::bgp::config::BgpConfig>,
}

/// One machine of the checked inventory.
#[derive(Debug, Clone, PartialEq)]
pub struct Machine {
    /// Exact name, or the pattern for a pattern entry.
    pub name: String,
    /// True for a pattern entry.
    pub is_pattern: bool,
    /// Instance type label.
    pub instance_type: String,
    /// Zone label.
    pub zone: String,
    /// Region label.
    pub region: String,
    /// Addresses to put on the Node (empty: keep the Node's).
    pub addresses: Vec<NodeAddress>,
    /// Extra labels.
    pub labels: BTreeMap<String, String>,
    /// Redfish endpoint, if any.
    pub bmc: Option<BmcConfig>,
}

impl Machine {
    /// Whether this entry describes the node `name`.
    pub fn matches(&self, name: &str) -> bool {
        if self.is_pattern {
            glob_match(self.name.as_bytes(), name.as_bytes())
        } else {
            self.name == name
        }
    }
}

/// Everything the provider needs, checked.
#[derive(Debug, Clone, Default)]
pub struct MetalConfig {
    /// Machines, exact names first in file order, then patterns in file order.
    pub machines: Vec<Machine>,
    /// Pools in file order (allocation tries them in this order).
    pub pools: Vec<Pool>,
    /// BMC concurrency bound.
    pub bmc_concurrency: usize,
    /// BMC request timeout.
    pub bmc_timeout: Duration,
    /// What providerIDs name.
    pub provider_id_from: ProviderIdFrom,
    /// Routes, if enabled.
    pub routes: Option<RoutesSettings>,
    /// Write `kube-vip.io/loadbalancerIPs` after assigning.
    pub kube_vip_annotation: bool,
    /// The `spec.loadBalancerClass` served; `None`: class-less Services.
    pub load_balancer_class: Option<String>,
}

/// Checked `[routes]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutesSettings {
    /// Routing table id.
    pub table: u32,
    /// Protocol number.
    pub protocol: u8,
    /// Namespace to open the socket in.
    pub netns: Option<PathBuf>,
    /// Cluster CIDRs guarded by an `unreachable` route in the table.
    pub cluster_cidrs: Vec<ipnet::IpNet>,
    /// `Some` in BGP mode: the speaker's settings.
    pub bgp: Option<crate::bgp::config::BgpSettings>,
}

impl MetalConfig {
    /// Parses and checks the TOML text.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let file: MetalConfigFile = ccm_cloud::parse_toml_str(text)?;
        Self::check(file)
    }

    /// The machine entry for node `name`: an exact entry wins over a pattern.
    pub fn machine(&self, name: &str) -> Option<&Machine> {
        self.machines.iter().find(|m| m.matches(name))
    }

    fn check(file: MetalConfigFile) -> Result<Self, ConfigError> {
        let mut exact = Vec::new();
        let mut patterns = Vec::new();
        for (i, m) in file.machines.into_iter().enumerate() {
            let machine = check_machine(i, m)?;
            if machine.is_pattern {
                patterns.push(machine);
            } else if exact.iter().any(|e: &Machine| e.name == machine.name) {
                return Err(ConfigError::field(
                    format!("machines[{i}].name"),
                    format!("a unique machine name; {:?} appears twice", machine.name),
                ));
            } else {
                exact.push(machine);
            }
        }
        let mut pools: Vec<Pool> = Vec::new();
        for (i, p) in file.pools.into_iter().enumerate() {
            let pool = check_pool(i, p)?;
            if pools.iter().any(|q| q.name == pool.name) {
                return Err(ConfigError::field(
                    format!("pools[{i}].name"),
                    format!("a unique pool name; {:?} appears twice", pool.name),
                ));
            }
            check_overlaps(i, &pool, &pools)?;
            check_node_addresses(i, &pool, &exact)?;
            pools.push(pool);
        }
        exact.extend(patterns);
        let bmc_concurrency = file.bmc.concurrency.unwrap_or(DEFAULT_BMC_CONCURRENCY);
        if bmc_concurrency == 0 {
            return Err(ConfigError::field(
                "bmc.concurrency",
                "at least 1 (the most BMC requests in flight at once)",
            ));
        }
        let bmc_timeout = match file.bmc.timeout_ms {
            Some(0) => {
                return Err(ConfigError::field(
                    "bmc.timeout_ms",
                    "a timeout in milliseconds above 0, e.g. 5000",
                ));
            }
            Some(ms) => Duration::from_millis(ms),
            None => DEFAULT_BMC_TIMEOUT,
        };
        let routes = file.routes.map(check_routes_file).transpose()?;
        if let Some(r) = &routes {
            check_routes(r)?;
        }
        let announced = routes
            .as_ref()
            .and_then(|r| r.bgp.as_ref())
            .is_some_and(|b| b.announce_load_balancers);
        if !announced
            && let Some((i, p)) = pools
                .iter()
                .enumerate()
                .find(|(_, p)| !p.bgp_communities.is_empty() || p.bgp_local_pref.is_some())
        {
            let name = if p.bgp_communities.is_empty() {
                "bgp_local_pref"
            } else {
                "bgp_communities"
            };
            return Err(ConfigError::field(
                format!("pools[{i}].{name}"),
                "routes.mode = \"bgp\" with routes.bgp.announce_load_balancers = true (nothing announces the pool's addresses otherwise), or no BGP attributes on the pool",
            ));
        }
        Ok(MetalConfig {
            machines: exact,
            pools,
            bmc_concurrency,
            bmc_timeout,
            provider_id_from: file.bmc.provider_id,
            routes,
            kube_vip_annotation: file.load_balancer.kube_vip_annotation,
            load_balancer_class: check_class(file.load_balancer.load_balancer_class)?,
        })
    }
}

/// A class must be one the API server accepts in `spec.loadBalancerClass` (a qualified name,
/// e.g. `example.com/metal`), or no Service could ever carry it.
fn check_class(class: Option<String>) -> Result<Option<String>, ConfigError> {
    let Some(class) = class else {
        return Ok(None);
    };
    let (prefix, name) = class.rsplit_once('/').unwrap_or(("", &class));
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    let prefix_ok = (prefix.is_empty() && !class.contains('/'))
        || (prefix.len() <= 253
            && prefix.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            }));
    if name_ok && prefix_ok {
        Ok(Some(class))
    } else {
        Err(ConfigError::field(
            "load_balancer.load_balancer_class",
            format!(
                "a qualified name as Services carry in spec.loadBalancerClass, e.g. \"example.com/metal\"; got {class:?}"
            ),
        ))
    }
}

/// A pool sharing an address with another (or two entries of one pool overlapping) would
/// hand one address out twice under different rules.
fn check_overlaps(i: usize, pool: &Pool, before: &[Pool]) -> Result<(), ConfigError> {
    for (k, r) in pool.ranges.iter().enumerate() {
        let earlier_own = pool.ranges[..k].iter().map(|q| (&pool.name, q));
        let others = before
            .iter()
            .flat_map(|p| p.ranges.iter().map(move |q| (&p.name, q)));
        if let Some((name, q)) = earlier_own.chain(others).find(|(_, q)| q.overlaps(r)) {
            return Err(ConfigError::field(
                format!("pools[{i}].addresses[{k}]"),
                format!("addresses no other pool has; {r} overlaps {q} of pool {name:?}"),
            ));
        }
    }
    Ok(())
}

/// A node's own address handed to a Service would take the node off the network.
fn check_node_addresses(i: usize, pool: &Pool, machines: &[Machine]) -> Result<(), ConfigError> {
    for m in machines {
        for a in &m.addresses {
            let Ok(ip) = a.address.parse::<IpAddr>() else {
                continue;
            };
            if let Some(k) = pool.ranges.iter().position(|r| r.contains(ip)) {
                return Err(ConfigError::field(
                    format!("pools[{i}].addresses[{k}]"),
                    format!(
                        "addresses no node uses; it contains {ip}, an address of machine {:?}",
                        m.name
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn check_routes_file(r: RoutesConfig) -> Result<RoutesSettings, ConfigError> {
    let mut cluster_cidrs = Vec::new();
    for (i, c) in r.cluster_cidrs.iter().enumerate() {
        let net: ipnet::IpNet = c.parse().map_err(|_| {
            ConfigError::field(
                format!("routes.cluster_cidrs[{i}]"),
                format!("a CIDR such as \"10.244.0.0/16\" (the --cluster-cidr value); got {c:?}"),
            )
        })?;
        if net.trunc() != net {
            return Err(ConfigError::field(
                format!("routes.cluster_cidrs[{i}]"),
                format!(
                    "a network address without host bits, e.g. {}; got {c:?}",
                    net.trunc()
                ),
            ));
        }
        cluster_cidrs.push(net);
    }
    let bgp = match r.mode.as_deref() {
        None | Some("kernel") if r.bgp.is_none() => None,
        None | Some("kernel") => {
            return Err(ConfigError::field(
                "routes.mode",
                "\"bgp\" to use [routes.bgp] (or remove [routes.bgp] for kernel routes)",
            ));
        }
        Some("bgp") => Some(crate::bgp::config::check(r.bgp)?),
        Some(other) => {
            return Err(ConfigError::field(
                "routes.mode",
                format!(
                    "\"kernel\" (routes on the CCM's host) or \"bgp\" (announced to routers); got {other:?}"
                ),
            ));
        }
    };
    Ok(RoutesSettings {
        bgp,
        table: r.table.unwrap_or(DEFAULT_ROUTE_TABLE),
        protocol: r.protocol.unwrap_or(DEFAULT_ROUTE_PROTOCOL),
        netns: r.netns,
        cluster_cidrs,
    })
}

fn check_routes(r: &RoutesSettings) -> Result<(), ConfigError> {
    // 0 (unspec), 253 (default), 254 (main) and 255 (local) hold routes ccm-rs must never own.
    if matches!(r.table, 0 | 253..=255) {
        return Err(ConfigError::field(
            "routes.table",
            format!(
                "a dedicated routing table id (not 0, 253, 254 or 255); got {}",
                r.table
            ),
        ));
    }
    // 0-4 are the kernel's own (unspec, redirect, kernel, boot, static).
    if r.protocol <= 4 {
        return Err(ConfigError::field(
            "routes.protocol",
            format!(
                "a dedicated route protocol number above 4 (0-4 are the kernel's); got {}",
                r.protocol
            ),
        ));
    }
    Ok(())
}

fn check_machine(i: usize, m: MachineConfig) -> Result<Machine, ConfigError> {
    let (name, is_pattern) = match (m.name, m.pattern) {
        (Some(n), None) if !n.is_empty() => (n, false),
        (None, Some(p)) if !p.is_empty() => (p, true),
        (Some(_), Some(_)) => {
            return Err(ConfigError::field(
                format!("machines[{i}]"),
                "either `name` or `pattern`, not both",
            ));
        }
        _ => {
            return Err(ConfigError::field(
                format!("machines[{i}].name"),
                "a machine name (or a `pattern` such as \"worker-*\")",
            ));
        }
    };
    if is_pattern && (!m.internal_ips.is_empty() || !m.external_ips.is_empty()) {
        return Err(ConfigError::field(
            format!("machines[{i}].internal_ips"),
            "no fixed addresses on a pattern entry (many machines cannot share them); list the machine by `name`",
        ));
    }
    if let Some(bmc) = &m.bmc {
        check_bmc(i, bmc)?;
    }
    let mut addresses: Vec<NodeAddress> = Vec::new();
    let mut push = |type_: &str, address: String| {
        addresses.push(NodeAddress {
            type_: type_.into(),
            address,
        })
    };
    m.internal_ips
        .iter()
        .for_each(|a| push("InternalIP", a.to_string()));
    m.external_ips
        .iter()
        .for_each(|a| push("ExternalIP", a.to_string()));
    if let Some(h) = m.hostname {
        push("Hostname", h);
    }
    Ok(Machine {
        name,
        is_pattern,
        instance_type: m.instance_type,
        zone: m.zone,
        region: m.region,
        addresses,
        labels: m.labels,
        bmc: m.bmc,
    })
}

fn check_bmc(i: usize, bmc: &BmcConfig) -> Result<(), ConfigError> {
    let field = format!("machines[{i}].bmc.endpoint");
    let uri: http::Uri = bmc
        .endpoint
        .parse()
        .map_err(|_| ConfigError::field(&field, "a URL such as \"http://10.0.0.11:8000\""))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => {
            return Err(ConfigError::field(
                &field,
                "a URL with a scheme, such as \"https://10.0.0.11\"",
            ));
        }
    }
    if uri.host().is_none() {
        return Err(ConfigError::field(&field, "a URL with a host"));
    }
    let selectors = [&bmc.system, &bmc.system_uuid, &bmc.system_serial]
        .iter()
        .filter(|s| s.is_some())
        .count();
    if selectors > 1 {
        return Err(ConfigError::field(
            format!("machines[{i}].bmc.system"),
            "one of system, system_uuid or system_serial, not several",
        ));
    }
    if bmc.auth == BmcAuth::Session && bmc.username.is_none() && bmc.credentials_secret.is_none() {
        return Err(ConfigError::field(
            format!("machines[{i}].bmc.auth"),
            "auth = \"session\" needs a username (with password_file) or credentials_secret",
        ));
    }
    if let Some(ca) = &bmc.ca_file {
        ccm_cloud::tls::client_config("ca_file", Some(ca), false)
            .map_err(|e| ConfigError::field(format!("machines[{i}].bmc.ca_file"), e))?;
    }
    if let Some(secret) = &bmc.credentials_secret {
        let ok = secret
            .split_once('/')
            .is_some_and(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'));
        if !ok {
            return Err(ConfigError::field(
                format!("machines[{i}].bmc.credentials_secret"),
                format!("\"namespace/name\" of a Secret; got {secret:?}"),
            ));
        }
        if bmc.password_file.is_some() {
            return Err(ConfigError::field(
                format!("machines[{i}].bmc.credentials_secret"),
                "either credentials_secret or password_file, not both",
            ));
        }
    }
    if bmc.password_file.is_some() && bmc.username.is_none() {
        return Err(ConfigError::field(
            format!("machines[{i}].bmc.username"),
            "a user name to go with password_file",
        ));
    }
    Ok(())
}

fn check_pool(i: usize, p: PoolConfig) -> Result<Pool, ConfigError> {
    if p.name.is_empty() {
        return Err(ConfigError::field(
            format!("pools[{i}].name"),
            "a pool name (it appears in events and annotations)",
        ));
    }
    if p.addresses.is_empty() {
        return Err(ConfigError::field(
            format!("pools[{i}].addresses"),
            "at least one CIDR (\"192.0.2.0/28\") or range (\"192.0.2.10-192.0.2.20\")",
        ));
    }
    let mut ranges = Vec::new();
    for (j, a) in p.addresses.iter().enumerate() {
        let range = PoolRange::parse(a)
            .map_err(|why| ConfigError::field(format!("pools[{i}].addresses[{j}]"), why))?;
        ranges.push(range);
    }
    let mut bgp_communities = Vec::new();
    for (j, c) in p.bgp_communities.iter().enumerate() {
        let c = crate::bgp::config::Community::parse(c)
            .map_err(|why| ConfigError::field(format!("pools[{i}].bgp_communities[{j}]"), why))?;
        bgp_communities.push(c);
    }
    Ok(Pool {
        name: p.name,
        ranges,
        auto_assign: p.auto_assign,
        avoid_buggy_ips: p.avoid_buggy_ips,
        use_network_and_broadcast: p.use_network_and_broadcast,
        namespaces: p.namespaces,
        service_selector: p.service_selector,
        bgp_communities,
        bgp_local_pref: p.bgp_local_pref,
    })
}

/// `*` matches any run of characters, `?` exactly one; everything else literally.
pub fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == b'?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match(b"worker-*", b"worker-12"));
        assert!(glob_match(b"w?rker-*-a", b"worker-1-a"));
        assert!(!glob_match(b"worker-*", b"master-1"));
        assert!(glob_match(b"*", b""));
        assert!(!glob_match(b"a?", b"a"));
    }

    #[test]
    fn errors_name_the_field() {
        let err = MetalConfig::parse("[[pools]]\nname = \"p\"\naddresses = [\"10.0.0.0/33\"]\n")
            .expect_err("bad cidr");
        assert_eq!(err.field.as_deref(), Some("pools[0].addresses[0]"), "{err}");
        let err = MetalConfig::parse("[[machines]]\nname = \"a\"\ninternal_ips = [\"x\"]\n")
            .expect_err("bad ip");
        assert!(
            err.to_string().contains("machines[0].internal_ips"),
            "{err}"
        );
        let err = MetalConfig::parse("[routes]\ntable = 254\n").expect_err("main table");
        assert!(err.to_string().contains("routes.table"), "{err}");
        let err = MetalConfig::parse(
            "[[machines]]\nname = \"a\"\n[machines.bmc]\nendpoint = \"ftp://bmc\"\n",
        )
        .expect_err("scheme");
        assert!(
            err.to_string().contains("machines[0].bmc.endpoint"),
            "{err}"
        );
        let err = MetalConfig::parse(
            "[[machines]]\nname = \"a\"\n[machines.bmc]\nendpoint = \"https://bmc\"\nca_file = \"/nonexistent.pem\"\n",
        )
        .expect_err("ca file");
        assert!(err.to_string().contains("machines[0].bmc.ca_file"), "{err}");
        let err = MetalConfig::parse("[[machines]]\nname = \"a\"\n[[machines]]\nname = \"a\"\n")
            .expect_err("dup");
        assert!(err.to_string().contains("appears twice"), "{err}");
    }

    #[test]
    fn the_load_balancer_class_must_be_one_a_service_can_carry() {
        let parse = |v: &str| {
            MetalConfig::parse(&format!("[load_balancer]\nload_balancer_class = {v:?}\n"))
        };
        assert_eq!(
            parse("example.com/metal")
                .expect("valid")
                .load_balancer_class
                .as_deref(),
            Some("example.com/metal")
        );
        assert_eq!(
            parse("metal")
                .expect("valid")
                .load_balancer_class
                .as_deref(),
            Some("metal")
        );
        assert_eq!(
            MetalConfig::parse("").expect("empty").load_balancer_class,
            None
        );
        for bad in [
            "",
            "Example.com/metal",
            "example.com/",
            "/metal",
            "a/b/c",
            "metal lb",
        ] {
            let err = parse(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"))
                .to_string();
            assert!(err.contains("load_balancer.load_balancer_class"), "{err}");
            assert!(err.contains("example.com/metal"), "{err}");
        }
    }

    #[test]
    fn overlapping_pools_and_pools_with_node_addresses_are_refused() {
        let err = MetalConfig::parse(
            "[[pools]]\nname = \"a\"\naddresses = [\"10.0.0.0/28\"]\n[[pools]]\nname = \"b\"\naddresses = [\"10.0.1.0/28\", \"10.0.0.8-10.0.0.20\"]\n",
        )
        .expect_err("overlap");
        assert_eq!(err.field.as_deref(), Some("pools[1].addresses[1]"), "{err}");
        assert!(err.to_string().contains("\"a\""), "{err}");
        let err = MetalConfig::parse(
            "[[machines]]\nname = \"n1\"\ninternal_ips = [\"192.0.2.7\"]\n[[pools]]\nname = \"lb\"\naddresses = [\"192.0.2.0/28\"]\n",
        )
        .expect_err("node address");
        assert!(
            err.to_string().contains("192.0.2.7") && err.to_string().contains("n1"),
            "{err}"
        );
        MetalConfig::parse(
            "[[pools]]\nname = \"a\"\naddresses = [\"10.0.0.0/28\"]\n[[pools]]\nname = \"b\"\naddresses = [\"10.0.0.16/28\", \"fd00::/120\"]\n",
        )
        .expect("adjacent pools are fine");
    }

    #[test]
    fn pool_bgp_attributes_are_checked_and_need_announced_load_balancers() {
        let bgp = "[routes]\nmode = \"bgp\"\n[routes.bgp]\nasn = 64512\nannounce_load_balancers = true\n[[routes.bgp.peers]]\naddress = \"192.0.2.1\"\nasn = 64501\n";
        let pool = "[[pools]]\nname = \"p\"\naddresses = [\"198.51.100.0/28\"]\n";
        let c = MetalConfig::parse(&format!(
            "{pool}bgp_communities = [\"64512:100\", \"4200000000:1:2\"]\nbgp_local_pref = 200\n{bgp}"
        ))
        .expect("valid");
        assert_eq!(c.pools[0].bgp_communities.len(), 2);
        assert_eq!(c.pools[0].bgp_local_pref, Some(200));
        let err = MetalConfig::parse(&format!("{pool}bgp_communities = [\"64512:70000\"]\n{bgp}"))
            .expect_err("bad community");
        assert_eq!(
            err.field.as_deref(),
            Some("pools[0].bgp_communities[0]"),
            "{err}"
        );
        let err = MetalConfig::parse(&format!("{pool}bgp_local_pref = 200\n"))
            .expect_err("nothing announces");
        assert_eq!(
            err.field.as_deref(),
            Some("pools[0].bgp_local_pref"),
            "{err}"
        );
        assert!(err.to_string().contains("announce_load_balancers"), "{err}");
    }

    #[test]
    fn exact_entries_win_over_patterns() {
        let c = MetalConfig::parse(
            "[[machines]]\npattern = \"w-*\"\nzone = \"any\"\n[[machines]]\nname = \"w-1\"\nzone = \"one\"\n",
        )
        .expect("valid");
        assert_eq!(c.machine("w-1").map(|m| m.zone.as_str()), Some("one"));
        assert_eq!(c.machine("w-2").map(|m| m.zone.as_str()), Some("any"));
        assert!(c.machine("x").is_none());
    }
}
