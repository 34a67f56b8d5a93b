//! `use-clouds = true`: fill the `[Global]` keys the cloud.conf leaves empty from an entry of
//! clouds.yaml, as upstream (gophercloud's clientconfig) does. The file is `clouds-file`, else
//! `$OS_CLIENT_CONFIG_FILE`, else the first of `./clouds.yaml`,
//! `~/.config/openstack/clouds.yaml`, `/etc/openstack/clouds.yaml` that exists; the entry is
//! `cloud`, else `$OS_CLOUD`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use ccm_cloud::ConfigError;
use serde::Deserialize;

use crate::config::GlobalOpts;
use crate::secret::Secret;

#[derive(Deserialize)]
struct File {
    clouds: BTreeMap<String, Cloud>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Cloud {
    auth: Auth,
    region_name: String,
    endpoint_type: String,
    interface: String,
    cacert: String,
    cert: String,
    key: String,
    verify: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Auth {
    auth_url: String,
    user_id: String,
    username: String,
    password: String,
    project_id: String,
    project_name: String,
    domain_id: String,
    domain_name: String,
    project_domain_id: String,
    project_domain_name: String,
    user_domain_id: String,
    user_domain_name: String,
    application_credential_id: String,
    application_credential_name: String,
    application_credential_secret: String,
}

fn candidates(g: &GlobalOpts) -> Vec<PathBuf> {
    if let Some(f) = &g.clouds_file {
        return vec![f.clone()];
    }
    if let Some(f) = std::env::var_os("OS_CLIENT_CONFIG_FILE") {
        return vec![PathBuf::from(f)];
    }
    let mut out = vec![PathBuf::from("clouds.yaml")];
    if let Some(home) = std::env::var_os("HOME") {
        out.push(PathBuf::from(home).join(".config/openstack/clouds.yaml"));
    }
    out.push(PathBuf::from("/etc/openstack/clouds.yaml"));
    out
}

fn fill(into: &mut String, from: String) {
    if into.is_empty() {
        *into = from;
    }
}

fn fill_secret(into: &mut Secret, from: String) {
    if into.is_empty() {
        *into = Secret::new(from);
    }
}

fn fill_path(into: &mut Option<PathBuf>, from: String) {
    if into.is_none() && !from.is_empty() {
        *into = Some(PathBuf::from(from));
    }
}

/// A YAML error without the values it quotes: a mis-indented `password:` makes the parser
/// quote the password (`invalid type: string "…"`), and the error reaches the log.
fn redact_quoted(msg: &str) -> String {
    match (msg.find('"'), msg.rfind('"')) {
        (Some(a), Some(b)) if b > a => format!("{}\"<redacted>\"{}", &msg[..a], &msg[b + 1..]),
        _ => msg.to_string(),
    }
}

/// Merges the clouds.yaml entry into `g`; what the cloud.conf sets wins.
pub fn merge(g: &mut GlobalOpts) -> Result<(), ConfigError> {
    let tried = candidates(g);
    let Some(path) = tried.iter().find(|p| p.is_file()) else {
        return Err(ConfigError::field(
            "[Global] use-clouds",
            format!(
                "no clouds.yaml found (looked at {}); set clouds-file",
                tried
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    };
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::general(format!("cannot read it: {e}")).in_file(file.clone()))?;
    let parsed: File = serde_yaml_ng::from_str(&text).map_err(|e| {
        ConfigError::general(format!(
            "not a clouds.yaml: {}",
            redact_quoted(&e.to_string())
        ))
        .in_file(file.clone())
    })?;
    let name = if g.cloud.is_empty() {
        std::env::var("OS_CLOUD").unwrap_or_default()
    } else {
        g.cloud.clone()
    };
    if name.is_empty() {
        return Err(ConfigError::field(
            "[Global] cloud",
            format!("use-clouds needs the entry of {file} to use: set cloud (or $OS_CLOUD)"),
        ));
    }
    let Some(mut c) = parsed
        .clouds
        .into_iter()
        .find(|(k, _)| *k == name)
        .map(|(_, c)| c)
    else {
        return Err(ConfigError::field(
            "[Global] cloud",
            format!("{file} has no cloud named {name:?}"),
        ));
    };
    let a = std::mem::take(&mut c.auth);
    fill(&mut g.auth_url, a.auth_url);
    fill(&mut g.user_id, a.user_id);
    fill(&mut g.username, a.username);
    fill_secret(&mut g.password, a.password);
    fill(&mut g.tenant_id, a.project_id);
    fill(&mut g.tenant_name, a.project_name);
    fill(&mut g.domain_id, a.domain_id);
    fill(&mut g.domain_name, a.domain_name);
    fill(&mut g.tenant_domain_id, a.project_domain_id);
    fill(&mut g.tenant_domain_name, a.project_domain_name);
    fill(&mut g.user_domain_id, a.user_domain_id);
    fill(&mut g.user_domain_name, a.user_domain_name);
    fill(
        &mut g.application_credential_id,
        a.application_credential_id,
    );
    fill(
        &mut g.application_credential_name,
        a.application_credential_name,
    );
    fill_secret(
        &mut g.application_credential_secret,
        a.application_credential_secret,
    );
    fill(&mut g.region, c.region_name);
    fill(&mut g.endpoint_type, c.endpoint_type);
    fill(&mut g.endpoint_type, c.interface);
    fill_path(&mut g.ca_file, c.cacert);
    fill_path(&mut g.cert_file, c.cert);
    fill_path(&mut g.key_file, c.key);
    if c.verify == Some(false) {
        g.tls_insecure = true;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the `openstack_clouds_yaml` fuzz target: a mis-indented `password:` used to
    /// be quoted in the YAML error.
    #[test]
    fn a_malformed_clouds_yaml_never_quotes_its_values() {
        let dir = std::env::temp_dir().join(format!("ccm-os-clouds-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("clouds.yaml");
        std::fs::write(&path, "clouds:\n  password: hunter2-secret\n").expect("write");
        let mut g = GlobalOpts {
            use_clouds: true,
            clouds_file: Some(path),
            cloud: "prod".into(),
            ..Default::default()
        };
        let e = merge(&mut g).expect_err("not a clouds.yaml").to_string();
        assert!(!e.contains("hunter2"), "{e}");
        assert!(e.contains("not a clouds.yaml"), "{e}");
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn the_cloud_conf_wins_and_clouds_yaml_fills_the_rest() {
        let dir = std::env::temp_dir().join(format!("ccm-os-clouds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("clouds.yaml");
        std::fs::write(
            &path,
            "clouds:\n  prod:\n    auth:\n      auth_url: https://ks:5000/v3\n      username: from-yaml\n      password: yaml-pw\n      project_name: k8s\n      user_domain_name: Default\n    region_name: RegionTwo\n    interface: internal\n",
        )
        .expect("write");
        let mut g = GlobalOpts {
            use_clouds: true,
            clouds_file: Some(path.clone()),
            cloud: "prod".into(),
            username: "from-conf".into(),
            ..Default::default()
        };
        merge(&mut g).expect("merges");
        assert_eq!(g.username, "from-conf");
        assert_eq!(g.password.expose(), "yaml-pw");
        assert_eq!(g.auth_url, "https://ks:5000/v3");
        assert_eq!(g.region, "RegionTwo");
        assert_eq!(g.endpoint_type, "internal");

        let mut g = GlobalOpts {
            use_clouds: true,
            clouds_file: Some(path),
            cloud: "staging".into(),
            ..Default::default()
        };
        let e = merge(&mut g).expect_err("no such cloud");
        assert!(e.to_string().contains("\"staging\""), "{e}");
        std::fs::remove_dir_all(dir).ok();
    }
}
