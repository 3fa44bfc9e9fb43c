//! End to end, the gateway port: `oxvs-switchd --gateway NAME` creates a
//! host interface wired into the switch, so the node's own stack reaches
//! pods (node -> pod and pod -> node, ping and TCP with data checked) with
//! no NAT; SIGTERM removes the interface again.
//! switchd runs with a `PATH` that has no program at all: it makes the
//! gateway pair, its address and the UMEM anchor over netlink, and needs
//! neither `ip` nor `ethtool` (the test itself uses both to look). The
//! host keeps TX checksum offload on the gateway (the switch completes the
//! checksums the host leaves partial), and so does the pod. The host's end
//! gets a qdisc (`--gateway-qdisc auto`).
//! Runs as root only (skips otherwise); everything lives in fresh
//! namespaces removed on drop.

mod common;

use std::time::{Duration, Instant};

use common::*;

const POD_MAC: &str = "02:00:0a:14:00:05";
const POD_IP: &str = "10.20.0.5";
const GW_IP: &str = "10.20.0.1";

#[test]
fn e2e_gateway() {
    skip_unless_capable!();
    let node = Netns::new("gwnode");
    let pod = Netns::new("gwpod");
    let mut sw = Switchd::start_with_env(
        &node,
        &["PATH=/nonexistent"],
        &[
            "--gateway",
            "oxgw0",
            "--gateway-ofport",
            "2",
            "--gateway-ip",
            "10.20.0.1/24",
        ],
    );
    let show = sw.ctl_ok(&["show"]);
    assert!(show.contains("oxgw0"), "gateway port not shown:\n{show}");
    let addr = node.sh("ip -4 -br addr show dev oxgw0");
    assert!(addr.contains("10.20.0.1/24"), "gateway address: {addr}");
    let features = node.must(&["ethtool", "-k", "oxgw0"]);
    assert!(
        features.contains("tx-checksumming: on"),
        "TX checksum offload turned off:\n{features}"
    );
    // The host's end has a qdisc (`--gateway-qdisc auto`: the kernel's
    // default in a namespace without the host's sysctl), so the veth
    // holds the host's frames back while the switch's ring is full
    // instead of dropping them.
    let qdisc = node.must(&["tc", "qdisc", "show", "dev", "oxgw0"]);
    assert!(
        qdisc.contains("qdisc pfifo_fast ") && qdisc.contains(" root "),
        "want pfifo_fast on the gateway:\n{qdisc}"
    );
    assert!(
        node.exec(&["ip", "link", "show", "oxvs-umem"])
            .status
            .success(),
        "no UMEM anchor device:\n{}",
        sw.log()
    );
    add_pod(&sw, &node, &pod, "gp1", 1, "10.20.0.5/24", POD_MAC, 1500);
    sw.add_flows(&example("switch-gateway.flows"));

    // pod -> node (the gateway IP lives in the node's stack), node -> pod.
    let p = ping_until_up(&pod, GW_IP, 5);
    assert!(p.ok, "pod -> gateway ping never answered:\n{}", p.output);
    let p = ping(&node, POD_IP, 5, "0.1", &[]);
    assert_eq!(p.received, 5, "node -> pod:\n{}", p.output);
    // The address the pod sees for the node is the node's: no NAT.
    tcp_transfer(&node, &pod, POD_IP, 5101, 1 << 20);
    tcp_transfer(&pod, &node, GW_IP, 5102, 1 << 20);

    // Clean shutdown removes the gateway interface it created.
    assert!(
        sw.stop(),
        "switchd did not exit on SIGTERM:\n{}",
        sw.log_tail(30)
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while node.exec(&["ip", "link", "show", "oxgw0"]).status.success() {
        assert!(
            Instant::now() < deadline,
            "oxgw0 still exists after switchd exited"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
