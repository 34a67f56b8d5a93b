//! One watch per resource, shared by every controller: a cache plus change notifications.
//!
//! kube-runtime's reflector gives a store, and its shared-stream variant is still unstable; the
//! CCM needs what client-go's SharedInformer gives: one Node watch feeding four controllers,
//! each told `(old, new)` so it can decide cheaply whether a change concerns it (the route
//! controller cares about podCIDRs, the service controller about exclusion labels).
//!
//! Objects are stored behind `Arc` after a transform that drops what no controller reads
//! (`managedFields`, node images), which is most of a Node's size. Because of that, controllers
//! must write with patches, never by PUT-ing a cached object back.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Resource, ResourceExt};
use parking_lot::{Mutex, RwLock};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

pub mod slim;

/// A change to one cached object: `old: None` is an add, `new: None` a delete.
#[derive(Debug)]
pub struct Change<K> {
    /// The object before the change, if it was cached.
    pub old: Option<Arc<K>>,
    /// The object after the change, if it still exists.
    pub new: Option<Arc<K>>,
}

impl<K> Clone for Change<K> {
    fn clone(&self) -> Self {
        Change {
            old: self.old.clone(),
            new: self.new.clone(),
        }
    }
}

/// Cache key: `namespace/name` for namespaced objects, `name` otherwise (as client-go).
pub fn object_key<K: Resource>(obj: &K) -> String {
    let meta = obj.meta();
    match &meta.namespace {
        Some(ns) if !ns.is_empty() => format!("{ns}/{}", meta.name.as_deref().unwrap_or("")),
        _ => meta.name.clone().unwrap_or_default(),
    }
}

type Transform<K> = Arc<dyn Fn(&mut K) + Send + Sync>;
type Keep<K> = Arc<dyn Fn(&K) -> bool + Send + Sync>;

struct Inner<K> {
    store: RwLock<HashMap<String, Arc<K>>>,
    subscribers: Mutex<Vec<mpsc::UnboundedSender<Change<K>>>>,
    ready: watch::Sender<bool>,
    transform: Transform<K>,
    keep: Keep<K>,
}

/// A shared cache of one resource kind with change fan-out.
pub struct Informer<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for Informer<K> {
    fn clone(&self) -> Self {
        Informer {
            inner: self.inner.clone(),
        }
    }
}

impl<K> Default for Informer<K>
where
    K: Resource + Clone + Send + Sync + 'static,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<K> Informer<K>
where
    K: Resource + Clone + Send + Sync + 'static,
{
    /// An empty cache that stores objects as received, minus `managedFields`.
    pub fn new() -> Self {
        Self::with_transform(|obj: &mut K| {
            obj.meta_mut().managed_fields = None;
        })
    }

    /// An empty cache applying `transform` to each object before storing it (to drop fields no
    /// controller reads).
    pub fn with_transform(transform: impl Fn(&mut K) + Send + Sync + 'static) -> Self {
        Self::with_transform_keeping(transform, |_| true)
    }

    /// [`Informer::with_transform`], caching only the objects `keep` accepts (after the
    /// transform): most of a cluster's Services are of no concern to any controller, and even
    /// trimmed each cost a kilobyte. An object that stops being kept leaves the cache, and its
    /// subscribers see it as an update (`old` cached, `new` the object as it now is): it still
    /// exists. One that was never kept is never seen.
    pub fn with_transform_keeping(
        transform: impl Fn(&mut K) + Send + Sync + 'static,
        keep: impl Fn(&K) -> bool + Send + Sync + 'static,
    ) -> Self {
        Informer {
            inner: Arc::new(Inner {
                store: RwLock::default(),
                subscribers: Mutex::default(),
                ready: watch::channel(false).0,
                transform: Arc::new(transform),
                keep: Arc::new(keep),
            }),
        }
    }

    /// Receives every later change. Objects already cached arrive first as adds, so a
    /// controller that subscribes late sees the same world as one that subscribed early.
    pub fn subscribe(&self) -> mpsc::UnboundedReceiver<Change<K>> {
        let (tx, rx) = mpsc::unbounded_channel();
        // Hold the store lock while registering so no change slips between snapshot and feed.
        let store = self.inner.store.read();
        for obj in store.values() {
            let _ = tx.send(Change {
                old: None,
                new: Some(obj.clone()),
            });
        }
        self.inner.subscribers.lock().push(tx);
        drop(store);
        rx
    }

    /// The cached object with this key.
    pub fn get(&self, key: &str) -> Option<Arc<K>> {
        self.inner.store.read().get(key).cloned()
    }

    /// Every cached object.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.inner.store.read().values().cloned().collect()
    }

    /// Number of cached objects.
    pub fn len(&self) -> usize {
        self.inner.store.read().len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True once the first full list has been received.
    pub fn is_ready(&self) -> bool {
        *self.inner.ready.borrow()
    }

    /// Waits until the first full list has been received: controllers must not act on a
    /// partial view (deleting routes for nodes "missing" from half a list, say).
    pub async fn wait_ready(&self) {
        let mut rx = self.inner.ready.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }

    fn notify(&self, change: Change<K>) {
        self.inner
            .subscribers
            .lock()
            .retain(|tx| tx.send(change.clone()).is_ok());
    }

    /// Adds or replaces one object, notifying subscribers. The watch loop uses it; tests may too.
    pub fn apply(&self, mut obj: K) {
        (self.inner.transform)(&mut obj);
        let key = object_key(&obj);
        let keep = (self.inner.keep)(&obj);
        let new = Arc::new(obj);
        let mut store = self.inner.store.write();
        if !keep {
            if let Some(old) = store.remove(&key) {
                self.notify(Change {
                    old: Some(old),
                    new: Some(new),
                });
            }
            return;
        }
        let old = store.insert(key, new.clone());
        // Unchanged resourceVersion (a re-list of the same object) is not a change.
        if let Some(o) = &old
            && o.meta().resource_version.is_some()
            && o.meta().resource_version == new.meta().resource_version
        {
            return;
        }
        self.notify(Change {
            old,
            new: Some(new),
        });
    }

    /// Removes one object, notifying subscribers.
    pub fn delete(&self, obj: &K) {
        let key = object_key(obj);
        let mut store = self.inner.store.write();
        if let Some(old) = store.remove(&key) {
            self.notify(Change {
                old: Some(old),
                new: None,
            });
        }
    }

    /// Replaces the whole cache with `objects` (a fresh list), notifying subscribers of each
    /// difference, then marks the cache ready.
    pub fn replace(&self, objects: Vec<K>) {
        let mut fresh = HashMap::with_capacity(objects.len());
        for obj in objects {
            self.insert_trimmed(&mut fresh, obj);
        }
        self.replace_trimmed(fresh);
    }

    /// Adds `obj` to a fresh list after the transform, if it is kept — or, when the cache holds
    /// the same version of it, the cached object itself: a re-list (a watch that ended during a
    /// burst, a 410 on resume) then costs the new list's keys and the objects that changed,
    /// not a second copy of every object held until the swap.
    fn insert_trimmed(&self, fresh: &mut HashMap<String, Arc<K>>, mut obj: K) {
        let key = object_key(&obj);
        if let Some(rv) = obj.meta().resource_version.as_deref()
            && let Some(cached) = self.inner.store.read().get(&key)
            && cached.meta().resource_version.as_deref() == Some(rv)
        {
            fresh.insert(key, cached.clone());
            return;
        }
        (self.inner.transform)(&mut obj);
        if (self.inner.keep)(&obj) {
            fresh.insert(key, Arc::new(obj));
        }
    }

    /// [`Informer::replace`] with a list already transformed and keyed.
    fn replace_trimmed(&self, fresh: HashMap<String, Arc<K>>) {
        let mut store = self.inner.store.write();
        let old_store = std::mem::take(&mut *store);
        for (key, new) in &fresh {
            let old = old_store.get(key).cloned();
            let unchanged = old.as_ref().is_some_and(|o| {
                o.meta().resource_version.is_some()
                    && o.meta().resource_version == new.meta().resource_version
            });
            if !unchanged {
                self.notify(Change {
                    old,
                    new: Some(new.clone()),
                });
            }
        }
        for (key, old) in old_store {
            if !fresh.contains_key(&key) {
                self.notify(Change {
                    old: Some(old),
                    new: None,
                });
            }
        }
        *store = fresh;
        drop(store);
        self.inner.ready.send_replace(true);
    }

    /// Watches `api` until `shutdown`, keeping the cache current. Watch errors (410 Gone,
    /// disconnects) are retried with backoff by kube-runtime, which re-lists as needed. `W` is
    /// what the objects are decoded into: `K` itself, or a [`slim`] type that skips at decoding
    /// what the transform would drop.
    pub async fn run<W>(self, api: Api<W>, config: watcher::Config, shutdown: CancellationToken)
    where
        K: Debug,
        K::DynamicType: Default,
        W: Resource + Into<K> + Clone + DeserializeOwned + Debug + Send + 'static,
        W::DynamicType: Default,
    {
        let stream = watcher::watcher(api, config).default_backoff();
        futures::pin_mut!(stream);
        let mut relist: Option<HashMap<String, Arc<K>>> = None;
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => return,
                next = stream.next() => next,
            };
            match next {
                None => return,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, kind = %K::kind(&Default::default()), "watch failed; retrying")
                }
                Some(Ok(Event::Init)) => relist = Some(HashMap::new()),
                Some(Ok(Event::InitApply(obj))) => {
                    if let Some(list) = relist.as_mut() {
                        // Trimmed as it arrives: a re-list of 50,000 kubelet Nodes held whole
                        // (managedFields, images) until the last page is hundreds of megabytes.
                        self.insert_trimmed(list, obj.into());
                    }
                }
                Some(Ok(Event::InitDone)) => {
                    let list = relist.take().unwrap_or_default();
                    tracing::debug!(count = list.len(), kind = %K::kind(&Default::default()), "cache (re)listed");
                    self.replace_trimmed(list);
                }
                Some(Ok(Event::Apply(obj))) => self.apply(obj.into()),
                Some(Ok(Event::Delete(obj))) => self.delete(&obj.into()),
            }
        }
    }
}

/// Drops the parts of a Node no controller reads, so 5,000 cached Nodes stay small:
/// `managedFields` and, of the status, everything but addresses and conditions (the image
/// list, capacity, allocatable, system info, attached volumes, daemon endpoints…), which is
/// most of a kubelet's Node. The controllers read metadata, spec, addresses and conditions
/// only; they write with patches, so the dropped fields are never written back.
pub fn trim_node(node: &mut k8s_openapi::api::core::v1::Node) {
    node.metadata.managed_fields = None;
    if let Some(annotations) = node.metadata.annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
    if let Some(status) = node.status.take() {
        node.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            addresses: status.addresses,
            conditions: status.conditions,
            ..Default::default()
        });
    }
}

/// Drops `managedFields` and kubectl's last-applied annotation from a Service, and all but
/// its identity and type from a Service the service controller has no business with: not
/// `type: LoadBalancer`, without the controller's finalizer and without a load-balancer
/// ingress in its status. Most of a cluster's Services are such (ClusterIP), and whole they
/// were half of the cache at 50,000 Services. Nothing reads the dropped parts: such a Service
/// is never synced, and when it becomes a LoadBalancer the update carries the whole object.
pub fn trim_service(svc: &mut k8s_openapi::api::core::v1::Service) {
    use k8s_openapi::api::core::v1::ServiceSpec;
    svc.metadata.managed_fields = None;
    if let Some(annotations) = svc.metadata.annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
    if concerns_service_controller(svc) {
        return;
    }
    let type_ = svc.spec.as_ref().and_then(|s| s.type_.clone());
    let meta = &mut svc.metadata;
    (meta.labels, meta.annotations, meta.owner_references) = (None, None, None);
    svc.spec = Some(ServiceSpec {
        type_,
        ..Default::default()
    });
    svc.status = None;
}

/// Whether the service controller has business with `svc`: `type: LoadBalancer`, or carrying
/// its finalizer or a load-balancer ingress (an LB to clean up). Only such Services are cached.
pub fn concerns_service_controller(svc: &k8s_openapi::api::core::v1::Service) -> bool {
    use crate::service::planner::{current_status, has_finalizer};
    let has_ingress = current_status(svc)
        .and_then(|l| l.ingress.as_ref())
        .is_some_and(|i| !i.is_empty());
    let type_ = svc.spec.as_ref().and_then(|s| s.type_.as_deref());
    type_ == Some("LoadBalancer") || has_finalizer(svc) || has_ingress
}

/// The name of an object, empty if unset.
pub fn name_of<K: Resource>(obj: &K) -> String {
    obj.name_any()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;

    /// A Node as a kubelet registers it on a real cluster (abridged from `kubectl get node -o
    /// json`): the parts no controller reads are most of it.
    fn kubelet_node() -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "n1", "resourceVersion": "7", "uid": "u1",
                "labels": {"kubernetes.io/hostname": "n1", "node.kubernetes.io/exclude-from-external-load-balancers": "true"},
                "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kubectl.kubernetes.io/last-applied-configuration": "{}"},
                "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:images": {}}}}],
            },
            "spec": {"podCIDR": "10.0.1.0/24", "podCIDRs": ["10.0.1.0/24"], "providerID": "sim://n1",
                     "taints": [{"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}]},
            "status": {
                "addresses": [{"type": "InternalIP", "address": "10.1.0.1"}, {"type": "Hostname", "address": "n1"}],
                "conditions": [{"type": "Ready", "status": "True"}, {"type": "NetworkUnavailable", "status": "True"}],
                "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"},
                "allocatable": {"cpu": "3800m", "memory": "15Gi", "pods": "110"},
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "6.1", "osImage": "Debian",
                             "containerRuntimeVersion": "containerd://2.0", "kubeletVersion": "v1.36.0", "kubeProxyVersion": "",
                             "operatingSystem": "linux", "architecture": "amd64"},
                "images": [{"names": ["registry.k8s.io/pause:3.10"], "sizeBytes": 320000}],
                "volumesInUse": ["kubernetes.io/csi/ebs^vol-1"],
                "volumesAttached": [{"name": "kubernetes.io/csi/ebs^vol-1", "devicePath": ""}],
                "runtimeHandlers": [{"name": "runc", "features": {"recursiveReadOnlyMounts": true}}],
                "features": {"supplementalGroupsPolicy": true},
                "declaredFeatures": ["InPlacePodVerticalScaling"],
            },
        }))
        .expect("node json")
    }

    #[test]
    fn a_relist_shares_the_cached_objects_it_did_not_change() {
        let cache: Informer<Node> = Informer::with_transform(trim_node);
        let mut other = kubelet_node();
        other.metadata.name = Some("n2".into());
        cache.replace(vec![kubelet_node(), other.clone()]);
        let (n1, n2) = (cache.get("n1").expect("n1"), cache.get("n2").expect("n2"));
        let mut changes = cache.subscribe();
        while changes.try_recv().is_ok() {}

        other.metadata.resource_version = Some("8".into());
        cache.replace(vec![kubelet_node(), other]);
        assert!(
            Arc::ptr_eq(&n1, &cache.get("n1").expect("n1")),
            "the same version: the cached object, not a copy"
        );
        let n2_new = cache.get("n2").expect("n2");
        assert!(!Arc::ptr_eq(&n2, &n2_new), "a new version is a new object");
        assert!(
            n2_new.status.as_ref().is_some_and(|s| s.images.is_none()),
            "trimmed"
        );
        let change = changes.try_recv().expect("the changed Node is announced");
        assert_eq!(
            change.new.and_then(|n| n.metadata.name.clone()).as_deref(),
            Some("n2")
        );
        assert!(changes.try_recv().is_err(), "the unchanged one is not");
    }

    #[test]
    fn the_node_cache_keeps_what_controllers_read_and_drops_the_rest() {
        let cache: Informer<Node> = Informer::with_transform(trim_node);
        cache.apply(kubelet_node());
        let node = cache.get("n1").expect("cached");
        // Kept: what the controllers read.
        assert_eq!(node.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(node.metadata.uid.as_deref(), Some("u1"));
        assert_eq!(node.metadata.labels.as_ref().map(|l| l.len()), Some(2));
        assert!(
            node.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("node.alpha.kubernetes.io/ttl"))
        );
        let spec = node.spec.as_ref().expect("spec");
        assert_eq!(spec.provider_id.as_deref(), Some("sim://n1"));
        assert_eq!(spec.pod_cidrs.as_ref().map(Vec::len), Some(1));
        assert_eq!(spec.taints.as_ref().map(Vec::len), Some(1));
        let status = node.status.as_ref().expect("status");
        assert_eq!(status.addresses.as_ref().map(Vec::len), Some(2));
        assert_eq!(status.conditions.as_ref().map(Vec::len), Some(2));
        // Dropped: managedFields, kubectl's copy, and the status no controller reads.
        assert!(node.metadata.managed_fields.is_none());
        assert!(
            node.metadata.annotations.as_ref().is_some_and(
                |a| !a.contains_key("kubectl.kubernetes.io/last-applied-configuration")
            )
        );
        let status = serde_json::to_value(status).expect("serialize");
        let kept: Vec<&String> = status.as_object().expect("object").keys().collect();
        assert_eq!(
            kept,
            ["addresses", "conditions"],
            "status fields kept in the cache"
        );
    }

    fn service(type_: &str, finalizer: bool, ingress: bool) -> k8s_openapi::api::core::v1::Service {
        let finalizers: Vec<&str> = if finalizer {
            vec![crate::service::planner::LOAD_BALANCER_CLEANUP_FINALIZER]
        } else {
            vec![]
        };
        let ingress: Vec<serde_json::Value> = if ingress {
            vec![serde_json::json!({"ip": "192.0.2.1"})]
        } else {
            vec![]
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u1", "resourceVersion": "3",
                         "finalizers": finalizers,
                         "labels": {"app": "web"},
                         "annotations": {"service.beta.kubernetes.io/aws-load-balancer-type": "nlb",
                                         "meta.helm.sh/release-name": "web"}},
            "spec": {"type": type_, "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}],
                     "selector": {"app": "web"}, "clusterIP": "10.96.0.10"},
            "status": {"loadBalancer": {"ingress": ingress}},
        }))
        .expect("service json")
    }

    #[test]
    fn a_service_the_controller_may_act_on_is_cached_whole() {
        for (type_, finalizer, ingress) in [
            ("LoadBalancer", false, false),
            ("ClusterIP", true, false),
            ("NodePort", false, true),
        ] {
            let mut svc = service(type_, finalizer, ingress);
            trim_service(&mut svc);
            let spec = svc.spec.as_ref().expect("spec");
            assert_eq!(spec.ports.as_ref().map(Vec::len), Some(1), "{type_}");
            assert!(
                svc.metadata.annotations.as_ref().is_some_and(
                    |a| a.contains_key("service.beta.kubernetes.io/aws-load-balancer-type")
                ),
                "{type_}: a provider's delete reads the annotations"
            );
        }
    }

    #[test]
    fn a_cluster_ip_service_is_cached_as_its_identity_and_type() {
        let mut svc = service("ClusterIP", false, false);
        trim_service(&mut svc);
        assert_eq!(svc.metadata.uid.as_deref(), Some("u1"));
        assert_eq!(svc.metadata.resource_version.as_deref(), Some("3"));
        assert_eq!(
            svc.spec.as_ref().and_then(|s| s.type_.as_deref()),
            Some("ClusterIP")
        );
        assert!(svc.metadata.annotations.is_none() && svc.metadata.labels.is_none());
        assert!(svc.spec.as_ref().is_some_and(|s| s.ports.is_none()));
        assert!(svc.status.is_none());
    }

    fn services_cache() -> Informer<k8s_openapi::api::core::v1::Service> {
        Informer::with_transform_keeping(trim_service, concerns_service_controller)
    }

    fn with_rv(
        mut svc: k8s_openapi::api::core::v1::Service,
        rv: &str,
    ) -> k8s_openapi::api::core::v1::Service {
        svc.metadata.resource_version = Some(rv.into());
        svc
    }

    /// Most of a cluster's Services are ClusterIP: none is cached or announced, and a load
    /// balancer that turns ClusterIP leaves the cache as an update, so its LB gets cleaned up.
    #[test]
    fn only_services_the_controller_acts_on_are_cached() {
        let cache = services_cache();
        let mut rx = cache.subscribe();
        cache.apply(service("ClusterIP", false, false));
        assert!(
            cache.is_empty() && rx.try_recv().is_err(),
            "ClusterIP: nothing"
        );
        cache.apply(with_rv(service("LoadBalancer", false, false), "4"));
        assert_eq!(cache.len(), 1);
        let add = rx.try_recv().expect("add");
        assert!(add.old.is_none() && add.new.is_some());
        cache.apply(with_rv(service("ClusterIP", false, false), "5"));
        assert!(cache.get("default/web").is_none(), "no longer cached");
        let left = rx.try_recv().expect("update");
        let type_of = |s: &Option<Arc<k8s_openapi::api::core::v1::Service>>| {
            s.as_ref()
                .and_then(|s| s.spec.as_ref())
                .and_then(|s| s.type_.clone())
        };
        assert_eq!(type_of(&left.old).as_deref(), Some("LoadBalancer"));
        assert_eq!(type_of(&left.new).as_deref(), Some("ClusterIP"));
        cache.apply(with_rv(service("ClusterIP", false, false), "6"));
        assert!(
            rx.try_recv().is_err(),
            "an uncached Service's changes are not announced"
        );
        // A re-list keeps only what concerns the controller: a finalizer still does.
        let mut db = service("NodePort", false, false);
        db.metadata.name = Some("db".into());
        cache.replace(vec![with_rv(service("ClusterIP", true, false), "7"), db]);
        assert!(cache.get("default/web").is_some() && cache.get("default/db").is_none());
    }
}
