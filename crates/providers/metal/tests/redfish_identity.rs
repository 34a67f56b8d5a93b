//! Which System is the machine's, and when a BMC's answer means "gone": sushy-tools with System
//! ids that are not the node names (its fake driver serves every System at its UUID, as an
//! iDRAC serves `System.Embedded.1`), and the hand-written fake BMC (tests/support/fake_bmc.rs)
//! for the failures, redirects and sessions sushy-tools cannot produce.

mod support;

use std::time::Duration;

use ccm_provider_metal::MetalConfig;
use ccm_provider_metal::config::BmcConfig;
use ccm_provider_metal::redfish::{BmcError, Lookup, Power, Redfish};
use support::fake_bmc::{FakeBmc, FakeSystem};
use support::*;

const U1: &str = "1a1a1a1a-0000-4000-8000-00000000001a";
const U2: &str = "2b2b2b2b-0000-4000-8000-00000000002b";

fn bmc(endpoint: &str, extra: &str) -> BmcConfig {
    MetalConfig::parse(&format!(
        "[[machines]]\nname = \"node-a\"\n[machines.bmc]\nendpoint = \"{endpoint}\"\n{extra}"
    ))
    .expect("config")
    .machine("node-a")
    .and_then(|m| m.bmc.clone())
    .expect("bmc")
}

fn failed(r: Result<Power, BmcError>) -> String {
    match r {
        Err(BmcError::Failed { message, .. }) => message,
        other => panic!("expected an error that keeps the Node, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_system_is_found_in_the_collection_never_guessed_from_the_node_name() {
    // One BMC, one System whose name is iDRAC's and whose id is its UUID: a default config
    // (no `system`) finds it as the collection's only member.
    let single = Sushy::start(&[("System.Embedded.1", U1, "On")]);
    let redfish = Redfish::new(4, Duration::from_secs(5));
    assert_eq!(
        redfish.power(&bmc(&single.endpoint, ""), "node-a").await,
        Ok(Power::On),
        "the only member of the Systems collection is the machine's System"
    );

    // Two Systems: the config must say which; without it, an error naming both — never "gone".
    let multi = Sushy::start(&[
        ("System.Embedded.1", U1, "On"),
        ("System.Embedded.2", U2, "Off"),
    ]);
    let guessed = failed(redfish.power(&bmc(&multi.endpoint, ""), "node-a").await);
    assert!(guessed.contains(U1) && guessed.contains(U2), "{guessed}");
    assert_eq!(
        redfish
            .power(
                &bmc(&multi.endpoint, &format!("system = \"{U2}\"\n")),
                "node-a"
            )
            .await,
        Ok(Power::Off)
    );
    assert_eq!(
        redfish
            .power(
                &bmc(
                    &multi.endpoint,
                    &format!("system_uuid = \"{}\"\n", U2.to_uppercase())
                ),
                "node-a"
            )
            .await,
        Ok(Power::Off),
        "matched by UUID, case-insensitively"
    );
    // A name the collection does not list (sushy would redirect it): first contact is an
    // error naming what the BMC offers, so a typo can never delete a Node.
    let typo = failed(
        redfish
            .power(
                &bmc(&multi.endpoint, "system = \"System.Embedded.1\"\n"),
                "node-a",
            )
            .await,
    );
    assert!(
        typo.contains("System.Embedded.1") && typo.contains(U2),
        "{typo}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gone_only_when_root_and_collection_answer_without_the_system() {
    let mut sushy = Sushy::start(&[
        ("System.Embedded.1", U1, "On"),
        ("System.Embedded.2", U2, "On"),
    ]);
    let redfish = Redfish::new(4, Duration::from_secs(5));
    let config = bmc(&sushy.endpoint, &format!("system = \"{U2}\"\n"));
    assert_eq!(redfish.power(&config, "node-a").await, Ok(Power::On));
    // The machine is removed from the BMC; root and collection still answer.
    sushy.restart(&[("System.Embedded.1", U1, "On")]);
    match redfish.lookup(&config, "node-a", None).await {
        Ok(Lookup::Gone { offered }) => assert_eq!(offered, vec![U1.to_string()]),
        other => panic!("the BMC answered without the System: gone, got {other:?}"),
    }
    drop(sushy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_404_on_the_system_path_401_and_5xx_keep_the_node() {
    let fake = FakeBmc::start(vec![FakeSystem::new("1", U1, "SN-1", "On")]).await;
    let redfish = Redfish::new(4, Duration::from_secs(5));
    let config = bmc(&fake.endpoint, "system_serial = \"SN-1\"\n");
    assert_eq!(redfish.power(&config, "node-a").await, Ok(Power::On));

    // The System path 404s and so does the service root (a BMC rebooting into a web UI that
    // answers 404 for everything): an error, not "gone".
    fake.state
        .lock()
        .fail
        .insert("/redfish/v1/Systems/1".into(), 404);
    fake.state.lock().fail.insert("/redfish/v1/".into(), 404);
    let msg = failed(redfish.power(&config, "node-a").await);
    assert!(msg.contains("/redfish/v1/") && msg.contains("404"), "{msg}");
    // Root answers, the collection 503s.
    fake.state.lock().fail.remove("/redfish/v1/");
    fake.state
        .lock()
        .fail
        .insert("/redfish/v1/Systems".into(), 503);
    let msg = failed(redfish.power(&config, "node-a").await);
    assert!(msg.contains("503"), "{msg}");
    // With no selector, a collection that lists nothing (a booting BMC) is not "gone" either.
    fake.state.lock().fail.clear();
    let only = bmc(&fake.endpoint, "");
    assert_eq!(redfish.power(&only, "node-a").await, Ok(Power::On));
    let systems = std::mem::take(&mut fake.state.lock().systems);
    let msg = failed(redfish.power(&only, "node-a").await);
    assert!(msg.contains("0 Systems"), "{msg}");
    fake.state.lock().systems = systems;
    // Credentials refused.
    fake.state.lock().fail.clear();
    fake.state.lock().basic = Some(("ccm".into(), "other".into()));
    let msg = failed(redfish.power(&config, "node-a").await);
    assert!(msg.contains("401"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_never_follow_a_redirect_to_another_origin() {
    let other = FakeBmc::start(vec![FakeSystem::new("1", U1, "SN-1", "On")]).await;
    let fake = FakeBmc::start(vec![FakeSystem::new("1", U1, "SN-1", "On")]).await;
    fake.state.lock().basic = Some(("ccm".into(), "s3cret".into()));
    fake.state.lock().redirect.insert(
        "/redfish/v1/Systems/1".into(),
        format!("{}/redfish/v1/Systems/1", other.endpoint),
    );
    let dir = TempDir::new("redirect");
    let pw = dir.0.join("password");
    std::fs::write(&pw, "s3cret\n").expect("password file");
    let config = bmc(
        &fake.endpoint,
        &format!("username = \"ccm\"\npassword_file = \"{}\"\n", pw.display()),
    );
    let redfish = Redfish::new(4, Duration::from_secs(5));
    assert_eq!(redfish.power(&config, "node-a").await, Ok(Power::On));
    let at_other = other.seen();
    assert!(!at_other.is_empty(), "the redirect was followed");
    assert!(
        at_other
            .iter()
            .all(|s| s.authorization.is_none() && s.token.is_none()),
        "credentials went to another origin: {at_other:?}"
    );
    assert!(
        fake.seen().iter().all(|s| s.authorization.is_some()),
        "the BMC itself gets the credentials"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redfish_sessions_log_in_once_and_again_when_the_token_expires() {
    let fake = FakeBmc::start(vec![FakeSystem::new(
        "System.Embedded.1",
        U1,
        "SN-1",
        "Off",
    )])
    .await;
    fake.state.lock().session = Some(("ccm".into(), "s3cret".into()));
    let dir = TempDir::new("session");
    let pw = dir.0.join("password");
    std::fs::write(&pw, "s3cret").expect("password file");
    let config = bmc(
        &fake.endpoint,
        &format!(
            "auth = \"session\"\nusername = \"ccm\"\npassword_file = \"{}\"\n",
            pw.display()
        ),
    );
    let redfish = Redfish::new(4, Duration::from_secs(5));
    for _ in 0..3 {
        assert_eq!(redfish.power(&config, "node-a").await, Ok(Power::Off));
    }
    assert_eq!(fake.state.lock().logins, 1, "one session, reused");
    let paths: Vec<String> = fake.seen().iter().map(|s| s.path.clone()).collect();
    assert_eq!(
        paths.len(),
        6,
        "login, root, collection, System at first contact, then one GET per lookup: {paths:?}"
    );
    assert!(
        fake.seen().iter().all(|s| s.authorization.is_none()),
        "no basic auth in session mode"
    );
    // The BMC drops its sessions (reboot, idle timeout): one new login, then the answer.
    fake.state.lock().tokens.clear();
    assert_eq!(redfish.power(&config, "node-a").await, Ok(Power::Off));
    assert_eq!(fake.state.lock().logins, 2);
    // A refused login is an error, never "gone".
    fake.state.lock().tokens.clear();
    fake.state.lock().session = Some(("ccm".into(), "rotated".into()));
    let msg = failed(redfish.power(&config, "node-a").await);
    assert!(msg.contains("401") && !msg.contains("s3cret"), "{msg}");
}
