//! `--cloud-config` for `--cloud-provider=aws`: upstream's INI file as is, or TOML.
//!
//! Upstream cloud-provider-aws reads an INI file with a `[Global]` section and
//! `[ServiceOverride "n"]` blocks (see [`crate::ini`]); a file whose first section is one of
//! those is read that way, with every key of upstream's `config.go`. Other ccm-rs providers read
//! TOML, so the same settings are accepted as snake_case keys and `[[service_override]]` tables:
//!
//! ```toml
//! region = "us-east-1"                  # default: the SDK chain (AWS_REGION, profile, IMDS)
//! kubernetes_cluster_id = "prod"        # cluster tag value; default: the CCM host's tags
//! vpc = "vpc-0abc"                      # default: the VPC of the cluster's instances
//! role_arn = "arn:aws:iam::1:role/ccm"  # assume this role on top of the default chain
//! route_table_id = ["rtb-0abc"]         # default: tables tagged kubernetes.io/cluster/<id>
//! node_ip_families = ["ipv4", "ipv6"]   # default ["ipv4"]
//!
//! [[service_override]]                  # what moto or a VPC endpoint needs
//! service = "ec2"                       # ec2 | elasticloadbalancing | elasticloadbalancingv2 | sts
//! url = "http://127.0.0.1:5000"
//! ```

use ccm_cloud::{CloudConfig, ConfigError};
use serde::Deserialize;

use crate::ini;

/// The parsed cloud-config. Every field is optional: with none, the SDK's default chain decides
/// region and credentials and the cluster id comes from the CCM host's instance tags.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AwsConfig {
    /// The region; default: the SDK chain.
    pub region: Option<String>,
    /// Value of the `kubernetes.io/cluster/<id>` tag key (upstream `KubernetesClusterID`).
    pub kubernetes_cluster_id: Option<String>,
    /// The VPC load balancers and security groups go into (upstream `VPC`).
    pub vpc: Option<String>,
    /// A role to assume for every call (upstream `RoleARN`).
    pub role_arn: Option<String>,
    /// Route tables for pod routes instead of the tagged ones (upstream `RouteTableID`).
    #[serde(default)]
    pub route_table_id: Vec<String>,
    /// Which address families become node addresses, in order (upstream `NodeIPFamilies`).
    #[serde(default = "default_families")]
    pub node_ip_families: Vec<IpFamily>,
    /// Per-service endpoints (upstream `ServiceOverride`).
    #[serde(default)]
    pub service_override: Vec<ServiceOverride>,
    /// Leave the nodes' security groups alone: the operator opens load-balancer traffic to the
    /// nodes themselves (upstream `DisableSecurityGroupIngress`).
    #[serde(default)]
    pub disable_security_group_ingress: bool,
    /// One security group every Classic ELB uses instead of a group created per load balancer,
    /// for accounts whose security-group quota cannot take one per Service (upstream
    /// `ElbSecurityGroup`).
    pub elb_security_group: Option<String>,
    /// Whether NLBs get a security group the controller manages (upstream
    /// `NLBSecurityGroupMode`); without one, NLB traffic is admitted on the nodes' groups.
    pub nlb_security_group_mode: Option<NlbSecurityGroupMode>,
    /// The legacy cluster id: resources are tagged `KubernetesCluster=<id>` (upstream
    /// `KubernetesClusterTag`).
    pub kubernetes_cluster_tag: Option<String>,
    /// Upstream `Zone`: read, not used (upstream ignores it too; zones come from instances).
    pub zone: Option<String>,
    /// Upstream `SubnetID`: the subnet for load balancers when no subnet is tagged.
    pub subnet_id: Option<String>,
    /// Upstream `SourceARN`: passed as the source when assuming `role_arn`.
    pub source_arn: Option<String>,
    /// Upstream `ClusterServiceLoadBalancerHealthProbeMode` (`Shared` or `ServiceNodePort`).
    pub cluster_service_load_balancer_health_probe_mode: Option<String>,
    /// Upstream `ClusterServiceSharedLoadBalancerHealthProbePort`.
    pub cluster_service_shared_load_balancer_health_probe_port: Option<u16>,
    /// Upstream `ClusterServiceSharedLoadBalancerHealthProbePath`.
    pub cluster_service_shared_load_balancer_health_probe_path: Option<String>,
    /// Upstream `SupportedTopologyInstanceTypePattern`.
    pub supported_topology_instance_type_pattern: Option<String>,
    /// `ServiceOverride` settings that were read but are not applied (signing name and region,
    /// services ccm-rs does not call), for the startup warning.
    #[serde(skip)]
    pub ignored_overrides: Vec<String>,
}

/// Upstream's `NLBSecurityGroupMode`: `Managed` opts into a security group per NLB.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
pub enum NlbSecurityGroupMode {
    /// The controller creates, attaches, updates and deletes a security group for each NLB.
    Managed,
}

fn default_families() -> Vec<IpFamily> {
    vec![IpFamily::Ipv4]
}

/// The same as an empty cloud-config: IPv4 node addresses, everything else from the SDK chain.
impl Default for AwsConfig {
    fn default() -> Self {
        AwsConfig {
            region: None,
            kubernetes_cluster_id: None,
            vpc: None,
            role_arn: None,
            route_table_id: Vec::new(),
            node_ip_families: default_families(),
            service_override: Vec::new(),
            disable_security_group_ingress: false,
            elb_security_group: None,
            nlb_security_group_mode: None,
            kubernetes_cluster_tag: None,
            zone: None,
            subnet_id: None,
            source_arn: None,
            cluster_service_load_balancer_health_probe_mode: None,
            cluster_service_shared_load_balancer_health_probe_port: None,
            cluster_service_shared_load_balancer_health_probe_path: None,
            supported_topology_instance_type_pattern: None,
            ignored_overrides: Vec::new(),
        }
    }
}

/// An address family for node addresses.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum IpFamily {
    /// Private IPv4 addresses, public IPv4, and the instance's DNS names.
    Ipv4,
    /// The first IPv6 address of each network interface.
    Ipv6,
}

/// An endpoint for one AWS service.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServiceOverride {
    /// `ec2`, `elasticloadbalancing`, `elasticloadbalancingv2` or `sts`.
    pub service: Service,
    /// The endpoint URL.
    pub url: String,
}

/// The AWS services this provider calls.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Service {
    /// EC2 (instances, routes, security groups, subnets).
    Ec2,
    /// Classic ELB.
    Elasticloadbalancing,
    /// ELBv2 (NLB).
    Elasticloadbalancingv2,
    /// STS (role assumption).
    Sts,
}

impl AwsConfig {
    /// Parses and checks a cloud-config; errors name the field and the fix.
    pub fn from_cloud_config(cfg: Option<&CloudConfig>) -> Result<Self, ConfigError> {
        let parsed: AwsConfig = match cfg {
            Some(c) if ini::looks_like_ini(&c.contents) => {
                from_ini(&c.contents).map_err(|e| e.in_file(c.path.display().to_string()))?
            }
            Some(c) => c.parse_toml()?,
            None => AwsConfig::default(),
        };
        parsed.validate()?;
        crate::identity::from_config(&parsed)?;
        Ok(parsed)
    }

    /// Settings ccm-rs reads but does not act on yet (upstream key names), for the startup
    /// warning: an operator migrating sees what still behaves differently.
    pub fn not_honoured(&self) -> Vec<String> {
        let mut out: Vec<String> = [
            ("Zone", self.zone.is_some()),
            ("SubnetID", self.subnet_id.is_some()),
            ("SourceARN", self.source_arn.is_some()),
            (
                "ClusterServiceLoadBalancerHealthProbeMode",
                self.cluster_service_load_balancer_health_probe_mode
                    .is_some(),
            ),
            (
                "ClusterServiceSharedLoadBalancerHealthProbePort",
                self.cluster_service_shared_load_balancer_health_probe_port
                    .is_some(),
            ),
            (
                "ClusterServiceSharedLoadBalancerHealthProbePath",
                self.cluster_service_shared_load_balancer_health_probe_path
                    .is_some(),
            ),
            (
                "SupportedTopologyInstanceTypePattern",
                self.supported_topology_instance_type_pattern.is_some(),
            ),
        ]
        .into_iter()
        .filter(|(_, set)| *set)
        .map(|(k, _)| k.to_string())
        .collect();
        out.extend(self.ignored_overrides.iter().cloned());
        out
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.node_ip_families.is_empty() {
            return Err(ConfigError::field(
                "node_ip_families",
                "must name at least one of \"ipv4\", \"ipv6\"",
            ));
        }
        for (i, o) in self.service_override.iter().enumerate() {
            if !(o.url.starts_with("http://") || o.url.starts_with("https://")) {
                return Err(ConfigError::field(
                    format!("service_override[{i}].url"),
                    format!("expected an http:// or https:// URL, got {:?}", o.url),
                ));
            }
        }
        if let Some(r) = &self.role_arn
            && !r.starts_with("arn:")
        {
            return Err(ConfigError::field(
                "role_arn",
                format!("expected an IAM role ARN (arn:aws:iam::<account>:role/<name>), got {r:?}"),
            ));
        }
        Ok(())
    }

    /// The endpoint override for `service`, if any.
    pub fn endpoint(&self, service: Service) -> Option<&str> {
        self.service_override
            .iter()
            .find(|o| o.service == service)
            .map(|o| o.url.as_str())
    }
}

/// Upstream's `[Global]` keys (`config.go`), in its order.
pub const GLOBAL_KEYS: &[&str] = &[
    "Zone",
    "Region",
    "VPC",
    "SubnetID",
    "RouteTableID",
    "RoleARN",
    "SourceARN",
    "KubernetesClusterTag",
    "KubernetesClusterID",
    "DisableSecurityGroupIngress",
    "ElbSecurityGroup",
    "NodeIPFamilies",
    "ClusterServiceLoadBalancerHealthProbeMode",
    "ClusterServiceSharedLoadBalancerHealthProbePort",
    "ClusterServiceSharedLoadBalancerHealthProbePath",
    "SupportedTopologyInstanceTypePattern",
    "NLBSecurityGroupMode",
];

/// Upstream's `[ServiceOverride "n"]` keys.
pub const OVERRIDE_KEYS: &[&str] = &[
    "Service",
    "Region",
    "URL",
    "SigningRegion",
    "SigningMethod",
    "SigningName",
];

/// gcfg matches names case-insensitively.
fn canonical(known: &[&'static str], key: &str) -> Option<&'static str> {
    known.iter().copied().find(|k| k.eq_ignore_ascii_case(key))
}

fn at(e: &ini::Entry) -> String {
    format!("{} (line {})", e.key, e.line)
}

/// A string value; a bare key has none.
fn text(e: &ini::Entry) -> Result<String, ConfigError> {
    e.value
        .clone()
        .ok_or_else(|| ConfigError::field(at(e), "needs a value: `Name = value`"))
}

/// gcfg booleans: a bare key, or true/yes/on/1, false/no/off/0.
fn boolean(e: &ini::Entry) -> Result<bool, ConfigError> {
    match e.value.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("true" | "yes" | "on" | "1") => Ok(true),
        Some("false" | "no" | "off" | "0") => Ok(false),
        Some(other) => Err(ConfigError::field(
            at(e),
            format!("expected true or false, got {other:?}"),
        )),
    }
}

fn non_empty(v: String) -> Option<String> {
    (!v.trim().is_empty()).then(|| v.trim().to_string())
}

/// Reads upstream's INI cloud-config. An unknown section or key, a key in the wrong section
/// and a bad value are errors naming the line and key.
pub fn from_ini(text: &str) -> Result<AwsConfig, ConfigError> {
    let sections =
        ini::parse(text).map_err(|e| ConfigError::field(format!("line {}", e.line), e.message))?;
    let mut cfg = AwsConfig::default();
    let mut families: Option<Vec<IpFamily>> = None;
    let mut overrides: Vec<(String, usize, Vec<ini::Entry>)> = Vec::new();
    for s in sections {
        if s.name.eq_ignore_ascii_case("global") && s.sub.is_none() {
            for e in &s.entries {
                global(&mut cfg, &mut families, e)?;
            }
        } else if s.name.eq_ignore_ascii_case("serviceoverride") && s.sub.is_some() {
            let n = s.sub.unwrap_or_default();
            for e in &s.entries {
                if canonical(OVERRIDE_KEYS, &e.key).is_none() {
                    return Err(wrong_place(e, &format!("[ServiceOverride \"{n}\"]")));
                }
            }
            match overrides.iter_mut().find(|(name, ..)| *name == n) {
                Some((_, _, entries)) => entries.extend(s.entries),
                None => overrides.push((n, s.line, s.entries)),
            }
        } else {
            return Err(ConfigError::field(
                format!("[{}] (line {})", s.name, s.line),
                "unknown section; upstream's cloud-config has [Global] and [ServiceOverride \"<n>\"]",
            ));
        }
    }
    if let Some(f) = families {
        cfg.node_ip_families = f;
    }
    for (n, line, entries) in overrides {
        service_override(&mut cfg, &n, line, &entries)?;
    }
    Ok(cfg)
}

/// The error for a key that is not in `section`: where it belongs, if anywhere.
fn wrong_place(e: &ini::Entry, section: &str) -> ConfigError {
    let global = canonical(GLOBAL_KEYS, &e.key);
    let over = canonical(OVERRIDE_KEYS, &e.key);
    let hint = match (global, over) {
        (Some(k), _) => format!("{k} belongs in [Global], not {section}"),
        (None, Some(k)) => {
            format!("{k} belongs in a [ServiceOverride \"<n>\"] section, not {section}")
        }
        (None, None) => format!(
            "unknown key in {section}; known keys: {}",
            if section == "[Global]" {
                GLOBAL_KEYS.join(", ")
            } else {
                OVERRIDE_KEYS.join(", ")
            }
        ),
    };
    ConfigError::field(at(e), hint)
}

fn global(
    cfg: &mut AwsConfig,
    families: &mut Option<Vec<IpFamily>>,
    e: &ini::Entry,
) -> Result<(), ConfigError> {
    let Some(key) = canonical(GLOBAL_KEYS, &e.key) else {
        return Err(wrong_place(e, "[Global]"));
    };
    let opt = || text(e).map(non_empty);
    match key {
        "Zone" => cfg.zone = opt()?,
        "Region" => cfg.region = opt()?,
        "VPC" => cfg.vpc = opt()?,
        "SubnetID" => cfg.subnet_id = opt()?,
        "RouteTableID" => cfg.route_table_id = opt()?.into_iter().collect(),
        "RoleARN" => cfg.role_arn = opt()?,
        "SourceARN" => cfg.source_arn = opt()?,
        "KubernetesClusterTag" => cfg.kubernetes_cluster_tag = opt()?,
        "KubernetesClusterID" => cfg.kubernetes_cluster_id = opt()?,
        "DisableSecurityGroupIngress" => cfg.disable_security_group_ingress = boolean(e)?,
        "ElbSecurityGroup" => cfg.elb_security_group = opt()?,
        "NodeIPFamilies" => {
            let list = families.get_or_insert_with(Vec::new);
            match opt()? {
                // gcfg: an empty value resets a multi-valued variable.
                None => list.clear(),
                Some(v) => list.push(match v.to_ascii_lowercase().as_str() {
                    "ipv4" => IpFamily::Ipv4,
                    "ipv6" => IpFamily::Ipv6,
                    _ => {
                        return Err(ConfigError::field(
                            at(e),
                            format!("expected ipv4 or ipv6, got {v:?}"),
                        ));
                    }
                }),
            }
        }
        "ClusterServiceLoadBalancerHealthProbeMode" => {
            let v = opt()?;
            if let Some(m) = v.as_deref()
                && m != "Shared"
                && m != "ServiceNodePort"
            {
                return Err(ConfigError::field(
                    at(e),
                    format!("expected Shared or ServiceNodePort, got {m:?}"),
                ));
            }
            cfg.cluster_service_load_balancer_health_probe_mode = v;
        }
        "ClusterServiceSharedLoadBalancerHealthProbePort" => {
            cfg.cluster_service_shared_load_balancer_health_probe_port = match opt()? {
                None => None,
                Some(p) => Some(p.parse().map_err(|_| {
                    ConfigError::field(at(e), format!("expected a port number, got {p:?}"))
                })?),
            }
        }
        "ClusterServiceSharedLoadBalancerHealthProbePath" => {
            cfg.cluster_service_shared_load_balancer_health_probe_path = opt()?
        }
        "SupportedTopologyInstanceTypePattern" => {
            cfg.supported_topology_instance_type_pattern = opt()?
        }
        "NLBSecurityGroupMode" => {
            // Upstream: only exactly "Managed" turns it on; anything else leaves it off.
            cfg.nlb_security_group_mode =
                (opt()?.as_deref() == Some("Managed")).then_some(NlbSecurityGroupMode::Managed)
        }
        _ => return Err(wrong_place(e, "[Global]")),
    }
    Ok(())
}

/// The services ccm-rs calls, by upstream's names (SDK v2 service ids and endpoint prefixes).
fn service_named(name: &str) -> Option<Service> {
    match name.to_ascii_lowercase().as_str() {
        "ec2" => Some(Service::Ec2),
        "elasticloadbalancing" | "elastic load balancing" | "elb" => {
            Some(Service::Elasticloadbalancing)
        }
        "elasticloadbalancingv2" | "elastic load balancing v2" | "elbv2" => {
            Some(Service::Elasticloadbalancingv2)
        }
        "sts" => Some(Service::Sts),
        _ => None,
    }
}

/// One `[ServiceOverride "n"]`, checked as upstream's `ValidateOverrides`: Service, Region,
/// URL and SigningRegion are required; one override per service and region. As upstream, an
/// override applies only to its Region: with `Region` in [Global] set to another, it is unused.
fn service_override(
    cfg: &mut AwsConfig,
    n: &str,
    line: usize,
    entries: &[ini::Entry],
) -> Result<(), ConfigError> {
    let get = |k: &str| -> Result<Option<String>, ConfigError> {
        let mut v = None;
        for e in entries.iter().filter(|e| e.key.eq_ignore_ascii_case(k)) {
            v = text(e).map(non_empty)?;
        }
        Ok(v)
    };
    let section = format!("[ServiceOverride \"{n}\"] (line {line})");
    let need = |k: &str, v: Option<String>| {
        v.ok_or_else(|| {
            ConfigError::field(
                format!("{section} {k}"),
                format!("{k} is required in every ServiceOverride"),
            )
        })
    };
    let name = need("Service", get("Service")?)?;
    let region = need("Region", get("Region")?)?;
    let url = need("URL", get("URL")?)?;
    let signing_region = need("SigningRegion", get("SigningRegion")?)?;
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(ConfigError::field(
            format!("{section} URL"),
            format!("expected an http:// or https:// URL, got {url:?}"),
        ));
    }
    let Some(service) = service_named(&name) else {
        cfg.ignored_overrides.push(format!(
            "ServiceOverride \"{n}\" (Service {name}: ccm-rs calls only ec2, elasticloadbalancing, elasticloadbalancingv2 and sts)"
        ));
        return Ok(());
    };
    if cfg.region.as_deref().is_some_and(|r| r != region) {
        cfg.ignored_overrides.push(format!(
            "ServiceOverride \"{n}\" (Region {region} is not the [Global] Region; unused, as upstream)"
        ));
        return Ok(());
    }
    if cfg.service_override.iter().any(|o| o.service == service) {
        return Err(ConfigError::field(
            format!("{section} Service"),
            format!("duplicate override for {name} in {region}"),
        ));
    }
    if signing_region != region {
        cfg.ignored_overrides
            .push(format!("ServiceOverride \"{n}\" SigningRegion"));
    }
    if get("SigningName")?.is_some() {
        cfg.ignored_overrides
            .push(format!("ServiceOverride \"{n}\" SigningName"));
    }
    cfg.service_override.push(ServiceOverride { service, url });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<AwsConfig, ConfigError> {
        AwsConfig::from_cloud_config(Some(&CloudConfig {
            path: "cloud.toml".into(),
            contents: text.into(),
        }))
    }

    #[test]
    fn full_config_parses() {
        let c = parse(
            "region = \"eu-west-1\"\nkubernetes_cluster_id = \"prod\"\nnode_ip_families = [\"ipv6\", \"ipv4\"]\n[[service_override]]\nservice = \"ec2\"\nurl = \"http://127.0.0.1:1\"\n",
        )
        .expect("valid");
        assert_eq!(c.region.as_deref(), Some("eu-west-1"));
        assert_eq!(c.node_ip_families, vec![IpFamily::Ipv6, IpFamily::Ipv4]);
        assert_eq!(c.endpoint(Service::Ec2), Some("http://127.0.0.1:1"));
        assert_eq!(c.endpoint(Service::Sts), None);
        assert_eq!(
            parse("").expect("empty").node_ip_families,
            vec![IpFamily::Ipv4]
        );
    }

    #[test]
    fn bad_fields_are_named() {
        let e = parse("[[service_override]]\nservice = \"ec2\"\nurl = \"127.0.0.1:1\"\n")
            .expect_err("no scheme");
        assert!(e.to_string().contains("service_override[0].url"), "{e}");
        let e = parse("regoin = \"x\"\n").expect_err("typo");
        assert!(e.to_string().contains("unknown field `regoin`"), "{e}");
        let e = parse("node_ip_families = [\"ipv5\"]\n").expect_err("family");
        assert!(e.to_string().contains("node_ip_families"), "{e}");
        let e = parse("role_arn = \"ccm\"\n").expect_err("arn");
        assert!(e.to_string().contains("field role_arn"), "{e}");
    }
    /// What kOps writes (lower-case `[global]`), plus upstream's `ServiceOverride` example
    /// from `config.go`.
    const KOPS: &str = "[global]
Zone = us-east-1a
VPC = vpc-0abc
KubernetesClusterTag = k8s.example.com
SubnetID = subnet-0abc
RouteTableID = rtb-0abc
DisableSecurityGroupIngress = false
ElbSecurityGroup = sg-0abc
NodeIPFamilies = ipv4
NodeIPFamilies = ipv6
NLBSecurityGroupMode = Managed

[ServiceOverride \"1\"]
 Service = s3
 Region = region1
 URL = https://s3.foo.bar
 SigningRegion = signing_region
 SigningMethod = signing_method

[ServiceOverride \"2\"]
 Service = ec2
 Region = us-east-1
 URL = https://ec2.foo.bar
 SigningRegion = us-east-1
 SigningMethod = v4
";

    #[test]
    fn upstream_ini_parses() {
        let c = parse(KOPS).expect("kOps cloud-config");
        assert_eq!(c.zone.as_deref(), Some("us-east-1a"));
        assert_eq!(c.vpc.as_deref(), Some("vpc-0abc"));
        assert_eq!(c.kubernetes_cluster_tag.as_deref(), Some("k8s.example.com"));
        assert_eq!(c.route_table_id, vec!["rtb-0abc".to_string()]);
        assert!(!c.disable_security_group_ingress);
        assert_eq!(c.elb_security_group.as_deref(), Some("sg-0abc"));
        assert_eq!(c.node_ip_families, vec![IpFamily::Ipv4, IpFamily::Ipv6]);
        assert_eq!(
            c.nlb_security_group_mode,
            Some(NlbSecurityGroupMode::Managed)
        );
        assert_eq!(c.endpoint(Service::Ec2), Some("https://ec2.foo.bar"));
        let warned = c.not_honoured();
        assert!(warned.contains(&"Zone".to_string()), "{warned:?}");
        assert!(warned.contains(&"SubnetID".to_string()), "{warned:?}");
        assert!(
            warned.iter().any(|w| w.contains("Service s3")),
            "{warned:?}"
        );
        assert!(!warned.iter().any(|w| w.contains("VPC")), "{warned:?}");
        let flag = parse("[Global]\nDisableSecurityGroupIngress\n").expect("bare bool");
        assert!(flag.disable_security_group_ingress);
    }

    #[test]
    fn ini_errors_name_line_and_key() {
        let e = parse("[Global]\nZone = a\nRegoin = us-east-1\n").expect_err("typo");
        let text = e.to_string();
        assert!(text.contains("cloud.toml: field Regoin (line 3)"), "{text}");
        assert!(text.contains("unknown key in [Global]"), "{text}");
        let e = parse("[Global]\nURL = https://x\n").expect_err("wrong section");
        assert!(e.to_string().contains("URL (line 2)"), "{e}");
        assert!(
            e.to_string().contains("belongs in a [ServiceOverride"),
            "{e}"
        );
        let e = parse("[ServiceOverride \"1\"]\nService = ec2\nVPC = vpc-1\n").expect_err("vpc");
        assert!(
            e.to_string()
                .contains("VPC (line 3): VPC belongs in [Global]"),
            "{e}"
        );
        let e = parse("[Global]\nRegion = \"us-east-1\n").expect_err("malformed");
        assert!(e.to_string().contains("line 2"), "{e}");
        let e = parse("[Global]\n[Globl]\n").expect_err("section");
        assert!(e.to_string().contains("[Globl] (line 2)"), "{e}");
        let e = parse("[Global]\nNodeIPFamilies = ipv5\n").expect_err("family");
        assert!(e.to_string().contains("NodeIPFamilies (line 2)"), "{e}");
        let e =
            parse("[ServiceOverride \"1\"]\nService = ec2\nURL = https://x\nSigningRegion = r\n")
                .expect_err("region");
        assert!(e.to_string().contains("Region is required"), "{e}");
        let e = parse("[Global]\nKubernetesClusterTag = a\nKubernetesClusterID = b\n")
            .expect_err("ids differ");
        assert!(e.to_string().contains("KubernetesClusterTag"), "{e}");
    }
}
