//! The real kubectl as a person runs it, for the kubectl tests beside `kubectl.rs`: its own
//! kubeconfig (the admin's) and, for another user, `--token`. Each test file uses part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::Duration;

use ccm_kube_sim::KubeSim;
use serde_json::Value;
use tokio::process::Command;

pub const SOON: Duration = Duration::from_secs(120);

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
pub struct Kubectl {
    bin: PathBuf,
    dir: PathBuf,
    token: Option<String>,
}

impl Kubectl {
    pub fn new(sim: &KubeSim, name: &str, token: Option<String>) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "kube-sim-kubectl-cli-{}-{name}",
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

    pub async fn run(&self, args: &[&str]) -> Output {
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
    pub async fn can_i(&self, verb: &str, resource: &str) -> (i32, String) {
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

    pub async fn whoami(&self) -> Value {
        let out = self.run(&["auth", "whoami", "-o", "json"]).await;
        assert!(
            out.status.success(),
            "kubectl auth whoami: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("whoami -o json")
    }

    pub async fn stdout(&self, args: &[&str]) -> String {
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

pub async fn post(sim: &KubeSim, url: &str, body: Value) {
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
