//! `application/vnd.kubernetes.protobuf`: objects, lists, Status and watch frames.
//!
//! The store keeps JSON. Clients built on client-go (kubectl's typed commands, controllers)
//! send and ask for protobuf, so this module transcodes between a stored JSON object and the
//! kind's protobuf message, walking the message's descriptor (compiled by `build.rs` from the
//! Kubernetes `generated.proto` files). One generic walk covers every kind: go-to-protobuf names
//! each proto field after its JSON field, so only the few types whose JSON form is not their
//! message shape (timestamps, IntOrString, Quantity, raw JSON, `[]string` wrappers, inline
//! embedded structs) are special-cased, by message name.
//!
//! The wire format is kube-apiserver's: `k8s\0` followed by a `runtime.Unknown` whose
//! `typeMeta` carries apiVersion/kind and whose `raw` is the encoded message; watch streams are
//! length-prefixed (4-byte big-endian) `metav1.WatchEvent`s whose object is such an envelope.

use std::collections::HashMap;
use std::sync::LazyLock;

use base64::Engine as _;
use bytes::Bytes;
use prost::Message as _;
use prost_reflect::{
    DescriptorPool, DynamicMessage, FieldDescriptor, Kind, MapKey, MessageDescriptor,
    ReflectMessage as _, Value as PValue,
};
use serde_json::{Map, Value};

/// The protobuf media type.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";
/// The media type of a protobuf watch stream.
pub const WATCH_MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf;stream=watch";

const MAGIC: &[u8; 4] = b"k8s\0";
const META: &str = "apimachinery.pkg.apis.meta.v1";
const TIME: &str = "apimachinery.pkg.apis.meta.v1.Time";
const MICRO_TIME: &str = "apimachinery.pkg.apis.meta.v1.MicroTime";
const DURATION: &str = "apimachinery.pkg.apis.meta.v1.Duration";
const FIELDS_V1: &str = "apimachinery.pkg.apis.meta.v1.FieldsV1";
const INT_OR_STRING: &str = "apimachinery.pkg.util.intstr.IntOrString";
const QUANTITY: &str = "apimachinery.pkg.api.resource.Quantity";
const QUANTITY_VALUE: &str = "apimachinery.pkg.api.resource.QuantityValue";
const RAW_EXTENSION: &str = "apimachinery.pkg.runtime.RawExtension";
const UNKNOWN: &str = "apimachinery.pkg.runtime.Unknown";
const WATCH_EVENT: &str = "apimachinery.pkg.apis.meta.v1.WatchEvent";

/// Go embedded structs tagged `json:",inline"`: a message field in protobuf, its fields at the
/// parent's level in JSON. go-to-protobuf names the field after the embedded type (or, for
/// `Probe`, after its old name). Found in the Go types of the vendored groups; the round-trip
/// tests cover each.
const INLINE: &[(&str, &str)] = &[
    ("handler", "api.core.v1.ProbeHandler"),
    ("localObjectReference", "api.core.v1.LocalObjectReference"),
    ("volumeSource", "api.core.v1.VolumeSource"),
    (
        "persistentVolumeSource",
        "api.core.v1.PersistentVolumeSource",
    ),
    (
        "ephemeralContainerCommon",
        "api.core.v1.EphemeralContainerCommon",
    ),
];

/// Why a body could not be transcoded; the text goes into a 400/406 Status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodecError(pub String);

impl std::fmt::Display for CodecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn err<T>(msg: impl Into<String>) -> Result<T, CodecError> {
    Err(CodecError(msg.into()))
}

static POOL: LazyLock<Result<DescriptorPool, String>> = LazyLock::new(|| {
    DescriptorPool::decode(include_bytes!(concat!(env!("OUT_DIR"), "/k8s.fds")).as_ref())
        .map_err(|e| e.to_string())
});

fn pool() -> Result<&'static DescriptorPool, CodecError> {
    POOL.as_ref()
        .map_err(|e| CodecError(format!("protobuf descriptors unusable: {e}")))
}

fn message(name: &str) -> Result<MessageDescriptor, CodecError> {
    pool()?
        .get_message_by_name(name)
        .ok_or_else(|| CodecError(format!("no protobuf message {name}")))
}

/// The protobuf message for objects of `api_version` and `kind`: `api.<group's first label,
/// or core>.<version>.<Kind>`, else the meta.k8s.io type of that name (Status, DeleteOptions,
/// PartialObjectMetadata, discovery documents).
pub fn message_for(api_version: &str, kind: &str) -> Option<MessageDescriptor> {
    let pool = pool().ok()?;
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let package = group
        .split('.')
        .next()
        .filter(|g| !g.is_empty())
        .unwrap_or("core");
    pool.get_message_by_name(&format!("api.{package}.{version}.{kind}"))
        .or_else(|| pool.get_message_by_name(&format!("{META}.{kind}")))
}

/// Encodes a JSON object carrying `apiVersion` and `kind` as `k8s\0` + `runtime.Unknown`.
pub fn encode_object(obj: &Value) -> Result<Vec<u8>, CodecError> {
    let s = |k: &str| obj.get(k).and_then(Value::as_str).unwrap_or_default();
    let (api_version, kind) = (s("apiVersion"), s("kind"));
    let Some(desc) = message_for(api_version, kind) else {
        return err(format!(
            "no protobuf message for kind {kind:?} of version {api_version:?}"
        ));
    };
    let raw = to_message(&desc, obj)?.encode_to_vec();
    envelope(api_version, kind, raw)
}

fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Result<Vec<u8>, CodecError> {
    let unknown = message(UNKNOWN)?;
    let Some(Kind::Message(type_meta)) = unknown.get_field_by_name("typeMeta").map(|f| f.kind())
    else {
        return err("runtime.Unknown has no typeMeta");
    };
    let mut tm = DynamicMessage::new(type_meta);
    tm.set_field_by_name("apiVersion", PValue::String(api_version.into()));
    tm.set_field_by_name("kind", PValue::String(kind.into()));
    let mut u = DynamicMessage::new(unknown);
    u.set_field_by_name("typeMeta", PValue::Message(tm));
    u.set_field_by_name("raw", PValue::Bytes(Bytes::from(raw)));
    u.set_field_by_name("contentEncoding", PValue::String(String::new()));
    u.set_field_by_name("contentType", PValue::String(String::new()));
    let mut out = MAGIC.to_vec();
    u.encode(&mut out)
        .map_err(|e| CodecError(format!("encoding runtime.Unknown: {e}")))?;
    Ok(out)
}

/// Decodes a `k8s\0` + `runtime.Unknown` body into the JSON object it carries, with
/// `apiVersion` and `kind` set from the envelope.
pub fn decode_object(body: &[u8]) -> Result<Value, CodecError> {
    let Some(rest) = body.strip_prefix(MAGIC) else {
        return err("the protobuf body does not start with the \"k8s\\x00\" prefix");
    };
    let u = DynamicMessage::decode(message(UNKNOWN)?, rest)
        .map_err(|e| CodecError(format!("invalid runtime.Unknown: {e}")))?;
    let text = |m: &DynamicMessage, f: &str| {
        m.get_field_by_name(f)
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default()
    };
    let encoding = text(&u, "contentEncoding");
    if !encoding.is_empty() {
        return err(format!("unsupported content encoding {encoding:?}"));
    }
    let tm = match u.get_field_by_name("typeMeta").as_deref() {
        Some(PValue::Message(m)) => m.clone(),
        _ => return err("runtime.Unknown without typeMeta"),
    };
    let (api_version, kind) = (text(&tm, "apiVersion"), text(&tm, "kind"));
    let Some(desc) = message_for(&api_version, &kind) else {
        return err(format!(
            "no kind {kind:?} is registered for version {api_version:?}"
        ));
    };
    let raw = match u.get_field_by_name("raw").as_deref() {
        Some(PValue::Bytes(b)) => b.clone(),
        _ => Bytes::new(),
    };
    let msg = DynamicMessage::decode(desc, raw)
        .map_err(|e| CodecError(format!("invalid {kind}: {e}")))?;
    let mut obj = match to_json(&msg) {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    obj.insert("apiVersion".into(), Value::String(api_version));
    obj.insert("kind".into(), Value::String(kind));
    Ok(Value::Object(obj))
}

/// One protobuf watch frame: a length-prefixed `metav1.WatchEvent` whose object is the
/// enveloped `object`.
pub fn watch_frame(event_type: &str, object: &Value) -> Result<Vec<u8>, CodecError> {
    let inner = encode_object(object)?;
    let desc = message(WATCH_EVENT)?;
    let mut raw = DynamicMessage::new(message(RAW_EXTENSION)?);
    raw.set_field_by_name("raw", PValue::Bytes(Bytes::from(inner)));
    let mut ev = DynamicMessage::new(desc);
    ev.set_field_by_name("type", PValue::String(event_type.into()));
    ev.set_field_by_name("object", PValue::Message(raw));
    let body = ev.encode_to_vec();
    let len = u32::try_from(body.len()).map_err(|_| CodecError("watch event too large".into()))?;
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Converts watch lines (`{"type":..,"object":..}\n`, whole lines only) into protobuf frames.
pub fn watch_lines_to_frames(chunk: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for line in chunk.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let frame = serde_json::from_slice::<Value>(line)
            .map_err(|e| CodecError(e.to_string()))
            .and_then(|ev| {
                let ty = ev.get("type").and_then(Value::as_str).unwrap_or_default();
                watch_frame(ty, ev.get("object").unwrap_or(&Value::Null))
            });
        match frame {
            Ok(f) => out.extend_from_slice(&f),
            Err(e) => tracing::warn!(error = %e, "kube-sim: watch event not encodable as protobuf"),
        }
    }
    out
}

fn inline_field(fd: &FieldDescriptor) -> bool {
    match fd.kind() {
        Kind::Message(m) => INLINE
            .iter()
            .any(|(name, ty)| *name == fd.name() && *ty == m.full_name()),
        _ => false,
    }
}

/// A JSON object as the message `desc`; JSON fields the message lacks are dropped, as a typed
/// decoder drops them.
pub fn to_message(desc: &MessageDescriptor, v: &Value) -> Result<DynamicMessage, CodecError> {
    let Some(obj) = v.as_object() else {
        return err(format!(": expected an object for {}", desc.name()));
    };
    let mut msg = DynamicMessage::new(desc.clone());
    for fd in desc.fields() {
        if inline_field(&fd) {
            if let Kind::Message(inner) = fd.kind() {
                let sub = to_message(&inner, v)?;
                if sub.fields().next().is_some() {
                    msg.set_field(&fd, PValue::Message(sub));
                }
            }
            continue;
        }
        let Some(jv) = obj.get(fd.name()).filter(|jv| !jv.is_null()) else {
            continue;
        };
        let pv = field_value(&fd, jv).map_err(|e| {
            let sep = if e.0.starts_with(':') { "" } else { "." };
            CodecError(format!("{}{sep}{e}", fd.name()))
        })?;
        msg.set_field(&fd, pv);
    }
    Ok(msg)
}

fn field_value(fd: &FieldDescriptor, jv: &Value) -> Result<PValue, CodecError> {
    if fd.is_map() {
        let Kind::Message(entry) = fd.kind() else {
            return err("map without entry type");
        };
        let vk = entry.map_entry_value_field().kind();
        let Some(obj) = jv.as_object() else {
            return err(": expected an object");
        };
        let mut out = HashMap::with_capacity(obj.len());
        for (k, v) in obj.iter().filter(|(_, v)| !v.is_null()) {
            out.insert(MapKey::String(k.clone()), kind_value(&vk, v)?);
        }
        return Ok(PValue::Map(out));
    }
    if fd.is_list() {
        let Some(items) = jv.as_array() else {
            return err(": expected an array");
        };
        let kind = fd.kind();
        return items
            .iter()
            .map(|v| kind_value(&kind, v))
            .collect::<Result<_, _>>()
            .map(PValue::List);
    }
    kind_value(&fd.kind(), jv)
}

fn kind_value(kind: &Kind, jv: &Value) -> Result<PValue, CodecError> {
    let int = || {
        jv.as_i64()
            .ok_or_else(|| CodecError(format!(": expected an integer, got {jv}")))
    };
    let uint = || {
        jv.as_u64()
            .ok_or_else(|| CodecError(format!(": expected an integer, got {jv}")))
    };
    let narrow = |e| CodecError(format!(": {jv} out of range ({e})"));
    Ok(match kind {
        Kind::String => match jv {
            Value::String(s) => PValue::String(s.clone()),
            other => return err(format!(": expected a string, got {other}")),
        },
        Kind::Bytes => {
            let s = jv.as_str().unwrap_or_default();
            let b = base64::engine::general_purpose::STANDARD
                .decode(s)
                .map_err(|e| CodecError(format!(": invalid base64: {e}")))?;
            PValue::Bytes(Bytes::from(b))
        }
        Kind::Bool => PValue::Bool(
            jv.as_bool()
                .ok_or_else(|| CodecError(format!(": expected a boolean, got {jv}")))?,
        ),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => {
            PValue::I32(i32::try_from(int()?).map_err(narrow)?)
        }
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => PValue::I64(int()?),
        Kind::Uint32 | Kind::Fixed32 => PValue::U32(u32::try_from(uint()?).map_err(narrow)?),
        Kind::Uint64 | Kind::Fixed64 => PValue::U64(uint()?),
        Kind::Double => PValue::F64(jv.as_f64().unwrap_or_default()),
        Kind::Float => PValue::F32(jv.as_f64().unwrap_or_default() as f32),
        Kind::Enum(_) => PValue::EnumNumber(i32::try_from(int()?).map_err(narrow)?),
        Kind::Message(m) => PValue::Message(special_to_message(m, jv)?),
    })
}

fn is_string_list(m: &MessageDescriptor) -> bool {
    m.name() == "ExtraValue" || m.full_name() == "apimachinery.pkg.apis.meta.v1.Verbs"
}

fn special_to_message(m: &MessageDescriptor, jv: &Value) -> Result<DynamicMessage, CodecError> {
    let mut msg = DynamicMessage::new(m.clone());
    let text = || {
        jv.as_str()
            .map(String::from)
            .ok_or_else(|| CodecError(format!(": expected a string, got {jv}")))
    };
    match m.full_name() {
        TIME | MICRO_TIME => {
            let ts: jiff::Timestamp = text()?
                .parse()
                .map_err(|e| CodecError(format!(": invalid timestamp: {e}")))?;
            msg.set_field_by_name("seconds", PValue::I64(ts.as_second()));
            msg.set_field_by_name("nanos", PValue::I32(ts.subsec_nanosecond()));
        }
        DURATION => {
            let nanos = parse_go_duration(&text()?)
                .ok_or_else(|| CodecError(format!(": invalid duration {jv}")))?;
            msg.set_field_by_name("duration", PValue::I64(nanos));
        }
        INT_OR_STRING => match jv {
            Value::String(s) => {
                msg.set_field_by_name("type", PValue::I64(1));
                msg.set_field_by_name("strVal", PValue::String(s.clone()));
            }
            _ => {
                let i = jv
                    .as_i64()
                    .and_then(|i| i32::try_from(i).ok())
                    .ok_or_else(|| CodecError(format!(": expected int or string, got {jv}")))?;
                msg.set_field_by_name("type", PValue::I64(0));
                msg.set_field_by_name("intVal", PValue::I32(i));
            }
        },
        QUANTITY | QUANTITY_VALUE => {
            let s = match jv {
                Value::Number(n) => n.to_string(),
                _ => text()?,
            };
            msg.set_field_by_name("string", PValue::String(s));
        }
        FIELDS_V1 | RAW_EXTENSION => {
            let field = if m.full_name() == FIELDS_V1 {
                "Raw"
            } else {
                "raw"
            };
            let raw = serde_json::to_vec(jv).unwrap_or_default();
            msg.set_field_by_name(field, PValue::Bytes(Bytes::from(raw)));
        }
        _ if is_string_list(m) => {
            let items = jv
                .as_array()
                .ok_or_else(|| CodecError(format!(": expected an array, got {jv}")))?;
            let items = items
                .iter()
                .map(|i| i.as_str().map(|s| PValue::String(s.into())))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| CodecError(": expected strings".into()))?;
            msg.set_field_by_name("items", PValue::List(items));
        }
        _ => return to_message(m, jv),
    }
    Ok(msg)
}

/// A message as the JSON the real server writes for it.
pub fn to_json(msg: &DynamicMessage) -> Value {
    let mut out = Map::new();
    for (fd, pv) in msg.fields() {
        if inline_field(&fd) {
            if let PValue::Message(m) = pv
                && let Value::Object(inner) = to_json(m)
            {
                out.extend(inner);
            }
            continue;
        }
        out.insert(fd.name().to_string(), value_json(pv));
    }
    Value::Object(out)
}

fn value_json(pv: &PValue) -> Value {
    match pv {
        PValue::Bool(b) => Value::Bool(*b),
        PValue::I32(i) => Value::from(*i),
        PValue::I64(i) => Value::from(*i),
        PValue::U32(i) => Value::from(*i),
        PValue::U64(i) => Value::from(*i),
        PValue::F32(f) => Value::from(f64::from(*f)),
        PValue::F64(f) => Value::from(*f),
        PValue::String(s) => Value::String(s.clone()),
        PValue::Bytes(b) => Value::String(base64::engine::general_purpose::STANDARD.encode(b)),
        PValue::EnumNumber(n) => Value::from(*n),
        PValue::List(items) => Value::Array(items.iter().map(value_json).collect()),
        PValue::Map(m) => {
            let mut out = Map::new();
            for (k, v) in m {
                let key = match k {
                    MapKey::String(s) => s.clone(),
                    MapKey::Bool(b) => b.to_string(),
                    MapKey::I32(i) => i.to_string(),
                    MapKey::I64(i) => i.to_string(),
                    MapKey::U32(i) => i.to_string(),
                    MapKey::U64(i) => i.to_string(),
                };
                out.insert(key, value_json(v));
            }
            Value::Object(out)
        }
        PValue::Message(m) => special_json(m),
    }
}

fn special_json(m: &DynamicMessage) -> Value {
    let get = |f: &str| m.get_field_by_name(f).map(|v| v.into_owned());
    let int = |f: &str| match get(f) {
        Some(PValue::I64(i)) => i,
        Some(PValue::I32(i)) => i64::from(i),
        _ => 0,
    };
    let text = |f: &str| match get(f) {
        Some(PValue::String(s)) => s,
        _ => String::new(),
    };
    let bytes = |f: &str| match get(f) {
        Some(PValue::Bytes(b)) => b,
        _ => Bytes::new(),
    };
    let desc = m.descriptor();
    match desc.full_name() {
        TIME | MICRO_TIME => {
            let nanos = i32::try_from(int("nanos")).unwrap_or(0);
            let Ok(ts) = jiff::Timestamp::new(int("seconds"), nanos) else {
                return Value::Null;
            };
            let fmt = if desc.full_name() == TIME {
                "%Y-%m-%dT%H:%M:%SZ"
            } else {
                "%Y-%m-%dT%H:%M:%S%.6fZ"
            };
            Value::String(ts.strftime(fmt).to_string())
        }
        DURATION => Value::String(format_go_duration(int("duration"))),
        INT_OR_STRING if int("type") == 1 => Value::String(text("strVal")),
        INT_OR_STRING => Value::from(int("intVal")),
        QUANTITY | QUANTITY_VALUE => Value::String(text("string")),
        FIELDS_V1 => serde_json::from_slice(&bytes("Raw")).unwrap_or(Value::Null),
        RAW_EXTENSION => serde_json::from_slice(&bytes("raw")).unwrap_or(Value::Null),
        _ if is_string_list(&desc) => match get("items") {
            Some(PValue::List(items)) => Value::Array(
                items
                    .iter()
                    .map(|i| Value::String(i.as_str().unwrap_or_default().into()))
                    .collect(),
            ),
            _ => Value::Array(Vec::new()),
        },
        _ => to_json(m),
    }
}

/// Go's `time.ParseDuration`, in nanoseconds (`1h2m3.5s`, `250ms`).
fn parse_go_duration(s: &str) -> Option<i64> {
    let (neg, mut rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest == "0" {
        return Some(0);
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .filter(|n| *n > 0)?;
        let value: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..u] {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        total += value * unit;
        rest = &rest[u..];
    }
    let total = total.round() as i64;
    Some(if neg { -total } else { total })
}

/// Go's `time.Duration.String()` (`1h0m0s`, `1.5s`, `250ms`).
fn format_go_duration(nanos: i64) -> String {
    if nanos == 0 {
        return "0s".into();
    }
    let sign = if nanos < 0 { "-" } else { "" };
    let n = nanos.unsigned_abs();
    if n < 1_000_000_000 {
        let (div, unit) = match n {
            0..1_000 => (1, "ns"),
            1_000..1_000_000 => (1_000, "µs"),
            _ => (1_000_000, "ms"),
        };
        return format!("{sign}{}{unit}", trim_fraction(n, div));
    }
    let (h, m) = (n / 3_600_000_000_000, (n / 60_000_000_000) % 60);
    let secs = trim_fraction(n % 60_000_000_000, 1_000_000_000);
    match (h, m) {
        (0, 0) => format!("{sign}{secs}s"),
        (0, m) => format!("{sign}{m}m{secs}s"),
        (h, m) => format!("{sign}{h}h{m}m{secs}s"),
    }
}

fn trim_fraction(n: u64, div: u64) -> String {
    let (whole, frac) = (n / div, n % div);
    if frac == 0 {
        return whole.to_string();
    }
    let width = div.ilog10() as usize;
    let f = format!("{frac:0width$}");
    format!("{whole}.{}", f.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_kind_has_a_protobuf_message() {
        for r in crate::resources::RESOURCES {
            let av = r.api_version();
            assert!(
                message_for(&av, r.kind).is_some(),
                "{av} {}: vendor its group's generated.proto under crates/kube-sim/proto",
                r.kind
            );
            assert!(
                message_for(&av, &format!("{}List", r.kind)).is_some(),
                "{av} {}List",
                r.kind
            );
        }
    }

    #[test]
    fn durations_as_go_prints_them() {
        for (s, n) in [
            ("0s", 0),
            ("1h0m0s", 3_600_000_000_000),
            ("1m30s", 90_000_000_000),
            ("1.5s", 1_500_000_000),
            ("250ms", 250_000_000),
            ("-2s", -2_000_000_000),
        ] {
            assert_eq!(format_go_duration(n), s);
            assert_eq!(parse_go_duration(s), Some(n), "{s}");
        }
        assert_eq!(parse_go_duration("1x"), None);
        assert_eq!(parse_go_duration(""), Some(0));
    }

    #[test]
    fn pod_round_trips_through_protobuf() {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "uid": "u-1",
                "creationTimestamp": "2026-01-02T03:04:05Z", "labels": {"app": "web"},
                "managedFields": [{"manager": "kubectl", "operation": "Update",
                    "time": "2026-01-02T03:04:05Z", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {}}}}]},
            "spec": {
                "containers": [{"name": "c", "image": "nginx",
                    "ports": [{"containerPort": 80, "protocol": "TCP"}],
                    "resources": {"limits": {"cpu": "500m", "memory": "1Gi"}},
                    "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
                    "readinessProbe": {"httpGet": {"path": "/", "port": "http"}}}],
                "volumes": [{"name": "v", "configMap": {"name": "cm", "defaultMode": 420}}],
                "hostNetwork": false,
            },
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True",
                "lastTransitionTime": "2026-01-02T03:04:05Z"}]},
        });
        let bytes = encode_object(&pod).expect("encode");
        assert!(bytes.starts_with(MAGIC));
        assert_eq!(decode_object(&bytes).expect("decode"), pod);
    }

    #[test]
    fn micro_time_and_secret_bytes_round_trip() {
        let ev = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e", "namespace": "default"},
            "eventTime": "2026-01-02T03:04:05.123456Z", "reason": "R", "action": "A",
            "regarding": {"kind": "Node", "name": "n"}, "type": "Normal"});
        assert_eq!(decode_object(&encode_object(&ev).unwrap()).unwrap(), ev);
        let secret = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s"}, "data": {"k": "aGVsbG8="}, "type": "Opaque"});
        assert_eq!(
            decode_object(&encode_object(&secret).unwrap()).unwrap(),
            secret
        );
    }

    #[test]
    fn bad_bodies_are_errors_not_panics() {
        assert!(decode_object(b"{}").is_err());
        assert!(decode_object(b"k8s\0\xff\xff\xff").is_err());
        assert!(encode_object(&json!({"apiVersion": "v1", "kind": "Nope"})).is_err());
        let wrong = json!({"apiVersion": "v1", "kind": "Node", "spec": {"unschedulable": "yes"}});
        let e = encode_object(&wrong).unwrap_err();
        assert!(e.0.contains("spec.unschedulable"), "{e}");
    }
}
