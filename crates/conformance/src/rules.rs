//! The rules of the provider traits, each with a stable id.
//!
//! The ids appear in every report and in known-defect lists, so a failure reads as "rule X
//! broken" rather than "test 17 failed", and a provider author can look the rule up here or in
//! docs/provider-guide.md.

use serde::Serialize;

/// One rule of the `ccm_cloud` traits that a provider must follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Rule {
    /// Stable id, `<area>.<rule>`: used in reports, JUnit test names and known-defect lists.
    pub id: &'static str,
    /// The rule, as a provider author reads it.
    pub text: &'static str,
    /// What breaks in a cluster when a provider gets it wrong.
    pub why: &'static str,
}

macro_rules! rules {
    ($($name:ident = $id:literal, $text:literal, $why:literal;)*) => {
        $(
            #[doc = $text]
            pub const $name: Rule = Rule { id: $id, text: $text, why: $why };
        )*
        /// Every rule the suite checks, in report order.
        pub const ALL: &[Rule] = &[$($name),*];
    };
}

rules! {
    INSTANCE_EXISTS = "instances.running-exists",
        "instance_exists is Ok(true) and instance_shutdown Ok(false) for a running instance",
        "a running Node reported missing is deleted by the lifecycle controller";
    INSTANCE_STOPPED = "instances.stopped-exists-and-shutdown",
        "a stopped instance exists (Ok(true)) and is shut down; started again it is not shut down",
        "a stopped Node reported missing is deleted instead of getting the shutdown taint";
    INSTANCE_TERMINATED = "instances.terminated-is-gone",
        "a terminated instance is reported Ok(false) / exists: false (looked up by name, Err(InstanceNotFound) is allowed too)",
        "Nodes of terminated instances are never cleaned up";
    ERROR_NEVER_GONE = "instances.error-is-never-gone",
        "a cloud error (5xx, 403, timeout, throttling, a 404 that is not an authoritative answer) is an Err, never Ok(false) or exists: false",
        "one failed API call deletes every NotReady Node of the cluster";
    FOREIGN_ID_NOT_GONE = "instances.foreign-provider-id-is-never-gone",
        "a providerID of another provider or of malformed shape is an Err, never Ok(false)",
        "Nodes of another cloud or with a typo in the providerID are deleted";
    BATCH_EQUALS_SINGLE = "instances.batch-equals-single",
        "instances_status and instances_metadata answer each Node, in order, as the single calls do",
        "batched controllers see other states than per-node ones: Nodes flap or get wrong labels";
    PROVIDER_ID_ROUND_TRIP = "instances.provider-id-round-trip",
        "metadata's providerID is <provider_name>://<id>, and a Node carrying it is found again with the same metadata",
        "a Node initialized with a providerID the provider cannot read is never found again";
    ADDRESSES_WELL_FORMED = "instances.addresses-well-formed",
        "addresses have a Kubernetes address type, *IP addresses parse as IPs, no entry repeats",
        "the API server rejects the Node status update, or kubelets pick a wrong address";
    LABELS_WELL_FORMED = "instances.labels-well-formed",
        "instance type, zone, region and additional labels are valid label values and keys",
        "the Node update is rejected and the Node is never initialized";
    ROUTES_ONLY_THIS_CLUSTER = "routes.only-this-cluster",
        "list_routes(cluster) returns only routes created for that cluster",
        "the route controller deletes another cluster's pod routes";
    ROUTE_CREATE_LISTED = "routes.create-is-listed",
        "a created route is listed with its destination CIDR and target Node",
        "the route controller re-creates the route forever";
    ROUTE_CREATE_NO_DUPLICATE = "routes.create-again-no-duplicate",
        "creating a route that exists again leaves exactly one route for the CIDR",
        "duplicate routes make pod traffic take either path";
    ROUTE_DELETE_IDEMPOTENT = "routes.delete-is-idempotent",
        "delete_route removes the route, and deleting a route that is gone is Ok",
        "a route deleted out of band blocks the route controller's sync forever";
    ROUTE_BLACKHOLE = "routes.blackhole-reported",
        "a route whose instance is terminated is listed as blackhole (or no longer listed)",
        "routes to dead instances are never cleaned up";
    LB_GET_MISSING_NONE = "lb.get-missing-is-none",
        "get_load_balancer of a Service without an LB is Ok(None), never an error",
        "deleting such a Service retries forever and its finalizer is never removed";
    LB_ENSURE_STATUS = "lb.ensure-reports-ingress",
        "ensure_load_balancer returns at least one ingress IP or hostname, and get_load_balancer then finds the LB",
        "the Service never gets an external address";
    LB_ENSURE_IDEMPOTENT = "lb.ensure-is-idempotent",
        "a second ensure with the same Service and Nodes returns the same ingress and creates no second LB",
        "every resync creates a load balancer: the account fills with leaked LBs";
    LB_ENSURE_CONVERGES = "lb.ensure-converges",
        "ensure with a changed Service (ports, hosts) updates the one LB in place",
        "Service changes are ignored, or the external address changes on every edit";
    LB_UPDATE_HOSTS = "lb.update-replaces-hosts",
        "update_load_balancer replaces the backend set with exactly the given Nodes",
        "traffic goes to removed Nodes, or new Nodes get none";
    LB_DELETE_REMOVES = "lb.delete-leaves-nothing",
        "after ensure_load_balancer_deleted, get is Ok(None) and the cloud holds nothing of the LB",
        "deleted Services leak load balancers (and their cost)";
    LB_DELETE_IDEMPOTENT = "lb.delete-is-idempotent",
        "ensure_load_balancer_deleted of an LB that is gone is Ok",
        "deleting a Service whose LB was removed by hand retries forever";
    LB_NAME_LIMITS = "lb.name-within-limits",
        "load_balancer_name fits the cloud's name limit and differs between Services",
        "long Service names fail to get an LB, or two Services share one";
    THROTTLED = "errors.throttling-is-throttled",
        "a cloud rate-limit answer surfaces as CloudError::Throttled",
        "controllers retry a throttled cloud at full speed and make the throttling worse";
    CANCEL_NOTHING_HALF_MADE = "cancel.nothing-half-made",
        "an ensure cancelled mid-call leaves nothing that a later ensure does not adopt and a delete does not remove",
        "a CCM restarted mid-operation leaks half-built load balancers";
}

/// The cluster-level rules: the real controllers on kube-sim with the provider's cloud.
pub const CLUSTER: &[Rule] = &[
    CLUSTER_NODE_JOIN,
    CLUSTER_NODE_SHUTDOWN,
    CLUSTER_NODE_TERMINATE,
    CLUSTER_ROUTES,
    CLUSTER_LB,
    CLUSTER_RESTART,
    CLUSTER_FAILOVER,
];

macro_rules! cluster_rules {
    ($($name:ident = $id:literal, $text:literal, $why:literal;)*) => {
        $(
            #[doc = $text]
            pub const $name: Rule = Rule { id: $id, text: $text, why: $why };
        )*
    };
}

cluster_rules! {
    CLUSTER_NODE_JOIN = "cluster.node-join",
        "a Node a kubelet registers with --cloud-provider=external is initialized: the uninitialized taint removed, providerID set",
        "new Nodes never take pods";
    CLUSTER_NODE_SHUTDOWN = "cluster.node-stop-start",
        "the NotReady Node of a stopped instance is kept and gets the shutdown taint; started and Ready again, the taint goes",
        "stopped machines lose their Nodes, or restarted ones stay tainted";
    CLUSTER_NODE_TERMINATE = "cluster.node-terminate",
        "the NotReady Node of a terminated instance is deleted",
        "dead Nodes stay in the cluster forever";
    CLUSTER_ROUTES = "cluster.routes-join-leave",
        "a joining Node's pod CIDR gets a route to it; a deleted Node's route is removed",
        "pods on new Nodes are unreachable, or old routes send traffic to reused addresses";
    CLUSTER_LB = "cluster.lb-lifecycle",
        "a LoadBalancer Service gets the cleanup finalizer and an ingress, a port change converges, deleting it removes the LB and then the finalizer",
        "Services never get an address, or deleted Services leak LBs or hang in Terminating";
    CLUSTER_RESTART = "cluster.restart-mid-operation",
        "a CCM stopped while creating an LB and started again converges to exactly one LB and cleans it when the Service goes",
        "every CCM restart (an upgrade, an eviction) leaks or duplicates load balancers";
    CLUSTER_FAILOVER = "cluster.leader-failover",
        "while the leader runs no standby acts; when it stops mid-operation the standby takes over and converges to one LB",
        "two CCMs fight over the cloud, or nobody finishes what the old leader started";
}

/// The rule with this id.
pub fn by_id(id: &str) -> Option<&'static Rule> {
    ALL.iter().chain(CLUSTER).find(|r| r.id == id)
}
