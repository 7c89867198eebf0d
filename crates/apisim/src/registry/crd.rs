//! A CRD turned into the kind it defines: names, scope, served versions (storage version
//! first), schemas, subresources and printer columns, with the API server's checks of the
//! CRD itself.

use super::{ResourceType, ScalePaths, version_priority};
use serde_json::{Value, json};
use std::collections::HashMap;

/// Build a resource type from a CRD object. Errors are field messages.
pub fn from_crd(crd: &Value) -> Result<ResourceType, Vec<crate::error::FieldError>> {
    use crate::error::FieldError;
    let mut errs = vec![];
    let spec = &crd["spec"];
    let group = spec["group"].as_str().unwrap_or("").to_string();
    let names = &spec["names"];
    let plural = names["plural"].as_str().unwrap_or("").to_string();
    let kind = names["kind"].as_str().unwrap_or("").to_string();
    if group.is_empty() {
        errs.push(FieldError::required("spec.group", ""));
    }
    if plural.is_empty() {
        errs.push(FieldError::required("spec.names.plural", ""));
    }
    if kind.is_empty() {
        errs.push(FieldError::required("spec.names.kind", ""));
    }
    let scope = spec["scope"].as_str().unwrap_or("");
    if scope != "Namespaced" && scope != "Cluster" {
        errs.push(FieldError::other(
            "FieldValueNotSupported",
            "spec.scope",
            format!(
                "Unsupported value: {}: supported values: \"Cluster\", \"Namespaced\"",
                crate::error::show(&spec["scope"])
            ),
        ));
    }
    let name = crd["metadata"]["name"].as_str().unwrap_or("");
    if !plural.is_empty() && !group.is_empty() && name != format!("{plural}.{group}") {
        errs.push(FieldError::invalid(
            "metadata.name",
            &json!(name),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    if versions.is_empty() {
        errs.push(FieldError::required(
            "spec.versions",
            "must have exactly one version marked as storage version",
        ));
    }
    let storage_count = versions
        .iter()
        .filter(|v| v["storage"].as_bool() == Some(true))
        .count();
    if !versions.is_empty() && storage_count != 1 {
        errs.push(FieldError::invalid(
            "spec.versions",
            &json!(
                versions
                    .iter()
                    .map(|v| v["name"].clone())
                    .collect::<Vec<_>>()
            ),
            "must have exactly one version marked as storage version",
        ));
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    let mut served: Vec<String> = vec![];
    let mut schemas = HashMap::new();
    let mut status = false;
    let mut scale = None;
    let storage = versions
        .iter()
        .find(|v| v["storage"].as_bool() == Some(true))
        .cloned()
        .unwrap_or(Value::Null);
    for v in &versions {
        let vn = v["name"].as_str().unwrap_or("").to_string();
        if v["served"].as_bool() == Some(true) {
            served.push(vn.clone());
        }
        if let Some(s) = v.pointer("/schema/openAPIV3Schema") {
            schemas.insert(vn.clone(), s.clone());
        } else if let Some(s) = spec.pointer("/validation/openAPIV3Schema") {
            schemas.insert(vn.clone(), s.clone());
        }
    }
    let subs = if storage["subresources"].is_object() {
        &storage["subresources"]
    } else {
        &spec["subresources"]
    };
    if subs["status"].is_object() {
        status = true;
    }
    if let Some(sc) = subs["scale"].as_object() {
        scale = Some(ScalePaths {
            spec_replicas: sc
                .get("specReplicasPath")
                .and_then(Value::as_str)
                .unwrap_or(".spec.replicas")
                .to_string(),
            status_replicas: sc
                .get("statusReplicasPath")
                .and_then(Value::as_str)
                .unwrap_or(".status.replicas")
                .to_string(),
            label_selector: sc
                .get("labelSelectorPath")
                .and_then(Value::as_str)
                .map(str::to_string),
        });
    }
    // storage version first, then by priority
    let sv = storage["name"].as_str().unwrap_or("").to_string();
    served.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
    if let Some(pos) = served.iter().position(|v| *v == sv) {
        let s = served.remove(pos);
        served.insert(0, s);
    }
    let str_list = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    Ok(ResourceType {
        group,
        versions: served,
        singular: names["singular"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| kind.to_lowercase()),
        list_kind: names["listKind"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| format!("{kind}List")),
        plural,
        kind,
        namespaced: scope == "Namespaced",
        status,
        scale,
        short_names: str_list(&names["shortNames"]),
        categories: str_list(&names["categories"]),
        create_only: false,
        label_name: false,
        generation: true,
        crd: true,
        schemas,
        printer_columns: storage["additionalPrinterColumns"]
            .as_array()
            .map(|cols| {
                cols.iter()
                    .map(|c| {
                        let s = |k: &str| c[k].as_str().unwrap_or("").to_string();
                        (s("name"), s("type"), s("jsonPath"))
                    })
                    .collect()
            })
            .unwrap_or_default(),
    })
}
