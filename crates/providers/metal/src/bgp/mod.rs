//! BGP mode: pod CIDRs announced to the datacenter's routers, next hop = each Node's
//! InternalIP of the prefix's family (IPv4 and IPv6 over one multiprotocol session per
//! router), only while ccm-rs leads. The speaker is BIRD 2 as a supervised child
//! ([`bird`]): ccm-rs writes its config and reloads it; nothing of BGP is implemented here.
//!
//! The announced set is the route controller's view of the cloud: `list_routes` reports it,
//! `create_route`/`delete_route` change it. A term starts with the set computed from the
//! Nodes (so a new leader announces everything at once, and its first End-of-RIB does not
//! flush routes the controller has not re-created yet), and ends by killing the daemon
//! without a withdrawal: with graceful restart the routers keep forwarding on the routes
//! until the next leader announces them, or until their restart timer ends.

pub mod bird;
pub mod config;
pub mod vips;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ccm_cloud::{CloudError, CloudResult, Route};
use ipnet::IpNet;
use parking_lot::RwLock;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio_util::sync::CancellationToken;

use crate::ipam::Pool;
use crate::routes::Target;
use bird::Bird;
use config::BgpSettings;
use vips::{VipRoute, VipService, VipTable};

/// How often the sessions' states are read from the daemon (a local socket, no cloud call).
const SESSION_POLL: Duration = Duration::from_secs(2);

/// Labels of the per-peer session gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerLabels {
    /// The router's address.
    pub peer: String,
}

/// Labels of the announced-prefix gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FamilyLabels {
    /// `IPv4` or `IPv6`.
    pub family: String,
}

/// The BGP metrics, shared with the registry.
#[derive(Clone, Default)]
pub struct BgpMetrics {
    /// `ccm_metal_bgp_session_up{peer}`: 1 while the session is Established.
    pub session_up: Family<PeerLabels, Gauge>,
    /// `ccm_metal_bgp_announced_prefixes{family}`: pod CIDRs in the announced set.
    pub announced: Family<FamilyLabels, Gauge>,
    /// `ccm_metal_bgp_announced_load_balancer_addresses{family}`: LoadBalancer addresses
    /// announced (those with at least one Node to serve them).
    pub announced_vips: Family<FamilyLabels, Gauge>,
    /// `ccm_metal_bgp_load_balancer_paths{family}`: paths (address, Node) announced.
    pub vip_paths: Family<FamilyLabels, Gauge>,
    /// `ccm_metal_bgp_daemon_restarts_total`: unplanned exits of the daemon.
    pub restarts: Counter,
}

/// One announced prefix.
#[derive(Debug, Clone)]
struct Announced {
    gateway: IpAddr,
    target: Target,
}

/// The LoadBalancer addresses a term starts with: the Services' statuses, their Nodes and
/// the EndpointSlices, read from the cluster before the daemon starts.
#[derive(Default)]
pub(crate) struct InitialVips {
    services: Vec<(String, VipService)>,
    slices: Vec<k8s_openapi::api::discovery::v1::EndpointSlice>,
}

/// The speaker's state: the announced set and the daemon.
pub(crate) struct BgpState {
    settings: BgpSettings,
    bird: Bird,
    announced: RwLock<BTreeMap<IpNet, Announced>>,
    /// LoadBalancer addresses (`announce_load_balancers`) and the pools' BGP attributes.
    vips: RwLock<VipTable>,
    pools: RwLock<Vec<Pool>>,
    /// Bumped by each change of `announced`; `applied` is the last one the daemon has.
    changed: AtomicU64,
    applied: AtomicU64,
    apply: tokio::sync::Mutex<()>,
    /// The current term's token: cancelled when it ends (`None`: not leading).
    term: RwLock<Option<CancellationToken>>,
    pub(crate) metrics: BgpMetrics,
    /// Last state reported per peer, so a Warning is written on change only.
    reported: parking_lot::Mutex<BTreeMap<usize, String>>,
}

impl BgpState {
    pub(crate) fn new(settings: &BgpSettings, netns: Option<PathBuf>, pools: Vec<Pool>) -> Self {
        BgpState {
            bird: Bird::new(settings, netns),
            settings: settings.clone(),
            announced: RwLock::new(BTreeMap::new()),
            vips: RwLock::new(VipTable::default()),
            pools: RwLock::new(pools),
            changed: AtomicU64::new(0),
            applied: AtomicU64::new(0),
            apply: tokio::sync::Mutex::new(()),
            term: RwLock::new(None),
            metrics: BgpMetrics::default(),
            reported: parking_lot::Mutex::new(BTreeMap::new()),
        }
    }

    /// Starts a term with `initial` announced (from the Nodes), the daemon and the session
    /// watcher; both end with `shutdown`. `warn` writes a Warning Event (peer, reason, text).
    pub(crate) async fn start_term(
        self: &Arc<Self>,
        initial: Vec<(IpNet, IpAddr, Target)>,
        vips: InitialVips,
        shutdown: CancellationToken,
        warn: Arc<dyn Fn(String, &'static str, String) + Send + Sync>,
    ) {
        {
            let mut a = self.announced.write();
            a.clear();
            for (net, gateway, target) in initial {
                a.insert(net, Announced { gateway, target });
            }
        }
        // What the Services' statuses show, until the service controller ensures each again.
        {
            let mut t = self.vips.write();
            t.clear_services();
            for (key, svc) in vips.services {
                t.set_service(&key, svc);
            }
            t.replace_slices(&vips.slices);
        }
        self.update_gauges();
        if let Err(e) = self
            .bird
            .write_config(&self.next_hops(), &self.vip_routes())
            .await
        {
            tracing::error!(error = %e, "metal bgp: cannot write the BIRD config");
        }
        self.applied
            .store(self.changed.load(Ordering::SeqCst), Ordering::SeqCst);
        *self.term.write() = Some(shutdown.clone());
        let me = self.clone();
        let term = shutdown.clone();
        let restarted = move |why: String| {
            me.metrics.restarts.inc();
            tracing::error!(%why, "metal bgp: the BIRD daemon is not running; restarting it");
        };
        let me = self.clone();
        tokio::spawn(async move { me.bird.supervise(term, restarted).await });
        let me = self.clone();
        tokio::spawn(async move { me.watch_sessions(shutdown, warn).await });
    }

    fn next_hops(&self) -> BTreeMap<IpNet, IpAddr> {
        self.announced
            .read()
            .iter()
            .map(|(n, a)| (*n, a.gateway))
            .collect()
    }

    /// The LoadBalancer addresses to announce, with their next hops.
    fn vip_routes(&self) -> BTreeMap<IpNet, VipRoute> {
        if !self.settings.announce_load_balancers {
            return BTreeMap::new();
        }
        self.vips.read().routes(&self.pools.read())
    }

    fn update_gauges(&self) {
        let set = |g: &Family<FamilyLabels, Gauge>, v4: usize, v6: usize| {
            for (family, n) in [("IPv4", v4), ("IPv6", v6)] {
                g.get_or_create(&FamilyLabels {
                    family: family.into(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        };
        let (v4, v6) = {
            let a = self.announced.read();
            let v4 = a.keys().filter(|n| matches!(n, IpNet::V4(_))).count();
            (v4, a.len() - v4)
        };
        set(&self.metrics.announced, v4, v6);
        if self.settings.announce_load_balancers {
            let vips = self.vip_routes();
            let count = |v4: bool, paths: bool| {
                vips.iter()
                    .filter(|(n, _)| matches!(n, IpNet::V4(_)) == v4)
                    .map(|(_, r)| if paths { r.next_hops.len() } else { 1 })
                    .sum::<usize>()
            };
            set(
                &self.metrics.announced_vips,
                count(true, false),
                count(false, false),
            );
            set(
                &self.metrics.vip_paths,
                count(true, true),
                count(false, true),
            );
        }
    }

    /// Whether LoadBalancer addresses are announced.
    pub(crate) fn announces_load_balancers(&self) -> bool {
        self.settings.announce_load_balancers
    }

    /// The pools' BGP attributes changed (a reload): re-announced with the new ones.
    pub(crate) async fn set_pools(&self, pools: Vec<Pool>) {
        self.change_vips(|_| {}, Some(pools)).await.ok();
    }

    /// Changes the VIP table with `f`; when what is announced changed (and ccm-rs leads), the
    /// daemon gets the new set.
    async fn change_vips(
        &self,
        f: impl FnOnce(&mut VipTable),
        pools: Option<Vec<Pool>>,
    ) -> CloudResult<()> {
        let before = self.vip_routes();
        {
            let mut t = self.vips.write();
            f(&mut t);
        }
        if let Some(p) = pools {
            *self.pools.write() = p;
        }
        if self.vip_routes() == before || self.leading().is_err() {
            self.update_gauges();
            return Ok(());
        }
        self.commit().await
    }

    /// Announces `key`'s addresses for `svc` (empty addresses: withdraws them).
    pub(crate) async fn set_service(&self, key: &str, svc: VipService) -> CloudResult<()> {
        self.change_vips(|t| t.set_service(key, svc), None).await
    }

    /// The Service's entry (its addresses and Nodes), if announced.
    pub(crate) fn service(&self, key: &str) -> Option<VipService> {
        self.vips.read().service(key).cloned()
    }

    /// Withdraws `key`'s addresses.
    pub(crate) async fn remove_service(&self, key: &str) -> CloudResult<()> {
        self.change_vips(|t| t.remove_service(key), None).await
    }

    /// An EndpointSlice event, from the watch of the current term.
    pub(crate) async fn endpoints_changed(&self, f: impl FnOnce(&mut VipTable)) {
        if let Err(e) = self.change_vips(f, None).await {
            // The file is written; a later change or a restarted daemon carries it.
            tracing::warn!(error = %e, "metal bgp: LoadBalancer next hops not reloaded");
        }
    }

    fn leading(&self) -> CloudResult<()> {
        match &*self.term.read() {
            Some(t) if !t.is_cancelled() => Ok(()),
            _ => Err(CloudError::Transient(
                "not leading: nothing is announced".into(),
            )),
        }
    }

    /// The announced set, as routes that name their Node and its addresses.
    pub(crate) fn list(&self) -> CloudResult<Vec<Route>> {
        self.leading()?;
        Ok(self
            .announced
            .read()
            .iter()
            .map(|(net, a)| Route {
                name: net.to_string(),
                target_node: a.target.node.clone(),
                enable_node_addresses: true,
                target_node_addresses: a.target.addresses.clone(),
                destination_cidr: net.to_string(),
                blackhole: false,
            })
            .collect())
    }

    /// Announces `net` via `gateway` (replacing its next hop if announced).
    pub(crate) async fn announce(
        &self,
        net: IpNet,
        gateway: IpAddr,
        target: Target,
    ) -> CloudResult<()> {
        self.leading()?;
        self.announced
            .write()
            .insert(net, Announced { gateway, target });
        self.commit().await
    }

    /// Withdraws `net`; not announced is not an error.
    pub(crate) async fn withdraw(&self, net: IpNet) -> CloudResult<()> {
        self.leading()?;
        if self.announced.write().remove(&net).is_none() {
            return Ok(());
        }
        self.commit().await
    }

    /// Puts the announced set into the daemon. Concurrent changes share one reload: a caller
    /// whose change an earlier reload already carried returns at once.
    async fn commit(&self) -> CloudResult<()> {
        let mine = self.changed.fetch_add(1, Ordering::SeqCst) + 1;
        self.update_gauges();
        let _one = self.apply.lock().await;
        if self.applied.load(Ordering::SeqCst) >= mine {
            return Ok(());
        }
        let upto = self.changed.load(Ordering::SeqCst);
        self.bird
            .write_config(&self.next_hops(), &self.vip_routes())
            .await
            .map_err(|e| CloudError::Transient(format!("writing the BIRD config: {e}")))?;
        self.bird
            .configure()
            .await
            .map_err(|e| CloudError::Transient(format!("reloading BIRD: {e}")))?;
        self.applied.store(upto, Ordering::SeqCst);
        Ok(())
    }

    /// Polls the sessions' states into the gauge; a session that leaves Established, or does
    /// not reach it, gets a Warning naming BIRD's reason (wrong AS, refused, reset, ...).
    async fn watch_sessions(
        &self,
        term: CancellationToken,
        warn: Arc<dyn Fn(String, &'static str, String) + Send + Sync>,
    ) {
        let _ = self.bird.wait_ready(Duration::from_secs(10)).await;
        let mut tick = tokio::time::interval(SESSION_POLL);
        loop {
            tokio::select! {
                _ = term.cancelled() => break,
                _ = tick.tick() => {}
            }
            let sessions = match self.bird.sessions().await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "metal bgp: cannot read the sessions' states");
                    continue;
                }
            };
            for s in sessions {
                let Some(peer) = self.settings.peers.get(s.peer) else {
                    continue;
                };
                let up = s.state == "Established";
                self.metrics
                    .session_up
                    .get_or_create(&PeerLabels {
                        peer: peer.address.to_string(),
                    })
                    .set(i64::from(up));
                let key = format!("{} {}", s.state, s.info);
                let before = self.reported.lock().insert(s.peer, key.clone());
                if before.as_deref() == Some(key.as_str()) {
                    continue;
                }
                if up {
                    tracing::info!(peer = %peer.address, "metal bgp: session established");
                } else if !s.info.is_empty() {
                    let text = format!(
                        "BGP session to {} (AS {}) is {}: {}",
                        peer.address, peer.asn, s.state, s.info
                    );
                    tracing::warn!("metal bgp: {text}");
                    warn(peer.address.to_string(), "BGPSessionDown", text);
                }
            }
        }
        for p in &self.settings.peers {
            self.metrics
                .session_up
                .get_or_create(&PeerLabels {
                    peer: p.address.to_string(),
                })
                .set(0);
        }
    }
}

impl crate::provider::MetalCloud {
    /// A Warning Event about a BGP session. A session belongs to no Kubernetes object; the
    /// Event names the leader-election Lease of the CCM (`kube-system/cloud-controller-manager`,
    /// upstream's default), where an operator looking at the CCM finds it.
    pub(crate) async fn warn_bgp(&self, peer: &str, reason: &str, message: String) {
        use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let Some(client) = self.client() else {
            return;
        };
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let mut ev = Event {
            involved_object: ObjectReference {
                api_version: Some("coordination.k8s.io/v1".into()),
                kind: Some("Lease".into()),
                namespace: Some("kube-system".into()),
                name: Some("cloud-controller-manager".into()),
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(message),
            type_: Some("Warning".into()),
            source: Some(EventSource {
                component: Some("cloud-provider-metal".into()),
                ..Default::default()
            }),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            count: Some(1),
            ..Default::default()
        };
        ev.metadata.generate_name = Some(format!("bgp-{}.", peer.replace([':', '.'], "-")));
        ev.metadata.namespace = Some("kube-system".into());
        if let Err(e) = kube::Api::<Event>::namespaced(client, "kube-system")
            .create(&kube::api::PostParams::default(), &ev)
            .await
        {
            tracing::warn!(error = %e, "metal bgp: cannot write the Warning Event");
        }
    }
}

impl crate::provider::MetalCloud {
    /// The speaker, when it announces LoadBalancer addresses.
    pub(crate) fn vip_speaker(&self) -> Option<&Arc<BgpState>> {
        self.inner
            .routes
            .as_ref()
            .and_then(|r| r.bgp.as_ref())
            .filter(|b| b.announces_load_balancers())
    }

    /// The InternalIPs of `node`, else of its inventory entry.
    fn node_next_hops(&self, node: &ccm_cloud::Node) -> Vec<IpAddr> {
        let internal = |addrs: &mut dyn Iterator<Item = (&str, &str)>| -> Vec<IpAddr> {
            addrs
                .filter(|(t, _)| *t == "InternalIP")
                .filter_map(|(_, a)| a.parse().ok())
                .collect()
        };
        let from_node = internal(
            &mut node
                .status
                .iter()
                .flat_map(|s| s.addresses.iter().flatten())
                .map(|a| (a.type_.as_str(), a.address.as_str())),
        );
        if !from_node.is_empty() {
            return from_node;
        }
        let name = node.metadata.name.as_deref().unwrap_or_default();
        self.config()
            .machine(name)
            .map(|m| {
                internal(
                    &mut m
                        .addresses
                        .iter()
                        .map(|a| (a.type_.as_str(), a.address.as_str())),
                )
            })
            .unwrap_or_default()
    }

    /// What a term announces at once: each served LoadBalancer Service's status addresses via
    /// the load-balancer Nodes (as the service controller chooses them: not being deleted,
    /// not labelled `node.kubernetes.io/exclude-from-external-load-balancers`, not tainted
    /// `ToBeDeletedByClusterAutoscaler`), so a new leader's first End-of-RIB does not flush
    /// the addresses the routers kept from the previous one. Empty when a list fails: the
    /// service controller then announces each Service as it syncs it.
    pub(crate) async fn initial_vips(&self, client: &kube::Client) -> InitialVips {
        use k8s_openapi::api::discovery::v1::EndpointSlice;
        use kube::api::{Api, ListParams};
        if self.vip_speaker().is_none() {
            return InitialVips::default();
        }
        let lp = ListParams::default();
        let lists = futures::future::try_join3(
            Api::<ccm_cloud::Service>::all(client.clone()).list(&lp),
            Api::<ccm_cloud::Node>::all(client.clone()).list(&lp),
            Api::<EndpointSlice>::all(client.clone()).list(&lp),
        )
        .await;
        let (services, nodes, slices) = match lists {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "metal bgp: cannot read the LoadBalancer Services at the term's start; each is announced when the service controller syncs it");
                return InitialVips::default();
            }
        };
        let nodes: Vec<Arc<ccm_cloud::Node>> = nodes
            .items
            .into_iter()
            .filter(in_lb_set)
            .map(Arc::new)
            .collect();
        let services = services
            .items
            .iter()
            .filter(|s| {
                s.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
                    && s.metadata.deletion_timestamp.is_none()
                    && self.serves_class(s)
            })
            .map(|s| {
                let ips = crate::kube_vip::status_ips(s);
                (crate::lb::key_of(s), self.vip_service(s, &ips, &nodes))
            })
            .collect();
        InitialVips {
            services,
            slices: slices.items,
        }
    }

    fn vip_service(
        &self,
        service: &ccm_cloud::Service,
        ips: &[IpAddr],
        nodes: &[Arc<ccm_cloud::Node>],
    ) -> VipService {
        let local = service
            .spec
            .as_ref()
            .and_then(|s| s.external_traffic_policy.as_deref())
            == Some("Local");
        let nodes = nodes
            .iter()
            .filter_map(|n| Some((n.metadata.name.clone()?, self.node_next_hops(n))))
            .collect();
        VipService {
            ips: ips.to_vec(),
            local,
            nodes,
        }
    }

    /// Announces the Service's addresses with the Nodes that can serve it (a no-op unless
    /// `announce_load_balancers`).
    pub(crate) async fn announce_vips(
        &self,
        service: &ccm_cloud::Service,
        ips: &[IpAddr],
        nodes: &[Arc<ccm_cloud::Node>],
    ) -> CloudResult<()> {
        let Some(bgp) = self.vip_speaker() else {
            return Ok(());
        };
        let svc = self.vip_service(service, ips, nodes);
        bgp.set_service(&crate::lb::key_of(service), svc).await
    }

    /// A new load-balancer node set for the Service: its addresses move to those Nodes.
    pub(crate) async fn update_vip_nodes(
        &self,
        service: &ccm_cloud::Service,
        nodes: &[Arc<ccm_cloud::Node>],
    ) -> CloudResult<()> {
        let Some(bgp) = self.vip_speaker() else {
            return Ok(());
        };
        let key = crate::lb::key_of(service);
        let ips = match bgp.service(&key) {
            Some(s) => s.ips,
            None => self.held(&key).await.unwrap_or_default(),
        };
        self.announce_vips(service, &ips, nodes).await
    }

    /// Withdraws the Service's addresses.
    pub(crate) async fn withdraw_vips(&self, service: &ccm_cloud::Service) -> CloudResult<()> {
        match self.vip_speaker() {
            Some(bgp) => bgp.remove_service(&crate::lb::key_of(service)).await,
            None => Ok(()),
        }
    }

    /// Watches EndpointSlices for the term, so `Local` Services' addresses follow their ready
    /// endpoints.
    pub(crate) fn spawn_endpoint_watch(&self, client: kube::Client, shutdown: CancellationToken) {
        use futures::StreamExt as _;
        use k8s_openapi::api::discovery::v1::EndpointSlice;
        use kube::runtime::{WatchStreamExt as _, watcher};
        let Some(bgp) = self.vip_speaker().cloned() else {
            return;
        };
        tokio::spawn(async move {
            let stream = watcher(
                kube::Api::<EndpointSlice>::all(client),
                watcher::Config::default(),
            )
            .default_backoff();
            futures::pin_mut!(stream);
            let mut listing: Vec<EndpointSlice> = Vec::new();
            loop {
                let next = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    n = stream.next() => n,
                };
                match next {
                    Some(Ok(watcher::Event::Apply(s))) => {
                        bgp.endpoints_changed(|t| t.apply_slice(&s)).await
                    }
                    Some(Ok(watcher::Event::Delete(s))) => {
                        bgp.endpoints_changed(|t| t.delete_slice(&s)).await
                    }
                    Some(Ok(watcher::Event::Init)) => listing.clear(),
                    Some(Ok(watcher::Event::InitApply(s))) => listing.push(s),
                    Some(Ok(watcher::Event::InitDone)) => {
                        let all = std::mem::take(&mut listing);
                        bgp.endpoints_changed(|t| t.replace_slices(&all)).await
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "metal bgp: EndpointSlice watch")
                    }
                    None => return,
                }
            }
        });
    }
}

/// Whether the service controller counts `node` in the load-balancer node set (its
/// `node_in_lb_set`): not being deleted, not excluded by label (a value other than a Go
/// `ParseBool` false excludes), not tainted `ToBeDeletedByClusterAutoscaler` or
/// `node.cloudprovider.kubernetes.io/uninitialized`.
fn in_lb_set(node: &ccm_cloud::Node) -> bool {
    let excluded = node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("node.kubernetes.io/exclude-from-external-load-balancers"))
        .is_some_and(|v| !matches!(v.as_str(), "0" | "f" | "F" | "false" | "FALSE" | "False"));
    let to_be_deleted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| {
            t.iter().any(|t| {
                t.key == "ToBeDeletedByClusterAutoscaler"
                    || t.key == "node.cloudprovider.kubernetes.io/uninitialized"
            })
        });
    node.metadata.deletion_timestamp.is_none() && !excluded && !to_be_deleted
}
