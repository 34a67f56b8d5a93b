//! `--cloud-config` for `--cloud-provider=aws` (TOML).
//!
//! Upstream cloud-provider-aws reads an INI file with a `[Global]` section and
//! `[ServiceOverride "n"]` blocks; ccm-rs providers read TOML, so the same settings appear as
//! snake_case keys and `[[service_override]]` tables:
//!
//! ```toml
//! region = "us-east-1"                  # default: the SDK chain (AWS_REGION, profile, IMDS)
//! kubernetes_cluster_id = "prod"        # cluster tag value; default: --cluster-name
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

/// The parsed cloud-config. Every field is optional: with none, the SDK's default chain decides
/// region and credentials and `--cluster-name` is the cluster tag.
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
            Some(c) => c.parse_toml()?,
            None => AwsConfig::default(),
        };
        parsed.validate()?;
        Ok(parsed)
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
}
