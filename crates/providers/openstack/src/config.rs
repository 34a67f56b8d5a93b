//! The cloud-config of openstack-cloud-controller-manager (`cloud.conf`, gcfg INI), read as
//! upstream reads it — same sections, keys, defaults and `use-clouds` merge — except that an
//! unknown section or key, or a value that does not parse, is an error naming the line and
//! the key (upstream's gcfg drops unknown keys silently, so a typo is never noticed).
//!
//! Every key has a [`KeyStatus`]: honoured, accepted but without effect yet (the load-balancer
//! and route settings, whose controllers this provider does not offer yet), or refused.

use std::path::PathBuf;
use std::time::Duration;

use ccm_cloud::{CloudConfig, ConfigError};

use crate::secret::Secret;
use ccm_cloud::gcfg::{self as ini, Entry, Section};

/// How this provider treats a cloud-config key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyStatus {
    /// Read and acted on as upstream does.
    Honoured,
    /// Parsed and validated, but the feature it configures is not built yet: it has no effect.
    NoEffectYet,
}

/// `[Global]`: where Keystone is and who the CCM is (upstream `client.AuthOpts`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct GlobalOpts {
    /// `auth-url`: Keystone's v3 endpoint, e.g. `https://keystone.example.com:5000/v3`.
    pub auth_url: String,
    /// `user-id`.
    pub user_id: String,
    /// `username`.
    pub username: String,
    /// `password`.
    pub password: Secret,
    /// `tenant-id`: the project to scope the token to.
    pub tenant_id: String,
    /// `tenant-name`.
    pub tenant_name: String,
    /// `trust-id`: authenticate as the trustee of this trust.
    pub trust_id: String,
    /// `trustee-id`: the trustee's user id (defaults to `user-id`).
    pub trustee_id: String,
    /// `trustee-password` (defaults to `password`).
    pub trustee_password: Secret,
    /// `domain-id`: default for the user's and the project's domain.
    pub domain_id: String,
    /// `domain-name`.
    pub domain_name: String,
    /// `tenant-domain-id`.
    pub tenant_domain_id: String,
    /// `tenant-domain-name`.
    pub tenant_domain_name: String,
    /// `user-domain-id`.
    pub user_domain_id: String,
    /// `user-domain-name`.
    pub user_domain_name: String,
    /// `region`: the catalog region; also the Nodes' `topology.kubernetes.io/region`.
    pub region: String,
    /// `os-endpoint-type`: the catalog interface (`public` by default, `internal`, `admin`).
    pub endpoint_type: String,
    /// `ca-file`: PEM CA certificates for Keystone and the endpoints.
    pub ca_file: Option<PathBuf>,
    /// `tls-insecure`: no certificate verification.
    pub tls_insecure: bool,
    /// `cert-file`: TLS client certificate (refused: not supported yet).
    pub cert_file: Option<PathBuf>,
    /// `key-file`.
    pub key_file: Option<PathBuf>,
    /// `use-clouds`: fill unset keys from clouds.yaml.
    pub use_clouds: bool,
    /// `clouds-file`.
    pub clouds_file: Option<PathBuf>,
    /// `cloud`: the entry of clouds.yaml.
    pub cloud: String,
    /// `application-credential-id`.
    pub application_credential_id: String,
    /// `application-credential-name`.
    pub application_credential_name: String,
    /// `application-credential-secret`.
    pub application_credential_secret: Secret,
}

impl std::fmt::Debug for GlobalOpts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Secret's Debug is redacted; the rest is what upstream logs at -v=5.
        f.debug_struct("GlobalOpts")
            .field("auth_url", &self.auth_url)
            .field("user_id", &self.user_id)
            .field("username", &self.username)
            .field("password", &self.password)
            .field("tenant_id", &self.tenant_id)
            .field("tenant_name", &self.tenant_name)
            .field("trust_id", &self.trust_id)
            .field("region", &self.region)
            .field("endpoint_type", &self.endpoint_type)
            .field("application_credential_id", &self.application_credential_id)
            .field(
                "application_credential_secret",
                &self.application_credential_secret,
            )
            .finish_non_exhaustive()
    }
}

/// `[Networking]`: which server addresses become which Node addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetworkingOpts {
    /// `ipv6-support-disabled`.
    pub ipv6_support_disabled: bool,
    /// `public-network-name` (repeatable): addresses on these networks are ExternalIP.
    pub public_network_name: Vec<String>,
    /// `internal-network-name` (repeatable): when set, only these networks give InternalIP.
    pub internal_network_name: Vec<String>,
    /// `address-sort-order`: comma-separated CIDRs; matching addresses first, in this order.
    pub address_sort_order: Vec<ipnet::IpNet>,
}

/// `[Metadata]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataOpts {
    /// `search-order` (`configDrive,metadataService`): where a kubelet-side lookup reads the
    /// local instance. The CCM never needs it (every lookup goes to Nova); validated only.
    pub search_order: String,
    /// `request-timeout`: the timeout of every OpenStack API request (upstream applies it to
    /// its HTTP client). Default 60 s.
    pub request_timeout: Duration,
}

impl Default for MetadataOpts {
    fn default() -> Self {
        MetadataOpts {
            search_order: "configDrive,metadataService".into(),
            request_timeout: Duration::from_secs(60),
        }
    }
}

/// The whole `cloud.conf`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenStackConfig {
    /// `[Global]`.
    pub global: GlobalOpts,
    /// `[Networking]`.
    pub networking: NetworkingOpts,
    /// `[Metadata]`.
    pub metadata: MetadataOpts,
    /// `[Route] router-id`: the Neutron router whose extraroutes carry the pod CIDRs.
    pub router_id: Option<String>,
    /// `[LoadBalancer]` and `[LoadBalancerClass "…"]` keys as written, validated (read by [`crate::lbopts::LbConfig`]).
    pub load_balancer: Vec<(String, String)>,
}

/// Every `[Global]` key and its status.
pub const GLOBAL_KEYS: &[(&str, KeyStatus)] = &[
    ("auth-url", KeyStatus::Honoured),
    ("user-id", KeyStatus::Honoured),
    ("username", KeyStatus::Honoured),
    ("password", KeyStatus::Honoured),
    ("tenant-id", KeyStatus::Honoured),
    ("tenant-name", KeyStatus::Honoured),
    ("trust-id", KeyStatus::Honoured),
    ("trustee-id", KeyStatus::Honoured),
    ("trustee-password", KeyStatus::Honoured),
    ("domain-id", KeyStatus::Honoured),
    ("domain-name", KeyStatus::Honoured),
    ("tenant-domain-id", KeyStatus::Honoured),
    ("tenant-domain-name", KeyStatus::Honoured),
    ("user-domain-id", KeyStatus::Honoured),
    ("user-domain-name", KeyStatus::Honoured),
    ("region", KeyStatus::Honoured),
    ("os-endpoint-type", KeyStatus::Honoured),
    ("ca-file", KeyStatus::Honoured),
    ("tls-insecure", KeyStatus::Honoured),
    ("use-clouds", KeyStatus::Honoured),
    ("clouds-file", KeyStatus::Honoured),
    ("cloud", KeyStatus::Honoured),
    ("application-credential-id", KeyStatus::Honoured),
    ("application-credential-name", KeyStatus::Honoured),
    ("application-credential-secret", KeyStatus::Honoured),
];

/// `[LoadBalancer]` keys (validated as text; [`crate::lbopts::HONOURED_KEYS`] are acted on).
pub const LOAD_BALANCER_KEYS: &[&str] = &[
    "enabled",
    "lb-version",
    "use-octavia",
    "subnet-id",
    "member-subnet-id",
    "network-id",
    "floating-network-id",
    "floating-subnet-id",
    "floating-subnet",
    "floating-subnet-tags",
    "lb-method",
    "lb-provider",
    "create-monitor",
    "monitor-delay",
    "monitor-timeout",
    "monitor-max-retries",
    "monitor-max-retries-down",
    "manage-security-groups",
    "internal-lb",
    "node-selector",
    "cascade-delete",
    "flavor-id",
    "availability-zone",
    "enable-ingress-hostname",
    "ingress-hostname-suffix",
    "max-shared-lb",
    "container-store",
    "default-tls-container-ref",
    "provider-requires-serial-api-calls",
];

/// `[LoadBalancerClass "name"]` keys.
pub const LB_CLASS_KEYS: &[&str] = &[
    "floating-network-id",
    "floating-subnet-id",
    "floating-subnet",
    "floating-subnet-tags",
    "network-id",
    "subnet-id",
    "member-subnet-id",
];

/// `[LoadBalancer]` keys that hold booleans (validated as such).
const LB_BOOL_KEYS: &[&str] = &[
    "enabled",
    "use-octavia",
    "create-monitor",
    "manage-security-groups",
    "internal-lb",
    "cascade-delete",
    "enable-ingress-hostname",
    "provider-requires-serial-api-calls",
];

/// Where an error points: `cloud.conf` line N, `[Section] key`.
fn err(section: &Section, e: &Entry, expected: impl Into<String>) -> ConfigError {
    ConfigError::field(
        format!("line {}: [{}] {}", e.line, section.name, e.key),
        expected,
    )
}

fn text(section: &Section, e: &Entry) -> Result<String, ConfigError> {
    match &e.value {
        Some(v) => Ok(v.clone()),
        None => Err(err(section, e, "expected `key = value`, got the key alone")),
    }
}

/// gcfg booleans: `true/yes/on/1`, `false/no/off/0`, a bare key is true.
fn boolean(section: &Section, e: &Entry) -> Result<bool, ConfigError> {
    let Some(v) = &e.value else { return Ok(true) };
    match v.to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Ok(true),
        "false" | "no" | "off" | "0" | "" => Ok(false),
        _ => Err(err(
            section,
            e,
            format!("expected true or false, got {v:?}"),
        )),
    }
}

/// Upstream's `MyDuration`: Go durations (`5s`, `1m30s`, `500ms`).
fn duration(section: &Section, e: &Entry) -> Result<Duration, ConfigError> {
    let v = text(section, e)?;
    parse_go_duration(&v).ok_or_else(|| {
        err(
            section,
            e,
            format!("expected a duration like 60s or 1m, got {v:?}"),
        )
    })
}

/// Parses a Go duration string (`1h2m3s`, `500ms`, `1.5s`).
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = s;
    let mut total = 0f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|&n| n > 0)?;
        let value: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let scale = match &rest[..u] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += value * scale;
        rest = &rest[u..];
    }
    // Past Go's limit (~292 years) is no duration: an error, not a panic.
    Duration::try_from_secs_f64(total).ok()
}

impl OpenStackConfig {
    /// Reads `--cloud-config`; without one, an error saying what to write (upstream: "no
    /// OpenStack cloud provider config file given").
    pub fn from_cloud_config(cfg: Option<&CloudConfig>) -> Result<Self, ConfigError> {
        let Some(cfg) = cfg else {
            return Err(ConfigError::general(
                "the openstack provider needs --cloud-config: a cloud.conf with [Global] auth-url and credentials",
            ));
        };
        let file = cfg.path.display().to_string();
        let mut out = Self::parse(&cfg.contents).map_err(|e| e.in_file(file.clone()))?;
        if out.global.use_clouds {
            crate::clouds::merge(&mut out.global)?;
        }
        out.validate().map_err(|e| e.in_file(file))?;
        Ok(out)
    }

    /// Parses the INI text (no clouds.yaml merge, no cross-key validation).
    pub fn parse(textual: &str) -> Result<Self, ConfigError> {
        let sections = ini::parse(textual)
            .map_err(|e| ConfigError::field(format!("line {}", e.line), e.message))?;
        let mut out = OpenStackConfig::default();
        for s in &sections {
            match s.name.to_ascii_lowercase().as_str() {
                "global" => out.global_section(s)?,
                "networking" => out.networking_section(s)?,
                "metadata" => out.metadata_section(s)?,
                "route" => out.route_section(s)?,
                "loadbalancer" => out.lb_section(s, LOAD_BALANCER_KEYS)?,
                "loadbalancerclass" if s.sub.is_some() => out.lb_section(s, LB_CLASS_KEYS)?,
                _ => {
                    return Err(ConfigError::field(
                        format!("line {}: [{}]", s.line, s.name),
                        "unknown section; openstack-cloud-controller-manager's cloud.conf has [Global], [Networking], [LoadBalancer], [LoadBalancerClass \"name\"], [Route] and [Metadata]",
                    ));
                }
            }
        }
        Ok(out)
    }

    fn global_section(&mut self, s: &Section) -> Result<(), ConfigError> {
        let g = &mut self.global;
        for e in &s.entries {
            let key = e.key.to_ascii_lowercase();
            let path = |v: String| Some(PathBuf::from(v));
            match key.as_str() {
                "auth-url" => g.auth_url = text(s, e)?,
                "user-id" => g.user_id = text(s, e)?,
                "username" => g.username = text(s, e)?,
                "password" => g.password = Secret::new(text(s, e)?),
                "tenant-id" => g.tenant_id = text(s, e)?,
                "tenant-name" => g.tenant_name = text(s, e)?,
                "trust-id" => g.trust_id = text(s, e)?,
                "trustee-id" => g.trustee_id = text(s, e)?,
                "trustee-password" => g.trustee_password = Secret::new(text(s, e)?),
                "domain-id" => g.domain_id = text(s, e)?,
                "domain-name" => g.domain_name = text(s, e)?,
                "tenant-domain-id" => g.tenant_domain_id = text(s, e)?,
                "tenant-domain-name" => g.tenant_domain_name = text(s, e)?,
                "user-domain-id" => g.user_domain_id = text(s, e)?,
                "user-domain-name" => g.user_domain_name = text(s, e)?,
                "region" => g.region = text(s, e)?,
                "os-endpoint-type" => g.endpoint_type = text(s, e)?,
                "ca-file" => g.ca_file = path(text(s, e)?),
                // Upstream: a string that must match ^true|false$.
                "tls-insecure" => g.tls_insecure = boolean(s, e)?,
                "cert-file" => g.cert_file = path(text(s, e)?),
                "key-file" => g.key_file = path(text(s, e)?),
                "use-clouds" => g.use_clouds = boolean(s, e)?,
                "clouds-file" => g.clouds_file = path(text(s, e)?),
                "cloud" => g.cloud = text(s, e)?,
                "application-credential-id" => g.application_credential_id = text(s, e)?,
                "application-credential-name" => g.application_credential_name = text(s, e)?,
                "application-credential-secret" => {
                    g.application_credential_secret = Secret::new(text(s, e)?)
                }
                _ => return Err(unknown(s, e, &known_global())),
            }
        }
        Ok(())
    }

    fn networking_section(&mut self, s: &Section) -> Result<(), ConfigError> {
        let n = &mut self.networking;
        for e in &s.entries {
            match e.key.to_ascii_lowercase().as_str() {
                "ipv6-support-disabled" => n.ipv6_support_disabled = boolean(s, e)?,
                "public-network-name" => n.public_network_name.push(text(s, e)?),
                "internal-network-name" => n.internal_network_name.push(text(s, e)?),
                "address-sort-order" => {
                    n.address_sort_order = Vec::new();
                    for item in text(s, e)?
                        .split(',')
                        .map(str::trim)
                        .filter(|i| !i.is_empty())
                    {
                        let cidr = item.parse::<ipnet::IpNet>().map_err(|_| {
                            err(
                                s,
                                e,
                                format!("expected comma-separated CIDRs, {item:?} is not one"),
                            )
                        })?;
                        n.address_sort_order.push(cidr.trunc());
                    }
                }
                _ => {
                    return Err(unknown(
                        s,
                        e,
                        "ipv6-support-disabled, public-network-name, internal-network-name, address-sort-order",
                    ));
                }
            }
        }
        Ok(())
    }

    fn metadata_section(&mut self, s: &Section) -> Result<(), ConfigError> {
        for e in &s.entries {
            match e.key.to_ascii_lowercase().as_str() {
                "search-order" => {
                    let v = text(s, e)?;
                    let items: Vec<&str> = v.split(',').map(str::trim).collect();
                    let ok = !items.is_empty()
                        && items.len() <= 2
                        && items
                            .iter()
                            .all(|i| *i == "configDrive" || *i == "metadataService");
                    if !ok {
                        return Err(err(
                            s,
                            e,
                            format!(
                                "expected configDrive, metadataService or both comma-separated, got {v:?}"
                            ),
                        ));
                    }
                    self.metadata.search_order = v;
                }
                "request-timeout" => self.metadata.request_timeout = duration(s, e)?,
                _ => return Err(unknown(s, e, "search-order, request-timeout")),
            }
        }
        Ok(())
    }

    fn route_section(&mut self, s: &Section) -> Result<(), ConfigError> {
        for e in &s.entries {
            match e.key.to_ascii_lowercase().as_str() {
                "router-id" => self.router_id = Some(text(s, e)?),
                _ => return Err(unknown(s, e, "router-id")),
            }
        }
        Ok(())
    }

    fn lb_section(&mut self, s: &Section, keys: &[&str]) -> Result<(), ConfigError> {
        for e in &s.entries {
            let key = e.key.to_ascii_lowercase();
            if !keys.contains(&key.as_str()) {
                return Err(unknown(s, e, &keys.join(", ")));
            }
            let value = match key.as_str() {
                k if LB_BOOL_KEYS.contains(&k) => boolean(s, e)?.to_string(),
                "monitor-delay" | "monitor-timeout" => {
                    duration(s, e)?;
                    text(s, e)?
                }
                "monitor-max-retries" | "monitor-max-retries-down" | "max-shared-lb" => {
                    let v = text(s, e)?;
                    v.parse::<u32>()
                        .map_err(|_| err(s, e, format!("expected a whole number, got {v:?}")))?;
                    v
                }
                _ => text(s, e)?,
            };
            let name = match &s.sub {
                Some(sub) => format!("LoadBalancerClass {sub:?} {key}"),
                None => key,
            };
            self.load_balancer.push((name, value));
        }
        Ok(())
    }

    /// Cross-key checks, after the clouds.yaml merge: the errors upstream only meets at the
    /// first Keystone call, said at startup.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let g = &self.global;
        let field = |k: &str| format!("[Global] {k}");
        if g.auth_url.is_empty() {
            return Err(ConfigError::field(
                field("auth-url"),
                "required: Keystone's v3 URL, e.g. https://keystone.example.com:5000/v3 (or use-clouds = true with a clouds.yaml that has auth.auth_url)",
            ));
        }
        let url = url::Url::parse(&g.auth_url).map_err(|e| {
            ConfigError::field(
                field("auth-url"),
                format!("not a URL ({e}): {:?}", g.auth_url),
            )
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(ConfigError::field(
                field("auth-url"),
                format!("expected an http or https URL, got {:?}", g.auth_url),
            ));
        }
        if g.cert_file.is_some() || g.key_file.is_some() {
            return Err(ConfigError::field(
                field("cert-file"),
                "TLS client certificates are not supported by ccm-rs yet; authenticate with a password, an application credential or a trust",
            ));
        }
        let app_cred = !g.application_credential_secret.is_empty();
        if app_cred {
            if g.application_credential_id.is_empty() && g.application_credential_name.is_empty() {
                return Err(ConfigError::field(
                    field("application-credential-secret"),
                    "needs application-credential-id, or application-credential-name with the user (user-id, or username and user-domain-name)",
                ));
            }
            if g.application_credential_id.is_empty()
                && g.user_id.is_empty()
                && g.username.is_empty()
            {
                return Err(ConfigError::field(
                    field("application-credential-name"),
                    "an application credential by name needs its user: user-id, or username with user-domain-name/-id",
                ));
            }
            return Ok(());
        }
        let (user_set, password_set) = if g.trust_id.is_empty() {
            (
                !g.user_id.is_empty() || !g.username.is_empty(),
                !g.password.is_empty(),
            )
        } else {
            (
                !g.trustee_id.is_empty() || !g.user_id.is_empty() || !g.username.is_empty(),
                !g.trustee_password.is_empty() || !g.password.is_empty(),
            )
        };
        if !user_set || !password_set {
            return Err(ConfigError::field(
                field(if user_set { "password" } else { "username" }),
                "no credentials: set username (or user-id) and password, or application-credential-id and application-credential-secret, or trust-id with the trustee's user-id and password",
            ));
        }
        Ok(())
    }

    /// The catalog interface: `public` unless `os-endpoint-type` says otherwise. Upstream
    /// (gophercloud) also accepts the v2 spellings `publicURL`, `internalURL`, `adminURL`.
    pub fn interface(&self) -> String {
        let t = self.global.endpoint_type.trim();
        let t = t.strip_suffix("URL").unwrap_or(t);
        if t.is_empty() {
            "public".into()
        } else {
            t.to_ascii_lowercase()
        }
    }
}

fn known_global() -> String {
    let mut k: Vec<&str> = GLOBAL_KEYS.iter().map(|(k, _)| *k).collect();
    k.extend(["cert-file", "key-file"]);
    k.join(", ")
}

fn unknown(s: &Section, e: &Entry, known: &str) -> ConfigError {
    err(
        s,
        e,
        format!("unknown key (upstream would ignore it silently); known keys here: {known}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the `openstack_config` fuzz target: a duration past Go's limit panicked.
    #[test]
    fn a_duration_past_gos_limit_is_an_error_not_a_panic() {
        assert_eq!(parse_go_duration(&format!("{}s", "9".repeat(90))), None);
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
    }

    const FULL: &str = r#"
[Global]
auth-url = https://keystone.example.com:5000/v3
username = ccm
password = "s3cr3t;with#chars"
tenant-name = k8s
domain-name = Default
region = RegionOne
os-endpoint-type = internalURL
ca-file = /etc/ssl/os-ca.pem
tls-insecure = false

[Networking]
public-network-name = public
public-network-name = public2
internal-network-name = private
ipv6-support-disabled = true
address-sort-order = 10.0.0.0/8, 192.168.0.0/16

[LoadBalancer]
floating-network-id = 0f0e-net
manage-security-groups = true
monitor-delay = 5s

[LoadBalancerClass "internet"]
floating-network-id = abc

[Route]
router-id = r-1

[Metadata]
search-order = configDrive,metadataService
request-timeout = 30s
"#;

    #[test]
    fn every_section_of_an_upstream_cloud_conf_is_read() {
        let c = OpenStackConfig::parse(FULL).expect("parses");
        assert_eq!(c.global.auth_url, "https://keystone.example.com:5000/v3");
        assert_eq!(c.global.password.expose(), "s3cr3t;with#chars");
        assert_eq!(c.global.tenant_name, "k8s");
        assert_eq!(c.interface(), "internal");
        assert_eq!(c.networking.public_network_name, ["public", "public2"]);
        assert_eq!(c.networking.internal_network_name, ["private"]);
        assert!(c.networking.ipv6_support_disabled);
        assert_eq!(c.networking.address_sort_order.len(), 2);
        assert_eq!(c.router_id.as_deref(), Some("r-1"));
        assert_eq!(c.metadata.request_timeout, Duration::from_secs(30));
        assert!(c.load_balancer.contains(&(
            "LoadBalancerClass \"internet\" floating-network-id".into(),
            "abc".into()
        )));
        c.validate().expect("valid");
    }

    #[test]
    fn unknown_and_malformed_keys_name_the_line_and_the_key() {
        let e = OpenStackConfig::parse("[Global]\nauth-url = x\nregoin = RegionOne\n")
            .expect_err("typo");
        let msg = e.to_string();
        assert!(msg.contains("line 3: [Global] regoin"), "{msg}");
        assert!(msg.contains("region"), "lists the known keys: {msg}");

        let e = OpenStackConfig::parse("[Networking]\nipv6-support-disabled = maybe\n")
            .expect_err("bool");
        assert!(e.to_string().contains("ipv6-support-disabled"), "{e}");
        let e = OpenStackConfig::parse("[Networking]\naddress-sort-order = 10.0.0.0/8, ten\n")
            .expect_err("cidr");
        assert!(e.to_string().contains("\"ten\""), "{e}");
        let e = OpenStackConfig::parse("[LoadBalancer]\nmonitor-delay = five\n").expect_err("dur");
        assert!(e.to_string().contains("monitor-delay"), "{e}");
        let e = OpenStackConfig::parse("[BlockStorage]\nbs-version = v3\n").expect_err("section");
        assert!(e.to_string().contains("[BlockStorage]"), "{e}");
        let e = OpenStackConfig::parse("[Metadata]\nsearch-order = cloudInit\n").expect_err("so");
        assert!(e.to_string().contains("search-order"), "{e}");
    }

    #[test]
    fn missing_credentials_are_refused_at_startup() {
        let c = OpenStackConfig::parse("[Global]\nauth-url = http://k:5000/v3\nusername = u\n")
            .expect("parses");
        let e = c.validate().expect_err("no password");
        assert!(e.to_string().contains("password"), "{e}");
        let c = OpenStackConfig::parse("[Global]\nusername = u\npassword = p\n").expect("parses");
        assert!(
            c.validate()
                .expect_err("no url")
                .to_string()
                .contains("auth-url")
        );
        let c = OpenStackConfig::parse(
            "[Global]\nauth-url = http://k:5000/v3\napplication-credential-id = i\napplication-credential-secret = s\n",
        )
        .expect("parses");
        c.validate().expect("app credential alone is enough");
        let c = OpenStackConfig::parse(
            "[Global]\nauth-url = http://k:5000/v3\ntrust-id = t\ntrustee-id = u\ntrustee-password = p\n",
        )
        .expect("parses");
        c.validate().expect("trust");
    }

    #[test]
    fn secrets_never_show_in_debug_output() {
        let c = OpenStackConfig::parse(FULL).expect("parses");
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("s3cr3t"), "{dbg}");
        assert!(dbg.contains("auth_url"), "{dbg}");
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_go_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_go_duration("5"), None);
        assert_eq!(parse_go_duration("s"), None);
    }
}
