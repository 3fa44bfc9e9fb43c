//! Interface helpers the daemon and its tests need: veth pairs, link up,
//! delete, existence, MTU.
//!
//! These shell out to iproute2's `ip` (synchronously) and read sysfs; each
//! error names the command and what it printed. Nothing here runs on the
//! datapath; all functions are blocking
//! and may be called from any thread. They act in the caller's network
//! namespace.

use std::path::Path;
use std::process::Command;

/// Why an interface operation failed.
#[derive(Debug, thiserror::Error)]
pub enum NetdevError {
    #[error("'{0}' is not a valid interface name (1-15 bytes, no '/', whitespace or NUL)")]
    BadName(String),
    #[error("cannot run `{cmd}`: {source}")]
    Spawn { cmd: String, source: std::io::Error },
    #[error("`{cmd}` failed: {stderr}")]
    Failed { cmd: String, stderr: String },
    #[error("cannot read the MTU of '{name}': {reason}")]
    Mtu { name: String, reason: String },
}

fn check_name(name: &str) -> Result<(), NetdevError> {
    let ok = !name.is_empty()
        && name.len() < 16
        && name != "."
        && name != ".."
        && !name
            .bytes()
            .any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace() || b == 0);
    if ok {
        Ok(())
    } else {
        Err(NetdevError::BadName(name.to_string()))
    }
}

fn ip(args: &[&str]) -> Result<(), NetdevError> {
    run("ip", args)
}

fn run(prog: &str, args: &[&str]) -> Result<(), NetdevError> {
    let cmd = format!("{prog} {}", args.join(" "));
    let out = Command::new(prog)
        .args(args)
        .output()
        .map_err(|source| NetdevError::Spawn {
            cmd: cmd.clone(),
            source,
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NetdevError::Failed {
            cmd,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
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

/// Adds the address `cidr` (e.g. `10.244.0.1/24`) to `name`.
pub fn add_address(name: &str, cidr: &str) -> Result<(), NetdevError> {
    check_name(name)?;
    ip(&["addr", "add", cidr, "dev", name])
}

/// Turns TX checksum offload off on `name` (`ethtool -K NAME tx off`): a
/// frame the host stack sends through it then carries complete checksums,
/// which AF_XDP (seeing raw frames) needs.
pub fn tx_checksum_off(name: &str) -> Result<(), NetdevError> {
    check_name(name)?;
    run("ethtool", &["-K", name, "tx", "off"])
}

/// Creates the veth pair `a` <-> `b` (both down), with `mtu` if given.
pub fn create_veth_pair(a: &str, b: &str, mtu: Option<u32>) -> Result<(), NetdevError> {
    check_name(a)?;
    check_name(b)?;
    let mtu_s = mtu.map(|m| m.to_string());
    let mut args = vec!["link", "add", a];
    if let Some(m) = &mtu_s {
        args.extend(["mtu", m.as_str()]);
    }
    args.extend(["type", "veth", "peer", "name", b]);
    if let Some(m) = &mtu_s {
        args.extend(["mtu", m.as_str()]);
    }
    ip(&args)
}

/// Creates `name`, a device that carries no traffic, with `queues` RX
/// and TX queues, replacing a device of that name: a `dummy` where the
/// kernel has it, else a veth pair (`name` and `name` + `p`, both down;
/// veth is always there, pods need it). Returns the kind made.
pub fn create_quiet_device(name: &str, queues: u32) -> Result<&'static str, NetdevError> {
    check_name(name)?;
    let peer = format!("{name}p");
    check_name(&peer)?;
    for stale in [name, peer.as_str()] {
        if link_exists(stale) {
            delete_link(stale)?;
        }
    }
    let q = queues.max(1).to_string();
    let common = ["link", "add", name, "numtxqueues", &q, "numrxqueues", &q];
    let mut dummy = common.to_vec();
    dummy.extend(["type", "dummy"]);
    match ip(&dummy) {
        Ok(()) => Ok("dummy"),
        Err(dummy_err) => {
            let mut veth = common.to_vec();
            veth.extend([
                "type",
                "veth",
                "peer",
                "name",
                &peer,
                "numtxqueues",
                &q,
                "numrxqueues",
                &q,
            ]);
            ip(&veth).map_err(|veth_err| NetdevError::Failed {
                cmd: format!("ip link add {name} ... type dummy|veth"),
                stderr: format!("dummy: {dummy_err}; veth: {veth_err}"),
            })?;
            Ok("veth")
        }
    }
}

/// Sets `name` administratively up.
pub fn set_up(name: &str) -> Result<(), NetdevError> {
    check_name(name)?;
    ip(&["link", "set", "dev", name, "up"])
}

/// Deletes the link `name` (for a veth, its peer goes too).
pub fn delete_link(name: &str) -> Result<(), NetdevError> {
    check_name(name)?;
    ip(&["link", "del", "dev", name])
}

/// Whether an interface called `name` exists.
pub fn link_exists(name: &str) -> bool {
    check_name(name).is_ok() && Path::new("/sys/class/net").join(name).exists()
}

/// The MTU of `name`.
pub fn get_mtu(name: &str) -> Result<u32, NetdevError> {
    check_name(name)?;
    let err = |reason: String| NetdevError::Mtu {
        name: name.to_string(),
        reason,
    };
    let s = std::fs::read_to_string(Path::new("/sys/class/net").join(name).join("mtu"))
        .map_err(|e| err(e.to_string()))?;
    s.trim()
        .parse()
        .map_err(|e| err(format!("'{}': {e}", s.trim())))
}

/// Whether an XDP program is attached to `name` (`ip link show` says `xdp`).
pub fn has_xdp(name: &str) -> Result<bool, NetdevError> {
    check_name(name)?;
    let cmd = format!("ip link show dev {name}");
    let out = Command::new("ip")
        .args(["link", "show", "dev", name])
        .output()
        .map_err(|source| NetdevError::Spawn {
            cmd: cmd.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(NetdevError::Failed {
            cmd,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.split_whitespace().any(|w| w.starts_with("xdp")))
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
}
