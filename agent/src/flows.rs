//! The node's flows, computed from what the agent knows (pure).
//!
//! The agent never edits flows by hand: it computes the flows a node should
//! have from its state (the node's network, the pods attached to it) and
//! sends the switch the difference. Everything here is a pure function of
//! its arguments, so it is tested without a switch, and a restarted agent
//! computes exactly the flows its predecessor installed (which is what lets
//! `replace-flows` reconcile without touching a live pod's flows).
//!
//! ## Tables (the Antrea-style plan of `oxvs_pipeline::names`)
//!
//! | table | this module installs |
//! |---|---|
//! | 0 Classifier | gateway port -> source 2; each pod port -> source 3; else drop |
//! | 10 SpoofGuard | a pod's IP traffic only with its MAC and IP, its ARP only with its MAC and IP; gateway trusted |
//! | 20 ARPResponder | answers "who has GATEWAY_IP" in place; ARP for a local pod's IP goes to its port, for the gateway IP to the gateway; a pod's gratuitous ARP goes to the gateway |
//! | 30 ConntrackZone | every IP packet through conntrack, zone 65520 |
//! | 31 ConntrackState | +inv drop; +est / +rel skip egress policy |
//! | 40, 41, 45 | egress policy (defaults only until NetworkPolicy) |
//! | 50 L3Forwarding | replies of connections from the gateway: to the gateway (kube-proxy's DNAT is undone there); IP to the gateway MAC for a local pod: MACs rewritten (routed) |
//! | 55 L3DecTTL | routed packets lose one TTL, except those the host already routed |
//! | 60 L2ForwardingCalc | destination MAC -> output port in `reg1`, `reg0[16]` = 1 |
//! | 70, 71, 75 | ingress policy (defaults only until NetworkPolicy) |
//! | 80 ConntrackCommit | commit new connections; those from the gateway with [`regs::FROM_GATEWAY_CT_MARK`] |
//! | 90 Output | output to `reg1` if known, else drop |
//!
//! ## How the flows are built
//!
//! [`node_flows`] is one function per table (`classifier`, `spoof_guard`,
//! ... `output`, in pipeline order); every flow comes from a builder named
//! for its purpose (`classify_pod`, `spoof_guard_pod_ip`, `arp_answer`,
//! `route_to_remote_node`, `l2_to_port`, `drop_pod_to_tunnel_port`...),
//! which writes it through [`FlowLine`] with a table of
//! [`oxvs_pipeline::names`], a priority of [`crate::priority`], a cookie of
//! [`crate::cookie`] and the register marks of [`oxvs_pipeline::regs`].
//! [`crate::desired::compute`] puts these together with the policy flows
//! into the node's flow set.
//!
//! ## Registers
//!
//! Every register field and mark is declared, by name, in
//! [`oxvs_pipeline::regs`]: the Classifier sets the source mark
//! ([`regs::PKT_SOURCE`]: [`regs::FROM_TUNNEL`], [`regs::FROM_GATEWAY`],
//! [`regs::FROM_POD`]), L2ForwardingCalc the output port
//! ([`regs::TARGET_OFPORT`], [`regs::OFPORT_FOUND_MARK`]), which Output reads.
//!
//! ## Cookies
//!
//! Every flow names the feature and object it exists for ([`crate::cookie`]):
//! [`cookie::DEFAULTS`], [`cookie::pod`], [`cookie::GATEWAY`],
//! [`cookie::TUNNEL`], [`cookie::remote_node`] and the tunnel guard's
//! [`cookie::TUNNEL_UNKNOWN_SOURCE`] and [`cookie::POD_TO_TUNNEL`].
//!
//! ## MAC addresses
//!
//! A pod's MAC is `0a:58:` followed by its IPv4 address ([`pod_mac`]), like
//! other Kubernetes networks do: stable across restarts and re-attachments,
//! and readable in dumps. An IPv6-only pod's is `0a:58:` followed by its
//! IPv6 address's last four bytes ([`pod_mac_of`]).
//!
//! ## Families
//!
//! A node has an IPv4 side, an IPv6 side ([`ipv6`]) or both (dual-stack);
//! the flows of a family exist only where the node (and, for a pod or a
//! remote node, that object) has an address or pod CIDR of it. An
//! IPv6-only node has no IPv4 or ARP flow at all: IPv4 from anyone,
//! the host included, drops in SpoofGuard.

pub mod ipv6;
mod line;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use oxvs_pipeline::names::*;
use oxvs_pipeline::regs;

use crate::cookie;
use crate::priority;

pub use line::FlowLine;

/// The UDP port of the node's VXLAN tunnel (IANA's), which the agent asks
/// the switch to use and guards from pods ([`tunnel_guard_flows`]).
pub const VXLAN_UDP_PORT: u16 = 4789;

/// The conntrack zone pod traffic is tracked in.
pub const CT_ZONE: u16 = 65520;

/// The node-level facts the flows depend on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeNet {
    /// Its IPv4 side: none on an IPv6-only node.
    pub ipv4: Option<NodeNet4>,
    pub gateway_mac: [u8; 6],
    pub gateway_ofport: u32,
    /// Its IPv6 side ([`ipv6`]), on a dual-stack or IPv6-only node.
    pub ipv6: Option<NodeNet6>,
}

impl NodeNet {
    /// Its IPv4 pod CIDR, if it has one.
    pub fn pod_cidr4(&self) -> Option<Ipv4Net> {
        self.ipv4.as_ref().map(|v4| v4.pod_cidr)
    }

    /// Its IPv6 pod CIDR, if it has one.
    pub fn pod_cidr6(&self) -> Option<Ipv6Net> {
        self.ipv6.as_ref().map(|v6| v6.pod_cidr)
    }

    /// Whether `ip` is in one of its pod CIDRs.
    pub fn holds(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(a) => self.pod_cidr4().is_some_and(|c| c.contains(&a)),
            IpAddr::V6(a) => self.pod_cidr6().is_some_and(|c| c.contains(&a)),
        }
    }
}

/// The IPv4 pod CIDR of a node and its gateway address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeNet4 {
    pub pod_cidr: Ipv4Net,
    pub gateway_ip: Ipv4Addr,
}

impl NodeNet4 {
    /// The IPv4 side of a node whose IPv4 pod CIDR is `cidr`.
    pub fn of(cidr: Ipv4Net) -> NodeNet4 {
        let cidr = cidr.trunc();
        NodeNet4 {
            pod_cidr: cidr,
            gateway_ip: Ipv4Addr::from(u32::from(cidr.network()).wrapping_add(1)),
        }
    }
}

/// The IPv6 pod CIDR of a node and its gateway address (on the same
/// gateway interface and MAC as the IPv4 one, on a dual-stack node).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeNet6 {
    pub pod_cidr: Ipv6Net,
    pub gateway_ip: Ipv6Addr,
}

impl NodeNet6 {
    /// The IPv6 side of a node whose IPv6 pod CIDR is `cidr`.
    pub fn of(cidr: Ipv6Net) -> NodeNet6 {
        let cidr = cidr.trunc();
        NodeNet6 {
            pod_cidr: cidr,
            gateway_ip: ipv6::gateway_of(cidr),
        }
    }
}

/// A pod attached to this node's switch.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodPort {
    pub ofport: u32,
    /// Its IPv4 address: none on an IPv6-only node.
    pub ip: Option<Ipv4Addr>,
    pub mac: [u8; 6],
    /// Its IPv6 address, on a dual-stack or IPv6-only node.
    pub ip6: Option<Ipv6Addr>,
}

/// Another node: its pod CIDR is reached through the tunnel to `ip`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteNode {
    pub name: String,
    /// Its IPv4 pod CIDR: none on an IPv6-only node.
    pub pod_cidr: Option<Ipv4Net>,
    /// Its underlay address (of the tunnel's family: the tunnel runs over
    /// IPv6 when this node's own address is IPv6).
    pub ip: IpAddr,
    /// Its IPv6 pod CIDR, on a dual-stack node.
    pub pod_cidr6: Option<Ipv6Net>,
}

/// The MAC that routed packets towards a remote node carry as destination
/// (and that the switch answers ARP for remote gateways with): it maps to
/// the tunnel port in L2ForwardingCalc.
pub const VIRTUAL_MAC: [u8; 6] = [0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff];

/// The MAC address oxvs gives the pod holding `ip`: `0a:58:` + the address.
pub fn pod_mac(ip: Ipv4Addr) -> [u8; 6] {
    let o = ip.octets();
    [0x0a, 0x58, o[0], o[1], o[2], o[3]]
}

/// The MAC address oxvs gives a pod with IPv4 address `ip4` and IPv6
/// address `ip6`: [`pod_mac`] of the IPv4 one, else (an IPv6-only pod)
/// `0a:58:` + the IPv6 address's last four bytes (unique within a pod
/// CIDR of /96 or longer, and the node's IPAM hands addresses out from
/// the start of its range).
pub fn pod_mac_of(ip4: Option<Ipv4Addr>, ip6: Option<Ipv6Addr>) -> [u8; 6] {
    match (ip4, ip6) {
        (Some(ip), _) => pod_mac(ip),
        (None, Some(ip)) => {
            let o = ip.octets();
            [0x0a, 0x58, o[12], o[13], o[14], o[15]]
        }
        (None, None) => pod_mac(Ipv4Addr::UNSPECIFIED),
    }
}

/// `aa:bb:cc:dd:ee:ff` text of a MAC address.
pub fn mac_str(mac: &[u8; 6]) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]
    )
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut out {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(out)
}

/// The default flow of `table`: on to `next`.
fn default_goto(table: TableDef, next: TableDef) -> FlowLine {
    FlowLine::new(table, priority::DEFAULT, cookie::DEFAULTS).goto(next)
}

/// The default flow of a table that is a gate: drop.
fn default_drop(table: TableDef) -> FlowLine {
    FlowLine::new(table, priority::DEFAULT, cookie::DEFAULTS).drop_packet()
}

/// The flows every node has: pipeline defaults and the gateway's flows, one
/// function per table, in pipeline order.
/// With `proxy`, ConntrackZone translates NATed connections and new
/// connections meet ServiceLB before egress policy ([`crate::proxy`]).
/// A dual-stack node also has [`ipv6::node_flows`].
pub fn node_flows(node: &NodeNet, proxy: bool) -> Vec<String> {
    let v4 = node.ipv4.is_some();
    [
        classifier(node),
        spoof_guard(node),
        arp_responder(node),
        conntrack_zone(proxy, v4),
        conntrack_state(proxy, v4),
        egress_defaults(),
        l3_forwarding(node),
        l3_dec_ttl(proxy, v4),
        l2_forwarding_calc(node),
        ingress_defaults(v4),
        conntrack_commit(v4),
        output(),
        node.ipv6
            .as_ref()
            .map(|v6| ipv6::node_flows(node, v6, proxy))
            .unwrap_or_default(),
    ]
    .into_iter()
    .flatten()
    .map(String::from)
    .collect()
}

/// The conntrack action of ConntrackZone (both families).
fn conntrack_action(proxy: bool) -> String {
    match proxy {
        true => crate::proxy::conntrack_zone_action(),
        false => format!("ct(table={},zone={CT_ZONE})", CONNTRACK_STATE.id),
    }
}

/// Where L3DecTTL goes next: ServiceSNAT with the proxy.
fn after_dec_ttl(proxy: bool) -> TableDef {
    match proxy {
        true => SERVICE_SNAT,
        false => L2_FORWARDING_CALC,
    }
}

/// Classifier: the gateway port is the host; any other unknown port drops.
fn classifier(node: &NodeNet) -> Vec<FlowLine> {
    vec![classify_gateway(node), default_drop(CLASSIFIER)]
}

/// SpoofGuard: the gateway is the host stack, trusted; anything that no
/// pod's guard lets through drops.
fn spoof_guard(node: &NodeNet) -> Vec<FlowLine> {
    let mut v = match node.ipv4 {
        Some(_) => spoof_guard_trust_gateway(node),
        None => Vec::new(),
    };
    v.push(default_drop(SPOOF_GUARD));
    v
}

/// ARPResponder: answer for the gateway in place (the pod learns the
/// gateway's real MAC); requests and replies addressed to the gateway go to
/// it; other ARP is switched by MAC.
fn arp_responder(node: &NodeNet) -> Vec<FlowLine> {
    let mut v = match &node.ipv4 {
        Some(v4) => vec![
            arp_answer(cookie::GATEWAY, v4.gateway_ip, &node.gateway_mac),
            arp_to_port(cookie::GATEWAY, v4.gateway_ip, node.gateway_ofport),
        ],
        None => Vec::new(),
    };
    v.push(default_goto(ARP_RESPONDER, L2_FORWARDING_CALC));
    v
}

/// ConntrackZone: every IP packet through conntrack; nothing else passes.
/// (`v4`: the node has an IPv4 side; the IPv6 flows are [`ipv6`]'s.)
fn conntrack_zone(proxy: bool, v4: bool) -> Vec<FlowLine> {
    let mut v: Vec<FlowLine> = v4.then(|| track(proxy, "ip")).into_iter().collect();
    v.push(default_drop(CONNTRACK_ZONE));
    v
}

/// ConntrackZone: packets of `family` (`ip`/`ipv6`) through conntrack.
fn track(proxy: bool, family: &str) -> FlowLine {
    FlowLine::new(
        CONNTRACK_ZONE,
        priority::conntrack_zone::TRACK,
        cookie::DEFAULTS,
    )
    .matching(family)
    .action(conntrack_action(proxy))
}

/// ConntrackState: invalid packets of `family` drop.
fn drop_invalid(family: &str) -> FlowLine {
    FlowLine::new(
        CONNTRACK_STATE,
        priority::conntrack_state::INVALID,
        cookie::DEFAULTS,
    )
    .matching("ct_state=+inv+trk")
    .matching(family)
    .drop_packet()
}

/// ConntrackState: invalid drops, established and related skip egress
/// policy, new connections meet it (with the proxy: ServiceLB first).
fn conntrack_state(proxy: bool, v4: bool) -> Vec<FlowLine> {
    let mut v = Vec::new();
    if v4 {
        v.push(drop_invalid("ip"));
        v.extend(skip_established(
            CONNTRACK_STATE,
            priority::conntrack_state::ESTABLISHED,
            L3_FORWARDING,
            "ip",
        ));
    }
    if proxy {
        v.push(crate::proxy::conntrack_state_default());
        v.push(crate::proxy::session_affinity_default());
        v.push(default_goto(SERVICE_LB, EGRESS_RULE));
    } else {
        v.push(default_goto(CONNTRACK_STATE, EGRESS_RULE));
    }
    v
}

/// The egress policy tables without a policy: straight through.
fn egress_defaults() -> Vec<FlowLine> {
    vec![
        default_goto(EGRESS_RULE, EGRESS_DEFAULT_RULE),
        default_goto(EGRESS_DEFAULT_RULE, EGRESS_METRIC),
        default_goto(EGRESS_METRIC, L3_FORWARDING),
    ]
}

/// L3Forwarding: replies of connections from the gateway go back to it;
/// everything not routed to a pod or a remote node is switched by MAC.
fn l3_forwarding(node: &NodeNet) -> Vec<FlowLine> {
    let mut v: Vec<FlowLine> = node
        .ipv4
        .as_ref()
        .map(|_| reply_to_gateway(node, "ip"))
        .into_iter()
        .collect();
    v.push(default_goto(L3_FORWARDING, L2_FORWARDING_CALC));
    v
}

/// L3DecTTL: routed packets lose one TTL, except those the host (the
/// gateway) already routed. With the proxy, ServiceSNAT comes next.
fn l3_dec_ttl(proxy: bool, v4: bool) -> Vec<FlowLine> {
    let mut v = match v4 {
        true => dec_ttl(proxy, "ip"),
        false => Vec::new(),
    };
    v.push(default_goto(L3_DEC_TTL, after_dec_ttl(proxy)));
    v
}

/// L3DecTTL's two flows for `family` (`ip`/`ipv6`: TTL or hop limit).
fn dec_ttl(proxy: bool, family: &str) -> Vec<FlowLine> {
    let next = after_dec_ttl(proxy);
    vec![
        FlowLine::new(
            L3_DEC_TTL,
            priority::l3_dec_ttl::FROM_GATEWAY,
            cookie::DEFAULTS,
        )
        .matching(family)
        .mark(regs::FROM_GATEWAY)
        .goto(next),
        FlowLine::new(L3_DEC_TTL, priority::l3_dec_ttl::DEC_TTL, cookie::DEFAULTS)
            .matching(family)
            .action("dec_ttl")
            .goto(next),
    ]
}

/// L2ForwardingCalc: the gateway's MAC is its port; an unknown MAC has no
/// output port.
fn l2_forwarding_calc(node: &NodeNet) -> Vec<FlowLine> {
    vec![
        l2_to_port(cookie::GATEWAY, &node.gateway_mac, node.gateway_ofport),
        default_goto(L2_FORWARDING_CALC, INGRESS_RULE),
    ]
}

/// The ingress policy tables without a policy: established and related
/// skip the rules, the rest goes straight through.
fn ingress_defaults(v4: bool) -> Vec<FlowLine> {
    let mut v = match v4 {
        true => skip_established(
            INGRESS_RULE,
            priority::policy_rule::ESTABLISHED,
            CONNTRACK_COMMIT,
            "ip",
        ),
        false => Vec::new(),
    };
    v.extend([
        default_goto(INGRESS_RULE, INGRESS_DEFAULT_RULE),
        default_goto(INGRESS_DEFAULT_RULE, INGRESS_METRIC),
        default_goto(INGRESS_METRIC, CONNTRACK_COMMIT),
    ]);
    v
}

/// ConntrackCommit: new connections are committed; those that enter from
/// the gateway are marked, so that their replies go back through the host
/// ([`reply_to_gateway`]).
fn conntrack_commit(v4: bool) -> Vec<FlowLine> {
    let mut v = match v4 {
        true => commit("ip"),
        false => Vec::new(),
    };
    v.push(default_goto(CONNTRACK_COMMIT, OUTPUT));
    v
}

/// ConntrackCommit's two flows for `family` (`ip`/`ipv6`).
fn commit(family: &str) -> Vec<FlowLine> {
    vec![
        FlowLine::new(
            CONNTRACK_COMMIT,
            priority::conntrack_commit::FROM_GATEWAY,
            cookie::GATEWAY,
        )
        .matching("ct_state=+new+trk")
        .matching(family)
        .mark(regs::FROM_GATEWAY)
        .action(format!(
            "ct(commit,zone={CT_ZONE},exec({}))",
            regs::FROM_GATEWAY_CT_MARK.load()
        ))
        .goto(OUTPUT),
        FlowLine::new(
            CONNTRACK_COMMIT,
            priority::conntrack_commit::COMMIT,
            cookie::DEFAULTS,
        )
        .matching("ct_state=+new+trk")
        .matching(family)
        .action(format!("ct(commit,zone={CT_ZONE})"))
        .goto(OUTPUT),
    ]
}

/// Output: to the port L2ForwardingCalc chose, if any; else drop.
fn output() -> Vec<FlowLine> {
    vec![
        FlowLine::new(OUTPUT, priority::output::KNOWN_PORT, cookie::DEFAULTS)
            .mark(regs::OFPORT_FOUND_MARK)
            .action(format!("output:{}", regs::TARGET_OFPORT.nxm())),
        default_drop(OUTPUT),
    ]
}

/// The flows of one pod (all with cookie [`cookie::pod`] of its port); a
/// pod with an IPv6 address on a dual-stack node also has
/// [`ipv6::pod_flows`].
pub fn pod_flows(node: &NodeNet, pod: &PodPort) -> Vec<String> {
    let c = cookie::pod(pod.ofport);
    let v6 = match (&node.ipv6, pod.ip6) {
        (Some(_), Some(ip6)) => ipv6::pod_flows(node, pod, ip6),
        _ => Vec::new(),
    };
    let v4 = match (&node.ipv4, pod.ip) {
        (Some(_), Some(ip)) => vec![
            spoof_guard_pod_ip(pod, ip),
            spoof_guard_pod_arp(pod, ip),
            arp_gratuitous_to_host(node, pod, ip),
            arp_to_port(c, ip, pod.ofport),
            route_to_pod(node, pod, ip),
        ],
        _ => Vec::new(),
    };
    std::iter::once(classify_pod(pod))
        .chain(v4)
        .chain(std::iter::once(l2_to_port(c, &pod.mac, pod.ofport)))
        .chain(v6)
        .map(String::from)
        .collect()
}

/// The tunnel's flows: packets from the tunnel are classified (and look
/// routed: destination = the gateway MAC, so L3Forwarding delivers them
/// to local pods), packets to a remote pod CIDR get that node as `tun_dst`
/// and the virtual MAC, which L2ForwardingCalc maps to the tunnel port; the
/// switch answers ARP for each remote gateway (the host routes remote pod
/// CIDRs onlink via them) with the virtual MAC.
///
/// Only known nodes may use the tunnel: a packet from the tunnel is
/// classified only if its outer source (`tun_src`) is the InternalIP of a
/// remote node (one flow per node, with that node's cookie); anything else
/// from the tunnel port is dropped by a flow of its own
/// ([`cookie::TUNNEL_UNKNOWN_SOURCE`], whose counters are
/// `oxvs_agent_tunnel_drops_total{reason="unknown_source"}`). The switch's
/// UDP socket takes datagrams from anyone who can reach the node; without
/// this check, a forged VXLAN packet would enter the pipeline as if a node
/// had sent it, past SpoofGuard (see [`tunnel_guard_flows`] for the pods).
pub fn tunnel_flows(node: &NodeNet, tunnel_ofport: u32, remotes: &[RemoteNode]) -> Vec<String> {
    let mut v = Vec::with_capacity(2 + 3 * remotes.len());
    v.push(drop_tunnel_from_unknown_source(tunnel_ofport));
    v.push(l2_to_port(cookie::TUNNEL, &VIRTUAL_MAC, tunnel_ofport));
    for r in remotes {
        // The node itself, if it is in the list, by either pod CIDR.
        if r.pod_cidr.is_some() && r.pod_cidr == node.pod_cidr4()
            || r.pod_cidr6.is_some() && r.pod_cidr6 == node.pod_cidr6()
        {
            continue;
        }
        let c = cookie::remote_node(r.ip);
        v.push(classify_from_node(node, tunnel_ofport, r));
        if let (Some(_), Some(cidr)) = (&node.ipv4, r.pod_cidr) {
            v.push(arp_answer(c, NodeNet4::of(cidr).gateway_ip, &VIRTUAL_MAC));
            v.push(route_to_remote_node(node, r, cidr));
        }
        if let (Some(_), Some(cidr)) = (&node.ipv6, r.pod_cidr6) {
            v.extend(ipv6::remote_flows(node, r, cidr));
        }
    }
    v.into_iter().map(String::from).collect()
}

/// Pods may not talk to any node's tunnel port: a pod's UDP datagram to
/// `node_ip:udp_port` (IPv4 or IPv6: the tunnel's family) for each node address in `node_ips` (this node's and
/// every remote node's) is dropped in ConntrackState, after reassembly
/// (so a fragmented datagram is judged whole) and before anything is
/// committed, whatever NetworkPolicy says and for connections set up
/// before the flow existed too. Without it, a pod could hand a forged
/// VXLAN packet to its own node's switch through the gateway, or to another
/// node's switch with the node's address as source once the node
/// masquerades it, and the receiving switch would take it for tunnel
/// traffic from a node. Cookie [`cookie::POD_TO_TUNNEL`]; counted as
/// `oxvs_agent_tunnel_drops_total{reason="pod_to_tunnel_port"}`.
pub fn tunnel_guard_flows(node_ips: &[IpAddr], udp_port: u16) -> Vec<String> {
    let mut ips = node_ips.to_vec();
    ips.sort();
    ips.dedup();
    ips.into_iter()
        .map(|ip| String::from(drop_pod_to_tunnel_port(ip, udp_port)))
        .collect()
}

// Flow builders, one per purpose.

/// Classifier: packets from the gateway port are from the host.
fn classify_gateway(node: &NodeNet) -> FlowLine {
    FlowLine::new(CLASSIFIER, priority::classifier::GATEWAY, cookie::GATEWAY)
        .matching(format!("in_port={}", node.gateway_ofport))
        .set_mark(regs::FROM_GATEWAY)
        .goto(SPOOF_GUARD)
}

/// Classifier: packets from a pod's port are from that pod.
fn classify_pod(pod: &PodPort) -> FlowLine {
    FlowLine::new(
        CLASSIFIER,
        priority::classifier::POD,
        cookie::pod(pod.ofport),
    )
    .matching(format!("in_port={}", pod.ofport))
    .set_mark(regs::FROM_POD)
    .goto(SPOOF_GUARD)
}

/// Classifier: packets from the tunnel with a known node's address as
/// outer source are from that node; they get the gateway's MAC as
/// destination (they look routed) and skip SpoofGuard.
fn classify_from_node(node: &NodeNet, tunnel_ofport: u32, r: &RemoteNode) -> FlowLine {
    FlowLine::new(
        CLASSIFIER,
        priority::classifier::KNOWN_NODE,
        cookie::remote_node(r.ip),
    )
    .matching(format!("in_port={tunnel_ofport}"))
    .matching(format!("{}={}", tun_field(r.ip, "src"), r.ip))
    .set_mark(regs::FROM_TUNNEL)
    .action(format!("set_field:{}->eth_dst", mac_str(&node.gateway_mac)))
    .goto(CONNTRACK_ZONE)
}

/// Classifier: the tunnel guard's drop of anything else from the tunnel.
fn drop_tunnel_from_unknown_source(tunnel_ofport: u32) -> FlowLine {
    FlowLine::new(
        CLASSIFIER,
        priority::classifier::UNKNOWN_TUNNEL_SOURCE,
        cookie::TUNNEL_UNKNOWN_SOURCE,
    )
    .matching(format!("in_port={tunnel_ofport}"))
    .drop_packet()
}

/// SpoofGuard: the gateway's IP and ARP pass.
fn spoof_guard_trust_gateway(node: &NodeNet) -> Vec<FlowLine> {
    let gw = node.gateway_ofport;
    vec![
        FlowLine::new(SPOOF_GUARD, priority::spoof_guard::ALLOW, cookie::GATEWAY)
            .matching("ip")
            .matching(format!("in_port={gw}"))
            .goto(CONNTRACK_ZONE),
        FlowLine::new(SPOOF_GUARD, priority::spoof_guard::ALLOW, cookie::GATEWAY)
            .matching("arp")
            .matching(format!("in_port={gw}"))
            .goto(ARP_RESPONDER),
    ]
}

/// SpoofGuard: a pod's IP traffic passes with its own MAC and IP only.
fn spoof_guard_pod_ip(pod: &PodPort, ip: Ipv4Addr) -> FlowLine {
    FlowLine::new(
        SPOOF_GUARD,
        priority::spoof_guard::ALLOW,
        cookie::pod(pod.ofport),
    )
    .matching("ip")
    .matching(format!("in_port={}", pod.ofport))
    .matching(format!("dl_src={}", mac_str(&pod.mac)))
    .matching(format!("nw_src={ip}"))
    .goto(CONNTRACK_ZONE)
}

/// SpoofGuard: a pod's ARP passes with its own MAC and IP only.
fn spoof_guard_pod_arp(pod: &PodPort, ip: Ipv4Addr) -> FlowLine {
    let mac = mac_str(&pod.mac);
    FlowLine::new(
        SPOOF_GUARD,
        priority::spoof_guard::ALLOW,
        cookie::pod(pod.ofport),
    )
    .matching("arp")
    .matching(format!("in_port={}", pod.ofport))
    .matching(format!("dl_src={mac}"))
    .matching(format!("arp_spa={ip}"))
    .matching(format!("arp_sha={mac}"))
    .goto(ARP_RESPONDER)
}

/// ARPResponder: "who has `ip`" is answered in place with `mac`.
pub(crate) fn arp_answer(cookie: u64, ip: Ipv4Addr, mac: &[u8; 6]) -> FlowLine {
    let mac = mac_str(mac);
    FlowLine::new(ARP_RESPONDER, priority::arp_responder::ANSWER, cookie)
        .matching("arp")
        .matching("arp_op=1")
        .matching(format!("arp_tpa={ip}"))
        .action("move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[]")
        .action(format!("set_field:{mac}->eth_src"))
        .action("load:0x2->NXM_OF_ARP_OP[]")
        .action("move:NXM_NX_ARP_SHA[]->NXM_NX_ARP_THA[]")
        .action(format!("set_field:{mac}->arp_sha"))
        .action("move:NXM_OF_ARP_SPA[]->NXM_OF_ARP_TPA[]")
        .action(format!("set_field:{ip}->arp_spa"))
        .action("output:IN_PORT")
}

/// ARPResponder: ARP for `ip` goes to the port that holds it.
fn arp_to_port(cookie: u64, ip: Ipv4Addr, ofport: u32) -> FlowLine {
    FlowLine::new(ARP_RESPONDER, priority::arp_responder::TO_PORT, cookie)
        .matching("arp")
        .matching(format!("arp_tpa={ip}"))
        .action(format!("output:{ofport}"))
}

/// ARPResponder: a pod's own gratuitous ARP (target = its own address)
/// goes to the host.
fn arp_gratuitous_to_host(node: &NodeNet, pod: &PodPort, ip: Ipv4Addr) -> FlowLine {
    FlowLine::new(
        ARP_RESPONDER,
        priority::arp_responder::GRATUITOUS,
        cookie::pod(pod.ofport),
    )
    .matching("arp")
    .matching(format!("in_port={}", pod.ofport))
    .matching(format!("arp_tpa={ip}"))
    .action(format!("output:{}", node.gateway_ofport))
}

/// `+est` and `+rel` packets of `table` (of the family `ip`/`ipv6`) go on
/// to `next`.
fn skip_established(table: TableDef, priority: u16, next: TableDef, family: &str) -> Vec<FlowLine> {
    ["ct_state=+est+trk", "ct_state=+rel+trk"]
        .into_iter()
        .map(|state| {
            FlowLine::new(table, priority, cookie::DEFAULTS)
                .matching(state)
                .matching(family)
                .goto(next)
        })
        .collect()
}

/// L3Forwarding: replies of connections that entered from the gateway go
/// back to the gateway, whatever their destination: the host that
/// forwarded the original direction (after kube-proxy's DNAT, say) must
/// see the reply to undo its NAT. Without this a pod's SYN-ACK to a
/// Service client on this node would go straight to the client, un-NATed.
fn reply_to_gateway(node: &NodeNet, family: &str) -> FlowLine {
    FlowLine::new(
        L3_FORWARDING,
        priority::l3_forwarding::REPLY_TO_GATEWAY,
        cookie::GATEWAY,
    )
    .matching("ct_state=+rpl+trk")
    .mark(regs::FROM_GATEWAY_CT_MARK)
    .matching(family)
    .action(format!("set_field:{}->eth_dst", mac_str(&node.gateway_mac)))
    .goto(L2_FORWARDING_CALC)
}

/// L3Forwarding: IP to the gateway's MAC for a local pod is routed: MACs
/// rewritten.
fn route_to_pod(node: &NodeNet, pod: &PodPort, ip: Ipv4Addr) -> FlowLine {
    let gw_mac = mac_str(&node.gateway_mac);
    FlowLine::new(
        L3_FORWARDING,
        priority::l3_forwarding::ROUTE,
        cookie::pod(pod.ofport),
    )
    .matching("ip")
    .matching(format!("dl_dst={gw_mac}"))
    .matching(format!("nw_dst={ip}"))
    .action(format!("set_field:{gw_mac}->eth_src"))
    .action(format!("set_field:{}->eth_dst", mac_str(&pod.mac)))
    .goto(L3_DEC_TTL)
}

/// L3Forwarding: IP to a remote node's pod CIDR is routed into the tunnel:
/// the virtual MAC as destination, the node as `tun_dst`.
fn route_to_remote_node(node: &NodeNet, r: &RemoteNode, cidr: Ipv4Net) -> FlowLine {
    FlowLine::new(
        L3_FORWARDING,
        priority::l3_forwarding::ROUTE,
        cookie::remote_node(r.ip),
    )
    .matching("ip")
    .matching(format!("nw_dst={cidr}"))
    .action(format!("set_field:{}->eth_src", mac_str(&node.gateway_mac)))
    .action(format!("set_field:{}->eth_dst", mac_str(&VIRTUAL_MAC)))
    .action(set_tun_dst(r.ip))
    .goto(L3_DEC_TTL)
}

/// The OVS field of the tunnel's outer `src` or `dst` address for an
/// underlay address of `ip`'s family (`tun_src`, `tun_ipv6_dst`...).
pub fn tun_field(ip: IpAddr, which: &str) -> String {
    match ip {
        IpAddr::V4(_) => format!("tun_{which}"),
        IpAddr::V6(_) => format!("tun_ipv6_{which}"),
    }
}

/// The action sending a packet through the tunnel to the node at `ip`.
pub(crate) fn set_tun_dst(ip: IpAddr) -> String {
    format!("set_field:{ip}->{}", tun_field(ip, "dst"))
}

/// L2ForwardingCalc: destination `mac` is output port `ofport`.
fn l2_to_port(cookie: u64, mac: &[u8; 6], ofport: u32) -> FlowLine {
    FlowLine::new(
        L2_FORWARDING_CALC,
        priority::l2_forwarding_calc::KNOWN_MAC,
        cookie,
    )
    .matching(format!("dl_dst={}", mac_str(mac)))
    .action(regs::TARGET_OFPORT.load(ofport))
    .set_mark(regs::OFPORT_FOUND_MARK)
    .goto(INGRESS_RULE)
}

/// ConntrackState: the tunnel guard's drop of a pod's datagram to
/// `ip:udp_port`.
fn drop_pod_to_tunnel_port(ip: IpAddr, udp_port: u16) -> FlowLine {
    let (proto, dst) = match ip {
        IpAddr::V4(_) => ("udp", "nw_dst"),
        IpAddr::V6(_) => ("udp6", "ipv6_dst"),
    };
    FlowLine::new(
        CONNTRACK_STATE,
        priority::conntrack_state::TUNNEL_GUARD,
        cookie::POD_TO_TUNNEL,
    )
    .matching(proto)
    .mark(regs::FROM_POD)
    .matching(format!("{dst}={ip}"))
    .matching(format!("tp_dst={udp_port}"))
    .drop_packet()
}

/// A gratuitous ARP request from `mac`/`ip` (padded to 60 bytes), as the
/// pod would send it after its address was configured.
pub fn gratuitous_arp(mac: [u8; 6], ip: Ipv4Addr) -> Vec<u8> {
    let mut f = Vec::with_capacity(60);
    f.extend_from_slice(&[0xff; 6]);
    f.extend_from_slice(&mac);
    f.extend_from_slice(&[0x08, 0x06, 0x00, 0x01, 0x08, 0x00, 6, 4, 0x00, 0x01]);
    f.extend_from_slice(&mac);
    f.extend_from_slice(&ip.octets());
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&ip.octets());
    f.resize(60, 0);
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::{self, Inputs, Tunnel};
    use oxvs_pipeline::parse::{parse_flow_file, ParseContext};
    use oxvs_pipeline::tables::Pipeline;
    use oxvs_pipeline::xlate::XlateEnv;

    fn node() -> NodeNet {
        NodeNet {
            ipv4: Some(crate::flows::NodeNet4 {
                pod_cidr: "10.244.0.0/24".parse().unwrap(),
                gateway_ip: "10.244.0.1".parse().unwrap(),
            }),
            gateway_mac: [0x0a, 0x58, 10, 244, 0, 1],
            gateway_ofport: 2,
            ipv6: None,
        }
    }

    /// The desired flows of [`node`] with `pods` and nothing else.
    fn desired_flows(node: &NodeNet, pods: &[PodPort]) -> String {
        desired::compute(&Inputs {
            pods: pods.to_vec(),
            ..Inputs::for_node(node.clone())
        })
        .text()
    }

    fn pod(ofport: u32, last: u8) -> PodPort {
        let ip = Ipv4Addr::new(10, 244, 0, last);
        PodPort {
            ofport,
            ip: Some(ip),
            mac: pod_mac(ip),
            ip6: None,
        }
    }

    #[test]
    fn every_flow_parses_and_names_its_object() {
        let text = desired_flows(&node(), &[pod(3, 3), pod(4, 4)]);
        let flows = parse_flow_file(&text, &ParseContext::default()).unwrap();
        assert_eq!(
            flows.len(),
            node_flows(&node(), false).len() + 2 * pod_flows(&node(), &pod(3, 3)).len()
        );
        for f in &flows {
            assert!(
                cookie::Feature::of(f.cookie).is_some(),
                "flow without a feature cookie: {f:?}"
            );
        }
        assert_eq!(
            flows
                .iter()
                .filter(|f| cookie::pod_port(f.cookie) == Some(4))
                .count(),
            7
        );
    }

    #[test]
    fn mac_helpers() {
        assert_eq!(
            mac_str(&pod_mac("10.244.0.5".parse().unwrap())),
            "0a:58:0a:f4:00:05"
        );
        assert_eq!(
            parse_mac("0a:58:0a:f4:00:05"),
            Some([0x0a, 0x58, 10, 244, 0, 5])
        );
        assert_eq!(parse_mac("0a:58:0a:f4:00"), None);
        assert_eq!(parse_mac("0a:58:0a:f4:00:05:01"), None);
        assert_eq!(parse_mac("0a:58:0a:f4:00:zz"), None);
        assert_eq!(cookie::pod_port(cookie::pod(7)), Some(7));
        assert_eq!(cookie::pod_port(cookie::GATEWAY), None);
        let g = gratuitous_arp([2, 0, 0, 0, 0, 1], "10.0.0.1".parse().unwrap());
        assert_eq!(g.len(), 60);
        assert_eq!(&g[12..14], &[0x08, 0x06]);
    }

    fn trace_text(spec: &str) -> String {
        let inp = Inputs {
            pods: vec![pod(3, 3), pod(4, 4)],
            ..Inputs::for_node(node())
        };
        desired::trace_desired(&inp, "", spec)
    }

    /// This node with pod 3 and the tunnel (port 9) to node n2
    /// (10.244.1.0/24) at `remote`, this node being at `own`.
    fn tunnel_inputs(own: &str, remote: &str) -> Inputs {
        Inputs {
            pods: vec![pod(3, 3)],
            tunnel: Some(Tunnel {
                ofport: 9,
                remotes: vec![RemoteNode {
                    name: "n2".into(),
                    pod_cidr: Some("10.244.1.0/24".parse().unwrap()),
                    ip: remote.parse().unwrap(),
                    pod_cidr6: None,
                }],
                node_ip: Some(own.parse().unwrap()),
                guard: true,
            }),
            ..Inputs::for_node(node())
        }
    }

    fn trace_with_tunnel(spec: &str) -> String {
        let inp = tunnel_inputs("192.168.77.11", "192.168.77.12");
        desired::trace_desired(&inp, "", spec)
    }

    #[test]
    fn traces_across_the_tunnel() {
        // Local pod -> remote pod: routed via the gateway MAC, out the tunnel to node 2.
        let t = trace_with_tunnel("in_port=3,icmp,dl_src=0a:58:0a:f4:00:03,dl_dst=0a:58:0a:f4:00:01,nw_src=10.244.0.3,nw_dst=10.244.1.7,nw_ttl=64");
        let last = t.lines().last().unwrap();
        assert!(
            last.contains("tun_dst=192.168.77.12") || last.contains("192.168.77.12"),
            "{t}"
        );
        assert!(
            last.contains("dst=aa:bb:cc:dd:ee:ff") && last.ends_with(",9"),
            "{t}"
        );
        assert!(last.contains("ttl=63"), "routed: TTL decremented\n{t}");
        // Remote pod -> local pod, from the tunnel: delivered with the pod's MAC.
        let t = trace_with_tunnel("in_port=9,icmp,tun_src=192.168.77.12,dl_src=0a:58:0a:f4:01:01,dl_dst=aa:bb:cc:dd:ee:ff,nw_src=10.244.1.7,nw_dst=10.244.0.3,nw_ttl=63");
        let last = t.lines().last().unwrap();
        assert!(
            last.contains("dst=0a:58:0a:f4:00:03") && last.ends_with(",3"),
            "{t}"
        );
        // The same packet from an address that is no node's: dropped in
        // the Classifier by the tunnel guard.
        for tun_src in ["192.168.77.99", "10.244.0.3", "10.244.0.1"] {
            let t = trace_with_tunnel(&format!("in_port=9,icmp,tun_src={tun_src},dl_src=0a:58:0a:f4:01:01,dl_dst=aa:bb:cc:dd:ee:ff,nw_src=10.244.0.1,nw_dst=10.244.0.3,nw_ttl=63"));
            assert!(
                t.contains("cookie 0x3000000000003") && t.trim_end().ends_with("drop"),
                "{t}"
            );
        }
        // The host ARPs for the remote gateway: answered with the virtual MAC.
        let t = trace_with_tunnel("in_port=2,arp,arp_op=1,dl_src=0a:58:0a:f4:00:01,dl_dst=ff:ff:ff:ff:ff:ff,arp_spa=10.244.0.1,arp_sha=0a:58:0a:f4:00:01,arp_tpa=10.244.1.1");
        assert!(
            t.lines().last().unwrap().contains("sha=aa:bb:cc:dd:ee:ff"),
            "{t}"
        );
    }

    #[test]
    fn pods_cannot_reach_any_nodes_vxlan_port() {
        let udp = |dst: &str, port: u16| {
            trace_with_tunnel(&format!("in_port=3,udp,dl_src=0a:58:0a:f4:00:03,dl_dst=0a:58:0a:f4:00:01,nw_src=10.244.0.3,nw_dst={dst},nw_ttl=64,tp_src=40000,tp_dst={port}"))
        };
        // This node's address and the other node's: dropped after
        // conntrack lookup, by the guard's cookie.
        for dst in ["192.168.77.11", "192.168.77.12"] {
            let t = udp(dst, VXLAN_UDP_PORT);
            assert!(
                t.contains("cookie 0x3000000000004") && t.trim_end().ends_with("drop"),
                "{t}"
            );
        }
        // Another port of a node, or port 4789 of a host that is no node:
        // not the guard's business (routed to the gateway).
        for (dst, port) in [("192.168.77.12", 4790), ("192.0.2.9", VXLAN_UDP_PORT)] {
            let t = udp(dst, port);
            assert!(!t.contains("cookie 0x3000000000004"), "{t}");
            assert!(t.lines().last().unwrap().ends_with(",2"), "{t}");
        }
    }

    /// The tunnel over an IPv6 underlay: out with `tun_ipv6_dst`, in only
    /// from a known node's `tun_ipv6_src` (the guard drops any other
    /// source, and an IPv4 outer source from the node's IPv4 address: the
    /// node is known by its tunnel address), and pods' UDP to any node's
    /// IPv6 VXLAN port dropped.
    /// An IPv6-only node: pods reach each other and the remote node's
    /// pods over IPv6; no IPv4 or ARP passes, from a pod or the host.
    #[test]
    fn an_ipv6_only_node_forwards_ipv6_and_nothing_else() {
        let node = NodeNet {
            ipv4: None,
            ipv6: Some(NodeNet6::of("fd00:10:244::/64".parse().unwrap())),
            ..node()
        };
        let pod6 = |ofport: u32, last: u16| {
            let ip6 = Ipv6Addr::new(0xfd00, 0x10, 0x244, 0, 0, 0, 0, last);
            PodPort {
                ofport,
                ip: None,
                mac: pod_mac_of(None, Some(ip6)),
                ip6: Some(ip6),
            }
        };
        assert_eq!(mac_str(&pod6(3, 3).mac), "0a:58:00:00:00:03");
        let inp = Inputs {
            pods: vec![pod6(3, 3), pod6(4, 4)],
            tunnel: Some(Tunnel {
                ofport: 9,
                remotes: vec![RemoteNode {
                    name: "n2".into(),
                    pod_cidr: None,
                    ip: "fd00:77::12".parse().unwrap(),
                    pod_cidr6: Some("fd00:10:244:1::/64".parse().unwrap()),
                }],
                node_ip: Some("fd00:77::11".parse().unwrap()),
                guard: true,
            }),
            ..Inputs::for_node(node.clone())
        };
        let text = desired::compute(&inp).text();
        assert!(
            !text
                .lines()
                .any(|l| l.contains("arp") || l.contains(" ip,")),
            "no IPv4 or ARP flow:\n{text}"
        );
        let trace = |spec: &str| desired::trace_desired(&inp, "", spec);
        let gw = "0a:58:0a:f4:00:01";
        // Pod to pod on the node, routed.
        let t = trace(&format!("in_port=3,icmp6,icmp_type=128,dl_src=0a:58:00:00:00:03,dl_dst={gw},ipv6_src=fd00:10:244::3,ipv6_dst=fd00:10:244::4,nw_ttl=64"));
        assert!(t.lines().last().unwrap().ends_with(",4"), "{t}");
        // The gateway's neighbour solicitation answered.
        let t = trace("in_port=3,icmp6,icmp_type=135,icmp_code=0,dl_src=0a:58:00:00:00:03,dl_dst=33:33:ff:00:00:01,ipv6_src=fd00:10:244::3,ipv6_dst=ff02::1:ff00:1,nd_target=fd00:10:244::1,nw_ttl=255");
        assert!(t.contains(&format!("set_field:{gw}->nd_tll")), "{t}");
        // Into the tunnel to the remote node.
        let t = trace(&format!("in_port=3,udp6,dl_src=0a:58:00:00:00:03,dl_dst={gw},ipv6_src=fd00:10:244::3,ipv6_dst=fd00:10:244:1::7,nw_ttl=64,tp_src=1000,tp_dst=53"));
        assert!(t.contains("set_field:fd00:77::12->tun_ipv6_dst"), "{t}");
        assert!(t.lines().last().unwrap().ends_with(",9"), "{t}");
        // IPv4 and ARP from a pod or the host go nowhere.
        for spec in [
            format!("in_port=3,icmp,dl_src=0a:58:00:00:00:03,dl_dst={gw},nw_src=10.244.0.3,nw_dst=10.244.0.4,nw_ttl=64"),
            format!("in_port=2,icmp,dl_src={gw},dl_dst=0a:58:00:00:00:04,nw_src=10.244.0.1,nw_dst=10.244.0.4,nw_ttl=64"),
            "in_port=3,arp,arp_op=1,dl_src=0a:58:00:00:00:03,dl_dst=ff:ff:ff:ff:ff:ff,arp_spa=10.244.0.3,arp_sha=0a:58:00:00:00:03,arp_tpa=10.244.0.1".to_string(),
        ] {
            let t = trace(&spec);
            assert!(t.trim_end().ends_with("drop"), "{spec}: {t}");
        }
    }

    #[test]
    fn traces_across_an_ipv6_underlay() {
        let inp = tunnel_inputs("fd00:77::11", "fd00:77::12");
        let mut state = crate::model::ClusterState::default();
        state.nodes.insert(
            "n2".into(),
            crate::model::Node {
                name: "n2".into(),
                pod_cidr: Some("10.244.1.0/24".parse().unwrap()),
                pod_cidr6: None,
                internal_ip: Some("192.168.77.12".parse().unwrap()),
                internal_ip6: Some("fd00:77::12".parse().unwrap()),
            },
        );
        let inp = Inputs {
            state: std::sync::Arc::new(state),
            ..inp
        };
        let trace = |spec: &str| desired::trace_desired(&inp, "", spec);
        let t = trace("in_port=3,icmp,dl_src=0a:58:0a:f4:00:03,dl_dst=0a:58:0a:f4:00:01,nw_src=10.244.0.3,nw_dst=10.244.1.7,nw_ttl=64");
        assert!(t.contains("set_field:fd00:77::12->tun_ipv6_dst"), "{t}");
        assert!(t.lines().last().unwrap().ends_with(",9"), "{t}");
        let t = trace("in_port=9,icmp,tun_ipv6_src=fd00:77::12,tun_ipv6_dst=fd00:77::11,dl_src=0a:58:0a:f4:01:01,dl_dst=aa:bb:cc:dd:ee:ff,nw_src=10.244.1.7,nw_dst=10.244.0.3,nw_ttl=63");
        assert!(t.lines().last().unwrap().ends_with(",3"), "delivered: {t}");
        for src in ["tun_ipv6_src=fd00:77::99", "tun_src=192.168.77.12"] {
            let t = trace(&format!("in_port=9,icmp,{src},dl_src=0a:58:0a:f4:01:01,dl_dst=aa:bb:cc:dd:ee:ff,nw_src=10.244.1.7,nw_dst=10.244.0.3,nw_ttl=63"));
            assert!(
                t.contains("cookie 0x3000000000003") && t.trim_end().ends_with("drop"),
                "{src}: {t}"
            );
        }
        let flows = desired::base_flows(&inp).join("\n");
        for ip in ["fd00:77::11", "fd00:77::12"] {
            assert!(
                flows.lines().any(|l| l.contains("udp6")
                    && l.contains(&format!("ipv6_dst={ip},"))
                    && l.contains("tp_dst=4789")
                    && l.ends_with("actions=drop")),
                "the guard covers {ip}:\n{flows}"
            );
        }
        // The other family's address of a node too: a pod's datagram to
        // it would leave masqueraded with this node's address.
        assert!(
            flows.lines().any(|l| l.contains(" udp,")
                && l.contains("nw_dst=192.168.77.12,")
                && l.contains("tp_dst=4789")
                && l.ends_with("actions=drop")),
            "the guard covers n2's IPv4 address:\n{flows}"
        );
    }

    /// An Ethernet + IPv4 + TCP frame (checksums left zero: the pipeline
    /// does not verify them).
    fn tcp_frame(
        dl: ([u8; 6], [u8; 6]),
        src: (Ipv4Addr, u16),
        dst: (Ipv4Addr, u16),
        flags: u8,
        seq: u32,
        ack: u32,
    ) -> Vec<u8> {
        let mut f = Vec::with_capacity(54);
        f.extend_from_slice(&dl.1);
        f.extend_from_slice(&dl.0);
        f.extend_from_slice(&[0x08, 0x00]);
        f.extend_from_slice(&[0x45, 0, 0, 40, 0, 1, 0x40, 0, 64, 6, 0, 0]);
        f.extend_from_slice(&src.0.octets());
        f.extend_from_slice(&dst.0.octets());
        f.extend_from_slice(&src.1.to_be_bytes());
        f.extend_from_slice(&dst.1.to_be_bytes());
        f.extend_from_slice(&seq.to_be_bytes());
        f.extend_from_slice(&ack.to_be_bytes());
        f.extend_from_slice(&[0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
        f
    }

    /// kube-proxy's DNAT on the host: the client pod's connection to a
    /// Service comes back into the switch from the gateway (source: the
    /// client, destination: the chosen backend). The backend's reply must go
    /// back to the gateway, not straight to the client next door, so the
    /// host can undo its NAT; a connection that did not come from the
    /// gateway is switched directly as before.
    #[test]
    fn replies_of_connections_from_the_gateway_go_back_to_the_gateway() {
        use oxvs_pipeline::conntrack::{Conntrack, CtConfig};
        use oxvs_pipeline::datapath::{Datapath, DatapathConfig, DpPacket, RecordingSink};
        use std::sync::Arc;
        let (n, client, backend) = (node(), pod(3, 3), pod(4, 4));
        let text = desired_flows(&n, &[client.clone(), backend.clone()]);
        let flows = parse_flow_file(&text, &ParseContext::default()).unwrap();
        let p = Arc::new(Pipeline::new());
        p.replace_all(&flows, 0).unwrap();
        let mut dp = Datapath::new(p, XlateEnv::default(), DatapathConfig::default());
        let mut ct = Conntrack::new(CtConfig::default());
        let mut run = |frame: Vec<u8>, in_port: u32| {
            let mut sink = RecordingSink::default();
            let mut pkts = [DpPacket::from_frame(&frame, in_port)];
            dp.process_batch(&mut pkts, &mut ct, 1, &mut sink);
            sink.outputs
        };
        let (c, b) = ((client.ip.unwrap(), 40000), (backend.ip.unwrap(), 8080));
        // SYN after DNAT, from the host: delivered to the backend.
        let out = run(
            tcp_frame((n.gateway_mac, backend.mac), c, b, 0x02, 100, 0),
            n.gateway_ofport,
        );
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, backend.ofport);
        // The backend's SYN-ACK, addressed to the client's MAC: to the gateway.
        let out = run(
            tcp_frame((backend.mac, client.mac), b, c, 0x12, 500, 101),
            backend.ofport,
        );
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].0, n.gateway_ofport, "reply not sent to the host");
        assert_eq!(&out[0].1[..6], &n.gateway_mac, "destination MAC");
        // The same ports between the pods directly (no host): switched.
        let out = run(
            tcp_frame(
                (backend.mac, client.mac),
                b,
                (client.ip.unwrap(), 40001),
                0x02,
                7,
                0,
            ),
            backend.ofport,
        );
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, client.ofport);
        let out = run(
            tcp_frame(
                (client.mac, backend.mac),
                (client.ip.unwrap(), 40001),
                b,
                0x12,
                9,
                8,
            ),
            client.ofport,
        );
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, backend.ofport, "direct reply detoured");
    }

    #[test]
    fn traces_pod_to_pod_host_to_pod_and_spoofing() {
        // Pod 3 -> pod 4, same subnet: switched by MAC to port 4.
        let t = trace_text("in_port=3,icmp,dl_src=0a:58:0a:f4:00:03,dl_dst=0a:58:0a:f4:00:04,nw_src=10.244.0.3,nw_dst=10.244.0.4,nw_ttl=64");
        assert_eq!(
            t.lines().last(),
            Some("Datapath actions: ct(commit,zone=65520),4"),
            "{t}"
        );
        // Spoofed source: dropped.
        let t = trace_text("in_port=3,icmp,dl_src=0a:58:0a:f4:00:03,dl_dst=0a:58:0a:f4:00:04,nw_src=10.244.0.9,nw_dst=10.244.0.4");
        assert!(t.trim_end().ends_with("Datapath actions: drop"), "{t}");
        // Host -> pod 4: committed with the from-gateway mark.
        let t = trace_text("in_port=2,tcp,dl_src=0a:58:0a:f4:00:01,dl_dst=0a:58:0a:f4:00:04,nw_src=10.244.0.1,nw_dst=10.244.0.4,tp_dst=80");
        assert_eq!(
            t.lines().last(),
            Some("Datapath actions: ct(commit,zone=65520,mark=0x1/0x1),4"),
            "{t}"
        );
        // Pod ARP for the gateway: answered in place.
        let t = trace_text("in_port=3,arp,arp_op=1,dl_src=0a:58:0a:f4:00:03,dl_dst=ff:ff:ff:ff:ff:ff,arp_spa=10.244.0.3,arp_sha=0a:58:0a:f4:00:03,arp_tpa=10.244.0.1");
        assert!(
            t.lines()
                .last()
                .unwrap()
                .ends_with("op=2,sha=0a:58:0a:f4:00:01,tha=0a:58:0a:f4:00:03)),3"),
            "{t}"
        );
        // Unknown port: dropped.
        let t = trace_text("in_port=9,icmp,nw_src=10.244.0.9,nw_dst=10.244.0.4");
        assert!(t.trim_end().ends_with("Datapath actions: drop"), "{t}");
    }
}
