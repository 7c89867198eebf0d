//! `config/crd` and `config/rbac`: the Memcached CRD from the Rust types, and the operator's
//! ServiceAccount, roles and bindings from [`memcached_operator::rbac`].

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::CustomResourceExt;
use memcached_api::Memcached;
use serde_json::json;

use super::{Doc, Error, File, Kustomization, labels, typed};
use memcached_operator::rbac::{self, BASE_NAMESPACE, SERVICE_ACCOUNT};

/// File name controller-gen gives the CRD.
pub const CRD_FILE: &str = "bases/memcached.cache.example.com_memcacheds.yaml";

pub(super) fn crd_files() -> Result<Vec<File>, Error> {
    Ok(vec![
        Doc::new("crd/bases/memcached.cache.example.com_memcacheds.yaml")
            .object(&Memcached::crd())?
            .finish(),
        Doc::new("crd/kustomization.yaml")
            .object(&Kustomization::resources(&[CRD_FILE]))?
            .finish(),
    ])
}

// ---------------------------------------------------------------------------------------
// config/rbac

/// The operator's ServiceAccount (kustomize base: namespace `system`).
pub(crate) fn service_account() -> Result<ServiceAccount, Error> {
    typed(
        "ServiceAccount",
        json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": SERVICE_ACCOUNT, "namespace": BASE_NAMESPACE, "labels": labels()},
        }),
    )
}

pub(super) fn rbac_files() -> Result<Vec<File>, Error> {
    let sa = service_account()?;
    Ok(vec![
        Doc::new("rbac/service_account.yaml").object(&sa)?.finish(),
        Doc::new("rbac/role.yaml")
            .comment("The controller's permissions: crates/operator/src/rbac.rs manager_rules().")
            .object(&rbac::manager_role())?
            .finish(),
        Doc::new("rbac/role_binding.yaml")
            .object(&rbac::cluster_role_binding(
                "manager-rolebinding",
                "manager-role",
            ))?
            .finish(),
        Doc::new("rbac/crd_reader_role.yaml")
            .comment("Cluster-scoped reads, bound cluster-wide: rbac.rs CLUSTER_READ_RULES.")
            .object(&rbac::crd_reader_role())?
            .finish(),
        Doc::new("rbac/crd_reader_role_binding.yaml")
            .object(&rbac::cluster_role_binding(
                "crd-reader-rolebinding",
                "crd-reader-role",
            ))?
            .finish(),
        Doc::new("rbac/leader_election_role.yaml")
            .comment("Leader election in the manager's namespace: rbac.rs LEADER_ELECTION_RULES.")
            .object(&rbac::leader_election_role())?
            .finish(),
        Doc::new("rbac/leader_election_role_binding.yaml")
            .object(&rbac::leader_election_role_binding())?
            .finish(),
        Doc::new("rbac/metrics_auth_role.yaml")
            .comment(
                "Authentication and authorization of metrics scrapers: rbac.rs METRICS_AUTH_RULES.",
            )
            .object(&rbac::metrics_auth_role())?
            .finish(),
        Doc::new("rbac/metrics_auth_role_binding.yaml")
            .object(&rbac::cluster_role_binding(
                "metrics-auth-rolebinding",
                "metrics-auth-role",
            ))?
            .finish(),
        Doc::new("rbac/metrics_reader_role.yaml")
            .comment("Bind this to the scraper (Prometheus) to let it read /metrics.")
            .object(&rbac::metrics_reader_role())?
            .finish(),
        Doc::new("rbac/memcached_editor_role.yaml")
            .comment("For users who create and edit Memcacheds (not used by the operator).")
            .object(&rbac::cluster_role(
                "memcached-editor-role",
                rbac::EDITOR_RULES,
            ))?
            .finish(),
        Doc::new("rbac/memcached_viewer_role.yaml")
            .comment("For users who only read Memcacheds (not used by the operator).")
            .object(&rbac::cluster_role(
                "memcached-viewer-role",
                rbac::VIEWER_RULES,
            ))?
            .finish(),
        Doc::new("rbac/kustomization.yaml")
            .object(&Kustomization::resources(&[
                "service_account.yaml",
                "role.yaml",
                "role_binding.yaml",
                "crd_reader_role.yaml",
                "crd_reader_role_binding.yaml",
                "leader_election_role.yaml",
                "leader_election_role_binding.yaml",
                "metrics_auth_role.yaml",
                "metrics_auth_role_binding.yaml",
                "metrics_reader_role.yaml",
                "memcached_editor_role.yaml",
                "memcached_viewer_role.yaml",
            ]))?
            .finish(),
    ])
}
