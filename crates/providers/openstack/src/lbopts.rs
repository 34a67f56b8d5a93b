//! What a Service's Octavia load balancer should be: `[LoadBalancer]` in cloud.conf, overridden
//! per Service by upstream's `loadbalancer.openstack.org/*` annotations. Each annotation is
//! honoured or refused (an error naming it, so a Service never gets less than it asked for);
//! the table is in docs/providers/openstack.md.

use std::time::Duration;

use ccm_cloud::{CloudError, ConfigError, Service};

use crate::config::parse_go_duration;

/// Annotation prefix of upstream's load-balancer annotations.
pub const ANNOTATION_PREFIX: &str = "loadbalancer.openstack.org/";
/// Upstream's internal-LB annotation (no floating IP).
pub const ANNOTATION_INTERNAL: &str = "service.beta.kubernetes.io/openstack-internal-load-balancer";

/// Annotations honoured, after `loadbalancer.openstack.org/`.
pub const HONOURED_ANNOTATIONS: &[&str] = &[
    "floating-network-id",
    "floating-subnet-id",
    "subnet-id",
    "network-id",
    "member-subnet-id",
    "port-id",
    "load-balancer-id",
    "keep-floatingip",
    "connection-limit",
    "proxy-protocol",
    "timeout-client-data",
    "timeout-member-connect",
    "timeout-member-data",
    "timeout-tcp-inspect",
    "flavor-id",
    "availability-zone",
    "lb-method",
    "enable-health-monitor",
    "health-monitor-delay",
    "health-monitor-timeout",
    "health-monitor-max-retries",
    "health-monitor-max-retries-down",
    "x-forwarded-for",
    "class",
    "floating-subnet",
    "floating-subnet-tags",
    "hostname",
];

/// Annotations upstream writes on the Services it manages (outputs, not requests): accepted and
/// left alone, so a Service OCCM managed is adopted as it is.
pub const OUTPUT_ANNOTATIONS: &[&str] = &["load-balancer-address"];

/// Annotations refused, after `loadbalancer.openstack.org/`, with the reason.
pub const REFUSED_ANNOTATIONS: &[(&str, &str)] = &[(
    "default-tls-container-ref",
    "TLS-terminating listeners (Barbican) are not built",
)];

/// `[LoadBalancer]` keys this provider acts on.
pub const HONOURED_KEYS: &[&str] = &[
    "enabled",
    "lb-version",
    "use-octavia",
    "subnet-id",
    "member-subnet-id",
    "network-id",
    "floating-network-id",
    "floating-subnet-id",
    "lb-method",
    "lb-provider",
    "create-monitor",
    "monitor-delay",
    "monitor-timeout",
    "monitor-max-retries",
    "monitor-max-retries-down",
    "manage-security-groups",
    "internal-lb",
    "cascade-delete",
    "flavor-id",
    "availability-zone",
    "floating-subnet",
    "floating-subnet-tags",
    "enable-ingress-hostname",
    "ingress-hostname-suffix",
];

/// Upstream's default `ingress-hostname-suffix`.
pub const DEFAULT_INGRESS_HOSTNAME_SUFFIX: &str = "nip.io";

/// One `[LoadBalancerClass "name"]` section: where a Service of that class gets its addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LbClass {
    /// `floating-network-id`.
    pub floating_network_id: Option<String>,
    /// `floating-subnet-id`.
    pub floating_subnet_id: Option<String>,
    /// `floating-subnet` (name pattern).
    pub floating_subnet: Option<String>,
    /// `floating-subnet-tags`.
    pub floating_subnet_tags: Option<String>,
    /// `network-id`.
    pub network_id: Option<String>,
    /// `subnet-id`.
    pub subnet_id: Option<String>,
    /// `member-subnet-id`.
    pub member_subnet_id: Option<String>,
}

/// `[LoadBalancer]` from cloud.conf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LbConfig {
    /// `enabled` (default true): false turns the load-balancer capability off.
    pub enabled: bool,
    /// `subnet-id`: the VIP's subnet.
    pub subnet_id: Option<String>,
    /// `network-id`: the VIP's network (Octavia picks the subnet).
    pub network_id: Option<String>,
    /// `member-subnet-id`: the members' subnet (default: the VIP's).
    pub member_subnet_id: Option<String>,
    /// `floating-network-id`: where floating IPs come from; none: the VIP is the address.
    pub floating_network_id: Option<String>,
    /// `floating-subnet-id`.
    pub floating_subnet_id: Option<String>,
    /// `lb-method` (default ROUND_ROBIN).
    pub lb_method: String,
    /// `lb-provider` (default: Octavia's default provider).
    pub provider: Option<String>,
    /// `create-monitor` (default false).
    pub create_monitor: bool,
    /// `monitor-delay`, `monitor-timeout` (default 5s, 3s).
    pub monitor_delay: Duration,
    /// `monitor-timeout`.
    pub monitor_timeout: Duration,
    /// `monitor-max-retries` (default 1), `monitor-max-retries-down` (default 3).
    pub monitor_max_retries: u32,
    /// `monitor-max-retries-down`.
    pub monitor_max_retries_down: u32,
    /// `internal-lb` (default false): no floating IP unless a Service asks.
    pub internal: bool,
    /// `flavor-id`, `availability-zone`.
    pub flavor_id: Option<String>,
    /// `availability-zone`.
    pub availability_zone: Option<String>,
    /// `manage-security-groups` (default false): a security group per Service on the member
    /// Nodes' ports (see [`crate::secgroup`]).
    pub manage_security_groups: bool,
    /// `floating-subnet`: a name pattern (glob, `~regexp`, `!` negates) choosing the floating
    /// IP's subnet on the floating network.
    pub floating_subnet: Option<String>,
    /// `floating-subnet-tags`: Neutron tag filters (`a,b` any, `&a,b` all, `!` negates).
    pub floating_subnet_tags: Option<String>,
    /// `enable-ingress-hostname` (default false): with PROXY protocol, the ingress is the
    /// hostname `<address>.<ingress-hostname-suffix>` (kube-proxy then leaves the traffic to
    /// the LB).
    pub enable_ingress_hostname: bool,
    /// `ingress-hostname-suffix` (default `nip.io`).
    pub ingress_hostname_suffix: String,
    /// `[LoadBalancerClass "name"]` sections, by name.
    pub classes: std::collections::BTreeMap<String, LbClass>,
}

impl Default for LbConfig {
    fn default() -> Self {
        LbConfig {
            enabled: true,
            subnet_id: None,
            network_id: None,
            member_subnet_id: None,
            floating_network_id: None,
            floating_subnet_id: None,
            lb_method: "ROUND_ROBIN".into(),
            provider: None,
            create_monitor: false,
            monitor_delay: Duration::from_secs(5),
            monitor_timeout: Duration::from_secs(3),
            monitor_max_retries: 1,
            monitor_max_retries_down: 3,
            internal: false,
            flavor_id: None,
            availability_zone: None,
            manage_security_groups: false,
            floating_subnet: None,
            floating_subnet_tags: None,
            enable_ingress_hostname: false,
            ingress_hostname_suffix: DEFAULT_INGRESS_HOSTNAME_SUFFIX.into(),
            classes: Default::default(),
        }
    }
}

fn field(key: &str) -> String {
    format!("[LoadBalancer] {key}")
}

fn some(v: &str) -> Option<String> {
    Some(v.to_string()).filter(|s| !s.is_empty())
}

impl LbConfig {
    /// From the validated `[LoadBalancer]` pairs of [`crate::OpenStackConfig`]. Keys that are
    /// not [`HONOURED_KEYS`] are returned for a warning.
    pub fn from_pairs(pairs: &[(String, String)]) -> Result<(Self, Vec<String>), ConfigError> {
        let mut c = LbConfig::default();
        let mut ignored = Vec::new();
        for (key, v) in pairs {
            let dur =
                || parse_go_duration(v).ok_or_else(|| ConfigError::field(field(key), "a duration"));
            let num = || {
                v.parse::<u32>()
                    .map_err(|_| ConfigError::field(field(key), "a whole number"))
            };
            match key.as_str() {
                "enabled" => c.enabled = v == "true",
                "lb-version" | "use-octavia" | "cascade-delete" => {}
                "subnet-id" => c.subnet_id = some(v),
                "network-id" => c.network_id = some(v),
                "member-subnet-id" => c.member_subnet_id = some(v),
                "floating-network-id" => c.floating_network_id = some(v),
                "floating-subnet-id" => c.floating_subnet_id = some(v),
                "lb-method" => {
                    c.lb_method = lb_method(v).map_err(|e| ConfigError::field(field(key), e))?
                }
                "lb-provider" => c.provider = some(v),
                "create-monitor" => c.create_monitor = v == "true",
                "monitor-delay" => c.monitor_delay = dur()?,
                "monitor-timeout" => c.monitor_timeout = dur()?,
                "monitor-max-retries" => c.monitor_max_retries = num()?,
                "monitor-max-retries-down" => c.monitor_max_retries_down = num()?,
                "internal-lb" => c.internal = v == "true",
                "flavor-id" => c.flavor_id = some(v),
                "availability-zone" => c.availability_zone = some(v),
                "manage-security-groups" => c.manage_security_groups = v == "true",
                "floating-subnet" => {
                    if let Some(p) = some(v) {
                        let _ = name_matcher(&p).map_err(|e| ConfigError::field(field(key), e))?;
                    }
                    c.floating_subnet = some(v)
                }
                "floating-subnet-tags" => c.floating_subnet_tags = some(v),
                "enable-ingress-hostname" => c.enable_ingress_hostname = v == "true",
                "ingress-hostname-suffix" => {
                    c.ingress_hostname_suffix =
                        some(v).unwrap_or_else(|| DEFAULT_INGRESS_HOSTNAME_SUFFIX.into())
                }
                k if k.starts_with("LoadBalancerClass ") => {
                    // `LoadBalancerClass "name" key`, as config.rs records it.
                    let rest = &k["LoadBalancerClass ".len()..];
                    let (class, ckey) = rest
                        .rsplit_once(' ')
                        .map(|(c, k)| (c.trim_matches('"').to_string(), k))
                        .unwrap_or_default();
                    let e = c.classes.entry(class).or_default();
                    let slot = match ckey {
                        "floating-network-id" => &mut e.floating_network_id,
                        "floating-subnet-id" => &mut e.floating_subnet_id,
                        "floating-subnet" => {
                            if let Some(p) = some(v) {
                                let _ = name_matcher(&p).map_err(|er| ConfigError::field(k, er))?;
                            }
                            &mut e.floating_subnet
                        }
                        "floating-subnet-tags" => &mut e.floating_subnet_tags,
                        "network-id" => &mut e.network_id,
                        "subnet-id" => &mut e.subnet_id,
                        "member-subnet-id" => &mut e.member_subnet_id,
                        _ => {
                            ignored.push(key.clone());
                            continue;
                        }
                    };
                    *slot = some(v);
                }
                _ => ignored.push(key.clone()),
            }
        }
        Ok((c, ignored))
    }
}

fn lb_method(v: &str) -> Result<String, String> {
    let up = v.to_ascii_uppercase();
    match up.as_str() {
        "ROUND_ROBIN" | "LEAST_CONNECTIONS" | "SOURCE_IP" | "SOURCE_IP_PORT" => Ok(up),
        _ => Err(format!(
            "ROUND_ROBIN, LEAST_CONNECTIONS, SOURCE_IP or SOURCE_IP_PORT, got {v:?}"
        )),
    }
}

/// A health monitor's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonitorOpts {
    /// Seconds between probes.
    pub delay: u64,
    /// Seconds a probe may take.
    pub timeout: u64,
    /// Successes to mark a member up.
    pub max_retries: u32,
    /// Failures to mark a member down.
    pub max_retries_down: u32,
}

/// One Service's load balancer settings: [`LbConfig`] with its annotations applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceLb {
    /// No floating IP.
    pub internal: bool,
    /// VIP placement.
    pub vip_subnet_id: Option<String>,
    /// VIP network.
    pub vip_network_id: Option<String>,
    /// An existing VIP port.
    pub vip_port_id: Option<String>,
    /// Members' subnet.
    pub member_subnet_id: Option<String>,
    /// Floating IP network; `None`: no floating IP.
    pub floating_network_id: Option<String>,
    /// Floating IP subnet.
    pub floating_subnet_id: Option<String>,
    /// Pool algorithm.
    pub lb_method: String,
    /// Octavia provider.
    pub provider: Option<String>,
    /// Octavia flavor.
    pub flavor_id: Option<String>,
    /// Availability zone.
    pub availability_zone: Option<String>,
    /// Health monitor, if any.
    pub monitor: Option<MonitorOpts>,
    /// Listener connection limit (-1: none).
    pub connection_limit: i64,
    /// Pools speak PROXY protocol to the nodes.
    pub proxy_protocol: bool,
    /// Listener timeouts (ms): client data, member connect, member data, TCP inspect.
    pub timeouts: [Option<u64>; 4],
    /// Keep the floating IP when the LB is deleted.
    pub keep_floating_ip: bool,
    /// An existing (shared) LB to put the listeners on.
    pub lb_id: Option<String>,
    /// Floating IP subnet by name pattern (when no `floating_subnet_id`).
    pub floating_subnet: Option<String>,
    /// Floating IP subnet by Neutron tags (when no `floating_subnet_id`).
    pub floating_subnet_tags: Option<String>,
    /// `hostname`: the ingress is this hostname instead of the address.
    pub hostname: Option<String>,
    /// `x-forwarded-for`: HTTP listeners that insert `X-Forwarded-For`.
    pub x_forwarded_for: bool,
    /// With `enable-ingress-hostname`: the suffix of the `<address>.<suffix>` ingress hostname
    /// of a PROXY-protocol LB.
    pub ingress_hostname_suffix: Option<String>,
}

fn ann<'a>(svc: &'a Service, key: &str) -> Option<&'a str> {
    svc.metadata
        .annotations
        .as_ref()?
        .get(&format!("{ANNOTATION_PREFIX}{key}"))
        .map(String::as_str)
}

fn bad(key: &str, expected: &str, got: &str) -> CloudError {
    CloudError::Permanent(format!(
        "annotation {ANNOTATION_PREFIX}{key}: expected {expected}, got {got:?}"
    ))
}

fn ann_bool(svc: &Service, key: &str, default: bool) -> Result<bool, CloudError> {
    match ann(svc, key) {
        None => Ok(default),
        Some("true") => Ok(true),
        Some("false") => Ok(false),
        Some(v) => Err(bad(key, "true or false", v)),
    }
}

fn ann_num(svc: &Service, key: &str) -> Result<Option<u64>, CloudError> {
    ann(svc, key)
        .map(|v| v.parse::<u64>().map_err(|_| bad(key, "a whole number", v)))
        .transpose()
}

fn ann_str(svc: &Service, key: &str, default: &Option<String>) -> Option<String> {
    match ann(svc, key) {
        Some(v) => some(v),
        None => default.clone(),
    }
}

fn refuse(svc: &Service) -> Result<(), CloudError> {
    for (key, why) in REFUSED_ANNOTATIONS {
        if let Some(v) = ann(svc, key) {
            // An explicit "false"/empty asks for nothing this provider lacks.
            if !v.is_empty() && v != "false" {
                return Err(CloudError::Permanent(format!(
                    "annotation {ANNOTATION_PREFIX}{key} is not supported by ccm-rs's openstack provider: {why}"
                )));
            }
        }
    }
    Ok(())
}

/// A value that failed to parse: an error when strict, the default when lenient.
fn soft<T>(r: Result<T, CloudError>, lenient: bool, default: T) -> Result<T, CloudError> {
    match r {
        Err(_) if lenient => Ok(default),
        other => other,
    }
}

impl ServiceLb {
    /// The settings for `svc`, or an error naming the first annotation that is malformed or
    /// refused.
    pub fn new(cfg: &LbConfig, svc: &Service) -> Result<Self, CloudError> {
        refuse(svc)?;
        Self::build(cfg, svc, false)
    }

    /// The settings for reading and deleting what exists: refused annotations are left out and
    /// a malformed value takes its default, except `keep-floatingip`, which decides whether an
    /// address is released (a malformed one is still an error: never act on doubt).
    pub fn for_cleanup(cfg: &LbConfig, svc: &Service) -> Result<Self, CloudError> {
        Self::build(cfg, svc, true)
    }

    fn build(cfg: &LbConfig, svc: &Service, lenient: bool) -> Result<Self, CloudError> {
        let internal = match svc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_INTERNAL))
        {
            None => cfg.internal,
            Some(v) if v == "true" => true,
            Some(v) if v == "false" => false,
            Some(_) if lenient => cfg.internal,
            Some(v) => {
                return Err(CloudError::Permanent(format!(
                    "annotation {ANNOTATION_INTERNAL}: expected true or false, got {v:?}"
                )));
            }
        };
        let monitor = soft(
            ann_bool(svc, "enable-health-monitor", cfg.create_monitor)
                .and_then(|on| on.then(|| monitor(cfg, svc)).transpose()),
            lenient,
            None,
        )?;
        let lb_method = match ann(svc, "lb-method") {
            Some(v) => soft(
                lb_method(v).map_err(|e| bad("lb-method", &e, v)),
                lenient,
                cfg.lb_method.clone(),
            )?,
            None => cfg.lb_method.clone(),
        };
        let connection_limit = match ann(svc, "connection-limit") {
            None => -1,
            Some(v) => soft(
                v.parse::<i64>()
                    .ok()
                    .filter(|n| *n >= -1)
                    .ok_or_else(|| bad("connection-limit", "-1 or a whole number", v)),
                lenient,
                -1,
            )?,
        };
        // `class` picks a `[LoadBalancerClass]` section: its keys stand in for the
        // `[LoadBalancer]` ones; the Service's own annotations still win.
        let mut base = cfg.clone();
        if let Some(class) = ann(svc, "class").filter(|c| !c.is_empty()) {
            match cfg.classes.get(class) {
                Some(c) => {
                    let over = |slot: &mut Option<String>, v: &Option<String>| {
                        if v.is_some() {
                            slot.clone_from(v);
                        }
                    };
                    over(&mut base.floating_network_id, &c.floating_network_id);
                    over(&mut base.floating_subnet_id, &c.floating_subnet_id);
                    over(&mut base.floating_subnet, &c.floating_subnet);
                    over(&mut base.floating_subnet_tags, &c.floating_subnet_tags);
                    over(&mut base.network_id, &c.network_id);
                    over(&mut base.subnet_id, &c.subnet_id);
                    over(&mut base.member_subnet_id, &c.member_subnet_id);
                }
                None if lenient => {}
                None => {
                    return Err(CloudError::Permanent(format!(
                        "annotation {ANNOTATION_PREFIX}class: no [LoadBalancerClass {class:?}] section in cloud.conf"
                    )));
                }
            }
        }
        let cfg = &base;
        let floating_network_id = if internal {
            None
        } else {
            ann_str(svc, "floating-network-id", &cfg.floating_network_id)
        };
        let floating_subnet = ann_str(svc, "floating-subnet", &cfg.floating_subnet);
        if let Some(p) = &floating_subnet
            && !lenient
        {
            let _ = name_matcher(p).map_err(|e| bad("floating-subnet", &e, p))?;
        }
        let x_forwarded_for = soft(ann_bool(svc, "x-forwarded-for", false), lenient, false)?;
        let timeout = |key: &str| soft(ann_num(svc, key), lenient, None);
        Ok(ServiceLb {
            internal,
            vip_subnet_id: ann_str(svc, "subnet-id", &cfg.subnet_id),
            vip_network_id: ann_str(svc, "network-id", &cfg.network_id),
            vip_port_id: ann_str(svc, "port-id", &None),
            member_subnet_id: ann_str(svc, "member-subnet-id", &cfg.member_subnet_id),
            floating_network_id,
            floating_subnet_id: ann_str(svc, "floating-subnet-id", &cfg.floating_subnet_id),
            lb_method,
            provider: cfg.provider.clone(),
            flavor_id: ann_str(svc, "flavor-id", &cfg.flavor_id),
            availability_zone: ann_str(svc, "availability-zone", &cfg.availability_zone),
            monitor,
            connection_limit,
            proxy_protocol: soft(ann_bool(svc, "proxy-protocol", false), lenient, false)?,
            timeouts: [
                timeout("timeout-client-data")?,
                timeout("timeout-member-connect")?,
                timeout("timeout-member-data")?,
                timeout("timeout-tcp-inspect")?,
            ],
            keep_floating_ip: ann_bool(svc, "keep-floatingip", false)?,
            lb_id: ann_str(svc, "load-balancer-id", &None),
            floating_subnet,
            floating_subnet_tags: ann_str(svc, "floating-subnet-tags", &cfg.floating_subnet_tags),
            hostname: ann_str(svc, "hostname", &None),
            x_forwarded_for,
            ingress_hostname_suffix: cfg
                .enable_ingress_hostname
                .then(|| cfg.ingress_hostname_suffix.clone()),
        })
    }
}

/// A subnet-name matcher as upstream's `floating-subnet`: a glob (`*`, `?`), or `~` and a
/// regular expression; a leading `!` negates. The whole name must match.
pub fn name_matcher(pattern: &str) -> Result<impl Fn(&str) -> bool + use<>, String> {
    let (not, pat) = match pattern.strip_prefix('!') {
        Some(rest) => (true, rest),
        None => (false, pattern),
    };
    let re = match pat.strip_prefix('~') {
        Some(r) => r.to_string(),
        None => {
            let mut r = String::new();
            for ch in pat.chars() {
                match ch {
                    '*' => r.push_str(".*"),
                    '?' => r.push('.'),
                    c => r.push_str(&regex::escape(&c.to_string())),
                }
            }
            r
        }
    };
    let re = regex::Regex::new(&format!("^(?:{re})$"))
        .map_err(|e| format!("a glob or ~regexp subnet name pattern ({e})"))?;
    Ok(move |name: &str| re.is_match(name) != not)
}

/// Neutron's subnet-listing tag filter for upstream's `floating-subnet-tags`: `a,b` any of
/// them, `&a,b` all, a leading `!` negates (`!a,b` none, `!&a,b` not all).
pub fn tag_filter(spec: &str) -> (&'static str, String) {
    let (not, rest) = match spec.strip_prefix('!') {
        Some(r) => (true, r),
        None => (false, spec),
    };
    let (all, rest) = match rest.strip_prefix('&') {
        Some(r) => (true, r),
        None => (false, rest),
    };
    let tags: Vec<&str> = rest.split(',').map(str::trim).collect();
    let key = match (all, not) {
        (true, false) => "tags",
        (true, true) => "not-tags-any",
        (false, false) => "tags-any",
        (false, true) => "not-tags",
    };
    (key, tags.join(","))
}

fn monitor(cfg: &LbConfig, svc: &Service) -> Result<MonitorOpts, CloudError> {
    let m = MonitorOpts {
        delay: ann_num(svc, "health-monitor-delay")?.unwrap_or(cfg.monitor_delay.as_secs()),
        timeout: ann_num(svc, "health-monitor-timeout")?.unwrap_or(cfg.monitor_timeout.as_secs()),
        max_retries: ann_num(svc, "health-monitor-max-retries")?
            .map_or(cfg.monitor_max_retries, |n| n.min(10) as u32),
        max_retries_down: ann_num(svc, "health-monitor-max-retries-down")?
            .map_or(cfg.monitor_max_retries_down, |n| n.min(10) as u32),
    };
    if m.delay == 0 || m.timeout == 0 || m.timeout > m.delay {
        return Err(CloudError::Permanent(format!(
            "health monitor of {}: delay ({} s) and timeout ({} s) must be positive, timeout at most delay",
            svc.metadata.name.as_deref().unwrap_or(""),
            m.delay,
            m.timeout
        )));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(anns: &[(&str, &str)]) -> Service {
        let mut s = Service::default();
        s.metadata.name = Some("web".into());
        s.metadata.annotations = Some(
            anns.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        s
    }

    #[test]
    fn annotations_override_the_config() {
        let cfg = LbConfig {
            floating_network_id: Some("pub".into()),
            ..LbConfig::default()
        };
        let s = svc(&[
            ("loadbalancer.openstack.org/floating-network-id", "other"),
            ("loadbalancer.openstack.org/enable-health-monitor", "true"),
            ("loadbalancer.openstack.org/health-monitor-delay", "7"),
            ("loadbalancer.openstack.org/connection-limit", "100"),
        ]);
        let o = ServiceLb::new(&cfg, &s).expect("valid");
        assert_eq!(o.floating_network_id.as_deref(), Some("other"));
        assert_eq!(o.monitor.as_ref().map(|m| m.delay), Some(7));
        assert_eq!(o.connection_limit, 100);
        let internal = svc(&[(ANNOTATION_INTERNAL, "true")]);
        assert_eq!(
            ServiceLb::new(&cfg, &internal)
                .expect("ok")
                .floating_network_id,
            None
        );
    }

    #[test]
    fn refused_and_malformed_annotations_name_the_annotation() {
        let cfg = LbConfig::default();
        let e = ServiceLb::new(
            &cfg,
            &svc(&[(
                "loadbalancer.openstack.org/default-tls-container-ref",
                "https://barbican/x",
            )]),
        )
        .expect_err("refused");
        assert!(e.to_string().contains("default-tls-container-ref"), "{e}");
        // ... but not for reading and deleting what exists.
        ServiceLb::for_cleanup(
            &cfg,
            &svc(&[
                (
                    "loadbalancer.openstack.org/default-tls-container-ref",
                    "https://barbican/x",
                ),
                ("loadbalancer.openstack.org/connection-limit", "many"),
            ]),
        )
        .expect("cleanup is never blocked by a refused or malformed annotation");
        // The address OCCM writes on its Services is accepted as it is.
        ServiceLb::new(
            &cfg,
            &svc(&[(
                "loadbalancer.openstack.org/load-balancer-address",
                "1.2.3.4",
            )]),
        )
        .expect("upstream's output annotation");
        let e = ServiceLb::new(
            &cfg,
            &svc(&[("loadbalancer.openstack.org/keep-floatingip", "yes")]),
        )
        .expect_err("malformed");
        assert!(e.to_string().contains("keep-floatingip"), "{e}");
        let (c, _) = LbConfig::from_pairs(&[("manage-security-groups".into(), "true".into())])
            .expect("honoured");
        assert!(c.manage_security_groups);
    }

    #[test]
    fn classes_stand_in_for_the_config_and_annotations_win() {
        let pairs: Vec<(String, String)> = [
            ("floating-network-id", "pub"),
            ("LoadBalancerClass \"internet\" floating-network-id", "inet"),
            ("LoadBalancerClass \"internet\" floating-subnet", "inet-*"),
            ("LoadBalancerClass \"internet\" member-subnet-id", "members"),
            ("enable-ingress-hostname", "true"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let (cfg, ignored) = LbConfig::from_pairs(&pairs).expect("valid");
        assert!(ignored.is_empty(), "{ignored:?}");
        let o = ServiceLb::new(
            &cfg,
            &svc(&[("loadbalancer.openstack.org/class", "internet")]),
        )
        .expect("class");
        assert_eq!(o.floating_network_id.as_deref(), Some("inet"));
        assert_eq!(o.floating_subnet.as_deref(), Some("inet-*"));
        assert_eq!(o.member_subnet_id.as_deref(), Some("members"));
        assert_eq!(o.ingress_hostname_suffix.as_deref(), Some("nip.io"));
        let o = ServiceLb::new(
            &cfg,
            &svc(&[
                ("loadbalancer.openstack.org/class", "internet"),
                ("loadbalancer.openstack.org/floating-network-id", "mine"),
            ]),
        )
        .expect("class");
        assert_eq!(o.floating_network_id.as_deref(), Some("mine"));
        assert_eq!(
            ServiceLb::new(&cfg, &svc(&[]))
                .expect("plain")
                .floating_network_id
                .as_deref(),
            Some("pub")
        );
        let e = ServiceLb::new(
            &cfg,
            &svc(&[("loadbalancer.openstack.org/class", "intranet")]),
        )
        .expect_err("unknown class");
        assert!(e.to_string().contains("intranet"), "{e}");
    }

    #[test]
    fn subnet_patterns_and_tag_filters_as_upstream() {
        let m = name_matcher("public-*").expect("glob");
        assert!(m("public-a") && !m("private-a") && !m("xpublic-a"));
        let m = name_matcher("!~pub.*[0-9]").expect("negated regexp");
        assert!(!m("pub1") && m("pub") && m("other"));
        assert!(name_matcher("~(").is_err());
        assert_eq!(tag_filter("a, b"), ("tags-any", "a,b".to_string()));
        assert_eq!(tag_filter("&a,b"), ("tags", "a,b".to_string()));
        assert_eq!(tag_filter("!a"), ("not-tags", "a".to_string()));
        assert_eq!(tag_filter("!&a,b"), ("not-tags-any", "a,b".to_string()));
        let e = LbConfig::from_pairs(&[("floating-subnet".into(), "~(".into())])
            .expect_err("bad pattern");
        assert!(e.to_string().contains("floating-subnet"), "{e}");
    }
}
