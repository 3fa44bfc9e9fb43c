//! End to end, wire interoperability over an IPv6 underlay: the twin of
//! `e2e_kernel_interop.rs` with no IPv4 on the underlay. Node A runs
//! oxvs-switchd with a VXLAN port whose `local_ip` is IPv6
//! (`fd00:192::1`, VNI 100, `examples/switch-node-a6.flows`: the pod's
//! traffic goes out with `set_field:fd00:192::2->tun_ipv6_dst`, and only
//! what node B sent, `tun_ipv6_src=fd00:192::2`, comes in). Node B is
//! plain Linux: a kernel `vxlan` device with an IPv6 `local`/`remote`
//! and its defaults (`udp6zerocsumtx` and `udp6zerocsumrx` off: it sends
//! UDP checksums and drops datagrams without one, so every packet oxvs
//! sends must carry a correct checksum), and the pod's veth in a bridge.
//!
//! Pod MTUs are 1430 (underlay 1500 - 70), as the kernel sets on `vx0`.
//! Ping (full-size inner packets too), TCP (1 MB, SHA-256 checked) and
//! UDP both ways, with inner IPv4 and inner IPv6 (Neighbour Discovery
//! across the tunnel). Then oxvs's pod goes to MTU 65535: its 64 KiB TCP
//! segments are cut into the tunnel (userspace TSO, pieces for the inner
//! MTU of 1430) and the kernel pod's segments come back merged
//! (userspace GRO), inner IPv4 and IPv6, 8 MB each way, SHA-256 checked.

mod common;
mod metrics_support;
mod tunnel_offload;

use common::*;
use tunnel_offload::{cut_into_the_tunnel, merged_from_the_tunnel, METRICS};

const IPA: &str = "10.20.0.1";
const IPB: &str = "10.20.0.2";
const IP6A: &str = "fd00:20::1";
const IP6B: &str = "fd00:20::2";

#[test]
fn e2e_kernel_interop_ipv6_underlay() {
    skip_unless_capable!();
    let na = Netns::new("n6a");
    let nb = Netns::new("n6b");
    let pa = Netns::new("p6a");
    let pb = Netns::new("p6b");
    underlay6(&na, &nb, 1500);

    // Node B: kernel only, IPv6 underlay, the kernel's checksum defaults.
    make_pod(&nb, &pb, "pb", "10.20.0.2/24", "02:00:0a:14:00:02", 1430);
    kernel_vxlan_node(&nb, "pb", 100, "fd00:192::2", "fd00:192::1");
    let details = nb.must(&["ip", "-d", "link", "show", "vx0"]);
    eprintln!("kernel vxlan: {}", details.trim());
    assert!(
        details.contains("mtu 1430"),
        "the kernel's vxlan over IPv6 has MTU 1430: {details}"
    );
    // iproute2 prints the defaults as `noudp6zerocsumtx noudp6zerocsumrx`.
    assert!(
        details.contains("noudp6zerocsumtx") && details.contains("noudp6zerocsumrx"),
        "the kernel vxlan must keep its checksum defaults: {details}"
    );

    // Node A: oxvs, its tunnel on the IPv6 underlay.
    let swa = Switchd::start_with(&na, &["--metrics-addr", METRICS]);
    swa.add_vxlan_port("tun0", 10, "fd00:192::1");
    make_pod(&na, &pa, "pa", "10.20.0.1/24", "02:00:0a:14:00:01", 1430);
    swa.add_port("pa", 1);
    swa.add_flows(&example("switch-node-a6.flows"));

    // Inner IPv4.
    let p = ping_until_up(&pa, IPB, 6);
    assert!(
        p.ok,
        "oxvs pod -> kernel pod over an IPv6 underlay never answered:\n{}\nswitchd:\n{}",
        p.output,
        swa.log_tail(20)
    );
    let p = ping(&pa, IPB, 5, "0.1", &[]);
    assert_eq!(p.received, 5, "oxvs pod -> kernel pod:\n{}", p.output);
    nb.exec(&["ip", "neigh", "flush", "dev", "vx0"]);
    pb.exec(&["ip", "neigh", "flush", "dev", "eth0"]);
    let p = ping_until_up(&pb, IPA, 6);
    assert!(p.ok, "kernel pod -> oxvs pod never answered:\n{}", p.output);
    let p = ping(&pb, IPA, 5, "0.1", &[]);
    assert_eq!(p.received, 5, "kernel pod -> oxvs pod:\n{}", p.output);
    // Full-size inner packets (1430 = 1402 + 28) both ways.
    for (from, to) in [(&pa, IPB), (&pb, IPA)] {
        let p = ping(from, to, 2, "0.2", &["-M", "do", "-s", "1402"]);
        assert_eq!(
            p.received, 2,
            "1430-byte inner packets to {to}:\n{}",
            p.output
        );
    }
    tcp_transfer(&pa, &pb, IPB, 5101, 1 << 20);
    tcp_transfer(&pb, &pa, IPA, 5102, 1 << 20);
    udp_exchange(&pa, &pb, IPB, 6101);
    udp_exchange(&pb, &pa, IPA, 6102);

    // Inner IPv6.
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
    let p = ping_until_up(&pa, IP6B, 6);
    assert!(
        p.ok,
        "oxvs pod -> kernel pod, IPv6 in IPv6, never answered:\n{}",
        p.output
    );
    pa.exec(&["ip", "-6", "neigh", "flush", "dev", "eth0"]);
    pb.exec(&["ip", "-6", "neigh", "flush", "dev", "eth0"]);
    let p = ping_until_up(&pb, IP6A, 6);
    assert!(
        p.ok,
        "kernel pod -> oxvs pod, IPv6 in IPv6, never answered:\n{}",
        p.output
    );
    for (from, to) in [(&pa, IP6B), (&pb, IP6A)] {
        // 1430 = 1382 + 8 + 40.
        let p = ping(from, to, 2, "0.2", &["-M", "do", "-s", "1382"]);
        assert_eq!(
            p.received, 2,
            "1430-byte inner IPv6 packets to {to}:\n{}",
            p.output
        );
    }
    tcp_transfer(&pa, &pb, IP6B, 5111, 1 << 20);
    tcp_transfer(&pb, &pa, IP6A, 5112, 1 << 20);
    udp_exchange(&pa, &pb, IP6B, 6111);
    udp_exchange(&pb, &pa, IP6A, 6112);

    // Large segments: A's pod at MTU 65535, B's pod advertising a large
    // MSS on both families' routes (its own path keeps 1430).
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
    cut_into_the_tunnel(&swa, &na, &pa, &pb, IPB, 5103);
    // The pod port's MTU (now 65535) is seen within 5 s.
    std::thread::sleep(std::time::Duration::from_secs(6));
    merged_from_the_tunnel(&swa, &na, &pa, &pb, IPA, 5104);
    cut_into_the_tunnel(&swa, &na, &pa, &pb, IP6B, 5113);
    merged_from_the_tunnel(&swa, &na, &pa, &pb, IP6A, 5114);

    let tun = swa.port_json("tun0");
    let stats = tun.get("stats").unwrap_or(&tun);
    for k in ["rx_errors", "tx_errors"] {
        assert_eq!(
            stats.get(k).and_then(|x| x.as_u64()),
            Some(0),
            "tunnel port {k}: {tun}"
        );
    }
}
