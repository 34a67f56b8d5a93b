//! The provider against a real Keystone (the PyPI release, in <workspace>/.venv-openstack,
//! installed by .ci/setup.d/60-openstack.sh) started on 127.0.0.1: password, application
//! credential and trust authentication, the catalog by region and interface, renewal before
//! expiry, a revoked token replaced on the service's 401, a wrong password an error that does
//! not carry it, and a catalog without compute an error for every Node, never "gone".

mod support;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_cloud::{CloudError, Instances};
use ccm_provider_openstack::{OpenStackCloud, OpenStackConfig};
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use kube::api::ObjectMeta;

/// Token lifetime Keystone is configured with: short, so renewal is seen within the test.
const LIFETIME_SECS: u64 = 8;

fn venv() -> PathBuf {
    let v = std::env::var_os("CCM_OPENSTACK_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../.venv-openstack")
        });
    assert!(
        v.join("bin/keystone-manage").is_file(),
        "Keystone is not installed in {}: run .ci/run (or `bash .ci/setup.d/60-openstack.sh` with CCM_VENV set)",
        v.display()
    );
    v
}

/// gunicorn serving Keystone, in a wrapper that exits when its stdin closes: a test binary that
/// dies never leaves a server behind.
const WRAPPER: &str = "import os, sys, threading\n\
def watch():\n    sys.stdin.read()\n    os._exit(0)\n\
threading.Thread(target=watch, daemon=True).start()\n\
from gunicorn.app.wsgiapp import run\n\
sys.argv = ['gunicorn'] + sys.argv[1:]\n\
run()\n";

struct Keystone {
    child: Child,
    _stdin: ChildStdin,
    url: String,
    dir: PathBuf,
    ids: std::collections::HashMap<String, String>,
}

impl Drop for Keystone {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_keystone() -> Keystone {
    let venv = venv();
    let port = support::free_ports(1);
    let dir = std::env::temp_dir().join(format!("ccm-keystone-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testenv/keystone.sh");
    let t0 = Instant::now();
    let st = Command::new("bash")
        .arg(&script)
        .arg(&dir)
        .arg(port.to_string())
        .arg(&venv)
        .arg(LIFETIME_SECS.to_string())
        .status()
        .expect("keystone.sh");
    assert!(
        st.success(),
        "keystone.sh failed; see {}/keystone-manage.log",
        dir.display()
    );
    let mut child = Command::new(venv.join("bin/python"))
        .args(["-c", WRAPPER, "--chdir"])
        .arg(&dir)
        .args([
            "-w",
            "1",
            "-b",
            &format!("127.0.0.1:{port}"),
            "ks_wsgi:application",
        ])
        .env("OS_KEYSTONE_CONFIG_FILES", dir.join("keystone.conf"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(dir.join("gunicorn.log")).expect("log"),
        ))
        .spawn()
        .expect("gunicorn");
    let stdin = child.stdin.take().expect("stdin");
    let url = format!("http://127.0.0.1:{port}/v3");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "Keystone did not listen within 60 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let ids_file = dir.join("ids.env");
    let st = Command::new(venv.join("bin/python"))
        .arg(dir.join("populate.py"))
        .arg(&url)
        .arg(&ids_file)
        .status()
        .expect("populate.py");
    assert!(st.success(), "populating Keystone failed");
    let mut text = String::new();
    std::fs::File::open(&ids_file)
        .and_then(|mut f| f.read_to_string(&mut text))
        .expect("ids");
    let ids = text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    eprintln!("Keystone ready in {:?}", t0.elapsed());
    Keystone {
        child,
        _stdin: stdin,
        url,
        dir,
        ids,
    }
}

fn cloud(conf: &str) -> OpenStackCloud {
    let cfg = OpenStackConfig::parse(conf).expect("cloud.conf parses");
    cfg.validate().expect("valid");
    OpenStackCloud::with_regional_provider_id(cfg, false).expect("provider")
}

fn auths(c: &OpenStackCloud) -> u64 {
    c.api_calls()
        .get("identity POST /auth/tokens")
        .copied()
        .unwrap_or(0)
}

fn node(name: &str, provider_id: Option<&str>) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: provider_id.map(Into::into),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn keystone_auth_catalog_renewal_and_errors() {
    let ks = tokio::task::spawn_blocking(start_keystone)
        .await
        .expect("start");
    let url = &ks.url;

    // Password, project by name in the default domain; catalog region and interface.
    let password = format!(
        "[Global]\nauth-url = {url}\nusername = ccm\npassword = ccm-secret\ntenant-name = ccm\ndomain-id = default\nregion = RegionOne\n"
    );
    let c = cloud(&password);
    let (_, identity) = c
        .keystone()
        .endpoint("identity")
        .await
        .expect("password auth");
    assert_eq!(identity, *url, "public interface of RegionOne");
    let c_internal = cloud(&format!("{password}os-endpoint-type = internalURL\n"));
    let (_, internal) = c_internal
        .keystone()
        .endpoint("identity")
        .await
        .expect("auth");
    assert!(
        internal.starts_with("http://localhost:"),
        "internal endpoint: {internal}"
    );

    // A request with the token works; one authentication serves many requests.
    for _ in 0..3 {
        let r = c
            .keystone()
            .request(
                "identity",
                "identity GET /auth/projects",
                http::Method::GET,
                "/auth/projects",
                &[],
                None,
            )
            .await
            .expect("request");
        assert_eq!(r.status.as_u16(), 200);
    }
    assert_eq!(auths(&c), 1);

    // Renewal: past half the token's life, the next call authenticates again first.
    tokio::time::sleep(Duration::from_secs(LIFETIME_SECS / 2 + 1)).await;
    c.keystone().endpoint("identity").await.expect("renewed");
    assert_eq!(auths(&c), 2, "renewed before expiry");

    // A revoked token: the service's 401 makes the provider authenticate again and retry.
    let (token, _) = c.keystone().endpoint("identity").await.expect("token");
    let admin = cloud(&format!(
        "[Global]\nauth-url = {url}\nusername = admin\npassword = admin-secret\ntenant-name = admin\ndomain-id = default\n"
    ));
    let r = admin
        .keystone()
        .request(
            "identity",
            "identity DELETE /auth/tokens",
            http::Method::DELETE,
            "/auth/tokens",
            &[("x-subject-token", token.expose())],
            None,
        )
        .await
        .expect("revoke");
    assert_eq!(r.status.as_u16(), 204, "token revoked");
    let before = auths(&c);
    let r = c
        .keystone()
        .request(
            "identity",
            "identity GET /auth/projects",
            http::Method::GET,
            "/auth/projects",
            &[],
            None,
        )
        .await
        .expect("request after revocation");
    assert_eq!(r.status.as_u16(), 200, "retried with a new token");
    assert_eq!(auths(&c), before + 1);

    // Application credential by id, by name with its user; a trust.
    let app_id = &ks.ids["KS_APP_CRED_ID"];
    let app_secret = &ks.ids["KS_APP_CRED_SECRET"];
    let c = cloud(&format!(
        "[Global]\nauth-url = {url}\napplication-credential-id = {app_id}\napplication-credential-secret = {app_secret}\n"
    ));
    c.keystone()
        .endpoint("identity")
        .await
        .expect("application credential by id");
    let c = cloud(&format!(
        "[Global]\nauth-url = {url}\napplication-credential-name = ccm-rs\napplication-credential-secret = {app_secret}\nusername = ccm\nuser-domain-id = default\n"
    ));
    c.keystone()
        .endpoint("identity")
        .await
        .expect("application credential by name");
    let trust = &ks.ids["KS_TRUST_ID"];
    let user = &ks.ids["KS_CCM_USER_ID"];
    let c = cloud(&format!(
        "[Global]\nauth-url = {url}\ntrust-id = {trust}\ntrustee-id = {user}\ntrustee-password = ccm-secret\n"
    ));
    c.keystone().endpoint("identity").await.expect("trust");

    // A wrong secret: an error that names Keystone's refusal and never the secret.
    let c = cloud(&format!(
        "[Global]\nauth-url = {url}\nusername = ccm\npassword = hunter2-wrong\ntenant-name = ccm\ndomain-id = default\n"
    ));
    let e = c
        .keystone()
        .endpoint("identity")
        .await
        .expect_err("wrong password");
    let msg = e.to_string();
    assert!(matches!(e, CloudError::Permanent(_)), "{e:?}");
    assert!(msg.contains("HTTP 401"), "{msg}");
    assert!(!msg.contains("hunter2"), "the password leaked: {msg}");

    // This Keystone's catalog has no compute: the startup check says so, and Instances answers
    // errors for every Node — never "gone".
    let c = cloud(&password);
    let e = c.check().await.expect_err("no compute");
    assert!(e.to_string().contains("no compute endpoint"), "{e}");
    let nodes = [
        node(
            "a",
            Some("openstack:///0b9ad0f8-3c4e-4c1a-9d2e-2f4f1f5b6c7d"),
        ),
        node("b", None),
    ];
    for r in c.instances_status(&nodes.clone().map(Arc::new)).await {
        assert!(
            r.is_err(),
            "an unanswerable lookup must be an error, got {r:?}"
        );
    }
    assert!(c.instance_exists(&nodes[0]).await.is_err());

    // A Keystone that does not answer: transient errors, no "gone".
    drop(ks);
    let e = c.keystone().endpoint("compute").await;
    assert!(e.is_err());
    for r in c.instances_status(&nodes.clone().map(Arc::new)).await {
        assert!(r.is_err(), "{r:?}");
    }
}
