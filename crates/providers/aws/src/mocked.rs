//! What moto cannot show: pagination (moto ignores `MaxResults` and never sends a
//! `NextToken`) and how AWS error codes coming back through the SDK — with its retries — reach
//! the controllers. EC2 is played by aws-smithy-mocks rules that answer like EC2 does: pages of
//! at most `PAGE` instances, `InvalidInstanceID.NotFound` for the whole call when one id is
//! unknown, `RequestLimitExceeded` when told to throttle.

use std::sync::Arc;
use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::{BehaviorVersion, Region};
use aws_sdk_ec2::config::Credentials;
use aws_sdk_ec2::error::ErrorMetadata;
use aws_sdk_ec2::operation::describe_instances::{
    DescribeInstancesError, DescribeInstancesInput, DescribeInstancesOutput,
};
use aws_sdk_ec2::operation::describe_route_tables::DescribeRouteTablesOutput;
use aws_sdk_ec2::types::{
    Instance, InstanceState, InstanceStateName, InstanceType, Placement, Reservation, Route,
    RouteState, RouteTable,
};
use aws_smithy_mocks::{MockResponse, MockResponseInterceptor, Rule, RuleMode, mock};
use ccm_cloud::{CloudError, Instances, Node, Routes};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::cloud::{AwsCloud, Clients};
use crate::config::AwsConfig;

/// Instances per page in the fake EC2 (real EC2 pages by `MaxResults`, up to 1,000).
const PAGE: usize = 40;

fn instance(n: usize, state: InstanceStateName) -> Instance {
    Instance::builder()
        .instance_id(format!("i-{n:017x}"))
        .private_dns_name(dns(n))
        .private_ip_address(format!("10.0.{}.{}", n / 250, n % 250 + 1))
        .instance_type(InstanceType::M5Large)
        .placement(
            Placement::builder()
                .availability_zone("us-east-1a")
                .availability_zone_id("use1-az1")
                .build(),
        )
        .state(InstanceState::builder().name(state).build())
        .vpc_id("vpc-1")
        .build()
}

fn dns(n: usize) -> String {
    format!("ip-10-0-{}-{}.ec2.internal", n / 250, n % 250 + 1)
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

fn ec2_error(code: &str, message: &str) -> DescribeInstancesError {
    DescribeInstancesError::generic(ErrorMetadata::builder().code(code).message(message).build())
}

/// A fake EC2 `DescribeInstances` over `fleet`: by ids (any unknown id fails the call, as EC2
/// does) or by `private-dns-name` filter, `PAGE` instances per page with a `NextToken`.
fn describe_instances(fleet: Arc<Vec<Instance>>) -> Rule {
    mock!(aws_sdk_ec2::Client::describe_instances).then_compute_response(
        move |req: &DescribeInstancesInput| {
            let ids = req.instance_ids();
            let matching: Vec<&Instance> = if !ids.is_empty() {
                let unknown: Vec<&String> = ids
                    .iter()
                    .filter(|id| !fleet.iter().any(|i| i.instance_id() == Some(id.as_str())))
                    .collect();
                if !unknown.is_empty() {
                    let list: Vec<&str> = unknown.iter().map(|s| s.as_str()).collect();
                    return MockResponse::Error(ec2_error(
                        "InvalidInstanceID.NotFound",
                        &format!("The instance IDs '{}' do not exist", list.join(", ")),
                    ));
                }
                fleet
                    .iter()
                    .filter(|i| ids.iter().any(|id| i.instance_id() == Some(id.as_str())))
                    .collect()
            } else {
                let names: Vec<&String> = req
                    .filters()
                    .iter()
                    .filter(|f| f.name() == Some("private-dns-name"))
                    .flat_map(|f| f.values())
                    .collect();
                fleet
                    .iter()
                    .filter(|i| {
                        names
                            .iter()
                            .any(|n| i.private_dns_name() == Some(n.as_str()))
                    })
                    .collect()
            };
            let start: usize = req.next_token().map_or(0, |t| t.parse().unwrap_or(0));
            let end = (start + PAGE).min(matching.len());
            let page: Vec<Instance> = matching[start..end].iter().map(|i| (*i).clone()).collect();
            let out = DescribeInstancesOutput::builder()
                .reservations(Reservation::builder().set_instances(Some(page)).build());
            MockResponse::Output(if end < matching.len() {
                out.next_token(end.to_string()).build()
            } else {
                out.build()
            })
        },
    )
}

/// A provider whose EC2 client answers from `rules` (first match wins), with the SDK's
/// standard retry (3 attempts) and millisecond backoff so throttling tests run fast.
fn provider(rules: &[&Rule]) -> AwsCloud {
    let mut mocks = MockResponseInterceptor::new().rule_mode(RuleMode::MatchAny);
    for r in rules {
        mocks = mocks.with_rule(r);
    }
    let ec2 = aws_sdk_ec2::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "mock"))
        .http_client(aws_smithy_mocks::create_mock_http_client())
        .retry_config(RetryConfig::standard().with_initial_backoff(Duration::from_millis(1)))
        .interceptor(mocks)
        .build();
    let sdk = aws_config::SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .build();
    AwsCloud::with_clients(
        AwsConfig::default(),
        Clients {
            ec2: aws_sdk_ec2::Client::from_conf(ec2),
            elb: aws_sdk_elasticloadbalancing::Client::new(&sdk),
            elbv2: aws_sdk_elasticloadbalancingv2::Client::new(&sdk),
            region: "us-east-1".into(),
        },
    )
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
    let fleet: Arc<Vec<Instance>> = Arc::new(
        (0..200)
            .map(|n| instance(n, InstanceStateName::Running))
            .collect(),
    );
    let rule = describe_instances(fleet.clone());
    let cloud = provider(&[&rule]);
    let nodes: Vec<Node> = (0..200).map(|n| node(&dns(n), None)).collect();
    let meta = rt().block_on(cloud.instances_metadata(&nodes));
    for (n, m) in meta.iter().enumerate() {
        let m = m.as_ref().expect("found").as_ref().expect("metadata");
        assert_eq!(
            m.provider_id,
            format!("aws:///us-east-1a/i-{n:017x}"),
            "node {n}"
        );
    }
    assert_eq!(rule.num_calls(), 4 + 2);
}

#[test]
fn lookups_by_id_page_and_drop_ids_ec2_does_not_know() {
    // 1,200 Nodes with providerIDs, one of which EC2 no longer knows: two chunks (1,000 +
    // 200 ids); the chunk with the unknown id costs one failed call, then its pages.
    let fleet: Arc<Vec<Instance>> = Arc::new(
        (0..1200)
            .map(|n| {
                let state = match n {
                    7 => InstanceStateName::Stopped,
                    8 => InstanceStateName::Terminated,
                    _ => InstanceStateName::Running,
                };
                instance(n, state)
            })
            .collect(),
    );
    let rule = describe_instances(fleet.clone());
    let cloud = provider(&[&rule]);
    let mut nodes: Vec<Node> = (0..1200)
        .map(|n| {
            let pid = format!("aws:///us-east-1a/i-{n:017x}");
            node(&dns(n), Some(pid))
        })
        .collect();
    nodes.push(node(
        "gone",
        Some("aws:///us-east-1a/i-0ffffffffffffffff".into()),
    ));
    let status = rt().block_on(cloud.instances_status(&nodes));
    let s = |n: usize| status[n].as_ref().expect("status");
    assert!(s(0).exists && !s(0).shutdown);
    assert!(s(7).exists && s(7).shutdown, "stopped → shutdown");
    assert!(!s(8).exists, "terminated → gone");
    assert!(!s(1200).exists, "unknown id → gone, not an error");
    assert_eq!(status.iter().filter(|s| s.is_err()).count(), 0);
    // Ids are looked up in sorted order, so the unknown id (it sorts last) is in chunk 2:
    // chunk 1 is 25 pages, chunk 2 one failed call then 5 pages for the 200 ids left.
    let pages = 1000usize.div_ceil(PAGE) + 200usize.div_ceil(PAGE);
    assert_eq!(rule.num_calls(), pages + 1);
}

#[test]
fn throttling_surfaces_as_throttled_after_the_sdks_three_attempts() {
    let throttled = mock!(aws_sdk_ec2::Client::describe_instances)
        .then_error(|| ec2_error("RequestLimitExceeded", "Request limit exceeded."));
    let cloud = provider(&[&throttled]);
    let nodes = vec![node("a", Some("aws:///us-east-1a/i-0123".into()))];
    let err = rt()
        .block_on(cloud.instances_status(&nodes))
        .remove(0)
        .expect_err("throttled");
    assert!(err.is_throttled(), "{err:?}");
    assert!(
        err.to_string()
            .contains("DescribeInstances: RequestLimitExceeded: Request limit exceeded."),
        "{err}"
    );
    assert_eq!(throttled.num_calls(), 3, "the SDK's standard retry");
    // A throttled lookup is an error, never "instance gone".
    assert!(!matches!(err, CloudError::InstanceNotFound));
}

#[test]
fn two_throttles_are_absorbed_by_the_sdk_retry() {
    // The SDK retries within one operation; the mock answers its attempts in sequence.
    let flaky = mock!(aws_sdk_ec2::Client::describe_instances)
        .sequence()
        .error(|| ec2_error("RequestLimitExceeded", "slow down"))
        .times(2)
        .output(|| {
            DescribeInstancesOutput::builder()
                .reservations(
                    Reservation::builder()
                        .instances(instance(1, InstanceStateName::Running))
                        .build(),
                )
                .build()
        })
        .build();
    let cloud = provider(&[&flaky]);
    let nodes = vec![node(
        &dns(1),
        Some(format!("aws:///us-east-1a/i-{:017x}", 1)),
    )];
    let status = rt().block_on(cloud.instances_status(&nodes)).remove(0);
    assert!(status.expect("retried to success").exists);
    assert_eq!(flaky.num_calls(), 3);
}

#[test]
fn other_errors_keep_their_code_and_are_not_retried() {
    let denied = mock!(aws_sdk_ec2::Client::describe_instances).then_error(|| {
        ec2_error(
            "UnauthorizedOperation",
            "You are not authorized to perform this operation.",
        )
    });
    let cloud = provider(&[&denied]);
    let nodes = vec![node("a", Some("aws:///us-east-1a/i-0123".into()))];
    let err = rt()
        .block_on(cloud.instances_status(&nodes))
        .remove(0)
        .expect_err("denied");
    assert!(
        matches!(&err, CloudError::Permanent(m) if m.starts_with("DescribeInstances: UnauthorizedOperation: ")),
        "{err:?}"
    );
    assert_eq!(denied.num_calls(), 1);
}

fn table(id: &str, routes: &[(&str, Option<&str>)]) -> RouteTable {
    RouteTable::builder()
        .route_table_id(id)
        .set_routes(Some(
            routes
                .iter()
                .map(|(cidr, inst)| {
                    let r = Route::builder().destination_cidr_block(*cidr);
                    match inst {
                        Some(i) => r.instance_id(*i).state(RouteState::Active),
                        None => r.state(RouteState::Blackhole),
                    }
                    .build()
                })
                .collect(),
        ))
        .build()
}

#[test]
fn route_tables_are_read_to_the_last_page() {
    // Two tagged tables on two pages: a route is listed only when both tables agree, so a
    // provider that stopped after page one would list 10.128.1.0/24 too.
    let i1 = format!("i-{:017x}", 1);
    let i2 = format!("i-{:017x}", 2);
    let (a, b) = (i1.clone(), i2.clone());
    let tables =
        mock!(aws_sdk_ec2::Client::describe_route_tables).then_compute_output(move |req| match req
            .next_token()
        {
            None => DescribeRouteTablesOutput::builder()
                .route_tables(table(
                    "rtb-1",
                    &[
                        ("10.128.0.0/24", Some(&a)),
                        ("10.128.1.0/24", Some(&b)),
                        ("10.128.2.0/24", None),
                    ],
                ))
                .next_token("2")
                .build(),
            Some(_) => DescribeRouteTablesOutput::builder()
                .route_tables(table(
                    "rtb-2",
                    &[("10.128.0.0/24", Some(&a)), ("10.128.2.0/24", None)],
                ))
                .build(),
        });
    let fleet = Arc::new(vec![
        instance(1, InstanceStateName::Running),
        instance(2, InstanceStateName::Running),
    ]);
    let describes = describe_instances(fleet);
    let cloud = provider(&[&tables, &describes]);
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
    assert_eq!(tables.num_calls(), 2);
    assert_eq!(
        describes.num_calls(),
        1,
        "instance → node names in one call"
    );
}
