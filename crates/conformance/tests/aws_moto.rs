//! The AWS provider against moto: the contract level with a harness that launches, stops and
//! terminates EC2 instances and reads the cluster's ELBs and security groups behind the
//! provider's back. moto cannot fail on purpose: for the fault rules the same provider code is
//! pointed at a small endpoint that answers every call with the injected error (500
//! InternalError, 403 UnauthorizedOperation, 503 RequestLimitExceeded, or a dropped
//! connection) — a hand-written stand-in, because no emulator fails on request. Both levels
//! run: the contract (`aws_on_moto_contract`) and the cluster level with the real manager
//! (`aws_on_moto_cluster`).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_config::{BehaviorVersion, Region};
use aws_sdk_ec2::types::{Filter, ResourceType, Tag, TagSpecification};
use ccm_cloud::k8s_openapi::api::core::v1::{NodeAddress, NodeSpec, NodeStatus};
use ccm_cloud::{
    CloudProvider, CloudResult, InstanceMetadata, InstanceStatus, Instances, LoadBalancer,
    LoadBalancerStatus, Node, Route, Routes, Service, node_name,
};
use ccm_conformance::{
    Fault, Harness, HarnessError, HarnessResult, Inventory, LbRecord, Level, Outcome, Suite,
    SuiteOptions, rules,
};
use ccm_provider_aws::{AwsCloud, AwsConfig, IpFamily, Service as AwsService, ServiceOverride};
use parking_lot::Mutex;

/// moto on an ephemeral loopback port; exits when the test process's stdin pipe closes.
struct Moto {
    child: Child,
    _stdin: ChildStdin,
    url: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn moto_python() -> std::path::PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("moto_server"))
            .find(|c| c.is_file())
    });
    let venv =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/moto_server");
    on_path
        .or_else(|| venv.is_file().then_some(venv))
        .expect("moto_server not found on PATH or in <workspace>/.venv/bin: run .ci/run (.ci/setup.d installs moto)")
        .with_file_name("python")
}

fn start_moto() -> Moto {
    const WRAPPER: &str = "import os, sys, threading\n\
def watch():\n    sys.stdin.read()\n    os._exit(0)\n\
threading.Thread(target=watch, daemon=True).start()\n\
from moto.server import main\n\
main(['-H', '127.0.0.1', '-p', '0'])\n";
    let dir = std::env::temp_dir().join(format!("ccm-conformance-moto-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let mut child = Command::new(moto_python())
        .args(["-c", WRAPPER])
        .current_dir(&dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start moto");
    let stdin = child.stdin.take().expect("stdin");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(port) = line.split("Running on http://127.0.0.1:").nth(1)
                && let Some(tx) = tx.take()
            {
                let _ = tx.send(port.trim().to_string());
            }
        }
    });
    let port = rx.recv_timeout(Duration::from_secs(60)).expect("moto port");
    Moto {
        child,
        _stdin: stdin,
        url: format!("http://127.0.0.1:{port}"),
    }
}

/// What the fault endpoint answers (a hand-written stand-in: no emulator fails on request).
#[derive(Clone, Copy, PartialEq)]
enum Answer {
    /// Answer with this fault's HTTP status and AWS error code.
    Fault(Fault),
    /// Close the connection without an answer (a dropped request, as a timeout ends).
    Drop,
}

/// Reads one HTTP request: the head, then `content-length` bytes of body.
async fn read_request(sock: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let len = text[..end]
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0usize);
            if buf.len() >= end + 4 + len {
                return text;
            }
        }
        match sock.read(&mut chunk).await {
            Ok(0) | Err(_) => return String::from_utf8_lossy(&buf).to_string(),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// An HTTP endpoint that answers every AWS call with the current [`Answer`].
struct FaultServer {
    url: String,
    answer: Arc<Mutex<Answer>>,
}

impl FaultServer {
    async fn start() -> FaultServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let answer = Arc::new(Mutex::new(Answer::Fault(Fault::ServerError)));
        let a = answer.clone();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let answer = *a.lock();
                tokio::spawn(async move {
                    use tokio::io::AsyncWriteExt;
                    let request = read_request(&mut sock).await;
                    let Answer::Fault(fault) = answer else {
                        return;
                    };
                    // EC2 speaks the EC2 query protocol; ELB its own error shape and codes.
                    let ec2 = request.contains("Version=2016-11-15");
                    let (code, error) = match (fault, ec2) {
                        (Fault::ServerError, true) => (500, "InternalError"),
                        (Fault::ServerError, false) => (500, "InternalFailure"),
                        (Fault::Forbidden, true) => (403, "UnauthorizedOperation"),
                        (Fault::Forbidden, false) => (403, "AccessDenied"),
                        (Fault::NotFound, _) => (404, "NotFound"),
                        (_, true) => (503, "RequestLimitExceeded"),
                        (_, false) => (400, "Throttling"),
                    };
                    let msg = "injected by the conformance suite";
                    let body = if ec2 {
                        format!(
                            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{error}</Code><Message>{msg}</Message></Error></Errors><RequestID>conformance</RequestID></Response>"
                        )
                    } else {
                        format!(
                            "<ErrorResponse><Error><Type>Sender</Type><Code>{error}</Code><Message>{msg}</Message></Error><RequestId>conformance</RequestId></ErrorResponse>"
                        )
                    };
                    let resp = format!(
                        "HTTP/1.1 {code} Injected\r\ncontent-type: text/xml\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = sock.write_all(resp.as_bytes()).await;
                });
            }
        });
        FaultServer { url, answer }
    }
}

/// The AWS provider under test, talking to moto, or — while a fault is injected — an
/// identically configured `AwsCloud` talking to the fault endpoint. Every call is the
/// provider's own code; only the endpoint changes, as when EC2 itself fails.
struct Switching {
    normal: AwsCloud,
    faulty: AwsCloud,
    fault: std::sync::atomic::AtomicBool,
}

impl Switching {
    fn now(&self) -> &AwsCloud {
        if self.fault.load(std::sync::atomic::Ordering::SeqCst) {
            &self.faulty
        } else {
            &self.normal
        }
    }
}

struct SwitchingProvider(Arc<Switching>);

impl CloudProvider for SwitchingProvider {
    fn provider_name(&self) -> &str {
        ccm_provider_aws::PROVIDER_NAME
    }
    fn instances(&self) -> Option<Arc<dyn Instances>> {
        Some(self.0.clone())
    }
    fn load_balancer(&self) -> Option<Arc<dyn LoadBalancer>> {
        Some(self.0.clone())
    }
    fn routes(&self) -> Option<Arc<dyn Routes>> {
        Some(self.0.clone())
    }
}

fn cap<T: ?Sized>(c: Option<Arc<T>>) -> Arc<T> {
    c.expect("the AWS provider has every capability")
}

#[async_trait]
impl Instances for Switching {
    async fn instance_exists(&self, n: &Node) -> CloudResult<bool> {
        cap(self.now().instances()).instance_exists(n).await
    }
    async fn instance_shutdown(&self, n: &Node) -> CloudResult<bool> {
        cap(self.now().instances()).instance_shutdown(n).await
    }
    async fn instance_metadata(&self, n: &Node) -> CloudResult<Option<InstanceMetadata>> {
        cap(self.now().instances()).instance_metadata(n).await
    }
    async fn instances_metadata(
        &self,
        n: &[Arc<Node>],
    ) -> Vec<CloudResult<Option<InstanceMetadata>>> {
        cap(self.now().instances()).instances_metadata(n).await
    }
    async fn instances_status(&self, n: &[Arc<Node>]) -> Vec<CloudResult<InstanceStatus>> {
        cap(self.now().instances()).instances_status(n).await
    }
    fn native_batching(&self) -> bool {
        true
    }
}

#[async_trait]
impl LoadBalancer for Switching {
    async fn get_load_balancer(
        &self,
        c: &str,
        s: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        cap(self.now().load_balancer())
            .get_load_balancer(c, s)
            .await
    }
    fn load_balancer_name(&self, c: &str, s: &Service) -> String {
        cap(self.now().load_balancer()).load_balancer_name(c, s)
    }
    async fn ensure_load_balancer(
        &self,
        c: &str,
        s: &Service,
        n: &[std::sync::Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        cap(self.now().load_balancer())
            .ensure_load_balancer(c, s, n)
            .await
    }
    async fn update_load_balancer(
        &self,
        c: &str,
        s: &Service,
        n: &[std::sync::Arc<Node>],
    ) -> CloudResult<()> {
        cap(self.now().load_balancer())
            .update_load_balancer(c, s, n)
            .await
    }
    async fn ensure_load_balancer_deleted(&self, c: &str, s: &Service) -> CloudResult<()> {
        cap(self.now().load_balancer())
            .ensure_load_balancer_deleted(c, s)
            .await
    }
}

#[async_trait]
impl Routes for Switching {
    async fn list_routes(&self, c: &str) -> CloudResult<Vec<Route>> {
        cap(self.now().routes()).list_routes(c).await
    }
    async fn create_route(&self, c: &str, h: &str, r: &Route) -> CloudResult<()> {
        cap(self.now().routes()).create_route(c, h, r).await
    }
    async fn delete_route(&self, c: &str, r: &Route) -> CloudResult<()> {
        cap(self.now().routes()).delete_route(c, r).await
    }
}

const REGION: &str = "us-east-1";

async fn sdk() -> aws_config::SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(REGION))
        .credentials_provider(aws_sdk_ec2::config::Credentials::new(
            "testing", "testing", None, None, "moto",
        ))
        .http_client(ccm_provider_aws::https_client())
        .load()
        .await
}

fn tags(kind: ResourceType, t: &[(&str, &str)]) -> TagSpecification {
    TagSpecification::builder()
        .resource_type(kind)
        .set_tags(Some(
            t.iter()
                .map(|(k, v)| Tag::builder().key(*k).value(*v).build())
                .collect(),
        ))
        .build()
}

struct AwsHarness {
    provider: Arc<dyn CloudProvider>,
    switch: Arc<Switching>,
    faults: FaultServer,
    ec2: aws_sdk_ec2::Client,
    elb: aws_sdk_elasticloadbalancing::Client,
    subnet: String,
    node_sg: String,
    /// Node name (private DNS name) → instance id.
    ids: Mutex<HashMap<String, String>>,
}

impl AwsHarness {
    /// A VPC laid out for the suite's two cluster names: tagged subnets (ELB role) and one
    /// tagged route table per cluster name, a node security group.
    async fn start(url: &str, cluster: &str) -> anyhow::Result<AwsHarness> {
        let sdk = sdk().await;
        let ec2 = aws_sdk_ec2::Client::from_conf(
            aws_sdk_ec2::config::Builder::from(&sdk)
                .endpoint_url(url)
                .build(),
        );
        let elb = aws_sdk_elasticloadbalancing::Client::from_conf(
            aws_sdk_elasticloadbalancing::config::Builder::from(&sdk)
                .endpoint_url(url)
                .build(),
        );
        let mine = format!("kubernetes.io/cluster/{cluster}");
        let other = format!("kubernetes.io/cluster/{cluster}-other");
        let vpc = ec2
            .create_vpc()
            .cidr_block("10.0.0.0/16")
            .send()
            .await?
            .vpc
            .and_then(|v| v.vpc_id)
            .expect("vpc");
        public_vpc(&ec2, &vpc).await?;
        let mut subnet = String::new();
        for (i, zone) in ["a", "b"].iter().enumerate() {
            let s = ec2
                .create_subnet()
                .vpc_id(&vpc)
                .cidr_block(format!("10.0.{}.0/20", i * 16))
                .availability_zone(format!("{REGION}{zone}"))
                .tag_specifications(tags(
                    ResourceType::Subnet,
                    &[
                        (&mine, "owned"),
                        (&other, "owned"),
                        ("kubernetes.io/role/elb", "1"),
                    ],
                ))
                .send()
                .await?
                .subnet
                .and_then(|s| s.subnet_id)
                .expect("subnet");
            if i == 0 {
                subnet = s;
            }
        }
        for t in [&mine, &other] {
            ec2.create_route_table()
                .vpc_id(&vpc)
                .tag_specifications(tags(ResourceType::RouteTable, &[(t, "owned")]))
                .send()
                .await?;
        }
        let node_sg = ec2
            .create_security_group()
            .vpc_id(&vpc)
            .group_name("nodes")
            .description("cluster nodes")
            .tag_specifications(tags(ResourceType::SecurityGroup, &[(&mine, "owned")]))
            .send()
            .await?
            .group_id
            .expect("sg");
        let cfg = |url: &str| {
            let over = |service| ServiceOverride {
                service,
                url: url.to_string(),
            };
            AwsConfig {
                service_override: vec![
                    over(AwsService::Ec2),
                    over(AwsService::Elasticloadbalancing),
                    over(AwsService::Elasticloadbalancingv2),
                ],
                node_ip_families: vec![IpFamily::Ipv4],
                ..Default::default()
            }
        };
        let faults = FaultServer::start().await;
        let switch = Arc::new(Switching {
            normal: AwsCloud::with_sdk_config(cfg(url), sdk.clone()),
            faulty: AwsCloud::with_sdk_config(cfg(&faults.url), sdk),
            fault: Default::default(),
        });
        let provider = Arc::new(SwitchingProvider(switch.clone()));
        Ok(AwsHarness {
            provider,
            switch,
            faults,
            ec2,
            elb,
            subnet,
            node_sg,
            ids: Mutex::default(),
        })
    }

    fn id(&self, node: &Node) -> HarnessResult<String> {
        self.ids
            .lock()
            .get(node_name(node))
            .cloned()
            .ok_or_else(|| HarnessError::Failed(format!("no instance for {}", node_name(node))))
    }
}

fn failed(e: impl std::fmt::Display) -> HarnessError {
    HarnessError::Failed(e.to_string())
}

#[async_trait]
impl Harness for AwsHarness {
    fn provider(&self) -> Arc<dyn CloudProvider> {
        self.provider.clone()
    }

    /// EC2 names the Node (its private DNS name): `_name` is only the suite's wish.
    async fn create_instance(&self, _name: &str) -> HarnessResult<Node> {
        let out = self
            .ec2
            .run_instances()
            .image_id("ami-12c6146b")
            .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
            .min_count(1)
            .max_count(1)
            .subnet_id(&self.subnet)
            .security_group_ids(&self.node_sg)
            .send()
            .await
            .map_err(failed)?;
        let inst = out
            .instances()
            .first()
            .ok_or_else(|| failed("no instance"))?;
        let (id, dns) = (
            inst.instance_id().unwrap_or_default(),
            inst.private_dns_name().unwrap_or_default(),
        );
        self.ids.lock().insert(dns.to_string(), id.to_string());
        let mut node = ccm_provider_sim::fixtures::node(dns, None);
        node.spec = Some(NodeSpec::default());
        node.status = Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: inst.private_ip_address().unwrap_or_default().into(),
            }]),
            ..Default::default()
        });
        Ok(node)
    }

    async fn stop_instance(&self, node: &Node) -> HarnessResult<()> {
        self.ec2
            .stop_instances()
            .instance_ids(self.id(node)?)
            .send()
            .await
            .map(drop)
            .map_err(failed)
    }

    async fn start_instance(&self, node: &Node) -> HarnessResult<()> {
        self.ec2
            .start_instances()
            .instance_ids(self.id(node)?)
            .send()
            .await
            .map(drop)
            .map_err(failed)
    }

    async fn terminate_instance(&self, node: &Node) -> HarnessResult<()> {
        self.ec2
            .terminate_instances()
            .instance_ids(self.id(node)?)
            .send()
            .await
            .map(drop)
            .map_err(failed)
    }

    async fn inject(&self, fault: Fault) -> HarnessResult<()> {
        let answer = match fault {
            Fault::ServerError | Fault::Forbidden | Fault::Throttle => Answer::Fault(fault),
            Fault::Timeout => Answer::Drop,
            Fault::NotFound => {
                return Err(HarnessError::Unsupported(
                    "EC2 answers unknown ids with 400 InvalidInstanceID.NotFound, not a 404".into(),
                ));
            }
            Fault::Latency(_) => {
                return Err(HarnessError::Unsupported("moto cannot be made slow".into()));
            }
        };
        *self.faults.answer.lock() = answer;
        self.switch
            .fault
            .store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    async fn clear_faults(&self) {
        self.switch
            .fault
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    async fn inventory(&self, cluster: &str) -> Option<Inventory> {
        let key = format!("kubernetes.io/cluster/{cluster}");
        let lbs = self.elb.describe_load_balancers().send().await.ok()?;
        let by_id: HashMap<String, String> = self
            .ids
            .lock()
            .iter()
            .map(|(n, i)| (i.clone(), n.clone()))
            .collect();
        let mut load_balancers = Vec::new();
        for lb in lbs.load_balancer_descriptions() {
            let name = lb.load_balancer_name().unwrap_or_default().to_string();
            let tags = self
                .elb
                .describe_tags()
                .load_balancer_names(&name)
                .send()
                .await
                .ok()?;
            let tags: HashMap<String, String> = tags
                .tag_descriptions()
                .iter()
                .flat_map(|d| d.tags())
                .map(|t| {
                    (
                        t.key().to_string(),
                        t.value().unwrap_or_default().to_string(),
                    )
                })
                .collect();
            if !tags.contains_key(&key) {
                continue;
            }
            let mut hosts: Vec<String> = lb
                .instances()
                .iter()
                .filter_map(|i| i.instance_id())
                .filter_map(|i| by_id.get(i).cloned())
                .collect();
            hosts.sort();
            load_balancers.push(LbRecord {
                name,
                service: tags.get("kubernetes.io/service-name").cloned(),
                service_uid: None,
                ports: Some(
                    lb.listener_descriptions()
                        .iter()
                        .filter_map(|l| l.listener())
                        .map(|l| l.load_balancer_port())
                        .collect(),
                ),
                hosts: Some(hosts),
            });
        }
        let sgs = self
            .ec2
            .describe_security_groups()
            .filters(Filter::builder().name("tag-key").values(&key).build())
            .send()
            .await
            .ok()?;
        let other = sgs
            .security_groups()
            .iter()
            .filter_map(|g| g.group_id())
            .filter(|g| *g != self.node_sg)
            .map(|g| format!("sg/{g}"))
            .collect();
        Some(Inventory {
            load_balancers,
            other,
        })
    }

    async fn sweep(&self, cluster: &str) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(inv) = self.inventory(cluster).await {
            for lb in inv.load_balancers {
                let _ = self
                    .elb
                    .delete_load_balancer()
                    .load_balancer_name(&lb.name)
                    .send()
                    .await;
                out.push(format!("elb/{}", lb.name));
            }
            for sg in inv.other {
                let id = sg.trim_start_matches("sg/");
                let _ = self.ec2.delete_security_group().group_id(id).send().await;
                out.push(sg);
            }
        }
        out
    }

    fn max_lb_name_len(&self) -> usize {
        32
    }

    /// The provider answers lookups by name from what it saw in the last 20 s
    /// (`BY_NAME_TTL`, a documented cost trade-off): a state change shows within that.
    fn settle_timeout(&self) -> Duration {
        Duration::from_secs(25)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_on_moto_contract() {
    let moto = start_moto();
    let opts = SuiteOptions::new(Level::Destructive).known_defect(
        &rules::ROUTE_BLACKHOLE,
        "a route whose target instance is terminated is listed live: the provider trusts the route's own state and its memory of the target; EC2 marks such routes blackhole, moto never does",
    );
    let harness = AwsHarness::start(&moto.url, &opts.cluster)
        .await
        .expect("VPC on moto");
    let suite = Suite::new(Arc::new(harness), opts);
    let report = suite.run().await;
    println!("{}", report.summary());
    assert!(report.passed(), "{}", report.summary());
    assert!(
        report
            .of(rules::ROUTE_BLACKHOLE.id)
            .all(|c| matches!(c.outcome, Outcome::KnownDefect { .. })),
        "{}",
        report.summary()
    );
    for r in [&rules::ERROR_NEVER_GONE, &rules::THROTTLED] {
        assert!(
            report
                .of(r.id)
                .all(|c| c.outcome == Outcome::Pass || c.case == "NotFound"),
            "{}",
            report.summary()
        );
    }
}

/// An internet gateway and a default route to it in the VPC's main route table: its subnets
/// become public, as internet-facing load balancers need (the provider places them only in
/// subnets with an internet-gateway route, as cloud-provider-aws does).
async fn public_vpc(ec2: &aws_sdk_ec2::Client, vpc: &str) -> anyhow::Result<()> {
    let igw = ec2
        .create_internet_gateway()
        .send()
        .await?
        .internet_gateway
        .and_then(|g| g.internet_gateway_id)
        .expect("internet gateway id");
    ec2.attach_internet_gateway()
        .internet_gateway_id(&igw)
        .vpc_id(vpc)
        .send()
        .await?;
    let tables = ec2
        .describe_route_tables()
        .filters(Filter::builder().name("vpc-id").values(vpc).build())
        .filters(
            Filter::builder()
                .name("association.main")
                .values("true")
                .build(),
        )
        .send()
        .await?;
    let main = tables.route_tables()[0]
        .route_table_id()
        .expect("main route table")
        .to_string();
    ec2.create_route()
        .route_table_id(main)
        .destination_cidr_block("0.0.0.0/0")
        .gateway_id(igw)
        .send()
        .await?;
    Ok(())
}

/// The real manager on kube-sim with the AWS provider on moto: join, stop/start, terminate,
/// routes on join and leave, CLB lifecycle with the finalizer, restart, failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_on_moto_cluster() {
    let moto = start_moto();
    let opts = SuiteOptions::new(Level::Destructive);
    let harness = AwsHarness::start(&moto.url, &opts.cluster)
        .await
        .expect("VPC on moto");
    let suite = Suite::new(Arc::new(harness), opts);
    let report = suite.run_cluster().await;
    println!("{}", report.summary());
    assert!(report.passed(), "{}", report.summary());
    for rule in rules::CLUSTER {
        assert!(
            report.of(rule.id).any(|r| r.outcome == Outcome::Pass),
            "rule {} not proved:\n{}",
            rule.id,
            report.summary()
        );
    }
}
