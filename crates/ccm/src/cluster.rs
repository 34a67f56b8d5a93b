//! A simulated cluster for `ccm demo` and `ccm bench`: kube-sim plus the sim cloud, and the
//! parts of Kubernetes that are not the CCM — kubelets registering Nodes (tainted, with pod
//! CIDRs, then Ready) and users creating LoadBalancer Services.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use ccm_controllers::nodeutil::{TAINT_SHUTDOWN, TAINT_UNINITIALIZED, condition_status, has_taint};
use ccm_kube_sim::KubeSim;
use ccm_provider_sim::{InstanceSpec, SimCloud};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// User-Agent of the simulated kubelets (for request accounting).
pub const KUBELET_AGENT: &str = "kubelet/sim";
/// User-Agent of the simulated user creating Services.
pub const USER_AGENT: &str = "kubectl/sim";
/// Pod CIDR range nodes get /24s from: 10.128.0.0/9 for the first 32,768 nodes, then
/// 10.0.0.0/9 (room for 65,536).
pub const CLUSTER_CIDR: &str = "10.0.0.0/8";

/// kube-sim, the sim cloud and clients acting as kubelets and users.
pub struct SimCluster {
    /// The in-memory API server; `None` when driving an external one (`--kubeconfig`), which
    /// has no request accounting.
    pub kube: Option<KubeSim>,
    /// The cloud.
    pub cloud: SimCloud,
    /// A kubeconfig for the API server (for the CCM and for kubectl).
    pub kubeconfig: PathBuf,
    /// What the simulated kubelets and users send (set before the first Node registers).
    pub bodies: Bodies,
    kubelet: kube::Client,
    user: kube::Client,
    _dir: TempDir,
}

/// How big the objects the simulated kubelets and users send are. The CPU and memory a
/// controller spends per object, and the API server's cost per request, grow with it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Bodies {
    /// The fields the CCM reads and nothing else: small, for tests and the demo.
    #[default]
    Minimal,
    /// The workload of the real-server reference run (docs/BENCHMARKS.md): Nodes with
    /// hostname/os/arch labels, a status of four conditions, InternalIP and Hostname,
    /// capacity and nodeInfo; Services with one TCP port.
    Reference,
    /// What a real cluster's kubelets and deployment tools send: the reference objects plus
    /// images, allocatable, runtime handlers, beta labels and annotations; Services with two
    /// ports, labels and Helm annotations.
    Production,
}

/// How a simulated kubelet is configured and what it finds on its machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kubelet {
    /// `--cloud-provider=external`: registers tainted, reports Ready.
    External,
    /// `--cloud-provider=external`, but the CNI waits for the CCM: registers tainted and
    /// reports NotReady (NetworkPluginNotReady).
    NoNetwork,
    /// Started without `--cloud-provider=external`: registers untainted, so no CCM ever
    /// initializes the node.
    NotExternal,
}

/// A directory removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What the cluster looks like now, as a person would check it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ClusterState {
    /// Node objects.
    pub nodes: usize,
    /// Nodes without the uninitialized taint and with a providerID.
    pub initialized: usize,
    /// Nodes whose NetworkUnavailable condition is False.
    pub network_ready: usize,
    /// Nodes with the shutdown taint.
    pub shutdown_tainted: usize,
    /// Routes in the cloud.
    pub routes: usize,
    /// LoadBalancer Services (without a class).
    pub lb_services: usize,
    /// Of those, how many have an ingress IP.
    pub with_ingress: usize,
    /// Load balancers in the cloud.
    pub cloud_lbs: usize,
}

impl SimCluster {
    /// Starts kube-sim (over HTTPS, as every real API server serves: kubectl sends the
    /// kubeconfig's bearer token only over TLS) and an empty cloud.
    pub async fn start(cloud: SimCloud) -> anyhow::Result<Self> {
        Self::start_with_threads(cloud, None).await
    }

    /// [`Self::start`] with kube-sim on `threads` of its own (`ccm_kube_sim::Config::threads`).
    pub async fn start_with_threads(
        cloud: SimCloud,
        threads: Option<usize>,
    ) -> anyhow::Result<Self> {
        let config = ccm_kube_sim::Config {
            tls: true,
            threads,
            ..ccm_kube_sim::Config::default()
        };
        let kube = KubeSim::start(config)
            .await
            .context("starting the in-memory API server")?;
        let dir = std::env::temp_dir().join(format!(
            "ccm-cluster-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir)?;
        let kubeconfig = dir.join("kubeconfig");
        kube.write_kubeconfig(&kubeconfig)?;
        let kubelet = kube.client_with_user_agent(KUBELET_AGENT)?;
        let user = kube.client_with_user_agent(USER_AGENT)?;
        Ok(SimCluster {
            kube: Some(kube),
            cloud,
            kubeconfig,
            bodies: Bodies::Minimal,
            kubelet,
            user,
            _dir: TempDir(dir),
        })
    }

    /// Uses an existing API server (any conformant one) through `kubeconfig`.
    pub async fn connect(kubeconfig: &std::path::Path, cloud: SimCloud) -> anyhow::Result<Self> {
        let client_for = |ua: &'static str| {
            let path = kubeconfig.to_path_buf();
            async move {
                let config = ccm_manager::client::load_config(Some(&path), None).await?;
                ccm_manager::client::build_client(
                    config,
                    ua,
                    &ccm_manager::client::RateLimitLayer::new(0.0, 0),
                )
            }
        };
        let dir = std::env::temp_dir().join(format!(
            "ccm-cluster-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir)?;
        Ok(SimCluster {
            kube: None,
            cloud,
            kubeconfig: kubeconfig.to_path_buf(),
            bodies: Bodies::Minimal,
            kubelet: client_for(KUBELET_AGENT).await?,
            user: client_for(USER_AGENT).await?,
            _dir: TempDir(dir),
        })
    }

    /// A client acting as the simulated user (for watches by demo and bench).
    pub fn user_client(&self) -> kube::Client {
        self.user.clone()
    }

    /// The name node number `i` registers as.
    pub fn node_name(i: u32) -> String {
        format!("node-{i:05}")
    }

    /// The instance behind node number `i` as [`Self::register`] creates it: its InternalIP is
    /// the node IP the kubelet reports. A cloud that lives elsewhere (in the CCM's process) is
    /// given these up front, as a real cloud has its VMs before their kubelets start.
    pub fn registered_instance(i: u32) -> InstanceSpec {
        InstanceSpec {
            internal_ip: Some(node_ip(i).into()),
            ..InstanceSpec::new(Self::node_name(i))
        }
    }

    /// The pod CIDR of node number `i`: a /24 of [`CLUSTER_CIDR`], distinct for 65,536 nodes.
    pub fn pod_cidr(i: u32) -> String {
        let (high, n) = if i < 32_768 {
            (128, i)
        } else {
            (0, i - 32_768)
        };
        format!("10.{}.{}.0/24", high + (n / 256) % 128, n % 256)
    }

    /// What a kubelet with `--cloud-provider=external` does at startup: register a Node
    /// tainted uninitialized (with a pod CIDR, as node IPAM would assign), then report Ready.
    /// The instance is created in the cloud first, as a VM boots before its kubelet.
    pub async fn add_node(&self, i: u32) -> anyhow::Result<String> {
        self.add_node_as(i, Kubelet::External).await
    }

    /// Registers node number `i` as a kubelet configured as `kubelet` does.
    pub async fn add_node_as(&self, i: u32, kubelet: Kubelet) -> anyhow::Result<String> {
        let name = Self::node_name(i);
        if self.bodies != Bodies::Minimal && kubelet == Kubelet::External {
            return Ok(self.register(i).await?.0);
        }
        self.cloud.add_instance(InstanceSpec::new(name.clone()));
        let nodes: Api<Node> = Api::all(self.kubelet.clone());
        let node = Self::node_object(&name, i, kubelet)?;
        nodes
            .create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("kubelet: registering node {name}"))?;
        if kubelet == Kubelet::NoNetwork {
            self.set_condition(
                &name,
                "False",
                "KubeletNotReady",
                "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized",
            )
            .await?;
        } else {
            self.set_ready(&name, true).await?;
        }
        Ok(name)
    }

    /// A kubelet with `--cloud-provider=external` and `--node-ip` registering node number `i`
    /// with bodies the size of [`Self::bodies`] (not [`Bodies::Minimal`]): its POST, then its
    /// full status as one strategic-merge PATCH. The instance's InternalIP is the node IP the
    /// kubelet reports, as on a real VM. Returns the name and when the POST returned (the
    /// reference run's time zero).
    pub async fn register(&self, i: u32) -> anyhow::Result<(String, std::time::Instant)> {
        let name = Self::node_name(i);
        let ip = node_ip(i);
        self.cloud.add_instance(Self::registered_instance(i));
        let mut node = ccm_kube_sim::realistic_node(&name, &Self::pod_cidr(i));
        let mut status = ccm_kube_sim::realistic_node_status(&name, &ip.to_string(), &jiff_now());
        if self.bodies == Bodies::Reference {
            trim_to_reference(&mut node, &mut status);
        }
        let nodes: Api<Node> = Api::all(self.kubelet.clone());
        nodes
            .create(&PostParams::default(), &serde_json::from_value(node)?)
            .await
            .with_context(|| format!("kubelet: registering node {name}"))?;
        let posted = std::time::Instant::now();
        nodes
            .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&status))
            .await
            .with_context(|| format!("kubelet: status of node {name}"))?;
        Ok((name, posted))
    }

    /// A kubelet that keeps trying through API-server faults, as a real one does: the instance
    /// is created once, then the Node POST and the status PATCH are each retried (every
    /// 200 ms, for up to `give_up`) until accepted.
    pub async fn add_node_persistent(&self, i: u32, give_up: Duration) -> anyhow::Result<String> {
        let name = Self::node_name(i);
        self.cloud.add_instance(InstanceSpec::new(name.clone()));
        let nodes: Api<Node> = Api::all(self.kubelet.clone());
        let node = Self::node_object(&name, i, Kubelet::External)?;
        let deadline = tokio::time::Instant::now() + give_up;
        loop {
            match nodes.create(&PostParams::default(), &node).await {
                Ok(_) => break,
                Err(kube::Error::Api(s)) if s.code == 409 => break,
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    return Err(e).with_context(|| format!("kubelet: registering node {name}"));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        while let Err(e) = self.set_ready(&name, true).await {
            if tokio::time::Instant::now() >= deadline {
                return Err(e);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(name)
    }

    /// The Node a kubelet registers as node `i`.
    fn node_object(name: &str, i: u32, kubelet: Kubelet) -> anyhow::Result<Node> {
        let taints = match kubelet {
            Kubelet::NotExternal => json!([]),
            Kubelet::External => {
                json!([{"key": TAINT_UNINITIALIZED, "value": "true", "effect": "NoSchedule"}])
            }
            // kube-controller-manager's node lifecycle controller adds not-ready at once.
            Kubelet::NoNetwork => json!([
                {"key": TAINT_UNINITIALIZED, "value": "true", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
            ]),
        };
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                },
            },
            "spec": {
                "podCIDR": Self::pod_cidr(i),
                "podCIDRs": [Self::pod_cidr(i)],
                "taints": taints,
            },
        }))?;
        Ok(node)
    }

    /// The kubelet's status update: Ready True/Unknown, plus its Hostname address.
    pub async fn set_ready(&self, name: &str, ready: bool) -> anyhow::Result<()> {
        if ready {
            self.set_condition(
                name,
                "True",
                "KubeletReady",
                "kubelet is posting ready status",
            )
            .await
        } else {
            self.set_condition(
                name,
                "Unknown",
                "NodeStatusUnknown",
                "Kubelet stopped posting node status.",
            )
            .await
        }
    }

    /// The kubelet's status update with any Ready condition, plus its Hostname address.
    pub async fn set_condition(
        &self,
        name: &str,
        status: &str,
        reason: &str,
        message: &str,
    ) -> anyhow::Result<()> {
        let nodes: Api<Node> = Api::all(self.kubelet.clone());
        let now = jiff_now();
        let patch = json!({
            "status": {
                "conditions": [{
                    "type": "Ready",
                    "status": status,
                    "reason": reason,
                    "message": message,
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }],
                "addresses": [{"type": "Hostname", "address": name}],
            }
        });
        nodes
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
            .with_context(|| format!("kubelet: status of node {name}"))?;
        Ok(())
    }

    /// Creates a LoadBalancer Service with one port.
    pub async fn add_service(&self, name: &str) -> anyhow::Result<()> {
        self.create_service(name, "LoadBalancer").await
    }

    /// Creates a ClusterIP Service (cached by the CCM, never given a load balancer).
    pub async fn add_cluster_ip_service(&self, name: &str) -> anyhow::Result<()> {
        self.create_service(name, "ClusterIP").await
    }

    async fn create_service(&self, name: &str, type_: &str) -> anyhow::Result<()> {
        let api: Api<Service> = Api::namespaced(self.user.clone(), "default");
        if self.bodies == Bodies::Production {
            let mut svc = ccm_kube_sim::realistic_service(name, "default");
            svc["spec"]["type"] = json!(type_);
            api.create(&PostParams::default(), &serde_json::from_value(svc)?)
                .await
                .with_context(|| format!("creating service default/{name}"))?;
            return Ok(());
        }
        let svc: Service = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "type": type_,
                "selector": {"app": name},
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}],
            },
        }))?;
        api.create(&PostParams::default(), &svc)
            .await
            .with_context(|| format!("creating service default/{name}"))?;
        Ok(())
    }

    /// Deletes a Node object, as an operator (or autoscaler) removing a machine does.
    pub async fn delete_node(&self, name: &str) -> anyhow::Result<()> {
        let api: Api<Node> = Api::all(self.user.clone());
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e).with_context(|| format!("deleting node {name}")),
        }
    }

    /// Deletes a Service (the CCM's finalizer keeps it until its LB is gone).
    pub async fn delete_service(&self, name: &str) -> anyhow::Result<()> {
        let api: Api<Service> = Api::namespaced(self.user.clone(), "default");
        api.delete(name, &DeleteParams::default())
            .await
            .with_context(|| format!("deleting service default/{name}"))?;
        Ok(())
    }

    /// Stops the node's instance; its kubelet stops reporting (Ready → Unknown).
    pub async fn stop_node(&self, name: &str) -> anyhow::Result<()> {
        let id = self
            .cloud
            .instance_id(name)
            .with_context(|| format!("no instance for {name}"))?;
        self.cloud.stop_instance(&id)?;
        self.set_ready(name, false).await
    }

    /// Terminates the node's instance; its kubelet is gone (Ready → Unknown).
    pub async fn terminate_node(&self, name: &str) -> anyhow::Result<()> {
        let id = self
            .cloud
            .instance_id(name)
            .with_context(|| format!("no instance for {name}"))?;
        self.cloud.terminate_instance(&id)?;
        self.set_ready(name, false).await
    }

    /// One look at the API server and the cloud.
    pub async fn state(&self) -> anyhow::Result<ClusterState> {
        let nodes: Api<Node> = Api::all(self.user.clone());
        let services: Api<Service> = Api::all(self.user.clone());
        let nodes = nodes.list(&ListParams::default()).await?.items;
        let services = services.list(&ListParams::default()).await?.items;
        let mut s = ClusterState {
            nodes: nodes.len(),
            routes: self.cloud.route_count(),
            cloud_lbs: self.cloud.load_balancer_host_counts().len(),
            ..Default::default()
        };
        for n in &nodes {
            let has_pid = n
                .spec
                .as_ref()
                .and_then(|s| s.provider_id.as_deref())
                .is_some_and(|p| !p.is_empty());
            if has_pid && !has_taint(n, TAINT_UNINITIALIZED) {
                s.initialized += 1;
            }
            if condition_status(n, "NetworkUnavailable")
                == ccm_controllers::nodeutil::ConditionStatus::False
            {
                s.network_ready += 1;
            }
            if has_taint(n, TAINT_SHUTDOWN) {
                s.shutdown_tainted += 1;
            }
        }
        for svc in &services {
            let spec = svc.spec.clone().unwrap_or_default();
            if spec.type_.as_deref() == Some("LoadBalancer") && spec.load_balancer_class.is_none() {
                s.lb_services += 1;
                let has_ingress = svc
                    .status
                    .as_ref()
                    .and_then(|st| st.load_balancer.as_ref())
                    .and_then(|lb| lb.ingress.as_ref())
                    .is_some_and(|i| !i.is_empty());
                if has_ingress {
                    s.with_ingress += 1;
                }
            }
        }
        Ok(s)
    }

    /// API requests by the CCM (User-Agent `cloud-controller-manager*`), by verb and resource.
    pub fn ccm_requests(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        let Some(kube) = &self.kube else {
            return out;
        };
        for c in kube.requests() {
            if c.key
                .client
                .starts_with(ccm_manager::client::USER_AGENT_BASE)
            {
                let sub = if c.key.subresource.is_empty() {
                    String::new()
                } else {
                    format!("/{}", c.key.subresource)
                };
                *out.entry(format!("{} {}{}", c.key.verb.as_str(), c.key.resource, sub))
                    .or_default() += c.count;
            }
        }
        out
    }

    /// Connections the API server has accepted since it started, from every client (the CCM,
    /// the kubelets, the bench's own): each a TLS handshake.
    pub fn accepted_connections(&self) -> u64 {
        self.kube.as_ref().map_or(0, KubeSim::accepted_connections)
    }

    /// Successful writes by the CCM, optionally to one resource.
    pub fn ccm_writes(&self, resource: Option<&str>) -> u64 {
        let Some(kube) = &self.kube else { return 0 };
        kube.count_requests(|k| {
            k.client.starts_with(ccm_manager::client::USER_AGENT_BASE)
                && k.verb.is_write()
                && (200..300).contains(&k.code)
                && resource.is_none_or(|r| k.resource == r)
        })
    }
}

/// Node `i`'s IP: 172.16.0.0/12 without the .0 and .255 of each /24 (outside the pod CIDRs).
fn node_ip(i: u32) -> std::net::Ipv4Addr {
    let (net, host) = (i / 254, i % 254 + 1);
    std::net::Ipv4Addr::new(172, 16 + ((net >> 8) & 0x0f) as u8, net as u8, host as u8)
}

/// Cuts a production kubelet's bodies down to the reference run's: hostname/os/arch labels, no
/// annotations; a status of conditions, addresses, capacity and nodeInfo.
fn trim_to_reference(node: &mut serde_json::Value, status: &mut serde_json::Value) {
    if let Some(meta) = node.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        meta.remove("annotations");
        if let Some(labels) = meta.get_mut("labels").and_then(|l| l.as_object_mut()) {
            labels.retain(|k, _| !k.starts_with("beta."));
        }
    }
    if let Some(st) = status.get_mut("status").and_then(|s| s.as_object_mut()) {
        st.retain(|k, _| {
            matches!(
                k.as_str(),
                "conditions" | "addresses" | "capacity" | "nodeInfo"
            )
        });
    }
}

fn jiff_now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// A seeded sim cloud where every call takes `latency` plus up to `latency / jitter_divisor`
/// (0: exactly `latency`), and a `fault_rate` fraction of calls fail (demo and bench differ
/// only in these numbers).
pub fn sim_cloud(
    seed: u64,
    latency: Duration,
    jitter_divisor: u32,
    fault_rate: f64,
) -> anyhow::Result<SimCloud> {
    let cloud = SimCloud::with_options(ccm_provider_sim::SimOptions {
        seed: Some(seed),
        ..Default::default()
    });
    cloud.set_latency(
        "*",
        ccm_provider_sim::Latency {
            fixed: latency,
            jitter: latency.checked_div(jitter_divisor).unwrap_or_default(),
        },
    )?;
    if fault_rate > 0.0 {
        cloud.set_error_rate("*", fault_rate.min(1.0))?;
    }
    Ok(cloud)
}

/// Polls `check` every 50 ms until it returns true or `timeout` passes.
pub async fn wait_until<F, Fut>(timeout: Duration, mut check: F) -> anyhow::Result<bool>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await? {
            return Ok(true);
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
