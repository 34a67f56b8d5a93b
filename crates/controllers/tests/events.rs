//! Events as `kubectl get events` shows them: a repeated event on the same object is one
//! Event whose count grows, different messages or objects are separate Events.

use std::time::Duration;

use ccm_controllers::events::{EventType, Recorder};
use ccm_kube_sim::{Config, KubeSim};
use k8s_openapi::api::core::v1::{Event, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams};

fn node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// (object, message, count) of every Event, sorted.
async fn events(client: &kube::Client) -> Vec<(String, String, i32)> {
    let mut out: Vec<_> = Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .map(|e| {
            (
                e.involved_object.name.unwrap_or_default(),
                e.message.unwrap_or_default(),
                e.count.unwrap_or_default(),
            )
        })
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn repeats_on_one_object_fold_into_one_event_with_a_count() {
    let sim = KubeSim::start(Config::default()).await.expect("kube-sim");
    let client = sim.client().expect("client");
    let recorder = Recorder::new(client.clone(), "cloud-node-controller");
    for _ in 0..3 {
        recorder.publish(&node("a"), EventType::Warning, "Failed", "cloud said no");
    }
    recorder.publish(&node("a"), EventType::Warning, "Failed", "cloud said maybe");
    for i in 0..200 {
        recorder.publish(&node(&format!("n{i}")), EventType::Normal, "Synced", "ok");
    }
    let mut want = vec![
        ("a".to_string(), "cloud said maybe".to_string(), 1),
        ("a".to_string(), "cloud said no".to_string(), 3),
    ];
    want.extend((0..200).map(|i| (format!("n{i}"), "ok".to_string(), 1)));
    want.sort();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let got = events(&client).await;
        if got == want || tokio::time::Instant::now() > deadline {
            assert_eq!(got, want);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Log lines written while a test runs (a `MakeWriter` for the fmt subscriber).
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// The captured lines that speak of dropped Events.
    fn drop_lines(&self) -> Vec<String> {
        self.lines_with("dropp")
    }

    /// The captured lines containing `needle`.
    fn lines_with(&self, needle: &str) -> Vec<String> {
        let text = String::from_utf8(self.0.lock().expect("log buffer").clone()).expect("utf-8");
        text.lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
    }
}

/// `ccm_events_dropped_total{component,reason="queue_full"}` as scraped.
fn dropped_total(component: &str) -> u64 {
    dropped(component, "queue_full")
}

/// `ccm_events_dropped_total{component,reason}` as scraped.
fn dropped(component: &str, reason: &str) -> u64 {
    let mut reg = prometheus_client::registry::Registry::default();
    ccm_controllers::events::register_metrics(&mut reg);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &reg).expect("encode");
    let series =
        format!("ccm_events_dropped_total{{component=\"{component}\",reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map(|v| v.parse().expect("counter value"))
        .expect("the recorder's series is scraped")
}

/// A stalled API server (every request answered after an hour) fills the recorder's queue: the
/// Events past its capacity are counted, and the log says so once per interval, not once per
/// Event (a real-server burst logged 101 identical warnings).
#[tokio::test(start_paused = true)]
async fn events_dropped_under_a_stalled_api_are_counted_and_summarised() {
    use ccm_controllers::events::{DROP_SUMMARY_INTERVAL, QUEUE_CAPACITY};

    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let sim = KubeSim::start(Config {
        fault_latency: Duration::from_secs(3600),
        ..Config::default()
    })
    .await
    .expect("kube-sim");
    let component = "stalled-api-test";
    let recorder = Recorder::new(sim.client().expect("client"), component);
    assert_eq!(
        dropped_total(component),
        0,
        "the series exists from the start"
    );
    let n = node("a");
    let publish = |count: usize| {
        for i in 0..count {
            recorder.publish(&n, EventType::Normal, "Synced", format!("event {i}"));
        }
    };
    // The writer task has not run yet (current-thread runtime, no await): the queue takes
    // exactly its capacity, everything past it is dropped.
    publish(QUEUE_CAPACITY + 150);
    assert_eq!(dropped_total(component), 150);
    // More drops inside the same interval, then in the next one, then none. Meanwhile the
    // writer took the first Event and waits on the API: one of the 30 fits in its slot.
    tokio::time::sleep(DROP_SUMMARY_INTERVAL / 2).await;
    publish(30);
    tokio::time::sleep(DROP_SUMMARY_INTERVAL).await;
    publish(20);
    tokio::time::sleep(DROP_SUMMARY_INTERVAL * 3).await;
    // A new spell of drops after a quiet one is reported again.
    publish(5);
    tokio::time::sleep(DROP_SUMMARY_INTERVAL * 2).await;

    assert_eq!(dropped_total(component), 204, "every dropped Event counted");
    let lines = log.drop_lines();
    assert_eq!(
        lines.len(),
        3,
        "one summary per interval with drops, none once they stop: {lines:#?}"
    );
    assert!(
        lines[0].contains("dropped 179 events in the last 10s (queue full)"),
        "{lines:#?}"
    );
    assert!(lines[1].contains("dropped 20 events"), "{lines:#?}");
    assert!(lines[2].contains("dropped 5 events"), "{lines:#?}");
    assert!(lines.iter().all(|l| l.contains(component)), "{lines:#?}");
}

/// An API server that refuses every write (500; kube-rs retries 429s itself before giving up)
/// costs one log line per interval, not one per Event, and every refused Event is counted.
#[tokio::test]
async fn events_the_api_refuses_are_counted_and_summarised() {
    use ccm_controllers::events::DROP_SUMMARY_INTERVAL;

    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let sim = KubeSim::start(Config {
        fault_500_rate: 1.0,
        ..Config::default()
    })
    .await
    .expect("kube-sim");
    let component = "refusing-api-test";
    let recorder = Recorder::new(sim.client().expect("client"), component);
    let n = node("a");
    let start = tokio::time::Instant::now();
    for i in 0..60 {
        recorder.publish(&n, EventType::Warning, "Failed", format!("event {i}"));
    }
    // The writer drains the queue at the server's pace, in real time (a paused clock would
    // jump a whole interval at each request it waits for)...
    while dropped(component, "write_failed") < 60 {
        assert!(start.elapsed() < Duration::from_secs(60), "writer stuck");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let drained = start.elapsed();
    // ...then the clock is paused so the summaries come without waiting for them.
    tokio::time::pause();
    tokio::time::sleep(DROP_SUMMARY_INTERVAL * 2).await;
    let intervals = start.elapsed().as_secs() / DROP_SUMMARY_INTERVAL.as_secs() + 1;

    assert_eq!(dropped(component, "write_failed"), 60);
    assert_eq!(dropped(component, "queue_full"), 0);
    let lines: Vec<String> = log
        .drop_lines()
        .into_iter()
        .chain(log.lines_with("could not write"))
        .collect();
    assert!(
        !lines.is_empty() && lines.len() as u64 <= intervals,
        "at most one line per interval ({intervals}): {lines:#?}"
    );
    if drained < DROP_SUMMARY_INTERVAL {
        assert_eq!(
            lines.len(),
            1,
            "all refused within one interval: {lines:#?}"
        );
    }
    let summed: u64 = lines
        .iter()
        .filter_map(|l| {
            l.split("dropped ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    assert_eq!(summed, 60, "the summaries add up: {lines:#?}");
    assert!(
        lines
            .iter()
            .all(|l| l.contains("(write failed)") && l.contains("error=")),
        "{lines:#?}"
    );
}
