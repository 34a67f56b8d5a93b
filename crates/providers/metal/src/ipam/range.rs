//! Address ranges of a pool: CIDRs and `first-last` ranges, IPv4 and IPv6, as inclusive
//! integer intervals.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// An IP family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    /// The family of `ip`.
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// An inclusive range of addresses of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolRange {
    first: IpAddr,
    last: IpAddr,
    /// A CIDR with a network (and, IPv4, broadcast) address: those are skipped when
    /// auto-assigning unless the pool opts out.
    subnet: bool,
}

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

fn from_u128(family: Family, n: u128) -> IpAddr {
    match family {
        // Invariant: callers only pass values between two addresses of the family.
        Family::V4 => IpAddr::V4(Ipv4Addr::from(n as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(n)),
    }
}

impl PoolRange {
    /// Parses `192.0.2.0/28`, `2001:db8::/120` or `192.0.2.10-192.0.2.20`. A CIDR's host
    /// bits must be zero, so a typo cannot silently widen or shift the pool.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if let Some((a, b)) = text.split_once('-') {
            let first: IpAddr = a.trim().parse().map_err(|_| {
                format!("a range \"first-last\" of two addresses; {a:?} is not an IP address")
            })?;
            let last: IpAddr = b.trim().parse().map_err(|_| {
                format!("a range \"first-last\" of two addresses; {b:?} is not an IP address")
            })?;
            if Family::of(first) != Family::of(last) {
                return Err(format!("a range within one IP family; got {text:?}"));
            }
            if to_u128(first) > to_u128(last) {
                return Err(format!(
                    "a range whose first address is not above its last; got {text:?}"
                ));
            }
            return Ok(PoolRange {
                first,
                last,
                subnet: false,
            });
        }
        let net: IpNet = text.parse().map_err(|_| {
            format!(
                "a CIDR such as \"192.0.2.0/28\" or a range \"192.0.2.10-192.0.2.20\"; got {text:?}"
            )
        })?;
        if net.trunc() != net {
            return Err(format!(
                "a CIDR without host bits ({} instead of {text:?})",
                net.trunc()
            ));
        }
        // /31, /32 (IPv4) and /127, /128 (IPv6) have no network or broadcast address.
        let subnet = net.max_prefix_len() - net.prefix_len() >= 2;
        Ok(PoolRange {
            first: net.network(),
            last: net.broadcast(),
            subnet,
        })
    }

    /// The family of the range.
    pub fn family(&self) -> Family {
        Family::of(self.first)
    }

    /// Whether `ip` is inside.
    pub fn contains(&self, ip: IpAddr) -> bool {
        Family::of(ip) == self.family()
            && (to_u128(self.first)..=to_u128(self.last)).contains(&to_u128(ip))
    }

    /// Whether `ip` is the network address of a CIDR (or its IPv4 broadcast address).
    pub fn is_subnet_edge(&self, ip: IpAddr) -> bool {
        self.subnet && (ip == self.first || (self.family() == Family::V4 && ip == self.last))
    }

    /// How many addresses the range has.
    pub fn size(&self) -> u128 {
        to_u128(self.last) - to_u128(self.first) + 1
    }

    /// How many of them are a CIDR's network / broadcast address.
    pub fn subnet_edges(&self) -> u128 {
        match (self.subnet, self.family()) {
            (false, _) => 0,
            (true, Family::V4) => 2,
            (true, Family::V6) => 1,
        }
    }

    /// Whether the two ranges share an address.
    pub fn overlaps(&self, other: &PoolRange) -> bool {
        self.family() == other.family()
            && to_u128(self.first) <= to_u128(other.last)
            && to_u128(other.first) <= to_u128(self.last)
    }

    /// The lowest address not `taken` (and, with `avoid_buggy`, not an IPv4 `.0`/`.255`;
    /// with `skip_edges`, not a CIDR's network or broadcast address). Visits at most one
    /// address per taken one plus the skipped ones, so huge IPv6 ranges cost nothing.
    pub fn first_free(
        &self,
        avoid_buggy: bool,
        skip_edges: bool,
        taken: impl Fn(IpAddr) -> bool,
    ) -> Option<IpAddr> {
        let family = self.family();
        let (mut n, last) = (to_u128(self.first), to_u128(self.last));
        loop {
            let ip = from_u128(family, n);
            let skipped = avoid_buggy && is_buggy(ip) || skip_edges && self.is_subnet_edge(ip);
            if !(taken(ip) || skipped) {
                return Some(ip);
            }
            if n == last {
                return None;
            }
            n += 1;
        }
    }
}

fn is_buggy(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V4(a) if matches!(a.octets()[3], 0 | 255))
}

impl fmt::Display for PoolRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}
