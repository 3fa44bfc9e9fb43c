//! Pod interfaces over netlink: the veth pair, its pod end configured inside
//! the pod's network namespace.
//!
//! The netlink and ethtool requests themselves are `oxvs-netlink`'s (shared
//! with oxvs-switchd); this module holds the pod logic: names, the netns
//! handling, owner aliases, checks.
//!
//! All functions are blocking system calls, no runtime of their own (the
//! agent calls them from `spawn_blocking`). Each opens its own netlink
//! socket(s); work inside a pod namespace runs on a short-lived OS thread that
//! `setns`es into it, opens its netlink socket there and exits, so the
//! caller's thread never changes namespace and no thread is reused after a
//! `setns`. Concurrent calls for different pods are independent.
//!
//! # How a pod interface is made ([`setup_pod_interface`])
//!
//! 1. One `RTM_NEWLINK` in the host namespace creates the veth pair: the
//!    host end (`host_ifname`, MTU, up) and, in the same message, the peer
//!    *directly in the pod namespace* (`IFLA_NET_NS_FD`) already carrying
//!    its final name, MAC and MTU (not the up flag: the kernel opens the peer
//!    before pairing it, and `veth_open` fails with `ENOTCONN` then). There is no temporary name,
//!    no move and no rename: one message instead of three, no window in
//!    which a half-named interface is visible, and a name clash in the pod
//!    namespace fails this very message (`EEXIST`). A `RTM_GETLINK` for the
//!    host end is pipelined behind it on the same socket (the kernel handles
//!    a socket's requests in order) to learn its index and MAC.
//! 2. A thread enters the pod namespace and, if asked, clears TX checksum
//!    offload (`SIOCETHTOOL`), looks up the pod end's index, then pipelines
//!    `lo` up, the pod end up, the address and the default route via the
//!    gateway (`onlink` when the gateway is outside the pod's subnet) and
//!    waits for the four acks. With `tcp_full_mtu` (large frames on the
//!    node, a default route of a lower MTU, and a switch that segments TCP
//!    into the tunnel), three more in the same pipeline: the subnet and
//!    the default route again in [`TCP_TABLE`] without the route MTU, and
//!    the rule `ipproto tcp lookup` it, so that the pod's TCP (its MSS, its
//!    segments) uses the interface's MTU everywhere while everything else
//!    keeps the tunnel's (UDP is then fragmented by the pod, as before).
//!    With a `qdisc`, one more: the pod end's root qdisc
//!    ([`oxvs_netlink::RootQdisc`] says why).
//!
//! Measured (debug build, 2 shared cores, kernel 6.18, 50 iterations in
//! fresh namespaces, `bench_setup_and_delete` in `tests/podnet.rs`): setup
//! p50 1.7 ms, p90 2.5 ms; delete p50 15 ms, p90 26 ms (the kernel's veth
//! unregistration waits for RCU grace periods; `ip link del` costs the same).
//!
//! All or nothing: any failure after step 1 deletes the host end, which
//! deletes its peer too, and the error names the step that failed.
//! The agent runs the two steps apart ([`create_pod_veth`], then
//! [`configure_pod_veth`] while the switch binds the port on the host
//! end) and undoes a failed step 2 itself, with the port.
//!
//! `EEXIST` from step 1 is ambiguous (host name or pod name); only then is
//! the host namespace asked which, so the fast path has no extra lookup.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use oxvs_netlink::{
    ethtool, Change, Errno, Ipv4Route, Ipv4Rule, Ipv6Route, Link, LinkChange, LinkSpec, Netlink,
    NewLink,
};

mod nl;

/// Index of the loopback device, the same in every network namespace.
const LOOPBACK_IFINDEX: u32 = 1;
/// Longest interface name the kernel accepts (IFNAMSIZ - 1).
const MAX_IFNAME_LEN: usize = oxvs_netlink::MAX_IFNAME_LEN;
/// The host name prefix when the pod name yields none.
const FALLBACK_PREFIX: &str = "oxvs";
/// How many hex digits of the hash end a host interface name.
const HASH_HEX_DIGITS: usize = 7;

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
    /// The pod's IPv4 address, prefix and gateway (a default route via
    /// it): none on an IPv6-only node.
    pub ipv4: Option<crate::state::PodIpv4>,
    pub mtu: u32,
    /// The default route's MTU when below `mtu` (paths leaving the node).
    pub route_mtu: Option<u32>,
    /// With `route_mtu`: TCP still takes `mtu` to every destination (the
    /// switch segments it into the tunnel): a rule sends TCP to
    /// [`TCP_TABLE`], the pod's subnet and default route without the
    /// route MTU.
    pub tcp_full_mtu: bool,
    /// Turn TX checksum offload off on the pod end.
    pub tx_checksum_off: bool,
    /// The pod's IPv6 address, prefix and gateway (a default route via
    /// it), on a dual-stack or IPv6-only node.
    pub ipv6: Option<crate::state::PodIpv6>,
    /// The pod end's root qdisc (a kind, `--pod-qdisc` resolved,
    /// [`oxvs_netlink::RootQdisc`]); `None` keeps the veth's `noqueue`.
    pub qdisc: Option<String>,
}

/// The pod's routing table for TCP when `tcp_full_mtu` (any number: the
/// pod's namespace is its own).
pub const TCP_TABLE: u32 = 100;
/// The priority of the rule sending TCP there (before `main`, 32766).
pub const TCP_RULE_PRIORITY: u32 = 100;
const IPPROTO_TCP: u8 = 6;

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
///
/// Format: `<prefix>-<hash>`, where
/// - `<prefix>` is the pod name lowercased with every byte other than
///   `[a-z0-9-]` dropped, truncated to 7 bytes and stripped of leading and
///   trailing `-`; `oxvs` when that leaves nothing;
/// - `<hash>` is 7 lowercase hex digits: the 64-bit FNV-1a hash (offset
///   basis `0xcbf29ce484222325`, prime `0x100000001b3`) of the bytes of
///   `container_id`, a `0x00` byte, then the bytes of `ifname`, folded to 32
///   bits (`h ^ (h >> 32)`) and masked to its low 28 bits.
///
/// This function is part of the node's persistent state (links made by an
/// older agent are found by name): the format and the hash must never
/// change. The pod namespace is not an input (the container id is unique on
/// the node); it is a parameter so the signature can stay if that changes.
/// The result uses only `[a-z0-9-]`, so it is always a valid interface name.
pub fn host_ifname(
    pod_namespace: &str,
    pod_name: &str,
    container_id: &str,
    ifname: &str,
) -> String {
    let _ = pod_namespace;
    let max_prefix = MAX_IFNAME_LEN - 1 - HASH_HEX_DIGITS;
    let sanitized: String = pod_name
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .filter(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
        .take(max_prefix)
        .collect();
    let prefix = sanitized.trim_matches('-');
    let prefix = if prefix.is_empty() {
        FALLBACK_PREFIX
    } else {
        prefix
    };
    let mut h = Fnv1a64::new();
    h.write(container_id.as_bytes());
    h.write(&[0]);
    h.write(ifname.as_bytes());
    let folded = (h.0 ^ (h.0 >> 32)) & 0x0fff_ffff;
    format!("{prefix}-{folded:07x}")
}

/// 64-bit FNV-1a (<http://www.isthe.com/chongo/tech/comp/fnv/>), kept here
/// so that the host interface names never depend on a dependency's hash.
struct Fnv1a64(u64);

impl Fnv1a64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    fn new() -> Self {
        Self(Self::OFFSET_BASIS)
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }
}

/// Checks that `name` is a name the kernel accepts for an interface
/// (`dev_valid_name`): 1..=15 bytes, not `.`/`..`, no `/`, `:`, NUL or
/// whitespace.
fn validate_ifname(what: &str, name: &str) -> Result<(), PodnetError> {
    if !oxvs_netlink::valid_ifname(name) {
        return Err(PodnetError::Other(format!(
            "invalid {what} interface name '{}': 1 to 15 bytes, none of '/', ':', NUL or whitespace",
            name.escape_debug()
        )));
    }
    Ok(())
}

fn validate_spec(spec: &PodIfaceSpec) -> Result<(), PodnetError> {
    validate_ifname("pod", &spec.ifname)?;
    validate_ifname("host", &spec.host_ifname)?;
    match (spec.ipv4, spec.ipv6) {
        (Some(v4), _) if v4.prefix_len > 32 => {
            return Err(PodnetError::Other(format!(
                "invalid prefix length /{} for {}: at most 32",
                v4.prefix_len, v4.ip
            )));
        }
        (_, Some(v6)) if v6.prefix_len > 128 => {
            return Err(PodnetError::Other(format!(
                "invalid prefix length /{} for {}: at most 128",
                v6.prefix_len, v6.ip
            )));
        }
        (None, None) => {
            return Err(PodnetError::Other(format!(
                "no address for {}: an IPv4 or an IPv6 one is needed",
                spec.ifname
            )));
        }
        _ => {}
    }
    if !(68..=65535).contains(&spec.mtu) {
        return Err(PodnetError::Other(format!(
            "invalid MTU {} for {}: 68 to 65535",
            spec.mtu, spec.ifname
        )));
    }
    if spec.mac == [0; 6] || spec.mac[0] & 1 != 0 {
        return Err(PodnetError::Other(format!(
            "invalid MAC {} for {}: must be unicast and not zero",
            fmt_mac(&spec.mac),
            spec.ifname
        )));
    }
    Ok(())
}

fn fmt_mac(mac: &[u8; 6]) -> String {
    let [a, b, c, d, e, f] = *mac;
    format!("{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{f:02x}")
}

/// Opens the namespace file and checks it is on nsfs (a network namespace
/// or at least a namespace; `setns` with `CLONE_NEWNET` rejects the others).
fn open_netns(path: &Path) -> Result<File, PodnetError> {
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(PodnetError::NoNetns(path.to_path_buf()))
        }
        Err(e) => {
            return Err(PodnetError::Other(format!(
                "cannot open network namespace {}: {e}",
                path.display()
            )))
        }
    };
    match nix::sys::statfs::fstatfs(&f) {
        Ok(s) if s.filesystem_type() == nix::sys::statfs::NSFS_MAGIC => Ok(f),
        _ => Err(PodnetError::NoNetns(path.to_path_buf())),
    }
}

/// Whether the subnet `ip/prefix_len` holds `other`.
fn in_subnet(ip: Ipv4Addr, prefix_len: u8, other: Ipv4Addr) -> bool {
    let mask = u32::MAX
        .checked_shl(32 - u32::from(prefix_len.min(32)))
        .unwrap_or(0);
    u32::from(ip) & mask == u32::from(other) & mask
}

/// Creates the veth pair and configures the pod end (name, MAC, address,
/// MTU, TX checksum offload, up, default route via the gateway) and brings
/// the host end up. All or nothing: on any failure what was made is deleted.
///
/// Errors: [`PodnetError::NoNetns`] when `spec.netns` is not a namespace,
/// [`PodnetError::Exists`] when the host name exists in the host namespace
/// or `spec.ifname` exists in the pod namespace (nothing is changed then),
/// [`PodnetError::Netlink`] naming the failed step otherwise.
pub fn setup_pod_interface(spec: &PodIfaceSpec) -> Result<PodIface, PodnetError> {
    let PodNetns(ns) = open_pod_netns(spec)?;
    let host = create_veth(spec, &ns)?;
    match configure_pod_end(spec, &ns) {
        Ok(()) => Ok(host),
        Err(e) => {
            let index = host.host_ifindex;
            let cleanup = nl::with_netlink(|nl| {
                nl.delete_link_index(index)
                    .map(drop)
                    .map_err(nl::step(format!("delete host link index {index}")))
            });
            Err(match cleanup {
                Ok(()) => e,
                Err(c) => PodnetError::Other(format!(
                    "{e}; and deleting host link '{}' afterwards failed: {c}",
                    spec.host_ifname
                )),
            })
        }
    }
}

/// The pod's network namespace, held open between [`open_pod_netns`],
/// [`create_pod_veth`] and [`configure_pod_veth`].
#[derive(Debug)]
pub struct PodNetns(File);

/// Checks `spec` and opens its namespace: nothing is made, whatever the
/// outcome.
pub fn open_pod_netns(spec: &PodIfaceSpec) -> Result<PodNetns, PodnetError> {
    validate_spec(spec)?;
    Ok(PodNetns(open_netns(&spec.netns)?))
}

/// Step 1 of [`setup_pod_interface`] alone: the veth pair, its host end
/// up, in the namespace [`open_pod_netns`] opened. The agent binds the
/// switch port on the host end while [`configure_pod_veth`] runs; unlike
/// [`setup_pod_interface`], a failure of step 2 then leaves the host end
/// for the caller to delete. Only [`PodnetError::Exists`] says for sure
/// that nothing was made (the creation itself was refused); after any
/// other error the pair may exist.
pub fn create_pod_veth(spec: &PodIfaceSpec, ns: &PodNetns) -> Result<PodIface, PodnetError> {
    create_veth(spec, &ns.0)
}

/// Step 2 of [`setup_pod_interface`] alone, on a veth [`create_pod_veth`]
/// made: the pod end configured inside its namespace.
pub fn configure_pod_veth(spec: &PodIfaceSpec, ns: &PodNetns) -> Result<(), PodnetError> {
    configure_pod_end(spec, &ns.0)
}

/// Step 1: the veth pair, the peer made directly in the pod namespace.
fn create_veth(spec: &PodIfaceSpec, ns: &File) -> Result<PodIface, PodnetError> {
    let new = NewLink::Veth {
        end: LinkSpec {
            mtu: Some(spec.mtu),
            up: true,
            ..LinkSpec::named(spec.host_ifname.as_str())
        },
        peer: LinkSpec {
            mtu: Some(spec.mtu),
            mac: Some(spec.mac),
            netns: Some(ns.as_fd()),
            ..LinkSpec::named(spec.ifname.as_str())
        },
    };
    let step = || {
        format!(
            "create veth '{}' with peer '{}' in {}",
            spec.host_ifname,
            spec.ifname,
            spec.netns.display()
        )
    };
    nl::with_netlink(|nl| {
        // The lookup of the host end is sent right behind the creation.
        let link = match nl.add_link_and_get(&new) {
            Ok(link) => link,
            Err(e) if e.errno() == Some(Errno::EEXIST) => {
                let host_taken = nl
                    .link(&spec.host_ifname)
                    .map_err(nl::step(format!("get link '{}'", spec.host_ifname)))?
                    .is_some();
                return Err(if host_taken {
                    PodnetError::Exists(
                        spec.host_ifname.clone(),
                        "the host network namespace".into(),
                    )
                } else {
                    PodnetError::Exists(spec.ifname.clone(), spec.netns.display().to_string())
                });
            }
            // (ENODEV here may also be the host end deleted right after
            // its creation, before the lookup behind it.)
            Err(e) => return Err(nl::nl_err(step(), &e)),
        };
        let host_mac = link.mac.ok_or_else(|| PodnetError::Netlink {
            step: step(),
            reason: format!("host link '{}' has no Ethernet address", spec.host_ifname),
        })?;
        Ok(PodIface {
            host_ifname: spec.host_ifname.clone(),
            host_ifindex: link.index,
            host_mac,
        })
    })
}

/// Step 2: inside the pod namespace, TX checksum, `lo` up, address, route.
fn configure_pod_end(spec: &PodIfaceSpec, ns: &File) -> Result<(), PodnetError> {
    let in_ns = spec.netns.display().to_string();
    nl::in_netns(ns.as_fd(), &spec.netns, || {
        if spec.tx_checksum_off {
            ethtool::set_tx_checksum(&spec.ifname, false).map_err(nl::step(format!(
                "turn TX checksum offload off on '{}' in {in_ns}",
                spec.ifname
            )))?;
        }
        if spec.ipv6.is_some() {
            pod_ipv6_sysctls(&spec.ifname, &in_ns)?;
        }
        nl::with_netlink(|nl| {
            let index = nl
                .existing_link(&spec.ifname)
                .map_err(nl::step(format!("find '{}' in {in_ns}", spec.ifname)))?
                .index;
            // Sent in this order, answered in this order: the address (and
            // its connected route) exists when the default route is added.
            let mut changes = vec![
                Change::SetLink {
                    index: LOOPBACK_IFINDEX,
                    change: LinkChange::up(),
                },
                Change::SetLink {
                    index,
                    change: LinkChange::up(),
                },
            ];
            let mut steps = vec![
                format!("bring 'lo' up in {in_ns}"),
                format!("bring '{}' up in {in_ns}", spec.ifname),
            ];
            let tcp_table = spec.tcp_full_mtu && spec.route_mtu.is_some();
            if let Some(v4) = spec.ipv4 {
                let route = Ipv4Route {
                    dst: Ipv4Net::default(),
                    gateway: Some(v4.gateway),
                    oif: Some(index),
                    onlink: !in_subnet(v4.ip, v4.prefix_len, v4.gateway),
                    mtu: spec.route_mtu,
                    table: None,
                };
                changes.extend([
                    Change::AddAddress {
                        index,
                        ip: IpAddr::V4(v4.ip),
                        prefix_len: v4.prefix_len,
                    },
                    Change::AddRoute {
                        route: route.clone(),
                        replace: false,
                    },
                ]);
                steps.extend([
                    format!(
                        "add {}/{} to '{}' in {in_ns}",
                        v4.ip, v4.prefix_len, spec.ifname
                    ),
                    format!(
                        "add default route via {} dev '{}' in {in_ns}",
                        v4.gateway, spec.ifname
                    ),
                ]);
                if tcp_table {
                    let subnet = Ipv4Net::new(v4.ip, v4.prefix_len)
                        .map(|n| n.trunc())
                        .unwrap_or_default();
                    changes.extend([
                        Change::AddRoute {
                            route: Ipv4Route {
                                dst: subnet,
                                gateway: None,
                                oif: Some(index),
                                onlink: false,
                                mtu: None,
                                table: Some(TCP_TABLE),
                            },
                            replace: false,
                        },
                        Change::AddRoute {
                            route: Ipv4Route {
                                mtu: None,
                                table: Some(TCP_TABLE),
                                ..route
                            },
                            replace: false,
                        },
                        Change::AddRule(Ipv4Rule {
                            priority: TCP_RULE_PRIORITY,
                            ip_proto: IPPROTO_TCP,
                            table: TCP_TABLE,
                        }),
                    ]);
                    steps.extend([
                        format!("add the subnet route to table {TCP_TABLE} in {in_ns}"),
                        format!("add the default route to table {TCP_TABLE} in {in_ns}"),
                        format!("add the rule 'ipproto tcp lookup {TCP_TABLE}' in {in_ns}"),
                    ]);
                }
            }
            let mut v6_steps = Vec::new();
            if let Some(v6) = spec.ipv6 {
                changes.extend([
                    Change::AddAddress {
                        index,
                        ip: IpAddr::V6(v6.ip),
                        prefix_len: v6.prefix_len,
                    },
                    Change::AddIpv6Route {
                        route: Ipv6Route {
                            dst: Ipv6Net::default(),
                            gateway: Some(v6.gateway),
                            oif: Some(index),
                            onlink: false,
                            mtu: spec.route_mtu,
                            table: None,
                        },
                        replace: false,
                    },
                ]);
                v6_steps = vec![
                    format!(
                        "add {}/{} to '{}' in {in_ns}",
                        v6.ip, v6.prefix_len, spec.ifname
                    ),
                    format!(
                        "add default route via {} dev '{}' in {in_ns}",
                        v6.gateway, spec.ifname
                    ),
                ];
                if tcp_table {
                    // The IPv6 twin of the TCP table: the switch cuts IPv6
                    // TCP into the tunnel too.
                    let subnet = Ipv6Net::new(v6.ip, v6.prefix_len)
                        .map(|n| n.trunc())
                        .unwrap_or_default();
                    let route6 = |dst, gateway| Change::AddIpv6Route {
                        route: Ipv6Route {
                            dst,
                            gateway,
                            oif: Some(index),
                            onlink: false,
                            mtu: None,
                            table: Some(TCP_TABLE),
                        },
                        replace: false,
                    };
                    changes.extend([
                        route6(subnet, None),
                        route6(Ipv6Net::default(), Some(v6.gateway)),
                        Change::AddIpv6Rule(Ipv4Rule {
                            priority: TCP_RULE_PRIORITY,
                            ip_proto: IPPROTO_TCP,
                            table: TCP_TABLE,
                        }),
                    ]);
                    v6_steps.extend([
                        format!("add the IPv6 subnet route to table {TCP_TABLE} in {in_ns}"),
                        format!("add the IPv6 default route to table {TCP_TABLE} in {in_ns}"),
                        format!("add the rule 'ipproto tcp lookup {TCP_TABLE}' (IPv6) in {in_ns}"),
                    ]);
                }
            }
            steps.extend(v6_steps);
            if let Some(kind) = &spec.qdisc {
                changes.push(Change::ReplaceRootQdisc {
                    index,
                    kind: kind.clone(),
                });
                steps.push(format!(
                    "set root qdisc '{kind}' on '{}' in {in_ns}",
                    spec.ifname
                ));
            }
            let results = nl
                .pipeline(&changes)
                .map_err(nl::step(format!("configure '{}' in {in_ns}", spec.ifname)))?;
            for ((r, change), step) in results.into_iter().zip(&changes).zip(steps) {
                match r {
                    // The namespace keeps the TCP rule when the veth goes
                    // (a DEL, a failed ADD): an ADD in it again finds the
                    // very rule (`EEXIST` is for an identical one only).
                    Err(e)
                        if e.errno() == Some(Errno::EEXIST)
                            && matches!(change, Change::AddRule(_) | Change::AddIpv6Rule(_)) => {}
                    r => r.map_err(nl::step(step))?,
                }
            }
            Ok(())
        })
    })
}

/// IPv6 settings of the pod's interface `ifname`, made in the pod's
/// namespace (the caller's thread is in it) before the link comes up:
/// IPv6 on; the link-local address the modified EUI-64 of the MAC (what
/// SpoofGuard allows it, [`crate::flows::ipv6::link_local`], whatever the
/// namespace's default generation mode); no duplicate address detection
/// (addresses are the agent's, unique, and usable at once); no router
/// advertisements taken (the switch drops pods' anyway; the default route
/// is set here).
fn pod_ipv6_sysctls(ifname: &str, in_ns: &str) -> Result<(), PodnetError> {
    // Linux skips DAD only when both `all` and the interface say so (the
    // namespace is the pod's own: `all` concerns it alone).
    for (dev, name, value) in [
        (ifname, "disable_ipv6", "0"),
        (ifname, "addr_gen_mode", "0"),
        ("all", "accept_dad", "0"),
        (ifname, "accept_dad", "0"),
        (ifname, "accept_ra", "0"),
    ] {
        let path = format!("/proc/sys/net/ipv6/conf/{dev}/{name}");
        std::fs::write(&path, value)
            .map_err(|e| PodnetError::Other(format!("set {path} to {value} in {in_ns}: {e}")))?;
    }
    Ok(())
}

/// Deletes the host end (and so its peer). `Ok(false)` if it did not exist.
pub fn delete_host_link(host_ifname: &str) -> Result<bool, PodnetError> {
    validate_ifname("host", host_ifname)?;
    nl::with_netlink(|nl| {
        nl.delete_link(host_ifname)
            .map_err(nl::step(format!("delete link '{host_ifname}'")))
    })
}

/// Checks the pod end against `spec` (exists, MAC, address, MTU, up, default
/// route, root qdisc when `qdisc`, and TX checksum offload off when
/// `tx_checksum_off`); the error
/// lists every difference.
pub fn check_pod_interface(spec: &PodIfaceSpec) -> Result<(), PodnetError> {
    validate_ifname("pod", &spec.ifname)?;
    let ns = open_netns(&spec.netns)?;
    let diffs = nl::in_netns(ns.as_fd(), &spec.netns, || {
        let (mut diffs, exists) = nl::with_netlink(|nl| {
            let mut diffs = Vec::new();
            let Some(link) = nl
                .link(&spec.ifname)
                .map_err(nl::step(format!("get link '{}'", spec.ifname)))?
            else {
                diffs.push("the interface does not exist".to_string());
                return Ok((diffs, false));
            };
            match link.mac {
                Some(mac) if mac == spec.mac => {}
                Some(mac) => diffs.push(format!(
                    "MAC is {}, want {}",
                    fmt_mac(&mac),
                    fmt_mac(&spec.mac)
                )),
                None => diffs.push(format!("has no MAC, want {}", fmt_mac(&spec.mac))),
            }
            match link.mtu {
                Some(mtu) if mtu == spec.mtu => {}
                Some(mtu) => diffs.push(format!("MTU is {mtu}, want {}", spec.mtu)),
                None => diffs.push(format!("has no MTU, want {}", spec.mtu)),
            }
            if !link.up {
                diffs.push("is down, want up".to_string());
            }
            if let Some(v4) = spec.ipv4 {
                let addrs = ipv4_addresses(nl, Some(link.index))?;
                if !addrs.contains(&(v4.ip, v4.prefix_len)) {
                    let have: Vec<String> =
                        addrs.iter().map(|(ip, p)| format!("{ip}/{p}")).collect();
                    diffs.push(format!(
                        "lacks address {}/{} (has [{}])",
                        v4.ip,
                        v4.prefix_len,
                        have.join(", ")
                    ));
                }
            }
            if let Some(v6) = spec.ipv6 {
                let has6 = nl
                    .addresses(Some(link.index))
                    .map_err(nl::step(format!("list the addresses of '{}'", spec.ifname)))?
                    .iter()
                    .any(|x| x.ip == IpAddr::V6(v6.ip) && x.prefix_len == v6.prefix_len);
                if !has6 {
                    diffs.push(format!("lacks address {}/{}", v6.ip, v6.prefix_len));
                }
            }
            if let Some(v4) = spec.ipv4 {
                let routes = nl
                    .ipv4_default_routes()
                    .map_err(nl::step("list IPv4 routes"))?;
                let want = routes
                    .iter()
                    .any(|r| r.gateway == Some(v4.gateway) && r.oif == Some(link.index));
                if !want {
                    let have: Vec<String> = routes
                        .iter()
                        .map(|r| match r.gateway {
                            Some(gw) => format!("via {gw} oif {:?}", r.oif),
                            None => format!("oif {:?}", r.oif),
                        })
                        .collect();
                    diffs.push(format!(
                        "lacks default route via {} on it (has [{}])",
                        v4.gateway,
                        have.join(", ")
                    ));
                }
            }
            if let Some(kind) = &spec.qdisc {
                match nl.root_qdisc(link.index) {
                    Ok(Some(have)) if &have == kind => {}
                    Ok(have) => diffs.push(format!(
                        "root qdisc is {}, want {kind}",
                        have.as_deref().unwrap_or("none")
                    )),
                    Err(e) => diffs.push(format!("cannot read the root qdisc: {e}")),
                }
            }
            Ok((diffs, true))
        })?;
        if spec.tx_checksum_off && exists {
            match ethtool::tx_checksum(&spec.ifname) {
                Ok(false) => {}
                Ok(true) => diffs.push("TX checksum offload is on, want off".to_string()),
                Err(e) => diffs.push(format!("cannot read TX checksum offload: {e}")),
            }
        }
        Ok(diffs)
    })?;
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(PodnetError::Other(format!(
            "interface '{}' in {} differs from its spec: {}",
            spec.ifname,
            spec.netns.display(),
            diffs.join("; ")
        )))
    }
}

/// The IPv4 addresses (with prefix length) of link `index` (of every link
/// for `None`).
fn ipv4_addresses(
    nl: &mut Netlink,
    index: Option<u32>,
) -> Result<Vec<(Ipv4Addr, u8)>, PodnetError> {
    let step = match index {
        Some(i) => format!("list addresses of link index {i}"),
        None => "list IPv4 addresses".to_string(),
    };
    Ok(nl
        .addresses(index)
        .map_err(nl::step(step))?
        .into_iter()
        .filter_map(|a| match a.ip {
            IpAddr::V4(ip) => Some((ip, a.prefix_len)),
            IpAddr::V6(_) => None,
        })
        .collect())
}

/// The alias the agent puts on a pod's host link, naming the attachment
/// that owns it (`oxvs:<ifname>:<container id>`, IFLA_IFALIAS). The host
/// link's name is a 28-bit hash, so two attachments may derive the same
/// name; the alias is what tells whose link it is before a DEL for an
/// attachment the agent has no record of deletes it. Container ids too
/// long for an alias (at most 255 bytes) are cut and end in a 64-bit hash
/// of the whole id.
pub fn owner_alias(container_id: &str, ifname: &str) -> String {
    const MAX_ALIAS: usize = 255;
    let full = format!("oxvs:{ifname}:{container_id}");
    if full.len() <= MAX_ALIAS {
        return full;
    }
    let mut h = Fnv1a64::new();
    h.write(container_id.as_bytes());
    h.write(&[0]);
    h.write(ifname.as_bytes());
    let keep = MAX_ALIAS
        .saturating_sub(format!("oxvs:{ifname}::#").len())
        .saturating_sub(16);
    // Container ids are ASCII (validated by the server); cut on a char
    // boundary anyway.
    let mut cut = keep.min(container_id.len());
    while !container_id.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("oxvs:{ifname}:{}:#{:016x}", &container_id[..cut], h.0)
}

/// Sets the alias (IFLA_IFALIAS) of the link with index `index`: the one
/// just made, whatever has its name by now.
pub fn set_link_alias_index(index: u32, name: &str, alias: &str) -> Result<(), PodnetError> {
    nl::with_netlink(|nl| {
        let change = LinkChange {
            alias: Some(alias.to_string()),
            ..Default::default()
        };
        nl.set_link(index, &change)
            .map_err(nl::step(format!("set the alias of '{name}'")))
    })
}

/// `name`'s alias: `Ok(None)` if there is no such link, `Ok(Some(None))`
/// if it has no alias.
pub fn link_alias(name: &str) -> Result<Option<Option<String>>, PodnetError> {
    Ok(link_owner(name)?.map(|(alias, _)| alias))
}

/// `name`'s alias and whether an XDP program is attached to it (a switch
/// port is bound to it): `Ok(None)` if there is no such link.
pub fn link_owner(name: &str) -> Result<Option<(Option<String>, bool)>, PodnetError> {
    validate_ifname("link", name)?;
    nl::with_netlink(|nl| {
        Ok(nl
            .link(name)
            .map_err(nl::step(format!("get link '{name}'")))?
            .map(|l| (l.alias, l.xdp)))
    })
}

/// The prefix of the address `ip` in the caller's namespace (the subnet
/// of the interface holding it), if some interface holds it.
pub fn subnet_of(ip: IpAddr) -> Result<Option<ipnet::IpNet>, PodnetError> {
    nl::with_netlink(|nl| {
        Ok(nl
            .addresses(None)
            .map_err(nl::step("list addresses"))?
            .into_iter()
            .find(|a| a.ip == ip)
            .and_then(|a| ipnet::IpNet::new(a.ip, a.prefix_len).ok())
            .map(|n| n.trunc()))
    })
}

/// The MTU of the link holding address `ip` in the caller's namespace
/// (`None`: no link holds it).
pub fn mtu_of_address(ip: IpAddr) -> Result<Option<u32>, PodnetError> {
    nl::with_netlink(|nl| {
        let Some(index) = nl
            .addresses(None)
            .map_err(nl::step("list addresses"))?
            .into_iter()
            .find(|a| a.ip == ip)
            .map(|a| a.index)
        else {
            return Ok(None);
        };
        Ok(nl
            .link_by_index(index)
            .map_err(nl::step(format!("get link index {index}")))?
            .and_then(|l| l.mtu))
    })
}

/// Whether `name` exists in the caller's namespace.
pub fn link_exists(name: &str) -> Result<bool, PodnetError> {
    validate_ifname("link", name)?;
    nl::with_netlink(|nl| {
        Ok(nl
            .link(name)
            .map_err(nl::step(format!("get link '{name}'")))?
            .is_some())
    })
}

fn existing_link(nl: &mut Netlink, name: &str) -> Result<Link, PodnetError> {
    nl.existing_link(name)
        .map_err(nl::step(format!("get link '{name}'")))
}

/// The MAC address of `name` in the caller's namespace.
pub fn link_mac(name: &str) -> Result<[u8; 6], PodnetError> {
    validate_ifname("link", name)?;
    nl::with_netlink(|nl| {
        existing_link(nl, name)?
            .mac
            .ok_or_else(|| PodnetError::Other(format!("link '{name}' has no Ethernet address")))
    })
}

/// The MTU of `name` in the caller's namespace.
pub fn link_mtu(name: &str) -> Result<u32, PodnetError> {
    validate_ifname("link", name)?;
    nl::with_netlink(|nl| {
        existing_link(nl, name)?
            .mtu
            .ok_or_else(|| PodnetError::Other(format!("link '{name}' reports no MTU")))
    })
}

/// Makes sure `name` holds `ip/prefix_len` (adds it if missing) and is up.
pub fn ensure_address(
    name: &str,
    ip: impl Into<IpAddr>,
    prefix_len: u8,
) -> Result<(), PodnetError> {
    validate_ifname("link", name)?;
    let ip = ip.into();
    let max = if ip.is_ipv4() { 32 } else { 128 };
    if prefix_len > max {
        return Err(PodnetError::Other(format!(
            "invalid prefix length /{prefix_len} for {ip} on '{name}': at most {max}"
        )));
    }
    nl::with_netlink(|nl| {
        let link = existing_link(nl, name)?;
        let has = nl
            .addresses(Some(link.index))
            .map_err(nl::step(format!("list the addresses of '{name}'")))?
            .iter()
            .any(|a| a.ip == ip && a.prefix_len == prefix_len);
        if !has {
            match nl.add_address(link.index, ip, prefix_len) {
                Ok(()) => {}
                // Lost a race with another writer: the address is there.
                Err(e) if e.errno() == Some(Errno::EEXIST) => {}
                Err(e) => return Err(nl::nl_err(format!("add {ip}/{prefix_len} to '{name}'"), &e)),
            }
        }
        if !link.up {
            nl.set_link(link.index, &LinkChange::up())
                .map_err(nl::step(format!("bring '{name}' up")))?;
        }
        Ok(())
    })
}

/// The name of the interface holding the IPv4 default route, if any (the
/// one with the lowest metric when there are several).
pub fn default_route_interface() -> Result<Option<String>, PodnetError> {
    nl::with_netlink(|nl| {
        let mut routes = nl
            .ipv4_default_routes()
            .map_err(nl::step("list IPv4 routes"))?;
        routes.sort_by_key(|r| r.metric);
        for r in routes {
            if let Some(oif) = r.oif {
                let link = nl
                    .link_by_index(oif)
                    .map_err(nl::step(format!("get link index {oif}")))?;
                if let Some(link) = link {
                    return Ok(Some(link.name));
                }
            }
        }
        Ok(None)
    })
}

/// Whether `path` names a network namespace (a nsfs file).
///
/// Any namespace file is on nsfs, so a mount namespace passes too; `setns`
/// then refuses it (`EINVAL`), reported as a failed step.
pub fn netns_exists(path: &Path) -> bool {
    matches!(
        nix::sys::statfs::statfs(path),
        Ok(s) if s.filesystem_type() == nix::sys::statfs::NSFS_MAGIC
    )
}

/// Makes the caller's namespace route `dst` via `via` on interface `dev`
/// (`onlink`: the next hop need not be in a connected subnet), or, without
/// `via`, straight onto the link (scope link), with path MTU `mtu` if
/// given. Replaces an existing route to `dst`. Idempotent.
pub fn ensure_route(
    dst: IpNet,
    via: Option<IpAddr>,
    dev: &str,
    mtu: Option<u32>,
) -> Result<(), PodnetError> {
    validate_ifname("link", dev)?;
    let what = match via {
        Some(via) => format!("route {dst} via {via} dev {dev} onlink"),
        None => format!("route {dst} dev {dev}"),
    };
    nl::with_netlink(|nl| {
        let oif = Some(existing_link(nl, dev)?.index);
        let onlink = via.is_some();
        match (dst, via) {
            (IpNet::V4(dst), None | Some(IpAddr::V4(_))) => {
                let gateway = via.and_then(|v| match v {
                    IpAddr::V4(v) => Some(v),
                    IpAddr::V6(_) => None,
                });
                let route = Ipv4Route {
                    dst,
                    gateway,
                    oif,
                    onlink,
                    mtu,
                    table: None,
                };
                nl.add_route(&route, true).map_err(nl::step(what))
            }
            (IpNet::V6(dst), None | Some(IpAddr::V6(_))) => {
                let gateway = via.and_then(|v| match v {
                    IpAddr::V6(v) => Some(v),
                    IpAddr::V4(_) => None,
                });
                let route = Ipv6Route {
                    dst,
                    gateway,
                    oif,
                    onlink,
                    mtu,
                    table: None,
                };
                nl.add_ipv6_route(&route, true).map_err(nl::step(what))
            }
            _ => Err(PodnetError::Other(format!(
                "{what}: the next hop is not of the destination's family"
            ))),
        }
    })
}

/// The destinations the caller's namespace routes via `via` out of `dev`
/// (none if `dev` does not exist).
pub fn routes_via(via: IpAddr, dev: &str) -> Result<Vec<IpNet>, PodnetError> {
    validate_ifname("link", dev)?;
    nl::with_netlink(|nl| {
        let Ok(link) = existing_link(nl, dev) else {
            return Ok(Vec::new());
        };
        let what = || format!("list the routes via {via} dev {dev}");
        match via {
            IpAddr::V4(v) => nl
                .ipv4_routes_via(v, link.index)
                .map(|r| r.into_iter().map(IpNet::from).collect())
                .map_err(nl::step(what())),
            IpAddr::V6(v) => nl
                .ipv6_routes_via(v, link.index)
                .map(|r| r.into_iter().map(IpNet::from).collect())
                .map_err(nl::step(what())),
        }
    })
}

/// Removes the caller's namespace route to `dst` (if any) that goes out of `dev`.
pub fn remove_route(dst: IpNet, dev: &str) -> Result<bool, PodnetError> {
    validate_ifname("link", dev)?;
    nl::with_netlink(|nl| {
        let Ok(link) = existing_link(nl, dev) else {
            return Ok(false);
        };
        let oif = Some(link.index);
        let removed = match dst {
            IpNet::V4(dst) => nl.delete_route(&Ipv4Route {
                dst,
                gateway: None,
                oif,
                onlink: false,
                mtu: None,
                table: None,
            }),
            IpNet::V6(dst) => nl.delete_ipv6_route(&Ipv6Route {
                dst,
                gateway: None,
                oif,
                onlink: false,
                mtu: None,
                table: None,
            }),
        };
        removed.map_err(nl::step(format!("remove the route to {dst} on {dev}")))
    })
}

/// Sets the MTU of `name` in the caller's namespace (if it differs).
pub fn set_mtu(name: &str, mtu: u32) -> Result<(), PodnetError> {
    validate_ifname("link", name)?;
    nl::with_netlink(|nl| {
        let link = existing_link(nl, name)?;
        if link.mtu == Some(mtu) {
            return Ok(());
        }
        let change = LinkChange {
            mtu: Some(mtu),
            ..Default::default()
        };
        nl.set_link(link.index, &change)
            .map_err(nl::step(format!("set the MTU of '{name}' to {mtu}")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid_name(n: &str) -> bool {
        !n.is_empty()
            && n.len() <= MAX_IFNAME_LEN
            && n.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    }

    #[test]
    fn host_ifname_shape() {
        let n = host_ifname("default", "nginx-deployment-7d9f8c", "abc123", "eth0");
        assert!(valid_name(&n), "{n}");
        assert_eq!(n.len(), 15, "{n}");
        assert!(n.starts_with("nginx-d-"), "{n}");
        let short = host_ifname("default", "db", "abc123", "eth0");
        assert!(short.starts_with("db-") && short.len() == 10, "{short}");
    }

    #[test]
    fn host_ifname_is_stable() {
        // Pinned values: links made by an older agent are found by name, so
        // these must never change.
        // (Computed with an independent FNV-1a implementation.)
        assert_eq!(
            host_ifname("default", "web", "c0ffee", "eth0"),
            "web-9457479"
        );
        assert_eq!(
            host_ifname(
                "kube-system",
                "coredns-5d78c9869d-abcde",
                "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                "eth0"
            ),
            "coredns-917d5f7"
        );
    }

    #[test]
    fn host_ifname_sanitises_and_falls_back() {
        for pod in ["", "---", "..//::", "ÄÖÜ", " \t"] {
            let n = host_ifname("ns", pod, "id", "eth0");
            assert!(n.starts_with("oxvs-"), "{pod:?} -> {n}");
            assert!(valid_name(&n), "{pod:?} -> {n}");
        }
        let n = host_ifname("ns", "My.Pod_Name:1", "id", "eth0");
        assert!(valid_name(&n), "{n}");
        assert!(n.starts_with("mypodna-"), "{n}");
        let n = host_ifname("ns", "a-------b", "id", "eth0");
        assert!(n.starts_with("a-"), "{n}");
        assert!(!n.contains("--"), "{n}");
    }

    #[test]
    fn host_ifname_distinct() {
        let a = host_ifname("ns", "pod", "container-a", "eth0");
        let b = host_ifname("ns", "pod", "container-b", "eth0");
        let c = host_ifname("ns", "pod", "container-a", "eth1");
        assert_ne!(a, b);
        assert_ne!(a, c);
        // The separator keeps ("ab","c") and ("a","bc") apart.
        assert_ne!(
            host_ifname("ns", "pod", "ab", "c"),
            host_ifname("ns", "pod", "a", "bc")
        );
        let names: std::collections::HashSet<String> = (0..2000)
            .map(|i| host_ifname("ns", "pod", &format!("{i:064x}"), "eth0"))
            .collect();
        assert_eq!(names.len(), 2000);
    }

    #[test]
    fn owner_alias_names_the_attachment_and_fits() {
        assert_eq!(owner_alias("abc", "eth0"), "oxvs:eth0:abc");
        let long = "x".repeat(256);
        let a = owner_alias(&long, "eth0");
        assert!(a.len() <= 255, "{}", a.len());
        assert!(a.starts_with("oxvs:eth0:xxx") && a.contains(":#"), "{a}");
        let mut other = long.clone();
        other.replace_range(255..256, "y");
        assert_ne!(owner_alias(&other, "eth0"), a, "a cut id still differs");
    }

    #[test]
    fn fnv1a64_known_vectors() {
        let mut h = Fnv1a64::new();
        assert_eq!(h.0, 0xcbf29ce484222325);
        h.write(b"a");
        assert_eq!(h.0, 0xaf63dc4c8601ec8c);
        let mut h = Fnv1a64::new();
        h.write(b"foobar");
        assert_eq!(h.0, 0x85944171f73967e8);
    }

    #[test]
    fn ifname_validation() {
        for ok in ["eth0", "a", "abcdefghijklmno", "veth-1.2_x"] {
            assert!(validate_ifname("t", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "abcdefghijklmnop",
            "a/b",
            "a:b",
            "a b",
            "a\0b",
        ] {
            assert!(validate_ifname("t", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn subnet_membership() {
        let ip = Ipv4Addr::new(10, 1, 2, 5);
        assert!(in_subnet(ip, 24, Ipv4Addr::new(10, 1, 2, 1)));
        assert!(!in_subnet(ip, 24, Ipv4Addr::new(10, 1, 3, 1)));
        assert!(in_subnet(ip, 0, Ipv4Addr::new(192, 0, 2, 1)));
        assert!(!in_subnet(ip, 32, Ipv4Addr::new(10, 1, 2, 1)));
        assert!(in_subnet(ip, 32, ip));
    }

    #[test]
    fn netns_exists_distinguishes() {
        assert!(netns_exists(Path::new("/proc/self/ns/net")));
        assert!(!netns_exists(Path::new("/proc/self/status")));
        assert!(!netns_exists(Path::new("/nonexistent/oxvs/netns")));
    }
}
