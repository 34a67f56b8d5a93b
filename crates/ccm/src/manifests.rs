//! `ccm manifests`: the objects that deploy ccm-rs, as the Helm chart renders them.
//!
//! One source of truth: the chart's `values.yaml` supplies the defaults and its
//! `files/ccm.json` the fixed parts (RBAC rules exactly as the controllers use them,
//! tolerations, probes, security contexts), both compiled in here and read by the chart's
//! templates. A test renders the chart with a real Helm engine and compares object by object.

use std::path::PathBuf;

use anyhow::Context as _;
use serde_json::{Map, Value, json};

/// The chart's defaults (`deploy/helm/ccm-rs/values.yaml`).
pub const VALUES_YAML: &str = include_str!("../../../deploy/helm/ccm-rs/values.yaml");
/// The chart's fixed parts (`deploy/helm/ccm-rs/files/ccm.json`).
pub const CCM_JSON: &str = include_str!("../../../deploy/helm/ccm-rs/files/ccm.json");

/// Flags of `ccm manifests`.
#[derive(Debug, Clone, clap::Args)]
pub struct ManifestOptions {
    /// A values file in the chart's format (as `helm template -f`); flags override it.
    #[arg(long, short = 'f')]
    pub values: Option<PathBuf>,
    /// `--cloud-provider` of the rendered CCM.
    #[arg(long)]
    pub provider: Option<String>,
    /// deployment, daemonset or static-pod.
    #[arg(long, value_parser = ["deployment", "daemonset", "static-pod"])]
    pub variant: Option<String>,
    /// Container image as REPOSITORY:TAG.
    #[arg(long)]
    pub image: Option<String>,
    /// Deployment replicas.
    #[arg(long)]
    pub replicas: Option<u32>,
    /// Secret in kube-system holding the cloud config under key `cloud-config`.
    #[arg(long)]
    pub cloud_config_secret: Option<String>,
    /// `--cluster-cidr` for the route controller (empty: routes off).
    #[arg(long)]
    pub cluster_cidr: Option<String>,
    /// A flag to append to the CCM's arguments (repeatable).
    #[arg(long = "extra-arg", allow_hyphen_values = true)]
    pub extra_args: Vec<String>,
}

fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) if slot.is_object() && v.is_object() => merge(slot, v),
                    _ => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

impl ManifestOptions {
    /// The chart's values after the values file and the flags, as Helm would coalesce them.
    pub fn values(&self) -> anyhow::Result<Value> {
        let mut v: Value =
            serde_yaml_ng::from_str(VALUES_YAML).context("the chart's values.yaml")?;
        if let Some(path) = &self.values {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--values {}: cannot read", path.display()))?;
            let over: Value = serde_yaml_ng::from_str(&text)
                .with_context(|| format!("--values {}: not YAML", path.display()))?;
            if !over.is_null() {
                anyhow::ensure!(
                    over.is_object(),
                    "--values {}: must be a mapping",
                    path.display()
                );
                merge(&mut v, over);
            }
        }
        let mut set = |k: &str, x: Value| v[k] = x;
        if let Some(p) = &self.provider {
            set("provider", json!(p));
        }
        if let Some(x) = &self.variant {
            set("variant", json!(x));
        }
        if let Some(r) = self.replicas {
            set("replicas", json!(r));
        }
        if let Some(s) = &self.cloud_config_secret {
            set("cloudConfigSecret", json!(s));
        }
        if let Some(c) = &self.cluster_cidr {
            set("clusterCIDR", json!(c));
        }
        if let Some(img) = &self.image {
            let (repo, tag) = img
                .rsplit_once(':')
                .filter(|(_, t)| !t.contains('/'))
                .with_context(|| {
                    format!("--image {img:?}: want REPOSITORY:TAG (e.g. ghcr.io/ccm-rs/ccm:0.1.0)")
                })?;
            v["image"]["repository"] = json!(repo);
            v["image"]["tag"] = json!(tag);
        }
        if !self.extra_args.is_empty() {
            let mut args = v["extraArgs"].as_array().cloned().unwrap_or_default();
            args.extend(self.extra_args.iter().map(|a| json!(a)));
            v["extraArgs"] = Value::Array(args);
        }
        check(&v)?;
        Ok(v)
    }
}

fn check(v: &Value) -> anyhow::Result<()> {
    let variant = v["variant"].as_str().unwrap_or_default();
    anyhow::ensure!(
        matches!(variant, "deployment" | "daemonset" | "static-pod"),
        "variant {variant:?}: want deployment, daemonset or static-pod"
    );
    anyhow::ensure!(
        v["provider"].as_str().is_some_and(|p| !p.is_empty()),
        "provider: required (the --cloud-provider the image was built with, e.g. sim, aws, metal)"
    );
    anyhow::ensure!(
        v["replicas"].as_u64().is_some_and(|r| r >= 1),
        "replicas: want a whole number of at least 1"
    );
    anyhow::ensure!(
        v["extraArgs"]
            .as_array()
            .is_some_and(|a| a.iter().all(Value::is_string)),
        "extraArgs: want a list of strings such as --concurrent-service-syncs=10"
    );
    Ok(())
}

/// Prints the manifests as one multi-document YAML stream.
pub fn run(opts: &ManifestOptions) -> anyhow::Result<()> {
    let objects = render(&opts.values()?)?;
    print!("{}", to_yaml(&objects)?);
    Ok(())
}

/// Multi-document YAML, `---` before each object.
pub fn to_yaml(objects: &[Value]) -> anyhow::Result<String> {
    let mut out = String::new();
    for o in objects {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(o)?);
    }
    Ok(out)
}

/// The fixed parts.
fn fixed() -> anyhow::Result<Value> {
    serde_json::from_str(CCM_JSON).context("the chart's files/ccm.json")
}

fn meta(f: &Value, name: &str, namespaced: bool) -> Value {
    let mut m = json!({"name": name, "labels": f["labels"]});
    if namespaced {
        m["namespace"] = f["namespace"].clone();
    }
    m
}

fn obj(api_version: &str, kind: &str, metadata: Value, rest: Value) -> Value {
    let mut o = Map::new();
    o.insert("apiVersion".into(), json!(api_version));
    o.insert("kind".into(), json!(kind));
    o.insert("metadata".into(), metadata);
    if let Value::Object(r) = rest {
        o.extend(r);
    }
    Value::Object(o)
}

fn role_ref(kind: &str, name: &str) -> Value {
    json!({"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name})
}

/// The subject the manager's own grants go to: its ServiceAccount, or for a static pod the
/// user of the host kubeconfig.
fn manager_subject(v: &Value, f: &Value) -> Value {
    if v["variant"] == "static-pod" {
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": v["staticPodUser"]})
    } else {
        json!({"kind": "ServiceAccount", "name": f["name"], "namespace": f["namespace"]})
    }
}

/// Every object, in apply order (identities and RBAC before the workload).
pub fn render(v: &Value) -> anyhow::Result<Vec<Value>> {
    check(v)?;
    let f = fixed()?;
    let use_sa = v["useServiceAccountCredentials"].as_bool().unwrap_or(true);
    let name = f["name"].as_str().unwrap_or_default();
    let mut out = Vec::new();
    let sa = |n: &str| obj("v1", "ServiceAccount", meta(&f, n, true), json!({}));
    if v["variant"] != "static-pod" {
        out.push(sa(name));
    }
    if use_sa {
        for c in f["controllers"].as_array().into_iter().flatten() {
            out.push(sa(c["serviceAccount"].as_str().unwrap_or_default()));
        }
    }
    out.extend(manager_rbac(v, &f, use_sa));
    for c in f["controllers"].as_array().into_iter().flatten() {
        let role = c["clusterRole"].as_str().unwrap_or_default();
        let subject = if use_sa {
            json!({"kind": "ServiceAccount", "name": c["serviceAccount"], "namespace": f["namespace"]})
        } else {
            manager_subject(v, &f)
        };
        out.push(obj(
            "rbac.authorization.k8s.io/v1",
            "ClusterRole",
            meta(&f, role, false),
            json!({"rules": c["rules"]}),
        ));
        out.push(obj(
            "rbac.authorization.k8s.io/v1",
            "ClusterRoleBinding",
            meta(&f, role, false),
            json!({"roleRef": role_ref("ClusterRole", role), "subjects": [subject]}),
        ));
    }
    out.extend(workload(v, &f));
    Ok(out)
}

fn manager_rbac(v: &Value, f: &Value, use_sa: bool) -> Vec<Value> {
    let m = &f["manager"];
    let cluster_role = m["clusterRole"].as_str().unwrap_or_default();
    let role = m["role"].as_str().unwrap_or_default();
    let mut rules = m["rules"].as_array().cloned().unwrap_or_default();
    if use_sa {
        rules.push(m["tokenRule"].clone());
    }
    let subject = manager_subject(v, f);
    vec![
        obj(
            "rbac.authorization.k8s.io/v1",
            "ClusterRole",
            meta(f, cluster_role, false),
            json!({"rules": m["clusterRules"]}),
        ),
        obj(
            "rbac.authorization.k8s.io/v1",
            "ClusterRoleBinding",
            meta(f, cluster_role, false),
            json!({"roleRef": role_ref("ClusterRole", cluster_role), "subjects": [subject]}),
        ),
        obj(
            "rbac.authorization.k8s.io/v1",
            "Role",
            meta(f, role, true),
            json!({"rules": rules}),
        ),
        obj(
            "rbac.authorization.k8s.io/v1",
            "RoleBinding",
            meta(f, role, true),
            json!({"roleRef": role_ref("Role", role), "subjects": [subject]}),
        ),
        // Delegated authentication reads the client CA and request-header configuration
        // (the bootstrap Role every kube-apiserver creates), as upstream's manifests bind it.
        obj(
            "rbac.authorization.k8s.io/v1",
            "RoleBinding",
            meta(f, f["authReaderBinding"].as_str().unwrap_or_default(), true),
            json!({"roleRef": role_ref("Role", "extension-apiserver-authentication-reader"),
                   "subjects": [subject]}),
        ),
    ]
}

fn args(v: &Value, f: &Value) -> Vec<Value> {
    let mut a = vec![
        json!(format!(
            "--cloud-provider={}",
            v["provider"].as_str().unwrap_or_default()
        )),
        json!("--leader-elect=true"),
        json!(format!(
            "--use-service-account-credentials={}",
            v["useServiceAccountCredentials"].as_bool().unwrap_or(true)
        )),
        json!(format!("--secure-port={}", f["securePort"])),
    ];
    if v["variant"] == "static-pod" {
        a.push(json!(format!(
            "--kubeconfig={}",
            v["staticPodKubeconfig"].as_str().unwrap_or_default()
        )));
    }
    if v["cloudConfigSecret"]
        .as_str()
        .is_some_and(|s| !s.is_empty())
    {
        a.push(json!(
            "--cloud-config=/etc/kubernetes/cloud-config/cloud-config"
        ));
    }
    match v["clusterCIDR"].as_str().unwrap_or_default() {
        "" => a.push(json!("--configure-cloud-routes=false")),
        cidr => a.push(json!(format!("--cluster-cidr={cidr}"))),
    }
    a.extend(v["extraArgs"].as_array().cloned().unwrap_or_default());
    a
}

fn pod_spec(v: &Value, f: &Value) -> Value {
    let variant = v["variant"].as_str().unwrap_or_default();
    let mut mounts = vec![json!({"name": "tmp", "mountPath": "/tmp"})];
    let mut volumes = vec![json!({"name": "tmp", "emptyDir": {}})];
    if let Some(secret) = v["cloudConfigSecret"].as_str().filter(|s| !s.is_empty()) {
        mounts.push(json!({"name": "cloud-config", "mountPath": "/etc/kubernetes/cloud-config", "readOnly": true}));
        volumes.push(json!({"name": "cloud-config", "secret": {"secretName": secret}}));
    }
    if variant == "static-pod" {
        let path = &v["staticPodKubeconfig"];
        mounts.push(json!({"name": "kubeconfig", "mountPath": path, "readOnly": true}));
        volumes.push(json!({"name": "kubeconfig", "hostPath": {"path": path, "type": "File"}}));
    }
    let image = format!(
        "{}:{}",
        v["image"]["repository"].as_str().unwrap_or_default(),
        v["image"]["tag"].as_str().unwrap_or_default()
    );
    let container = json!({
        "name": f["name"],
        "image": image,
        "imagePullPolicy": v["image"]["pullPolicy"],
        "args": args(v, f),
        "ports": [{"name": "https", "containerPort": f["securePort"], "protocol": "TCP"}],
        "livenessProbe": f["livenessProbe"],
        "readinessProbe": f["readinessProbe"],
        "resources": v["resources"],
        "securityContext": f["securityContext"],
        "volumeMounts": mounts,
    });
    let mut spec = json!({
        "priorityClassName": "system-cluster-critical",
        "hostNetwork": true,
        "securityContext": f["podSecurityContext"],
        "containers": [container],
        "volumes": volumes,
    });
    if variant != "static-pod" {
        spec["serviceAccountName"] = f["name"].clone();
        spec["nodeSelector"] = f["nodeSelector"].clone();
        spec["tolerations"] = f["tolerations"].clone();
    }
    if variant == "deployment" {
        spec["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": f["labels"]}, "topologyKey": "kubernetes.io/hostname"}
        ]}});
    }
    spec
}

fn workload(v: &Value, f: &Value) -> Vec<Value> {
    let name = f["name"].as_str().unwrap_or_default();
    let template = json!({"metadata": {"labels": f["labels"]}, "spec": pod_spec(v, f)});
    let selector = json!({"matchLabels": f["labels"]});
    match v["variant"].as_str().unwrap_or_default() {
        "daemonset" => vec![obj(
            "apps/v1",
            "DaemonSet",
            meta(f, name, true),
            json!({"spec": {"selector": selector, "template": template,
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}}}),
        )],
        "static-pod" => vec![obj(
            "v1",
            "Pod",
            meta(f, name, true),
            json!({"spec": pod_spec(v, f)}),
        )],
        _ => vec![
            obj(
                "apps/v1",
                "Deployment",
                meta(f, name, true),
                json!({"spec": {"replicas": v["replicas"], "selector": selector, "template": template}}),
            ),
            obj(
                "policy/v1",
                "PodDisruptionBudget",
                meta(f, name, true),
                json!({"spec": {"minAvailable": 1, "selector": selector}}),
            ),
        ],
    }
}
