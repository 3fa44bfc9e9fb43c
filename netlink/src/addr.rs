//! Addresses: add, list.

use std::net::IpAddr;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::address::{AddressAttribute, AddressHeaderFlags, AddressMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use crate::conn::Request;
use crate::{Error, Netlink};

/// An address on a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Address {
    /// The link's index.
    pub index: u32,
    pub ip: IpAddr,
    pub prefix_len: u8,
}

pub(crate) fn add_request(index: u32, ip: IpAddr, prefix_len: u8) -> Request {
    // What `ip address add` sends: the address as both local and
    // (peer) address, and for IPv4 the broadcast address of its subnet.
    let mut m = AddressMessage::default();
    m.header.index = index;
    m.header.prefix_len = prefix_len;
    m.header.family = match ip {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    };
    m.attributes.push(AddressAttribute::Local(ip));
    m.attributes.push(AddressAttribute::Address(ip));
    if ip.is_ipv6() {
        // No duplicate address detection (`ip address add ... nodad`): the
        // address is usable at once, not tentative for a second; the
        // addresses oxvs adds are its own allocations, unique by
        // construction.
        m.header.flags = AddressHeaderFlags::Nodad;
    }
    if let IpAddr::V4(v4) = ip {
        if prefix_len < 31 {
            let host = u32::MAX.checked_shr(u32::from(prefix_len)).unwrap_or(0);
            m.attributes
                .push(AddressAttribute::Broadcast((u32::from(v4) | host).into()));
        }
    }
    Request::acked(
        RouteNetlinkMessage::NewAddress(m),
        NLM_F_CREATE | NLM_F_EXCL,
    )
}

impl Netlink {
    /// Adds `ip/prefix_len` to the link with index `index`; `EEXIST` if it
    /// has it already.
    pub fn add_address(&mut self, index: u32, ip: IpAddr, prefix_len: u8) -> Result<(), Error> {
        let max = if ip.is_ipv4() { 32 } else { 128 };
        if prefix_len > max {
            return Err(Error::Kernel(crate::Errno::EINVAL));
        }
        self.request(add_request(index, ip, prefix_len)).map(drop)
    }

    /// The addresses of the link with index `index` (every link's for
    /// `None`), IPv4 and IPv6.
    pub fn addresses(&mut self, index: Option<u32>) -> Result<Vec<Address>, Error> {
        let msgs = self.request(Request::dump(RouteNetlinkMessage::GetAddress(
            AddressMessage::default(),
        )))?;
        Ok(msgs
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewAddress(a) => Some(a),
                _ => None,
            })
            .filter(|m| index.is_none_or(|i| m.header.index == i))
            .filter_map(|m| {
                // The local address; `Address` is the peer's on a
                // point-to-point link, and the only one for IPv6.
                let local = m.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Local(ip) => Some(*ip),
                    _ => None,
                });
                let addr = m.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Address(ip) => Some(*ip),
                    _ => None,
                });
                local.or(addr).map(|ip| Address {
                    index: m.header.index,
                    ip,
                    prefix_len: m.header.prefix_len,
                })
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn ipv4_add_has_broadcast() {
        let r = add_request(3, IpAddr::V4(Ipv4Addr::new(10, 244, 1, 1)), 24);
        let RouteNetlinkMessage::NewAddress(m) = r.msg_for_test() else {
            panic!()
        };
        assert_eq!(m.header.index, 3);
        assert_eq!(m.header.prefix_len, 24);
        assert!(m
            .attributes
            .contains(&AddressAttribute::Broadcast(Ipv4Addr::new(10, 244, 1, 255))));
        let r = add_request(3, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 32);
        let RouteNetlinkMessage::NewAddress(m) = r.msg_for_test() else {
            panic!()
        };
        assert!(!m
            .attributes
            .iter()
            .any(|a| matches!(a, AddressAttribute::Broadcast(_))));
        let r = add_request(3, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 0);
        let RouteNetlinkMessage::NewAddress(m) = r.msg_for_test() else {
            panic!()
        };
        assert!(m
            .attributes
            .contains(&AddressAttribute::Broadcast(Ipv4Addr::BROADCAST)));
        assert_ne!(r.flags_for_test() & NLM_F_EXCL, 0);
    }
}
