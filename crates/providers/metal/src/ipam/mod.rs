//! LB-IPAM: which address each LoadBalancer Service gets, as a pure data structure.
//!
//! No I/O and no clock: the provider feeds it Services (as [`Request`]s) and applies what it
//! answers, so every rule below is proven by property tests over random create / update /
//! delete / restart sequences (`tests` at the bottom).
//!
//! Rules, and the peer bugs they prevent:
//! - **An address is held by one Service**, or by several with the same sharing key and no
//!   common (protocol, port) (MetalLB's `allow-shared-ip`); an incompatible request fails and
//!   names the holder (kube-vip-cloud-provider #34, kube-vip #283).
//! - **A held address never moves on its own.** A Service keeps its addresses as long as its
//!   request is unchanged — pool edits, other Services' deletions and restarts included
//!   (MetalLB #686, #1591). Only a changed request (another requested IP, pool or family set)
//!   reassigns, and a failed reassignment keeps the old addresses.
//! - **State comes from the cluster**: after a restart, [`Allocator::adopt`] is called for every
//!   Service that shows addresses in its status, oldest first, *before* any allocation; so a
//!   pending Service can never take an address a bound one shows (MetalLB #1774, #2443, #2479;
//!   kube-vip-cloud-provider #15). A Service whose status shows an address an older Service
//!   holds is refused, not silently renumbered.
//! - **Errors name the pool**, so the Warning Event tells the operator what to grow or fix.

mod range;
mod request;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

pub use range::{Family, PoolRange};
pub use request::{
    ANNOTATION_ADDRESS_POOL, ANNOTATION_LOAD_BALANCER_IPS, ANNOTATION_SHARED_IP,
    ANNOTATION_SHARING_CROSS_NAMESPACE, request_from,
};

/// An address pool (checked `[[pools]]` entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    /// Unique name.
    pub name: String,
    /// Address ranges, tried in order.
    pub ranges: Vec<PoolRange>,
    /// Whether Services that neither name the pool nor request one of its addresses get one.
    pub auto_assign: bool,
    /// Skip IPv4 addresses ending in `.0` / `.255` when auto-assigning.
    pub avoid_buggy_ips: bool,
    /// Also hand out the network (and IPv4 broadcast) addresses of CIDR ranges.
    pub use_network_and_broadcast: bool,
    /// Allowed namespaces (empty: all).
    pub namespaces: Vec<String>,
    /// Labels a Service must carry (empty: any Service).
    pub service_selector: BTreeMap<String, String>,
    /// BGP communities the pool's addresses carry when announced.
    pub bgp_communities: Vec<crate::bgp::config::Community>,
    /// BGP LOCAL_PREF of the pool's addresses (sent to iBGP peers only, as BGP does).
    pub bgp_local_pref: Option<u32>,
}

impl Pool {
    /// Whether the pool may serve this Service at all (namespace and selector).
    pub fn allows(&self, req: &Request) -> bool {
        (self.namespaces.is_empty() || self.namespaces.contains(&req.namespace))
            && self
                .service_selector
                .iter()
                .all(|(k, v)| req.labels.get(k) == Some(v))
    }

    /// Whether `ip` lies in one of the pool's ranges.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.ranges.iter().any(|r| r.contains(ip))
    }

    fn has_family(&self, family: Family) -> bool {
        self.ranges.iter().any(|r| r.family() == family)
    }
}

/// A port a Service exposes, for IP-sharing conflicts.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Port {
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// The port number.
    pub port: i32,
}

/// What one Service asks for, distilled from its spec and annotations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    /// `namespace/name`: the allocation key.
    pub key: String,
    /// For the pools' namespace restriction.
    pub namespace: String,
    /// For the pools' selectors.
    pub labels: BTreeMap<String, String>,
    /// Families wanted, primary first (`spec.ipFamilies`, cut to one for SingleStack).
    pub families: Vec<Family>,
    /// `RequireDualStack`: every family or nothing.
    pub require_all_families: bool,
    /// Exact addresses requested (empty: any).
    pub ips: Vec<IpAddr>,
    /// Requested pool.
    pub pool: Option<String>,
    /// Sharing key (`allow-shared-ip`).
    pub sharing_key: Option<String>,
    /// Namespaces whose Services may share with this one (`*`: any); its own always may.
    pub share_namespaces: Vec<String>,
    /// Exposed ports.
    pub ports: Vec<Port>,
    /// Addresses the Service's status shows now (what a restart adopts).
    pub current: Vec<IpAddr>,
}

/// Why a Service gets no address. The text goes into a Warning Event on the Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocError {
    /// Every pool that may serve the Service is full.
    Exhausted {
        /// The pools tried, in order.
        pools: Vec<String>,
        /// The family that ran out.
        family: Family,
    },
    /// No pool may serve the Service in this family (namespace, selector, auto-assign).
    NoPool {
        /// The family asked for.
        family: Family,
    },
    /// The requested pool does not exist.
    UnknownPool {
        /// The name requested.
        pool: String,
    },
    /// A requested address is in no pool that may serve the Service.
    NotInPool {
        /// The address.
        ip: IpAddr,
        /// The requested pool, if one was named.
        pool: Option<String>,
    },
    /// A requested (or adopted) address is held by a Service it cannot be shared with.
    InUse {
        /// The address.
        ip: IpAddr,
        /// The holder (`namespace/name`).
        holder: String,
        /// Why sharing is not possible.
        why: &'static str,
        /// The pool containing the address, if any.
        pool: Option<String>,
    },
    /// The Service's annotations and spec contradict each other.
    Invalid(String),
    /// The Service gave up the addresses it showed (see the inner error); its status must be
    /// cleared.
    Released(Box<AllocError>),
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::Exhausted { pools, family } => write!(
                f,
                "no free {family} address in pool{} {}; add addresses to the pool or delete a LoadBalancer Service",
                if pools.len() == 1 { "" } else { "s" },
                pools
                    .iter()
                    .map(|p| format!("{p:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            AllocError::NoPool { family } => write!(
                f,
                "no {family} address pool may serve this Service (check the pools' namespaces, service_selector and auto_assign)"
            ),
            AllocError::UnknownPool { pool } => {
                write!(f, "requested address pool {pool:?} does not exist")
            }
            AllocError::NotInPool { ip, pool: Some(p) } => write!(
                f,
                "requested address {ip} is not in pool {p:?}, or the pool does not serve this Service"
            ),
            AllocError::NotInPool { ip, pool: None } => write!(
                f,
                "requested address {ip} is in no pool that may serve this Service"
            ),
            AllocError::InUse {
                ip,
                holder,
                why,
                pool,
            } => write!(
                f,
                "address {ip}{} is already used by Service {holder} and cannot be shared: {why}",
                pool.as_ref()
                    .map(|p| format!(" (pool {p:?})"))
                    .unwrap_or_default()
            ),
            AllocError::Invalid(why) => f.write_str(why),
            AllocError::Released(e) => write!(
                f,
                "{e}; the address was taken away from this Service (the other Service keeps it) and a new one is assigned at the next retry"
            ),
        }
    }
}

impl std::error::Error for AllocError {}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Holding {
    ips: Vec<IpAddr>,
    sharing_key: Option<String>,
    ports: Vec<Port>,
    namespace: String,
    share_namespaces: Vec<String>,
    /// The request the addresses were given for, minus `current` and `ports`.
    fingerprint: Fingerprint,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Fingerprint {
    ips: BTreeSet<IpAddr>,
    pool: Option<String>,
    families: Vec<Family>,
    require_all: bool,
}

impl Fingerprint {
    fn of(req: &Request) -> Self {
        Fingerprint {
            ips: req.ips.iter().copied().collect(),
            pool: req.pool.clone(),
            families: req.families.clone(),
            require_all: req.require_all_families,
        }
    }
}

/// The allocation table: pools, who holds which address.
#[derive(Debug, Clone, Default)]
pub struct Allocator {
    pools: Vec<Pool>,
    holdings: BTreeMap<String, Holding>,
    by_ip: BTreeMap<IpAddr, BTreeSet<String>>,
    /// Requested addresses of Services that hold nothing yet, and who requested them.
    reserved: BTreeMap<IpAddr, String>,
}

impl Allocator {
    /// An empty table over `pools`.
    pub fn new(pools: Vec<Pool>) -> Self {
        Allocator {
            pools,
            ..Default::default()
        }
    }

    /// Replaces the pools (config reload). Held addresses stay held, even outside every pool:
    /// addresses never move because a pool changed.
    pub fn set_pools(&mut self, pools: Vec<Pool>) {
        self.pools = pools;
    }

    /// The pools.
    pub fn pools(&self) -> &[Pool] {
        &self.pools
    }

    /// The addresses `key` holds, if any.
    pub fn held(&self, key: &str) -> Option<&[IpAddr]> {
        self.holdings.get(key).map(|h| h.ips.as_slice())
    }

    /// Every `(Service, addresses)` held, for checks.
    pub fn holdings(&self) -> impl Iterator<Item = (&str, &[IpAddr])> {
        self.holdings
            .iter()
            .map(|(k, h)| (k.as_str(), h.ips.as_slice()))
    }

    /// The pool containing `ip`, if any (first in config order).
    pub fn pool_of(&self, ip: IpAddr) -> Option<&str> {
        self.pools
            .iter()
            .find(|p| p.contains(ip))
            .map(|p| p.name.as_str())
    }

    /// Records what the cluster already shows (`req.current`) without allocating: the restart
    /// path, called oldest Service first before any [`Allocator::assign`]. The addresses are
    /// recorded even when they clash with an earlier Service's (so they are never handed to a
    /// third one) or lie outside every pool (a pool removed while the CCM was down must not
    /// renumber anything); a clash is returned, and the Service's next `assign` reports it
    /// instead of renumbering it.
    pub fn adopt(&mut self, req: &Request) -> Result<(), AllocError> {
        if req.current.is_empty() {
            return Ok(());
        }
        let clash = req
            .current
            .iter()
            .find_map(|&ip| self.check_shareable(ip, req).err());
        // Addresses a pool edit left outside every pool still count as granted: a pool
        // change never moves them (an address in another pool than the one named does move).
        let orphaned = req.current.iter().all(|ip| self.pool_of(*ip).is_none());
        let mut unpooled = req.clone();
        unpooled.pool = None;
        let fingerprint = if self.satisfies(&req.current, req)
            || orphaned && self.satisfies(&req.current, &unpooled)
        {
            Fingerprint::of(req)
        } else {
            // Shown in status but not what is asked for now: the next assign reassigns.
            Fingerprint {
                ips: req.current.iter().copied().collect(),
                pool: None,
                families: Vec::new(),
                require_all: false,
            }
        };
        self.hold(req, req.current.clone(), fingerprint);
        clash.map_or(Ok(()), Err)
    }

    /// Addresses for `req`: the ones it holds if its request is unchanged or they still fulfil
    /// it, else new ones. On error the Service keeps what it had.
    pub fn assign(&mut self, req: &Request) -> Result<Vec<IpAddr>, AllocError> {
        // Reservations follow the Service's current request.
        self.reserved
            .retain(|ip, k| k != &req.key || req.ips.contains(ip));
        let sharing_changed = self.holdings.get(&req.key).is_some_and(|h| {
            h.sharing_key != req.sharing_key
                || h.ports != req.ports
                || h.share_namespaces != req.share_namespaces
        });
        if let Some(h) = self.holdings.get_mut(&req.key) {
            // Sharing decisions follow the Service's current spec even if this call fails: a
            // Service that dropped its sharing key no longer consents to sharing.
            h.sharing_key.clone_from(&req.sharing_key);
            h.ports.clone_from(&req.ports);
            h.share_namespaces.clone_from(&req.share_namespaces);
        }
        if let Some(h) = self.holdings.get(&req.key)
            && (h.fingerprint == Fingerprint::of(req) || self.satisfies(&h.ips, req))
        {
            let ips = h.ips.clone();
            for &ip in &ips {
                if let Err(e) = self.check_shareable(ip, req) {
                    if !sharing_changed {
                        return Err(e);
                    }
                    // Its sharing key, ports or namespaces changed and no longer fit a
                    // co-holder's: this Service (the later change) gives the address up, as
                    // MetalLB clears the later one; the co-holder keeps it.
                    self.release(&req.key);
                    return Err(AllocError::Released(Box::new(e)));
                }
            }
            let ips = self.with_missing_families(req, ips);
            self.hold(req, ips.clone(), Fingerprint::of(req));
            return Ok(ips);
        }
        if !self.holdings.contains_key(&req.key) && self.satisfies(&req.current, req) {
            // Shows addresses that were never adopted (created after the rebuild's list):
            // keep them if they are free to hold, never renumber silently.
            for &ip in &req.current {
                self.check_shareable(ip, req)?;
            }
            self.hold(req, req.current.clone(), Fingerprint::of(req));
            return Ok(req.current.clone());
        }
        self.assign_fresh(req)
    }

    /// New addresses for a Service that holds none it may keep.
    fn assign_fresh(&mut self, req: &Request) -> Result<Vec<IpAddr>, AllocError> {
        let ips = match self.choose(req) {
            Ok(ips) => ips,
            Err(e) => {
                // A refused request (its address held, for now) keeps its claim: when the
                // address frees, auto-assignment does not hand it to someone else first.
                self.reserve(req);
                return Err(e);
            }
        };
        self.hold(req, ips.clone(), Fingerprint::of(req));
        self.reserved.retain(|_, k| k != &req.key);
        Ok(ips)
    }

    /// `ips` plus one address of each family the request wants and `ips` lacks (a
    /// SingleStack Service turned PreferDualStack gains its second family); the families it
    /// has keep their addresses. Best effort: what cannot be had now is tried next time.
    fn with_missing_families(&self, req: &Request, mut ips: Vec<IpAddr>) -> Vec<IpAddr> {
        if !req.ips.is_empty() {
            return ips;
        }
        let Ok(pools) = self.candidate_pools(req) else {
            return ips;
        };
        let auto: Vec<&Pool> = pools
            .into_iter()
            .filter(|p| p.auto_assign || req.pool.as_deref() == Some(p.name.as_str()))
            .collect();
        for &family in &req.families {
            if ips.iter().all(|ip| Family::of(*ip) != family)
                && let Ok(ip) = self.choose_family(req, &auto, family)
            {
                ips.push(ip);
            }
        }
        ips
    }

    /// Remembers the addresses that Services without any yet have requested (the restart
    /// path, after every [`Allocator::adopt`]): auto-assignment never hands them to another
    /// Service, so a request is not lost to whoever is processed first (MetalLB #1984).
    ///
    /// Only an address a pool may give this Service is kept for it: a request no pool would
    /// grant (another namespace's pool, outside every pool) must not block anyone.
    pub fn reserve(&mut self, req: &Request) {
        if req.current.is_empty() {
            for &ip in &req.ips {
                if self.may_hold(req, ip) {
                    self.reserved.entry(ip).or_insert_with(|| req.key.clone());
                }
            }
        }
    }

    /// What `key` keeps from other Services: the addresses it holds and those reserved for it.
    /// When this shrinks, a Service waiting for an address may get one.
    pub fn taken_by(&self, key: &str) -> BTreeSet<IpAddr> {
        let reserved = self.reserved.iter().filter(|(_, k)| *k == key);
        self.held(key)
            .unwrap_or_default()
            .iter()
            .copied()
            .chain(reserved.map(|(ip, _)| *ip))
            .collect()
    }

    /// Forgets `key`'s addresses (the Service was deleted or stopped being a LoadBalancer).
    pub fn release(&mut self, key: &str) {
        self.release_holding(key);
    }

    /// Forgets `key` altogether: its addresses and its reservations (the Service is gone).
    pub fn forget(&mut self, key: &str) {
        self.release_holding(key);
        self.reserved.retain(|_, k| k != key);
    }

    fn release_holding(&mut self, key: &str) {
        if let Some(h) = self.holdings.remove(key) {
            for ip in h.ips {
                if let Some(holders) = self.by_ip.get_mut(&ip) {
                    holders.remove(key);
                    if holders.is_empty() {
                        self.by_ip.remove(&ip);
                    }
                }
            }
        }
    }

    fn hold(&mut self, req: &Request, ips: Vec<IpAddr>, fingerprint: Fingerprint) {
        self.release(&req.key);
        for &ip in &ips {
            self.by_ip.entry(ip).or_default().insert(req.key.clone());
        }
        self.holdings.insert(
            req.key.clone(),
            Holding {
                ips,
                sharing_key: req.sharing_key.clone(),
                ports: req.ports.clone(),
                namespace: req.namespace.clone(),
                share_namespaces: req.share_namespaces.clone(),
                fingerprint,
            },
        );
    }

    /// Whether addresses `ips` fulfil `req` as asked (ignoring which pool they came from unless
    /// a pool was named).
    fn satisfies(&self, ips: &[IpAddr], req: &Request) -> bool {
        if ips.is_empty() {
            return false;
        }
        if !req.ips.is_empty() {
            let want: BTreeSet<_> = req.ips.iter().collect();
            return want == ips.iter().collect();
        }
        let families: BTreeSet<Family> = ips.iter().map(|ip| Family::of(*ip)).collect();
        if families.len() != ips.len() || !families.iter().all(|f| req.families.contains(f)) {
            return false;
        }
        if req.require_all_families && families.len() != req.families.len() {
            return false;
        }
        match &req.pool {
            Some(name) => self
                .pools
                .iter()
                .find(|p| &p.name == name)
                .is_some_and(|p| ips.iter().all(|ip| p.contains(*ip))),
            None => true,
        }
    }

    /// `Ok` when `req` may hold `ip` alongside its current holders (other than itself).
    fn check_shareable(&self, ip: IpAddr, req: &Request) -> Result<(), AllocError> {
        for holder in self.by_ip.get(&ip).into_iter().flatten() {
            if holder == &req.key {
                continue;
            }
            let Some(h) = self.holdings.get(holder) else {
                continue;
            };
            let allows = |ns: &[String], other: &str| ns.iter().any(|n| n == "*" || n == other);
            let why = match (&req.sharing_key, &h.sharing_key) {
                (Some(a), Some(b))
                    if a == b
                        && req.namespace != h.namespace
                        && !(allows(&req.share_namespaces, &h.namespace)
                            && allows(&h.share_namespaces, &req.namespace)) =>
                {
                    Some(
                        "the Services are in different namespaces; both need the annotation metal.ccm-rs.io/sharing-cross-namespace naming the other's namespace (or \"*\")",
                    )
                }
                (Some(a), Some(b)) if a == b => {
                    if h.ports.iter().any(|p| req.ports.contains(p)) {
                        Some("both Services use the same port")
                    } else {
                        None
                    }
                }
                (Some(_), Some(_)) => Some("the Services have different sharing keys"),
                _ => Some("sharing needs the same allow-shared-ip key on both Services"),
            };
            if let Some(why) = why {
                return Err(AllocError::InUse {
                    ip,
                    holder: holder.clone(),
                    why,
                    pool: self.pool_of(ip).map(str::to_string),
                });
            }
        }
        Ok(())
    }

    /// Whether a pool that may serve `req` (the named one, or any that admits it) contains `ip`.
    fn may_hold(&self, req: &Request, ip: IpAddr) -> bool {
        self.candidate_pools(req)
            .is_ok_and(|pools| pools.iter().any(|p| p.contains(ip)))
    }

    fn candidate_pools(&self, req: &Request) -> Result<Vec<&Pool>, AllocError> {
        if let Some(name) = &req.pool {
            let pool = self
                .pools
                .iter()
                .find(|p| &p.name == name)
                .ok_or_else(|| AllocError::UnknownPool { pool: name.clone() })?;
            return Ok(if pool.allows(req) { vec![pool] } else { vec![] });
        }
        Ok(self.pools.iter().filter(|p| p.allows(req)).collect())
    }

    fn choose(&self, req: &Request) -> Result<Vec<IpAddr>, AllocError> {
        let pools = self.candidate_pools(req)?;
        if !req.ips.is_empty() {
            for &ip in &req.ips {
                if !pools.iter().any(|p| p.contains(ip)) {
                    return Err(AllocError::NotInPool {
                        ip,
                        pool: req.pool.clone(),
                    });
                }
                self.check_shareable(ip, req)?;
            }
            return Ok(req.ips.clone());
        }
        let auto: Vec<&Pool> = pools
            .into_iter()
            .filter(|p| p.auto_assign || req.pool.as_deref() == Some(p.name.as_str()))
            .collect();
        let mut out = Vec::new();
        let mut first_error = None;
        for &family in &req.families {
            match self.choose_family(req, &auto, family) {
                Ok(ip) => out.push(ip),
                Err(e) if req.require_all_families => return Err(e),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match (out.is_empty(), first_error) {
            (true, Some(e)) => Err(e),
            (true, None) => Err(AllocError::Invalid(
                "the Service asks for no IP family".into(),
            )),
            (false, _) => Ok(out),
        }
    }

    fn choose_family(
        &self,
        req: &Request,
        pools: &[&Pool],
        family: Family,
    ) -> Result<IpAddr, AllocError> {
        let pools: Vec<&Pool> = pools
            .iter()
            .copied()
            .filter(|p| p.has_family(family))
            .collect();
        if pools.is_empty() {
            return Err(AllocError::NoPool { family });
        }
        // What the Service holds in this family stays (a family change never renumbers it),
        // also an address of a pool it may use but that does not auto-assign (it asked for
        // that address once, then dropped the request).
        if let Some(h) = self.holdings.get(&req.key)
            && let Some(&ip) = h
                .ips
                .iter()
                .find(|ip| Family::of(**ip) == family && self.may_hold(req, **ip))
            && self.check_shareable(ip, req).is_ok()
        {
            return Ok(ip);
        }
        if req.sharing_key.is_some() {
            // Join a Service with the same key first, as MetalLB does.
            // An address another Service waits for is not joined either: once its holders
            // let it go, it is the waiting Service's.
            let shared = self.by_ip.keys().copied().find(|&ip| {
                Family::of(ip) == family
                    && pools.iter().any(|p| p.contains(ip))
                    && self.reserved.get(&ip).is_none_or(|k| k == &req.key)
                    && self.check_shareable(ip, req).is_ok()
            });
            if let Some(ip) = shared {
                return Ok(ip);
            }
        }
        for pool in &pools {
            for range in pool.ranges.iter().filter(|r| r.family() == family) {
                let taken = |ip: IpAddr| {
                    self.by_ip.contains_key(&ip)
                        || self.reserved.get(&ip).is_some_and(|k| k != &req.key)
                };
                if let Some(ip) =
                    range.first_free(pool.avoid_buggy_ips, !pool.use_network_and_broadcast, taken)
                {
                    return Ok(ip);
                }
            }
        }
        Err(AllocError::Exhausted {
            pools: pools.iter().map(|p| p.name.clone()).collect(),
            family,
        })
    }
}

#[cfg(test)]
mod tests;
