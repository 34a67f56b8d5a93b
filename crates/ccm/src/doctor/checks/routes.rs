//! The route controller's cost: `route_controller_route_sync_total` from the CCM's metrics.
//! Interval mode lists every route every `--route-reconciliation-period` (10 s) even when no
//! node changes; watch mode (`CloudControllerManagerWatchBasedRoutesReconciliation`, the ccm-rs
//! default) syncs only when nodes change.

use crate::doctor::metrics::{MetricsProbe, MetricsSample};
use crate::doctor::report::{Finding, Verdict};
use crate::doctor::snapshot::{Snapshot, human};

const ID: &str = "route-syncs";
/// The feature gate that switches the route controller to watch mode.
pub const WATCH_GATE: &str = "CloudControllerManagerWatchBasedRoutesReconciliation";
/// Syncs per hour above which a watch-mode controller is churning (interval mode does 360).
const CHURN_PER_HOUR: f64 = 60.0;
/// Uptime below which a rate says more about startup than about steady state.
const MIN_UPTIME_SECS: f64 = 600.0;

/// Checks the route controller's sync rate, when the CCM's metrics can be read.
pub fn route_syncs(snap: &Snapshot) -> Finding {
    let pods = snap.ccm_pods();
    let flags = pods.first().map(|(_, f)| f.clone()).unwrap_or_default();
    if !flags.bool("configure-cloud-routes", true) {
        return Finding::new(
            ID,
            Verdict::Skip,
            "route controller disabled (--configure-cloud-routes=false)",
        );
    }
    let (url, sample, unverified) = match &snap.metrics {
        MetricsProbe::NotTried(reason) => {
            return Finding::new(ID, Verdict::Warn, format!("metrics not reachable: {reason}"))
                .fix("pass --metrics-url https://HOST:10258/metrics (e.g. after `kubectl -n kube-system port-forward pod/<ccm-pod> 10258`)");
        }
        MetricsProbe::Unreachable { url, reason } => {
            return Finding::new(ID, Verdict::Warn, format!("metrics not reachable at {url}"))
                .evidence([reason.clone()])
                .fix("run doctor where the CCM's port is reachable, or pass --metrics-url (e.g. after `kubectl port-forward`); the kubeconfig's user needs `get` on the nonResourceURL /metrics; doctor sends credentials only to a serving certificate it can verify: pass --metrics-ca with the CA of the CCM's --tls-cert-file (or its self-signed certificate)");
        }
        MetricsProbe::Scraped {
            url,
            sample,
            unverified_tls,
        } => (url, sample, *unverified_tls),
    };
    let mut evidence = vec![format!(
        "read {url}{}",
        if unverified {
            " anonymously (serving certificate not verified, so no credentials sent)"
        } else {
            ""
        }
    )];
    let Some(total) = sample.route_syncs else {
        return Finding::new(
            ID,
            Verdict::Skip,
            "no route_controller_route_sync_total: route controller not running here (not the leader?) or a CCM older than 1.36",
        )
        .evidence(evidence);
    };
    let uptime = uptime(sample);
    let per_hour = uptime.map(|u| total * 3600.0 / u.max(1.0));
    evidence.push(match (uptime, per_hour) {
        (Some(u), Some(r)) => format!(
            "{total:.0} route syncs in {} of uptime ({r:.0}/h)",
            human(std::time::Duration::from_secs_f64(u.max(0.0)))
        ),
        _ => format!("{total:.0} route syncs (no process_start_time_seconds for a rate)"),
    });
    for (trigger, n) in &sample.route_syncs_by_trigger {
        evidence.push(format!("  trigger={trigger}: {n:.0}"));
    }
    let interval_mode = match sample.route_syncs_by_trigger.get("periodic") {
        Some(n) => *n > 0.0,
        // Unlabelled (upstream): the mode is the feature gate, off by default upstream.
        None if sample.route_syncs_by_trigger.is_empty() => {
            flags.feature_gate(WATCH_GATE) != Some(true)
        }
        None => false,
    };
    if interval_mode {
        return Finding::new(
            ID,
            Verdict::Warn,
            "route controller in interval mode: a full route sync (ListRoutes) every period, changed or not",
        )
        .evidence(evidence)
        .fix(format!(
            "add --feature-gates={WATCH_GATE}=true to the CCM: it then syncs routes only when nodes change"
        ));
    }
    match (uptime, per_hour) {
        (Some(u), Some(r)) if u >= MIN_UPTIME_SECS && r > CHURN_PER_HOUR => Finding::new(
            ID,
            Verdict::Warn,
            format!(
                "route controller syncs {r:.0} times an hour in watch mode: nodes keep changing"
            ),
        )
        .evidence(evidence)
        .fix("find what rewrites nodes' podCIDRs or addresses (`kubectl get nodes -w -o wide`)"),
        _ => Finding::new(
            ID,
            Verdict::Ok,
            "route controller in watch mode, syncing only on node changes",
        )
        .evidence(evidence),
    }
}

fn uptime(s: &MetricsSample) -> Option<f64> {
    s.start_time.map(|start| s.scraped_at - start)
}
