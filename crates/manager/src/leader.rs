//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's semantics.
//!
//! Written here because no crate gets it right (see the ecosystem reference §1.3): every write
//! carries the resourceVersion it was decided on (optimistic concurrency, so two candidates can
//! never both win an expired lease), expiry is measured from when *this process* last saw the
//! lease record change (a local `Instant`, immune to clock skew between nodes), and a leader that
//! cannot renew within the renew deadline steps down.
//!
//! The decision is the pure function [`decide`]; [`LeaderElector`] only performs its I/O.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Timing and identity of one candidate (upstream flags `--leader-elect-*`).
#[derive(Debug, Clone)]
pub struct LeaderElectionConfig {
    /// Lease namespace (`--leader-elect-resource-namespace`, default `kube-system`).
    pub namespace: String,
    /// Lease name (`--leader-elect-resource-name`, default `cloud-controller-manager`).
    pub name: String,
    /// This candidate's identity: `hostname_uuid`, as upstream.
    pub identity: String,
    /// How long a lease is valid after its holder last renewed it (15s).
    pub lease_duration: Duration,
    /// How long a leader keeps trying to renew before it gives up leadership (10s).
    pub renew_deadline: Duration,
    /// How often candidates retry and leaders renew (2s).
    pub retry_period: Duration,
}

/// The holder-relevant part of a Lease, compared to detect change.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseRecord {
    /// Current holder; empty when released.
    pub holder: String,
    /// Validity the holder promised, in seconds.
    pub lease_duration_seconds: i32,
    /// When the holder acquired it.
    pub acquire_time: Option<Timestamp>,
    /// When the holder last renewed it.
    pub renew_time: Option<Timestamp>,
    /// How many times the lease changed hands.
    pub transitions: i32,
}

impl LeaseRecord {
    fn from_lease(lease: &Lease) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        LeaseRecord {
            holder: spec.holder_identity.unwrap_or_default(),
            lease_duration_seconds: spec.lease_duration_seconds.unwrap_or(0),
            acquire_time: spec.acquire_time.map(|t| t.0),
            renew_time: spec.renew_time.map(|t| t.0),
            transitions: spec.lease_transitions.unwrap_or(0),
        }
    }

    fn to_spec(&self) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.holder.clone()),
            lease_duration_seconds: Some(self.lease_duration_seconds),
            acquire_time: self.acquire_time.map(MicroTime),
            renew_time: self.renew_time.map(MicroTime),
            lease_transitions: Some(self.transitions),
            ..Default::default()
        }
    }
}

/// What this candidate last saw of the lease and when it saw it change.
#[derive(Debug, Clone)]
pub struct Observed {
    /// The record as last read.
    pub record: LeaseRecord,
    /// Local time at which the record was last seen to change.
    pub changed_at: Instant,
}

/// The outcome of [`decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Write this record (with the resourceVersion just read): we take or keep the lease.
    Write(LeaseRecord),
    /// Someone else holds a valid lease; look again later.
    Wait,
}

/// Decides what a candidate does given the lease record it just read.
///
/// `observed` is updated in place: when the record differs from what was seen before, its
/// `changed_at` becomes `now` — expiry counts from *our* observation, never from the remote
/// `renewTime`, so clock skew between nodes cannot make two leaders.
pub fn decide(
    current: &LeaseRecord,
    observed: &mut Option<Observed>,
    identity: &str,
    lease_duration: Duration,
    now: Instant,
    wall_now: Timestamp,
) -> Decision {
    match observed {
        Some(o) if o.record == *current => {}
        _ => {
            *observed = Some(Observed {
                record: current.clone(),
                changed_at: now,
            })
        }
    }
    let changed_at = observed.as_ref().map(|o| o.changed_at).unwrap_or(now);
    let held_by_other = !current.holder.is_empty() && current.holder != identity;
    // The holder's promised duration, or ours if it promised nothing sensible.
    let validity = if current.lease_duration_seconds > 0 {
        Duration::from_secs(current.lease_duration_seconds as u64)
    } else {
        lease_duration
    };
    if held_by_other && changed_at + validity > now {
        return Decision::Wait;
    }
    let mut next = current.clone();
    if current.holder == identity {
        next.renew_time = Some(wall_now);
    } else {
        next.holder = identity.to_string();
        next.acquire_time = Some(wall_now);
        next.renew_time = Some(wall_now);
        next.transitions = current.transitions + i32::from(!current.holder.is_empty());
    }
    next.lease_duration_seconds = lease_duration.as_secs().max(1) as i32;
    Decision::Write(next)
}

/// Why an election attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    /// The API server refused or could not be reached.
    #[error("lease {0}: {1}")]
    Api(String, #[source] kube::Error),
}

/// Performs leader election for one candidate.
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaderElectionConfig,
    observed: Option<Observed>,
    /// When we last successfully wrote the lease as holder.
    last_renew: Option<Instant>,
}

/// Leader status shared with the health endpoint and `leader_election_master_status`.
#[derive(Debug, Clone, Default)]
pub struct LeaderStatus {
    inner: std::sync::Arc<parking_lot::Mutex<Option<Instant>>>,
}

impl LeaderStatus {
    /// Records a successful renew now.
    pub fn renewed(&self) {
        *self.inner.lock() = Some(Instant::now());
    }
    /// Records that leadership ended.
    pub fn lost(&self) {
        *self.inner.lock() = None;
    }
    /// True while leading.
    pub fn is_leader(&self) -> bool {
        self.inner.lock().is_some()
    }
    /// Time since the last successful renew while leading.
    pub fn since_renew(&self) -> Option<Duration> {
        self.inner.lock().map(|t| t.elapsed())
    }
}

impl LeaderElector {
    /// A candidate using `client`.
    pub fn new(client: kube::Client, config: LeaderElectionConfig) -> Self {
        LeaderElector {
            api: Api::namespaced(client, &config.namespace),
            config,
            observed: None,
            last_renew: None,
        }
    }

    /// The configuration in use.
    pub fn config(&self) -> &LeaderElectionConfig {
        &self.config
    }

    /// One round: read the lease and take or renew it if allowed. `Ok(true)` means we hold it.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, ElectionError> {
        let name = &self.config.name;
        let ctx = || format!("{}/{}", self.config.namespace, name);
        let existing = self
            .api
            .get_opt(name)
            .await
            .map_err(|e| ElectionError::Api(ctx(), e))?;
        let now = Instant::now();
        let wall = Timestamp::now();
        let Some(lease) = existing else {
            let record = LeaseRecord {
                holder: self.config.identity.clone(),
                lease_duration_seconds: self.config.lease_duration.as_secs().max(1) as i32,
                acquire_time: Some(wall),
                renew_time: Some(wall),
                transitions: 0,
            };
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(record.to_spec()),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => {
                    self.observed = Some(Observed {
                        record,
                        changed_at: now,
                    });
                    self.last_renew = Some(now);
                    Ok(true)
                }
                // Someone else created it first: they lead.
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(ElectionError::Api(ctx(), e)),
            };
        };
        let current = LeaseRecord::from_lease(&lease);
        match decide(
            &current,
            &mut self.observed,
            &self.config.identity,
            self.config.lease_duration,
            now,
            wall,
        ) {
            Decision::Wait => Ok(false),
            Decision::Write(record) => {
                let mut next = lease.clone();
                next.spec = Some(record.to_spec());
                // `replace` sends metadata.resourceVersion from the read: a concurrent writer
                // makes this fail with 409 instead of both of us winning.
                match self.api.replace(name, &PostParams::default(), &next).await {
                    Ok(_) => {
                        self.observed = Some(Observed {
                            record,
                            changed_at: now,
                        });
                        self.last_renew = Some(now);
                        Ok(true)
                    }
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                    Err(e) => Err(ElectionError::Api(ctx(), e)),
                }
            }
        }
    }

    /// Blocks until this candidate holds the lease, or `cancel` fires (`false`).
    pub async fn acquire(&mut self, cancel: &CancellationToken) -> bool {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => return true,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "leader election: cannot read or write lease"),
            }
            let jitter = rand::random::<f64>() * 0.2;
            let wait = self.config.retry_period.mul_f64(1.0 + jitter);
            tokio::select! {
                _ = cancel.cancelled() => return false,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Renews every retry period while leading. Returns when leadership is lost — no
    /// successful renew within the renew deadline, or the lease taken by another — or when
    /// `cancel` fires. Returns `true` if it stopped because of `cancel` while still leading.
    pub async fn keep_renewing(
        &mut self,
        status: &LeaderStatus,
        cancel: &CancellationToken,
    ) -> bool {
        status.renewed();
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return true,
                _ = tokio::time::sleep(self.config.retry_period) => {}
            }
            let deadline =
                self.last_renew.unwrap_or_else(Instant::now) + self.config.renew_deadline;
            let attempt = tokio::time::timeout_at(deadline, self.try_acquire_or_renew()).await;
            match attempt {
                Ok(Ok(true)) => status.renewed(),
                Ok(Ok(false)) => {
                    tracing::error!("leader election: lease was taken by another candidate");
                    status.lost();
                    return false;
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "leader election: renew failed"),
                Err(_) => {}
            }
            if Instant::now() >= deadline
                && self
                    .last_renew
                    .is_none_or(|t| t + self.config.renew_deadline <= Instant::now())
            {
                tracing::error!(
                    renew_deadline = ?self.config.renew_deadline,
                    "leader election: could not renew the lease within the renew deadline"
                );
                status.lost();
                return false;
            }
        }
    }

    /// Gives the lease up so a standby takes over within one retry period (client-go's
    /// ReleaseOnCancel): holder cleared, duration 1s. Best effort.
    pub async fn release(&mut self) {
        let name = self.config.name.clone();
        let Ok(Some(lease)) = self.api.get_opt(&name).await else {
            return;
        };
        let current = LeaseRecord::from_lease(&lease);
        if current.holder != self.config.identity {
            return;
        }
        let record = LeaseRecord {
            holder: String::new(),
            lease_duration_seconds: 1,
            acquire_time: current.acquire_time,
            renew_time: Some(Timestamp::now()),
            transitions: current.transitions,
        };
        let mut next = lease.clone();
        next.spec = Some(record.to_spec());
        match self.api.replace(&name, &PostParams::default(), &next).await {
            Ok(_) => tracing::info!("leader election: lease released"),
            Err(e) => tracing::warn!(error = %e, "leader election: could not release the lease"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const D: Duration = Duration::from_secs(15);

    fn rec(holder: &str, n: i32) -> LeaseRecord {
        LeaseRecord {
            holder: holder.into(),
            lease_duration_seconds: 15,
            acquire_time: None,
            renew_time: Some(Timestamp::from_second(i64::from(n)).unwrap_or(Timestamp::UNIX_EPOCH)),
            transitions: 0,
        }
    }

    #[test]
    fn empty_or_own_lease_is_taken_at_once() {
        let now = Instant::now();
        let mut obs = None;
        assert!(matches!(
            decide(&rec("", 0), &mut obs, "me", D, now, Timestamp::now()),
            Decision::Write(r) if r.holder == "me"
        ));
        let mut obs = None;
        assert!(matches!(
            decide(&rec("me", 0), &mut obs, "me", D, now, Timestamp::now()),
            Decision::Write(r) if r.holder == "me"
        ));
    }

    #[test]
    fn other_holder_must_be_silent_for_a_full_lease_duration() {
        let t0 = Instant::now();
        let mut obs = None;
        let other = rec("other", 1);
        assert_eq!(
            decide(&other, &mut obs, "me", D, t0, Timestamp::now()),
            Decision::Wait
        );
        assert_eq!(
            decide(
                &other,
                &mut obs,
                "me",
                D,
                t0 + Duration::from_secs(14),
                Timestamp::now()
            ),
            Decision::Wait
        );
        // The holder renewed at t0+14: the clock restarts from our observation.
        let renewed = rec("other", 2);
        assert_eq!(
            decide(
                &renewed,
                &mut obs,
                "me",
                D,
                t0 + Duration::from_secs(14),
                Timestamp::now()
            ),
            Decision::Wait
        );
        assert_eq!(
            decide(
                &renewed,
                &mut obs,
                "me",
                D,
                t0 + Duration::from_secs(28),
                Timestamp::now()
            ),
            Decision::Wait
        );
        match decide(
            &renewed,
            &mut obs,
            "me",
            D,
            t0 + Duration::from_secs(29),
            Timestamp::now(),
        ) {
            Decision::Write(r) => {
                assert_eq!(r.holder, "me");
                assert_eq!(r.transitions, 1);
            }
            Decision::Wait => panic!("expired lease must be taken"),
        }
    }

    proptest! {
        /// Whatever the sequence of observations, a candidate never writes over another
        /// holder's lease less than one lease duration after it last saw that lease change.
        #[test]
        fn never_steals_a_live_lease(
            steps in proptest::collection::vec((0u8..3, 0u64..20_000, any::<bool>()), 1..60)
        ) {
            let start = Instant::now();
            let mut now = start;
            let mut obs: Option<Observed> = None;
            let mut renew_counter = 0;
            let mut last_change: Option<(LeaseRecord, Instant)> = None;
            for (who, advance_ms, renew) in steps {
                now += Duration::from_millis(advance_ms);
                let holder = ["", "me", "other"][who as usize];
                if renew { renew_counter += 1; }
                let current = rec(holder, renew_counter);
                match &last_change {
                    Some((r, _)) if *r == current => {}
                    _ => last_change = Some((current.clone(), now)),
                }
                let d = decide(&current, &mut obs, "me", D, now, Timestamp::now());
                if let (Decision::Write(_), Some((_, changed))) = (&d, &last_change)
                    && holder == "other"
                {
                    prop_assert!(now.duration_since(*changed) >= D);
                }
                if holder != "other" {
                    prop_assert!(matches!(d, Decision::Write(ref r) if r.holder == "me"));
                }
            }
        }
    }
}
