//! The operator's RBAC, declared once, next to the code that needs it.
//!
//! `config/rbac` is generated from these tables and from the kinds of the controller's
//! children (`crate::children`) by `memcached-operator-gen manifests`, and
//! `tests/rbac.rs` runs the controller against the in-memory API server, records every
//! request it makes and checks each against the generated roles — so a rule that is
//! missing fails a test, and the roles carry no wildcard. Every rule says which code path
//! needs it; when the code stops making a call, delete the rule.

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::children::{self, Child, Kind};

/// One RBAC rule: these verbs on these resources of these API groups (only the objects
/// named in `resource_names`, when it is not empty).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub api_groups: &'static [&'static str],
    pub resources: &'static [&'static str],
    pub verbs: &'static [&'static str],
    pub resource_names: &'static [&'static str],
}

/// A rule on non-resource URLs (`/metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NonResourceRule {
    pub urls: &'static [&'static str],
    pub verbs: &'static [&'static str],
}

/// What the controller (`controller::run`, `crd::check_installed`) does besides managing
/// its children, cluster-wide (it watches all namespaces unless `--namespace` narrows it).
/// The children's own rules come from their kinds in the list of children
/// ([`crate::children::Kind::rule`]); [`manager_rules`] puts both together.
pub const CONTROLLER_RULES: &[Rule] = &[
    // controller::run: the Memcached watcher/reflector (list + watch);
    // crd::check_installed: `list(limit=1)` before the controller starts.
    Rule {
        api_groups: &[memcached_api::GROUP],
        resources: &["memcacheds"],
        verbs: &["list", "watch"],
        resource_names: &[],
    },
    // controller::reconcile: merge patch of the status subresource.
    Rule {
        api_groups: &[memcached_api::GROUP],
        resources: &["memcacheds/status"],
        verbs: &["patch"],
        resource_names: &[],
    },
    // The children carry an ownerReference to the Memcached with blockOwnerDeletion=true;
    // with the OwnerReferencesPermissionEnforcement admission plugin (OpenShift and
    // hardened clusters) that needs `update` on the owner's finalizers subresource. No
    // request goes there, the admission plugin checks it.
    Rule {
        api_groups: &[memcached_api::GROUP],
        resources: &["memcacheds/finalizers"],
        verbs: &["update"],
        resource_names: &[],
    },
    // controller::watches: the Secrets' metadata (list + watch, metadata-only requests: the
    // cache holds names and resourceVersions, no data); controller::secrets: reads the data
    // of a SASL or TLS Secret a Memcached names (get) when its version moved. RBAC cannot
    // grant metadata alone: list and watch would also allow reading data.
    Rule {
        api_groups: &[""],
        resources: &["secrets"],
        verbs: &["get", "list", "watch"],
        resource_names: &[],
    },
    // controller::run: Pod watcher (list + watch) for `status.nodes` and readiness;
    // controller::restart_gate deletes a pod whose TLS reload agent reported a refused
    // certificate (its Deployment replaces it); controller::deletion_costs merge-patches
    // the `controller.kubernetes.io/pod-deletion-cost` annotation of a proxied pool's pods.
    Rule {
        api_groups: &[""],
        resources: &["pods"],
        verbs: &["delete", "list", "patch", "watch"],
        resource_names: &[],
    },
    // controller::events (kube-runtime Recorder): creates events.k8s.io/v1 Events in the
    // Memcached's namespace, and patches them to count repeats.
    Rule {
        api_groups: &["events.k8s.io"],
        resources: &["events"],
        verbs: &["create", "patch"],
        resource_names: &[],
    },
];

/// The `manager-role` ClusterRole's rules for a controller managing `children`:
/// [`CONTROLLER_RULES`] and the rule of each kind of child, sorted by group and resource as
/// controller-gen writes them.
pub fn manager_rules_for(children: &[Child]) -> Vec<Rule> {
    let mut rules: Vec<Rule> = CONTROLLER_RULES
        .iter()
        .copied()
        .chain(children::kinds(children).into_iter().map(Kind::rule))
        .collect();
    rules.sort_by_key(|r| (r.api_groups, r.resources));
    rules
}

/// The `manager-role` ClusterRole's rules for the operator's children
/// ([`children::CHILDREN`]).
pub fn manager_rules() -> Vec<Rule> {
    manager_rules_for(children::CHILDREN)
}

/// What the controller reads of cluster-scoped objects: the `crd-reader-role` ClusterRole,
/// always bound cluster-wide (a namespaced install binds the manager's role in its
/// namespaces only, where a cluster-scoped object cannot be granted).
pub const CLUSTER_READ_RULES: &[Rule] = &[
    // informer::WhileServed: whether the Prometheus Operator's ServiceMonitor kind is
    // served, from a metadata-only watch of its one CustomResourceDefinition (list + watch
    // with a field selector on the name, which RBAC checks against resourceNames).
    Rule {
        api_groups: &["apiextensions.k8s.io"],
        resources: &["customresourcedefinitions"],
        verbs: &["list", "watch"],
        resource_names: &[crate::children::SERVICE_MONITOR_CRD],
    },
];

/// The `crd-reader-role` ClusterRole ([`CLUSTER_READ_RULES`]).
pub fn crd_reader_role() -> ClusterRole {
    cluster_role("crd-reader-role", CLUSTER_READ_RULES)
}

/// Leader election (`memcached_manager::leader`), in the manager's own namespace only:
/// the `leader-election-role` Role. Only the verbs the lock uses (tests/rbac.rs finds each
/// in the API server's audit log): Kubebuilder's scaffold also grants list, watch and
/// patch on Leases and create and patch on core Events, for controller-runtime's resource
/// lock and its leader-election events, neither of which this operator has.
pub const LEADER_ELECTION_RULES: &[Rule] = &[
    // manager::leader: get the Lease, create it when missing, update (PUT with the read
    // resourceVersion) to take, renew and release it.
    Rule {
        api_groups: &["coordination.k8s.io"],
        resources: &["leases"],
        verbs: &["create", "get", "update"],
        resource_names: &[],
    },
];

/// The secured metrics endpoint (`memcached_manager::metrics_server`) authenticates the
/// scraper's bearer token and authorizes it for `get /metrics`: the `metrics-auth-role`
/// ClusterRole.
pub const METRICS_AUTH_RULES: &[Rule] = &[
    // metrics_server: TokenReview of the scraper's bearer token.
    Rule {
        api_groups: &["authentication.k8s.io"],
        resources: &["tokenreviews"],
        verbs: &["create"],
        resource_names: &[],
    },
    // metrics_server: SubjectAccessReview "may this user get /metrics".
    Rule {
        api_groups: &["authorization.k8s.io"],
        resources: &["subjectaccessreviews"],
        verbs: &["create"],
        resource_names: &[],
    },
];

/// Bound to whoever scrapes the metrics (Prometheus): the `metrics-reader` ClusterRole.
pub const METRICS_READER_RULES: &[NonResourceRule] = &[NonResourceRule {
    urls: &["/metrics"],
    verbs: &["get"],
}];

/// Kubebuilder's `memcached-editor-role`: for users who manage Memcacheds.
pub const EDITOR_RULES: &[Rule] = &[
    Rule {
        api_groups: &[memcached_api::GROUP],
        resources: &["memcacheds"],
        verbs: &[
            "create", "delete", "get", "list", "patch", "update", "watch",
        ],
        resource_names: &[],
    },
    Rule {
        api_groups: &[memcached_api::GROUP],
        resources: &["memcacheds/status"],
        verbs: &["get"],
        resource_names: &[],
    },
];

/// Kubebuilder's `memcached-viewer-role`: read-only access to Memcacheds.
pub const VIEWER_RULES: &[Rule] = &[
    Rule {
        api_groups: &[memcached_api::GROUP],
        resources: &["memcacheds"],
        verbs: &["get", "list", "watch"],
        resource_names: &[],
    },
    Rule {
        api_groups: &[memcached_api::GROUP],
        resources: &["memcacheds/status"],
        verbs: &["get"],
        resource_names: &[],
    },
];

/// Name of the operator's ServiceAccount (before kustomize's namePrefix).
pub const SERVICE_ACCOUNT: &str = "controller-manager";
/// Namespace placeholder of the kustomize bases (set by config/default's `namespace`).
pub const BASE_NAMESPACE: &str = "system";

fn strings(s: &[&str]) -> Vec<String> {
    s.iter().map(|x| x.to_string()).collect()
}

/// The rules as k8s-openapi `PolicyRule`s.
pub fn policy_rules(rules: &[Rule]) -> Vec<PolicyRule> {
    rules
        .iter()
        .map(|r| PolicyRule {
            api_groups: Some(strings(r.api_groups)),
            resources: Some(strings(r.resources)),
            verbs: strings(r.verbs),
            resource_names: (!r.resource_names.is_empty()).then(|| strings(r.resource_names)),
            ..PolicyRule::default()
        })
        .collect()
}

/// Labels Kubebuilder puts on everything in config/.
pub fn kustomize_labels() -> std::collections::BTreeMap<String, String> {
    [
        ("app.kubernetes.io/name", "memcached-operator"),
        ("app.kubernetes.io/managed-by", "kustomize"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: namespace.map(str::to_string),
        labels: Some(kustomize_labels()),
        ..ObjectMeta::default()
    }
}

/// A ClusterRole named `name` with `rules`.
pub fn cluster_role(name: &str, rules: &[Rule]) -> ClusterRole {
    ClusterRole {
        metadata: meta(name, None),
        rules: Some(policy_rules(rules)),
        ..ClusterRole::default()
    }
}

/// The controller's ClusterRole (`manager-role`).
pub fn manager_role() -> ClusterRole {
    cluster_role("manager-role", &manager_rules())
}

/// The leader-election Role (`leader-election-role`) in the manager's namespace.
pub fn leader_election_role() -> Role {
    Role {
        metadata: meta("leader-election-role", Some(BASE_NAMESPACE)),
        rules: Some(policy_rules(LEADER_ELECTION_RULES)),
    }
}

/// The `metrics-auth-role` ClusterRole.
pub fn metrics_auth_role() -> ClusterRole {
    cluster_role("metrics-auth-role", METRICS_AUTH_RULES)
}

/// The `metrics-reader` ClusterRole.
pub fn metrics_reader_role() -> ClusterRole {
    ClusterRole {
        metadata: meta("metrics-reader", None),
        rules: Some(
            METRICS_READER_RULES
                .iter()
                .map(|r| PolicyRule {
                    non_resource_urls: Some(strings(r.urls)),
                    verbs: strings(r.verbs),
                    ..PolicyRule::default()
                })
                .collect(),
        ),
        ..ClusterRole::default()
    }
}

/// The ServiceAccount as a binding subject.
fn service_account_subject() -> Vec<Subject> {
    vec![Subject {
        kind: "ServiceAccount".into(),
        name: SERVICE_ACCOUNT.into(),
        namespace: Some(BASE_NAMESPACE.into()),
        ..Subject::default()
    }]
}

/// A ClusterRoleBinding of the ClusterRole `role` to the operator's ServiceAccount.
pub fn cluster_role_binding(name: &str, role: &str) -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: meta(name, None),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: role.into(),
        },
        subjects: Some(service_account_subject()),
    }
}

/// The RoleBinding of `leader-election-role` to the operator's ServiceAccount.
pub fn leader_election_role_binding() -> RoleBinding {
    RoleBinding {
        metadata: meta("leader-election-rolebinding", Some(BASE_NAMESPACE)),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: "leader-election-role".into(),
        },
        subjects: Some(service_account_subject()),
    }
}
