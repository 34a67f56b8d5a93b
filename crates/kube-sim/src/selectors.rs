//! Label and field selectors with kube-apiserver's grammar and matching rules.
//!
//! Controllers narrow lists and watches with these; a selector that matches differently here
//! than on a real cluster would hide or invent objects, so `!=` and `notin` match absent keys,
//! and unknown field labels are refused as the real server refuses them.

use serde_json::Value;

use crate::resources::ResourceDesc;
use crate::status::ApiError;

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Exists,
    NotExists,
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
}

/// A parsed label selector: a conjunction of requirements.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    reqs: Vec<(String, Op)>,
}

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn bad(msg: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!("unable to parse requirement: {msg}"))
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 317
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn valid_value(v: &str) -> bool {
    v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn parse_set(rest: &str) -> Result<Vec<String>, ApiError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| bad(format!("found '{rest}', expected: '('")))?;
    let vals: Vec<String> = inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect();
    for v in &vals {
        if !valid_value(v) {
            return Err(bad(format!("invalid label value: {v:?}")));
        }
    }
    Ok(vals)
}

impl LabelSelector {
    /// Parses the `labelSelector` query parameter.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self { reqs });
        }
        for part in split_top(s) {
            let p = part.trim();
            if p.is_empty() {
                return Err(bad("found '', expected: identifier"));
            }
            if let Some(k) = p.strip_prefix('!') {
                let k = k.trim();
                if !valid_key(k) {
                    return Err(bad(format!("invalid label key {k:?}")));
                }
                reqs.push((k.to_string(), Op::NotExists));
                continue;
            }
            let (key, op) = if let Some(i) = p.find("!=") {
                (&p[..i], Op::NotEq(p[i + 2..].trim().to_string()))
            } else if let Some(i) = p.find("==") {
                (&p[..i], Op::Eq(p[i + 2..].trim().to_string()))
            } else if let Some(i) = p.find('=') {
                (&p[..i], Op::Eq(p[i + 1..].trim().to_string()))
            } else if let Some(i) = p.find(" notin ").or_else(|| p.find(" notin(")) {
                (&p[..i], Op::NotIn(parse_set(&p[i + 6..])?))
            } else if let Some(i) = p.find(" in ").or_else(|| p.find(" in(")) {
                (&p[..i], Op::In(parse_set(&p[i + 3..])?))
            } else {
                (p, Op::Exists)
            };
            let key = key.trim();
            if !valid_key(key) {
                return Err(bad(format!("invalid label key {key:?}")));
            }
            if let Op::Eq(v) | Op::NotEq(v) = &op
                && !valid_value(v)
            {
                return Err(bad(format!("invalid label value: {v:?}")));
            }
            reqs.push((key.to_string(), op));
        }
        Ok(Self { reqs })
    }

    /// Whether the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Matches an object's `metadata.labels`.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        self.reqs.iter().all(|(k, op)| {
            let v = labels.and_then(|l| l.get(k)).and_then(Value::as_str);
            match op {
                Op::Exists => v.is_some(),
                Op::NotExists => v.is_none(),
                Op::Eq(x) => v == Some(x.as_str()),
                Op::NotEq(x) => v != Some(x.as_str()),
                Op::In(xs) => v.is_some_and(|v| xs.iter().any(|x| x == v)),
                Op::NotIn(xs) => !v.is_some_and(|v| xs.iter().any(|x| x == v)),
            }
        })
    }
}

/// A parsed field selector: equality requirements on the kind's selectable fields.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector {
    reqs: Vec<(String, bool, String)>,
}

/// The string form of a selectable field, as the real server's `fields.Set` formats it.
fn field_value(obj: &Value, path: &str) -> String {
    let mut cur = obj;
    for seg in path.split('.') {
        match cur.get(seg) {
            Some(v) => cur = v,
            None => {
                // bools default to "false" (`fmt.Sprint(node.Spec.Unschedulable)`).
                return if path == "spec.unschedulable" {
                    "false".into()
                } else {
                    String::new()
                };
            }
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null => String::new(),
        // `source` on core events is a struct; the real server selects on source.component.
        Value::Object(o) => o
            .get("component")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        Value::Array(_) => String::new(),
    }
}

impl FieldSelector {
    /// Parses the `fieldSelector` query parameter against the kind's selectable fields.
    pub fn parse(s: &str, desc: &ResourceDesc) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self { reqs });
        }
        for part in s.split(',') {
            let p = part.trim();
            let (k, eq, v) = if let Some(i) = p.find("!=") {
                (&p[..i], false, &p[i + 2..])
            } else if let Some(i) = p.find("==") {
                (&p[..i], true, &p[i + 2..])
            } else if let Some(i) = p.find('=') {
                (&p[..i], true, &p[i + 1..])
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{p}'"
                )));
            };
            let k = k.trim();
            let supported = k == "metadata.name"
                || (k == "metadata.namespace" && desc.namespaced)
                || desc.fields.contains(&k);
            if !supported {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {k}"
                )));
            }
            reqs.push((k.to_string(), eq, v.trim().to_string()));
        }
        Ok(Self { reqs })
    }

    /// Whether the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// The `metadata.name=X` requirement, if any: lets a list jump straight to one key.
    pub fn exact_name(&self) -> Option<&str> {
        self.reqs
            .iter()
            .find(|(k, eq, _)| k == "metadata.name" && *eq)
            .map(|(_, _, v)| v.as_str())
    }

    /// Matches an object's selectable fields.
    pub fn matches(&self, obj: &Value) -> bool {
        self.reqs
            .iter()
            .all(|(k, eq, v)| (field_value(obj, k) == *v) == *eq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "labels": labels}, "spec": {}})
    }

    #[test]
    fn label_ops() {
        let o = obj(json!({"a": "1", "b": "2"}));
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(&o);
        assert!(m("a=1"));
        assert!(m("a==1,b"));
        assert!(!m("a!=1"));
        assert!(m("c!=1"));
        assert!(m("a in (1, 3)"));
        assert!(!m("a notin (1,3)"));
        assert!(m("c notin (1)"));
        assert!(m("!c"));
        assert!(!m("!a"));
        assert!(m(""));
        assert!(LabelSelector::parse("a in 1").is_err());
        assert!(LabelSelector::parse("a=b=c").is_err());
    }

    #[test]
    fn field_ops() {
        let d = &crate::resources::RESOURCES[crate::resources::ids::NODES];
        let o = obj(json!({}));
        let m = |s: &str| FieldSelector::parse(s, d).unwrap().matches(&o);
        assert!(m("metadata.name=a"));
        assert!(m("spec.unschedulable=false"));
        assert!(!m("spec.unschedulable!=false"));
        assert!(FieldSelector::parse("spec.foo=a", d).is_err());
    }
}
