//! The monitoring mixin (deploy/helm/ccm-rs/files/monitoring): its rules pass the real
//! `promtool check rules` and the unit tests in deploy/monitoring/rules_test.yaml under
//! `promtool test rules`; every metric a rule or a dashboard panel queries is in a scrape of a
//! running ccm-rs (`ccm demo --break kubelet-not-external`, its CCM with `--cloud-api-qps` so
//! the rate limiter reports its waits), except `up` (Prometheus's own) and
//! `kube_node_spec_taint` (kube-state-metrics); and the chart ships it off by default.

use std::collections::BTreeSet;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ccm_manager::scrape::Scraper;
use serde_json::Value;

/// Metrics the mixin reads from elsewhere than the CCM.
const NOT_FROM_THE_CCM: &[&str] = &["up", "kube_node_spec_taint"];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

fn promtool() -> PathBuf {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([workspace().join(".venv/bin"), PathBuf::from("/usr/bin")])
        .map(|d| d.join("promtool"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("promtool not found: run .ci/test (or .ci/setup.d/20-promtool.sh)")
        })
}

fn mixin(file: &str) -> PathBuf {
    workspace()
        .join("deploy/helm/ccm-rs/files/monitoring")
        .join(file)
}

#[test]
fn the_rules_pass_promtool_check_and_their_unit_tests() {
    let out = Command::new(promtool())
        .args(["check", "rules"])
        .arg(mixin("rules.yaml"))
        .output()
        .expect("promtool");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("SUCCESS: 9 rules found"), "{text}");
    let out = Command::new(promtool())
        .args(["test", "rules"])
        .arg(workspace().join("deploy/monitoring/rules_test.yaml"))
        .output()
        .expect("promtool");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("SUCCESS"), "{text}");
}

/// The metric names a PromQL expression reads: identifiers outside label matchers, range
/// selectors and grouping clauses that are not functions or keywords.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut plain = String::new();
    let mut depth = 0usize;
    for c in expr.chars() {
        match c {
            '{' | '[' => depth += 1,
            '}' | ']' => depth = depth.saturating_sub(1),
            _ if depth == 0 => plain.push(c),
            _ => {}
        }
    }
    let grouping = [
        "by",
        "on",
        "without",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let keywords = ["and", "or", "unless", "bool", "offset"];
    let mut out = BTreeSet::new();
    let mut tokens = Vec::new();
    let mut cur = String::new();
    for c in plain.chars().chain([' ']) {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '$' {
            cur.push(c);
        } else {
            if !cur.is_empty() {
                tokens.push(std::mem::take(&mut cur));
            }
            if !c.is_whitespace() {
                tokens.push(c.to_string());
            }
        }
    }
    let mut skip_group = false;
    for (i, t) in tokens.iter().enumerate() {
        if skip_group {
            if t == ")" {
                skip_group = false;
            }
            continue;
        }
        if grouping.contains(&t.as_str()) {
            skip_group = tokens.get(i + 1).is_some_and(|n| n == "(");
            continue;
        }
        let ident = t
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        // `sum by (x) (…)`: an aggregation, whose grouping comes first.
        let function = tokens
            .get(i + 1)
            .is_some_and(|n| n == "(" || grouping.contains(&n.as_str()));
        if ident && !function && !keywords.contains(&t.as_str()) && !t.starts_with('$') {
            out.insert(t.clone());
        }
    }
    out
}

/// Every expression of the rules and of the dashboard's panels.
fn queried() -> BTreeSet<String> {
    let rules: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(mixin("rules.yaml")).expect("rules"))
            .expect("rules yaml");
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(mixin("dashboard.json")).expect("dashboard"))
            .expect("dashboard json");
    let recorded: BTreeSet<String> = rules["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["record"].as_str().map(String::from))
        .collect();
    let exprs = rules["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["expr"].as_str().map(String::from))
        .chain(
            dashboard["panels"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
                .filter_map(|t| t["expr"].as_str().map(String::from)),
        );
    exprs
        .flat_map(|e| metric_names(&e))
        .filter(|m| !recorded.contains(m))
        .collect()
}

#[test]
fn metric_names_are_read_from_promql() {
    let names = metric_names(
        r#"sum by (provider, operation) (rate(cloudprovider_api_requests_total{result="throttled"}[5m])) > 0 and on (provider) absent(up{job=~"x"} == 1) or histogram_quantile(0.99, sum by (le) (rate(x_seconds_bucket[$__rate_interval])))"#,
    );
    let want: BTreeSet<String> = ["cloudprovider_api_requests_total", "up", "x_seconds_bucket"]
        .map(String::from)
        .into();
    assert_eq!(names, want);
}

/// The series names of a scrape.
fn scraped_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next().map(String::from))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_mixin_queries_is_in_a_scrape_of_a_running_ccm() {
    let dir = std::env::temp_dir().join(format!("ccm-monitoring-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let kubeconfig = dir.join("kubeconfig");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ccm"))
        .args(["demo", "--nodes=4", "--services=2", "--cloud-latency=5ms"])
        .args([
            "--break",
            "kubelet-not-external",
            "--ccm-arg=--cloud-api-qps=1000",
        ])
        .arg(format!("--kubeconfig-out={}", kubeconfig.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("demo");
    let mut lines = std::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut printed = String::new();
    for line in lines.by_ref().map_while(Result::ok) {
        printed.push_str(&line);
        printed.push('\n');
        if line.contains("Still running") {
            break;
        }
    }
    std::thread::spawn(move || lines.for_each(drop));
    let word_after = |w: &str| {
        printed
            .split_whitespace()
            .skip_while(|x| *x != w)
            .nth(1)
            .map(String::from)
            .unwrap_or_else(|| panic!("no {w} in:\n{printed}"))
    };
    let ca = std::fs::read(word_after("--metrics-ca")).expect("serving certificate");
    let url = printed
        .split_whitespace()
        .find(|w| w.starts_with("https://127.0.0.1:") && w.ends_with("/metrics"))
        .expect("metrics URL")
        .to_string();
    let addr: std::net::SocketAddr = url
        .trim_start_matches("https://")
        .trim_end_matches("/metrics")
        .parse()
        .expect("addr");
    let kc: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&kubeconfig).expect("kubeconfig"))
            .expect("yaml");
    let token = kc["users"][0]["user"]["token"]
        .as_str()
        .expect("token")
        .to_string();
    let scraper = Scraper::new(addr, &ca, Some(token)).expect("scraper");
    let (code, body) = scraper.get("/metrics").await.expect("scrape");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, 200, "{body}");
    let have = scraped_names(&body);
    let missing: Vec<String> = queried()
        .into_iter()
        .filter(|m| !NOT_FROM_THE_CCM.contains(&m.as_str()) && !have.contains(m))
        .collect();
    assert!(
        missing.is_empty(),
        "queried but not in the CCM's scrape: {missing:?}"
    );
    // The check has teeth: a misspelt name would be missing.
    assert!(!have.contains("cloudprovider_api_request_total"));
    assert!(have.contains("cloudprovider_api_rate_limit_wait_seconds_bucket"));
}

fn render(args: &[&str]) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_ccm"))
        .arg("manifests")
        .args(args)
        .output()
        .expect("ccm manifests");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split("\n---")
        .map(|d| d.trim_start_matches("---"))
        .filter_map(|d| serde_yaml_ng::from_str::<Value>(d).ok())
        .filter(|v| !v.is_null())
        .collect()
}

#[test]
fn the_chart_ships_the_mixin_off_by_default() {
    let kinds = |objs: &[Value]| -> Vec<String> {
        objs.iter()
            .map(|o| o["kind"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    let default = render(&[]);
    assert!(
        !kinds(&default)
            .iter()
            .any(|k| k == "PrometheusRule" || k == "ConfigMap")
    );
    let dir = std::env::temp_dir().join(format!("ccm-mixin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let values = dir.join("values.yaml");
    std::fs::write(
        &values,
        "monitoring:\n  prometheusRule: {enabled: true, labels: {release: kube-prometheus-stack}}\n  dashboards: {enabled: true}\n",
    )
    .expect("write");
    let on = render(&["--values", values.to_str().expect("path")]);
    let rule = on
        .iter()
        .find(|o| o["kind"] == "PrometheusRule")
        .expect("PrometheusRule");
    let rules: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(mixin("rules.yaml")).expect("rules"))
            .expect("yaml");
    assert_eq!(rule["spec"], rules);
    assert_eq!(
        rule["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    let cm = on
        .iter()
        .find(|o| o["kind"] == "ConfigMap")
        .expect("dashboard ConfigMap");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let dashboard: Value =
        serde_json::from_str(cm["data"]["ccm-rs.json"].as_str().expect("json")).expect("dashboard");
    assert_eq!(dashboard["uid"], "ccm-rs-control-loop");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The real Helm engine renders the PrometheusRule (the template reads the same rules file):
/// kube-sim serves no Prometheus Operator CRDs, so the install stops at the REST mapping of
/// that kind — after rendering, never at a template error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_renders_the_prometheus_rule() {
    let sim = ccm_kube_sim::KubeSim::start(ccm_kube_sim::Config {
        tls: true,
        ..Default::default()
    })
    .await
    .expect("kube-sim");
    let dir = std::env::temp_dir().join(format!("ccm-mixin-helm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let kubeconfig = dir.join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let helm = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([workspace().join(".venv/bin")])
        .map(|d| d.join("helm-python"))
        .find(|p| p.is_file())
        .expect("helm-python: run .ci/test (or .ci/setup.d/50-deploy.sh)");
    let out = tokio::process::Command::new(helm)
        .arg(workspace().join("deploy/helm/helm.py"))
        .arg("install")
        .arg(workspace().join("deploy/helm/ccm-rs"))
        .arg(&kubeconfig)
        .arg("mixin")
        .arg(r#"{"monitoring": {"prometheusRule": {"enabled": true}}}"#)
        .env("HELM_DRIVER", "memory")
        .output()
        .await
        .expect("helm");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(
            r#"no matches for kind "PrometheusRule" in version "monitoring.coreos.com/v1""#
        ),
        "{err}"
    );
    sim.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
