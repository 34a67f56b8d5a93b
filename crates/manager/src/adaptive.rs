//! An in-flight limit that adapts to the API server's latency, for the controllers' clients.
//!
//! A fixed in-flight bound sized for an idle server lets the CCM take its full share of a busy
//! one: during a burst of kubelet registrations the CCM's writes then compete with the kubelets'
//! for the server's CPU, and everyone else slows down. This limiter works as TCP Vegas and
//! Netflix's concurrency-limits do: it learns the server's *baseline* latency (the lowest seen,
//! per verb class: reads and writes cost differently) and compares each client's *recent*
//! latency (a moving average) against it. While recent latency stays within [`TOLERANCE`] of
//! the baseline the limit grows by one per round trip (additive increase); once it rises above,
//! the limit shrinks by [`DECREASE`] at most once per round trip (multiplicative decrease) down
//! to a floor, so a client always makes progress. A 429 halves the limit and stops it growing
//! until the server's `Retry-After` has passed. The gate sits inside kube-rs's retry layer, so
//! a request waiting out its `Retry-After` gives its slot back meanwhile: a server that refuses
//! a share of requests slows this client by that share, not by the length of the waits.
//!
//! The baseline is shared by all clients of one process ([`Baseline`]): the leader elector's
//! lease renewals (on its own client, observed but never limited, as the admin client is)
//! teach it what a write costs on an idle server before a burst starts, so a controller whose
//! first write arrives in the middle of a burst does not take the loaded latency for normal.
//! The limit is per client, as each controller has its own client and budget: one controller's
//! burst never makes another's requests wait.
//!
//! Watches and other long-running requests are neither limited by latency nor sampled: their
//! duration is the stream's, not the server's cost.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::time::Instant;
use tower::{Layer, Service};

/// Recent latency above this multiple of the baseline means the server is queueing: shrink.
pub const TOLERANCE: f64 = 2.0;

/// Multiplicative decrease applied at most once per round trip while latency is high.
pub const DECREASE: f64 = 0.7;

/// Requests in flight a client may always have, however slow the server: the limiter yields
/// the server to others, it never starves its own controller.
pub const FLOOR: usize = 2;

/// Weight of a new sample in the recent-latency average (about the last 5 requests).
const RECENT_WEIGHT: f64 = 0.2;

/// How fast an unrefreshed baseline rises per second (2 %): a server that stays slower for a
/// couple of minutes is its new normal, and the limit grows back.
const BASELINE_DRIFT_PER_SEC: f64 = 0.02;

/// The pause after a 429 that carried no usable `Retry-After`.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The verb classes whose latency is tracked separately.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// GET and LIST.
    Read,
    /// POST, PUT, PATCH, DELETE.
    Write,
}

impl Class {
    fn index(self) -> usize {
        self as usize
    }

    fn label(self) -> &'static str {
        match self {
            Class::Read => "read",
            Class::Write => "write",
        }
    }

    /// The class of a request, or `None` for requests whose duration is not the server's
    /// cost: watches and streams (`watch`, `follow`) last as long as the caller wants.
    pub fn of<B>(req: &http::Request<B>) -> Option<Class> {
        let long_running = req.uri().query().is_some_and(|q| {
            q.split('&').any(|kv| {
                matches!(
                    kv,
                    "watch=true" | "watch=1" | "watch=True" | "follow=true" | "follow=1"
                )
            })
        });
        if long_running {
            return None;
        }
        match *req.method() {
            http::Method::GET | http::Method::HEAD => Some(Class::Read),
            http::Method::POST | http::Method::PUT | http::Method::PATCH | http::Method::DELETE => {
                Some(Class::Write)
            }
            _ => None,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClientLabels {
    client: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabels {
    class: String,
}

/// The limiter's gauges: each client's current limit and the shared baselines.
#[derive(Clone, Default)]
pub struct AdaptiveMetrics {
    limit: Family<ClientLabels, Gauge>,
    baseline: Family<ClassLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
}

impl AdaptiveMetrics {
    /// Registers `ccm_rest_client_in_flight_limit{client}` and
    /// `ccm_rest_client_latency_baseline_seconds{class}` (client-go has no adaptive limit, so
    /// these carry ccm-rs's `ccm_` prefix).
    pub fn new(registry: &mut Registry) -> Self {
        let m = AdaptiveMetrics::default();
        registry.register(
            "ccm_rest_client_in_flight_limit",
            "Requests a Kubernetes client may have in flight now, as adapted to the API server's latency",
            m.limit.clone(),
        );
        registry.register(
            "ccm_rest_client_latency_baseline_seconds",
            "Lowest recent API server latency by verb class (read, write), the adaptive limit's reference",
            m.baseline.clone(),
        );
        m
    }
}

/// One class's baseline and when it was last refreshed.
type Slot = Option<(Duration, Instant)>;

/// The lowest latency recently seen per verb class, shared by every client of the process.
#[derive(Clone, Default)]
pub struct Baseline {
    inner: Arc<Mutex<[Slot; 2]>>,
    metrics: Option<AdaptiveMetrics>,
}

impl Baseline {
    /// A baseline that reports into `metrics`.
    pub fn with_metrics(metrics: AdaptiveMetrics) -> Self {
        Baseline {
            inner: Arc::default(),
            metrics: Some(metrics),
        }
    }

    /// Takes one sample; returns the baseline after it. An unrefreshed baseline drifts up by
    /// [`BASELINE_DRIFT_PER_SEC`], never above the sample.
    pub fn observe(&self, class: Class, latency: Duration, now: Instant) -> Duration {
        let mut slots = self.inner.lock();
        let slot = &mut slots[class.index()];
        let next = match *slot {
            None => latency,
            Some((base, at)) => {
                let drift = 1.0 + BASELINE_DRIFT_PER_SEC * now.duration_since(at).as_secs_f64();
                base.mul_f64(drift).min(latency)
            }
        };
        *slot = Some((next, now));
        if let Some(m) = &self.metrics {
            let labels = ClassLabels {
                class: class.label().to_string(),
            };
            m.baseline.get_or_create(&labels).set(next.as_secs_f64());
        }
        next
    }

    /// The current baseline of `class`, if any sample was taken.
    pub fn get(&self, class: Class) -> Option<Duration> {
        self.inner.lock()[class.index()].map(|(b, _)| b)
    }
}

/// The mutable part of one client's limit.
#[derive(Debug)]
struct State {
    limit: f64,
    in_flight: usize,
    /// Recent latency per class, seconds (exponential moving average).
    recent: [Option<f64>; 2],
    last_decrease: Option<Instant>,
    /// No growth before this (the server's Retry-After).
    hold_until: Option<Instant>,
    waiters: Vec<Waker>,
}

/// One client's adaptive in-flight limit (clones share it).
#[derive(Clone)]
pub struct AdaptiveLimit {
    state: Arc<Mutex<State>>,
    baseline: Baseline,
    floor: usize,
    ceiling: usize,
    gauge: Option<Gauge>,
}

impl AdaptiveLimit {
    /// A limit between `floor` and `ceiling` (starting at `ceiling`: an idle server is the
    /// common case), judged against the shared `baseline`.
    pub fn new(baseline: Baseline, floor: usize, ceiling: usize) -> Self {
        let floor = floor.max(1);
        let ceiling = ceiling.max(floor);
        AdaptiveLimit {
            state: Arc::new(Mutex::new(State {
                limit: ceiling as f64,
                in_flight: 0,
                recent: [None; 2],
                last_decrease: None,
                hold_until: None,
                waiters: Vec::new(),
            })),
            baseline,
            floor,
            ceiling,
            gauge: None,
        }
    }

    /// The same limit, reported as `ccm_rest_client_in_flight_limit{client}`.
    pub fn reported(mut self, metrics: &AdaptiveMetrics, client: &str) -> Self {
        let gauge = metrics
            .limit
            .get_or_create(&ClientLabels {
                client: client.to_string(),
            })
            .clone();
        gauge.set(self.limit() as i64);
        self.gauge = Some(gauge);
        self
    }

    /// Requests that may be in flight now.
    pub fn limit(&self) -> usize {
        self.state.lock().limit as usize
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> usize {
        self.state.lock().in_flight
    }

    /// A slot if one is free; otherwise `waker` is woken when one frees.
    fn try_acquire(&self, waker: &Waker) -> Option<Permit> {
        let mut s = self.state.lock();
        if s.in_flight < s.limit as usize {
            s.in_flight += 1;
            return Some(Permit {
                limit: self.clone(),
            });
        }
        if !s.waiters.iter().any(|w| w.will_wake(waker)) {
            s.waiters.push(waker.clone());
        }
        None
    }

    fn release(&self) {
        let waiters = {
            let mut s = self.state.lock();
            s.in_flight -= 1;
            std::mem::take(&mut s.waiters)
        };
        waiters.into_iter().for_each(Waker::wake);
    }

    /// Takes one request's latency: grows the limit while the server keeps up, shrinks it
    /// when the recent latency rises above [`TOLERANCE`] × the baseline.
    pub fn on_latency(&self, class: Class, latency: Duration, now: Instant) {
        let base = self.baseline.observe(class, latency, now).as_secs_f64();
        let mut s = self.state.lock();
        let recent = ewma(s.recent[class.index()], latency.as_secs_f64());
        s.recent[class.index()] = Some(recent);
        if recent > TOLERANCE * base {
            let once_per_trip = s
                .last_decrease
                .is_none_or(|t| now.duration_since(t).as_secs_f64() >= recent);
            if once_per_trip {
                s.limit = (s.limit * DECREASE).max(self.floor as f64);
                s.last_decrease = Some(now);
            }
        } else if s.hold_until.is_none_or(|t| now >= t) && self.in_use(&s) {
            s.limit = (s.limit + 1.0 / s.limit).min(self.ceiling as f64);
        }
        self.publish(&mut s);
    }

    /// The server answered 429: halve the limit and hold it until `retry_after` has passed.
    /// More 429s within the hold only extend it: the requests that were already in flight when
    /// the server pushed back are one signal, as TCP reduces its window once per loss episode.
    pub fn on_throttled(&self, retry_after: Option<Duration>, now: Instant) {
        let mut s = self.state.lock();
        if s.hold_until.is_none_or(|t| now >= t) {
            s.limit = (s.limit / 2.0).max(self.floor as f64);
            s.last_decrease = Some(now);
        }
        let until = now + retry_after.unwrap_or(DEFAULT_RETRY_AFTER);
        s.hold_until = Some(s.hold_until.map_or(until, |t| t.max(until)));
        self.publish(&mut s);
    }

    /// Feeds one answer: its 429, or its latency (watches and streams feed nothing).
    fn on_response<RB>(&self, resp: &http::Response<RB>, class: Option<Class>, start: Instant) {
        let now = Instant::now();
        match (throttled(resp), class) {
            (Some(retry_after), _) => self.on_throttled(retry_after, now),
            (None, Some(class)) => self.on_latency(class, now - start, now),
            (None, None) => {}
        }
    }

    /// Only a limit that is being used may grow (an idle client learns nothing about more).
    fn in_use(&self, s: &State) -> bool {
        (s.in_flight as f64 + 1.0) * 2.0 >= s.limit
    }

    /// Updates the gauge; wakes waiters when the limit grew past those in flight.
    fn publish(&self, s: &mut State) {
        if let Some(g) = &self.gauge {
            g.set(s.limit as i64);
        }
        if s.in_flight < s.limit as usize {
            std::mem::take(&mut s.waiters)
                .into_iter()
                .for_each(Waker::wake);
        }
    }
}

fn ewma(prev: Option<f64>, sample: f64) -> f64 {
    match prev {
        None => sample,
        Some(p) => p + RECENT_WEIGHT * (sample - p),
    }
}

/// The `Retry-After` of a 429 answer (seconds; a date is taken as "no usable value").
pub fn throttled<B>(resp: &http::Response<B>) -> Option<Option<Duration>> {
    (resp.status() == http::StatusCode::TOO_MANY_REQUESTS).then(|| {
        resp.headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs)
    })
}

/// A slot held by one request; freed on drop (also when the request is cancelled).
struct Permit {
    limit: AdaptiveLimit,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.limit.release();
    }
}

/// Gates a client's requests with an [`AdaptiveLimit`]. Placed inside kube-rs's retry layer
/// (the HTTPS stack, [`crate::http2::builder`]), it gates and samples each *attempt*: a request
/// waiting out a 429's `Retry-After` holds no slot, so the other requests keep the server's
/// share, and the wait is never taken for server latency. Outside it (kube-rs's own stack) it
/// gates whole requests.
#[derive(Clone)]
pub struct AdaptiveConcurrencyLayer {
    limit: AdaptiveLimit,
}

impl AdaptiveConcurrencyLayer {
    /// A layer whose services share `limit` and feed it each response's latency and 429s.
    pub fn new(limit: AdaptiveLimit) -> Self {
        AdaptiveConcurrencyLayer { limit }
    }
}

impl<S> Layer<S> for AdaptiveConcurrencyLayer {
    type Service = AdaptiveConcurrency<S>;
    fn layer(&self, inner: S) -> Self::Service {
        AdaptiveConcurrency {
            inner,
            limit: self.limit.clone(),
            permit: None,
        }
    }
}

/// The service produced by [`AdaptiveConcurrencyLayer`]: readiness waits for a slot; each
/// response's latency (from the call, not from the wait) and 429s feed the limit.
pub struct AdaptiveConcurrency<S> {
    inner: S,
    limit: AdaptiveLimit,
    permit: Option<Permit>,
}

/// A clone (the retry layer keeps one per request for its next attempt) holds no slot.
impl<S: Clone> Clone for AdaptiveConcurrency<S> {
    fn clone(&self) -> Self {
        AdaptiveConcurrency {
            inner: self.inner.clone(),
            limit: self.limit.clone(),
            permit: None,
        }
    }
}

impl<S, B, RB> Service<http::Request<B>> for AdaptiveConcurrency<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if self.permit.is_none() {
            match self.limit.try_acquire(cx.waker()) {
                Some(p) => self.permit = Some(p),
                None => return Poll::Pending,
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let permit = self.permit.take().expect("poll_ready before call");
        let limit = self.limit.clone();
        let class = Class::of(&req);
        let start = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let result = fut.await;
            if let Ok(resp) = &result {
                limit.on_response(resp, class, start);
            }
            drop(permit);
            result
        })
    }
}

/// Feeds a [`Baseline`] without limiting anything: on the leader elector's client, whose lease
/// renewals must never wait and teach the baseline an idle server's latency before a burst,
/// and on the admin client.
#[derive(Clone)]
pub struct ObserveLayer {
    baseline: Baseline,
}

impl ObserveLayer {
    /// Samples every response's latency into `baseline`.
    pub fn baseline(baseline: Baseline) -> Self {
        ObserveLayer { baseline }
    }
}

impl<S> Layer<S> for ObserveLayer {
    type Service = Observed<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Observed {
            inner,
            baseline: self.baseline.clone(),
        }
    }
}

/// The service produced by [`ObserveLayer`].
#[derive(Clone)]
pub struct Observed<S> {
    inner: S,
    baseline: Baseline,
}

impl<S, B, RB> Service<http::Request<B>> for Observed<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let class = Class::of(&req);
        let start = Instant::now();
        let baseline = self.baseline.clone();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let result = fut.await;
            if let (Ok(resp), Some(class)) = (&result, class)
                && throttled(resp).is_none()
            {
                let now = Instant::now();
                baseline.observe(class, now - start, now);
            }
            result
        })
    }
}

#[cfg(test)]
mod tests;
