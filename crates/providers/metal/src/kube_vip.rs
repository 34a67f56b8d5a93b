//! kube-vip pairing: kube-vip's service watcher announces the addresses in a Service's
//! `kube-vip.io/loadbalancerIPs` annotation (it does not read the status), so with
//! `kube_vip_annotation = true` ccm-rs keeps that annotation equal to the addresses the
//! Service's status shows and ccm-rs holds for it — never more:
//! - **grown only after the status**: a Service watcher writes it once the status shows the
//!   addresses (the service controller writes the status after `ensure_load_balancer`);
//! - **shrunk before the status**: `ensure_load_balancer` drops addresses it no longer gives
//!   and `ensure_load_balancer_deleted` removes the annotation before the status is cleared;
//! - **output, never a request**: ccm-rs records the value it wrote in
//!   [`KUBE_VIP_WRITTEN`]; the kube-vip annotation is read as a request only when it differs
//!   from that record (a user wrote it). Such a user request is moved to ccm-rs's request
//!   annotation in the same patch that rewrites kube-vip's, so a refused request is never
//!   announced and never lost.
//!
//! So a crash between any two writes leaves an annotation that names at most the status's
//! addresses and is marked as ccm-rs's, and kube-vip never announces one address for two
//! Services.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ccm_cloud::Service;
use futures::StreamExt as _;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio_util::sync::CancellationToken;

use crate::ipam::ANNOTATION_LOAD_BALANCER_IPS;
use crate::provider::MetalCloud;

/// kube-vip's announce (and request) annotation.
pub const KUBE_VIP_IPS: &str = "kube-vip.io/loadbalancerIPs";
/// The value ccm-rs last wrote to [`KUBE_VIP_IPS`].
pub const KUBE_VIP_WRITTEN: &str = "metal.ccm-rs.io/kube-vip-written";

fn annotations(svc: &Service) -> BTreeMap<String, String> {
    svc.metadata.annotations.clone().unwrap_or_default()
}

/// Whether the Service's kube-vip annotation is the one ccm-rs wrote (then it is output only).
pub fn written_by_ccm(a: &BTreeMap<String, String>) -> bool {
    a.contains_key(KUBE_VIP_IPS) && a.get(KUBE_VIP_IPS) == a.get(KUBE_VIP_WRITTEN)
}

fn parse(text: &str) -> Vec<IpAddr> {
    text.split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

/// The addresses the Service's status shows.
pub fn status_ips(svc: &Service) -> Vec<IpAddr> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|ing| {
            ing.iter()
                .filter_map(|i| i.ip.as_deref()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The annotation patch that makes kube-vip's annotation name exactly `ips` (absent when
/// empty) and marks it as ccm-rs's; `None` when the Service already says so. A kube-vip
/// annotation a user wrote moves to ccm-rs's request annotation unless that one is set.
pub fn plan(svc: &Service, ips: &[IpAddr]) -> Option<serde_json::Value> {
    let a = annotations(svc);
    let want = (!ips.is_empty()).then(|| {
        ips.iter()
            .map(IpAddr::to_string)
            .collect::<Vec<_>>()
            .join(",")
    });
    let have = a.get(KUBE_VIP_IPS).cloned();
    let ours = written_by_ccm(&a);
    let settled = if ours {
        have == want
    } else {
        have.is_none() && want.is_none() && !a.contains_key(KUBE_VIP_WRITTEN)
    };
    if settled {
        return None;
    }
    let mut patch = serde_json::Map::new();
    if let Some(user) = have.as_ref().filter(|_| !ours)
        && !a.contains_key(ANNOTATION_LOAD_BALANCER_IPS)
    {
        patch.insert(ANNOTATION_LOAD_BALANCER_IPS.into(), user.clone().into());
    }
    let value = |v: &Option<String>| v.clone().map_or(serde_json::Value::Null, Into::into);
    patch.insert(KUBE_VIP_IPS.into(), value(&want));
    patch.insert(KUBE_VIP_WRITTEN.into(), value(&want));
    Some(serde_json::json!({
        "metadata": {
            // Optimistic concurrency: a Service changed meanwhile is planned again from its
            // next event.
            "resourceVersion": svc.metadata.resource_version,
            "annotations": patch,
        }
    }))
}

/// The addresses kube-vip's annotation may name now: those the status shows and ccm-rs
/// holds for the Service; none once it is not a LoadBalancer or is being deleted.
pub fn desired(svc: &Service, held: Option<&[IpAddr]>) -> Vec<IpAddr> {
    let lb = svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer");
    if !lb || svc.metadata.deletion_timestamp.is_some() {
        return Vec::new();
    }
    let held = held.unwrap_or_default();
    status_ips(svc)
        .into_iter()
        .filter(|ip| held.contains(ip))
        .collect()
}

/// The addresses of ccm-rs's own kube-vip annotation that are also in `keep`; `None` when the
/// annotation is not ccm-rs's.
pub fn ours_within(svc: &Service, keep: &[IpAddr]) -> Option<Vec<IpAddr>> {
    let a = annotations(svc);
    written_by_ccm(&a).then(|| {
        parse(a.get(KUBE_VIP_IPS).map(String::as_str).unwrap_or(""))
            .into_iter()
            .filter(|ip| keep.contains(ip))
            .collect()
    })
}

impl MetalCloud {
    /// Applies [`plan`] to the Service.
    pub(crate) async fn patch_kube_vip(
        &self,
        svc: &Service,
        ips: &[IpAddr],
    ) -> ccm_cloud::CloudResult<()> {
        let Some(patch) = plan(svc, ips) else {
            return Ok(());
        };
        let client = self.client().ok_or_else(|| {
            ccm_cloud::CloudError::Transient(
                "metal provider not initialized: cannot write the kube-vip annotation".into(),
            )
        })?;
        let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
        let name = svc.metadata.name.as_deref().unwrap_or("");
        Api::<Service>::namespaced(client, ns)
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map(|_| ())
            .map_err(|e| {
                ccm_cloud::CloudError::Transient(format!(
                    "writing {KUBE_VIP_IPS} on {ns}/{name}: {e}"
                ))
            })
    }

    /// Watches Services and grows each one's kube-vip annotation once its status shows the
    /// addresses (and cleans up after Services that stopped being LoadBalancers).
    pub(crate) fn spawn_kube_vip_sync(&self, client: kube::Client, shutdown: CancellationToken) {
        let me = self.clone();
        tokio::spawn(async move {
            let stream = watcher(Api::<Service>::all(client), watcher::Config::default())
                .default_backoff()
                .applied_objects();
            futures::pin_mut!(stream);
            loop {
                let next = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    n = stream.next() => n,
                };
                match next {
                    Some(Ok(svc)) => me.sync_kube_vip(&svc).await,
                    Some(Err(e)) => tracing::debug!(error = %e, "metal: kube-vip Service watch"),
                    None => return,
                }
            }
        });
    }

    async fn sync_kube_vip(&self, svc: &Service) {
        let a = annotations(svc);
        let spec = svc.spec.as_ref();
        let lb = spec.and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
            && spec.and_then(|s| s.load_balancer_class.as_ref()).is_none();
        // Only Services ccm-rs serves, or whose annotation it wrote, are ever edited.
        if !(lb || a.contains_key(KUBE_VIP_WRITTEN)) {
            return;
        }
        if !a.contains_key(KUBE_VIP_IPS)
            && !a.contains_key(KUBE_VIP_WRITTEN)
            && status_ips(svc).is_empty()
        {
            return;
        }
        let key = crate::lb::key_of(svc);
        let held = self.held(&key).await;
        let want = desired(svc, held.as_deref());
        if let Err(e) = self.patch_kube_vip(svc, &want).await {
            tracing::debug!(service = %key, error = %e, "metal: kube-vip annotation not synced; retried at the next event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        LoadBalancerIngress, LoadBalancerStatus, ServiceSpec, ServiceStatus,
    };

    fn svc(ann: &[(&str, &str)], status: &[&str]) -> Service {
        let mut s = Service::default();
        s.metadata.annotations = Some(
            ann.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        s.spec = Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ..Default::default()
        });
        s.status = Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(
                    status
                        .iter()
                        .map(|ip| LoadBalancerIngress {
                            ip: Some(ip.to_string()),
                            ..Default::default()
                        })
                        .collect(),
                ),
            }),
            ..Default::default()
        });
        s
    }

    #[test]
    fn a_user_request_moves_to_the_ccm_annotation_and_ours_is_output_only() {
        let ip: IpAddr = "192.0.2.10".parse().unwrap();
        let user = svc(&[(KUBE_VIP_IPS, "192.0.2.10")], &[]);
        let p = plan(&user, &[]).expect("patch");
        assert_eq!(
            p["metadata"]["annotations"][ANNOTATION_LOAD_BALANCER_IPS],
            "192.0.2.10"
        );
        assert!(p["metadata"]["annotations"][KUBE_VIP_IPS].is_null());
        let ours = svc(
            &[
                (KUBE_VIP_IPS, "192.0.2.10"),
                (KUBE_VIP_WRITTEN, "192.0.2.10"),
            ],
            &["192.0.2.10"],
        );
        assert!(plan(&ours, &[ip]).is_none());
        assert!(written_by_ccm(&annotations(&ours)));
        assert_eq!(desired(&ours, Some(&[ip])), vec![ip]);
        assert_eq!(
            desired(&ours, None),
            Vec::<IpAddr>::new(),
            "not held: not announced"
        );
    }
}
