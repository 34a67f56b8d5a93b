//! The secure port as Prometheus and the kubelet meet it: HTTPS always, /healthz open, /metrics
//! behind delegated authentication (TokenReview, client certificates) and authorization
//! (SubjectAccessReview, decided by kube-sim's RBAC), certificates reloaded on rotation.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use ccm_kube_sim::{Config, KubeSim};
use ccm_manager::scrape::Scraper;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, PostParams};

mod support;
use support::{ccm_command, free_port, tmpdir};

/// Starts `ccm run` against `kube` (no controllers needed: the secure port is the subject).
fn spawn(kube: &KubeSim, dir: &Path, extra: &[String]) -> (tokio::process::Child, SocketAddr) {
    let (mut cmd, port) = ccm_command(env!("CARGO_BIN_EXE_ccm"), kube, dir);
    let child = cmd
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    (child, SocketAddr::from(([127, 0, 0, 1], port)))
}

async fn wait_scraper(make: impl Fn() -> anyhow::Result<Scraper>) -> Scraper {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(s) = make()
            && s.get("/livez").await.is_ok()
        {
            return s;
        }
        assert!(Instant::now() < deadline, "the secure port never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn status(s: &Scraper, path: &str) -> u16 {
    s.get(path).await.map(|r| r.0).expect("request")
}

async fn service_account(kube: &KubeSim, name: &str) -> String {
    let sas: Api<ServiceAccount> = Api::namespaced(kube.client().expect("client"), "kube-system");
    let sa: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).expect("sa");
    sas.create(&PostParams::default(), &sa)
        .await
        .expect("create sa");
    kube.service_account_token("kube-system", name)
        .expect("token")
}

async fn grant_metrics(kube: &KubeSim, sa: &str) {
    let client = kube.client().expect("client");
    let role: ClusterRole = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "metrics-reader"},
        "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}],
    }))
    .expect("role");
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("create role");
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "metrics-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "metrics-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": "kube-system"}],
    }))
    .expect("binding");
    Api::<ClusterRoleBinding>::all(client)
        .create(&PostParams::default(), &binding)
        .await
        .expect("create binding");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_answer_401_403_200_by_token_review_and_rbac() {
    let kube = KubeSim::start(Config {
        rbac: true,
        ..Config::default()
    })
    .await
    .expect("kube-sim");
    let allowed = service_account(&kube, "prometheus").await;
    let denied = service_account(&kube, "nosy").await;
    grant_metrics(&kube, "prometheus").await;

    let dir = tmpdir("authz");
    let certs = dir.join("certs");
    let (mut child, addr) = spawn(&kube, &dir, &[format!("--cert-dir={}", certs.display())]);
    let with = |token: Option<&str>| {
        let certs = certs.clone();
        let token = token.map(String::from);
        move || Scraper::for_cert_dir(addr, &certs, token.clone())
    };
    let anonymous = wait_scraper(with(None)).await;
    assert_eq!(
        status(&anonymous, "/healthz").await,
        200,
        "kubelet probes need no credentials"
    );
    assert_eq!(status(&anonymous, "/livez").await, 200);
    assert_eq!(status(&anonymous, "/metrics").await, 401);
    assert_eq!(
        status(&wait_scraper(with(Some("not-a-token"))).await, "/metrics").await,
        401
    );

    let nosy = wait_scraper(with(Some(&denied))).await;
    let (code, body) = nosy.get("/metrics").await.expect("request");
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("system:serviceaccount:kube-system:nosy"),
        "{body}"
    );
    // Not always-allowed: a named health check needs authorization, as upstream.
    assert_eq!(status(&nosy, "/healthz/leaderElection").await, 403);

    let prometheus = wait_scraper(with(Some(&allowed))).await;
    let (code, metrics) = prometheus.get("/metrics").await.expect("request");
    assert_eq!(code, 200);
    assert!(metrics.contains("process_cpu_seconds_total"), "{metrics}");
    let admin = wait_scraper(with(Some(kube.token()))).await;
    assert_eq!(
        status(&admin, "/metrics").await,
        200,
        "system:masters needs no grant"
    );

    // Answers are cached (upstream's 10s TTLs): repeated scrapes add no reviews.
    let reviews = || {
        kube.count_requests(|k| {
            k.resource == "tokenreviews" || k.resource == "subjectaccessreviews"
        })
    };
    let before = reviews();
    for _ in 0..5 {
        assert_eq!(status(&prometheus, "/metrics").await, 200);
        assert_eq!(status(&nosy, "/metrics").await, 403);
    }
    assert_eq!(
        reviews(),
        before,
        "cached answers must not call the API server"
    );
    assert!(
        before >= 4,
        "TokenReview and SubjectAccessReview were used ({before})"
    );
    let _ = child.kill().await;
}

/// A CA and a client certificate for `cn` in group `org`, as PEM (ca, cert, key).
fn client_cert(cn: &str, org: &str) -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate().expect("key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "client-ca");
    let ca_cert = ca.self_signed(&ca_key).expect("ca");
    let key = KeyPair::generate().expect("key");
    let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
    p.distinguished_name.push(DnType::CommonName, cn);
    p.distinguished_name.push(DnType::OrganizationName, org);
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = p.signed_by(&key, &ca_cert, &ca_key).expect("sign");
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_from_client_ca_file_authenticate() {
    let kube = KubeSim::start(Config {
        rbac: true,
        ..Config::default()
    })
    .await
    .expect("kube-sim");
    let dir = tmpdir("clientca");
    let (ca, admin_cert, admin_key) = client_cert("ops", "system:masters");
    let ca_file = dir.join("client-ca.crt");
    std::fs::write(&ca_file, &ca).expect("write");
    let certs = dir.join("certs");
    let (mut child, addr) = spawn(
        &kube,
        &dir,
        &[
            format!("--cert-dir={}", certs.display()),
            format!("--client-ca-file={}", ca_file.display()),
        ],
    );
    let server_ca = || std::fs::read(certs.join("cloud-controller-manager.crt"));
    let ops = wait_scraper(|| {
        Scraper::with_client_cert(
            addr,
            &server_ca()?,
            admin_cert.as_bytes(),
            admin_key.as_bytes(),
        )
    })
    .await;
    assert_eq!(
        status(&ops, "/metrics").await,
        200,
        "CN=ops O=system:masters"
    );

    // A certificate from another CA is not an identity.
    let (_, stranger_cert, stranger_key) = client_cert("eve", "system:masters");
    let eve = Scraper::with_client_cert(
        addr,
        &server_ca().expect("ca"),
        stranger_cert.as_bytes(),
        stranger_key.as_bytes(),
    )
    .expect("scraper");
    assert!(
        !matches!(eve.get("/metrics").await, Ok((200, _))),
        "a foreign client certificate must not be accepted"
    );
    let _ = child.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_cert_files_are_reloaded_when_they_change() {
    let kube = KubeSim::start(Config::default()).await.expect("kube-sim");
    let dir = tmpdir("reload");
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    let ip = "127.0.0.1".parse().expect("ip");
    let (first_cert, first_key) = ccm_manager::tls::self_signed(ip).expect("cert");
    std::fs::write(&cert, &first_cert).expect("write");
    std::fs::write(&key, &first_key).expect("write");
    let (mut child, addr) = spawn(
        &kube,
        &dir,
        &[
            format!("--tls-cert-file={}", cert.display()),
            format!("--tls-private-key-file={}", key.display()),
        ],
    );
    let token = Some(kube.token().to_string());
    let first = wait_scraper(|| Scraper::new(addr, first_cert.as_bytes(), token.clone())).await;
    assert_eq!(status(&first, "/metrics").await, 200);

    let (second_cert, second_key) = ccm_manager::tls::self_signed(ip).expect("cert");
    std::fs::write(&key, &second_key).expect("write");
    std::fs::write(&cert, &second_cert).expect("write");
    let second = Scraper::new(addr, second_cert.as_bytes(), token.clone()).expect("scraper");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(second.get("/metrics").await, Ok((200, _))) {
        assert!(
            Instant::now() < deadline,
            "the new certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A fresh client (no TLS session to resume) that trusts only the old CA is refused.
    let old = Scraper::new(addr, first_cert.as_bytes(), token).expect("scraper");
    assert!(
        old.get("/metrics").await.is_err(),
        "the old certificate is still served"
    );
    let _ = child.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_authentication_kubeconfig_is_a_startup_error_naming_the_flag() {
    let kube = KubeSim::start(Config::default()).await.expect("kube-sim");
    let dir = tmpdir("badkc");
    let (child, _) = spawn(
        &kube,
        &dir,
        &["--authentication-kubeconfig=/nonexistent/ccm.conf".to_string()],
    );
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("exits")
        .expect("output");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--authentication-kubeconfig /nonexistent/ccm.conf"),
        "{err}"
    );
}

/// The "Done when" of issue 12: a typical upstream CCM manifest's argument list (kubeadm/kOps
/// style: separate authn/authz kubeconfigs, always-allow paths, cert dir, webhook port, leader
/// migration) starts the real binary unchanged — only paths and the port point at this test.
/// It leads (both the main and the leader-migration lease) and serves HTTPS with delegated auth.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_manifests_arguments_start_the_binary_unchanged() {
    let kube = KubeSim::start(Config {
        rbac: true,
        ..Config::default()
    })
    .await
    .expect("kube-sim");
    let dir = tmpdir("upstream-args");
    let kubeconfig = dir.join("cloud-controller-manager.conf");
    kube.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let certs = dir.join("certs");
    let port = free_port();
    let k = kubeconfig.display();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ccm"))
        .args([
            "--cloud-provider=sim".to_string(),
            format!("--authentication-kubeconfig={k}"),
            format!("--authorization-kubeconfig={k}"),
            "--authorization-always-allow-paths=/healthz,/readyz,/livez".into(),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", certs.display()),
            "--webhook-secure-port=0".into(),
            "--enable-leader-migration".into(),
            "--leader-elect=true".into(),
            "--use-service-account-credentials=false".into(),
            "--configure-cloud-routes=false".into(),
            "--cluster-name=kubernetes".into(),
            format!("--kubeconfig={k}"),
            "--profiling=false".into(),
            "--v=2".into(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let certs2 = certs.clone();
    let anonymous = wait_scraper(move || Scraper::for_cert_dir(addr, &certs2, None)).await;
    assert_eq!(status(&anonymous, "/livez").await, 200);
    assert_eq!(status(&anonymous, "/metrics").await, 401);
    let admin =
        Scraper::for_cert_dir(addr, &certs, Some(kube.token().to_string())).expect("scraper");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (code, body) = admin.get("/metrics").await.expect("metrics");
        assert_eq!(code, 200, "{body}");
        // --enable-leader-migration without a file: upstream's default migration lease, free
        // here, so this process holds both.
        if body.contains(r#"leader_election_master_status{name="cloud-controller-manager"} 1"#)
            && body.contains(
                r#"leader_election_master_status{name="cloud-provider-extraction-migration"} 1"#,
            )
        {
            break;
        }
        assert!(Instant::now() < deadline, "never became leader:\n{body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Ready once its informers synced and controllers started; probes need no credentials.
    while status(&anonymous, "/readyz").await != 200 {
        assert!(Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = child.start_kill();
    let out = child.wait_with_output().await.expect("output");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("leader migration: became leader of the migration lease"),
        "leader migration not in effect:\n{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
