//! End to end, large frames: pods on one node with an MTU far above a
//! page (9000 and 65535) exchange frames whole through the switch.
//!
//! The switch's XDP program is frags-aware (`xdp.frags`), which is what
//! lets a veth with a program attached take an MTU above ~3.5k at all, and
//! its AF_XDP sockets are bound with `XDP_USE_SG`: a frame larger than a
//! UMEM frame arrives in several descriptors, the switch gathers it, runs
//! it through the pipeline as one packet, and sends it in several
//! descriptors again.
//!
//! 1. Two pods at MTU 65535 (ARP flooded, IPv4 by destination MAC): pings of
//!    8972 and 65000 bytes with DF set (one unfragmented frame each way,
//!    so nothing but whole-frame forwarding can answer them), 8 MB of TCP
//!    each way (data compared by SHA-256; checksums completed by the
//!    switch over the gathered frame), a 60000-byte UDP datagram each way
//!    without fragmentation, and the switch's port counters showing the
//!    pods' frames went through whole (bytes per packet far above a page).
//! 2. A third pod at MTU 9000 talks TCP with a 65535 one (MSS
//!    negotiation picks the smaller).
//! 3. A pod at MTU 1500 still gets ICMP, TCP and UDP through.
//!
//! Runs as root only (skips otherwise); everything lives in fresh
//! namespaces removed on drop.

mod common;

use common::*;

const MAC1: &str = "02:00:0a:0a:00:01";
const MAC2: &str = "02:00:0a:0a:00:02";
const IP1: &str = "10.11.0.1";
const IP2: &str = "10.11.0.2";

/// A DF ping of `size` bytes of payload: `count` answered out of `count`.
fn df_ping(from: &Netns, to: &str, size: u32) {
    let s = size.to_string();
    let p = ping(from, to, 3, "0.2", &["-M", "do", "-s", &s, "-W", "2"]);
    assert!(
        p.ok && p.received == 3,
        "{}: {size}-byte DF ping to {to} not answered whole:\n{}",
        from.name,
        p.output
    );
}

/// The switch's (rx_packets, rx_bytes) for port `name`.
#[test]
fn e2e_jumbo() {
    skip_unless_capable!();
    let node = Netns::new("jbnode");
    let pod1 = Netns::new("jbpod1");
    let pod2 = Netns::new("jbpod2");
    let pod3 = Netns::new("jbpod3");
    let pod4 = Netns::new("jbpod4");

    let sw = Switchd::start_with(&node, &["--tx-move"]);
    add_pod(&sw, &node, &pod1, "jb1", 1, "10.11.0.1/24", MAC1, 65535);
    add_pod(&sw, &node, &pod2, "jb2", 2, "10.11.0.2/24", MAC2, 65535);
    add_pod(
        &sw,
        &node,
        &pod3,
        "jb3",
        3,
        "10.11.0.3/24",
        "02:00:0a:0a:00:03",
        9000,
    );
    add_pod(
        &sw,
        &node,
        &pod4,
        "jb4",
        4,
        "10.11.0.4/24",
        "02:00:0a:0a:00:04",
        1500,
    );
    // Every pod's MTU took (a veth with a plain XDP program refuses
    // more than ~3.5k on its peer).
    for (pod, mtu) in [(&pod1, "65535"), (&pod2, "65535"), (&pod3, "9000")] {
        let l = pod.must(&["ip", "link", "show", "eth0"]);
        assert!(l.contains(&format!("mtu {mtu} ")), "{}: {l}", pod.name);
    }
    let flows = std::env::temp_dir().join(unique("jumbo-flows"));
    let macs: Vec<String> = (1..=4).map(|i| format!("02:00:0a:0a:00:0{i}")).collect();
    let text = flood_arp_ip_by_mac_flows(&macs);
    std::fs::write(&flows, text).expect("write flows");
    sw.add_flows(flows.to_str().expect("path"));
    let _ = std::fs::remove_file(&flows);
    let p = ping_until_up(&pod1, IP2, 5);
    assert!(p.ok, "pod1 -> pod2 ping never answered:\n{}", p.output);

    // 1. Whole large frames between two 65535 pods.
    df_ping(&pod1, IP2, 8972);
    df_ping(&pod1, IP2, 65000);
    df_ping(&pod2, IP1, 65000);
    let (p0, b0) = sw.port_counters("jb1").rx();
    let out0 = sw.port_counters("jb2");
    tcp_transfer(&pod1, &pod2, IP2, 5001, 8 << 20);
    let (p1, b1) = sw.port_counters("jb1").rx();
    let out1 = sw.port_counters("jb2");
    let per_packet = (b1 - b0) / (p1 - p0).max(1);
    assert!(
        per_packet > 16_000,
        "8 MB of TCP from a 65535-MTU pod came in {} packets ({per_packet} bytes each): \
         not as large frames",
        p1 - p0
    );
    // Those frames left in the frames they arrived in (the pods' ports
    // share the thread's UMEM, each segment is its flow's last output):
    // moved, not copied, their rewritten heads (checksums completed)
    // written back; the SHA-256 comparison above proves the bytes.
    let (sent, moved) = (
        out1.tx_packets - out0.tx_packets,
        out1.tx_moved - out0.tx_moved,
    );
    assert!(
        sent > 0 && moved * 10 >= sent * 9,
        "of {sent} frames sent to pod2 only {moved} were moved without a copy"
    );
    tcp_transfer(&pod2, &pod1, IP1, 5002, 8 << 20);
    big_udp_exchange(&pod1, &pod2, IP2, 6001, 60_000, true);
    big_udp_exchange(&pod2, &pod1, IP1, 6002, 60_000, true);

    // 2. 9000 <-> 65535.
    df_ping(&pod3, IP1, 8972);
    tcp_transfer(&pod3, &pod1, IP1, 5003, 4 << 20);
    tcp_transfer(&pod1, &pod3, "10.11.0.3", 5004, 4 << 20);

    // 3. 1500 <-> 65535.
    let p = ping_until_up(&pod4, IP2, 5);
    assert!(p.ok, "pod4 (MTU 1500) -> pod2 ping:\n{}", p.output);
    let out0 = sw.port_counters("jb2");
    tcp_transfer(&pod4, &pod2, IP2, 5005, 1 << 20);
    let out1 = sw.port_counters("jb2");
    // One frame each: moved as they are.
    assert!(
        out1.tx_moved - out0.tx_moved >= (out1.tx_packets - out0.tx_packets) * 9 / 10,
        "1500-byte frames to pod2 were copied: {:?} -> {:?}",
        (out0.tx_packets, out0.tx_moved),
        (out1.tx_packets, out1.tx_moved)
    );
    tcp_transfer(&pod2, &pod4, "10.11.0.4", 5006, 1 << 20);
    udp_exchange(&pod4, &pod2, IP2, 6003);
}
