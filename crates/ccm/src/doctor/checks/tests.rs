//! Each check against a healthy cluster and against the broken one it exists for, asserting the
//! verdict and that the fix names the object to change.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{Value, json};

use super::*;
use crate::doctor::metrics::{MetricsProbe, MetricsSample};
use crate::doctor::report::Verdict;
use crate::doctor::snapshot::{LeaseLookup, Settings, Snapshot};

const UNINIT: &str = "node.cloudprovider.kubernetes.io/uninitialized";

fn now() -> jiff::Timestamp {
    "2026-11-23T12:00:00Z".parse().expect("time")
}

fn ago(secs: i64) -> String {
    (now() - jiff::SignedDuration::from_secs(secs)).to_string()
}

fn obj<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("valid object")
}

fn ready(status: &str, reason: &str) -> Value {
    json!({"type": "Ready", "status": status, "reason": reason, "message": "m"})
}

/// An initialized node: providerID, labels, addresses, Ready.
fn node(name: &str) -> Node {
    obj(json!({
        "metadata": {"name": name, "creationTimestamp": ago(3600), "labels": {
            "topology.kubernetes.io/zone": "z1", "topology.kubernetes.io/region": "r1",
            "node.kubernetes.io/instance-type": "m1"}},
        "spec": {"providerID": format!("sim://{name}")},
        "status": {"conditions": [ready("True", "KubeletReady")],
                   "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]},
    }))
}

/// A node as a kubelet with --cloud-provider=external registers it.
fn tainted(name: &str, age: i64, is_ready: bool) -> Node {
    let cond = if is_ready {
        ready("True", "KubeletReady")
    } else {
        ready("False", "KubeletNotReady")
    };
    obj(json!({
        "metadata": {"name": name, "creationTimestamp": ago(age)},
        "spec": {"taints": [{"key": UNINIT, "value": "true", "effect": "NoSchedule"}]},
        "status": {"conditions": [cond]},
    }))
}

fn ccm_pod(name: &str, extra_args: &[&str]) -> Pod {
    let mut args = vec!["--cloud-provider=sim".to_string()];
    args.extend(extra_args.iter().map(|s| s.to_string()));
    obj(json!({
        "metadata": {"name": name, "namespace": "kube-system",
            "labels": {"app.kubernetes.io/name": "cloud-controller-manager"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": "cloud-controller-manager-7d9f", "uid": "u", "controller": true}]},
        "spec": {"hostNetwork": true, "nodeName": "cp-1",
            "containers": [{"name": "ccm", "image": "ccm-rs:1", "command": ["/ccm"], "args": args}],
            "tolerations": [{"key": UNINIT, "operator": "Exists"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.9",
            "containerStatuses": [{"name": "ccm", "image": "ccm-rs:1", "imageID": "", "ready": true,
                "restartCount": 0, "state": {"running": {}}}]},
    }))
}

fn kcm_pod(cloud_provider: Option<&str>) -> Pod {
    let mut command = vec![
        "kube-controller-manager".to_string(),
        "--leader-elect=true".into(),
    ];
    if let Some(cp) = cloud_provider {
        command.push(format!("--cloud-provider={cp}"));
    }
    obj(json!({
        "metadata": {"name": "kube-controller-manager-cp-1", "namespace": "kube-system",
            "labels": {"component": "kube-controller-manager"}},
        "spec": {"nodeName": "cp-1", "containers": [{"name": "kube-controller-manager", "command": command}]},
        "status": {"phase": "Running"},
    }))
}

fn lease(holder: &str, renewed_ago: i64) -> Lease {
    let renew = (now() - jiff::SignedDuration::from_secs(renewed_ago)).to_string();
    obj(json!({
        "metadata": {"name": "cloud-controller-manager", "namespace": "kube-system"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": renew},
    }))
}

fn lb_service(name: &str, ingress: bool) -> Service {
    let status = if ingress {
        json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.1"}]}})
    } else {
        json!({})
    };
    obj(json!({
        "metadata": {"name": name, "namespace": "default", "creationTimestamp": ago(600)},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]},
        "status": status,
    }))
}

fn event(kind: &str, name: &str, type_: &str, reason: &str, message: &str) -> Event {
    obj(json!({
        "metadata": {"name": format!("{name}.1"), "namespace": "default"},
        "involvedObject": {"kind": kind, "name": name, "namespace": "default"},
        "type": type_, "reason": reason, "message": message, "lastTimestamp": ago(30),
    }))
}

fn scraped(periodic: f64, node_change: f64, uptime: f64) -> MetricsProbe {
    let mut by = std::collections::BTreeMap::new();
    by.insert("periodic".to_string(), periodic);
    by.insert("node_change".to_string(), node_change);
    MetricsProbe::Scraped {
        url: "https://10.0.0.9:10258/metrics".into(),
        sample: MetricsSample {
            route_syncs: Some(periodic + node_change),
            route_syncs_by_trigger: by,
            start_time: Some(1000.0),
            scraped_at: 1000.0 + uptime,
        },
        unverified_tls: true,
    }
}

/// A healthy cluster: every check passes.
fn healthy() -> Snapshot {
    Snapshot {
        now: now(),
        nodes: vec![node("cp-1"), node("worker-1"), node("worker-2")],
        system_pods: Ok(vec![
            ccm_pod("cloud-controller-manager-7d9f-abcde", &[]),
            kcm_pod(Some("external")),
        ]),
        services: Ok(vec![lb_service("web", true)]),
        events: Ok(vec![]),
        endpoint_slices: Ok(vec![]),
        workloads: Default::default(),
        lease: LeaseLookup {
            namespace: "kube-system".into(),
            name: "cloud-controller-manager".into(),
            result: Ok(Some(lease("cp-1_0b7c", 3))),
        },
        metrics: scraped(0.0, 4.0, 7200.0),
        settings: Settings {
            namespace: "kube-system".into(),
            grace: Duration::from_secs(120),
        },
    }
}

fn fix(f: &crate::doctor::report::Finding) -> String {
    f.fix.join("\n")
}

#[test]
fn a_healthy_cluster_passes_every_check() {
    let snap = healthy();
    for f in run_all(&snap) {
        assert!(
            matches!(f.verdict, Verdict::Ok | Verdict::Skip),
            "{} is {:?}: {} {:?}",
            f.check,
            f.verdict,
            f.summary,
            f.evidence
        );
    }
}

#[test]
fn tainted_nodes_fail_after_the_grace_and_warn_before() {
    let mut snap = healthy();
    snap.nodes.push(tainted("worker-3", 30, true));
    let f = nodes::uninitialized_taint(&snap);
    assert_eq!(f.verdict, Verdict::Warn, "{f:?}");
    snap.nodes.push(tainted("worker-4", 600, true));
    let f = nodes::uninitialized_taint(&snap);
    assert_eq!(f.verdict, Verdict::Fail);
    assert!(f.summary.contains("2 of 5 nodes"), "{}", f.summary);
    assert_eq!(f.evidence[0], "node worker-4: tainted for 10m00s");
    assert!(
        fix(&f).contains("kubectl describe node worker-4"),
        "{}",
        fix(&f)
    );
}

#[test]
fn notready_and_uninitialized_is_the_cni_deadlock() {
    let mut snap = healthy();
    snap.nodes.push(tainted("worker-3", 600, true));
    assert_eq!(nodes::network_deadlock(&snap).verdict, Verdict::Ok);
    snap.nodes.push(tainted("worker-4", 600, false));
    let mut pod = ccm_pod("cloud-controller-manager-7d9f-abcde", &[]);
    let spec = pod.spec.as_mut().expect("spec");
    spec.host_network = None;
    spec.node_name = None;
    spec.tolerations = None;
    pod.status.as_mut().expect("status").phase = Some("Pending".into());
    snap.system_pods = Ok(vec![pod]);
    let f = nodes::network_deadlock(&snap);
    assert_eq!(f.verdict, Verdict::Fail);
    assert!(
        f.evidence
            .iter()
            .any(|e| e.starts_with("node worker-4: Ready=False")),
        "{f:?}"
    );
    assert!(
        f.evidence
            .iter()
            .any(|e| e.contains("cloud-controller-manager-7d9f-abcde: Pending")),
        "{f:?}"
    );
    assert!(fix(&f).contains("hostNetwork: true"), "{}", fix(&f));
    assert!(
        fix(&f).contains("deployment/cloud-controller-manager"),
        "{}",
        fix(&f)
    );
}

#[test]
fn missing_ccm_pod_fails_and_an_outside_leader_only_warns() {
    let mut snap = healthy();
    snap.system_pods = Ok(vec![kcm_pod(Some("external"))]);
    snap.lease.result = Ok(None);
    let f = ccm::ccm_pods(&snap);
    assert_eq!(f.verdict, Verdict::Fail);
    assert!(fix(&f).contains("kube-system"), "{}", fix(&f));
    snap.lease.result = Ok(Some(lease("laptop_1234", 2)));
    let f = ccm::ccm_pods(&snap);
    assert_eq!(f.verdict, Verdict::Warn, "{f:?}");
    assert!(f.evidence[0].contains("laptop_1234"), "{f:?}");
}

#[test]
fn pending_ccm_pod_names_the_untolerated_taint() {
    let mut snap = healthy();
    snap.nodes = vec![tainted("n1", 600, true), tainted("n2", 600, true)];
    let mut pod = ccm_pod("cloud-controller-manager-7d9f-abcde", &[]);
    let spec = pod.spec.as_mut().expect("spec");
    spec.node_name = None;
    spec.tolerations = None;
    pod.status.as_mut().expect("status").phase = Some("Pending".into());
    snap.system_pods = Ok(vec![pod]);
    let f = ccm::ccm_pods(&snap);
    assert_eq!(f.verdict, Verdict::Fail);
    assert!(
        f.evidence.join("\n").contains(&format!(
            "taint {UNINIT}:NoSchedule not tolerated (2 of 2 nodes)"
        )),
        "{f:?}"
    );
    assert!(fix(&f).contains("add tolerations"), "{}", fix(&f));
    assert!(fix(&f).contains("kubectl -n kube-system edit deployment/cloud-controller-manager"));
}

#[test]
fn pending_ccm_pod_names_selector_and_image_problems() {
    let mut snap = healthy();
    let mut pod = ccm_pod("ccm-a", &[]);
    let spec = pod.spec.as_mut().expect("spec");
    spec.node_name = None;
    spec.node_selector = Some(
        [(
            "node-role.kubernetes.io/control-plane".to_string(),
            String::new(),
        )]
        .into(),
    );
    pod.status.as_mut().expect("status").phase = Some("Pending".into());
    snap.system_pods = Ok(vec![pod]);
    let f = ccm::ccm_pods(&snap);
    assert!(
        f.evidence
            .join("\n")
            .contains("nodeSelector node-role.kubernetes.io/control-plane= matches no node"),
        "{f:?}"
    );
    assert!(fix(&f).contains("nodeSelector"));

    let mut pod = ccm_pod("ccm-b", &[]);
    let status = pod.status.as_mut().expect("status");
    status.phase = Some("Pending".into());
    status.container_statuses = Some(vec![obj(
        json!({"name": "ccm", "image": "ccm-rs:typo", "imageID": "",
        "ready": false, "restartCount": 0,
        "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}}),
    )]);
    snap.system_pods = Ok(vec![pod]);
    let f = ccm::ccm_pods(&snap);
    assert_eq!(f.verdict, Verdict::Fail);
    assert!(
        f.evidence
            .join("\n")
            .contains("image pull of ccm-rs:typo fails: ImagePullBackOff"),
        "{f:?}"
    );
}

#[test]
fn crashlooping_ccm_pod_fails_with_its_last_exit() {
    let mut snap = healthy();
    let mut pod = ccm_pod("ccm-a", &[]);
    pod.status.as_mut().expect("status").container_statuses = Some(vec![obj(json!({
        "name": "ccm", "image": "ccm-rs:1", "imageID": "", "ready": false, "restartCount": 7,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}))]);
    snap.system_pods = Ok(vec![pod]);
    let f = ccm::ccm_pods(&snap);
    assert_eq!(f.verdict, Verdict::Fail);
    assert!(
        f.evidence
            .join("\n")
            .contains("restarted 7 times, CrashLoopBackOff, last exit 1 (Error)"),
        "{f:?}"
    );
    assert!(
        fix(&f).contains("kubectl -n kube-system logs ccm-a --previous"),
        "{}",
        fix(&f)
    );
}

#[test]
fn leader_election_checks_lease_freshness_and_holder() {
    let mut snap = healthy();
    let f = ccm::leader_election(&snap);
    assert_eq!(f.verdict, Verdict::Ok, "{f:?}");
    assert!(
        f.summary.contains("cloud-controller-manager-7d9f-abcde"),
        "{f:?}"
    );

    snap.lease.result = Ok(Some(lease("cp-1_0b7c", 120)));
    let f = ccm::leader_election(&snap);
    assert_eq!(f.verdict, Verdict::Fail);
    assert!(f.evidence[0].contains("last renewed 2m00s ago"), "{f:?}");

    snap.lease.result = Ok(Some(lease("old-box_99", 1)));
    let f = ccm::leader_election(&snap);
    assert_eq!(f.verdict, Verdict::Warn);
    assert!(f.summary.contains("old-box_99"), "{f:?}");

    snap.lease.result = Ok(None);
    let f = ccm::leader_election(&snap);
    assert_eq!(f.verdict, Verdict::Fail);
    assert!(
        f.summary
            .contains("kube-system/cloud-controller-manager does not exist")
    );
}

#[test]
fn replicas_without_leader_election_fail() {
    let mut snap = healthy();
    snap.system_pods = Ok(vec![
        ccm_pod("ccm-a", &["--leader-elect=false"]),
        ccm_pod("ccm-b", &["--leader-elect=false"]),
    ]);
    let f = ccm::leader_election(&snap);
    assert_eq!(f.verdict, Verdict::Fail);
    assert!(fix(&f).contains("--leader-elect=true"));
    assert!(
        fix(&f).contains("deployment/cloud-controller-manager"),
        "{}",
        fix(&f)
    );
    snap.system_pods = Ok(vec![ccm_pod("ccm-a", &["--leader-elect=false"])]);
    assert_eq!(ccm::leader_election(&snap).verdict, Verdict::Ok);
}

#[test]
fn kcm_with_a_cloud_provider_fails() {
    let mut snap = healthy();
    snap.system_pods = Ok(vec![ccm_pod("ccm-a", &[]), kcm_pod(Some("aws"))]);
    let f = ccm::kcm_cloud_provider(&snap);
    assert_eq!(f.verdict, Verdict::Fail);
    assert!(
        fix(&f).contains("kube-system/kube-controller-manager-cp-1"),
        "{}",
        fix(&f)
    );
    assert!(fix(&f).contains("on node cp-1"), "{}", fix(&f));
    snap.system_pods = Ok(vec![ccm_pod("ccm-a", &[]), kcm_pod(None)]);
    assert_eq!(ccm::kcm_cloud_provider(&snap).verdict, Verdict::Ok);
    snap.system_pods = Ok(vec![ccm_pod("ccm-a", &[])]);
    assert_eq!(ccm::kcm_cloud_provider(&snap).verdict, Verdict::Skip);
}

#[test]
fn nodes_without_taint_or_provider_id_point_at_their_kubelet() {
    let mut snap = healthy();
    let mut n = node("worker-9");
    n.spec.as_mut().expect("spec").provider_id = None;
    snap.nodes.push(n);
    let f = nodes::kubelet_cloud_provider(&snap);
    assert_eq!(f.verdict, Verdict::Fail);
    assert!(fix(&f).contains("kubelet on node worker-9 with --cloud-provider=external"));
    assert!(fix(&f).contains(&format!(
        "kubectl taint node worker-9 {UNINIT}=true:NoSchedule"
    )));
}

#[test]
fn initialized_nodes_without_labels_or_addresses_warn() {
    let mut snap = healthy();
    let mut n = node("worker-9");
    n.metadata.labels = None;
    n.status.as_mut().expect("status").addresses = None;
    snap.nodes.push(n);
    let f = nodes::node_metadata(&snap);
    assert_eq!(f.verdict, Verdict::Warn);
    assert_eq!(
        f.evidence[0],
        "node worker-9: missing label topology.kubernetes.io/zone, label topology.kubernetes.io/region, \
         label node.kubernetes.io/instance-type, InternalIP/ExternalIP address"
    );
    assert!(fix(&f).contains("node worker-9"));
}

#[test]
fn pending_load_balancers_show_their_latest_events() {
    let mut snap = healthy();
    snap.services = Ok(vec![lb_service("web", true), lb_service("api", false)]);
    snap.events = Ok(vec![event(
        "Service",
        "api",
        "Warning",
        "SyncLoadBalancerFailed",
        "Error syncing load balancer: quota exceeded",
    )]);
    let f = services::lb_pending(&snap);
    assert_eq!(f.verdict, Verdict::Fail);
    assert!(
        f.summary.starts_with("1 of 2 LoadBalancer Services"),
        "{}",
        f.summary
    );
    assert!(
        f.evidence
            .iter()
            .any(|e| e.contains("Warning SyncLoadBalancerFailed") && e.contains("quota exceeded")),
        "{f:?}"
    );
    assert!(fix(&f).contains("kubectl describe service default/api"));
    // A Service with a class is another controller's business.
    let mut classed = lb_service("other", false);
    classed.spec.as_mut().expect("spec").load_balancer_class = Some("example.com/lb".into());
    snap.services = Ok(vec![lb_service("web", true), classed]);
    assert_eq!(services::lb_pending(&snap).verdict, Verdict::Ok);
}

fn slice(service: &str, node: &str, is_ready: bool) -> EndpointSlice {
    obj(json!({
        "metadata": {"name": format!("{service}-x"), "namespace": "default",
            "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.1.0.5"], "nodeName": node, "conditions": {"ready": is_ready}}],
    }))
}

#[test]
fn local_traffic_policy_needs_ready_endpoints_on_lb_nodes() {
    let mut snap = healthy();
    let mut svc = lb_service("web", true);
    svc.spec.as_mut().expect("spec").external_traffic_policy = Some("Local".into());
    snap.services = Ok(vec![svc]);
    snap.endpoint_slices = Ok(vec![slice("web", "worker-1", true)]);
    assert_eq!(services::lb_local_endpoints(&snap).verdict, Verdict::Ok);

    snap.endpoint_slices = Ok(vec![slice("web", "worker-1", false)]);
    let f = services::lb_local_endpoints(&snap);
    assert_eq!(f.verdict, Verdict::Fail);
    assert!(
        f.evidence[0].contains("service default/web: no ready endpoints at all"),
        "{f:?}"
    );
    assert!(fix(&f).contains("default/web"));

    // Ready, but only on a node excluded from load balancers.
    snap.endpoint_slices = Ok(vec![slice("web", "worker-1", true)]);
    snap.nodes[1]
        .metadata
        .labels
        .get_or_insert_default()
        .insert(
            "node.kubernetes.io/exclude-from-external-load-balancers".into(),
            "true".into(),
        );
    let f = services::lb_local_endpoints(&snap);
    assert_eq!(f.verdict, Verdict::Fail);
    assert!(
        f.evidence[0].contains("ready endpoints only on worker-1"),
        "{f:?}"
    );
}

#[test]
fn external_ips_warn_with_the_alternative() {
    let mut snap = healthy();
    let mut svc: Service = obj(
        json!({"metadata": {"name": "legacy", "namespace": "default"},
        "spec": {"type": "ClusterIP", "externalIPs": ["198.51.100.7"]}}),
    );
    snap.services = Ok(vec![svc.clone()]);
    let f = services::external_ips(&snap);
    assert_eq!(f.verdict, Verdict::Warn);
    assert!(f.evidence[0].contains("198.51.100.7"));
    assert!(
        fix(&f).contains("make default/legacy `type: LoadBalancer`"),
        "{}",
        fix(&f)
    );
    svc.spec.as_mut().expect("spec").external_ips = None;
    snap.services = Ok(vec![svc]);
    assert_eq!(services::external_ips(&snap).verdict, Verdict::Ok);
}

#[test]
fn interval_mode_route_syncs_suggest_watch_mode() {
    let mut snap = healthy();
    snap.metrics = scraped(700.0, 3.0, 7200.0);
    let f = routes::route_syncs(&snap);
    assert_eq!(f.verdict, Verdict::Warn);
    assert!(
        fix(&f)
            .contains("--feature-gates=CloudControllerManagerWatchBasedRoutesReconciliation=true")
    );
    assert!(
        f.evidence
            .iter()
            .any(|e| e.contains("703 route syncs in 2h00m of uptime (352/h)")),
        "{f:?}"
    );
    assert!(
        f.evidence[0]
            .contains("anonymously (serving certificate not verified, so no credentials sent)"),
        "{f:?}"
    );

    // An upstream CCM (no trigger label) in its default interval mode.
    snap.metrics = MetricsProbe::Scraped {
        url: "https://x/metrics".into(),
        sample: MetricsSample {
            route_syncs: Some(720.0),
            start_time: Some(0.0),
            scraped_at: 7200.0,
            ..Default::default()
        },
        unverified_tls: false,
    };
    assert_eq!(routes::route_syncs(&snap).verdict, Verdict::Warn);
    snap.system_pods = Ok(vec![ccm_pod(
        "cloud-controller-manager-7d9f-abcde",
        &["--feature-gates=CloudControllerManagerWatchBasedRoutesReconciliation=true"],
    )]);
    // Watch mode on, but 360 syncs an hour: churn.
    let f = routes::route_syncs(&snap);
    assert_eq!(f.verdict, Verdict::Warn);
    assert!(f.summary.contains("360 times an hour"), "{f:?}");
}

#[test]
fn unreachable_metrics_are_a_warning_with_the_reason() {
    let mut snap = healthy();
    snap.metrics = MetricsProbe::Unreachable {
        url: "https://10.0.0.9:10258/metrics".into(),
        reason: "HTTP 403 forbidden".into(),
    };
    let f = routes::route_syncs(&snap);
    assert_eq!(f.verdict, Verdict::Warn);
    assert!(
        f.summary
            .contains("metrics not reachable at https://10.0.0.9:10258/metrics")
    );
    assert_eq!(f.evidence, vec!["HTTP 403 forbidden".to_string()]);
    snap.system_pods = Ok(vec![ccm_pod("c", &["--configure-cloud-routes=false"])]);
    assert_eq!(routes::route_syncs(&snap).verdict, Verdict::Skip);
}

#[test]
fn metrics_target_is_the_leader_pods_secure_port() {
    let mut snap = healthy();
    let mut follower = ccm_pod("ccm-b", &[]);
    follower.spec.as_mut().expect("spec").node_name = Some("cp-2".into());
    follower.status.as_mut().expect("status").pod_ip = Some("10.0.0.8".into());
    snap.system_pods = Ok(vec![follower, ccm_pod("ccm-a", &["--secure-port=10300"])]);
    assert_eq!(
        crate::doctor::metrics_target(&snap),
        Ok("https://10.0.0.9:10300/metrics".to_string())
    );
    snap.system_pods = Ok(vec![ccm_pod("ccm-a", &["--secure-port=0"])]);
    assert!(crate::doctor::metrics_target(&snap).is_err());
}

#[test]
fn nodes_stuck_the_same_way_fold_into_one_line() {
    let mut snap = healthy();
    snap.nodes = (0..5)
        .map(|i| tainted(&format!("n{i}"), 600, false))
        .collect();
    let f = nodes::network_deadlock(&snap);
    assert_eq!(
        f.evidence[0],
        "nodes n0, n1, n2 and 2 more: Ready=False (KubeletNotReady: m)"
    );
    let f = nodes::uninitialized_taint(&snap);
    assert_eq!(
        f.evidence,
        vec!["nodes n0, n1, n2 and 2 more: tainted for 10m00s".to_string()]
    );
}

#[test]
fn node_network_follows_whether_routes_are_the_ccms_job() {
    let mut snap = healthy();
    let mut n = node("worker-1");
    n.status
        .as_mut()
        .and_then(|s| s.conditions.as_mut())
        .expect("conditions")
        .push(obj(json!({"type": "NetworkUnavailable", "status": "True",
            "reason": "NoRouteCreated", "lastTransitionTime": ago(600)})));
    snap.nodes = vec![node("cp-1"), n];
    // Routes on: the CCM runs with a cluster CIDR; past the grace it is a failure.
    snap.system_pods = Ok(vec![ccm_pod("ccm-a", &["--cluster-cidr=10.244.0.0/16"])]);
    let f = nodes::node_network(&snap);
    assert_eq!(f.verdict, Verdict::Fail, "{f:?}");
    assert!(
        f.evidence
            .join(" ")
            .contains("node worker-1: NetworkUnavailable=True (NoRouteCreated)"),
        "{f:?}"
    );
    // Routes off: the CNI's condition to clear, a warning.
    snap.system_pods = Ok(vec![ccm_pod("ccm-a", &["--configure-cloud-routes=false"])]);
    assert_eq!(nodes::node_network(&snap).verdict, Verdict::Warn);
    // Routes on, every node networked, one without a podCIDR: the route controller skips it.
    snap.nodes = vec![node("cp-1")];
    snap.system_pods = Ok(vec![ccm_pod("ccm-a", &["--cluster-cidr=10.244.0.0/16"])]);
    let f = nodes::node_network(&snap);
    assert_eq!(f.verdict, Verdict::Warn, "{f:?}");
    assert!(f.summary.contains("no spec.podCIDR"), "{f:?}");
    snap.nodes[0].spec.as_mut().expect("spec").pod_cidr = Some("10.244.1.0/24".into());
    assert_eq!(nodes::node_network(&snap).verdict, Verdict::Ok);
}

#[test]
fn kcm_with_an_in_tree_provider_is_refused_from_1_29_and_crash_loops() {
    let mut snap = healthy();
    let mut kcm = kcm_pod(Some("aws"));
    kcm.spec.as_mut().expect("spec").containers[0].image =
        Some("registry.k8s.io/kube-controller-manager:v1.36.0".into());
    snap.system_pods = Ok(vec![ccm_pod("ccm-a", &[]), kcm.clone()]);
    let f = ccm::kcm_cloud_provider(&snap);
    assert_eq!(f.verdict, Verdict::Fail);
    assert!(
        f.summary
            .contains("refuses --cloud-provider=aws since 1.29"),
        "{f:?}"
    );
    kcm.status = Some(obj(json!({"phase": "Running", "containerStatuses": [{
        "name": "kube-controller-manager", "image": "x", "imageID": "", "ready": false,
        "restartCount": 9, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 1, "message": "built-in cloud providers are disabled"}}}]})));
    snap.system_pods = Ok(vec![ccm_pod("ccm-a", &[]), kcm.clone()]);
    let f = ccm::kcm_cloud_provider(&snap);
    assert!(f.summary.contains("crash-looping"), "{f:?}");
    assert!(
        f.evidence[0].contains(
            "9 restarts, CrashLoopBackOff, last exit code 1: built-in cloud providers are disabled"
        ),
        "{f:?}"
    );
    // Before 1.29 the same flag runs the cloud loops next to the CCM.
    kcm.status = None;
    kcm.spec.as_mut().expect("spec").containers[0].image =
        Some("registry.k8s.io/kube-controller-manager:v1.28.4".into());
    snap.system_pods = Ok(vec![ccm_pod("ccm-a", &[]), kcm]);
    assert!(
        ccm::kcm_cloud_provider(&snap)
            .summary
            .contains("runs with --cloud-provider=aws")
    );
}
