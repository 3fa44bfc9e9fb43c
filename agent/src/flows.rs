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
//! | 60 L2ForwardingCalc | destination MAC -> output port in reg1, reg0[16] = 1 |
//! | 70, 71, 75 | ingress policy (defaults only until NetworkPolicy) |
//! | 80 ConntrackCommit | commit new connections; those from the gateway with [`regs::FROM_GATEWAY_CT_MARK`] |
//! | 90 Output | output to reg1 if known, else drop |
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
//! and readable in dumps.

use std::fmt::Write as _;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use oxvs_pipeline::{names, regs};

use crate::cookie;
use crate::priority;

/// The UDP port of the node's VXLAN tunnel (IANA's), which the agent asks
/// the switch to use and guards from pods ([`tunnel_guard_flows`]).
pub const VXLAN_UDP_PORT: u16 = 4789;

/// The conntrack zone pod traffic is tracked in.
pub const CT_ZONE: u16 = 65520;

/// The node-level facts the flows depend on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeNet {
    pub pod_cidr: Ipv4Net,
    pub gateway_ip: Ipv4Addr,
    pub gateway_mac: [u8; 6],
    pub gateway_ofport: u32,
}

/// A pod attached to this node's switch.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodPort {
    pub ofport: u32,
    pub ip: Ipv4Addr,
    pub mac: [u8; 6],
}

/// Another node: its pod CIDR is reached through the tunnel to `ip`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteNode {
    pub name: String,
    pub pod_cidr: Ipv4Net,
    pub ip: Ipv4Addr,
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

fn line(out: &mut Vec<String>, table: names::TableDef, priority: u16, cookie: u64, body: &str) {
    let mut s = String::with_capacity(96 + body.len());
    let _ = write!(
        s,
        "table={}, priority={priority}, cookie={cookie:#x}, {body}",
        table.name
    );
    out.push(s);
}

/// The flows every node has: pipeline defaults and the gateway's flows.
pub fn node_flows(node: &NodeNet) -> Vec<String> {
    use names::*;
    let d = cookie::DEFAULTS;
    let g = cookie::GATEWAY;
    let gw = node.gateway_ofport;
    let gw_mac = mac_str(&node.gateway_mac);
    let gw_ip = node.gateway_ip;
    let mut v = Vec::with_capacity(40);

    // Classifier.
    line(
        &mut v,
        CLASSIFIER,
        priority::classifier::GATEWAY,
        g,
        &format!(
            "in_port={gw}, actions={},goto_table:{}",
            regs::FROM_GATEWAY.load(),
            SPOOF_GUARD.id
        ),
    );
    line(&mut v, CLASSIFIER, priority::DEFAULT, d, "actions=drop");
    // SpoofGuard: the gateway is the host stack, trusted.
    line(
        &mut v,
        SPOOF_GUARD,
        priority::spoof_guard::ALLOW,
        g,
        &format!("ip, in_port={gw}, actions=goto_table:{}", CONNTRACK_ZONE.id),
    );
    line(
        &mut v,
        SPOOF_GUARD,
        priority::spoof_guard::ALLOW,
        g,
        &format!("arp, in_port={gw}, actions=goto_table:{}", ARP_RESPONDER.id),
    );
    line(&mut v, SPOOF_GUARD, priority::DEFAULT, d, "actions=drop");
    // ARPResponder: answer for the gateway in place (the pod learns the
    // gateway's real MAC); replies and requests addressed to the gateway go to it.
    line(
        &mut v,
        ARP_RESPONDER,
        priority::arp_responder::ANSWER,
        g,
        &format!(
            "arp, arp_op=1, arp_tpa={gw_ip}, actions=move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],set_field:{gw_mac}->eth_src,load:0x2->NXM_OF_ARP_OP[],move:NXM_NX_ARP_SHA[]->NXM_NX_ARP_THA[],set_field:{gw_mac}->arp_sha,move:NXM_OF_ARP_SPA[]->NXM_OF_ARP_TPA[],set_field:{gw_ip}->arp_spa,output:IN_PORT"
        ),
    );
    line(
        &mut v,
        ARP_RESPONDER,
        priority::arp_responder::TO_PORT,
        g,
        &format!("arp, arp_tpa={gw_ip}, actions=output:{gw}"),
    );
    line(
        &mut v,
        ARP_RESPONDER,
        priority::DEFAULT,
        d,
        &format!("actions=goto_table:{}", L2_FORWARDING_CALC.id),
    );
    // Conntrack.
    line(
        &mut v,
        CONNTRACK_ZONE,
        priority::conntrack_zone::TRACK,
        d,
        &format!(
            "ip, actions=ct(table={},zone={CT_ZONE})",
            CONNTRACK_STATE.id
        ),
    );
    line(&mut v, CONNTRACK_ZONE, priority::DEFAULT, d, "actions=drop");
    line(
        &mut v,
        CONNTRACK_STATE,
        priority::conntrack_state::INVALID,
        d,
        "ct_state=+inv+trk, ip, actions=drop",
    );
    line(
        &mut v,
        CONNTRACK_STATE,
        priority::conntrack_state::ESTABLISHED,
        d,
        &format!(
            "ct_state=+est+trk, ip, actions=goto_table:{}",
            L3_FORWARDING.id
        ),
    );
    line(
        &mut v,
        CONNTRACK_STATE,
        priority::conntrack_state::ESTABLISHED,
        d,
        &format!(
            "ct_state=+rel+trk, ip, actions=goto_table:{}",
            L3_FORWARDING.id
        ),
    );
    line(
        &mut v,
        CONNTRACK_STATE,
        priority::DEFAULT,
        d,
        &format!("actions=goto_table:{}", EGRESS_RULE.id),
    );
    // Egress policy defaults.
    line(
        &mut v,
        EGRESS_RULE,
        priority::DEFAULT,
        d,
        &format!("actions=goto_table:{}", EGRESS_DEFAULT_RULE.id),
    );
    line(
        &mut v,
        EGRESS_DEFAULT_RULE,
        priority::DEFAULT,
        d,
        &format!("actions=goto_table:{}", EGRESS_METRIC.id),
    );
    line(
        &mut v,
        EGRESS_METRIC,
        priority::DEFAULT,
        d,
        &format!("actions=goto_table:{}", L3_FORWARDING.id),
    );
    // Replies of connections that entered from the gateway go back to the
    // gateway, whatever their destination: the host that forwarded the
    // original direction (after kube-proxy's DNAT, say) must see the reply
    // to undo its NAT. Without this a pod's SYN-ACK to a Service client on
    // this node would go straight to the client, un-NATed.
    line(
        &mut v,
        L3_FORWARDING,
        210,
        g,
        &format!(
            "ct_state=+rpl+trk, {}, ip, actions=set_field:{gw_mac}->eth_dst,goto_table:{}",
            regs::FROM_GATEWAY_CT_MARK.matching(),
            L2_FORWARDING_CALC.id
        ),
    );
    // L3: everything not routed to a local pod is switched by MAC.
    line(
        &mut v,
        L3_FORWARDING,
        0,
        d,
        &format!("actions=goto_table:{}", L2_FORWARDING_CALC.id),
    );
    line(
        &mut v,
        L3_DEC_TTL,
        210,
        d,
        &format!(
            "ip, {}, actions=goto_table:{}",
            regs::FROM_GATEWAY.matching(),
            L2_FORWARDING_CALC.id
        ),
    );
    line(
        &mut v,
        L3_DEC_TTL,
        200,
        d,
        &format!("ip, actions=dec_ttl,goto_table:{}", L2_FORWARDING_CALC.id),
    );
    line(
        &mut v,
        L3_DEC_TTL,
        0,
        d,
        &format!("actions=goto_table:{}", L2_FORWARDING_CALC.id),
    );
    // L2: the gateway's MAC.
    line(
        &mut v,
        L2_FORWARDING_CALC,
        200,
        g,
        &format!(
            "dl_dst={gw_mac}, actions={},{},goto_table:{}",
            regs::TARGET_OFPORT.load(gw),
            regs::OFPORT_FOUND_MARK.load(),
            INGRESS_RULE.id
        ),
    );
    line(
        &mut v,
        L2_FORWARDING_CALC,
        0,
        d,
        &format!("actions=goto_table:{}", INGRESS_RULE.id),
    );
    // Ingress policy defaults: established and related skip the rules.
    line(
        &mut v,
        INGRESS_RULE,
        priority::policy_rule::ESTABLISHED,
        d,
        &format!(
            "ct_state=+est+trk, ip, actions=goto_table:{}",
            CONNTRACK_COMMIT.id
        ),
    );
    line(
        &mut v,
        INGRESS_RULE,
        priority::policy_rule::ESTABLISHED,
        d,
        &format!(
            "ct_state=+rel+trk, ip, actions=goto_table:{}",
            CONNTRACK_COMMIT.id
        ),
    );
    line(
        &mut v,
        INGRESS_RULE,
        priority::DEFAULT,
        d,
        &format!("actions=goto_table:{}", INGRESS_DEFAULT_RULE.id),
    );
    line(
        &mut v,
        INGRESS_DEFAULT_RULE,
        priority::DEFAULT,
        d,
        &format!("actions=goto_table:{}", INGRESS_METRIC.id),
    );
    line(
        &mut v,
        INGRESS_METRIC,
        priority::DEFAULT,
        d,
        &format!("actions=goto_table:{}", CONNTRACK_COMMIT.id),
    );
    // Connections that enter from the gateway are marked, so that their
    // replies go back through the host (the L3Forwarding flow at 210).
    line(
        &mut v,
        CONNTRACK_COMMIT,
        priority::conntrack_commit::FROM_GATEWAY,
        g,
        &format!(
            "ct_state=+new+trk, ip, {}, actions=ct(commit,zone={CT_ZONE},exec({})),goto_table:{}",
            regs::FROM_GATEWAY.matching(),
            regs::FROM_GATEWAY_CT_MARK.load(),
            OUTPUT.id
        ),
    );
    line(
        &mut v,
        CONNTRACK_COMMIT,
        priority::conntrack_commit::COMMIT,
        d,
        &format!(
            "ct_state=+new+trk, ip, actions=ct(commit,zone={CT_ZONE}),goto_table:{}",
            OUTPUT.id
        ),
    );
    line(
        &mut v,
        CONNTRACK_COMMIT,
        priority::DEFAULT,
        d,
        &format!("actions=goto_table:{}", OUTPUT.id),
    );
    line(
        &mut v,
        OUTPUT,
        priority::output::KNOWN_PORT,
        d,
        &format!(
            "{}, actions=output:{}",
            regs::OFPORT_FOUND_MARK.matching(),
            regs::TARGET_OFPORT.nxm()
        ),
    );
    line(&mut v, OUTPUT, priority::DEFAULT, d, "actions=drop");
    v
}

/// The flows of one pod (all with cookie [`cookie::pod`] of its port).
pub fn pod_flows(node: &NodeNet, pod: &PodPort) -> Vec<String> {
    use names::*;
    let c = cookie::pod(pod.ofport);
    let p = pod.ofport;
    let mac = mac_str(&pod.mac);
    let ip = pod.ip;
    let gw = node.gateway_ofport;
    let gw_mac = mac_str(&node.gateway_mac);
    let mut v = Vec::with_capacity(8);
    line(
        &mut v,
        CLASSIFIER,
        priority::classifier::POD,
        c,
        &format!(
            "in_port={p}, actions={},goto_table:{}",
            regs::FROM_POD.load(),
            SPOOF_GUARD.id
        ),
    );
    line(
        &mut v,
        SPOOF_GUARD,
        priority::spoof_guard::ALLOW,
        c,
        &format!(
            "ip, in_port={p}, dl_src={mac}, nw_src={ip}, actions=goto_table:{}",
            CONNTRACK_ZONE.id
        ),
    );
    line(
        &mut v,
        SPOOF_GUARD,
        priority::spoof_guard::ALLOW,
        c,
        &format!(
            "arp, in_port={p}, dl_src={mac}, arp_spa={ip}, arp_sha={mac}, actions=goto_table:{}",
            ARP_RESPONDER.id
        ),
    );
    // A pod's own gratuitous ARP (target = its own address) goes to the host.
    line(
        &mut v,
        ARP_RESPONDER,
        priority::arp_responder::GRATUITOUS,
        c,
        &format!("arp, in_port={p}, arp_tpa={ip}, actions=output:{gw}"),
    );
    line(
        &mut v,
        ARP_RESPONDER,
        priority::arp_responder::TO_PORT,
        c,
        &format!("arp, arp_tpa={ip}, actions=output:{p}"),
    );
    line(
        &mut v,
        L3_FORWARDING,
        200,
        c,
        &format!("ip, dl_dst={gw_mac}, nw_dst={ip}, actions=set_field:{gw_mac}->eth_src,set_field:{mac}->eth_dst,goto_table:{}", L3_DEC_TTL.id),
    );
    line(
        &mut v,
        L2_FORWARDING_CALC,
        200,
        c,
        &format!(
            "dl_dst={mac}, actions={},{},goto_table:{}",
            regs::TARGET_OFPORT.load(p),
            regs::OFPORT_FOUND_MARK.load(),
            INGRESS_RULE.id
        ),
    );
    v
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
    use names::*;
    let t = cookie::TUNNEL;
    let gw_mac = mac_str(&node.gateway_mac);
    let vmac = mac_str(&VIRTUAL_MAC);
    let mut v = Vec::with_capacity(2 + 3 * remotes.len());
    line(
        &mut v,
        CLASSIFIER,
        priority::classifier::UNKNOWN_TUNNEL_SOURCE,
        cookie::TUNNEL_UNKNOWN_SOURCE,
        &format!("in_port={tunnel_ofport}, actions=drop"),
    );
    line(
        &mut v,
        L2_FORWARDING_CALC,
        200,
        t,
        &format!(
            "dl_dst={vmac}, actions={},{},goto_table:{}",
            regs::TARGET_OFPORT.load(tunnel_ofport),
            regs::OFPORT_FOUND_MARK.load(),
            INGRESS_RULE.id
        ),
    );
    for r in remotes {
        if r.pod_cidr == node.pod_cidr {
            continue;
        }
        let c = cookie::remote_node(r.ip);
        let rgw = Ipv4Addr::from(u32::from(r.pod_cidr.network()).wrapping_add(1));
        line(
            &mut v,
            CLASSIFIER,
            priority::classifier::KNOWN_NODE,
            c,
            &format!(
                "in_port={tunnel_ofport}, tun_src={}, actions={},set_field:{gw_mac}->eth_dst,goto_table:{}",
                r.ip,
                regs::FROM_TUNNEL.load(),
                CONNTRACK_ZONE.id
            ),
        );
        line(
            &mut v,
            ARP_RESPONDER,
            priority::arp_responder::ANSWER,
            c,
            &format!(
                "arp, arp_op=1, arp_tpa={rgw}, actions=move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],set_field:{vmac}->eth_src,load:0x2->NXM_OF_ARP_OP[],move:NXM_NX_ARP_SHA[]->NXM_NX_ARP_THA[],set_field:{vmac}->arp_sha,move:NXM_OF_ARP_SPA[]->NXM_OF_ARP_TPA[],set_field:{rgw}->arp_spa,output:IN_PORT"
            ),
        );
        line(
            &mut v,
            L3_FORWARDING,
            200,
            c,
            &format!(
                "ip, nw_dst={}, actions=set_field:{gw_mac}->eth_src,set_field:{vmac}->eth_dst,set_field:{}->tun_dst,goto_table:{}",
                r.pod_cidr,
                r.ip,
                L3_DEC_TTL.id
            ),
        );
    }
    v
}

/// Pods may not talk to any node's tunnel port: a pod's UDP datagram to
/// `node_ip:udp_port` for each node address in `node_ips` (this node's and
/// every remote node's) is dropped in ConntrackState, after reassembly
/// (so a fragmented datagram is judged whole) and before anything is
/// committed, whatever NetworkPolicy says and for connections set up
/// before the flow existed too. Without it, a pod could hand a forged
/// VXLAN packet to its own node's switch through the gateway, or to another
/// node's switch with the node's address as source once the node
/// masquerades it, and the receiving switch would take it for tunnel
/// traffic from a node. Cookie [`cookie::POD_TO_TUNNEL`]; counted as
/// `oxvs_agent_tunnel_drops_total{reason="pod_to_tunnel_port"}`.
pub fn tunnel_guard_flows(node_ips: &[Ipv4Addr], udp_port: u16) -> Vec<String> {
    let mut ips = node_ips.to_vec();
    ips.sort();
    ips.dedup();
    let mut v = Vec::with_capacity(ips.len());
    for ip in ips {
        line(
            &mut v,
            names::CONNTRACK_STATE,
            priority::conntrack_state::TUNNEL_GUARD,
            cookie::POD_TO_TUNNEL,
            &format!(
                "udp, {}, nw_dst={ip}, tp_dst={udp_port}, actions=drop",
                regs::FROM_POD.matching()
            ),
        );
    }
    v
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
    use oxvs_pipeline::names::TableNames;
    use oxvs_pipeline::parse::{parse_flow_file, parse_packet_spec, ParseContext};
    use oxvs_pipeline::tables::Pipeline;
    use oxvs_pipeline::trace::{trace, TraceOptions};
    use oxvs_pipeline::xlate::XlateEnv;

    fn node() -> NodeNet {
        NodeNet {
            pod_cidr: "10.244.0.0/24".parse().unwrap(),
            gateway_ip: "10.244.0.1".parse().unwrap(),
            gateway_mac: [0x0a, 0x58, 10, 244, 0, 1],
            gateway_ofport: 2,
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
            ip,
            mac: pod_mac(ip),
        }
    }

    #[test]
    fn every_flow_parses_and_names_its_object() {
        let text = desired_flows(&node(), &[pod(3, 3), pod(4, 4)]);
        let flows = parse_flow_file(&text, &ParseContext::default()).unwrap();
        assert_eq!(
            flows.len(),
            node_flows(&node()).len() + 2 * pod_flows(&node(), &pod(3, 3)).len()
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
        let text = desired_flows(&node(), &[pod(3, 3), pod(4, 4)]);
        let flows = parse_flow_file(&text, &ParseContext::default()).unwrap();
        let p = Pipeline::new();
        p.replace_all(&flows, 0).unwrap();
        let key = parse_packet_spec(spec, &ParseContext::default()).unwrap();
        let opts = TraceOptions {
            names: Some(TableNames::default()),
            ..TraceOptions::default()
        };
        let report = trace(&*p.snapshot(), &key, &XlateEnv::default(), &opts);
        format!("{report}")
    }

    fn trace_with_tunnel(spec: &str) -> String {
        let remotes = [RemoteNode {
            name: "n2".into(),
            pod_cidr: "10.244.1.0/24".parse().unwrap(),
            ip: "192.168.77.12".parse().unwrap(),
        }];
        let text = desired::compute(&Inputs {
            pods: vec![pod(3, 3)],
            tunnel: Some(Tunnel {
                ofport: 9,
                remotes: remotes.to_vec(),
                node_ip: Some("192.168.77.11".parse().unwrap()),
                guard: true,
            }),
            ..Inputs::for_node(node())
        })
        .text();
        let flows = parse_flow_file(&text, &ParseContext::default()).unwrap();
        let p = Pipeline::new();
        p.replace_all(&flows, 0).unwrap();
        let key = parse_packet_spec(spec, &ParseContext::default()).unwrap();
        let opts = TraceOptions {
            names: Some(TableNames::default()),
            ..TraceOptions::default()
        };
        format!(
            "{}",
            trace(&*p.snapshot(), &key, &XlateEnv::default(), &opts)
        )
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
        let (c, b) = ((client.ip, 40000), (backend.ip, 8080));
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
            tcp_frame((backend.mac, client.mac), b, (client.ip, 40001), 0x02, 7, 0),
            backend.ofport,
        );
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, client.ofport);
        let out = run(
            tcp_frame((client.mac, backend.mac), (client.ip, 40001), b, 0x12, 9, 8),
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
