//! Interface helpers the daemon and its tests need: veth pairs, link up,
//! delete, existence, MTU, addresses, TX checksum offload, the quiet
//! device anchoring shared UMEMs.
//!
//! These go through `oxvs-netlink` (rtnetlink and the ethtool ioctl, plain
//! blocking system calls: no helper process, no runtime); each error names
//! what failed and the kernel's reason. Only the RX queue count is read
//! from sysfs. Nothing here runs on the datapath; all functions are
//! blocking and may be called from any thread. Each opens its own netlink
//! socket, so they act in the calling thread's network namespace.

use std::net::IpAddr;
use std::path::Path;

use oxvs_netlink::{Errno, LinkChange, LinkSpec, Netlink, NewLink};

/// Why an interface operation failed.
#[derive(Debug, thiserror::Error)]
pub enum NetdevError {
    #[error("'{0}' is not a valid interface name (1-15 bytes, no '/', ':', whitespace or NUL)")]
    BadName(String),
    #[error("'{0}' is not an address with an optional prefix length (e.g. 10.244.0.1/24)")]
    BadAddress(String),
    /// `what` names the operation ("create veth pair a/b"). (`reason`
    /// is in the message, so it is not also this error's `source()`: a
    /// chain printed with `{:#}` names it once.)
    #[error("cannot {what}: {reason}")]
    Failed {
        what: String,
        reason: oxvs_netlink::Error,
    },
    #[error("cannot create {name} as a dummy ({dummy}) nor as a veth pair {name}/{peer} ({veth})")]
    QuietDevice {
        name: String,
        peer: String,
        dummy: oxvs_netlink::Error,
        veth: oxvs_netlink::Error,
    },
    #[error("cannot read the MTU of '{name}': {reason}")]
    Mtu { name: String, reason: String },
}

fn check_name(name: &str) -> Result<(), NetdevError> {
    if oxvs_netlink::valid_ifname(name) {
        Ok(())
    } else {
        Err(NetdevError::BadName(name.to_string()))
    }
}

/// Runs `f` on a fresh netlink socket; a failure (also opening the socket)
/// becomes [`NetdevError::Failed`] naming `what`.
fn with_netlink<T>(
    what: impl FnOnce() -> String,
    f: impl FnOnce(&mut Netlink) -> Result<T, oxvs_netlink::Error>,
) -> Result<T, NetdevError> {
    Netlink::open()
        .and_then(|mut nl| f(&mut nl))
        .map_err(|reason| NetdevError::Failed {
            what: what(),
            reason,
        })
}

/// Whether `name` is a physical device (it has a `device` in sysfs; veth,
/// dummy and the other virtual devices do not). A physical NIC may do
/// zero-copy AF_XDP, and the frames it receives carry complete checksums.
pub fn is_physical(name: &str) -> bool {
    Path::new("/sys/class/net")
        .join(name)
        .join("device")
        .exists()
}

/// The number of RX queues of `name` (from sysfs), if it can be read.
pub fn rx_queue_count(name: &str) -> Option<usize> {
    check_name(name).ok()?;
    let dir = std::fs::read_dir(Path::new("/sys/class/net").join(name).join("queues")).ok()?;
    Some(
        dir.filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
            .count(),
    )
}

/// Parses `ip[/len]` (a missing length is a host address: /32 or /128).
fn parse_cidr(cidr: &str) -> Option<(IpAddr, u8)> {
    let (ip, len) = match cidr.split_once('/') {
        Some((ip, len)) => (ip.parse::<IpAddr>().ok()?, Some(len.parse::<u8>().ok()?)),
        None => (cidr.parse::<IpAddr>().ok()?, None),
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len = len.unwrap_or(max);
    (len <= max).then_some((ip, len))
}

/// Adds the address `cidr` (e.g. `10.244.0.1/24`) to `name`.
pub fn add_address(name: &str, cidr: &str) -> Result<(), NetdevError> {
    check_name(name)?;
    let (ip, len) = parse_cidr(cidr).ok_or_else(|| NetdevError::BadAddress(cidr.to_string()))?;
    with_netlink(
        || format!("add {cidr} to {name}"),
        |nl| {
            let link = nl.existing_link(name)?;
            nl.add_address(link.index, ip, len)
        },
    )
}

/// Turns TX checksum offload off on `name` (what `ethtool -K NAME tx off`
/// does): a frame the host stack sends through it then carries complete
/// checksums, which AF_XDP (seeing raw frames) needs.
pub fn tx_checksum_off(name: &str) -> Result<(), NetdevError> {
    check_name(name)?;
    oxvs_netlink::ethtool::set_tx_checksum(name, false).map_err(|reason| NetdevError::Failed {
        what: format!("turn TX checksum offload off on {name}"),
        reason,
    })
}

/// Creates the veth pair `a` <-> `b` (both down), with `mtu` if given.
pub fn create_veth_pair(a: &str, b: &str, mtu: Option<u32>) -> Result<(), NetdevError> {
    check_name(a)?;
    check_name(b)?;
    let end = |name: &str| LinkSpec {
        mtu,
        ..LinkSpec::named(name)
    };
    with_netlink(
        || format!("create veth pair {a}/{b}"),
        |nl| {
            nl.add_link(&NewLink::Veth {
                end: end(a),
                peer: end(b),
            })
        },
    )
}

/// Creates `name`, a device that carries no traffic, with `queues` RX
/// and TX queues, replacing a device of that name: a `dummy` where the
/// kernel has it, else a veth pair (`name` and `name` + `p`, both down;
/// veth is always there, pods need it). Returns the kind made.
pub fn create_quiet_device(name: &str, queues: u32) -> Result<&'static str, NetdevError> {
    check_name(name)?;
    let peer = format!("{name}p");
    check_name(&peer)?;
    let spec = |n: &str| LinkSpec {
        queues: Some(queues.max(1)),
        ..LinkSpec::named(n)
    };
    let failed = |what: String| move |reason| NetdevError::Failed { what, reason };
    let mut nl = Netlink::open().map_err(failed(format!("create the quiet device {name}")))?;
    for stale in [name, peer.as_str()] {
        // Looked up first: deleting a missing link without CAP_NET_ADMIN
        // is EPERM, not ENODEV.
        let exists = nl
            .link(stale)
            .map_err(failed(format!("look for a stale device {stale}")))?
            .is_some();
        if exists {
            nl.delete_link(stale)
                .map_err(failed(format!("delete the stale device {stale}")))?;
        }
    }
    let dummy = match nl.add_link(&NewLink::Dummy(spec(name))) {
        Ok(()) => return Ok("dummy"),
        Err(e) => e,
    };
    match nl.add_link(&NewLink::Veth {
        end: spec(name),
        peer: spec(&peer),
    }) {
        Ok(()) => Ok("veth"),
        Err(veth) => Err(NetdevError::QuietDevice {
            name: name.to_string(),
            peer,
            dummy,
            veth,
        }),
    }
}

/// Sets `name` administratively up.
pub fn set_up(name: &str) -> Result<(), NetdevError> {
    check_name(name)?;
    with_netlink(
        || format!("bring {name} up"),
        |nl| {
            let link = nl.existing_link(name)?;
            nl.set_link(link.index, &LinkChange::up())
        },
    )
}

/// Makes a `kind` qdisc (its defaults) the root qdisc of `name` (`tc
/// qdisc replace dev NAME root KIND`).
pub fn set_root_qdisc(name: &str, kind: &str) -> Result<(), NetdevError> {
    check_name(name)?;
    with_netlink(
        || format!("set root qdisc {kind} on {name}"),
        |nl| {
            let link = nl.existing_link(name)?;
            nl.replace_root_qdisc(link.index, kind)
        },
    )
}

/// Sets the MTU of `name`.
pub fn set_mtu(name: &str, mtu: u32) -> Result<(), NetdevError> {
    check_name(name)?;
    with_netlink(
        || format!("set the MTU of {name} to {mtu}"),
        |nl| {
            let link = nl.existing_link(name)?;
            nl.set_link(
                link.index,
                &LinkChange {
                    mtu: Some(mtu),
                    ..LinkChange::default()
                },
            )
        },
    )
}

/// Deletes the link `name` (for a veth, its peer goes too).
pub fn delete_link(name: &str) -> Result<(), NetdevError> {
    check_name(name)?;
    with_netlink(
        || format!("delete {name}"),
        |nl| match nl.delete_link(name)? {
            true => Ok(()),
            false => Err(oxvs_netlink::Error::Kernel(Errno::ENODEV)),
        },
    )
}

/// Whether an interface called `name` exists (`false` also when netlink
/// cannot be asked).
pub fn link_exists(name: &str) -> bool {
    check_name(name).is_ok()
        && Netlink::open()
            .and_then(|mut nl| nl.link(name))
            .is_ok_and(|l| l.is_some())
}

/// The MTU of `name`.
pub fn get_mtu(name: &str) -> Result<u32, NetdevError> {
    check_name(name)?;
    let err = |reason: String| NetdevError::Mtu {
        name: name.to_string(),
        reason,
    };
    let link = Netlink::open()
        .and_then(|mut nl| nl.existing_link(name))
        .map_err(|e| err(e.to_string()))?;
    link.mtu
        .ok_or_else(|| err("the kernel reports none".into()))
}

/// Whether an XDP program is attached to `name` (in any mode).
pub fn has_xdp(name: &str) -> Result<bool, NetdevError> {
    check_name(name)?;
    with_netlink(
        || format!("read the XDP state of {name}"),
        |nl| Ok(nl.existing_link(name)?.xdp),
    )
}

/// The MTU each link of the calling thread's network namespace can
/// receive from its port side: its own, and for a veth whose peer is in
/// this namespace too (the gateway pair), the smaller of the two (a veth
/// drops what exceeds its peer's MTU). By name.
pub fn receive_mtus() -> Result<std::collections::HashMap<String, u32>, NetdevError> {
    with_netlink(
        || "list the links".to_string(),
        |nl| {
            let links = nl.links()?;
            let by_index: std::collections::HashMap<u32, u32> = links
                .iter()
                .filter_map(|l| Some((l.index, l.mtu?)))
                .collect();
            Ok(links
                .iter()
                .filter_map(|l| {
                    let own = l.mtu?;
                    let peer = l.peer_here.and_then(|p| by_index.get(&p).copied());
                    Some((l.name.clone(), peer.map_or(own, |p| p.min(own))))
                })
                .collect())
        },
    )
}

/// [`receive_mtus`] for one link: what `name` can receive from its port
/// side (one or two link requests, no dump), and whether its veth peer is
/// in this namespace too (then that end's MTU counts, and whoever set up
/// the pair may change it later, as the agent does its gateway's).
pub fn receive_mtu(name: &str) -> Result<(u32, bool), NetdevError> {
    check_name(name)?;
    with_netlink(
        || format!("read the MTU of {name}"),
        |nl| {
            let link = nl.existing_link(name)?;
            let own = link
                .mtu
                .ok_or(oxvs_netlink::Error::Kernel(Errno::ENODATA))?;
            let peer = match link.peer_here {
                Some(p) => nl.link_by_index(p)?.and_then(|l| l.mtu),
                None => None,
            };
            Ok((peer.map_or(own, |p| p.min(own)), link.peer_here.is_some()))
        },
    )
}

/// The names of every link in the calling thread's network namespace.
pub fn link_names() -> Result<Vec<String>, NetdevError> {
    with_netlink(
        || "list the links".to_string(),
        |nl| Ok(nl.links()?.into_iter().map(|l| l.name).collect()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(check_name("eth0").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("a/b").is_err());
        assert!(check_name("0123456789abcdef").is_err());
        assert!(!link_exists("../etc"));
    }

    #[test]
    fn cidrs_are_parsed() {
        let v4 = |s: &str| parse_cidr(s).map(|(ip, l)| (ip.to_string(), l));
        assert_eq!(v4("10.244.0.1/24"), Some(("10.244.0.1".into(), 24)));
        assert_eq!(v4("10.244.0.1"), Some(("10.244.0.1".into(), 32)));
        assert_eq!(v4("fd00::1/64"), Some(("fd00::1".into(), 64)));
        assert_eq!(v4("fd00::1"), Some(("fd00::1".into(), 128)));
        for bad in [
            "10.244.0.1/33",
            "10.244.0/24",
            "x/1",
            "10.0.0.1/",
            "/24",
            "",
        ] {
            assert_eq!(v4(bad), None, "{bad}");
        }
    }

    #[test]
    fn errors_name_what_failed() {
        let e = NetdevError::Failed {
            what: "create veth pair a/b".into(),
            reason: oxvs_netlink::Error::Kernel(Errno::EEXIST),
        };
        assert_eq!(e.to_string(), "cannot create veth pair a/b: File exists");
        // Named once in a printed chain.
        assert!(std::error::Error::source(&e).is_none());
        assert!(add_address("gw0", "nonsense")
            .unwrap_err()
            .to_string()
            .contains("nonsense"));
    }
}
