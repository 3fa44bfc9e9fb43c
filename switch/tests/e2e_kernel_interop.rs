//! End to end, wire interoperability: node A runs oxvs-switchd with a VXLAN
//! port (VNI 100, `examples/switch-node-a.flows`); node B is plain Linux: a
//! kernel `vxlan` device (VNI 100, UDP 4789) and the pod's veth in a bridge.
//! Ping, TCP (1 MB, SHA-256 checked) and UDP in both directions, over
//! IPv4 and over IPv6 (inner IPv6 in the IPv4 underlay; Neighbour
//! Discovery across the tunnel).
//! Pod MTUs are 1450 (underlay 1500 - 50), as the kernel vxlan device has.
//! Then oxvs's pod goes to MTU 65535 and sends TCP in 64 KiB segments
//! that oxvs cuts into the tunnel (userspace TSO): the kernel's vxlan and
//! the kernel pod's TCP take every piece (8 MB, SHA-256 checked); the
//! kernel pod's segments come back merged (userspace GRO) into large
//! frames for oxvs's pod. The same 8 MB both ways over IPv6: cut and
//! merged alike.

mod common;
mod metrics_support;
mod tunnel_offload;

use common::*;
use tunnel_offload::{cut_into_the_tunnel, merged_from_the_tunnel};

const IPA: &str = "10.20.0.1";
const IPB: &str = "10.20.0.2";
const IP6A: &str = "fd00:20::1";
const IP6B: &str = "fd00:20::2";
/// /metrics inside node A's namespace (counts the cut and the merges).
const METRICS: &str = tunnel_offload::METRICS;

#[test]
fn e2e_kernel_interop() {
    skip_unless_capable!();
    let na = Netns::new("na");
    let nb = Netns::new("nb");
    let pa = Netns::new("pa");
    let pb = Netns::new("pb");
    underlay(&na, &nb, 1500);

    // Node B: kernel only.
    make_pod(&nb, &pb, "pb", "10.20.0.2/24", "02:00:0a:14:00:02", 1450);
    kernel_vxlan_node(&nb, "pb", 100, "192.0.2.2", "192.0.2.1");

    // Node A: oxvs.
    let swa = Switchd::start_with(&na, &["--metrics-addr", METRICS]);
    swa.add_vxlan_port("tun0", 10, "192.0.2.1");
    make_pod(&na, &pa, "pa", "10.20.0.1/24", "02:00:0a:14:00:01", 1450);
    swa.add_port("pa", 1);
    swa.add_flows(&example("switch-node-a.flows"));

    let p = ping_until_up(&pa, IPB, 6);
    assert!(p.ok, "oxvs pod -> kernel pod never answered:\n{}", p.output);
    let p = ping(&pa, IPB, 5, "0.1", &[]);
    assert_eq!(p.received, 5, "oxvs pod -> kernel pod:\n{}", p.output);
    // Flush B's neighbour so that B starts with an ARP through its vxlan.
    nb.exec(&["ip", "neigh", "flush", "dev", "vx0"]);
    pb.exec(&["ip", "neigh", "flush", "dev", "eth0"]);
    let p = ping_until_up(&pb, IPA, 6);
    assert!(p.ok, "kernel pod -> oxvs pod never answered:\n{}", p.output);
    let p = ping(&pb, IPA, 5, "0.1", &[]);
    assert_eq!(p.received, 5, "kernel pod -> oxvs pod:\n{}", p.output);

    tcp_transfer(&pa, &pb, IPB, 5001, 1 << 20);
    tcp_transfer(&pb, &pa, IPA, 5002, 1 << 20);
    udp_exchange(&pa, &pb, IPB, 6001);
    udp_exchange(&pb, &pa, IPA, 6002);

    // Full-size inner packets (1450) cross both ways.
    let p = ping(&pa, IPB, 2, "0.2", &["-M", "do", "-s", "1422"]);
    assert_eq!(
        p.received, 2,
        "1450-byte inner packets oxvs <-> kernel:\n{}",
        p.output
    );
    let p = ping(&pb, IPA, 2, "0.2", &["-M", "do", "-s", "1422"]);
    assert_eq!(
        p.received, 2,
        "1450-byte inner packets kernel <-> oxvs:\n{}",
        p.output
    );

    // IPv6 inside the IPv4 underlay: Neighbour Discovery through the
    // tunnel both ways, then ping (full-size inner packets too), TCP and
    // UDP.
    pa.must(&[
        "ip",
        "addr",
        "add",
        &format!("{IP6A}/64"),
        "dev",
        "eth0",
        "nodad",
    ]);
    pb.must(&[
        "ip",
        "addr",
        "add",
        &format!("{IP6B}/64"),
        "dev",
        "eth0",
        "nodad",
    ]);
    let p = ping_until_up(&pa, IP6B, 6);
    assert!(
        p.ok,
        "oxvs pod -> kernel pod over IPv6 never answered:\n{}",
        p.output
    );
    pa.exec(&["ip", "-6", "neigh", "flush", "dev", "eth0"]);
    pb.exec(&["ip", "-6", "neigh", "flush", "dev", "eth0"]);
    let p = ping_until_up(&pb, IP6A, 6);
    assert!(
        p.ok,
        "kernel pod -> oxvs pod over IPv6 never answered:\n{}",
        p.output
    );
    for (from, to) in [(&pa, IP6B), (&pb, IP6A)] {
        let p = ping(from, to, 2, "0.2", &["-M", "do", "-s", "1402"]);
        assert_eq!(
            p.received, 2,
            "1450-byte inner IPv6 packets to {to}:\n{}",
            p.output
        );
    }
    tcp_transfer(&pa, &pb, IP6B, 5011, 1 << 20);
    tcp_transfer(&pb, &pa, IP6A, 5012, 1 << 20);
    udp_exchange(&pa, &pb, IP6B, 6011);
    udp_exchange(&pb, &pa, IP6A, 6012);

    // Large segments into the kernel's tunnel: A's pod at MTU 65535; B's
    // pod advertises a large MSS while its own path keeps 1450 (its
    // bridge cannot carry more into the kernel's vxlan).
    na.must(&["ip", "link", "set", "pa", "mtu", "65535"]);
    pa.must(&["ip", "link", "set", "eth0", "mtu", "65535"]);
    pb.must(&[
        "ip",
        "route",
        "replace",
        "10.20.0.0/24",
        "dev",
        "eth0",
        "proto",
        "kernel",
        "scope",
        "link",
        "src",
        IPB,
        "advmss",
        "65000",
    ]);
    cut_into_the_tunnel(&swa, &na, &pa, &pb, IPB, 5003);

    // And back: the kernel's 1410-byte segments are merged by oxvs (its
    // pod port's MTU now 65535, seen within 5 s) into large frames for A.
    std::thread::sleep(std::time::Duration::from_secs(6));
    merged_from_the_tunnel(&swa, &na, &pa, &pb, IPA, 5004);

    // The same over IPv6 (TCP right after the fixed header): B's pod
    // advertises the large MSS on its IPv6 route too; its 1378-byte
    // segments come back merged.
    pb.must(&[
        "ip",
        "-6",
        "route",
        "replace",
        "fd00:20::/64",
        "dev",
        "eth0",
        "proto",
        "kernel",
        "metric",
        "256",
        "advmss",
        "65000",
    ]);
    cut_into_the_tunnel(&swa, &na, &pa, &pb, IP6B, 5013);
    merged_from_the_tunnel(&swa, &na, &pa, &pb, IP6A, 5014);
}
