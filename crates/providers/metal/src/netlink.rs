//! Kernel routes through rtnetlink: one table, one protocol number, IPv4 and IPv6.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

use futures::TryStreamExt;
use ipnet::IpNet;
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
                if table_of(&msg) == self.table
                    && u8::from(msg.header.protocol) == self.protocol
                    && msg.header.kind == RouteType::Unicast
                    && let Some(r) = kernel_route(&msg)
                {
                    out.push(r);
                }
            }
        }
        Ok(out)
    }

    /// Adds or replaces the route to `r.dst`.
    pub async fn replace(&self, r: &KernelRoute) -> Result<(), rtnetlink::Error> {
        let msg = self.builder(r.dst)?.gateway(r.gateway).map_err(invalid)?;
        self.handle
            .route()
            .add(msg.build())
            .replace()
            .execute()
            .await
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

fn kernel_route(msg: &RouteMessage) -> Option<KernelRoute> {
    let mut dst = None;
    let mut gateway = None;
    for a in &msg.attributes {
        match a {
            RouteAttribute::Destination(RouteAddress::Inet(ip)) => dst = Some(IpAddr::V4(*ip)),
            RouteAttribute::Destination(RouteAddress::Inet6(ip)) => dst = Some(IpAddr::V6(*ip)),
            RouteAttribute::Gateway(RouteAddress::Inet(ip)) => gateway = Some(IpAddr::V4(*ip)),
            RouteAttribute::Gateway(RouteAddress::Inet6(ip)) => gateway = Some(IpAddr::V6(*ip)),
            RouteAttribute::Via(RouteVia::Inet6(ip)) => gateway = Some(IpAddr::V6(*ip)),
            _ => {}
        }
    }
    let dst = IpNet::new(dst?, msg.header.destination_prefix_length).ok()?;
    Some(KernelRoute {
        dst,
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
