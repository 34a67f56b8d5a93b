//! From a Service to a [`Request`]: the requested addresses, pool and sharing key, whichever
//! of ccm-rs's, MetalLB's or kube-vip's spellings the user wrote.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ccm_cloud::Service;

use super::{AllocError, Family, Port, Request};

/// ccm-rs's request annotation: comma-separated addresses (one per family for dual-stack).
pub const ANNOTATION_LOAD_BALANCER_IPS: &str = "metal.ccm-rs.io/load-balancer-ips";
/// ccm-rs's pool annotation.
pub const ANNOTATION_ADDRESS_POOL: &str = "metal.ccm-rs.io/address-pool";
/// ccm-rs's sharing-key annotation.
pub const ANNOTATION_SHARED_IP: &str = "metal.ccm-rs.io/allow-shared-ip";
/// Namespaces (comma-separated, `*` for any) whose Services may share this one's address;
/// both Services must name each other's namespace (Cilium #35460: no silent cross-namespace
/// sharing).
pub const ANNOTATION_SHARING_CROSS_NAMESPACE: &str = "metal.ccm-rs.io/sharing-cross-namespace";

/// Address annotations accepted, so a Service written for MetalLB or kube-vip works unchanged.
const IP_ANNOTATIONS: &[&str] = &[
    ANNOTATION_LOAD_BALANCER_IPS,
    "metallb.io/loadBalancerIPs",
    "metallb.universe.tf/loadBalancerIPs",
    "kube-vip.io/loadbalancerIPs",
];
const POOL_ANNOTATIONS: &[&str] = &[
    ANNOTATION_ADDRESS_POOL,
    "metallb.io/address-pool",
    "metallb.universe.tf/address-pool",
];
const SHARE_ANNOTATIONS: &[&str] = &[
    ANNOTATION_SHARED_IP,
    "metallb.io/allow-shared-ip",
    "metallb.universe.tf/allow-shared-ip",
];

/// The Service's request. Contradictions (two spellings asking for different addresses or
/// pools) are errors, never a silent pick (kube-vip-cloud-provider #59).
pub fn request_from(svc: &Service) -> Result<Request, AllocError> {
    let meta = &svc.metadata;
    let namespace = meta.namespace.clone().unwrap_or_default();
    let key = format!("{namespace}/{}", meta.name.as_deref().unwrap_or(""));
    let spec = svc.spec.clone().unwrap_or_default();
    let annotations = meta.annotations.clone().unwrap_or_default();

    let mut ips: Option<(String, Vec<IpAddr>)> = None;
    let mut sources: Vec<(String, String)> = IP_ANNOTATIONS
        .iter()
        // kube-vip's annotation as ccm-rs wrote it is output, not a request.
        .filter(|k| {
            **k != crate::kube_vip::KUBE_VIP_IPS || !crate::kube_vip::written_by_ccm(&annotations)
        })
        .filter_map(|k| {
            annotations
                .get(*k)
                .map(|v| (format!("annotation {k}"), v.clone()))
        })
        .collect();
    if let Some(ip) = spec.load_balancer_ip.as_ref().filter(|s| !s.is_empty()) {
        sources.push(("spec.loadBalancerIP".into(), ip.clone()));
    }
    for (source, text) in sources {
        let parsed = parse_ips(&source, &text)?;
        match &ips {
            Some((first, prev)) if set(prev) != set(&parsed) => {
                return Err(AllocError::Invalid(format!(
                    "{source} ({text}) contradicts {first}; set the addresses in one place"
                )));
            }
            Some(_) => {}
            None => ips = Some((source, parsed)),
        }
    }
    let pool = agree(&annotations, POOL_ANNOTATIONS, "address pool")?;
    let sharing_key = agree(&annotations, SHARE_ANNOTATIONS, "sharing key")?;

    let mut families: Vec<Family> = spec
        .ip_families
        .unwrap_or_default()
        .iter()
        .filter_map(|f| match f.as_str() {
            "IPv4" => Some(Family::V4),
            "IPv6" => Some(Family::V6),
            _ => None,
        })
        .collect();
    if families.is_empty() {
        families.push(Family::V4);
    }
    let policy = spec.ip_family_policy.unwrap_or_default();
    if policy.is_empty() || policy == "SingleStack" {
        families.truncate(1);
    }
    let ips = ips.map(|(_, v)| v).unwrap_or_default();
    // MetalLB #1742: an address of a family the Service does not have would be published but
    // never reach it (kube-proxy programs only the Service's families).
    if let Some(ip) = ips.iter().find(|ip| !families.contains(&Family::of(**ip))) {
        let have: Vec<String> = families.iter().map(Family::to_string).collect();
        return Err(AllocError::Invalid(format!(
            "requested address {ip} is {} but the Service's IP families are [{}]; request an address of its family or change spec.ipFamilies / spec.ipFamilyPolicy",
            Family::of(*ip),
            have.join(", ")
        )));
    }
    let share_namespaces = annotations
        .get(ANNOTATION_SHARING_CROSS_NAMESPACE)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let ports = spec
        .ports
        .unwrap_or_default()
        .iter()
        .map(|p| Port {
            protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
            port: p.port,
        })
        .collect();
    let current = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|ing| {
            ing.iter()
                .filter_map(|i| i.ip.as_deref()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    Ok(Request {
        key,
        namespace,
        labels: meta.labels.clone().unwrap_or_default(),
        families,
        require_all_families: policy == "RequireDualStack",
        ips,
        pool,
        sharing_key,
        share_namespaces,
        ports,
        current,
    })
}

fn set(ips: &[IpAddr]) -> BTreeSet<IpAddr> {
    ips.iter().copied().collect()
}

fn parse_ips(source: &str, text: &str) -> Result<Vec<IpAddr>, AllocError> {
    let mut out: Vec<IpAddr> = Vec::new();
    for part in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let ip: IpAddr = part
            .parse()
            .map_err(|_| AllocError::Invalid(format!("{source}: {part:?} is not an IP address")))?;
        if ip.is_unspecified() {
            return Err(AllocError::Invalid(format!(
                "{source}: {ip} (kube-vip's DHCP request) is not supported by the metal provider; request an address from a pool or none"
            )));
        }
        if out.iter().any(|o| Family::of(*o) == Family::of(ip)) {
            return Err(AllocError::Invalid(format!(
                "{source}: at most one address per IP family; got {text:?}"
            )));
        }
        out.push(ip);
    }
    Ok(out)
}

fn agree(
    annotations: &std::collections::BTreeMap<String, String>,
    keys: &[&str],
    what: &str,
) -> Result<Option<String>, AllocError> {
    let mut found: Option<(&str, &String)> = None;
    for k in keys {
        if let Some(v) = annotations.get(*k).filter(|v| !v.is_empty()) {
            match found {
                Some((k0, v0)) if v0 != v => {
                    return Err(AllocError::Invalid(format!(
                        "annotation {k} ({v:?}) contradicts {k0} ({v0:?}); set the {what} in one place"
                    )));
                }
                Some(_) => {}
                None => found = Some((k, v)),
            }
        }
    }
    Ok(found.map(|(_, v)| v.clone()))
}
