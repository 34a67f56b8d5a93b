//! The object store: one lock, one resourceVersion counter, per-kind event history.
//!
//! Every write takes the lock, bumps the global resourceVersion, records the event in the
//! kind's bounded history and publishes it on the kind's broadcast channel — all under the lock,
//! so a watch that snapshots history and subscribes under the same lock sees every event exactly
//! once and in order. Objects are shared `Arc<Value>`s: lists, watch replays and events clone
//! pointers, not documents.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use crate::kinds::{self, Allocator, KindCtx};
use crate::resources::{RESOURCES, ResourceDesc, ids};
use crate::status::{ApiError, FieldError};

/// (namespace, name); the namespace is empty for cluster-scoped kinds. Sorted like etcd keys.
pub type Key = (String, String);

/// Watch event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// `ADDED`.
    Added,
    /// `MODIFIED`.
    Modified,
    /// `DELETED`.
    Deleted,
}

impl EventType {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change, kept in history and fanned out to watchers.
#[derive(Debug)]
pub struct WatchEvent {
    /// resourceVersion of this change.
    pub rv: u64,
    /// What happened.
    pub ty: EventType,
    /// The object after the change (for `DELETED`: its last state, carrying the deletion's RV).
    pub obj: Arc<Value>,
    /// The object before the change, for selector transitions (`MODIFIED` only).
    pub prev: Option<Arc<Value>>,
    line: OnceLock<Bytes>,
}

impl WatchEvent {
    /// The serialized `{"type":..,"object":..}\n` line, computed once and shared by all watchers.
    pub fn line(&self) -> Bytes {
        self.line
            .get_or_init(|| event_line(self.ty.as_str(), &self.obj))
            .clone()
    }
}

/// Serializes one watch event line.
pub fn event_line(ty: &str, obj: &Value) -> Bytes {
    let mut buf = Vec::with_capacity(512);
    buf.extend_from_slice(b"{\"type\":\"");
    buf.extend_from_slice(ty.as_bytes());
    buf.extend_from_slice(b"\",\"object\":");
    // Serializing a `Value` into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut buf, obj);
    buf.extend_from_slice(b"}\n");
    Bytes::from(buf)
}

#[derive(Default)]
struct History {
    events: VecDeque<Arc<WatchEvent>>,
    /// RV of the newest event dropped from the window; watches from below it get 410.
    evicted_rv: u64,
}

struct Inner {
    rv: u64,
    objects: Vec<BTreeMap<Key, Arc<Value>>>,
    history: Vec<History>,
    retention: usize,
    alloc: Allocator,
}

/// Where a new watch starts.
pub enum WatchStart {
    /// Synthetic `ADDED` for the current state, then live (resourceVersion unset or "0").
    Snapshot(Vec<Arc<Value>>),
    /// Replay of retained events after the requested resourceVersion, then live.
    Replay(Vec<Arc<WatchEvent>>),
}

/// Delete preconditions from `DeleteOptions`.
#[derive(Debug, Default, Clone)]
pub struct Preconditions {
    /// `preconditions.uid`.
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub resource_version: Option<String>,
}

/// What a delete did.
pub enum Deleted {
    /// Removed now; the final state.
    Gone(Arc<Value>),
    /// Finalizers remain: `deletionTimestamp` is set and the object stays.
    Pending(Arc<Value>),
}

/// Which endpoint an update arrived on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// The object itself: `status` changes are dropped for kinds with a status subresource.
    Main,
    /// `/status`: `spec` changes are dropped.
    Status,
}

/// What a write does to `metadata.managedFields`.
#[derive(Debug, Clone, Copy)]
pub enum Manage<'a> {
    /// An internal write: the stored entries stay as they are.
    Keep,
    /// A create, update or non-apply patch: an `Update` entry for this writer.
    Update(&'a crate::managed::Writer),
    /// Server-side apply: the caller computed the entries (`crate::apply`).
    Applied,
}

impl Manage<'_> {
    fn record(self, desc: &ResourceDesc, endpoint: Endpoint, old: Option<&Value>, new: &mut Value) {
        if let Manage::Update(w) = self {
            crate::managed::record_update(desc, endpoint, old, new, w);
        }
    }
}

/// The shared store.
pub struct Store {
    inner: Mutex<Inner>,
    senders: Vec<broadcast::Sender<Arc<WatchEvent>>>,
}

/// Current time as kube-apiserver writes timestamps (RFC 3339, seconds, UTC).
pub fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// A random v4 UUID.
pub fn new_uid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn meta(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    match obj.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

fn meta_str<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    meta(obj).and_then(|m| m.get(key)).and_then(Value::as_str)
}

fn finalizers(obj: &Value) -> Vec<String> {
    meta(obj)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

const GENERATE_CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

impl Store {
    /// An empty store with the given history window and service allocator.
    pub fn new(retention: usize, watch_buffer: usize, alloc: Allocator) -> Self {
        let n = RESOURCES.len();
        Self {
            inner: Mutex::new(Inner {
                rv: 0,
                objects: (0..n).map(|_| BTreeMap::new()).collect(),
                history: (0..n).map(|_| History::default()).collect(),
                retention: retention.max(1),
                alloc,
            }),
            senders: (0..n)
                .map(|_| broadcast::channel(watch_buffer.max(16)).0)
                .collect(),
        }
    }

    /// Current global resourceVersion.
    pub fn rv(&self) -> u64 {
        self.inner.lock().rv
    }

    /// Shrinks or grows the history window; shrinking evicts at once.
    pub fn set_retention(&self, n: usize) {
        let mut g = self.inner.lock();
        g.retention = n.max(1);
        let r = g.retention;
        for h in &mut g.history {
            while h.events.len() > r {
                if let Some(e) = h.events.pop_front() {
                    h.evicted_rv = e.rv;
                }
            }
        }
    }

    /// Drops every retained event, so any watch resuming from an older resourceVersion gets 410.
    pub fn compact(&self) {
        let mut g = self.inner.lock();
        let rv = g.rv;
        for h in &mut g.history {
            h.events.clear();
            h.evicted_rv = rv;
        }
    }

    /// Records one change in the kind's history and sends it to its watchers.
    fn commit(
        &self,
        g: &mut Inner,
        res: usize,
        rv: u64,
        ty: EventType,
        obj: &Arc<Value>,
        prev: Option<Arc<Value>>,
    ) {
        let ev = Arc::new(WatchEvent {
            rv,
            ty,
            obj: obj.clone(),
            prev,
            line: OnceLock::new(),
        });
        let retention = g.retention;
        let h = &mut g.history[res];
        h.events.push_back(ev.clone());
        while h.events.len() > retention {
            if let Some(e) = h.events.pop_front() {
                h.evicted_rv = e.rv;
            }
        }
        // No receivers is fine.
        let _ = self.senders[res].send(ev);
    }

    fn check_namespace(g: &Inner, desc: &ResourceDesc, ns: &str) -> Result<(), ApiError> {
        if desc.namespaced
            && !g.objects[ids::NAMESPACES].contains_key(&(String::new(), ns.to_string()))
        {
            return Err(ApiError::not_found(&RESOURCES[ids::NAMESPACES], ns));
        }
        Ok(())
    }

    /// Creates an object (POST).
    pub fn create(&self, res: usize, ns: &str, obj: Value) -> Result<Arc<Value>, ApiError> {
        self.create_opts(res, ns, obj, false)
    }

    /// Creates an object, or with `dry_run` (`?dryRun=All`) validates and defaults it exactly
    /// as a create would and returns the result without storing it.
    pub fn create_opts(
        &self,
        res: usize,
        ns: &str,
        obj: Value,
        dry_run: bool,
    ) -> Result<Arc<Value>, ApiError> {
        self.create_as(res, ns, obj, dry_run, Manage::Keep)
    }

    /// [`Self::create_opts`] recording the writer in `managedFields` as `manage` says.
    pub fn create_as(
        &self,
        res: usize,
        ns: &str,
        mut obj: Value,
        dry_run: bool,
        manage: Manage,
    ) -> Result<Arc<Value>, ApiError> {
        let desc = &RESOURCES[res];
        if !obj.is_object() {
            return Err(ApiError::bad_request("the object provided is unrecognized"));
        }
        let mut g = self.inner.lock();
        Self::check_namespace(&g, desc, ns)?;
        let m = meta_mut(&mut obj);
        let mut name = m
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if name.is_empty()
            && let Some(prefix) = m.get("generateName").and_then(Value::as_str)
            && !prefix.is_empty()
        {
            let suffix: String = (0..5)
                .map(|_| GENERATE_CHARS[rand::random_range(0..GENERATE_CHARS.len())] as char)
                .collect();
            name = format!("{prefix}{suffix}");
        }
        if name.is_empty() {
            return Err(ApiError::invalid(
                desc,
                "",
                &[FieldError::required(
                    "metadata.name",
                    "name or generateName is required",
                )],
            ));
        }
        if desc.namespaced {
            if let Some(body_ns) = m.get("namespace").and_then(Value::as_str)
                && !body_ns.is_empty()
                && body_ns != ns
            {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            m.insert("namespace".into(), Value::String(ns.to_string()));
        } else {
            m.remove("namespace");
        }
        m.insert("name".into(), Value::String(name.clone()));
        let key = (ns.to_string(), name.clone());
        if g.objects[res].contains_key(&key) {
            return Err(ApiError::already_exists(desc, &name));
        }
        m.insert("uid".into(), Value::String(new_uid()));
        m.insert("creationTimestamp".into(), Value::String(now_rfc3339()));
        m.remove("deletionTimestamp");
        m.remove("deletionGracePeriodSeconds");
        if !matches!(manage, Manage::Applied) {
            m.remove("managedFields");
        }
        m.remove("resourceVersion");
        m.remove("selfLink");
        if desc.has_spec {
            m.insert("generation".into(), json!(1));
        } else {
            m.remove("generation");
        }
        set_type_meta(&mut obj, desc);
        let ctx = KindCtx {
            res,
            desc,
            old: None,
            endpoint: Endpoint::Main,
        };
        let inner = &mut *g;
        if dry_run {
            kinds::prepare(&ctx, &mut obj, &mut inner.alloc.clone())?;
            manage.record(desc, Endpoint::Main, None, &mut obj);
            return Ok(Arc::new(obj));
        }
        kinds::prepare(&ctx, &mut obj, &mut inner.alloc)?;
        manage.record(desc, Endpoint::Main, None, &mut obj);
        inner.rv += 1;
        let rv = inner.rv;
        meta_mut(&mut obj).insert("resourceVersion".into(), Value::String(rv.to_string()));
        let obj = Arc::new(obj);
        g.objects[res].insert(key, obj.clone());
        self.commit(&mut g, res, rv, EventType::Added, &obj, None);
        Ok(obj)
    }

    /// The RBAC objects as they are now, read under one lock.
    pub fn rbac_policy(&self) -> crate::rbac::Policy {
        let g = self.inner.lock();
        let all = |res: usize| g.objects[res].values().cloned().collect::<Vec<_>>();
        crate::rbac::Policy {
            cluster_roles: all(ids::CLUSTERROLES),
            cluster_role_bindings: all(ids::CLUSTERROLEBINDINGS),
            roles: all(ids::ROLES),
            role_bindings: all(ids::ROLEBINDINGS),
        }
    }

    /// Reads one object.
    pub fn get(&self, res: usize, ns: &str, name: &str) -> Result<Arc<Value>, ApiError> {
        let g = self.inner.lock();
        g.objects[res]
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
            .ok_or_else(|| ApiError::not_found(&RESOURCES[res], name))
    }

    /// Lists objects in key order after `after`, keeping those `keep` accepts, at most `limit`.
    /// Returns (items, key of the last item if more remain, resourceVersion, remaining count).
    pub fn list(
        &self,
        res: usize,
        ns: Option<&str>,
        after: Option<&Key>,
        only_name: Option<&str>,
        limit: usize,
        keep: &dyn Fn(&Value) -> bool,
    ) -> (Vec<Arc<Value>>, Option<Key>, u64, usize) {
        use std::ops::Bound;
        let g = self.inner.lock();
        let map = &g.objects[res];
        let lower = match (after, ns) {
            (Some(k), _) => Bound::Excluded(k.clone()),
            (None, Some(ns)) => Bound::Included((ns.to_string(), String::new())),
            (None, None) => Bound::Unbounded,
        };
        let mut out = Vec::new();
        let mut next = None;
        let mut remaining = 0usize;
        for (k, v) in map.range((lower, Bound::Unbounded)) {
            if let Some(ns) = ns
                && k.0 != ns
            {
                if k.0.as_str() > ns {
                    break;
                }
                continue;
            }
            if let Some(n) = only_name
                && k.1 != n
            {
                continue;
            }
            if !keep(v) {
                continue;
            }
            if out.len() >= limit {
                remaining += 1;
                continue;
            }
            out.push(v.clone());
            if out.len() == limit {
                next = Some(k.clone());
            }
        }
        if remaining == 0 {
            next = None;
        }
        (out, next, g.rv, remaining)
    }

    /// Updates an object: `f` maps the current object to the requested one (PUT body or patch
    /// result); the store then applies kube-apiserver's update rules. With `dry_run`
    /// (`?dryRun=All`) everything but storing the result.
    pub fn update_opts(
        &self,
        res: usize,
        ns: &str,
        name: &str,
        endpoint: Endpoint,
        f: &mut dyn FnMut(&Value) -> Result<Value, ApiError>,
        dry_run: bool,
    ) -> Result<Arc<Value>, ApiError> {
        self.update_as(res, (ns, name), endpoint, f, dry_run, Manage::Keep)
    }

    /// [`Self::update_opts`] recording the writer in `managedFields` as `manage` says.
    pub fn update_as(
        &self,
        res: usize,
        (ns, name): (&str, &str),
        endpoint: Endpoint,
        f: &mut dyn FnMut(&Value) -> Result<Value, ApiError>,
        dry_run: bool,
        manage: Manage,
    ) -> Result<Arc<Value>, ApiError> {
        let desc = &RESOURCES[res];
        let key = (ns.to_string(), name.to_string());
        let mut g = self.inner.lock();
        let Some(old) = g.objects[res].get(&key).cloned() else {
            return Err(ApiError::not_found(desc, name));
        };
        let mut new = f(&old)?;
        if !new.is_object() {
            return Err(ApiError::bad_request("the object provided is unrecognized"));
        }
        let old_rv = meta_str(&old, "resourceVersion").unwrap_or_default();
        {
            let m = meta_mut(&mut new);
            if let Some(n) = m.get("name").and_then(Value::as_str)
                && !n.is_empty()
                && n != name
            {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
            if desc.namespaced
                && let Some(n) = m.get("namespace").and_then(Value::as_str)
                && !n.is_empty()
                && n != ns
            {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            match m.get("resourceVersion").and_then(Value::as_str) {
                Some(rv) if !rv.is_empty() && rv != old_rv => {
                    return Err(ApiError::conflict(desc, name));
                }
                _ => {}
            }
            if let Some(uid) = m.get("uid").and_then(Value::as_str)
                && !uid.is_empty()
                && Some(uid) != meta_str(&old, "uid")
            {
                return Err(ApiError::conflict_because(
                    desc,
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                        meta_str(&old, "uid").unwrap_or_default()
                    ),
                ));
            }
            let om = meta(&old).cloned().unwrap_or_default();
            m.insert("name".into(), Value::String(name.to_string()));
            if desc.namespaced {
                m.insert("namespace".into(), Value::String(ns.to_string()));
            }
            for k in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "resourceVersion",
            ] {
                match om.get(k) {
                    Some(v) => {
                        m.insert(k.into(), v.clone());
                    }
                    None => {
                        m.remove(k);
                    }
                }
            }
            // A write that sets `managedFields` replaces them (as kubectl's upgrade from
            // client-side apply does); one without them keeps the stored ones.
            let explicit = matches!(manage, Manage::Update(_))
                && m.get("managedFields").is_some_and(Value::is_array);
            if !matches!(manage, Manage::Applied) && !explicit {
                match om.get("managedFields") {
                    Some(v) => m.insert("managedFields".into(), v.clone()),
                    None => m.remove("managedFields"),
                };
            }
            m.remove("selfLink");
        }
        set_type_meta(&mut new, desc);
        if desc.status_subresource {
            let keep = match endpoint {
                Endpoint::Main => "status",
                Endpoint::Status => "spec",
            };
            match old.get(keep) {
                Some(v) => new[keep] = v.clone(),
                None => {
                    if let Some(o) = new.as_object_mut() {
                        o.remove(keep);
                    }
                }
            }
        }
        // Once deletion started, finalizers may only be removed.
        if meta_str(&old, "deletionTimestamp").is_some() {
            let before = finalizers(&old);
            let added: Vec<String> = finalizers(&new)
                .into_iter()
                .filter(|f| !before.contains(f))
                .collect();
            if !added.is_empty() {
                return Err(ApiError::invalid(
                    desc,
                    name,
                    &[FieldError::forbidden(
                        "metadata.finalizers",
                        format!(
                            "no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                        ),
                    )],
                ));
            }
        }
        let ctx = KindCtx {
            res,
            desc,
            old: Some(&old),
            endpoint,
        };
        let inner = &mut *g;
        if dry_run {
            kinds::prepare(&ctx, &mut new, &mut inner.alloc.clone())?;
            manage.record(desc, endpoint, Some(&old), &mut new);
            return Ok(Arc::new(new));
        }
        kinds::prepare(&ctx, &mut new, &mut inner.alloc)?;
        if desc.has_spec && new.get("spec") != old.get("spec") {
            let gen_ = meta(&old)
                .and_then(|m| m.get("generation"))
                .and_then(Value::as_i64)
                .unwrap_or(0);
            meta_mut(&mut new).insert("generation".into(), json!(gen_ + 1));
        }
        manage.record(desc, endpoint, Some(&old), &mut new);
        if new == *old {
            // kube-apiserver skips no-op writes: same resourceVersion, no event.
            return Ok(old);
        }
        inner.rv += 1;
        let rv = inner.rv;
        meta_mut(&mut new).insert("resourceVersion".into(), Value::String(rv.to_string()));
        if meta_str(&new, "deletionTimestamp").is_some() && finalizers(&new).is_empty() {
            // The last finalizer is gone: the object goes with it.
            let obj = Arc::new(new);
            g.objects[res].remove(&key);
            kinds::release(res, &obj, &mut g.alloc);
            self.commit(&mut g, res, rv, EventType::Deleted, &obj, Some(old));
            return Ok(obj);
        }
        let obj = Arc::new(new);
        g.objects[res].insert(key, obj.clone());
        self.commit(&mut g, res, rv, EventType::Modified, &obj, Some(old));
        Ok(obj)
    }

    /// Deletes an object, honouring finalizers and preconditions.
    pub fn delete(
        &self,
        res: usize,
        ns: &str,
        name: &str,
        pre: &Preconditions,
    ) -> Result<Deleted, ApiError> {
        let desc = &RESOURCES[res];
        let key = (ns.to_string(), name.to_string());
        let mut g = self.inner.lock();
        let Some(old) = g.objects[res].get(&key).cloned() else {
            return Err(ApiError::not_found(desc, name));
        };
        if let Some(uid) = &pre.uid {
            let cur = meta_str(&old, "uid").unwrap_or_default();
            if uid != cur {
                return Err(ApiError::conflict_because(
                    desc,
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {cur}"
                    ),
                ));
            }
        }
        if let Some(rv) = &pre.resource_version {
            let cur = meta_str(&old, "resourceVersion").unwrap_or_default();
            if rv != cur {
                return Err(ApiError::conflict_because(
                    desc,
                    name,
                    &format!(
                        "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {cur}"
                    ),
                ));
            }
        }
        if res == ids::NAMESPACES {
            // The namespace controller's cleanup, done at once.
            for (r, d) in RESOURCES.iter().enumerate() {
                if !d.namespaced {
                    continue;
                }
                let keys: Vec<Key> = g.objects[r]
                    .keys()
                    .filter(|k| k.0 == name)
                    .cloned()
                    .collect();
                for k in keys {
                    if let Some(o) = g.objects[r].remove(&k) {
                        self.remove_locked(&mut g, r, o);
                    }
                }
            }
        } else if !finalizers(&old).is_empty() {
            if meta_str(&old, "deletionTimestamp").is_some() {
                return Ok(Deleted::Pending(old));
            }
            let mut new = (*old).clone();
            let m = meta_mut(&mut new);
            m.insert("deletionTimestamp".into(), Value::String(now_rfc3339()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            g.rv += 1;
            let rv = g.rv;
            meta_mut(&mut new).insert("resourceVersion".into(), Value::String(rv.to_string()));
            let obj = Arc::new(new);
            g.objects[res].insert(key, obj.clone());
            self.commit(&mut g, res, rv, EventType::Modified, &obj, Some(old));
            return Ok(Deleted::Pending(obj));
        }
        g.objects[res].remove(&key);
        Ok(Deleted::Gone(self.remove_locked(&mut g, res, old)))
    }

    fn remove_locked(&self, g: &mut Inner, res: usize, old: Arc<Value>) -> Arc<Value> {
        g.rv += 1;
        let rv = g.rv;
        let mut last = (*old).clone();
        meta_mut(&mut last).insert("resourceVersion".into(), Value::String(rv.to_string()));
        let obj = Arc::new(last);
        kinds::release(res, &obj, &mut g.alloc);
        self.commit(g, res, rv, EventType::Deleted, &obj, Some(old));
        obj
    }

    /// Starts a watch atomically with respect to writes: the starting point plus a receiver
    /// that sees every later event.
    pub fn watch(
        &self,
        res: usize,
        from: Option<u64>,
    ) -> Result<(WatchStart, broadcast::Receiver<Arc<WatchEvent>>, u64), ApiError> {
        let g = self.inner.lock();
        let rx = self.senders[res].subscribe();
        let start = match from {
            None => WatchStart::Snapshot(g.objects[res].values().cloned().collect()),
            Some(rv) => {
                let h = &g.history[res];
                if rv < h.evicted_rv {
                    return Err(ApiError::expired(rv, h.evicted_rv));
                }
                WatchStart::Replay(h.events.iter().filter(|e| e.rv > rv).cloned().collect())
            }
        };
        Ok((start, rx, g.rv))
    }

    /// A receiver of the kind's later events and the resourceVersion it starts after, taken
    /// atomically with respect to writes (the watch cache's own subscription).
    pub fn subscribe(&self, res: usize) -> (broadcast::Receiver<Arc<WatchEvent>>, u64) {
        let g = self.inner.lock();
        (self.senders[res].subscribe(), g.rv)
    }

    /// The resourceVersion a bookmark may carry: the global RV if the watcher has drained its
    /// channel (checked under the write lock, so no event can hide behind it), else `last`.
    pub fn bookmark_rv(&self, rx: &broadcast::Receiver<Arc<WatchEvent>>, last: u64) -> u64 {
        let g = self.inner.lock();
        if rx.is_empty() { g.rv.max(last) } else { last }
    }
}

/// Sets `kind` and `apiVersion` as the stored form carries them.
pub fn set_type_meta(obj: &mut Value, desc: &ResourceDesc) {
    if let Some(o) = obj.as_object_mut() {
        o.insert("kind".into(), Value::String(desc.kind.into()));
        o.insert("apiVersion".into(), Value::String(desc.api_version()));
    }
}
