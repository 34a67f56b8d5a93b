//! A small version of every `ccm bench` scenario, so the benchmark keeps working. Numbers are
//! not asserted (the machine is shared and noisy); only outcomes a user relies on: every
//! scenario converges, nothing leaks, and the JSON carries its documented fields.

use std::process::Command;

#[test]
fn every_scenario_runs_small() {
    let dir = std::env::temp_dir().join(format!("ccm-bench-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let json = dir.join("bench.json");
    let plots = dir.join("plots");
    let out = Command::new(env!("CARGO_BIN_EXE_ccm"))
        .args([
            "bench",
            "--nodes=20",
            "--services=5",
            "--cloud-latency=5ms",
            "--idle-window=2s",
            "--churn-duration=3s",
            "--churn-rate=10",
            "--memory-nodes=40",
            "--memory-services=40",
            "--joins=3",
            "--scale-nodes=30",
            "--scale-services=60",
            "--api-cost=free",
            "--timeout=120s",
        ])
        .arg(format!("--json={}", json.display()))
        .arg(format!("--plot={}", plots.display()))
        .output()
        .expect("run bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
    assert_eq!(doc["schema"], 1);
    let scenarios = doc["scenarios"].as_array().expect("scenarios");
    let names: Vec<&str> = scenarios
        .iter()
        .filter_map(|s| s["scenario"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "burst", "idle", "services", "churn", "memory", "join", "scale"
        ]
    );
    for s in scenarios {
        assert_eq!(s["converged"], true, "{s}");
        assert!(
            s["usage"]["peak_rss_mb"].as_f64().unwrap_or(0.0) > 0.0,
            "{s}"
        );
    }
    let burst = &scenarios[0];
    assert!(burst["time_to_initialized"]["p99"].as_f64().is_some());
    assert!(burst["api_node_writes_per_node"].as_f64().is_some());
    assert!(burst["time_to_ready"]["p99"].as_f64().is_some());
    assert!(burst["api_requests_per_node"]["patch"].as_f64().is_some());
    assert!(burst["cpu_seconds_per_1000_nodes"].as_f64().is_some());
    // The last node's wait splits into the server's lag (until a watch showed it) and the
    // CCM's part after it.
    let seen = burst["last_seen_after_last_registration_seconds"].as_f64();
    let ready = burst["last_ready_after_last_registration_seconds"].as_f64();
    assert!(
        seen.zip(ready).is_some_and(|(s, r)| s <= r),
        "seen {seen:?}, ready {ready:?}"
    );
    let join = &scenarios[5];
    assert!(join["time_to_routed"]["max"].as_f64().is_some());
    let scale = &scenarios[6];
    assert_eq!(scale["nodes"], 30);
    assert_eq!(scale["services"], 60);
    assert!(scale["time_to_ingress"]["p99"].as_f64().is_some());
    assert!(scale["api_requests_per_node"]["patch"].as_f64().is_some());
    // One Node joined the settled cluster and reached every load balancer (60 Services, 2 LBs).
    assert!(
        scale["join"]["routed_seconds"]
            .as_f64()
            .is_some_and(|s| s > 0.0)
    );
    assert!(
        scale["join"]["initialized_seconds"]
            .as_f64()
            .is_some_and(|s| s > 0.0)
    );
    assert_eq!(scale["node_join_lb_updates"], 2, "{scale}");
    let idle = scenarios[1]["idle"].as_array().expect("idle modes");
    assert_eq!(idle.len(), 2);
    for mode in idle {
        // The soak's window starts once the setup's requests have drained, and has its curve.
        assert!(mode["drain_seconds"].as_f64().is_some(), "{mode}");
        let curve = mode["rss_timeline"].as_array().expect("rss_timeline");
        assert!(curve.len() >= 2, "{mode}");
    }
    // The process measured is the one the image runs, not the tools binary.
    let measured = doc["ccm_under_test"].as_str().expect("ccm_under_test");
    assert!(measured.ends_with("/ccm-controller-manager"), "{measured}");
    let churn = &scenarios[3];
    assert_eq!(churn["leaked_load_balancers"], 0);
    assert_eq!(churn["missing_load_balancers"], 0);
    assert_eq!(churn["leaked_routes"], 0);
    assert!(plots.join("burst-initialized.svg").exists());
    assert!(plots.join("idle-cloud-calls.svg").exists());
    assert!(plots.join("idle-rss.svg").exists());
}

/// The calibrated cost model end to end: a small burst converges and is labelled.
#[test]
fn a_burst_runs_on_the_calibrated_model() {
    let doc = run_bench(
        "cost",
        &[
            "bench",
            "burst",
            "--nodes=20",
            "--cloud-latency=5ms",
            "--timeout=120s",
            "--api-cost=calibrated",
        ],
    );
    let burst = &doc["scenarios"][0];
    assert_eq!(burst["api_cost"], "calibrated");
    assert_eq!(burst["converged"], true, "{burst}");
}

/// API Priority and Fairness pushback: with one seat and no queue kube-sim refuses every
/// request of the CCM's that arrives while another executes; the CCM waits out the 429s and the
/// burst still converges.
#[test]
fn a_burst_converges_through_a_one_seat_priority_level() {
    let doc = run_bench(
        "apf",
        &[
            "bench",
            "burst",
            "--nodes=20",
            "--cloud-latency=5ms",
            "--timeout=120s",
            "--api-cost=free",
            "--api-priority-level=1/0",
        ],
    );
    let burst = &doc["scenarios"][0];
    assert_eq!(burst["converged"], true, "{burst}");
    assert!(
        burst["api_429_answers"].as_u64().is_some_and(|n| n > 0),
        "the CCM was refused: {burst}"
    );
}

/// A CCM under test that cannot start fails the run at once with its own error, not after
/// the readiness wait.
#[test]
fn a_ccm_that_exits_at_startup_fails_the_run_with_its_own_error() {
    let stderr = bench_failure(&[
        "bench",
        "burst",
        "--nodes=5",
        "--api-cost=free",
        "--ccm-arg=--no-such-flag",
    ]);
    assert!(stderr.contains("the CCM under test exited"), "{stderr}");
    assert!(
        stderr.contains("--no-such-flag"),
        "the CCM's own error: {stderr}"
    );
}

/// A CCM under test that dies during a scenario fails the run (with its log's tail) instead
/// of being waited for until the timeout: here a wrapper runs it without the cloud-node
/// controller (so the burst cannot converge) and SIGKILLs it after a few seconds.
#[test]
fn a_ccm_that_dies_mid_scenario_fails_the_run() {
    let dir = std::env::temp_dir().join(format!("ccm-bench-dies-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let wrapper = dir.join("ccm-dies");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\n{} \"$@\" --controllers='*,-cloud-node' &\nsleep 8\nkill -9 $!\nexit 137\n",
            env!("CARGO_BIN_EXE_ccm")
        ),
    )
    .expect("wrapper");
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let stderr = bench_failure(&[
        "bench",
        "burst",
        "--nodes=5",
        "--api-cost=free",
        "--timeout=600s",
        &format!("--ccm-bin={}", wrapper.display()),
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(stderr.contains("the CCM under test exited"), "{stderr}");
}

/// The reference scenario, small: every phase runs, the figures are reported, and none is
/// compared with the real server's at a size other than the reference run's.
#[test]
fn the_reference_scenario_runs_small_and_compares_only_at_its_size() {
    let doc = run_bench(
        "ref",
        &[
            "bench",
            "reference",
            "--nodes=20",
            "--services=4",
            "--cloud-latency=5ms",
            "--reference-idle=1s",
            "--reference-idle-after-join=1s",
            "--timeout=120s",
            "--api-cost=calibrated",
            "--api-cost-knob=write=500+50",
        ],
    );
    let r = &doc["scenarios"][0];
    assert_eq!(r["scenario"], "reference");
    assert_eq!(r["converged"], true, "{r}");
    let rows = r["reference"].as_array().expect("reference rows");
    let figure = |name: &str| {
        rows.iter()
            .find(|row| row["figure"].as_str().is_some_and(|f| f.starts_with(name)))
            .unwrap_or_else(|| panic!("no row {name}: {r}"))
    };
    assert!(figure("(a) initialized p99")["measured"].as_f64().is_some());
    assert!(figure("(c) ingress p99")["measured"].as_f64().is_some());
    // One join with 4 LBs updates each of them once.
    assert_eq!(figure("(d) UpdateLoadBalancer calls")["measured"], 4.0);
    // The cloud runs in the CCM's process, as in the real run: its calls are the CCM's
    // metrics' — a route for each of the 20 Nodes and the two that joined.
    assert_eq!(r["cloud_calls"]["create_route"], 22, "{r}");
    assert!(rows.iter().all(|row| row["real"].is_null()), "{r}");
    // The CCM's CPU per phase accounts for all of it: the burst's and each later phase's
    // add up to the end of the run's.
    let cpu = |name: &str| figure(name)["measured"].as_f64().expect("CPU figure");
    let phases: f64 = ["(a)", "(b)", "(c)", "(d)", "(e)", "(f)"]
        .map(|phase| cpu(&format!("{phase} CCM CPU")))
        .iter()
        .sum();
    assert!((phases - cpu("end: CCM CPU")).abs() < 1e-6, "{r}");
    assert!(
        cpu("(c) CCM CPU") > 0.0,
        "the Services cost the CCM no CPU: {r}"
    );
    // A malformed knob names itself and the fix.
    let stderr = bench_failure(&[
        "bench",
        "burst",
        "--api-cost=calibrated",
        "--api-cost-knob=wrte=1",
    ]);
    assert!(stderr.contains("wrte=1"), "{stderr}");
}

/// Runs `ccm bench` with `args` plus `--json` into a fresh directory named after `tag`; the
/// parsed JSON once the run succeeded.
fn run_bench(tag: &str, args: &[&str]) -> serde_json::Value {
    let dir = std::env::temp_dir().join(format!("ccm-bench-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let json = dir.join("bench.json");
    let out = Command::new(env!("CARGO_BIN_EXE_ccm"))
        .args(args)
        .arg(format!("--json={}", json.display()))
        .output()
        .expect("run bench");
    assert!(
        out.status.success(),
        "bench failed: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
    let _ = std::fs::remove_dir_all(&dir);
    doc
}

/// Runs `ccm bench` with `args`, asserts that it failed, and returns what it wrote to stderr.
fn bench_failure(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ccm"))
        .args(args)
        .output()
        .expect("run bench");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "bench succeeded: {stderr}");
    stderr
}
