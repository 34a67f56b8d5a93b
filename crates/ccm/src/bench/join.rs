//! The join scenario: one node at a time joins a quiet cluster.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::BenchOptions;
use super::env::Env;
use super::report::{ScenarioResult, percentiles};
use super::track::{Tracker, add_nodes, both_latencies, initialized, routed, spinner};

/// Nodes joining a quiet cluster one at a time: each is timed from its kubelet's first
/// request to routed and to initialized.
pub(super) async fn join(opts: &BenchOptions) -> anyhow::Result<ScenarioResult> {
    let base = opts.nodes.min(100);
    let joins = opts.joins.max(1);
    let pb = spinner(&format!(
        "join: {joins} nodes join a quiet {base}-node cluster, one at a time"
    ));
    let started = Instant::now();
    let env = Env::start(opts, 0.0, &[]).await?;
    add_nodes(&env.cluster, 0..base, opts.kubelets).await?;
    let b = base as usize;
    let mut converged = env
        .until(opts.timeout.0, || async {
            let s = env.cluster.state().await?;
            Ok(s.initialized == b && s.network_ready == b && s.routes == b)
        })
        .await?;
    let client = env.cluster.user_client();
    let init = Tracker::nodes(client.clone(), initialized);
    let net = Tracker::nodes(client, routed);
    let mut created = HashMap::new();
    for i in base..base + joins {
        // Quiet: let the previous join's trailing writes (its Event) settle first.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let t = Instant::now();
        let name = env.cluster.add_node(i).await?;
        created.insert(name.clone(), t);
        converged &= env
            .until(opts.timeout.0, || async {
                let (i, r) = (init.first.lock(), net.first.lock());
                Ok(i.contains_key(&name) && r.contains_key(&name))
            })
            .await?;
    }
    let (ready, _) = both_latencies(&init, &net, &created);
    let mut r = ScenarioResult {
        scenario: "join".into(),
        converged,
        nodes: joins,
        time_to_initialized: Some(percentiles(init.latencies(&created))),
        time_to_routed: Some(percentiles(net.latencies(&created))),
        time_to_ready: Some(percentiles(ready)),
        ..Default::default()
    };
    r.usage = env.usage();
    r.cloud_calls = env.cloud_calls().await;
    env.stop().await;
    r.wall_seconds = started.elapsed().as_secs_f64();
    pb.finish_and_clear();
    Ok(r)
}
