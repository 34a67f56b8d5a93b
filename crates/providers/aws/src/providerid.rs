//! `aws:///<availability-zone>/<instance-id>` provider IDs, and the Nodes that are not EC2
//! instances (EKS Fargate pods, hybrid nodes).

use ccm_cloud::{CloudError, CloudResult};

/// What a Node's providerID names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind<'a> {
    /// An EC2 instance, by id.
    Ec2(&'a str),
    /// An EKS Fargate Node (`aws:///<zone>/fargate-<ip>…`): no instance behind it.
    Fargate,
    /// A hybrid Node (`eks-hybrid://…`, or an SSM managed instance `mi-…`): not in EC2.
    Hybrid,
}

/// The provider ID upstream writes for an instance.
pub fn provider_id(zone: &str, instance_id: &str) -> String {
    format!("aws:///{zone}/{instance_id}")
}

/// What `pid` names. Fargate and hybrid Nodes are recognised so that callers skip them instead
/// of failing the whole batch; anything else unknown is an error with the expected form.
pub fn classify(pid: &str) -> CloudResult<NodeKind<'_>> {
    if pid.starts_with("eks-hybrid://") {
        return Ok(NodeKind::Hybrid);
    }
    let last = match pid.strip_prefix("aws://") {
        Some(rest) => rest.rsplit('/').next().unwrap_or(""),
        None if !pid.contains('/') => pid,
        None => "",
    };
    if last.starts_with("fargate-") && last.len() > "fargate-".len() {
        return Ok(NodeKind::Fargate);
    }
    if last.starts_with("mi-") && last.len() > 3 {
        return Ok(NodeKind::Hybrid);
    }
    let valid = last
        .strip_prefix("i-")
        .is_some_and(|hex| !hex.is_empty() && hex.chars().all(|c| c.is_ascii_alphanumeric()));
    if valid {
        Ok(NodeKind::Ec2(last))
    } else {
        Err(CloudError::Permanent(format!(
            "providerID {pid:?} is not an EC2 instance (expected aws:///<zone>/i-<id>)"
        )))
    }
}

/// The instance id in a provider ID. Accepts every form upstream accepts (`aws:///zone/i-…`,
/// `aws:////i-…`, a bare `i-…`) and refuses anything else with the expected form — including
/// Fargate and hybrid Nodes; code that walks all Nodes uses [`ec2_instance_id`] instead.
pub fn parse_provider_id(pid: &str) -> CloudResult<&str> {
    match classify(pid)? {
        NodeKind::Ec2(id) => Ok(id),
        NodeKind::Fargate | NodeKind::Hybrid => Err(CloudError::Permanent(format!(
            "providerID {pid:?} is a Fargate or hybrid Node, not an EC2 instance"
        ))),
    }
}

/// The instance id of a Node's providerID, `None` (with a debug log line) for a Fargate or
/// hybrid Node, which route and load-balancer code skip rather than fail on.
pub fn ec2_instance_id(pid: &str) -> CloudResult<Option<&str>> {
    match classify(pid)? {
        NodeKind::Ec2(id) => Ok(Some(id)),
        kind => {
            tracing::debug!(provider_id = pid, ?kind, "not an EC2 instance; skipped");
            Ok(None)
        }
    }
}

/// Whether a Node name is an instance id (resource-based hostnames, kOps): such Nodes are
/// looked up by id, not by private DNS name.
pub fn instance_id_name(name: &str) -> Option<&str> {
    let hex = name.strip_prefix("i-")?;
    let ok = (hex.len() == 8 || hex.len() == 17) && hex.chars().all(|c| c.is_ascii_hexdigit());
    ok.then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_forms_parse() {
        assert_eq!(
            parse_provider_id("aws:///us-east-1a/i-0abc").ok(),
            Some("i-0abc")
        );
        assert_eq!(parse_provider_id("aws:////i-0abc").ok(), Some("i-0abc"));
        assert_eq!(parse_provider_id("i-0abc").ok(), Some("i-0abc"));
        assert_eq!(provider_id("us-east-1a", "i-1"), "aws:///us-east-1a/i-1");
        for bad in [
            "gce://p/z/i-1",
            "aws:///us-east-1a/",
            "aws:///z/vol-1",
            "i-",
            "a/i-1",
        ] {
            let e = parse_provider_id(bad).expect_err(bad);
            assert!(e.to_string().contains("expected aws:///"), "{e}");
        }
    }

    #[test]
    fn fargate_and_hybrid_are_recognised() {
        let fargate = "aws:///us-east-1a/fargate-ip-10-0-1-7.ec2.internal";
        assert_eq!(classify(fargate).ok(), Some(NodeKind::Fargate));
        assert_eq!(ec2_instance_id(fargate).ok(), Some(None));
        assert!(parse_provider_id(fargate).is_err());
        for hybrid in [
            "eks-hybrid:///us-west-2/prod/node-7",
            "aws:///us-west-2/mi-0123456789abcdef0",
        ] {
            assert_eq!(classify(hybrid).ok(), Some(NodeKind::Hybrid), "{hybrid}");
        }
        assert_eq!(
            ec2_instance_id("aws:///z/i-0abc").ok(),
            Some(Some("i-0abc"))
        );
        assert!(ec2_instance_id("gce://p/z/x").is_err());
    }

    #[test]
    fn instance_id_names() {
        assert_eq!(
            instance_id_name("i-0123456789abcdef0"),
            Some("i-0123456789abcdef0")
        );
        assert_eq!(instance_id_name("i-0123abcd"), Some("i-0123abcd"));
        for not in ["ip-10-0-0-1.ec2.internal", "i-xyz", "i-", "node-1"] {
            assert_eq!(instance_id_name(not), None, "{not}");
        }
    }
}
