//! Request accounting: `apiserver_request_total` with an added `client` label.
//!
//! The benchmark's headline number is API writes per node, per controller; the real metric has
//! no client dimension, so the User-Agent (whole, as sent) is added as `client`. Tests read the
//! same counters through [`Metrics::snapshot`] without parsing text.

use std::collections::HashMap;
use std::fmt::Write as _;

use parking_lot::{Mutex, RwLock, RwLockReadGuard};

/// Request verbs, named as kube-apiserver's authorizer and audit log name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verb {
    /// GET of one object.
    Get,
    /// GET of a collection.
    List,
    /// GET of a collection with `watch=true`.
    Watch,
    /// POST.
    Create,
    /// PUT.
    Update,
    /// PATCH.
    Patch,
    /// DELETE of one object.
    Delete,
}

impl Verb {
    /// The lowercase verb (`get`, `create`, ...), as in RBAC rules and audit events.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "get",
            Self::List => "list",
            Self::Watch => "watch",
            Self::Create => "create",
            Self::Update => "update",
            Self::Patch => "patch",
            Self::Delete => "delete",
        }
    }

    /// The `verb` label value of upstream's `apiserver_request_total` (`GET`, `LIST`, `POST`, ...),
    /// so dashboards written for kube-apiserver read these metrics unchanged.
    pub fn metric_label(self) -> &'static str {
        match self {
            Self::Get => "GET",
            Self::List => "LIST",
            Self::Watch => "WATCH",
            Self::Create => "POST",
            Self::Update => "PUT",
            Self::Patch => "PATCH",
            Self::Delete => "DELETE",
        }
    }

    /// Whether the verb changes state.
    pub fn is_write(self) -> bool {
        matches!(
            self,
            Self::Create | Self::Update | Self::Patch | Self::Delete
        )
    }

    /// Parses either naming.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_lowercase().as_str() {
            "get" => Self::Get,
            "list" => Self::List,
            "watch" => Self::Watch,
            "create" | "post" => Self::Create,
            "update" | "put" => Self::Update,
            "patch" => Self::Patch,
            "delete" => Self::Delete,
            _ => return None,
        })
    }
}

/// One counter's labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestKey {
    /// The verb.
    pub verb: Verb,
    /// API group (empty for core).
    pub group: String,
    /// Plural resource (`nodes`).
    pub resource: String,
    /// Subresource (`status`, `token`) or empty.
    pub subresource: String,
    /// HTTP status code.
    pub code: u16,
    /// The User-Agent header as sent (`unknown` if absent).
    pub client: String,
    /// The authenticated user (`system:serviceaccount:kube-system:node-controller`); kept for
    /// RBAC accounting, not rendered at `/metrics` (upstream has no such label).
    pub user: String,
}

/// One counter in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestCount {
    /// Its labels.
    pub key: RequestKey,
    /// Requests counted.
    pub count: u64,
}

/// The counters.
#[derive(Default)]
pub struct Metrics {
    counts: Mutex<HashMap<RequestKey, u64>>,
    /// Held shared from a request's store operation until it is counted, and exclusively by
    /// [`Self::snapshot`]: a write another client has already seen is always counted, so a
    /// test that waits for an object's change and then counts requests never sees one short.
    visible: RwLock<()>,
}

impl Metrics {
    /// Taken around a request's store operation and its [`Self::record`] (see `visible`).
    pub fn counting(&self) -> RwLockReadGuard<'_, ()> {
        self.visible.read()
    }

    /// Counts one request.
    pub fn record(&self, key: RequestKey) {
        *self.counts.lock().entry(key).or_default() += 1;
    }

    /// All counters, sorted by labels.
    pub fn snapshot(&self) -> Vec<RequestCount> {
        let _all_seen_counted = self.visible.write();
        let mut v: Vec<RequestCount> = self
            .counts
            .lock()
            .iter()
            .map(|(k, c)| RequestCount {
                key: k.clone(),
                count: *c,
            })
            .collect();
        v.sort_by(|a, b| a.key.cmp(&b.key));
        v
    }

    /// Forgets all counts (e.g. between benchmark phases).
    pub fn reset(&self) {
        self.counts.lock().clear();
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP apiserver_request_total Counter of apiserver requests broken out for each verb, group, resource, subresource, client and HTTP response code.\n");
        out.push_str("# TYPE apiserver_request_total counter\n");
        // The user is not a label here: fold counters that differ only by user into one series.
        let mut folded: std::collections::BTreeMap<RequestKey, u64> = Default::default();
        for c in self.snapshot() {
            let key = RequestKey {
                user: String::new(),
                ..c.key
            };
            *folded.entry(key).or_default() += c.count;
        }
        for (k, count) in &folded {
            let scope = "";
            let _ = writeln!(
                out,
                "apiserver_request_total{{client=\"{}\",code=\"{}\",component=\"apiserver\",group=\"{}\",resource=\"{}\",scope=\"{scope}\",subresource=\"{}\",verb=\"{}\",version=\"\"}} {}",
                escape(&k.client),
                k.code,
                escape(&k.group),
                escape(&k.resource),
                escape(&k.subresource),
                k.verb.metric_label(),
                count
            );
        }
        out
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
