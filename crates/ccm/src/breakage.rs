//! `ccm demo --break <scenario>`: the demo cluster with one of the failures `ccm doctor` exists
//! for, left broken so `ccm doctor` (or `kubectl ccm doctor`) can be pointed at it. Also the
//! Pod objects a real cluster shows for its control plane (the CCM's own pod, the
//! kube-controller-manager static pod), which the simulated kubelets report.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::cluster::{Kubelet, SimCluster, wait_until};
use crate::demo::{Ccm, DemoOptions, cloud, register};

/// The failures `ccm demo --break` can stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Breakage {
    /// The CCM is not running: nodes stay tainted, LoadBalancer Services pending.
    CcmDown,
    /// The chicken and egg: the CNI waits for the CCM (nodes NotReady), and the CCM's pod,
    /// without hostNetwork or tolerations, cannot be scheduled on any node.
    CcmUntolerated,
    /// The CCM runs, but kube-controller-manager still runs its cloud loops
    /// (`--cloud-provider=aws`).
    KcmCloudLoops,
    /// The CCM runs, but two kubelets were started without `--cloud-provider=external`: their
    /// nodes are never initialized.
    KubeletNotExternal,
    /// The CCM runs, but what answers on the port its pod declares is another TLS server,
    /// with a certificate no one trusts, that records every credential sent to it.
    TokenProbe,
    /// The CCM's DaemonSet selects `node-role.kubernetes.io/control-plane: ""`, but the
    /// control-plane node is labelled `"true"` (k3s, RKE2): no pod at all.
    DaemonsetNoMatch,
    /// The CCM runs, from a Deployment without hostNetwork or tolerations: fine today, broken
    /// the day every node is new.
    UntoleratedButRunning,
    /// The CCM runs, but kube-controller-manager v1.36 with `--cloud-provider=aws` exits at
    /// every start (in-tree providers are refused since 1.29) and crash-loops.
    KcmCrashloop,
}

impl Breakage {
    fn describe(self) -> &'static str {
        match self {
            Breakage::CcmDown => "the cloud-controller-manager is not running",
            Breakage::CcmUntolerated => {
                "the CNI waits for the CCM, and the CCM's pod cannot schedule on the NotReady, uninitialized nodes"
            }
            Breakage::KcmCloudLoops => {
                "kube-controller-manager still runs with --cloud-provider=aws next to the CCM"
            }
            Breakage::KubeletNotExternal => {
                "two kubelets were started without --cloud-provider=external"
            }
            Breakage::TokenProbe => {
                "the port the CCM's pod declares is answered by another server, which records credentials"
            }
            Breakage::DaemonsetNoMatch => {
                "the CCM's DaemonSet selects control-plane=\"\" but the control-plane node is labelled \"true\""
            }
            Breakage::UntoleratedButRunning => {
                "the CCM runs from a Deployment without hostNetwork or tolerations"
            }
            Breakage::KcmCrashloop => {
                "kube-controller-manager v1.36 with --cloud-provider=aws crash-loops"
            }
        }
    }

    fn ccm_runs(self) -> bool {
        !matches!(
            self,
            Breakage::CcmDown | Breakage::CcmUntolerated | Breakage::DaemonsetNoMatch
        )
    }
}

/// The name of the machine, as the CCM's leader-election identity (`hostname_uuid`) uses it.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

const CCM_POD: &str = "cloud-controller-manager-5d7c9-x4k2p";

fn ccm_pod_template(args: &[String]) -> Value {
    json!({
        "metadata": {"name": CCM_POD, "namespace": "kube-system",
            "labels": {"app.kubernetes.io/name": "cloud-controller-manager", "pod-template-hash": "5d7c9"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": "cloud-controller-manager-5d7c9", "uid": "5d7c9", "controller": true}]},
        "spec": {"containers": [{"name": "cloud-controller-manager", "image": "ccm-rs:demo",
            "command": ["/ccm"], "args": args}]},
    })
}

async fn create_with_status<K>(api: &Api<K>, mut obj: Value, status: Value) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    obj["status"] = Value::Null;
    let typed: K = serde_json::from_value(obj)?;
    api.create(&PostParams::default(), &typed)
        .await
        .with_context(|| format!("creating {name}"))?;
    api.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": status})),
    )
    .await
    .with_context(|| format!("status of {name}"))?;
    Ok(())
}

/// Reports the in-process CCM as a running, hostNetwork pod on this machine (a control-plane
/// node), with the flags it runs with, as a Deployment's pod would appear.
pub(crate) async fn register_ccm_pod(cluster: &SimCluster, args: &[String]) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(cluster.user_client(), "kube-system");
    let mut pod = ccm_pod_template(args);
    pod["spec"]["hostNetwork"] = json!(true);
    pod["spec"]["nodeName"] = json!(hostname());
    pod["spec"]["tolerations"] = json!([
        {"key": "node.cloudprovider.kubernetes.io/uninitialized", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"},
    ]);
    let status = json!({"phase": "Running", "podIP": "127.0.0.1", "hostIP": "127.0.0.1",
        "containerStatuses": [{"name": "cloud-controller-manager", "image": "ccm-rs:demo", "imageID": "",
            "ready": true, "restartCount": 0, "state": {"running": {"startedAt": now()}}}]});
    create_with_status(&pods, pod, status).await
}

fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The CCM's pod as a Deployment without hostNetwork or tolerations leaves it: Pending, with
/// the scheduler's FailedScheduling event.
async fn register_unschedulable_ccm_pod(cluster: &SimCluster, nodes: u32) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(cluster.user_client(), "kube-system");
    let mut pod = ccm_pod_template(&["--cloud-provider=sim".into(), "--leader-elect=true".into()]);
    // What DefaultTolerationSeconds adds to every pod: NoExecute only, so no help here.
    pod["spec"]["tolerations"] = json!([
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    ]);
    let message = format!(
        "0/{nodes} nodes are available: {nodes} node(s) had untolerated taint {{node.cloudprovider.kubernetes.io/uninitialized: true}}. preemption: 0/{nodes} nodes are available: {nodes} Preemption is not helpful for scheduling."
    );
    let status = json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
        "reason": "Unschedulable", "message": message, "lastTransitionTime": now()}]});
    create_with_status(&pods, pod, status).await?;
    let events: Api<Event> = Api::namespaced(cluster.user_client(), "kube-system");
    let event: Event = serde_json::from_value(json!({
        "metadata": {"name": format!("{CCM_POD}.demo"), "namespace": "kube-system"},
        "involvedObject": {"kind": "Pod", "name": CCM_POD, "namespace": "kube-system", "apiVersion": "v1"},
        "type": "Warning", "reason": "FailedScheduling", "message": message,
        "source": {"component": "default-scheduler"}, "firstTimestamp": now(), "lastTimestamp": now(), "count": 1,
    }))?;
    events.create(&PostParams::default(), &event).await?;
    Ok(())
}

/// kube-controller-manager's static pod on this machine, still running the cloud loops.
async fn register_kcm_pod(cluster: &SimCluster) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(cluster.user_client(), "kube-system");
    let host = hostname();
    let pod = json!({
        "metadata": {"name": format!("kube-controller-manager-{host}"), "namespace": "kube-system",
            "labels": {"component": "kube-controller-manager", "tier": "control-plane"}},
        "spec": {"hostNetwork": true, "nodeName": host, "containers": [{"name": "kube-controller-manager",
            "image": "registry.k8s.io/kube-controller-manager:v1.36.0",
            "command": ["kube-controller-manager", "--cloud-provider=aws", "--allocate-node-cidrs=true",
                "--cluster-cidr=10.128.0.0/9", "--kubeconfig=/etc/kubernetes/controller-manager.conf",
                "--leader-elect=true"]}]},
    });
    create_with_status(
        &pods,
        pod,
        json!({"phase": "Running", "podIP": "127.0.0.1"}),
    )
    .await
}

/// The token probe, each request it sees printed as one line (`token-probe: …`).
async fn start_token_probe() -> anyhow::Result<(u16, tokio::task::JoinHandle<()>)> {
    let (port, task) = crate::token_probe::start(|seen| {
        let what = if seen.credentials {
            "WITH credentials (leaked)"
        } else {
            "without credentials"
        };
        println!("token-probe: request from {:?} {what}", seen.user_agent);
    })
    .await?;
    println!("token-probe: listening on 127.0.0.1:{port}, the port the CCM's pod declares");
    Ok((port, task))
}

/// How the demo's CCM workload differs from what `ccm manifests` ships.
#[derive(Debug, Clone, Copy)]
enum Shape {
    /// As rendered.
    AsShipped,
    /// Without hostNetwork and without tolerations.
    Untolerated,
    /// With this value of the control-plane nodeSelector.
    Selecting(&'static str),
}

const CONTROL_PLANE: &str = "node-role.kubernetes.io/control-plane";

/// Labels the first node as a control-plane node with `value` (k3s and RKE2 use "true").
async fn label_control_plane(cluster: &SimCluster, value: &str) -> anyhow::Result<()> {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(cluster.user_client());
    let first = nodes
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .min()
        .context("no node to label")?;
    nodes
        .patch(
            &first,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {CONTROL_PLANE: value}}})),
        )
        .await?;
    Ok(())
}

/// The CCM's Deployment or DaemonSet as `ccm manifests` renders it (reshaped), with the status
/// its controller would report for `ready` running pods, and a Deployment's ReplicaSet.
async fn register_ccm_workload(
    cluster: &SimCluster,
    variant: &str,
    shape: Shape,
    ready: i32,
) -> anyhow::Result<()> {
    let mut values: Value = serde_yaml_ng::from_str(crate::manifests::VALUES_YAML)?;
    values["variant"] = json!(variant);
    let objects = crate::manifests::render(&values, "kube-system")?;
    let mut w = objects
        .into_iter()
        .find(|o| o["kind"] == "Deployment" || o["kind"] == "DaemonSet")
        .context("no workload rendered")?;
    let spec = &mut w["spec"]["template"]["spec"];
    match shape {
        Shape::AsShipped => {}
        Shape::Untolerated => {
            let s = spec.as_object_mut().context("pod spec")?;
            s.remove("hostNetwork");
            s.remove("tolerations");
        }
        Shape::Selecting(v) => spec["nodeSelector"] = json!({CONTROL_PLANE: v}),
    }
    let c = cluster.user_client();
    let name = w["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if variant == "daemonset" {
        let api: Api<k8s_openapi::api::apps::v1::DaemonSet> = Api::namespaced(c, "kube-system");
        let status = json!({"desiredNumberScheduled": ready, "currentNumberScheduled": ready,
            "numberMisscheduled": 0, "numberReady": ready, "updatedNumberScheduled": ready,
            "numberAvailable": ready, "observedGeneration": 1});
        return create_with_status(&api, w, status).await;
    }
    let api: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(c.clone(), "kube-system");
    let status = json!({"replicas": 1, "readyReplicas": ready, "updatedReplicas": 1,
        "availableReplicas": ready, "observedGeneration": 1});
    let template = w["spec"]["template"].clone();
    create_with_status(&api, w, status).await?;
    let uid = api.get(&name).await?.metadata.uid.unwrap_or_default();
    let rs: Api<k8s_openapi::api::apps::v1::ReplicaSet> = Api::namespaced(c, "kube-system");
    let obj = json!({"metadata": {"name": format!("{name}-5d7c9"), "namespace": "kube-system",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name,
                "uid": uid, "controller": true}]},
        "spec": {"replicas": 1, "selector": template["metadata"].get("labels").map(|l| json!({"matchLabels": l})),
            "template": template}});
    create_with_status(
        &rs,
        obj,
        json!({"replicas": 1, "readyReplicas": ready, "availableReplicas": ready}),
    )
    .await
}

/// The in-process CCM's pod, as a Deployment without hostNetwork or tolerations leaves it:
/// running (scheduled before the nodes were tainted), its hostname the pod's name.
async fn reregister_ccm_pod_untolerated(cluster: &SimCluster) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(cluster.user_client(), "kube-system");
    let old = pods.get(CCM_POD).await?;
    pods.delete(CCM_POD, &Default::default()).await?;
    let args: Vec<String> = old
        .spec
        .and_then(|s| s.containers.into_iter().next())
        .and_then(|c| c.args)
        .unwrap_or_default();
    let mut pod = ccm_pod_template(&args);
    pod["metadata"]["name"] = json!(hostname());
    pod["spec"]["nodeName"] = json!("node-00000");
    let status = json!({"phase": "Running", "podIP": "127.0.0.1", "hostIP": "127.0.0.1",
        "containerStatuses": [{"name": "cloud-controller-manager", "image": "ccm-rs:demo", "imageID": "",
            "ready": true, "restartCount": 0, "state": {"running": {"startedAt": now()}}}]});
    create_with_status(&pods, pod, status).await
}

/// kube-controller-manager v1.36 with an in-tree provider: it exits at every start.
async fn register_kcm_crashloop_pod(cluster: &SimCluster) -> anyhow::Result<()> {
    register_kcm_pod(cluster).await?;
    let pods: Api<Pod> = Api::namespaced(cluster.user_client(), "kube-system");
    let name = format!("kube-controller-manager-{}", hostname());
    let message = "cloud provider \"aws\" was specified, but built-in cloud providers are disabled. Please set --cloud-provider=external and migrate to an external cloud provider";
    pods.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running", "containerStatuses": [{
            "name": "kube-controller-manager", "image": "registry.k8s.io/kube-controller-manager:v1.36.0",
            "imageID": "", "ready": false, "restartCount": 7,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s restarting failed container"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": message,
                "startedAt": now(), "finishedAt": now()}}}]}})),
    )
    .await?;
    Ok(())
}

/// Stages `breakage` on a fresh demo cluster and keeps it up until Ctrl-C.
pub async fn run(opts: &DemoOptions, breakage: Breakage) -> anyhow::Result<ExitCode> {
    let cluster = SimCluster::start(cloud(opts)?).await?;
    let kubeconfig = match (&opts.kubeconfig_out, &cluster.kube) {
        (Some(path), Some(kube)) => {
            kube.write_kubeconfig(path)?;
            path.clone()
        }
        _ => cluster.kubeconfig.clone(),
    };
    println!("ccm demo --break: {}", breakage.describe());
    let probe = match breakage {
        Breakage::TokenProbe => Some(start_token_probe().await?),
        _ => None,
    };
    let ccm = if breakage.ccm_runs() {
        let ccm = Ccm::start_advertising(
            &cluster,
            &opts.ccm_arg_refs(),
            probe.as_ref().map(|(port, _)| *port),
        )
        .await?
        .0;
        if breakage != Breakage::UntoleratedButRunning {
            register_ccm_workload(&cluster, "deployment", Shape::AsShipped, 1).await?;
        }
        Some(ccm)
    } else {
        None
    };
    let n = opts.nodes;
    match breakage {
        Breakage::CcmDown => register(&cluster, 0..n, 0..opts.services).await?,
        Breakage::CcmUntolerated => {
            for i in 0..n {
                cluster.add_node_as(i, Kubelet::NoNetwork).await?;
            }
            register(&cluster, 0..0, 0..opts.services).await?;
            register_ccm_workload(&cluster, "deployment", Shape::Untolerated, 0).await?;
            register_unschedulable_ccm_pod(&cluster, n).await?;
        }
        Breakage::KcmCloudLoops => {
            register(&cluster, 0..n, 0..opts.services).await?;
            register_kcm_pod(&cluster).await?;
        }
        Breakage::TokenProbe => register(&cluster, 0..n, 0..opts.services).await?,
        Breakage::DaemonsetNoMatch => {
            register(&cluster, 0..n, 0..opts.services).await?;
            label_control_plane(&cluster, "true").await?;
            register_ccm_workload(&cluster, "daemonset", Shape::Selecting(""), 0).await?;
        }
        Breakage::UntoleratedButRunning => {
            register(&cluster, 0..n, 0..opts.services).await?;
            register_ccm_workload(&cluster, "deployment", Shape::Untolerated, 1).await?;
            reregister_ccm_pod_untolerated(&cluster).await?;
        }
        Breakage::KcmCrashloop => {
            register(&cluster, 0..n, 0..opts.services).await?;
            register_kcm_crashloop_pod(&cluster).await?;
        }
        Breakage::KubeletNotExternal => {
            register(&cluster, 0..n, 0..opts.services).await?;
            for i in n..n + 2 {
                cluster.add_node_as(i, Kubelet::NotExternal).await?;
            }
        }
    }
    if breakage != Breakage::DaemonsetNoMatch {
        // kubeadm's label, which the shipped nodeSelector selects.
        label_control_plane(&cluster, "").await?;
    }
    if breakage.ccm_runs() {
        let (nodes, services) = (n as usize, opts.services as usize);
        let settled = wait_until(opts.timeout.0, || async {
            let s = cluster.state().await?;
            Ok(s.initialized >= nodes && s.with_ingress >= services)
        })
        .await?;
        anyhow::ensure!(settled, "the CCM did not initialize the demo's nodes");
    }
    if let Some(ccm) = &ccm {
        println!("{}", crate::demo::metrics_hint(ccm, &kubeconfig));
    }
    println!(
        "✘ broken on purpose. Diagnose it (read-only):\n  ccm doctor --kubeconfig {}",
        kubeconfig.display()
    );
    println!("Still running: Ctrl-C to stop.");
    let _ = tokio::signal::ctrl_c().await;
    if let Some((_, task)) = probe {
        task.abort();
    }
    if let Some(ccm) = ccm {
        // Give the last events a moment to land before the runtime goes away.
        tokio::time::sleep(Duration::from_millis(100)).await;
        ccm.stop().await?;
    }
    Ok(ExitCode::SUCCESS)
}
