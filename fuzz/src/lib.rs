//! Shared pieces of the fuzz targets: the aws provider's parsers compiled from their source
//! files, and small helpers that turn fuzz bytes into the inputs the parsers take.

use std::collections::BTreeMap;

use ccm_cloud::Service;

/// The aws provider's gcfg dialect check (its `src/ini.rs`, unchanged).
#[path = "../../crates/providers/aws/src/ini.rs"]
#[allow(dead_code)]
mod ini;

/// The aws provider's cloud-config parser (its `src/config.rs`, unchanged).
#[path = "../../crates/providers/aws/src/config.rs"]
#[allow(dead_code)]
pub mod config;

/// The aws provider's Service annotation parser (its `src/annotations.rs`, unchanged).
#[path = "../../crates/providers/aws/src/annotations.rs"]
#[allow(dead_code)]
pub mod annotations;

/// The aws provider's providerID reader (its `src/providerid.rs`, unchanged).
#[path = "../../crates/providers/aws/src/providerid.rs"]
#[allow(dead_code)]
pub mod providerid;

/// Stands in for the aws provider's `identity` module, which needs the AWS SDK. Its
/// `from_config` compares two strings of the parsed config (no parsing), so the fuzz build
/// skips that check and keeps the SDK out.
mod identity {
    use ccm_cloud::ConfigError;

    /// Accepts every parsed config (see the module doc).
    pub fn from_config(_: &crate::config::AwsConfig) -> Result<(), ConfigError> {
        Ok(())
    }
}

/// Annotations from fuzz bytes: one `key=value` per line; a key without `/` gets `prefix`.
pub fn annotations(data: &[u8], prefix: &str) -> BTreeMap<String, String> {
    let text = String::from_utf8_lossy(data);
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            let key = if k.contains('/') {
                k.to_string()
            } else {
                format!("{prefix}{k}")
            };
            (key, v.to_string())
        })
        .collect()
}

/// A LoadBalancer Service carrying `ann`, with a TCP and a UDP port; lines of `data` starting
/// with `spec.` set the spec fields a provider reads (`spec.loadBalancerIP=…`,
/// `spec.loadBalancerSourceRanges=a,b`, `spec.ipFamilies=IPv4,IPv6`, `spec.ipFamilyPolicy=…`,
/// `spec.loadBalancerClass=…`, `spec.externalTrafficPolicy=…`, `spec.healthCheckNodePort=N`).
pub fn service(data: &[u8], prefix: &str) -> Service {
    let mut ann = annotations(data, prefix);
    let mut spec = serde_json::json!({
        "type": "LoadBalancer",
        "ports": [
            {"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080, "protocol": "TCP"},
            {"name": "dns", "port": 53, "nodePort": 30053, "protocol": "UDP"}
        ]
    });
    let keys: Vec<String> = ann
        .keys()
        .filter(|k| k.contains("spec."))
        .cloned()
        .collect();
    for k in keys {
        let v = ann.remove(&k).unwrap_or_default();
        let field = k.rsplit("spec.").next().unwrap_or_default();
        spec[field] = match field {
            "loadBalancerSourceRanges" | "ipFamilies" => {
                serde_json::json!(v.split(',').collect::<Vec<_>>())
            }
            "healthCheckNodePort" => serde_json::json!(v.parse::<i32>().unwrap_or(0)),
            _ => serde_json::json!(v),
        };
    }
    let svc = serde_json::json!({
        "metadata": {"name": "web", "namespace": "default", "uid": "0f1e2d3c-aaaa-bbbb-cccc-001122334455", "annotations": ann},
        "spec": spec,
    });
    serde_json::from_value(svc).unwrap_or_default()
}

/// Asserts that `message` does not show `secret` (a credential taken from the fuzz input);
/// short secrets are skipped, as they occur in any message by chance.
pub fn assert_hidden(message: &str, secret: &str) {
    if secret.len() >= 6 && secret.chars().all(|c| c.is_ascii_alphanumeric()) {
        assert!(
            !message.contains(secret),
            "a credential from the input shows in an error: {message}"
        );
    }
}

/// The values of `key = value` / `key = "value"` lines of `text` (any case, quotes dropped):
/// the credentials a fuzz input sets, for [`assert_hidden`].
pub fn values_of<'a>(text: &'a str, key: &str) -> Vec<&'a str> {
    let values = text.lines().filter_map(|l| ini_value(l, key)).collect();
    only_secret(text, values, |l, v| ini_value(l, key) == Some(v))
}

fn ini_value<'b>(l: &'b str, key: &str) -> Option<&'b str> {
    l.split_once('=')
        .filter(|(k, _)| k.trim().eq_ignore_ascii_case(key))
        .map(|(_, v)| v.trim().trim_matches('"'))
}

/// The `values` that appear in `text` only on their own lines (`is_own(line, value)`): a value
/// that is also part of another line (a key name, another field) may rightly be shown there.
fn only_secret<'a>(
    text: &str,
    values: Vec<&'a str>,
    is_own: impl Fn(&str, &str) -> bool,
) -> Vec<&'a str> {
    values
        .into_iter()
        .filter(|v| {
            text.lines()
                .filter(|l| l.contains(*v))
                .all(|l| is_own(l, v))
        })
        .collect()
}

/// The values of `key: value` YAML lines of `text` for any of `keys` (quotes dropped).
pub fn values_of_yaml<'a>(text: &'a str, keys: &[&str]) -> Vec<&'a str> {
    let values = text.lines().filter_map(|l| yaml_value(l, keys)).collect();
    only_secret(text, values, |l, v| yaml_value(l, keys) == Some(v))
}

fn yaml_value<'b>(l: &'b str, keys: &[&str]) -> Option<&'b str> {
    l.split_once(':')
        .filter(|(k, _)| keys.contains(&k.trim().trim_start_matches("- ")))
        .map(|(_, v)| v.trim().trim_matches('"').trim_matches('\''))
}
