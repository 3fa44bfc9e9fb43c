//! The IPv6 flows of a dual-stack node: the IPv4 pipeline's twins (`ipv6`
//! where IPv4 flows say `ip`, `ipv6_src`/`ipv6_dst` for `nw_src`/`nw_dst`)
//! and Neighbour Discovery, which takes ARP's place.
//!
//! # Neighbour Discovery
//!
//! ND is ICMPv6, so unlike ARP it is IP: left alone it would pass
//! SpoofGuard as a pod's IP traffic (any ND message from its own address
//! to anyone), go through conntrack and meet NetworkPolicy. Instead:
//!
//! - **SpoofGuard** sends ND to the responder table ([`ARP_RESPONDER`]),
//!   only what a pod may say: a solicitation from its own address or its
//!   link-local address (EUI-64 of its MAC: the agent pins the pod's
//!   address generation to it), an advertisement whose target is one of
//!   those addresses and whose target link-layer option, if any, is its
//!   own MAC. Every other router solicitation, router advertisement,
//!   neighbour solicitation or advertisement and redirect (ICMPv6 133-137)
//!   from a pod is dropped: a pod is never a router, and may not claim
//!   another pod's address. Duplicate address detection (a solicitation
//!   from `::`) is dropped too: pods' global addresses are added without
//!   it, and nothing answers it for a link-local address.
//! - **The responder** answers a solicitation for the gateway's address in
//!   place, as ARPResponder answers ARP: a Neighbour Advertisement (router,
//!   solicited, override) with the gateway's MAC, out of the port it came
//!   in by. It answers a solicitation for another node's gateway with the
//!   virtual MAC (the host routes remote IPv6 pod CIDRs on-link through
//!   them), and sends one for a local pod to that pod's port.
//!   Advertisements go on by destination MAC.
//! - **IngressRule** lets ND through before any rule (it is never
//!   tracked, like ARP, which the IP-only policy flows never see).

use std::net::Ipv6Addr;

use oxvs_pipeline::names::*;
use oxvs_pipeline::regs;

use super::{
    mac_str, skip_established, FlowLine, NodeNet, NodeNet6, PodPort, RemoteNode, VIRTUAL_MAC,
};
use crate::cookie;
use crate::priority;

/// ICMPv6 types (RFC 4861): router solicitation and advertisement,
/// neighbour solicitation and advertisement, redirect.
const ROUTER_SOLICIT: u8 = 133;
const NEIGHBOUR_SOLICIT: u8 = 135;
const NEIGHBOUR_ADVERT: u8 = 136;
const REDIRECT: u8 = 137;

/// A Neighbour Advertisement's flags word (RFC 4861 4.4): router,
/// solicited, override. The gateway is a router.
const NA_FLAGS_ROUTER: u32 = 0xe000_0000;
/// The Target Link-Layer Address option's type.
const OPTION_TARGET_LL: u8 = 2;

/// The link-local address Linux derives from `mac` (modified EUI-64,
/// RFC 4291 appendix A): `fe80::` + the MAC with `ff:fe` in its middle and
/// the universal/local bit flipped.
pub fn link_local(mac: &[u8; 6]) -> Ipv6Addr {
    let m = mac;
    Ipv6Addr::from([
        0xfe,
        0x80,
        0,
        0,
        0,
        0,
        0,
        0,
        m[0] ^ 0x02,
        m[1],
        m[2],
        0xff,
        0xfe,
        m[3],
        m[4],
        m[5],
    ])
}

/// The gateway address of an IPv6 pod CIDR: its first address after the
/// network's.
pub fn gateway_of(cidr: ipnet::Ipv6Net) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(cidr.network()).wrapping_add(1))
}

/// The IPv6 flows every dual-stack node has, table by table.
pub(super) fn node_flows(node: &NodeNet, v6: &NodeNet6, proxy: bool) -> Vec<FlowLine> {
    let gw = node.gateway_ofport;
    let mut v = Vec::new();
    // SpoofGuard: the gateway's ND to the responder, its IPv6 on.
    for ty in [NEIGHBOUR_SOLICIT, NEIGHBOUR_ADVERT] {
        v.push(
            FlowLine::new(
                SPOOF_GUARD,
                priority::spoof_guard::ND_ALLOW,
                cookie::GATEWAY,
            )
            .matching("icmp6")
            .matching(format!("in_port={gw}"))
            .matching(format!("icmp_type={ty}"))
            .goto(ARP_RESPONDER),
        );
    }
    v.push(
        FlowLine::new(SPOOF_GUARD, priority::spoof_guard::ALLOW, cookie::GATEWAY)
            .matching("ipv6")
            .matching(format!("in_port={gw}"))
            .goto(CONNTRACK_ZONE),
    );
    // SpoofGuard: no router or neighbour messages from pods but those
    // their own flows allow.
    for ty in ROUTER_SOLICIT..=REDIRECT {
        v.push(
            FlowLine::new(
                SPOOF_GUARD,
                priority::spoof_guard::ND_DENY,
                cookie::DEFAULTS,
            )
            .matching("icmp6")
            .mark(regs::FROM_POD)
            .matching(format!("icmp_type={ty}"))
            .drop_packet(),
        );
    }
    // The responder: the gateway's address answered in place.
    v.extend(nd_answer(cookie::GATEWAY, v6.gateway_ip, &node.gateway_mac));
    // ConntrackZone, ConntrackState, L3Forwarding, L3DecTTL: the IPv4
    // flows' twins.
    v.push(super::track(proxy, "ipv6"));
    v.push(super::drop_invalid("ipv6"));
    v.extend(skip_established(
        CONNTRACK_STATE,
        priority::conntrack_state::ESTABLISHED,
        L3_FORWARDING,
        "ipv6",
    ));
    v.push(super::reply_to_gateway(node, "ipv6"));
    v.extend(super::dec_ttl(proxy, "ipv6"));
    // IngressRule: established and related skip the rules; so does ND.
    v.extend(skip_established(
        INGRESS_RULE,
        priority::policy_rule::ESTABLISHED,
        CONNTRACK_COMMIT,
        "ipv6",
    ));
    for ty in [NEIGHBOUR_SOLICIT, NEIGHBOUR_ADVERT] {
        v.push(
            FlowLine::new(
                INGRESS_RULE,
                priority::policy_rule::ESTABLISHED,
                cookie::DEFAULTS,
            )
            .matching("icmp6")
            .matching(format!("icmp_type={ty}"))
            .goto(CONNTRACK_COMMIT),
        );
    }
    v.extend(super::commit("ipv6"));
    v
}

/// The IPv6 flows of one pod with address `ip6`.
pub(super) fn pod_flows(node: &NodeNet, pod: &PodPort, ip6: Ipv6Addr) -> Vec<FlowLine> {
    let c = cookie::pod(pod.ofport);
    let mac = mac_str(&pod.mac);
    let ll = link_local(&pod.mac);
    let guard = |p: u16| {
        FlowLine::new(SPOOF_GUARD, p, c)
            .matching(format!("in_port={}", pod.ofport))
            .matching(format!("dl_src={mac}"))
    };
    let mut v = Vec::new();
    for own in [ip6, ll] {
        v.push(
            guard(priority::spoof_guard::ND_ALLOW)
                .matching("icmp6")
                .matching(format!("ipv6_src={own}"))
                .matching(format!("icmp_type={NEIGHBOUR_SOLICIT}"))
                .matching("icmp_code=0")
                .goto(ARP_RESPONDER),
        );
        // An advertisement of its own address: with its own MAC as target
        // link-layer address, or none.
        for tll in [mac.as_str(), "00:00:00:00:00:00"] {
            v.push(
                guard(priority::spoof_guard::ND_ALLOW)
                    .matching("icmp6")
                    .matching(format!("icmp_type={NEIGHBOUR_ADVERT}"))
                    .matching("icmp_code=0")
                    .matching(format!("nd_target={own}"))
                    .matching(format!("nd_tll={tll}"))
                    .goto(ARP_RESPONDER),
            );
        }
        v.push(nd_to_port(c, own, pod.ofport));
    }
    v.push(
        guard(priority::spoof_guard::ALLOW)
            .matching("ipv6")
            .matching(format!("ipv6_src={ip6}"))
            .goto(CONNTRACK_ZONE),
    );
    let gw_mac = mac_str(&node.gateway_mac);
    v.push(
        FlowLine::new(L3_FORWARDING, priority::l3_forwarding::ROUTE, c)
            .matching("ipv6")
            .matching(format!("dl_dst={gw_mac}"))
            .matching(format!("ipv6_dst={ip6}"))
            .action(format!("set_field:{gw_mac}->eth_src"))
            .action(format!("set_field:{mac}->eth_dst"))
            .goto(L3_DEC_TTL),
    );
    v
}

/// The IPv6 flows of a remote node with IPv6 pod CIDR `cidr`: its
/// gateway's solicitations answered with the virtual MAC, its pods routed
/// into the tunnel.
pub(super) fn remote_flows(node: &NodeNet, r: &RemoteNode, cidr: ipnet::Ipv6Net) -> Vec<FlowLine> {
    let c = cookie::remote_node(r.ip);
    let mut v = nd_answer(c, gateway_of(cidr), &VIRTUAL_MAC);
    v.push(
        FlowLine::new(L3_FORWARDING, priority::l3_forwarding::ROUTE, c)
            .matching("ipv6")
            .matching(format!("ipv6_dst={cidr}"))
            .action(format!("set_field:{}->eth_src", mac_str(&node.gateway_mac)))
            .action(format!("set_field:{}->eth_dst", mac_str(&VIRTUAL_MAC)))
            .action(super::set_tun_dst(r.ip))
            .goto(L3_DEC_TTL),
    );
    v
}

/// The responder: a solicitation for `ip` is answered in place with `mac`
/// (a Neighbour Advertisement with the router, solicited and override
/// flags and `mac` as target link-layer address, from `ip` to the
/// solicitation's source, out of the port it came in by). Two flows: OVS
/// lets a flow write `nd_tll` only where its match says the packet is an
/// advertisement, so the first makes the solicitation one and resubmits
/// it, marked, to the second.
pub(crate) fn nd_answer(cookie: u64, ip: Ipv6Addr, mac: &[u8; 6]) -> Vec<FlowLine> {
    let mac = mac_str(mac);
    let solicit = FlowLine::new(ARP_RESPONDER, priority::arp_responder::ANSWER, cookie)
        .matching("icmp6")
        .matching(format!("icmp_type={NEIGHBOUR_SOLICIT}"))
        .matching("icmp_code=0")
        .matching(format!("nd_target={ip}"))
        .action("move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[]")
        .action(format!("set_field:{mac}->eth_src"))
        .action("move:NXM_NX_IPV6_SRC[]->NXM_NX_IPV6_DST[]")
        .action(format!("set_field:{ip}->ipv6_src"))
        .action(format!("set_field:{NEIGHBOUR_ADVERT}->icmpv6_type"))
        .action(format!("set_field:{NA_FLAGS_ROUTER:#x}->nd_reserved"))
        .action(format!("set_field:{OPTION_TARGET_LL}->nd_options_type"))
        .action(regs::ND_REPLY_MARK.load())
        .action(format!("resubmit(,{})", ARP_RESPONDER.id));
    let advert = FlowLine::new(ARP_RESPONDER, priority::arp_responder::ND_REPLY, cookie)
        .matching("icmp6")
        .matching(format!("icmp_type={NEIGHBOUR_ADVERT}"))
        .matching("icmp_code=0")
        .matching(format!("nd_target={ip}"))
        .mark(regs::ND_REPLY_MARK)
        .action(format!("set_field:{mac}->nd_tll"))
        .action("output:IN_PORT");
    vec![solicit, advert]
}

/// The responder: a solicitation for `ip` goes to the port that holds it.
fn nd_to_port(cookie: u64, ip: Ipv6Addr, ofport: u32) -> FlowLine {
    FlowLine::new(ARP_RESPONDER, priority::arp_responder::TO_PORT, cookie)
        .matching("icmp6")
        .matching(format!("icmp_type={NEIGHBOUR_SOLICIT}"))
        .matching("icmp_code=0")
        .matching(format!("nd_target={ip}"))
        .action(format!("output:{ofport}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_local_is_the_modified_eui64_of_the_mac() {
        assert_eq!(
            link_local(&[0x0a, 0x58, 10, 244, 0, 5]),
            "fe80::858:aff:fef4:5".parse::<Ipv6Addr>().unwrap()
        );
    }
}
