//! End to end, checksums: pods keep TX checksum offload on (the veth
//! default, so their kernels hand the veth TCP and UDP with only the
//! pseudo-header summed, and keep GSO), and the switch completes the
//! checksums, as a NIC would.
//!
//! 1. Two pods on one oxvs-switchd (`examples/switch-two-pods.flows`),
//!    (its MACs), offload on (asserted): 4 MB of TCP each way (data compared by
//!    SHA-256), a UDP exchange each way, and a 3000-byte UDP datagram (IPv4
//!    fragments, which the kernel checksums itself and the switch leaves
//!    alone).
//! 2. The same pods behind a switch started with `--trust-checksums`
//!    (completion off): TCP cannot even connect, because the receiving
//!    kernel drops every segment as corrupt. This is what shows that step
//!    1 exercises the completion, and what pods lived with before it.
//!
//! The gateway (host offloads on) and the VXLAN paths (a kernel VXLAN
//! peer with offload on) are covered by `e2e_gateway` and
//! `e2e_kernel_interop`, whose pods and hosts keep their offloads too.
//! Runs as root only (skips otherwise); everything lives in fresh
//! namespaces removed on drop.

mod common;

use common::*;

const MAC1: &str = "02:00:0a:0a:00:01";
const MAC2: &str = "02:00:0a:0a:00:02";
const IP1: &str = "10.11.0.1";
const IP2: &str = "10.11.0.2";

fn offload_on(pod: &Netns) {
    let k = pod.must(&["ethtool", "-k", "eth0"]);
    assert!(
        k.contains("tx-checksumming: on"),
        "{}: TX checksum offload is not on:\n{k}",
        pod.name
    );
}

#[test]
fn e2e_checksums() {
    skip_unless_capable!();
    let node = Netns::new("csnode");
    let pod1 = Netns::new("cspod1");
    let pod2 = Netns::new("cspod2");

    // 1. Completion on (the default).
    let sw = Switchd::start(&node);
    add_pod(&sw, &node, &pod1, "cs1", 1, "10.11.0.1/24", MAC1, 1500);
    add_pod(&sw, &node, &pod2, "cs2", 2, "10.11.0.2/24", MAC2, 1500);
    offload_on(&pod1);
    offload_on(&pod2);
    sw.add_flows(&example("switch-two-pods.flows"));
    let p = ping_until_up(&pod1, IP2, 5);
    assert!(p.ok, "pod1 -> pod2 ping never answered:\n{}", p.output);

    tcp_transfer(&pod1, &pod2, IP2, 5001, 4 << 20);
    tcp_transfer(&pod2, &pod1, IP1, 5002, 4 << 20);
    udp_exchange(&pod1, &pod2, IP2, 6001);
    udp_exchange(&pod2, &pod1, IP1, 6002);

    // IPv4 fragments, which the kernel checksums itself (the switch
    // leaves them alone).
    big_udp_exchange(&pod1, &pod2, IP2, 6003, 3000, false);
    drop(sw);

    // 2. Completion off: offloaded TCP is dropped by the receiver.
    let sw = Switchd::start_with(&node, &["--trust-checksums"]);
    sw.add_port("cs1", 1);
    sw.add_port("cs2", 2);
    sw.add_flows(&example("switch-two-pods.flows"));
    let p = ping_until_up(&pod1, IP2, 5);
    assert!(
        p.ok,
        "ping (ICMP: never offloaded) through --trust-checksums:\n{}",
        p.output
    );
    let r = try_tcp_transfer(&pod1, &pod2, IP2, 5003, 1 << 16, 4);
    assert!(
        r.is_err(),
        "TCP with partial checksums got through a switch that does not complete them: \
         the test no longer exercises completion"
    );
}
