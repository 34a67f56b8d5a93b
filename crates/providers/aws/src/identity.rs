//! The cluster id, found as upstream finds it: `KubernetesClusterID` / `KubernetesClusterTag`
//! in the cloud-config, else the tags of the instance the CCM runs on (its id from IMDS with
//! v2 session tokens, its tags from EC2). ccm-rs adds one way: an explicitly given
//! `--cluster-name`. The flag's default (`kubernetes`) never becomes a cluster id: with none of
//! these the provider refuses to start and says how to set one.

use std::time::Duration;

use aws_config::imds::client::Client as Imds;
use aws_config::provider_config::ProviderConfig;
use aws_sdk_ec2::types::{Filter, Tag};
use ccm_cloud::{CloudError, CloudResult, ConfigError};

use crate::config::AwsConfig;

/// The legacy cluster tag key; its value is the cluster id (upstream
/// `TagNameKubernetesClusterLegacy`).
pub const LEGACY_CLUSTER_TAG: &str = "KubernetesCluster";
/// The cluster tag key prefix (upstream `TagNameKubernetesClusterPrefix`).
pub const CLUSTER_TAG_PREFIX: &str = "kubernetes.io/cluster/";

/// Which cluster the provider works for, and how its resources are tagged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterId {
    /// The id: the `<id>` of `kubernetes.io/cluster/<id>` (or the legacy tag's value).
    pub id: String,
    /// The cluster's resources carry the legacy `KubernetesCluster=<id>` tag (upstream
    /// `usesLegacyTags`, set by `KubernetesClusterTag` or a legacy-tagged instance).
    pub legacy: bool,
}

impl ClusterId {
    /// The `DescribeInstances` filter that keeps lookups inside the cluster (upstream
    /// `tagging.addFilters`).
    pub fn filter(&self) -> Filter {
        if self.legacy {
            Filter::builder()
                .name(format!("tag:{LEGACY_CLUSTER_TAG}"))
                .values(&self.id)
                .build()
        } else {
            Filter::builder()
                .name("tag-key")
                .values(format!("{CLUSTER_TAG_PREFIX}{}", self.id))
                .build()
        }
    }

    /// Whether `tags` mark a resource as this cluster's: `kubernetes.io/cluster/<id>` (owned
    /// or shared) or the legacy `KubernetesCluster=<id>` (upstream `hasClusterTag`).
    pub fn owns(&self, tags: &[Tag]) -> bool {
        let new_key = format!("{CLUSTER_TAG_PREFIX}{}", self.id);
        tags.iter().any(|t| match t.key() {
            Some(k) if k == new_key => true,
            Some(LEGACY_CLUSTER_TAG) => t.value() == Some(self.id.as_str()),
            _ => false,
        })
    }

    /// Whether a route table the `tag-key` filter (the cluster key, or `KubernetesCluster`)
    /// returned is this cluster's: all are, except those whose legacy tag names another
    /// cluster and that lack this cluster's key.
    pub fn owns_table(&self, tags: &[Tag]) -> bool {
        let legacy = tags.iter().any(|t| t.key() == Some(LEGACY_CLUSTER_TAG));
        !legacy || self.owns(tags)
    }
}

/// The cluster id the cloud-config sets, if any. Both keys set and different is an error, as
/// upstream (`clusterID tags did not match`).
pub fn from_config(cfg: &AwsConfig) -> Result<Option<ClusterId>, ConfigError> {
    let tag = cfg
        .kubernetes_cluster_tag
        .as_deref()
        .filter(|s| !s.is_empty());
    let id = cfg
        .kubernetes_cluster_id
        .as_deref()
        .filter(|s| !s.is_empty());
    match (tag, id) {
        (Some(t), Some(i)) if t != i => Err(ConfigError::field(
            "KubernetesClusterTag",
            format!(
                "{t:?} differs from KubernetesClusterID {i:?}; set one of them, or both to the same id"
            ),
        )),
        (Some(t), _) => Ok(Some(ClusterId {
            id: t.to_string(),
            legacy: true,
        })),
        (None, Some(i)) => Ok(Some(ClusterId {
            id: i.to_string(),
            legacy: false,
        })),
        (None, None) => Ok(None),
    }
}

/// The cluster id an instance's tags carry (upstream `findClusterIDs` + `initFromTags`):
/// the legacy tag wins; two different `kubernetes.io/cluster/` ids are an error.
pub fn from_tags(instance: &str, tags: &[Tag]) -> CloudResult<Option<ClusterId>> {
    let mut new_ids: Vec<&str> = tags
        .iter()
        .filter_map(|t| t.key()?.strip_prefix(CLUSTER_TAG_PREFIX))
        .filter(|id| !id.is_empty())
        .collect();
    new_ids.sort_unstable();
    new_ids.dedup();
    if new_ids.len() > 1 {
        return Err(CloudError::Permanent(format!(
            "instance {instance} carries several cluster tags ({}): set KubernetesClusterID in [Global] of --cloud-config",
            new_ids.join(", ")
        )));
    }
    let legacy = tags
        .iter()
        .find(|t| t.key() == Some(LEGACY_CLUSTER_TAG))
        .and_then(|t| t.value())
        .filter(|v| !v.is_empty());
    match (legacy, new_ids.first()) {
        (Some(l), Some(n)) if l != *n => Err(CloudError::Permanent(format!(
            "instance {instance}: tag {LEGACY_CLUSTER_TAG}={l} and tag {CLUSTER_TAG_PREFIX}{n} name different clusters"
        ))),
        (Some(l), _) => Ok(Some(ClusterId {
            id: l.to_string(),
            legacy: true,
        })),
        (None, Some(n)) => Ok(Some(ClusterId {
            id: n.to_string(),
            legacy: false,
        })),
        (None, None) => Ok(None),
    }
}

/// The value of `--cluster-name` when the command line gives it (`--cluster-name=x` or
/// `--cluster-name x`); `None` when the flag's default would apply.
pub fn explicit_cluster_name<I: IntoIterator<Item = String>>(args: I) -> Option<String> {
    let mut it = args.into_iter();
    let mut found = None;
    while let Some(a) = it.next() {
        if a == "--" {
            break;
        }
        if let Some(v) = a.strip_prefix("--cluster-name=") {
            found = Some(v.to_string());
        } else if a == "--cluster-name" {
            found = it.next();
        }
    }
    found.filter(|v| !v.is_empty())
}

/// The error when no way gave a cluster id: names every way to set one.
pub fn missing(why: &str) -> CloudError {
    CloudError::Permanent(format!(
        "no cluster id: {why}. Set KubernetesClusterID in [Global] of --cloud-config (or kubernetes_cluster_id in a TOML cloud-config), or run the CCM on an instance tagged kubernetes.io/cluster/<id> (read through IMDS), or pass --cluster-name=<id> explicitly"
    ))
}

/// The id of the instance the CCM runs on, from IMDS (v2: a session token first, then the
/// metadata with it). `endpoint`: the IMDS base URL, default the SDK's (169.254.169.254, or
/// `AWS_EC2_METADATA_SERVICE_ENDPOINT`).
pub async fn self_instance_id(
    endpoint: Option<&str>,
    http: aws_sdk_ec2::config::SharedHttpClient,
) -> Result<String, String> {
    let mut b = Imds::builder()
        .configure(&ProviderConfig::without_region().with_http_client(http))
        .max_attempts(2)
        .connect_timeout(Duration::from_secs(1))
        .read_timeout(Duration::from_secs(2));
    if let Some(e) = endpoint {
        b = b.endpoint(e).map_err(|e| format!("IMDS endpoint {e}"))?;
    }
    let id: String = b
        .build()
        .get("/latest/meta-data/instance-id")
        .await
        .map_err(|e| format!("IMDS: {}", chain(&e)))?
        .into();
    let id = id.trim().to_string();
    if id.starts_with("i-") {
        Ok(id)
    } else {
        Err(format!("IMDS answered {id:?} for the instance id"))
    }
}

/// An error and its sources, Display only: IMDS errors' Debug form carries the raw response,
/// session token included, which must not reach a log.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        out.push_str(": ");
        out.push_str(&s.to_string());
        src = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(k: &str, v: &str) -> Tag {
        Tag::builder().key(k).value(v).build()
    }

    #[test]
    fn config_ids() {
        let mut c = AwsConfig::default();
        assert_eq!(from_config(&c).ok(), Some(None));
        c.kubernetes_cluster_id = Some("prod".into());
        assert_eq!(
            from_config(&c).ok().flatten().map(|c| c.legacy),
            Some(false)
        );
        c.kubernetes_cluster_tag = Some("prod".into());
        assert_eq!(from_config(&c).ok().flatten().map(|c| c.legacy), Some(true));
        c.kubernetes_cluster_tag = Some("other".into());
        let e = from_config(&c).expect_err("mismatch");
        assert!(e.to_string().contains("KubernetesClusterTag"), "{e}");
    }

    #[test]
    fn tag_ids() {
        let legacy = from_tags("i-1", &[tag("KubernetesCluster", "k1"), tag("Name", "x")]);
        assert_eq!(
            legacy.ok().flatten(),
            Some(ClusterId {
                id: "k1".into(),
                legacy: true
            })
        );
        let new = from_tags("i-1", &[tag("kubernetes.io/cluster/k2", "owned")]);
        assert_eq!(new.ok().flatten().map(|c| c.id), Some("k2".into()));
        assert_eq!(from_tags("i-1", &[tag("Name", "x")]).ok(), Some(None));
        let two = from_tags(
            "i-1",
            &[
                tag("kubernetes.io/cluster/a", "owned"),
                tag("kubernetes.io/cluster/b", "shared"),
            ],
        );
        assert!(two.expect_err("two").to_string().contains("a, b"));
    }

    #[test]
    fn ownership_either_tag() {
        let c = ClusterId {
            id: "k".into(),
            legacy: false,
        };
        assert!(c.owns(&[tag("kubernetes.io/cluster/k", "shared")]));
        assert!(c.owns(&[tag("KubernetesCluster", "k")]));
        assert!(!c.owns(&[tag("KubernetesCluster", "other")]));
        assert!(!c.owns(&[tag("kubernetes.io/cluster/other", "owned")]));
    }

    #[test]
    fn explicit_flag_only() {
        let args = |a: &[&str]| explicit_cluster_name(a.iter().map(|s| s.to_string()));
        assert_eq!(args(&["ccm", "--cloud-provider=aws"]), None);
        assert_eq!(args(&["ccm", "--cluster-name=prod"]), Some("prod".into()));
        assert_eq!(
            args(&["ccm", "--cluster-name", "prod"]),
            Some("prod".into())
        );
        assert_eq!(args(&["ccm", "--cluster-name="]), None);
    }
}
