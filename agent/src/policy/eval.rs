//! The reference interpreter: NetworkPolicy semantics evaluated directly on
//! one connection, independent of the flow translation. The lab prints its
//! truth table, the tests use it as the oracle for the flows.
//!
//! Semantics (networking.k8s.io/v1):
//! - a pod is *selected* by a policy if it is in the policy's namespace and
//!   its labels match `podSelector`; hostNetwork pods are never selected;
//! - a pod selected by at least one policy with `policyTypes: Ingress`
//!   (egress alike) is isolated in that direction: a connection passes only
//!   if some rule of some such policy allows it (union); pods selected by no
//!   such policy are open;
//! - a rule allows a connection if some peer matches the other end (no
//!   peers: every address) AND some port entry matches (no ports: every
//!   packet);
//! - a pod peer matches pods with an IP and without hostNetwork, in the
//!   policy's namespace (no `namespaceSelector`) or in the namespaces whose
//!   labels match it, whose labels match `podSelector` (none: all);
//! - an `ipBlock` matches addresses in `cidr` and in no `except`;
//! - a named port is resolved on the destination pod: for ingress the
//!   selected pod, for egress the destination if it is a pod matched by a
//!   pod peer of the rule (or any pod, for a rule without peers); a
//!   destination reached only through an `ipBlock` matches no named port;
//! - traffic between a pod and its own node (the node's gateway address,
//!   the first host address of its pod CIDR, and its InternalIP;
//!   [`node_addresses`]; on a dual-stack node also its IPv6 gateway) is
//!   always allowed;
//! - dual-stack: a connection is of one family ([`allowed_v6`] judges
//!   IPv6 ones, addressed by pods' IPv6 addresses); an `ipBlock` matches
//!   only addresses of its own family, a pod peer both of a pod's.
//! - a connection passes if the source's egress allows it (when the source
//!   is a pod) AND the destination's ingress allows it (when it is a pod).
//!
//! Pure and allocation-light; no state.

use std::net::{IpAddr, Ipv4Addr};

use crate::model::{
    ClusterState, NetworkPolicy, ObjKey, Peer, Pod, PolicyPort, PortRef, Protocol, Rule,
};

use super::prefix::{ipblock6_contains, ipblock_contains};
use super::Direction;

/// One end of a connection.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Endpoint {
    /// A pod, by (namespace, name), addressed by its `status.podIP`.
    Pod(ObjKey),
    /// An address that is no pod (outside the cluster, a node, ...).
    External(Ipv4Addr),
}

/// The transport of a connection's first packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum L4 {
    /// TCP, UDP or SCTP to a destination port.
    Port(Protocol, u16),
    /// Another IP protocol (ICMP, ...): matched only by rules without ports.
    Other,
}

/// Whether a new connection from `src` to `dst` with `proto` to `port` is
/// allowed by the NetworkPolicies of `state`. A pod endpoint that is not in
/// `state`, has no IP or is hostNetwork cannot be addressed: `false`.
pub fn allowed(
    state: &ClusterState,
    src: Endpoint,
    dst: Endpoint,
    proto: Protocol,
    port: u16,
) -> bool {
    allowed_l4(state, &src, &dst, L4::Port(proto, port))
}

/// [`allowed`] for an IPv6 connection: pods are addressed by their IPv6
/// addresses (a pod without one cannot be reached over IPv6: `false`), an
/// external endpoint is never IPv6 here.
pub fn allowed_v6(
    state: &ClusterState,
    src: Endpoint,
    dst: Endpoint,
    proto: Protocol,
    port: u16,
) -> bool {
    allowed_in(state, &src, &dst, L4::Port(proto, port), true)
}

/// [`allowed`] for any transport.
pub fn allowed_l4(state: &ClusterState, src: &Endpoint, dst: &Endpoint, l4: L4) -> bool {
    allowed_in(state, src, dst, l4, false)
}

fn allowed_in(state: &ClusterState, src: &Endpoint, dst: &Endpoint, l4: L4, v6: bool) -> bool {
    let Some((src_ip, src_pod)) = resolve(state, src, v6) else {
        return false;
    };
    let Some((dst_ip, dst_pod)) = resolve(state, dst, v6) else {
        return false;
    };
    let egress_ok = src_pod.is_none_or(|s| egress_allowed(state, s, dst_ip, dst_pod, l4));
    let ingress_ok = dst_pod.is_none_or(|d| ingress_allowed(state, d, src_ip, src_pod, l4));
    egress_ok && ingress_ok
}

fn resolve<'a>(
    state: &'a ClusterState,
    e: &Endpoint,
    v6: bool,
) -> Option<(IpAddr, Option<&'a Pod>)> {
    match e {
        Endpoint::External(ip) => (!v6).then_some((IpAddr::V4(*ip), None)),
        Endpoint::Pod(key) => {
            let pod = state.pods.get(key)?;
            if pod.host_network {
                return None;
            }
            let ip = match v6 {
                false => IpAddr::V4(pod.ip?),
                true => IpAddr::V6(pod.ip6?),
            };
            Some((ip, Some(pod)))
        }
    }
}

/// Whether `policy` selects `pod` (its namespace, its pod selector).
pub fn selects(policy: &NetworkPolicy, pod: &Pod) -> bool {
    !pod.host_network
        && pod.namespace == policy.namespace
        && policy.pod_selector.matches(&pod.labels)
}

/// Whether pod `src` may open a connection to `dst_ip` (the pod `dst_pod`,
/// if it is one) by its egress policies alone.
pub fn egress_allowed(
    state: &ClusterState,
    src: &Pod,
    dst_ip: impl Into<IpAddr>,
    dst_pod: Option<&Pod>,
    l4: L4,
) -> bool {
    direction_allowed(state, src, Direction::Egress, dst_ip.into(), dst_pod, l4)
}

/// Whether pod `dst` accepts a connection from `src_ip` (the pod `src_pod`,
/// if it is one) by its ingress policies alone.
pub fn ingress_allowed(
    state: &ClusterState,
    dst: &Pod,
    src_ip: impl Into<IpAddr>,
    src_pod: Option<&Pod>,
    l4: L4,
) -> bool {
    direction_allowed(state, dst, Direction::Ingress, src_ip.into(), src_pod, l4)
}

/// The addresses node `name` talks to its pods from and is reached at: the
/// gateway (the first host address of its pod CIDR) and its InternalIP.
/// Empty if the node is unknown. Sorted, without duplicates.
pub fn node_addresses(state: &ClusterState, name: &str) -> Vec<Ipv4Addr> {
    let Some(node) = state.nodes.get(name) else {
        return Vec::new();
    };
    let mut v: Vec<Ipv4Addr> = node
        .pod_cidr
        .map(|c| Ipv4Addr::from(u32::from(c.network()).wrapping_add(1)))
        .into_iter()
        .chain(node.internal_ip)
        .collect();
    v.sort();
    v.dedup();
    v
}

fn direction_allowed(
    state: &ClusterState,
    pod: &Pod,
    dir: Direction,
    peer_ip: IpAddr,
    peer_pod: Option<&Pod>,
    l4: L4,
) -> bool {
    let own_node = match peer_ip {
        IpAddr::V4(ip) => node_addresses(state, &pod.node_name).contains(&ip),
        IpAddr::V6(ip) => state
            .nodes
            .get(&pod.node_name)
            .and_then(|n| n.pod_cidr6)
            .is_some_and(|c| crate::flows::ipv6::gateway_of(c) == ip),
    };
    if own_node {
        return true;
    }
    let mut isolated = false;
    for p in state.policies.values() {
        let (isolates, rules) = match dir {
            Direction::Ingress => (p.ingress_isolation, &p.ingress),
            Direction::Egress => (p.egress_isolation, &p.egress),
        };
        if !isolates || !selects(p, pod) {
            continue;
        }
        isolated = true;
        if rules
            .iter()
            .any(|r| rule_allows(state, p, r, dir, pod, peer_ip, peer_pod, l4))
        {
            return true;
        }
    }
    !isolated
}

/// Whether the pod peer `peer` of a rule of `policy` matches `pod`.
pub fn peer_selects_pod(
    state: &ClusterState,
    policy: &NetworkPolicy,
    peer: &Peer,
    pod: &Pod,
) -> bool {
    let Peer::Pods {
        namespace_selector,
        pod_selector,
    } = peer
    else {
        return false;
    };
    if pod.host_network || (pod.ip.is_none() && pod.ip6.is_none()) {
        return false;
    }
    let ns_ok = match namespace_selector {
        None => pod.namespace == policy.namespace,
        Some(sel) => sel.matches(&state.namespace_labels(&pod.namespace)),
    };
    ns_ok && pod_selector.as_ref().is_none_or(|s| s.matches(&pod.labels))
}

#[allow(clippy::too_many_arguments)]
fn rule_allows(
    state: &ClusterState,
    policy: &NetworkPolicy,
    rule: &Rule,
    dir: Direction,
    selected: &Pod,
    peer_ip: IpAddr,
    peer_pod: Option<&Pod>,
    l4: L4,
) -> bool {
    let peer_by_pod =
        |peer: &Peer| peer_pod.is_some_and(|pp| peer_selects_pod(state, policy, peer, pp));
    let peer_ok = rule.peers.is_empty()
        || rule.peers.iter().any(|peer| match (peer, peer_ip) {
            (Peer::Pods { .. }, _) => peer_by_pod(peer),
            (Peer::IpBlock { cidr, except }, IpAddr::V4(ip)) => ipblock_contains(*cidr, except, ip),
            (Peer::IpBlock6 { cidr, except }, IpAddr::V6(ip)) => {
                ipblock6_contains(*cidr, except, ip)
            }
            // A block holds addresses of its own family only.
            (Peer::IpBlock { .. } | Peer::IpBlock6 { .. }, _) => false,
        });
    if !peer_ok {
        return false;
    }
    if rule.ports.is_empty() {
        return true;
    }
    // The pod a named port is resolved on.
    let named_on: Option<&Pod> = match dir {
        Direction::Ingress => Some(selected),
        Direction::Egress => peer_pod.filter(|pp| {
            (rule.peers.is_empty() && !pp.host_network && (pp.ip.is_some() || pp.ip6.is_some()))
                || rule
                    .peers
                    .iter()
                    .any(|peer| peer_selects_pod(state, policy, peer, pp))
        }),
    };
    rule.ports.iter().any(|pp| port_matches(pp, named_on, l4))
}

fn port_matches(pp: &PolicyPort, named_on: Option<&Pod>, l4: L4) -> bool {
    let L4::Port(proto, port) = l4 else {
        return false;
    };
    if pp.protocol != proto {
        return false;
    }
    match &pp.port {
        None => true,
        Some(PortRef::Number(p)) => match pp.end_port {
            None => port == *p,
            Some(end) => (*p..=end).contains(&port),
        },
        Some(PortRef::Name(name)) => {
            named_on.and_then(|pod| pod.named_port(name, proto)) == Some(port)
        }
    }
}
