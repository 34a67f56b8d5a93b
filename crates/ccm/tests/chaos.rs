//! A small `ccm bench chaos`: every fault once, on a small cluster, against the real CCM
//! binary. Only the invariants are asserted, never a time: after each fault no Node whose
//! instance runs was deleted (and every terminated one was), every Node is initialized and
//! routed, no route or LB is leaked, missing or duplicated, every LoadBalancer Service has its
//! ingress.

use std::process::Command;

#[test]
fn every_fault_keeps_the_invariants() {
    let dir = std::env::temp_dir().join(format!("ccm-chaos-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let json = dir.join("chaos.json");
    let out = Command::new(env!("CARGO_BIN_EXE_ccm"))
        .args([
            "bench",
            "chaos",
            "--chaos-nodes=24",
            "--chaos-services=4",
            "--chaos-duration=3s",
            "--chaos-kills=1",
            "--churn-rate=5",
            "--cloud-latency=5ms",
            "--api-cost=free",
            "--timeout=90s",
        ])
        .arg(format!("--json={}", json.display()))
        .output()
        .expect("run bench chaos");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap_or_else(|e| {
            panic!(
                "no JSON ({e}): {}\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        }))
        .expect("parse");
    let chaos = &doc["scenarios"][0];
    assert_eq!(chaos["scenario"], "chaos");
    let rows = chaos["chaos"].as_array().expect("one row per fault");
    let faults: Vec<&str> = rows.iter().filter_map(|r| r["fault"].as_str()).collect();
    assert_eq!(
        faults,
        [
            "ApiRestart",
            "WatchDrops",
            "Api429",
            "CloudOutage",
            "CloudThrottle",
            "CcmKill"
        ]
    );
    for row in rows {
        assert_eq!(row["violations"], serde_json::json!([]), "{row}\n{stdout}");
        assert!(row["reconverge_seconds"].is_number(), "{row}\n{stdout}");
        assert!(row["operations"].as_u64().unwrap_or(0) > 0, "{row}");
    }
    assert!(out.status.success(), "{}\n{stdout}", out.status);
    let _ = std::fs::remove_dir_all(&dir);
}
