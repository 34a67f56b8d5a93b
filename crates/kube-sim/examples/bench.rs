//! Throughput of the simulator on this machine: writes/s and watch fan-out.
//!
//! `cargo run --release -p ccm-kube-sim --example bench -- [nodes] [writes] [watchers] [objects]`
//! (defaults 5000 20000 10 10000). Clients run in the same process and share the cores, so
//! the numbers are a floor for the server alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ccm_kube_sim::{Config, KubeSim};
use futures::StreamExt;
use http_body_util::BodyExt;

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

async fn send(client: &kube::Client, method: &str, uri: &str, ct: &str, body: String) -> u16 {
    let req = http::Request::builder()
        .method(method)
        .uri(uri)
        .header(http::header::CONTENT_TYPE, ct)
        .body(kube::client::Body::from(body.into_bytes()))
        .expect("request");
    let resp = client.send(req).await.expect("send");
    let code = resp.status().as_u16();
    // Drain the body, as a real client would.
    let _ = resp.into_body().collect().await;
    code
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let nodes = arg(1, 5000);
    let writes = arg(2, 20_000);
    let watchers = arg(3, 10);
    let objects = arg(4, 10_000);
    let concurrency = 64;
    let sim = KubeSim::start(Config {
        retention: 200_000,
        watch_buffer: 65_536,
        ..Config::default()
    })
    .await?;
    let client = sim.client_with_user_agent("bench")?;

    // Creates.
    let t = Instant::now();
    futures::stream::iter(0..nodes)
        .map(|i| {
            let c = client.clone();
            async move {
                let body = format!(
                    r#"{{"apiVersion":"v1","kind":"Node","metadata":{{"name":"node-{i}","labels":{{"topology.kubernetes.io/zone":"zone-{}"}}}},"spec":{{"providerID":"sim://node-{i}"}},"status":{{"conditions":[{{"type":"Ready","status":"True"}}],"addresses":[{{"type":"InternalIP","address":"10.0.{}.{}"}}]}}}}"#,
                    i % 3,
                    i / 250,
                    i % 250
                );
                assert_eq!(send(&c, "POST", "/api/v1/nodes", "application/json", body).await, 201);
            }
        })
        .buffer_unordered(concurrency)
        .collect::<Vec<_>>()
        .await;
    let create_rate = nodes as f64 / t.elapsed().as_secs_f64();

    // Strategic-merge status patches, as node controllers write.
    let t = Instant::now();
    futures::stream::iter(0..writes)
        .map(|i| {
            let c = client.clone();
            async move {
                let body = format!(
                    r#"{{"status":{{"conditions":[{{"type":"Ready","status":"True","lastHeartbeatTime":"2026-01-01T00:00:{:02}Z","reason":"r{i}"}}]}}}}"#,
                    i % 60
                );
                let uri = format!("/api/v1/nodes/node-{}/status", i % nodes);
                assert_eq!(send(&c, "PATCH", &uri, "application/strategic-merge-patch+json", body).await, 200);
            }
        })
        .buffer_unordered(concurrency)
        .collect::<Vec<_>>()
        .await;
    let write_rate = writes as f64 / t.elapsed().as_secs_f64();

    // Watch fan-out: `watchers` raw watches on configmaps, then `objects` creates.
    let rv = sim.resource_version();
    let seen: Vec<Arc<AtomicU64>> = (0..watchers).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let mut tasks = Vec::new();
    for s in &seen {
        let c = client.clone();
        let s = s.clone();
        let req = http::Request::builder()
            .uri(format!(
                "/api/v1/configmaps?watch=1&resourceVersion={rv}&timeoutSeconds=600"
            ))
            .body(kube::client::Body::empty())?;
        let resp = c.send(req).await?;
        tasks.push(tokio::spawn(async move {
            let mut body = resp.into_body();
            while let Some(Ok(f)) = body.frame().await {
                if let Ok(d) = f.into_data() {
                    let n = d.iter().filter(|b| **b == b'\n').count() as u64;
                    s.fetch_add(n, Ordering::Relaxed);
                }
            }
        }));
    }
    let t = Instant::now();
    futures::stream::iter(0..objects)
        .map(|i| {
            let c = client.clone();
            async move {
                let body = format!(
                    r#"{{"metadata":{{"name":"cm-{i}"}},"data":{{"k":"{}"}}}}"#,
                    "v".repeat(200)
                );
                assert_eq!(
                    send(
                        &c,
                        "POST",
                        "/api/v1/namespaces/default/configmaps",
                        "application/json",
                        body
                    )
                    .await,
                    201
                );
            }
        })
        .buffer_unordered(concurrency)
        .collect::<Vec<_>>()
        .await;
    let write_done = t.elapsed();
    let deadline = Instant::now() + Duration::from_secs(300);
    while seen
        .iter()
        .any(|s| s.load(Ordering::Relaxed) < objects as u64)
    {
        anyhow::ensure!(
            Instant::now() < deadline,
            "watchers did not receive all events"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let fan = t.elapsed();
    for t in tasks {
        t.abort();
    }
    let events = (watchers * objects) as f64;
    println!(
        "kube-sim bench ({} cores available)",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    println!("  creates:            {nodes} nodes at {create_rate:.0}/s");
    println!(
        "  status patches:     {writes} strategic-merge PATCH at {write_rate:.0} writes/s (concurrency {concurrency})"
    );
    println!(
        "  watch fan-out:      {objects} creates with {watchers} watchers: writes {:.0}/s, all {} events delivered in {:.2}s ({:.0} events/s)",
        objects as f64 / write_done.as_secs_f64(),
        events,
        fan.as_secs_f64(),
        events / fan.as_secs_f64()
    );
    println!(
        "  writes counted for client \"bench\": {}",
        sim.count_writes("bench")
    );
    sim.shutdown().await;
    Ok(())
}
