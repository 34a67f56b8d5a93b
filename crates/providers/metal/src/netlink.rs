//! Kernel routes through rtnetlink: one table, one protocol number, IPv4 and IPv6.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

use futures::TryStreamExt;
use ipnet::IpNet;
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteType, RouteVia,
};
use rtnetlink::{Handle, RouteMessageBuilder};

use crate::config::RoutesSettings;

/// A route as ccm-rs owns it: destination and gateway (table and protocol are the table's).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KernelRoute {
    /// The pod CIDR.
    pub dst: IpNet,
    /// The node's InternalIP.
    pub gateway: IpAddr,
}

/// The dedicated routing table, through one netlink socket.
pub struct NetlinkTable {
    handle: Handle,
    table: u32,
    protocol: u8,
}

impl NetlinkTable {
    /// Opens a netlink socket, in `settings.netns` if set (the socket stays bound to the
    /// namespace it was created in, whichever thread uses it later).
    pub async fn open(settings: &RoutesSettings) -> io::Result<Self> {
        let handle = match &settings.netns {
            None => {
                let (conn, handle, _) = rtnetlink::new_connection()?;
                tokio::spawn(conn);
                handle
            }
            Some(path) => open_in_netns(path).await?,
        };
        Ok(NetlinkTable {
            handle,
            table: settings.table,
            protocol: settings.protocol,
        })
    }

    /// Routes in the table carrying the protocol number; everything else is invisible.
    pub async fn list(&self) -> Result<Vec<KernelRoute>, rtnetlink::Error> {
        Ok(self
            .table_routes()
            .await?
            .iter()
            .filter(|m| u8::from(m.header.protocol) == self.protocol)
            .filter(|m| m.header.kind == RouteType::Unicast)
            .filter_map(kernel_route)
            .collect())
    }

    /// Every route of the table, whoever made it.
    async fn table_routes(&self) -> Result<Vec<RouteMessage>, rtnetlink::Error> {
        let mut out = Vec::new();
        let queries = [
            RouteMessageBuilder::<Ipv4Addr>::new()
                .table_id(self.table)
                .build(),
            RouteMessageBuilder::<Ipv6Addr>::new()
                .table_id(self.table)
                .build(),
        ];
        for q in queries {
            let mut stream = self.handle.route().get(q).execute();
            while let Some(msg) = stream.try_next().await? {
                if table_of(&msg) == self.table {
                    out.push(msg);
                }
            }
        }
        Ok(out)
    }

    /// The protocol number of another tool's route to exactly `dst` in the table, if there
    /// is one: the kernel's replace would overwrite it whatever its protocol.
    pub async fn foreign_owner(&self, dst: IpNet) -> Result<Option<u8>, rtnetlink::Error> {
        Ok(self
            .table_routes()
            .await?
            .iter()
            .filter(|m| u8::from(m.header.protocol) != self.protocol)
            .find(|m| destination(m) == Some(dst))
            .map(|m| u8::from(m.header.protocol)))
    }

    /// Adds or replaces the route to `r.dst`. The caller checks [`Self::foreign_owner`] first.
    pub async fn replace(&self, r: &KernelRoute) -> Result<(), rtnetlink::Error> {
        let msg = self.builder(r.dst)?.gateway(r.gateway).map_err(invalid)?;
        self.handle
            .route()
            .add(msg.build())
            .replace()
            .execute()
            .await
    }

    /// Puts an `unreachable` route to `dst` (a cluster CIDR) in the table, so an address of a
    /// pod network without a route is refused here instead of following the main table.
    pub async fn ensure_unreachable(&self, dst: IpNet) -> Result<(), rtnetlink::Error> {
        let msg = self.builder(dst)?.kind(RouteType::Unreachable).build();
        self.handle.route().add(msg).replace().execute().await
    }

    /// Deletes our route to `dst`; a missing route is not an error.
    pub async fn delete(&self, dst: IpNet) -> Result<(), rtnetlink::Error> {
        let msg = self.builder(dst)?.build();
        match self.handle.route().del(msg).execute().await {
            Err(rtnetlink::Error::NetlinkError(e))
                if e.code.map(|c| c.get()) == Some(-3) /* ESRCH */ =>
            {
                Ok(())
            }
            other => other,
        }
    }

    fn builder(&self, dst: IpNet) -> Result<RouteMessageBuilder<IpAddr>, rtnetlink::Error> {
        Ok(RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(dst.addr(), dst.prefix_len())
            .map_err(invalid)?
            .table_id(self.table)
            .protocol(RouteProtocol::from(self.protocol)))
    }
}

fn invalid(e: impl std::fmt::Display) -> rtnetlink::Error {
    rtnetlink::Error::InvalidNla(e.to_string())
}

fn table_of(msg: &RouteMessage) -> u32 {
    msg.attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(msg.header.table))
}

/// The route's destination; a default route (no attribute) is `0.0.0.0/0` or `::/0`.
fn destination(msg: &RouteMessage) -> Option<IpNet> {
    let addr = msg
        .attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Destination(RouteAddress::Inet(ip)) => Some(IpAddr::V4(*ip)),
            RouteAttribute::Destination(RouteAddress::Inet6(ip)) => Some(IpAddr::V6(*ip)),
            _ => None,
        })
        .or(match msg.header.address_family {
            AddressFamily::Inet => Some(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
            AddressFamily::Inet6 => Some(IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
            _ => None,
        })?;
    IpNet::new(addr, msg.header.destination_prefix_length).ok()
}

fn kernel_route(msg: &RouteMessage) -> Option<KernelRoute> {
    let gateway = msg.attributes.iter().find_map(|a| match a {
        RouteAttribute::Gateway(RouteAddress::Inet(ip)) => Some(IpAddr::V4(*ip)),
        RouteAttribute::Gateway(RouteAddress::Inet6(ip)) => Some(IpAddr::V6(*ip)),
        RouteAttribute::Via(RouteVia::Inet6(ip)) => Some(IpAddr::V6(*ip)),
        _ => None,
    });
    Some(KernelRoute {
        dst: destination(msg)?,
        gateway: gateway?,
    })
}

/// Creates the socket on a short-lived thread that entered the namespace (network namespaces
/// are per thread), so no runtime thread ever changes namespace.
async fn open_in_netns(path: &Path) -> io::Result<Handle> {
    let rt = tokio::runtime::Handle::current();
    let path = path.to_owned();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("metal-netns".into())
        .spawn(move || {
            let result = (|| {
                let ns = std::fs::File::open(&path)
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(|e| io::Error::other(format!("entering {}: {e}", path.display())))?;
                let _guard = rt.enter();
                let (conn, handle, _) = rtnetlink::new_connection()?;
                rt.spawn(conn);
                Ok(handle)
            })();
            let _ = tx.send(result);
        })?;
    rx.await
        .map_err(|_| io::Error::other("the netns thread ended without an answer"))?
}
