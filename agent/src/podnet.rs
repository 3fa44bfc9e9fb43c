//! Pod interfaces over netlink: the veth pair, its pod end configured inside
//! the pod's network namespace.
//!
//! CONTRACT (implementation pending). All functions are blocking (the agent
//! calls them from `spawn_blocking`); each opens its own netlink socket(s)
//! (rtnetlink); work inside a pod namespace runs on a short-lived thread
//! that `setns`es into it, so the caller's thread never changes namespace.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// What the pod's interface must look like.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodIfaceSpec {
    /// The pod's network namespace (`CNI_NETNS`).
    pub netns: PathBuf,
    /// The interface name inside the pod (`CNI_IFNAME`).
    pub ifname: String,
    /// The host end's name (see [`host_ifname`]).
    pub host_ifname: String,
    pub mac: [u8; 6],
    pub ip: Ipv4Addr,
    pub prefix_len: u8,
    /// Default route via this address.
    pub gateway: Ipv4Addr,
    pub mtu: u32,
    /// Turn TX checksum offload off on the pod end.
    pub tx_checksum_off: bool,
}

/// What [`setup_pod_interface`] made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodIface {
    pub host_ifname: String,
    pub host_ifindex: u32,
    pub host_mac: [u8; 6],
}

/// Why an interface operation failed; messages name the interface,
/// namespace and step.
#[derive(Debug, thiserror::Error)]
pub enum PodnetError {
    #[error("network namespace {0} does not exist")]
    NoNetns(PathBuf),
    #[error("interface '{0}' already exists in {1}")]
    Exists(String, String),
    #[error("{step}: {reason}")]
    Netlink { step: String, reason: String },
    #[error("{0}")]
    Other(String),
}

/// The host end's name: derived from the pod and a hash of the container
/// id, at most 15 bytes, unique per (container id, ifname).
pub fn host_ifname(
    pod_namespace: &str,
    pod_name: &str,
    container_id: &str,
    ifname: &str,
) -> String {
    let _ = (pod_namespace, pod_name, container_id, ifname);
    todo!("podnet")
}

/// Creates the veth pair and configures the pod end (name, MAC, address,
/// MTU, TX checksum offload, up, default route via the gateway) and brings
/// the host end up. All or nothing: on any failure what was made is deleted.
pub fn setup_pod_interface(spec: &PodIfaceSpec) -> Result<PodIface, PodnetError> {
    let _ = spec;
    todo!("podnet")
}

/// Deletes the host end (and so its peer). `Ok(false)` if it did not exist.
pub fn delete_host_link(host_ifname: &str) -> Result<bool, PodnetError> {
    let _ = host_ifname;
    todo!("podnet")
}

/// Checks the pod end against `spec` (exists, MAC, address, MTU, up, default
/// route); the error lists every difference.
pub fn check_pod_interface(spec: &PodIfaceSpec) -> Result<(), PodnetError> {
    let _ = spec;
    todo!("podnet")
}

/// Whether `name` exists in the caller's namespace.
pub fn link_exists(name: &str) -> Result<bool, PodnetError> {
    let _ = name;
    todo!("podnet")
}

/// The MAC address of `name` in the caller's namespace.
pub fn link_mac(name: &str) -> Result<[u8; 6], PodnetError> {
    let _ = name;
    todo!("podnet")
}

/// The MTU of `name` in the caller's namespace.
pub fn link_mtu(name: &str) -> Result<u32, PodnetError> {
    let _ = name;
    todo!("podnet")
}

/// Makes sure `name` holds `ip/prefix_len` (adds it if missing) and is up.
pub fn ensure_address(name: &str, ip: Ipv4Addr, prefix_len: u8) -> Result<(), PodnetError> {
    let _ = (name, ip, prefix_len);
    todo!("podnet")
}

/// The name of the interface holding the IPv4 default route, if any.
pub fn default_route_interface() -> Result<Option<String>, PodnetError> {
    todo!("podnet")
}

/// Whether `path` names a network namespace (a nsfs file).
pub fn netns_exists(path: &Path) -> bool {
    let _ = path;
    todo!("podnet")
}
