//! Leader migration (KEP-2436): moving the cloud controllers from kube-controller-manager to
//! the CCM during a rolling control-plane upgrade without two managers ever running them.
//!
//! Both managers take part in a second election on a Lease named by the configuration
//! (`cloud-provider-extraction-migration` by default). A controller listed in the
//! configuration runs only in the manager that holds that lease *and* is named as the
//! controller's component (or `*`); controllers not listed run under each manager's own lease
//! as before. Upstream: `k8s.io/controller-manager/pkg/leadermigration`.

use std::path::Path;

use serde::Deserialize;

/// The configuration's API group; any of [`API_VERSIONS`] is accepted, as upstream's decoder does.
pub const API_GROUP: &str = "controllermanager.config.k8s.io";
/// Versions upstream still decodes (`v1` has no `resourceLock`: leases when absent).
pub const API_VERSIONS: &[&str] = &["v1", "v1beta1", "v1alpha1"];
/// The configuration's kind.
pub const KIND: &str = "LeaderMigrationConfiguration";
/// The component name this manager answers to in `controllerLeaders[].component`.
pub const COMPONENT: &str = "cloud-controller-manager";
/// The default migration lease name (upstream's `DefaultLeaderMigrationConfiguration`).
pub const DEFAULT_LEADER_NAME: &str = "cloud-provider-extraction-migration";

/// A validated LeaderMigrationConfiguration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderMigrationConfig {
    /// Name of the migration Lease (`leaderName`).
    pub leader_name: String,
    /// `resourceLock`; always `leases` once validated.
    pub resource_lock: String,
    /// `controllerLeaders`: which component runs which migrated controller.
    pub controller_leaders: Vec<ControllerLeader>,
}

/// One `controllerLeaders` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerLeader {
    /// Controller name, as in `--controllers` (canonical name or alias: `route`,
    /// `node-route-controller`, ...).
    #[serde(default)]
    pub name: String,
    /// The manager that runs it: `kube-controller-manager`, `cloud-controller-manager`, or
    /// `*` for whichever participant holds the migration lease.
    #[serde(default)]
    pub component: String,
}

/// The file as written; unknown fields are errors (a misspelt `controllerLeaders` would
/// otherwise silently run every cloud controller under the main lease, next to
/// kube-controller-manager's).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct File {
    api_version: Option<String>,
    kind: Option<String>,
    #[serde(default)]
    leader_name: String,
    resource_lock: Option<String>,
    #[serde(default)]
    controller_leaders: Vec<ControllerLeader>,
}

/// Where a controller runs under leader migration (upstream's `FilterResult`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Not part of the migration: runs under the main lease.
    Main,
    /// Migrated to this manager: runs only while it holds the migration lease.
    Migrated,
    /// Listed for another component (named here): this manager never runs it.
    Unowned(String),
}

impl LeaderMigrationConfig {
    /// Upstream's default, used when `--enable-leader-migration` is given without a file:
    /// route, service and cloud-node-lifecycle migrate to whichever manager holds the lease.
    pub fn default_config() -> Self {
        let any = |name: &str| ControllerLeader {
            name: name.into(),
            component: "*".into(),
        };
        LeaderMigrationConfig {
            leader_name: DEFAULT_LEADER_NAME.into(),
            resource_lock: "leases".into(),
            controller_leaders: vec![any("route"), any("service"), any("cloud-node-lifecycle")],
        }
    }

    /// Reads and validates the file at `path`; every problem is reported, each naming the
    /// field and how to fix it.
    pub fn load(path: &Path) -> Result<Self, Vec<String>> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| vec![format!("cannot read {}: {e}", path.display())])?;
        Self::parse(&text)
    }

    /// Parses and validates a LeaderMigrationConfiguration document.
    pub fn parse(text: &str) -> Result<Self, Vec<String>> {
        if text.trim().is_empty() {
            return Err(vec![format!(
                "the file is empty: write a {KIND} (apiVersion: {API_GROUP}/v1, leaderName, controllerLeaders)"
            )]);
        }
        let file: File = serde_yaml_ng::from_str(text).map_err(|e| {
            vec![format!(
                "not a {KIND}: {e} (fields: apiVersion, kind, leaderName, resourceLock, controllerLeaders[].name, controllerLeaders[].component)"
            )]
        })?;
        let mut errs = Vec::new();
        let version = check_type(&file, &mut errs);
        let resource_lock = match (version, file.resource_lock.as_deref()) {
            // v1 has no resourceLock: leases, always.
            (Some("v1"), None) => "leases".to_string(),
            (_, lock) => lock.unwrap_or_default().to_string(),
        };
        let cfg = LeaderMigrationConfig {
            leader_name: file.leader_name,
            resource_lock,
            controller_leaders: file.controller_leaders,
        };
        errs.extend(cfg.validate());
        if errs.is_empty() { Ok(cfg) } else { Err(errs) }
    }

    /// Upstream's `ValidateLeaderMigrationConfiguration`, with `endpoints` refused (ccm-rs
    /// elects only on Leases, as with `--leader-elect-resource-lock`) and a leader name that
    /// must be a valid Lease name.
    pub fn validate(&self) -> Vec<String> {
        let mut errs = Vec::new();
        if self.leader_name.is_empty() {
            errs.push(format!(
                "leaderName: Required value: name the migration Lease, e.g. leaderName: {DEFAULT_LEADER_NAME}"
            ));
        } else if !is_dns_subdomain(&self.leader_name) {
            errs.push(format!(
                "leaderName: Invalid value: {:?}: a Lease name must be lowercase letters, digits, '-' and '.' (e.g. {DEFAULT_LEADER_NAME})",
                self.leader_name
            ));
        }
        match self.resource_lock.as_str() {
            "leases" => {}
            "endpoints" => errs.push(
                "resourceLock: Unsupported value: \"endpoints\": ccm-rs elects only on Leases; use resourceLock: leases (in kube-controller-manager's file too)".into(),
            ),
            "" => errs.push("resourceLock: Required value: set resourceLock: leases".into()),
            other => errs.push(format!(
                "resourceLock: Unsupported value: {other:?}: supported value: \"leases\""
            )),
        }
        for (i, leader) in self.controller_leaders.iter().enumerate() {
            if leader.component.is_empty() {
                errs.push(format!(
                    "controllerLeaders[{i}].component: Required value: kube-controller-manager, cloud-controller-manager or \"*\""
                ));
            }
            if leader.name.is_empty() {
                errs.push(format!(
                    "controllerLeaders[{i}].name: Required value: a controller name such as route, service or cloud-node-lifecycle"
                ));
            }
        }
        errs
    }

    /// Where the controller `canonical` (with `alias`) runs for [`COMPONENT`]. An entry matches
    /// the canonical name or the alias: upstream's files use the aliases (`route`).
    pub fn placement(&self, canonical: &str, alias: &str) -> Placement {
        let entry = self
            .controller_leaders
            .iter()
            .rev()
            .find(|l| l.name == canonical || l.name == alias);
        match entry {
            None => Placement::Main,
            Some(l) if l.component == COMPONENT || l.component == "*" => Placement::Migrated,
            Some(l) => Placement::Unowned(l.component.clone()),
        }
    }
}

/// Checks apiVersion and kind; returns the version when the group is right.
fn check_type<'a>(file: &'a File, errs: &mut Vec<String>) -> Option<&'a str> {
    let versions = API_VERSIONS
        .iter()
        .map(|v| format!("{API_GROUP}/{v}"))
        .collect::<Vec<_>>()
        .join(", ");
    match file.kind.as_deref() {
        Some(KIND) => {}
        Some(k) => errs.push(format!("kind: Invalid value: {k:?}: must be {KIND}")),
        None => errs.push(format!("kind: Required value: kind: {KIND}")),
    }
    match file.api_version.as_deref() {
        None => {
            errs.push(format!(
                "apiVersion: Required value: apiVersion: {API_GROUP}/v1"
            ));
            None
        }
        Some(v) => match v.split_once('/') {
            Some((API_GROUP, ver)) if API_VERSIONS.contains(&ver) => Some(ver),
            _ => {
                errs.push(format!(
                    "apiVersion: Invalid value: {v:?}: one of {versions}"
                ));
                None
            }
        },
    }
}

/// RFC 1123 subdomain, as a Lease name must be.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errs(text: &str) -> Vec<String> {
        LeaderMigrationConfig::parse(text).expect_err("invalid")
    }

    #[test]
    fn every_version_upstream_decodes() {
        let v1 = LeaderMigrationConfig::parse(
            "apiVersion: controllermanager.config.k8s.io/v1\nkind: LeaderMigrationConfiguration\nleaderName: test\ncontrollerLeaders:\n- name: route\n  component: \"*\"\n",
        )
        .expect("v1");
        assert_eq!(v1.resource_lock, "leases");
        assert_eq!(v1.controller_leaders.len(), 1);
        for v in ["v1beta1", "v1alpha1"] {
            let c = LeaderMigrationConfig::parse(&format!(
                "apiVersion: controllermanager.config.k8s.io/{v}\nkind: LeaderMigrationConfiguration\nleaderName: test\nresourceLock: leases\ncontrollerLeaders: []\n"
            ))
            .expect(v);
            assert_eq!(c.leader_name, "test");
        }
    }

    #[test]
    fn each_field_error_names_the_field() {
        let e = errs(
            "apiVersion: controllermanager.config.k8s.io/v1\nkind: LeaderMigrationConfiguration\ncontrollerLeaders:\n- name: route\n- component: '*'\n",
        );
        assert!(
            e.iter().any(|m| m.starts_with("leaderName: Required")),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|m| m.starts_with("controllerLeaders[0].component")),
            "{e:?}"
        );
        assert!(
            e.iter().any(|m| m.starts_with("controllerLeaders[1].name")),
            "{e:?}"
        );
        let e = errs(
            "apiVersion: controllermanager.config.k8s.io/v1beta1\nkind: LeaderMigrationConfiguration\nleaderName: x\nresourceLock: endpoints\n",
        );
        assert!(
            e[0].starts_with("resourceLock: Unsupported value: \"endpoints\""),
            "{e:?}"
        );
        let e = errs("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n");
        assert!(
            e.iter().any(|m| m.starts_with("apiVersion: Invalid")),
            "{e:?}"
        );
        assert!(e.iter().any(|m| m.starts_with("kind: Invalid")), "{e:?}");
        // A misspelt list must not silently migrate nothing.
        let e = errs(
            "apiVersion: controllermanager.config.k8s.io/v1\nkind: LeaderMigrationConfiguration\nleaderName: x\ncontrollerLeader: []\n",
        );
        assert!(e[0].contains("unknown field `controllerLeader`"), "{e:?}");
        assert!(errs("")[0].contains("empty"));
        let e = errs(
            "apiVersion: controllermanager.config.k8s.io/v1\nkind: LeaderMigrationConfiguration\nleaderName: Bad_Name\n",
        );
        assert!(e[0].starts_with("leaderName: Invalid value"), "{e:?}");
    }

    #[test]
    fn placement_follows_component_and_wildcard() {
        let d = LeaderMigrationConfig::default_config();
        assert_eq!(
            d.placement("cloud-node-controller", "cloud-node"),
            Placement::Main
        );
        assert_eq!(
            d.placement("node-route-controller", "route"),
            Placement::Migrated
        );
        assert_eq!(
            d.placement("service-lb-controller", "service"),
            Placement::Migrated
        );
        assert_eq!(
            d.placement("cloud-node-lifecycle-controller", "cloud-node-lifecycle"),
            Placement::Migrated
        );
        let from = LeaderMigrationConfig::parse(
            "apiVersion: controllermanager.config.k8s.io/v1\nkind: LeaderMigrationConfiguration\nleaderName: m\ncontrollerLeaders:\n- {name: route, component: kube-controller-manager}\n- {name: service-lb-controller, component: cloud-controller-manager}\n- {name: nodeipam, component: '*'}\n",
        )
        .expect("valid");
        assert_eq!(
            from.placement("node-route-controller", "route"),
            Placement::Unowned("kube-controller-manager".into())
        );
        assert_eq!(
            from.placement("service-lb-controller", "service"),
            Placement::Migrated
        );
        assert_eq!(
            from.placement("cloud-node-controller", "cloud-node"),
            Placement::Main
        );
    }
}
