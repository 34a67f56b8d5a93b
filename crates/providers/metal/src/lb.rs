//! LoadBalancer: addresses from the pools, recorded in the Services' status, rebuilt from the
//! cluster before the first allocation of every leadership term.

use std::net::IpAddr;

use std::collections::BTreeSet;

use async_trait::async_trait;
use ccm_cloud::{
    CloudError, CloudResult, LoadBalancer, LoadBalancerStatus, Node, Service, ServiceRequeue,
};
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::LoadBalancerIngress;
use kube::api::{Api, ListParams, Patch, PatchParams};
use parking_lot::Mutex as SyncMutex;

use crate::ipam::{AllocError, Allocator, Pool, Request, request_from};
use crate::provider::MetalCloud;

/// The allocator, `None` until rebuilt from the cluster.
pub(crate) struct LbState {
    alloc: tokio::sync::Mutex<Option<Allocator>>,
    pools: SyncMutex<Vec<Pool>>,
    /// Pool fill, updated after every allocator operation.
    pub(crate) gauges: crate::metrics::PoolGauges,
    /// `(Service, address)` held outside every pool and already reported by an Event.
    orphans: SyncMutex<BTreeSet<(String, IpAddr)>>,
    /// Services whose last ensure found no address for them; changed under the allocator's
    /// lock, so an address freed right after a refusal always requeues the refused Service.
    pending: SyncMutex<BTreeSet<String>>,
    /// Asks the service controller to sync the waiting Services again when an address frees
    /// or the pools change.
    requeue: ServiceRequeue,
}

impl LbState {
    pub(crate) fn new(pools: Vec<Pool>) -> Self {
        LbState {
            alloc: tokio::sync::Mutex::new(None),
            pools: SyncMutex::new(pools),
            orphans: SyncMutex::default(),
            gauges: Default::default(),
            pending: SyncMutex::default(),
            requeue: ServiceRequeue::default(),
        }
    }

    /// New pools; the allocator picks them up at its next operation (held addresses stay).
    pub(crate) fn set_pools(&self, pools: Vec<Pool>) {
        *self.pools.lock() = pools;
    }

    /// The pools in force.
    pub(crate) fn pools(&self) -> parking_lot::MutexGuard<'_, Vec<Pool>> {
        self.pools.lock()
    }

    /// Forget the table: the next operation rebuilds it from the cluster. Waiting Services
    /// are forgotten too: a new term syncs every Service anyway.
    pub(crate) async fn reset(&self) {
        let mut alloc = self.alloc.lock().await;
        *alloc = None;
        self.pending.lock().clear();
    }

    /// Asks the service controller to sync every waiting Service but `except` now.
    pub(crate) fn requeue_pending(&self, except: Option<&str>) {
        let keys: Vec<String> = self
            .pending
            .lock()
            .iter()
            .filter(|k| Some(k.as_str()) != except)
            .cloned()
            .collect();
        if !keys.is_empty() {
            tracing::debug!(
                services = keys.len(),
                "metal: an address may be free; requeueing waiting Services"
            );
            self.requeue.requeue(keys);
        }
    }

    /// Records the outcome of `key`'s ensure (under the allocator's lock) and whether it gave
    /// up any address it kept from others (`before` → now).
    fn settle(
        &self,
        alloc: &Allocator,
        key: &str,
        before: &BTreeSet<IpAddr>,
        waiting: bool,
    ) -> bool {
        {
            let mut pending = self.pending.lock();
            if waiting {
                pending.insert(key.to_string());
            } else {
                pending.remove(key);
            }
        }
        !before.is_subset(&alloc.taken_by(key))
    }
}

pub(crate) fn key_of(svc: &Service) -> String {
    format!(
        "{}/{}",
        svc.metadata.namespace.as_deref().unwrap_or(""),
        svc.metadata.name.as_deref().unwrap_or("")
    )
}

fn is_load_balancer(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
}

fn status_of(ips: &[IpAddr]) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: Some(
            ips.iter()
                .map(|ip| LoadBalancerIngress {
                    ip: Some(ip.to_string()),
                    ip_mode: Some("VIP".into()),
                    ..Default::default()
                })
                .collect(),
        ),
    }
}

/// Requests of every Service that shows addresses, oldest first (ties by key), so the older
/// Service keeps an address two of them show.
pub fn adoption_order(services: &[Service]) -> Vec<Request> {
    let mut shown: Vec<(Option<String>, Request)> = services
        .iter()
        .filter(|s| is_load_balancer(s))
        .filter_map(|s| {
            // A Service whose annotations are now contradictory still holds what it shows.
            let req = request_from(s).unwrap_or_else(|_| Request {
                key: key_of(s),
                current: crate::kube_vip::status_ips(s),
                ..Default::default()
            });
            (!req.current.is_empty()).then(|| {
                let created = s
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0.to_string());
                (created, req)
            })
        })
        .collect();
    shown.sort_by(|a, b| (&a.0, &a.1.key).cmp(&(&b.0, &b.1.key)));
    shown.into_iter().map(|(_, r)| r).collect()
}

impl MetalCloud {
    /// Runs `f` on the allocator, rebuilding it from all Services in the cluster first if this
    /// leadership term has not yet (MetalLB #1774: never allocate before the full picture).
    async fn with_allocator<T>(
        &self,
        f: impl FnOnce(&mut Allocator) -> CloudResult<T>,
    ) -> CloudResult<T> {
        let mut guard = self.inner.lb.alloc.lock().await;
        if guard.is_none() {
            *guard = Some(self.rebuild().await?);
        }
        let alloc = guard
            .as_mut()
            .ok_or_else(|| CloudError::Transient("address table not built yet".into()))?;
        let pools = self.inner.lb.pools.lock().clone();
        if alloc.pools() != pools.as_slice() {
            alloc.set_pools(pools);
        }
        let out = f(alloc);
        crate::metrics::update(&self.inner.lb.gauges, alloc);
        out
    }

    /// The addresses the table holds for `key` (building the table first if needed).
    pub(crate) async fn held(&self, key: &str) -> Option<Vec<IpAddr>> {
        self.with_allocator(|a| Ok(a.held(key).map(<[IpAddr]>::to_vec)))
            .await
            .ok()
            .flatten()
    }

    async fn rebuild(&self) -> CloudResult<Allocator> {
        let client = self.client().ok_or_else(|| {
            CloudError::retry_after(
                std::time::Duration::from_secs(1),
                "metal provider not initialized yet: no API client to rebuild the address table",
            )
        })?;
        let services = Api::<Service>::all(client)
            .list(&ListParams::default())
            .await
            .map_err(|e| {
                CloudError::Transient(format!(
                    "listing Services to rebuild the address table: {e}"
                ))
            })?;
        let mut alloc = Allocator::new(self.inner.lb.pools.lock().clone());
        let mut adopted = 0usize;
        for req in adoption_order(&services.items) {
            match alloc.adopt(&req) {
                Ok(()) => adopted += 1,
                Err(e) => tracing::warn!(service = %req.key, error = %e,
                    "the Service's status shows an address another Service holds; it keeps it but gets no other until the conflict is resolved"),
            }
        }
        // Requests of Services still waiting for an address are kept for them (MetalLB #1984),
        // also those of Services another implementation serves: an address any Service asked
        // for is not handed to another.
        for svc in services.items.iter().filter(|s| is_load_balancer(s)) {
            if let Ok(req) = request_from(svc) {
                alloc.reserve(&req);
            }
        }
        tracing::info!(
            services = services.items.len(),
            adopted,
            "metal: LB address table rebuilt from the cluster"
        );
        Ok(alloc)
    }
}

impl MetalCloud {
    /// After a pool change: one Warning Event per address a Service holds outside every pool
    /// (it keeps the address — nothing moves because a pool changed — but the operator must
    /// know the pool no longer covers it).
    pub(crate) async fn report_orphans(&self) {
        let Ok(orphans) = self
            .with_allocator(|a| {
                Ok(a.holdings()
                    .flat_map(|(k, ips)| ips.iter().map(move |ip| (k.to_string(), *ip)))
                    .filter(|(_, ip)| a.pool_of(*ip).is_none())
                    .collect::<std::collections::BTreeSet<_>>())
            })
            .await
        else {
            return;
        };
        let new: Vec<(String, IpAddr)> = {
            let mut reported = self.inner.lb.orphans.lock();
            reported.retain(|o| orphans.contains(o));
            orphans
                .into_iter()
                .filter(|o| reported.insert(o.clone()))
                .collect()
        };
        for (key, ip) in new {
            if let Err(e) = self.warn_orphan(&key, ip).await {
                tracing::warn!(service = %key, %ip, error = %e, "metal: Event for an address outside every pool not written");
            }
        }
    }

    async fn warn_orphan(&self, key: &str, ip: IpAddr) -> Result<(), kube::Error> {
        let (ns, name) = key.split_once('/').unwrap_or(("default", key));
        self.warn(
            ns,
            "Service",
            name,
            "AddressOutsidePools",
            format!(
                "address {ip} is in no configured pool any more; the Service keeps it, but no pool covers it: add it back to a pool, or request another address"
            ),
        )
        .await
    }

    /// Takes the addresses off a Service that gave them up (kube-vip's annotation first),
    /// so no two Services show one IP:port.
    async fn clear_status(&self, svc: &Service) -> CloudResult<()> {
        if crate::kube_vip::ours_within(svc, &[]).is_some() {
            self.patch_kube_vip(svc, &[]).await?;
        }
        let client = self.client().ok_or_else(|| {
            CloudError::Transient("metal provider not initialized: cannot clear a status".into())
        })?;
        let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
        let name = svc.metadata.name.as_deref().unwrap_or("");
        let patch = serde_json::json!({"status": {"loadBalancer": {"ingress": null}}});
        Api::<Service>::namespaced(client, ns)
            .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map(|_| ())
            .map_err(|e| CloudError::Transient(format!("clearing the status of {ns}/{name}: {e}")))
    }
}

/// Whether `svc` shows (in its status) the address that `err` says another Service holds.
fn shows_held_elsewhere(svc: &Service, err: &AllocError) -> bool {
    matches!(err, AllocError::InUse { ip, .. } if crate::kube_vip::status_ips(svc).contains(ip))
}

/// A Service waiting for an address (pool full, address held, no pool yet) is not polled: the
/// provider requeues it through [`LoadBalancer::service_requeues`] the moment an address frees
/// or the pools change, and the controller's per-Service backoff (5 s → 300 s) is the fallback
/// for what the provider cannot see (a label edit that makes a pool's selector match).
fn to_cloud(e: AllocError) -> CloudError {
    match e {
        // Only an edit of the Service fixes it, and an edit is an event of its own.
        AllocError::Invalid(_) => CloudError::Permanent(e.to_string()),
        _ => CloudError::Transient(e.to_string()),
    }
}

/// Whether a refusal leaves the Service waiting for an address someone else may free.
fn is_waiting(e: &AllocError) -> bool {
    !matches!(e, AllocError::Invalid(_))
}

#[async_trait]
impl LoadBalancer for MetalCloud {
    async fn get_load_balancer(
        &self,
        _cluster: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        let key = key_of(service);
        let pending = &self.inner.lb.pending;
        self.with_allocator(|a| {
            Ok(match a.held(&key) {
                Some(ips) => Some(status_of(ips)),
                // A waiting Service's claim on a requested address is state to clean up too:
                // "exists", so the controller's delete path calls ensure_load_balancer_deleted.
                None if !a.taken_by(&key).is_empty() || pending.lock().contains(&key) => {
                    Some(LoadBalancerStatus::default())
                }
                None => None,
            })
        })
        .await
    }

    async fn ensure_load_balancer(
        &self,
        _cluster: &str,
        service: &Service,
        nodes: &[std::sync::Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        let req = request_from(service).map_err(to_cloud)?;
        let lb = &self.inner.lb;
        let (result, freed, holds_nothing) = self
            .with_allocator(|a| {
                let before = a.taken_by(&req.key);
                let result = a.assign(&req);
                let waiting = result.as_ref().err().is_some_and(is_waiting);
                let freed = lb.settle(a, &req.key, &before, waiting);
                Ok((result, freed, a.held(&req.key).is_none()))
            })
            .await?;
        if freed {
            // A changed request, a dropped claim, a sharer giving its address up.
            lb.requeue_pending(Some(&req.key));
        }
        let ips = match result {
            Ok(ips) => ips,
            // Gave its addresses up now, or earlier with a clean-up that failed (a conflict on
            // kube-vip's annotation): a Service must not show an address another Service
            // holds, or two Services show one IP:port. (An address that left the pools stays
            // shown: that LB keeps serving.)
            Err(e)
                if matches!(e, AllocError::Released(_))
                    || holds_nothing && shows_held_elsewhere(service, &e) =>
            {
                self.withdraw_vips(service).await?;
                self.clear_status(service).await?;
                return Err(to_cloud(e));
            }
            Err(e) => return Err(to_cloud(e)),
        };
        tracing::debug!(service = %req.key, ?ips, "metal: addresses assigned");
        // kube-vip's annotation shrinks before the status does; it grows after (kube_vip).
        if let Some(keep) = crate::kube_vip::ours_within(service, &ips) {
            self.patch_kube_vip(service, &keep).await?;
        }
        // routes.bgp.announce_load_balancers: announced before the status shows them.
        self.announce_vips(service, &ips, nodes).await?;
        Ok(status_of(&ips))
    }

    /// Nothing to do for kube-vip or MetalLB, which follow the Nodes themselves; with
    /// `routes.bgp.announce_load_balancers`, the addresses' next hops move to the new set.
    async fn update_load_balancer(
        &self,
        _cluster: &str,
        service: &Service,
        nodes: &[std::sync::Arc<Node>],
    ) -> CloudResult<()> {
        self.update_vip_nodes(service, nodes).await
    }

    async fn ensure_load_balancer_deleted(
        &self,
        _cluster: &str,
        service: &Service,
    ) -> CloudResult<()> {
        let key = key_of(service);
        // Not announced any more before the address is free for another Service.
        if crate::kube_vip::ours_within(service, &[]).is_some() {
            self.patch_kube_vip(service, &[]).await?;
        }
        self.withdraw_vips(service).await?;
        let lb = &self.inner.lb;
        let freed = self
            .with_allocator(|a| {
                let before = a.taken_by(&key);
                a.forget(&key);
                Ok(lb.settle(a, &key, &before, false))
            })
            .await?;
        if freed {
            lb.requeue_pending(Some(&key));
        }
        Ok(())
    }

    fn load_balancer_class(&self) -> Option<String> {
        self.inner.class.clone()
    }

    fn service_requeues(&self) -> Option<BoxStream<'static, String>> {
        Some(self.inner.lb.requeue.subscribe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::Family;

    #[test]
    fn waiting_services_are_not_polled_but_keep_the_controller_backoff() {
        let full = AllocError::Exhausted {
            pools: vec!["public".into()],
            family: Family::V4,
        };
        assert!(is_waiting(&full));
        // Not a fixed-delay Retry: the requeue hook wakes it, the backoff is the fallback.
        let e = to_cloud(full);
        assert!(matches!(e, CloudError::Transient(_)), "{e:?}");
        assert!(full_text_has_pool(&e));
        assert!(!is_waiting(&AllocError::Invalid("x".into())));
        assert!(matches!(
            to_cloud(AllocError::Invalid("x".into())),
            CloudError::Permanent(_)
        ));
    }

    fn full_text_has_pool(e: &CloudError) -> bool {
        e.to_string().contains("\"public\"")
    }
}
