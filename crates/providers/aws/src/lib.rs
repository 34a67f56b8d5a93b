//! # ccm-provider-aws: EC2 instances, VPC routes, Classic and Network Load Balancers
//!
//! `--cloud-provider=aws` for ccm-rs, on aws-sdk-rust. It behaves like upstream
//! kubernetes/cloud-provider-aws (provider IDs `aws:///<zone>/<instance-id>`, node addresses in
//! the same order, load balancers named from the Service UID, the same annotations and tags)
//! and differs where ccm-rs does better: instance lookups are real batches (one
//! `DescribeInstances` for up to 1,000 Nodes), and what rarely changes (route table ids, zone
//! ids, which instances already have source/dest check off) is remembered instead of asked for
//! again. See docs/providers/aws.md for flags, cloud-config, annotations and the IAM policy.
//!
//! Credentials come from the SDK's default chain (environment, profile, web identity / IRSA,
//! IMDS), optionally with a role to assume; they are never logged and never part of an error.

mod annotations;
mod clb;
mod cloud;
pub mod config;
mod error;
mod identity;
mod ini;
mod instances;
mod lb;
mod metrics;
#[cfg(test)]
mod mocked;
mod nlb;
mod providerid;
mod routes;
mod sg;
mod subnets;
mod volumes;

pub use cloud::{AwsCloud, IdentitySources, PROVIDER_NAME, https_client, register};
pub use config::{AwsConfig, IpFamily, Service, ServiceOverride};
pub use error::THROTTLE_CODES;
pub use identity::{ClusterId, explicit_cluster_name};
pub use instances::{MAX_IDS_PER_CALL, node_addresses};
pub use metrics::AwsMetrics;
pub use providerid::{NodeKind, classify, ec2_instance_id, parse_provider_id, provider_id};
pub use volumes::{EBS_CSI_DRIVER, MAX_VOLUMES_PER_CALL};
