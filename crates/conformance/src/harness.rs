//! What the suite needs from a cloud beyond the provider traits.
//!
//! The traits only read instances; to prove that a stopped instance still exists the suite must
//! stop one, and to prove that an error is never "gone" it must make the cloud fail. A provider
//! author implements [`Harness`] for a test cloud (an emulator, a sandbox account); every method
//! but [`Harness::provider`] has a default saying "not available", and the checks that need it
//! are reported as not run, with the reason — never silently passed.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ccm_cloud::{CloudProvider, InitContext, Node};

/// A failure the harness can make the cloud answer with, for the calls that follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// The API answers 5xx (InternalError, ServiceUnavailable).
    ServerError,
    /// The API refuses the credentials (401/403, UnauthorizedOperation).
    Forbidden,
    /// The API does not answer in time.
    Timeout,
    /// The API answers with its rate-limit error (RequestLimitExceeded, 429).
    Throttle,
    /// The API answers 404 Not Found for a resource it should know (a BMC mid firmware
    /// update, a proxy in the way): a 404 that does not come from an authoritative lookup.
    NotFound,
    /// Every call takes about this long (for cancelling calls mid-way).
    Latency(Duration),
}

impl Fault {
    /// The faults under which an instance must never be reported gone.
    pub const ERRORS: [Fault; 5] = [
        Fault::ServerError,
        Fault::Forbidden,
        Fault::Timeout,
        Fault::Throttle,
        Fault::NotFound,
    ];
}

/// A harness could not do what the suite asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HarnessError {
    /// The harness cannot do this at all (the check is reported as not run, with this reason).
    Unsupported(String),
    /// It tried and failed (the check fails with this message).
    Failed(String),
}

impl std::fmt::Display for HarnessError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HarnessError::Unsupported(why) => write!(f, "not supported by the harness: {why}"),
            HarnessError::Failed(why) => write!(f, "harness failed: {why}"),
        }
    }
}

/// Result of a harness action.
pub type HarnessResult<T> = Result<T, HarnessError>;

/// One load balancer as the cloud holds it, seen from outside the provider.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LbRecord {
    /// The cloud's name (or id) of the LB.
    pub name: String,
    /// `namespace/name` of the Service it serves, when the cloud records it (AWS: the
    /// `kubernetes.io/service-name` tag).
    pub service: Option<String>,
    /// UID of the Service it serves, when the cloud records it (a tag, a description).
    pub service_uid: Option<String>,
    /// Listener ports, when the harness can see them.
    pub ports: Option<Vec<i32>>,
    /// Backend Node names, when the harness can see them.
    pub hosts: Option<Vec<String>>,
}

/// What the cloud holds for one cluster name, read behind the provider's back: the only way to
/// see a leak the provider itself no longer reports.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Inventory {
    /// Load balancers (and what belongs to them: target groups, security groups, address
    /// claims), one record each.
    pub load_balancers: Vec<LbRecord>,
    /// Other resources tagged with the cluster that are not load balancers, e.g. `sg/sg-123`.
    pub other: Vec<String>,
}

/// The cloud under test plus what the suite needs to drive it.
#[async_trait]
pub trait Harness: Send + Sync {
    /// The provider under test, exactly as the CCM would build it.
    fn provider(&self) -> Arc<dyn CloudProvider>;

    /// What the provider's `initialize` gets before any check, for providers that need it
    /// (e.g. a kube client to rebuild their state from the cluster). `None`: not called.
    async fn init_context(&self) -> Option<InitContext> {
        None
    }

    /// Nodes of instances that exist and run, for the read-only checks. They are only read.
    async fn existing_nodes(&self) -> Vec<Node> {
        Vec::new()
    }

    /// Creates a running instance that will register as Node `name` and returns that Node as
    /// a kubelet would register it (name, addresses; no providerID yet).
    async fn create_instance(&self, _name: &str) -> HarnessResult<Node> {
        Err(HarnessError::Unsupported("cannot create instances".into()))
    }

    /// Powers the instance of `node` off.
    async fn stop_instance(&self, _node: &Node) -> HarnessResult<()> {
        Err(HarnessError::Unsupported("cannot stop instances".into()))
    }

    /// Powers the instance of `node` on.
    async fn start_instance(&self, _node: &Node) -> HarnessResult<()> {
        Err(HarnessError::Unsupported("cannot start instances".into()))
    }

    /// Terminates the instance of `node` for good.
    async fn terminate_instance(&self, _node: &Node) -> HarnessResult<()> {
        Err(HarnessError::Unsupported(
            "cannot terminate instances".into(),
        ))
    }

    /// Makes the cloud answer the provider's following calls with `fault`, until
    /// [`Harness::clear_faults`].
    async fn inject(&self, fault: Fault) -> HarnessResult<()> {
        Err(HarnessError::Unsupported(format!(
            "cannot inject {fault:?}"
        )))
    }

    /// Lifts every injected fault.
    async fn clear_faults(&self) {}

    /// The resources the cloud holds for `cluster`, read without the provider. `None`: the
    /// harness cannot see them, and leak checks rely on the provider's own answers.
    async fn inventory(&self, _cluster: &str) -> Option<Inventory> {
        None
    }

    /// Removes whatever the cloud still holds for `cluster` (the suite's own cluster name
    /// only) and says what it removed. Called at the end of every run, also after a failure.
    async fn sweep(&self, _cluster: &str) -> Vec<String> {
        Vec::new()
    }

    /// Capabilities (`"load_balancer"`, `"routes"`) whose calls never reach the API that
    /// [`Harness::inject`] makes fail — e.g. the metal provider's address pools and kernel
    /// routes are local, only its BMCs are remote — so a fault cannot surface in them.
    fn local_capabilities(&self) -> &'static [&'static str] {
        &[]
    }

    /// The longest load-balancer name the cloud accepts (AWS ELB: 32).
    fn max_lb_name_len(&self) -> usize {
        255
    }

    /// How long the cloud may take before a change shows (eventual consistency).
    fn settle_timeout(&self) -> Duration {
        Duration::from_secs(5)
    }

    /// The pod CIDR range the suite's routes are taken from; it must be unused in the account.
    fn route_cidr_base(&self) -> ipnet::Ipv4Net {
        "10.250.0.0/16".parse().expect("literal CIDR")
    }
}
