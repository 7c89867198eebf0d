//! A YAML tree with Helm template holes, and its emitter.
//!
//! The chart's objects start as the same JSON the kustomize tree is generated from
//! ([`T::from`]); the chart then replaces a few values by template text (names, the image,
//! `toYaml .Values.resources`) and makes a few map entries and list items conditional
//! (`{{- if … }}`). The emitter writes block YAML with the template directives on lines of
//! their own, indented with the content they guard, so `helm template` renders valid YAML
//! for every combination of values.

use std::fmt::Write as _;

use serde_json::Value;

/// A node of the tree.
#[derive(Debug, Clone, PartialEq)]
pub enum T {
    /// A plain value (maps and lists are converted on emit).
    V(Value),
    /// A map whose entries may be conditional.
    Map(Vec<Entry>),
    /// A list whose items may be conditional.
    List(Vec<Item>),
    /// Template text in the place of a scalar, emitted as is (`{{ $.Values.replicaCount }}`).
    Tpl(String),
    /// The YAML of a template expression, on the lines below its key
    /// (`{{- toYaml EXPR | nindent N }}`).
    Yaml(String),
    /// Lines of template text inside a map or list, at its indentation; `{indent}` in the
    /// text becomes the indentation's width (for `nindent`).
    Raw(String),
}

/// When an entry or item is present.
#[derive(Debug, Clone, PartialEq)]
pub enum Cond {
    Always,
    /// `{{- if EXPR }}`.
    If(String),
    /// `{{- with EXPR }}`: inside, `.` is the value of EXPR.
    With(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub key: String,
    pub value: T,
    pub cond: Cond,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub value: T,
    pub cond: Cond,
}

impl From<Value> for T {
    fn from(v: Value) -> T {
        match v {
            Value::Object(m) => T::Map(
                m.into_iter()
                    .map(|(key, value)| Entry {
                        key,
                        value: T::from(value),
                        cond: Cond::Always,
                    })
                    .collect(),
            ),
            Value::Array(a) => T::List(
                a.into_iter()
                    .map(|value| Item {
                        value: T::from(value),
                        cond: Cond::Always,
                    })
                    .collect(),
            ),
            scalar => T::V(scalar),
        }
    }
}

/// Template text.
pub fn tpl(s: impl Into<String>) -> T {
    T::Tpl(s.into())
}

impl T {
    /// A plain map or list as a [`T::Map`] or [`T::List`], so its parts can be edited.
    fn expand(&mut self) {
        if let T::V(v @ (Value::Object(_) | Value::Array(_))) = self {
            *self = T::from(v.take());
        }
    }

    /// The node at `path` (map keys, or list indexes as numbers), if there is one.
    pub fn get_mut(&mut self, path: &[&str]) -> Option<&mut T> {
        let Some((first, rest)) = path.split_first() else {
            return Some(self);
        };
        self.expand();
        let child = match self {
            T::Map(entries) => entries
                .iter_mut()
                .find(|e| e.key == *first)
                .map(|e| &mut e.value),
            T::List(items) => first
                .parse::<usize>()
                .ok()
                .and_then(|i| items.get_mut(i))
                .map(|i| &mut i.value),
            _ => None,
        }?;
        child.get_mut(rest)
    }

    /// The node at `path`; a path the generator does not have is a bug in the generator.
    pub fn at(&mut self, path: &[&str]) -> &mut T {
        match self.get_mut(path) {
            Some(t) => t,
            None => panic!("the chart generator names a missing path {path:?}"),
        }
    }

    /// Sets (or adds, at the end) map entry `key`.
    pub fn set(&mut self, key: &str, value: T) -> &mut T {
        self.set_when(key, value, Cond::Always)
    }

    /// Sets (or adds, at the end) map entry `key`, present only when `cond` holds.
    pub fn set_when(&mut self, key: &str, value: T, cond: Cond) -> &mut T {
        self.expand();
        let T::Map(entries) = self else {
            panic!("the chart generator sets {key} on a non-map");
        };
        match entries.iter_mut().find(|e| e.key == key) {
            Some(e) => {
                e.value = value;
                e.cond = cond;
            }
            None => entries.push(Entry {
                key: key.to_string(),
                value,
                cond,
            }),
        }
        self
    }

    /// Removes map entry `key` (if present).
    pub fn remove(&mut self, key: &str) -> &mut T {
        self.expand();
        if let T::Map(entries) = self {
            entries.retain(|e| e.key != key);
        }
        self
    }

    /// Adds a list item.
    pub fn push(&mut self, value: T, cond: Cond) -> &mut T {
        self.expand();
        let T::List(items) = self else {
            panic!("the chart generator pushes onto a non-list");
        };
        items.push(Item { value, cond });
        self
    }

    /// Makes every list item satisfying `pred` conditional.
    pub fn items_when(&mut self, pred: impl Fn(&T) -> bool, cond: Cond) -> &mut T {
        self.expand();
        if let T::List(items) = self {
            for item in items.iter_mut().filter(|i| pred(&i.value)) {
                item.cond = cond.clone();
            }
        }
        self
    }
}

fn open(out: &mut String, pad: &str, cond: &Cond) {
    match cond {
        Cond::Always => {}
        Cond::If(c) => {
            let _ = writeln!(out, "{pad}{{{{- if {c} }}}}");
        }
        Cond::With(c) => {
            let _ = writeln!(out, "{pad}{{{{- with {c} }}}}");
        }
    }
}

fn close(out: &mut String, pad: &str, cond: &Cond) {
    if *cond != Cond::Always {
        let _ = writeln!(out, "{pad}{{{{- end }}}}");
    }
}

/// A scalar as YAML; block scalars (multi-line strings) indented below `indent`.
fn scalar(v: &Value, indent: usize) -> String {
    let yaml = serde_yaml::to_string(v).unwrap_or_else(|_| v.to_string());
    let yaml = yaml.trim_end_matches('\n');
    let mut lines = yaml.lines();
    let mut s = lines.next().unwrap_or_default().to_string();
    let pad = " ".repeat(indent);
    for line in lines {
        s.push('\n');
        if !line.is_empty() {
            s.push_str(&pad);
        }
        s.push_str(line);
    }
    s
}

fn raw(out: &mut String, text: &str, indent: usize) {
    let pad = " ".repeat(indent);
    for line in text.replace("{indent}", &indent.to_string()).lines() {
        let _ = writeln!(out, "{pad}{line}");
    }
}

/// Writes `value` after `key:` (already written) at `indent`.
fn value_after_key(out: &mut String, value: &T, indent: usize) {
    match value {
        T::V(Value::Object(m)) if !m.is_empty() => {
            value_after_key(out, &T::from(Value::Object(m.clone())), indent)
        }
        T::V(Value::Array(a)) if !a.is_empty() => {
            value_after_key(out, &T::from(Value::Array(a.clone())), indent)
        }
        T::V(v) => {
            let _ = writeln!(out, " {}", scalar(v, indent + 2));
        }
        T::Tpl(s) => {
            let _ = writeln!(out, " {s}");
        }
        T::Yaml(expr) => {
            let _ = writeln!(
                out,
                "\n{}{{{{- toYaml {expr} | nindent {} }}}}",
                " ".repeat(indent + 2),
                indent + 2
            );
        }
        T::Map(entries) if entries.is_empty() => out.push_str(" {}\n"),
        T::Map(entries) => {
            out.push('\n');
            entries_at(out, entries, indent + 2);
        }
        T::List(items) if items.is_empty() => out.push_str(" []\n"),
        T::List(items) => {
            out.push('\n');
            items_at(out, items, indent);
        }
        T::Raw(text) => {
            out.push('\n');
            raw(out, text, indent + 2);
        }
    }
}

/// Writes map entries at `indent`.
pub fn entries_at(out: &mut String, entries: &[Entry], indent: usize) {
    let pad = " ".repeat(indent);
    for e in entries {
        open(out, &pad, &e.cond);
        if let T::Raw(text) = &e.value {
            raw(out, text, indent);
        } else {
            let _ = write!(out, "{pad}{}:", scalar(&Value::String(e.key.clone()), 0));
            value_after_key(out, &e.value, indent);
        }
        close(out, &pad, &e.cond);
    }
}

/// Writes list items at `indent` (`- ` at that column).
pub fn items_at(out: &mut String, items: &[Item], indent: usize) {
    let pad = " ".repeat(indent);
    for item in items {
        open(out, &pad, &item.cond);
        let value = match &item.value {
            T::V(v @ (Value::Object(_) | Value::Array(_))) => T::from(v.clone()),
            other => other.clone(),
        };
        match &value {
            T::Map(entries) if !entries.is_empty() => {
                let mut buf = String::new();
                entries_at(&mut buf, entries, indent + 2);
                let inner = " ".repeat(indent + 2);
                match buf.strip_prefix(&inner) {
                    Some(rest) if !rest.starts_with("{{") => {
                        let _ = write!(out, "{pad}- {rest}");
                    }
                    _ => {
                        let _ = write!(out, "{pad}-\n{buf}");
                    }
                }
            }
            T::List(inner) if !inner.is_empty() => {
                let _ = writeln!(out, "{pad}-");
                items_at(out, inner, indent + 2);
            }
            T::Raw(text) => raw(out, text, indent),
            T::Yaml(expr) => {
                let _ = writeln!(
                    out,
                    "{pad}- {{{{- toYaml {expr} | nindent {} }}}}",
                    indent + 2
                );
            }
            T::Map(_) => {
                let _ = writeln!(out, "{pad}- {{}}");
            }
            T::List(_) => {
                let _ = writeln!(out, "{pad}- []");
            }
            T::Tpl(s) => {
                let _ = writeln!(out, "{pad}- {s}");
            }
            T::V(v) => {
                let _ = writeln!(out, "{pad}- {}", scalar(v, indent + 2));
            }
        }
        close(out, &pad, &item.cond);
    }
}

/// One YAML document of a template file, present only when `cond` holds.
pub fn document(out: &mut String, t: &T, cond: &Cond) {
    open(out, "", cond);
    out.push_str("---\n");
    match t {
        T::Map(entries) => entries_at(out, entries, 0),
        T::V(Value::Object(_)) => {
            if let T::Map(entries) = T::from(match t {
                T::V(v) => v.clone(),
                _ => Value::Null,
            }) {
                entries_at(out, &entries, 0);
            }
        }
        other => panic!("a chart document must be a map, not {other:?}"),
    }
    close(out, "", cond);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Without template holes, the emitter writes YAML that parses back to the same value
    /// (multi-line strings, quoting, empty maps and lists, nested lists).
    #[test]
    fn plain_values_round_trip() {
        let v = json!({
            "a": {"b": [1, "two", {"c": "multi\nline\ntext", "d": []}], "e": {}},
            "f": "true", "g": "with: colon", "h": [[1, 2], []], "i": null,
            "app.kubernetes.io/name": "x",
        });
        let mut out = String::new();
        document(&mut out, &T::from(v.clone()), &Cond::Always);
        let back: Value = serde_yaml::from_str(&out).expect("parses");
        assert_eq!(back, v, "{out}");
    }

    #[test]
    fn conditions_wrap_their_entry_or_item_at_its_indentation() {
        let mut t = T::from(json!({"spec": {"args": ["run", "--leader-elect"]}}));
        t.at(&["spec", "args"]).items_when(
            |i| *i == T::V(json!("--leader-elect")),
            Cond::If("$.X".into()),
        );
        t.at(&["spec"])
            .set_when("r", T::Yaml(".".into()), Cond::With("$.R".into()));
        let mut out = String::new();
        document(&mut out, &t, &Cond::Always);
        assert_eq!(
            out,
            "---\nspec:\n  args:\n  - run\n  {{- if $.X }}\n  - --leader-elect\n  {{- end }}\n  \
             {{- with $.R }}\n  r:\n    {{- toYaml . | nindent 4 }}\n  {{- end }}\n"
        );
    }
}
