//! The socket: requests out, answers matched back to them by sequence
//! number.
//!
//! Every request but a dump asks for an acknowledgement (`NLM_F_ACK`), so
//! each ends with exactly one `NLMSG_ERROR` (code 0 for success) after its
//! replies, if any; a dump ends with `NLMSG_DONE` (or an error). Several
//! requests may be sent before the first answer is read: the kernel handles
//! one socket's requests in order and answers each under its own sequence
//! number. Answers to sequence numbers no current exchange waits for (left
//! over after an earlier failure) are dropped.

use std::net::IpAddr;

use netlink_packet_core::{
    NetlinkBuffer, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR,
    NLM_F_REQUEST,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

use crate::link::LinkChange;
use crate::route::Ipv4Route;
use crate::{Errno, Error};

/// How often a dump the kernel reports as interrupted (the table changed
/// while it was read, `NLM_F_DUMP_INTR`) is started again.
const DUMP_TRIES: usize = 5;

/// One `NETLINK_ROUTE` socket, in the network namespace of the thread that
/// opened it. Blocking; not shared between threads (`&mut self`), but it
/// may move to another thread.
pub struct Netlink {
    sock: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl std::fmt::Debug for Netlink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Netlink").field("seq", &self.seq).finish()
    }
}

/// One request and what ends its answer.
pub(crate) struct Request {
    msg: RouteNetlinkMessage,
    flags: u16,
    dump: bool,
}

impl Request {
    /// A request answered by an acknowledgement (after replies, if any):
    /// every change, and a `GET` of one object.
    pub(crate) fn acked(msg: RouteNetlinkMessage, extra_flags: u16) -> Self {
        Request {
            msg,
            flags: NLM_F_REQUEST | NLM_F_ACK | extra_flags,
            dump: false,
        }
    }

    #[cfg(test)]
    pub(crate) fn msg_for_test(&self) -> &RouteNetlinkMessage {
        &self.msg
    }

    #[cfg(test)]
    pub(crate) fn flags_for_test(&self) -> u16 {
        self.flags
    }

    /// A dump: replies until `NLMSG_DONE`.
    pub(crate) fn dump(msg: RouteNetlinkMessage) -> Self {
        Request {
            msg,
            flags: NLM_F_REQUEST | NLM_F_DUMP,
            dump: true,
        }
    }
}

/// A change for [`Netlink::pipeline`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// [`Netlink::set_link`].
    SetLink { index: u32, change: LinkChange },
    /// [`Netlink::add_address`].
    AddAddress {
        index: u32,
        ip: IpAddr,
        prefix_len: u8,
    },
    /// [`Netlink::add_route`].
    AddRoute { route: Ipv4Route, replace: bool },
    /// [`Netlink::add_ipv6_route`].
    AddIpv6Route {
        route: crate::Ipv6Route,
        replace: bool,
    },
    /// [`Netlink::delete_route`] (an absent route is an `ESRCH` error here).
    DeleteRoute(Ipv4Route),
    /// [`Netlink::delete_link_index`] (an absent link is an `ENODEV` error
    /// here).
    DeleteLink { index: u32 },
    /// [`Netlink::add_rule`].
    AddRule(crate::Ipv4Rule),
    /// The same rule for IPv6 (`ip -6 rule add`).
    AddIpv6Rule(crate::Ipv4Rule),
    /// [`Netlink::replace_root_qdisc`] (a kind that cannot be one is sent
    /// as it is: the kernel refuses it).
    ReplaceRootQdisc { index: u32, kind: String },
}

impl Change {
    fn request(&self) -> Request {
        match self {
            Change::SetLink { index, change } => crate::link::set_request(*index, change),
            Change::AddAddress {
                index,
                ip,
                prefix_len,
            } => crate::addr::add_request(*index, *ip, *prefix_len),
            Change::AddRoute { route, replace } => {
                crate::route::add_request(&route.into(), *replace)
            }
            Change::AddIpv6Route { route, replace } => {
                crate::route::add_request(&route.into(), *replace)
            }
            Change::DeleteRoute(route) => crate::route::delete_request(&route.into()),
            Change::DeleteLink { index } => crate::link::delete_index_request(*index),
            Change::AddRule(rule) => crate::route::add_rule_request(rule),
            Change::AddIpv6Rule(rule) => crate::route::add_ipv6_rule_request(rule),
            Change::ReplaceRootQdisc { index, kind } => {
                crate::qdisc::replace_root_request(*index, kind)
            }
        }
    }
}

/// What one request got: its replies, or why it failed.
pub(crate) type Answer = Result<Vec<RouteNetlinkMessage>, Error>;

impl Netlink {
    /// Opens a socket in the calling thread's network namespace.
    pub fn open() -> Result<Netlink, Error> {
        let mut sock = Socket::new(NETLINK_ROUTE).map_err(Error::Socket)?;
        sock.bind_auto().map_err(Error::Socket)?;
        sock.connect(&SocketAddr::new(0, 0))
            .map_err(Error::Socket)?;
        Ok(Netlink {
            sock,
            seq: 0,
            buf: Vec::with_capacity(32 * 1024),
        })
    }

    /// Sends every change before reading any answer, then returns one
    /// result per change, in order. The kernel applies them in order and
    /// each independently: a failed one does not stop the next. `Err` only
    /// when the socket itself fails.
    pub fn pipeline(&mut self, changes: &[Change]) -> Result<Vec<Result<(), Error>>, Error> {
        let reqs = changes.iter().map(Change::request).collect();
        Ok(self
            .exchange(reqs)?
            .into_iter()
            .map(|a| a.map(drop))
            .collect())
    }

    /// Sends `req` and waits for its answer.
    pub(crate) fn request(&mut self, req: Request) -> Answer {
        let dump = req.dump;
        if !dump {
            return self.exchange(vec![req])?.pop().unwrap_or_else(no_answer);
        }
        // A dump the table changed under is read again.
        let (msg, flags) = (req.msg, req.flags);
        let mut last = Err(Error::Kernel(Errno::EINTR));
        for _ in 0..DUMP_TRIES {
            last = self
                .exchange(vec![Request {
                    msg: msg.clone(),
                    flags,
                    dump,
                }])?
                .pop()
                .unwrap_or_else(no_answer);
            if !matches!(last, Err(Error::Kernel(Errno::EINTR))) {
                break;
            }
        }
        last
    }

    /// Sends every request, then reads until each has its answer. At most
    /// one dump per exchange (the kernel runs one dump per socket at a
    /// time). `Err` only when the socket itself fails.
    pub(crate) fn exchange(&mut self, reqs: Vec<Request>) -> Result<Vec<Answer>, Error> {
        let n = reqs.len();
        let first = self.seq.wrapping_add(1);
        let mut dumps = Vec::with_capacity(n);
        let mut out = Vec::new();
        for r in reqs {
            self.seq = self.seq.wrapping_add(1);
            let mut m = NetlinkMessage::from(r.msg);
            m.header.flags = r.flags;
            m.header.sequence_number = self.seq;
            m.finalize();
            out.clear();
            out.resize(m.buffer_len(), 0);
            m.serialize(&mut out);
            self.send(&out)?;
            dumps.push(r.dump);
        }
        let mut answers: Vec<Option<Answer>> = (0..n).map(|_| None).collect();
        let mut replies: Vec<Vec<RouteNetlinkMessage>> = vec![Vec::new(); n];
        // A reply that did not decode, or an interrupted dump: reported once
        // the request's answer is complete.
        let mut spoilt: Vec<Option<Error>> = (0..n).map(|_| None).collect();
        let mut pending = n;
        while pending > 0 {
            self.recv()?;
            let data = &self.buf[..];
            let mut off = 0;
            while data.len() - off >= 16 {
                let nb = NetlinkBuffer::new_checked(&data[off..])
                    .map_err(|e| Error::Decode(e.to_string()))?;
                let len = nb.length() as usize;
                if len < 16 || len > data.len() - off {
                    return Err(Error::Decode(format!(
                        "a message of {len} bytes in a datagram of {} at offset {off}",
                        data.len()
                    )));
                }
                let (seq, flags) = (nb.sequence_number(), nb.flags());
                let raw = &data[off..off + len];
                off += (len + 3) & !3;
                let i = seq.wrapping_sub(first) as usize;
                if i >= n || answers[i].is_some() {
                    continue;
                }
                if dumps[i] && flags & NLM_F_DUMP_INTR != 0 && spoilt[i].is_none() {
                    spoilt[i] = Some(Error::Kernel(Errno::EINTR));
                }
                let msg = match NetlinkMessage::<RouteNetlinkMessage>::deserialize(raw) {
                    Ok(m) => m,
                    Err(e) => {
                        if spoilt[i].is_none() {
                            spoilt[i] = Some(Error::Decode(e.to_string()));
                        }
                        continue;
                    }
                };
                let end = match msg.payload {
                    NetlinkPayload::InnerMessage(m) => {
                        replies[i].push(m);
                        None
                    }
                    NetlinkPayload::Error(e) => Some(match e.code {
                        None => Ok(()),
                        Some(c) => Err(Error::Kernel(Errno::from_raw(-c.get()))),
                    }),
                    NetlinkPayload::Done(d) if d.code < 0 => {
                        Some(Err(Error::Kernel(Errno::from_raw(-d.code))))
                    }
                    NetlinkPayload::Done(_) => Some(Ok(())),
                    NetlinkPayload::Overrun(_) => {
                        Some(Err(Error::Decode("the kernel reports an overrun".into())))
                    }
                    _ => None,
                };
                if let Some(end) = end {
                    let answer = match (end, spoilt[i].take()) {
                        (Err(e), _) => Err(e),
                        (Ok(()), Some(e)) => Err(e),
                        (Ok(()), None) => Ok(std::mem::take(&mut replies[i])),
                    };
                    answers[i] = Some(answer);
                    pending -= 1;
                }
            }
        }
        Ok(answers
            .into_iter()
            .map(|a| a.unwrap_or_else(no_answer))
            .collect())
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), Error> {
        loop {
            match self.sock.send(bytes, 0) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::Socket(e)),
            }
        }
    }

    /// Reads one datagram, whole, into `self.buf`.
    fn recv(&mut self) -> Result<(), Error> {
        loop {
            self.buf.clear();
            let size = match self
                .sock
                .recv(&mut self.buf, libc::MSG_PEEK | libc::MSG_TRUNC)
            {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::Socket(e)),
            };
            self.buf.clear();
            self.buf.reserve(size);
            match self.sock.recv(&mut self.buf, 0) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::Socket(e)),
            }
        }
    }
}

fn no_answer<T>() -> Result<T, Error> {
    Err(Error::Decode("no answer to a request".into()))
}
