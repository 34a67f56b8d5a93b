//! Upstream cloud-provider-aws's API metrics, by AWS action name:
//! `cloudprovider_aws_api_request_duration_seconds{request}`,
//! `cloudprovider_aws_api_request_errors{request}` and
//! `cloudprovider_aws_api_throttled_requests_total{operation_name}`. They count what AWS saw,
//! one sample per SDK operation including the SDK's retries; ccm-rs's own `cloudprovider_api_*`
//! metrics count provider calls instead.

use std::collections::BTreeMap;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabel {
    request: &'static str,
}

/// Upstream labels its throttle counter `operation_name`, unlike the other two.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabel {
    operation_name: &'static str,
}

/// The AWS API metrics of one provider instance.
#[derive(Clone)]
pub struct AwsMetrics {
    duration: Family<RequestLabel, Histogram>,
    // A gauge, not a counter: prometheus-client would export a counter as `..._errors_total`,
    // and upstream dashboards query `cloudprovider_aws_api_request_errors`. It only goes up.
    errors: Family<RequestLabel, Gauge>,
    throttled: Family<OperationLabel, Counter>,
    tally: Arc<parking_lot::Mutex<BTreeMap<&'static str, u64>>>,
}

impl Default for AwsMetrics {
    fn default() -> Self {
        AwsMetrics {
            duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.005, 2.0, 15))
            }),
            errors: Family::default(),
            throttled: Family::default(),
            tally: Arc::default(),
        }
    }
}

impl AwsMetrics {
    /// Registers the families into the process registry served at `/metrics`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "cloudprovider_aws_api_request_duration_seconds",
            "Latency of AWS API calls",
            self.duration.clone(),
        );
        registry.register(
            "cloudprovider_aws_api_request_errors",
            "AWS API errors",
            self.errors.clone(),
        );
        // prometheus-client adds the `_total` suffix of upstream's name.
        registry.register(
            "cloudprovider_aws_api_throttled_requests",
            "AWS API throttled requests",
            self.throttled.clone(),
        );
    }

    /// An operation that AWS still throttled after the SDK's retries (upstream counts at the
    /// same place: its middleware wraps the SDK's retry loop).
    pub(crate) fn throttled(&self, operation_name: &'static str) {
        self.throttled
            .get_or_create(&OperationLabel { operation_name })
            .inc();
    }

    pub(crate) fn observe(&self, request: &'static str, seconds: f64, failed: bool) {
        let label = RequestLabel { request };
        self.duration.get_or_create(&label).observe(seconds);
        if failed {
            self.errors.get_or_create(&label).inc();
        }
        *self.tally.lock().entry(request).or_default() += 1;
    }

    /// SDK operations made for the AWS action `request` (e.g. `DescribeInstances`), for tests
    /// and reports.
    pub fn calls(&self, request: &str) -> u64 {
        self.tally.lock().get(request).copied().unwrap_or(0)
    }

    /// SDK operations by AWS action.
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.tally
            .lock()
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect()
    }
}
