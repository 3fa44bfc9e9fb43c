//! The small typed layer between [`super`] and `rtnetlink`: a blocking
//! "run this with a netlink handle" helper, the thread that enters a network
//! namespace, lookups that decode the messages we need, and errno mapping.
//!
//! Invariants:
//! - A netlink socket belongs to the network namespace of the thread that
//!   created it, so [`with_handle`] always opens its own socket on the
//!   calling thread, and [`in_netns`] runs its closure on a fresh OS thread
//!   that `setns`es first and exits afterwards (it is never reused).
//! - [`with_handle`] builds a current-thread tokio runtime: it must not be
//!   called from inside an async task (use `spawn_blocking`).

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::BorrowedFd;
use std::path::Path;

use futures::TryStreamExt;
use nix::errno::Errno;
use nix::sched::{setns, CloneFlags};
use rtnetlink::packet_route::address::{AddressAttribute, AddressMessage};
use rtnetlink::packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteHeader, RouteMessage};
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::{Handle, RouteMessageBuilder};

use super::PodnetError;

/// Runs `f` with a netlink handle whose socket is opened on the calling
/// thread (hence in its network namespace), on a current-thread runtime.
pub(super) fn with_handle<T, F, Fut>(f: F) -> Result<T, PodnetError>
where
    F: FnOnce(Handle) -> Fut,
    Fut: Future<Output = Result<T, PodnetError>>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|e| PodnetError::Other(format!("cannot build a tokio runtime: {e}")))?;
    rt.block_on(async move {
        let (conn, handle, _) = rtnetlink::new_connection().map_err(|e| PodnetError::Netlink {
            step: "open a netlink socket".into(),
            reason: e.to_string(),
        })?;
        let task = tokio::spawn(conn);
        let out = f(handle).await;
        task.abort();
        out
    })
}

/// Runs `f` on a new OS thread that first enters the network namespace
/// `ns` (an open nsfs file, `ns_path` only names it in errors). The thread
/// exits when `f` returns, so no thread outlives its namespace switch.
pub(super) fn in_netns<T, F>(ns: BorrowedFd<'_>, ns_path: &Path, f: F) -> Result<T, PodnetError>
where
    T: Send,
    F: FnOnce() -> Result<T, PodnetError> + Send,
{
    std::thread::scope(|s| {
        let joined = std::thread::Builder::new()
            .name("oxvs-netns".into())
            .spawn_scoped(s, move || {
                setns(ns, CloneFlags::CLONE_NEWNET).map_err(|e| PodnetError::Netlink {
                    step: format!("enter network namespace {}", ns_path.display()),
                    reason: e.desc().to_string(),
                })?;
                f()
            })
            .map_err(|e| PodnetError::Other(format!("cannot spawn a netns thread: {e}")))?
            .join();
        joined.unwrap_or_else(|_| {
            Err(PodnetError::Other(format!(
                "the thread working in {} panicked",
                ns_path.display()
            )))
        })
    })
}

/// The errno of a netlink NACK, if that is what `e` is.
pub(super) fn errno(e: &rtnetlink::Error) -> Option<Errno> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| Errno::from_raw(-c.get())),
        _ => None,
    }
}

/// A [`PodnetError::Netlink`] for `step`, the reason rendered with the
/// errno name when there is one.
pub(super) fn nl_err(step: impl Into<String>, e: &rtnetlink::Error) -> PodnetError {
    let reason = match errno(e) {
        Some(n) => format!("{n}: {}", n.desc()),
        None => e.to_string(),
    };
    PodnetError::Netlink {
        step: step.into(),
        reason,
    }
}

/// The link named `name`, `None` when there is none (ENODEV).
pub(super) async fn link_by_name(
    h: &Handle,
    name: &str,
) -> Result<Option<LinkMessage>, PodnetError> {
    let res = h.link().get().match_name(name).execute().try_next().await;
    match res {
        Ok(m) => Ok(m),
        Err(e) if errno(&e) == Some(Errno::ENODEV) => Ok(None),
        Err(e) => Err(nl_err(format!("get link '{name}'"), &e)),
    }
}

/// The name of the link with index `index`, if any.
pub(super) async fn link_name_by_index(
    h: &Handle,
    index: u32,
) -> Result<Option<String>, PodnetError> {
    let res = h.link().get().match_index(index).execute().try_next().await;
    match res {
        Ok(m) => Ok(m.as_ref().and_then(link_name)),
        Err(e) if errno(&e) == Some(Errno::ENODEV) => Ok(None),
        Err(e) => Err(nl_err(format!("get link index {index}"), &e)),
    }
}

pub(super) fn link_name(m: &LinkMessage) -> Option<String> {
    m.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some(n.clone()),
        _ => None,
    })
}

pub(super) fn link_alias(m: &LinkMessage) -> Option<String> {
    m.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfAlias(n) => Some(n.clone()),
        _ => None,
    })
}

/// Every IPv4 address of the namespace (any link), with its prefix length.
pub(super) async fn all_ipv4_addresses(h: &Handle) -> Result<Vec<(Ipv4Addr, u8)>, PodnetError> {
    let mut req = h.address().get();
    req.message_mut().header.family = AddressFamily::Inet;
    let msgs: Vec<AddressMessage> = req
        .execute()
        .try_collect()
        .await
        .map_err(|e| nl_err("list IPv4 addresses", &e))?;
    Ok(msgs
        .iter()
        .filter_map(|m| {
            m.attributes.iter().find_map(|a| match a {
                AddressAttribute::Local(IpAddr::V4(ip)) => Some((*ip, m.header.prefix_len)),
                _ => None,
            })
        })
        .collect())
}

pub(super) fn link_mac(m: &LinkMessage) -> Option<[u8; 6]> {
    m.attributes.iter().find_map(|a| match a {
        LinkAttribute::Address(v) => <[u8; 6]>::try_from(v.as_slice()).ok(),
        _ => None,
    })
}

pub(super) fn link_mtu(m: &LinkMessage) -> Option<u32> {
    m.attributes.iter().find_map(|a| match a {
        LinkAttribute::Mtu(v) => Some(*v),
        _ => None,
    })
}

pub(super) fn link_is_up(m: &LinkMessage) -> bool {
    m.header.flags.contains(LinkFlags::Up)
}

/// The IPv4 addresses (with prefix length) on link `index`.
pub(super) async fn ipv4_addresses(
    h: &Handle,
    index: u32,
) -> Result<Vec<(Ipv4Addr, u8)>, PodnetError> {
    let mut req = h.address().get().set_link_index_filter(index);
    req.message_mut().header.family = AddressFamily::Inet;
    let msgs: Vec<AddressMessage> = req
        .execute()
        .try_collect()
        .await
        .map_err(|e| nl_err(format!("list addresses of link index {index}"), &e))?;
    Ok(msgs
        .iter()
        // The kernel may ignore the filters (no strict checking): re-check.
        .filter(|m| m.header.index == index)
        .filter_map(|m| {
            let local = m.attributes.iter().find_map(|a| match a {
                AddressAttribute::Local(IpAddr::V4(ip)) => Some(*ip),
                _ => None,
            });
            let addr = m.attributes.iter().find_map(|a| match a {
                AddressAttribute::Address(IpAddr::V4(ip)) => Some(*ip),
                _ => None,
            });
            local.or(addr).map(|ip| (ip, m.header.prefix_len))
        })
        .collect())
}

/// An IPv4 default route of the main table: its gateway, output interface
/// and metric.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct DefaultRoute {
    pub gateway: Option<Ipv4Addr>,
    pub oif: Option<u32>,
    pub metric: u32,
}

/// Every IPv4 default route in the main table.
pub(super) async fn ipv4_default_routes(h: &Handle) -> Result<Vec<DefaultRoute>, PodnetError> {
    let msgs: Vec<RouteMessage> = h
        .route()
        .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
        .execute()
        .try_collect()
        .await
        .map_err(|e| nl_err("list IPv4 routes", &e))?;
    Ok(msgs
        .iter()
        .filter(|m| m.header.address_family == AddressFamily::Inet)
        .filter(|m| m.header.destination_prefix_length == 0)
        .filter(|m| route_table(m) == u32::from(RouteHeader::RT_TABLE_MAIN))
        .map(|m| {
            let mut r = DefaultRoute {
                gateway: None,
                oif: None,
                metric: 0,
            };
            for a in &m.attributes {
                match a {
                    RouteAttribute::Gateway(RouteAddress::Inet(gw)) => r.gateway = Some(*gw),
                    RouteAttribute::Oif(i) => r.oif = Some(*i),
                    RouteAttribute::Priority(p) => r.metric = *p,
                    RouteAttribute::MultiPath(hops) if r.oif.is_none() => {
                        r.oif = hops.first().map(|nh| nh.interface_index);
                    }
                    _ => {}
                }
            }
            r
        })
        .collect())
}

fn route_table(m: &RouteMessage) -> u32 {
    m.attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(m.header.table))
}
