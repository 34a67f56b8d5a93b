//! `Config::threads`: kube-sim on threads of its own keeps serving while its caller's runtime
//! is busy, as a real API server in its own process does while its clients are; on the
//! caller's runtime it cannot.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use ccm_kube_sim::{Config, KubeSim};

/// A GET of `/version` over a plain socket, on a thread of its own; `None` when no answer
/// came within `timeout`.
fn version_from_another_thread(
    addr: SocketAddr,
    token: String,
    timeout: Duration,
) -> std::thread::JoinHandle<Option<String>> {
    std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).ok()?;
        s.set_read_timeout(Some(timeout)).ok()?;
        let req = format!(
            "GET /version HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
             Connection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes()).ok()?;
        let mut answer = String::new();
        s.read_to_string(&mut answer).ok()?;
        Some(answer)
    })
}

/// Blocks the caller's only runtime thread until the other thread's request ends.
fn ask_while_the_caller_is_blocked(sim: &KubeSim) -> Option<String> {
    version_from_another_thread(sim.addr(), sim.token().to_string(), Duration::from_secs(2))
        .join()
        .expect("the client thread")
}

#[tokio::test(flavor = "current_thread")]
async fn on_its_own_threads_it_answers_while_the_callers_runtime_is_blocked() {
    let sim = KubeSim::start(Config {
        threads: Some(1),
        ..Config::default()
    })
    .await
    .expect("kube-sim");
    let answer = ask_while_the_caller_is_blocked(&sim).expect("an answer");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // Dropped here, inside the caller's runtime: its own runtime must shut down without
    // blocking (a blocking drop panics in an async context).
}

#[tokio::test(flavor = "current_thread")]
async fn on_the_callers_runtime_it_waits_for_that_runtime() {
    let sim = KubeSim::start(Config::default()).await.expect("kube-sim");
    assert_eq!(ask_while_the_caller_is_blocked(&sim), None);
}
