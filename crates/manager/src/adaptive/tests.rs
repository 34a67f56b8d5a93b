//! The limiter against a fake API server whose latency and answers the test controls, on
//! paused time. Each test asserts what the fake server sees (requests in flight), so a fixed
//! in-flight bound fails them.

use std::sync::atomic::{AtomicUsize, Ordering};

use tower::ServiceExt as _;

use super::*;

const CEILING: usize = 64;
const CALLERS: usize = 100;
const FAST: Duration = Duration::from_millis(10);
const SLOW: Duration = Duration::from_millis(100);

/// An API server whose latency and status are set by the test; counts requests in flight.
#[derive(Clone, Default)]
struct Fake {
    latency: Arc<Mutex<Duration>>,
    /// Answer 429 with this `Retry-After` (seconds) while set.
    throttle: Arc<Mutex<Option<u64>>>,
    /// When set, only this many more answers are 429s (while `throttle` is set).
    refuse_next: Arc<Mutex<Option<usize>>>,
    in_flight: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    done: Arc<AtomicUsize>,
}

impl Fake {
    fn new(latency: Duration) -> Self {
        let f = Fake::default();
        f.set_latency(latency);
        f
    }

    fn set_latency(&self, d: Duration) {
        *self.latency.lock() = d;
    }

    /// The most requests in flight at once over `window`.
    async fn peak_over(&self, window: Duration) -> usize {
        self.peak
            .store(self.in_flight.load(Ordering::SeqCst), Ordering::SeqCst);
        tokio::time::sleep(window).await;
        self.peak.load(Ordering::SeqCst)
    }
}

impl Service<http::Request<()>> for Fake {
    type Response = http::Response<()>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<()>) -> Self::Future {
        let me = self.clone();
        Box::pin(async move {
            let now = me.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            me.peak.fetch_max(now, Ordering::SeqCst);
            let latency = *me.latency.lock();
            tokio::time::sleep(latency).await;
            me.in_flight.fetch_sub(1, Ordering::SeqCst);
            me.done.fetch_add(1, Ordering::SeqCst);
            let mut resp = http::Response::new(());
            let refused = match &mut *me.refuse_next.lock() {
                None => true,
                Some(0) => false,
                Some(n) => {
                    *n -= 1;
                    true
                }
            };
            if let Some(secs) = (*me.throttle.lock()).filter(|_| refused) {
                *resp.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
                resp.headers_mut()
                    .insert(http::header::RETRY_AFTER, secs.to_string().parse().unwrap());
            }
            Ok(resp)
        })
    }
}

fn patch() -> http::Request<()> {
    http::Request::builder()
        .method(http::Method::PATCH)
        .uri("/api/v1/nodes/n1/status")
        .body(())
        .unwrap()
}

/// `CALLERS` tasks writing through `layer` back to back, as a controller's workers during a
/// burst; aborted when the returned set drops.
fn callers(layer: &AdaptiveConcurrencyLayer, fake: &Fake) -> tokio::task::JoinSet<()> {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..CALLERS {
        let (layer, fake) = (layer.clone(), fake.clone());
        set.spawn(async move {
            loop {
                let svc = layer.layer(fake.clone());
                let _ = svc.oneshot(patch()).await;
            }
        });
    }
    set
}

fn limiter() -> (AdaptiveConcurrencyLayer, AdaptiveLimit) {
    let limit = AdaptiveLimit::new(Baseline::default(), FLOOR, CEILING);
    (AdaptiveConcurrencyLayer::new(limit.clone()), limit)
}

#[tokio::test(start_paused = true)]
async fn it_shrinks_when_the_server_slows_down_and_grows_back_when_it_recovers() {
    let fake = Fake::new(FAST);
    let (layer, limit) = limiter();
    let _workers = callers(&layer, &fake);
    let idle = fake.peak_over(Duration::from_secs(2)).await;
    assert_eq!(idle, CEILING, "a fast server gets the whole ceiling");

    fake.set_latency(SLOW);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let slow = fake.peak_over(Duration::from_secs(3)).await;
    assert!(slow <= FLOOR, "10x the baseline latency: {slow} in flight");
    assert_eq!(limit.limit(), FLOOR);

    fake.set_latency(FAST);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let recovered = fake.peak_over(Duration::from_secs(1)).await;
    assert_eq!(
        recovered, CEILING,
        "back at the baseline: the whole ceiling again"
    );
}

#[tokio::test(start_paused = true)]
async fn a_mildly_slower_server_keeps_the_whole_ceiling() {
    let fake = Fake::new(FAST);
    let (layer, _) = limiter();
    let _workers = callers(&layer, &fake);
    tokio::time::sleep(Duration::from_secs(1)).await;
    fake.set_latency(FAST.mul_f64(TOLERANCE * 0.9));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(fake.peak_over(Duration::from_secs(2)).await, CEILING);
}

#[tokio::test(start_paused = true)]
async fn however_slow_the_server_the_floor_keeps_requests_moving() {
    let fake = Fake::new(FAST);
    let (layer, limit) = limiter();
    let _workers = callers(&layer, &fake);
    tokio::time::sleep(Duration::from_secs(1)).await;
    fake.set_latency(Duration::from_secs(5));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(limit.limit(), FLOOR, "never below the floor");
    let before = fake.done.load(Ordering::SeqCst);
    let peak = fake.peak_over(Duration::from_secs(20)).await;
    let done = fake.done.load(Ordering::SeqCst) - before;
    assert_eq!(peak, FLOOR, "the floor stays in use");
    assert!(done >= 2 * FLOOR, "requests still complete: {done} in 20 s");
}

#[tokio::test(start_paused = true)]
async fn a_429_halves_the_limit_until_retry_after_has_passed() {
    let fake = Fake::new(FAST);
    let (layer, limit) = limiter();
    let _workers = callers(&layer, &fake);
    tokio::time::sleep(Duration::from_secs(1)).await;
    *fake.throttle.lock() = Some(5);
    tokio::time::sleep(FAST * 2).await;
    *fake.throttle.lock() = None;
    let held = fake.peak_over(Duration::from_secs(4)).await;
    assert!(held <= CEILING / 2, "within Retry-After: {held} in flight");
    assert!(held >= FLOOR, "still moving: {held} in flight");
    let after = limit.limit();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let regrown = fake.peak_over(Duration::from_secs(1)).await;
    assert!(
        regrown > after,
        "grows once Retry-After has passed: {after} → {regrown}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_observed_idle_write_sets_the_baseline_for_a_client_that_starts_under_load() {
    let baseline = Baseline::default();
    // The lease renewals on the admin client see an idle server first.
    let lease = ObserveLayer::baseline(baseline.clone()).layer(Fake::new(FAST));
    lease.oneshot(patch()).await.unwrap();
    // A controller's first writes meet a server that is 10x slower.
    let fake = Fake::new(SLOW);
    let limit = AdaptiveLimit::new(baseline, FLOOR, CEILING);
    let _workers = callers(&AdaptiveConcurrencyLayer::new(limit.clone()), &fake);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(fake.peak_over(Duration::from_secs(2)).await <= FLOOR);
}

#[tokio::test(start_paused = true)]
async fn an_idle_client_does_not_grow_its_limit() {
    let fake = Fake::new(FAST);
    let limit = AdaptiveLimit::new(Baseline::default(), FLOOR, CEILING);
    limit.on_throttled(Some(Duration::ZERO), Instant::now());
    let halved = limit.limit();
    let svc = AdaptiveConcurrencyLayer::new(limit.clone());
    for _ in 0..1000 {
        svc.layer(fake.clone()).oneshot(patch()).await.unwrap();
    }
    assert_eq!(
        limit.limit(),
        halved,
        "one request at a time proves nothing about more"
    );
}

#[test]
fn watches_and_streams_are_not_sampled() {
    let req = |m: http::Method, uri: &str| {
        http::Request::builder()
            .method(m)
            .uri(uri)
            .body(())
            .unwrap()
    };
    assert_eq!(
        Class::of(&req(http::Method::GET, "/api/v1/nodes?watch=true")),
        None
    );
    assert_eq!(
        Class::of(&req(
            http::Method::GET,
            "/api/v1/namespaces/a/pods/p/log?follow=true"
        )),
        None
    );
    assert_eq!(
        Class::of(&req(http::Method::GET, "/api/v1/nodes?limit=500")),
        Some(Class::Read)
    );
    assert_eq!(
        Class::of(&req(http::Method::PATCH, "/api/v1/nodes/n")),
        Some(Class::Write)
    );
}

#[test]
fn the_limit_and_the_baseline_are_exported() {
    let mut registry = Registry::default();
    let metrics = AdaptiveMetrics::new(&mut registry);
    let baseline = Baseline::with_metrics(metrics.clone());
    let limit = AdaptiveLimit::new(baseline.clone(), FLOOR, CEILING).reported(&metrics, "node");
    let now = Instant::now();
    baseline.observe(Class::Write, Duration::from_millis(8), now);
    limit.on_throttled(None, now);
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
    for line in [
        r#"ccm_rest_client_in_flight_limit{client="node"} 32"#,
        r#"ccm_rest_client_latency_baseline_seconds{class="write"} 0.008"#,
    ] {
        assert!(out.contains(line), "missing {line} in\n{out}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_volley_of_429s_within_retry_after_halves_the_limit_once() {
    let limit = AdaptiveLimit::new(Baseline::default(), FLOOR, CEILING);
    let start = Instant::now();
    for i in 0..10 {
        limit.on_throttled(Some(Duration::from_secs(1)), start + FAST * i);
    }
    assert_eq!(limit.limit(), CEILING / 2);
    limit.on_throttled(Some(Duration::from_secs(1)), start + Duration::from_secs(2));
    assert_eq!(
        limit.limit(),
        CEILING / 4,
        "a later episode halves it again"
    );
}

/// Retries a 429 after its `Retry-After`, as kube-rs's `RetryPolicy::server_retry` does.
#[derive(Clone)]
struct RetryAfter;

impl tower::retry::Policy<http::Request<()>, http::Response<()>, std::convert::Infallible>
    for RetryAfter
{
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        _: &mut http::Request<()>,
        result: &mut Result<http::Response<()>, std::convert::Infallible>,
    ) -> Option<Self::Future> {
        let resp = result.as_ref().ok()?;
        throttled(resp).map(|after| tokio::time::sleep(after.unwrap_or(DEFAULT_RETRY_AFTER)))
    }

    fn clone_request(&mut self, req: &http::Request<()>) -> Option<http::Request<()>> {
        let mut copy = http::Request::new(());
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = req.uri().clone();
        Some(copy)
    }
}

/// The gate inside a retry layer, as the HTTPS client stacks it: the first `CEILING` requests
/// are refused with a 5 s `Retry-After`. While they wait, the other callers keep the (halved)
/// limit busy — a gate that kept the waiting requests' slots would let nothing through for
/// 5 s — and the waits are not taken for the server's latency.
#[tokio::test(start_paused = true)]
async fn requests_waiting_out_retry_after_give_their_slots_to_the_others() {
    let fake = Fake::new(FAST);
    *fake.refuse_next.lock() = Some(CEILING);
    *fake.throttle.lock() = Some(5);
    let limit = AdaptiveLimit::new(Baseline::default(), FLOOR, CEILING);
    let stack = tower::ServiceBuilder::new()
        .layer(tower::retry::RetryLayer::new(RetryAfter))
        .layer(AdaptiveConcurrencyLayer::new(limit.clone()));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..CALLERS {
        let svc = stack.service(fake.clone());
        set.spawn(async move {
            loop {
                let _ = svc.clone().oneshot(patch()).await;
            }
        });
    }
    tokio::time::sleep(FAST * 3).await;
    let before = fake.done.load(Ordering::SeqCst);
    let during = fake.peak_over(Duration::from_secs(4)).await;
    let served = fake.done.load(Ordering::SeqCst) - before;
    assert_eq!(during, CEILING / 2, "the halved limit stays in use");
    assert!(served > 1000, "{served} requests served during Retry-After");
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        limit.limit() > CEILING / 2,
        "the 5 s waits were not latency: the limit grew back to {}",
        limit.limit()
    );
}
