//! TX checksum offload through the legacy `SIOCETHTOOL` ioctl
//! (`ETHTOOL_GTXCSUM` / `ETHTOOL_STXCSUM`): the `ethtool` crate and
//! netlink crates we use cannot set features.
//!
//! The ioctl acts on the network namespace of the socket it is issued on,
//! which is opened by each call on the calling thread: call these from a
//! thread in the device's namespace. `ETHTOOL_STXCSUM` with 0 clears
//! every checksum feature of the device (`tx-checksum-ip-generic`,
//! `-ipv4`, `-ipv6`, and the FCoE/SCTP CRC ones) in its wanted features.
#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};

use crate::{check_ifname, Errno, Error};

/// `ETHTOOL_GTXCSUM` from `<linux/ethtool.h>`.
const ETHTOOL_GTXCSUM: u32 = 0x16;
/// `ETHTOOL_STXCSUM` from `<linux/ethtool.h>`.
const ETHTOOL_STXCSUM: u32 = 0x17;

/// `struct ethtool_value` from `<linux/ethtool.h>`.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// Turns TX checksum offload of `ifname` on or off (`ethtool -K IFNAME tx
/// on|off`). `ENODEV` if there is no such device, `EOPNOTSUPP` if its
/// driver cannot change it.
pub fn set_tx_checksum(ifname: &str, on: bool) -> Result<(), Error> {
    let mut v = EthtoolValue {
        cmd: ETHTOOL_STXCSUM,
        data: u32::from(on),
    };
    ethtool_ioctl(ifname, &mut v)
}

/// Whether TX checksum offload of `ifname` is on.
pub fn tx_checksum(ifname: &str) -> Result<bool, Error> {
    let mut v = EthtoolValue {
        cmd: ETHTOOL_GTXCSUM,
        data: 0,
    };
    ethtool_ioctl(ifname, &mut v)?;
    Ok(v.data != 0)
}

fn ethtool_ioctl(ifname: &str, value: &mut EthtoolValue) -> Result<(), Error> {
    check_ifname(ifname)?;
    let name = ifname.as_bytes();
    // `check_ifname` bounds the length: the name and its NUL fit in
    // `ifr_name` (IFNAMSIZ bytes).
    debug_assert!(name.len() < libc::IFNAMSIZ);
    let sock: OwnedFd = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| Error::Socket(e.into()))?;
    // SAFETY: `ifreq` is a C struct of a byte array and a union of plain
    // integers, socket addresses and raw pointers: all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(name) {
        // c_char is i8 or u8 depending on the target: a plain byte copy.
        *dst = *src as libc::c_char;
    }
    // The name is NUL-terminated: it is shorter than IFNAMSIZ and the rest
    // of the array is still zero.
    ifr.ifr_ifru.ifru_data = (value as *mut EthtoolValue).cast::<libc::c_char>();
    // SAFETY: `sock` is an open socket; `ifr` is a valid, NUL-terminated
    // `ifreq` whose data pointer points to `value`, a live `ethtool_value`
    // that the kernel reads and, for GET commands, writes (8 bytes, the size
    // of `struct ethtool_value`). Both outlive the call.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCETHTOOL as _, &mut ifr) };
    if rc < 0 {
        return Err(Error::Kernel(Errno::last()));
    }
    Ok(())
}
