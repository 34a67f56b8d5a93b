//! The webhook server end to end over HTTPS: real AdmissionReview requests to the
//! PersistentVolume labeler, started from the upstream flags as `ccm run` starts it.
//!
//! The cloud side is a hand-written `ccm_cloud::Volumes` (a provider offering only disks): it
//! counts calls, can fail, and can be slow, which is what these tests check. The manager builds
//! the labeler from it as `ccm run` does; the sim and AWS providers have their own tests.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine as _;
use ccm_cloud::k8s_openapi::api::core::v1::PersistentVolumeSpec;
use ccm_cloud::{CloudProvider, CloudResult, VolumeTopology, Volumes};
use ccm_manager::options::RunOptions;
use ccm_manager::webhook::pvlabel::PvLabeler;
use ccm_manager::webhook::{Webhook, select, setup};
use clap::Parser;
use http_body_util::{BodyExt, Full};
use k8s_openapi::api::core::v1::PersistentVolume;
use parking_lot::RwLock;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
struct Cmd {
    #[command(flatten)]
    options: RunOptions,
}

#[derive(Default)]
struct Disks {
    calls: AtomicUsize,
    ids_asked: AtomicUsize,
    fail: bool,
    delay: Duration,
}

#[async_trait::async_trait]
impl Volumes for Disks {
    /// In-tree EBS (`aws://zone/vol-…` or `vol-…`) and the EBS CSI driver, as the AWS provider.
    fn volume_id(&self, spec: &PersistentVolumeSpec) -> Option<String> {
        if let Some(ebs) = &spec.aws_elastic_block_store {
            return ebs.volume_id.rsplit('/').next().map(str::to_string);
        }
        let csi = spec.csi.as_ref()?;
        (csi.driver == "ebs.csi.aws.com").then(|| csi.volume_handle.clone())
    }
    async fn volume_topology(
        &self,
        ids: &[String],
    ) -> CloudResult<HashMap<String, VolumeTopology>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.ids_asked.fetch_add(ids.len(), Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        if self.fail {
            return Err(ccm_cloud::CloudError::Throttled {
                message: "DescribeVolumes: RequestLimitExceeded".into(),
                retry_after: None,
            });
        }
        Ok(ids
            .iter()
            .filter(|id| id.starts_with("vol-"))
            .map(|id| {
                let t = VolumeTopology {
                    zone: "us-east-1b".into(),
                    region: "us-east-1".into(),
                };
                (id.clone(), t)
            })
            .collect())
    }
}

/// A provider that offers only disks.
struct DiskCloud(Arc<Disks>);

impl CloudProvider for DiskCloud {
    fn provider_name(&self) -> &str {
        "sim"
    }
    fn volumes(&self) -> Option<Arc<dyn Volumes>> {
        Some(self.0.clone())
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

struct Server {
    addr: SocketAddr,
    client: HttpsClient,
    registry: Arc<RwLock<Registry>>,
    _stop: tokio_util::sync::DropGuard,
}

/// Starts the server from flags, as `ccm run` does, trusting the self-signed pair it writes.
async fn start(
    disks: Arc<Disks>,
    timeout: Option<Duration>,
    extra: &[&str],
) -> anyhow::Result<Server> {
    let dir = std::env::temp_dir().join(format!("ccm-webhook-{}", rand_suffix()));
    let port = free_port();
    let mut argv = vec![
        "cloud-controller-manager".to_string(),
        "--cloud-provider=sim".into(),
        "--webhooks=persistentvolumelabel".into(),
        "--feature-gates=CloudControllerManagerWebhook=true".into(),
        "--webhook-bind-address=127.0.0.1".into(),
        format!("--webhook-secure-port={port}"),
        format!("--webhook-cert-dir={}", dir.display()),
    ];
    argv.extend(extra.iter().map(|s| s.to_string()));
    let v = Cmd::try_parse_from(argv)?.options.validate()?;
    // The labeler's own timeout is not a flag: a test that needs a short one supplies the
    // labeler itself, which takes precedence over the one built from the provider.
    let offered: Vec<Arc<dyn Webhook>> = match timeout {
        Some(t) => vec![Arc::new(PvLabeler::new(disks.clone()).with_timeout(t))],
        None => Vec::new(),
    };
    let provider: Arc<dyn CloudProvider> = Arc::new(DiskCloud(disks));
    let registry = Arc::new(RwLock::new(Registry::default()));
    let stop = CancellationToken::new();
    let addr = setup::start(&v, &provider, &offered, &registry, stop.clone())
        .await?
        .expect("server started");
    // Written when the server generated its own pair; a test serving files sets its client.
    let pem = std::fs::read(dir.join("cloud-controller-manager-webhook.crt")).unwrap_or_default();
    let client = client_trusting(&pem)?;
    Ok(Server {
        addr,
        client,
        registry,
        _stop: stop.drop_guard(),
    })
}

type HttpsClient = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Full<bytes::Bytes>,
>;

/// An HTTPS client that trusts only the certificates in `pem`.
fn client_trusting(pem: &[u8]) -> anyhow::Result<HttpsClient> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_slice_iter(pem) {
        roots.add(c?)?;
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .build();
    Ok(
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(https),
    )
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

use rustls_pki_types::pem::PemObject as _;

impl Server {
    async fn post(&self, content_type: &str, body: Value) -> anyhow::Result<(u16, Value)> {
        let req = http::Request::post(format!(
            "https://localhost:{}/persistentvolumelabel",
            self.addr.port()
        ))
        .header("content-type", content_type)
        .body(Full::new(serde_json::to_vec(&body)?.into()))?;
        let resp = self.client.request(req).await?;
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await?.to_bytes();
        let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Ok((status, json))
    }

    async fn review(&self, pv: Value) -> anyhow::Result<Value> {
        let (status, body) = self.post("application/json", review(&pv)).await?;
        assert_eq!(status, 200, "{body}");
        Ok(body["response"].clone())
    }

    fn metrics(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry.read()).unwrap();
        out
    }
}

fn review(pv: &Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("uid-{}", pv["metadata"]["name"].as_str().unwrap_or("")),
            "kind": {"group": "", "version": "v1", "kind": "PersistentVolume"},
            "resource": {"group": "", "version": "v1", "resource": "persistentvolumes"},
            "operation": "CREATE",
            "userInfo": {"username": "admin"},
            "object": pv,
        }
    })
}

fn ebs_pv(name: &str, volume_id: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "awsElasticBlockStore": {"volumeID": volume_id, "fsType": "ext4"}
        }
    })
}

/// Applies the response's JSON patch (the `add` operations the labeler emits) as
/// kube-apiserver would, and parses the result as a PersistentVolume.
fn patched(pv: &Value, response: &Value) -> PersistentVolume {
    let mut pv = pv.clone();
    if let Some(b64) = response["patch"].as_str() {
        assert_eq!(response["patchType"], "JSONPatch");
        let ops: Vec<Value> = serde_json::from_slice(
            &base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap(),
        )
        .unwrap();
        for op in ops {
            assert_eq!(op["op"], "add", "{op}");
            let path = op["path"].as_str().unwrap();
            let (parent, key) = path.rsplit_once('/').unwrap();
            pv.pointer_mut(parent).expect("parent exists")[key] = op["value"].clone();
        }
    }
    serde_json::from_value(pv).expect("still a valid PersistentVolume")
}

fn zone_terms(pv: &PersistentVolume) -> Vec<(String, Vec<String>)> {
    pv.spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map(|r| {
            r.node_selector_terms
                .iter()
                .flat_map(|t| t.match_expressions.clone().unwrap_or_default())
                .map(|e| (e.key, e.values.unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn an_ebs_pv_gets_zone_region_labels_and_node_affinity() -> anyhow::Result<()> {
    let disks = Arc::new(Disks::default());
    let s = start(disks.clone(), None, &[]).await?;

    let pv = ebs_pv("in-tree", "aws://us-east-1b/vol-0abc");
    let r = s.review(pv.clone()).await?;
    assert_eq!(r["uid"], "uid-in-tree");
    assert_eq!(r["allowed"], true);
    let out = patched(&pv, &r);
    let labels = out.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels["topology.kubernetes.io/zone"], "us-east-1b");
    assert_eq!(labels["topology.kubernetes.io/region"], "us-east-1");
    let terms = zone_terms(&out);
    assert!(terms.contains(&(
        "topology.kubernetes.io/zone".into(),
        vec!["us-east-1b".into()]
    )));

    // A CSI PV of the configured driver, with labels and an affinity term of its own: both kept.
    let csi = json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "csi", "labels": {"team": "a"}},
        "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-0def"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]}]}]}}
        }
    });
    let out = patched(&csi, &s.review(csi.clone()).await?);
    let labels = out.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels["team"], "a");
    assert_eq!(labels["topology.kubernetes.io/zone"], "us-east-1b");
    let keys: Vec<String> = zone_terms(&out).into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        keys,
        [
            "kubernetes.io/arch",
            "topology.kubernetes.io/zone",
            "topology.kubernetes.io/region"
        ]
    );

    // Another driver, and a volume the cloud does not know: admitted unchanged.
    let nfs = json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "nfs"},
        "spec": {"nfs": {"server": "10.0.0.1", "path": "/x"}}});
    let r = s.review(nfs).await?;
    assert_eq!((r["allowed"].clone(), r.get("patch")), (json!(true), None));
    let r = s.review(ebs_pv("gone", "snap-unknown")).await?;
    assert_eq!((r["allowed"].clone(), r.get("patch")), (json!(true), None));
    assert_eq!(disks.calls.load(Ordering::SeqCst), 3, "nfs costs no lookup");

    let m = s.metrics();
    assert!(
        m.contains(
            r#"cloud_provider_webhook_request_total{code="200",webhook="persistentvolumelabel"} 4"#
        ),
        "{m}"
    );
    Ok(())
}

#[tokio::test]
async fn a_burst_of_pvs_shares_lookups_and_repeats_are_cached() -> anyhow::Result<()> {
    let disks = Arc::new(Disks::default());
    let s = Arc::new(start(disks.clone(), None, &[]).await?);
    let burst = |round: &'static str| {
        let s = s.clone();
        async move {
            let reqs = (0..50).map(|i| {
                let s = s.clone();
                async move {
                    let pv = ebs_pv(&format!("{round}-{i}"), &format!("vol-{i:04}"));
                    let r = s.review(pv.clone()).await.expect("review");
                    let out = patched(&pv, &r);
                    assert_eq!(
                        out.metadata.labels.unwrap_or_default()["topology.kubernetes.io/zone"],
                        "us-east-1b"
                    );
                }
            });
            futures::future::join_all(reqs).await;
        }
    };
    burst("first").await;
    let calls = disks.calls.load(Ordering::SeqCst);
    assert_eq!(
        disks.ids_asked.load(Ordering::SeqCst),
        50,
        "each volume asked once"
    );
    eprintln!("50 concurrent PVs: {calls} lookups");
    assert!(calls <= 10, "50 PVs cost {calls} lookups");
    burst("again").await;
    assert_eq!(
        disks.calls.load(Ordering::SeqCst),
        calls,
        "known volumes are cached"
    );
    Ok(())
}

#[tokio::test]
async fn a_failed_or_slow_lookup_is_refused_never_admitted_unlabeled() -> anyhow::Result<()> {
    let failing = Arc::new(Disks {
        fail: true,
        ..Disks::default()
    });
    let s = start(failing, None, &[]).await?;
    let r = s.review(ebs_pv("throttled", "vol-1")).await?;
    assert_eq!(r["allowed"], false, "{r}");
    assert_eq!(r["status"]["code"], 500);
    let msg = r["status"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("RequestLimitExceeded"), "{msg}");
    assert!(
        s.metrics().contains(
            r#"cloud_provider_webhook_rejection_total{webhook="persistentvolumelabel"} 1"#
        )
    );

    let slow = Arc::new(Disks {
        delay: Duration::from_secs(3),
        ..Disks::default()
    });
    let s = start(slow, Some(Duration::from_millis(200)), &[]).await?;
    let r = s.review(ebs_pv("slow", "vol-2")).await?;
    assert_eq!(r["allowed"], false, "{r}");
    let msg = r["status"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("timed out"), "{msg}");
    Ok(())
}

#[tokio::test]
async fn malformed_requests_get_400() -> anyhow::Result<()> {
    let s = start(Arc::new(Disks::default()), None, &[]).await?;
    let (code, _) = s.post("text/plain", review(&ebs_pv("a", "vol-1"))).await?;
    assert_eq!(code, 400);
    let (code, _) = s
        .post(
            "application/json",
            json!({"apiVersion": "admission.k8s.io/v1"}),
        )
        .await?;
    assert_eq!(code, 400);
    assert!(
        s.metrics().contains(
            r#"cloud_provider_webhook_request_total{code="400",webhook="persistentvolumelabel"} 2"#
        ),
        "{}",
        s.metrics()
    );
    Ok(())
}

#[test]
fn webhooks_flag_follows_upstream_syntax() {
    let known = ["a", "b"];
    let sel = |f: &[&str]| select(&f.iter().map(|s| s.to_string()).collect::<Vec<_>>(), &known);
    assert_eq!(sel(&[]).unwrap(), Vec::<String>::new());
    assert_eq!(sel(&["*"]).unwrap(), ["a", "b"]);
    assert_eq!(sel(&["*", "-a"]).unwrap(), ["b"]);
    assert_eq!(sel(&["b"]).unwrap(), ["b"]);
    let err = sel(&["c"]).unwrap_err();
    assert!(err.contains("--webhooks") && err.contains("\"c\""), "{err}");
}

#[tokio::test]
async fn startup_errors_name_the_flag() -> anyhow::Result<()> {
    let parse = |args: &[&str]| {
        let mut argv = vec!["cloud-controller-manager", "--cloud-provider=sim"];
        argv.extend_from_slice(args);
        Cmd::try_parse_from(argv).unwrap().options.validate()
    };
    let err = parse(&["--webhooks=Pv_Label"]).err().unwrap().to_string();
    assert!(
        err.contains("--webhooks") && err.contains("Pv_Label"),
        "{err}"
    );
    let err = parse(&["--webhook-tls-cert-file=/x.crt"])
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("--webhook-tls-private-key-file"), "{err}");

    // Enabled, but this provider offers no labeler.
    let v = parse(&[
        "--webhooks=persistentvolumelabel",
        "--feature-gates=CloudControllerManagerWebhook=true",
        &format!("--webhook-secure-port={}", free_port()),
    ])?;
    let registry = Arc::new(RwLock::new(Registry::default()));
    let bare: Arc<dyn CloudProvider> = Arc::new(Bare);
    let err = setup::start(&v, &bare, &[], &registry, CancellationToken::new())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--webhooks") && err.contains("not offered"),
        "{err}"
    );
    // A name neither built in nor offered by the provider (upstream's wording).
    let v = parse(&[
        "--webhooks=foo",
        "--feature-gates=CloudControllerManagerWebhook=true",
        &format!("--webhook-secure-port={}", free_port()),
    ])?;
    let err = setup::start(&v, &bare, &[], &registry, CancellationToken::new())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--webhooks: \"foo\" is not in the list of known webhooks"),
        "{err}"
    );
    // The provider's own webhook is served by its name.
    let v = parse(&[
        "--webhooks=namecheck",
        "--feature-gates=CloudControllerManagerWebhook=true",
        &format!("--webhook-secure-port={}", free_port()),
    ])?;
    let served = setup::start(&v, &bare, &[], &registry, CancellationToken::new()).await?;
    assert!(served.is_some(), "a provider's webhook is served");

    // Without the gate, no server (as upstream).
    let v = parse(&[
        "--webhooks=persistentvolumelabel",
        &format!("--webhook-secure-port={}", free_port()),
    ])?;
    let started = setup::start(&v, &bare, &[], &registry, CancellationToken::new()).await?;
    assert_eq!(started, None);
    Ok(())
}

/// `--webhook-tls-cert-file`/`--webhook-tls-private-key-file` are served, and a rotated pair is
/// picked up without a restart (cert-manager renewals).
#[tokio::test]
async fn certificate_files_are_served_and_reloaded() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("ccm-webhook-files-{}", rand_suffix()));
    std::fs::create_dir_all(&dir)?;
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    let ip = "127.0.0.1".parse()?;
    let (first_cert, first_key) = ccm_manager::tls::self_signed(ip)?;
    std::fs::write(&cert, &first_cert)?;
    std::fs::write(&key, &first_key)?;
    let disks = Arc::new(Disks::default());
    let mut s = start(
        disks,
        None,
        &[
            &format!("--webhook-tls-cert-file={}", cert.display()),
            &format!("--webhook-tls-private-key-file={}", key.display()),
        ],
    )
    .await?;
    s.client = client_trusting(first_cert.as_bytes())?;
    assert_eq!(s.review(ebs_pv("a", "vol-1")).await?["allowed"], true);

    let (second_cert, second_key) = ccm_manager::tls::self_signed(ip)?;
    std::fs::write(&key, &second_key)?;
    std::fs::write(&cert, &second_cert)?;
    s.client = client_trusting(second_cert.as_bytes())?;
    let mut served = false;
    for _ in 0..50 {
        if s.post("application/json", review(&ebs_pv("b", "vol-2")))
            .await
            .is_ok()
        {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(served, "the rotated certificate is never served");
    s.client = client_trusting(first_cert.as_bytes())?;
    assert!(
        s.post("application/json", review(&ebs_pv("c", "vol-3")))
            .await
            .is_err(),
        "the old certificate is still served"
    );
    Ok(())
}

/// A provider without disks whose only webhook is [`NameCheck`].
struct Bare;

impl CloudProvider for Bare {
    fn provider_name(&self) -> &str {
        "bare"
    }
    fn webhooks(&self) -> Vec<Arc<dyn Webhook>> {
        vec![Arc::new(NameCheck)]
    }
}

/// A validating webhook written for this test: refuses names starting with "bad", fails on
/// names starting with "err"; its failure policy is Ignore.
struct NameCheck;

#[async_trait::async_trait]
impl Webhook for NameCheck {
    fn name(&self) -> &str {
        "namecheck"
    }
    fn failure_policy(&self) -> ccm_manager::webhook::FailurePolicy {
        ccm_manager::webhook::FailurePolicy::Ignore
    }
    async fn admit(
        &self,
        req: &ccm_manager::webhook::AdmissionRequest,
    ) -> Result<ccm_manager::webhook::Admission, ccm_manager::webhook::WebhookError> {
        let name = req
            .object
            .as_ref()
            .and_then(|o| o.pointer("/metadata/name"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        if name.starts_with("err") {
            return Err("backend unavailable".into());
        }
        if name.starts_with("panic") {
            panic!("a bug in the handler");
        }
        Ok(if name.starts_with("bad") {
            ccm_manager::webhook::Admission::Deny(format!("name {name:?} is not allowed"))
        } else {
            ccm_manager::webhook::Admission::Allow
        })
    }
}

#[tokio::test]
async fn a_validating_webhook_denies_and_ignore_policy_admits_on_error() -> anyhow::Result<()> {
    let mut registry = Registry::default();
    let metrics = ccm_manager::webhook::WebhookMetrics::new(&mut registry);
    let dir = std::env::temp_dir().join(format!("ccm-webhook-v-{}", rand_suffix()));
    let tls = ccm_manager::tls::TlsSettings {
        cert: ccm_manager::tls::CertSource::SelfSigned {
            dir: Some(dir.clone()),
            pair: setup::PAIR_NAME,
        },
        client_ca_pem: None,
        min_version: ccm_manager::options::tls_min_version(None).unwrap(),
        http2_max_streams: 0,
    };
    let stop = CancellationToken::new();
    let hooks: Vec<Arc<dyn Webhook>> = vec![Arc::new(NameCheck)];
    let addr =
        ccm_manager::webhook::serve("127.0.0.1:0".parse()?, tls, &hooks, &metrics, stop.clone())
            .await?;
    let _stop = stop.drop_guard();
    let client = client_trusting(&std::fs::read(
        dir.join("cloud-controller-manager-webhook.crt"),
    )?)?;
    let ask = |name: &str| {
        let body = serde_json::to_vec(&review(&ebs_pv(name, "vol-1"))).unwrap();
        let req = http::Request::post(format!("https://localhost:{}/namecheck", addr.port()))
            .header("content-type", "application/json")
            .body(Full::new(body.into()))
            .unwrap();
        let fut = client.request(req);
        async move {
            let resp = fut.await.expect("request");
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            serde_json::from_slice::<Value>(&bytes).unwrap()["response"].clone()
        }
    };
    let r = ask("bad-pv").await;
    assert_eq!(r["allowed"], false);
    assert_eq!(r["status"]["code"], 403);
    assert_eq!(r["status"]["message"], "name \"bad-pv\" is not allowed");
    let r = ask("err-pv").await;
    assert_eq!(r["allowed"], true, "Ignore admits on a handler error: {r}");
    let warning = r["warnings"][0].as_str().unwrap_or_default();
    assert!(warning.contains("backend unavailable"), "{r}");
    let r = ask("panic-pv").await;
    assert_eq!(r["allowed"], true, "a panic is a failure too: {r}");
    assert!(
        r["warnings"][0]
            .as_str()
            .unwrap_or_default()
            .contains("panicked"),
        "{r}"
    );
    assert_eq!(
        ask("good-pv").await["allowed"],
        true,
        "still serving after a panic"
    );
    let mut m = String::new();
    prometheus_client::encoding::text::encode(&mut m, &registry)?;
    assert!(
        m.contains(r#"cloud_provider_webhook_rejection_total{webhook="namecheck"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(r#"cloud_provider_webhook_handler_failure_total{webhook="namecheck"} 2"#),
        "{m}"
    );
    Ok(())
}
