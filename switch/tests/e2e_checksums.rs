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
//!    Out of the pods' ports the switch asks the kernel to finish the
//!    checksums (AF_XDP TX metadata, where the kernel has it: counted in
//!    `tx_checksum_requests`): the receiving pod trusts a
//!    `CHECKSUM_PARTIAL` skb without summing it, so the SHA-256 is what
//!    shows the data whole. That the request's terms are right (where the
//!    sum starts, where it goes) shows where the kernel must compute it
//!    in software: pod2 routes to a third namespace through a veth with
//!    TX checksum offload off, whose kernel verifies every checksum (IPv4,
//!    then IPv6).
//!
//!    Then `--software-checksums`: the switch completes them itself (no
//!    request), and the same TCP and UDP pass.
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

/// Whether this kernel takes AF_XDP TX metadata (Linux 6.11+), so that
/// the switch asks it to finish checksums.
fn kernel_has_tx_metadata() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let v: Vec<u32> = release
        .split(|c: char| !c.is_ascii_digit())
        .take(2)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    v >= vec![6, 11]
}

/// Asserts that `ns` counts none of `counters` (`nstat`): no checksum
/// error where its kernel computed the sums from the switch's requests.
/// Each counter must be listed (`-z` prints the zero ones), so a renamed
/// one fails rather than passing unseen.
fn no_checksum_errors(ns: &Netns, counters: &[&str]) {
    let mut args = vec!["nstat", "-az"];
    args.extend_from_slice(counters);
    let out = ns.must(&args);
    for c in counters {
        let value = out
            .lines()
            .find_map(|l| l.strip_prefix(c).and_then(|v| v.split_whitespace().next()));
        assert_eq!(
            value,
            Some("0"),
            "{c} in {} where the kernel finished the switch's requests:\n{out}",
            ns.name
        );
    }
}

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
    // The counters are published every ~50 ms.
    let requests = |sw: &Switchd| {
        std::thread::sleep(std::time::Duration::from_millis(200));
        sw.port_counters("cs1").tx_checksum_requests + sw.port_counters("cs2").tx_checksum_requests
    };
    if kernel_has_tx_metadata() {
        assert!(
            requests(&sw) > 1000,
            "the kernel was asked to finish {} checksums: 4 MB each way are thousands of \
             segments",
            requests(&sw)
        );
    }

    // Where the request's terms are used to compute the sum: pod2 routes
    // to `far` through a veth with TX checksum offload off.
    let far = Netns::new("csfar");
    veth(&pod2, "fwd0", &far, "far0");
    pod2.must(&["ip", "addr", "add", "10.12.0.1/24", "dev", "fwd0"]);
    pod2.must(&["ethtool", "-K", "fwd0", "tx", "off"]);
    pod2.must(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    far.must(&["ip", "addr", "add", "10.12.0.2/24", "dev", "far0"]);
    far.must(&["ip", "route", "add", "10.11.0.0/24", "via", "10.12.0.1"]);
    pod1.must(&["ip", "route", "add", "10.12.0.0/24", "via", IP2]);
    let forwarded = |dst: &str, port: u16, counters: &[&str], path: &str| {
        let before = requests(&sw);
        tcp_transfer(&pod1, &far, dst, port, 4 << 20);
        udp_exchange(&pod1, &far, dst, port + 1000);
        no_checksum_errors(&far, counters);
        if kernel_has_tx_metadata() {
            assert!(
                requests(&sw) - before > 1000,
                "no requests on the forwarded {path}path"
            );
        }
    };
    forwarded(
        "10.12.0.2",
        5004,
        &["TcpInCsumErrors", "UdpInCsumErrors"],
        "",
    );

    // The same over IPv6 (its pseudo-header, a 40-byte header before the
    // sum's start): static neighbours, so the switch needs only flows
    // by MAC.
    let flows = std::env::temp_dir().join(unique("cs-ipv6-flows"));
    std::fs::write(
        &flows,
        format!(
            "table=0,priority=50,ipv6,dl_dst={MAC1} actions=output:1\n\
             table=0,priority=50,ipv6,dl_dst={MAC2} actions=output:2\n"
        ),
    )
    .expect("write flows");
    sw.add_flows(flows.to_str().expect("path"));
    let _ = std::fs::remove_file(&flows);
    let v6 = |ns: &Netns, args: &[&str]| {
        let mut cmd = vec!["ip", "-6"];
        cmd.extend_from_slice(args);
        ns.must(&cmd);
    };
    v6(
        &pod1,
        &["addr", "add", "fd00:11::1/64", "dev", "eth0", "nodad"],
    );
    v6(
        &pod2,
        &["addr", "add", "fd00:11::2/64", "dev", "eth0", "nodad"],
    );
    v6(
        &pod1,
        &["neigh", "add", "fd00:11::2", "lladdr", MAC2, "dev", "eth0"],
    );
    v6(
        &pod2,
        &["neigh", "add", "fd00:11::1", "lladdr", MAC1, "dev", "eth0"],
    );
    v6(
        &pod2,
        &["addr", "add", "fd00:12::1/64", "dev", "fwd0", "nodad"],
    );
    pod2.must(&["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]);
    v6(
        &far,
        &["addr", "add", "fd00:12::2/64", "dev", "far0", "nodad"],
    );
    v6(&far, &["route", "add", "fd00:11::/64", "via", "fd00:12::1"]);
    v6(
        &pod1,
        &["route", "add", "fd00:12::/64", "via", "fd00:11::2"],
    );
    forwarded(
        "fd00:12::2",
        5007,
        &["TcpInCsumErrors", "Udp6InCsumErrors"],
        "IPv6 ",
    );
    drop(sw);

    // 1b. The switch completes them itself.
    let sw = Switchd::start_with(&node, &["--software-checksums"]);
    sw.add_port("cs1", 1);
    sw.add_port("cs2", 2);
    sw.add_flows(&example("switch-two-pods.flows"));
    let p = ping_until_up(&pod1, IP2, 5);
    assert!(p.ok, "pod1 -> pod2 ping never answered:\n{}", p.output);
    tcp_transfer(&pod1, &pod2, IP2, 5005, 4 << 20);
    tcp_transfer(&pod1, &far, "10.12.0.2", 5006, 1 << 20);
    udp_exchange(&pod2, &pod1, IP1, 6005);
    assert_eq!(requests(&sw), 0, "--software-checksums asked the kernel");
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
