//! The real `kubectl` binary driving the simulator, as a person would.
//!
//! These tests fail (never skip) when kubectl is missing: CI must have it. Set `KUBECTL` to
//! use a binary outside `PATH`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use ccm_kube_sim::{Config, KubeSim};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const SOON: Duration = Duration::from_secs(120);

fn kubectl_path() -> PathBuf {
    if let Some(p) = std::env::var_os("KUBECTL") {
        return PathBuf::from(p);
    }
    for dir in std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/local/bin")])
    {
        let c = dir.join("kubectl");
        if c.is_file() {
            return c;
        }
    }
    panic!(
        "kubectl not found in PATH, /usr/bin or $KUBECTL: these tests need the real kubectl binary"
    );
}

struct Kubectl {
    bin: PathBuf,
    dir: PathBuf,
}

impl Kubectl {
    fn new(sim: &KubeSim, name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("kube-sim-kubectl-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        sim.write_kubeconfig(&dir.join("kubeconfig")).unwrap();
        Self {
            bin: kubectl_path(),
            dir,
        }
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.args(args)
            .env("KUBECONFIG", self.dir.join("kubeconfig"))
            .env("HOME", &self.dir)
            .arg(format!("--cache-dir={}", self.dir.join("cache").display()))
            .stdin(Stdio::null())
            .kill_on_drop(true);
        c
    }

    /// Runs kubectl and returns stdout; panics with stderr on failure.
    async fn ok(&self, args: &[&str]) -> String {
        let out = tokio::time::timeout(SOON, self.cmd(args).output())
            .await
            .unwrap_or_else(|_| panic!("kubectl {args:?} timed out"))
            .expect("running kubectl");
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    async fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&a).await).expect("kubectl -o json output")
    }

    fn write(&self, name: &str, text: &str) -> String {
        let p = self.dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    }
}

impl Drop for Kubectl {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const MANIFEST: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels:
    topology.kubernetes.io/zone: zone-a
spec:
  providerID: sim://node-a
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: default
spec:
  type: LoadBalancer
  selector:
    app: web
  ports:
  - name: http
    port: 80
    targetPort: 8080
"#;

async fn tls_sim() -> KubeSim {
    KubeSim::start(Config {
        tls: true,
        ..Config::default()
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_get_patch_label_taint() {
    let sim = tls_sim().await;
    let k = Kubectl::new(&sim, "apply");
    let path = k.write("m.yaml", MANIFEST);
    let out = k.ok(&["apply", "-f", &path]).await;
    assert!(
        out.contains("node/node-a created") && out.contains("service/web created"),
        "{out}"
    );
    // Re-applying a changed manifest goes through client-side apply's strategic merge PATCH.
    let path2 = k.write("m2.yaml", &MANIFEST.replace("zone-a", "zone-b"));
    let out = k.ok(&["apply", "-f", &path2]).await;
    assert!(
        out.contains("node/node-a configured") && out.contains("service/web unchanged"),
        "{out}"
    );

    let node = k.json(&["get", "node", "node-a"]).await;
    assert_eq!(
        node["metadata"]["labels"]["topology.kubernetes.io/zone"],
        "zone-b"
    );
    assert_eq!(node["spec"]["providerID"], "sim://node-a");
    assert!(
        node["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .is_string()
    );
    let svc = k.json(&["get", "service", "web", "-n", "default"]).await;
    assert_eq!(svc["spec"]["type"], "LoadBalancer");
    let np = svc["spec"]["ports"][0]["nodePort"].as_u64().unwrap();
    assert!((30000..=32767).contains(&np));
    assert!(
        svc["spec"]["clusterIP"]
            .as_str()
            .unwrap()
            .starts_with("10.")
    );

    // Table output: the server prints columns.
    let table = k.ok(&["get", "svc", "web"]).await;
    assert!(
        table.contains("LoadBalancer")
            && table.contains("<pending>")
            && table.contains(&format!("80:{np}/TCP")),
        "{table}"
    );
    let table = k.ok(&["get", "nodes"]).await;
    assert!(
        table.lines().next().unwrap().contains("STATUS") && table.contains("node-a"),
        "{table}"
    );

    k.ok(&[
        "patch",
        "node",
        "node-a",
        "--type",
        "strategic",
        "-p",
        r#"{"metadata":{"labels":{"s":"1"}}}"#,
    ])
    .await;
    k.ok(&[
        "patch",
        "node",
        "node-a",
        "--type",
        "merge",
        "-p",
        r#"{"metadata":{"labels":{"m":"1"}}}"#,
    ])
    .await;
    k.ok(&[
        "patch",
        "node",
        "node-a",
        "--type",
        "json",
        "-p",
        r#"[{"op":"add","path":"/metadata/labels/j","value":"1"}]"#,
    ])
    .await;
    k.ok(&["label", "node", "node-a", "team=blue"]).await;
    k.ok(&["taint", "node", "node-a", "dedicated=gpu:NoSchedule"])
        .await;
    k.ok(&["taint", "node", "node-a", "spot=true:NoExecute"])
        .await;
    k.ok(&["taint", "node", "node-a", "dedicated-"]).await;
    let node = k.json(&["get", "node", "node-a"]).await;
    let labels = &node["metadata"]["labels"];
    for l in ["s", "m", "j"] {
        assert_eq!(labels[l], "1", "{labels}");
    }
    assert_eq!(labels["team"], "blue");
    assert_eq!(
        node["spec"]["taints"],
        json!([{"key": "spot", "value": "true", "effect": "NoExecute"}])
    );

    // Errors reach the user worded as the real server words them.
    let out = k
        .cmd(&["taint", "node", "node-a", "bad=x:Sometimes"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Sometimes"), "{err}");
    let out = k.cmd(&["get", "node", "missing"]).output().await.unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains(r#"nodes "missing" not found"#));

    let desc = k.ok(&["describe", "node", "node-a"]).await;
    assert!(desc.contains("spot=true:NoExecute"), "{desc}");
    let desc = k.ok(&["describe", "service", "web"]).await;
    assert!(desc.contains("LoadBalancer"), "{desc}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_watch_sees_change() {
    let sim = tls_sim().await;
    let k = Kubectl::new(&sim, "watch");
    let path = k.write("m.yaml", MANIFEST);
    k.ok(&["apply", "-f", &path]).await;
    let mut child = k
        .cmd(&[
            "get",
            "nodes",
            "-w",
            "-o",
            "custom-columns=NAME:.metadata.name,TEAM:.metadata.labels.team",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // The initial state arrives first: the watch is established.
    let first = tokio::time::timeout(SOON, lines.next_line())
        .await
        .unwrap()
        .unwrap();
    assert!(first.is_some());
    k.ok(&["label", "node", "node-a", "team=red"]).await;
    let deadline = tokio::time::Instant::now() + SOON;
    let mut seen = Vec::new();
    loop {
        let line = tokio::time::timeout_at(deadline, lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("kubectl get -w never showed the change: {seen:?}"))
            .unwrap()
            .unwrap_or_else(|| panic!("kubectl get -w exited: {seen:?}"));
        if line.contains("node-a") && line.contains("red") {
            break;
        }
        seen.push(line);
    }
    child.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_waits_for_finalizer() {
    let sim = tls_sim().await;
    let k = Kubectl::new(&sim, "delete");
    let path = k.write(
        "n.yaml",
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: held\n  finalizers: [example.com/hold]\n",
    );
    k.ok(&["apply", "-f", &path]).await;
    let nodes: Api<Node> = Api::all(sim.client_with_user_agent("finalizer-remover").unwrap());
    let remover = {
        let nodes = nodes.clone();
        tokio::spawn(async move {
            // Wait until kubectl's delete marked the node, then release it.
            loop {
                let n = nodes.get("held").await.unwrap();
                if n.metadata.deletion_timestamp.is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            nodes
                .patch(
                    "held",
                    &PatchParams::default(),
                    &Patch::Json::<()>(
                        serde_json::from_value(json!([
                    {"op": "remove", "path": "/metadata/finalizers"}]))
                        .unwrap(),
                    ),
                )
                .await
                .unwrap();
        })
    };
    let out = k
        .ok(&["delete", "node", "held", "--wait=true", "--timeout=120s"])
        .await;
    assert!(out.contains(r#"node "held" deleted"#), "{out}");
    // kubectl returned only once the object was gone, i.e. after the finalizer was removed.
    assert!(remover.is_finished() || nodes.get_opt("held").await.unwrap().is_none());
    assert!(nodes.get_opt("held").await.unwrap().is_none());
    tokio::time::timeout(SOON, remover).await.unwrap().unwrap();
}

/// kubectl's typed `create deployment` sends protobuf with every unset Go string as `""`;
/// kube-apiserver defaults those before validating, so the Deployment is accepted and stored
/// with the pod-template defaults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_deployment_gets_pod_template_defaults() {
    let sim = tls_sim().await;
    let k = Kubectl::new(&sim, "deploy");
    let out = k
        .ok(&["create", "deployment", "d1", "--image=nginx:1.27"])
        .await;
    assert!(out.contains("deployment.apps/d1 created"), "{out}");
    let d = k.json(&["get", "deployment", "d1"]).await;
    let spec = &d["spec"]["template"]["spec"];
    assert_eq!(spec["restartPolicy"], "Always", "{d}");
    assert_eq!(spec["dnsPolicy"], "ClusterFirst", "{d}");
    assert_eq!(spec["terminationGracePeriodSeconds"], 30, "{d}");
    assert_eq!(spec["schedulerName"], "default-scheduler", "{d}");
    let c = &spec["containers"][0];
    assert_eq!(c["terminationMessagePath"], "/dev/termination-log", "{d}");
    assert_eq!(c["terminationMessagePolicy"], "File", "{d}");
    assert_eq!(c["imagePullPolicy"], "IfNotPresent", "{d}");
    assert_eq!(d["spec"]["strategy"]["type"], "RollingUpdate", "{d}");
    assert_eq!(
        d["spec"]["strategy"]["rollingUpdate"]["maxSurge"], "25%",
        "{d}"
    );
    // A restart policy the apps group forbids is still refused, with kube-apiserver's words.
    let path = k.write(
        "bad.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: bad\nspec:\n  selector:\n    \
         matchLabels: {app: bad}\n  template:\n    metadata:\n      labels: {app: bad}\n    spec:\n      \
         restartPolicy: Never\n      containers: [{name: c, image: nginx}]\n",
    );
    let out = k.cmd(&["apply", "-f", &path]).output().await.unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(r#"spec.template.spec.restartPolicy: Unsupported value: "Never""#),
        "{err}"
    );
}
