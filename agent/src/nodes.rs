//! Which Node objects the agent believes (pure).
//!
//! A Node's `spec.podCIDR` becomes a host route on every node (`ip route
//! CIDR via GW onlink dev oxvs-gw0`) and tunnel flows to its InternalIP;
//! this node's own becomes its IPAM range. Anyone who can write a Node
//! object (a node's kubelet credentials, a cluster admin's typo) would
//! otherwise steer every node's traffic: a podCIDR of `0.0.0.0/0` sends
//! the host's default traffic into the tunnel, one that covers the node
//! subnet cuts the underlay, one that overlaps another node's range steals
//! its pods' traffic. So every Node is checked before anything is made of
//! it, and a Node that fails is refused (no route, no tunnel flow, never
//! used for IPAM), logged with its name and the reason, and counted
//! (`oxvs_agent_nodes_refused`, `oxvs_agent_node_refusals_total`).
//!
//! ## The checks
//!
//! A remote Node (one with a podCIDR of either family and an InternalIP
//! of the tunnel's family; others are not routed to at all) is refused
//! when its (IPv4) podCIDR
//!
//! - is broader than [`MIN_PREFIX_LEN`] (`0.0.0.0/0`, `10.0.0.0/7`);
//! - overlaps a range that is never pod addresses ([`RESERVED`]: this
//!   network, loopback, link-local, multicast and reserved);
//! - overlaps this node's pod CIDR;
//! - overlaps this node's underlay subnet (the prefix of the interface
//!   holding the node's address);
//! - overlaps another remote Node's podCIDR: then *both* are refused. The
//!   agent cannot tell which one is right, and routing either could send
//!   one node's pods' traffic to the other; the conflict needs an
//!   operator, and the refusal names both Nodes;
//! - contains a node's address (any Node's InternalIP, or this node's):
//!   the route would capture the tunnel's own packets. The Node whose
//!   address it holds is refused too, for the same reason as an overlap;
//!
//! or when its InternalIP is no unicast address (unspecified, loopback,
//! multicast, broadcast, IPv6 link-local), is this node's own address, or
//! lies in this node's pod CIDR (of its family).
//!
//! The InternalIP is the one of the tunnel's family: the tunnel runs over
//! IPv6 when this node's own address (`--node-ip`, else its Node's
//! InternalIP, IPv4 first) is IPv6, and then a remote Node without an
//! IPv6 InternalIP is not routed to. A remote's IPv6 pod CIDR that holds
//! any node's IPv6 InternalIP or overlaps this node's IPv6 underlay subnet
//! is not used (the Node stays for IPv4), as one that overlaps another's.
//! An IPv6-only Node (no IPv4 podCIDR) is checked by its InternalIP and
//! its IPv6 range that way; if the range is not used, nothing of it is.
//!
//! This node's own Node object (used only without `--pod-cidr`) is refused
//! as its IPAM range when its podCIDR is broader than [`MIN_PREFIX_LEN`],
//! reserved, covers the node's address or overlaps its underlay subnet;
//! the agent then stays not ready (CNI ADD answers "try again later") and
//! says why.
//!
//! Cost: O(n log n) in the number of Nodes (sorting and one sweep; the
//! InternalIPs are looked up by binary search), so a 5 000-node cluster
//! costs nothing noticeable per recomputation.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

use crate::flows::RemoteNode;
use crate::model::Node;

/// The broadest pod CIDR a node may have: a `/8` (a cluster CIDR is
/// usually a `/16` or `/12`, a node's a `/24`).
pub const MIN_PREFIX_LEN: u8 = 8;

/// Ranges that are never a node's pod addresses (RFC 6890), by name.
pub const RESERVED: [(&str, &str); 5] = [
    ("0.0.0.0/8", "\"this network\""),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved (and broadcast)"),
];

/// Why a Node was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeProblem {
    TooBroad {
        cidr: Ipv4Net,
    },
    Reserved {
        cidr: Ipv4Net,
        range: Ipv4Net,
        what: &'static str,
    },
    OverlapsLocalPods {
        cidr: Ipv4Net,
        local: Ipv4Net,
    },
    OverlapsNodeSubnet {
        cidr: Ipv4Net,
        subnet: Ipv4Net,
    },
    ContainsNodeAddress {
        cidr: Ipv4Net,
        ip: Ipv4Addr,
        /// The Node whose address it is.
        node: String,
    },
    OverlapsNode {
        cidr: Ipv4Net,
        other: String,
        other_cidr: Ipv4Net,
    },
    BadAddress {
        ip: IpAddr,
        why: &'static str,
    },
}

impl NodeProblem {
    /// The metric label of the reason.
    pub fn reason(&self) -> &'static str {
        match self {
            NodeProblem::TooBroad { .. } => "too_broad",
            NodeProblem::Reserved { .. } => "reserved",
            NodeProblem::OverlapsLocalPods { .. } => "overlaps_local_pod_cidr",
            NodeProblem::OverlapsNodeSubnet { .. } => "overlaps_node_subnet",
            NodeProblem::ContainsNodeAddress { .. } => "contains_node_address",
            NodeProblem::OverlapsNode { .. } => "overlaps_node",
            NodeProblem::BadAddress { .. } => "bad_address",
        }
    }

    /// Every reason label, for the metric's zero series.
    pub const REASONS: [&'static str; 7] = [
        "too_broad",
        "reserved",
        "overlaps_local_pod_cidr",
        "overlaps_node_subnet",
        "contains_node_address",
        "overlaps_node",
        "bad_address",
    ];
}

impl fmt::Display for NodeProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeProblem::TooBroad { cidr } => write!(
                f,
                "spec.podCIDR {cidr} is broader than /{MIN_PREFIX_LEN} (it would route far more than pods)"
            ),
            NodeProblem::Reserved { cidr, range, what } => write!(
                f,
                "spec.podCIDR {cidr} overlaps {range} ({what} addresses, never pods)"
            ),
            NodeProblem::OverlapsLocalPods { cidr, local } => write!(
                f,
                "spec.podCIDR {cidr} overlaps this node's pod CIDR {local}"
            ),
            NodeProblem::OverlapsNodeSubnet { cidr, subnet } => write!(
                f,
                "spec.podCIDR {cidr} overlaps the node subnet {subnet} (the underlay)"
            ),
            NodeProblem::ContainsNodeAddress { cidr, ip, node } => write!(
                f,
                "spec.podCIDR {cidr} contains Node '{node}' address {ip}"
            ),
            NodeProblem::OverlapsNode {
                cidr,
                other,
                other_cidr,
            } => write!(
                f,
                "spec.podCIDR {cidr} overlaps Node '{other}' podCIDR {other_cidr} (both refused until one is fixed)"
            ),
            NodeProblem::BadAddress { ip, why } => {
                write!(f, "InternalIP {ip} is {why}")
            }
        }
    }
}

/// A refused Node and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefusedNode {
    pub name: String,
    pub problem: NodeProblem,
}

impl fmt::Display for RefusedNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Node '{}' refused: {}", self.name, self.problem)
    }
}

/// What this node knows of itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalNode {
    pub name: String,
    /// The pod CIDR in use (flag or own Node object), once known.
    pub pod_cidr: Option<Ipv4Net>,
    /// The IPv6 pod CIDR in use, on a dual-stack node.
    pub pod_cidr6: Option<Ipv6Net>,
    /// The underlay address: the tunnel runs over its family.
    pub node_ip: Option<IpAddr>,
    /// The node's IPv4 address when the tunnel runs over IPv6 (its IPv4
    /// InternalIP): still checked against pod CIDRs.
    pub ip4: Option<Ipv4Addr>,
    /// The prefix of the host interface holding `node_ip`, if found and
    /// IPv4.
    pub underlay: Option<Ipv4Net>,
    /// The prefix of the host interface holding `node_ip`, if found and
    /// IPv6.
    pub underlay6: Option<Ipv6Net>,
}

impl LocalNode {
    /// Whether the tunnel runs over IPv6 (the node's address is IPv6).
    pub fn tunnel_ipv6(&self) -> bool {
        self.node_ip.is_some_and(|ip| ip.is_ipv6())
    }

    fn node_ip4(&self) -> Option<Ipv4Addr> {
        match self.node_ip {
            Some(IpAddr::V4(a)) => Some(a),
            _ => self.ip4,
        }
    }
}

/// The remote Nodes that may be routed to, and those refused.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Checked {
    /// By name.
    pub remotes: Vec<RemoteNode>,
    /// By name.
    pub refused: Vec<RefusedNode>,
}

fn overlaps(a: &Ipv4Net, b: &Ipv4Net) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

fn reserved(cidr: &Ipv4Net) -> Option<NodeProblem> {
    RESERVED.iter().find_map(|(r, what)| {
        let range: Ipv4Net = r.parse().ok()?;
        overlaps(cidr, &range).then_some(NodeProblem::Reserved {
            cidr: *cidr,
            range,
            what,
        })
    })
}

/// The checks of a pod CIDR on its own (any node's).
fn check_cidr(cidr: &Ipv4Net, underlay: Option<&Ipv4Net>) -> Option<NodeProblem> {
    if cidr.prefix_len() < MIN_PREFIX_LEN {
        return Some(NodeProblem::TooBroad { cidr: *cidr });
    }
    if let Some(p) = reserved(cidr) {
        return Some(p);
    }
    underlay
        .filter(|u| overlaps(cidr, u))
        .map(|subnet| NodeProblem::OverlapsNodeSubnet {
            cidr: *cidr,
            subnet: *subnet,
        })
}

fn check_address(ip: IpAddr, local: &LocalNode) -> Option<&'static str> {
    let (broadcast, link_local, in_pods) = match ip {
        IpAddr::V4(a) => (
            a.is_broadcast(),
            false,
            local.pod_cidr.is_some_and(|c| c.contains(&a)),
        ),
        IpAddr::V6(a) => (
            false,
            (u128::from(a) >> 118) == 0x3fa,
            local.pod_cidr6.is_some_and(|c| c.contains(&a)),
        ),
    };
    // ::ffff:a.b.c.d and ::a.b.c.d name an IPv4 address an IPv6 socket
    // would reach past the IPv4 checks.
    if let IpAddr::V6(a) = ip {
        let v = u128::from(a);
        if v >> 32 == 0xffff || (v >> 32 == 0 && v > 1) {
            return Some("an IPv4-mapped or IPv4-compatible IPv6 address");
        }
    }
    if ip.is_unspecified() {
        Some("unspecified")
    } else if ip.is_loopback() {
        Some("a loopback address")
    } else if ip.is_multicast() {
        Some("a multicast address")
    } else if broadcast {
        Some("the broadcast address")
    } else if link_local {
        // A link-local tunnel address needs a scope the Node cannot say.
        Some("a link-local address")
    } else if Some(ip) == local.node_ip {
        Some("this node's own address")
    } else if in_pods {
        Some("inside this node's pod CIDR")
    } else {
        None
    }
}

/// The pod CIDR of this node's own Node object, if it may be used as the
/// node's IPAM range.
pub fn check_local(cidr: Ipv4Net, local: &LocalNode) -> Result<Ipv4Net, NodeProblem> {
    let cidr = cidr.trunc();
    if let Some(p) = check_cidr(&cidr, local.underlay.as_ref()) {
        return Err(p);
    }
    match local.node_ip4().filter(|ip| cidr.contains(ip)) {
        Some(ip) => Err(NodeProblem::ContainsNodeAddress {
            cidr,
            ip,
            node: local.name.clone(),
        }),
        None => Ok(cidr),
    }
}

/// Whether an IPv6 pod CIDR may be routed: a unicast range (not loopback,
/// link-local, multicast or unspecified) that holds a gateway and a pod.
fn usable_ipv6_cidr(c: &Ipv6Net) -> bool {
    let net = c.network();
    let special = net.is_loopback()
        || net.is_multicast()
        || net.is_unspecified()
        || (u128::from(net) >> 118) == 0x3fa; // fe80::/10
    !special && c.prefix_len() >= 8 && c.prefix_len() <= 126
}

/// Takes the IPv6 pod CIDR away from an accepted remote whose CIDR is not
/// usable or overlaps this node's or an earlier one's (by name); the Node
/// stays for IPv4. Logged at each computation that finds it (rare: a
/// misconfigured cluster).
fn drop_bad_ipv6_cidrs(
    local: &LocalNode,
    nodes: &BTreeMap<String, Node>,
    remotes: &mut [RemoteNode],
) {
    // Every IPv6 node address: a range holding one would capture the
    // tunnel's own packets when it runs over IPv6 (and the host's traffic
    // to that node in any case).
    let node_ips6: Vec<Ipv6Addr> = nodes
        .values()
        .filter_map(|n| n.internal_ip6)
        .chain(match local.node_ip {
            Some(IpAddr::V6(a)) => Some(a),
            _ => None,
        })
        .collect();
    // Accepted ranges by network address; pairwise disjoint, so a range
    // overlaps one of them exactly when the one before its end contains
    // its network address or starts inside it.
    let mut taken: BTreeMap<Ipv6Addr, Ipv6Net> = BTreeMap::new();
    if let Some(l) = local.pod_cidr6 {
        taken.insert(l.network(), l);
    }
    for r in remotes.iter_mut() {
        let Some(c) = r.pod_cidr6 else { continue };
        let overlaps = taken
            .range(..=c.broadcast())
            .next_back()
            .is_some_and(|(_, t)| t.contains(&c.network()) || c.contains(&t.network()));
        let captures_underlay = node_ips6.iter().any(|ip| c.contains(ip))
            || local
                .underlay6
                .is_some_and(|u| u.contains(&c.network()) || c.contains(&u.network()));
        if !usable_ipv6_cidr(&c) || overlaps || captures_underlay {
            tracing::warn!(node = %r.name, pod_cidr = %c, "a Node's IPv6 pod CIDR is not usable, overlaps another's or holds a node address; its pods are not reached over IPv6");
            r.pod_cidr6 = None;
        } else {
            taken.insert(c.network(), c);
        }
    }
}

/// Checks every remote Node of `nodes` (see the module doc).
pub fn check_remotes(local: &LocalNode, nodes: &BTreeMap<String, Node>) -> Checked {
    let mut refused: BTreeMap<String, NodeProblem> = BTreeMap::new();
    // 1. Each Node on its own.
    let mut candidates: Vec<RemoteNode> = Vec::new();
    for n in nodes.values().filter(|n| n.name != local.name) {
        // An IPv6-only Node (no IPv4 podCIDR) is checked by its address
        // here and by its IPv6 range in `drop_bad_ipv6_cidrs`.
        if n.pod_cidr.is_none() && n.pod_cidr6.is_none() {
            continue;
        }
        let Some(ip) = n.tunnel_ip(local.tunnel_ipv6()) else {
            continue;
        };
        let cidr = n.pod_cidr.map(|c| c.trunc());
        let problem = cidr
            .and_then(|cidr| {
                check_cidr(&cidr, local.underlay.as_ref()).or_else(|| {
                    local
                        .pod_cidr
                        .filter(|l| overlaps(&cidr, l))
                        .map(|l| NodeProblem::OverlapsLocalPods { cidr, local: l })
                })
            })
            .or_else(|| check_address(ip, local).map(|why| NodeProblem::BadAddress { ip, why }));
        match problem {
            Some(p) => {
                refused.insert(n.name.clone(), p);
            }
            None => candidates.push(RemoteNode {
                name: n.name.clone(),
                pod_cidr: cidr,
                ip,
                pod_cidr6: n.pod_cidr6.map(|c| c.trunc()),
            }),
        }
    }
    // 2. Pairs of IPv4 ranges. Prefixes nest or are disjoint, so after
    // sorting by first address each one overlaps the widest range opened
    // before it, if any.
    let mut with4: Vec<(Ipv4Net, &str)> = candidates
        .iter()
        .filter_map(|r| Some((r.pod_cidr?, r.name.as_str())))
        .collect();
    with4.sort_by(|a, b| {
        (a.0.network(), a.0.prefix_len(), a.1).cmp(&(b.0.network(), b.0.prefix_len(), b.1))
    });
    let mut widest: Option<usize> = None;
    for (i, r) in with4.iter().enumerate() {
        match widest {
            Some(w) if with4[w].0.contains(&r.0.network()) => {
                let other = &with4[w];
                for (a, b) in [(r, other), (other, r)] {
                    refused
                        .entry(a.1.to_string())
                        .or_insert_with(|| NodeProblem::OverlapsNode {
                            cidr: a.0,
                            other: b.1.to_string(),
                            other_cidr: b.0,
                        });
                }
            }
            _ => widest = Some(i),
        }
    }
    // 3. A pod CIDR holding a node's address (any Node's InternalIP, or
    // this node's) would capture the tunnel's own packets: the range's
    // Node is refused, and so is the Node whose address it holds.
    let mut ips: Vec<(Ipv4Addr, &str)> = nodes
        .values()
        .filter_map(|n| Some((n.internal_ip?, n.name.as_str())))
        .chain(local.node_ip4().map(|ip| (ip, local.name.as_str())))
        .collect();
    ips.sort_unstable();
    ips.dedup();
    for r in &candidates {
        let Some(cidr) = r.pod_cidr else { continue };
        let from = ips.partition_point(|(ip, _)| *ip < cidr.network());
        for (ip, owner) in ips[from..].iter().take_while(|(ip, _)| cidr.contains(ip)) {
            refused
                .entry(r.name.clone())
                .or_insert_with(|| NodeProblem::ContainsNodeAddress {
                    cidr,
                    ip: *ip,
                    node: owner.to_string(),
                });
            if *owner != local.name && *owner != r.name {
                refused
                    .entry(owner.to_string())
                    .or_insert(NodeProblem::BadAddress {
                        ip: IpAddr::V4(*ip),
                        why: "inside another Node's pod CIDR",
                    });
            }
        }
    }
    let mut remotes: Vec<RemoteNode> = candidates
        .into_iter()
        .filter(|r| !refused.contains_key(&r.name))
        .collect();
    remotes.sort_by(|a, b| a.name.cmp(&b.name));
    drop_bad_ipv6_cidrs(local, nodes, &mut remotes);
    // An IPv6-only Node whose IPv6 range was not usable has nothing left
    // to route to.
    remotes.retain(|r| r.pod_cidr.is_some() || r.pod_cidr6.is_some());
    Checked {
        remotes,
        refused: refused
            .into_iter()
            .map(|(name, problem)| RefusedNode { name, problem })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, cidr: &str, ip: &str) -> (String, Node) {
        (
            name.to_string(),
            Node {
                name: name.to_string(),
                pod_cidr: Some(cidr.parse().unwrap()),
                pod_cidr6: None,
                internal_ip: Some(ip.parse().unwrap()),
                internal_ip6: None,
            },
        )
    }

    fn local() -> LocalNode {
        LocalNode {
            name: "n1".into(),
            pod_cidr: Some("10.244.1.0/24".parse().unwrap()),
            node_ip: Some("192.168.77.11".parse().unwrap()),
            underlay: Some("192.168.77.0/24".parse().unwrap()),
            underlay6: None,
            ip4: None,
            pod_cidr6: None,
        }
    }

    /// A remote Node's IPv6 pod CIDR is used only when it is a usable
    /// unicast range overlapping neither this node's nor an earlier
    /// remote's; the Node stays for IPv4 either way.
    #[test]
    fn bad_ipv6_pod_cidrs_are_dropped_and_the_node_kept() {
        let mut l = local();
        l.pod_cidr6 = Some("fd00:10:244:1::/64".parse().unwrap());
        let cidrs6 = [
            ("n2", "10.244.2.0/24", "fd00:10:244:2::/64"),
            ("n3", "10.244.3.0/24", "fd00:10:244:1::/64"), // this node's
            ("n4", "10.244.4.0/24", "fd00:10:244::/48"),   // covers n2's and mine
            ("n5", "10.244.5.0/24", "fe80::/64"),          // link-local
            ("n6", "10.244.6.0/24", "ff02::/64"),          // multicast
            ("n7", "10.244.7.0/24", "fd00:10:244:7::/127"), // no room for a pod
            ("n8", "10.244.8.0/24", "fd00:10:244:2:8000::/65"), // inside n2's
            ("n9", "10.244.9.0/24", "fd00:10:244:9::/64"),
        ];
        let nodes: BTreeMap<String, Node> = cidrs6
            .iter()
            .enumerate()
            .map(|(i, (name, c4, c6))| {
                let (k, mut n) = node(name, c4, &format!("192.168.77.{}", 20 + i));
                n.pod_cidr6 = Some(c6.parse().unwrap());
                (k, n)
            })
            .collect();
        let c = check_remotes(&l, &nodes);
        assert!(c.refused.is_empty(), "{:?}", c.refused);
        let kept: Vec<(&str, Option<String>)> = c
            .remotes
            .iter()
            .map(|r| (r.name.as_str(), r.pod_cidr6.map(|x| x.to_string())))
            .collect();
        assert_eq!(
            kept,
            vec![
                ("n2", Some("fd00:10:244:2::/64".into())),
                ("n3", None),
                ("n4", None),
                ("n5", None),
                ("n6", None),
                ("n7", None),
                ("n8", None),
                ("n9", Some("fd00:10:244:9::/64".into())),
            ]
        );
    }

    /// On a node whose address is IPv6, the tunnel runs over IPv6: each
    /// remote is reached at its IPv6 InternalIP (one without is not routed
    /// to), an InternalIP that cannot be a tunnel endpoint is refused, and
    /// an IPv6 pod CIDR holding a node's IPv6 address is not used.
    /// IPv6-only Nodes (no IPv4 podCIDR): routed to by their IPv6 range
    /// alone, checked as the IPv6 ranges of dual-stack Nodes are; one
    /// whose range is not usable has nothing left and is not a remote.
    #[test]
    fn ipv6_only_nodes_are_remotes_by_their_ipv6_range() {
        let l = LocalNode {
            name: "n1".into(),
            pod_cidr: None,
            pod_cidr6: Some("fd00:10:244:1::/64".parse().unwrap()),
            node_ip: Some("fd00:77::11".parse().unwrap()),
            ip4: None,
            underlay: None,
            underlay6: Some("fd00:77::/64".parse().unwrap()),
        };
        let v6only = |name: &str, ip6: &str, c6: &str| {
            (
                name.to_string(),
                Node {
                    name: name.into(),
                    pod_cidr: None,
                    pod_cidr6: Some(c6.parse().unwrap()),
                    internal_ip: None,
                    internal_ip6: Some(ip6.parse().unwrap()),
                },
            )
        };
        let nodes: BTreeMap<String, Node> = [
            v6only("n2", "fd00:77::12", "fd00:10:244:2::/64"),
            v6only("n3", "fd00:77::13", "fd00:10:244:1::/64"), // this node's range
            v6only("n4", "fd00:77::14", "fd00:77::/120"),      // holds node addresses
            v6only("n5", "fe80::5", "fd00:10:244:5::/64"),     // link-local address
            v6only("n1", "fd00:77::11", "fd00:10:244:1::/64"), // this node
        ]
        .into_iter()
        .collect();
        let c = check_remotes(&l, &nodes);
        let got: Vec<(&str, Option<Ipv4Net>, Option<String>)> = c
            .remotes
            .iter()
            .map(|r| {
                (
                    r.name.as_str(),
                    r.pod_cidr,
                    r.pod_cidr6.map(|x| x.to_string()),
                )
            })
            .collect();
        assert_eq!(got, vec![("n2", None, Some("fd00:10:244:2::/64".into()))]);
        assert_eq!(c.refused.len(), 1, "{:?}", c.refused);
        assert_eq!(c.refused[0].name, "n5");
    }

    #[test]
    fn an_ipv6_underlay_uses_the_ipv6_internal_ips() {
        let mut l = local();
        l.node_ip = Some("fd00:77::11".parse().unwrap());
        l.underlay = None;
        l.underlay6 = Some("fd00:77::/64".parse().unwrap());
        l.pod_cidr6 = Some("fd00:10:244:1::/64".parse().unwrap());
        let six = [
            ("n2", Some("fd00:77::12"), "fd00:10:244:2::/64"),
            ("n3", None, "fd00:10:244:3::/64"), // no IPv6 InternalIP
            ("n4", Some("fe80::4"), "fd00:10:244:4::/64"), // link-local
            ("n5", Some("fd00:77::11"), "fd00:10:244:5::/64"), // this node's
            ("n6", Some("ff02::6"), "fd00:10:244:6::/64"), // multicast
            ("n7", Some("fd00:10:244:1::7"), "fd00:10:244:7::/64"), // in my pods
            ("n8", Some("fd00:77::18"), "fd00:77::/120"), // holds node addresses
            ("n9", Some("fd00:99::19"), "fd00:99::/64"), // holds its own
        ];
        let nodes: BTreeMap<String, Node> = six
            .iter()
            .enumerate()
            .map(|(i, (name, ip6, c6))| {
                let (k, mut n) = node(
                    name,
                    &format!("10.244.{}.0/24", 2 + i),
                    &format!("192.168.77.{}", 20 + i),
                );
                n.internal_ip6 = ip6.map(|a| a.parse().unwrap());
                n.pod_cidr6 = Some(c6.parse().unwrap());
                (k, n)
            })
            .collect();
        let mut nodes = nodes;
        for (name, ip6) in [("m1", "::ffff:127.0.0.1"), ("m2", "::10.0.0.1")] {
            let (k, mut n) = node(
                name,
                &format!("10.245.{}.0/24", name.len()),
                "192.168.77.90",
            );
            n.internal_ip = None;
            n.internal_ip6 = Some(ip6.parse().unwrap());
            nodes.insert(k, n);
        }
        nodes.get_mut("m2").unwrap().pod_cidr = Some("10.245.7.0/24".parse().unwrap());
        let c = check_remotes(&l, &nodes);
        let got: Vec<(&str, String, Option<String>)> = c
            .remotes
            .iter()
            .map(|r| {
                (
                    r.name.as_str(),
                    r.ip.to_string(),
                    r.pod_cidr6.map(|x| x.to_string()),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "n2",
                    "fd00:77::12".into(),
                    Some("fd00:10:244:2::/64".into())
                ),
                ("n8", "fd00:77::18".into(), None),
                ("n9", "fd00:99::19".into(), None),
            ]
        );
        let why: Vec<(String, String)> = c
            .refused
            .iter()
            .map(|r| (r.name.clone(), r.problem.to_string()))
            .collect();
        assert_eq!(
            why,
            vec![
                (
                    "m1".into(),
                    "InternalIP ::ffff:127.0.0.1 is an IPv4-mapped or IPv4-compatible IPv6 address"
                        .into()
                ),
                (
                    "m2".into(),
                    "InternalIP ::a00:1 is an IPv4-mapped or IPv4-compatible IPv6 address".into()
                ),
                (
                    "n4".into(),
                    "InternalIP fe80::4 is a link-local address".into()
                ),
                (
                    "n5".into(),
                    "InternalIP fd00:77::11 is this node's own address".into()
                ),
                (
                    "n6".into(),
                    "InternalIP ff02::6 is a multicast address".into()
                ),
                (
                    "n7".into(),
                    "InternalIP fd00:10:244:1::7 is inside this node's pod CIDR".into()
                ),
            ]
        );
    }

    /// With the tunnel over IPv6, the node's IPv4 subnet and address are
    /// still guarded: a remote IPv4 pod CIDR over the IPv4 underlay
    /// subnet, or this node's own pod CIDR holding its IPv4 address, is
    /// refused as on an IPv4 underlay.
    #[test]
    fn an_ipv6_underlay_still_checks_the_ipv4_side() {
        let mut l = local();
        l.node_ip = Some("fd00:77::11".parse().unwrap());
        l.ip4 = Some("192.168.77.11".parse().unwrap());
        l.underlay6 = Some("fd00:77::/64".parse().unwrap());
        let (k, mut n) = node("n2", "192.168.77.0/28", "192.168.77.12");
        n.internal_ip6 = Some("fd00:77::12".parse().unwrap());
        let nodes: BTreeMap<String, Node> = [(k, n)].into_iter().collect();
        assert_eq!(
            reasons(&check_remotes(&l, &nodes)),
            vec![("n2".to_string(), "overlaps_node_subnet")]
        );
        l.underlay = None;
        let own = check_local("192.168.77.0/24".parse().unwrap(), &l);
        assert_eq!(own.map_err(|p| p.reason()), Err("contains_node_address"));
    }

    fn reasons(c: &Checked) -> Vec<(String, &'static str)> {
        c.refused
            .iter()
            .map(|r| (r.name.clone(), r.problem.reason()))
            .collect()
    }

    #[test]
    fn good_nodes_pass() {
        let nodes = BTreeMap::from([
            node("n1", "10.244.1.0/24", "192.168.77.11"),
            node("n2", "10.244.2.0/24", "192.168.77.12"),
            node("n3", "10.244.3.0/24", "192.168.77.13"),
        ]);
        let c = check_remotes(&local(), &nodes);
        assert!(c.refused.is_empty(), "{:?}", c.refused);
        let names: Vec<&str> = c.remotes.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["n2", "n3"]);
    }

    #[test]
    fn bad_pod_cidrs_are_refused_with_the_reason() {
        let nodes = BTreeMap::from([
            node("default", "0.0.0.0/0", "192.168.77.20"),
            node("wide", "10.0.0.0/7", "192.168.77.21"),
            node("lo", "127.0.0.0/8", "192.168.77.22"),
            node("mine", "10.244.1.128/25", "192.168.77.23"),
            node("covers-me", "10.244.0.0/16", "192.168.77.24"),
            node("underlay", "192.168.77.0/28", "192.168.77.25"),
            node("has-ip", "192.168.0.0/16", "192.168.77.26"),
            node("ok", "10.245.0.0/24", "192.168.77.27"),
            node("self-ip", "10.245.1.0/24", "192.168.77.11"),
            node("zero-ip", "10.245.2.0/24", "0.0.0.0"),
        ]);
        let c = check_remotes(&local(), &nodes);
        assert_eq!(
            reasons(&c),
            vec![
                ("covers-me".to_string(), "overlaps_local_pod_cidr"),
                ("default".to_string(), "too_broad"),
                ("has-ip".to_string(), "overlaps_node_subnet"),
                ("lo".to_string(), "reserved"),
                ("mine".to_string(), "overlaps_local_pod_cidr"),
                ("self-ip".to_string(), "bad_address"),
                ("underlay".to_string(), "overlaps_node_subnet"),
                ("wide".to_string(), "too_broad"),
                ("zero-ip".to_string(), "bad_address"),
            ]
        );
        assert_eq!(c.remotes.len(), 1);
        assert_eq!(c.remotes[0].name, "ok");
        let msg = c.refused[1].to_string();
        assert!(
            msg.contains("Node 'default'") && msg.contains("0.0.0.0/0"),
            "{msg}"
        );
    }

    #[test]
    fn without_the_underlay_a_node_address_inside_is_still_caught() {
        let mut l = local();
        l.underlay = None;
        let nodes = BTreeMap::from([node("n9", "192.168.77.0/24", "192.168.77.30")]);
        let c = check_remotes(&l, &nodes);
        assert_eq!(
            reasons(&c),
            vec![("n9".to_string(), "contains_node_address")]
        );
    }

    #[test]
    fn overlapping_remote_nodes_are_both_refused_naming_each_other() {
        let nodes = BTreeMap::from([
            node("a", "10.250.0.0/16", "192.168.77.31"),
            node("b", "10.250.7.0/24", "192.168.77.32"),
            node("c", "10.250.9.0/24", "192.168.77.33"),
            node("d", "10.251.0.0/24", "192.168.77.34"),
            node("e", "10.251.0.0/24", "192.168.77.35"),
            node("f", "10.252.0.0/24", "192.168.77.36"),
        ]);
        let c = check_remotes(&local(), &nodes);
        let r = reasons(&c);
        assert_eq!(
            r.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["a", "b", "c", "d", "e"]
        );
        assert!(r.iter().all(|(_, why)| *why == "overlaps_node"));
        let b = c.refused.iter().find(|x| x.name == "b").unwrap();
        assert!(b.to_string().contains("Node 'a'"), "{b}");
        let d = c.refused.iter().find(|x| x.name == "d").unwrap();
        assert!(d.to_string().contains("Node 'e'"), "{d}");
        assert_eq!(c.remotes.len(), 1);
        assert_eq!(c.remotes[0].name, "f");
    }

    #[test]
    fn a_tunnel_endpoint_inside_a_pod_cidr_is_refused() {
        let nodes = BTreeMap::from([
            node("a", "10.250.0.0/24", "10.250.1.5"),
            node("b", "10.250.1.0/24", "192.168.77.40"),
            node("c", "10.250.2.0/24", "10.244.1.9"),
        ]);
        let c = check_remotes(&local(), &nodes);
        assert_eq!(
            reasons(&c),
            vec![
                ("a".to_string(), "bad_address"),
                ("b".to_string(), "contains_node_address"),
                ("c".to_string(), "bad_address")
            ]
        );
        let b = c.refused.iter().find(|x| x.name == "b").unwrap();
        assert!(b.to_string().contains("Node 'a' address 10.250.1.5"), "{b}");
    }

    #[test]
    fn own_node_pod_cidr() {
        let l = local();
        assert!(check_local("10.244.1.0/24".parse().unwrap(), &l).is_ok());
        for bad in [
            "0.0.0.0/0",
            "192.168.77.0/26",
            "127.0.0.0/24",
            "192.168.0.0/16",
        ] {
            assert!(check_local(bad.parse().unwrap(), &l).is_err(), "{bad}");
        }
    }
}
