//! Node IPAM: addresses for pods from the node's pod CIDR.
//!
//! CONTRACT (implementation pending): see the doc comments of each item.
//!
//! - The gateway is the CIDR's first host address (never allocated); the
//!   network and broadcast addresses are never allocated.
//! - Allocations are keyed by (container id, ifname) and persisted under
//!   `dir` (default `/var/lib/oxvs/ipam/`) with atomic writes (temporary
//!   file, fsync, rename, fsync of the directory), so a restart (or a crash
//!   at any point) never hands out a live address twice.
//! - Addresses are handed out round-robin from the last one given (like the
//!   reference `host-local` plugin), so a released address is not reused
//!   at once.
//! - Not thread-safe by itself: the agent holds it in a `Mutex`.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use ipnet::Ipv4Net;

/// One allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub ip: Ipv4Addr,
    pub container_id: String,
    pub ifname: String,
}

/// Why an IPAM operation failed.
#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    #[error("pod CIDR {cidr} has no free address ({allocated} allocated)")]
    Exhausted { cidr: Ipv4Net, allocated: usize },
    #[error(
        "pod CIDR {0} is too small (needs at least a gateway and one pod address: /30 or larger)"
    )]
    CidrTooSmall(Ipv4Net),
    #[error("IPAM store {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("IPAM store {path}: corrupt record: {reason}")]
    Corrupt { path: PathBuf, reason: String },
}

/// The node's address allocator.
#[derive(Debug)]
pub struct Ipam {
    _dir: PathBuf,
    cidr: Ipv4Net,
}

impl Ipam {
    /// Opens (creating if needed) the store for `cidr` under `dir` and loads
    /// its allocations.
    pub fn open(dir: &Path, cidr: Ipv4Net) -> Result<Ipam, IpamError> {
        let _ = (dir, cidr);
        todo!("ipam")
    }

    /// The pod CIDR.
    pub fn cidr(&self) -> Ipv4Net {
        self.cidr
    }

    /// The gateway address (the CIDR's first host address).
    pub fn gateway(&self) -> Ipv4Addr {
        todo!("ipam")
    }

    /// Allocates an address for (container_id, ifname); if that key already
    /// holds one, returns it (idempotent).
    pub fn allocate(&mut self, container_id: &str, ifname: &str) -> Result<Ipv4Addr, IpamError> {
        let _ = (container_id, ifname);
        todo!("ipam")
    }

    /// Releases the address of (container_id, ifname); `Ok(None)` if it had none.
    pub fn release(
        &mut self,
        container_id: &str,
        ifname: &str,
    ) -> Result<Option<Ipv4Addr>, IpamError> {
        let _ = (container_id, ifname);
        todo!("ipam")
    }

    /// The address of (container_id, ifname), if any.
    pub fn get(&self, container_id: &str, ifname: &str) -> Option<Ipv4Addr> {
        let _ = (container_id, ifname);
        todo!("ipam")
    }

    /// Every allocation, by address.
    pub fn allocations(&self) -> Vec<Allocation> {
        todo!("ipam")
    }
}
