//! `kubectl explain` and strict field validation against kube-sim's OpenAPI v3 documents —
//! the real kubectl. Fails (never skips) when kubectl is missing.

#[path = "support/kubectl_cli.rs"]
mod kubectl_cli;

use ccm_kube_sim::{Config, KubeSim};
use kubectl_cli::Kubectl;

async fn sim() -> KubeSim {
    KubeSim::start(Config {
        tls: true,
        ..Config::default()
    })
    .await
    .expect("kube-sim")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_node_and_service_fields() {
    let sim = sim().await;
    let k = Kubectl::new(&sim, "explain", None);

    let out = k.stdout(&["explain", "node.spec.podCIDRs"]).await;
    assert!(out.contains("KIND:       Node"), "{out}");
    assert!(out.contains("FIELD: podCIDRs <[]string>"), "{out}");
    assert!(
        out.contains("podCIDRs represents the IP ranges assigned to the node"),
        "{out}"
    );

    let out = k.stdout(&["explain", "service.spec", "--recursive"]).await;
    for field in [
        "ports\t<[]ServicePort>",
        "targetPort\t<IntOrString>",
        "sessionAffinity\t<string>",
        "ipFamilyPolicy\t<string>",
        "internalTrafficPolicy\t<string>",
    ] {
        assert!(out.contains(field), "{field} missing from:\n{out}");
    }

    let out = k
        .stdout(&["explain", "deployments.spec.template.spec.containers.ports"])
        .await;
    assert!(out.contains("GROUP:      apps"), "{out}");
    assert!(out.contains("containerPort\t<integer> -required-"), "{out}");
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_validation_rejects_an_unknown_field() {
    let sim = sim().await;
    let k = Kubectl::new(&sim, "strict", None);
    let path = std::env::temp_dir().join(format!("kube-sim-strict-{}.yaml", std::process::id()));
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  ports:\n  - port: 80\n    bogus: 1\n",
    )
    .expect("manifest");
    let file = path.to_string_lossy().into_owned();

    let out = k.run(&["create", "-f", &file, "--validate=strict"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(r#"strict decoding error: unknown field "spec.ports[0].bogus""#),
        "{err}"
    );
    let got = k.run(&["get", "service", "web"]).await;
    assert!(!got.status.success(), "the invalid Service was stored");

    // `--validate=false` stores it as sent (the field is dropped by a real server's decoder,
    // kept here: see the README).
    k.stdout(&["create", "-f", &file, "--validate=false"]).await;
    let _ = std::fs::remove_file(&path);
    sim.shutdown().await;
}
