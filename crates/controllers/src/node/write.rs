//! Optimistic-concurrency Node writes, shared by the cloud-node and lifecycle controllers.
//!
//! The cache holds trimmed Nodes, so writes are merge patches; and because the kubelet writes
//! the same Node concurrently, each patch carries the `metadata.resourceVersion` it was
//! computed from. A stale one is refused with 409 Conflict: the Node is re-read from the API and
//! the patch recomputed from the fresh object, so a concurrent write is never overwritten.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::Value;

use crate::informer::slim::SlimNode;

/// How many 409 Conflicts one write tolerates before giving up (and being retried with the
/// key's backoff). Upstream retries 5 (labels/taints) to 20 (initialization) times.
pub const MAX_CONFLICTS: u32 = 10;

/// Which part of the Node a patch goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The object (metadata and spec).
    Object,
    /// The `status` subresource.
    Status,
}

/// True for a 409 Conflict from the API server.
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_conflict())
}

/// True for a 404 Not Found from the API server.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_not_found())
}

/// Sends one merge patch guarded by `node`'s resourceVersion and returns the updated Node,
/// trimmed as the cache's.
pub async fn send(
    api: &Api<Node>,
    node: &Node,
    target: Target,
    mut patch: Value,
) -> Result<Node, kube::Error> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    if let Some(rv) = &node.metadata.resource_version {
        patch["metadata"]["resourceVersion"] = Value::String(rv.clone());
    }
    let pp = PatchParams::default();
    // The reply is the whole Node; decoded slim (what the cache keeps), which is all any
    // caller reads of it.
    let slim = Api::<SlimNode>::all(api.clone().into_client());
    let updated = match target {
        Target::Object => slim.patch(name, &pp, &Patch::Merge(&patch)).await,
        Target::Status => slim.patch_status(name, &pp, &Patch::Merge(&patch)).await,
    };
    updated.map(Node::from)
}

/// Computes a patch from `node` with `build` and sends it guarded by resourceVersion; on
/// Conflict re-reads the Node and recomputes. `Ok(None)`: nothing to write (or the Node is
/// gone).
pub async fn patch_guarded(
    api: &Api<Node>,
    node: Node,
    target: Target,
    build: impl Fn(&Node) -> Option<Value>,
) -> Result<Option<Node>, kube::Error> {
    let mut node = node;
    let mut conflicts = 0;
    loop {
        let Some(patch) = build(&node) else {
            return Ok(None);
        };
        match send(api, &node, target, patch).await {
            Ok(n) => return Ok(Some(n)),
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) if is_conflict(&e) && conflicts < MAX_CONFLICTS => {
                conflicts += 1;
                let name = node.metadata.name.clone().unwrap_or_default();
                match api.get(&name).await {
                    Ok(fresh) => node = fresh,
                    Err(e) if is_not_found(&e) => return Ok(None),
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    }
}
