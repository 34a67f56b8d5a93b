//! `kubectl auth can-i` and `kubectl auth whoami` — the real kubectl against kube-sim with RBAC
//! enforced, once as the administrator and once as a restricted service account.
//!
//! Fails (never skips) when kubectl is missing. Set `KUBECTL` to use a binary outside `PATH`.

use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::Duration;

use ccm_kube_sim::{ADMIN_USER, Config, KubeSim};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tokio::process::Command;

const SOON: Duration = Duration::from_secs(120);

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
        .expect("kubectl not found in PATH, /usr/bin or $KUBECTL: these tests need it")
}

/// kubectl with its own kubeconfig (the admin's) and, for another user, `--token`.
struct Kubectl {
    bin: PathBuf,
    dir: PathBuf,
    token: Option<String>,
}

impl Kubectl {
    fn new(sim: &KubeSim, name: &str, token: Option<String>) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "kube-sim-kubectl-auth-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        sim.write_kubeconfig(&dir.join("kubeconfig"))
            .expect("kubeconfig");
        Self {
            bin: kubectl_path(),
            dir,
            token,
        }
    }

    async fn run(&self, args: &[&str]) -> Output {
        let mut c = Command::new(&self.bin);
        c.args(args)
            .env("KUBECONFIG", self.dir.join("kubeconfig"))
            .env("HOME", &self.dir)
            .arg(format!("--cache-dir={}", self.dir.join("cache").display()))
            .stdin(Stdio::null())
            .kill_on_drop(true);
        if let Some(t) = &self.token {
            c.arg(format!("--token={t}"));
        }
        tokio::time::timeout(SOON, c.output())
            .await
            .unwrap_or_else(|_| panic!("kubectl {args:?} timed out"))
            .expect("running kubectl")
    }

    /// `(exit code, stdout)`; stderr goes into the panic message of a failed assertion.
    async fn can_i(&self, verb: &str, resource: &str) -> (i32, String) {
        let out = self.run(&["auth", "can-i", verb, resource]).await;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        // kubectl itself warns that a cluster-scoped resource ignores the context's namespace.
        assert!(
            stderr
                .lines()
                .all(|l| l.is_empty() || l.starts_with("Warning:")),
            "kubectl auth can-i {verb} {resource}: {stderr}"
        );
        (out.status.code().unwrap_or(-1), stdout)
    }

    async fn whoami(&self) -> Value {
        let out = self.run(&["auth", "whoami", "-o", "json"]).await;
        assert!(
            out.status.success(),
            "kubectl auth whoami: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("whoami -o json")
    }

    async fn stdout(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Kubectl {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn post(sim: &KubeSim, url: &str, body: Value) {
    let req = http::Request::post(url)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).expect("json"))
        .expect("request");
    sim.client()
        .expect("admin")
        .request::<Value>(req)
        .await
        .unwrap_or_else(|e| panic!("creating {body}: {e}"));
}

/// RBAC on; service account `default/viewer` may read Nodes and nothing else.
async fn setup() -> (KubeSim, ServiceAccount) {
    let sim = KubeSim::start(Config {
        tls: true,
        rbac: true,
        ..Config::default()
    })
    .await
    .expect("kube-sim");
    let sas: Api<ServiceAccount> = Api::namespaced(sim.client().expect("admin"), "default");
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "viewer"}})).expect("sa");
    let sa = sas.create(&PostParams::default(), &sa).await.expect("sa");
    post(
        &sim,
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        json!({"metadata": {"name": "node-reader"}, "rules": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        ]}),
    )
    .await;
    post(
        &sim,
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        json!({"metadata": {"name": "viewer-reads-nodes"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "node-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": "default"}]}),
    )
    .await;
    (sim, sa)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn can_i_answers_from_rbac_for_the_requesting_user() {
    let (sim, _) = setup().await;
    let admin = Kubectl::new(&sim, "admin", None);
    let token = sim
        .service_account_token("default", "viewer")
        .expect("token");
    let viewer = Kubectl::new(&sim, "viewer", Some(token));

    assert_eq!(admin.can_i("create", "nodes").await, (0, "yes\n".into()));
    // As the real kubectl prints a denial: "no", exit code 1.
    assert_eq!(viewer.can_i("create", "nodes").await, (1, "no\n".into()));
    // The grant the binding gives is seen: the answer comes from RBAC, not a blanket "no".
    assert_eq!(viewer.can_i("list", "nodes").await, (0, "yes\n".into()));
    assert_eq!(viewer.can_i("delete", "services").await, (1, "no\n".into()));

    // Discovery lists both review groups, so `kubectl api-resources` shows them.
    let listed = admin
        .stdout(&["api-resources", "--no-headers", "-o", "name"])
        .await;
    for r in [
        "selfsubjectaccessreviews.authorization.k8s.io",
        "selfsubjectreviews.authentication.k8s.io",
    ] {
        assert!(
            listed.lines().any(|l| l == r),
            "{r} missing from:\n{listed}"
        );
    }
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whoami_shows_the_requesting_user() {
    let (sim, sa) = setup().await;
    let admin = Kubectl::new(&sim, "whoami-admin", None);
    let token = sim
        .service_account_token("default", "viewer")
        .expect("token");
    let viewer = Kubectl::new(&sim, "whoami-viewer", Some(token));

    let me = admin.whoami().await;
    assert_eq!(me["kind"], "SelfSubjectReview");
    assert_eq!(me["status"]["userInfo"]["username"], ADMIN_USER);
    assert_eq!(
        me["status"]["userInfo"]["groups"],
        json!(["system:masters", "system:authenticated"])
    );

    let me = viewer.whoami().await;
    let info = &me["status"]["userInfo"];
    assert_eq!(info["username"], "system:serviceaccount:default:viewer");
    assert_eq!(
        info["uid"].as_str(),
        sa.metadata.uid.as_deref(),
        "a service account's UID is its object's"
    );
    assert_eq!(
        info["groups"],
        json!([
            "system:serviceaccounts",
            "system:serviceaccounts:default",
            "system:authenticated"
        ])
    );

    // The table a person reads.
    let table = viewer.stdout(&["auth", "whoami"]).await;
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("Username")
                && l.ends_with("system:serviceaccount:default:viewer")),
        "{table}"
    );
    sim.shutdown().await;
}
