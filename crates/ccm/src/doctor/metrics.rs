//! Reading the CCM's `/metrics` the way Prometheus does: over HTTPS, with the kubeconfig's
//! credentials (the CCM authorizes `/metrics` by delegating to the API server).
//!
//! Credentials go only to a verified endpoint: the serving certificate must chain to the
//! kubeconfig's CA or to a CA passed with `--metrics-ca`. Whatever listens on the pod's IP and
//! port may not be the CCM (the pod is gone and another hostNetwork process took the port, a
//! rogue pod answers on it), and a bearer token sent there is the operator's token lost. When
//! verification fails, doctor makes one more attempt without any credential (no token, no
//! client certificate, no exec plugin) and without verification: a CCM that allows `/metrics`
//! anonymously (`--authorization-always-allow-paths`) still answers; one that does not answers
//! 401/403, and the finding says how to let doctor verify it. Nothing here ever fails doctor:
//! an unreachable endpoint is a finding.

use std::collections::BTreeMap;
use std::time::Duration;

/// What came of trying to read the CCM's metrics.
#[derive(Debug, Clone, PartialEq)]
pub enum MetricsProbe {
    /// No endpoint to try (no running CCM pod, or serving disabled); the reason.
    NotTried(String),
    /// The endpoint did not answer with metrics.
    Unreachable {
        /// The URL tried.
        url: String,
        /// Why (connection refused, 403, timeout, ...).
        reason: String,
    },
    /// Metrics read.
    Scraped {
        /// The URL read.
        url: String,
        /// The families doctor uses.
        sample: MetricsSample,
        /// The serving certificate could not be verified, so the metrics were read anonymously
        /// (no credential sent).
        unverified_tls: bool,
    },
}

/// The metric families the route check reads.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricsSample {
    /// `route_controller_route_sync_total`, summed over labels; `None` when absent (route
    /// controller not running, or a CCM older than 1.36).
    pub route_syncs: Option<f64>,
    /// ccm-rs labels its counter with `trigger` (periodic, node_change, retry, resync).
    pub route_syncs_by_trigger: BTreeMap<String, f64>,
    /// `process_start_time_seconds`.
    pub start_time: Option<f64>,
    /// When the sample was read (Unix seconds).
    pub scraped_at: f64,
}

/// Parses Prometheus text or OpenMetrics exposition for the families doctor needs.
pub fn parse(body: &str, scraped_at: f64) -> MetricsSample {
    let mut s = MetricsSample {
        scraped_at,
        ..Default::default()
    };
    for (name, series, value) in samples(body) {
        match name {
            "route_controller_route_sync_total" => {
                *s.route_syncs.get_or_insert(0.0) += value;
                if let Some(t) = label(series, "trigger") {
                    *s.route_syncs_by_trigger.entry(t).or_default() += value;
                }
            }
            "process_start_time_seconds" => s.start_time = Some(value),
            _ => {}
        }
    }
    s
}

/// Every sample of an exposition as (family name, series with its labels, value); lines that
/// are not samples are skipped.
pub(crate) fn samples(body: &str) -> impl Iterator<Item = (&str, &str, f64)> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let (series, rest) = match line.find('{') {
                Some(i) => {
                    let j = line[i..].find('}')?;
                    (&line[..i + j + 1], &line[i + j + 1..])
                }
                None => line.split_once(' ')?,
            };
            let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
            let name = series.split('{').next().unwrap_or(series);
            Some((name, series, value))
        })
}

/// The value of label `key` in a series such as `foo{a="b"}`.
pub(crate) fn label(series: &str, key: &str) -> Option<String> {
    let inner = series.split_once('{')?.1.trim_end_matches('}');
    inner.split(',').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"').to_string())
    })
}

/// Reads `url`: with the kubeconfig's credentials from an endpoint whose certificate chains to
/// the kubeconfig's CA or one of `extra_ca` (DER); anonymously, and saying so, from one that
/// does not.
pub async fn probe(base: &kube::Config, url: &str, extra_ca: &[Vec<u8>]) -> MetricsProbe {
    let unreachable = |reason: String| MetricsProbe::Unreachable {
        url: url.to_string(),
        reason,
    };
    let Ok(uri) = url.parse::<http::Uri>() else {
        return unreachable("not a URL".into());
    };
    let path = uri
        .path_and_query()
        .map_or("/metrics", |p| p.as_str())
        .to_string();
    let root = match (uri.scheme_str(), uri.authority()) {
        (Some(s), Some(a)) => format!("{s}://{a}"),
        _ => return unreachable("not an absolute URL".into()),
    };
    let mut verified_config = base.clone();
    if !extra_ca.is_empty() {
        verified_config
            .root_cert
            .get_or_insert_with(Vec::new)
            .extend(extra_ca.iter().cloned());
    }
    let verified = fetch(&verified_config, &root, &path, Mode::Verified).await;
    let (result, unverified_tls) = match verified {
        Ok(body) => (Ok(body), false),
        Err(e) if root.starts_with("https://") && !e.starts_with("HTTP ") => (
            fetch(base, &root, &path, Mode::AnonymousUnverified)
                .await
                .map_err(|e2| {
                    format!(
                        "serving certificate not verified ({e}), so doctor sent no credentials; \
                         anonymously: {e2}"
                    )
                }),
            true,
        ),
        Err(e) => (Err(e), false),
    };
    match result {
        Ok(body) => MetricsProbe::Scraped {
            url: url.to_string(),
            sample: parse(
                &body,
                jiff::Timestamp::now().as_millisecond() as f64 / 1000.0,
            ),
            unverified_tls,
        },
        Err(reason) => unreachable(reason),
    }
}

/// How a request is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Certificate verified; the kubeconfig's credentials (over HTTPS only).
    Verified,
    /// Certificate not verified; therefore no credential of any kind.
    AnonymousUnverified,
}

/// `config` without any credential: no token, no client certificate, no exec plugin, no
/// Authorization header.
fn anonymous(config: &mut kube::Config) {
    config.auth_info = Default::default();
    config
        .headers
        .retain(|(name, _)| name != http::header::AUTHORIZATION);
}

async fn fetch(base: &kube::Config, root: &str, path: &str, mode: Mode) -> Result<String, String> {
    let mut config = base.clone();
    config.cluster_url = root.parse().map_err(|e| format!("{e}"))?;
    if !root.starts_with("https://") || mode == Mode::AnonymousUnverified {
        // Credentials never travel over plain HTTP, nor to an endpoint not verified.
        anonymous(&mut config);
    }
    config.accept_invalid_certs = mode == Mode::AnonymousUnverified;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(super::USER_AGENT),
    ));
    config.tls_server_name = None;
    config.connect_timeout = Some(Duration::from_secs(3));
    config.read_timeout = Some(Duration::from_secs(5));
    let client = kube::Client::try_from(config).map_err(|e| format!("{e}"))?;
    let req = http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| format!("{e}"))?;
    let work = client.request_text(req);
    match tokio::time::timeout(Duration::from_secs(8), work).await {
        Ok(Ok(body)) => Ok(body),
        Ok(Err(kube::Error::Api(s))) => Err(format!("HTTP {} {}", s.code, s.message)),
        Ok(Err(e)) => Err(error_chain(&e)),
        Err(_) => Err("timed out after 8s".into()),
    }
}

/// The certificates (DER) of a PEM file: `--metrics-ca`.
pub fn read_pem_certificates(path: &std::path::Path) -> anyhow::Result<Vec<Vec<u8>>> {
    use anyhow::Context as _;
    use base64::Engine as _;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--metrics-ca {}: cannot read", path.display()))?;
    let mut out = Vec::new();
    let mut body: Option<String> = None;
    for line in text.lines().map(str::trim) {
        match (&mut body, line) {
            (None, "-----BEGIN CERTIFICATE-----") => body = Some(String::new()),
            (Some(b), "-----END CERTIFICATE-----") => {
                let der = base64::engine::general_purpose::STANDARD
                    .decode(b.as_bytes())
                    .with_context(|| {
                        format!(
                            "--metrics-ca {}: a certificate is not base64",
                            path.display()
                        )
                    })?;
                out.push(der);
                body = None;
            }
            (Some(b), l) => b.push_str(l),
            (None, _) => {}
        }
    }
    anyhow::ensure!(
        !out.is_empty(),
        "--metrics-ca {}: no PEM certificate in it (expected -----BEGIN CERTIFICATE-----)",
        path.display()
    );
    Ok(out)
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let msg = s.to_string();
        if !out.contains(&msg) {
            out.push_str(": ");
            out.push_str(&msg);
        }
        src = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_labelled_and_plain_counters() {
        let body = "# HELP route_controller_route_sync_total x\n\
            # TYPE route_controller_route_sync_total counter\n\
            route_controller_route_sync_total{trigger=\"periodic\",outcome=\"noop\"} 40\n\
            route_controller_route_sync_total{trigger=\"periodic\",outcome=\"changed\"} 2\n\
            route_controller_route_sync_total{trigger=\"resync\",outcome=\"noop\"} 1\n\
            process_start_time_seconds 1700000000.5\n\
            # EOF\n";
        let s = parse(body, 1.0);
        assert_eq!(s.route_syncs, Some(43.0));
        assert_eq!(s.route_syncs_by_trigger.get("periodic"), Some(&42.0));
        assert_eq!(s.start_time, Some(1_700_000_000.5));
        let upstream = parse("route_controller_route_sync_total 7\n", 1.0);
        assert_eq!(upstream.route_syncs, Some(7.0));
        assert!(upstream.route_syncs_by_trigger.is_empty());
        assert_eq!(parse("other 1\n", 1.0).route_syncs, None);
    }
}
