//! The provider against a real OpenStack started on 127.0.0.1 by testenv/stack.sh (Keystone,
//! Nova on the fake virt driver, Neutron ML2 without agents, Placement, Glance; RabbitMQ and
//! MariaDB from Debian): servers booted and stopped and deleted with the real `openstack`
//! client, the provider answering many Nodes with one servers listing; a stopped server is
//! shut down, a deleted one gone, and an unreachable Nova or refused credentials are errors,
//! never "gone".

use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use ccm_cloud::Instances;
use ccm_provider_openstack::{OpenStackCloud, OpenStackConfig};
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use kube::api::ObjectMeta;

fn venv() -> PathBuf {
    let v = std::env::var_os("CCM_OPENSTACK_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../.venv-openstack")
        });
    assert!(
        v.join("bin/nova-api-wsgi").is_file() || v.join("bin/nova-compute").is_file(),
        "Nova is not installed in {}: run .ci/run (or `bash .ci/setup.d/60-openstack.sh` with CCM_VENV set)",
        v.display()
    );
    v
}

/// The running stack; dropping it closes stack.sh's stdin, which stops every service.
struct Stack {
    child: Child,
    stdin: Option<ChildStdin>,
    dir: PathBuf,
    ks_url: String,
}

impl Drop for Stack {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let _ = self.child.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_base() -> u16 {
    // Nine consecutive ports, probed.
    loop {
        let base = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
        if base < 60000
            && (base..base + 9).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
        {
            return base;
        }
    }
}

fn start_stack() -> Stack {
    let venv = venv();
    let base = free_base();
    let dir = std::env::temp_dir().join(format!("ccm-openstack-{}-{base}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testenv/stack.sh");
    let t0 = Instant::now();
    let mut child = Command::new("bash")
        .arg(&script)
        .arg(&dir)
        .arg(base.to_string())
        .arg(&venv)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(
            std::fs::File::create(dir.join("stack.err")).expect("log"),
        ))
        .spawn()
        .expect("stack.sh");
    let stdin = child.stdin.take();
    let mut out = child.stdout.take().expect("stdout");
    let mut seen = String::new();
    let mut buf = [0u8; 256];
    use std::io::Read as _;
    while !seen.contains("READY") {
        let n = out.read(&mut buf).expect("stack.sh output");
        assert!(
            n > 0,
            "stack.sh ended before READY; see {}/stack.err and logs/",
            dir.display()
        );
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    eprintln!("OpenStack ready in {:?}", t0.elapsed());
    Stack {
        child,
        stdin,
        dir,
        ks_url: format!("http://127.0.0.1:{base}/v3"),
    }
}

impl Stack {
    /// The real `openstack` client as the cluster's user.
    fn openstack(&self, args: &[&str]) -> String {
        self.try_openstack(args)
            .unwrap_or_else(|e| panic!("openstack {args:?}: {e}"))
    }

    fn try_openstack(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new(venv().join("bin/openstack"))
            .args(args)
            .env("OS_AUTH_URL", &self.ks_url)
            .env("OS_USERNAME", "ccm")
            .env("OS_PASSWORD", "ccm-secret")
            .env("OS_PROJECT_NAME", "ccm")
            .env("OS_USER_DOMAIN_ID", "default")
            .env("OS_PROJECT_DOMAIN_ID", "default")
            .env("OS_IDENTITY_API_VERSION", "3")
            .env("OS_REGION_NAME", "RegionOne")
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).to_string())
        }
    }

    /// Boots `name` and waits for ACTIVE. A build that ends in ERROR is printed with Nova's
    /// fault, deleted and tried again (twice at most): the one-host fake cloud sometimes fails a
    /// build right after another (seen: "Error creating server").
    fn boot(&self, name: &str) -> String {
        let mut last = String::new();
        for _ in 0..3 {
            let args = [
                "server", "create", "--flavor", "m1.small", "--image", "tiny", "--nic", "none",
                "--wait", "-f", "value", "-c", "id", name,
            ];
            match self.try_openstack(&args) {
                Ok(id) => return id,
                Err(e) => last = e,
            }
            let fault = self.try_openstack(&["server", "show", "-f", "value", "-c", "fault", name]);
            eprintln!("boot {name} failed ({last}); fault: {fault:?}; retrying");
            let _ = self.try_openstack(&["server", "delete", "--wait", name]);
        }
        panic!("boot {name}: {last}");
    }

    fn wait_status(&self, id: &str, want: Option<&str>) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let list =
                self.openstack(&["server", "list", "-f", "value", "-c", "ID", "-c", "Status"]);
            let status = list
                .lines()
                .find(|l| l.starts_with(id))
                .and_then(|l| l.split_whitespace().nth(1));
            if status == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "server {id} never reached {want:?}: {list}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn cloud(&self, password: &str) -> OpenStackCloud {
        let conf = format!(
            "[Global]\nauth-url = {}\nusername = ccm\npassword = {password}\ntenant-name = ccm\ndomain-id = default\nregion = RegionOne\n",
            self.ks_url
        );
        let cfg = OpenStackConfig::parse(&conf).expect("parses");
        OpenStackCloud::with_regional_provider_id(cfg, false).expect("provider")
    }
}

fn node(name: &str, provider_id: Option<String>) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn calls(c: &OpenStackCloud, op: &str) -> u64 {
    c.api_calls().get(op).copied().unwrap_or(0)
}

const LIST: &str = "compute GET /servers/detail";
const GET: &str = "compute GET /servers/{id}";

#[tokio::test(flavor = "multi_thread")]
async fn nova_instances_batched_shutdown_gone_and_errors() {
    let stack = tokio::task::spawn_blocking(start_stack)
        .await
        .expect("start");
    let ids: Vec<String> = ["node-a", "node-b", "node-c"]
        .iter()
        .map(|n| stack.boot(n))
        .collect();
    let nodes = vec![
        node("node-a", Some(format!("openstack:///{}", ids[0]))),
        node("node-b", None),
        node("node-c", Some(format!("openstack://RegionOne/{}", ids[2]))),
    ];
    let cloud = stack.cloud("ccm-secret");
    cloud.check().await.expect("compute in the catalog");

    // Metadata for three Nodes (by id, by name, by regional id): one listing.
    let md = cloud.instances_metadata(&nodes).await;
    for (i, m) in md.iter().enumerate() {
        let m = m.as_ref().expect("metadata").as_ref().expect("some");
        assert_eq!(m.provider_id, format!("openstack:///{}", ids[i]));
        assert_eq!(m.instance_type, "m1.small");
        assert_eq!(m.zone, "nova");
        assert_eq!(m.region, "RegionOne");
    }
    assert_eq!(calls(&cloud, LIST), 1, "{:?}", cloud.api_calls());
    assert!(
        calls(&cloud, "network GET /v2.0/ports") <= 1,
        "{:?}",
        cloud.api_calls()
    );

    // Status: all running, one listing more.
    let st = cloud.instances_status(&nodes).await;
    assert!(
        st.iter()
            .all(|s| s.as_ref().is_ok_and(|s| s.exists && !s.shutdown)),
        "{st:?}"
    );
    assert_eq!(calls(&cloud, LIST), 2);

    // `openstack server stop` → SHUTOFF → shut down (still exists).
    stack.openstack(&["server", "stop", &ids[0]]);
    stack.wait_status(&ids[0], Some("SHUTOFF"));
    let st = cloud.instances_status(&nodes).await;
    assert!(st[0].as_ref().expect("status").shutdown);
    assert!(st[0].as_ref().expect("status").exists);

    // Delete → gone, confirmed by Nova's own 404 for that id.
    stack.openstack(&["server", "delete", "--wait", &ids[2]]);
    stack.wait_status(&ids[2], None);
    let before = calls(&cloud, GET);
    let st = cloud.instances_status(&nodes).await;
    let gone = st[2].as_ref().expect("status");
    assert!(!gone.exists, "deleted server is gone");
    assert_eq!(
        calls(&cloud, GET),
        before + 1,
        "one confirming GET, only for the missing one"
    );
    assert!(st[1].as_ref().expect("status").exists);

    // Wrong credentials (Keystone's 401): errors for every Node, never gone.
    let bad = stack.cloud("not-the-password");
    for r in bad.instances_status(&nodes).await {
        assert!(r.is_err(), "{r:?}");
    }

    // Nova's API down: errors, never gone.
    let pid = std::fs::read_to_string(stack.dir.join("nova.gpid")).expect("nova pid");
    let _ = Command::new("kill").arg(pid.trim()).status();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = cloud.instances_status(&nodes).await;
        if r.iter().all(|r| r.is_err()) {
            break;
        }
        assert!(Instant::now() < deadline, "Nova still answering: {r:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop(stack);
}
