//! `meta.k8s.io/v1` Table responses (what `kubectl get` asks for).

use crate::registry::ResourceType;
use crate::util::meta_str;
use serde_json::{Value, json};

/// Age the way kubectl prints it.
pub fn age(ts: &str) -> String {
    let Ok(t) = ts.parse::<jiff::Timestamp>() else {
        return "<unknown>".into();
    };
    let secs = (jiff::Timestamp::now().as_second() - t.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// Evaluate the small JSONPath subset printer columns use: `.a.b`, `.a[0]`,
/// `.a[?(@.k=="v")].b`.
pub fn jsonpath<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    let p = path.trim().trim_start_matches('{').trim_end_matches('}');
    let p = p.strip_prefix('$').unwrap_or(p);
    let mut cur = v;
    let mut rest = p;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let key = &r[..end];
            if !key.is_empty() {
                cur = cur.get(key)?;
            }
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            let inner = &r[..end];
            rest = &r[end + 1..];
            if let Some(f) = inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')')) {
                let (k, want) = f.split_once("==")?;
                let want = want.trim().trim_matches(|c| c == '"' || c == '\'');
                cur = cur.as_array()?.iter().find(|i| match &i[k.trim()] {
                    Value::String(s) => s == want,
                    other => *other == want,
                })?;
            } else {
                let i: usize = inner.parse().ok()?;
                cur = cur.as_array()?.get(i)?;
            }
        } else {
            return None;
        }
    }
    Some(cur)
}

fn cell(v: Option<&Value>, ty: &str) -> Value {
    match (v, ty) {
        (None | Some(Value::Null), _) => json!("<none>"),
        (Some(Value::String(s)), "date") => json!(age(s)),
        (Some(Value::String(s)), _) => json!(s),
        (Some(Value::Array(a)), _) => json!(
            a.iter()
                .map(|x| x
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| x.to_string()))
                .collect::<Vec<_>>()
                .join(",")
        ),
        (Some(o), _) => o.clone(),
    }
}

fn col(name: &str, ty: &str) -> Value {
    let format = if name == "Name" { "name" } else { "" };
    json!({"name": name, "type": ty, "format": format, "description": "", "priority": 0})
}

fn num(o: &Value, p: &str) -> i64 {
    jsonpath(o, p).and_then(Value::as_i64).unwrap_or(0)
}

/// Column definitions and one row of cells per object.
fn columns(rt: &ResourceType, items: &[Value]) -> (Vec<Value>, Vec<Vec<Value>>) {
    let name = |o: &Value| json!(meta_str(o, "name"));
    let created = |o: &Value| json!(age(meta_str(o, "creationTimestamp")));
    let mut defs = vec![col("Name", "string")];
    type CellFn = Box<dyn Fn(&Value) -> Value>;
    let mut fns: Vec<CellFn> = vec![Box::new(name)];
    let mut add = |n: &str, ty: &str, f: CellFn| {
        defs.push(col(n, ty));
        fns.push(f);
    };
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "pods") => {
            add(
                "Ready",
                "string",
                Box::new(|o| {
                    let cs = o["status"]["containerStatuses"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    let total = o["spec"]["containers"]
                        .as_array()
                        .map(Vec::len)
                        .unwrap_or(0);
                    let ready = cs.iter().filter(|c| c["ready"] == true).count();
                    json!(format!("{ready}/{total}"))
                }),
            );
            add(
                "Status",
                "string",
                Box::new(|o| {
                    if !o["metadata"]["deletionTimestamp"].is_null() {
                        json!("Terminating")
                    } else {
                        cell(o.pointer("/status/phase"), "string")
                    }
                }),
            );
            add(
                "Restarts",
                "integer",
                Box::new(|o| {
                    json!(
                        o["status"]["containerStatuses"]
                            .as_array()
                            .map(|cs| cs
                                .iter()
                                .map(|c| c["restartCount"].as_i64().unwrap_or(0))
                                .sum::<i64>())
                            .unwrap_or(0)
                    )
                }),
            );
        }
        ("apps", "deployments") => {
            add(
                "Ready",
                "string",
                Box::new(|o| {
                    json!(format!(
                        "{}/{}",
                        num(o, ".status.readyReplicas"),
                        num(o, ".spec.replicas")
                    ))
                }),
            );
            add(
                "Up-to-date",
                "integer",
                Box::new(|o| json!(num(o, ".status.updatedReplicas"))),
            );
            add(
                "Available",
                "integer",
                Box::new(|o| json!(num(o, ".status.availableReplicas"))),
            );
        }
        ("apps", "replicasets") => {
            add(
                "Desired",
                "integer",
                Box::new(|o| json!(num(o, ".spec.replicas"))),
            );
            add(
                "Current",
                "integer",
                Box::new(|o| json!(num(o, ".status.replicas"))),
            );
            add(
                "Ready",
                "integer",
                Box::new(|o| json!(num(o, ".status.readyReplicas"))),
            );
        }
        ("", "services") => {
            add(
                "Type",
                "string",
                Box::new(|o| cell(o.pointer("/spec/type"), "string")),
            );
            add(
                "Cluster-IP",
                "string",
                Box::new(|o| cell(o.pointer("/spec/clusterIP"), "string")),
            );
            add(
                "Ports",
                "string",
                Box::new(|o| {
                    let ports: Vec<String> = o["spec"]["ports"]
                        .as_array()
                        .map(|ps| {
                            ps.iter()
                                .map(|p| {
                                    format!(
                                        "{}/{}",
                                        p["port"],
                                        p["protocol"].as_str().unwrap_or("TCP")
                                    )
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    json!(if ports.is_empty() {
                        "<none>".to_string()
                    } else {
                        ports.join(",")
                    })
                }),
            );
        }
        ("", "namespaces") => {
            add(
                "Status",
                "string",
                Box::new(|o| cell(o.pointer("/status/phase"), "string")),
            );
        }
        _ => {
            for pc in &rt.printer_columns {
                let (n, ty, p) = (pc.0.clone(), pc.1.clone(), pc.2.clone());
                if n.eq_ignore_ascii_case("age") && p == ".metadata.creationTimestamp" {
                    continue;
                }
                let ty2 = ty.clone();
                add(&n, &ty, Box::new(move |o| cell(jsonpath(o, &p), &ty2)));
            }
        }
    }
    add("Age", "string", Box::new(created));
    let rows = items
        .iter()
        .map(|o| fns.iter().map(|f| f(o)).collect())
        .collect();
    (defs, rows)
}

pub fn table(rt: &ResourceType, items: &[Value], rv: &str, cont: Option<&str>) -> Value {
    let (defs, cells) = columns(rt, items);
    let rows: Vec<Value> = items
        .iter()
        .zip(cells)
        .map(|(o, c)| {
            json!({
                "cells": c,
                "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]},
            })
        })
        .collect();
    let mut meta = json!({"resourceVersion": rv});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "columnDefinitions": defs, "rows": rows})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonpath_subset() {
        let o = json!({"spec": {"size": 3}, "status": {"conditions": [
            {"type": "Progressing", "status": "False"}, {"type": "Available", "status": "True"}
        ], "nodes": ["a", "b"]}});
        assert_eq!(jsonpath(&o, ".spec.size"), Some(&json!(3)));
        assert_eq!(
            jsonpath(&o, ".status.conditions[?(@.type==\"Available\")].status"),
            Some(&json!("True"))
        );
        assert_eq!(jsonpath(&o, ".status.nodes[1]"), Some(&json!("b")));
        assert_eq!(jsonpath(&o, ".status.missing"), None);
        assert_eq!(cell(jsonpath(&o, ".status.nodes"), "string"), json!("a,b"));
    }

    #[test]
    fn crd_printer_columns_in_table() {
        let mut rt = crate::registry::Registry::with_builtins()
            .types
            .get(&("".to_string(), "configmaps".to_string()))
            .map(|rt| (**rt).clone())
            .unwrap();
        rt.plural = "memcacheds".into();
        rt.group = "x.io".into();
        rt.printer_columns = vec![("Size".into(), "integer".into(), ".spec.size".into())];
        let t = table(
            &rt,
            &[json!({"metadata": {"name": "m"}, "spec": {"size": 2}})],
            "1",
            None,
        );
        let names: Vec<&str> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, vec!["Name", "Size", "Age"]);
        assert_eq!(t["rows"][0]["cells"][1], 2);
    }
}
