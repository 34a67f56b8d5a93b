//! `aws:///<availability-zone>/<instance-id>` provider IDs.

use ccm_cloud::{CloudError, CloudResult};

/// The provider ID upstream writes for an instance.
pub fn provider_id(zone: &str, instance_id: &str) -> String {
    format!("aws:///{zone}/{instance_id}")
}

/// The instance id in a provider ID. Accepts every form upstream accepts (`aws:///zone/i-…`,
/// `aws:////i-…`, a bare `i-…`) and refuses anything else with the expected form.
pub fn parse_provider_id(pid: &str) -> CloudResult<&str> {
    let id = match pid.strip_prefix("aws://") {
        Some(rest) => rest.rsplit('/').next().unwrap_or(""),
        None if !pid.contains('/') => pid,
        None => "",
    };
    let valid = id
        .strip_prefix("i-")
        .is_some_and(|hex| !hex.is_empty() && hex.chars().all(|c| c.is_ascii_alphanumeric()));
    if valid {
        Ok(id)
    } else {
        Err(CloudError::Permanent(format!(
            "providerID {pid:?} is not an EC2 instance (expected aws:///<zone>/i-<id>)"
        )))
    }
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
}
