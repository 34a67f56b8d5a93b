//! The static table of resource kinds the simulator serves.
//!
//! Everything that differs between kinds (scope, discovery data, status subresource, strategic
//! merge keys, selectable fields, table columns) is data here, so the store and the HTTP layer
//! stay generic: adding a kind is adding a row.

/// How a strategic merge patch treats one list field, mirroring the `patchStrategy` /
/// `patchMergeKey` struct tags of the Kubernetes Go types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListStrategy {
    /// `patchStrategy:"merge"` with `patchMergeKey`: elements are maps matched by this key.
    MergeByKey(&'static str),
    /// `patchStrategy:"merge"` on a list of scalars: set union, order kept.
    MergePrimitives,
}

/// One served resource kind: the facts discovery advertises and the behaviour the store applies.
#[derive(Debug)]
pub struct ResourceDesc {
    /// API group; empty for the core group.
    pub group: &'static str,
    /// API version within the group.
    pub version: &'static str,
    /// Plural resource name as it appears in URLs.
    pub plural: &'static str,
    /// Singular name (discovery's `singularName`).
    pub singular: &'static str,
    /// Kind of one object.
    pub kind: &'static str,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// kubectl short names.
    pub short_names: &'static [&'static str],
    /// Whether a `/status` subresource exists (the main endpoint then ignores `status`).
    pub status_subresource: bool,
    /// Whether `metadata.generation` tracks `spec` changes.
    pub has_spec: bool,
    /// Field selector labels accepted besides `metadata.name` / `metadata.namespace`.
    pub fields: &'static [&'static str],
    /// Strategic-merge list strategies by dotted path (lists of maps nest as `a.b`).
    pub patch_lists: &'static [(&'static str, ListStrategy)],
    /// Discovery categories (`kubectl get all`).
    pub categories: &'static [&'static str],
}

impl ResourceDesc {
    /// `apiVersion` of objects of this kind.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The `resource.group` name kube-apiserver uses in error messages (`nodes`, `leases.coordination.k8s.io`).
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The strategic-merge list strategy for a dotted path, including the metadata lists every kind has.
    pub fn list_strategy(&self, path: &str) -> Option<ListStrategy> {
        match path {
            "metadata.finalizers" => return Some(ListStrategy::MergePrimitives),
            "metadata.ownerReferences" => return Some(ListStrategy::MergeByKey("uid")),
            _ => {}
        }
        self.patch_lists
            .iter()
            .find(|(p, _)| *p == path)
            .map(|(_, s)| *s)
    }
}

const NO: &[&str] = &[];

/// Every kind served. The index into this table is the store's resource id.
pub static RESOURCES: &[ResourceDesc] = &[
    ResourceDesc {
        group: "",
        version: "v1",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
        short_names: &["no"],
        status_subresource: true,
        has_spec: true,
        fields: &["spec.unschedulable"],
        patch_lists: &[
            ("spec.podCIDRs", ListStrategy::MergePrimitives),
            ("status.conditions", ListStrategy::MergeByKey("type")),
            ("status.addresses", ListStrategy::MergeByKey("type")),
            ("status.volumesAttached", ListStrategy::MergeByKey("name")),
        ],
        categories: NO,
    },
    ResourceDesc {
        group: "",
        version: "v1",
        plural: "services",
        singular: "service",
        kind: "Service",
        namespaced: true,
        short_names: &["svc"],
        status_subresource: true,
        has_spec: true,
        fields: &["spec.clusterIP", "spec.type"],
        patch_lists: &[
            ("spec.ports", ListStrategy::MergeByKey("port")),
            ("status.conditions", ListStrategy::MergeByKey("type")),
        ],
        categories: &["all"],
    },
    ResourceDesc {
        group: "",
        version: "v1",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        short_names: &["ns"],
        status_subresource: true,
        has_spec: false,
        fields: &["status.phase"],
        patch_lists: &[("status.conditions", ListStrategy::MergeByKey("type"))],
        categories: NO,
    },
    ResourceDesc {
        group: "",
        version: "v1",
        plural: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        namespaced: true,
        short_names: &["cm"],
        status_subresource: false,
        has_spec: false,
        fields: NO,
        patch_lists: &[],
        categories: NO,
    },
    ResourceDesc {
        group: "",
        version: "v1",
        plural: "secrets",
        singular: "secret",
        kind: "Secret",
        namespaced: true,
        short_names: NO,
        status_subresource: false,
        has_spec: false,
        fields: &["type"],
        patch_lists: &[],
        categories: NO,
    },
    ResourceDesc {
        group: "",
        version: "v1",
        plural: "serviceaccounts",
        singular: "serviceaccount",
        kind: "ServiceAccount",
        namespaced: true,
        short_names: &["sa"],
        status_subresource: false,
        has_spec: false,
        fields: NO,
        patch_lists: &[("secrets", ListStrategy::MergeByKey("name"))],
        categories: NO,
    },
    ResourceDesc {
        group: "",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        short_names: &["ev"],
        status_subresource: false,
        has_spec: false,
        fields: &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        patch_lists: &[],
        categories: NO,
    },
    ResourceDesc {
        group: "",
        version: "v1",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        namespaced: true,
        short_names: &["po"],
        status_subresource: true,
        has_spec: true,
        fields: &["spec.nodeName", "status.phase", "spec.schedulerName"],
        patch_lists: &[
            ("spec.containers", ListStrategy::MergeByKey("name")),
            ("status.conditions", ListStrategy::MergeByKey("type")),
        ],
        categories: &["all"],
    },
    ResourceDesc {
        group: "",
        version: "v1",
        plural: "endpoints",
        singular: "endpoints",
        kind: "Endpoints",
        namespaced: true,
        short_names: &["ep"],
        status_subresource: false,
        has_spec: false,
        fields: NO,
        patch_lists: &[],
        categories: NO,
    },
    ResourceDesc {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        singular: "lease",
        kind: "Lease",
        namespaced: true,
        short_names: NO,
        status_subresource: false,
        has_spec: true,
        fields: NO,
        patch_lists: &[],
        categories: NO,
    },
    ResourceDesc {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        short_names: &["ev"],
        status_subresource: false,
        has_spec: false,
        fields: &[
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "reason",
            "reportingController",
            "type",
        ],
        patch_lists: &[],
        categories: NO,
    },
    ResourceDesc {
        group: "discovery.k8s.io",
        version: "v1",
        plural: "endpointslices",
        singular: "endpointslice",
        kind: "EndpointSlice",
        namespaced: true,
        short_names: NO,
        status_subresource: false,
        has_spec: false,
        fields: &["addressType"],
        patch_lists: &[],
        categories: NO,
    },
    // rbac.authorization.k8s.io/v1: stored and evaluated by `rbac` (enforced with `Config::rbac`).
    ResourceDesc {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "clusterroles",
        singular: "clusterrole",
        kind: "ClusterRole",
        namespaced: false,
        short_names: NO,
        status_subresource: false,
        has_spec: false,
        fields: NO,
        patch_lists: &[],
        categories: NO,
    },
    ResourceDesc {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "clusterrolebindings",
        singular: "clusterrolebinding",
        kind: "ClusterRoleBinding",
        namespaced: false,
        short_names: NO,
        status_subresource: false,
        has_spec: false,
        fields: NO,
        patch_lists: &[],
        categories: NO,
    },
    ResourceDesc {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "roles",
        singular: "role",
        kind: "Role",
        namespaced: true,
        short_names: NO,
        status_subresource: false,
        has_spec: false,
        fields: NO,
        patch_lists: &[],
        categories: NO,
    },
    ResourceDesc {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "rolebindings",
        singular: "rolebinding",
        kind: "RoleBinding",
        namespaced: true,
        short_names: NO,
        status_subresource: false,
        has_spec: false,
        fields: NO,
        patch_lists: &[],
        categories: NO,
    },
    // apps/v1 and policy/v1: stored (validated and defaulted where the CCM's manifests need
    // it), never reconciled — no controller creates ReplicaSets or Pods from them.
    ResourceDesc {
        group: "apps",
        version: "v1",
        plural: "deployments",
        singular: "deployment",
        kind: "Deployment",
        namespaced: true,
        short_names: &["deploy"],
        status_subresource: true,
        has_spec: true,
        fields: NO,
        patch_lists: POD_TEMPLATE_LISTS,
        categories: &["all"],
    },
    ResourceDesc {
        group: "apps",
        version: "v1",
        plural: "daemonsets",
        singular: "daemonset",
        kind: "DaemonSet",
        namespaced: true,
        short_names: &["ds"],
        status_subresource: true,
        has_spec: true,
        fields: NO,
        patch_lists: POD_TEMPLATE_LISTS,
        categories: &["all"],
    },
    ResourceDesc {
        group: "policy",
        version: "v1",
        plural: "poddisruptionbudgets",
        singular: "poddisruptionbudget",
        kind: "PodDisruptionBudget",
        namespaced: true,
        short_names: &["pdb"],
        status_subresource: true,
        has_spec: true,
        fields: NO,
        patch_lists: &[("status.conditions", ListStrategy::MergeByKey("type"))],
        categories: NO,
    },
    // Stored only (as Deployments): `ccm doctor` reads a Deployment's ReplicaSets to tell a
    // stuck rollout from a running one.
    ResourceDesc {
        group: "apps",
        version: "v1",
        plural: "replicasets",
        singular: "replicaset",
        kind: "ReplicaSet",
        namespaced: true,
        short_names: &["rs"],
        status_subresource: true,
        has_spec: true,
        fields: NO,
        patch_lists: POD_TEMPLATE_LISTS,
        categories: &["all"],
    },
    // Stored only: PersistentVolumes are what the CCM's PersistentVolume labeler webhook
    // mutates; the webhook configurations drive `admission` (calls on create and update).
    ResourceDesc {
        group: "",
        version: "v1",
        plural: "persistentvolumes",
        singular: "persistentvolume",
        kind: "PersistentVolume",
        namespaced: false,
        short_names: &["pv"],
        status_subresource: true,
        has_spec: true,
        fields: NO,
        patch_lists: &[],
        categories: NO,
    },
    ResourceDesc {
        group: "admissionregistration.k8s.io",
        version: "v1",
        plural: "mutatingwebhookconfigurations",
        singular: "mutatingwebhookconfiguration",
        kind: "MutatingWebhookConfiguration",
        namespaced: false,
        short_names: NO,
        status_subresource: false,
        has_spec: false,
        fields: NO,
        patch_lists: &[("webhooks", ListStrategy::MergeByKey("name"))],
        categories: &["api-extensions"],
    },
    ResourceDesc {
        group: "admissionregistration.k8s.io",
        version: "v1",
        plural: "validatingwebhookconfigurations",
        singular: "validatingwebhookconfiguration",
        kind: "ValidatingWebhookConfiguration",
        namespaced: false,
        short_names: NO,
        status_subresource: false,
        has_spec: false,
        fields: NO,
        patch_lists: &[("webhooks", ListStrategy::MergeByKey("name"))],
        categories: &["api-extensions"],
    },
    // Stored only: the chart's optional API Priority and Fairness objects are installed here
    // by its tests (kube-sim does not queue by them; its 429s come from `faults`).
    ResourceDesc {
        group: "flowcontrol.apiserver.k8s.io",
        version: "v1",
        plural: "flowschemas",
        singular: "flowschema",
        kind: "FlowSchema",
        namespaced: false,
        short_names: NO,
        status_subresource: true,
        has_spec: true,
        fields: NO,
        patch_lists: &[("status.conditions", ListStrategy::MergeByKey("type"))],
        categories: NO,
    },
    ResourceDesc {
        group: "flowcontrol.apiserver.k8s.io",
        version: "v1",
        plural: "prioritylevelconfigurations",
        singular: "prioritylevelconfiguration",
        kind: "PriorityLevelConfiguration",
        namespaced: false,
        short_names: NO,
        status_subresource: true,
        has_spec: true,
        fields: NO,
        patch_lists: &[("status.conditions", ListStrategy::MergeByKey("type"))],
        categories: NO,
    },
];

/// Strategic-merge keys of a pod template (`spec.template.spec`), as in `core/v1` PodSpec.
const POD_TEMPLATE_LISTS: &[(&str, ListStrategy)] = &[
    (
        "spec.template.spec.containers",
        ListStrategy::MergeByKey("name"),
    ),
    (
        "spec.template.spec.initContainers",
        ListStrategy::MergeByKey("name"),
    ),
    (
        "spec.template.spec.containers.env",
        ListStrategy::MergeByKey("name"),
    ),
    (
        "spec.template.spec.containers.ports",
        ListStrategy::MergeByKey("containerPort"),
    ),
    (
        "spec.template.spec.containers.volumeMounts",
        ListStrategy::MergeByKey("mountPath"),
    ),
    (
        "spec.template.spec.volumes",
        ListStrategy::MergeByKey("name"),
    ),
    (
        "spec.template.spec.imagePullSecrets",
        ListStrategy::MergeByKey("name"),
    ),
    ("status.conditions", ListStrategy::MergeByKey("type")),
];

/// Index of the kind in [`RESOURCES`] for a group, version and plural.
pub fn find(group: &str, version: &str, plural: &str) -> Option<usize> {
    RESOURCES
        .iter()
        .position(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Well-known ids, so special cases in the store read as names, not numbers.
pub mod ids {
    /// core/v1 nodes.
    pub const NODES: usize = 0;
    /// core/v1 services.
    pub const SERVICES: usize = 1;
    /// core/v1 namespaces.
    pub const NAMESPACES: usize = 2;
    /// core/v1 serviceaccounts.
    pub const SERVICEACCOUNTS: usize = 5;
    /// core/v1 events.
    pub const EVENTS: usize = 6;
    /// coordination.k8s.io/v1 leases.
    pub const LEASES: usize = 9;
    /// rbac.authorization.k8s.io/v1 clusterroles.
    pub const CLUSTERROLES: usize = 12;
    /// rbac.authorization.k8s.io/v1 clusterrolebindings.
    pub const CLUSTERROLEBINDINGS: usize = 13;
    /// rbac.authorization.k8s.io/v1 roles.
    pub const ROLES: usize = 14;
    /// rbac.authorization.k8s.io/v1 rolebindings.
    pub const ROLEBINDINGS: usize = 15;
    /// apps/v1 deployments.
    pub const DEPLOYMENTS: usize = 16;
    /// apps/v1 daemonsets.
    pub const DAEMONSETS: usize = 17;
    /// policy/v1 poddisruptionbudgets.
    pub const PODDISRUPTIONBUDGETS: usize = 18;
    /// core/v1 endpoints.
    pub const ENDPOINTS: usize = 8;
    /// discovery.k8s.io/v1 endpointslices.
    pub const ENDPOINTSLICES: usize = 11;
    /// admissionregistration.k8s.io/v1 mutatingwebhookconfigurations.
    pub const MUTATINGWEBHOOKCONFIGURATIONS: usize = 21;
    /// admissionregistration.k8s.io/v1 validatingwebhookconfigurations.
    pub const VALIDATINGWEBHOOKCONFIGURATIONS: usize = 22;
}

/// The API groups served under `/apis`, in discovery order.
pub fn groups() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES {
        if !r.group.is_empty() && !out.iter().any(|(g, _)| *g == r.group) {
            out.push((r.group, r.version));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_match_table() {
        assert_eq!(RESOURCES[ids::NODES].plural, "nodes");
        assert_eq!(RESOURCES[ids::SERVICES].plural, "services");
        assert_eq!(RESOURCES[ids::NAMESPACES].plural, "namespaces");
        assert_eq!(RESOURCES[ids::SERVICEACCOUNTS].plural, "serviceaccounts");
        assert_eq!(RESOURCES[ids::EVENTS].api_version(), "v1");
        assert_eq!(RESOURCES[ids::EVENTS].plural, "events");
        assert_eq!(RESOURCES[ids::LEASES].plural, "leases");
        assert_eq!(RESOURCES[ids::CLUSTERROLES].plural, "clusterroles");
        assert_eq!(
            RESOURCES[ids::CLUSTERROLEBINDINGS].plural,
            "clusterrolebindings"
        );
        assert_eq!(RESOURCES[ids::ROLES].plural, "roles");
        assert_eq!(RESOURCES[ids::ROLEBINDINGS].plural, "rolebindings");
        assert_eq!(RESOURCES[ids::DEPLOYMENTS].plural, "deployments");
        assert_eq!(RESOURCES[ids::DAEMONSETS].plural, "daemonsets");
        assert_eq!(
            RESOURCES[ids::PODDISRUPTIONBUDGETS].plural,
            "poddisruptionbudgets"
        );
        assert_eq!(RESOURCES[ids::ENDPOINTS].plural, "endpoints");
        assert_eq!(RESOURCES[ids::ENDPOINTSLICES].plural, "endpointslices");
        assert_eq!(RESOURCES[20].plural, "persistentvolumes");
        assert_eq!(
            RESOURCES[ids::MUTATINGWEBHOOKCONFIGURATIONS].plural,
            "mutatingwebhookconfigurations"
        );
        assert_eq!(
            RESOURCES[ids::VALIDATINGWEBHOOKCONFIGURATIONS].plural,
            "validatingwebhookconfigurations"
        );
    }
}
