//! End to end, two nodes through VXLAN: two node namespaces joined by an
//! underlay veth (192.0.2.1/24 <-> 192.0.2.2/24, MTU 1500), each running its
//! own oxvs-switchd with a VXLAN port (ofport 10) and one pod (ofport 1).
//! Flows: `examples/switch-node-a.flows` / `switch-node-b.flows` (pod <->
//! tunnel, VNI 100, `tun_dst` = the other node).
//!
//! With pod MTU 1450 (underlay - 50): ping and a 1 MB TCP transfer (data
//! compared by SHA-256) both ways, UDP both ways. Then the MTU path: pod
//! MTU raised to 1500, a 1472-byte DF ping cannot be carried and must come
//! back as ICMP "fragmentation needed" naming the inner MTU (1450), never a
//! silent drop; a 1400-byte DF ping passes; a TCP transfer with 1500-byte
//! segments recovers through path-MTU discovery.

mod common;

use common::*;

const IPA: &str = "10.20.0.1";
const IPB: &str = "10.20.0.2";

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
fn e2e_two_nodes_vxlan() {
    skip_unless_capable!();
    let na = Netns::new("na");
    let nb = Netns::new("nb");
    let pa = Netns::new("pa");
    let pb = Netns::new("pb");
    underlay(&na, &nb, 1500);
    let swa = Switchd::start(&na);
    let swb = Switchd::start(&nb);
    swa.add_vxlan_port("tun0", 10, "192.0.2.1");
    swb.add_vxlan_port("tun0", 10, "192.0.2.2");
    add_pod(
        &swa,
        &na,
        &pa,
        "pa",
        1,
        "10.20.0.1/24",
        "02:00:0a:14:00:01",
        1450,
    );
    add_pod(
        &swb,
        &nb,
        &pb,
        "pb",
        1,
        "10.20.0.2/24",
        "02:00:0a:14:00:02",
        1450,
    );
    swa.add_flows(&example("switch-node-a.flows"));
    swb.add_flows(&example("switch-node-b.flows"));

    let p = ping_until_up(&pa, IPB, 6);
    assert!(
        p.ok,
        "pod A -> pod B through VXLAN never answered:\n{}",
        p.output
    );
    let p = ping(&pa, IPB, 5, "0.1", &[]);
    assert_eq!(p.received, 5, "pod A -> pod B:\n{}", p.output);
    let p = ping(&pb, IPA, 5, "0.1", &[]);
    assert_eq!(p.received, 5, "pod B -> pod A:\n{}", p.output);

    tcp_transfer(&pa, &pb, IPB, 5001, 1 << 20);
    tcp_transfer(&pb, &pa, IPA, 5002, 1 << 20);
    udp_exchange(&pa, &pb, IPB, 6001);
    udp_exchange(&pb, &pa, IPA, 6002);

    // The tunnel ports counted traffic.
    let (rx, tx) = port_packet_totals(&swa);
    assert!(
        rx > 20 && tx > 20,
        "node A dump-ports totals: rx {rx} tx {tx}"
    );

    // MTU: pods at 1500 on a 1500 underlay (normally pod = underlay - 50):
    // 1472 + 28 = 1500-byte inner packet + 50 bytes of VXLAN > 1500.
    pa.must(&["ip", "link", "set", "eth0", "mtu", "1500"]);
    pb.must(&["ip", "link", "set", "eth0", "mtu", "1500"]);
    let big = ping(&pa, IPB, 3, "0.3", &["-M", "do", "-s", "1472"]);
    assert_eq!(
        big.received, 0,
        "a 1500-byte inner packet crossed a 1500-byte underlay:\n{}",
        big.output
    );
    let route = pa.must(&["ip", "route", "get", IPB]);
    let mtu = reported_mtu(&big.output, &route).unwrap_or_else(|| {
        panic!(
            "no ICMP fragmentation-needed reached pod A (silent drop?)\nping:\n{}\nip route get: {route}",
            big.output
        )
    });
    assert!(
        (1428..=1450).contains(&mtu),
        "inner MTU reported {mtu}, expected 1450 (underlay 1500 - 50)\nping:\n{}\nroute: {route}",
        big.output
    );
    eprintln!(
        "MTU: pod A told inner MTU {mtu}; ping said: {:?}; route: {}",
        big.output.lines().find(|l| l.contains("mtu")),
        route.trim()
    );
    let ok = ping(&pa, IPB, 3, "0.2", &["-M", "do", "-s", "1400"]);
    assert_eq!(
        ok.received, 3,
        "1400-byte DF ping within the inner MTU:\n{}",
        ok.output
    );
    // The other direction too.
    let big = ping(&pb, IPA, 2, "0.3", &["-M", "do", "-s", "1472"]);
    let route = pb.must(&["ip", "route", "get", IPA]);
    assert_eq!(big.received, 0, "{}", big.output);
    assert!(
        reported_mtu(&big.output, &route).is_some(),
        "no fragmentation-needed reached pod B:\n{}\n{route}",
        big.output
    );
    // And big TCP still flows after PMTU discovery (segments shrink).
    tcp_transfer(&pa, &pb, IPB, 5003, 256 << 10);
}
