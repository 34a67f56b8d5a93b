//! What `ccm doctor` reads: one snapshot of the cluster, taken with GET and LIST only, so every
//! check is a pure function of it and runs without an API server in unit tests.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::metrics::MetricsProbe;

/// A list that may have failed (403, timeout): checks that need it say so instead of guessing.
pub type Listed<T> = Result<Vec<T>, String>;

/// Defaults of upstream's `--leader-elect-resource-*` flags.
pub const DEFAULT_LEASE_NAMESPACE: &str = "kube-system";
/// The Lease upstream's cloud-controller-manager holds.
pub const DEFAULT_LEASE_NAME: &str = "cloud-controller-manager";
/// Upstream's `--secure-port` default.
pub const DEFAULT_SECURE_PORT: u16 = 10258;

/// Knobs of the checks (from `ccm doctor` flags).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Namespace of the CCM's pods.
    pub namespace: String,
    /// How long a Node may carry the uninitialized taint, or a LoadBalancer Service wait for
    /// its address, before it is a failure rather than a warning.
    pub grace: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            namespace: "kube-system".into(),
            grace: Duration::from_secs(120),
        }
    }
}

/// The cluster as doctor saw it.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// When it was taken (ages are measured against this).
    pub now: jiff::Timestamp,
    /// Every Node (a failure to list them ends doctor before any check).
    pub nodes: Vec<Node>,
    /// Pods of the CCM's namespace (and of kube-system, where kube-controller-manager lives).
    pub system_pods: Listed<Pod>,
    /// Every Service.
    pub services: Listed<Service>,
    /// core/v1 Events of every namespace (what `kubectl describe` shows).
    pub events: Listed<Event>,
    /// Every EndpointSlice (for `externalTrafficPolicy: Local` Services).
    pub endpoint_slices: Listed<EndpointSlice>,
    /// The workloads of the CCM's namespace: what runs the CCM's pods, and what should.
    pub workloads: Workloads,
    /// The leader-election Lease looked up, and what came back.
    pub lease: LeaseLookup,
    /// The CCM's metrics, if doctor reached them.
    pub metrics: MetricsProbe,
    /// Check knobs.
    pub settings: Settings,
}

/// Deployments, DaemonSets and ReplicaSets of the CCM's namespace.
#[derive(Debug, Clone)]
pub struct Workloads {
    /// apps/v1 Deployments.
    pub deployments: Listed<Deployment>,
    /// apps/v1 DaemonSets.
    pub daemonsets: Listed<DaemonSet>,
    /// apps/v1 ReplicaSets (a Deployment's rollout).
    pub replicasets: Listed<ReplicaSet>,
}

impl Default for Workloads {
    fn default() -> Self {
        Workloads {
            deployments: Ok(Vec::new()),
            daemonsets: Ok(Vec::new()),
            replicasets: Ok(Vec::new()),
        }
    }
}

/// The Lease doctor looked for (named by the CCM's flags when a CCM pod is found).
#[derive(Debug, Clone)]
pub struct LeaseLookup {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `Ok(None)`: the Lease does not exist.
    pub result: Result<Option<Lease>, String>,
}

/// A CCM pod's flags, parsed from its container's command and args.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flags(pub BTreeMap<String, String>);

/// Boolean flags: `--flag value` never takes the next token for these (pflag semantics).
const BOOL_FLAGS: &[&str] = &[
    "leader-elect",
    "configure-cloud-routes",
    "allocate-node-cidrs",
    "profiling",
    "use-service-account-credentials",
    "allow-untagged-cloud",
];

impl Flags {
    /// Parses `--name=value`, `--name value` and bare boolean `--name` tokens.
    pub fn parse<'a>(tokens: impl IntoIterator<Item = &'a str>) -> Self {
        let tokens: Vec<&str> = tokens.into_iter().collect();
        let mut out = BTreeMap::new();
        let mut i = 0;
        while i < tokens.len() {
            let Some(flag) = tokens[i].strip_prefix("--").or(tokens[i].strip_prefix('-')) else {
                i += 1;
                continue;
            };
            if let Some((k, v)) = flag.split_once('=') {
                out.insert(k.to_string(), v.to_string());
            } else if !BOOL_FLAGS.contains(&flag)
                && tokens.get(i + 1).is_some_and(|n| !n.starts_with('-'))
            {
                out.insert(flag.to_string(), tokens[i + 1].to_string());
                i += 1;
            } else {
                out.insert(flag.to_string(), "true".to_string());
            }
            i += 1;
        }
        Flags(out)
    }

    /// The value of `--name`, if given.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// A boolean flag with its default.
    pub fn bool(&self, name: &str, default: bool) -> bool {
        match self.get(name) {
            Some(v) => !matches!(v.to_ascii_lowercase().as_str(), "false" | "0" | "f"),
            None => default,
        }
    }

    /// Whether `--feature-gates` turns `gate` on (`None` when not mentioned).
    pub fn feature_gate(&self, gate: &str) -> Option<bool> {
        self.get("feature-gates")?.split(',').find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k.trim() == gate).then(|| v.trim().eq_ignore_ascii_case("true"))
        })
    }
}

/// The command line of a pod's main container: the one that mentions the component, else the
/// first.
pub fn command_line<'a>(pod: &'a Pod, component: &str) -> Vec<&'a str> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    let line = |c: &'a k8s_openapi::api::core::v1::Container| -> Vec<&'a str> {
        c.command
            .iter()
            .flatten()
            .chain(c.args.iter().flatten())
            .map(String::as_str)
            .collect()
    };
    spec.containers
        .iter()
        .map(line)
        .find(|l| l.iter().any(|t| t.contains(component)))
        .or_else(|| spec.containers.first().map(line))
        .unwrap_or_default()
}

fn mentions(pod: &Pod, needle: &str) -> bool {
    mentioned(&pod.metadata, pod.spec.as_ref(), needle)
}

fn mentioned(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    spec: Option<&k8s_openapi::api::core::v1::PodSpec>,
    needle: &str,
) -> bool {
    meta.name.as_deref().is_some_and(|n| n.contains(needle))
        || meta
            .labels
            .iter()
            .flatten()
            .any(|(_, v)| v.contains(needle))
        || spec.iter().flat_map(|s| &s.containers).any(|c| {
            c.name.contains(needle)
                || c.command
                    .iter()
                    .flatten()
                    .chain(c.args.iter().flatten())
                    .any(|t| t.contains(needle))
        })
}

/// Whether a pod is kube-controller-manager (static pod `kube-controller-manager-<node>`,
/// label `component=kube-controller-manager` as kubeadm sets).
pub fn is_kcm_pod(pod: &Pod) -> bool {
    mentions(pod, "kube-controller-manager")
}

/// Whether a pod is a cloud-controller-manager: its name, a label or its command line says
/// `cloud-controller-manager`, or its command runs the `ccm` binary.
pub fn is_ccm_pod(pod: &Pod) -> bool {
    is_ccm(&pod.metadata, pod.spec.as_ref())
}

/// [`is_ccm_pod`] for any object with a pod spec (a workload's template).
pub fn is_ccm(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    spec: Option<&k8s_openapi::api::core::v1::PodSpec>,
) -> bool {
    if mentioned(meta, spec, "kube-controller-manager") {
        return false;
    }
    mentioned(meta, spec, "cloud-controller-manager")
        || spec.iter().flat_map(|s| &s.containers).any(|c| {
            c.command
                .iter()
                .flatten()
                .next()
                .is_some_and(|cmd| cmd == "ccm" || cmd.ends_with("/ccm"))
        })
}

impl Snapshot {
    /// The CCM's pods with their flags.
    pub fn ccm_pods(&self) -> Vec<(&Pod, Flags)> {
        let Ok(pods) = &self.system_pods else {
            return Vec::new();
        };
        pods.iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(self.settings.namespace.as_str()))
            .filter(|p| is_ccm_pod(p))
            .map(|p| (p, Flags::parse(command_line(p, "cloud-controller-manager"))))
            .collect()
    }

    /// kube-controller-manager pods with their flags.
    pub fn kcm_pods(&self) -> Vec<(&Pod, Flags)> {
        let Ok(pods) = &self.system_pods else {
            return Vec::new();
        };
        pods.iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some("kube-system"))
            .filter(|p| is_kcm_pod(p))
            .map(|p| (p, Flags::parse(command_line(p, "kube-controller-manager"))))
            .collect()
    }

    /// Age of something created at `t`.
    pub fn age(
        &self,
        t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    ) -> Duration {
        self.since(t.map(|t| t.0))
    }

    /// Time from `t` to the snapshot (zero for the future or unknown).
    pub fn since(&self, t: Option<jiff::Timestamp>) -> Duration {
        t.and_then(|t| self.now.duration_since(t).try_into().ok())
            .unwrap_or_default()
    }
}

/// Which Lease the CCM holds: from the first CCM pod's flags, else upstream's defaults.
pub fn lease_of(flags: Option<&Flags>) -> (String, String) {
    let ns = flags
        .and_then(|f| f.get("leader-elect-resource-namespace"))
        .unwrap_or(DEFAULT_LEASE_NAMESPACE);
    let name = flags
        .and_then(|f| f.get("leader-elect-resource-name"))
        .unwrap_or(DEFAULT_LEASE_NAME);
    (ns.to_string(), name.to_string())
}

/// "3m12s"-style durations for evidence lines.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86400, (s % 86400) / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_like_pflag() {
        let f = Flags::parse([
            "/bin/ccm",
            "--cloud-provider=aws",
            "--leader-elect",
            "--secure-port",
            "10300",
            "--feature-gates=A=true,CloudControllerManagerWatchBasedRoutesReconciliation=false",
            "-v=2",
        ]);
        assert_eq!(f.get("cloud-provider"), Some("aws"));
        assert!(f.bool("leader-elect", false));
        assert_eq!(f.get("secure-port"), Some("10300"));
        assert_eq!(f.get("v"), Some("2"));
        assert_eq!(
            f.feature_gate("CloudControllerManagerWatchBasedRoutesReconciliation"),
            Some(false)
        );
        assert_eq!(f.feature_gate("Other"), None);
        assert!(!Flags::parse(["--leader-elect=false"]).bool("leader-elect", true));
    }

    #[test]
    fn human_durations() {
        assert_eq!(human(Duration::from_secs(5)), "5s");
        assert_eq!(human(Duration::from_secs(192)), "3m12s");
        assert_eq!(human(Duration::from_secs(7300)), "2h01m");
    }
}
