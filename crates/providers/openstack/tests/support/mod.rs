//! The OpenStack of testenv/stack.sh for the tests that share it: start, the `openstack`
//! client as the cluster's user, booting servers, a provider configured against it.
#![allow(dead_code)]

pub mod lb;
pub mod nova;

use std::io::BufReader;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ccm_provider_openstack::{OpenStackCloud, OpenStackConfig};

pub fn venv() -> PathBuf {
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
pub struct Stack {
    /// `None` for a stack this process did not start (`CCM_OPENSTACK_STACK_DIR`).
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    pub dir: PathBuf,
    pub ks_url: String,
}

impl Drop for Stack {
    fn drop(&mut self) {
        let Some(child) = self.child.as_mut() else {
            return;
        };
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let _ = child.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Calls the provider made since `before`, by operation.
pub fn delta(
    c: &OpenStackCloud,
    before: &std::collections::BTreeMap<String, u64>,
) -> std::collections::BTreeMap<String, u64> {
    c.api_calls()
        .into_iter()
        .filter_map(|(k, v)| {
            let d = v - before.get(&k).copied().unwrap_or(0);
            (d > 0).then_some((k, d))
        })
        .collect()
}

pub fn total(m: &std::collections::BTreeMap<String, u64>) -> u64 {
    m.values().sum()
}

/// The first of `n` consecutive free loopback ports (see `ccm_kube_sim::ports`).
pub fn free_ports(n: u16) -> u16 {
    ccm_kube_sim::ports::free_loopback_ports(n).expect("free loopback ports")
}

pub fn start_stack() -> Stack {
    start_stack_with(false)
}

/// The stack with Octavia too (`octavia`), or without.
pub fn start_stack_with(octavia: bool) -> Stack {
    if let Some(dir) = std::env::var_os("CCM_OPENSTACK_STACK_DIR") {
        // A stack started by hand (testenv/stack.sh), for quicker runs while developing.
        let dir = PathBuf::from(dir);
        let env = std::fs::read_to_string(dir.join("stack.env")).expect("stack.env");
        let ks = env
            .lines()
            .find_map(|l| l.strip_prefix("OS_AUTH_URL="))
            .expect("OS_AUTH_URL")
            .to_string();
        return Stack {
            child: None,
            stdin: None,
            dir,
            ks_url: ks,
        };
    }
    let venv = venv();
    let base = free_ports(10);
    let dir = std::env::temp_dir().join(format!("ccm-openstack-{}-{base}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testenv/stack.sh");
    let t0 = Instant::now();
    let mut child = Command::new("bash")
        .arg(&script)
        .arg(&dir)
        .arg(base.to_string())
        .arg(&venv)
        .args(octavia.then_some("octavia"))
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
        child: Some(child),
        stdin,
        dir,
        ks_url: format!("http://127.0.0.1:{base}/v3"),
    }
}

impl Stack {
    /// A value of stack.env (`PUBLIC_NET_ID`, `OCTAVIA_URL`).
    pub fn env(&self, key: &str) -> String {
        let env = std::fs::read_to_string(self.dir.join("stack.env")).expect("stack.env");
        env.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")).map(str::to_string))
            .unwrap_or_else(|| panic!("{key} not in stack.env"))
    }

    /// The real `openstack` client as the cloud's admin.
    pub fn openstack_admin(&self, args: &[&str]) -> String {
        let env = user_env(&self.ks_url, "admin", "admin-secret", "admin");
        osc(env, args, 600).unwrap_or_else(|e| panic!("openstack {args:?}: {e}"))
    }

    /// The real `openstack` client as the cluster's user.
    pub fn openstack(&self, args: &[&str]) -> String {
        self.try_openstack(args)
            .unwrap_or_else(|e| panic!("openstack {args:?}: {e}"))
    }

    pub fn try_openstack(&self, args: &[&str]) -> Result<String, String> {
        openstack_at(&self.ks_url, args)
    }

    /// Boots `name` and waits for ACTIVE (see [`boot_at`]).
    pub fn boot(&self, name: &str) -> String {
        boot_at(&self.ks_url, name).unwrap_or_else(|e| panic!("boot {name}: {e}"))
    }

    pub fn wait_status(&self, id: &str, want: Option<&str>) {
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

    pub fn cloud(&self, password: &str) -> OpenStackCloud {
        self.cloud_with(password, "")
    }

    /// A provider with `extra` sections after `[Global]` (e.g. `[Route]`).
    pub fn cloud_with(&self, password: &str, extra: &str) -> OpenStackCloud {
        let conf = format!(
            "[Global]\nauth-url = {}\nusername = ccm\npassword = {password}\ntenant-name = ccm\ndomain-id = default\nregion = RegionOne\n{extra}",
            self.ks_url
        );
        let cfg = OpenStackConfig::parse(&conf).expect("parses");
        OpenStackCloud::with_regional_provider_id(cfg, false).expect("provider")
    }
}

/// The real `openstack` client as the cluster's user of the stack at `ks_url`.
pub fn openstack_at(ks_url: &str, args: &[&str]) -> Result<String, String> {
    // Bounded: on the one-host fake cloud (Nova on sqlite) a build can stay in BUILD for good
    // after a "database is locked"; `--wait` would then never return.
    osc(user_env(ks_url, "ccm", "ccm-secret", "ccm"), args, 150)
}

/// The `OS_*` variables of `openstack` as `user` on `project` of the stack at `ks_url`.
fn user_env(ks_url: &str, user: &str, password: &str, project: &str) -> serde_json::Value {
    serde_json::json!({
        "OS_AUTH_URL": ks_url,
        "OS_USERNAME": user,
        "OS_PASSWORD": password,
        "OS_PROJECT_NAME": project,
        "OS_USER_DOMAIN_ID": "default",
        "OS_PROJECT_DOMAIN_ID": "default",
        "OS_IDENTITY_API_VERSION": "3",
        "OS_REGION_NAME": "RegionOne",
    })
}

/// A kept-loaded `openstack` client (support/osc_server.py): the same shell code as the
/// command, without a Python start per command (about 2.5 CPU-seconds each, hundreds of
/// commands per test binary).
struct Shell {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Shell {
    fn start() -> Result<Shell, String> {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/support/osc_server.py");
        let mut child = Command::new(venv().join("bin/python"))
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("osc_server.py: {e}"))?;
        let stdin = child.stdin.take().ok_or("osc_server.py: no stdin")?;
        let stdout = BufReader::new(child.stdout.take().ok_or("osc_server.py: no stdout")?);
        Ok(Shell {
            child,
            stdin,
            stdout,
        })
    }

    fn call(&mut self, req: &serde_json::Value) -> Result<serde_json::Value, String> {
        use std::io::{BufRead as _, Write as _};
        writeln!(self.stdin, "{req}").map_err(|e| format!("osc_server.py: {e}"))?;
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .map_err(|e| format!("osc_server.py: {e}"))?;
        serde_json::from_str(&line).map_err(|e| format!("osc_server.py answered {line:?}: {e}"))
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Idle shells: a command takes one (or starts one), so tests running side by side in one
/// binary each have their own.
static SHELLS: Mutex<Vec<Shell>> = Mutex::new(Vec::new());

/// `openstack ARGS` with only `env`'s OS_* variables, stopped after `timeout` seconds: its
/// stdout (trimmed) or, when it fails, its stderr.
fn osc(env: serde_json::Value, args: &[&str], timeout: u64) -> Result<String, String> {
    let idle = SHELLS.lock().unwrap_or_else(|p| p.into_inner()).pop();
    let mut shell = match idle {
        Some(s) => s,
        None => Shell::start()?,
    };
    let req = serde_json::json!({"args": args, "env": env, "timeout": timeout});
    // A shell that failed to answer is dropped (killed), not returned to the pool.
    let reply = shell.call(&req)?;
    SHELLS.lock().unwrap_or_else(|p| p.into_inner()).push(shell);
    let text = |k: &str| reply[k].as_str().unwrap_or_default().to_string();
    if reply["rc"].as_i64() == Some(0) {
        Ok(text("out").trim().to_string())
    } else {
        Err(format!("{}(exit {})", text("err"), reply["rc"]))
    }
}

/// Boots `name` (no NIC) and waits for ACTIVE. A build that ends in ERROR is printed with
/// Nova's fault, deleted and tried again (twice at most): the one-host fake cloud sometimes
/// fails a build right after another (seen: "Error creating server").
pub fn boot_at(ks_url: &str, name: &str) -> Result<String, String> {
    let mut last = String::new();
    for _ in 0..3 {
        let args = [
            "server", "create", "--flavor", "m1.small", "--image", "tiny", "--nic", "none",
            "--wait", "-f", "value", "-c", "id", name,
        ];
        match openstack_at(ks_url, &args) {
            Ok(id) => return Ok(id),
            Err(e) => last = e,
        }
        let fault = openstack_at(
            ks_url,
            &["server", "show", "-f", "value", "-c", "fault", name],
        );
        eprintln!("boot {name} failed ({last}); fault: {fault:?}; retrying");
        let _ = openstack_at(ks_url, &["server", "delete", "--wait", name]);
    }
    Err(last)
}
