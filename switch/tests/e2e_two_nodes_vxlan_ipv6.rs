//! End to end, two nodes through VXLAN over an IPv6 underlay: the twin of
//! `e2e_two_nodes_vxlan.rs` with no IPv4 on the underlay (`fd00:192::1/64`
//! <-> `fd00:192::2/64`, MTU 1500): two oxvs-switchd, each with a VXLAN
//! port whose `local_ip` is IPv6 (ofport 10) and one pod (ofport 1).
//! Flows: `examples/switch-node-a6.flows` / `switch-node-b6.flows` (pod <->
//! tunnel, VNI 100, `tun_ipv6_dst` = the other node; from the tunnel only
//! the other node's `tun_ipv6_src`).
//!
//! With pod MTU 1430 (underlay - 70): ping and a 1 MB TCP transfer both
//! ways, UDP both ways, inner IPv4 and inner IPv6. Then the MTU path: pod
//! MTU raised to 1500, a 1472-byte DF ping cannot be carried and must come
//! back as ICMP "fragmentation needed" naming the inner MTU (1430), and an
//! IPv6 one as "packet too big"; a 1400-byte DF ping passes; TCP with
//! 1500-byte segments recovers through path-MTU discovery.

mod common;

use common::*;

const IPA: &str = "10.20.0.1";
const IPB: &str = "10.20.0.2";
const IP6A: &str = "fd00:20::1";
const IP6B: &str = "fd00:20::2";

/// The MTU a "Frag needed" / "message too long" line of ping names, or the
/// `mtu N` of `ip route get` in the pod's route cache.
fn reported_mtu(ping_output: &str, route: &str) -> Option<u32> {
    for text in [ping_output, route] {
        for key in ["mtu = ", "mtu=", "mtu "] {
            if let Some(i) = text.find(key) {
                let n: String = text[i + key.len()..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                if let Ok(n) = n.parse() {
                    return Some(n);
                }
            }
        }
    }
    None
}

#[test]
fn e2e_two_nodes_vxlan_ipv6_underlay() {
    skip_unless_capable!();
    let na = Netns::new("n6a");
    let nb = Netns::new("n6b");
    let pa = Netns::new("p6a");
    let pb = Netns::new("p6b");
    underlay6(&na, &nb, 1500);
    // IPv4 pods' "fragmentation needed" answers need an IPv4 source: the
    // tunnel's local address is IPv6 here.
    let swa = Switchd::start_with(&na, &["--icmp-src-ip", "10.20.0.254"]);
    let swb = Switchd::start_with(&nb, &["--icmp-src-ip", "10.20.0.253"]);
    swa.add_vxlan_port("tun0", 10, "fd00:192::1");
    swb.add_vxlan_port("tun0", 10, "fd00:192::2");
    let show = swa.ctl_ok(&["show"]);
    assert!(
        show.contains("10(tun0): type=vxlan, mode=udp-socket, local=[fd00:192::1]:4789, state=up"),
        "show names the tunnel's local address:\n{show}"
    );
    add_pod(
        &swa,
        &na,
        &pa,
        "pa",
        1,
        "10.20.0.1/24",
        "02:00:0a:14:00:01",
        1430,
    );
    add_pod(
        &swb,
        &nb,
        &pb,
        "pb",
        1,
        "10.20.0.2/24",
        "02:00:0a:14:00:02",
        1430,
    );
    for (pod, ip) in [(&pa, IP6A), (&pb, IP6B)] {
        pod.must(&[
            "ip",
            "addr",
            "add",
            &format!("{ip}/64"),
            "dev",
            "eth0",
            "nodad",
        ]);
    }
    swa.add_flows(&example("switch-node-a6.flows"));
    swb.add_flows(&example("switch-node-b6.flows"));

    for (from, to, what) in [
        (&pa, IPB, "pod A -> pod B"),
        (&pb, IPA, "pod B -> pod A"),
        (&pa, IP6B, "pod A -> pod B, IPv6"),
        (&pb, IP6A, "pod B -> pod A, IPv6"),
    ] {
        let p = ping_until_up(from, to, 6);
        assert!(
            p.ok,
            "{what} through VXLAN over IPv6 never answered:\n{}",
            p.output
        );
        let p = ping(from, to, 3, "0.1", &[]);
        assert_eq!(p.received, 3, "{what}:\n{}", p.output);
    }
    tcp_transfer(&pa, &pb, IPB, 5201, 1 << 20);
    tcp_transfer(&pb, &pa, IPA, 5202, 1 << 20);
    tcp_transfer(&pa, &pb, IP6B, 5211, 1 << 20);
    tcp_transfer(&pb, &pa, IP6A, 5212, 1 << 20);
    udp_exchange(&pa, &pb, IPB, 6201);
    udp_exchange(&pb, &pa, IP6A, 6212);
    let (rx, tx) = port_packet_totals(&swa);
    assert!(
        rx > 20 && tx > 20,
        "node A dump-ports totals: rx {rx} tx {tx}"
    );

    // MTU: pods at 1500 on a 1500 IPv6 underlay (normally underlay - 70).
    pa.must(&["ip", "link", "set", "eth0", "mtu", "1500"]);
    pb.must(&["ip", "link", "set", "eth0", "mtu", "1500"]);
    let big = ping(&pa, IPB, 3, "0.3", &["-M", "do", "-s", "1472"]);
    assert_eq!(
        big.received, 0,
        "a 1500-byte inner packet crossed:\n{}",
        big.output
    );
    let route = pa.must(&["ip", "route", "get", IPB]);
    let mtu = reported_mtu(&big.output, &route).unwrap_or_else(|| {
        panic!(
            "no ICMP fragmentation-needed reached pod A (silent drop?)\nping:\n{}\nroute: {route}\nswitchd:\n{}",
            big.output,
            swa.log_tail(20)
        )
    });
    assert_eq!(
        mtu, 1430,
        "inner MTU over IPv6 = 1500 - 70\n{}\n{route}",
        big.output
    );
    let ok = ping(&pa, IPB, 3, "0.2", &["-M", "do", "-s", "1400"]);
    assert_eq!(ok.received, 3, "1400-byte DF ping:\n{}", ok.output);
    // IPv6: packet too big (1452 + 48 = 1500).
    let big6 = ping(&pb, IP6A, 3, "0.3", &["-M", "do", "-s", "1452"]);
    assert_eq!(big6.received, 0, "{}", big6.output);
    let route6 = pb.must(&["ip", "-6", "route", "get", IP6A]);
    let mtu6 = reported_mtu(&big6.output, &route6).unwrap_or_else(|| {
        panic!(
            "no packet too big reached pod B:\n{}\n{route6}",
            big6.output
        )
    });
    assert_eq!(mtu6, 1430, "{}\n{route6}", big6.output);
    // And big TCP still flows after PMTU discovery.
    tcp_transfer(&pa, &pb, IPB, 5203, 256 << 10);
    tcp_transfer(&pb, &pa, IP6A, 5213, 256 << 10);
}
