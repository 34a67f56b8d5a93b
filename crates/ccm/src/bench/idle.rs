//! The idle scenario: a converged cluster sits quiet, once per route mode.

use std::time::{Duration, Instant};

use super::env::Env;
use super::report::{IdleResult, ScenarioResult};
use super::track::{SERVICE_CLIENTS, add_nodes, add_services, spinner};
use super::{BenchOptions, RouteMode};

pub(super) async fn idle(opts: &BenchOptions) -> anyhow::Result<ScenarioResult> {
    let started = Instant::now();
    let mut r = ScenarioResult {
        scenario: "idle".into(),
        nodes: opts.nodes,
        converged: true,
        ..Default::default()
    };
    let mut modes = opts.idle_route_modes.clone();
    if modes.is_empty() {
        modes = vec![RouteMode::Watch, RouteMode::Interval];
    }
    for (mode, gate) in modes.into_iter().map(RouteMode::name_and_gate) {
        let pb = spinner(&format!(
            "idle ({mode} routes): {} nodes, then a {} quiet window",
            opts.nodes, opts.idle_window
        ));
        let extra = vec![format!(
            "--feature-gates=CloudControllerManagerWatchBasedRoutesReconciliation={gate}"
        )];
        let env = Env::start(opts, 0.0, &extra).await?;
        let n = opts.nodes as usize;
        add_nodes(&env.cluster, 0..opts.nodes, opts.kubelets).await?;
        let ok = env
            .until(opts.timeout.0, || async {
                let s = env.cluster.state().await?;
                Ok(s.initialized == n && s.network_ready == n && s.routes == n)
            })
            .await?;
        r.converged &= ok;
        // The LB phase before the quiet window, as in the issue 17 real-server soak.
        add_services(&env.cluster, "idle-lb", opts.services, SERVICE_CLIENTS).await?;
        let m = opts.services as usize;
        r.converged &= env
            .until(opts.timeout.0, || async {
                let s = env.cluster.state().await?;
                Ok(s.with_ingress == m)
            })
            .await?;
        // Let trailing work (events, the last sync) finish before the window starts.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let drain_seconds = drain_requests(&env, opts.timeout.0).await;
        env.cluster.cloud.reset_calls();
        if let Some(k) = &env.cluster.kube {
            k.reset_requests();
        }
        let syncs_before = env.metric("route_controller_route_sync_total").await;
        let at_start = env.usage();
        let window = opts.idle_window.0;
        let t0 = Instant::now();
        let mut timeline = Vec::new();
        let mut rss_max = at_start.rss_mb;
        let mut rss_timeline = Vec::new();
        let mut next_rss_sample = Duration::ZERO;
        while t0.elapsed() < window {
            let (at, usage) = (t0.elapsed(), env.usage());
            timeline.push((at.as_secs_f64(), env.cluster.cloud.total_calls()));
            rss_max = rss_max.max(usage.rss_mb);
            if at >= next_rss_sample {
                rss_timeline.push((at.as_secs_f64(), usage.rss_mb, usage.rss_anon_mb));
                next_rss_sample += Duration::from_secs(10);
            }
            tokio::time::sleep(Duration::from_secs(1).min(window)).await;
        }
        let secs = t0.elapsed().as_secs_f64();
        timeline.push((secs, env.cluster.cloud.total_calls()));
        let at_end = env.usage();
        rss_timeline.push((secs, at_end.rss_mb, at_end.rss_anon_mb));
        let per_hour = |n: u64| n as f64 * 3600.0 / secs;
        let requests = env.cluster.ccm_requests();
        let lease: u64 = requests
            .iter()
            .filter(|(k, _)| k.contains("leases"))
            .map(|(_, v)| v)
            .sum();
        let other: u64 = requests
            .iter()
            .filter(|(k, _)| !k.contains("leases"))
            .map(|(_, v)| v)
            .sum();
        let syncs = env
            .metric("route_controller_route_sync_total")
            .await
            .saturating_sub(syncs_before);
        r.idle.push(IdleResult {
            route_mode: mode.into(),
            window_seconds: secs,
            cloud_calls_per_hour: per_hour(env.cluster.cloud.total_calls()),
            api_requests_per_hour: per_hour(other),
            lease_requests_per_hour: per_hour(lease),
            route_syncs: syncs,
            timeline,
            rss_start_mb: at_start.rss_mb,
            rss_end_mb: at_end.rss_mb,
            rss_max_mb: rss_max,
            cpu_seconds: at_end.cpu_seconds - at_start.cpu_seconds,
            drain_seconds,
            rss_timeline,
        });
        r.usage = env.usage();
        env.stop().await;
        pb.finish_and_clear();
    }
    r.wall_seconds = started.elapsed().as_secs_f64();
    Ok(r)
}

/// Waits until the CCM has made no API request but leader election's for 10 s (the setup's
/// Events drain through their client's rate limit for a while), so an idle window measures
/// rest, not the tail of the setup. Seconds waited; `None` without kube-sim's counters.
pub(super) async fn drain_requests(env: &Env, timeout: Duration) -> Option<f64> {
    env.cluster.kube.as_ref()?;
    let non_lease = || -> u64 {
        env.cluster
            .ccm_requests()
            .iter()
            .filter(|(k, _)| !k.contains("leases"))
            .map(|(_, v)| v)
            .sum()
    };
    let (started, mut last, mut quiet_since) = (Instant::now(), non_lease(), Instant::now());
    while quiet_since.elapsed() < Duration::from_secs(10) && started.elapsed() < timeout {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = non_lease();
        if now != last {
            (last, quiet_since) = (now, Instant::now());
        }
    }
    Some(started.elapsed().as_secs_f64())
}
