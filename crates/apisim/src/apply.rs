//! Server-side apply and field ownership: the leaf field paths each manager owns, kept in
//! `managedFields` (`fieldsV1`); updates take ownership of what they change, applies
//! conflict with other owners (unless forced) and remove the fields a manager stops
//! applying.

use crate::error::ApiError;
use crate::patch::merge_key;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet};

/// A field path: segments like `f:spec`, `k:{"name":"x"}`.
pub type FieldPath = Vec<String>;
pub type FieldSet = BTreeSet<FieldPath>;

const IGNORED_META: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
];

/// The set of leaf field paths of an object, as server-side apply tracks them.
pub fn field_set(obj: &Value, include_status: bool) -> FieldSet {
    let mut out = FieldSet::new();
    if let Value::Object(m) = obj {
        for (k, v) in m {
            match k.as_str() {
                "apiVersion" | "kind" => {}
                "status" if !include_status => {}
                "metadata" => {
                    if let Value::Object(mm) = v {
                        for (mk, mv) in mm {
                            if !IGNORED_META.contains(&mk.as_str()) {
                                walk(
                                    mv,
                                    vec!["f:metadata".into(), format!("f:{mk}")],
                                    mk,
                                    &mut out,
                                );
                            }
                        }
                    }
                }
                _ => walk(v, vec![format!("f:{k}")], k, &mut out),
            }
        }
    }
    out
}

fn key_segment(item: &Value, mk: &str) -> String {
    let mut m = Map::new();
    m.insert(mk.to_string(), item[mk].clone());
    format!("k:{}", Value::Object(m))
}

fn walk(v: &Value, prefix: FieldPath, field: &str, out: &mut FieldSet) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, c) in m {
                let mut p = prefix.clone();
                p.push(format!("f:{k}"));
                walk(c, p, k, out);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            if let Some(mk) = merge_key(field, items) {
                for it in items {
                    let mut p = prefix.clone();
                    p.push(key_segment(it, &mk));
                    out.insert(p.clone());
                    if let Value::Object(m) = it {
                        for (k, c) in m {
                            let mut pp = p.clone();
                            pp.push(format!("f:{k}"));
                            walk(c, pp, k, out);
                        }
                    }
                }
            } else if field == "finalizers" {
                for it in items {
                    let mut p = prefix.clone();
                    p.push(format!("v:{it}"));
                    out.insert(p);
                }
            } else {
                out.insert(prefix);
            }
        }
        _ => {
            out.insert(prefix);
        }
    }
}

/// The value at a field path, if present.
pub fn get_at<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = v;
    for seg in path {
        if let Some(f) = seg.strip_prefix("f:") {
            cur = cur.as_object()?.get(f)?;
        } else if let Some(k) = seg.strip_prefix("k:") {
            let key: Map<String, Value> = serde_json::from_str(k).ok()?;
            cur = cur
                .as_array()?
                .iter()
                .find(|i| key.iter().all(|(kk, kv)| &i[kk] == kv))?;
        } else if let Some(k) = seg.strip_prefix("v:") {
            let val: Value = serde_json::from_str(k).ok()?;
            cur = cur.as_array()?.iter().find(|i| **i == val)?;
        } else {
            return None;
        }
    }
    Some(cur)
}

/// Remove the field at a path (no-op if absent).
pub fn remove_at(v: &mut Value, path: &[String]) {
    let Some((last, parent_path)) = path.split_last() else {
        return;
    };
    let mut cur = v;
    for seg in parent_path {
        let next = if let Some(f) = seg.strip_prefix("f:") {
            cur.as_object_mut().and_then(|m| m.get_mut(f))
        } else if let Some(k) = seg.strip_prefix("k:") {
            let Ok(key) = serde_json::from_str::<Map<String, Value>>(k) else {
                return;
            };
            cur.as_array_mut().and_then(|a| {
                a.iter_mut()
                    .find(|i| key.iter().all(|(kk, kv)| &i[kk] == kv))
            })
        } else {
            None
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    if let Some(f) = last.strip_prefix("f:") {
        if let Some(m) = cur.as_object_mut() {
            m.remove(f);
        }
    } else if let Some(k) = last.strip_prefix("k:") {
        if let (Ok(key), Some(a)) = (
            serde_json::from_str::<Map<String, Value>>(k),
            cur.as_array_mut(),
        ) {
            a.retain(|i| !key.iter().all(|(kk, kv)| &i[kk] == kv));
        }
    } else if let Some(k) = last.strip_prefix("v:")
        && let (Ok(val), Some(a)) = (serde_json::from_str::<Value>(k), cur.as_array_mut())
    {
        a.retain(|i| *i != val);
    }
}

/// `fieldsV1` JSON from a field set.
pub fn to_fields_v1(set: &FieldSet) -> Value {
    #[derive(Default)]
    struct Node {
        leaf: bool,
        children: BTreeMap<String, Node>,
    }
    let mut root = Node::default();
    for p in set {
        let mut n = &mut root;
        for s in p {
            n = n.children.entry(s.clone()).or_default();
        }
        n.leaf = true;
    }
    fn render(n: &Node) -> Value {
        let mut m = Map::new();
        if n.leaf && !n.children.is_empty() {
            m.insert(".".into(), json!({}));
        }
        for (k, c) in &n.children {
            m.insert(k.clone(), render(c));
        }
        Value::Object(m)
    }
    render(&root)
}

/// Field set from `fieldsV1` JSON.
pub fn from_fields_v1(v: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    fn rec(v: &Value, prefix: &mut FieldPath, out: &mut FieldSet) {
        if let Value::Object(m) = v {
            for (k, c) in m {
                if k == "." {
                    out.insert(prefix.clone());
                    continue;
                }
                prefix.push(k.clone());
                if c.as_object().is_some_and(|m| m.is_empty()) {
                    out.insert(prefix.clone());
                } else {
                    rec(c, prefix, out);
                }
                prefix.pop();
            }
        }
    }
    rec(v, &mut vec![], &mut out);
    out
}

/// One `managedFields` entry, parsed.
#[derive(Debug, Clone)]
pub struct Manager {
    pub manager: String,
    pub operation: String,
    pub api_version: String,
    pub subresource: String,
    pub time: String,
    pub fields: FieldSet,
}

pub fn read_managers(obj: &Value) -> Vec<Manager> {
    obj["metadata"]["managedFields"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| Manager {
                    manager: e["manager"].as_str().unwrap_or("").into(),
                    operation: e["operation"].as_str().unwrap_or("Update").into(),
                    api_version: e["apiVersion"].as_str().unwrap_or("").into(),
                    subresource: e["subresource"].as_str().unwrap_or("").into(),
                    time: e["time"].as_str().unwrap_or("").into(),
                    fields: from_fields_v1(&e["fieldsV1"]),
                })
                .collect()
        })
        .unwrap_or_default()
}

pub fn write_managers(obj: &mut Value, ms: &[Manager]) {
    let entries: Vec<Value> = ms
        .iter()
        .filter(|m| !m.fields.is_empty())
        .map(|m| {
            let mut e = json!({
                "manager": m.manager,
                "operation": m.operation,
                "apiVersion": m.api_version,
                "time": m.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": to_fields_v1(&m.fields),
            });
            if !m.subresource.is_empty() {
                e["subresource"] = json!(m.subresource);
            }
            e
        })
        .collect();
    let meta = crate::util::meta_mut(obj);
    if entries.is_empty() {
        meta.remove("managedFields");
    } else {
        meta.insert("managedFields".into(), Value::Array(entries));
    }
}

/// Record an `Update` operation by `manager`: it takes ownership of every field it changed.
pub fn track_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    api_version: &str,
    subresource: &str,
) {
    let mut ms = match old {
        Some(o) => read_managers(o),
        None => vec![],
    };
    let include_status = subresource == "status" || subresource.is_empty();
    let changed: FieldSet = field_set(new, include_status)
        .into_iter()
        .filter(|p| match old {
            Some(o) => get_at(o, p) != get_at(new, p),
            None => true,
        })
        .collect();
    for m in ms.iter_mut() {
        if m.manager != manager || m.operation != "Update" || m.subresource != subresource {
            m.fields.retain(|p| !changed.contains(p));
        }
        m.fields.retain(|p| get_at(new, p).is_some());
    }
    if !changed.is_empty() {
        let now = crate::util::now_rfc3339();
        match ms.iter_mut().find(|m| {
            m.manager == manager && m.operation == "Update" && m.subresource == subresource
        }) {
            Some(m) => {
                m.fields.extend(changed);
                m.time = now;
                m.api_version = api_version.into();
            }
            None => ms.push(Manager {
                manager: manager.into(),
                operation: "Update".into(),
                api_version: api_version.into(),
                subresource: subresource.into(),
                time: now,
                fields: changed,
            }),
        }
    }
    write_managers(new, &ms);
}

/// Merge an applied configuration into the live object (maps recursively, keyed lists by key).
pub fn apply_merge(live: &mut Value, applied: &Value, field: &str) {
    match (live, applied) {
        (l @ Value::Object(_), Value::Object(a)) => {
            let Some(lm) = l.as_object_mut() else { return };
            for (k, v) in a {
                if v.is_null() {
                    continue;
                }
                match lm.get_mut(k) {
                    Some(cur) => apply_merge(cur, v, k),
                    None => {
                        lm.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (Value::Array(l), Value::Array(a)) => {
            if let Some(mk) = merge_key(field, a).filter(|_| l.iter().all(Value::is_object)) {
                for it in a {
                    match l.iter().position(|c| c[mk.as_str()] == it[mk.as_str()]) {
                        Some(i) => apply_merge(&mut l[i], it, field),
                        None => l.push(it.clone()),
                    }
                }
            } else if field == "finalizers" {
                for it in a {
                    if !l.contains(it) {
                        l.push(it.clone());
                    }
                }
            } else {
                *l = a.clone();
            }
        }
        (l, a) => *l = a.clone(),
    }
}

fn path_string(p: &FieldPath) -> String {
    let mut s = String::new();
    for seg in p {
        if let Some(f) = seg.strip_prefix("f:") {
            s.push('.');
            s.push_str(f);
        } else if let Some(k) = seg.strip_prefix("k:") {
            s.push('[');
            s.push_str(&k.replace(['{', '}'], "").replace(':', "="));
            s.push(']');
        } else if let Some(v) = seg.strip_prefix("v:") {
            s.push_str(&format!("[{v}]"));
        }
    }
    s
}

/// Server-side apply. Returns the new object (with managedFields) or a 409 conflict.
pub fn server_side_apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    api_version: &str,
    subresource: &str,
    status_subresource: bool,
) -> Result<Value, ApiError> {
    let include_status = subresource == "status" || !status_subresource;
    let mut applied = applied.clone();
    if !include_status && let Some(m) = applied.as_object_mut() {
        m.remove("status");
    }
    let new_set = field_set(&applied, include_status);
    let mut ms = live.map(read_managers).unwrap_or_default();
    let mut obj = live.cloned().unwrap_or_else(|| json!({}));
    // conflicts
    let mut conflicts: Vec<(String, String, String)> = vec![];
    for m in ms.iter() {
        if m.manager == manager && m.operation == "Apply" {
            continue;
        }
        for p in &new_set {
            if m.fields.contains(p) && get_at(&obj, p) != get_at(&applied, p) {
                conflicts.push((m.manager.clone(), m.api_version.clone(), path_string(p)));
            }
        }
    }
    if !conflicts.is_empty() && !force {
        // the structured-merge-diff wording: grouped by manager
        let mut groups: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        for (m, av, f) in &conflicts {
            groups
                .entry((m.clone(), av.clone()))
                .or_default()
                .push(f.clone());
        }
        let parts: Vec<String> = groups
            .iter()
            .map(|((m, av), fs)| {
                if fs.len() == 1 {
                    format!("conflict with \"{m}\" using {av}: {}", fs[0])
                } else {
                    let lines: Vec<String> = fs.iter().map(|f| format!("- {f}")).collect();
                    format!("conflicts with \"{m}\" using {av}:\n{}", lines.join("\n"))
                }
            })
            .collect();
        let n = conflicts.len();
        let msg = format!(
            "Apply failed with {n} conflict{}: {}",
            if n == 1 { "" } else { "s" },
            parts.join("\n")
        );
        let causes: Vec<Value> = conflicts
            .iter()
            .map(|(m, av, f)| json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{m}\" using {av}"), "field": f}))
            .collect();
        return Err(ApiError::new(409, msg).with_details(json!({"causes": causes})));
    }
    if force {
        for m in ms.iter_mut() {
            if !(m.manager == manager && m.operation == "Apply") {
                m.fields
                    .retain(|p| !(new_set.contains(p) && get_at(&obj, p) != get_at(&applied, p)));
            }
        }
    }
    // fields this manager applied before and no longer applies: remove if nobody else owns them
    let prev: FieldSet = ms
        .iter()
        .find(|m| m.manager == manager && m.operation == "Apply" && m.subresource == subresource)
        .map(|m| m.fields.clone())
        .unwrap_or_default();
    let mut removed: Vec<&FieldPath> = prev
        .iter()
        .filter(|p| !new_set.contains(*p))
        .filter(|p| {
            !ms.iter().any(|m| {
                !(m.manager == manager && m.operation == "Apply" && m.subresource == subresource)
                    && m.fields.contains(*p)
            })
        })
        .collect();
    // shallowest first: a keyed list item goes as a whole (children then no-op)
    removed.sort_by_key(|p| p.len());
    for p in removed {
        // never remove the key field of a keyed list item that stays
        if let [.., parent, last] = p.as_slice()
            && let (Some(k), Some(f)) = (parent.strip_prefix("k:"), last.strip_prefix("f:"))
            && serde_json::from_str::<Map<String, Value>>(k).is_ok_and(|m| m.contains_key(f))
        {
            continue;
        }
        // don't remove a keyed item if some other manager owns a field inside it
        let inside_owned = ms.iter().any(|m| {
            !(m.manager == manager && m.operation == "Apply")
                && m.fields
                    .iter()
                    .any(|q| q.len() > p.len() && q.starts_with(p))
        });
        if !inside_owned {
            remove_at(&mut obj, p);
        }
    }
    // A map this manager applied and now applies nothing in goes as a whole (the real
    // server tracks the map itself as a member, `.`), with whatever the server defaulted
    // in it, unless another manager owns a field inside it: dropping `spec.x` from an
    // apply removes `spec.x`, not only the fields the manager wrote there.
    let mut emptied: Vec<FieldPath> = prev
        .iter()
        .filter(|p| !new_set.contains(*p))
        .flat_map(|p| (2..p.len()).map(move |n| p[..n].to_vec()))
        .filter(|m| m.last().is_some_and(|s| s.starts_with("f:")))
        .filter(|m| !new_set.iter().any(|q| q.starts_with(m)))
        .filter(|m| {
            !ms.iter().any(|other| {
                !(other.manager == manager
                    && other.operation == "Apply"
                    && other.subresource == subresource)
                    && other.fields.iter().any(|q| q.starts_with(m))
            })
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    emptied.sort_by_key(|p| p.len());
    for m in emptied {
        if get_at(&obj, &m).is_some_and(Value::is_object) {
            remove_at(&mut obj, &m);
        }
    }
    apply_merge(&mut obj, &applied, "");
    let now = crate::util::now_rfc3339();
    ms.retain(|m| {
        !(m.manager == manager && m.operation == "Apply" && m.subresource == subresource)
    });
    ms.push(Manager {
        manager: manager.into(),
        operation: "Apply".into(),
        api_version: api_version.into(),
        subresource: subresource.into(),
        time: now,
        fields: new_set,
    });
    for m in ms.iter_mut() {
        m.fields.retain(|p| get_at(&obj, p).is_some());
    }
    write_managers(&mut obj, &ms);
    Ok(obj)
}
