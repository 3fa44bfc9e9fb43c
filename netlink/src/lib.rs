//! Typed, synchronous network-device operations over rtnetlink, and the
//! few ethtool settings the project needs, shared by `oxvs-switchd` (its
//! gateway veth pair, the UMEM anchor device) and `oxvs-agent` (pod veth
//! pairs, the node gateway's address and routes).
//!
//! - [`Netlink`] is one `NETLINK_ROUTE` socket with typed requests: links
//!   (get, list, create a veth pair or a dummy, delete, set up/MTU/alias),
//!   IPv4/IPv6 addresses (add, list) and IPv4 routes (add or replace,
//!   delete, list default routes), root queueing disciplines (replace,
//!   read). [`Netlink::pipeline`] sends several
//!   changes before reading any answer (the kernel handles a socket's
//!   requests in order), [`Netlink::add_link_and_get`] pipelines the
//!   creation with the lookup of the new link.
//! - [`ethtool`] turns TX checksum offload on or off (`SIOCETHTOOL`).
//!
//! Everything blocks on plain system calls: no async runtime, no thread, no
//! helper process (nothing runs `ip` or `ethtool`), so any thread may call
//! it, also one inside an async runtime's `spawn_blocking` or a control
//! thread while a datapath runs.
//!
//! Network namespaces: a netlink socket (and the ethtool ioctl's socket)
//! belongs to the network namespace of the thread that opened it. A
//! [`Netlink`] acts in the namespace its creating thread was in when
//! [`Netlink::open`] ran, whatever thread uses it later; each [`ethtool`]
//! call opens its socket on the calling thread. Entering a namespace is the
//! caller's business (the agent does it on a short-lived thread).
//!
//! Errors are [`Error`]s that say what went wrong, not which operation
//! failed: the callers know that and wrap them ("cannot create veth pair
//! a/b: File exists").

mod addr;
mod conn;
pub mod ethtool;
mod link;
mod qdisc;
mod route;

pub use addr::Address;
pub use conn::{Change, Netlink};
pub use link::{Link, LinkChange, LinkSpec, NewLink};
pub use nix::errno::Errno;
pub use qdisc::{valid_qdisc_kind, RootQdisc, MAX_QDISC_KIND_LEN};
pub use route::{DefaultRoute, Ipv4Route, Ipv4Rule, Ipv6Route};

/// Longest interface name the kernel accepts (`IFNAMSIZ` - 1).
pub const MAX_IFNAME_LEN: usize = 15;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The kernel refused the request (the errno of its NACK or ioctl).
    #[error("{}", .0.desc())]
    Kernel(Errno),
    /// The netlink or ioctl socket could not be opened, written or read.
    #[error("netlink socket: {0}")]
    Socket(std::io::Error),
    /// The kernel's answer could not be decoded.
    #[error("cannot decode the kernel's answer: {0}")]
    Decode(String),
    /// A name the kernel would refuse as an interface name.
    #[error(
        "'{}' is not a valid interface name (1 to 15 bytes, not '.' or '..', none of '/', ':', NUL or whitespace)",
        .0.escape_debug()
    )]
    BadName(String),
}

impl Error {
    /// The kernel's errno, when that is what this is.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            Error::Kernel(e) => Some(*e),
            Error::Socket(e) => e.raw_os_error().map(Errno::from_raw),
            _ => None,
        }
    }
}

/// Whether the kernel accepts `name` as an interface name
/// (`dev_valid_name`): 1 to 15 bytes, not `.` or `..`, none of `/`, `:`,
/// NUL or whitespace.
pub fn valid_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_IFNAME_LEN
        && name != "."
        && name != ".."
        && !name
            .bytes()
            .any(|b| b == b'/' || b == b':' || b == 0 || b.is_ascii_whitespace())
}

/// [`valid_ifname`] as a result.
pub fn check_ifname(name: &str) -> Result<(), Error> {
    if valid_ifname(name) {
        Ok(())
    } else {
        Err(Error::BadName(name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ifname_validation() {
        for ok in ["eth0", "a", "abcdefghijklmno", "veth-1.2_x", "oxu1f.0p"] {
            assert!(valid_ifname(ok), "{ok}");
            assert!(check_ifname(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "abcdefghijklmnop",
            "a/b",
            "a:b",
            "a b",
            "a\tb",
            "a\0b",
            "../etc",
        ] {
            assert!(!valid_ifname(bad), "{bad:?}");
            assert!(
                matches!(check_ifname(bad), Err(Error::BadName(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn kernel_errors_read_like_strerror() {
        assert_eq!(Error::Kernel(Errno::EEXIST).to_string(), "File exists");
        assert_eq!(Error::Kernel(Errno::ENODEV).errno(), Some(Errno::ENODEV));
        assert_eq!(Error::Decode("x".into()).errno(), None);
    }
}
