//! The moto AWS emulator as a child process on 127.0.0.1 with an ephemeral port.
//!
//! moto runs under a small Python wrapper that exits when its stdin closes, so a test binary
//! that dies (or ends with the server in a `static`) never leaves a server behind; `Drop` kills
//! it at once as well.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// A running moto server.
pub struct Moto {
    child: Child,
    _stdin: ChildStdin,
    /// Its working directory (the recorder's file).
    dir: PathBuf,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
}

const WRAPPER: &str = "import os, sys, threading\n\
def watch():\n    sys.stdin.read()\n    os._exit(0)\n\
threading.Thread(target=watch, daemon=True).start()\n\
from moto.server import main\n\
main(['-H', '127.0.0.1', '-p', '0'])\n";

fn moto_python() -> PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("moto_server"))
            .find(|c| c.is_file())
    });
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../.venv/bin/moto_server");
    let server = on_path
        .or_else(|| venv.is_file().then_some(venv))
        .unwrap_or_else(|| {
            panic!(
                "moto_server not found on PATH or in <workspace>/.venv/bin: run .ci/run (or \
             `CCM_VENV=$PWD/.venv bash -c 'source .ci/setup.d/30-moto.sh'`) to install moto"
            )
        });
    // moto_server is a console script of the venv; its python sits beside it.
    server.with_file_name("python")
}

impl Moto {
    /// Starts a server of its own (for tests that read moto's call recorder).
    pub fn start() -> Moto {
        Self::start_with_env(&[])
    }

    /// Starts a server of its own with extra environment, e.g. moto's IAM enforcement
    /// (`INITIAL_NO_AUTH_ACTION_COUNT`).
    pub fn start_with_env(env: &[(&str, &str)]) -> Moto {
        let python = moto_python();
        // The recorder writes `moto_recording` into the working directory: one of its own, so
        // servers running at the same time (other test binaries, a measurement) don't share it.
        static SERVERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = SERVERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ccm-moto-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("moto working directory");
        let mut child = Command::new(&python)
            .args(["-c", WRAPPER])
            .envs(env.iter().copied())
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting moto with {}: {e}", python.display()));
        let stdin = child.stdin.take().expect("piped stdin");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(port) = line.split("Running on http://127.0.0.1:").nth(1)
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(port.trim().to_string());
                }
                // Keep draining so moto never blocks on a full pipe.
            }
        });
        let port = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("moto did not report its port within 60s");
        Moto {
            child,
            _stdin: stdin,
            dir,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    /// The server shared by the tests of this binary (each test takes its own region).
    pub fn shared() -> &'static Moto {
        static SHARED: OnceLock<Moto> = OnceLock::new();
        SHARED.get_or_init(Moto::start)
    }

    /// Clears moto's call recorder and starts recording.
    pub async fn start_recording(&self) {
        let c = reqwest_like::Client;
        c.post(&format!("{}/moto-api/recorder/reset-recording", self.url))
            .await;
        c.post(&format!("{}/moto-api/recorder/start-recording", self.url))
            .await;
    }

    /// Calls recorded since [`Moto::start_recording`], by AWS action.
    pub async fn recorded(&self) -> std::collections::BTreeMap<String, u64> {
        let mut out = std::collections::BTreeMap::new();
        for (action, _) in self.recorded_calls().await {
            *out.entry(action).or_default() += 1;
        }
        out
    }

    /// Calls recorded since [`Moto::start_recording`] in the order moto saw them: the AWS
    /// action and the decoded form body (its parameters: ids, filters).
    pub async fn recorded_calls(&self) -> Vec<(String, String)> {
        let c = reqwest_like::Client;
        let body = c
            .get(&format!(
                "{}/moto-api/recorder/download-recording",
                self.url
            ))
            .await;
        let mut out = Vec::new();
        // Records written by moto's threads can share a line: read a stream of JSON values.
        for v in serde_json::Deserializer::from_str(&body).into_iter::<serde_json::Value>() {
            let v = v.expect("recorder entries are JSON");
            // moto stores request bodies base64-encoded ("body_encoded": "True").
            let raw = v["body"].as_str().unwrap_or_default();
            let body = if v["body_encoded"].as_str() == Some("True") || v["body_encoded"] == true {
                use base64::Engine as _;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(raw)
                    .expect("recorder body is base64");
                String::from_utf8_lossy(&bytes).to_string()
            } else {
                raw.to_string()
            };
            let action = body
                .split('&')
                .find_map(|kv| kv.strip_prefix("Action="))
                .expect("every recorded AWS call names its Action")
                .to_string();
            out.push((action, body));
        }
        out
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A minimal HTTP/1.1 client for moto's control API (plain HTTP on loopback).
mod reqwest_like {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    pub struct Client;

    impl Client {
        async fn send(&self, method: &str, url: &str) -> String {
            let rest = url.strip_prefix("http://").expect("http URL");
            let (host, path) = rest.split_once('/').expect("path");
            let mut s = tokio::net::TcpStream::connect(host)
                .await
                .expect("connect to moto");
            let req = format!(
                "{method} /{path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            s.write_all(req.as_bytes()).await.expect("write");
            let mut buf = Vec::new();
            s.read_to_end(&mut buf).await.expect("read");
            let text = String::from_utf8_lossy(&buf).to_string();
            let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
            assert!(
                head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"),
                "{method} {url}: {head}"
            );
            body.to_string()
        }

        pub async fn post(&self, url: &str) -> String {
            self.send("POST", url).await
        }

        pub async fn get(&self, url: &str) -> String {
            self.send("GET", url).await
        }
    }
}
