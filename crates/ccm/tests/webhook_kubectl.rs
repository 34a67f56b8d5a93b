//! The PersistentVolume labeler end to end, as an operator meets it: the `ccm` binary with the
//! sim cloud serves `--webhooks=persistentvolumelabel`, kube-sim calls it as kube-apiserver
//! calls admission webhooks, and the real `kubectl create -f pv.yaml` shows the result — the
//! zone/region labels and node affinity, or the real server's error when the webhook is down
//! (`failurePolicy: Fail`), untrusted, or slower than `timeoutSeconds`; with `Ignore` the PV is
//! created unlabelled.
//!
//! Fails (never skips) when kubectl is missing: `.ci/run` installs it. Set `KUBECTL` to use a
//! binary outside `PATH`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use base64::Engine as _;
use ccm_kube_sim::{Config, KubeSim};
use serde_json::Value;

mod support;
use support::{ccm_command, free_port, tmpdir};

const HOOK: &str = "pvlabel.ccm-rs.io";
const SERVICE_HOST: &str = "cloud-controller-manager-webhook.kube-system.svc";

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
        .expect("kubectl not found in PATH, /usr/bin or $KUBECTL: .ci/run installs it")
}

struct Kubectl {
    bin: PathBuf,
    dir: PathBuf,
}

impl Kubectl {
    /// Runs kubectl; returns (success, stdout, stderr).
    async fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out = tokio::process::Command::new(&self.bin)
            .args(args)
            .arg(format!(
                "--kubeconfig={}",
                self.dir.join("kubeconfig").display()
            ))
            .arg(format!("--cache-dir={}", self.dir.join("cache").display()))
            .env_remove("KUBECONFIG")
            .env("HOME", &self.dir)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(60), out)
            .await
            .expect("kubectl timed out")
            .expect("running kubectl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    async fn ok(&self, args: &[&str]) -> String {
        let (ok, stdout, stderr) = self.run(args).await;
        assert!(ok, "kubectl {args:?} failed:\n{stderr}\n{stdout}");
        stdout
    }

    /// `kubectl create -f` of a manifest written to a file; its error output when it fails.
    async fn create(&self, name: &str, yaml: &str) -> Result<(), String> {
        let path = self.dir.join(name);
        std::fs::write(&path, yaml).expect("write manifest");
        let (ok, _, stderr) = self
            .run(&["create", "-f", &path.display().to_string()])
            .await;
        if ok {
            Ok(())
        } else {
            Err(stderr.trim().to_string())
        }
    }

    async fn pv(&self, name: &str) -> Value {
        let out = self.ok(&["get", "pv", name, "-o", "json"]).await;
        serde_json::from_str(&out).expect("pv json")
    }

    /// Replaces the webhook configuration (delete, then create).
    async fn configure(&self, yaml: &str) {
        let _ = self
            .run(&[
                "delete",
                "mutatingwebhookconfiguration",
                "ccm-rs-pvlabel",
                "--ignore-not-found",
            ])
            .await;
        self.create("mwc.yaml", yaml)
            .await
            .expect("create webhook configuration");
    }
}

/// A CA and a serving certificate for the webhook Service's name and 127.0.0.1:
/// (ca PEM, cert PEM, key PEM).
fn serving_cert() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
    let ca_key = KeyPair::generate().expect("ca key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key).expect("ca");
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(vec![SERVICE_HOST.to_string()]).expect("params");
    params
        .subject_alt_names
        .push(SanType::IpAddress([127, 0, 0, 1].into()));
    let cert = params.signed_by(&key, &ca, &ca_key).expect("cert");
    (ca.pem(), cert.pem(), key.serialize_pem())
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// The MutatingWebhookConfiguration the chart installs, with `client` as its clientConfig.
fn mwc(client: &str, ca_pem: &str, policy: &str, timeout: u32) -> String {
    format!(
        r#"apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: ccm-rs-pvlabel
webhooks:
- name: {HOOK}
  admissionReviewVersions: ["v1"]
  sideEffects: None
  failurePolicy: {policy}
  timeoutSeconds: {timeout}
  rules:
  - operations: ["CREATE"]
    apiGroups: [""]
    apiVersions: ["v1"]
    resources: ["persistentvolumes"]
  clientConfig:
    caBundle: {ca}
{client}
"#,
        ca = b64(ca_pem)
    )
}

fn url(port: u16) -> String {
    format!("    url: https://127.0.0.1:{port}/persistentvolumelabel")
}

fn pv(name: &str, driver: &str, handle: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: PersistentVolume
metadata:
  name: {name}
spec:
  capacity:
    storage: 1Gi
  accessModes: ["ReadWriteOnce"]
  csi:
    driver: {driver}
    volumeHandle: {handle}
"#
    )
}

fn labels(pv: &Value) -> (Option<&str>, Option<&str>) {
    let l = &pv["metadata"]["labels"];
    (
        l["topology.kubernetes.io/zone"].as_str(),
        l["topology.kubernetes.io/region"].as_str(),
    )
}

/// Waits until the webhook port accepts connections.
async fn listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "the webhook port {port} never opened"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `ccm` with the sim cloud (`cloud_config`) serving the labeler on `port`.
fn spawn_ccm(
    kube: &KubeSim,
    dir: &Path,
    cloud_config: &str,
    port: u16,
    tls: &[String],
) -> tokio::process::Child {
    let cfg = dir.join("sim-cloud.toml");
    std::fs::write(&cfg, cloud_config).expect("cloud config");
    let (mut cmd, _) = ccm_command(env!("CARGO_BIN_EXE_ccm"), kube, dir);
    cmd.args([
        format!("--cloud-config={}", cfg.display()),
        "--webhooks=persistentvolumelabel".into(),
        "--feature-gates=CloudControllerManagerWebhook=true".into(),
        "--webhook-bind-address=127.0.0.1".into(),
        format!("--webhook-secure-port={port}"),
    ])
    .args(tls)
    .spawn()
    .expect("spawn ccm")
}

const DISKS: &str = r#"
[[volumes]]
id = "vol-in-b"
zone = "region-1b"
region = "region-1"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_pv_is_labelled_by_the_ccm_webhook_or_refused_as_a_real_server_refuses() {
    // TLS: kubectl (client-go) sends no bearer token over plain HTTP.
    let kube = KubeSim::start(Config {
        tls: true,
        ..Config::default()
    })
    .await
    .expect("kube-sim");
    let dir = tmpdir("webhook-kubectl");
    let (ca, cert, key) = serving_cert();
    std::fs::write(dir.join("tls.crt"), &cert).expect("cert");
    std::fs::write(dir.join("tls.key"), &key).expect("key");
    let port = free_port();
    let tls = [
        format!("--webhook-tls-cert-file={}", dir.join("tls.crt").display()),
        format!(
            "--webhook-tls-private-key-file={}",
            dir.join("tls.key").display()
        ),
    ];
    let _ccm = spawn_ccm(&kube, &dir, DISKS, port, &tls);
    listening(port).await;
    let k = Kubectl {
        bin: kubectl_path(),
        dir: dir.clone(),
    };
    let driver = ccm_provider_sim::SIM_CSI_DRIVER;

    // The labeler, called by URL: labels and node affinity from the disk's zone.
    k.configure(&mwc(&url(port), &ca, "Fail", 10)).await;
    k.create("pv1.yaml", &pv("pv1", driver, "vol-in-b"))
        .await
        .expect("pv1 created");
    let pv1 = k.pv("pv1").await;
    assert_eq!(labels(&pv1), (Some("region-1b"), Some("region-1")), "{pv1}");
    let terms = &pv1["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"];
    let exprs = terms[0]["matchExpressions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        exprs
            .iter()
            .any(|e| e["key"] == "topology.kubernetes.io/zone" && e["values"][0] == "region-1b"),
        "node affinity: {pv1}"
    );
    // Another driver, or a disk the cloud does not know: admitted unchanged.
    k.create("pv2.yaml", &pv("pv2", "nfs.csi.k8s.io", "vol-in-b"))
        .await
        .expect("pv2");
    k.create("pv3.yaml", &pv("pv3", driver, "vol-unknown"))
        .await
        .expect("pv3");
    for name in ["pv2", "pv3"] {
        let got = k.pv(name).await;
        assert_eq!(labels(&got), (None, None), "{got}");
    }

    // Called through its Service, as the chart configures it: kube-sim dials the Service's
    // EndpointSlice address and checks the certificate for <service>.<namespace>.svc.
    let svc = format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: cloud-controller-manager-webhook, namespace: kube-system}}
spec:
  ports: [{{name: https, port: 443, targetPort: {port}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: cloud-controller-manager-webhook-1
  namespace: kube-system
  labels: {{kubernetes.io/service-name: cloud-controller-manager-webhook}}
addressType: IPv4
ports: [{{name: https, port: {port}, protocol: TCP}}]
endpoints: [{{addresses: ["127.0.0.1"], conditions: {{ready: true}}}}]
"#
    );
    k.create("svc.yaml", &svc).await.expect("service");
    let service = "    service: {name: cloud-controller-manager-webhook, namespace: kube-system, path: /persistentvolumelabel, port: 443}";
    k.configure(&mwc(service, &ca, "Fail", 10)).await;
    k.create("pv4.yaml", &pv("pv4", driver, "vol-in-b"))
        .await
        .expect("pv4");
    assert_eq!(labels(&k.pv("pv4").await).0, Some("region-1b"));

    // A caBundle that did not sign the webhook's certificate: never called unverified.
    let (other_ca, ..) = serving_cert();
    k.configure(&mwc(&url(port), &other_ca, "Fail", 10)).await;
    let err = k
        .create("pv5.yaml", &pv("pv5", driver, "vol-in-b"))
        .await
        .unwrap_err();
    assert!(
        err.contains("x509: certificate signed by unknown authority") && err.contains(HOOK),
        "{err}"
    );

    // The webhook down: Fail refuses with the real server's message; Ignore admits unlabelled.
    let down = free_port();
    k.configure(&mwc(&url(down), &ca, "Fail", 10)).await;
    let path = dir.join("pv6.yaml").display().to_string();
    let err = k
        .create("pv6.yaml", &pv("pv6", driver, "vol-in-b"))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        format!(
            "Error from server (InternalError): error when creating {path:?}: Internal error occurred: \
             failed calling webhook \"{HOOK}\": failed to call webhook: Post \
             \"https://127.0.0.1:{down}/persistentvolumelabel?timeout=10s\": dial tcp 127.0.0.1:{down}: \
             connect: connection refused"
        )
    );
    let (ok, ..) = k.run(&["get", "pv", "pv6"]).await;
    assert!(!ok, "a refused PV is not stored");
    k.configure(&mwc(&url(down), &ca, "Ignore", 10)).await;
    k.create("pv6.yaml", &pv("pv6", driver, "vol-in-b"))
        .await
        .expect("Ignore admits");
    assert_eq!(labels(&k.pv("pv6").await), (None, None));

    // A slow cloud: a second CCM (self-signed pair in --webhook-cert-dir) whose disk lookups
    // take 3s, behind a webhook with timeoutSeconds: 1.
    let slow_dir = tmpdir("webhook-slow");
    let slow_port = free_port();
    let slow_cfg = format!("{DISKS}\n[latency.volume_topology]\nfixed_ms = 3000\n");
    let certs = slow_dir.join("certs");
    let _slow = spawn_ccm(
        &kube,
        &slow_dir,
        &slow_cfg,
        slow_port,
        &[format!("--webhook-cert-dir={}", certs.display())],
    );
    listening(slow_port).await;
    let pair = std::fs::read_to_string(certs.join("cloud-controller-manager-webhook.crt"))
        .expect("self-signed pair");
    k.configure(&mwc(&url(slow_port), &pair, "Fail", 1)).await;
    let err = k
        .create("pv7.yaml", &pv("pv7", driver, "vol-in-b"))
        .await
        .unwrap_err();
    assert!(
        err.contains(&format!(
            "failed calling webhook \"{HOOK}\": failed to call webhook: Post \
             \"https://127.0.0.1:{slow_port}/persistentvolumelabel?timeout=1s\": context deadline exceeded"
        )),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&slow_dir);
}
