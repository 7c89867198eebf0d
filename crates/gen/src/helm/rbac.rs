//! The chart's cluster-wide definitions: the Memcached CRD (`templates/crd.yaml`) and the
//! operator's ServiceAccount and RBAC (`templates/rbac.yaml`), from the kustomize base's
//! `config/crd` and `config/rbac`.

use kube::CustomResourceExt;
use memcached_api::Memcached;
use serde_json::json;

use super::tpl::{self, Cond, T, tpl};
use super::{
    Doc, LABELS, Template, always, bind_to_release, cond, raw_entry, release_meta, to_value, when,
};
use crate::manifests::{self, Error};
use memcached_operator::rbac;

pub(super) fn crd_template() -> Result<Template, Error> {
    let mut crd = T::from(to_value("CRD", &Memcached::crd())?);
    let meta = crd.at(&["metadata"]);
    meta.set("labels", T::Map(vec![]))
        .at(&["labels"])
        .set("", raw_entry(LABELS));
    meta.set_when(
        "annotations",
        T::V(json!({"helm.sh/resource-policy": "keep"})),
        cond("$.Values.crds.keep"),
    );
    Ok(Template {
        path: "templates/crd.yaml",
        comment: "The Memcached CRD: upgraded with the chart, kept on uninstall (crds.keep).",
        preamble: "",
        docs: vec![when(crd, "$.Values.crds.install")],
    })
}

pub(super) fn rbac_template() -> Result<Template, Error> {
    let sa_name = || tpl("{{ include \"memcached-operator.serviceAccountName\" $ }}");
    let mut sa = T::from(to_value("ServiceAccount", &manifests::service_account()?)?);
    release_meta(&mut sa, true);
    let meta = sa.at(&["metadata"]);
    meta.set("name", sa_name());
    meta.set_when(
        "annotations",
        T::Yaml(".".into()),
        Cond::With("$.Values.serviceAccount.annotations".into()),
    );
    let cluster_role = |role: k8s_openapi::api::rbac::v1::ClusterRole| -> Result<T, Error> {
        let mut t = T::from(to_value("ClusterRole", &role)?);
        release_meta(&mut t, false);
        Ok(t)
    };
    let cluster_binding = |name: &str, role: &str| -> Result<T, Error> {
        let mut t = T::from(to_value(
            "ClusterRoleBinding",
            &rbac::cluster_role_binding(name, role),
        )?);
        release_meta(&mut t, false);
        bind_to_release(&mut t);
        Ok(t)
    };
    // With watchNamespaces, the manager's ClusterRole is bound in each watched namespace.
    let mut per_namespace = cluster_binding("manager-rolebinding", "manager-role")?;
    per_namespace.set("kind", T::V(json!("RoleBinding")));
    per_namespace
        .at(&["metadata"])
        .set("namespace", tpl("{{ . }}"));
    let mut range = String::from("{{- range $.Values.watchNamespaces }}\n");
    tpl::document(&mut range, &per_namespace, &Cond::Always);
    range.push_str("{{- end }}\n");

    let mut leader_role = T::from(to_value("Role", &rbac::leader_election_role())?);
    release_meta(&mut leader_role, true);
    let mut leader_binding = T::from(to_value(
        "RoleBinding",
        &rbac::leader_election_role_binding(),
    )?);
    release_meta(&mut leader_binding, true);
    bind_to_release(&mut leader_binding);

    Ok(Template {
        path: "templates/rbac.yaml",
        comment: "The operator's ServiceAccount and RBAC (crates/operator/src/rbac.rs).",
        preamble: "",
        docs: vec![
            when(sa, "$.Values.serviceAccount.create"),
            always(cluster_role(rbac::manager_role())?),
            when(
                cluster_binding("manager-rolebinding", "manager-role")?,
                "not $.Values.watchNamespaces",
            ),
            Doc::Raw(range),
            // Cluster-scoped reads are bound cluster-wide, watchNamespaces or not.
            always(cluster_role(rbac::crd_reader_role())?),
            always(cluster_binding(
                "crd-reader-rolebinding",
                "crd-reader-role",
            )?),
            when(leader_role, "$.Values.leaderElection.enabled"),
            when(leader_binding, "$.Values.leaderElection.enabled"),
            when(
                cluster_role(rbac::metrics_auth_role())?,
                "$.Values.metrics.enabled",
            ),
            when(
                cluster_binding("metrics-auth-rolebinding", "metrics-auth-role")?,
                "$.Values.metrics.enabled",
            ),
            when(
                cluster_role(rbac::metrics_reader_role())?,
                "$.Values.metrics.enabled",
            ),
            always(cluster_role(rbac::cluster_role(
                "memcached-editor-role",
                rbac::EDITOR_RULES,
            ))?),
            always(cluster_role(rbac::cluster_role(
                "memcached-viewer-role",
                rbac::VIEWER_RULES,
            ))?),
        ],
    })
}
