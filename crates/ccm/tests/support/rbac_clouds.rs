//! The clouds the RBAC-exactness test runs the CCM binary against: the sim (`SimServer`), the
//! metal provider (sushy-tools Redfish emulator behind basic auth, System ids that are not the
//! Node names, BMC credentials from a Secret, kube-vip pairing, kernel routes in a network
//! namespace) and, with `--features aws`, the AWS provider on moto (driven through boto3 from
//! moto's own venv, so the test needs no AWS SDK of its own).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ccm_provider_sim::{InstanceSpec, SimCloud, SimServer};

/// Finds `tool` on PATH, then in `<workspace>/.venv/bin` (where .ci/setup.d installs it).
pub fn find_tool(tool: &str) -> PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(tool))
            .find(|p| p.is_file())
    });
    let venv = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../.venv/bin")
        .join(tool);
    on_path
        .or_else(|| venv.is_file().then_some(venv))
        .unwrap_or_else(|| {
            panic!("{tool} is not installed: run .ci/run once (.ci/setup.d installs it into .venv)")
        })
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// What the CCM process needs for one provider.
pub struct Launch {
    /// `ccm manifests` flags beyond `--cluster-cidr`.
    pub manifest_args: Vec<String>,
    /// The `--cloud-config` file.
    pub cloud_config: PathBuf,
    /// Extra environment of the CCM process.
    pub env: Vec<(String, String)>,
}

// ---------------------------------------------------------------------------------------------
// sim

/// The sim cloud over HTTP, as `--cloud-provider=sim` reaches it.
pub struct Sim {
    pub cloud: SimCloud,
    _server: SimServer,
}

impl Sim {
    pub async fn start(dir: &Path) -> (Sim, Launch) {
        let cloud = SimCloud::seeded(7);
        let server = SimServer::start(cloud.clone(), ([127, 0, 0, 1], 0).into())
            .await
            .expect("sim server");
        let cc = dir.join("cloud.toml");
        std::fs::write(&cc, format!("endpoint = \"{}\"\n", server.endpoint()))
            .expect("cloud config");
        let launch = Launch {
            manifest_args: vec!["--provider=sim".into()],
            cloud_config: cc,
            env: vec![],
        };
        (
            Sim {
                cloud,
                _server: server,
            },
            launch,
        )
    }

    pub fn add(&self, name: &str) {
        self.cloud.add_instance(InstanceSpec::new(name.to_string()));
    }

    fn id(&self, name: &str) -> String {
        self.cloud.instance_id(name).expect("instance")
    }

    pub fn stop(&self, name: &str) {
        self.cloud.stop_instance(&self.id(name)).expect("stop");
    }

    pub fn start_again(&self, name: &str) {
        self.cloud.start_instance(&self.id(name)).expect("start");
    }

    pub fn terminate(&self, name: &str) {
        self.cloud
            .terminate_instance(&self.id(name))
            .expect("terminate");
    }
}

// ---------------------------------------------------------------------------------------------
// metal

/// The Secret (in kube-system, the release namespace) holding the BMC credentials.
pub const BMC_SECRET: &str = "bmc-creds";
pub const BMC_USER: &str = "rbac-admin";
pub const BMC_PASSWORD: &str = "rbac-secret-pw";

/// (Node name, Redfish System UUID, Redfish System name, InternalIP): the System is neither
/// named nor served as the Node, as on real BMCs.
pub const METAL_MACHINES: [(&str, &str, &str, &str); 3] = [
    (
        "n1",
        "8d1e2f40-0000-4000-8000-000000000001",
        "System.Embedded.1",
        "192.168.77.11",
    ),
    (
        "n2",
        "8d1e2f40-0000-4000-8000-000000000002",
        "System.Embedded.2",
        "192.168.77.12",
    ),
    (
        "n3",
        "8d1e2f40-0000-4000-8000-000000000003",
        "System.Embedded.3",
        "192.168.77.13",
    ),
];

/// sushy-tools with basic auth, a network namespace for the kernel routes, and the
/// cloud-config file (rewritten to take a machine out of the inventory).
pub struct Metal {
    sushy: Child,
    endpoint: String,
    netns: String,
    cloud_config: PathBuf,
    /// Machines still in the inventory.
    machines: parking_lot::Mutex<Vec<&'static str>>,
}

impl Drop for Metal {
    fn drop(&mut self) {
        let _ = self.sushy.kill();
        let _ = self.sushy.wait();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

fn start_sushy(dir: &Path) -> (Child, String) {
    let python = find_tool("sushy-emulator").with_file_name("python3");
    let hash = run(Command::new(&python).args([
        "-c",
        "import bcrypt,sys; print(bcrypt.hashpw(sys.argv[1].encode(), bcrypt.gensalt(4)).decode())",
        BMC_PASSWORD,
    ]));
    let htpasswd = dir.join("htpasswd");
    std::fs::write(&htpasswd, format!("{BMC_USER}:{}", hash.trim())).expect("htpasswd");
    let systems: Vec<String> = METAL_MACHINES
        .iter()
        .map(|(_, uuid, name, _)| format!("{{'uuid': '{uuid}', 'name': '{name}', 'power_state': 'On', 'external_notifier': False, 'nics': []}}"))
        .collect();
    let conf = dir.join("emulator.conf");
    std::fs::write(
        &conf,
        format!(
            "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\nSUSHY_EMULATOR_LISTEN_PORT = 0\nSUSHY_EMULATOR_STATE_DIR = '{}'\nSUSHY_EMULATOR_FAKE_DRIVER = True\nSUSHY_EMULATOR_FAKE_SYSTEMS = [{}]\nSUSHY_EMULATOR_AUTH_FILE = '{}'\n",
            dir.join("sushy-state").display(),
            systems.join(", "),
            htpasswd.display()
        ),
    )
    .expect("sushy config");
    let mut child = Command::new(find_tool("sushy-emulator"))
        .arg("--config")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sushy-emulator");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("Running on ").nth(1) {
                let _ = tx.send(rest.trim().to_string());
            }
        }
    });
    let endpoint = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("sushy-emulator did not print its address within 30 s");
    (child, endpoint)
}

/// A namespace with one veth pair (both ends inside) carrying the nodes' network, so kernel
/// routes `via <node InternalIP>` have an on-link gateway.
fn make_netns(name: &str) {
    let ip = |args: &[&str]| run(Command::new("ip").args(args));
    ip(&["netns", "add", name]);
    ip(&["-n", name, "link", "set", "lo", "up"]);
    ip(&[
        "-n", name, "link", "add", "nodes0", "type", "veth", "peer", "name", "nodes1",
    ]);
    ip(&[
        "-n",
        name,
        "addr",
        "add",
        "192.168.77.1/24",
        "dev",
        "nodes0",
    ]);
    ip(&["-n", name, "link", "set", "nodes0", "up"]);
    ip(&["-n", name, "link", "set", "nodes1", "up"]);
}

impl Metal {
    pub fn start(dir: &Path) -> (Metal, Launch) {
        assert!(
            is_root(),
            "the metal run creates a network namespace for its kernel routes and needs root (CI runs .ci/run as root)"
        );
        let (sushy, endpoint) = start_sushy(dir);
        let netns = format!("ccm-rbac-{}", std::process::id());
        let _ = Command::new("ip")
            .args(["netns", "del", &netns])
            .stderr(Stdio::null())
            .status();
        make_netns(&netns);
        let values = dir.join("values.yaml");
        std::fs::write(
            &values,
            format!("provider: metal\nmetal:\n  credentialsSecrets: [{BMC_SECRET}]\n"),
        )
        .expect("values");
        let metal = Metal {
            sushy,
            endpoint,
            netns,
            cloud_config: dir.join("metal.toml"),
            machines: parking_lot::Mutex::new(METAL_MACHINES.iter().map(|m| m.0).collect()),
        };
        metal.write_config();
        let launch = Launch {
            manifest_args: vec![format!("--values={}", values.display())],
            cloud_config: metal.cloud_config.clone(),
            env: vec![],
        };
        (metal, launch)
    }

    fn write_config(&self) {
        let keep = self.machines.lock().clone();
        let mut s = format!(
            "[bmc]\ntimeout_ms = 5000\n\n[load_balancer]\nkube_vip_annotation = true\n\n[routes]\nnetns = \"/run/netns/{}\"\n",
            self.netns
        );
        for (name, uuid, _, ip) in METAL_MACHINES.iter().filter(|m| keep.contains(&m.0)) {
            s.push_str(&format!(
                "\n[[machines]]\nname = \"{name}\"\ninstance_type = \"r640\"\nzone = \"rack-1\"\ninternal_ips = [\"{ip}\"]\n[machines.bmc]\nendpoint = \"{}\"\nsystem = \"{uuid}\"\ncredentials_secret = \"kube-system/{BMC_SECRET}\"\n",
                self.endpoint
            ));
        }
        s.push_str("\n[[pools]]\nname = \"rbac\"\naddresses = [\"192.0.2.0/28\"]\n");
        // Written whole, then renamed: the provider re-reads the file every 2 s.
        let tmp = self.cloud_config.with_extension("tmp");
        std::fs::write(&tmp, s).expect("metal cloud-config");
        std::fs::rename(&tmp, &self.cloud_config).expect("metal cloud-config");
    }

    /// The BMC credentials Secret the cloud-config names.
    pub fn secret(&self) -> serde_json::Value {
        serde_json::json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": BMC_SECRET, "namespace": "kube-system"},
            "data": {"username": b64(BMC_USER), "password": b64(BMC_PASSWORD)}})
    }

    fn uuid(name: &str) -> &'static str {
        METAL_MACHINES
            .iter()
            .find(|m| m.0 == name)
            .map(|m| m.1)
            .expect("machine")
    }

    async fn reset(&self, name: &str, reset: &str) {
        let url = format!(
            "{}/redfish/v1/Systems/{}/Actions/ComputerSystem.Reset",
            self.endpoint,
            Self::uuid(name)
        );
        let out = tokio::process::Command::new("curl")
            .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
            .args(["-u", &format!("{BMC_USER}:{BMC_PASSWORD}")])
            .args(["-H", "Content-Type: application/json"])
            .args(["-d", &format!("{{\"ResetType\": \"{reset}\"}}"), &url])
            .output()
            .await
            .expect("curl");
        let code = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(code.starts_with('2'), "Redfish Reset {reset}: HTTP {code}");
    }

    pub async fn stop(&self, name: &str) {
        self.reset(name, "ForceOff").await;
    }

    pub async fn start_again(&self, name: &str) {
        self.reset(name, "On").await;
    }

    /// The machine leaves the inventory (decommissioned): the authoritative "gone".
    pub fn terminate(&self, name: &str) {
        self.machines.lock().retain(|m| *m != name);
        self.write_config();
    }

    /// ccm-rs's routes (its table, its protocol) in the namespace.
    pub fn routes(&self) -> usize {
        let out = run(Command::new("ip").args([
            "-n",
            &self.netns,
            "route",
            "show",
            "table",
            "17219",
            "proto",
            "75",
        ]));
        out.lines().filter(|l| !l.trim().is_empty()).count()
    }
}

// ---------------------------------------------------------------------------------------------
// aws

/// boto3 (a dependency of moto, in the same venv) drives moto as an operator would: the VPC as
/// the provider expects it, instances, and stop/start/terminate.
#[cfg(feature = "aws")]
const BOTO: &str = r#"
import boto3, json, sys
url, cluster, cmd = sys.argv[1], sys.argv[2], sys.argv[3]
ec2 = boto3.client('ec2', endpoint_url=url, region_name='us-east-1',
                   aws_access_key_id='testing', aws_secret_access_key='testing')
key = 'kubernetes.io/cluster/' + cluster
def tags(kind, t):
    return [{'ResourceType': kind, 'Tags': [{'Key': k, 'Value': v} for k, v in t]}]
if cmd == 'setup':
    vpc = ec2.create_vpc(CidrBlock='10.0.0.0/16')['Vpc']['VpcId']
    igw = ec2.create_internet_gateway()['InternetGateway']['InternetGatewayId']
    ec2.attach_internet_gateway(InternetGatewayId=igw, VpcId=vpc)
    main = ec2.describe_route_tables(Filters=[{'Name': 'vpc-id', 'Values': [vpc]},
        {'Name': 'association.main', 'Values': ['true']}])['RouteTables'][0]['RouteTableId']
    ec2.create_route(RouteTableId=main, DestinationCidrBlock='0.0.0.0/0', GatewayId=igw)
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock='10.0.0.0/20', AvailabilityZone='us-east-1a',
        TagSpecifications=tags('subnet', [(key, 'owned'), ('kubernetes.io/role/elb', '1')]))['Subnet']['SubnetId']
    ec2.create_route_table(VpcId=vpc, TagSpecifications=tags('route-table', [(key, 'owned')]))
    sg = ec2.create_security_group(VpcId=vpc, GroupName='nodes', Description='cluster nodes',
        TagSpecifications=tags('security-group', [(key, 'owned')]))['GroupId']
    out = ec2.run_instances(ImageId='ami-12c6146b', InstanceType='m5.large', MinCount=3, MaxCount=3,
        SubnetId=subnet, SecurityGroupIds=[sg], TagSpecifications=tags('instance', [(key, 'owned')]))
    print(json.dumps([[i['InstanceId'], i['PrivateDnsName']] for i in out['Instances']]))
elif cmd == 'routes':
    tables = ec2.describe_route_tables(Filters=[{'Name': 'tag-key', 'Values': [key]}])['RouteTables']
    print(sum(1 for t in tables for r in t['Routes'] if r.get('InstanceId')))
else:
    getattr(ec2, cmd + '_instances')(InstanceIds=[sys.argv[4]])
"#;

/// moto with the cluster's VPC and three instances.
#[cfg(feature = "aws")]
pub struct Aws {
    moto: Child,
    _stdin: std::process::ChildStdin,
    url: String,
    /// (instance id, Node name = private DNS name).
    pub instances: Vec<(String, String)>,
}

#[cfg(feature = "aws")]
impl Drop for Aws {
    fn drop(&mut self) {
        let _ = self.moto.kill();
        let _ = self.moto.wait();
    }
}

#[cfg(feature = "aws")]
pub const AWS_CLUSTER: &str = "rbac";

#[cfg(feature = "aws")]
impl Aws {
    fn python() -> PathBuf {
        find_tool("moto_server").with_file_name("python")
    }

    pub fn start(dir: &Path) -> (Aws, Launch) {
        const WRAPPER: &str = "import os, sys, threading\n\
def watch():\n    sys.stdin.read()\n    os._exit(0)\n\
threading.Thread(target=watch, daemon=True).start()\n\
from moto.server import main\n\
main(['-H', '127.0.0.1', '-p', '0'])\n";
        let mut moto = Command::new(Self::python())
            .args(["-c", WRAPPER])
            .current_dir(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start moto");
        let stdin = moto.stdin.take().expect("stdin");
        let stderr = moto.stderr.take().expect("stderr");
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
        let url = format!("http://127.0.0.1:{port}");
        let out = run(Command::new(Self::python()).args(["-c", BOTO, &url, AWS_CLUSTER, "setup"]));
        let instances: Vec<(String, String)> =
            serde_json::from_str(out.trim()).expect("instances from boto3");
        let cc = dir.join("aws.toml");
        let mut text =
            format!("region = \"us-east-1\"\nkubernetes_cluster_id = \"{AWS_CLUSTER}\"\n");
        for service in [
            "ec2",
            "elasticloadbalancing",
            "elasticloadbalancingv2",
            "sts",
        ] {
            text.push_str(&format!(
                "\n[[service_override]]\nservice = \"{service}\"\nurl = \"{url}\"\n"
            ));
        }
        std::fs::write(&cc, text).expect("aws cloud-config");
        let env = [
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_REGION", "us-east-1"),
            ("AWS_EC2_METADATA_DISABLED", "true"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let launch = Launch {
            manifest_args: vec!["--provider=aws".into()],
            cloud_config: cc,
            env,
        };
        (
            Aws {
                moto,
                _stdin: stdin,
                url,
                instances,
            },
            launch,
        )
    }

    fn id(&self, name: &str) -> &str {
        self.instances
            .iter()
            .find(|(_, n)| n == name)
            .map(|(i, _)| i.as_str())
            .expect("instance of the node")
    }

    fn ec2(&self, cmd: &str, name: &str) {
        run(Command::new(Self::python()).args([
            "-c",
            BOTO,
            &self.url,
            AWS_CLUSTER,
            cmd,
            self.id(name),
        ]));
    }

    pub fn stop(&self, name: &str) {
        self.ec2("stop", name);
    }

    pub fn start_again(&self, name: &str) {
        self.ec2("start", name);
    }

    pub fn terminate(&self, name: &str) {
        self.ec2("terminate", name);
    }

    /// Routes to instances in the cluster's tagged route table.
    pub fn routes(&self) -> usize {
        let out =
            run(Command::new(Self::python()).args(["-c", BOTO, &self.url, AWS_CLUSTER, "routes"]));
        out.trim().parse().expect("route count")
    }
}

fn b64(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}
