//! `ccm manifests`: the objects that deploy ccm-rs, as the Helm chart renders them.
//!
//! One source of truth: the chart's `values.yaml` supplies the defaults and its
//! `files/ccm.json` the fixed parts (RBAC rules exactly as the controllers use them,
//! tolerations, probes, security contexts), both compiled in here and read by the chart's
//! templates. A test renders the chart with a real Helm engine and compares object by object.

use std::path::PathBuf;

use anyhow::Context as _;
use base64::Engine as _;
use serde_json::{Map, Value, json};

/// The chart's defaults (`deploy/helm/ccm-rs/values.yaml`).
pub const VALUES_YAML: &str = include_str!("../../../deploy/helm/ccm-rs/values.yaml");
/// The chart's fixed parts (`deploy/helm/ccm-rs/files/ccm.json`).
pub const CCM_JSON: &str = include_str!("../../../deploy/helm/ccm-rs/files/ccm.json");
/// The monitoring mixin's Prometheus rules (`deploy/helm/ccm-rs/files/monitoring/rules.yaml`).
pub const MONITORING_RULES: &str =
    include_str!("../../../deploy/helm/ccm-rs/files/monitoring/rules.yaml");
/// The mixin's Grafana dashboard (`deploy/helm/ccm-rs/files/monitoring/dashboard.json`).
pub const DASHBOARD_JSON: &str =
    include_str!("../../../deploy/helm/ccm-rs/files/monitoring/dashboard.json");
/// The chart's values schema (`deploy/helm/ccm-rs/values.schema.json`): `ccm manifests`
/// refuses the keys Helm refuses.
pub const VALUES_SCHEMA: &str = include_str!("../../../deploy/helm/ccm-rs/values.schema.json");

/// Flags of `ccm manifests`.
#[derive(Debug, Clone, clap::Args)]
pub struct ManifestOptions {
    /// A values file in the chart's format (as `helm template -f`); flags override it.
    #[arg(long, short = 'f')]
    pub values: Option<PathBuf>,
    /// `--cloud-provider` of the rendered CCM: sim, aws or metal.
    #[arg(long)]
    pub provider: Option<String>,
    /// deployment, daemonset or static-pod (the Pod file alone; see --rbac).
    #[arg(long, value_parser = ["deployment", "daemonset", "static-pod"])]
    pub variant: Option<String>,
    /// The namespace of the CCM's ServiceAccount and workload (Helm's release namespace). Its
    /// Lease and the controllers' ServiceAccounts stay in kube-system, as upstream's.
    #[arg(long, short = 'n', default_value = "kube-system")]
    pub namespace: String,
    /// With --variant static-pod: print the RBAC objects (for `kubectl apply`) instead of the
    /// Pod file.
    #[arg(long)]
    pub rbac: bool,
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
    let schema: Value = serde_json::from_str(VALUES_SCHEMA).context("values.schema.json")?;
    unknown_keys(v, &schema, "")?;
    let f = fixed()?;
    let variant = v["variant"].as_str().unwrap_or_default();
    anyhow::ensure!(
        matches!(variant, "deployment" | "daemonset" | "static-pod"),
        "variant {variant:?}: want deployment, daemonset or static-pod"
    );
    let provider = v["provider"].as_str().unwrap_or_default();
    let known: Vec<&str> = f["providers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    anyhow::ensure!(
        known.contains(&provider),
        "provider {provider:?}: want one of {} (the providers the image carries)",
        known.join(", ")
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
    if variant == "static-pod" {
        static_pod_check(v)?;
    }
    webhook_check(v)
}

/// The webhook server's certificate must come from somewhere a kubelet can mount and the API
/// server can trust.
fn webhook_check(v: &Value) -> anyhow::Result<()> {
    if !webhooks_on(v) {
        return Ok(());
    }
    let w = &v["webhooks"];
    anyhow::ensure!(
        v["variant"] != "static-pod",
        "static-pod: webhooks need their serving certificate from a Secret, which a static pod cannot mount; use the deployment or daemonset variant"
    );
    if w["certificates"] == "secret" {
        let set = |k: &str| w["secret"][k].as_str().is_some_and(|s| !s.is_empty());
        anyhow::ensure!(
            set("name") && set("caBundle"),
            "webhooks.certificates secret: set webhooks.secret.name (a kubernetes.io/tls Secret) and webhooks.secret.caBundle (the PEM of the CA that signed it)"
        );
    }
    Ok(())
}

/// A key the schema does not list (`additionalProperties: false`), named with its path: Helm
/// refuses it as well, where it would otherwise be silently ignored.
fn unknown_keys(v: &Value, schema: &Value, at: &str) -> anyhow::Result<()> {
    let (Some(obj), Some(props)) = (v.as_object(), schema["properties"].as_object()) else {
        return Ok(());
    };
    for (k, val) in obj {
        let path = if at.is_empty() {
            k.clone()
        } else {
            format!("{at}.{k}")
        };
        match props.get(k) {
            Some(sub) => unknown_keys(val, sub, &path)?,
            None if schema["additionalProperties"] == json!(false) => {
                let mut known: Vec<&String> = props.keys().collect();
                known.sort();
                anyhow::bail!(
                    "values: unknown key {path:?} (known here: {})",
                    known
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            None => {}
        }
    }
    Ok(())
}

/// What a kubelet cannot do for a static pod: reference API objects (Secrets, ConfigMaps,
/// ServiceAccounts), so volumes are host paths only.
fn static_pod_check(v: &Value) -> anyhow::Result<()> {
    anyhow::ensure!(
        v["cloudConfigSecret"]
            .as_str()
            .unwrap_or_default()
            .is_empty()
            && v["cloudConfig"].as_str().unwrap_or_default().is_empty(),
        "static-pod: a static pod cannot mount a Secret; put the cloud config on the host and set staticPodCloudConfig to its path"
    );
    let bad = v["extraVolumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|vol| vol.get("hostPath").is_none());
    anyhow::ensure!(
        bad.is_none(),
        "static-pod: extraVolumes {}: a static pod can mount host paths only",
        bad.map(|b| b["name"].to_string()).unwrap_or_default()
    );
    anyhow::ensure!(
        v["imagePullSecrets"].as_array().is_none_or(Vec::is_empty),
        "static-pod: imagePullSecrets are Secrets, which a static pod cannot reference; configure the node's container runtime to pull the image"
    );
    let env_refs = v["env"].as_array().into_iter().flatten().any(|e| {
        e["valueFrom"]["secretKeyRef"].is_object() || e["valueFrom"]["configMapKeyRef"].is_object()
    });
    anyhow::ensure!(
        !env_refs,
        "static-pod: env valueFrom secretKeyRef/configMapKeyRef: a static pod cannot reference API objects"
    );
    Ok(())
}

/// Prints the manifests as one multi-document YAML stream; a static pod as the single Pod
/// document a kubelet reads (its RBAC objects with --rbac).
pub fn run(opts: &ManifestOptions) -> anyhow::Result<()> {
    let values = opts.values()?;
    let objects = render(&values, &opts.namespace)?;
    if values["variant"] == "static-pod" {
        let (pods, rbac): (Vec<Value>, Vec<Value>) =
            objects.into_iter().partition(|o| o["kind"] == "Pod");
        if opts.rbac {
            print!("{}", to_yaml(&rbac)?);
        } else {
            print!("{}", serde_yaml_ng::to_string(&pods[0])?);
        }
        return Ok(());
    }
    anyhow::ensure!(!opts.rbac, "--rbac: only with --variant static-pod");
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

/// Where each object goes: the release namespace, and kube-system for the Lease's and the
/// controllers' tokens' grants (the CCM uses kube-system for both, as upstream).
struct Ns<'a> {
    release: &'a str,
    system: &'a str,
}

fn meta(f: &Value, name: &str, namespace: Option<&str>) -> Value {
    let mut m = json!({"name": name, "labels": f["labels"]});
    if let Some(ns) = namespace {
        m["namespace"] = json!(ns);
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

fn rbac(kind: &str, metadata: Value, rest: Value) -> Value {
    obj("rbac.authorization.k8s.io/v1", kind, metadata, rest)
}

fn role_ref(kind: &str, name: &str) -> Value {
    json!({"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name})
}

/// A Role or ClusterRole with its binding to `subjects`.
fn bound(
    kind: &str,
    name: &str,
    ns: Option<&str>,
    f: &Value,
    rules: &Value,
    subjects: Value,
) -> [Value; 2] {
    [
        rbac(kind, meta(f, name, ns), json!({"rules": rules})),
        rbac(
            &format!("{kind}Binding"),
            meta(f, name, ns),
            json!({"roleRef": role_ref(kind, name), "subjects": subjects}),
        ),
    ]
}

/// The subject the manager's own grants go to: its ServiceAccount, or for a static pod the
/// user of the host kubeconfig.
fn manager_subject(v: &Value, f: &Value, ns: &Ns) -> Value {
    if v["variant"] == "static-pod" {
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": v["staticPodUser"]})
    } else {
        json!({"kind": "ServiceAccount", "name": f["name"], "namespace": ns.release})
    }
}

fn non_empty(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        _ => true,
    }
}

/// Every object, in apply order (identities and RBAC before the workload), for the release
/// namespace `namespace`.
pub fn render(v: &Value, namespace: &str) -> anyhow::Result<Vec<Value>> {
    check(v)?;
    let f = fixed()?;
    let ns = Ns {
        release: namespace,
        system: f["namespace"].as_str().unwrap_or("kube-system"),
    };
    let use_sa = v["useServiceAccountCredentials"].as_bool().unwrap_or(true);
    let name = f["name"].as_str().unwrap_or_default();
    let static_pod = v["variant"] == "static-pod";
    let mut out = Vec::new();
    if !static_pod {
        let mut m = meta(&f, name, Some(ns.release));
        if non_empty(&v["serviceAccount"]["annotations"]) {
            m["annotations"] = v["serviceAccount"]["annotations"].clone();
        }
        out.push(obj("v1", "ServiceAccount", m, json!({})));
    }
    if use_sa {
        for c in f["controllers"].as_array().into_iter().flatten() {
            let sa = c["serviceAccount"].as_str().unwrap_or_default();
            out.push(obj(
                "v1",
                "ServiceAccount",
                meta(&f, sa, Some(ns.system)),
                json!({}),
            ));
        }
    }
    if let Some(cfg) = v["cloudConfig"].as_str().filter(|c| !c.is_empty()) {
        let secret = f["cloudConfigSecret"].as_str().unwrap_or_default();
        out.push(obj(
            "v1",
            "Secret",
            meta(&f, secret, Some(ns.release)),
            json!({"type": "Opaque", "stringData": {"cloud-config": cfg}}),
        ));
    }
    out.extend(manager_rbac(v, &f, use_sa, &ns));
    out.extend(provider_rbac(v, &f, &ns));
    for c in f["controllers"].as_array().into_iter().flatten() {
        let role = c["clusterRole"].as_str().unwrap_or_default();
        let subject = if use_sa {
            json!({"kind": "ServiceAccount", "name": c["serviceAccount"], "namespace": ns.system})
        } else {
            manager_subject(v, &f, &ns)
        };
        out.extend(bound(
            "ClusterRole",
            role,
            None,
            &f,
            &c["rules"],
            json!([subject]),
        ));
    }
    let reader = f["metricsReader"].as_str().unwrap_or_default();
    out.push(rbac(
        "ClusterRole",
        meta(&f, reader, None),
        json!({"rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]}),
    ));
    if non_empty(&v["metrics"]["readerSubjects"]) {
        out.push(rbac(
            "ClusterRoleBinding",
            meta(&f, reader, None),
            json!({"roleRef": role_ref("ClusterRole", reader), "subjects": v["metrics"]["readerSubjects"]}),
        ));
    }
    out.extend(workload(v, &f, &ns));
    out.extend(webhook_objects(v, &f, &ns));
    out.extend(monitors(v, &f, &ns));
    out.extend(mixin(v, &f, &ns)?);
    out.extend(apf(v, &f, &ns, use_sa));
    Ok(out)
}

/// API Priority and Fairness, when `apf.enabled`: the CCM's requests in a priority level of
/// its own, so a burst of CCM writes queues behind its own share of the server instead of
/// slowing the kubelets (`system`), the scheduler and users (`workload-*`); its Lease renewals
/// in the cluster's `leader-election` level, so queuing never costs it leadership.
fn apf(v: &Value, f: &Value, ns: &Ns, use_sa: bool) -> Vec<Value> {
    let a = &v["apf"];
    if a["enabled"] != json!(true) {
        return Vec::new();
    }
    let name = f["name"].as_str().unwrap_or_default();
    let manager = if v["variant"] == "static-pod" {
        json!({"kind": "User", "user": {"name": v["staticPodUser"]}})
    } else {
        json!({"kind": "ServiceAccount", "serviceAccount": {"name": name, "namespace": ns.release}})
    };
    let mut subjects = vec![manager.clone()];
    if use_sa {
        for c in f["controllers"].as_array().into_iter().flatten() {
            subjects.push(json!({"kind": "ServiceAccount",
                "serviceAccount": {"name": c["serviceAccount"], "namespace": ns.system}}));
        }
    }
    let level = obj(
        "flowcontrol.apiserver.k8s.io/v1",
        "PriorityLevelConfiguration",
        meta(f, name, None),
        json!({"spec": {"type": "Limited", "limited": {
            "nominalConcurrencyShares": a["nominalConcurrencyShares"],
            "lendablePercent": a["lendablePercent"],
            "limitResponse": {"type": "Queue", "queuing": {"queues": 64, "handSize": 6, "queueLengthLimit": 50}}}}}),
    );
    let leases = obj(
        "flowcontrol.apiserver.k8s.io/v1",
        "FlowSchema",
        meta(f, &format!("{name}-leader-election"), None),
        json!({"spec": {"priorityLevelConfiguration": {"name": "leader-election"},
            "matchingPrecedence": 150, "distinguisherMethod": {"type": "ByUser"},
            "rules": [{"subjects": [manager], "resourceRules": [{"verbs": ["get", "create", "update"],
                "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "namespaces": [ns.system]}]}]}}),
    );
    let all = obj(
        "flowcontrol.apiserver.k8s.io/v1",
        "FlowSchema",
        meta(f, name, None),
        json!({"spec": {"priorityLevelConfiguration": {"name": name},
            "matchingPrecedence": 850, "distinguisherMethod": {"type": "ByUser"},
            "rules": [{"subjects": subjects, "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"],
                "resources": ["*"], "clusterScope": true, "namespaces": ["*"]}],
                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}]}}),
    );
    vec![level, leases, all]
}

fn manager_rbac(v: &Value, f: &Value, use_sa: bool, ns: &Ns) -> Vec<Value> {
    let m = &f["manager"];
    let cluster_role = m["clusterRole"].as_str().unwrap_or_default();
    let role = m["role"].as_str().unwrap_or_default();
    let mut rules = m["rules"].as_array().cloned().unwrap_or_default();
    if use_sa {
        rules.push(m["tokenRule"].clone());
    }
    let subjects = json!([manager_subject(v, f, ns)]);
    let mut out = Vec::new();
    out.extend(bound(
        "ClusterRole",
        cluster_role,
        None,
        f,
        &m["clusterRules"],
        subjects.clone(),
    ));
    out.extend(bound(
        "Role",
        role,
        Some(ns.system),
        f,
        &json!(rules),
        subjects.clone(),
    ));
    // Delegated authentication reads the client CA and request-header configuration
    // (the bootstrap Role every kube-apiserver creates), as upstream's manifests bind it.
    out.push(rbac(
        "RoleBinding",
        meta(
            f,
            f["authReaderBinding"].as_str().unwrap_or_default(),
            Some(ns.system),
        ),
        json!({"roleRef": role_ref("Role", "extension-apiserver-authentication-reader"),
               "subjects": subjects}),
    ));
    out
}

/// What the provider itself reads and writes, granted only when that provider is rendered.
fn provider_rbac(v: &Value, f: &Value, ns: &Ns) -> Vec<Value> {
    let provider = v["provider"].as_str().unwrap_or_default();
    let p = &f["providerRbac"][provider];
    let name = format!("ccm-rs:provider-{provider}");
    let subjects = json!([manager_subject(v, f, ns)]);
    let mut out = Vec::new();
    let mut cluster_rules = list(&p["clusterRules"]);
    if provider == "metal" && v["metal"]["announceLoadBalancers"].as_bool() == Some(true) {
        // LoadBalancer addresses over BGP: `Local` Services follow their ready endpoints.
        cluster_rules.push(json!({"apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"], "verbs": ["list", "watch"]}));
    }
    if !cluster_rules.is_empty() {
        out.extend(bound(
            "ClusterRole",
            &name,
            None,
            f,
            &json!(cluster_rules),
            subjects.clone(),
        ));
    }
    let mut rules = list(&p["rules"]);
    let secrets = &v["metal"]["credentialsSecrets"];
    if provider == "metal" && non_empty(secrets) {
        // The BMC credentials, by name: never every Secret of the namespace.
        rules.push(json!({"apiGroups": [""], "resources": ["secrets"],
            "resourceNames": secrets, "verbs": ["get"]}));
    }
    if !rules.is_empty() {
        out.extend(bound(
            "Role",
            &name,
            Some(ns.release),
            f,
            &json!(rules),
            subjects,
        ));
    }
    out
}

fn args(v: &Value, f: &Value, cloud_config: Option<&str>) -> Vec<Value> {
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
    if let Some(path) = cloud_config {
        a.push(json!(format!("--cloud-config={path}")));
    }
    match v["clusterCIDR"].as_str().unwrap_or_default() {
        "" => a.push(json!("--configure-cloud-routes=false")),
        cidr => a.push(json!(format!("--cluster-cidr={cidr}"))),
    }
    if webhooks_on(v) {
        a.extend([
            json!("--webhooks=persistentvolumelabel"),
            json!("--feature-gates=CloudControllerManagerWebhook=true"),
            json!(format!("--webhook-secure-port={}", v["webhooks"]["port"])),
            json!(format!("--webhook-tls-cert-file={WEBHOOK_TLS_DIR}/tls.crt")),
            json!(format!(
                "--webhook-tls-private-key-file={WEBHOOK_TLS_DIR}/tls.key"
            )),
        ]);
    }
    a.extend(v["extraArgs"].as_array().cloned().unwrap_or_default());
    a
}

fn list(v: &Value) -> Vec<Value> {
    v.as_array().cloned().unwrap_or_default()
}

/// The static pod's writable directory on the host (root-owned, as the Pod runs as root).
const STATIC_POD_TMP: &str = "/var/lib/cloud-controller-manager";

/// The mounts, volumes and `--cloud-config` path of the pod.
fn volumes(v: &Value, f: &Value) -> (Vec<Value>, Vec<Value>, Option<String>) {
    let mut mounts = Vec::new();
    let mut volumes = Vec::new();
    let mut cloud_config = None;
    if v["variant"] == "static-pod" {
        // Host paths only: a kubelet cannot give a static pod a Secret. /tmp holds the
        // controllers' minted tokens.
        mounts.push(json!({"name": "tmp", "mountPath": "/tmp"}));
        volumes.push(json!({"name": "tmp", "hostPath": {"path": STATIC_POD_TMP, "type": "DirectoryOrCreate"}}));
        let path = &v["staticPodKubeconfig"];
        mounts.push(json!({"name": "kubeconfig", "mountPath": path, "readOnly": true}));
        volumes.push(json!({"name": "kubeconfig", "hostPath": {"path": path, "type": "File"}}));
        if let Some(cfg) = v["staticPodCloudConfig"].as_str().filter(|s| !s.is_empty()) {
            mounts.push(json!({"name": "cloud-config", "mountPath": cfg, "readOnly": true}));
            volumes
                .push(json!({"name": "cloud-config", "hostPath": {"path": cfg, "type": "File"}}));
            cloud_config = Some(cfg.to_string());
        }
    } else {
        mounts.push(json!({"name": "tmp", "mountPath": "/tmp"}));
        volumes.push(json!({"name": "tmp", "emptyDir": {}}));
        let secret = match v["cloudConfig"].as_str().filter(|s| !s.is_empty()) {
            Some(_) => f["cloudConfigSecret"].as_str(),
            None => v["cloudConfigSecret"].as_str().filter(|s| !s.is_empty()),
        };
        if let Some(secret) = secret {
            mounts.push(json!({"name": "cloud-config", "mountPath": "/etc/kubernetes/cloud-config", "readOnly": true}));
            volumes.push(json!({"name": "cloud-config", "secret": {"secretName": secret}}));
            cloud_config = Some("/etc/kubernetes/cloud-config/cloud-config".into());
        }
    }
    if webhooks_on(v) {
        mounts.push(json!({"name": "webhook-tls", "mountPath": WEBHOOK_TLS_DIR, "readOnly": true}));
        volumes.push(json!({"name": "webhook-tls", "secret": {"secretName": webhook_secret(v)}}));
    }
    mounts.extend(list(&v["extraVolumeMounts"]));
    volumes.extend(list(&v["extraVolumes"]));
    (mounts, volumes, cloud_config)
}

fn pod_spec(v: &Value, f: &Value) -> Value {
    let variant = v["variant"].as_str().unwrap_or_default();
    let static_pod = variant == "static-pod";
    let (mounts, volumes, cloud_config) = volumes(v, f);
    let image = format!(
        "{}:{}",
        v["image"]["repository"].as_str().unwrap_or_default(),
        v["image"]["tag"].as_str().unwrap_or_default()
    );
    let mut container = json!({
        "name": f["name"],
        "image": image,
        "imagePullPolicy": v["image"]["pullPolicy"],
        "args": args(v, f, cloud_config.as_deref()),
        "ports": [{"name": "https", "containerPort": f["securePort"], "protocol": "TCP"}],
        "livenessProbe": f["livenessProbe"],
        "readinessProbe": f["readinessProbe"],
        "resources": v["resources"],
        "securityContext": f["securityContext"],
        "volumeMounts": mounts,
    });
    if webhooks_on(v) {
        container["ports"].as_array_mut().expect("ports").push(
            json!({"name": "webhook", "containerPort": v["webhooks"]["port"], "protocol": "TCP"}),
        );
    }
    if non_empty(&v["env"]) {
        container["env"] = v["env"].clone();
    }
    let mut spec = json!({
        "priorityClassName": v["priorityClassName"],
        "hostNetwork": true,
        "dnsPolicy": v["dnsPolicy"],
        "securityContext": if static_pod { &f["staticPodSecurityContext"] } else { &f["podSecurityContext"] },
        "containers": [container],
        "volumes": volumes,
    });
    if !static_pod {
        spec["serviceAccountName"] = f["name"].clone();
        spec["nodeSelector"] = v["nodeSelector"].clone();
        spec["tolerations"] = v["tolerations"].clone();
        if non_empty(&v["imagePullSecrets"]) {
            spec["imagePullSecrets"] = v["imagePullSecrets"].clone();
        }
    }
    if non_empty(&v["affinity"]) && !static_pod {
        spec["affinity"] = v["affinity"].clone();
    } else if variant == "deployment" {
        spec["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": f["labels"]}, "topologyKey": "kubernetes.io/hostname"}
        ]}});
    }
    spec
}

/// The pod template's metadata: the fixed labels over the operator's, the operator's
/// annotations and, for a cloud config from values, its checksum (a change rolls the pods).
fn pod_meta(v: &Value, f: &Value) -> Value {
    let mut labels = v["podLabels"].as_object().cloned().unwrap_or_default();
    labels.extend(f["labels"].as_object().cloned().unwrap_or_default());
    let mut meta = json!({"labels": labels});
    let mut annotations = v["podAnnotations"].as_object().cloned().unwrap_or_default();
    if let Some(cfg) = v["cloudConfig"].as_str().filter(|c| !c.is_empty()) {
        annotations.insert("checksum/cloud-config".into(), json!(sha256_hex(cfg)));
    }
    if !annotations.is_empty() {
        meta["annotations"] = Value::Object(annotations);
    }
    meta
}

fn sha256_hex(s: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, s.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn workload(v: &Value, f: &Value, ns: &Ns) -> Vec<Value> {
    let name = f["name"].as_str().unwrap_or_default();
    let m = meta(f, name, Some(ns.release));
    let template = json!({"metadata": pod_meta(v, f), "spec": pod_spec(v, f)});
    let selector = json!({"matchLabels": f["labels"]});
    match v["variant"].as_str().unwrap_or_default() {
        "daemonset" => vec![obj(
            "apps/v1",
            "DaemonSet",
            m,
            json!({"spec": {"selector": selector, "template": template,
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}}}),
        )],
        "static-pod" => {
            let mut meta = m;
            if let Some(Value::Object(a)) = template["metadata"].get("annotations") {
                meta["annotations"] = Value::Object(a.clone());
            }
            for (k, l) in template["metadata"]["labels"]
                .as_object()
                .into_iter()
                .flatten()
            {
                meta["labels"][k] = l.clone();
            }
            vec![obj("v1", "Pod", meta, json!({"spec": pod_spec(v, f)}))]
        }
        _ => {
            // hostNetwork (port 10258) and hostname anti-affinity: a surge pod has no node
            // to go to, so updates replace one pod at a time.
            let strategy = json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}});
            let mut out = vec![obj(
                "apps/v1",
                "Deployment",
                m.clone(),
                json!({"spec": {"replicas": v["replicas"], "strategy": strategy, "selector": selector, "template": template}}),
            )];
            // One replica: a PodDisruptionBudget could only block every drain.
            if v["replicas"].as_u64().unwrap_or(1) > 1 {
                out.push(obj(
                    "policy/v1",
                    "PodDisruptionBudget",
                    m,
                    json!({"spec": {"maxUnavailable": 1, "selector": selector}}),
                ));
            }
            out
        }
    }
}

/// Where the webhook server's certificate Secret is mounted.
const WEBHOOK_TLS_DIR: &str = "/etc/kubernetes/webhook-tls";
/// The webhook Service, and the name its certificate is issued for.
const WEBHOOK_NAME: &str = "cloud-controller-manager-webhook";

fn webhooks_on(v: &Value) -> bool {
    v["webhooks"]["persistentVolumeLabel"]["enabled"] == json!(true)
}

fn webhook_secret(v: &Value) -> String {
    match v["webhooks"]["certificates"].as_str() {
        Some("secret") => v["webhooks"]["secret"]["name"]
            .as_str()
            .unwrap_or_default()
            .into(),
        _ => format!("{WEBHOOK_NAME}-tls"),
    }
}

/// The webhook's Service, its certificate (cert-manager) and the MutatingWebhookConfiguration.
fn webhook_objects(v: &Value, f: &Value, ns: &Ns) -> Vec<Value> {
    if !webhooks_on(v) {
        return Vec::new();
    }
    let w = &v["webhooks"];
    let m = meta(f, WEBHOOK_NAME, Some(ns.release));
    let mut out = vec![obj(
        "v1",
        "Service",
        m.clone(),
        json!({"spec": {"selector": f["labels"],
        "ports": [{"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}]}}),
    )];
    let mut hook_meta = meta(f, WEBHOOK_NAME, None);
    let mut client = json!({"service": {"name": WEBHOOK_NAME, "namespace": ns.release,
        "path": "/persistentvolumelabel", "port": 443}});
    if w["certificates"] == "secret" {
        let pem = w["secret"]["caBundle"].as_str().unwrap_or_default();
        client["caBundle"] = json!(base64::engine::general_purpose::STANDARD.encode(pem));
    } else {
        let mut issuer = w["certManager"]["issuerRef"].clone();
        if !non_empty(&issuer) {
            let name = format!("{WEBHOOK_NAME}-selfsigned");
            out.push(obj(
                "cert-manager.io/v1",
                "Issuer",
                meta(f, &name, Some(ns.release)),
                json!({"spec": {"selfSigned": {}}}),
            ));
            issuer = json!({"name": name, "kind": "Issuer"});
        }
        let svc = format!("{WEBHOOK_NAME}.{}", ns.release);
        out.push(obj(
            "cert-manager.io/v1",
            "Certificate",
            m,
            json!({"spec": {
            "secretName": webhook_secret(v), "issuerRef": issuer,
            "dnsNames": [WEBHOOK_NAME, svc, format!("{svc}.svc")]}}),
        ));
        hook_meta["annotations"] =
            json!({"cert-manager.io/inject-ca-from": format!("{}/{WEBHOOK_NAME}", ns.release)});
    }
    let p = &w["persistentVolumeLabel"];
    out.push(obj(
        "admissionregistration.k8s.io/v1",
        "MutatingWebhookConfiguration",
        hook_meta,
        json!({
            "webhooks": [{
                "name": "persistentvolumelabel.ccm-rs.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": p["failurePolicy"],
                "timeoutSeconds": p["timeoutSeconds"],
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                    "resources": ["persistentvolumes"]}],
                "clientConfig": client,
            }]
        }),
    ));
    out
}

/// Prometheus Operator objects; the endpoint's TLS and authorization come from values.
fn monitors(v: &Value, f: &Value, ns: &Ns) -> Vec<Value> {
    let name = f["name"].as_str().unwrap_or_default();
    let m = meta(f, name, Some(ns.release));
    let selector = json!({"matchLabels": f["labels"]});
    let endpoint = |interval: &Value| {
        let mut e = v["metrics"]["endpoint"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        e.extend(
            json!({"port": "https", "scheme": "https", "path": "/metrics", "interval": interval})
                .as_object()
                .cloned()
                .unwrap_or_default(),
        );
        Value::Object(e)
    };
    let mut out = Vec::new();
    let sm = &v["metrics"]["serviceMonitor"];
    if sm["enabled"] == json!(true) {
        out.push(obj("v1", "Service", m.clone(), json!({"spec": {"clusterIP": "None", "selector": f["labels"],
            "ports": [{"name": "https", "port": f["securePort"], "targetPort": "https", "protocol": "TCP"}]}})));
        out.push(obj(
            "monitoring.coreos.com/v1",
            "ServiceMonitor",
            m.clone(),
            json!({"spec": {
            "selector": selector, "namespaceSelector": {"matchNames": [ns.release]},
            "endpoints": [endpoint(&sm["interval"])]}}),
        ));
    }
    let pm = &v["metrics"]["podMonitor"];
    if pm["enabled"] == json!(true) {
        out.push(obj(
            "monitoring.coreos.com/v1",
            "PodMonitor",
            m,
            json!({"spec": {
            "selector": selector, "namespaceSelector": {"matchNames": [ns.release]},
            "podMetricsEndpoints": [endpoint(&pm["interval"])]}}),
        ));
    }
    out
}

/// `labels` over the fixed ones, the fixed ones winning (as Helm's `merge`).
fn labels_with(f: &Value, extra: &Value) -> Value {
    let mut l = extra.as_object().cloned().unwrap_or_default();
    l.extend(f["labels"].as_object().cloned().unwrap_or_default());
    Value::Object(l)
}

/// The monitoring mixin: a PrometheusRule and the dashboard ConfigMap, when enabled.
fn mixin(v: &Value, f: &Value, ns: &Ns) -> anyhow::Result<Vec<Value>> {
    let m = &v["monitoring"];
    let mut out = Vec::new();
    if m["prometheusRule"]["enabled"] == json!(true) {
        let rules: Value = serde_yaml_ng::from_str(MONITORING_RULES).context("rules.yaml")?;
        out.push(obj(
            "monitoring.coreos.com/v1",
            "PrometheusRule",
            json!({"name": f["name"], "namespace": ns.release,
                "labels": labels_with(f, &m["prometheusRule"]["labels"])}),
            json!({"spec": rules}),
        ));
    }
    if m["dashboards"]["enabled"] == json!(true) {
        out.push(obj(
            "v1",
            "ConfigMap",
            json!({"name": f["dashboardsConfigMap"], "namespace": ns.release,
                "labels": labels_with(f, &m["dashboards"]["labels"])}),
            json!({"data": {"ccm-rs.json": DASHBOARD_JSON}}),
        ));
    }
    Ok(out)
}
