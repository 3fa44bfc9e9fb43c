//! Links: look up, list, create (veth pair, dummy), delete, change.

use std::os::fd::{AsRawFd, BorrowedFd};

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage, LinkXdp,
    XdpAttached,
};
use netlink_packet_route::RouteNetlinkMessage;

use crate::conn::{Answer, Request};
use crate::{check_ifname, Errno, Error, Netlink};

/// A link as the kernel reports it (`RTM_NEWLINK`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    /// Its Ethernet address (none for links without a 6-byte address).
    pub mac: Option<[u8; 6]>,
    pub mtu: Option<u32>,
    /// Administratively up (`IFF_UP`).
    pub up: bool,
    /// `IFLA_IFALIAS`, if set.
    pub alias: Option<String>,
    /// The link kind (`veth`, `dummy`, ...), for links made by a driver
    /// that reports one.
    pub kind: Option<String>,
    /// An XDP program is attached (in any mode), what `ip link show`
    /// prints as `xdp`, `xdpgeneric`, ...
    pub xdp: bool,
    /// The index of the link it is paired with or stacked on
    /// (`IFLA_LINK`: a veth's peer) when that link is in the same
    /// namespace (no `IFLA_LINK_NETNSID`).
    pub peer_here: Option<u32>,
}

impl Link {
    fn from_message(m: &LinkMessage) -> Link {
        let mut l = Link {
            index: m.header.index,
            name: String::new(),
            mac: None,
            mtu: None,
            up: m.header.flags.contains(LinkFlags::Up),
            alias: None,
            kind: None,
            xdp: false,
            peer_here: None,
        };
        let mut other_ns = false;
        for a in &m.attributes {
            match a {
                LinkAttribute::IfName(n) => l.name = n.clone(),
                LinkAttribute::Address(v) => l.mac = <[u8; 6]>::try_from(v.as_slice()).ok(),
                LinkAttribute::Mtu(v) => l.mtu = Some(*v),
                LinkAttribute::IfAlias(v) => l.alias = Some(v.clone()),
                LinkAttribute::LinkInfo(infos) => {
                    l.kind = infos.iter().find_map(|i| match i {
                        LinkInfo::Kind(k) => Some(k.to_string()),
                        _ => None,
                    })
                }
                LinkAttribute::Xdp(xdp) => {
                    l.xdp = xdp
                        .iter()
                        .any(|x| matches!(x, LinkXdp::Attached(a) if *a != XdpAttached::None))
                }
                LinkAttribute::Link(i) if *i != l.index && *i != 0 => l.peer_here = Some(*i),
                LinkAttribute::LinkNetNsId(_) => other_ns = true,
                _ => {}
            }
        }
        if other_ns {
            l.peer_here = None;
        }
        l
    }
}

/// One end of a new link: its name and what to set at creation.
#[derive(Clone, Debug, Default)]
pub struct LinkSpec<'a> {
    pub name: String,
    pub mtu: Option<u32>,
    pub mac: Option<[u8; 6]>,
    /// Created up. Not for a veth peer: the kernel opens the peer before
    /// pairing it, and opening it then fails (`ENOTCONN`).
    pub up: bool,
    /// Number of TX and of RX queues (`numtxqueues`, `numrxqueues`).
    pub queues: Option<u32>,
    /// Created directly in this network namespace (an open nsfs file)
    /// instead of the socket's.
    pub netns: Option<BorrowedFd<'a>>,
}

impl LinkSpec<'_> {
    /// A spec with only a name.
    pub fn named(name: impl Into<String>) -> Self {
        LinkSpec {
            name: name.into(),
            ..Default::default()
        }
    }

    fn check(&self) -> Result<(), Error> {
        check_ifname(&self.name)
    }

    fn message(&self) -> LinkMessage {
        let mut m = LinkMessage::default();
        if self.up {
            m.header.flags |= LinkFlags::Up;
            m.header.change_mask |= LinkFlags::Up;
        }
        m.attributes.push(LinkAttribute::IfName(self.name.clone()));
        if let Some(mtu) = self.mtu {
            m.attributes.push(LinkAttribute::Mtu(mtu));
        }
        if let Some(mac) = self.mac {
            m.attributes.push(LinkAttribute::Address(mac.to_vec()));
        }
        if let Some(q) = self.queues {
            m.attributes.push(LinkAttribute::NumTxQueues(q));
            m.attributes.push(LinkAttribute::NumRxQueues(q));
        }
        if let Some(ns) = self.netns {
            m.attributes.push(LinkAttribute::NetNsFd(ns.as_raw_fd()));
        }
        m
    }
}

/// A link to create.
#[derive(Clone, Debug)]
pub enum NewLink<'a> {
    /// A `dummy` device (the kernel may lack the module: `EOPNOTSUPP`).
    Dummy(LinkSpec<'a>),
    /// A veth pair; deleting either end deletes both.
    Veth {
        end: LinkSpec<'a>,
        peer: LinkSpec<'a>,
    },
}

impl NewLink<'_> {
    /// The name of the link the socket's namespace gets (the first end).
    pub fn name(&self) -> &str {
        match self {
            NewLink::Dummy(s) => &s.name,
            NewLink::Veth { end, .. } => &end.name,
        }
    }

    fn request(&self) -> Result<Request, Error> {
        let (spec, kind, data) = match self {
            NewLink::Dummy(s) => (s, InfoKind::Dummy, None),
            NewLink::Veth { end, peer } => {
                peer.check()?;
                (
                    end,
                    InfoKind::Veth,
                    Some(InfoData::Veth(InfoVeth::Peer(peer.message()))),
                )
            }
        };
        spec.check()?;
        let mut m = spec.message();
        let mut info = vec![LinkInfo::Kind(kind)];
        info.extend(data.map(LinkInfo::Data));
        m.attributes.push(LinkAttribute::LinkInfo(info));
        Ok(Request::acked(
            RouteNetlinkMessage::NewLink(m),
            NLM_F_CREATE | NLM_F_EXCL,
        ))
    }
}

/// Changes to an existing link; `None` leaves a setting alone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkChange {
    /// Administratively up (`true`) or down.
    pub up: Option<bool>,
    pub mtu: Option<u32>,
    pub alias: Option<String>,
}

impl LinkChange {
    /// Only "bring it up".
    pub fn up() -> Self {
        LinkChange {
            up: Some(true),
            ..Default::default()
        }
    }
}

pub(crate) fn set_request(index: u32, c: &LinkChange) -> Request {
    let mut m = LinkMessage::default();
    m.header.index = index;
    if let Some(up) = c.up {
        if up {
            m.header.flags |= LinkFlags::Up;
        }
        m.header.change_mask |= LinkFlags::Up;
    }
    if let Some(mtu) = c.mtu {
        m.attributes.push(LinkAttribute::Mtu(mtu));
    }
    if let Some(alias) = &c.alias {
        m.attributes.push(LinkAttribute::IfAlias(alias.clone()));
    }
    Request::acked(RouteNetlinkMessage::SetLink(m), 0)
}

pub(crate) fn delete_index_request(index: u32) -> Request {
    let mut m = LinkMessage::default();
    m.header.index = index;
    Request::acked(RouteNetlinkMessage::DelLink(m), 0)
}

fn get_name_request(name: &str) -> Request {
    let mut m = LinkMessage::default();
    m.attributes.push(LinkAttribute::IfName(name.to_string()));
    Request::acked(RouteNetlinkMessage::GetLink(m), 0)
}

/// The link of a `GET` answer; ENODEV is "none".
fn one_link(a: Answer) -> Result<Option<Link>, Error> {
    match a {
        Ok(msgs) => Ok(msgs.iter().find_map(|m| match m {
            RouteNetlinkMessage::NewLink(l) => Some(Link::from_message(l)),
            _ => None,
        })),
        Err(e) if e.errno() == Some(Errno::ENODEV) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `Ok(false)` for ENODEV.
fn existed(r: Result<(), Error>) -> Result<bool, Error> {
    match r {
        Ok(()) => Ok(true),
        Err(e) if e.errno() == Some(Errno::ENODEV) => Ok(false),
        Err(e) => Err(e),
    }
}

impl Netlink {
    /// The link called `name`, `None` if there is none.
    pub fn link(&mut self, name: &str) -> Result<Option<Link>, Error> {
        check_ifname(name)?;
        one_link(self.request(get_name_request(name)))
    }

    /// The link called `name`; `ENODEV` if there is none.
    pub fn existing_link(&mut self, name: &str) -> Result<Link, Error> {
        self.link(name)?.ok_or(Error::Kernel(Errno::ENODEV))
    }

    /// The link with index `index`, `None` if there is none.
    pub fn link_by_index(&mut self, index: u32) -> Result<Option<Link>, Error> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        one_link(self.request(Request::acked(RouteNetlinkMessage::GetLink(m), 0)))
    }

    /// Every link of the namespace.
    pub fn links(&mut self) -> Result<Vec<Link>, Error> {
        let msgs = self.request(Request::dump(RouteNetlinkMessage::GetLink(
            LinkMessage::default(),
        )))?;
        Ok(msgs
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(Link::from_message(l)),
                _ => None,
            })
            .collect())
    }

    /// Creates `link`; `EEXIST` if a name is taken (for a veth pair, either
    /// end's, in its namespace).
    pub fn add_link(&mut self, link: &NewLink<'_>) -> Result<(), Error> {
        let req = link.request()?;
        self.request(req).map(drop)
    }

    /// Creates `link` and returns it as the kernel made it (index, MAC),
    /// the lookup sent right behind the creation, answered in one round
    /// trip. If the creation fails, so does this, with its error.
    pub fn add_link_and_get(&mut self, link: &NewLink<'_>) -> Result<Link, Error> {
        let add = link.request()?;
        let get = get_name_request(link.name());
        let mut answers = self.exchange(vec![add, get])?.into_iter();
        let added = answers.next().unwrap_or(Err(Error::Kernel(Errno::EIO)));
        let got = answers.next().unwrap_or(Err(Error::Kernel(Errno::EIO)));
        added?;
        // Gone already: someone deleted it right away.
        one_link(got)?.ok_or(Error::Kernel(Errno::ENODEV))
    }

    /// Deletes the link `name` (a veth pair's peer goes with it).
    /// `Ok(false)` if there was none (without `CAP_NET_ADMIN` the kernel
    /// answers `EPERM` before it looks: check with [`Netlink::link`] first
    /// where that matters).
    pub fn delete_link(&mut self, name: &str) -> Result<bool, Error> {
        check_ifname(name)?;
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.to_string()));
        existed(
            self.request(Request::acked(RouteNetlinkMessage::DelLink(m), 0))
                .map(drop),
        )
    }

    /// Deletes the link with index `index`. `Ok(false)` if there was none.
    pub fn delete_link_index(&mut self, index: u32) -> Result<bool, Error> {
        existed(self.request(delete_index_request(index)).map(drop))
    }

    /// Applies `change` to the link with index `index`.
    pub fn set_link(&mut self, index: u32, change: &LinkChange) -> Result<(), Error> {
        self.request(set_request(index, change)).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn veth_request_carries_both_ends() {
        let new = NewLink::Veth {
            end: LinkSpec {
                mtu: Some(1450),
                up: true,
                queues: Some(4),
                ..LinkSpec::named("a")
            },
            peer: LinkSpec {
                mac: Some([2, 0, 0, 0, 0, 1]),
                ..LinkSpec::named("b")
            },
        };
        let req = new.request().unwrap();
        let RouteNetlinkMessage::NewLink(m) = &req.msg_for_test() else {
            panic!("not a NEWLINK");
        };
        assert!(m.header.flags.contains(LinkFlags::Up));
        assert!(m.attributes.contains(&LinkAttribute::IfName("a".into())));
        assert!(m.attributes.contains(&LinkAttribute::Mtu(1450)));
        assert!(m.attributes.contains(&LinkAttribute::NumTxQueues(4)));
        assert!(m.attributes.contains(&LinkAttribute::NumRxQueues(4)));
        let info = m
            .attributes
            .iter()
            .find_map(|a| match a {
                LinkAttribute::LinkInfo(i) => Some(i),
                _ => None,
            })
            .unwrap();
        assert_eq!(info[0], LinkInfo::Kind(InfoKind::Veth));
        let LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(p))) = &info[1] else {
            panic!("no peer");
        };
        assert!(p.attributes.contains(&LinkAttribute::IfName("b".into())));
        assert!(p
            .attributes
            .contains(&LinkAttribute::Address(vec![2, 0, 0, 0, 0, 1])));
        assert!(!p.header.flags.contains(LinkFlags::Up));
    }

    #[test]
    fn bad_names_are_refused_before_sending() {
        let new = NewLink::Veth {
            end: LinkSpec::named("ok"),
            peer: LinkSpec::named("not/ok"),
        };
        assert!(matches!(new.request(), Err(Error::BadName(n)) if n == "not/ok"));
        assert!(matches!(
            NewLink::Dummy(LinkSpec::named("")).request(),
            Err(Error::BadName(_))
        ));
    }

    #[test]
    fn link_decodes_what_we_read() {
        let mut m = LinkMessage::default();
        m.header.index = 7;
        m.header.flags = LinkFlags::Up;
        m.attributes = vec![
            LinkAttribute::IfName("gw0".into()),
            LinkAttribute::Address(vec![1, 2, 3, 4, 5, 6]),
            LinkAttribute::Mtu(9000),
            LinkAttribute::IfAlias("oxvs:eth0:c".into()),
            LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Dummy)]),
            LinkAttribute::Xdp(vec![LinkXdp::Attached(XdpAttached::SocketBuffer)]),
        ];
        let l = Link::from_message(&m);
        assert_eq!(
            l,
            Link {
                index: 7,
                name: "gw0".into(),
                mac: Some([1, 2, 3, 4, 5, 6]),
                mtu: Some(9000),
                up: true,
                alias: Some("oxvs:eth0:c".into()),
                kind: Some("dummy".into()),
                xdp: true,
                peer_here: None,
            }
        );
        m.attributes = vec![LinkAttribute::Xdp(vec![LinkXdp::Attached(
            XdpAttached::None,
        )])];
        let l = Link::from_message(&m);
        assert!(!l.xdp && l.mac.is_none() && l.kind.is_none());
    }
}
