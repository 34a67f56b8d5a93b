//! The BIRD 2 daemon as a supervised child: its config rendered from the announced set, its
//! control socket driven through `birdc`, its life bound to ccm-rs's (`setpriv --pdeathsig`,
//! so a crashed leader's sessions close with it and its routers start their restart timers).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use ipnet::IpNet;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use super::config::{BgpSettings, Community, Peer};
use super::vips::VipRoute;

/// Seconds a starting daemon waits for every session's End-of-RIB before announcing (BIRD's
/// `graceful restart wait`): bounds what an unreachable peer delays at a term's start.
pub const GR_RECOVERY_WAIT: u16 = 10;

/// How long one `birdc` command may take.
const BIRDC_TIMEOUT: Duration = Duration::from_secs(10);

/// The name of peer `i`'s BGP protocol in the daemon (`show protocols`).
pub(crate) fn protocol_name(i: usize) -> String {
    format!("ccm_peer{i}")
}

/// One BGP session as `show protocols` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Session {
    /// Index into the configured peers.
    pub peer: usize,
    /// `Established`, `Active`, `Connect`, `Idle`, ... (BIRD's BGP state).
    pub state: String,
    /// BIRD's last error, e.g. `Received: Bad peer AS`, `Socket: Connection refused`.
    pub info: String,
}

/// The daemon's files and binaries.
pub(crate) struct Bird {
    settings: BgpSettings,
    netns: Option<PathBuf>,
    bird: PathBuf,
    birdc: PathBuf,
}

impl Bird {
    pub(crate) fn new(settings: &BgpSettings, netns: Option<PathBuf>) -> Self {
        let bird = settings.bird.clone().unwrap_or_else(|| find("bird"));
        let birdc = settings.birdc.clone().unwrap_or_else(|| {
            bird.parent()
                .map(|d| d.join("birdc"))
                .filter(|p| p.exists())
                .unwrap_or_else(|| find("birdc"))
        });
        Bird {
            settings: settings.clone(),
            netns,
            bird,
            birdc,
        }
    }

    fn conf(&self) -> PathBuf {
        self.settings.run_dir.join("bird.conf")
    }

    fn socket(&self) -> PathBuf {
        self.settings.run_dir.join("bird.ctl")
    }

    /// Writes the daemon's config for `routes` (pod CIDR → next hop) and `vips` (LoadBalancer
    /// addresses → next hops), atomically, readable by the owner only.
    pub(crate) async fn write_config(
        &self,
        routes: &BTreeMap<IpNet, IpAddr>,
        vips: &BTreeMap<IpNet, VipRoute>,
    ) -> io::Result<()> {
        use tokio::io::AsyncWriteExt as _;
        tokio::fs::create_dir_all(&self.settings.run_dir).await?;
        let tmp = self.settings.run_dir.join("bird.conf.tmp");
        let _ = tokio::fs::remove_file(&tmp).await;
        // Owner-only: the file holds the peers' TCP MD5 passwords.
        let mut f = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .await?;
        f.write_all(render_all(&self.settings, routes, vips).as_bytes())
            .await?;
        f.sync_all().await?;
        drop(f);
        tokio::fs::rename(&tmp, self.conf()).await
    }

    /// Makes the running daemon read its config. An error when the daemon is down or refuses
    /// the file; the file stays, and a restarted daemon reads it.
    pub(crate) async fn configure(&self) -> Result<(), String> {
        let out = self.birdc(&["configure"]).await?;
        if out.contains("Reconfigured") || out.contains("Reconfiguration in progress") {
            Ok(())
        } else {
            Err(format!("bird refused the new config: {}", out.trim()))
        }
    }

    /// The sessions' states.
    pub(crate) async fn sessions(&self) -> Result<Vec<Session>, String> {
        Ok(parse_protocols(&self.birdc(&["show", "protocols"]).await?))
    }

    async fn birdc(&self, args: &[&str]) -> Result<String, String> {
        let run = Command::new(&self.birdc)
            .arg("-s")
            .arg(self.socket())
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(BIRDC_TIMEOUT, run)
            .await
            .map_err(|_| {
                format!(
                    "{} {}: no answer within {BIRDC_TIMEOUT:?}",
                    self.birdc.display(),
                    args.join(" ")
                )
            })?
            .map_err(|e| format!("{}: {e}", self.birdc.display()))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() || text.contains("Unable to connect") {
            return Err(format!(
                "bird control socket {}: {}{}",
                self.socket().display(),
                text.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(text)
    }

    /// Starts the daemon in the foreground, in `netns` if set, killed with ccm-rs.
    fn spawn(&self) -> io::Result<Child> {
        let mut cmd = Command::new("setpriv");
        cmd.args(["--pdeathsig", "KILL", "--"]);
        if let Some(ns) = &self.netns {
            cmd.arg("nsenter")
                .arg(format!("--net={}", ns.display()))
                .arg("--");
        }
        cmd.arg(&self.bird).arg("-f");
        if self.settings.graceful_restart.is_some() {
            // Graceful-restart recovery: the sessions' OPEN says the forwarding state was kept,
            // so the routers keep the previous leader's routes until this daemon's End-of-RIB
            // (without it they flush them the moment the session is up, before the new
            // announcements arrive).
            cmd.arg("-R");
        }
        cmd.arg("-c")
            .arg(self.conf())
            .arg("-s")
            .arg(self.socket())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("starting {} (through setpriv): {e}", self.bird.display()),
            )
        })?;
        if let Some(err) = child.stderr.take() {
            tokio::spawn(async move {
                let mut lines = BufReader::new(err).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::info!(target: "ccm_metal::bird", "{line}");
                }
            });
        }
        Ok(child)
    }

    /// Runs the daemon until `term` is cancelled, restarting it when it dies. `restarted`
    /// is called for each unplanned exit. On `term` the daemon is killed without withdrawing
    /// anything: with graceful restart the routers keep the routes for the next leader.
    pub(crate) async fn supervise(&self, term: CancellationToken, restarted: impl Fn(String)) {
        loop {
            let mut child = match self.spawn() {
                Ok(c) => c,
                Err(e) => {
                    restarted(e.to_string());
                    tokio::select! {
                        _ = term.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_secs(2)) => continue,
                    }
                }
            };
            tokio::select! {
                _ = term.cancelled() => {
                    let _ = child.start_kill();
                    let _ = child.wait().await;
                    return;
                }
                status = child.wait() => {
                    restarted(format!("bird exited: {status:?}"));
                    tokio::select! {
                        _ = term.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
        }
    }

    /// Waits until the control socket answers (the daemon read its config).
    pub(crate) async fn wait_ready(&self, within: Duration) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match self.birdc(&["show", "status"]).await {
                Ok(_) => return Ok(()),
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}

/// `name` on PATH, else in /usr/sbin (Debian's bird2 installs there, often not on PATH).
fn find(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| Path::new("/usr/sbin").join(name))
}

/// The daemon's config for pod CIDRs only (see [`render_all`]).
pub fn render(s: &BgpSettings, routes: &BTreeMap<IpNet, IpAddr>) -> String {
    render_all(s, routes, &BTreeMap::new())
}

/// The name of the static protocol holding the LoadBalancer addresses served by `nh`: one
/// protocol per next hop, named after it, so each address has one route (one BGP path) per
/// Node, and a Node joining or leaving touches only its own protocol.
pub(crate) fn vip_protocol_name(nh: &IpAddr) -> String {
    match nh {
        IpAddr::V4(a) => {
            let o = a.octets();
            format!("ccm_lb4_{}_{}_{}_{}", o[0], o[1], o[2], o[3])
        }
        IpAddr::V6(a) => {
            let segs: Vec<String> = a.segments().iter().map(|s| format!("{s:x}")).collect();
            format!("ccm_lb6_{}", segs.join("_"))
        }
    }
}

/// The daemon's config: one static protocol per family holding the announced pod CIDRs, and
/// one per LoadBalancer next hop holding the addresses that Node serves (all as blackholes,
/// which nothing installs: the daemon has no kernel protocol); an export filter that sets
/// each route's BGP next hop to its Node's address, and the pool's communities and
/// LOCAL_PREF on the addresses. With addresses to announce, every session sends all paths of
/// a prefix (ADD-PATH `tx`); a router that does not take them gets the best one.
pub fn render_all(
    s: &BgpSettings,
    routes: &BTreeMap<IpNet, IpAddr>,
    vips: &BTreeMap<IpNet, VipRoute>,
) -> String {
    let mut c = String::from(
        "# Written by ccm-rs (cloud-provider metal, routes.mode = \"bgp\"); rewritten on every change.\n",
    );
    if let Some(id) = s.router_id {
        let _ = writeln!(c, "router id {id};");
    }
    c.push_str("log stderr { warning, error, fatal, bug, auth, remote };\nprotocol device { scan time 60; }\n");
    if s.graceful_restart.is_some() {
        // Recovery (`bird -R`) holds every export until all sessions are up and have sent
        // End-of-RIB; a router that is down must not hold the others' announcements longer.
        let _ = writeln!(c, "graceful restart wait {GR_RECOVERY_WAIT};");
    }
    for (name, family, v4) in [("ccm_v4", "ipv4", true), ("ccm_v6", "ipv6", false)] {
        let _ = writeln!(c, "protocol static {name} {{\n  {family};");
        for net in routes.keys().filter(|n| matches!(n, IpNet::V4(_)) == v4) {
            let _ = writeln!(c, "  route {net} blackhole;");
        }
        c.push_str("}\n");
    }
    let mut by_hop: BTreeMap<IpAddr, Vec<IpNet>> = BTreeMap::new();
    for (net, r) in vips {
        for nh in &r.next_hops {
            by_hop.entry(*nh).or_default().push(*net);
        }
    }
    for (nh, nets) in &by_hop {
        let family = if nh.is_ipv4() { "ipv4" } else { "ipv6" };
        let _ = writeln!(
            c,
            "protocol static {} {{\n  {family};",
            vip_protocol_name(nh)
        );
        for net in nets.iter().filter(|n| n.addr().is_ipv4() == nh.is_ipv4()) {
            let _ = writeln!(c, "  route {net} blackhole;");
        }
        c.push_str("}\n");
    }
    c.push_str("filter ccm_export {\n  if proto = \"ccm_v4\" || proto = \"ccm_v6\" then {\n");
    for (net, gw) in routes {
        let _ = writeln!(
            c,
            "    if net = {net} then {{ bgp_next_hop = {gw}; accept; }}"
        );
    }
    c.push_str("    reject;\n  }\n");
    for nh in by_hop.keys() {
        let _ = writeln!(c, "  if proto = \"{}\" then {{", vip_protocol_name(nh));
        let _ = writeln!(c, "    bgp_next_hop = {nh};");
        for (net, r) in vips.iter().filter(|(_, r)| r.next_hops.contains(nh)) {
            if r.communities.is_empty() && r.local_pref.is_none() {
                continue;
            }
            let _ = write!(c, "    if net = {net} then {{");
            for comm in &r.communities {
                match comm {
                    Community::Standard(a, b) => {
                        let _ = write!(c, " bgp_community.add(({a},{b}));");
                    }
                    Community::Large(a, b, l) => {
                        let _ = write!(c, " bgp_large_community.add(({a},{b},{l}));");
                    }
                }
            }
            if let Some(lp) = r.local_pref {
                let _ = write!(c, " bgp_local_pref = {lp};");
            }
            c.push_str(" }\n");
        }
        c.push_str("    accept;\n  }\n");
    }
    c.push_str("  reject;\n}\n");
    let add_paths = s.announce_load_balancers;
    for (i, p) in s.peers.iter().enumerate() {
        render_peer(&mut c, s, i, p, add_paths);
    }
    c
}

fn render_peer(c: &mut String, s: &BgpSettings, i: usize, p: &Peer, add_paths: bool) {
    let _ = writeln!(c, "protocol bgp {} {{", protocol_name(i));
    let _ = writeln!(c, "  local as {};", s.asn);
    match p.port {
        Some(port) => {
            let _ = writeln!(c, "  neighbor {} port {port} as {};", p.address, p.asn);
        }
        None => {
            let _ = writeln!(c, "  neighbor {} as {};", p.address, p.asn);
        }
    }
    let _ = writeln!(c, "  hold time {};", p.hold_time);
    if p.hold_time >= 3 {
        let _ = writeln!(c, "  keepalive time {};", (p.hold_time / 3).max(1));
    }
    // A short connect retry: a router that comes back (or a session it reset) is re-peered in
    // seconds, not BIRD's default two minutes.
    c.push_str("  connect retry time 5;\n  error wait time 1, 30;\n");
    match s.graceful_restart {
        Some(t) => {
            let _ = writeln!(c, "  graceful restart on;\n  graceful restart time {t};");
        }
        None => c.push_str("  graceful restart off;\n"),
    }
    if let Some(pw) = &p.password {
        let _ = writeln!(c, "  password \"{pw}\";");
    }
    if p.ttl_security {
        c.push_str("  ttl security on;\n");
    }
    if let Some(h) = p.multihop {
        let _ = writeln!(c, "  multihop {h};");
    }
    let add = if add_paths { " add paths tx;" } else { "" };
    let _ = writeln!(
        c,
        "  ipv4 {{ import none; export filter ccm_export;{add} }};\n  ipv6 {{ import none; export filter ccm_export;{add} }};\n}}"
    );
}

/// Our sessions from `birdc show protocols` output.
pub(crate) fn parse_protocols(out: &str) -> Vec<Session> {
    out.lines()
        .filter_map(|l| {
            let mut cols = l.split_whitespace();
            let name = cols.next()?;
            let peer = name.strip_prefix("ccm_peer")?.parse().ok()?;
            let _proto = cols.next()?;
            let _table = cols.next()?;
            let _up_down = cols.next()?;
            let _since = cols.next()?;
            let state = cols.next().unwrap_or_default().to_string();
            let info = cols.collect::<Vec<_>>().join(" ");
            Some(Session { peer, state, info })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_config_with_passwords_is_owner_only() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("metal-bird-{}", std::process::id()));
        let settings = BgpSettings {
            asn: 64512,
            router_id: None,
            graceful_restart: Some(120),
            bird: Some("/nonexistent/bird".into()),
            birdc: Some("/nonexistent/birdc".into()),
            run_dir: dir.clone(),
            peers: vec![Peer {
                address: "192.0.2.1".parse().expect("ip"),
                asn: 64501,
                password: Some("s3cret".into()),
                ttl_security: true,
                multihop: None,
                hold_time: 9,
                port: None,
            }],
            announce_load_balancers: false,
        };
        let bird = Bird::new(&settings, None);
        let routes = BTreeMap::from([(
            "10.244.1.0/24".parse().expect("net"),
            "192.0.2.11".parse().expect("ip"),
        )]);
        bird.write_config(&routes, &BTreeMap::new())
            .await
            .expect("write");
        bird.write_config(&routes, &BTreeMap::new())
            .await
            .expect("rewrite");
        let meta = std::fs::metadata(dir.join("bird.conf")).expect("conf");
        let text = std::fs::read_to_string(dir.join("bird.conf")).expect("conf");
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert!(text.contains("password \"s3cret\";"), "{text}");
        assert!(text.contains("ttl security on;"), "{text}");
        assert!(
            text.contains("if net = 10.244.1.0/24 then { bgp_next_hop = 192.0.2.11; accept; }"),
            "{text}"
        );
    }

    #[test]
    fn show_protocols_is_parsed() {
        let out = "BIRD 2.0.12 ready.\nName       Proto      Table      State  Since         Info\ndevice1    Device     ---        up     04:29:57.736  \nccm_peer0  BGP        ---        up     04:30:06.702  Established   \nccm_peer1  BGP        ---        start  04:40:48.688  Active        Socket: Connection refused\n";
        assert_eq!(
            parse_protocols(out),
            vec![
                Session {
                    peer: 0,
                    state: "Established".into(),
                    info: String::new()
                },
                Session {
                    peer: 1,
                    state: "Active".into(),
                    info: "Socket: Connection refused".into()
                },
            ]
        );
    }
}
