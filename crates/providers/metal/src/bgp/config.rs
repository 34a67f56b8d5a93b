//! `[routes.bgp]`: the BGP speaker's identity, timers and peers, parsed and checked. Every
//! error names the field and what to write instead.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use ccm_cloud::ConfigError;
use serde::Deserialize;

/// Default hold time (seconds): BIRD's and the RFC's 90 s would leave a crashed leader's
/// routes announced for a minute and a half where graceful restart is off.
pub const DEFAULT_HOLD_TIME: u16 = 9;
/// Default graceful-restart time (seconds): how long routers keep a vanished leader's routes
/// while a new leader takes over.
pub const DEFAULT_RESTART_TIME: u16 = 120;
/// Default directory of the daemon's config file and control socket.
pub const DEFAULT_RUN_DIR: &str = "/run/ccm-rs/bird";

/// `[routes.bgp]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BgpConfig {
    /// The cluster's (ccm-rs's) autonomous system number.
    pub asn: Option<u32>,
    /// BGP router id (an IPv4 address); default: the daemon picks the host's lowest IPv4.
    pub router_id: Option<Ipv4Addr>,
    /// Hold time in seconds for every peer without its own (default 9; 0 or 3–65535).
    pub hold_time: Option<u16>,
    /// Graceful restart: routers keep the routes for `graceful_restart_time` seconds when the
    /// leader's session ends without a withdrawal (default on, 120 s).
    pub graceful_restart: Option<bool>,
    /// See `graceful_restart`.
    pub graceful_restart_time: Option<u16>,
    /// The `bird` binary (BIRD 2); default: found on PATH, then /usr/sbin.
    pub bird: Option<PathBuf>,
    /// The `birdc` binary; default: next to `bird`.
    pub birdc: Option<PathBuf>,
    /// Where the daemon's config and control socket live (default /run/ccm-rs/bird).
    pub run_dir: Option<PathBuf>,
    /// The routers (or route reflectors) to announce to.
    #[serde(default)]
    pub peers: Vec<PeerConfig>,
    /// Also announce each LoadBalancer address as a /32 (/128) with one path per Node that
    /// can serve it (ADD-PATH), default false.
    #[serde(default)]
    pub announce_load_balancers: bool,
}

/// `[[routes.bgp.peers]]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    /// The router's address (IPv4 or IPv6); one session carries both families.
    pub address: Option<IpAddr>,
    /// The router's AS number.
    pub asn: Option<u32>,
    /// TCP MD5 password (RFC 2385), as configured on the router.
    pub password: Option<String>,
    /// Generalized TTL security (RFC 5082): accept only packets from a directly connected
    /// router.
    #[serde(default)]
    pub ttl_security: bool,
    /// The router is this many hops away (eBGP multihop); default: directly connected.
    pub multihop: Option<u8>,
    /// Hold time in seconds for this peer.
    pub hold_time: Option<u16>,
    /// The router's BGP port (default 179).
    pub port: Option<u16>,
}

/// Checked `[routes.bgp]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BgpSettings {
    /// Local AS.
    pub asn: u32,
    /// Router id, if set.
    pub router_id: Option<Ipv4Addr>,
    /// Graceful restart time in seconds; `None`: graceful restart off.
    pub graceful_restart: Option<u16>,
    /// The daemon binary, if set.
    pub bird: Option<PathBuf>,
    /// The control client binary, if set.
    pub birdc: Option<PathBuf>,
    /// Config and socket directory.
    pub run_dir: PathBuf,
    /// The peers.
    pub peers: Vec<Peer>,
    /// LoadBalancer addresses are announced too (one path per serving Node, ADD-PATH).
    pub announce_load_balancers: bool,
}

/// A BGP community a pool's addresses carry: standard (RFC 1997, `65000:100`) or large
/// (RFC 8092, `4200000000:1:2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Community {
    /// `asn:value`, 16 bits each.
    Standard(u16, u16),
    /// `global:local1:local2`, 32 bits each.
    Large(u32, u32, u32),
}

impl Community {
    /// Parses `a:b` (standard) or `a:b:c` (large).
    pub fn parse(text: &str) -> Result<Self, String> {
        let parts: Vec<&str> = text.split(':').collect();
        let want = || {
            format!(
                "a community \"asn:value\" (0-65535 each, e.g. \"64512:100\") or a large community \"global:local1:local2\" (0-4294967295 each); got {text:?}"
            )
        };
        match parts.as_slice() {
            [a, b] => Ok(Community::Standard(
                a.parse().map_err(|_| want())?,
                b.parse().map_err(|_| want())?,
            )),
            [a, b, c] => Ok(Community::Large(
                a.parse().map_err(|_| want())?,
                b.parse().map_err(|_| want())?,
                c.parse().map_err(|_| want())?,
            )),
            _ => Err(want()),
        }
    }
}

impl std::fmt::Display for Community {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Community::Standard(a, b) => write!(f, "{a}:{b}"),
            Community::Large(a, b, c) => write!(f, "{a}:{b}:{c}"),
        }
    }
}

/// One checked peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Router address.
    pub address: IpAddr,
    /// Router AS.
    pub asn: u32,
    /// MD5 password.
    pub password: Option<String>,
    /// GTSM.
    pub ttl_security: bool,
    /// Multihop TTL.
    pub multihop: Option<u8>,
    /// Hold time in seconds.
    pub hold_time: u16,
    /// Router port.
    pub port: Option<u16>,
}

fn field(name: impl Into<String>, want: impl Into<String>) -> ConfigError {
    ConfigError::field(name, want)
}

fn check_hold(name: String, h: u16) -> Result<u16, ConfigError> {
    if h == 1 || h == 2 {
        return Err(field(
            name,
            format!("0 (no keepalives) or 3-65535 seconds, as RFC 4271 allows; got {h}"),
        ));
    }
    Ok(h)
}

/// Checks `[routes.bgp]` (`None` when `routes.mode = "bgp"` has no such table).
pub fn check(file: Option<BgpConfig>) -> Result<BgpSettings, ConfigError> {
    let b = file.ok_or_else(|| {
        field(
            "routes.bgp",
            "a [routes.bgp] table with asn and at least one [[routes.bgp.peers]] when routes.mode = \"bgp\"",
        )
    })?;
    let asn = match b.asn {
        Some(a) if a != 0 && a != 23456 => a,
        other => {
            return Err(field(
                "routes.bgp.asn",
                format!(
                    "the cluster's AS number, 1-4294967295 except 23456 (AS_TRANS), e.g. 64512; got {other:?}"
                ),
            ));
        }
    };
    let hold = check_hold(
        "routes.bgp.hold_time".into(),
        b.hold_time.unwrap_or(DEFAULT_HOLD_TIME),
    )?;
    if b.peers.is_empty() {
        return Err(field(
            "routes.bgp.peers",
            "at least one [[routes.bgp.peers]] with address and asn (the routers to announce to)",
        ));
    }
    let mut seen = BTreeSet::new();
    let mut peers = Vec::new();
    for (i, p) in b.peers.into_iter().enumerate() {
        let peer = check_peer(i, p, hold)?;
        if !seen.insert(peer.address) {
            return Err(field(
                format!("routes.bgp.peers[{i}].address"),
                format!("each router once; {} appears twice", peer.address),
            ));
        }
        peers.push(peer);
    }
    let graceful_restart = match (b.graceful_restart.unwrap_or(true), b.graceful_restart_time) {
        (false, _) => None,
        (true, Some(0)) => {
            return Err(field(
                "routes.bgp.graceful_restart_time",
                "1-4095 seconds (or graceful_restart = false); got 0",
            ));
        }
        (true, Some(t)) if t > 4095 => {
            return Err(field(
                "routes.bgp.graceful_restart_time",
                format!("1-4095 seconds (the capability's 12-bit field); got {t}"),
            ));
        }
        (true, t) => Some(t.unwrap_or(DEFAULT_RESTART_TIME)),
    };
    Ok(BgpSettings {
        asn,
        router_id: b.router_id,
        graceful_restart,
        bird: b.bird,
        birdc: b.birdc,
        run_dir: b.run_dir.unwrap_or_else(|| PathBuf::from(DEFAULT_RUN_DIR)),
        peers,
        announce_load_balancers: b.announce_load_balancers,
    })
}

fn check_peer(i: usize, p: PeerConfig, hold: u16) -> Result<Peer, ConfigError> {
    let at = |f: &str| format!("routes.bgp.peers[{i}].{f}");
    let address = p
        .address
        .ok_or_else(|| field(at("address"), "the router's IP address, e.g. \"192.0.2.1\""))?;
    let asn = match p.asn {
        Some(a) if a != 0 && a != 23456 => a,
        other => {
            return Err(field(
                at("asn"),
                format!("the router's AS number, 1-4294967295 except 23456; got {other:?}"),
            ));
        }
    };
    if let Some(pw) = &p.password
        && (pw.is_empty()
            || pw.len() > 80
            || pw.chars().any(|c| c == '"' || c == '\\' || c.is_control()))
    {
        return Err(field(
            at("password"),
            "1-80 printable characters without \" or \\ (the TCP MD5 key the router has)",
        ));
    }
    if p.ttl_security && p.multihop.is_some() {
        return Err(field(
            at("ttl_security"),
            "false with multihop: TTL security accepts only directly connected routers",
        ));
    }
    if p.multihop == Some(0) {
        return Err(field(at("multihop"), "1-255 hops; got 0"));
    }
    Ok(Peer {
        address,
        asn,
        password: p.password,
        ttl_security: p.ttl_security,
        multihop: p.multihop,
        hold_time: check_hold(at("hold_time"), p.hold_time.unwrap_or(hold))?,
        port: p.port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<BgpSettings, ConfigError> {
        check(Some(toml_like(text)))
    }

    fn toml_like(text: &str) -> BgpConfig {
        ccm_cloud::parse_toml_str(text).expect("toml")
    }

    #[test]
    fn a_minimal_config_gets_the_defaults() {
        let s =
            parse("asn = 64512\n[[peers]]\naddress = \"192.0.2.1\"\nasn = 64500\n").expect("valid");
        assert_eq!(s.graceful_restart, Some(DEFAULT_RESTART_TIME));
        assert_eq!(s.peers[0].hold_time, DEFAULT_HOLD_TIME);
        assert!(!s.announce_load_balancers);
    }

    #[test]
    fn communities_parse_and_print() {
        assert_eq!(
            Community::parse("64512:100"),
            Ok(Community::Standard(64512, 100))
        );
        assert_eq!(
            Community::parse("4200000000:1:2"),
            Ok(Community::Large(4200000000, 1, 2))
        );
        for bad in ["", "1", "65536:1", "a:b", "1:2:3:4", "-1:2"] {
            assert!(Community::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(Community::Large(1, 2, 3).to_string(), "1:2:3");
    }

    #[test]
    fn bad_input_names_the_field() {
        for (text, name) in [
            (
                "[[peers]]\naddress = \"192.0.2.1\"\nasn = 1\n",
                "routes.bgp.asn",
            ),
            ("asn = 1\n", "routes.bgp.peers"),
            (
                "asn = 1\n[[peers]]\naddress = \"192.0.2.1\"\nasn = 2\n[[peers]]\naddress = \"192.0.2.1\"\nasn = 3\n",
                "routes.bgp.peers[1].address",
            ),
            (
                "asn = 1\n[[peers]]\nasn = 2\n",
                "routes.bgp.peers[0].address",
            ),
            (
                "asn = 1\n[[peers]]\naddress = \"192.0.2.1\"\nasn = 2\npassword = \"a\\\"b\"\n",
                "routes.bgp.peers[0].password",
            ),
            (
                "asn = 1\nhold_time = 2\n[[peers]]\naddress = \"192.0.2.1\"\nasn = 2\n",
                "routes.bgp.hold_time",
            ),
        ] {
            let err = parse(text).expect_err(text);
            assert!(err.to_string().contains(name), "{text}: {err}");
        }
    }
}
