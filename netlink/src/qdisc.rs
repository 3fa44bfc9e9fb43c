//! Root queueing disciplines: set (`tc qdisc replace dev D root KIND`),
//! read.

use netlink_packet_core::{NLM_F_CREATE, NLM_F_REPLACE};
use netlink_packet_route::tc::{TcAttribute, TcHandle, TcMessage};
use netlink_packet_route::RouteNetlinkMessage;

use crate::conn::Request;
use crate::{Errno, Error, Netlink};

/// Longest qdisc kind the kernel knows (`IFNAMSIZ` - 1, as `TCA_KIND`).
pub const MAX_QDISC_KIND_LEN: usize = 15;

/// Whether `kind` can name a queueing discipline: 1 to 15 bytes of ASCII
/// letters, digits and `_` (every kind the kernel has: `pfifo`,
/// `pfifo_fast`, `fq_codel`, `noqueue`, ...).
pub fn valid_qdisc_kind(kind: &str) -> bool {
    !kind.is_empty()
        && kind.len() <= MAX_QDISC_KIND_LEN
        && kind.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Which root qdisc a veth that sends into the switch gets: a pod's `eth0`
/// (`oxvs-agent --pod-qdisc`) or the host's end of the gateway
/// (`oxvs-switchd --gateway-qdisc`).
///
/// A veth has none (`noqueue`): when its peer cannot take a frame, the
/// frame is dropped. The switch's end of such a pair runs its XDP
/// program, and a frame sent into it waits on that end's 256-entry ring
/// until the switch's thread takes it; a burst that fills the ring while
/// the thread waits for a CPU loses frames the switch never sees (TCP
/// retransmits them). With a qdisc on the sending end, a veth of Linux
/// 6.16 or later stops that end's queue instead and wakes it when the ring
/// has room: backpressure, as on a NIC. (Earlier kernels drop as before.)
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum RootQdisc {
    /// The node's default (`net.core.default_qdisc`: what a NIC gets;
    /// `pfifo_fast`, or `fq_codel` where systemd sets it). Outside the
    /// host's network namespace, where that sysctl is absent,
    /// `pfifo_fast`, the kernel's own default.
    #[default]
    Auto,
    /// None: the veth's `noqueue`.
    None,
    /// This kind, with its defaults.
    Kind(String),
}

impl std::str::FromStr for RootQdisc {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(RootQdisc::Auto),
            "none" => Ok(RootQdisc::None),
            k if valid_qdisc_kind(k) => Ok(RootQdisc::Kind(k.to_string())),
            k => Err(format!(
                "'{}' is not a qdisc kind (auto, none, or 1 to {MAX_QDISC_KIND_LEN} ASCII letters, digits and '_', as pfifo_fast)",
                k.escape_debug()
            )),
        }
    }
}

/// Where the node's default qdisc is set.
const DEFAULT_QDISC_SYSCTL: &str = "/proc/sys/net/core/default_qdisc";
/// The default qdisc of a kernel whose sysctl nobody changed.
const KERNEL_DEFAULT_QDISC: &str = "pfifo_fast";

impl RootQdisc {
    /// The kind to set (`None`: none), reading the node's default for
    /// [`RootQdisc::Auto`].
    pub fn resolve(&self) -> Result<Option<String>, String> {
        match self {
            RootQdisc::None => Ok(None),
            RootQdisc::Kind(k) => Ok(Some(k.clone())),
            RootQdisc::Auto => match std::fs::read_to_string(DEFAULT_QDISC_SYSCTL) {
                Ok(raw) => Self::from_default_qdisc(&raw),
                // The sysctl exists in the host's network namespace only;
                // elsewhere (a lab node) the kernel's own default.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    Ok(Some(KERNEL_DEFAULT_QDISC.to_string()))
                }
                Err(e) => Err(format!("cannot read {DEFAULT_QDISC_SYSCTL}: {e}")),
            },
        }
    }

    /// [`RootQdisc::Auto`] given the content of `net.core.default_qdisc`.
    fn from_default_qdisc(raw: &str) -> Result<Option<String>, String> {
        let kind = raw.trim();
        if !valid_qdisc_kind(kind) {
            return Err(format!(
                "{DEFAULT_QDISC_SYSCTL} holds '{}', not a qdisc kind",
                kind.escape_debug()
            ));
        }
        // `noqueue` is what a veth has already.
        Ok((kind != "noqueue").then(|| kind.to_string()))
    }
}

pub(crate) fn replace_root_request(index: u32, kind: &str) -> Request {
    // What `tc qdisc replace dev D root KIND` sends with no options: the
    // kernel gives the discipline its defaults (a FIFO's limit is the
    // device's txqueuelen).
    let mut m = TcMessage::with_index(index as i32);
    m.header.parent = TcHandle::ROOT;
    m.attributes.push(TcAttribute::Kind(kind.to_string()));
    Request::acked(
        RouteNetlinkMessage::NewQueueDiscipline(m),
        NLM_F_CREATE | NLM_F_REPLACE,
    )
}

impl Netlink {
    /// Makes a `kind` discipline with its defaults the root qdisc of the
    /// link with index `index`, replacing the one it has. `EINVAL` for a
    /// kind that cannot be one ([`valid_qdisc_kind`]); `ENOENT` for a kind
    /// this kernel lacks.
    pub fn replace_root_qdisc(&mut self, index: u32, kind: &str) -> Result<(), Error> {
        if !valid_qdisc_kind(kind) {
            return Err(Error::Kernel(Errno::EINVAL));
        }
        self.request(replace_root_request(index, kind)).map(drop)
    }

    /// The kind of the root qdisc of the link with index `index` (`noqueue`
    /// for a device that queues nothing, as a veth by default), `None` if
    /// the kernel lists none for it.
    pub fn root_qdisc(&mut self, index: u32) -> Result<Option<String>, Error> {
        let msgs = self.request(Request::dump(RouteNetlinkMessage::GetQueueDiscipline(
            TcMessage::default(),
        )))?;
        Ok(msgs.iter().find_map(|m| match m {
            RouteNetlinkMessage::NewQueueDiscipline(q)
                if q.header.index == index as i32 && q.header.parent == TcHandle::ROOT =>
            {
                q.attributes.iter().find_map(|a| match a {
                    TcAttribute::Kind(k) => Some(k.clone()),
                    _ => None,
                })
            }
            _ => None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds() {
        for ok in [
            "pfifo",
            "pfifo_fast",
            "fq_codel",
            "noqueue",
            "abcdefghijklmno",
        ] {
            assert!(valid_qdisc_kind(ok), "{ok}");
        }
        for bad in ["", "abcdefghijklmnop", "fq-codel", "pfifo ", "a/b", "p\0"] {
            assert!(!valid_qdisc_kind(bad), "{bad:?}");
        }
    }

    #[test]
    fn choices() {
        assert_eq!("auto".parse(), Ok(RootQdisc::Auto));
        assert_eq!("none".parse(), Ok(RootQdisc::None));
        assert_eq!(
            "pfifo_fast".parse(),
            Ok(RootQdisc::Kind("pfifo_fast".into()))
        );
        for bad in ["", "fq-codel", "a b", "abcdefghijklmnop", "../x"] {
            let e = bad.parse::<RootQdisc>().unwrap_err();
            assert!(e.contains("not a qdisc kind"), "{bad:?}: {e}");
        }
        assert_eq!(RootQdisc::None.resolve(), Ok(None));
        assert_eq!(
            RootQdisc::Kind("pfifo".into()).resolve(),
            Ok(Some("pfifo".into()))
        );
        // Auto: the node's default, as the kernel prints it.
        assert_eq!(
            RootQdisc::from_default_qdisc("fq_codel\n"),
            Ok(Some("fq_codel".into()))
        );
        assert_eq!(RootQdisc::from_default_qdisc("noqueue\n"), Ok(None));
        let e = RootQdisc::from_default_qdisc("\n").unwrap_err();
        assert!(e.contains("not a qdisc kind"), "{e}");
        // This machine's, whatever it is, resolves (also where the
        // sysctl is absent).
        RootQdisc::Auto.resolve().unwrap();
    }

    #[test]
    fn replace_is_tc_qdisc_replace_root() {
        let r = replace_root_request(7, "pfifo");
        let RouteNetlinkMessage::NewQueueDiscipline(m) = r.msg_for_test() else {
            panic!("not RTM_NEWQDISC");
        };
        assert_eq!(m.header.index, 7);
        assert_eq!(m.header.parent, TcHandle::ROOT);
        assert_eq!(m.header.handle, TcHandle::default());
        assert_eq!(m.attributes, vec![TcAttribute::Kind("pfifo".into())]);
        let f = r.flags_for_test();
        assert_eq!(f & NLM_F_CREATE, NLM_F_CREATE);
        assert_eq!(f & NLM_F_REPLACE, NLM_F_REPLACE);
    }
}
