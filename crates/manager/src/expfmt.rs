//! `/metrics` in the Prometheus text format (0.0.4), as upstream's components serve it.
//!
//! prometheus-client writes OpenMetrics, where a counter family `foo` has samples `foo_total`.
//! Parsers of the older text format (promtool, Prometheus told to prefer it, Datadog, Telegraf,
//! Metricbeat) read `foo_total` as a second, untyped family without help. Upstream's CCM
//! (client_golang, no OpenMetrics) names the family `foo_total`, so the same scrape config
//! and lint rules must work against ccm-rs: OpenMetrics goes to clients that ask for it, this
//! rendition to everyone else.

/// The media type of the text rendition.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The media type of the OpenMetrics rendition.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// True when an `Accept` header value asks for OpenMetrics (Prometheus's default asks for
/// both, OpenMetrics first).
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| {
        a.split(',').any(|part| {
            let mut fields = part.split(';').map(str::trim);
            let is_om = fields.next() == Some("application/openmetrics-text");
            is_om && !fields.any(|f| f.replace(' ', "") == "q=0")
        })
    })
}

/// Rewrites prometheus-client's OpenMetrics text as text format 0.0.4: counter families get
/// their `_total` name in `# HELP`/`# TYPE`, `unknown` becomes `untyped`, `info` a gauge named
/// `_info`; `# UNIT`, `# EOF` and counters' `_created` samples are dropped.
pub fn openmetrics_to_text(om: &str) -> String {
    let mut out = String::with_capacity(om.len());
    let mut help: Option<(&str, &str)> = None;
    let mut created: Option<String> = None;
    for line in om.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help = Some((name, text));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let (family, kind) = match kind {
                "counter" if name.ends_with("_total") => (name.to_string(), "counter"),
                "counter" => (format!("{name}_total"), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                "stateset" => (name.to_string(), "gauge"),
                "gaugehistogram" => (name.to_string(), "histogram"),
                "unknown" => (name.to_string(), "untyped"),
                k => (name.to_string(), k),
            };
            created = (kind == "counter").then(|| format!("{name}_created"));
            if let Some((_, text)) = help.take() {
                out.push_str(&format!("# HELP {family} {}\n", text.replace("\\\"", "\"")));
            }
            out.push_str(&format!("# TYPE {family} {kind}\n"));
        } else if line.starts_with("# UNIT ") || line == "# EOF" {
        } else if line.starts_with('#') {
            out.push_str(line);
            out.push('\n');
        } else {
            if let Some((name, text)) = help.take() {
                out.push_str(&format!("# HELP {name} {text}\n"));
            }
            if created.as_deref().is_some_and(|c| {
                line.strip_prefix(c)
                    .is_some_and(|r| r.starts_with(['{', ' ']))
            }) {
                continue;
            }
            // Exemplars (` # {...}`) do not exist in 0.0.4.
            let sample = line.split_once(" # {").map_or(line, |(s, _)| s);
            push_sample(&mut out, sample);
        }
    }
    out
}

/// Copies a sample line, writing `le` and `quantile` bounds as client_golang does (`1`, `60`,
/// `1e-06`), so selectors such as `{le="1"}` in upstream dashboards match.
fn push_sample(out: &mut String, line: &str) {
    let mut rest = line;
    while let Some(at) = ["le=\"", "quantile=\""]
        .iter()
        .filter_map(|k| rest.find(k).map(|i| i + k.len()))
        .min()
    {
        let Some(end) = rest[at..].find('"').map(|e| at + e) else {
            break;
        };
        out.push_str(&rest[..at]);
        match rest[at..end].parse::<f64>() {
            Ok(v) => out.push_str(&go_float(v)),
            Err(_) => out.push_str(&rest[at..end]),
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out.push('\n');
}

/// Go's `strconv.FormatFloat(v, 'g', -1, 64)` with client_golang's `+Inf`: the shortest
/// digits, in exponent form (`1e-06`, `1e+06`) when the exponent is below -4 or at least 6.
pub fn go_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    if v == 0.0 {
        return "0".into();
    }
    let sci = format!("{:e}", v.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if v < 0.0 { "-" } else { "" };
    if !(-4..6).contains(&exp) {
        let (first, more) = digits.split_at(1);
        let dot = if more.is_empty() { "" } else { "." };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{dot}{more}e{esign}{:02}", exp.abs());
    }
    if exp < 0 {
        let zeros = "0".repeat((-exp - 1) as usize);
        return format!("{sign}0.{zeros}{digits}");
    }
    let int_len = exp as usize + 1;
    if digits.len() <= int_len {
        format!("{sign}{digits}{}", "0".repeat(int_len - digits.len()))
    } else {
        format!("{sign}{}.{}", &digits[..int_len], &digits[int_len..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_take_their_total_name_and_openmetrics_markers_go() {
        let om = "# HELP rest_client_requests Number of HTTP requests, partitioned by status code, method, and host.\n\
                  # TYPE rest_client_requests counter\n\
                  rest_client_requests_total{code=\"200\",host=\"h\",method=\"GET\"} 3\n\
                  rest_client_requests_created{code=\"200\",host=\"h\",method=\"GET\"} 1.7e9\n\
                  # HELP workqueue_depth Current depth of workqueue.\n\
                  # TYPE workqueue_depth gauge\n\
                  # UNIT workqueue_depth items\n\
                  workqueue_depth{name=\"Nodes\"} 0\n\
                  # HELP x_seconds Says \\\"hi\\\".\n\
                  # TYPE x_seconds histogram\n\
                  x_seconds_bucket{le=\"+Inf\"} 1 # {trace_id=\"a\"} 0.5\n\
                  # EOF\n";
        let text = openmetrics_to_text(om);
        assert_eq!(
            text,
            "# HELP rest_client_requests_total Number of HTTP requests, partitioned by status code, method, and host.\n\
             # TYPE rest_client_requests_total counter\n\
             rest_client_requests_total{code=\"200\",host=\"h\",method=\"GET\"} 3\n\
             # HELP workqueue_depth Current depth of workqueue.\n\
             # TYPE workqueue_depth gauge\n\
             workqueue_depth{name=\"Nodes\"} 0\n\
             # HELP x_seconds Says \"hi\".\n\
             # TYPE x_seconds histogram\n\
             x_seconds_bucket{le=\"+Inf\"} 1\n"
        );
    }

    #[test]
    fn floats_as_go_prints_them() {
        for (v, go) in [
            (1.0, "1"),
            (60.0, "60"),
            (0.005, "0.005"),
            (0.25, "0.25"),
            (1e-6, "1e-06"),
            (9.999999999999999e-6, "9.999999999999999e-06"),
            (0.001, "0.001"),
            (1000.0, "1000"),
            (1e6, "1e+06"),
            (123456.5, "123456.5"),
            (-2.5, "-2.5"),
            (0.0001, "0.0001"),
            (f64::INFINITY, "+Inf"),
        ] {
            assert_eq!(go_float(v), go, "{v}");
        }
        let mut out = String::new();
        push_sample(&mut out, r#"x_bucket{le="60.0",verb="GET"} 3"#);
        push_sample(&mut out, r#"y_bucket{le="0.000001",name="a"} 0"#);
        assert_eq!(
            out,
            "x_bucket{le=\"60\",verb=\"GET\"} 3\ny_bucket{le=\"1e-06\",name=\"a\"} 0\n"
        );
    }

    #[test]
    fn accept_negotiation() {
        assert!(!wants_openmetrics(None));
        assert!(!wants_openmetrics(Some("text/plain;version=0.0.4")));
        assert!(wants_openmetrics(Some(
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
        )));
        assert!(!wants_openmetrics(Some(
            "application/openmetrics-text; q=0, text/plain"
        )));
    }
}
