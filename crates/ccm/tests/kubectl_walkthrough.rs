//! The README's walkthrough, as a new user runs it: `ccm demo --kubeconfig-out PATH`, then the
//! real `kubectl` binary against it, with nothing but that kubeconfig.
//!
//! Fails (never skips) when kubectl is missing: `.ci/run` installs it. Set `KUBECTL` to use a
//! binary outside `PATH`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const SOON: Duration = Duration::from_secs(60);

fn kubectl_path() -> PathBuf {
    if let Some(p) = std::env::var_os("KUBECTL") {
        return PathBuf::from(p);
    }
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/local/bin")])
        .map(|d| d.join("kubectl"))
        .find(|c| c.is_file())
        .unwrap_or_else(|| {
            panic!("kubectl not found in PATH, /usr/bin or $KUBECTL: .ci/run installs it")
        })
}

/// A running `ccm demo`, killed on drop.
struct Demo {
    _child: Child,
    dir: PathBuf,
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts the demo with a small cluster and waits until its story has played and it says it
/// stays up: from then on the cluster is the one a user's kubectl would see.
async fn start_demo() -> Demo {
    let dir = std::env::temp_dir().join(format!("ccm-walkthrough-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ccm"))
        .args(["demo", "--nodes=3", "--services=2", "--cloud-latency=5ms"])
        .arg(format!(
            "--kubeconfig-out={}",
            dir.join("kubeconfig").display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn ccm demo");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    let ready = tokio::time::timeout(Duration::from_secs(120), async {
        while let Ok(Some(line)) = lines.next_line().await {
            let done = line.contains("Still running");
            seen.push(line);
            if done {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        ready,
        Ok(true),
        "the demo did not come up:\n{}",
        seen.join("\n")
    );
    // Keep draining stdout so the demo never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Demo { _child: child, dir }
}

struct Kubectl {
    bin: PathBuf,
    dir: PathBuf,
}

impl Kubectl {
    fn new(demo: &Demo) -> Self {
        Self {
            bin: kubectl_path(),
            dir: demo.dir.clone(),
        }
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.args(args)
            .arg(format!("--kubeconfig={}", self.kubeconfig().display()))
            .env_remove("KUBECONFIG")
            .env("HOME", &self.dir)
            .arg(format!("--cache-dir={}", self.dir.join("cache").display()))
            .stdin(Stdio::null())
            .kill_on_drop(true);
        c
    }

    /// Runs kubectl; returns (success, stdout, stderr).
    async fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out = tokio::time::timeout(SOON, self.cmd(args).output())
            .await
            .unwrap_or_else(|_| panic!("kubectl {args:?} timed out"))
            .expect("running kubectl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Runs kubectl and returns stdout; panics with stderr on failure.
    async fn ok(&self, args: &[&str]) -> String {
        let (ok, stdout, stderr) = self.run(args).await;
        assert!(ok, "kubectl {args:?} failed:\n{stderr}\n{stdout}");
        stdout
    }

    async fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&a).await).expect("kubectl -o json output")
    }

    fn write(&self, name: &str, text: &str) -> String {
        let p = self.dir.join(name);
        std::fs::write(&p, text).expect("write manifest");
        p.display().to_string()
    }
}

fn rows(table: &str) -> Vec<Vec<&str>> {
    table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect()
}

fn kubeconfig_is_tls(path: &Path) {
    let text = std::fs::read_to_string(path).expect("kubeconfig written");
    assert!(text.contains("server: https://"), "{text}");
    assert!(text.contains("certificate-authority-data:"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_walkthrough_against_ccm_demo() {
    let demo = start_demo().await;
    let k = Kubectl::new(&demo);
    kubeconfig_is_tls(&k.kubeconfig());

    let version = k.ok(&["version"]).await;
    assert!(version.contains("Server Version:"), "{version}");

    nodes_wide_and_describe(&k).await;
    warning_events_only(&k).await;
    load_balancer_service_lifecycle(&k).await;
    typed_creates(&k).await;
    lease_label_annotate_taint_cordon(&k).await;
    replace_and_patch(&k).await;
    server_side_apply_and_explain(&k).await;
    discovery_and_metrics(&k).await;
}

/// `apply --server-side` (what Helm 4 and Flux send) and `explain`, from kube-sim's OpenAPI v3.
async fn server_side_apply_and_explain(k: &Kubectl) {
    let file = k.write(
        "ssa.yaml",
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: ssa-web\nspec:\n  type: LoadBalancer\n  \
         selector: {app: ssa-web}\n  ports:\n  - {name: http, port: 80, targetPort: 8080}\n",
    );
    let out = k.ok(&["apply", "--server-side", "-f", &file]).await;
    assert!(out.contains("service/ssa-web serverside-applied"), "{out}");
    let svc = k
        .json(&["get", "svc", "ssa-web", "--show-managed-fields"])
        .await;
    let managers = svc["metadata"]["managedFields"].to_string();
    assert!(
        managers.contains(r#""manager":"kubectl","operation":"Apply""#),
        "{managers}"
    );
    let out = k.ok(&["explain", "service.spec.loadBalancerClass"]).await;
    assert!(out.contains("FIELD: loadBalancerClass <string>"), "{out}");
    k.ok(&["delete", "svc", "ssa-web", "--timeout=60s"]).await;
}

async fn nodes_wide_and_describe(k: &Kubectl) {
    // 3 nodes + 1 joined − 1 terminated by the demo's story.
    let wide = k.ok(&["get", "nodes", "-o", "wide"]).await;
    let header = wide.lines().next().unwrap_or_default();
    assert!(
        header.contains("INTERNAL-IP") && header.contains("STATUS"),
        "{wide}"
    );
    let nodes = rows(&wide);
    assert_eq!(nodes.len(), 3, "{wide}");
    assert!(
        nodes
            .iter()
            .all(|r| r[0].starts_with("node-") && r.contains(&"<none>")),
        "{wide}"
    );
    // The cloud-node controller's Event is listed: kubectl finds it with a fieldSelector on
    // involvedObject.
    let desc = k.ok(&["describe", "node", "node-00002"]).await;
    let events = desc
        .split_once("\nEvents:")
        .map(|(_, e)| e)
        .unwrap_or_else(|| panic!("no Events section:\n{desc}"));
    assert!(
        events.contains("Synced") && events.contains("cloud-node-controller"),
        "{events}"
    );
    assert!(desc.contains("ProviderID:"), "{desc}");
}

async fn warning_events_only(k: &Kubectl) {
    let manifest = r#"
apiVersion: v1
kind: Event
metadata: {name: walkthrough-warning, namespace: kube-system}
involvedObject: {kind: Node, name: node-00002, apiVersion: v1}
reason: WalkthroughWarning
message: something to look at
type: Warning
source: {component: walkthrough}
"#;
    let path = k.write("warning.yaml", manifest);
    k.ok(&["apply", "-f", &path]).await;
    let out = k
        .ok(&["get", "events", "-A", "--field-selector", "type=Warning"])
        .await;
    assert!(out.contains("WalkthroughWarning"), "{out}");
    assert!(!out.contains("Synced"), "Normal events listed:\n{out}");
}

/// `kubectl create service` sends protobuf; the CCM gives the Service an ingress IP, and on
/// delete releases its finalizer so kubectl's wait returns.
async fn load_balancer_service_lifecycle(k: &Kubectl) {
    let out = k
        .ok(&["create", "service", "loadbalancer", "web", "--tcp=80:8080"])
        .await;
    assert!(out.contains("service/web created"), "{out}");
    let mut watch = k
        .cmd(&["get", "svc", "web", "-w"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl get -w");
    let mut lines = BufReader::new(watch.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    let ip = tokio::time::timeout(SOON, async {
        while let Ok(Some(line)) = lines.next_line().await {
            let cols: Vec<String> = line.split_whitespace().map(String::from).collect();
            seen.push(line);
            // NAME TYPE CLUSTER-IP EXTERNAL-IP PORT(S) AGE
            if cols.first().map(String::as_str) == Some("web")
                && cols
                    .get(3)
                    .is_some_and(|ip| ip.parse::<std::net::IpAddr>().is_ok())
            {
                return Some(cols[3].clone());
            }
        }
        None
    })
    .await;
    let _ = watch.kill().await;
    assert!(
        matches!(ip, Ok(Some(_))),
        "no EXTERNAL-IP in kubectl get -w:\n{}",
        seen.join("\n")
    );
    let svc = k.json(&["get", "svc", "web"]).await;
    assert!(
        svc["metadata"]["finalizers"]
            .to_string()
            .contains("service.kubernetes.io/load-balancer-cleanup"),
        "{svc}"
    );
    let out = k.ok(&["delete", "svc", "web", "--timeout=60s"]).await;
    assert!(out.contains("service \"web\" deleted"), "{out}");
    let (ok, _, err) = k.run(&["get", "svc", "web"]).await;
    assert!(!ok && err.contains("not found"), "{err}");
}

/// kubectl's typed `create` subcommands (protobuf bodies), `run`, `expose` and `edit`.
async fn typed_creates(k: &Kubectl) {
    for (args, expect) in [
        (
            &["create", "configmap", "cm1", "--from-literal=a=b"][..],
            "configmap/cm1 created",
        ),
        (
            &["create", "secret", "generic", "s1", "--from-literal=a=b"],
            "secret/s1 created",
        ),
        (&["create", "namespace", "ns1"], "namespace/ns1 created"),
        (
            &["create", "serviceaccount", "sa1"],
            "serviceaccount/sa1 created",
        ),
        (
            &["create", "deployment", "d1", "--image=nginx"],
            "deployment.apps/d1 created",
        ),
        (&["run", "p1", "--image=nginx"], "pod/p1 created"),
        (&["expose", "pod", "p1", "--port=80"], "service/p1 exposed"),
    ] {
        let out = k.ok(args).await;
        assert!(out.contains(expect), "kubectl {args:?}: {out}");
    }
    let secret = k.json(&["get", "secret", "s1"]).await;
    assert_eq!(secret["data"]["a"], "Yg==");
    let token = k.ok(&["create", "token", "sa1"]).await;
    assert!(!token.trim().is_empty());
    // `kubectl edit` with a non-interactive editor.
    let mut edit = k.cmd(&["edit", "configmap", "cm1"]);
    edit.env("KUBE_EDITOR", "sed -i -e 's/a: b$/a: edited/'");
    let out = edit.output().await.expect("kubectl edit");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cm = k.json(&["get", "configmap", "cm1"]).await;
    assert_eq!(cm["data"]["a"], "edited", "{cm}");
    let out = k.ok(&["delete", "namespace", "ns1"]).await;
    assert!(out.contains("deleted"), "{out}");
}

async fn lease_label_annotate_taint_cordon(k: &Kubectl) {
    let leases = k.ok(&["get", "lease", "-n", "kube-system"]).await;
    assert!(leases.contains("cloud-controller-manager"), "{leases}");

    let node = "node-00002";
    k.ok(&["label", "node", node, "team=blue"]).await;
    k.ok(&["annotate", "node", node, "example.com/note=hello"])
        .await;
    k.ok(&["taint", "node", node, "dedicated=gpu:NoSchedule"])
        .await;
    k.ok(&["cordon", node]).await;
    let n = k.json(&["get", "node", node]).await;
    assert_eq!(n["metadata"]["labels"]["team"], "blue");
    assert_eq!(n["metadata"]["annotations"]["example.com/note"], "hello");
    assert_eq!(n["spec"]["unschedulable"], true);
    let taints = n["spec"]["taints"].as_array().cloned().unwrap_or_default();
    assert!(
        taints
            .iter()
            .any(|t| t["key"] == "dedicated" && t["effect"] == "NoSchedule"),
        "{taints:?}"
    );
    let status = k.ok(&["get", "node", node]).await;
    assert!(status.contains("SchedulingDisabled"), "{status}");
    k.ok(&["uncordon", node]).await;
    k.ok(&["taint", "node", node, "dedicated-"]).await;
    let n = k.json(&["get", "node", node]).await;
    assert!(n["spec"]["unschedulable"].as_bool() != Some(true), "{n}");
    assert!(
        !n["spec"]["taints"].to_string().contains("dedicated"),
        "{n}"
    );
}

async fn replace_and_patch(k: &Kubectl) {
    // `kubectl edit` without an editor: get -o yaml, change, replace.
    let yaml = k.ok(&["get", "svc", "svc-1", "-o", "yaml"]).await;
    assert!(yaml.contains("kind: Service"), "{yaml}");
    let edited = yaml.replacen(
        "metadata:\n",
        "metadata:\n  labels:\n    edited: \"yes\"\n",
        1,
    );
    let path = k.write("svc-1.yaml", &edited);
    let out = k.ok(&["replace", "-f", &path]).await;
    assert!(out.contains("service/svc-1 replaced"), "{out}");
    k.ok(&[
        "patch",
        "svc",
        "svc-1",
        "-p",
        r#"{"metadata":{"annotations":{"patched":"yes"}}}"#,
    ])
    .await;
    let svc = k.json(&["get", "svc", "svc-1"]).await;
    assert_eq!(svc["metadata"]["labels"]["edited"], "yes");
    assert_eq!(svc["metadata"]["annotations"]["patched"], "yes");
}

async fn discovery_and_metrics(k: &Kubectl) {
    let all = k.ok(&["get", "all"]).await;
    assert!(all.contains("service/svc-1"), "{all}");
    let res = k.ok(&["api-resources"]).await;
    assert!(
        res.contains("nodes") && res.contains("leases") && res.contains("coordination.k8s.io"),
        "{res}"
    );
    let metrics = k.ok(&["get", "--raw", "/metrics"]).await;
    assert!(metrics.contains("apiserver_request_total{"), "{metrics}");
}
