//! What moto cannot show: pagination (moto ignores `MaxResults` and never sends a
//! `NextToken`) and how AWS error codes coming back through the SDK — with its retries — reach
//! the controllers. EC2 is played by a small fake behind the SDK's HTTP client trait that
//! answers the EC2 Query protocol as EC2 does: pages of at most [`PAGE`] items with a
//! `nextToken`, `InvalidInstanceID.NotFound` (HTTP 400) for the whole call when one id is
//! unknown, HTTP 503 `RequestLimitExceeded` when told to throttle. The SDK parses every answer
//! (XML, error codes, retry classification) exactly as it parses EC2's.
//!
//! Not aws-smithy-mocks: it needs `aws-smithy-http-client/test-util`, which turns on
//! `serde_json/preserve_order` for every crate of the workspace under `cargo test --workspace`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_ec2::config::{Credentials, SharedCredentialsProvider};
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::body::SdkBody;
use ccm_cloud::{CloudError, Instances, Node, Routes};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use parking_lot::Mutex;

use crate::cloud::AwsCloud;
use crate::config::AwsConfig;

/// Items per page in the fake (real EC2 pages by `MaxResults`, up to 1,000).
const PAGE: usize = 40;

/// One instance as the fake knows it.
#[derive(Clone)]
struct Inst {
    n: usize,
    state: &'static str,
}

impl Inst {
    fn id(&self) -> String {
        id(self.n)
    }

    fn xml(&self) -> String {
        let code = match self.state {
            "running" => 16,
            "stopped" => 80,
            _ => 48,
        };
        format!(
            "<item><instanceId>{}</instanceId><privateDnsName>{}</privateDnsName>\
             <privateIpAddress>10.0.{}.{}</privateIpAddress><instanceType>m5.large</instanceType>\
             <placement><availabilityZone>us-east-1a</availabilityZone>\
             <availabilityZoneId>use1-az1</availabilityZoneId></placement>\
             <instanceState><code>{code}</code><name>{}</name></instanceState>\
             <vpcId>vpc-1</vpcId></item>",
            self.id(),
            dns(self.n),
            self.n / 250,
            self.n % 250 + 1,
            self.state
        )
    }
}

fn id(n: usize) -> String {
    format!("i-{n:017x}")
}

fn dns(n: usize) -> String {
    format!("ip-10-0-{}-{}.ec2.internal", n / 250, n % 250 + 1)
}

/// A route table: id, and its routes (destination, target instance id or None: blackhole).
type Table = (String, Vec<(String, Option<String>)>);

/// The fake's state: the fleet, route tables, injected failures, calls per action.
#[derive(Default)]
struct State {
    fleet: Vec<Inst>,
    /// The route tables, in page order.
    tables: Vec<Table>,
    /// The next N calls answer 503 `RequestLimitExceeded`.
    throttle_next: usize,
    /// Every call answers this (HTTP status, code, message).
    fail_with: Option<(u16, String, String)>,
    calls: BTreeMap<String, usize>,
}

#[derive(Clone, Default)]
struct FakeEc2(Arc<Mutex<State>>);

impl std::fmt::Debug for FakeEc2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FakeEc2")
    }
}

/// `application/x-www-form-urlencoded` → key → value.
fn form(body: &[u8]) -> HashMap<String, String> {
    let decode = |s: &str| {
        let s = s.replace('+', " ");
        let mut out = Vec::new();
        let b = s.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%'
                && i + 2 < b.len()
                && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
            {
                out.push(v);
                i += 3;
                continue;
            }
            out.push(b[i]);
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    String::from_utf8_lossy(body)
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect()
}

/// Values of a Query-protocol list: `prefix.1`, `prefix.2`, ...
fn list(f: &HashMap<String, String>, prefix: &str) -> Vec<String> {
    (1..)
        .map_while(|i| f.get(&format!("{prefix}.{i}")).cloned())
        .collect()
}

fn error(status: u16, code: &str, message: &str) -> (u16, String) {
    (
        status,
        format!(
            "<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error>\
             </Errors><RequestID>fake</RequestID></Response>"
        ),
    )
}

/// Items `start..start+PAGE` of `all`, and the token of the next page if any.
fn page<T: Clone>(all: &[T], f: &HashMap<String, String>) -> (Vec<T>, String) {
    let start: usize = f.get("NextToken").and_then(|t| t.parse().ok()).unwrap_or(0);
    let end = (start + PAGE).min(all.len());
    let token = if end < all.len() {
        format!("<nextToken>{end}</nextToken>")
    } else {
        String::new()
    };
    (all[start.min(end)..end].to_vec(), token)
}

impl FakeEc2 {
    fn answer(&self, f: &HashMap<String, String>) -> (u16, String) {
        let action = f.get("Action").cloned().unwrap_or_default();
        let mut s = self.0.lock();
        *s.calls.entry(action.clone()).or_default() += 1;
        if let Some((status, code, message)) = &s.fail_with {
            return error(*status, code, message);
        }
        if s.throttle_next > 0 {
            s.throttle_next -= 1;
            return error(503, "RequestLimitExceeded", "Request limit exceeded.");
        }
        match action.as_str() {
            "DescribeInstances" => describe_instances(&s, f),
            "DescribeRouteTables" => describe_route_tables(&s, f),
            other => error(400, "InvalidAction", &format!("the fake has no {other}")),
        }
    }

    fn calls(&self, action: &str) -> usize {
        self.0.lock().calls.get(action).copied().unwrap_or(0)
    }
}

fn describe_instances(s: &State, f: &HashMap<String, String>) -> (u16, String) {
    let ids = list(f, "InstanceId");
    let matching: Vec<Inst> = if !ids.is_empty() {
        let by_id: HashMap<String, &Inst> = s.fleet.iter().map(|x| (x.id(), x)).collect();
        let unknown: Vec<&str> = ids
            .iter()
            .filter(|i| !by_id.contains_key(*i))
            .map(String::as_str)
            .collect();
        if !unknown.is_empty() {
            let msg = format!("The instance IDs '{}' do not exist", unknown.join(", "));
            return error(400, "InvalidInstanceID.NotFound", &msg);
        }
        ids.iter().map(|i| by_id[i].clone()).collect()
    } else {
        let mut names = Vec::new();
        let mut vpcs = Vec::new();
        for i in 1.. {
            let Some(name) = f.get(&format!("Filter.{i}.Name")) else {
                break;
            };
            match name.as_str() {
                "private-dns-name" => names.extend(list(f, &format!("Filter.{i}.Value"))),
                "vpc-id" => vpcs.extend(list(f, &format!("Filter.{i}.Value"))),
                _ => {}
            }
        }
        let names: std::collections::HashSet<String> = names.into_iter().collect();
        // Every instance of the fake is in vpc-1.
        let whole_vpc = vpcs.iter().any(|v| v == "vpc-1");
        s.fleet
            .iter()
            .filter(|x| {
                (names.is_empty() || names.contains(&dns(x.n))) && (vpcs.is_empty() || whole_vpc)
            })
            .cloned()
            .collect()
    };
    let (items, token) = page(&matching, f);
    let items: String = items.iter().map(Inst::xml).collect();
    (
        200,
        format!(
            "<DescribeInstancesResponse><requestId>fake</requestId><reservationSet><item>\
             <reservationId>r-1</reservationId><instancesSet>{items}</instancesSet></item>\
             </reservationSet>{token}</DescribeInstancesResponse>"
        ),
    )
}

fn describe_route_tables(s: &State, f: &HashMap<String, String>) -> (u16, String) {
    let (tables, token) = page(&s.tables, f);
    let items: String = tables
        .iter()
        .map(|(id, routes)| {
            let routes: String = routes
                .iter()
                .map(|(cidr, target)| match target {
                    Some(i) => format!(
                        "<item><destinationCidrBlock>{cidr}</destinationCidrBlock>\
                         <instanceId>{i}</instanceId><state>active</state></item>"
                    ),
                    None => format!(
                        "<item><destinationCidrBlock>{cidr}</destinationCidrBlock>\
                         <state>blackhole</state></item>"
                    ),
                })
                .collect();
            format!("<item><routeTableId>{id}</routeTableId><routeSet>{routes}</routeSet></item>")
        })
        .collect();
    (
        200,
        format!(
            "<DescribeRouteTablesResponse><requestId>fake</requestId>\
             <routeTableSet>{items}</routeTableSet>{token}</DescribeRouteTablesResponse>"
        ),
    )
}

impl HttpConnector for FakeEc2 {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let f = form(request.body().bytes().unwrap_or_default());
        let (status, xml) = self.answer(&f);
        let mut resp =
            HttpResponse::new(status.try_into().expect("valid status"), SdkBody::from(xml));
        resp.headers_mut().insert("content-type", "text/xml");
        HttpConnectorFuture::ready(Ok(resp))
    }
}

impl HttpClient for FakeEc2 {
    fn http_connector(
        &self,
        _: &HttpConnectorSettings,
        _: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(self.clone())
    }
}

/// A provider talking to `fake`, with the SDK's standard retry (3 attempts) and millisecond
/// backoff so throttling tests run fast.
fn provider(fake: &FakeEc2) -> AwsCloud {
    let sdk = SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            "test", "test", None, None, "fake",
        )))
        .http_client(SharedHttpClient::new(fake.clone()))
        .retry_config(RetryConfig::standard().with_initial_backoff(Duration::from_millis(1)))
        .build();
    AwsCloud::with_sdk_config(AwsConfig::default(), sdk)
}

fn fleet(n: usize, state: impl Fn(usize) -> &'static str) -> FakeEc2 {
    let fake = FakeEc2::default();
    fake.0.lock().fleet = (0..n).map(|n| Inst { n, state: state(n) }).collect();
    fake
}

fn node(name: &str, provider_id: Option<String>) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::NodeSpec {
            provider_id,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn with_pid(n: usize) -> Node {
    node(&dns(n), Some(format!("aws:///us-east-1a/{}", id(n))))
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn lookups_by_name_follow_next_token_and_split_names_by_150() {
    // 200 Nodes without providerID, no VPC known yet: two private-dns-name filters (150 + 50
    // names), and every page of each (4 + 2 pages of 40).
    let fake = fleet(200, |_| "running");
    let cloud = provider(&fake);
    let nodes: Vec<Arc<Node>> = (0..200).map(|n| Arc::new(node(&dns(n), None))).collect();
    let meta = rt().block_on(cloud.instances_metadata(&nodes));
    for (n, m) in meta.iter().enumerate() {
        let m = m.as_ref().expect("found").as_ref().expect("metadata");
        assert_eq!(m.provider_id, format!("aws:///us-east-1a/{}", id(n)));
        assert_eq!(m.instance_type, "m5.large");
        assert_eq!(
            m.node_addresses[0].address,
            format!("10.0.{}.{}", n / 250, n % 250 + 1)
        );
    }
    assert_eq!(fake.calls("DescribeInstances"), 4 + 2);
    // Another controller asking for the same new Nodes (a route's target, an LB's backends)
    // within 20 s is answered from what those calls returned.
    let again = rt().block_on(cloud.instances_metadata(&nodes[100..]));
    assert!(again.iter().all(|m| matches!(m, Ok(Some(_)))));
    assert_eq!(fake.calls("DescribeInstances"), 4 + 2);
}

#[test]
fn a_name_the_fresh_listing_lacks_is_asked_for_by_filter() {
    let fake = fleet(400, |_| "running");
    let cloud = provider(&fake);
    let nodes: Vec<Arc<Node>> = (0..400).map(|n| Arc::new(node(&dns(n), None))).collect();
    // 400 names: 150 by filter (4 pages of 40) tell the VPC; more than 150 are left, so the
    // VPC's listing (10 pages) answers them.
    let meta = rt().block_on(cloud.instances_metadata(&nodes));
    assert!(meta.iter().all(|m| matches!(m, Ok(Some(_)))));
    assert_eq!(fake.calls("DescribeInstances"), 4 + 10);
    // A name the listing does not have (an instance launched since, or none): one filter call.
    let ghost = node("ip-10-9-9-9.ec2.internal", None);
    let meta = rt().block_on(cloud.instances_metadata(&[ghost].map(Arc::new)));
    assert!(matches!(meta[0], Err(CloudError::InstanceNotFound)));
    assert_eq!(fake.calls("DescribeInstances"), 4 + 10 + 1);
    // 151 names is over the filter limit but the listing is fresh: no call.
    let meta = rt().block_on(cloud.instances_metadata(&nodes[..151]));
    assert!(meta.iter().all(|m| matches!(m, Ok(Some(_)))));
    assert_eq!(fake.calls("DescribeInstances"), 4 + 10 + 1);
}

#[test]
fn lookups_by_id_page_and_drop_ids_ec2_does_not_know() {
    // 1,200 Nodes with providerIDs and one whose instance EC2 no longer knows: two chunks
    // (1,000 + 201 ids, sorted, so the unknown id — it sorts last — is in chunk 2). Chunk 1 is
    // 25 pages; chunk 2 one failed call, then 5 pages for the 200 ids left.
    let fake = fleet(1200, |n| match n {
        7 => "stopped",
        8 => "terminated",
        _ => "running",
    });
    let cloud = provider(&fake);
    let mut nodes: Vec<Arc<Node>> = (0..1200).map(|n| Arc::new(with_pid(n))).collect();
    nodes.push(Arc::new(node(
        "gone",
        Some("aws:///us-east-1a/i-0ffffffffffffffff".into()),
    )));
    let status = rt().block_on(cloud.instances_status(&nodes));
    let s = |n: usize| status[n].as_ref().expect("status");
    assert!(s(0).exists && !s(0).shutdown);
    assert!(s(7).exists && s(7).shutdown, "stopped → shutdown");
    assert!(!s(8).exists, "terminated → gone");
    assert!(!s(1200).exists, "unknown id → gone, not an error");
    assert!(status.iter().all(Result::is_ok));
    assert_eq!(fake.calls("DescribeInstances"), 25 + 1 + 5);
}

#[test]
fn lookups_started_together_share_one_call() {
    // The address refresh looks up its chunks of Nodes concurrently: one DescribeInstances.
    let fake = fleet(2, |_| "running");
    let cloud = provider(&fake);
    let (first, second) = ([Arc::new(with_pid(0))], [Arc::new(with_pid(1))]);
    let (a, b) = rt().block_on(async {
        futures::join!(
            cloud.instances_metadata(&first),
            cloud.instances_metadata(&second)
        )
    });
    assert!(matches!(a[0], Ok(Some(_))) && matches!(b[0], Ok(Some(_))));
    assert_eq!(fake.calls("DescribeInstances"), 1);
}

#[test]
fn throttling_surfaces_as_throttled_after_the_sdks_three_attempts() {
    let fake = fleet(1, |_| "running");
    fake.0.lock().throttle_next = 3;
    let cloud = provider(&fake);
    let err = rt()
        .block_on(cloud.instances_status(&[with_pid(0)].map(Arc::new)))
        .remove(0)
        .expect_err("throttled");
    assert!(err.is_throttled(), "{err:?}");
    assert!(
        err.to_string()
            .contains("DescribeInstances: RequestLimitExceeded: Request limit exceeded."),
        "{err}"
    );
    assert_eq!(
        fake.calls("DescribeInstances"),
        3,
        "the SDK's standard retry"
    );
    // A throttled lookup is an error, never "instance gone".
    assert!(!matches!(err, CloudError::InstanceNotFound));

    // The next reconcile, with AWS calm again, succeeds.
    let again = rt().block_on(cloud.instances_status(&[with_pid(0)].map(Arc::new)));
    assert!(again[0].as_ref().expect("calm").exists);

    // Upstream's metric families, as /metrics serves them: one failed and one good operation.
    let mut registry = prometheus_client::registry::Registry::default();
    ccm_cloud::CloudProvider::register_metrics(&cloud, &mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    assert!(
        text.contains("cloudprovider_aws_api_request_errors{request=\"DescribeInstances\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "cloudprovider_aws_api_request_duration_seconds_count{request=\"DescribeInstances\"} 2\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "cloudprovider_aws_api_throttled_requests_total{operation_name=\"DescribeInstances\"} 1\n"
        ),
        "{text}"
    );
}

#[test]
fn two_throttles_are_absorbed_by_the_sdk_retry() {
    let fake = fleet(1, |_| "running");
    fake.0.lock().throttle_next = 2;
    let cloud = provider(&fake);
    let status = rt()
        .block_on(cloud.instances_status(&[with_pid(0)].map(Arc::new)))
        .remove(0);
    assert!(status.expect("retried to success").exists);
    assert_eq!(fake.calls("DescribeInstances"), 3);
}

#[test]
fn other_errors_keep_their_code_and_are_not_retried() {
    let fake = fleet(1, |_| "running");
    fake.0.lock().fail_with = Some((
        403,
        "UnauthorizedOperation".into(),
        "You are not authorized to perform this operation.".into(),
    ));
    let cloud = provider(&fake);
    let err = rt()
        .block_on(cloud.instances_status(&[with_pid(0)].map(Arc::new)))
        .remove(0)
        .expect_err("denied");
    assert!(
        matches!(&err, CloudError::Permanent(m) if m == "DescribeInstances: UnauthorizedOperation: You are not authorized to perform this operation."),
        "{err:?}"
    );
    assert_eq!(fake.calls("DescribeInstances"), 1);

    // EC2's own 5xx is retried by the SDK and then transient for the controllers.
    fake.0.lock().fail_with = Some((500, "InternalError".into(), "oops".into()));
    let err = rt()
        .block_on(cloud.instances_status(&[with_pid(0)].map(Arc::new)))
        .remove(0)
        .expect_err("internal");
    assert!(matches!(err, CloudError::Transient(_)), "{err:?}");
    assert_eq!(fake.calls("DescribeInstances"), 1 + 3);
}

#[test]
fn route_tables_are_read_to_the_last_page() {
    // 41 tagged tables: the last one is alone on page 2. A route is listed only when every
    // table agrees, so a provider that stopped after page one would also list 10.128.1.0/24.
    let fake = fleet(3, |_| "running");
    let all = |n: usize| {
        vec![
            ("10.128.0.0/24".to_string(), Some(id(1))),
            ("10.128.1.0/24".to_string(), Some(id(2))),
            ("10.128.2.0/24".to_string(), None),
        ]
        .into_iter()
        .take(n)
        .collect::<Vec<_>>()
    };
    let mut tables: Vec<_> = (0..PAGE).map(|t| (format!("rtb-{t}"), all(3))).collect();
    let mut last = all(1);
    last.push(("10.128.2.0/24".to_string(), None));
    tables.push(("rtb-last".to_string(), last));
    fake.0.lock().tables = tables;
    let cloud = provider(&fake);
    let mut routes = rt().block_on(cloud.list_routes("c1")).expect("routes");
    routes.sort_by(|x, y| x.destination_cidr.cmp(&y.destination_cidr));
    let got: Vec<(&str, &str, bool)> = routes
        .iter()
        .map(|r| {
            (
                r.destination_cidr.as_str(),
                r.target_node.as_str(),
                r.blackhole,
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("10.128.0.0/24", dns(1).as_str(), false),
            ("10.128.2.0/24", "", true),
        ]
    );
    assert_eq!(fake.calls("DescribeRouteTables"), 2);
    assert_eq!(
        fake.calls("DescribeInstances"),
        1,
        "instance → node names in one call"
    );
}

#[test]
fn only_ec2s_word_about_an_instance_id_makes_a_node_gone() {
    let fake = fleet(2, |_| "running");
    let cloud = provider(&fake);
    // No instance answers to this name: doubt, never "gone" (its Node would be deleted).
    let ghost = node("ip-10-9-9-9.ec2.internal", None);
    let status = rt().block_on(cloud.instances_status(&[ghost.clone(), with_pid(0)].map(Arc::new)));
    assert!(status[0].is_err(), "unresolvable name: {:?}", status[0]);
    assert!(status[1].as_ref().expect("the other Node").exists);
    assert!(rt().block_on(cloud.instance_exists(&ghost)).is_err());
    // A Node named by instance id (resource-based hostname): looked up by id, and EC2's
    // InvalidInstanceID.NotFound for it is the authoritative "gone".
    let named_by_id = node(&id(1), None);
    let gone = node("i-0ffffffffffffffff", None);
    let status = rt().block_on(cloud.instances_status(&[named_by_id, gone].map(Arc::new)));
    assert!(status[0].as_ref().expect("found by id").exists);
    assert!(!status[1].as_ref().expect("EC2 said NotFound").exists);
    // Fargate and hybrid Nodes: no EC2 call, never gone, nothing to initialize.
    let before = fake.calls("DescribeInstances");
    let fargate = node(
        "fargate-ip-10-0-1-7.ec2.internal",
        Some("aws:///us-east-1a/fargate-ip-10-0-1-7.ec2.internal".into()),
    );
    let hybrid = node("edge-1", Some("eks-hybrid:///us-east-1/prod/edge-1".into()));
    let status = rt().block_on(cloud.instances_status(&[fargate.clone(), hybrid].map(Arc::new)));
    assert!(status.iter().all(|s| s.as_ref().is_ok_and(|s| s.exists)));
    let meta = rt().block_on(cloud.instances_metadata(&[fargate, with_pid(0)].map(Arc::new)));
    assert!(matches!(meta[0], Ok(None)), "{:?}", meta[0]);
    assert!(matches!(meta[1], Ok(Some(_))), "the EC2 Node beside it");
    assert_eq!(fake.calls("DescribeInstances"), before + 1);
}

#[test]
fn fargate_and_hybrid_nodes_stay_out_of_load_balancer_backends_without_failing_them() {
    let fake = fleet(2, |_| "running");
    let cloud = provider(&fake);
    let fargate = node(
        "fargate-ip-10-0-1-7.ec2.internal",
        Some("aws:///us-east-1a/fargate-ip-10-0-1-7.ec2.internal".into()),
    );
    let hybrid = node("edge-1", Some("eks-hybrid:///us-east-1/prod/edge-1".into()));
    let ids = rt()
        .block_on(cloud.node_instance_ids(
            &[with_pid(0), fargate, hybrid, with_pid(1)].map(std::sync::Arc::new),
        ))
        .expect("one Fargate or hybrid Node never fails the others' backends");
    assert_eq!(ids.into_iter().collect::<Vec<_>>(), vec![id(0), id(1)]);
    assert_eq!(
        fake.calls("DescribeInstances"),
        0,
        "providerIDs need no lookup"
    );
}
