//! Request bodies the size of a real cluster's: what a kubelet sends when it registers its Node
//! and reports its status, and what a client sends to create a Service. Simulated kubelets and
//! load generators use them so that the bytes kube-sim stores, encodes and sends to watchers per
//! object — and so the CPU and memory a controller spends on them — are those of a real
//! cluster, where most of a Node is the kubelet's status (images, nodeInfo, capacity,
//! conditions) and its managedFields.
//!
//! The values are those of a kubelet 1.36 on a 4-CPU / 16 GiB cloud VM running containerd 2.1.

use serde_json::{Value, json};

/// Images a freshly joined node of a typical cluster holds (CNI, kube-proxy, CSI, pause …):
/// kubelet reports each with its tag and digest names and its size.
const IMAGES: &[(&str, &str, u64)] = &[
    ("registry.k8s.io/kube-proxy", "v1.36.2", 30_884_214),
    ("docker.io/calico/node", "v3.31.0", 146_262_810),
    ("docker.io/calico/cni", "v3.31.0", 94_453_124),
    ("docker.io/calico/pod2daemon-flexvol", "v3.31.0", 6_046_132),
    (
        "registry.k8s.io/provider-aws/aws-ebs-csi-driver",
        "v1.48.0",
        42_011_482,
    ),
    (
        "public.ecr.aws/eks-distro/kubernetes-csi/node-driver-registrar",
        "v2.14.0",
        10_214_019,
    ),
    (
        "public.ecr.aws/eks-distro/kubernetes-csi/livenessprobe",
        "v2.16.0",
        9_331_804,
    ),
    ("registry.k8s.io/coredns/coredns", "v1.12.3", 22_384_805),
    (
        "registry.k8s.io/metrics-server/metrics-server",
        "v0.8.0",
        19_564_420,
    ),
    ("registry.k8s.io/pause", "3.10.1", 320_448),
];

/// A deterministic 64-hex-digit digest for an image (a real one is the content's sha256).
fn digest(name: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut out = String::with_capacity(64);
    for round in 0..4u64 {
        for b in name.bytes().chain(round.to_le_bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        out.push_str(&format!("{h:016x}"));
    }
    out
}

/// The Node a kubelet started with `--cloud-provider=external` POSTs when it registers
/// (labels, annotations, the uninitialized taint and its pod CIDR).
pub fn realistic_node(name: &str, pod_cidr: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": {
            "podCIDR": pod_cidr,
            "podCIDRs": [pod_cidr],
            "taints": [{"key": "node.cloudprovider.kubernetes.io/uninitialized",
                        "value": "true", "effect": "NoSchedule"}],
        },
    })
}

fn quantities(memory_ki: u64, pods: u32) -> Value {
    json!({
        "cpu": "4",
        "ephemeral-storage": "101430960Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "memory": format!("{memory_ki}Ki"),
        "pods": pods.to_string(),
    })
}

fn condition(ty: &str, status: &str, reason: &str, message: &str, now: &str) -> Value {
    json!({"type": ty, "status": status, "reason": reason, "message": message,
           "lastHeartbeatTime": now, "lastTransitionTime": now})
}

/// The status a ready kubelet reports (a strategic-merge patch of `nodes/status`): capacity
/// and allocatable, the four conditions with heartbeat times (`now`, RFC 3339), its addresses,
/// daemon endpoint, nodeInfo, images, runtime handlers and features.
pub fn realistic_node_status(name: &str, internal_ip: &str, now: &str) -> Value {
    let images: Vec<Value> = IMAGES
        .iter()
        .map(|(repo, tag, size)| {
            json!({"names": [format!("{repo}@sha256:{}", digest(repo)), format!("{repo}:{tag}")],
                   "sizeBytes": size})
        })
        .collect();
    let id = digest(name);
    json!({
        "status": {
            "capacity": quantities(16_393_220, 110),
            "allocatable": quantities(16_290_820, 110),
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory",
                          "kubelet has sufficient memory available", now),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure",
                          "kubelet has no disk pressure", now),
                condition("PIDPressure", "False", "KubeletHasSufficientPID",
                          "kubelet has sufficient PID available", now),
                condition("Ready", "True", "KubeletReady", "kubelet is posting ready status", now),
            ],
            "addresses": [
                {"type": "InternalIP", "address": internal_ip},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": &id[..32],
                "systemUUID": format!("ec2{}-{}-{}-{}-{}", &id[32..37], &id[37..41], &id[41..45],
                                      &id[45..49], &id[49..61]),
                "bootID": format!("{}-{}-{}-{}-{}", &id[..8], &id[8..12], &id[12..16],
                                  &id[16..20], &id[20..32]),
                "kernelVersion": "6.12.48-1.el10.x86_64",
                "osImage": "Ubuntu 24.04.3 LTS",
                "containerRuntimeVersion": "containerd://2.1.4",
                "kubeletVersion": "v1.36.2",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
                "swap": {"capacity": 0},
            },
            "images": images,
            "runtimeHandlers": [
                {"name": "runc", "features": {"recursiveReadOnlyMounts": true, "userNamespaces": true}},
                {"name": "", "features": {"recursiveReadOnlyMounts": true, "userNamespaces": true}},
            ],
            "features": {"supplementalGroupsPolicy": true},
        }
    })
}

/// A LoadBalancer Service as a deployment tool creates it (labels, a selector, two ports);
/// kube-apiserver then adds clusterIP(s), ipFamilies, ipFamilyPolicy, sessionAffinity,
/// internalTrafficPolicy, externalTrafficPolicy, allocateLoadBalancerNodePorts and NodePorts.
pub fn realistic_service(name: &str, namespace: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": name,
                "app.kubernetes.io/instance": name,
                "app.kubernetes.io/component": "frontend",
                "app.kubernetes.io/managed-by": "Helm",
            },
            "annotations": {"meta.helm.sh/release-name": name,
                            "meta.helm.sh/release-namespace": namespace},
        },
        "spec": {
            "type": "LoadBalancer",
            "selector": {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": name},
            "ports": [
                {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"},
                {"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"},
            ],
        },
    })
}
