//! Synchronous reviews: TokenReview (the tokens registered with `ApiServer::allow_token`)
//! and SubjectAccessReview (RBAC evaluated over the stored Roles, ClusterRoles and their
//! bindings). Answered on create, nothing stored.

use crate::error::ApiError;
use crate::registry::ResourceType;
use crate::store::State;
use crate::util::meta_str;
use serde_json::{Value, json};

fn str_list(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn has(list: &[String], want: &str) -> bool {
    list.iter().any(|x| x == "*" || x == want)
}

/// Answer a TokenReview or SubjectAccessReview (nothing is stored).
pub fn review(st: &State, rt: &ResourceType, mut obj: Value) -> Result<Value, ApiError> {
    match rt.kind.as_str() {
        "TokenReview" => {
            let token = obj["spec"]["token"].as_str().unwrap_or("");
            obj["status"] = match st.tokens.get(token) {
                Some((user, groups)) => json!({
                    "authenticated": true,
                    "user": {"username": user, "groups": groups},
                    "audiences": obj["spec"]["audiences"].clone(),
                }),
                None => json!({"authenticated": false, "error": "invalid bearer token"}),
            };
            Ok(obj)
        }
        "SubjectAccessReview" => {
            let (allowed, reason) = rbac_allows(st, &obj["spec"]);
            obj["status"] = json!({"allowed": allowed, "reason": reason});
            Ok(obj)
        }
        _ => Err(ApiError::method_not_allowed("create only")),
    }
}

fn rbac_allows(st: &State, spec: &Value) -> (bool, String) {
    let user = spec["user"].as_str().unwrap_or("");
    let groups = str_list(&spec["groups"]);
    if groups.iter().any(|g| g == "system:masters") {
        return (true, "system:masters".into());
    }
    let ra = &spec["resourceAttributes"];
    let nra = &spec["nonResourceAttributes"];
    let ns = ra["namespace"].as_str().unwrap_or("");
    let subject_matches = |b: &Value| -> bool {
        b["subjects"].as_array().is_some_and(|subs| {
            subs.iter().any(|s| {
                let name = s["name"].as_str().unwrap_or("");
                match s["kind"].as_str().unwrap_or("") {
                    "User" => name == user,
                    "Group" => groups.iter().any(|g| g == name),
                    "ServiceAccount" => {
                        user == format!(
                            "system:serviceaccount:{}:{}",
                            s["namespace"].as_str().unwrap_or(""),
                            name
                        )
                    }
                    _ => false,
                }
            })
        })
    };
    let rbac = "rbac.authorization.k8s.io".to_string();
    let role_rules = |kind: &str, name: &str, bns: &str| -> Vec<Value> {
        let (plural, rns) = if kind == "ClusterRole" {
            ("clusterroles", "")
        } else {
            ("roles", bns)
        };
        st.get(&(rbac.clone(), plural.into()), rns, name)
            .and_then(|r| r["rules"].as_array().cloned())
            .unwrap_or_default()
    };
    let rule_ok = |rule: &Value| -> bool {
        let verbs = str_list(&rule["verbs"]);
        if nra.is_object() {
            let path = nra["path"].as_str().unwrap_or("");
            let verb = nra["verb"].as_str().unwrap_or("");
            return has(&verbs, verb)
                && str_list(&rule["nonResourceURLs"]).iter().any(|u| {
                    u == "*"
                        || u == path
                        || u.strip_suffix('*').is_some_and(|p| path.starts_with(p))
                });
        }
        let verb = ra["verb"].as_str().unwrap_or("");
        let group = ra["group"].as_str().unwrap_or("");
        let resource = ra["resource"].as_str().unwrap_or("");
        let sub = ra["subresource"].as_str().unwrap_or("");
        let name = ra["name"].as_str().unwrap_or("");
        let full = if sub.is_empty() {
            resource.to_string()
        } else {
            format!("{resource}/{sub}")
        };
        let resources = str_list(&rule["resources"]);
        let names = str_list(&rule["resourceNames"]);
        has(&verbs, verb)
            && has(&str_list(&rule["apiGroups"]), group)
            && (resources
                .iter()
                .any(|r| r == "*" || *r == full || (!sub.is_empty() && *r == format!("*/{sub}"))))
            && (names.is_empty() || names.iter().any(|n| n == name))
    };
    for b in st.list(&(rbac.clone(), "clusterrolebindings".into()), None) {
        if subject_matches(&b) {
            let rr = &b["roleRef"];
            if role_rules("ClusterRole", rr["name"].as_str().unwrap_or(""), "")
                .iter()
                .any(rule_ok)
            {
                return (
                    true,
                    format!(
                        "RBAC: allowed by ClusterRoleBinding \"{}\"",
                        meta_str(&b, "name")
                    ),
                );
            }
        }
    }
    if !ns.is_empty() && nra.is_null() {
        for b in st.list(&(rbac.clone(), "rolebindings".into()), Some(ns)) {
            if subject_matches(&b) {
                let rr = &b["roleRef"];
                let kind = rr["kind"].as_str().unwrap_or("Role");
                if role_rules(kind, rr["name"].as_str().unwrap_or(""), ns)
                    .iter()
                    .any(rule_ok)
                {
                    return (
                        true,
                        format!(
                            "RBAC: allowed by RoleBinding \"{}/{}\"",
                            ns,
                            meta_str(&b, "name")
                        ),
                    );
                }
            }
        }
    }
    (false, String::new())
}
