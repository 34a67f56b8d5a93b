//! `ccm conformance` as an operator runs it: the sim in-process, and a provider built from a
//! cloud-config (the sim over HTTP, standing in for a real cloud account) with an existing Node
//! — every resource the suite made is swept, after a full run and after Ctrl-C, and the
//! operator's instance is never touched.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use ccm_provider_sim::{InstanceSpec, InstanceState, Latency, SimCloud, SimServer};

const CCM: &str = env!("CARGO_BIN_EXE_ccm");

fn tmpdir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "ccm-{tag}-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    dir
}

#[tokio::test]
async fn sim_destructive_run_passes_and_writes_reports() {
    let dir = tmpdir("conformance");
    let (junit, json) = (dir.join("junit.xml"), dir.join("report.json"));
    let out = tokio::process::Command::new(CCM)
        .args(["conformance", "--cloud-provider=sim", "--destructive"])
        .arg(format!("--junit={}", junit.display()))
        .arg(format!("--json={}", json.display()))
        .output()
        .await
        .expect("run ccm");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("0 failed"), "{stdout}");
    let xml = std::fs::read_to_string(&junit).expect("junit");
    assert!(xml.contains("failures=\"0\"") && xml.contains("instances.error-is-never-gone"));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
    assert_eq!(report["level"], "destructive");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn bad_flags_exit_2_naming_the_fix() {
    let out = tokio::process::Command::new(CCM)
        .args([
            "conformance",
            "--cloud-provider=sim",
            "--known-defect=lb.nope=x",
        ])
        .output()
        .await
        .expect("run ccm");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no rule \"lb.nope\"") && err.contains("lb.delete-is-idempotent"),
        "{err}"
    );
}

struct Cloud {
    sim: SimCloud,
    _server: SimServer,
    config: std::path::PathBuf,
    prod: String,
}

async fn remote_cloud(dir: &std::path::Path) -> Cloud {
    let sim = SimCloud::seeded(9);
    let prod = sim.add_instance(InstanceSpec::new("prod-node"));
    let server = SimServer::start(sim.clone(), SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("sim server");
    let config = dir.join("cloud.toml");
    std::fs::write(
        &config,
        format!(
            "endpoint = \"{}\"\nactor = \"conformance\"\n",
            server.endpoint()
        ),
    )
    .expect("config");
    Cloud {
        sim,
        _server: server,
        config,
        prod,
    }
}

fn conformance(cloud: &Cloud) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(CCM);
    cmd.args([
        "conformance",
        "--cloud-provider=sim",
        "--destructive",
        "--node=prod-node",
    ])
    .arg(format!("--cloud-config={}", cloud.config.display()))
    .arg("--settle-timeout=2s")
    .arg("--max-lb-name-len=32")
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .kill_on_drop(true);
    cmd
}

fn untouched(cloud: &Cloud) {
    assert!(
        cloud.sim.load_balancers().is_empty(),
        "{:?}",
        cloud.sim.load_balancers()
    );
    assert!(cloud.sim.routes().is_empty(), "{:?}", cloud.sim.routes());
    let prod = cloud
        .sim
        .instances()
        .into_iter()
        .find(|i| i.id == cloud.prod)
        .expect("prod");
    assert_eq!(prod.state, InstanceState::Running);
    assert!(
        cloud
            .sim
            .mutations()
            .iter()
            .all(|m| m.actor != "conformance" || !m.object.starts_with("instance/")),
        "the suite changed an instance: {:?}",
        cloud.sim.mutations()
    );
}

#[tokio::test]
async fn against_a_configured_cloud_everything_is_swept_also_after_ctrl_c() {
    let dir = tmpdir("conformance-remote");
    let cloud = remote_cloud(&dir).await;

    let out = conformance(&cloud).output().await.expect("run ccm");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{stdout}");
    // Without a harness, lifecycle and fault checks say why they did not run.
    assert!(
        stdout.contains("NOT RUN") && stdout.contains("lb.ensure-is-idempotent"),
        "{stdout}"
    );
    untouched(&cloud);

    // Slow cloud; interrupt once the suite has made a load balancer.
    cloud
        .sim
        .set_latency("*", Latency::from_millis(100, 0))
        .expect("latency");
    let child = conformance(&cloud).spawn().expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(60);
    while cloud.sim.load_balancers().is_empty() {
        assert!(Instant::now() < deadline, "the suite never created an LB");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = child.id().expect("pid").to_string();
    let kill = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("kill");
    assert!(kill.success());
    let out = child.wait_with_output().await.expect("wait");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("interrupted"), "{stdout}");
    untouched(&cloud);
    let _ = std::fs::remove_dir_all(dir);
}
