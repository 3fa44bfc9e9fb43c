//! End to end, one node: two pods on one oxvs-switchd, flows from
//! `examples/switch-two-pods.flows` loaded with `oxvsctl add-flows`.
//!
//! Checks ARP resolution, ping both ways, a 1 MB TCP transfer each way with
//! the data compared by SHA-256, a UDP exchange each way; then that a
//! higher-priority drop flow stops the next ping and deleting it restores
//! traffic; and that `dump-flows` and `dump-ports` counters moved.
//! Runs as root only (skips otherwise); everything lives in fresh
//! namespaces removed on drop.

mod common;

use common::*;

const MAC1: &str = "02:00:0a:0a:00:01";
const MAC2: &str = "02:00:0a:0a:00:02";
const IP1: &str = "10.10.0.1";
const IP2: &str = "10.10.0.2";

#[test]
fn e2e_one_node() {
    skip_unless_capable!();
    let node = Netns::new("node");
    let pod1 = Netns::new("pod1");
    let pod2 = Netns::new("pod2");
    let sw = Switchd::start(&node);

    add_pod(&sw, &node, &pod1, "p1", 1, "10.10.0.1/24", MAC1, 1500);
    add_pod(&sw, &node, &pod2, "p2", 2, "10.10.0.2/24", MAC2, 1500);

    // An empty pipeline forwards nothing.
    let p = ping(&pod1, IP2, 2, "0.2", &[]);
    assert_eq!(
        p.received, 0,
        "forwarded with no flows loaded:\n{}",
        p.output
    );

    sw.add_flows(&example("switch-two-pods.flows"));
    let flows_before = sw.ctl_ok(&["dump-flows"]);
    let (rx0, tx0) = port_packet_totals(&sw);

    // ARP + ping both ways.
    let p = ping_until_up(&pod1, IP2, 5);
    assert!(p.ok, "pod1 -> pod2 ping never answered:\n{}", p.output);
    let neigh = pod1.must(&["ip", "neigh", "show", IP2]);
    assert!(
        neigh.to_lowercase().contains(MAC2),
        "pod1 did not learn pod2's MAC by ARP: {neigh}"
    );
    let p = ping(&pod1, IP2, 5, "0.1", &[]);
    assert_eq!(p.received, 5, "pod1 -> pod2:\n{}", p.output);
    let p = ping(&pod2, IP1, 5, "0.1", &[]);
    assert_eq!(p.received, 5, "pod2 -> pod1:\n{}", p.output);

    // TCP, 1 MB each way, data checked.
    tcp_transfer(&pod1, &pod2, IP2, 5001, 1 << 20);
    tcp_transfer(&pod2, &pod1, IP1, 5002, 1 << 20);

    // UDP each way.
    udp_exchange(&pod1, &pod2, IP2, 6001);
    udp_exchange(&pod2, &pod1, IP1, 6002);

    // Counters moved.
    let flows_after = sw.ctl_ok(&["dump-flows"]);
    let to2 = flow_packets(&flows_after, "dl_dst=02:00:0a:0a:00:02")
        .unwrap_or_else(|| panic!("no flow with dl_dst={MAC2} in dump-flows:\n{flows_after}"));
    assert!(
        to2 >= 10,
        "n_packets of the flow to pod2 is {to2} after >10 pings + TCP:\n{flows_after}"
    );
    assert!(
        sum_field(&flows_after, "n_packets=") > sum_field(&flows_before, "n_packets="),
        "dump-flows n_packets did not grow:\nbefore:\n{flows_before}\nafter:\n{flows_after}"
    );
    let (rx1, tx1) = port_packet_totals(&sw);
    eprintln!("counters: flow to pod2 n_packets={to2}; ports rx {rx0} -> {rx1}, tx {tx0} -> {tx1}");
    assert!(
        rx1 > rx0 + 10 && tx1 > tx0 + 10,
        "dump-ports totals barely moved: rx {rx0} -> {rx1}, tx {tx0} -> {tx1}"
    );

    // A higher-priority drop for pod1 -> pod2 IP takes effect for the next packet.
    let drop = "table=0,priority=200,ip,nw_src=10.10.0.1,nw_dst=10.10.0.2 actions=drop";
    sw.ctl_ok(&["add-flow", drop]);
    let p = ping(&pod1, IP2, 3, "0.2", &[]);
    assert_eq!(
        p.received,
        0,
        "ping pod1 -> pod2 still answered after the drop flow:\n{}\n{}",
        p.output,
        sw.ctl_ok(&["dump-flows"])
    );
    // The other direction's requests pass, but their replies (pod1 -> pod2) are dropped.
    let p = ping(&pod2, IP1, 2, "0.2", &[]);
    assert_eq!(
        p.received, 0,
        "pod2 -> pod1 replies not dropped:\n{}",
        p.output
    );
    let dump = sw.ctl_ok(&["dump-flows"]);
    let dropped = flow_packets(&dump, "priority=200")
        .unwrap_or_else(|| panic!("the drop flow is not in dump-flows:\n{dump}"));
    assert!(dropped >= 3, "drop flow n_packets={dropped}:\n{dump}");

    sw.ctl_ok(&["del-flows", "table=0,ip,nw_src=10.10.0.1,nw_dst=10.10.0.2"]);
    let dump = sw.ctl_ok(&["dump-flows"]);
    assert!(
        !dump.contains("priority=200"),
        "drop flow still there after del-flows:\n{dump}"
    );
    assert!(
        dump.contains("dl_dst=02:00:0a:0a:00:02"),
        "del-flows removed more than the drop flow:\n{dump}"
    );
    let p = ping(&pod1, IP2, 3, "0.2", &[]);
    assert_eq!(
        p.received, 3,
        "traffic not restored after del-flows:\n{}",
        p.output
    );
}
