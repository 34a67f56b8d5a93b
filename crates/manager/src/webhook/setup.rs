//! From the webhook flags to a running webhook server.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use anyhow::Context as _;
use parking_lot::RwLock;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use ccm_cloud::CloudProvider;

use super::{KNOWN, Webhook, WebhookMetrics, pvlabel, select};
use crate::options::{Validated, tls_min_version};
use crate::tls::{CertSource, TlsSettings};

/// Upstream's `--webhook-secure-port` default.
pub const DEFAULT_PORT: u16 = 10260;
/// Upstream's self-signed pair name for the webhook server.
pub const PAIR_NAME: &str = "cloud-controller-manager-webhook";
/// The feature gate upstream requires for the webhook server.
pub const GATE: &str = "CloudControllerManagerWebhook";

/// The webhook server's TLS: `--webhook-tls-*` files (reloaded on change), else a
/// self-signed pair kept in `--webhook-cert-dir` or in memory.
pub fn tls_settings(v: &Validated) -> anyhow::Result<TlsSettings> {
    let o = &v.options;
    let cert = match (&o.webhook_tls_cert_file, &o.webhook_tls_private_key_file) {
        (Some(cert), Some(key)) => CertSource::Files {
            cert: cert.into(),
            key: key.into(),
        },
        (None, None) => CertSource::SelfSigned {
            dir: o.webhook_cert_dir.as_ref().map(Into::into),
            pair: PAIR_NAME,
        },
        _ => anyhow::bail!(
            "--webhook-tls-cert-file and --webhook-tls-private-key-file must be given together"
        ),
    };
    Ok(TlsSettings {
        cert,
        client_ca_pem: None,
        min_version: tls_min_version(o.serving.tls_min_version.as_deref())
            .context("--tls-min-version: use VersionTLS12 or VersionTLS13")?,
        http2_max_streams: o.serving.http2_max_streams_per_connection,
    })
}

/// Starts the webhook server when upstream would: the gate is on, the port is not 0 and
/// `--webhooks` enables at least one webhook. The names are those of [`KNOWN`] (built here
/// from provider capabilities: `persistentvolumelabel` from [`CloudProvider::volumes`]) and of
/// the provider's own [`CloudProvider::webhooks`] plus `extra` (supplied by the binary). An
/// unknown name, or a known one this provider cannot serve, is a startup error naming the flag.
pub async fn start(
    v: &Validated,
    provider: &Arc<dyn CloudProvider>,
    extra: &[Arc<dyn Webhook>],
    registry: &Arc<RwLock<Registry>>,
    shutdown: CancellationToken,
) -> anyhow::Result<Option<SocketAddr>> {
    let o = &v.options;
    let mut offered: Vec<Arc<dyn Webhook>> = provider.webhooks();
    offered.extend(extra.iter().cloned());
    let mut names: Vec<&str> = KNOWN.to_vec();
    names.extend(offered.iter().map(|w| w.name()));
    names.dedup();
    let enabled = select(&o.webhooks, &names).map_err(|e| anyhow::anyhow!(e))?;
    let port = o.webhook_secure_port.unwrap_or(DEFAULT_PORT);
    if enabled.is_empty() || port == 0 {
        return Ok(None);
    }
    if !v.gates.get(GATE).copied().unwrap_or(false) {
        tracing::warn!(
            "--webhooks enables {enabled:?} but the webhook server starts only with --feature-gates={GATE}=true (as upstream)"
        );
        return Ok(None);
    }
    let mut hooks = Vec::new();
    for name in &enabled {
        let hook = match offered.iter().find(|w| w.name() == name) {
            Some(hook) => hook.clone(),
            None if name == pvlabel::NAME && provider.volumes().is_some() => {
                let volumes = provider.volumes().expect("checked");
                Arc::new(pvlabel::PvLabeler::new(volumes)) as Arc<dyn Webhook>
            }
            None => anyhow::bail!(
                "--webhooks: {name:?} is not offered by cloud provider {:?}",
                o.cloud_provider
            ),
        };
        hooks.push(hook);
    }
    let metrics = WebhookMetrics::new(&mut registry.write());
    let bind = o
        .webhook_bind_address
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let local = super::serve(
        SocketAddr::new(bind, port),
        tls_settings(v)?,
        &hooks,
        &metrics,
        shutdown,
    )
    .await?;
    tracing::info!(%local, webhooks = ?enabled, "serving admission webhooks over HTTPS");
    Ok(Some(local))
}
