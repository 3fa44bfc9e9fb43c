//! IPv4 and IPv6 routes (of the main table unless one is named): add or
//! replace, delete, list the main table's IPv4 default routes; IPv4 policy
//! rules that send one IP protocol to a table: add or replace.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteMetric,
    RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use netlink_packet_route::{AddressFamily, IpProtocol, RouteNetlinkMessage};

use crate::conn::Request;
use crate::{Errno, Error, Netlink};

/// An IPv4 unicast route (of the main table unless `table` says another).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ipv4Route {
    /// `0.0.0.0/0` for the default route.
    pub dst: Ipv4Net,
    pub gateway: Option<Ipv4Addr>,
    /// The output link's index.
    pub oif: Option<u32>,
    /// The gateway need not be in a connected subnet (`onlink`).
    pub onlink: bool,
    /// The path MTU through this route (`ip route ... mtu N`), when lower
    /// than the link's; `None`: the link's. Set on add only (a delete
    /// matches any).
    pub mtu: Option<u32>,
    /// The routing table; `None`: main.
    pub table: Option<u32>,
}

/// An IPv6 unicast route: the same fields as [`Ipv4Route`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ipv6Route {
    /// `::/0` for the default route.
    pub dst: Ipv6Net,
    pub gateway: Option<Ipv6Addr>,
    pub oif: Option<u32>,
    pub onlink: bool,
    pub mtu: Option<u32>,
    pub table: Option<u32>,
}

/// A route of either family, as the request builders see it.
pub(crate) struct Spec {
    family: AddressFamily,
    prefix_len: u8,
    dst: RouteAddress,
    gateway: Option<RouteAddress>,
    oif: Option<u32>,
    onlink: bool,
    mtu: Option<u32>,
    table: Option<u32>,
}

impl From<&Ipv4Route> for Spec {
    fn from(r: &Ipv4Route) -> Spec {
        Spec {
            family: AddressFamily::Inet,
            prefix_len: r.dst.prefix_len(),
            dst: RouteAddress::Inet(r.dst.network()),
            gateway: r.gateway.map(RouteAddress::Inet),
            oif: r.oif,
            onlink: r.onlink,
            mtu: r.mtu,
            table: r.table,
        }
    }
}

impl From<&Ipv6Route> for Spec {
    fn from(r: &Ipv6Route) -> Spec {
        Spec {
            family: AddressFamily::Inet6,
            prefix_len: r.dst.prefix_len(),
            dst: RouteAddress::Inet6(r.dst.network()),
            gateway: r.gateway.map(RouteAddress::Inet6),
            oif: r.oif,
            onlink: r.onlink,
            mtu: r.mtu,
            table: r.table,
        }
    }
}

fn message(r: &Spec) -> RouteMessage {
    let mut m = RouteMessage::default();
    m.header.address_family = r.family;
    match r.table {
        None => m.header.table = RouteHeader::RT_TABLE_MAIN,
        Some(t) => match u8::try_from(t) {
            Ok(small) => m.header.table = small,
            Err(_) => {
                m.header.table = RouteHeader::RT_TABLE_UNSPEC;
                m.attributes.push(RouteAttribute::Table(t));
            }
        },
    }
    m.header.destination_prefix_length = r.prefix_len;
    if r.prefix_len > 0 {
        m.attributes
            .push(RouteAttribute::Destination(r.dst.clone()));
    }
    if let Some(gw) = &r.gateway {
        m.attributes.push(RouteAttribute::Gateway(gw.clone()));
    }
    if let Some(oif) = r.oif {
        m.attributes.push(RouteAttribute::Oif(oif));
    }
    if r.onlink {
        m.header.flags.insert(RouteFlags::Onlink);
    }
    m
}

pub(crate) fn add_request(r: &Spec, replace: bool) -> Request {
    let mut m = message(r);
    if let Some(mtu) = r.mtu {
        m.attributes
            .push(RouteAttribute::Metrics(vec![RouteMetric::Mtu(mtu)]));
    }
    m.header.protocol = RouteProtocol::Static;
    m.header.kind = RouteType::Unicast;
    // Without a gateway the destination is on the link.
    m.header.scope = if r.gateway.is_none() && r.oif.is_some() {
        RouteScope::Link
    } else {
        RouteScope::Universe
    };
    let flags = NLM_F_CREATE | if replace { NLM_F_REPLACE } else { NLM_F_EXCL };
    Request::acked(RouteNetlinkMessage::NewRoute(m), flags)
}

pub(crate) fn delete_request(r: &Spec) -> Request {
    // As `ip route del`: any protocol, scope and type; the route's fields
    // that are set must match.
    let mut m = message(r);
    m.header.protocol = RouteProtocol::Unspec;
    m.header.scope = RouteScope::NoWhere;
    m.header.kind = RouteType::Unspec;
    Request::acked(RouteNetlinkMessage::DelRoute(m), 0)
}

/// An IPv4 policy rule: packets of IP protocol `ip_proto` look their route
/// up in `table` (`ip rule add priority P ipproto N lookup T`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ipv4Rule {
    pub priority: u32,
    pub ip_proto: u8,
    pub table: u32,
}

pub(crate) fn add_rule_request(r: &Ipv4Rule) -> Request {
    rule_request(r, AddressFamily::Inet)
}

/// [`add_rule_request`] for IPv6 (`ip -6 rule add ...`): the same fields.
pub(crate) fn add_ipv6_rule_request(r: &Ipv4Rule) -> Request {
    rule_request(r, AddressFamily::Inet6)
}

fn rule_request(r: &Ipv4Rule, family: AddressFamily) -> Request {
    let mut m = RuleMessage::default();
    m.header.family = family;
    m.header.table = RouteHeader::RT_TABLE_UNSPEC;
    m.header.action = RuleAction::ToTable;
    m.attributes.push(RuleAttribute::Priority(r.priority));
    m.attributes.push(RuleAttribute::Table(r.table));
    m.attributes
        .push(RuleAttribute::IpProtocol(IpProtocol::from(r.ip_proto)));
    Request::acked(RouteNetlinkMessage::NewRule(m), NLM_F_CREATE | NLM_F_EXCL)
}

/// An IPv4 default route of the main table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DefaultRoute {
    pub gateway: Option<Ipv4Addr>,
    /// The output link's index (the first next hop's for a multipath
    /// route).
    pub oif: Option<u32>,
    pub metric: u32,
}

fn table(m: &RouteMessage) -> u32 {
    m.attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(m.header.table))
}

impl Netlink {
    /// Adds `route`; with `replace`, replaces a route to the same
    /// destination (and is then idempotent), else `EEXIST` if there is one.
    pub fn add_route(&mut self, route: &Ipv4Route, replace: bool) -> Result<(), Error> {
        self.request(add_request(&route.into(), replace)).map(drop)
    }

    /// [`Netlink::add_route`] for IPv6.
    pub fn add_ipv6_route(&mut self, route: &Ipv6Route, replace: bool) -> Result<(), Error> {
        self.request(add_request(&route.into(), replace)).map(drop)
    }

    /// Deletes the route to `route.dst` that matches its gateway and output
    /// link where those are set. `Ok(false)` if there was none.
    pub fn delete_route(&mut self, route: &Ipv4Route) -> Result<bool, Error> {
        self.delete_spec(&route.into())
    }

    /// [`Netlink::delete_route`] for IPv6.
    pub fn delete_ipv6_route(&mut self, route: &Ipv6Route) -> Result<bool, Error> {
        self.delete_spec(&route.into())
    }

    fn delete_spec(&mut self, route: &Spec) -> Result<bool, Error> {
        match self.request(delete_request(route)) {
            Ok(_) => Ok(true),
            Err(e) if matches!(e.errno(), Some(Errno::ESRCH) | Some(Errno::ENOENT)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Adds `rule`; `EEXIST` if an identical one exists.
    pub fn add_rule(&mut self, rule: &Ipv4Rule) -> Result<(), Error> {
        self.request(add_rule_request(rule)).map(drop)
    }

    /// Every IPv4 route of the main table (a dump).
    fn main_ipv4_routes(&mut self) -> Result<Vec<RouteMessage>, Error> {
        self.main_routes(AddressFamily::Inet)
    }

    /// The main table's routes of `family`.
    fn main_routes(&mut self, family: AddressFamily) -> Result<Vec<RouteMessage>, Error> {
        let mut req = RouteMessage::default();
        req.header.address_family = family;
        let msgs = self.request(Request::dump(RouteNetlinkMessage::GetRoute(req)))?;
        Ok(msgs
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRoute(r) => Some(r),
                _ => None,
            })
            .filter(|m| m.header.address_family == family)
            .filter(|m| table(m) == u32::from(RouteHeader::RT_TABLE_MAIN))
            .collect())
    }

    /// The destinations of the main table's IPv6 routes through `gateway`
    /// on link `oif` ([`Self::ipv4_routes_via`]'s IPv6 twin).
    pub fn ipv6_routes_via(&mut self, gateway: Ipv6Addr, oif: u32) -> Result<Vec<Ipv6Net>, Error> {
        Ok(self
            .main_routes(AddressFamily::Inet6)?
            .into_iter()
            .filter(|m| {
                m.attributes
                    .contains(&RouteAttribute::Gateway(RouteAddress::Inet6(gateway)))
                    && m.attributes.contains(&RouteAttribute::Oif(oif))
            })
            .filter_map(|m| {
                let dst = m.attributes.iter().find_map(|a| match a {
                    RouteAttribute::Destination(RouteAddress::Inet6(d)) => Some(*d),
                    _ => None,
                })?;
                Ipv6Net::new(dst, m.header.destination_prefix_length).ok()
            })
            .collect())
    }

    /// The destinations of the main table's IPv4 routes through `gateway`
    /// on link `oif` (what an owner of that next hop set, to reconcile
    /// after a restart).
    pub fn ipv4_routes_via(&mut self, gateway: Ipv4Addr, oif: u32) -> Result<Vec<Ipv4Net>, Error> {
        Ok(self
            .main_ipv4_routes()?
            .into_iter()
            .filter(|m| {
                m.attributes
                    .contains(&RouteAttribute::Gateway(RouteAddress::Inet(gateway)))
                    && m.attributes.contains(&RouteAttribute::Oif(oif))
            })
            .filter_map(|m| {
                let dst = m.attributes.iter().find_map(|a| match a {
                    RouteAttribute::Destination(RouteAddress::Inet(d)) => Some(*d),
                    _ => None,
                })?;
                Ipv4Net::new(dst, m.header.destination_prefix_length).ok()
            })
            .collect())
    }

    /// Every IPv4 default route of the main table.
    pub fn ipv4_default_routes(&mut self) -> Result<Vec<DefaultRoute>, Error> {
        Ok(self
            .main_ipv4_routes()?
            .into_iter()
            .filter(|m| m.header.destination_prefix_length == 0)
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn onlink_replace_route_message() {
        let r = Ipv4Route {
            dst: "10.244.2.0/24".parse().unwrap(),
            gateway: Some(Ipv4Addr::new(10, 244, 2, 1)),
            oif: Some(5),
            onlink: true,
            mtu: Some(1450),
            table: None,
        };
        let req = add_request(&(&r).into(), true);
        let RouteNetlinkMessage::NewRoute(m) = req.msg_for_test() else {
            panic!()
        };
        assert_eq!(m.header.destination_prefix_length, 24);
        assert!(m.header.flags.contains(RouteFlags::Onlink));
        assert_eq!(m.header.scope, RouteScope::Universe);
        assert!(m
            .attributes
            .contains(&RouteAttribute::Destination(RouteAddress::Inet(
                Ipv4Addr::new(10, 244, 2, 0)
            ))));
        assert!(m
            .attributes
            .contains(&RouteAttribute::Metrics(vec![RouteMetric::Mtu(1450)])));
        assert_ne!(req.flags_for_test() & NLM_F_REPLACE, 0);
        assert_eq!(req.flags_for_test() & NLM_F_EXCL, 0);

        let default = Ipv4Route {
            dst: Ipv4Net::default(),
            gateway: Some(Ipv4Addr::new(10, 0, 0, 1)),
            oif: Some(2),
            onlink: false,
            mtu: None,
            table: None,
        };
        let RouteNetlinkMessage::NewRoute(m) = add_request(&(&default).into(), false)
            .msg_for_test()
            .clone()
        else {
            panic!()
        };
        assert_eq!(m.header.destination_prefix_length, 0);
        assert!(!m
            .attributes
            .iter()
            .any(|a| matches!(a, RouteAttribute::Destination(_))));
    }

    #[test]
    fn ipv6_route_message() {
        let r = Ipv6Route {
            dst: "fd00:10:244:2::/64".parse().unwrap(),
            gateway: Some("fd00:10:244:2::1".parse().unwrap()),
            oif: Some(5),
            onlink: true,
            mtu: None,
            table: None,
        };
        let req = add_request(&(&r).into(), false);
        let RouteNetlinkMessage::NewRoute(m) = req.msg_for_test() else {
            panic!()
        };
        assert_eq!(m.header.address_family, AddressFamily::Inet6);
        assert_eq!(m.header.destination_prefix_length, 64);
        assert!(m.header.flags.contains(RouteFlags::Onlink));
        assert!(m
            .attributes
            .contains(&RouteAttribute::Gateway(RouteAddress::Inet6(
                "fd00:10:244:2::1".parse().unwrap()
            ))));
        assert!(m
            .attributes
            .contains(&RouteAttribute::Destination(RouteAddress::Inet6(
                "fd00:10:244:2::".parse().unwrap()
            ))));
    }
}
